/*
 * vmm/emu/copies.c: copies and memsets: validation at the call, translation through the
 * mapping table and execution in the stream (cuMemcpy*Async, cuMemsetD8Async).
 * A plain handle's bytes are reached through the device's view (memcpy); a shareable or
 * imported handle's through its own memfd (pread, pwrite, pwritev of a filled buffer),
 * never through a mapping of the emulator's own: no mmap per copied handle, and its
 * release is a close (a munmap there cost a TLB shoot-down of every CPU running one of
 * the process's threads).
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

#include <sched.h>
#include <stdio.h>
#include <unistd.h>

/* ---- copies ------------------------------------------------------------------------- */

/* Translates device address va for an access needing `need` by device d: where its bytes
   are (emu_handle_loc: the device's view, or a shared allocation's memfd and offset) and
   the length (<= want) of the contiguous run it starts. False and a reason when the address
   is not mapped with that access. */
static bool xlate_locked(struct emu_dev *d, kcu_deviceptr va, size_t want, int need,
                         struct emu_loc *at, size_t *run, const char **why)
{
    struct emu_resv *rv = emu_resv_find_locked((uintptr_t)va);
    if (!rv) {
        *why = "not a reserved address";
        return false;
    }
    size_t idx = ((uintptr_t)va - rv->base) / rv->gran;
    size_t in = ((uintptr_t)va - rv->base) % rv->gran;
    struct emu_ent *e = emu_ent_get(rv, idx);
    if (!e || !e->h1) {
        *why = "not mapped";
        return false;
    }
    struct emu_handle *h = &emu.handles[e->h1 - 1];
    if (h->dev != d) {
        *why = "memory of another device (peer access is not emulated)";
        return false;
    }
    if (((int)e->access & need) != need) {
        *why = need & NEED_W ? "not writable (cuMemSetAccess)" : "not readable (cuMemSetAccess)";
        return false;
    }
    size_t len = rv->gran - in;
    for (size_t k = idx + 1; len < want && k < rv->ngran; k++) {
        struct emu_ent *f = emu_ent_get(rv, k);
        if (!f || f->map_id != e->map_id || ((int)f->access & need) != need)
            break;
        len += rv->gran;
    }
    *run = min_sz(len, want);
    emu_handle_loc(h, e->off * d->gran + in, at);
    return true;
}

/* True when every byte of [va, va + n) is mapped (any access): copies are refused up front
   with KCU_ERROR_INVALID_VALUE on addresses the driver does not know. */
bool emu_range_known_locked(kcu_deviceptr va, size_t n)
{
    while (n) {
        struct emu_resv *rv = emu_resv_find_locked((uintptr_t)va);
        if (!rv)
            return false;
        size_t idx = ((uintptr_t)va - rv->base) / rv->gran;
        if (!emu_ent_mapped(rv, idx))
            return false;
        size_t step = min_sz(n, rv->gran - ((uintptr_t)va - rv->base) % rv->gran);
        va += step;
        n -= step;
    }
    return true;
}

static void device_fault_locked(struct emu_dev *d, kcu_deviceptr va, const char *why)
{
    if (!d->sticky)
        klog_error("emulated device %d: illegal address 0x%llx (%s): the device is dead, "
                   "every later call returns CUDA_ERROR_ILLEGAL_ADDRESS", d->ordinal, va, why);
    d->sticky = KCU_ERROR_ILLEGAL_ADDRESS;
}

/* The bounce buffer of a copy between two shared allocations' memfds, and the filled
   buffer of a memset into one: used within one chunk of emu_xfer_locked, under emu.lock. */
static unsigned char bounce[XFER_CHUNK];

/* Reads (write: writes) n bytes of memfd f at off into (from) p, partial transfers
   resumed. False (errno set) on an error or an end of file. */
static bool fd_io(int f, bool write, void *p, size_t n, off_t off)
{
    unsigned char *b = p;
    while (n) {
        ssize_t k = write ? pwrite(f, b, n, off) : pread(f, b, n, off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (k == 0)
                errno = EIO;                /* past the end: the memfd was shrunk */
            return false;
        }
        b += k;
        off += k;
        n -= (size_t)k;
    }
    return true;
}

/* Moves one run of op (n bytes at pos) between host memory and device bytes at dst / src
   (emu_loc). A view is reached with memcpy, a memfd with pread / pwrite; a copy between
   two memfds (which may be the same allocation, overlapping) reads the whole run into the
   bounce buffer before it writes, as memmove would. False (errno) when a memfd refused. */
static bool run_move_locked(const struct emu_op *op, size_t pos, size_t n,
                            const struct emu_loc *dst, const struct emu_loc *src)
{
    switch (op->kind) {
    case OP_HTOD:
        if (!dst->p)
            return fd_io(dst->fd, true, (unsigned char *)(uintptr_t)op->hsrc + pos, n,
                         dst->off);
        memcpy(dst->p, (const unsigned char *)op->hsrc + pos, n);
        return true;
    case OP_DTOH:
        if (!src->p)
            return fd_io(src->fd, false, (unsigned char *)op->hdst + pos, n, src->off);
        memcpy((unsigned char *)op->hdst + pos, src->p, n);
        return true;
    case OP_DTOD:
        if (dst->p && src->p) {
            memmove(dst->p, src->p, n);
            return true;
        }
        if (dst->p)                         /* a view and a memfd: never the same memory */
            return fd_io(src->fd, false, dst->p, n, src->off);
        if (src->p)
            return fd_io(dst->fd, true, src->p, n, dst->off);
        KVVM_ASSERT(n <= sizeof bounce);
        return fd_io(src->fd, false, bounce, n, src->off) &&
               fd_io(dst->fd, true, bounce, n, dst->off);
    case OP_MEMSET:
        if (dst->p) {
            memset(dst->p, op->val, n);
            return true;
        }
        memset(bounce, op->val, min_sz(n, EMU_FILL_BYTES));
        return emu_fd_fill(dst->fd, dst->off, n, bounce);
    default:
        return true;
    }
}

/* Executes a copy or memset on device d, translating at execution time. The lock is dropped
   between chunks. A fault makes the device's error sticky and stops the copy. */
void emu_xfer_locked(struct emu_dev *d, struct emu_op *op)
{
    size_t done = 0;
    while (done < op->n && !d->sticky) {
        size_t chunk = min_sz(op->n - done, XFER_CHUNK), cd = 0;
        while (cd < chunk) {
            size_t pos = done + cd, want = chunk - cd, run = want, run2;
            struct emu_loc dl = { 0 }, sl = { 0 };
            const char *why = NULL;
            if (op->kind != OP_DTOH && !xlate_locked(d, op->dst + pos, want, NEED_W, &dl,
                                                     &run, &why)) {
                device_fault_locked(d, op->dst + pos, why);
                return;
            }
            if (op->kind == OP_DTOH || op->kind == OP_DTOD) {
                if (!xlate_locked(d, op->src + pos, run, NEED_R, &sl, &run2, &why)) {
                    device_fault_locked(d, op->src + pos, why);
                    return;
                }
                run = min_sz(run, run2);
            }
            if (!run_move_locked(op, pos, run, &dl, &sl)) {
                /* a bad host pointer (EFAULT), or a memfd out of memory or shrunk */
                char msg[160];
                snprintf(msg, sizeof msg, "a shared allocation's memfd refused the copy (a "
                         "bad host pointer, or no memory): %s", strerror(errno));
                device_fault_locked(d, op->kind == OP_DTOH ? op->src + pos : op->dst + pos,
                                    msg);
                return;
            }
            cd += run;
        }
        done += chunk;
        switch (op->kind) {
        case OP_HTOD: d->c.copied_htod += chunk; break;
        case OP_DTOH: d->c.copied_dtoh += chunk; break;
        case OP_DTOD: d->c.copied_dtod += chunk; break;
        case OP_MEMSET: d->c.memset_bytes += chunk; break;
        default: break;
        }
        if (done < op->n) {        /* let map/unmap calls in between, as a GPU would */
            pthread_mutex_unlock(&emu.lock);
            sched_yield();         /* the mutex is unfair: give waiters a real chance */
            pthread_mutex_lock(&emu.lock);
        }
    }
}

/* True when [p, p + n) overlaps a reservation: device virtual memory, not host memory. */
static bool host_in_resv_locked(const void *p, size_t n)
{
    uintptr_t b = (uintptr_t)p;
    for (size_t i = 0; i < emu.nresv; i++) {
        struct emu_resv *rv = emu.resvs[i];
        if (b < rv->base + rv->size && (b >= rv->base || rv->base - b < n))
            return true;
    }
    return false;
}

/* Common part of the four copy entry points. Zero bytes: success, nothing queued.
   Device ranges the driver does not know (not mapped), NULL host pointers, or a host side
   inside a reservation (a device address: on a GPU it is not host memory at all, even where
   the emulator's windows are CPU-readable): KCU_ERROR_INVALID_VALUE at call time; access is
   checked when the copy runs. */
static kcu_result copy_submit_locked(struct emu_dev *cur, kcu_stream stream, struct emu_op *tmpl)
{
    struct kcu_stream_st *s;
    struct emu_dev *d;
    kcu_result r = emu_stream_arg_locked(stream, cur, &s, &d);
    if (r)
        return r;
    if (tmpl->n == 0)
        return KCU_SUCCESS;
    bool dw = tmpl->kind != OP_DTOH, sr = tmpl->kind == OP_DTOH || tmpl->kind == OP_DTOD;
    if ((tmpl->kind == OP_HTOD && !tmpl->hsrc) || (tmpl->kind == OP_DTOH && !tmpl->hdst) ||
        (dw && (tmpl->dst + tmpl->n < tmpl->dst || !emu_range_known_locked(tmpl->dst, tmpl->n))) ||
        (sr && (tmpl->src + tmpl->n < tmpl->src || !emu_range_known_locked(tmpl->src, tmpl->n))) ||
        (tmpl->kind == OP_HTOD && host_in_resv_locked(tmpl->hsrc, tmpl->n)) ||
        (tmpl->kind == OP_DTOH && host_in_resv_locked(tmpl->hdst, tmpl->n)))
        return KCU_ERROR_INVALID_VALUE;
    struct emu_op *op = malloc(sizeof *op);
    if (!op)
        return KCU_ERROR_OUT_OF_MEMORY;
    *op = *tmpl;
    /* Pageable host memory is treated like pinned memory: the copy reads or fills it when
       the stream reaches it, never at the call. The driver documents no more than "for
       transfers between device memory and pageable host memory, the function might be
       synchronous with respect to host" (CUDA Driver API, "API synchronization behavior",
       Async), so a caller that reuses a source or reads a destination before the stream
       got there is wrong on a GPU too; here it reads the wrong bytes every time. */
    return emu_submit_locked(s, d, op);
}

kcu_result emu_cuMemcpyHtoDAsync(kcu_deviceptr dst, const void *src, size_t bytes,
                                        kcu_stream stream)
{
    BEGIN(cuMemcpyHtoDAsync, F_INIT | F_CTX | F_STICKY);
    r = copy_submit_locked(cur, stream, &(struct emu_op){ .kind = OP_HTOD, .dst = dst,
                                                          .hsrc = src, .n = bytes });
out:
    return emu_leave(r);
}

kcu_result emu_cuMemcpyDtoHAsync(void *dst, kcu_deviceptr src, size_t bytes,
                                        kcu_stream stream)
{
    BEGIN(cuMemcpyDtoHAsync, F_INIT | F_CTX | F_STICKY);
    r = copy_submit_locked(cur, stream, &(struct emu_op){ .kind = OP_DTOH, .hdst = dst,
                                                          .src = src, .n = bytes });
out:
    return emu_leave(r);
}

kcu_result emu_cuMemcpyDtoDAsync(kcu_deviceptr dst, kcu_deviceptr src, size_t bytes,
                                        kcu_stream stream)
{
    BEGIN(cuMemcpyDtoDAsync, F_INIT | F_CTX | F_STICKY);
    r = copy_submit_locked(cur, stream, &(struct emu_op){ .kind = OP_DTOD, .dst = dst,
                                                          .src = src, .n = bytes });
out:
    return emu_leave(r);
}

kcu_result emu_cuMemsetD8Async(kcu_deviceptr dst, unsigned char value, size_t n,
                                      kcu_stream stream)
{
    BEGIN(cuMemsetD8Async, F_INIT | F_CTX | F_STICKY);
    r = copy_submit_locked(cur, stream, &(struct emu_op){ .kind = OP_MEMSET, .dst = dst,
                                                          .val = value, .n = n });
out:
    return emu_leave(r);
}
