/* tests/test_pool_metrics.c: the daemon's figures for operators (issue 37), with a real kvvmd
   (tests/pool_daemon.h) and real sockets: kvvmd --metrics serves the pool's figures and each
   client's (client, pid and conn labels, names escaped; two contexts of one name and pid
   are two series), every family with # HELP and # TYPE and documented in docs/api.md, no
   series twice, figures that follow returns, exits, drops and a take-back step by step;
   the reserve (frames made ahead) inside the pool's capacity, fresh, counted, and none
   with --reserve-frames 0;
   a malformed address exits 2, one kvvmd cannot listen on exits 1; hostile HTTP clients
   (slowloris past the connection bound, huge headers, garbage, a reader that never reads)
   never stall a pool client that grows and frees meanwhile; the library's kvvm_pool_wait_duration_seconds counts what
   pool_waits counts; kvvmctl top's plain lines list the clients and not itself, and on a
   terminal (a pty) it redraws, exits 0 on q or Ctrl-C and restores the terminal's modes.
   Every wait is for a condition (a line, an answer, a figure polled), never for a time;
   TH_DEADLINE guards hangs. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <termios.h>
#include <time.h>
#include "harness.h"
#include "pool_daemon.h"

#ifndef KVVMTEST_API_MD
#error "KVVMTEST_API_MD (docs/api.md) must be defined by tests/CMakeLists.txt"
#endif

#define BPT 4096u                       /* bytes per token: 16 tokens per 64 KiB page */
#define TPP ((uint64_t)PD_GRAN / BPT)
#define GRAN ((long long)PD_GRAN)     /* a figure's bytes, as sample() reads them */

/* Starts kvvmd with --metrics 127.0.0.1:0 (and more args); returns the port it serves. */
static unsigned md_start(struct pd *d, const char *budget, const char *const *more)
{
    snprintf(d->dir, sizeof d->dir, "/tmp/kvvmpool.XXXXXX");
    cr_assert(mkdtemp(d->dir));
    char p[128];
    snprintf(p, sizeof p, "%s/sock", d->dir);
    const char *extra[8] = { "--metrics", "127.0.0.1:0" };
    for (int k = 2; more && *more && k < 7; more++)
        extra[k++] = *more;
    pd_start_at(d, p, budget, extra);
    pd_expect_ready(d);
    char line[512];
    const char *key = "kvvmd: metrics at http://127.0.0.1:";
    while (pd_line(d->err, line, sizeof line))
        if (!strncmp(line, key, strlen(key)))
            return (unsigned)atoi(line + strlen(key));
    cr_assert_fail("kvvmd said no metrics address");
    return 0;
}

static int tcp_connect(unsigned port)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(s, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(s, (struct sockaddr *)&a, sizeof a), 0, "connect: %s",
                 strerror(errno));
    return s;
}

/* Sends req, reads the whole answer (the server closes after one): malloc'ed, NUL-ended. */
static char *http(unsigned port, const char *req, size_t req_len)
{
    int s = tcp_connect(port);
    for (size_t off = 0; off < req_len;) {
        ssize_t w = send(s, req + off, req_len - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;                      /* the server may answer (431) and close early */
        off += (size_t)w;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    cr_assert(b);
    for (;;) {
        if (n + 4096 > cap)
            cr_assert(b = realloc(b, cap *= 2));
        ssize_t r = recv(s, b + n, cap - n - 1, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    b[n] = 0;
    close(s);
    return b;
}

static char *scrape(unsigned port)
{
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    char *a = http(port, req, sizeof req - 1);
    cr_assert(!strncmp(a, "HTTP/1.1 200 ", 13), "GET /metrics: %.200s", a);
    cr_assert(strstr(a, "Content-Type: text/plain; version=0.0.4"), "%.300s", a);
    char *body = strstr(a, "\r\n\r\n");
    cr_assert(body);
    memmove(a, body + 4, strlen(body + 4) + 1);
    return a;
}

/* The value of series `key` (name and labels as written), or -1 when absent. */
static long long sample(const char *t, const char *key)
{
    size_t k = strlen(key);
    for (const char *l = t; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, key, k) && l[k] == ' ')
            return atoll(l + k + 1);
    return -1;
}

/* Scrapes until series key reads want (the server publishes after each round). */
static char *wait_sample(unsigned port, const char *key, long long want)
{
    for (;;) {
        char *t = scrape(port);
        if (sample(t, key) == want)
            return t;
        free(t);
        sched_yield();
    }
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    cr_assert(b && fread(b, 1, (size_t)n, f) == (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

/* Every family: # HELP then # TYPE, counters _total, no gauge _total, every sample in the
   family just declared, every family named in docs/api.md (as `name`). Returns families. */
static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* No two samples of the text name the same series (name and labels): Prometheus refuses
   a scrape's duplicates. */
static void check_unique_series(const char *t)
{
    size_t n = 0, cap = 256;
    char **keys = malloc(cap * sizeof *keys);
    cr_assert(keys);
    for (const char *l = t; *l; l = strchr(l, '\n') + 1) {
        if (*l == '#')
            continue;
        const char *end = strchr(l, '\n');  /* the series ends at the line's last space */
        while (end > l && *end != ' ')
            end--;
        cr_assert(end > l, "a sample line: %.80s", l);
        if (n == cap)
            cr_assert(keys = realloc(keys, (cap *= 2) * sizeof *keys));
        cr_assert(keys[n++] = strndup(l, (size_t)(end - l)));
    }
    qsort(keys, n, sizeof *keys, cmp_str);
    for (size_t i = 1; i < n; i++)
        cr_expect_str_neq(keys[i - 1], keys[i], "a series twice: %s", keys[i]);
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
}

static unsigned check_families(const char *t)
{
    check_unique_series(t);
    char *doc = slurp(KVVMTEST_API_MD);
    char fam[128] = "", type[32] = "", help[128] = "";
    unsigned n = 0;
    for (const char *l = t; *l; l = strchr(l, '\n') + 1) {
        cr_assert(strchr(l, '\n'), "the text ends with a newline");
        if (!strncmp(l, "# HELP ", 7)) {
            cr_assert_eq(sscanf(l + 7, "%127s", help), 1);
            continue;
        }
        if (!strncmp(l, "# TYPE ", 7)) {
            cr_assert_eq(sscanf(l + 7, "%127s %31s", fam, type), 2);
            cr_expect_str_eq(help, fam, "# HELP %s precedes its # TYPE", fam);
            size_t fl = strlen(fam);
            bool total = fl > 6 && !strcmp(fam + fl - 6, "_total");
            cr_expect(strncmp(fam, "kvvm_", 5) == 0, "%s: kvvm_ prefix", fam);
            if (!strcmp(type, "counter"))
                cr_expect(total, "counter %s ends in _total", fam);
            else
                cr_expect(!total, "%s %s does not end in _total", type, fam);
            char q1[140], q2[140];              /* `name` or `name{labels}` */
            snprintf(q1, sizeof q1, "`%s`", fam);
            snprintf(q2, sizeof q2, "`%s{", fam);
            cr_expect(strstr(doc, q1) || strstr(doc, q2), "docs/api.md documents %s", fam);
            n++;
            continue;
        }
        size_t fl = strlen(fam);
        cr_expect(fl && !strncmp(l, fam, fl) &&
                  (l[fl] == '{' || l[fl] == ' ' || l[fl] == '_'), "sample of family %s: %.80s",
                  fam, l);
    }
    free(doc);
    return n;
}

static void lease_close(int c, unsigned n)
{
    uint64_t ids[POOL_BATCH_MAX];
    int fds[POOL_BATCH_MAX];
    cr_assert_eq(pc_lease(c, n, ids, fds, NULL), n);
    for (unsigned i = 0; i < n; i++)
        close(fds[i]);
}

Test(pool_metrics, serves_the_pool_and_each_client)
{
    TH_DEADLINE(60);
    struct pd d;
    unsigned port = md_start(&d, "4M", NULL);
    /* a name the format must escape: a quote, a backslash, a newline, a byte that is no
       UTF-8 */
    static const char weird[] = "we\"ird\\na\nme\xff";
    int a = pc_client(d.path, "alpha"), w = pc_client(d.path, weird);
    int ctl = pc_connect(d.path);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_hello(ctl, POOL_ROLE_CONTROL, "kvvmctl", 0, 0, buf), POOL_MSG_WELCOME);
    uint64_t ids[4];
    int fds[4];
    cr_assert_eq(pc_lease(a, 4, ids, fds, NULL), 4);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    lease_close(w, 2);
    char ka[128], kw[192];
    snprintf(ka, sizeof ka, "kvvm_pool_client_held_bytes{client=\"alpha\",pid=\"%d\","
             "conn=\"1\"}", (int)getpid());
    snprintf(kw, sizeof kw, "kvvm_pool_client_held_bytes{client=\"we\\\"ird\\\\na\\nme"
             "\xef\xbf\xbd\",pid=\"%d\",conn=\"2\"}", (int)getpid());
    char *t = wait_sample(port, "kvvm_pool_held_bytes", 6 * GRAN);
    cr_expect_eq(sample(t, ka), 4 * GRAN, "%s in:\n%s", ka, t);
    cr_expect_eq(sample(t, kw), 2 * GRAN, "%s in:\n%s", kw, t);
    cr_expect_eq(sample(t, "kvvm_pool_size_bytes"), 64 * GRAN);
    cr_expect_eq(sample(t, "kvvm_pool_free_bytes"), 58 * GRAN);
    cr_expect_eq(sample(t, "kvvm_pool_page_size_bytes"), GRAN);
    cr_expect_eq(sample(t, "kvvm_pool_clients"), 2, "kvvmctl's connection is no client");
    cr_expect_eq(sample(t, "kvvm_pool_control_connections"), 1);
    cr_expect_eq(sample(t, "kvvm_pool_frames_leased_total"), 6);
    cr_expect_geq(check_families(t), 25);
    free(t);

    pc_return(a, ids, 3);               /* a gives 3 back; w exits holding 2 */
    close(w);
    free(wait_sample(port, "kvvm_pool_frames_returned_total", 3));   /* two connections: */
    t = wait_sample(port, "kvvm_pool_disconnects_total{how=\"closed\"}", 1);  /* both seen */
    cr_expect_eq(sample(t, "kvvm_pool_frames_returned_total"), 3);
    cr_expect_eq(sample(t, "kvvm_pool_frames_released_at_exit_total"), 2);
    cr_expect_eq(sample(t, "kvvm_pool_held_bytes"), GRAN);
    cr_expect_eq(sample(t, ka), GRAN);
    cr_expect_eq(sample(t, kw), -1, "a gone client has no series");
    cr_expect_eq(sample(t, "kvvm_pool_clients"), 1);
    cr_expect_eq(sample(t, "kvvm_pool_connections_total"), 3);
    check_families(t);
    free(t);
    close(a);
    close(ctl);
    pd_stop(&d);
}

/* A take-back, step by step over raw connections: the pool dry (giver holds every frame),
   asker's waiting lease makes the daemon ask giver (RECLAIM); giver returns the frames and
   answers (RECLAIMED); asker gets them. The daemon's and both clients' take-back figures
   count exactly that; a lease that finds the pool dry without waiting counts as short. */
Test(pool_metrics, takeback_counted)
{
    TH_DEADLINE(60);
    struct pd d;
    unsigned port = md_start(&d, "4M", NULL);
    int g = pc_client(d.path, "giver"), a = pc_client(d.path, "asker");
    uint64_t ids[POOL_BATCH_MAX];
    int fds[POOL_BATCH_MAX];
    cr_assert_eq(pc_lease(g, 64, ids, fds, NULL), 64);
    for (int i = 0; i < 64; i++)
        close(fds[i]);
    uint64_t none[1];
    cr_assert_eq(pc_lease(a, 1, none, fds, NULL), 0, "dry, no wait: nothing");
    struct pool_lease l = { .n = 4, .wait_ms = 30000 };
    pool_proto_hdr(&l.h, POOL_MSG_LEASE);
    cr_assert_eq(pool_proto_send(a, &l, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(g, buf, NULL, NULL), POOL_MSG_RECLAIM);
    struct pool_reclaim rc;
    memcpy(&rc, buf, sizeof rc);
    cr_assert_eq(rc.n, 4);
    pc_return(g, ids, 4);
    struct pool_reclaimed done = { .seq = rc.seq, .given = 4 };
    pool_proto_hdr(&done.h, POOL_MSG_RECLAIMED);
    cr_assert_eq(pool_proto_send(g, &done, NULL, 0, 0), 0);
    int nf;
    cr_assert_eq(pc_recv(a, buf, fds, &nf), POOL_MSG_FRAMES);
    cr_assert_eq(nf, 4);
    for (int i = 0; i < nf; i++)
        close(fds[i]);
    char *t = wait_sample(port, "kvvm_pool_takeback_frames_total{state=\"given\"}", 4);
    cr_expect_eq(sample(t, "kvvm_pool_takeback_rounds_total"), 1);
    cr_expect_eq(sample(t, "kvvm_pool_takeback_asks_total"), 1);
    cr_expect_eq(sample(t, "kvvm_pool_takeback_frames_total{state=\"asked\"}"), 4);
    cr_expect_eq(sample(t, "kvvm_pool_takeback_duration_seconds_count"), 1);
    cr_expect_eq(sample(t, "kvvm_pool_leases_short_total"), 1);
    cr_expect_eq(sample(t, "kvvm_pool_frames_leased_total"), 68);
    cr_expect_eq(sample(t, "kvvm_pool_frames_returned_total"), 4);
    char k[160];
    int pid = (int)getpid();
#define CK(fam, who, conn, extra, want)                                                   \
    snprintf(k, sizeof k, fam "{client=\"" who "\",pid=\"%d\",conn=\"" conn "\"" extra "}", \
             pid);                                                                        \
    cr_expect_eq(sample(t, k), want, "%s in:\n%s", k, t)
    CK("kvvm_pool_client_takeback_asks_total", "giver", "1", "", 1);
    CK("kvvm_pool_client_takeback_frames_total", "giver", "1", ",state=\"asked\"", 4);
    CK("kvvm_pool_client_takeback_frames_total", "giver", "1", ",state=\"given\"", 4);
    CK("kvvm_pool_client_frames_returned_total", "giver", "1", "", 4);
    CK("kvvm_pool_client_held_bytes", "giver", "1", "", 60 * GRAN);
    CK("kvvm_pool_client_lease_waits_total", "asker", "2", "", 1);
    CK("kvvm_pool_client_leases_short_total", "asker", "2", "", 1);
    CK("kvvm_pool_client_frames_leased_total", "asker", "2", "", 4);
    CK("kvvm_pool_client_waiting_frames", "asker", "2", "", 0);
    CK("kvvm_pool_client_takeback_asks_total", "asker", "2", "", 0);
#undef CK
    check_families(t);
    free(t);
    close(g);
    close(a);
    pd_stop(&d);
}

/* Frame fd (a leased emulated frame: its memfd) holds only want in every byte; then it is
   filled with fill (the holder's own bytes). */
static bool frame_check_fill(int fd, unsigned char want, unsigned char fill)
{
    unsigned char *m = mmap(NULL, PD_GRAN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert_neq(m, MAP_FAILED, "mmap of a leased frame: %s", strerror(errno));
    bool ok = true;
    for (size_t i = 0; i < PD_GRAN && ok; i++)
        ok = m[i] == want;
    memset(m, fill, PD_GRAN);
    munmap(m, PD_GRAN);
    return ok;
}

/* The reserve (issue 34, giving back): fresh frames the daemon makes ahead when idle live
   inside the pool's capacity and show in the figures. On a device of exactly the pool's 16
   frames the reserve fills it (16 ready, counted free); a lease of the whole pool takes
   them (none made on the lease's path); then rounds of a whole-pool return by one client
   and at once a whole-pool lease by the other each get all 16 frames (a reserve past the
   pool would make the device refuse a create and the lease come short), every byte of
   every frame leased the poison of fresh memory, never what the other client wrote into
   the frames it gave back (a given-back frame is released, never handed on). Returned,
   the reserve fills the pool again, every release made. */
Test(pool_metrics, reserve_inside_the_pool_and_fresh)
{
    TH_DEADLINE(120);
    struct pd d;
    static const char *const more[] = { "--emu-device-bytes", "1M", NULL };
    unsigned port = md_start(&d, "1M", more);
    char *t = wait_sample(port, "kvvm_pool_ready_frames", 16);
    cr_expect_eq(sample(t, "kvvm_pool_frames_created_total{when=\"ahead\"}"), 16);
    cr_expect_eq(sample(t, "kvvm_pool_free_bytes"), 16 * GRAN, "ready frames are free");
    free(t);
    int c[2] = { pc_client(d.path, "one"), pc_client(d.path, "two") };
    uint64_t ids[16];
    int fds[16];
    cr_assert_eq(pc_lease(c[0], 16, ids, fds, NULL), 16);
    t = wait_sample(port, "kvvm_pool_ready_frames", 0);
    cr_expect_eq(sample(t, "kvvm_pool_frames_created_total{when=\"at_lease\"}"), 0,
                 "every frame was ready");
    cr_expect_eq(sample(t, "kvvm_pool_free_bytes"), 0);
    free(t);
    enum { ROUNDS = 12 };
    for (int round = 0; round <= ROUNDS; round++) {
        for (int i = 0; i < 16; i++) {
            cr_expect(frame_check_fill(fds[i], 0xA5, (unsigned char)(0x10 + round)),
                      "round %d, frame %d: fresh (poison), not the other client's bytes",
                      round, i);
            close(fds[i]);
        }
        int me = round & 1;
        pc_return(c[me], ids, 16);
        (void)pc_info(c[me]);           /* the return is done */
        if (round < ROUNDS)
            cr_assert_eq(pc_lease(c[!me], 16, ids, fds, NULL), 16,
                         "round %d: the whole pool at once", round);
    }
    /* the server's snapshot may lag the loop: a snapshot from between a round's return and
       its lease reads 16 ready frames too. The last lease's snapshot first (the count only
       grows), then the one after the last return */
    free(wait_sample(port, "kvvm_pool_frames_leased_total", 16 * (ROUNDS + 1)));
    t = wait_sample(port, "kvvm_pool_ready_frames", 16);
    cr_expect_eq(sample(t, "kvvm_pool_releasing_frames"), 0);
    cr_expect_eq(sample(t, "kvvm_pool_frames_leased_total"), 16 * (ROUNDS + 1));
    cr_expect_eq(sample(t, "kvvm_pool_leases_short_total"), 0);
    cr_expect_eq(sample(t, "kvvm_pool_free_bytes"), 16 * GRAN);
    free(t);
    close(c[0]);
    close(c[1]);
    pd_stop(&d);
}


/* Issue 34 (giving back): where the device has room past the pool (a 64 MiB device, a
   1 MiB pool of 16 frames), the reserve stays ready when the pool is full, never counted
   in the pool's figures: a client leasing the whole pool takes 16 ready frames, the
   daemon makes its 64 again past the pool (free_bytes stays 0), and a take-back for
   another client then grants ready frames, none made on its lease's path. A call's lease
   announcing a need larger than the reserve (LEASE's need) makes the reserve keep that
   many ready from then on. */
Test(pool_metrics, reserve_past_the_pool_where_the_device_has_room)
{
    TH_DEADLINE(120);
    struct pd d;
    unsigned port = md_start(&d, "1M", NULL);
    free(wait_sample(port, "kvvm_pool_ready_frames", 64));
    int v = pc_client(d.path, "victim"), b = pc_client(d.path, "asker");
    uint64_t ids[16];
    int fds[16];
    cr_assert_eq(pc_lease(v, 16, ids, fds, NULL), 16);
    for (int i = 0; i < 16; i++)
        close(fds[i]);
    free(wait_sample(port, "kvvm_pool_free_bytes", 0));    /* the lease seen */
    char *t = wait_sample(port, "kvvm_pool_ready_frames", 64);
    cr_expect_eq(sample(t, "kvvm_pool_free_bytes"), 0, "ready frames past the pool are not "
                 "the pool's");
    cr_expect_eq(sample(t, "kvvm_pool_frames_created_total{when=\"at_lease\"}"), 0);
    free(t);
    struct pool_lease m = { .n = 8, .wait_ms = 30000, .need = 100 };
    pool_proto_hdr(&m.h, POOL_MSG_LEASE);
    cr_assert_eq(pool_proto_send(b, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(v, buf, NULL, NULL), POOL_MSG_RECLAIM);
    const struct pool_reclaim *r = (const void *)buf;
    cr_expect_eq(r->n, 16, "the whole need, within what the victim holds");
    pc_return(v, ids, 16);
    struct pool_reclaimed a = { .seq = r->seq, .given = 16 };
    pool_proto_hdr(&a.h, POOL_MSG_RECLAIMED);
    cr_assert_eq(pool_proto_send(v, &a, NULL, 0, 0), 0);
    int nf = 0, got[POOL_BATCH_MAX];
    cr_assert_eq(pc_recv(b, buf, got, &nf), POOL_MSG_FRAMES);
    cr_expect_eq(((const struct pool_frames *)buf)->n, 8);
    for (int i = 0; i < nf; i++)
        close(got[i]);
    /* the need (100, capped by the pool's 16 frames for this client) asked; the reserve
       keeps what the device allows of it */
    free(wait_sample(port, "kvvm_pool_frames_leased_total", 24));  /* the grant seen */
    t = wait_sample(port, "kvvm_pool_ready_frames", 64);
    cr_expect_eq(sample(t, "kvvm_pool_frames_created_total{when=\"at_lease\"}"), 0,
                 "the take-back's grant sent ready frames");
    free(t);
    close(b);
    close(v);
    pd_stop(&d);
}

/* regress/releases_wait_for_the_takeback: the daemon releases no dead frame while a
   take-back is on (a release frees the frame's memory: CPU the giver's copies and the
   asker's imports want), and releases them all once it ends. Before: the loop released
   one in each idle moment of the round. */
Test(pool_metrics, releases_wait_for_the_takeback)
{
    TH_DEADLINE(120);
    struct pd d;
    unsigned port = md_start(&d, "1M", NULL);
    free(wait_sample(port, "kvvm_pool_ready_frames", 64));
    int v = pc_client(d.path, "victim"), b = pc_client(d.path, "asker");
    uint64_t ids[16], got_ids[8];
    int fds[16];
    cr_assert_eq(pc_lease(v, 16, ids, fds, NULL), 16);
    for (int i = 0; i < 16; i++)
        close(fds[i]);
    struct pool_lease m = { .n = 8, .wait_ms = 30000 };
    pool_proto_hdr(&m.h, POOL_MSG_LEASE);
    cr_assert_eq(pool_proto_send(b, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(v, buf, NULL, NULL), POOL_MSG_RECLAIM);
    struct pool_reclaim r;
    memcpy(&r, buf, sizeof r);
    pc_return(v, ids, 8);               /* given back; the ask not answered yet */
    int nf = 0;
    cr_assert_eq(pc_recv(b, buf, fds, &nf), POOL_MSG_FRAMES);
    const struct pool_frames *f = (const void *)buf;
    cr_assert_eq(f->n, 8);
    memcpy(got_ids, f->ids, sizeof got_ids);
    for (int i = 0; i < nf; i++)
        close(fds[i]);
    for (int i = 0; i < 32; i++)
        (void)pc_info(b);               /* the loop idles between them */
    pc_return(b, got_ids, 1);           /* a figure published after those */
    char *t = wait_sample(port, "kvvm_pool_frames_returned_total", 9);
    cr_expect_eq(sample(t, "kvvm_pool_releasing_frames"), 9,
                 "no release while the victim's ask is open:\n%s", t);
    free(t);
    struct pool_reclaimed a = { .seq = r.seq, .given = 8 };
    pool_proto_hdr(&a.h, POOL_MSG_RECLAIMED);
    cr_assert_eq(pool_proto_send(v, &a, NULL, 0, 0), 0);
    free(wait_sample(port, "kvvm_pool_releasing_frames", 0));  /* the round over: all */
    close(b);
    close(v);
    pd_stop(&d);
}

/* The reserve grows to the largest need a call's lease announced (within the device's
   room): a lease of 1 frame whose call needs 100 of a 128-frame pool makes the daemon keep
   100 ready, past its --reserve-frames of 64. */
Test(pool_metrics, reserve_grows_to_the_largest_need_announced)
{
    TH_DEADLINE(120);
    struct pd d;
    unsigned port = md_start(&d, "8M", NULL);
    free(wait_sample(port, "kvvm_pool_ready_frames", 64));
    int b = pc_client(d.path, "asker");
    struct pool_lease m = { .n = 1, .wait_ms = 30000, .need = 100 };
    pool_proto_hdr(&m.h, POOL_MSG_LEASE);
    cr_assert_eq(pool_proto_send(b, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int nf = 0, got[POOL_BATCH_MAX];
    cr_assert_eq(pc_recv(b, buf, got, &nf), POOL_MSG_FRAMES);
    for (int i = 0; i < nf; i++)
        close(got[i]);
    free(wait_sample(port, "kvvm_pool_ready_frames", 100));
    close(b);
    pd_stop(&d);
}

/* --reserve-frames 0: no frame made ahead, every leased frame made on the lease's path and
   every given-back one released at once (nothing ready, nothing releasing); a malformed
   value is a usage error (exit 2) naming the option and the value. */
Test(pool_metrics, reserve_frames_zero_and_malformed)
{
    TH_DEADLINE(60);
    struct pd d;
    static const char *const none[] = { "--reserve-frames", "0", NULL };
    unsigned port = md_start(&d, "1M", none);
    int c = pc_client(d.path, "one");
    uint64_t ids[8];
    int fds[8];
    cr_assert_eq(pc_lease(c, 8, ids, fds, NULL), 8);
    for (int i = 0; i < 8; i++)
        close(fds[i]);
    pc_return(c, ids, 8);
    char *t = wait_sample(port, "kvvm_pool_frames_returned_total", 8);
    cr_expect_eq(sample(t, "kvvm_pool_frames_created_total{when=\"at_lease\"}"), 8);
    cr_expect_eq(sample(t, "kvvm_pool_frames_created_total{when=\"ahead\"}"), 0);
    cr_expect_eq(sample(t, "kvvm_pool_ready_frames"), 0);
    cr_expect_eq(sample(t, "kvvm_pool_releasing_frames"), 0);
    free(t);
    close(c);
    pd_stop(&d);
    static const char *const bad[] = { "x", "-1", "65537", "" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct pd b = { 0 };
        const char *extra[] = { "--reserve-frames", bad[i], NULL };
        pd_start_at(&b, "/tmp/kvvm-reserve-never-bound", "4M", extra);
        cr_expect_eq(pd_wait(b.pid), 2, "--reserve-frames '%s': exit 2", bad[i]);
        char line[512];
        cr_expect(pd_line(b.err, line, sizeof line));
        cr_expect(strstr(line, "--reserve-frames") && strstr(line, bad[i]),
                  "the message names the option and the value: %s", line);
        close(b.out);
        close(b.err);
    }
}

/* A client that sends something malformed is dropped: counted as dropped, not closed, and
   the frames it held as released at exit. */
Test(pool_metrics, dropped_client_counted)
{
    TH_DEADLINE(60);
    struct pd d;
    unsigned port = md_start(&d, "4M", NULL);
    int c = pc_client(d.path, "rogue");
    lease_close(c, 2);
    static const char junk[] = "not a message";
    cr_assert_eq(send(c, junk, sizeof junk, 0), (ssize_t)sizeof junk);
    cr_assert(pc_dropped(c));
    char *t = wait_sample(port, "kvvm_pool_disconnects_total{how=\"dropped\"}", 1);
    cr_expect_eq(sample(t, "kvvm_pool_disconnects_total{how=\"closed\"}"), 0);
    cr_expect_eq(sample(t, "kvvm_pool_frames_released_at_exit_total"), 2);
    cr_expect_eq(sample(t, "kvvm_pool_clients"), 0);
    cr_expect_eq(sample(t, "kvvm_pool_free_bytes"), 64 * GRAN);
    check_families(t);
    free(t);
    close(c);
    pd_stop(&d);
}

/* Regression: two contexts of one process may carry one name (the default
   "<program>-<pid>" is the same for both): their series differ by conn, never twice the
   same series (Prometheus would refuse the scrape). */
Test(pool_metrics, same_name_and_pid_are_two_series)
{
    TH_DEADLINE(60);
    struct pd d;
    unsigned port = md_start(&d, "4M", NULL);
    int a = pc_client(d.path, "twin"), b = pc_client(d.path, "twin");
    lease_close(a, 1);
    lease_close(b, 3);
    char *t = wait_sample(port, "kvvm_pool_held_bytes", 4 * GRAN);
    char k[128];
    snprintf(k, sizeof k, "kvvm_pool_client_held_bytes{client=\"twin\",pid=\"%d\",conn=\"1\"}",
             (int)getpid());
    cr_expect_eq(sample(t, k), GRAN, "%s in:\n%s", k, t);
    snprintf(k, sizeof k, "kvvm_pool_client_held_bytes{client=\"twin\",pid=\"%d\",conn=\"2\"}",
             (int)getpid());
    cr_expect_eq(sample(t, k), 3 * GRAN, "%s in:\n%s", k, t);
    check_families(t);
    free(t);
    close(a);
    close(b);
    pd_stop(&d);
}

Test(pool_metrics, malformed_address_exits_2)
{
    TH_DEADLINE(60);
    static const char *const bad[] = { "127.0.0.1", "localhost:9464", "127.0.0.1:65536",
                                       "127.0.0.1:-1", ":9464", "127.0.0.1:", "::1:9464",
                                       "127.0.0.1:94x" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct pd d = { 0 };
        const char *extra[] = { "--metrics", bad[i], NULL };
        pd_start_at(&d, "/tmp/kvvm-metrics-never-bound", "4M", extra);
        cr_expect_eq(pd_wait(d.pid), 2, "--metrics %s: exit 2", bad[i]);
        char line[512];
        cr_expect_not(pd_line(d.out, line, sizeof line), "no ready line: '%s'", line);
        cr_expect(pd_line(d.err, line, sizeof line));
        cr_expect(strstr(line, "--metrics") && strstr(line, bad[i]),
                  "the message names the option and the value: %s", line);
        close(d.out);
        close(d.err);
    }
}

/* An address kvvmd cannot listen on (taken): exit 1 naming it, no ready line, the pool's
   socket not left behind. */
Test(pool_metrics, address_in_use_exits_1)
{
    TH_DEADLINE(60);
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    cr_assert_eq(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(l, 1), 0);
    cr_assert_eq(getsockname(l, (struct sockaddr *)&a, &al), 0);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    struct pd d = { 0 };
    snprintf(d.dir, sizeof d.dir, "/tmp/kvvmpool.XXXXXX");
    cr_assert(mkdtemp(d.dir));
    char p[128];
    snprintf(p, sizeof p, "%s/sock", d.dir);
    const char *extra[] = { "--metrics", addr, NULL };
    pd_start_at(&d, p, "4M", extra);
    cr_expect_eq(pd_wait(d.pid), 1, "--metrics %s taken: exit 1", addr);
    char line[512];
    cr_expect_not(pd_line(d.out, line, sizeof line), "no ready line: '%s'", line);
    bool said = false;
    while (!said && pd_line(d.err, line, sizeof line))
        said = strstr(line, "cannot start") && strstr(line, addr);
    cr_expect(said, "stderr names the address");
    struct stat st;
    cr_expect_neq(lstat(p, &st), 0, "the socket is removed");
    close(d.out);
    close(d.err);
    close(l);
    rmdir(d.dir);
}

/* ---- a hostile HTTP side ----------------------------------------------------------------- */

struct attack {
    unsigned port;
    int stop;                           /* atomic: the client is done */
    unsigned rounds;                    /* attack rounds made */
};

/* Until stop: rounds of 48 slowloris connections (half a request each, held open), a
   header past the bound, garbage, a GET whose answer is never read; then all closed. */
static void *attack_main(void *arg)
{
    struct attack *at = arg;
    static char big[64 * 1024];
    memset(big, 'a', sizeof big);
    strcpy(big, "GET /metrics HTTP/1.1\r\nX-Big: ");
    big[strlen(big)] = 'a';             /* no end of header in it */
    while (!__atomic_load_n(&at->stop, __ATOMIC_ACQUIRE)) {
        int held[50], nh = 0;
        for (; nh < 48; nh++) {
            held[nh] = tcp_connect(at->port);
            (void)!send(held[nh], "GET /metrics HTTP/1.1\r\nX-Slow: ", 31, MSG_NOSIGNAL);
        }
        held[nh] = tcp_connect(at->port);
        (void)!send(held[nh++], "GET /metrics HTTP/1.1\r\n\r\n", 25, MSG_NOSIGNAL);
        int b = tcp_connect(at->port);
        fcntl(b, F_SETFL, O_NONBLOCK);
        (void)!send(b, big, sizeof big, MSG_NOSIGNAL);
        close(b);
        free(http(at->port, "\x00\x01garbage\r\n\r\n", 14));
        for (int i = 0; i < nh; i++)
            close(held[i]);
        __atomic_fetch_add(&at->rounds, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void pool_cfg(struct kvvm_config *c, const char *path, const char *name)
{
    th_config(c, (size_t)PD_GRAN, 1, BPT, 8, 64 * TPP, 0, 0, 0);
    c->pool_socket = path;
    c->client_name = name;
    c->page_size = 0;
    c->emu_granule = 0;
    c->device_budget = 0;
}

Test(pool_metrics, hostile_http_clients_never_stall_pool_clients)
{
    TH_DEADLINE(120);
    struct pd d;
    struct attack at = { .port = md_start(&d, "4M", NULL) };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, attack_main, &at), 0);
    while (__atomic_load_n(&at.rounds, __ATOMIC_ACQUIRE) < 1)
        sched_yield();                  /* the attack is on before the client starts */
    struct kvvm_config c;
    pool_cfg(&c, d.path, "grower");
    kvvm *kv = th_open(&c);
    /* grows and frees while the attack goes on: each cycle leases and gives back */
    for (int i = 0; i < 20; i++) {
        kvvm_seq s;
        cr_assert_eq(kvvm_seq_create(kv, &s), 0);
        cr_assert_eq(kvvm_seq_grow(kv, s, 40 * TPP), 0, "cycle %d: %s", i,
                     kvvm_last_error());
        cr_assert_eq(kvvm_seq_free(kv, s), 0);
        cr_assert_geq(kvvm_trim(kv, 0), 0);
    }
    struct kvvm_stats st;
    th_stats(kv, &st);
    cr_expect_geq(st.pool_leases, 40, "frames leased during the attack: %llu",
                  (unsigned long long)st.pool_leases);
    cr_expect_gt(st.pool_returns, 0);
    /* the metrics still answer during the attack, and come to count the one client (a
       scrape reads the snapshot the loop last published, which may lag: waited for,
       bounded by the deadline; a daemon that stalls never answers and fails it) */
    free(wait_sample(at.port, "kvvm_pool_clients", 1));
    __atomic_store_n(&at.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    kvvm_close(kv);
    pd_stop(&d);
}

/* ---- the library's side: waits on the pool as a histogram --------------------------------- */

/* The value of series key in the library's text, as a double (seconds written exactly). */
static double lib_sample(const char *t, const char *key)
{
    size_t k = strlen(key);
    for (const char *l = t; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, key, k) && l[k] == ' ')
            return strtod(l + k + 1, NULL);
    return -1;
}

/* Regression (issue 37, "waits on the pool as a histogram"): the calls' waits for the
   daemon are kvvm_pool_wait_duration_seconds, whose _count is pool_waits and _sum
   pool_wait_ns; the series did not exist before. */
Test(pool_metrics, pool_wait_histogram_counts_what_pool_waits_counts)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    struct kvvm_config c;
    pool_cfg(&c, d.path, "waiter");
    c.pool_thread = 0;                  /* every lease on the caller's thread: a wait */
    kvvm *kv = th_open(&c);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, 40 * TPP), 0, "%s", kvvm_last_error());
    struct kvvm_stats st;
    th_stats(kv, &st);
    int n = kvvm_metrics(kv, NULL, 0);
    cr_assert_gt(n, 0);
    char *t = malloc((size_t)n + 1);
    cr_assert_eq(kvvm_metrics(kv, t, (size_t)n + 1), n);
    cr_assert_gt(st.pool_waits, 0, "a grow of 40 pages leased on the caller's thread");
    double cnt = lib_sample(t, "kvvm_pool_wait_duration_seconds_count");
    double sum = lib_sample(t, "kvvm_pool_wait_duration_seconds_sum");
    double inf = lib_sample(t, "kvvm_pool_wait_duration_seconds_bucket{le=\"+Inf\"}");
    cr_expect_eq((unsigned long long)cnt, st.pool_waits, "_count %.0f, pool_waits %llu", cnt,
                 (unsigned long long)st.pool_waits);
    cr_expect_eq(inf, cnt, "+Inf bucket == _count");
    double want = (double)st.pool_wait_ns / 1e9;
    cr_expect(sum > 0 && sum >= want * 0.999999 && sum <= want * 1.000001,
              "_sum %.9f s, pool_wait_ns %llu", sum, (unsigned long long)st.pool_wait_ns);
    free(t);
    cr_assert_eq(kvvm_seq_free(kv, s), 0);
    kvvm_close(kv);
    pd_stop(&d);
}

/* ---- kvvmctl top --------------------------------------------------------------------------- */

/* Not a terminal (a pipe): plain lines, one snapshot per interval, --count of them; the
   clients listed with their held bytes, kvvmctl's own connection not among them. */
Test(ctl_top, plain_lines_list_the_clients)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    int a = pc_client(d.path, "top-alpha"), b = pc_client(d.path, "top-beta");
    lease_close(a, 3);
    lease_close(b, 1);
    char out[8192];
    cr_assert_eq(pd_ctl(d.path, "top --count 3 --interval 20", out, sizeof out), 0, "%s",
                 out);
    unsigned snaps = 0;
    for (const char *p = out; (p = strstr(p, "pool ")); p++)
        snaps += p == out || p[-1] == '\n';
    cr_expect_eq(snaps, 3, "three snapshots:\n%s", out);
    cr_expect(strstr(out, "clients 2 "), "%s", out);
    char want[128];
    snprintf(want, sizeof want, "top-alpha %*d %12llu ", 24 - 9 + 8, (int)getpid(),
             3 * (unsigned long long)PD_GRAN);
    cr_expect(strstr(out, want), "'%s' in:\n%s", want, out);
    cr_expect(strstr(out, "top-beta"), "%s", out);
    cr_expect_null(strstr(out, "kvvmctl"), "kvvmctl's connection is no client:\n%s", out);
    cr_expect_null(strstr(out, "\033["), "no terminal escapes in plain mode");
    close(a);
    close(b);
    pd_stop(&d);
}

Test(ctl_top, bad_options_exit_2)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    static const char *const bad[] = { "top --count 0", "top --interval 5", "top --interval",
                                       "top --count x", "top --bogus", "--json top" };
    char out[4096];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(pd_ctl(d.path, bad[i], out, sizeof out), 2, "%s: %s", bad[i], out);
        cr_expect(strstr(out, "kvvmctl: "), "%s: the cause is said: %s", bad[i], out);
    }
    pd_stop(&d);
}

/* On a terminal (a pty): the screen is cleared and redrawn each interval; q exits 0, and
   so does Ctrl-C; the terminal's modes are restored at exit. */
static pid_t top_on_pty(const char *path, int *master)
{
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    cr_assert_geq(m, 0);
    cr_assert_eq(grantpt(m), 0);
    cr_assert_eq(unlockpt(m), 0);
    const char *sn = ptsname(m);
    cr_assert(sn);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setsid();
        int sl = open(sn, O_RDWR);          /* the session's controlling terminal */
        if (sl < 0 || ioctl(sl, TIOCSCTTY, 0) != 0)
            _exit(126);
        dup2(sl, 0);
        dup2(sl, 1);
        dup2(sl, 2);
        execl(KVVMTEST_KVVMCTL, "kvvmctl", "--socket", path, "top", "--interval", "20",
              (char *)NULL);
        _exit(127);
    }
    *master = m;
    return pid;
}

/* Reads the pty until `screens` redraws were seen (true), or its end (false). */
static bool pty_screens(int m, unsigned screens, char *seen, size_t cap)
{
    static const char clear[] = "\033[H\033[2J";
    size_t n = 0;
    unsigned got = 0;
    for (;;) {
        if (n + 1 >= cap) {                 /* keep the tail: a sequence may straddle */
            memmove(seen, seen + n - 64, 64);
            n = 64;
        }
        ssize_t r = read(m, seen + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        size_t from = n > sizeof clear ? n - sizeof clear : 0;
        n += (size_t)r;
        seen[n] = 0;
        for (const char *p = seen + from; (p = strstr(p, clear)); p++)
            got++;
        if (got >= screens)
            return true;
    }
}

static int pty_finish(int m, pid_t pid)
{
    char b[4096];
    for (;;) {                              /* drain until it closes the terminal */
        ssize_t r = read(m, b, sizeof b);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
    }
    return pd_wait(pid);
}

Test(ctl_top, terminal_redraws_and_q_or_ctrl_c_exit_0)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    int c = pc_client(d.path, "on-a-tty");
    lease_close(c, 2);
    static char seen[1 << 16];
    for (int round = 0; round < 2; round++) {
        int m;
        pid_t pid = top_on_pty(d.path, &m);
        cr_assert(pty_screens(m, 3, seen, sizeof seen), "three screens drawn");
        cr_expect(strstr(seen, "on-a-tty"), "the client's row: %s", seen);
        struct termios t;
        cr_assert_eq(tcgetattr(m, &t), 0);
        cr_expect_eq(t.c_lflag & (ICANON | ECHO), 0, "raw while it runs (keys, no echo)");
        cr_assert_eq(write(m, round ? "\003" : "q", 1), 1);
        cr_expect_eq(pty_finish(m, pid), 0, "%s exits 0", round ? "Ctrl-C" : "q");
        cr_assert_eq(tcgetattr(m, &t), 0);
        cr_expect_eq(t.c_lflag & (ICANON | ECHO), ICANON | ECHO, "the modes are restored");
        close(m);
    }
    close(c);
    pd_stop(&d);
}
