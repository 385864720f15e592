/*
 * testing/spill.c: the disk tier's engine (disk/disk.h) alone, for kvvm-bench's spill figures
 * (testing/kvvm_testing.h). Requests and completions are passed through as they are: their
 * layouts are checked equal to spill_req's and spill_cqe's below.
 */
#include "testing/kvvm_testing.h"

#include <errno.h>
#include <stddef.h>

#include "disk/disk.h"

#define SAME(a, b, f) (offsetof(struct a, f) == offsetof(struct b, f))
_Static_assert(sizeof(struct kvvm_testing_spill_req) == sizeof(struct spill_req) &&
               SAME(kvvm_testing_spill_req, spill_req, op) &&
               SAME(kvvm_testing_spill_req, spill_req, slot) &&
               SAME(kvvm_testing_spill_req, spill_req, buf) &&
               SAME(kvvm_testing_spill_req, spill_req, page) &&
               SAME(kvvm_testing_spill_req, spill_req, user), "kvvm_testing_spill_req");
_Static_assert(sizeof(struct kvvm_testing_spill_cqe) == sizeof(struct spill_cqe) &&
               SAME(kvvm_testing_spill_cqe, spill_cqe, user) &&
               SAME(kvvm_testing_spill_cqe, spill_cqe, page) &&
               SAME(kvvm_testing_spill_cqe, spill_cqe, slot) &&
               SAME(kvvm_testing_spill_cqe, spill_cqe, op) &&
               SAME(kvvm_testing_spill_cqe, spill_cqe, status), "kvvm_testing_spill_cqe");
_Static_assert(sizeof(enum spill_op) == sizeof(int) && sizeof(spill_slot) == sizeof(uint32_t),
               "spill_op, spill_slot");
_Static_assert((int)KVVM_TESTING_SPILL_WRITE == (int)SPILL_WRITE &&
               (int)KVVM_TESTING_SPILL_READ == (int)SPILL_READ, "spill ops");
_Static_assert((int)KVVM_TESTING_SPILL_IO_URING == (int)SPILL_ENGINE_IO_URING &&
               (int)KVVM_TESTING_SPILL_PSYNC == (int)SPILL_ENGINE_PSYNC &&
               (int)KVVM_TESTING_SPILL_AUTO == (int)SPILL_ENGINE_AUTO, "spill engines");
#undef SAME

#define SP(sp) ((struct spill *)(sp))

int kvvm_testing_spill_open(const struct kvvm_testing_spill_params *p,
                            kvvm_testing_spill **out)
{
    if (!p || !out)
        return -EINVAL;
    struct spill_params sp = { .dir = p->dir, .budget = p->budget, .page_size = p->page_size,
                               .buf_base = p->buf_base, .buf_bytes = p->buf_bytes,
                               .queue_depth = p->queue_depth, .io_size = p->io_size,
                               .engine = (enum spill_engine)p->engine };
    struct spill *s = NULL;
    int rc = spill_open(&sp, &s);
    *out = (kvvm_testing_spill *)s;
    return rc;
}

void kvvm_testing_spill_close(kvvm_testing_spill *sp) { spill_close(SP(sp)); }

int kvvm_testing_spill_slot_alloc(kvvm_testing_spill *sp, size_t n, uint32_t *out)
{
    return spill_slot_alloc(SP(sp), n, SPILL_SLOT_NONE, (spill_slot *)(void *)out);
}

int kvvm_testing_spill_slot_free(kvvm_testing_spill *sp, uint32_t slot)
{
    return spill_slot_free(SP(sp), (spill_slot){ slot });
}

int kvvm_testing_spill_submit(kvvm_testing_spill *sp, const struct kvvm_testing_spill_req *r,
                              size_t n)
{
    return spill_submit(SP(sp), (const struct spill_req *)(const void *)r, n);
}

size_t kvvm_testing_spill_reap(kvvm_testing_spill *sp, struct kvvm_testing_spill_cqe *out,
                               size_t max)
{
    return spill_reap(SP(sp), (struct spill_cqe *)(void *)out, max);
}

int kvvm_testing_spill_wait_all(kvvm_testing_spill *sp) { return spill_wait_all(SP(sp)); }
