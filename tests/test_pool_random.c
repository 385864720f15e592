/* tests/test_pool_random.c: random publish / attach / export / import / write / free / kill
   across 3 client processes of one real kvvmd (tests/pool_daemon.h), against a model in the
   test process, every byte verified.

   The test process holds the model: each worker's sequences (per token, the pattern its
   bytes must be), the prompts published into the daemon's shared index (their keys, per
   token patterns, and whether they must be there or may be partly there: a publisher killed
   during its publish), the exports not yet imported (their tokens and patterns). Workers
   are forked processes, each with its own context on the daemon, driven over pipes one
   command at a time; a worker checks every byte it is told to against the patterns sent with
   the command, and reports what it saw. Operations, drawn from a seeded generator:
   write (grow, then write a token range: into a shared page it copies on write), free,
   publish (fresh keys, the sequence's full blocks), attach (lookup, attach, check; no copy),
   drop a prompt (gone from the daemon and the dropper; the local entries of the others stay),
   export, import (spent after; a forged or spent token -ENOENT), drop an export, check a
   sequence, and SIGKILL a worker (idle, or in the middle of a publish or an export), which is
   then replaced by a fresh process. A kill loses that worker's sequences and nothing else:
   entries and exports outlive it. Every other generation of a worker runs on an engine
   stream, so writes after a publish or an export are in flight while it hands frames over
   (never seen through them). At the end every live sequence, prompt and export is checked.

   KVVMTEST_POOL_SEED: the seed (default: a fixed one; printed). KVVMTEST_POOL_OPS: the
   operation count (default 1000, a few seconds). A failure names the seed and the operation. */
#include <limits.h>
#include <stdarg.h>
#include "harness.h"
#include "pool_daemon.h"

#define BPT     4096u                   /* bytes per token: 16 tokens per 64 KiB page */
#define TPP     (PD_GRAN / BPT)
#define NREG    2u
#define NW      3                       /* worker processes */
#define NSLOT   6                       /* sequences per worker */
#define MAXB    4                       /* blocks per sequence at most */
#define MAXTOK  (MAXB * TPP)
#define NPROMPT 32
#define NEXP    12

enum { C_WRITE = 1, C_FREE, C_PUBLISH, C_ATTACH, C_EXPORT, C_IMPORT, C_HDROP, C_CHECK, C_DROP,
       C_EXIT };

struct cmd {
    uint32_t op, slot, a, n, pat, nkeys;
    uint64_t ns, len;
    kvvm_handoff tok;
    kvvm_key keys[MAXB];
    uint32_t want[MAXTOK];              /* per token: its pattern (attach, import, check) */
};

struct rep {
    int32_t rc;                         /* the call's result, or a check's failure (< -1000) */
    uint32_t n;                         /* attach: blocks; lookup's count in look */
    uint32_t look;
    uint64_t len, copied;               /* a new sequence's length; bytes_to_device moved */
    kvvm_handoff tok;
    char why[256];
};

_Static_assert(sizeof(struct cmd) < PIPE_BUF && sizeof(struct rep) < PIPE_BUF,
               "one write each: atomic on a pipe");

/* The byte at offset j of token tok of region r written with pattern p. */
static inline uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void tok_bytes(unsigned char *b, uint32_t p, uint32_t r, uint64_t tok)
{
    uint64_t s = mix(((uint64_t)p << 32) ^ ((uint64_t)r << 24) ^ tok);
    for (uint32_t j = 0; j < BPT; j++)
        b[j] = (unsigned char)((s >> ((j & 7) * 8)) + (j >> 3));
}

/* ---- a worker ------------------------------------------------------------------------ */

struct wk {
    kvvm *kv;
    kvvm_seq s[NSLOT];
    bool live[NSLOT];
    unsigned char *buf;                 /* MAXTOK tokens */
    unsigned char *tmp;
    bool stream;                        /* on an engine stream */
};

static int wfail(struct rep *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int wfail(struct rep *r, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
    r->rc = code;
    return code;
}

static int wcall(struct rep *r, int rc, const char *what)
{
    if (rc < 0)
        snprintf(r->why, sizeof r->why, "%s: %d %s", what, rc, kvvm_last_error());
    r->rc = rc;
    return rc;
}

/* Every byte of tokens [0, len) of every region of slot's sequence is want's. */
static int wcheck(struct wk *w, struct rep *r, uint32_t slot, uint64_t len, const uint32_t *want)
{
    struct kvvm_seq_info si = { .size = sizeof si };
    if (kvvm_seq_info(w->kv, w->s[slot], &si))
        return wfail(r, -1001, "seq_info: %s", kvvm_last_error());
    if (si.length != len)
        return wfail(r, -1002, "length %llu, the model %llu", (unsigned long long)si.length,
                     (unsigned long long)len);
    for (uint32_t reg = 0; reg < NREG && len; reg++) {
        if (kvvm_seq_read(w->kv, w->s[slot], reg, 0, w->buf, len * BPT))
            return wfail(r, -1003, "read: %s", kvvm_last_error());
        for (uint64_t t = 0; t < len; t++) {
            tok_bytes(w->tmp, want[t], reg, t);
            if (memcmp(w->tmp, w->buf + t * BPT, BPT) != 0)
                return wfail(r, -1004, "region %u token %llu: not pattern %u's bytes "
                             "(first byte %02x, want %02x)", reg, (unsigned long long)t,
                             want[t], w->buf[t * BPT], w->tmp[0]);
        }
    }
    r->rc = 0;
    return 0;
}

static int wwrite(struct wk *w, struct rep *r, const struct cmd *c)
{
    kvvm_seq *s = &w->s[c->slot];
    if (!w->live[c->slot]) {
        if (wcall(r, kvvm_seq_create(w->kv, s), "create"))
            return r->rc;
        w->live[c->slot] = true;
    }
    if (c->a + c->n > c->len && wcall(r, kvvm_seq_grow(w->kv, *s, c->a + c->n), "grow"))
        return r->rc;
    for (uint32_t reg = 0; reg < NREG; reg++) {
        for (uint32_t t = 0; t < c->n; t++)
            tok_bytes(w->buf + (size_t)t * BPT, c->pat, reg, c->a + t);
        if (wcall(r, kvvm_seq_write(w->kv, *s, reg, (uint64_t)c->a * BPT, w->buf,
                                    (size_t)c->n * BPT), "write"))
            return r->rc;
    }
    return 0;
}

static uint64_t wcopied(kvvm *kv)
{
    struct kvvm_stats st = { .size = sizeof st };
    return kvvm_stats(kv, &st) ? UINT64_MAX : st.bytes_to_device;
}

/* A new sequence in slot (the old one freed): attached (lookup first) or imported. */
static int wnew(struct wk *w, struct rep *r, const struct cmd *c)
{
    if (w->live[c->slot]) {
        if (wcall(r, kvvm_seq_free(w->kv, w->s[c->slot]), "free"))
            return r->rc;
        w->live[c->slot] = false;
    }
    uint64_t before = wcopied(w->kv);
    kvvm_seq s;
    if (c->op == C_IMPORT) {
        int rc = kvvm_seq_import(w->kv, &c->tok, &s);
        if (rc == -ENOENT && !*kvvm_last_error())
            return wfail(r, -1010, "import -ENOENT with no kvvm_last_error");
        if (wcall(r, rc, "import"))
            return rc;
    } else {
        int look = kvvm_prefix_lookup(w->kv, c->ns, c->keys, c->nkeys, NULL);
        if (wcall(r, look, "lookup") < 0)
            return look;
        r->look = (uint32_t)look;
        if (wcall(r, kvvm_seq_create(w->kv, &s), "create"))
            return r->rc;
        int n = kvvm_prefix_attach(w->kv, s, c->ns, c->keys, c->nkeys);
        if (wcall(r, n, "attach") < 0) {
            kvvm_seq_free(w->kv, s);
            return n;
        }
        r->n = (uint32_t)n;
        r->rc = 0;
    }
    w->s[c->slot] = s;
    w->live[c->slot] = true;
    r->copied = wcopied(w->kv) - before;
    struct kvvm_seq_info si = { .size = sizeof si };
    if (kvvm_seq_info(w->kv, s, &si))
        return wfail(r, -1011, "seq_info: %s", kvvm_last_error());
    r->len = si.length;
    return wcheck(w, r, c->slot, si.length, c->want);
}

static void wserve(struct wk *w, const struct cmd *c, struct rep *r)
{
    switch (c->op) {
    case C_WRITE:
        wwrite(w, r, c);
        break;
    case C_FREE:
        wcall(r, kvvm_seq_free(w->kv, w->s[c->slot]), "free");
        w->live[c->slot] = false;
        break;
    /* the reply tells the model its shares are visible to the other workers: on an engine
       stream that is once kvvm_sync returned (they are pending until the device work before
       the call completed) */
    case C_PUBLISH:
        if (wcall(r, kvvm_prefix_publish(w->kv, w->s[c->slot], c->ns, c->keys, c->nkeys),
                  "publish") >= 0 && w->stream && kvvm_sync(w->kv))
            (void)wcall(r, -EIO, "sync after the publish");
        break;
    case C_EXPORT:
        if (!wcall(r, kvvm_seq_export(w->kv, w->s[c->slot], &r->tok), "export") && w->stream &&
            kvvm_sync(w->kv))
            (void)wcall(r, -EIO, "sync after the export");
        break;
    case C_ATTACH:
    case C_IMPORT:
        wnew(w, r, c);
        break;
    case C_HDROP:
        wcall(r, kvvm_handoff_drop(w->kv, &c->tok), "handoff_drop");
        break;
    case C_DROP:
        wcall(r, kvvm_prefix_drop(w->kv, c->ns, c->keys, c->nkeys), "prefix_drop");
        break;
    case C_CHECK:
        wcheck(w, r, c->slot, c->len, c->want);
        break;
    default:
        wfail(r, -1020, "unknown command %u", c->op);
    }
}

static int worker(const char *path, int id, bool stream, int in, int out)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct kvvm_config c;
    th_config(&c, PD_GRAN, NREG, BPT, NSLOT + 2, MAXTOK, 0, 0, 0);
    char name[32];
    snprintf(name, sizeof name, "random-w%d", id);
    c.pool_socket = path;
    c.client_name = name;
    c.page_size = 0;
    c.emu_granule = 0;
    c.device_budget = 0;                /* the whole pool */
    struct wk w = { .stream = stream };
    w.buf = malloc((size_t)MAXTOK * BPT);
    w.tmp = malloc(BPT);
    if (!w.buf || !w.tmp || kvvm_open(&c, &w.kv))
        return 10;
    void *st = NULL;
    if (stream && (kvvm_stream_create(w.kv, &st) || kvvm_set_stream(w.kv, st)))
        return 11;
    struct cmd cm;
    while (read(in, &cm, sizeof cm) == (ssize_t)sizeof cm && cm.op != C_EXIT) {
        struct rep r = { 0 };
        wserve(&w, &cm, &r);
        if (write(out, &r, sizeof r) != (ssize_t)sizeof r)
            return 12;
    }
    kvvm_close(w.kv);
    free(w.buf);
    free(w.tmp);
    return 0;
}

/* ---- the model ----------------------------------------------------------------------- */

struct mseq {
    bool live;
    uint64_t len;
    uint32_t pat[MAXTOK];
};

struct mworker {
    pid_t pid;
    int cmd, rep;                       /* the test's ends */
    int gen;
    struct mseq s[NSLOT];
};

struct mprompt {
    uint64_t ns;
    uint32_t nb;
    bool sure;                          /* false: its publisher was killed during it */
    bool dropped;                       /* kvvm_prefix_drop'ed: gone from the daemon and from
                                           the dropper; the others' local entries stay */
    int pub, pub_gen;                   /* its publisher and that worker's generation */
    uint32_t local[NW];                 /* blocks each worker's context holds as its own
                                           entries (it published or attached them), reset
                                           when the worker is replaced */
    kvvm_key keys[MAXB];
    uint32_t pat[MAXTOK];
};

struct mexport {
    bool made, live;                    /* made: exported once (its token may be spent) */
    kvvm_handoff tok;
    uint64_t len;
    uint32_t pat[MAXTOK];
};

struct model {
    const char *path;
    uint64_t seed, rng;
    int op;
    char what[160];                     /* the operation now, for a failure's message */
    struct mworker w[NW];
    struct mprompt p[NPROMPT];
    int np;
    struct mexport e[NEXP];
    uint32_t next_pat, next_key;
    unsigned long counts[16];
    unsigned long kills, kills_mid, cow_writes, attached_blocks, imports, forged, drops;
};

#define FAILIF(m, cond, ...)                                                                 \
    do {                                                                                     \
        if (cond) {                                                                          \
            char msg_[512];                                                                  \
            snprintf(msg_, sizeof msg_, __VA_ARGS__);                                        \
            cr_assert_fail("seed %llu (KVVMTEST_POOL_SEED=%llu), operation %d: %s: %s",      \
                           (unsigned long long)(m)->seed, (unsigned long long)(m)->seed,     \
                           (m)->op, (m)->what, msg_);                                        \
        }                                                                                    \
    } while (0)

static uint64_t rnd(struct model *m)
{
    m->rng = mix(m->rng);
    return m->rng;
}

static uint32_t below(struct model *m, uint32_t n)
{
    return n ? (uint32_t)(rnd(m) % n) : 0;
}

static void spawn(struct model *m, int i)
{
    int cp[2], rp[2];
    cr_assert_eq(pipe2(cp, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(rp, O_CLOEXEC), 0);
    struct mworker *w = &m->w[i];
    w->gen++;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(cp[1]);
        close(rp[0]);
        _exit(worker(m->path, i, ((w->gen + i) & 1) == 0, cp[0], rp[1]));
    }
    close(cp[0]);
    close(rp[1]);
    for (int pi = 0; pi < NPROMPT; pi++)
        m->p[pi].local[i] = 0;          /* a new process: no entry of its own */
    w->pid = pid;
    w->cmd = cp[1];
    w->rep = rp[0];
    memset(w->s, 0, sizeof w->s);
}

static void reap(struct model *m, int i, bool killed)
{
    struct mworker *w = &m->w[i];
    int st = pd_wait(w->pid);
    FAILIF(m, st != (killed ? 128 + SIGKILL : 0), "worker %d exited with status %d", i, st);
    close(w->cmd);
    close(w->rep);
}

static void send_cmd(struct model *m, int i, const struct cmd *c)
{
    FAILIF(m, write(m->w[i].cmd, c, sizeof *c) != (ssize_t)sizeof *c, "to worker %d: %s", i,
           strerror(errno));
}

static struct rep ask(struct model *m, int i, const struct cmd *c)
{
    send_cmd(m, i, c);
    struct rep r;
    ssize_t n = read(m->w[i].rep, &r, sizeof r);
    if (n != (ssize_t)sizeof r) {
        int st = pd_wait(m->w[i].pid);
        FAILIF(m, true, "worker %d gave no reply (it exited with status %d)", i, st);
    }
    return r;
}

static void expect_ok(struct model *m, int i, const struct rep *r)
{
    FAILIF(m, r->rc < 0, "worker %d: %d: %s", i, r->rc, r->why);
}

/* Worker i checks slot's every byte against the model. */
static void check_seq(struct model *m, int i, uint32_t slot)
{
    struct mseq *s = &m->w[i].s[slot];
    struct cmd c = { .op = C_CHECK, .slot = slot, .len = s->len };
    memcpy(c.want, s->pat, sizeof c.want);
    struct rep r = ask(m, i, &c);
    expect_ok(m, i, &r);
}

/* ---- the operations ------------------------------------------------------------------- */

static int pick_live(struct model *m, int i, uint64_t min_len)
{
    int cand[NSLOT], n = 0;
    for (int k = 0; k < NSLOT; k++)
        if (m->w[i].s[k].live && m->w[i].s[k].len >= min_len)
            cand[n++] = k;
    return n ? cand[below(m, (uint32_t)n)] : -1;
}

static void op_write(struct model *m, int i)
{
    uint32_t slot = below(m, NSLOT);
    struct mseq *s = &m->w[i].s[slot];
    uint64_t len = s->live ? s->len : 0;
    uint32_t a = below(m, (uint32_t)(len < MAXTOK ? len + 1 : len)), n = 1 + below(m, MAXTOK - a);
    if (n > 3 * TPP)
        n = 1 + below(m, 3 * TPP);
    struct cmd c = { .op = C_WRITE, .slot = slot, .a = a, .n = n, .pat = ++m->next_pat,
                     .len = len };
    snprintf(m->what, sizeof m->what, "worker %d slot %u: write tokens [%u, %u) of length "
             "%llu, pattern %u", i, slot, a, a + n, (unsigned long long)len, c.pat);
    struct rep r = ask(m, i, &c);
    expect_ok(m, i, &r);
    s->len = len;
    s->live = true;
    for (uint32_t t = 0; t < n; t++)
        s->pat[a + t] = c.pat;
    if (a + n > s->len)
        s->len = a + n;
    m->cow_writes += a < len;
    check_seq(m, i, slot);
}

static void op_free(struct model *m, int i)
{
    int slot = pick_live(m, i, 0);
    if (slot < 0)
        return;
    snprintf(m->what, sizeof m->what, "worker %d slot %d: free", i, slot);
    struct cmd c = { .op = C_FREE, .slot = (uint32_t)slot };
    struct rep r = ask(m, i, &c);
    expect_ok(m, i, &r);
    m->w[i].s[slot].live = false;
}

/* Publishes a sequence's full blocks under fresh keys; kill: SIGKILL right after sending. */
static void op_publish(struct model *m, int i, bool kill_mid)
{
    int slot = pick_live(m, i, TPP);
    if (slot < 0 || m->np == NPROMPT)
        return;
    struct mseq *s = &m->w[i].s[slot];
    struct mprompt *p = &m->p[m->np];
    p->ns = 1 + below(m, 2);
    p->nb = 1 + below(m, (uint32_t)(s->len / TPP));
    p->sure = !kill_mid;
    p->pub = i;
    p->pub_gen = m->w[i].gen;
    struct cmd c = { .op = C_PUBLISH, .slot = (uint32_t)slot, .ns = p->ns, .nkeys = p->nb };
    for (uint32_t b = 0; b < p->nb; b++) {
        uint64_t k[4] = { m->seed, ++m->next_key, b, 0x9b };
        memcpy(p->keys[b].bytes, k, sizeof k);
    }
    memcpy(c.keys, p->keys, sizeof c.keys);
    memcpy(p->pat, s->pat, sizeof p->pat);
    snprintf(m->what, sizeof m->what, "worker %d slot %d: publish %u blocks as prompt %d in "
             "ns %llu%s", i, slot, p->nb, m->np, (unsigned long long)p->ns,
             kill_mid ? ", killed meanwhile" : "");
    m->np++;
    if (kill_mid) {
        send_cmd(m, i, &c);
        cr_assert_eq(kill(m->w[i].pid, SIGKILL), 0);
        reap(m, i, true);
        m->kills_mid++;
        spawn(m, i);
        return;
    }
    struct rep r = ask(m, i, &c);
    expect_ok(m, i, &r);
    p->local[i] = p->nb;
}

/* The blocks an attach of nk keys of p in worker i must find: all of them while the daemon
   has p, afterwards those worker i holds as its own entries. */
static uint32_t attach_want(const struct mprompt *p, int i, uint32_t nk)
{
    if (!p->dropped)
        return nk;
    return p->local[i] < nk ? p->local[i] : nk;
}

/* Drops a prompt from the daemon (and the dropper's own entries). Workers that attached it
   keep their mappings and entries; its publisher's sequence, no longer sharing its pages with
   a local entry, must still copy on write: the daemon's frames stay mapped elsewhere. */
static void op_drop(struct model *m, int i)
{
    if (!m->np)
        return;
    int pi = (int)below(m, (uint32_t)m->np);
    struct mprompt *p = &m->p[pi];
    if (!p->sure || p->dropped)
        return;
    if (below(m, 2) && p->pub_gen == m->w[p->pub].gen)
        i = p->pub;                     /* its publisher: its sequence may still map them */
    struct cmd c = { .op = C_DROP, .ns = p->ns, .nkeys = p->nb };
    memcpy(c.keys, p->keys, sizeof c.keys);
    snprintf(m->what, sizeof m->what, "worker %d: drop prompt %d (%u blocks)", i, pi, p->nb);
    struct rep r = ask(m, i, &c);
    expect_ok(m, i, &r);
    p->dropped = true;
    p->local[i] = 0;
    m->drops++;
}

static void op_attach(struct model *m, int i)
{
    if (!m->np)
        return;
    int pi = (int)below(m, (uint32_t)m->np);
    struct mprompt *p = &m->p[pi];
    bool other_ns = below(m, 8) == 0;
    uint32_t slot = below(m, NSLOT), nk = 1 + below(m, p->nb);
    struct cmd c = { .op = C_ATTACH, .slot = slot, .ns = other_ns ? p->ns + 2 : p->ns,
                     .nkeys = nk };
    memcpy(c.keys, p->keys, sizeof c.keys);
    memcpy(c.want, p->pat, sizeof c.want);
    snprintf(m->what, sizeof m->what, "worker %d slot %u: attach %u blocks of prompt %d%s", i,
             slot, nk, pi, other_ns ? " in another namespace" : "");
    struct rep r = ask(m, i, &c);
    expect_ok(m, i, &r);
    uint32_t want = other_ns ? 0 : attach_want(p, i, nk);
    FAILIF(m, p->sure ? r.n != want : r.n > want, "%u blocks attached, the model %s%u", r.n,
           p->sure ? "" : "at most ", want);
    FAILIF(m, r.look != r.n, "lookup found %u blocks, attach %u", r.look, r.n);
    FAILIF(m, r.len != (uint64_t)r.n * TPP, "length %llu after %u blocks",
           (unsigned long long)r.len, r.n);
    FAILIF(m, r.copied != 0, "the attach copied %llu bytes onto the device",
           (unsigned long long)r.copied);
    struct mseq *s = &m->w[i].s[slot];
    s->live = true;
    s->len = r.len;
    memcpy(s->pat, p->pat, sizeof s->pat);
    if (!other_ns && r.n > p->local[i])
        p->local[i] = r.n;              /* attached blocks become its own entries too */
    m->attached_blocks += r.n;
}

static void op_export(struct model *m, int i, bool kill_mid)
{
    int slot = pick_live(m, i, 1), ei = -1;
    for (int k = 0; k < NEXP && ei < 0; k++)
        ei = m->e[k].live ? -1 : k;
    if (slot < 0 || ei < 0)
        return;
    struct mseq *s = &m->w[i].s[slot];
    snprintf(m->what, sizeof m->what, "worker %d slot %d: export (length %llu)%s", i, slot,
             (unsigned long long)s->len, kill_mid ? ", killed meanwhile" : "");
    struct cmd c = { .op = C_EXPORT, .slot = (uint32_t)slot };
    if (kill_mid) {                     /* its token never reaches us: nothing to model */
        send_cmd(m, i, &c);
        cr_assert_eq(kill(m->w[i].pid, SIGKILL), 0);
        reap(m, i, true);
        m->kills_mid++;
        spawn(m, i);
        return;
    }
    struct rep r = ask(m, i, &c);
    expect_ok(m, i, &r);
    struct mexport *e = &m->e[ei];
    e->made = e->live = true;
    e->tok = r.tok;
    e->len = s->len;
    memcpy(e->pat, s->pat, sizeof e->pat);
}

/* Imports an export (checked, no copy; spent after), or a forged or spent token (-ENOENT). */
static void op_import(struct model *m, int i)
{
    int ei = (int)below(m, NEXP);
    struct mexport *e = &m->e[ei];
    uint32_t slot = below(m, NSLOT), bad = below(m, 6);
    if (!e->made)
        return;
    struct cmd c = { .op = C_IMPORT, .slot = slot, .tok = e->tok };
    memcpy(c.want, e->pat, sizeof c.want);
    if (e->live && bad == 0)
        c.tok.bytes[below(m, sizeof c.tok.bytes)] ^= (uint8_t)(1u << below(m, 8));
    bool want_ok = e->live && bad != 0;
    snprintf(m->what, sizeof m->what, "worker %d slot %u: import export %d (%s token)", i, slot,
             ei, want_ok ? "its" : e->live ? "a forged" : "a spent");
    struct rep r = ask(m, i, &c);
    if (!want_ok) {
        FAILIF(m, r.rc != -ENOENT, "%d (%s), want -ENOENT", r.rc, r.why);
        m->forged++;
        m->w[i].s[slot].live = false;   /* the worker freed the slot before the import */
        return;
    }
    expect_ok(m, i, &r);
    FAILIF(m, r.len != e->len, "length %llu, exported %llu", (unsigned long long)r.len,
           (unsigned long long)e->len);
    FAILIF(m, r.copied != 0, "the import copied %llu bytes onto the device",
           (unsigned long long)r.copied);
    struct mseq *s = &m->w[i].s[slot];
    s->live = true;
    s->len = e->len;
    memcpy(s->pat, e->pat, sizeof s->pat);
    e->live = false;
    m->imports++;
}

static void op_hdrop(struct model *m, int i)
{
    int ei = (int)below(m, NEXP);
    struct mexport *e = &m->e[ei];
    if (!e->live)
        return;
    snprintf(m->what, sizeof m->what, "worker %d: drop export %d", i, ei);
    struct cmd c = { .op = C_HDROP, .tok = e->tok };
    struct rep r = ask(m, i, &c);
    expect_ok(m, i, &r);
    e->live = false;
}

static void op_kill(struct model *m, int i)
{
    snprintf(m->what, sizeof m->what, "worker %d: SIGKILL (generation %d)", i, m->w[i].gen);
    cr_assert_eq(kill(m->w[i].pid, SIGKILL), 0);
    reap(m, i, true);
    m->kills++;
    spawn(m, i);
}

static void step(struct model *m)
{
    int i = (int)below(m, NW);
    uint32_t k = below(m, 100);
    m->counts[k / 10]++;
    if (k < 30)
        op_write(m, i);
    else if (k < 37)
        op_free(m, i);
    else if (k < 50)
        op_publish(m, i, below(m, 12) == 0);
    else if (k < 66)
        op_attach(m, i);
    else if (k < 76)
        op_export(m, i, below(m, 12) == 0);
    else if (k < 86)
        op_import(m, i);
    else if (k < 88)
        op_hdrop(m, i);
    else if (k < 92)
        op_drop(m, i);
    else if (k < 97) {
        int slot = pick_live(m, i, 0);
        snprintf(m->what, sizeof m->what, "worker %d slot %d: check", i, slot);
        if (slot >= 0)
            check_seq(m, i, (uint32_t)slot);
    } else
        op_kill(m, i);
}

/* Everything the model holds, checked: each live sequence, each prompt attached in full (a
   sure one) by some worker, each live export imported. */
static void check_all(struct model *m)
{
    for (int i = 0; i < NW; i++)
        for (uint32_t k = 0; k < NSLOT; k++)
            if (m->w[i].s[k].live) {
                snprintf(m->what, sizeof m->what, "final: worker %d slot %u", i, k);
                check_seq(m, i, k);
            }
    for (int pi = 0; pi < m->np; pi++) {
        struct mprompt *p = &m->p[pi];
        int i = pi % NW;
        struct cmd c = { .op = C_ATTACH, .slot = 0, .ns = p->ns, .nkeys = p->nb };
        memcpy(c.keys, p->keys, sizeof c.keys);
        memcpy(c.want, p->pat, sizeof c.want);
        snprintf(m->what, sizeof m->what, "final: prompt %d attached in worker %d", pi, i);
        struct rep r = ask(m, i, &c);
        expect_ok(m, i, &r);
        uint32_t want = attach_want(p, i, p->nb);
        FAILIF(m, p->sure ? r.n != want : r.n > want, "%u blocks, the model %s%u", r.n,
               p->sure ? "" : "at most ", want);
        if (r.n > p->local[i])
            p->local[i] = r.n;
        m->w[i].s[0].live = true;
    }
    for (int ei = 0; ei < NEXP; ei++) {
        if (!m->e[ei].live)
            continue;
        int i = ei % NW;
        struct cmd c = { .op = C_IMPORT, .slot = 1, .tok = m->e[ei].tok };
        memcpy(c.want, m->e[ei].pat, sizeof c.want);
        snprintf(m->what, sizeof m->what, "final: export %d imported in worker %d", ei, i);
        struct rep r = ask(m, i, &c);
        expect_ok(m, i, &r);
        FAILIF(m, r.len != m->e[ei].len, "length %llu, exported %llu",
               (unsigned long long)r.len, (unsigned long long)m->e[ei].len);
    }
}

Test(pool_random, three_processes_every_byte_against_the_model)
{
    TH_DEADLINE(240);
    struct model *m = calloc(1, sizeof *m);
    cr_assert(m);
    m->seed = 0x35c0ffee;
    const char *env = getenv("KVVMTEST_POOL_SEED");
    if (env)
        m->seed = strtoull(env, NULL, 0);
    int ops = 1000;
    env = getenv("KVVMTEST_POOL_OPS");
    if (env)
        ops = atoi(env);
    m->rng = m->seed;
    printf("pool_random: seed %llu (KVVMTEST_POOL_SEED), %d operations\n",
           (unsigned long long)m->seed, ops);
    signal(SIGPIPE, SIG_IGN);
    struct pd d;
    pd_start(&d, "56M");                /* 896 frames: room for everything the model holds,
                                           so the daemon never reclaims an entry */
    m->path = d.path;
    for (int i = 0; i < NW; i++)
        spawn(m, i);
    for (m->op = 0; m->op < ops; m->op++)
        step(m);
    m->op = ops;
    check_all(m);
    for (int i = 0; i < NW; i++) {
        struct cmd c = { .op = C_EXIT };
        snprintf(m->what, sizeof m->what, "worker %d: exit", i);
        send_cmd(m, i, &c);
        reap(m, i, false);
    }
    printf("pool_random: %d prompts published (%lu blocks attached), %lu imports, %lu forged "
           "or spent tokens refused, %lu prompts dropped, %lu writes over existing tokens, %lu "
           "kills (%lu in the middle of a publish or an export)\n", m->np, m->attached_blocks,
           m->imports, m->forged, m->drops, m->cow_writes, m->kills + m->kills_mid,
           m->kills_mid);
    cr_expect_gt(m->attached_blocks, 0);
    cr_expect_gt(m->imports, 0);
    cr_expect_gt(m->kills, 0);
    pd_stop(&d);
    free(m);
}

/* The publisher drops its entry (from the daemon and its own index) while another client still
   maps the entry's frames, then writes over the published block: the write must copy on write
   (the page is shared with the other process though no local entry shares it any more), and
   the other client keeps reading the published bytes. */
Test(pool_random, publisher_drops_then_writes_while_another_maps)
{
    TH_DEADLINE(120);
    struct model *m = calloc(1, sizeof *m);
    cr_assert(m);
    signal(SIGPIPE, SIG_IGN);
    struct pd d;
    pd_start(&d, "8M");
    m->path = d.path;
    spawn(m, 0);
    spawn(m, 1);
    struct cmd c = { .op = C_WRITE, .slot = 0, .a = 0, .n = 2 * TPP, .pat = 1 };
    snprintf(m->what, sizeof m->what, "A writes 2 blocks");
    struct rep r = ask(m, 0, &c);
    expect_ok(m, 0, &r);
    struct cmd pub = { .op = C_PUBLISH, .slot = 0, .ns = 1, .nkeys = 2 };
    memset(pub.keys[0].bytes, 0xa1, sizeof pub.keys[0].bytes);
    memset(pub.keys[1].bytes, 0xa2, sizeof pub.keys[1].bytes);
    snprintf(m->what, sizeof m->what, "A publishes them");
    r = ask(m, 0, &pub);
    expect_ok(m, 0, &r);
    struct cmd at = pub;
    at.op = C_ATTACH;
    for (uint32_t t = 0; t < 2 * TPP; t++)
        at.want[t] = 1;
    snprintf(m->what, sizeof m->what, "B attaches them");
    r = ask(m, 1, &at);
    expect_ok(m, 1, &r);
    FAILIF(m, r.n != 2 || r.copied != 0, "%u blocks, %llu bytes copied", r.n,
           (unsigned long long)r.copied);
    struct cmd drop = pub;
    drop.op = C_DROP;
    snprintf(m->what, sizeof m->what, "A drops the entry");
    r = ask(m, 0, &drop);
    expect_ok(m, 0, &r);
    c = (struct cmd){ .op = C_WRITE, .slot = 0, .a = 0, .n = TPP, .pat = 2, .len = 2 * TPP };
    snprintf(m->what, sizeof m->what, "A writes over block 0");
    r = ask(m, 0, &c);
    expect_ok(m, 0, &r);
    struct cmd chk = { .op = C_CHECK, .slot = 0, .len = 2 * TPP };
    for (uint32_t t = 0; t < 2 * TPP; t++)
        chk.want[t] = t < TPP ? 2 : 1;
    snprintf(m->what, sizeof m->what, "A reads its write");
    r = ask(m, 0, &chk);
    expect_ok(m, 0, &r);
    for (uint32_t t = 0; t < 2 * TPP; t++)
        chk.want[t] = 1;
    snprintf(m->what, sizeof m->what, "B still reads the published bytes");
    r = ask(m, 1, &chk);
    expect_ok(m, 1, &r);
    at.slot = 1;
    snprintf(m->what, sizeof m->what, "B attaches again (its own entries)");
    r = ask(m, 1, &at);
    expect_ok(m, 1, &r);
    FAILIF(m, r.n != 2, "%u blocks", r.n);
    for (int i = 0; i < 2; i++) {
        struct cmd e = { .op = C_EXIT };
        send_cmd(m, i, &e);
        reap(m, i, false);
    }
    pd_stop(&d);
    free(m);
}
