/*
 * common/assert.h: KVVM_ASSERT, the internal-invariant check of the debug build.
 *
 * Contract: KVVM_ASSERT(cond) states an internal invariant (a page's refcount before a put,
 * a frame's state before a transition, a slot freed once), never a runtime condition (a
 * bad argument, a driver error, memory exhaustion: those return -errno). In the debug build
 * (cmake -DKVVM_DEBUG=ON, which defines KVVM_DEBUG) a false cond is logged at error level
 * (the condition, file, line, function) and the process aborts, so a test fails at the
 * transition that broke the invariant. Otherwise it compiles to nothing: cond is neither
 * evaluated nor may it have side effects (its variables and functions still count as used:
 * `0 && (cond)`, not `sizeof`, whose operand is unevaluated, so clang's
 * -Wunneeded-internal-declaration called a static function used only in asserts unneeded).
 */
#ifndef KVVM_COMMON_ASSERT_H
#define KVVM_COMMON_ASSERT_H

#include "common/log.h"

#ifdef KVVM_DEBUG
KVVM_INTERNAL void kassert_fail(const char *cond, const char *file, int line,
                                const char *func) __attribute__((noreturn));
#define KVVM_ASSERT(cond) \
    ((cond) ? (void)0 : kassert_fail(#cond, __FILE__, __LINE__, __func__))
#else
#define KVVM_ASSERT(cond) ((void)(0 && (cond)))
#endif

#endif
