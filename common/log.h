/*
 * common/log.h: the library's one log sink and small shared helpers.
 *
 * Contract: every "clear message" of the library goes through klog(); the sink and level are
 * set by kvvm_set_log() or KVVM_LOG. Safe from any thread; never allocates on the caller's
 * behalf beyond a stack buffer; never aborts. Used by every layer (it depends on nothing).
 */
#ifndef KVVM_COMMON_LOG_H
#define KVVM_COMMON_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include "kvvm.h"

#define KVVM_INTERNAL __attribute__((visibility("hidden")))

KVVM_INTERNAL void klog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
KVVM_INTERNAL int klog_enabled(int level);
/* The calling thread's last error (kvvm_last_error): every klog at error level appends to it
   (whatever the log level). klast_clear empties it; klast_set sets it only when it is empty
   (a generic reason for a failure nothing logged). */
/* klast_clear is inline: every public call makes it twice, and the hot path's grow must not
   pay a call for it. kvvm__last_len is the thread's last error length (log.c);
   initial-exec: one thread-pointer-relative read. */
extern KVVM_INTERNAL __thread size_t kvvm__last_len __attribute__((tls_model("initial-exec")));
KVVM_INTERNAL void klast_clear_slow(void);
static inline void klast_clear(void)
{
    if (__builtin_expect(kvvm__last_len != 0, 0))
        klast_clear_slow();
}
KVVM_INTERNAL void klast_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Logs an error (klog_error: so it is also the last error) and returns rc: the one way a
   public call refuses an argument, `return kerr(-EINVAL, "kvvm_x: why", ...)`. */
#define kerr(rc, ...) (klog_error(__VA_ARGS__), (rc))
/* An answer the docs tell callers to expect, returned as an error code (a block table of a
   sequence that is not resident, a buffer to size): the reason is the last error and is
   logged at debug level only, not as an error (misuse stays kerr). Returns rc. */
#define kanswer(rc, ...) (klast_set(__VA_ARGS__), klog_debug(__VA_ARGS__), (rc))

#define klog_debug(...) klog(KVVM_LOG_DEBUG, __VA_ARGS__)
#define klog_info(...)  klog(KVVM_LOG_INFO, __VA_ARGS__)
#define klog_warn(...)  klog(KVVM_LOG_WARN, __VA_ARGS__)
#define klog_error(...) klog(KVVM_LOG_ERROR, __VA_ARGS__)

/* Parses a size with an optional K/M/G/T suffix (binary units). 0 ok, -EINVAL malformed. */
KVVM_INTERNAL int kparse_size(const char *s, size_t *out);
/* Writes bytes in the largest binary unit it reaches (B, KiB, MiB, GiB, TiB): "512 KiB",
   "1.5 MiB" (one decimal unless exact), for messages. Returns buf. */
KVVM_INTERNAL const char *kfmt_size(unsigned long long bytes, char *buf, size_t len);

/* Monotonic clock in nanoseconds. */
KVVM_INTERNAL uint64_t know_ns(void);

#endif
