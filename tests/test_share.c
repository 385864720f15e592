/* tests/test_share.c: shareable handles (POSIX file descriptors), the driver-level ground
   of the pool daemon: the emulated driver's cuMemExportToShareableHandle and
   cuMemImportFromShareableHandle (as strict as the driver: export refused for a handle
   made without the type, an imported allocation alive while an importer or an open
   export descriptor holds it after the exporter released it, accounted to the exporting
   device until then, one imported handle mapped at two addresses as the pool's held frames
   map it; and its costs: copies through the memfd with no view, an import a dup of the
   export description), and vmm.h's vmm_handle_export / vmm_handle_import (which takes its
   descriptor over: kept by the handle, closed once, at its release or its failure). The
   cross-process tests fork a real child (before the parent makes any handle, so it
   inherits none), pass the descriptor over a socketpair with SCM_RIGHTS, and compare
   bytes both ways. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "vmm/vmm.h"

#define KiB (1024ul)
#define MiB (1024ul * 1024ul)
#define G   (64 * KiB)

/* ---- descriptors over a socket ----------------------------------------------------------- */

static int send_fd(int sock, int fd, char tag)
{
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec io = { &tag, 1 };
    struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1 };
    if (fd >= 0) {
        m.msg_control = cbuf;
        m.msg_controllen = sizeof cbuf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

/* One tag byte and the descriptor it carries (-1: none). -1 on EOF or error. */
static int recv_fd(int sock, char *tag, int *fd)
{
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec io = { tag, 1 };
    struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf,
                        .msg_controllen = sizeof cbuf };
    ssize_t n;
    while ((n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
        ;
    if (n != 1)
        return -1;
    *fd = -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
        memcpy(fd, CMSG_DATA(c), sizeof *fd);
    return 0;
}

static int child_status(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        cr_assert_eq(errno, EINTR);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- the emulated driver --------------------------------------------------------------- */

static const struct kcu_api *A;

/* A fresh emulated device of granule G, its context current (windows CPU-accessible: the
   test reads bytes through them). Returns its ordinal, or -1 (in a child: no Criterion). */
static int dev_up(size_t gran)
{
    A = emu_api();
    struct emu_device_params p = { .capacity = 8 * MiB, .granule = gran };
    int ord;
    kcu_device dev;
    kcu_context ctx;
    if (emu_device_create(&p, &ord) || A->cuInit(0) || A->cuDeviceGet(&dev, ord) ||
        A->cuDevicePrimaryCtxRetain(&ctx, dev) || A->cuCtxSetCurrent(ctx))
        return -1;
    return ord;
}

static int create_typed(int ord, size_t bytes, int types, kcu_mem_handle *h)
{
    struct kcu_mem_alloc_prop p = { 0 };
    p.type = KCU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = KCU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = ord;
    p.requestedHandleTypes = types;
    return A->cuMemCreate(h, bytes, &p, 0);
}

/* Exports h and imports it in this process (the handle an importing client gets), closing
   the descriptor in between; asserts each step. */
static void import_own(kcu_mem_handle h, kcu_mem_handle *in)
{
    int fd = -1;
    cr_assert_eq(A->cuMemExportToShareableHandle(&fd, h,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemImportFromShareableHandle(in, (void *)(intptr_t)fd,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), KCU_SUCCESS);
    close(fd);
}

/* Maps h (bytes) read-write at a new reservation; returns the window, 0 on failure. */
static unsigned char *map_rw(int ord, kcu_mem_handle h, size_t bytes, kcu_deviceptr *va)
{
    struct kcu_mem_access_desc d = { .location = { KCU_MEM_LOCATION_TYPE_DEVICE, ord },
                                     .flags = KCU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    if (A->cuMemAddressReserve(va, bytes, 0, 0, 0) || A->cuMemMap(*va, bytes, 0, h, 0) ||
        A->cuMemSetAccess(*va, bytes, &d, 1))
        return NULL;
    return (unsigned char *)(uintptr_t)*va;
}

static void unmap(kcu_deviceptr va, size_t bytes)
{
    cr_assert_eq(A->cuMemUnmap(va, bytes), KCU_SUCCESS);
    cr_assert_eq(A->cuMemAddressFree(va, bytes), KCU_SUCCESS);
}

static bool all(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

Test(share_emu, export_refused_without_the_handle_type)
{
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    kcu_mem_handle plain, shared;
    cr_assert_eq(create_typed(ord, 2 * G, KCU_MEM_HANDLE_TYPE_NONE, &plain), KCU_SUCCESS);
    cr_assert_eq(create_typed(ord, 2 * G, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &shared),
                 KCU_SUCCESS);
    int fd = -1;
    cr_expect_eq(A->cuMemExportToShareableHandle(&fd, plain,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(fd, -1, "a refused export hands out nothing");
    cr_expect_eq(A->cuMemExportToShareableHandle(&fd, shared, 8 /* fabric */, 0),
                 KCU_ERROR_NOT_SUPPORTED);
    cr_expect_eq(A->cuMemExportToShareableHandle(NULL, shared,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemExportToShareableHandle(&fd, shared,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemExportToShareableHandle(&fd, shared + (1ull << 32),
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_ERROR_INVALID_VALUE,
                 "a forged handle");
    struct kcu_mem_alloc_prop p = { .type = KCU_MEM_ALLOCATION_TYPE_PINNED,
                                    .requestedHandleTypes = 2 /* win32 */,
                                    .location = { KCU_MEM_LOCATION_TYPE_DEVICE, ord } };
    kcu_mem_handle h;
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_ERROR_NOT_SUPPORTED);
    cr_assert_eq(A->cuMemRelease(plain), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(shared), KCU_SUCCESS);
    cr_expect_eq(A->cuMemExportToShareableHandle(&fd, shared,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_ERROR_INVALID_VALUE,
                 "a released handle");
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.handles + c.handle_bytes + c.lingering, 0);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord), 0);
}

/* The child's side of the cross-process tests: its own device, the descriptor received,
   imported and mapped; it checks the parent's bytes (0x11), writes its own (0x22) in the
   second half, acks, then on the parent's word (tag 'r') checks the first half again and
   releases. Exit 0 when every check held. */
static int importer(int sock, size_t bytes)
{
    int ord = dev_up(G);
    char tag;
    int fd;
    if (ord < 0 || recv_fd(sock, &tag, &fd) || fd < 0)
        return 10;
    kcu_mem_handle h;
    kcu_deviceptr va;
    if (A->cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                          KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return 11;
    close(fd);
    unsigned char *w = map_rw(ord, h, bytes, &va);
    if (!w)
        return 12;
    if (!all(w, bytes / 2, 0x11))
        return 13;
    memset(w + bytes / 2, 0x22, bytes / 2);
    struct emu_counters c;
    if (emu_counters_get(ord, &c) || c.imported != 1 || c.imported_bytes != bytes ||
        c.handles != 0)
        return 14;
    if (send_fd(sock, -1, 'a') || recv_fd(sock, &tag, &fd) || tag != 'r')
        return 15;
    if (!all(w, bytes / 2, 0x11))        /* still valid after the exporter's release */
        return 16;
    if (A->cuMemRelease(h) || A->cuMemUnmap(va, bytes) || A->cuMemAddressFree(va, bytes))
        return 17;
    if (emu_counters_get(ord, &c) || c.imported != 0)
        return 18;
    if (A->cuDevicePrimaryCtxRelease(ord) || emu_device_destroy(ord) != 0)
        return 19;
    return send_fd(sock, -1, 'd') ? 20 : 0;
}

Test(share_emu, export_import_across_processes_bytes_both_ways)
{
    TH_DEADLINE(60);
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    const size_t bytes = 4 * G;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        _exit(importer(sv[1], bytes));
    }
    close(sv[1]);
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    kcu_mem_handle h;
    cr_assert_eq(create_typed(ord, bytes, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h),
                 KCU_SUCCESS);
    kcu_deviceptr va;
    unsigned char *w = map_rw(ord, h, bytes, &va);
    cr_assert(w);
    cr_expect(all(w, bytes, EMU_POISON), "a new shareable allocation is poisoned");
    memset(w, 0x11, bytes / 2);
    int fd = -1;
    cr_assert_eq(A->cuMemExportToShareableHandle(&fd, h,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_SUCCESS);
    cr_assert_geq(fd, 0);
    cr_assert_eq(send_fd(sv[0], fd, 'f'), 0);
    close(fd);
    char tag;
    int none;
    cr_assert_eq(recv_fd(sv[0], &tag, &none), 0, "the child died: status %d",
                 child_status(pid));
    cr_expect(all(w + bytes / 2, bytes / 2, 0x22), "the importer's bytes, seen here");

    /* Released and unmapped here while the child maps it: alive there, and still this
       device's memory (lingering) until the child lets go. */
    unmap(va, bytes);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering, 1);
    cr_expect_eq(c.handle_bytes, bytes, "accounted to the exporting device");
    size_t fr, tot;
    cr_assert_eq(A->cuMemGetInfo(&fr, &tot), KCU_SUCCESS);
    cr_expect_eq(fr, tot - bytes);
    cr_assert_eq(send_fd(sv[0], -1, 'r'), 0);
    cr_assert_eq(recv_fd(sv[0], &tag, &none), 0, "child status %d", child_status(pid));
    cr_expect_eq(tag, 'd');
    cr_expect_eq(child_status(pid), 0, "the importer's checks (its exit code names one)");
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering + c.handles + c.handle_bytes, 0, "freed once the importer let go");
    cr_expect_eq(c.exports, 1);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord), 0);
    close(sv[0]);
}

/* An importer that dies (SIGKILL) lets go like one that releases. */
Test(share_emu, killed_importer_lets_go)
{
    TH_DEADLINE(60);
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        _exit(importer(sv[1], 2 * G));
    }
    close(sv[1]);
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    kcu_mem_handle h;
    cr_assert_eq(create_typed(ord, 2 * G, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h),
                 KCU_SUCCESS);
    kcu_deviceptr va;
    unsigned char *w = map_rw(ord, h, 2 * G, &va);
    cr_assert(w);
    memset(w, 0x11, G);
    int fd;
    cr_assert_eq(A->cuMemExportToShareableHandle(&fd, h,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_SUCCESS);
    cr_assert_eq(send_fd(sv[0], fd, 'f'), 0);
    close(fd);
    char tag;
    int none;
    cr_assert_eq(recv_fd(sv[0], &tag, &none), 0);
    unmap(va, 2 * G);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering, 1);
    kill(pid, SIGKILL);
    cr_expect_eq(child_status(pid), 128 + SIGKILL);
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering + c.handles + c.handle_bytes, 0);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord), 0);
}

/* Regression (take-back's cost, issue 34): a new shareable allocation was poisoned by a
   memset through its fresh view, one first-touch fault per 4 KiB page, which made most of
   the daemon's cost of a frame on a VM. It is written into the memfd now: the creating
   thread takes (almost) no fault, and every byte is still poison, in this process and in
   an importer's view. */
Test(share_emu, shareable_create_poisons_without_first_touch_faults)
{
    TH_DEADLINE(60);
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    const size_t bytes = 2 * MiB;           /* 512 pages of 4 KiB: 512 faults before */
    struct rusage r0, r1;
    kcu_mem_handle h;
    cr_assert_eq(getrusage(RUSAGE_THREAD, &r0), 0);
    cr_assert_eq(create_typed(ord, bytes, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h),
                 KCU_SUCCESS);
    cr_assert_eq(getrusage(RUSAGE_THREAD, &r1), 0);
    long faults = r1.ru_minflt - r0.ru_minflt + r1.ru_majflt - r0.ru_majflt;
    cr_expect_lt(faults, 64, "creating a 2 MiB shareable allocation took %ld page faults",
                 faults);
    kcu_mem_handle imp;
    import_own(h, &imp);
    kcu_deviceptr va, vb;
    unsigned char *w = map_rw(ord, h, bytes, &va), *x = map_rw(ord, imp, bytes, &vb);
    cr_assert(w && x);
    cr_expect(all(w, bytes, EMU_POISON), "every byte of the new allocation is poison");
    cr_expect(all(x, bytes, EMU_POISON), "every byte seen through an import is poison");
    unmap(va, bytes);
    unmap(vb, bytes);
    cr_assert_eq(A->cuMemRelease(imp), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
}


/* Mappings of emulated shareable memfds in this process (/proc/self/maps): views and
   windows alike. */
static int share_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert(f);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, "memfd:kvvm-emu-share:") != NULL;
    fclose(f);
    return n;
}

/* Maps h (bytes) read-write at a new reservation and copies src into it (HtoD). */
static kcu_deviceptr map_filled(int ord, kcu_mem_handle h, size_t bytes, const void *src)
{
    kcu_deviceptr va;
    cr_assert(map_rw(ord, h, bytes, &va));
    cr_assert_eq(A->cuMemcpyHtoDAsync(va, src, bytes, NULL), KCU_SUCCESS);
    return va;
}

/* Device bytes [va, va + n) read back (DtoH) equal want. */
static bool device_holds(kcu_deviceptr va, const unsigned char *want, size_t n)
{
    static unsigned char got[4 * G];
    cr_assert_leq(n, sizeof got);
    memset(got, 0, n);
    cr_assert_eq(A->cuMemcpyDtoHAsync(got, va, n, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);
    return memcmp(got, want, n) == 0;
}

/* Performance (issue 34, giving frames back): a shareable or imported handle's copies went
   through a view of its memfd that the first copy mapped (an mmap) and its release
   unmapped: a munmap, a TLB shoot-down of every CPU running the process's threads, 91-99%
   of a pool client's release of 64 imports. Copies read and write the memfd now: a create,
   an import and every kind of copy map nothing but the windows, and the bytes are the same
   memory the windows show: in, out, memset, device to device between two allocations,
   between a plain and a shared one both ways, and overlapping within one. */
Test(share_emu, copies_map_no_view)
{
    TH_DEADLINE(60);
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    int m0 = share_mappings();
    const size_t n = 4 * G;
    kcu_mem_handle h, in, h2, pl;
    cr_assert_eq(create_typed(ord, n, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h),
                 KCU_SUCCESS);
    cr_assert_eq(create_typed(ord, n, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h2),
                 KCU_SUCCESS);
    cr_assert_eq(create_typed(ord, n, KCU_MEM_HANDLE_TYPE_NONE, &pl), KCU_SUCCESS);
    import_own(h, &in);
    cr_expect_eq(share_mappings(), m0, "creates and an import mapped %d views",
                 share_mappings() - m0);
    static unsigned char src[4 * G], mod[4 * G], two[4 * G];   /* mod: what h holds */
    for (size_t i = 0; i < n; i++) {
        src[i] = (unsigned char)(i * 13 + 5);
        two[i] = (unsigned char)(i * 7 + 1);
    }
    kcu_deviceptr vb = map_filled(ord, in, n, src);       /* in through the import */
    kcu_deviceptr va, vc = map_filled(ord, pl, n, two), vd;
    unsigned char *w = map_rw(ord, h, n, &va), *w2 = map_rw(ord, h2, n, &vd);
    cr_assert(w && w2);
    memcpy(mod, src, n);
    cr_expect(device_holds(va, mod, n), "out through the exporter's handle: the same memory");
    cr_expect_eq(memcmp(w, mod, n), 0, "and seen through its window");
    cr_assert_eq(A->cuMemsetD8Async(vb + G + 3, 0x77, 2 * G, NULL), KCU_SUCCESS);
    memset(mod + G + 3, 0x77, 2 * G);
    cr_expect(device_holds(va, mod, n), "a memset through the import");
    static unsigned char mod2[4 * G];                    /* what h2 holds */
    cr_assert_eq(A->cuMemcpyDtoDAsync(vd, va, n, NULL), KCU_SUCCESS);   /* memfd to memfd */
    memcpy(mod2, mod, n);
    cr_expect(device_holds(vd, mod2, n), "device to device between two shared allocations");
    cr_expect_eq(memcmp(w2, mod2, n), 0);
    cr_assert_eq(A->cuMemcpyDtoDAsync(vc + G, vb, G, NULL), KCU_SUCCESS);   /* to plain */
    memcpy(two + G, mod, G);
    cr_expect(device_holds(vc, two, n), "shared to plain");
    cr_assert_eq(A->cuMemcpyDtoDAsync(vd + 2 * G, vc, G, NULL), KCU_SUCCESS); /* from plain */
    memcpy(mod2 + 2 * G, two, G);
    cr_expect(device_holds(vd, mod2, n), "plain to shared");
    /* overlapping, one allocation seen through its two handles: memmove's result */
    cr_assert_eq(A->cuMemcpyDtoDAsync(vb + 100, va, 2 * G, NULL), KCU_SUCCESS);
    memmove(mod + 100, mod, 2 * G);
    cr_expect(device_holds(va, mod, n), "an overlapping copy within one allocation");
    cr_expect_eq(share_mappings(), m0 + 3, "the three windows only, after every kind of copy "
                 "(%d mappings)", share_mappings() - m0);
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.memset_bytes, 2 * G);
    cr_expect_eq(c.copied_dtod, n + 2 * G + 2 * G);
    unmap(va, n);
    unmap(vb, n);
    unmap(vc, n);
    unmap(vd, n);
    cr_assert_eq(A->cuMemRelease(in), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(h2), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(pl), KCU_SUCCESS);
    cr_expect_eq(share_mappings(), m0);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord), 0);
}

/* A pool client maps a frame it received held at a second address (paging adopts the same
   handle as a second frame): the driver lets one handle, an imported one included, be
   mapped at several addresses, each mapping with its own access, and keeps its memory
   after cuMemRelease until the last mapping goes. The emulator must allow it too, as
   strict as the driver and no stricter. */
Test(share_emu, imported_handle_mapped_at_two_addresses)
{
    TH_DEADLINE(60);
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    kcu_mem_handle h, in;
    cr_assert_eq(create_typed(ord, G, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h),
                 KCU_SUCCESS);
    import_own(h, &in);
    kcu_deviceptr va, vb;
    unsigned char *x = map_rw(ord, in, G, &va), *y = map_rw(ord, in, G, &vb);
    cr_assert(x && y, "an imported handle mapped a second time");
    x[5] = 0x5a;
    cr_expect_eq(y[5], 0x5a, "one allocation through both addresses");
    cr_assert_eq(A->cuMemRelease(in), KCU_SUCCESS);     /* still mapped twice */
    unmap(va, G);
    y[7] = 0x7b;
    cr_expect_eq(y[5], 0x5a, "the second mapping keeps the memory after the release");
    unmap(vb, G);
    unsigned char *w = map_rw(ord, h, G, &va);
    cr_assert(w);
    cr_expect_eq(w[7], 0x7b, "the exporter's allocation is the one written");
    unmap(va, G);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
}

/* This process's open descriptors, as a bitmap of the first 1024 (/proc/self/fd). */
static void open_fds(unsigned char set[1024])
{
    memset(set, 0, 1024);
    char path[64];
    for (int fd = 0; fd < 1024; fd++) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        set[fd] = access(path, F_OK) == 0;
    }
}

/* The file offset of descriptor fd's open file description (/proc/self/fdinfo), or -1. */
static long fd_pos(int fd)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    long pos = -1;
    if (fscanf(f, "pos: %ld", &pos) != 1)
        pos = -1;
    fclose(f);
    return pos;
}

/* Performance (issue 34, an import per frame): an import opened the export's memfd anew
   (/proc/self/fd/N) and took a shared flock on its own description: an open, a flock and
   a close more per imported frame, on the client's path. The create makes the export
   description once (opened anew, locked shared) and an export is a dup of it; an import
   is a dup of the descriptor it is given: the same open file description (one file
   offset: an lseek of the export moves the import's), and one descriptor more. */
Test(share_emu, import_shares_the_export_description)
{
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    kcu_mem_handle h, in;
    cr_assert_eq(create_typed(ord, 2 * G, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h),
                 KCU_SUCCESS);
    int fd = -1, fd2 = -1;
    cr_assert_eq(A->cuMemExportToShareableHandle(&fd, h,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemExportToShareableHandle(&fd2, h,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_SUCCESS);
    static unsigned char before[1024], after[1024];
    open_fds(before);
    cr_assert_eq(A->cuMemImportFromShareableHandle(&in, (void *)(intptr_t)fd,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), KCU_SUCCESS);
    open_fds(after);
    int mine = -1, n_new = 0;
    for (int i = 0; i < 1024; i++)
        if (after[i] && !before[i]) {
            mine = i;
            n_new++;
        }
    cr_assert_eq(n_new, 1, "an import keeps one descriptor (%d new)", n_new);
    cr_assert_eq(lseek(fd, 3 * 4096, SEEK_SET), 3 * 4096);
    cr_expect_eq(fd_pos(mine), 3 * 4096, "the import's description is the export's");
    cr_expect_eq(fd_pos(fd2), 3 * 4096, "and every export's");
    /* the emulator reads and writes at offsets: the shared file offset changes nothing */
    kcu_deviceptr va, vb;
    unsigned char *w = map_rw(ord, h, 2 * G, &va), *x = map_rw(ord, in, 2 * G, &vb);
    cr_assert(w && x);
    static unsigned char src[2 * G];
    memset(src, 0x6b, sizeof src);
    cr_expect(!device_holds(va, src, sizeof src), "poison first");
    cr_assert_eq(A->cuMemcpyHtoDAsync(vb, src, sizeof src, NULL), KCU_SUCCESS);
    cr_expect(device_holds(va, src, sizeof src));
    cr_expect(all(w, 2 * G, 0x6b));
    close(fd);
    close(fd2);
    unmap(va, 2 * G);
    unmap(vb, 2 * G);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering, 1, "the import still holds it");
    cr_assert_eq(A->cuMemRelease(in), KCU_SUCCESS);
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering + c.handles + c.imported, 0);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord), 0);
}

/* cuMemRelease frees an allocation once its mappings and "all outstanding references to
   the handle (including its shareable counterparts)" are gone: an export descriptor left
   open, here or in another process, keeps a released shareable allocation (lingering,
   accounted to the device) until it is closed. */
Test(share_emu, an_unclosed_export_keeps_a_released_allocation)
{
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    kcu_mem_handle h;
    cr_assert_eq(create_typed(ord, 2 * G, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h),
                 KCU_SUCCESS);
    int fd = -1;
    cr_assert_eq(A->cuMemExportToShareableHandle(&fd, h,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering, 1, "the export descriptor still refers to it");
    cr_expect_eq(c.handle_bytes, 2 * G);
    close(fd);
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering + c.handles + c.handle_bytes, 0, "freed once it is closed");
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord), 0);
}

/* Regression (issue 34, the export description made at create): a process forked without
   exec after a handle was exported kept a copy of its export description (and of every
   import's), whose shared flock says the allocation is held: the parent's released
   allocation lingered, its granules taken, for as long as the child lived. The child now
   closes its copies at the fork (pthread_atfork), as a GPU's fork copies no device
   allocation: the release frees it while the child lives on. */
Test(share_emu, forked_child_does_not_keep_released_allocations)
{
    TH_DEADLINE(60);
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    kcu_mem_handle h, in;
    cr_assert_eq(create_typed(ord, G, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h),
                 KCU_SUCCESS);
    import_own(h, &in);
    int up[2], hold[2];
    cr_assert_eq(pipe(up), 0);
    cr_assert_eq(pipe(hold), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {                     /* lives on, its handlers run: says so, waits */
        char x = 'r';
        close(up[0]);
        close(hold[1]);
        if (write(up[1], &x, 1) != 1 || read(hold[0], &x, 1) < 0)
            _exit(1);
        _exit(0);
    }
    close(up[1]);
    close(hold[0]);
    char x;
    cr_assert_eq(read(up[0], &x, 1), 1);
    cr_assert_eq(A->cuMemRelease(in), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering + c.handles + c.handle_bytes, 0, "freed while the forked child "
                 "lives (lingering %llu)", (unsigned long long)c.lingering);
    close(hold[1]);                     /* the child ends */
    cr_expect_eq(child_status(pid), 0);
    close(up[0]);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord), 0);
}

/* Guard (the export description shared by every import): two importers in two processes
   hold one description between them; the exporter's release leaves the allocation
   lingering until both have let go, not until the first. */
Test(share_emu, two_importers_linger_until_both_close)
{
    TH_DEADLINE(60);
    const size_t bytes = 2 * G;
    int sv[2][2];
    pid_t pid[2];
    for (int k = 0; k < 2; k++) {              /* forked first: they inherit no handle */
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv[k]), 0);
        pid[k] = fork();
        cr_assert_geq(pid[k], 0);
        if (pid[k] == 0) {
            close(sv[k][0]);
            _exit(importer(sv[k][1], bytes));
        }
        close(sv[k][1]);
    }
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    kcu_mem_handle h;
    cr_assert_eq(create_typed(ord, bytes, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h),
                 KCU_SUCCESS);
    kcu_deviceptr va;
    unsigned char *w = map_rw(ord, h, bytes, &va);
    cr_assert(w);
    memset(w, 0x11, bytes / 2);
    int fd = -1;
    cr_assert_eq(A->cuMemExportToShareableHandle(&fd, h,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_SUCCESS);
    char tag;
    int none;
    for (int k = 0; k < 2; k++)
        cr_assert_eq(send_fd(sv[k][0], fd, 'f'), 0);
    close(fd);
    for (int k = 0; k < 2; k++)
        cr_assert_eq(recv_fd(sv[k][0], &tag, &none), 0, "importer %d died: status %d", k,
                     child_status(pid[k]));
    unmap(va, bytes);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    struct emu_counters c;
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(emu_counters_get(ord, &c), 0);
        cr_expect_eq(c.lingering, 1, "held by %d importer(s)", 2 - k);
        cr_expect_eq(c.handle_bytes, bytes);
        cr_assert_eq(send_fd(sv[k][0], -1, 'r'), 0);
        cr_assert_eq(recv_fd(sv[k][0], &tag, &none), 0, "status %d", child_status(pid[k]));
        cr_expect_eq(tag, 'd');
        cr_expect_eq(child_status(pid[k]), 0, "importer %d's checks (its exit code)", k);
        close(sv[k][0]);
    }
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering + c.handles + c.handle_bytes, 0, "freed once both let go");
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord), 0);
}

/* The import identifies an emulated export by its mode (the fstat it makes for the size),
   not by reading its name: a memfd that merely carries an export's name is not one. */
Test(share_emu, import_refuses_a_memfd_that_only_has_an_exports_name)
{
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    char name[64];
    snprintf(name, sizeof name, "kvvm-emu-share:%lu", G);
    int forged = memfd_create(name, MFD_CLOEXEC);
    cr_assert_geq(forged, 0);
    cr_assert_eq(ftruncate(forged, (off_t)(2 * G)), 0);
    kcu_mem_handle in;
    cr_expect_eq(A->cuMemImportFromShareableHandle(&in, (void *)(uintptr_t)forged,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), KCU_ERROR_INVALID_VALUE);
    close(forged);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord), 0);
}

/* Regression (the import's mode check): an export's mode held log2 of its granule in the
   group and other bits, execute bits included (4 KiB: 014, 2 MiB: 025), and a memfd sealed
   against execution (MFD_NOEXEC_SEAL, which the emulator asks for, or vm.memfd_noexec on
   some systems) refuses such a mode: creating a shareable allocation of those granules
   failed. Every granule of the emulator's range exports, imports and maps. */
Test(share_emu, every_granule_exports_and_imports)
{
    TH_DEADLINE(60);
    const size_t grans[] = { 4 * KiB, 8 * KiB, 64 * KiB, 1 * MiB, 2 * MiB };
    for (size_t g = 0; g < sizeof grans / sizeof *grans; g++) {
        size_t gran = grans[g];
        struct emu_device_params p = { .capacity = 8 * MiB, .granule = gran };
        int ord;
        kcu_context ctx;
        cr_assert_eq(emu_device_create(&p, &ord), 0);
        A = emu_api();
        cr_assert_eq(A->cuInit(0), KCU_SUCCESS);
        cr_assert_eq(A->cuDevicePrimaryCtxRetain(&ctx, ord), KCU_SUCCESS);
        cr_assert_eq(A->cuCtxSetCurrent(ctx), KCU_SUCCESS);
        kcu_mem_handle h, in;
        cr_assert_eq(create_typed(ord, 2 * gran, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                  &h), KCU_SUCCESS, "a shareable allocation, granule %zu", gran);
        import_own(h, &in);
        kcu_deviceptr va, vb;
        unsigned char *w = map_rw(ord, h, 2 * gran, &va), *x = map_rw(ord, in, 2 * gran, &vb);
        cr_assert(w && x);
        memset(w, 0x3c, 2 * gran);
        cr_expect(all(x, 2 * gran, 0x3c), "the same memory, granule %zu", gran);
        unmap(va, 2 * gran);
        unmap(vb, 2 * gran);
        cr_assert_eq(A->cuMemRelease(in), KCU_SUCCESS);
        cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
        cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
        cr_expect_eq(emu_device_destroy(ord), 0);
    }
}

Test(share_emu, import_checks_its_descriptor)
{
    int ord = dev_up(G);
    cr_assert_geq(ord, 0);
    kcu_mem_handle h, in;
    cr_assert_eq(create_typed(ord, 2 * G, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h),
                 KCU_SUCCESS);
    int fd;
    cr_assert_eq(A->cuMemExportToShareableHandle(&fd, h,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), KCU_SUCCESS);
    int other = memfd_create("not-an-export", MFD_CLOEXEC);
    cr_assert_geq(other, 0);
    cr_assert_eq(ftruncate(other, (off_t)(2 * G)), 0);
    cr_expect_eq(A->cuMemImportFromShareableHandle(&in, (void *)(uintptr_t)other,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemImportFromShareableHandle(&in, (void *)(uintptr_t)999,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemImportFromShareableHandle(&in, (void *)(uintptr_t)fd, 8),
                 KCU_ERROR_NOT_SUPPORTED);
    cr_expect_eq(A->cuMemImportFromShareableHandle(NULL, (void *)(uintptr_t)fd,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), KCU_ERROR_INVALID_VALUE);
    /* a device of another granule cannot map it */
    struct emu_device_params p2 = { .capacity = 8 * MiB, .granule = 2 * G };
    int ord2;
    kcu_context ctx2;
    cr_assert_eq(emu_device_create(&p2, &ord2), 0);
    cr_assert_eq(A->cuDevicePrimaryCtxRetain(&ctx2, ord2), KCU_SUCCESS);
    cr_assert_eq(A->cuCtxSetCurrent(ctx2), KCU_SUCCESS);
    cr_expect_eq(A->cuMemImportFromShareableHandle(&in, (void *)(uintptr_t)fd,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), KCU_ERROR_INVALID_VALUE);
    /* an import left unreleased is a leak of the importing device */
    kcu_mem_handle leaked;
    cr_assert_eq(A->cuMemImportFromShareableHandle(&leaked, (void *)(uintptr_t)fd,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), KCU_ERROR_INVALID_VALUE,
                 "granule 2G device: refused");
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord2), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord2), 0);
    kcu_device dev;
    kcu_context ctx;
    cr_assert_eq(A->cuDeviceGet(&dev, ord), KCU_SUCCESS);
    cr_assert_eq(A->cuDevicePrimaryCtxRetain(&ctx, dev), KCU_SUCCESS);
    cr_assert_eq(A->cuCtxSetCurrent(ctx), KCU_SUCCESS);
    /* in the same process: a second handle of the same memory */
    cr_assert_eq(A->cuMemImportFromShareableHandle(&in, (void *)(uintptr_t)fd,
                 KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), KCU_SUCCESS);
    close(fd);
    close(other);
    cr_expect_neq(in, h);
    kcu_deviceptr va1, va2;
    unsigned char *w1 = map_rw(ord, h, 2 * G, &va1), *w2 = map_rw(ord, in, 2 * G, &va2);
    cr_assert(w1 && w2);
    memset(w1, 0x5c, 2 * G);
    cr_expect(all(w2, 2 * G, 0x5c));
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.imported, 1);
    cr_expect_eq(c.handles, 1, "an import is not a new allocation of the device");
    unmap(va1, 2 * G);
    unmap(va2, 2 * G);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering, 1, "the import still holds it");
    cr_assert_eq(A->cuMemRelease(in), KCU_SUCCESS);
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    cr_expect_eq(c.lingering + c.handles + c.imported, 0);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord), 0);
}

/* ---- vmm.h --------------------------------------------------------------------------- */

static struct vmm *open_vmm(int shareable)
{
    struct vmm_params p = { .backend = KVVM_BACKEND_EMULATED, .emu_capacity = 8 * MiB,
                            .emu_granule = G, .emu_opaque = 1, .shareable = shareable };
    struct vmm *v = NULL;
    return vmm_open(&p, &v) ? NULL : v;
}

/* The child: imports through vmm.h, checks 0x11 in the first half through a copy, writes
   0x22 in the second, acks. */
static int vmm_importer(int sock, size_t bytes)
{
    struct vmm *v = open_vmm(0);
    char tag;
    int fd;
    if (!v || recv_fd(sock, &tag, &fd) || fd < 0)
        return 10;
    vmm_handle h;
    uint64_t base;
    if (vmm_handle_import(v, fd, bytes, &h) || vmm_reserve(v, bytes, &base) ||
        vmm_map_run(v, base, &h, 1, bytes))
        return 11;                      /* the import took fd over */
    unsigned char *buf = malloc(bytes);
    if (!buf || vmm_copy_dtoh(v, buf, base, bytes, NULL) || vmm_stream_sync(v, NULL))
        return 12;
    if (!all(buf, bytes / 2, 0x11))
        return 13;
    memset(buf, 0x22, bytes);
    if (vmm_copy_htod(v, base + bytes / 2, buf, bytes / 2, NULL) || vmm_stream_sync(v, NULL))
        return 14;
    free(buf);
    if (vmm_unmap(v, base, bytes) || vmm_phys_release(v, h))
        return 15;
    vmm_unreserve(v);
    vmm_close(v);
    return send_fd(sock, -1, 'a') ? 16 : 0;
}

Test(share_vmm, export_import_across_processes)
{
    TH_DEADLINE(60);
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    const size_t bytes = 2 * G;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        _exit(vmm_importer(sv[1], bytes));
    }
    close(sv[1]);
    struct vmm *v = open_vmm(1);
    cr_assert(v);
    vmm_handle h;
    uint64_t base;
    cr_assert_eq(vmm_phys_create(v, bytes, &h), 0);
    cr_assert_eq(vmm_reserve(v, bytes, &base), 0);
    cr_assert_eq(vmm_map_run(v, base, &h, 1, bytes), 0);
    cr_assert_eq(vmm_memset(v, base, 0x11, bytes, NULL), 0);
    cr_assert_eq(vmm_stream_sync(v, NULL), 0);
    int fd = -1;
    cr_assert_eq(vmm_handle_export(v, h, &fd), 0);
    cr_assert_eq(send_fd(sv[0], fd, 'f'), 0);
    close(fd);
    char tag;
    int none;
    cr_assert_eq(recv_fd(sv[0], &tag, &none), 0, "child status %d", child_status(pid));
    cr_expect_eq(child_status(pid), 0, "the importer's checks (its exit code names one)");
    unsigned char *buf = malloc(bytes);
    cr_assert(buf);
    cr_assert_eq(vmm_copy_dtoh(v, buf, base, bytes, NULL), 0);
    cr_assert_eq(vmm_stream_sync(v, NULL), 0);
    cr_expect(all(buf, bytes / 2, 0x11));
    cr_expect(all(buf + bytes / 2, bytes / 2, 0x22), "the importer's bytes, seen here");
    free(buf);
    cr_assert_eq(vmm_unmap(v, base, bytes), 0);
    cr_assert_eq(vmm_phys_release(v, h), 0);
    vmm_unreserve(v);
    vmm_close(v);
    close(sv[0]);
}

Test(share_vmm, export_refused_without_shareable)
{
    struct vmm *v = open_vmm(0);
    cr_assert(v);
    vmm_handle h;
    cr_assert_eq(vmm_phys_create(v, G, &h), 0);
    int fd = -1;
    cr_expect_eq(vmm_handle_export(v, h, &fd), -EINVAL);
    cr_expect_eq(fd, -1);
    cr_expect_eq(vmm_handle_import(v, -1, G, &h), -EINVAL);
    cr_assert_eq(vmm_phys_release(v, h), 0);
    vmm_close(v);
}

static bool fd_open(int fd)
{
    return fcntl(fd, F_GETFD) != -1 || errno != EBADF;
}

/* vmm_handle_import takes its descriptor over (vmm.h): the emulated handle keeps the very
   descriptor it is given (no dup: before, an import made a dup and its caller a close, two
   system calls per imported frame on a pool client's path) and its release closes it, once;
   the caller never closes it. */
Test(share_vmm, import_takes_the_descriptor_over)
{
    struct vmm *v = open_vmm(1);
    cr_assert(v);
    vmm_handle h, in;
    cr_assert_eq(vmm_phys_create(v, G, &h), 0);
    int fd = -1;
    cr_assert_eq(vmm_handle_export(v, h, &fd), 0);
    static unsigned char before[1024], after[1024];
    open_fds(before);
    cr_assert_eq(vmm_handle_import(v, fd, G, &in), 0);
    open_fds(after);
    cr_expect_eq(memcmp(before, after, sizeof before), 0, "the import made no descriptor");
    cr_expect(fd_open(fd), "the imported handle holds the descriptor it was given");
    uint64_t base;
    cr_assert_eq(vmm_reserve(v, G, &base), 0);
    cr_assert_eq(vmm_map_run(v, base, &in, 1, G), 0);
    cr_assert_eq(vmm_unmap(v, base, G), 0);
    cr_expect(fd_open(fd), "unmapped, still held by the handle");
    cr_assert_eq(vmm_phys_release(v, in), 0);
    cr_expect(!fd_open(fd), "the release closed it");
    cr_assert_eq(vmm_phys_release(v, h), 0);
    vmm_unreserve(v);
    vmm_close(v);
}

/* n exports of fresh frames of v into fds and hs. */
static void exports(struct vmm *v, vmm_handle *hs, int *fds, int n)
{
    for (int i = 0; i < n; i++) {
        cr_assert_eq(vmm_phys_create(v, G, &hs[i]), 0);
        cr_assert_eq(vmm_handle_export(v, hs[i], &fds[i]), 0);
    }
}

/* vmm_handles_import (vmm.h): a pool client imports each FRAMES message's descriptors in
   one call, which checks the current context once for the batch, not once per import. */
Test(share_vmm, batch_import_checks_the_context_once)
{
    struct vmm *v = open_vmm(1);
    cr_assert(v);
    enum { N = 16 };
    vmm_handle hs[N], in[N];
    int fds[N];
    size_t done = 0;
    exports(v, hs, fds, N);
    struct emu_calls a, b;
    cr_assert_eq(emu_thread_calls_get(&a), 0);
    cr_assert_eq(vmm_handles_import(v, fds, N, G, in, &done), 0);
    cr_assert_eq(emu_thread_calls_get(&b), 0);
    cr_expect_eq(done, N);
    cr_expect_eq(b.cuMemImportFromShareableHandle - a.cuMemImportFromShareableHandle, N);
    cr_expect_eq(b.cuCtxGetCurrent - a.cuCtxGetCurrent, 1, "%lu context checks for %d imports",
                 (unsigned long)(b.cuCtxGetCurrent - a.cuCtxGetCurrent), N);
    for (int i = 0; i < N; i++) {
        cr_expect(fd_open(fds[i]), "import %d holds its descriptor", i);
        cr_assert_eq(vmm_phys_release(v, in[i]), 0);
        cr_assert_eq(vmm_phys_release(v, hs[i]), 0);
    }
    vmm_close(v);
}

/* The batch stops at its first failure (vmm.h): the handles made before it are the
   caller's, every descriptor from the failed one on is closed; a negative descriptor
   anywhere refuses the batch before anything is taken. */
Test(share_vmm, batch_import_failing_midway_closes_the_rest)
{
    struct vmm *v = open_vmm(1);
    cr_assert(v);
    enum { N = 6 };
    vmm_handle hs[N], in[N];
    int fds[N];
    size_t done = 99;
    exports(v, hs, fds, N);
    int bad[2] = { fds[0], -1 };
    cr_expect_eq(vmm_handles_import(v, bad, 2, G, in, &done), -EINVAL);
    cr_expect_eq(done, 0);
    cr_expect(fd_open(fds[0]), "nothing taken");
    cr_assert_eq(emu_fail_arm("cuMemImportFromShareableHandle", 3, KCU_ERROR_OUT_OF_MEMORY),
                 0);
    cr_expect_eq(vmm_handles_import(v, fds, N, G, in, &done), -ENOMEM);
    cr_expect_eq(done, 2, "the two imports before the refused third");
    for (int i = 0; i < N; i++)
        cr_expect_eq(fd_open(fds[i]), i < 2, "descriptor %d %s", i,
                     i < 2 ? "held by its handle" : "closed");
    struct vmm_debug_objects o;
    cr_assert_eq(vmm_debug_objects(v, &o), 0);
    cr_expect_eq(o.handles, N + 2, "the frames and the two imports");
    for (int i = 0; i < N; i++) {
        if (i < 2)
            cr_assert_eq(vmm_phys_release(v, in[i]), 0);
        cr_assert_eq(vmm_phys_release(v, hs[i]), 0);
    }
    vmm_close(v);
}

/* The rule for a failed import (vmm.h): the descriptor is taken over whatever the outcome,
   so a refused one is closed before the return (a descriptor that is no export, a size that
   is not a multiple of the granule, the driver's refusal); fd -1 is refused, nothing
   closed. */
Test(share_vmm, failed_import_closes_the_descriptor)
{
    struct vmm *v = open_vmm(1);
    cr_assert(v);
    vmm_handle h, in = { 0 };
    cr_assert_eq(vmm_phys_create(v, G, &h), 0);
    int other = memfd_create("not-an-export", MFD_CLOEXEC);
    cr_assert_geq(other, 0);
    cr_assert_eq(ftruncate(other, (off_t)G), 0);
    cr_expect_eq(vmm_handle_import(v, other, G, &in), -EINVAL, "no emulated export");
    cr_expect(!fd_open(other), "closed on the driver's refusal");
    int fd = -1;
    cr_assert_eq(vmm_handle_export(v, h, &fd), 0);
    cr_expect_eq(vmm_handle_import(v, fd, G + 1, &in), -EINVAL);
    cr_expect(!fd_open(fd), "closed on a bad size");
    cr_assert_eq(vmm_handle_export(v, h, &fd), 0);
    cr_assert_eq(emu_fail_arm("cuMemImportFromShareableHandle", 1, KCU_ERROR_OUT_OF_MEMORY),
                 0);
    cr_expect_eq(vmm_handle_import(v, fd, G, &in), -ENOMEM);
    cr_expect(!fd_open(fd), "closed on an injected refusal");
    cr_expect_eq(vmm_handle_import(v, -1, G, &in), -EINVAL);
    cr_expect_eq(in.h, 0, "nothing imported");
    struct vmm_debug_objects o;
    cr_assert_eq(vmm_debug_objects(v, &o), 0);
    cr_expect_eq(o.handles, 1, "only the frame: no import kept");
    cr_assert_eq(vmm_phys_release(v, h), 0);
    vmm_close(v);
}
