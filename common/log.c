/*
 * common/log.c: the log sink. The level and sink are process-wide (like the driver), set once
 * from KVVM_LOG on first use and by kvvm_set_log() at any time.
 *
 * The last error (kvvm_last_error): every error-level message is also kept in a buffer of the
 * thread that logged it, whatever the log level, so the reason of a failed call (the layer
 * that refused first, then the call's own context) reaches its caller. core/call.h clears the
 * buffer when a public call starts and when it succeeds (klast_clear) and supplies a generic
 * reason when a failure logged none (klast_set).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include "common/assert.h"
#include "common/env.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static kvvm_log_fn log_fn;         /* NULL = stderr; guarded by log_lock */
static void *log_arg;              /* guarded by log_lock */
static int log_level = KVVM_LOG_WARN; /* read without the lock: an int, set rarely */

/* The calling thread's last error: error-level messages of the current call, "; "-joined. */
static _Thread_local char last_err[1024];
/* Its length: initial-exec (8 bytes of static TLS), so klast_clear, which every public call
   makes twice, costs one thread-pointer-relative read and no __tls_get_addr call when the
   buffer is empty already. */
KVVM_INTERNAL __thread size_t kvvm__last_len __attribute__((tls_model("initial-exec")));

static const char *const level_names[] = { "debug", "info", "warn", "error", "off" };

static void log_init_env(void)
{
    const char *e = kenv(KVVM_LOG);
    if (!e || !*e)
        return;
    for (int i = 0; i <= KVVM_LOG_OFF; i++) {
        if (!strcasecmp(e, level_names[i])) {
            __atomic_store_n(&log_level, i, __ATOMIC_RELAXED);
            return;
        }
    }
    fprintf(stderr, "kvvm warn: KVVM_LOG=%s is not one of debug|info|warn|error|off; "
                    "keeping 'warn'\n", e);
}

int klog_enabled(int level)
{
    pthread_once(&log_once, log_init_env);
    return level >= __atomic_load_n(&log_level, __ATOMIC_RELAXED) && level < KVVM_LOG_OFF;
}

/* Appends msg to the thread's last error (truncated when full). */
static void last_append(const char *msg)
{
    if (kvvm__last_len + 3 >= sizeof last_err)
        return;
    int n = snprintf(last_err + kvvm__last_len, sizeof last_err - kvvm__last_len, "%s%s",
                     kvvm__last_len ? "; " : "", msg);
    if (n > 0)
        kvvm__last_len += (size_t)n < sizeof last_err - kvvm__last_len ? (size_t)n
                                                           : sizeof last_err - 1 - kvvm__last_len;
    KVVM_ASSERT(kvvm__last_len < sizeof last_err && !last_err[kvvm__last_len]);
}

void klast_clear_slow(void)
{
    last_err[0] = 0;
    kvvm__last_len = 0;
}

void klast_set(const char *fmt, ...)
{
    if (kvvm__last_len)
        return;
    char msg[sizeof last_err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    last_append(msg);
}

const char *kvvm_last_error(void)
{
    return last_err;
}

void klog(int level, const char *fmt, ...)
{
    KVVM_ASSERT(level >= KVVM_LOG_DEBUG && level < KVVM_LOG_OFF);   /* a level_names[] entry */
    int keep = level >= KVVM_LOG_ERROR;
    if (!klog_enabled(level) && !keep)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (keep)
        last_append(msg);
    if (!klog_enabled(level))
        return;
    pthread_mutex_lock(&log_lock);
    if (log_fn)
        log_fn(level, msg, log_arg);
    else
        fprintf(stderr, "kvvm %s: %s\n", level_names[level], msg);
    pthread_mutex_unlock(&log_lock);
}

void kvvm_set_log(kvvm_log_fn fn, void *arg, int level)
{
    pthread_once(&log_once, log_init_env);
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_arg = arg;
    if (level < KVVM_LOG_DEBUG)
        level = KVVM_LOG_DEBUG;
    if (level > KVVM_LOG_OFF)
        level = KVVM_LOG_OFF;
    __atomic_store_n(&log_level, level, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&log_lock);
}

const char *kfmt_size(unsigned long long bytes, char *buf, size_t len)
{
    static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    unsigned u = 0;
    while (u + 1 < sizeof unit / sizeof *unit && bytes >> (10 * (u + 1)))
        u++;
    unsigned long long whole = bytes >> (10 * u), rest = bytes - (whole << (10 * u));
    if (!rest)
        snprintf(buf, len, "%llu %s", whole, unit[u]);
    else
        snprintf(buf, len, "%.1f %s", (double)bytes / (double)(1ull << (10 * u)), unit[u]);
    return buf;
}

int kparse_size(const char *s, size_t *out)
{
    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-')
        return -EINVAL;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: return -EINVAL;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end)
        return -EINVAL;
    if (shift && v > (~0ULL >> shift))
        return -EINVAL;
    *out = (size_t)(v << shift);
    return 0;
}

uint64_t know_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define KVVM_STR2(x) #x
#define KVVM_STR(x) KVVM_STR2(x)
const char *kvvm_version(void)
{
    return KVVM_STR(KVVM_VERSION_MAJOR) "." KVVM_STR(KVVM_VERSION_MINOR) "."
           KVVM_STR(KVVM_VERSION_PATCH);
}

#ifdef KVVM_DEBUG
/* KVVM_ASSERT's failure (common/assert.h): the debug build only, where aborting on a broken
   internal invariant is the point. */
void kassert_fail(const char *cond, const char *file, int line, const char *func)
{
    klog_error("internal invariant violated: %s (%s:%d, %s)", cond, file, line, func);
    fprintf(stderr, "kvvm: internal invariant violated: %s (%s:%d, %s); aborting (KVVM_DEBUG "
                    "build)\n", cond, file, line, func);
    abort();
}
#endif
