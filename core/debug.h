/*
 * core/debug.h: the whole-context invariant check (core/debug.c), for the debug build's check
 * after every public call (core/call.h) and for the testing interface's kvvm_debug_check
 * (testing/hooks.c). Not installed, not part of the API. No testing/ header here: the
 * testing interface sits on top of core (testing/kvvm_testing.h), never inside it, so the
 * shipped libraries hold none of it.
 */
#ifndef KVVM_CORE_DEBUG_H
#define KVVM_CORE_DEBUG_H

#include <stddef.h>
#include "kvvm.h"

/* Checks kv against the emulated device's tables and the tiers' own counts (what
   testing/kvvm_testing.h says of kvvm_debug_check); kv->lock held. 0 when all hold;
   -EUCLEAN with the first violation logged and described in why (if why and len). */
int core_check_locked(kvvm *kv, char *why, size_t len);

#endif
