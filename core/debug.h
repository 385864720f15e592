/*
 * core/debug.h: test and tool hooks into a context (not installed, not part of the API).
 * Declared in the testing interface, testing/kvvm_testing.h (kvvm_debug_*); implemented in
 * core/debug.c.
 */
#ifndef KVVM_CORE_DEBUG_H
#define KVVM_CORE_DEBUG_H

#include "testing/kvvm_testing.h"

#endif
