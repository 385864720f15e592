/*
 * testing/disk_alone.c: the disk tier's engine (disk/disk.h) alone, for kvvm-bench's spill figures
 * (testing/kvvm_testing.h). Requests and completions are passed through as they are: their
 * layouts are checked equal to disk_req's and disk_cqe's below.
 */
#include "testing/kvvm_testing.h"

#include <errno.h>
#include <stddef.h>

#include "disk/disk.h"

#define SAME(a, b, f) (offsetof(struct a, f) == offsetof(struct b, f))
_Static_assert(sizeof(struct kvvm_testing_spill_req) == sizeof(struct disk_req) &&
               SAME(kvvm_testing_spill_req, disk_req, op) &&
               SAME(kvvm_testing_spill_req, disk_req, slot) &&
               SAME(kvvm_testing_spill_req, disk_req, buf) &&
               SAME(kvvm_testing_spill_req, disk_req, page) &&
               SAME(kvvm_testing_spill_req, disk_req, user), "kvvm_testing_spill_req");
_Static_assert(sizeof(struct kvvm_testing_spill_cqe) == sizeof(struct disk_cqe) &&
               SAME(kvvm_testing_spill_cqe, disk_cqe, user) &&
               SAME(kvvm_testing_spill_cqe, disk_cqe, page) &&
               SAME(kvvm_testing_spill_cqe, disk_cqe, slot) &&
               SAME(kvvm_testing_spill_cqe, disk_cqe, op) &&
               SAME(kvvm_testing_spill_cqe, disk_cqe, status), "kvvm_testing_spill_cqe");
_Static_assert(sizeof(enum disk_op) == sizeof(int) && sizeof(disk_slot) == sizeof(uint32_t),
               "disk_op, disk_slot");
_Static_assert((int)KVVM_TESTING_SPILL_WRITE == (int)DISK_WRITE &&
               (int)KVVM_TESTING_SPILL_READ == (int)DISK_READ, "spill ops");
_Static_assert((int)KVVM_TESTING_SPILL_IO_URING == (int)DISK_ENGINE_IO_URING &&
               (int)KVVM_TESTING_SPILL_PSYNC == (int)DISK_ENGINE_PSYNC &&
               (int)KVVM_TESTING_SPILL_AUTO == (int)DISK_ENGINE_AUTO, "spill engines");
#undef SAME

#define SP(dk) ((struct disk *)(dk))

int kvvm_testing_spill_open(const struct kvvm_testing_spill_params *p,
                            kvvm_testing_spill **out)
{
    if (!p || !out)
        return -EINVAL;
    struct disk_params dp = { .dir = p->dir, .budget = p->budget, .page_size = p->page_size,
                              .buf_base = p->buf_base, .buf_bytes = p->buf_bytes,
                              .queue_depth = p->queue_depth, .io_size = p->io_size,
                              .engine = (enum disk_engine)p->engine };
    struct disk *s = NULL;
    int rc = disk_open(&dp, &s);
    *out = (kvvm_testing_spill *)s;
    return rc;
}

void kvvm_testing_spill_close(kvvm_testing_spill *dk) { disk_close(SP(dk)); }

int kvvm_testing_spill_slot_alloc(kvvm_testing_spill *dk, size_t n, uint32_t *out)
{
    return disk_slot_alloc(SP(dk), n, DISK_SLOT_NONE, (disk_slot *)(void *)out);
}

int kvvm_testing_spill_slot_free(kvvm_testing_spill *dk, uint32_t slot)
{
    return disk_slot_free(SP(dk), (disk_slot){ slot });
}

int kvvm_testing_spill_submit(kvvm_testing_spill *dk, const struct kvvm_testing_spill_req *r,
                              size_t n)
{
    return disk_submit(SP(dk), (const struct disk_req *)(const void *)r, n);
}

size_t kvvm_testing_spill_reap(kvvm_testing_spill *dk, struct kvvm_testing_spill_cqe *out,
                               size_t max)
{
    return disk_reap(SP(dk), (struct disk_cqe *)(void *)out, max);
}

int kvvm_testing_spill_wait_all(kvvm_testing_spill *dk) { return disk_wait_all(SP(dk)); }
