/*
 * tools/kvvm-bench/syscount.c: system calls counted, not guessed (bench.h, bench_syscalls).
 *
 * How: the work runs in a helper (spawn.c: this binary again, by fork and exec) that the
 * bench traces with ptrace (PTRACE_TRACEME before the exec, then PTRACE_SYSCALL stops;
 * PTRACE_GET_SYSCALL_INFO names each entry, on every architecture; the exec's own stop is
 * passed over). The helper brackets what it wants counted with bench_syscall_mark(k), a
 * system call of a number no kernel has (it fails with ENOSYS, so an untraced run costs one
 * cheap failed call): the tracer adds every entry it sees after mark(k) to segment k, until
 * the next mark (k < 0: count nothing), so neither the exec nor the helper's start counts.
 * Only the helper's calling thread is traced (no PTRACE_O_TRACECLONE): what the engine's
 * thread pays; the library's own threads and the emulated device's workers are not counted.
 * No LD_PRELOAD, no wrapper: a system call made by the C library on the library's behalf (a
 * futex of a contended lock, a clock_gettime that left the vDSO) counts too.
 */
#include "bench.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* No kernel assigns it (x86-64 and arm64 numbers end below 1024); ENOSYS everywhere. */
#define MARK_NR 0x4b56

void bench_syscall_mark(int segment)
{
    (void)syscall(MARK_NR, (long)segment);
}

/* The child: stop for the tracer, then become the helper. */
static void __attribute__((noreturn)) child_run(const char *role, const struct bench_shm *arg)
{
    if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0)
        _exit(254);
    raise(SIGSTOP);
    bench_helper_exec(role, arg, NULL, 0);
}

int bench_syscalls(const char *role, const struct bench_shm *arg, uint64_t *counts,
                   int n_segments)
{
    for (int i = 0; i < n_segments; i++)
        counts[i] = 0;
    fflush(NULL);                    /* nothing buffered is written twice */
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0)
        child_run(role, arg);
    int st, seg = -1, rc = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFSTOPPED(st)) {
        rc = -ECHILD;
        goto out_reap;
    }
    if (ptrace(PTRACE_SETOPTIONS, pid, NULL,
               (void *)(long)(PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL |
                              PTRACE_O_TRACEEXEC)) != 0) {
        rc = -errno;
        kill(pid, SIGKILL);
        goto out_reap;
    }
    for (int sig = 0;;) {
        if (ptrace(PTRACE_SYSCALL, pid, NULL, (void *)(long)sig) != 0) {
            rc = -errno;
            kill(pid, SIGKILL);
            break;
        }
        sig = 0;
        if (waitpid(pid, &st, 0) != pid) {
            rc = -ECHILD;
            break;
        }
        if (WIFEXITED(st)) {
            int code = WEXITSTATUS(st);
            return code == 254 ? -EPERM : code ? -code : rc;
        }
        if (WIFSIGNALED(st))
            return -EINTR;
        if (!WIFSTOPPED(st))
            continue;
        if (st >> 8 == (SIGTRAP | (PTRACE_EVENT_EXEC << 8)))
            continue;                    /* the exec's stop: not a signal of the child's */
        if (WSTOPSIG(st) != (SIGTRAP | 0x80)) {
            sig = WSTOPSIG(st);          /* the child's own signal: deliver it */
            continue;
        }
        struct __ptrace_syscall_info si;
        if (ptrace(PTRACE_GET_SYSCALL_INFO, pid, (void *)sizeof si, &si) <= 0 ||
            si.op != PTRACE_SYSCALL_INFO_ENTRY)
            continue;                    /* an exit stop */
        if (si.entry.nr == MARK_NR)
            seg = (int)(long)si.entry.args[0];
        else if (seg >= 0 && seg < n_segments)
            counts[seg]++;
    }
out_reap:
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return rc;
}
