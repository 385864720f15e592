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

int vmm_handle_import(struct vmm *v, int fd, size_t bytes, vmm_handle *out)
{
    if (fd < 0)
        return -EINVAL;
    int err = !out || !bytes || bytes % v->granule ? -EINVAL : vmm_enter(v);
    if (err) {
        close(fd);                  /* taken over whatever the outcome (vmm.h) */
        return err;
    }
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
