/*
 * vmm/share.c: shareable handles over the driver table (contract in vmm.h): export a
 * handle as a POSIX file descriptor, import one (taking the descriptor over: on the emulated
 * device the handle keeps it, through the backend's import_take; on CUDA it is closed after
 * cuMemImportFromShareableHandle, which keeps the allocation). Handles made exportable come from
 * vmm_phys_create on a vmm opened with params.shareable (vmm.c asks cuMemCreate for
 * KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR); an imported handle counts as a live handle of
 * this vmm (vmm_phys_release releases it), its memory is the exporting device's.
 */
#include <errno.h>
#include <stdint.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"
#include "vmm_int.h"

int vmm_handle_export(struct vmm *v, vmm_handle h, int *fd)
{
    if (!fd || !h.h)
        return -EINVAL;
    int err = vmm_enter(v);
    if (err)
        return err;
    int out = -1;
    kcu_result r = v->api->cuMemExportToShareableHandle(
        &out, h.h, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != KCU_SUCCESS)
        return vmm_drv_fail(v, "cuMemExportToShareableHandle", r);
    KVVM_ASSERT(out >= 0);           /* the driver's descriptor on success */
    *fd = out;
    return 0;
}

/* Imports fd (taken over) as *out, the context entered. 0; -errno (fd closed). */
static int import_entered(struct vmm *v, int fd, vmm_handle *out)
{
    kcu_mem_handle h = 0;
    kcu_result r;
    if (v->dbg && v->dbg->import_take) {
        r = v->dbg->import_take(&h, fd);    /* the handle keeps fd: no dup, no close */
        if (r != KCU_SUCCESS)
            close(fd);
    } else {
        r = v->api->cuMemImportFromShareableHandle(
            &h, (void *)(uintptr_t)fd, KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fd);                  /* the driver keeps the allocation, not the descriptor */
    }
    if (r != KCU_SUCCESS)
        return vmm_drv_fail(v, "cuMemImportFromShareableHandle", r);
    vmm_count(&v->n_handles, 1);
    out->h = h;
    return 0;
}

int vmm_handles_import(struct vmm *v, const int *fds, size_t n, size_t bytes, vmm_handle *out,
                       size_t *done)
{
    *done = 0;
    for (size_t i = 0; i < n; i++)
        if (fds[i] < 0)
            return -EINVAL;         /* nothing taken */
    /* one context check for the batch: the context cannot change under this thread's
       calls (a pool client's FRAMES message of 64 imports paid 64) */
    int err = !out || !bytes || bytes % v->granule ? -EINVAL : n ? vmm_enter(v) : 0;
    size_t i = 0;
    for (; !err && i < n; i++) {
        if (!(err = import_entered(v, fds[i], &out[i])))
            (*done)++;
    }
    for (; i < n; i++)
        close(fds[i]);              /* taken over whatever the outcome (vmm.h) */
    return err;
}

int vmm_handle_import(struct vmm *v, int fd, size_t bytes, vmm_handle *out)
{
    size_t done;
    return vmm_handles_import(v, &fd, 1, bytes, out, &done);
}
