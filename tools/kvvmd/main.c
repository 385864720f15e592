/*
 * kvvmd: the pool daemon, one per device (docs/api.md "The pool"). A thin main over
 * pool/server.h: options, signals, the ready line.
 *
 *   kvvmd --socket PATH [--backend auto|cuda|emulated] [--device N] [--budget BYTES]
 *         [--page-size BYTES] [--emu-device-bytes BYTES] [--emu-granule BYTES]
 *
 * stdout carries exactly one line, "kvvmd: ready PATH", once clients are accepted; all else
 * goes to stderr. SIGTERM or SIGINT: every allocation released, PATH removed, exit 0.
 * Exit 1 when it cannot start (the cause on stderr), 2 for a usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool/protocol.h"
#include "pool/server.h"

static struct pool_srv *srv;

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
          "             [--emu-granule BYTES]\n"
          "BYTES takes K/M/G suffixes (powers of 1024).\n", f);
}

/* BYTES with an optional K/M/G suffix; false when malformed. */
static bool parse_bytes(const char *s, size_t *out)
{
    return pool_parse_bytes(s, out) == 0;
}

static int parse(int argc, char **argv, struct pool_srv_params *p)
{
    static const struct option opts[] = {
        { "socket", required_argument, NULL, 's' },
        { "backend", required_argument, NULL, 'b' },
        { "device", required_argument, NULL, 'd' },
        { "budget", required_argument, NULL, 'B' },
        { "page-size", required_argument, NULL, 'p' },
        { "emu-device-bytes", required_argument, NULL, 'e' },
        { "emu-granule", required_argument, NULL, 'g' },
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
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvvmd: bad value '%s' for --%s\n", optarg,
                    opts[c == 's' ? 0 : c == 'b' ? 1 : c == 'd' ? 2 : c == 'B' ? 3 :
                         c == 'p' ? 4 : c == 'e' ? 5 : 6].name);
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

int main(int argc, char **argv)
{
    struct pool_srv_params p = { .backend = KVVM_BACKEND_AUTO };
    int rc = parse(argc, argv, &p);
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

    char why[512];
    rc = pool_srv_open(&p, &srv, why, sizeof why);
    if (rc) {
        fprintf(stderr, "kvvmd: cannot start: %s\n", why);
        return 1;
    }
    fprintf(stderr, "kvvmd: serving %zu bytes in frames of %zu on the %s device\n",
            pool_srv_pool_bytes(srv), pool_srv_page_size(srv), pool_srv_backend(srv));
    printf("kvvmd: ready %s\n", p.socket_path);
    fflush(stdout);
    sigprocmask(SIG_SETMASK, &old, NULL);       /* a signal pending since then stops it */
    rc = pool_srv_run(srv);
    pool_srv_close(srv);
    srv = NULL;
    if (rc)
        return 1;
    fprintf(stderr, "kvvmd: stopped\n");
    return 0;
}
