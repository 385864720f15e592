/*
 * vmm/emu/emu_share.c: shareable handles (KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR):
 * cuMemExportToShareableHandle, cuMemImportFromShareableHandle, and the lifetime of memory
 * an importer still holds.
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 *
 * Design: a handle created with the POSIX file-descriptor type has a memfd of its own, named
 * "kvvm-emu-share:GRANULE" (the exporting device's granule, for a reader of /proc), so a
 * descriptor of it gives exactly that allocation and nothing else of the device. Its mode says
 * the same for the import's fstat (which it makes anyway, for the size): the sticky bit and
 * owner read-write mark an export, the group's and others' read and write bits hold its
 * granule (share_mode), so an import reads no name (a readlink of /proc/self/fd/N per frame
 * was a third of an import's cost). The create also opens the memfd anew (/proc/self/fd/N):
 * the export description, which takes a shared flock at once and is kept (xfd) until the
 * release. An export is a dup of it; an import, in this or another process, is an fstat (every
 * check) and a dup of the descriptor it is given (no open, no flock: the description it shares
 * holds the lock), or that descriptor itself where the caller hands it over (emu_import_take,
 * vmm_handle_import's way: no dup, and no close by the caller). An import opened its own
 * description and locked it before: two system calls more per imported frame, on the
 * client's path. A shareable or imported handle has no mapping
 * of the emulator's own: a window maps its memfd, and a copy reads and writes the memfd
 * (copies.c: pread, pwrite), so neither a create, an import nor a copy pays an mmap, and a
 * release is a close (a munmap of a view there was 91-99% of a client's give-back of 64
 * imports: a TLB shoot-down of every CPU running one of its threads). The kernel keeps the
 * memory while any descriptor or mapping remains, as the driver keeps an allocation while an
 * importer holds it; the exporting device's accounting follows the same rule: the release
 * closes xfd, and a released shareable handle whose export description is still open (an
 * import, here or in another process, or an export not closed yet: cuMemRelease's "shareable
 * counterparts"; the exporter's exclusive non-blocking flock on its own description fails)
 * lingers, its granules taken, until a later look (cuMemCreate, cuMemGetInfo, the counters)
 * finds them all closed. A child forked without exec closes its copies of the export
 * descriptions and imports (share_atfork_child), so it holds none of the parent's.
 */
#include "emu_int.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define SHARE_PREFIX "kvvm-emu-share:"
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U        /* Linux 6.3 */
#endif
/* An export's mode: the sticky bit and owner read-write mark it; the group's and others'
   read and write bits hold log2 of its granule less 11 (a device's granule is a power of
   two, 4 KiB .. 2 MiB: 1 .. 10 in 4 bits). Never an execute bit: a memfd sealed against
   execution (MFD_NOEXEC_SEAL, or vm.memfd_noexec) refuses a mode with one (EPERM). */
#define SHARE_MARK (S_ISVTX | S_IRUSR | S_IWUSR)
#define SHARE_GBITS (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)

static mode_t share_mode(size_t gran)
{
    KVVM_ASSERT(gran >= 4096 && gran <= (2u << 20) && !(gran & (gran - 1)));
    unsigned v = (unsigned)__builtin_ctzll(gran) - 11;
    return SHARE_MARK | (mode_t)((v & 3) << 1) | (mode_t)(((v >> 2) & 3) << 4);
}

/* The granule share_mode put in mode m, or 0: none. */
static size_t mode_granule(mode_t m)
{
    if ((m & 07777 & ~SHARE_GBITS) != SHARE_MARK)
        return 0;
    unsigned v = ((unsigned)(m >> 1) & 3) | (((unsigned)(m >> 4) & 3) << 2);
    return v >= 1 && v <= 10 ? (size_t)1 << (v + 11) : 0;
}

/* The device number of the kernel's internal shmem mount (every memfd's), or 0. */
static dev_t shm_dev;

static void shm_dev_init(void)
{
    int f = memfd_create("kvvm-emu-probe", MFD_CLOEXEC);
    struct stat st;
    if (f >= 0 && fstat(f, &st) == 0)
        shm_dev = st.st_dev;
    if (f >= 0)
        close(f);
}

/* A shareable allocation is poisoned by writing its memfd (emu_fd_fill of one poison
   buffer): the kernel allocates and fills its pages, and no mapping of this process takes a
   first-touch fault for it (a memset through a fresh view faulted in every 4 KiB page, the
   dominant cost of a new frame on a VM). The pages are the memfd's own, fresh: never
   another allocation's bytes. */
static unsigned char poison[EMU_FILL_BYTES];

static void poison_init(void)
{
    memset(poison, EMU_POISON, sizeof poison);
}

bool emu_fd_fill(int f, off_t off, size_t n, const unsigned char *pat)
{
    struct iovec io[64];
    size_t done = 0;
    while (done < n) {
        int k = 0;
        size_t len = 0;
        for (; k < 64 && done + len < n; k++) {
            size_t m = min_sz(n - done - len, EMU_FILL_BYTES);
            io[k] = (struct iovec){ (void *)(uintptr_t)pat, m };
            len += m;
        }
        ssize_t w = pwritev(f, io, k, off + (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        done += (size_t)w;
    }
    return true;
}

/* Opens memfd f anew (an open file description of its own: the export description) and
   takes the shared flock every export and import of it then holds. -1 on failure (errno). */
static int export_open(int f)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", f);
    int x = open(path, O_RDWR | O_CLOEXEC);
    if (x < 0)
        return -1;
    while (flock(x, LOCK_SH) != 0) {     /* a new memfd: no one else can hold a lock */
        if (errno != EINTR) {
            int e = errno;
            close(x);
            errno = e;
            return -1;
        }
    }
    return x;
}

/* A child forked without exec inherits every descriptor: its copies of the export
   descriptions (xfd) and of the imports (each a dup of one) would keep the shared flock
   that says an allocation is held, so the exporter's released allocations would linger
   until the child exits, where a GPU's fork copies no device allocation. The child closes
   them (its handles of the parent's are unusable there, as its contexts are). */
static void share_atfork_child(void)
{
    for (size_t i = 0; i < emu.handles_cap; i++) {
        struct emu_handle *h = &emu.handles[i];
        if (!h->dev)
            continue;
        if (h->kind == EMU_H_SHAREABLE && h->xfd >= 0) {
            close(h->xfd);
            h->xfd = -1;
        } else if (h->kind == EMU_H_IMPORTED && h->fd >= 0) {
            close(h->fd);
            h->fd = -1;
        }
    }
}

static void share_atfork_init(void)
{
    (void)pthread_atfork(NULL, NULL, share_atfork_child);
}

kcu_result emu_share_create_locked(struct emu_dev *d, size_t size, int *fd, int *xfd)
{
    static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
    (void)pthread_once(&fork_once, share_atfork_init);
    char name[64];
    snprintf(name, sizeof name, SHARE_PREFIX "%zu", d->gran);
    /* device memory is never executed: sealed so where the kernel can (6.3 and later), as
       vm.memfd_noexec does to every memfd on some systems */
    int f = memfd_create(name, MFD_CLOEXEC | MFD_NOEXEC_SEAL);
    if (f < 0 && errno == EINVAL)
        f = memfd_create(name, MFD_CLOEXEC);
    int x = -1;
    if (f < 0 || ftruncate(f, (off_t)size) != 0 || fchmod(f, share_mode(d->gran)) != 0 ||
        (x = export_open(f)) < 0) {
        klog_error("emulated device %d: a shareable allocation's memfd could not be made: %s",
                   d->ordinal, strerror(errno));
        if (f >= 0)
            close(f);
        return KCU_ERROR_OUT_OF_MEMORY;
    }
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    (void)pthread_once(&once, poison_init);
    if (!emu_fd_fill(f, 0, size, poison)) {
        klog_error("emulated device %d: a shareable allocation's memfd could not be "
                   "poisoned: %s", d->ordinal, strerror(errno));
        close(x);
        close(f);
        return KCU_ERROR_OUT_OF_MEMORY;
    }
    *fd = f;
    *xfd = x;
    return KCU_SUCCESS;
}

void emu_share_unexport(struct emu_handle *h)
{
    KVVM_ASSERT(h->kind == EMU_H_SHAREABLE);
    if (h->xfd >= 0)
        close(h->xfd);
    h->xfd = -1;
}

bool emu_share_held_elsewhere(const struct emu_handle *h)
{
    KVVM_ASSERT(h->kind == EMU_H_SHAREABLE && h->fd >= 0 && h->xfd < 0);
    /* The exporter's own description holds no lock; the export description holds a shared
       one while any descriptor of it is open: an export not closed yet, an import (a dup of
       it, here or in another process), their copies. The exporter's own descriptor of it
       (xfd) was closed at the release. */
    if (flock(h->fd, LOCK_EX | LOCK_NB) == 0)
        return false;               /* released by close() in emu_share_close */
    return errno == EWOULDBLOCK;
}

void emu_share_close(struct emu_handle *h)
{
    if (h->kind == EMU_H_SHAREABLE)
        emu_share_unexport(h);
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
}

void emu_share_reap_locked(struct emu_dev *d)
{
    if (!d->n_lingering)
        return;
    for (size_t i = 0; i < emu.handles_cap && d->n_lingering; i++) {
        struct emu_handle *h = &emu.handles[i];
        if (h->dev == d && h->lingering && !emu_share_held_elsewhere(h))
            emu_handle_free_now_locked(i);
    }
}

/* Errors: shareableHandle NULL, flags != 0, a stale, forged or released handle, or a handle
   not created with the POSIX file-descriptor type: KCU_ERROR_INVALID_VALUE (the driver
   lists only INVALID_VALUE for bad arguments: undocumented which); another handle type:
   KCU_ERROR_NOT_SUPPORTED; no descriptor left: KCU_ERROR_OUT_OF_MEMORY (logged). */
kcu_result emu_cuMemExportToShareableHandle(void *shareableHandle, kcu_mem_handle handle,
                                            int handleType, unsigned long long flags)
{
    BEGIN(cuMemExportToShareableHandle, F_INIT | F_STICKY);
    struct emu_handle *h = emu_handle_lookup_locked(handle, NULL);
    if (!shareableHandle || flags != 0 || !h) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if (handleType != KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        r = KCU_ERROR_NOT_SUPPORTED;
        goto out;
    }
    if (h->kind == EMU_H_PLAIN) {
        r = KCU_ERROR_INVALID_VALUE;      /* created without requestedHandleTypes */
        goto out;
    }
    if (h->xfd < 0) {                     /* closed at the release, or the parent's handle
                                             in a forked child (share_atfork_child) */
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    int fd = fcntl(h->xfd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        klog_error("emulated device %d: cuMemExportToShareableHandle: no descriptor: %s",
                   h->dev->ordinal, strerror(errno));
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    memcpy(shareableHandle, &fd, sizeof fd);
    h->dev->c.exports++;
out:
    return emu_leave(r);
}

/* The granule an emulated export's memfd was made with, or 0: not one. Its mode marks it
   and holds the granule (st: the import's fstat, no other system call). */
static size_t export_granule(const struct stat *st)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    (void)pthread_once(&once, shm_dev_init);
    if (!S_ISREG(st->st_mode) || !shm_dev || st->st_dev != shm_dev)
        return 0;                   /* not a memfd */
    return mode_granule(st->st_mode);   /* 0: not one of the emulator's exports */
}

/* The import (both entry points): fd checked by its fstat (every check the driver makes);
   take: the new handle keeps fd itself (closed at its release), else a dup of it. Errors:
   handle NULL, a descriptor that is not an emulated export, its size not a multiple of
   the current device's granule or its granule not the device's: KCU_ERROR_INVALID_VALUE;
   another handle type: KCU_ERROR_NOT_SUPPORTED; no slot or no descriptor:
   KCU_ERROR_OUT_OF_MEMORY. On a failure the caller keeps fd, taken or not. */
static kcu_result share_import(kcu_mem_handle *handle, int fd, int shHandleType, bool take)
{
    BEGIN(cuMemImportFromShareableHandle, F_INIT | F_CTX | F_STICKY);
    struct emu_dev *d = cur;
    int f = -1;
    size_t slot;
    struct stat st;
    if (!handle) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if (shHandleType != KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        r = KCU_ERROR_NOT_SUPPORTED;
        goto out;
    }
    size_t gran = fd < 0 || fstat(fd, &st) != 0 ? 0 : export_granule(&st);
    if (!gran || gran != d->gran || st.st_size <= 0 || (size_t)st.st_size % gran) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    size_t size = (size_t)st.st_size;
    /* the export description itself (no open, no flock): it holds the shared flock that
       tells the exporter this allocation is still held */
    if (emu_handle_slot_alloc_locked(&slot) ||
        (f = take ? fd : fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    /* no view: a mapping into a window is made from the memfd itself, and a copy reads and
       writes the memfd (copies.c) */
    emu.handles[slot] = (struct emu_handle){ .dev = d, .gen = emu.handles[slot].gen,
                                             .ngran = size / d->gran, .fd = f,
                                             .xfd = -1, .kind = EMU_H_IMPORTED };
    d->c.imported++;
    d->c.imported_bytes += size;
    d->c.imports++;
    *handle = emu_handle_value(slot);
out:
    return emu_leave(r);
}

/* As the driver: the caller keeps osHandle (the handle holds a dup of it). Errors:
   share_import's. */
kcu_result emu_cuMemImportFromShareableHandle(kcu_mem_handle *handle, void *osHandle,
                                              int shHandleType)
{
    return share_import(handle, (int)(intptr_t)osHandle, shHandleType, false);
}

kcu_result emu_import_take(kcu_mem_handle *handle, int fd)
{
    return share_import(handle, fd, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, true);
}
