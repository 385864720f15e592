/*
 * tools/common/httpd.c: the tools' HTTP/1.1 server of GET /metrics (contract: httpd.h).
 *
 * One thread, poll() over the listening socket, a stop pipe and the connections, every
 * socket non-blocking. A connection reads its request header into a fixed buffer, then
 * writes its whole answer and closes; its deadline (accept + TOOL_HTTPD_TIMEOUT_MS) bounds
 * what a slow client can hold, and the table of TOOL_HTTPD_MAX_CONNS bounds how many.
 */
#include "httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct conn {
    int fd;                       /* -1: a free entry */
    uint64_t deadline_ms;         /* accept + TOOL_HTTPD_TIMEOUT_MS */
    size_t in;                    /* request bytes read */
    char req[TOOL_HTTPD_MAX_REQUEST];
    char *out;                    /* the answer (malloc'ed); NULL while reading */
    size_t out_len, out_off;
    int ok;                       /* the answer is a 200 */
};

struct tool_httpd {
    int lfd, stop_rd, stop_wr;
    uint16_t port;
    tool_httpd_body_fn fn;
    void *arg;
    pthread_t thread;
    uint64_t n_ok, n_refused;     /* atomic: read by tool_httpd_counts */
    struct conn conns[TOOL_HTTPD_MAX_CONNS];
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void conn_close(struct tool_httpd *h, struct conn *c, int ok)
{
    if (c->fd < 0)
        return;
    close(c->fd);
    c->fd = -1;
    free(c->out);
    c->out = NULL;
    __atomic_fetch_add(ok ? &h->n_ok : &h->n_refused, 1, __ATOMIC_RELAXED);
}

/* The answer: status line, headers, and body (len bytes; NULL none). */
static void answer(struct conn *c, const char *status, const char *ctype, const char *body,
                   size_t len, int head)
{
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: "
                     "%zu\r\nConnection: close\r\n%s\r\n", status, ctype, len,
                     !strncmp(status, "405", 3) ? "Allow: GET, HEAD\r\n" : "");
    size_t blen = head ? 0 : len;
    c->out = malloc((size_t)n + blen);
    if (!c->out) {
        c->out_len = 0;              /* nothing to say: closed at the next round */
        return;
    }
    memcpy(c->out, hdr, (size_t)n);
    if (blen)
        memcpy(c->out + n, body, blen);
    c->out_len = (size_t)n + blen;
    c->out_off = 0;
    c->ok = !strncmp(status, "200", 3);
}

static void answer_text(struct conn *c, const char *status, const char *text)
{
    answer(c, status, "text/plain; charset=utf-8", text, strlen(text), 0);
}

/* A whole request header is in c->req (NUL-terminated): its answer. */
static void respond(struct tool_httpd *h, struct conn *c)
{
    char method[16], target[256], version[16];
    if (strlen(c->req) != c->in ||               /* a NUL in the request */
        sscanf(c->req, "%15s %255s %15s", method, target, version) != 3 ||
        strncmp(version, "HTTP/1.", 7) != 0) {
        answer_text(c, "400 Bad Request", "bad request\n");
        return;
    }
    int head = !strcmp(method, "HEAD");
    if (strcmp(method, "GET") != 0 && !head) {
        answer_text(c, "405 Method Not Allowed", "GET /metrics only\n");
        return;
    }
    target[strcspn(target, "?")] = 0;
    if (strcmp(target, "/metrics") != 0) {
        answer_text(c, "404 Not Found", "not found: the figures are at /metrics\n");
        return;
    }
    size_t len = 0;
    char *body = h->fn(h->arg, &len);
    if (!body) {
        answer_text(c, "500 Internal Server Error", "the figures could not be read\n");
        return;
    }
    answer(c, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body, len, head);
    free(body);
}

static void on_readable(struct tool_httpd *h, struct conn *c)
{
    ssize_t r = recv(c->fd, c->req + c->in, sizeof c->req - 1 - c->in, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        conn_close(h, c, 0);
        return;
    }
    if (r < 0)
        return;
    c->in += (size_t)r;
    c->req[c->in] = 0;
    if (memmem(c->req, c->in, "\r\n\r\n", 4) || memmem(c->req, c->in, "\n\n", 2))
        respond(h, c);
    else if (c->in == sizeof c->req - 1)
        answer_text(c, "431 Request Header Fields Too Large", "request too large\n");
}

static void on_writable(struct tool_httpd *h, struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (w <= 0) {
            conn_close(h, c, 0);
            return;
        }
        c->out_off += (size_t)w;
    }
    shutdown(c->fd, SHUT_WR);
    conn_close(h, c, c->ok);
}

/* A new connection: a free entry, else the oldest one still reading is closed for it. */
static void on_accept(struct tool_httpd *h)
{
    int fd = accept4(h->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    struct conn *slot = NULL, *oldest = NULL;
    for (int i = 0; i < TOOL_HTTPD_MAX_CONNS && !slot; i++) {
        struct conn *c = &h->conns[i];
        if (c->fd < 0)
            slot = c;
        else if (!c->out && (!oldest || c->deadline_ms < oldest->deadline_ms))
            oldest = c;
    }
    if (!slot && oldest) {
        conn_close(h, oldest, 0);
        slot = oldest;
    }
    if (!slot) {                     /* every one is writing its answer: this one waits */
        close(fd);
        __atomic_fetch_add(&h->n_refused, 1, __ATOMIC_RELAXED);
        return;
    }
    slot->fd = fd;
    slot->in = 0;
    slot->out = NULL;
    slot->out_len = slot->out_off = 0;
    slot->deadline_ms = now_ms() + TOOL_HTTPD_TIMEOUT_MS;
}

static void *serve(void *arg)
{
    struct tool_httpd *h = arg;
    struct pollfd p[TOOL_HTTPD_MAX_CONNS + 2];
    struct conn *of[TOOL_HTTPD_MAX_CONNS + 2];
    for (;;) {
        uint64_t now = now_ms();
        int n = 0, wait = 1000;
        p[n++] = (struct pollfd){ .fd = h->stop_rd, .events = POLLIN };
        p[n++] = (struct pollfd){ .fd = h->lfd, .events = POLLIN };
        for (int i = 0; i < TOOL_HTTPD_MAX_CONNS; i++) {
            struct conn *c = &h->conns[i];
            if (c->fd >= 0 && (now >= c->deadline_ms || (c->out && !c->out_len)))
                conn_close(h, c, 0);        /* too slow, or no memory for its answer */
            if (c->fd < 0)
                continue;
            if (c->deadline_ms - now < (uint64_t)wait)
                wait = (int)(c->deadline_ms - now);
            of[n] = c;
            p[n++] = (struct pollfd){ .fd = c->fd, .events = c->out ? POLLOUT : POLLIN };
        }
        if (poll(p, (nfds_t)n, wait) < 0 && errno != EINTR)
            break;
        if (p[0].revents)
            break;                          /* tool_httpd_stop */
        for (int i = 2; i < n; i++) {
            if (!p[i].revents || of[i]->fd < 0)
                continue;
            if (of[i]->out)
                on_writable(h, of[i]);
            else
                on_readable(h, of[i]);
            if (of[i]->fd >= 0 && of[i]->out && of[i]->out_len)
                on_writable(h, of[i]);      /* answered now: most fit the socket at once */
        }
        if (p[1].revents & POLLIN)
            on_accept(h);
    }
    return NULL;
}

/* "what: the errno's text" into err; returns rc. */
static int fail(char *err, size_t errlen, int rc, const char *what)
{
    snprintf(err, errlen, "%s: %s", what, strerror(-rc));
    return rc;
}

static int listen_on(const char *addr, uint16_t port, int *fd_out, uint16_t *port_out,
                     char *err, size_t errlen)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "%s is not an IPv4 address", addr);
        return -EINVAL;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fail(err, errlen, -errno, "http server: socket");
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t sl = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 64) ||
        getsockname(fd, (struct sockaddr *)&sa, &sl)) {
        int rc = -errno;
        close(fd);
        char where[96];
        snprintf(where, sizeof where, "cannot listen on %s:%u", addr, (unsigned)port);
        return fail(err, errlen, rc, where);
    }
    *fd_out = fd;
    *port_out = ntohs(sa.sin_port);
    return 0;
}

int tool_httpd_start(const char *addr, uint16_t port, tool_httpd_body_fn fn, void *arg,
                     struct tool_httpd **out, char *err, size_t errlen)
{
    struct tool_httpd *h = calloc(1, sizeof *h);
    if (!h)
        return fail(err, errlen, -ENOMEM, "http server");
    int pfd[2] = { -1, -1 };
    int rc = listen_on(addr, port, &h->lfd, &h->port, err, errlen);
    if (rc)
        goto out_free;
    if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK)) {
        rc = fail(err, errlen, -errno, "http server: pipe");
        goto out_close;
    }
    h->stop_rd = pfd[0];
    h->stop_wr = pfd[1];
    h->fn = fn;
    h->arg = arg;
    for (int i = 0; i < TOOL_HTTPD_MAX_CONNS; i++)
        h->conns[i].fd = -1;
    sigset_t all, old;                  /* the thread is born with every signal blocked */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    rc = -pthread_create(&h->thread, NULL, serve, h);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        fail(err, errlen, rc, "http server: thread");
        goto out_pipe;
    }
    *out = h;
    return 0;
out_pipe:
    close(pfd[0]);
    close(pfd[1]);
out_close:
    close(h->lfd);
out_free:
    free(h);
    return rc;
}

uint16_t tool_httpd_port(const struct tool_httpd *h)
{
    return h->port;
}

void tool_httpd_counts(const struct tool_httpd *h, uint64_t *ok, uint64_t *refused)
{
    *ok = __atomic_load_n(&h->n_ok, __ATOMIC_RELAXED);
    *refused = __atomic_load_n(&h->n_refused, __ATOMIC_RELAXED);
}

void tool_httpd_stop(struct tool_httpd *h)
{
    if (!h)
        return;
    char b = 1;
    while (write(h->stop_wr, &b, 1) < 0 && errno == EINTR)
        ;
    pthread_join(h->thread, NULL);
    for (int i = 0; i < TOOL_HTTPD_MAX_CONNS; i++)
        if (h->conns[i].fd >= 0) {
            close(h->conns[i].fd);
            free(h->conns[i].out);
        }
    close(h->lfd);
    close(h->stop_rd);
    close(h->stop_wr);
    free(h);
}
