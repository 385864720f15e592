/*
 * tests/test_host.c: the host arena (host/host.h) on the emulated device: slots, counters,
 * registration with the driver (checked against the emulator's own counters), failure
 * unwinding, and concurrent allocation.
 */
#include <criterion/criterion.h>
#include <unistd.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "host/host.h"
#include "vmm/emu/emu.h"
#include "vmm/vmm.h"

#define PAGE ((size_t)64 << 10)

static struct vmm *v;
static int ord;

static void setup(void)
{
    alarm(60);  /* hang guard; not Criterion's .timeout, see TH_DEADLINE in tests/harness.h */
    struct vmm_params p = { .backend = KVVM_BACKEND_EMULATED, .emu_capacity = 64u << 20,
                            .emu_granule = 64u << 10 };
    cr_assert_eq(vmm_open(&p, &v), 0);
    ord = vmm_emu_ordinal(v);
    cr_assert_geq(ord, 0);
}

static void teardown(void)
{
    emu_fail_clear();
    vmm_close(v);
}

TestSuite(host, .init = setup, .fini = teardown);

static struct emu_counters counters(void)
{
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    return c;
}

Test(host, slots_never_over_budget)
{
    struct host_params p = { .budget = 16 * PAGE + PAGE - 1, .page_size = PAGE };
    struct host_arena *a;
    cr_assert_eq(host_arena_open(v, &p, &a), 0);
    cr_assert_eq(host_slots_total(a), 16);
    cr_assert_eq(host_slots_free(a), 16);
    cr_assert_eq(host_arena_bytes(a), 16 * PAGE);
    cr_assert_eq((uintptr_t)host_arena_base(a) % 4096, 0);
    host_slot s[17];
    unsigned char seen[16] = { 0 };
    for (int k = 0; k < 16; k++) {
        cr_assert_eq(host_slot_alloc(a, &s[k]), 0);
        cr_assert_lt(s[k].idx, 16);
        cr_assert_eq(seen[s[k].idx]++, 0, "slot %u handed out twice", s[k].idx);
        unsigned char *ptr = host_slot_ptr(a, s[k]);
        cr_assert_eq(ptr, (unsigned char *)host_arena_base(a) + s[k].idx * PAGE);
        cr_assert(host_slot_allocated(a, s[k]));
        memset(ptr, k + 1, PAGE);   /* every byte of the slot is usable */
    }
    cr_assert_eq(host_slot_alloc(a, &s[16]), -ENOMEM, "allocation past the budget");
    cr_assert_eq(host_slots_free(a), 0);
    cr_assert_eq(host_slots_used(a), 16);
    for (int k = 0; k < 16; k++) {
        unsigned char *ptr = host_slot_ptr(a, s[k]);
        cr_assert(ptr[0] == k + 1 && ptr[PAGE - 1] == k + 1, "slot %d overlapped another", k);
    }
    cr_assert_eq(host_slot_free(a, s[3]), 0);
    cr_assert_eq(host_slots_free(a), 1);
    host_slot again;
    cr_assert_eq(host_slot_alloc(a, &again), 0);
    cr_assert_eq(again.idx, s[3].idx, "the only free slot was not the one handed out");
    for (int k = 0; k < 16; k++)
        cr_assert_eq(host_slot_free(a, s[k]), 0);
    cr_assert_eq(host_slots_free(a), 16);
    host_arena_close(a);
}

Test(host, double_free_and_forged_ids_refused)
{
    struct host_params p = { .budget = 4 * PAGE, .page_size = PAGE };
    struct host_arena *a;
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_assert_eq(host_arena_open(v, &p, &a), 0);
    host_slot s;
    cr_assert_eq(host_slot_alloc(a, &s), 0);
    cr_assert_eq(host_slot_free(a, s), 0);
    cr_assert_eq(host_slot_free(a, s), -EINVAL, "double free accepted");
    cr_assert_eq(host_slot_free(a, (host_slot){ 4 }), -EINVAL);
    cr_assert_eq(host_slot_free(a, HOST_SLOT_NONE), -EINVAL);
    cr_assert_null(host_slot_ptr(a, (host_slot){ 4 }));
    cr_assert_eq(host_slots_free(a), 4, "a refused free changed the count");
    /* The free stack is intact: exactly 4 distinct slots come out. */
    host_slot t[5];
    for (int k = 0; k < 4; k++)
        cr_assert_eq(host_slot_alloc(a, &t[k]), 0);
    cr_assert_eq(host_slot_alloc(a, &t[4]), -ENOMEM);
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            cr_assert_neq(t[i].idx, t[j].idx);
    host_arena_close(a);
}

Test(host, slot_of_pointer)
{
    struct host_params p = { .budget = 8 * PAGE, .page_size = PAGE };
    struct host_arena *a;
    cr_assert_eq(host_arena_open(v, &p, &a), 0);
    unsigned char *base = host_arena_base(a);
    cr_assert_eq(host_slot_of(a, base).idx, 0);
    cr_assert_eq(host_slot_of(a, base + 3 * PAGE + 17).idx, 3);
    cr_assert_eq(host_slot_of(a, base + 8 * PAGE - 1).idx, 7);
    cr_assert(!host_slot_valid(host_slot_of(a, base + 8 * PAGE)));
    cr_assert(!host_slot_valid(host_slot_of(a, base - 1)));
    host_arena_close(a);
}

Test(host, registered_in_chunks_with_the_driver)
{
    struct emu_counters c0 = counters();
    /* 10 slots in chunks of 4 slots (the chunk is rounded down to whole slots) = 3 calls. */
    struct host_params p = { .budget = 10 * PAGE, .page_size = PAGE,
                             .chunk_bytes = 4 * PAGE + 100 };
    struct host_arena *a;
    cr_assert_eq(host_arena_open(v, &p, &a), 0);
    cr_assert(host_arena_registered(a));
    struct emu_counters c1 = counters();
    cr_assert_eq(c1.host_registered - c0.host_registered, 3);
    cr_assert_eq(c1.host_registered_bytes - c0.host_registered_bytes, 10 * PAGE);
    host_arena_close(a);
    struct emu_counters c2 = counters();
    cr_assert_eq(c2.host_registered, c0.host_registered, "registration leaked at close");
    cr_assert_eq(c2.host_registered_bytes, c0.host_registered_bytes);
}

/* A lost context during registration fails the open with -EIO: there is nothing to fall
   back on (every driver call fails from then on). */
Test(host, lost_context_fails_the_open)
{
    struct host_params p = { .budget = 12 * PAGE, .page_size = PAGE, .chunk_bytes = 4 * PAGE };
    struct host_arena *a = NULL;
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_assert_eq(emu_fail_arm("cuMemHostRegister", 2, KCU_ERROR_ILLEGAL_ADDRESS), 0);
    cr_assert_eq(host_arena_open(v, &p, &a), -EIO);
    cr_assert(vmm_dead(v));
}

Test(host, without_a_driver_and_empty)
{
    struct host_params p = { .budget = 4 * PAGE, .page_size = PAGE };
    struct host_arena *a;
    cr_assert_eq(host_arena_open(NULL, &p, &a), 0);
    cr_assert_eq(host_arena_registered(a), 0);
    host_slot s;
    cr_assert_eq(host_slot_alloc(a, &s), 0);
    cr_assert_eq(host_slot_free(a, s), 0);
    host_arena_close(a);

    p.budget = PAGE - 1;                       /* no whole slot: an empty tier */
    cr_assert_eq(host_arena_open(v, &p, &a), 0);
    cr_assert_eq(host_slots_total(a), 0);
    cr_assert_null(host_arena_base(a));
    cr_assert_eq(host_slot_alloc(a, &s), -ENOMEM);
    host_arena_close(a);

    p.page_size = 4096 + 512;
    cr_assert_eq(host_arena_open(v, &p, &a), -EINVAL);
    p.page_size = 0;
    cr_assert_eq(host_arena_open(v, &p, &a), -EINVAL);
    host_arena_close(NULL);
}

/* Random alloc/free against a shadow model; a cookie in each allocated slot is checked on
   free (nothing else wrote into it). */
Test(host, random_model)
{
    enum { N = 64 };
    struct host_params p = { .budget = N * 4096, .page_size = 4096 };
    struct host_arena *a;
    cr_assert_eq(host_arena_open(v, &p, &a), 0);
    host_slot held[N];
    int n_held = 0;
    unsigned seed = 12345;
    for (int op = 0; op < 20000; op++) {
        seed = seed * 1103515245u + 12345u;
        int do_alloc = (seed >> 16) % 2;
        if (do_alloc) {
            host_slot s;
            int r = host_slot_alloc(a, &s);
            if (n_held == N) {
                cr_assert_eq(r, -ENOMEM);
                continue;
            }
            cr_assert_eq(r, 0);
            uint64_t *w = host_slot_ptr(a, s);
            w[0] = 0xC0FFEE00u + s.idx;
            w[511] = ~(uint64_t)s.idx;
            held[n_held++] = s;
        } else if (n_held) {
            int k = (int)((seed >> 8) % (unsigned)n_held);
            host_slot s = held[k];
            uint64_t *w = host_slot_ptr(a, s);
            cr_assert_eq(w[0], 0xC0FFEE00u + s.idx, "slot %u cookie damaged", s.idx);
            cr_assert_eq(w[511], ~(uint64_t)s.idx);
            cr_assert_eq(host_slot_free(a, s), 0);
            held[k] = held[--n_held];
        }
        cr_assert_eq(host_slots_free(a), (size_t)(N - n_held));
    }
    while (n_held)
        cr_assert_eq(host_slot_free(a, held[--n_held]), 0);
    host_arena_close(a);
}

struct th { struct host_arena *a; int id; int ok; };

static void *churn(void *arg)
{
    struct th *t = arg;
    host_slot mine[8];
    for (int round = 0; round < 2000; round++) {
        int got = 0;
        for (; got < 8; got++) {
            if (host_slot_alloc(t->a, &mine[got]) != 0)
                break;
            *(int *)host_slot_ptr(t->a, mine[got]) = t->id * 100000 + round;
        }
        for (int k = 0; k < got; k++) {
            if (*(int *)host_slot_ptr(t->a, mine[k]) != t->id * 100000 + round)
                return NULL;   /* someone else got the same slot */
            if (host_slot_free(t->a, mine[k]) != 0)
                return NULL;
        }
    }
    t->ok = 1;
    return NULL;
}

Test(host, concurrent_alloc_free)
{
    struct host_params p = { .budget = 24 * 4096, .page_size = 4096 };
    struct host_arena *a;
    cr_assert_eq(host_arena_open(v, &p, &a), 0);
    pthread_t tid[4];
    struct th t[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (struct th){ a, i + 1, 0 };
        cr_assert_eq(pthread_create(&tid[i], NULL, churn, &t[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(tid[i], NULL);
        cr_expect(t[i].ok, "thread %d saw a slot handed out twice", i);
    }
    cr_assert_eq(host_slots_free(a), 24);
    host_arena_close(a);
}

/* ---------------------------------------------------------------- registration refused */

struct logcap { int warns; char last[256]; };
static void logcap_fn(int level, const char *msg, void *arg)
{
    struct logcap *c = arg;
    if (level == KVVM_LOG_WARN && strstr(msg, "pageable")) {
        c->warns++;
        snprintf(c->last, sizeof c->last, "%s", msg);
    }
}

/* A driver that refuses to pin host memory (NOT_SUPPORTED / NOT_PERMITTED, as under
   confidential computing; INVALID_VALUE; OUT_OF_MEMORY at a pinning limit), at the first chunk
   or a later one: the arena opens unregistered, with one clear warning, every chunk it had
   pinned unregistered. Regression: the refusal failed host_arena_open and so kvvm_open. */
Test(host, registration_refused_falls_back)
{
    struct emu_counters c0 = counters();
    struct host_params p = { .budget = 12 * PAGE, .page_size = PAGE, .chunk_bytes = 4 * PAGE };
    struct host_arena *a = NULL;
    struct logcap lc = { 0 };
    kcu_result errs[] = { KCU_ERROR_NOT_SUPPORTED, KCU_ERROR_NOT_PERMITTED,
                          KCU_ERROR_INVALID_VALUE, KCU_ERROR_OUT_OF_MEMORY };
    for (int e = 0; e < 4; e++) {
        for (unsigned long nth = 1; nth <= 3; nth++) {
            lc.warns = 0;
            kvvm_set_log(logcap_fn, &lc, KVVM_LOG_WARN);
            cr_assert_eq(emu_fail_arm("cuMemHostRegister", nth, errs[e]), 0);
            int r = host_arena_open(v, &p, &a);
            emu_fail_clear();
            kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
            cr_assert_eq(r, 0, "open failed (%d) with registration %lu refused", r, nth);
            cr_assert_eq(lc.warns, 1, "one warning expected, got %d", lc.warns);
            cr_assert_eq(host_arena_registered(a), 0);
            struct emu_counters c1 = counters();
            cr_assert_eq(c1.host_registered, c0.host_registered, "a chunk stayed registered");
            host_slot s;
            cr_assert_eq(host_slot_alloc(a, &s), 0);
            memset(host_slot_ptr(a, s), 0x5a, PAGE);
            cr_assert_eq(host_slot_free(a, s), 0);
            host_arena_close(a);
        }
    }
}

/* Through kvvm_open with the first registration failing with err: opens, logs, and a swap
   round trip through the pageable host tier keeps the bytes. */
static void open_pageable_swap_roundtrip(kcu_result err)
{
    struct kvvm_config c;
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.emu_granule = PAGE;
    c.page_size = PAGE;
    c.n_regions = 2;
    c.bytes_per_token = 4096;
    c.max_seqs = 4;
    c.max_tokens = 64;
    c.device_budget = 16 * PAGE;
    c.host_budget = 16 * PAGE;
    c.emu_opaque = 1;
    struct logcap lc = { 0 };
    kvvm_set_log(logcap_fn, &lc, KVVM_LOG_WARN);
    cr_assert_eq(emu_fail_arm("cuMemHostRegister", 1, err), 0);
    kvvm *kv = NULL;
    int rc = kvvm_open(&c, &kv);
    emu_fail_clear();
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_assert_eq(rc, 0, "kvvm_open: %d", rc);
    cr_assert_eq(lc.warns, 1, "the fallback must be logged once (%d)", lc.warns);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, 40), 0);
    size_t n = 40 * 4096;
    uint8_t *w = malloc(n), *r = malloc(n);
    cr_assert(w && r);
    for (uint32_t reg = 0; reg < 2; reg++) {
        for (size_t i = 0; i < n; i++)
            w[i] = (uint8_t)(i * 7 + reg * 13 + (i >> 12));
        cr_assert_eq(kvvm_seq_write(kv, s, reg, 0, w, n), 0);
    }
    cr_assert_eq(kvvm_step(kv), 0);
    cr_assert_eq(kvvm_seq_swap_out(kv, s), 0);
    cr_assert_eq(kvvm_sync(kv), 0);
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(kv, s, &in), 0);
    cr_assert_eq(in.resident, 0);
    cr_assert_eq(kvvm_seq_swap_in(kv, s), 0);
    for (uint32_t reg = 0; reg < 2; reg++) {
        for (size_t i = 0; i < n; i++)
            w[i] = (uint8_t)(i * 7 + reg * 13 + (i >> 12));
        memset(r, 0, n);
        cr_assert_eq(kvvm_seq_read(kv, s, reg, 0, r, n), 0);
        cr_assert_eq(memcmp(r, w, n), 0, "region %u changed by the round trip", reg);
    }
    free(w);
    free(r);
    kvvm_close(kv);
}

Test(host_fallback, kvvm_open_swap_roundtrip)
{
    open_pageable_swap_roundtrip(KCU_ERROR_NOT_SUPPORTED);
}

/* Bug: only NOT_SUPPORTED / NOT_PERMITTED (-EIO) fell back to pageable memory; a driver
   answering cuMemHostRegister with CUDA_ERROR_INVALID_VALUE failed kvvm_open (-EINVAL). */
Test(regress, host_register_invalid_value_failed_the_open)
{
    open_pageable_swap_roundtrip(KCU_ERROR_INVALID_VALUE);
}
