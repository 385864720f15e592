/*
 * tools/kvvm-gpucheck/share.c: the shareable-handle probes (issue 34: the pool daemon hands
 * frames to its clients as POSIX file descriptors). Rows:
 *   share.export          cuMemCreate with requestedHandleTypes = POSIX file descriptor, then
 *                         cuMemExportToShareableHandle: a descriptor
 *   share.import_here     the descriptor imported in this process (a second handle of the
 *                         same memory), both mapped: bytes written through one are read
 *                         through the other
 *   share.second_process  the descriptor passed to a second process (this program again,
 *                         --child share.peer, the descriptor inherited across exec, its
 *                         number in KVVM_GPUCHECK_SHARE_FD), which opens the driver itself,
 *                         imports it, maps it into a reservation of its own, reads what this
 *                         process wrote and writes a second pattern this process then reads
 *                         through its own mapping: the daemon-and-client arrangement
 * Both drivers (the emulated device maps the exporter's memfd in the peer; the fake driver
 * forwards to it), compared with the emulator.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpucheck.h"

#define SHARE_FD_ENV "KVVM_GPUCHECK_SHARE_FD"

/* The peer's exit codes (share.second_process reports them by name). */
enum { PEER_OK = 0, PEER_OPEN = 10, PEER_IMPORT, PEER_MAP, PEER_READ, PEER_DIFFERS,
       PEER_WRITE, PEER_ENV };

static const char *peer_what(int code)
{
    switch (code) {
    case PEER_OPEN: return "peer:open";
    case PEER_IMPORT: return "peer:import";
    case PEER_MAP: return "peer:map";
    case PEER_READ: return "peer:read";
    case PEER_DIFFERS: return "peer:differs";
    case PEER_WRITE: return "peer:write";
    case PEER_ENV: return "peer:no descriptor";
    default: return "peer:died";
    }
}

/* kvvm-gpucheck --child share.peer: the second process (main.c's child_main). */
int gc_share_peer(int emulated, const struct gc_opts *o)
{
    const char *e = getenv(SHARE_FD_ENV);
    char *end;
    long fd = e ? strtol(e, &end, 10) : -1;
    if (!e || *end || fd < 0 || fcntl((int)fd, F_GETFD) < 0)
        return PEER_ENV;
    struct gc_dev dv, *d = &dv;
    char why[512];
    if (gc_dev_open(d, emulated, o, true, why, sizeof why)) {
        fprintf(stderr, "share.peer: %s\n", why);
        return PEER_OPEN;
    }
    kcu_mem_handle h;
    kcu_result r = d->a->cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                                        KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r) {
        fprintf(stderr, "share.peer: import: %s\n", gc_err(d->a, r));
        return PEER_IMPORT;
    }
    if (gc_map(d, d->base, d->g, h) || gc_access(d, d->base, d->g))
        return PEER_MAP;
    int c = gc_check(d, d->base, d->g, 21, &r);
    if (c)
        return c < 0 ? PEER_READ : PEER_DIFFERS;
    if (gc_write(d, d->base, d->g, 22, &r))
        return PEER_WRITE;
    (void)d->a->cuMemUnmap(d->base, d->g);
    (void)d->a->cuMemRelease(h);
    return PEER_OK;
}

/* Runs the peer on fd; its exit code (PEER_*), or -1 when it could not be started. */
static int run_peer(struct gc_dev *d, int fd)
{
    char self[4096], fds[16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -1;
    self[n] = 0;
    char dev[16];
    snprintf(dev, sizeof dev, "%d", d->o->device);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* across exec: the driver's descriptor may be close-on-exec */
        int keep = fcntl(fd, F_DUPFD, 3);
        if (keep < 0)
            _exit(PEER_ENV);
        snprintf(fds, sizeof fds, "%d", keep);
        setenv(SHARE_FD_ENV, fds, 1);
        execl(self, self, "--child", "share.peer", "--driver",
              d->emulated ? "emulated" : "cuda", "--device", dev, (char *)NULL);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void gc_share(struct gc_dev *d)
{
    struct kcu_mem_alloc_prop prop = d->prop;
    prop.requestedHandleTypes = KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    kcu_mem_handle h, imp;
    kcu_result r = d->a->cuMemCreate(&h, d->g, &prop, 0);
    int fd = -1;
    if (!r)
        r = d->a->cuMemExportToShareableHandle(&fd, h, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                               0);
    char res[80];
    snprintf(res, sizeof res, r ? "%s" : fd >= 0 ? "ok" : "no descriptor", gc_err(d->a, r));
    gc_row("share.export", res, "cuMemCreate (requestedHandleTypes POSIX file descriptor, one "
           "granule of %zu bytes) then cuMemExportToShareableHandle: descriptor %d", d->g, fd);
    if (r || fd < 0) {
        gc_row("share", "error: setup", "no exported descriptor");
        return;
    }
    /* this process: the original at base, the import at base + 4 granules */
    kcu_deviceptr v2 = d->base + 4 * d->g;
    r = d->a->cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd,
                                             KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    int c = -1;
    const char *step = "import";
    if (!r && !(r = gc_map(d, d->base, d->g, h)) && !(r = gc_access(d, d->base, d->g)) &&
        !(r = gc_map(d, v2, d->g, imp)) && !(r = gc_access(d, v2, d->g))) {
        step = "copy";
        c = gc_write(d, d->base, d->g, 11, &r) ? -1 : gc_check(d, v2, d->g, 11, &r);
        if (c == 0)
            c = gc_write(d, v2, d->g, 12, &r) ? -1 : gc_check(d, d->base, d->g, 12, &r);
    } else if (!r) {
        step = "map";
    }
    if (c < 0)
        snprintf(res, sizeof res, "%s:%s", step, gc_err(d->a, r));
    else
        snprintf(res, sizeof res, c ? "differs" : "ok");
    gc_row("share.import_here", res, "the descriptor imported in the exporting process "
           "(cuMemImportFromShareableHandle) and mapped beside the original: bytes written "
           "through either are read through the other");
    if (c == 0) {
        (void)d->a->cuMemUnmap(v2, d->g);
        (void)d->a->cuMemRelease(imp);
    }
    /* a second process: it reads 21 written here and writes 22, read here */
    int peer = -1;
    if (c >= 0 || !gc_map(d, d->base, d->g, h)) {
        (void)gc_access(d, d->base, d->g);
        if (!gc_write(d, d->base, d->g, 21, &r))
            peer = run_peer(d, fd);
    }
    if (peer < 0) {
        snprintf(res, sizeof res, "error: setup");
    } else if (peer != PEER_OK) {
        snprintf(res, sizeof res, "%s", peer_what(peer));
    } else {
        c = gc_check(d, d->base, d->g, 22, &r);
        snprintf(res, sizeof res, c < 0 ? "read:%s" : c ? "differs" : "ok", gc_err(d->a, r));
    }
    gc_row("share.second_process", res, "the descriptor inherited by a second process that "
           "opens the driver, imports it, maps it in its own reservation, reads this "
           "process's bytes and writes its own, read back here (peer exit %d)", peer);
    (void)d->a->cuMemUnmap(d->base, d->g);
    (void)d->a->cuMemRelease(h);
    close(fd);
}
