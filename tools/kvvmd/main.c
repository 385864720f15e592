/*
 * kvvmd: the pool daemon, one per device (docs/api.md "The pool"). A thin main over
 * pool/server.h: options, signals, the ready line.
 *
 *   kvvmd --socket PATH [--backend auto|cuda|emulated] [--device N] [--budget BYTES]
 *         [--page-size BYTES] [--emu-device-bytes BYTES] [--emu-granule BYTES]
 *         [--metrics ADDR:PORT] [--reserve-frames N]
 *
 * --metrics serves GET /metrics (Prometheus text) on that IPv4 address and port only (port
 * 0: a free one), from its own thread (tools/common/httpd.c) reading the server's published
 * snapshot (pool/server_figures.h), so an HTTP client never stalls the pool's clients; the
 * address it listens on goes to stderr ("kvvmd: metrics at http://ADDR:PORT/metrics").
 *
 * stdout carries exactly one line, "kvvmd: ready PATH", once clients are accepted; all else
 * goes to stderr. SIGTERM or SIGINT: every allocation released, PATH removed, exit 0.
 * Exit 1 when it cannot start (the cause on stderr), 2 for a usage error. It raises its soft
 * descriptor limit to the hard one: each live frame holds its export here for its life.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../common/httpd.h"
#include "pool/protocol.h"
#include "pool/server.h"
#include "pool/server_figures.h"

static struct pool_srv *srv;

/* --metrics ADDR:PORT, parsed */
struct metrics_opt {
    char addr[INET_ADDRSTRLEN];     /* "" : no --metrics */
    uint16_t port;
};

static void on_signal(int sig)
{
    (void)sig;
    if (srv)
        pool_srv_stop(srv);
}

static void usage(FILE *f)
{
    fputs("usage: kvvmd --socket PATH [--backend auto|cuda|emulated] [--device N]\n"
          "             [--budget BYTES] [--page-size BYTES] [--emu-device-bytes BYTES]\n"
          "             [--emu-granule BYTES] [--metrics ADDR:PORT] [--reserve-frames N]\n"
          "BYTES takes K/M/G suffixes (powers of 1024). --metrics: GET /metrics on that\n"
          "IPv4 address and port (e.g. 127.0.0.1:9464; port 0: a free one).\n"
          "--reserve-frames: free frames created ahead when idle, at least (default 64; 0:\n"
          "             none); up to the largest need of a call where the device has room.\n",
          f);
}

/* BYTES with an optional K/M/G suffix; false when malformed. */
static bool parse_bytes(const char *s, size_t *out)
{
    return pool_parse_bytes(s, out) == 0;
}

/* ADDR:PORT: a dotted IPv4 address and a decimal port (0 .. 65535); false when malformed. */
static bool parse_metrics(const char *s, struct metrics_opt *m)
{
    const char *colon = strrchr(s, ':');
    struct in_addr a;
    if (!colon || (size_t)(colon - s) >= sizeof m->addr || !colon[1])
        return false;
    memcpy(m->addr, s, (size_t)(colon - s));
    m->addr[colon - s] = 0;
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end || errno || port > 65535 || colon[1] == '-' || colon[1] == '+' ||
        inet_pton(AF_INET, m->addr, &a) != 1) {
        m->addr[0] = 0;
        return false;
    }
    m->port = (uint16_t)port;
    return true;
}

static int parse(int argc, char **argv, struct pool_srv_params *p, struct metrics_opt *mo)
{
    static const struct option opts[] = {
        { "socket", required_argument, NULL, 's' },
        { "backend", required_argument, NULL, 'b' },
        { "device", required_argument, NULL, 'd' },
        { "budget", required_argument, NULL, 'B' },
        { "page-size", required_argument, NULL, 'p' },
        { "emu-device-bytes", required_argument, NULL, 'e' },
        { "emu-granule", required_argument, NULL, 'g' },
        { "metrics", required_argument, NULL, 'm' },
        { "reserve-frames", required_argument, NULL, 'r' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 's': p->socket_path = optarg; break;
        case 'b':
            if (!strcmp(optarg, "auto")) p->backend = KVVM_BACKEND_AUTO;
            else if (!strcmp(optarg, "cuda")) p->backend = KVVM_BACKEND_CUDA;
            else if (!strcmp(optarg, "emulated")) p->backend = KVVM_BACKEND_EMULATED;
            else ok = false;
            break;
        case 'd': {
            char *end;
            long v = strtol(optarg, &end, 10);
            ok = *optarg && !*end && v >= 0 && v < 1024;
            p->device = (int)v;
            break;
        }
        case 'B': ok = parse_bytes(optarg, &p->budget); break;
        case 'p': ok = parse_bytes(optarg, &p->page_size); break;
        case 'e': ok = parse_bytes(optarg, &p->emu_device_bytes); break;
        case 'g': ok = parse_bytes(optarg, &p->emu_granule); break;
        case 'm': ok = parse_metrics(optarg, mo); break;
        case 'r': {
            char *end;
            errno = 0;
            unsigned long v = strtoul(optarg, &end, 10);
            ok = *optarg >= '0' && *optarg <= '9' && !*end && !errno && v <= 65536;
            p->reserve_frames = v;
            p->no_reserve = v == 0;
            break;
        }
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
        if (!ok) {
            const char *name = "?";
            for (const struct option *o = opts; o->name; o++)
                if (o->val == c)
                    name = o->name;
            fprintf(stderr, "kvvmd: bad value '%s' for --%s%s\n", optarg, name,
                    c == 'm' ? " (want an IPv4 ADDR:PORT, e.g. 127.0.0.1:9464)" : "");
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc || !p->socket_path) {
        fprintf(stderr, optind < argc ? "kvvmd: unexpected argument '%s'\n"
                                      : "kvvmd: --socket PATH is required%s\n",
                optind < argc ? argv[optind] : "");
        usage(stderr);
        return 2;
    }
    return 0;
}

/* The body of GET /metrics (the HTTP server's thread): the published snapshot's text. */
static char *metrics_body(void *arg, size_t *len)
{
    return pool_fig_text(arg, len);
}

int main(int argc, char **argv)
{
    struct pool_srv_params p = { .backend = KVVM_BACKEND_AUTO };
    struct metrics_opt mo = { .addr = "" };
    struct tool_httpd *http = NULL;
    int rc = parse(argc, argv, &p, &mo);
    if (rc)
        return rc;
    /* the handlers are in before the socket exists: a signal right after the ready line
       already stops the daemon cleanly */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &old);
    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* a live frame holds a descriptor here for its life (its export; on the emulated device
       two more): the soft descriptor limit raised to the hard one (the daemon polls with
       epoll, never select) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    char why[512];
    rc = pool_srv_open(&p, &srv, why, sizeof why);
    if (rc) {
        fprintf(stderr, "kvvmd: cannot start: %s\n", why);
        return 1;
    }
    if (mo.addr[0]) {
        struct pool_fig *fig = pool_srv_figures(srv);
        rc = fig ? tool_httpd_start(mo.addr, mo.port, metrics_body, fig, &http, why,
                                    sizeof why) : -ENOMEM;
        if (!fig)
            snprintf(why, sizeof why, "out of memory");
        if (rc) {
            fprintf(stderr, "kvvmd: cannot start: --metrics %s:%u: %s\n", mo.addr,
                    (unsigned)mo.port, why);
            pool_srv_close(srv);
            return 1;
        }
        fprintf(stderr, "kvvmd: metrics at http://%s:%u/metrics\n", mo.addr,
                (unsigned)tool_httpd_port(http));
    }
    fprintf(stderr, "kvvmd: serving %zu bytes in frames of %zu on the %s device\n",
            pool_srv_pool_bytes(srv), pool_srv_page_size(srv), pool_srv_backend(srv));
    printf("kvvmd: ready %s\n", p.socket_path);
    fflush(stdout);
    sigprocmask(SIG_SETMASK, &old, NULL);       /* a signal pending since then stops it */
    rc = pool_srv_run(srv);
    if (http) {
        uint64_t ok, refused;
        tool_httpd_counts(http, &ok, &refused);
        tool_httpd_stop(http);          /* before the figures it reads go */
        fprintf(stderr, "kvvmd: metrics: %llu scrape%s answered, %llu other answer%s\n",
                (unsigned long long)ok, ok == 1 ? "" : "s", (unsigned long long)refused,
                refused == 1 ? "" : "s");
    }
    pool_srv_close(srv);
    srv = NULL;
    if (rc)
        return 1;
    fprintf(stderr, "kvvmd: stopped\n");
    return 0;
}
