/*
 * tools/kvvm-gpucheck/view.c: the pool view probe (docs/kvvm-gpucheck.md, "view").
 *
 * A libkvvm context with KVVM_F_POOL_VIEW: a sequence of 4 blocks in 2 regions, its bytes
 * written through the window (kvvm_seq_write) and read back through the pool view (at
 * kvvm_pool_base(r) + id * page_size, kvvm_seq_block_table's ids), then written through the
 * pool view and read back through the window (kvvm_seq_read). On the emulated device the
 * pool view is read and written by the CPU (emu_opaque 0); on a GPU by driver copies on the
 * probe's stream (the same primary context as libkvvm's). Both must see the same bytes.
 */
#include "gpucheck.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvvm.h"

#define BLOCKS 4u
#define TPB 16u                         /* tokens per block */

static uint8_t pat(uint32_t r, size_t i, unsigned pass)
{
    return (uint8_t)(r * 29u + i * 7u + (i >> 9) + pass * 101u + 1u);
}

/* One block's page of region r through the pool view: read (wr 0) into buf or written from
   it. 0 or a driver result != 0 (*what says which). */
static int pool_io(struct gc_dev *d, uint64_t va, uint8_t *buf, size_t n, int wr,
                   const char **what)
{
    if (d->emulated) {                  /* CPU-accessible mappings (emu_opaque 0) */
        if (wr)
            memcpy((void *)(uintptr_t)va, buf, n);
        else
            memcpy(buf, (const void *)(uintptr_t)va, n);
        return 0;
    }
    kcu_result r = wr ? d->a->cuMemcpyHtoDAsync(va, buf, n, d->s)
                      : d->a->cuMemcpyDtoHAsync(buf, va, n, d->s);
    *what = wr ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync";
    if (!r) {
        r = d->a->cuStreamSynchronize(d->s);
        *what = "cuStreamSynchronize";
    }
    return (int)r;
}

/* Through the pool view of every block and region: compare with pass's pattern (wr 0) or
   write it (wr 1). 0, 1 a byte differs, -1 a driver call failed (msg says). */
static int each_block(struct gc_dev *d, kvvm *kv, const int32_t *ids, size_t ps,
                      uint8_t *buf, unsigned pass, int wr, char *msg, size_t len)
{
    for (uint32_t r = 0; r < 2; r++) {
        uint64_t base = 0;
        int rc = kvvm_pool_base(kv, r, &base);
        if (rc) {
            snprintf(msg, len, "kvvm_pool_base: %s", kvvm_strerror(rc));
            return -1;
        }
        for (uint32_t b = 0; b < BLOCKS; b++) {
            if (wr)
                for (size_t i = 0; i < ps; i++)
                    buf[i] = pat(r, b * ps + i, pass);
            const char *what = "";
            int e = pool_io(d, base + (uint64_t)ids[b] * ps, buf, ps, wr, &what);
            if (e) {
                snprintf(msg, len, "%s: %s", what, gc_err(d->a, (kcu_result)e));
                return -1;
            }
            for (size_t i = 0; !wr && i < ps; i++)
                if (buf[i] != pat(r, b * ps + i, pass))
                    return 1;
        }
    }
    return 0;
}

static int window_io(kvvm *kv, kvvm_seq s, uint8_t *all, size_t n, unsigned pass, int wr)
{
    for (uint32_t r = 0; r < 2; r++) {
        if (wr)
            for (size_t i = 0; i < n; i++)
                all[i] = pat(r, i, pass);
        int rc = wr ? kvvm_seq_write(kv, s, r, 0, all, n) : kvvm_seq_read(kv, s, r, 0, all, n);
        if (rc)
            return rc;
        for (size_t i = 0; !wr && i < n; i++)
            if (all[i] != pat(r, i, pass))
                return 1;
    }
    return 0;
}

void gc_view_two_views(struct gc_dev *d)
{
    const char *id = "view.two_views";
    size_t ps = d->g;
    struct kvvm_config c;
    kvvm_config_init(&c);
    if (d->emulated) {
        c.backend = KVVM_BACKEND_EMULATED;
        c.emu_device_bytes = 64 * ps;
        c.emu_granule = ps;
        c.emu_opaque = 0;
    } else {
        c.backend = KVVM_BACKEND_CUDA;
        c.device = d->o->device;
    }
    c.page_size = ps;
    c.n_regions = 2;
    c.bytes_per_token = ps / TPB;
    c.max_seqs = 2;
    c.max_tokens = BLOCKS * TPB;
    c.device_budget = 4 * BLOCKS * ps;
    c.host_budget = 0;
    c.pool_thread = 0;
    c.flags = KVVM_F_POOL_VIEW;
    size_t n = BLOCKS * ps;
    uint8_t *all = malloc(n), *buf = malloc(ps);
    kvvm *kv = NULL;
    char msg[160] = "";
    const char *res = "error: setup";
    int rc = all && buf ? kvvm_open(&c, &kv) : -ENOMEM;
    kvvm_seq s = 0;
    int32_t ids[BLOCKS];
    if (!rc && !(rc = kvvm_seq_create(kv, &s)) && !(rc = kvvm_seq_grow(kv, s, c.max_tokens)) &&
        !(rc = window_io(kv, s, all, n, 1, 1)) && !(rc = kvvm_sync(kv)))
        rc = kvvm_seq_block_table(kv, s, 0, BLOCKS, ids);
    if (rc) {
        snprintf(msg, sizeof msg, "libkvvm setup: %s (%s)", kvvm_strerror(rc),
                 kvvm_last_error());
    } else {
        int a = each_block(d, kv, ids, ps, buf, 1, 0, msg, sizeof msg);   /* window -> view */
        int b = a ? a : each_block(d, kv, ids, ps, buf, 2, 1, msg, sizeof msg);
        int w = b ? b : window_io(kv, s, all, n, 2, 0);                  /* view -> window */
        res = a < 0 || b < 0 || w < 0 ? "error: driver"
            : a ? "window->view differs" : w > 1 ? "error: read" : w ? "view->window differs"
            : "ok";
        if (!*msg)
            snprintf(msg, sizeof msg, "%u blocks of %zu KiB in 2 regions, ids %d %d %d %d: "
                     "window -> pool view and pool view -> window", BLOCKS, ps >> 10, ids[0],
                     ids[1], ids[2], ids[3]);
    }
    if (kv)
        kvvm_close(kv);
    free(all);
    free(buf);
    gc_row(id, res, "%s", msg);
}
