/*
 * kvvmctl: the pool daemon's control tool (docs/api.md "The pool"). A thin main over
 * pool/protocol.h: it connects as a control connection (not a client: n_clients counts
 * contexts), asks, prints.
 *
 *   kvvmctl [--socket PATH] [--json] status           pool size, free, clients, entries
 *   kvvmctl [--socket PATH] [--json] clients          one line (object) per client
 *   kvvmctl [--socket PATH] limit NAME BYTES          a client's limit at run time
 *   kvvmctl [--socket PATH] drop [NS]                 drop shared prefix entries
 *   kvvmctl [--socket PATH] top [--interval MS] [--count N]
 *                                                     a live table of the pool and clients
 *
 * top: on a terminal it redraws the screen every interval (q or Ctrl-C: exit 0); when
 * stdout is no terminal it prints plain lines, one snapshot per interval, each starting
 * with "pool ..." and ending with an empty line, until --count snapshots or a signal.
 *
 * PATH defaults to $KVVM_POOL_SOCKET. --json figures are numbers in bytes. Exit 0 on
 * success, 1 with a message naming the cause otherwise, 2 for a usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "../common/json.h"
#include "pool/protocol.h"

static const char *sock_path;
static bool json;

static int usage(void)
{
    fputs("usage: kvvmctl [--socket PATH] [--json] status\n"
          "       kvvmctl [--socket PATH] [--json] clients\n"
          "       kvvmctl [--socket PATH] limit NAME BYTES\n"
          "       kvvmctl [--socket PATH] drop [NS]\n"
          "       kvvmctl [--socket PATH] top [--interval MS] [--count N]\n"
          "PATH defaults to $KVVM_POOL_SOCKET; BYTES takes K/M/G suffixes.\n", stderr);
    return 2;
}

static int fail(const char *fmt, const char *a, const char *b)
{
    fputs("kvvmctl: ", stderr);
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 1;
}

/* Connects and greets as a control connection; the welcome in *w. -1 (said) on failure. */
static int ctl_connect(struct pool_welcome *w)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    if (fd < 0 || strlen(sock_path) >= sizeof a.sun_path) {
        fail("cannot connect to %s%s", sock_path, fd < 0 ? ": no socket" : ": path too long");
        goto out;
    }
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fail("no kvvmd answers on %s: %s", sock_path, strerror(errno));
        goto out;
    }
    struct pool_hello h = { .version = POOL_PROTO_VERSION, .role = POOL_ROLE_CONTROL };
    pool_proto_hdr(&h.h, POOL_MSG_HELLO);
    snprintf(h.name, sizeof h.name, "kvvmctl");
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int nfds;
    unsigned type;
    long n = pool_proto_send(fd, &h, NULL, 0, 0) ? -1
             : pool_proto_recv(fd, buf, sizeof buf, NULL, 0, &nfds, 0);
    if (n <= 0 || pool_proto_check(buf, (size_t)n, nfds, &type)) {
        fail("%s: the daemon did not answer as kvvmd%s", sock_path, "");
        goto out;
    }
    if (type == POOL_MSG_REFUSED) {
        fail("%s: refused: %s", sock_path, ((struct pool_refused *)buf)->why);
        goto out;
    }
    memcpy(w, buf, sizeof *w);
    if (type != POOL_MSG_WELCOME || w->version != POOL_PROTO_VERSION) {
        fprintf(stderr, "kvvmctl: %s: the daemon speaks protocol version %u, kvvmctl %u\n",
                sock_path, type == POOL_MSG_WELCOME ? w->version : 0, POOL_PROTO_VERSION);
        goto out;
    }
    return fd;
out:
    if (fd >= 0)
        close(fd);
    return -1;
}

/* Sends a request that has no body. 0; 1 (said). */
static int ask(int fd, unsigned req)
{
    _Alignas(8) unsigned char m[sizeof(struct pool_hdr)];
    pool_proto_hdr((struct pool_hdr *)m, req);
    if (pool_proto_send(fd, m, NULL, 0, 0))
        return fail("%s: the daemon went away%s", sock_path, "");
    return 0;
}

/* Receives one message of type want into buf (POOL_MSG_MAX bytes). 0; 1 (said). */
static int recv_one(int fd, unsigned want, void *buf)
{
    int nfds;
    unsigned type;
    long n = pool_proto_recv(fd, buf, POOL_MSG_MAX, NULL, 0, &nfds, 0);
    if (n <= 0 || pool_proto_check(buf, (size_t)n, nfds, &type) || type != want)
        return fail("%s: the daemon went away or answered out of turn%s", sock_path, "");
    return 0;
}

static int cmd_status(int fd, const struct pool_welcome *w)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    if (ask(fd, POOL_MSG_INFO) ||
        recv_one(fd, POOL_MSG_INFO_REPLY, buf))
        return 1;
    const struct pool_figures *f = &((struct pool_info_reply *)buf)->fig;
    const char *backend = w->backend == POOL_BACKEND_EMULATED ? "emulated" : "cuda";
    if (json) {
        printf("{\"pool_bytes\":%" PRIu64 ",\"free_bytes\":%" PRIu64 ",\"held_bytes\":%" PRIu64
               ",\"n_clients\":%u,\"shared_entries\":%" PRIu64 ",\"shared_bytes\":%" PRIu64
               ",\"page_size\":%" PRIu64 ",\"backend\":\"%s\"}\n", f->pool_bytes,
               f->free_bytes, f->pool_bytes - f->free_bytes, f->n_clients, f->shared_entries,
               f->shared_bytes, w->page_size, backend);
        return 0;
    }
    printf("pool     %" PRIu64 " bytes (%" PRIu64 " frames of %" PRIu64 " bytes, %s device)\n",
           f->pool_bytes, f->pool_bytes / w->page_size, w->page_size, backend);
    printf("free     %" PRIu64 " bytes\n", f->free_bytes);
    printf("held     %" PRIu64 " bytes\n", f->pool_bytes - f->free_bytes);
    printf("clients  %u\n", f->n_clients);
    printf("entries  %" PRIu64 " (%" PRIu64 " bytes)\n", f->shared_entries, f->shared_bytes);
    return 0;
}

static int cmd_clients(int fd)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    if (ask(fd, POOL_MSG_CLIENTS))
        return 1;
    if (json)
        printf("[");
    else
        printf("%-24s %8s %14s %14s %14s %14s\n", "NAME", "PID", "HELD", "RESERVE", "LIMIT",
               "SHARED");
    for (int k = 0;; k++) {
        int nfds;
        unsigned type;
        long n = pool_proto_recv(fd, buf, sizeof buf, NULL, 0, &nfds, 0);
        if (n <= 0 || pool_proto_check(buf, (size_t)n, nfds, &type) ||
            (type != POOL_MSG_CLIENT && type != POOL_MSG_END))
            return fail("%s: the daemon went away mid-list%s", sock_path, "");
        if (type == POOL_MSG_END)
            break;
        const struct pool_client_row *r = (const void *)buf;
        if (json) {
            printf("%s\n{\"name\":", k ? "," : "");
            tool_json_string(stdout, r->name);
            printf(",\"pid\":%u,\"held\":%" PRIu64 ",\"reserve\":%" PRIu64 ",\"limit\":%" PRIu64
                   ",\"shared\":%" PRIu64 "}", r->pid, r->held, r->reserve, r->limit,
                   r->shared);
        } else {
            printf("%-24s %8u %14" PRIu64 " %14" PRIu64 " %14" PRIu64 " %14" PRIu64 "\n",
                   r->name, r->pid, r->held, r->reserve, r->limit, r->shared);
        }
    }
    if (json)
        printf("\n]\n");
    return 0;
}

/* ---- top ---------------------------------------------------------------------------- */

struct top_opts { long interval_ms, count; };   /* count 0: until a signal or q */

struct top_snap {
    struct pool_figures f;
    struct pool_client_row *rows;
    size_t n, cap;
    uint64_t t_ns;                  /* CLOCK_MONOTONIC, when it was taken */
};

static volatile sig_atomic_t top_stop;
static void top_on_signal(int sig) { (void)sig; top_stop = 1; }

static uint64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The pool's figures and every client's row into s. 0; 1 (said). */
static int top_take(int fd, struct top_snap *s)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    if (ask(fd, POOL_MSG_INFO) || recv_one(fd, POOL_MSG_INFO_REPLY, buf))
        return 1;
    s->f = ((struct pool_info_reply *)buf)->fig;
    if (ask(fd, POOL_MSG_CLIENTS))
        return 1;
    for (s->n = 0;;) {
        int nfds;
        unsigned type;
        long n = pool_proto_recv(fd, buf, sizeof buf, NULL, 0, &nfds, 0);
        if (n <= 0 || pool_proto_check(buf, (size_t)n, nfds, &type) ||
            (type != POOL_MSG_CLIENT && type != POOL_MSG_END))
            return fail("%s: the daemon went away mid-list%s", sock_path, "");
        if (type == POOL_MSG_END)
            break;
        if (s->n == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 16;
            struct pool_client_row *r = realloc(s->rows, cap * sizeof *r);
            if (!r)
                return fail("out of memory%s%s", "", "");
            s->rows = r;
            s->cap = cap;
        }
        memcpy(&s->rows[s->n++], buf, sizeof *s->rows);
    }
    s->t_ns = mono_ns();
    return 0;
}

/* Bytes per second row r's held moved since prev (0 when r is new there). */
static double top_rate(const struct pool_client_row *r, const struct top_snap *prev,
                       uint64_t now)
{
    for (size_t i = 0; prev && i < prev->n; i++) {
        const struct pool_client_row *p = &prev->rows[i];
        if (p->pid == r->pid && !strcmp(p->name, r->name) && now > prev->t_ns)
            return ((double)r->held - (double)p->held) * 1e9 / (double)(now - prev->t_ns);
    }
    return 0;
}

/* Bytes as a terminal shows them: B, KiB, MiB, GiB (one decimal). */
static const char *human(double v, char *b, size_t len)
{
    static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int u = 0;
    double a = v < 0 ? -v : v;
    while (a >= 1024 && u < 4) {
        a /= 1024;
        v /= 1024;
        u++;
    }
    snprintf(b, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
    return b;
}

static void top_print(const struct top_snap *s, const struct top_snap *prev, bool tty)
{
    const struct pool_figures *f = &s->f;
    char a[32], b[32], c[32], d[32], e[32], g[32];
    if (tty) {
        printf("\033[H\033[2Jkvvmctl top: %s (q or Ctrl-C quits)\n\n", sock_path);
        printf("pool %s  free %s  held %s  clients %u  entries %" PRIu64 " (%s)\n\n",
               human((double)f->pool_bytes, a, sizeof a), human((double)f->free_bytes, b,
               sizeof b), human((double)(f->pool_bytes - f->free_bytes), c, sizeof c),
               f->n_clients, f->shared_entries, human((double)f->shared_bytes, d, sizeof d));
    } else {
        printf("pool %" PRIu64 " free %" PRIu64 " held %" PRIu64 " clients %u entries %" PRIu64
               " shared %" PRIu64 "\n", f->pool_bytes, f->free_bytes,
               f->pool_bytes - f->free_bytes, f->n_clients, f->shared_entries,
               f->shared_bytes);
    }
    printf("%-24s %8s %12s %12s %12s %12s %12s\n", "NAME", "PID", "HELD", "RESERVE", "LIMIT",
           "SHARED", "HELD/S");
    for (size_t i = 0; i < s->n; i++) {
        const struct pool_client_row *r = &s->rows[i];
        double rate = top_rate(r, prev, s->t_ns);
        if (tty)
            printf("%-24.24s %8u %12s %12s %12s %12s %12s\n", r->name, r->pid,
                   human((double)r->held, a, sizeof a), human((double)r->reserve, b, sizeof b),
                   human((double)r->limit, c, sizeof c), human((double)r->shared, e, sizeof e),
                   human(rate, g, sizeof g));
        else
            printf("%-24s %8u %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %12.0f\n",
                   r->name, r->pid, r->held, r->reserve, r->limit, r->shared, rate);
    }
    if (!tty)
        putchar('\n');
    fflush(stdout);
}

/* Waits interval_ms, or until q on a terminal's stdin or a signal: true to go on. */
static bool top_wait(long interval_ms, bool keys)
{
    uint64_t end = mono_ns() + (uint64_t)interval_ms * 1000000u;
    for (;;) {
        uint64_t now = mono_ns();
        if (top_stop)
            return false;
        if (now >= end)
            return true;
        struct pollfd p = { .fd = 0, .events = POLLIN };
        int r = poll(&p, keys ? 1 : 0, (int)((end - now + 999999u) / 1000000u));
        if (r > 0 && (p.revents & POLLIN)) {
            char ch;
            if (read(0, &ch, 1) == 1 && (ch == 'q' || ch == 'Q' || ch == 3))
                return false;
        } else if (r > 0) {
            keys = false;               /* stdin closed: the clock only */
        }
    }
}

static int cmd_top(int fd, const struct top_opts *o)
{
    bool tty = isatty(1), keys = tty && isatty(0);
    struct termios old, raw;
    if (keys && tcgetattr(0, &old) == 0) {
        raw = old;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 1;
        raw.c_cc[VTIME] = 0;
        keys = tcsetattr(0, TCSANOW, &raw) == 0;
    } else {
        keys = false;
    }
    struct sigaction sa = { .sa_handler = top_on_signal };  /* no SA_RESTART: poll wakes */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    struct top_snap snap[2] = { { .n = 0 }, { .n = 0 } };
    int rc = 0, cur = 0;
    for (long k = 0; !top_stop; k++) {
        if ((rc = top_take(fd, &snap[cur])))
            break;
        top_print(&snap[cur], k ? &snap[!cur] : NULL, tty);
        if ((o->count && k + 1 >= o->count) || !top_wait(o->interval_ms, keys))
            break;
        cur = !cur;
    }
    if (keys)
        tcsetattr(0, TCSANOW, &old);
    free(snap[0].rows);
    free(snap[1].rows);
    return rc;
}

/* top's options: --interval MS (10 .. 3600000), --count N (>= 1). false: a usage error. */
static bool top_parse(int argc, char **argv, int first, struct top_opts *o)
{
    *o = (struct top_opts){ .interval_ms = 1000, .count = 0 };
    for (int i = first; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        long *dst = NULL, lo = 1, hi = 1000000000;
        size_t l = 0;
        if (!strncmp(a, "--interval", l = 10) && (a[l] == '=' || !a[l])) {
            dst = &o->interval_ms;
            lo = 10;
            hi = 3600000;
        } else if (!strncmp(a, "--count", l = 7) && (a[l] == '=' || !a[l])) {
            dst = &o->count;
        } else {
            fprintf(stderr, "kvvmctl: top: unknown option '%s'\n", a);
            return false;
        }
        v = a[l] == '=' ? a + l + 1 : (i + 1 < argc ? argv[++i] : NULL);
        char *end;
        errno = 0;
        long n = v ? strtol(v, &end, 10) : 0;
        if (!v || !*v || *end || errno || n < lo || n > hi) {
            fprintf(stderr, "kvvmctl: top: bad value '%s' for %.*s (%ld .. %ld)\n",
                    v ? v : "", (int)l, a, lo, hi);
            return false;
        }
        *dst = n;
    }
    return true;
}

static bool parse_bytes(const char *s, uint64_t *out)
{
    size_t v;
    if (pool_parse_bytes(s, &v))
        return false;
    *out = v;
    return true;
}

static int cmd_limit(int fd, const char *name, uint64_t bytes)
{
    struct pool_limit m = { .bytes = bytes };
    pool_proto_hdr(&m.h, POOL_MSG_LIMIT);
    snprintf(m.name, sizeof m.name, "%s", name);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    if (pool_proto_send(fd, &m, NULL, 0, 0) || recv_one(fd, POOL_MSG_RESULT, buf))
        return fail("%s: the daemon went away%s", sock_path, "");
    const struct pool_result *r = (const void *)buf;
    if (r->err)
        return fail("limit: %s%s", r->text, "");
    printf("%s\n", r->text);
    return 0;
}

/* Drops the shared prefix entries of namespace ns (every entry when ns is NULL). */
static int cmd_drop(int fd, const char *ns)
{
    struct pool_prefix_drop m = { .scope = ns ? POOL_DROP_NS : POOL_DROP_ALL };
    pool_proto_hdr(&m.h, POOL_MSG_PREFIX_DROP);
    if (ns) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(ns, &end, 0);
        if (!*ns || *end || errno || *ns == '-') {
            fprintf(stderr, "kvvmctl: drop: '%s' is not a namespace (a number)\n", ns);
            return 2;
        }
        m.ns = v;
    }
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    if (pool_proto_send(fd, &m, NULL, 0, 0) || recv_one(fd, POOL_MSG_RESULT, buf))
        return fail("%s: the daemon went away%s", sock_path, "");
    const struct pool_result *r = (const void *)buf;
    if (r->err < 0)
        return fail("drop: %s%s", r->text, "");
    printf("%s\n", r->text);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "socket", required_argument, NULL, 's' },
        { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;
    sock_path = getenv("KVVM_POOL_SOCKET");
    while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
        if (c == 's')
            sock_path = optarg;
        else if (c == 'j')
            json = true;
        else
            return usage();
    }
    if (optind >= argc)
        return usage();
    const char *cmd = argv[optind++];
    int nargs = argc - optind;
    uint64_t bytes = 0;
    struct top_opts top = { .interval_ms = 1000 };
    if (!strcmp(cmd, "top")) {
        if (json) {
            fputs("kvvmctl: top has no --json (kvvmd --metrics serves the figures)\n", stderr);
            return usage();
        }
        if (!top_parse(argc, argv, optind, &top))
            return usage();
    } else if (!strcmp(cmd, "status") || !strcmp(cmd, "clients")) {
        if (nargs)
            return usage();
    } else if (!strcmp(cmd, "limit")) {
        if (nargs != 2 || !argv[optind][0] || strlen(argv[optind]) >= POOL_NAME_MAX)
            return usage();
        if (!parse_bytes(argv[optind + 1], &bytes)) {
            fprintf(stderr, "kvvmctl: limit: '%s' is not a size\n", argv[optind + 1]);
            return 2;
        }
    } else if (!strcmp(cmd, "drop")) {
        if (nargs > 1)
            return usage();
    } else {
        fprintf(stderr, "kvvmctl: unknown command '%s'\n", cmd);
        return usage();
    }
    if (!sock_path || !*sock_path) {
        fputs("kvvmctl: no socket: give --socket PATH or set KVVM_POOL_SOCKET\n", stderr);
        return 2;
    }
    struct pool_welcome w;
    int fd = ctl_connect(&w);
    if (fd < 0)
        return 1;
    int rc;
    if (!strcmp(cmd, "status"))
        rc = cmd_status(fd, &w);
    else if (!strcmp(cmd, "clients"))
        rc = cmd_clients(fd);
    else if (!strcmp(cmd, "limit"))
        rc = cmd_limit(fd, argv[optind], bytes);
    else if (!strcmp(cmd, "top"))
        rc = cmd_top(fd, &top);
    else
        rc = cmd_drop(fd, nargs ? argv[optind] : NULL);
    close(fd);
    return rc;
}
