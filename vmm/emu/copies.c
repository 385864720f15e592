/*
 * vmm/emu/copies.c: copies and memsets: validation at the call, translation through the
 * mapping table and execution in the stream (cuMemcpy*Async, cuMemsetD8Async).
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

#include <sched.h>

/* ---- copies ------------------------------------------------------------------------- */

/* Translates device address va for an access needing `need` by device d: a pointer into
   the memory's view and the length (<= want) of the contiguous run it starts. NULL and a
   reason when the address is not mapped with that access. */
static unsigned char *xlate_locked(struct emu_dev *d, kcu_deviceptr va, size_t want, int need,
                                   size_t *run, const char **why)
{
    struct emu_resv *rv = emu_resv_find_locked((uintptr_t)va);
    if (!rv) {
        *why = "not a reserved address";
        return NULL;
    }
    size_t idx = ((uintptr_t)va - rv->base) / rv->gran;
    size_t in = ((uintptr_t)va - rv->base) % rv->gran;
    struct emu_ent *e = emu_ent_get(rv, idx);
    if (!e || !e->h1) {
        *why = "not mapped";
        return NULL;
    }
    struct emu_handle *h = &emu.handles[e->h1 - 1];
    if (h->dev != d) {
        *why = "memory of another device (peer access is not emulated)";
        return NULL;
    }
    if (((int)e->access & need) != need) {
        *why = need & NEED_W ? "not writable (cuMemSetAccess)" : "not readable (cuMemSetAccess)";
        return NULL;
    }
    size_t len = rv->gran - in;
    for (size_t k = idx + 1; len < want && k < rv->ngran; k++) {
        struct emu_ent *f = emu_ent_get(rv, k);
        if (!f || f->map_id != e->map_id || ((int)f->access & need) != need)
            break;
        len += rv->gran;
    }
    *run = min_sz(len, want);
    unsigned char *mem = emu_handle_mem(h);
    if (!mem) {
        *why = "no view of a shared allocation could be mapped (out of memory)";
        return NULL;
    }
    return mem + e->off * d->gran + in;
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

/* Executes a copy or memset on device d, translating at execution time. The lock is dropped
   between chunks. A fault makes the device's error sticky and stops the copy. */
void emu_xfer_locked(struct emu_dev *d, struct emu_op *op)
{
    size_t done = 0;
    while (done < op->n && !d->sticky) {
        size_t chunk = min_sz(op->n - done, XFER_CHUNK), cd = 0;
        while (cd < chunk) {
            size_t pos = done + cd, want = chunk - cd, run = want, run2;
            unsigned char *dptr = NULL, *sptr = NULL;
            const char *why = NULL;
            if (op->kind != OP_DTOH) {
                dptr = xlate_locked(d, op->dst + pos, want, NEED_W, &run, &why);
                if (!dptr) {
                    device_fault_locked(d, op->dst + pos, why);
                    return;
                }
            }
            if (op->kind == OP_DTOH || op->kind == OP_DTOD) {
                sptr = xlate_locked(d, op->src + pos, run, NEED_R, &run2, &why);
                if (!sptr) {
                    device_fault_locked(d, op->src + pos, why);
                    return;
                }
                run = min_sz(run, run2);
            }
            switch (op->kind) {
            case OP_HTOD: memcpy(dptr, (const unsigned char *)op->hsrc + pos, run); break;
            case OP_DTOH: memcpy((unsigned char *)op->hdst + pos, sptr, run); break;
            case OP_DTOD: memmove(dptr, sptr, run); break;
            case OP_MEMSET: memset(dptr, op->val, run); break;
            default: break;
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
