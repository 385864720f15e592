/* tests/test_pool_takeback.c: the pool's arbitration with real processes: a real kvvmd
   (tests/pool_daemon.h), clients in forked processes. When the pool is dry, a call's lease
   makes the daemon take frames back from clients above their reserve (their CACHED
   sequences dropped, their LIVE bytes intact); a client at its reserve is not asked; a
   client that cannot give is not waited for; the asker waits at most pool_timeout_ms; a
   limit below what a client holds makes it give back down to it; a client killed while it
   is asked does not stall the daemon; a round asks for the call's whole need. Every wait
   is for a condition (a pipe's byte, a line of the daemon's stderr, a figure polled), never
   for a time; TH_DEADLINE guards hangs. */
#include <sched.h>
#include "harness.h"
#include "pool_daemon.h"

#define BPT 4096u                       /* bytes per token: 16 tokens per 64 KiB page */
#define TPP (PD_GRAN / BPT)             /* tokens per page */
#define POOL_FRAMES 16u                 /* the daemon's pool: "1M" */

static void tb_cfg(struct kvvm_config *c, const char *path, const char *name)
{
    th_config(c, PD_GRAN, 1, BPT, 8, 16 * TPP, 0, 0, 0);
    c->pool_socket = path;
    c->client_name = name;
    c->page_size = 0;                   /* the daemon's */
    c->emu_granule = 0;                 /* the daemon's device */
    c->device_budget = 0;               /* limit: the whole pool */
}

/* What kvvmctl --json clients says `name` holds (bytes). */
static long long held_of(const char *path, const char *name)
{
    char out[4096], key[96];
    cr_assert_eq(pd_ctl(path, "--json clients", out, sizeof out), 0, "%s", out);
    snprintf(key, sizeof key, "\"name\":\"%s\",", name);
    const char *p = strstr(out, key);
    if (!p)
        return -1;
    const char *h = strstr(p, "\"held\":");
    cr_assert(h, "%s", out);
    return atoll(h + 7);
}

/* Reads the daemon's stderr until a line containing `what`. */
static void wait_daemon_says(struct pd *d, const char *what)
{
    char line[512];
    while (pd_line(d->err, line, sizeof line))
        if (strstr(line, what))
            return;
    cr_assert_fail("kvvmd's stderr ended before a line with '%s'", what);
}

static void fill(unsigned char *b, size_t n, unsigned char pat)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(pat + i * 7);
}

/* ---- the holder: client A in its own process ---------------------------------------------
   Opens a pool client (reserve, flags), grows one LIVE sequence of `live` pages with a
   pattern, then `cached` CACHED sequences of 4 pages each, steps (nothing protected), says
   'r' on `out`, then obeys one command byte from `in`:
     'c' check: the LIVE bytes are intact; its exit code says how many CACHED sequences were
         dropped (100 + n) or what failed (< 100);
     'g' grow: its LIVE sequence by 6 more pages must fail -ENOMEM (past its limit of 8
         pages), then 'c';
     'h' grow: its LIVE sequence by 3 more pages must succeed (within its limit once its
         own CACHED sequences are dropped), then 'c'. */
struct holder { const char *name; size_t reserve; unsigned live, cached; unsigned flags; };

static int holder_main(const char *path, const struct holder *h, int out, int in)
{
    struct kvvm_config c;
    tb_cfg(&c, path, h->name);
    c.pool_reserve = h->reserve;
    c.flags = h->flags;
    kvvm *kv = NULL;
    if (kvvm_open(&c, &kv))
        return 10;
    size_t bytes = (size_t)h->live * PD_GRAN;
    unsigned char *w = malloc(bytes), *r = malloc(bytes);
    kvvm_seq live, cs[8];
    if (!w || !r || h->cached > 8 || kvvm_seq_create(kv, &live) ||
        kvvm_seq_grow(kv, live, (uint64_t)h->live * TPP))
        return 11;
    fill(w, bytes, 0x21);
    if (kvvm_seq_write(kv, live, 0, 0, w, bytes))
        return 12;
    unsigned char page[BPT];
    memset(page, 0x5c, sizeof page);
    for (unsigned i = 0; i < h->cached; i++)
        if (kvvm_seq_create(kv, &cs[i]) || kvvm_seq_grow(kv, cs[i], 4 * TPP) ||
            kvvm_seq_write(kv, cs[i], 0, 0, page, sizeof page) ||
            kvvm_seq_set_class(kv, cs[i], KVVM_SEQ_CACHED))
            return 13;
    if (kvvm_step(kv) || kvvm_sync(kv))
        return 14;
    char x = 'r';
    if (write(out, &x, 1) != 1 || read(in, &x, 1) != 1)
        return 15;
    if (x == 'g' && kvvm_seq_grow(kv, live, (uint64_t)(h->live + 6) * TPP) != -ENOMEM)
        return 16;
    if (x == 'h' && kvvm_seq_grow(kv, live, (uint64_t)(h->live + 3) * TPP) != 0)
        return 19;
    if (kvvm_seq_read(kv, live, 0, 0, r, bytes) || memcmp(w, r, bytes))
        return 17;                              /* the LIVE bytes are intact */
    unsigned dropped = 0;
    for (unsigned i = 0; i < h->cached; i++) {
        struct kvvm_seq_info in_ = { .size = sizeof in_ };
        if (kvvm_seq_info(kv, cs[i], &in_))
            return 18;
        dropped += in_.dropped != 0;
    }
    kvvm_close(kv);
    free(w);
    free(r);
    return 100 + (int)dropped;
}

struct proc { pid_t pid; int to, from; };

static struct proc holder_start(const char *path, const struct holder *h)
{
    int a[2], b[2];
    cr_assert_eq(pipe2(a, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(b, O_CLOEXEC), 0);
    struct proc p = { .pid = fork() };
    cr_assert_geq(p.pid, 0);
    if (p.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);       /* a test that dies takes it along */
        close(a[0]);
        close(b[1]);
        _exit(holder_main(path, h, a[1], b[0]));
    }
    close(a[1]);
    close(b[0]);
    p.from = a[0];
    p.to = b[1];
    char x;
    cr_assert_eq(read(p.from, &x, 1), 1, "holder %s set up (status %d)", h->name,
                 x == 'r' ? 0 : pd_wait(p.pid));
    return p;
}

/* Sends cmd to the holder; its exit status. */
static int holder_end(struct proc *p, char cmd)
{
    cr_assert_eq(write(p->to, &cmd, 1), 1);
    int st = pd_wait(p->pid);
    close(p->to);
    close(p->from);
    return st;
}

/* ---- the asker: client B, in this process ------------------------------------------------ */

static kvvm *asker_open(const char *path, const char *name, uint32_t timeout_ms)
{
    struct kvvm_config c;
    tb_cfg(&c, path, name);
    c.pool_timeout_ms = timeout_ms;
    return th_open(&c);
}

/* Grows a new sequence of B over `pages` pages, writes and reads them back. */
static void asker_grow_ok(kvvm *b, unsigned pages)
{
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(b, &s), 0);
    cr_assert_eq(kvvm_seq_grow(b, s, (uint64_t)pages * TPP), 0, "%s", kvvm_last_error());
    size_t bytes = (size_t)pages * PD_GRAN;
    unsigned char *w = malloc(bytes), *r = malloc(bytes);
    cr_assert(w && r);
    fill(w, bytes, 0x73);
    cr_assert_eq(kvvm_seq_write(b, s, 0, 0, w, bytes), 0);
    cr_assert_eq(kvvm_seq_read(b, s, 0, 0, r, bytes), 0);
    cr_expect_eq(memcmp(w, r, bytes), 0, "B's bytes in the frames taken back");
    free(w);
    free(r);
}

static void wait_pool_free(const char *path)
{
    int ctl = pc_connect(path);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_hello(ctl, POOL_ROLE_CONTROL, "test", 0, 0, buf), POOL_MSG_WELCOME);
    for (;;) {
        struct pool_figures f = pc_info(ctl);
        if (f.free_bytes == f.pool_bytes && f.n_clients == 0)
            break;
        sched_yield();
    }
    close(ctl);
}

/* A fills the pool with 1 LIVE page and 15 pages of CACHED sequences (well, 3 x 4 + what
   its frame pool thread leased ahead); B's grow of 8 pages succeeds by taking frames back
   from A: A's CACHED sequences are dropped, its LIVE bytes intact, B's bytes right. */
Test(takeback, dry_pool_takes_cached_frames_back)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");
    struct holder ha = { .name = "A", .live = 3, .cached = 3 };
    struct proc a = holder_start(d.path, &ha);
    cr_assert_geq(held_of(d.path, "A"), 15 * PD_GRAN, "A holds the pool");
    kvvm *b = asker_open(d.path, "B", 60000);
    asker_grow_ok(b, 8);
    struct kvvm_stats st = { .size = sizeof st };
    cr_assert_eq(kvvm_stats(b, &st), 0);
    cr_expect_geq(st.pool_waits, 1, "B's call waited for the daemon");
    cr_expect_geq(st.pool_leases, 8);
    int rc = holder_end(&a, 'c');
    cr_expect_geq(rc, 102, "A's LIVE bytes intact and >= 2 of its CACHED sequences "
                  "dropped (exit %d: 100 + dropped, < 100 a failed check)", rc);
    kvvm_close(b);
    wait_pool_free(d.path);
    pd_stop(&d);
}

/* A client at its reserve is never asked: A reserves and holds the whole pool; B's grow
   fails -ENOMEM at once (its pool_timeout_ms is 10 minutes: TH_DEADLINE would end a wait)
   naming the pool's numbers, and A's CACHED sequences are all there. */
Test(takeback, client_at_its_reserve_is_not_asked)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");
    struct holder ha = { .name = "A", .reserve = POOL_FRAMES * PD_GRAN, .live = 4,
                         .cached = 3 };
    struct proc a = holder_start(d.path, &ha);
    kvvm *b = asker_open(d.path, "B", 600000);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(b, &s), 0);
    cr_expect_eq(kvvm_seq_grow(b, s, 2 * TPP), -ENOMEM);
    cr_expect(strstr(kvvm_last_error(), "0 of 1048576 bytes free"), "%s", kvvm_last_error());
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(b, s, &in), 0);
    cr_expect_eq(in.length, 0, "the failed grow changed nothing");
    cr_expect_eq(holder_end(&a, 'c'), 100, "A: LIVE intact, no CACHED sequence dropped");
    kvvm_close(b);
    wait_pool_free(d.path);
    pd_stop(&d);
}

/* A client that cannot give (all LIVE, no host tier) is not waited for: B fails -ENOMEM
   long before its 10-minute pool_timeout_ms, with the pool's numbers, changing nothing;
   A's bytes are intact. */
Test(takeback, client_that_cannot_give_is_not_waited_for)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");
    struct holder ha = { .name = "A", .live = POOL_FRAMES, .flags = KVVM_F_AUTO_SWAP };
    struct proc a = holder_start(d.path, &ha);
    kvvm *b = asker_open(d.path, "B", 600000);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(b, &s), 0);
    cr_expect_eq(kvvm_seq_grow(b, s, 2 * TPP), -ENOMEM);
    const char *e = kvvm_last_error();
    cr_expect(strstr(e, "0 of 1048576 bytes free") && strstr(e, "this client holds 0"),
              "the pool's numbers: %s", e);
    cr_expect(strstr(e, "no other client could give"), "%s", e);
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(b, s, &in), 0);
    cr_expect_eq(in.length, 0, "the failed grow changed nothing");
    struct kvvm_pool_info pi = { .size = sizeof pi };
    cr_assert_eq(kvvm_pool_info(b, &pi), 0);
    cr_expect_eq(pi.held_bytes, 0);
    cr_expect_eq(held_of(d.path, "A"), POOL_FRAMES * PD_GRAN, "A kept every frame");
    cr_expect_eq(holder_end(&a, 'c'), 100, "A's LIVE bytes intact");
    kvvm_close(b);
    wait_pool_free(d.path);
    pd_stop(&d);
}

/* The asker waits at most pool_timeout_ms: A is asked and does not answer (stopped), B's
   grow fails -ENOMEM saying so, its wait counted (pool_waits, pool_wait_ns >= the
   timeout); A killed, B's grow goes through. */
Test(takeback, asker_waits_at_most_pool_timeout_ms)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");
    struct holder ha = { .name = "A", .live = 3, .cached = 3 };
    struct proc a = holder_start(d.path, &ha);
    cr_assert_eq(kill(a.pid, SIGSTOP), 0);
    kvvm *b = asker_open(d.path, "B", 300);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(b, &s), 0);
    cr_expect_eq(kvvm_seq_grow(b, s, 2 * TPP), -ENOMEM);
    cr_expect(strstr(kvvm_last_error(), "within pool_timeout_ms (300 ms)") &&
              strstr(kvvm_last_error(), "bytes free"), "%s", kvvm_last_error());
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(b, s, &in), 0);
    cr_expect_eq(in.length, 0, "the failed grow changed nothing");
    struct kvvm_stats st = { .size = sizeof st };
    cr_assert_eq(kvvm_stats(b, &st), 0);
    cr_expect_geq(st.pool_waits, 1);
    cr_expect_geq(st.pool_wait_ns, 300000000ull, "it waited its pool_timeout_ms");
    kill(a.pid, SIGKILL);
    cr_expect_eq(pd_wait(a.pid), 128 + SIGKILL);
    close(a.to);
    close(a.from);
    asker_grow_ok(b, 8);
    kvvm_close(b);
    wait_pool_free(d.path);
    pd_stop(&d);
}

/* kvvmctl limit below what a client holds: it gives back down to the limit (polled with
   kvvmctl clients) dropping its CACHED sequences, its LIVE bytes intact; a grow past the
   limit then fails -ENOMEM. */
Test(takeback, limit_below_held_gives_back_down_to_it)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");
    struct holder ha = { .name = "A", .live = 3, .cached = 3 };
    struct proc a = holder_start(d.path, &ha);
    char out[1024];
    cr_assert_eq(pd_ctl(d.path, "limit A 512K", out, sizeof out), 0, "%s", out);
    while (held_of(d.path, "A") > 8 * PD_GRAN)
        sched_yield();                          /* a condition, not a time: TH_DEADLINE */
    int rc = holder_end(&a, 'g');
    cr_expect_geq(rc, 101, "A: its grow past the limit failed -ENOMEM, LIVE intact, CACHED "
                  "dropped (exit %d)", rc);
    wait_pool_free(d.path);
    pd_stop(&d);
}

/* A client killed while it is asked does not stall the daemon: A (stopped) is asked for
   B's frames; the daemon answers others meanwhile; A killed, B's waiting grow goes
   through with A's frames. */
Test(takeback, client_killed_while_asked_does_not_stall_the_daemon)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");
    struct holder ha = { .name = "A", .live = 3, .cached = 3 };
    struct proc a = holder_start(d.path, &ha);
    cr_assert_eq(kill(a.pid, SIGSTOP), 0);
    int pp[2];
    cr_assert_eq(pipe2(pp, O_CLOEXEC), 0);
    pid_t pb = fork();
    cr_assert_geq(pb, 0);
    if (pb == 0) {                              /* B: waits up to 10 minutes */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        struct kvvm_config c;
        tb_cfg(&c, d.path, "B");
        c.pool_timeout_ms = 600000;
        kvvm *b = NULL;
        kvvm_seq s;
        if (kvvm_open(&c, &b) || kvvm_seq_create(b, &s))
            _exit(10);
        _exit(kvvm_seq_grow(b, s, 8 * TPP) ? 11 : 0);
    }
    wait_daemon_says(&d, "take-back: asked client A");
    int ctl = pc_connect(d.path);               /* the daemon serves on while A is asked */
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_hello(ctl, POOL_ROLE_CONTROL, "test", 0, 0, buf), POOL_MSG_WELCOME);
    cr_expect_eq(pc_info(ctl).n_clients, 2);
    close(ctl);
    kill(a.pid, SIGKILL);
    cr_expect_eq(pd_wait(a.pid), 128 + SIGKILL);
    close(a.to);
    close(a.from);
    cr_expect_eq(pd_wait(pb), 0, "B's grow went through once A died");
    close(pp[0]);
    close(pp[1]);
    wait_pool_free(d.path);
    pd_stop(&d);
}

/* Regression (issue 34, giving back): a take-back round asked for a lease's batch (16
   frames), not for the call's need, so a grow short of N frames made N / 16 rounds, each
   a RECLAIM and a reclaim pass in the victim. Now a call's lease asks for its whole need
   (up to a message's 64 frames): B's grow of 36 pages, while A holds a 48-frame pool but
   what is free (16 at most) in 4 LIVE pages, 7 CACHED sequences of 4 pages and frames
   leased ahead (a shortfall of 20 or more), makes the daemon
   ask A once (its stderr's "asked client A" lines, counted up to B's disconnection), and
   A's LIVE bytes stay intact. */
Test(takeback, round_asks_for_the_calls_whole_shortfall_not_a_batch)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "3M");
    struct holder ha = { .name = "A", .live = 4, .cached = 7 };
    struct proc a = holder_start(d.path, &ha);
    struct kvvm_config c;
    tb_cfg(&c, d.path, "B");
    c.max_tokens = 48 * TPP;
    c.pool_timeout_ms = 60000;
    kvvm *b = th_open(&c);
    asker_grow_ok(b, 36);
    kvvm_close(b);
    unsigned asks = 0;
    char line[512];
    while (pd_line(d.err, line, sizeof line) && !(strstr(line, "client B") &&
                                                  strstr(line, "disconnected")))
        asks += strstr(line, "asked client A") != NULL;
    cr_expect_eq(asks, 1, "the daemon asked A %u times for B's one grow", asks);
    int rc = holder_end(&a, 'c');
    cr_expect_geq(rc, 100, "A's LIVE bytes intact (exit %d: 100 + dropped)", rc);
    wait_pool_free(d.path);
    pd_stop(&d);
}

/* Regression (issue 34): a client past its daemon limit did not drop its own CACHED
   sequences to grow. kvvmctl limit sets A's limit (8 pages) below its device_budget (the
   pool); A gives back down to it keeping a CACHED sequence; A's grow by 3 pages, which
   fits the limit once that sequence is dropped (as a local context does at its budget),
   failed -ENOMEM: paging counted the frames up to device_budget as free and the daemon
   refused the lease. Now it succeeds, every CACHED sequence dropped, LIVE bytes intact. */
Test(takeback, client_at_its_daemon_limit_drops_its_own_cached_to_grow)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");
    struct holder ha = { .name = "A", .live = 3, .cached = 3 };
    struct proc a = holder_start(d.path, &ha);
    char out[1024];
    cr_assert_eq(pd_ctl(d.path, "limit A 512K", out, sizeof out), 0, "%s", out);
    while (held_of(d.path, "A") > 8 * PD_GRAN)
        sched_yield();                          /* a condition, not a time: TH_DEADLINE */
    int rc = holder_end(&a, 'h');
    cr_expect_eq(rc, 103, "A: its grow within the limit succeeded, LIVE intact, all 3 "
                 "CACHED dropped (exit %d: 100 + dropped; 19: the grow failed)", rc);
    wait_pool_free(d.path);
    pd_stop(&d);
}
