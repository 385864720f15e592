/*
 * kvvmctl: the pool daemon's control tool (docs/api.md "The pool"). A thin main over
 * pool/protocol.h: it connects as a control connection (not a client: n_clients counts
 * contexts), asks, prints.
 *
 *   kvvmctl [--socket PATH] [--json] status           pool size, free, clients, entries
 *   kvvmctl [--socket PATH] [--json] clients          one line (object) per client
 *   kvvmctl [--socket PATH] limit NAME BYTES          a client's limit at run time
 *   kvvmctl [--socket PATH] drop [NS]                 drop shared prefix entries
 *
 * PATH defaults to $KVVM_POOL_SOCKET. --json figures are numbers in bytes. Exit 0 on
 * success, 1 with a message naming the cause otherwise, 2 for a usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
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
    if (!strcmp(cmd, "status") || !strcmp(cmd, "clients")) {
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
    else
        rc = fail("drop: %s keeps no shared prefix entries: this kvvmd has no shared index "
                  "yet%s", sock_path, "");
    close(fd);
    return rc;
}
