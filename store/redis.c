/*
 * store/redis.c: the Redis backend (contract in store.h), and the connection the Redis
 * Cluster backend (cluster.c) holds one of per master (store_rconn_*, store_int.h). With
 * cluster.c, the only library files that include hiredis.h.
 *
 * hiredis connects (redisConnectWithTimeout: the connect bounded by what is left of the
 * deadline) and parses replies (a redisReader fed by this file), except a get batch's, which
 * this file parses itself so that values land in the caller's buffers (struct gets); the
 * socket is then ours, non-blocking, and every wait is a ppoll bounded by the request's
 * deadline (a get batch's stream is first waited for awake, briefly: g_await). Commands
 * are written as RESP by hand and sent with sendmsg(MSG_NOSIGNAL) straight from the
 * caller's buffers: a SET's value goes out as [command and header]
 * [payload iovecs] ["\r\n"], with no copy of the payload (hiredis's own
 * redisAppendCommandArgv formats a copy, then copies it into its output buffer), and no
 * SIGPIPE when the server is gone. A batch is one pipeline: every command is sent, then
 * every reply read; while a send waits for room, the replies already there are read, so
 * neither side's buffers can fill up and stall both.
 *
 * Size: over 1000 lines: the connection, the pipelined requests and a get batch's own RESP
 * parser all work on the connection's private state (struct rstore, its waits); apart, they
 * would need that state in a header of their own.
 *
 * Any failure of the connection itself (a timeout, a reset, a protocol error) drops it:
 * the replies still owed on it could otherwise be matched with later requests. The next
 * request after the backoff (50 ms, doubling to 2 s; reset by a good connection) connects
 * again: AUTH, SELECT and PING in one round trip, all inside that request's deadline.
 */
#include <errno.h>
#include <fcntl.h>
#include <hiredis.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"
#include "store_int.h"

#define BACKOFF_MIN_NS (50ull * 1000000u)
#define BACKOFF_MAX_NS (2000ull * 1000000u)
#define RBUF_BYTES (256u << 10)
#define CMD_MAX (STORE_NAME_MAX + 64)   /* one command's RESP text (not the value) */

struct rstore {
    struct store_redis_url u;    /* owned copies */
    store_key_fn key;            /* an entry's key name (store_redis_key, store_cluster_key) */
    int asking;                  /* each command of the next batch goes after an ASKING (a
                                    slot being imported by this node: redis-cluster) */
    char where[96];              /* "host:port/db" for messages */
    int fd;                      /* -1: down */
    redisReader *rd;             /* with fd */
    uint64_t next_try;           /* know_ns after which a reconnection may be tried */
    uint64_t backoff;            /* ns until the try after a failed one */
    int down_logged;             /* the outage was logged */
    char cause[128];             /* hiredis's reason for the last failed connect, or "" */
    char *rbuf;                  /* [RBUF_BYTES] receive buffer */
    struct gets *g;              /* the get batch being received, or NULL (the reader's) */
    char redir[64];              /* the last MOVED / ASK reply's target, "host:port" */
};

/* ------------------------------------------------------------------ the connection */

/* Closes the connection, if any. */
static void r_shut(struct rstore *r)
{
    if (r->fd >= 0) {
        close(r->fd);
        redisReaderFree(r->rd);
        r->fd = -1;
        r->rd = NULL;
    }
}

/* The store is down: closes the connection, schedules the next try, logs the outage once. */
static void r_drop(struct rstore *r, const char *why, int err)
{
    r_shut(r);
    r->next_try = know_ns() + r->backoff;
    r->backoff = r->backoff * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : r->backoff * 2;
    if (!r->down_logged)
        klog_warn("kvvm store: redis %s is unavailable (%s: %s); requests fail fast until "
                  "it is back (reconnecting by itself)", r->where, why,
                  r->cause[0] ? r->cause : strerror(-err));
    r->cause[0] = 0;
    r->down_logged = 1;
}

/* Reads one chunk (at most RBUF_BYTES) of what the socket has into the reader: a chunk at
   a time, so that the reader's buffer holds about one reply beyond what was parsed (it moves
   the unparsed rest to the front after each reply). 0, or -ENOTCONN (closed / reset). */
static int r_fill(struct rstore *r)
{
    for (;;) {
        ssize_t got = recv(r->fd, r->rbuf, RBUF_BYTES, MSG_DONTWAIT);
        if (got > 0)
            return redisReaderFeed(r->rd, r->rbuf, (size_t)got) == REDIS_OK ? 0 : -ENOMEM;
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        return -ENOTCONN;
    }
}

static int g_step(struct rstore *r);

/* Waits until the socket is ready for ev (reading whatever arrives meanwhile). 0,
   -ETIMEDOUT at the deadline, -ENOTCONN. */
static int r_wait(struct rstore *r, short ev, uint64_t deadline)
{
    for (;;) {
        uint64_t left = store_left_ns(deadline);
        if (!left)
            return -ETIMEDOUT;
        struct pollfd p = { r->fd, (short)(ev | POLLIN), 0 };
        struct timespec ts = { (time_t)(left / 1000000000u), (long)(left % 1000000000u) };
        int n = ppoll(&p, 1, &ts, NULL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            continue;                /* the deadline check above ends it */
        if (p.revents & POLLIN) {
            int rc = r->g ? g_step(r) : r_fill(r);
            if (rc < 0)
                return rc;
        } else if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) {
            return -ENOTCONN;
        }
        if (p.revents & ev)
            return 0;
    }
}

/* Sends the iovecs (modified as they go). 0, -ETIMEDOUT, -ENOTCONN. */
static int r_send(struct rstore *r, struct iovec *iov, size_t n, uint64_t deadline)
{
    while (n) {
        struct msghdr m = { .msg_iov = iov, .msg_iovlen = n < IOV_MAX ? n : IOV_MAX };
        ssize_t w = sendmsg(r->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            int rc = errno == EINTR ? 0
                   : errno == EAGAIN || errno == EWOULDBLOCK ? r_wait(r, POLLOUT, deadline)
                   : -ENOTCONN;
            if (rc)
                return rc;
            continue;
        }
        size_t left = (size_t)w;
        for (; n && left >= iov->iov_len; iov++, n--)
            left -= iov->iov_len;
        if (n && left) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

/* The next reply. 0 (*out to freeReplyObject), -ETIMEDOUT, -ENOTCONN, -EIO (protocol). */
static int r_reply(struct rstore *r, uint64_t deadline, redisReply **out)
{
    for (;;) {
        void *rep = NULL;
        if (redisReaderGetReply(r->rd, &rep) != REDIS_OK)
            return -EIO;
        if (rep) {
            *out = rep;
            return 0;
        }
        int rc = r_wait(r, POLLIN, deadline);
        if (rc)
            return rc;
    }
}

/* The errno an error reply (its text) stands for. */
static int r_err_str(const char *s)
{
    if (!strncmp(s, "OOM", 3))
        return -ENOSPC;
    if (!strncmp(s, "NOAUTH", 6) || !strncmp(s, "WRONGPASS", 9) || !strncmp(s, "NOPERM", 6) ||
        strstr(s, "invalid password") || strstr(s, "without any password") ||
        strstr(s, "invalid username"))
        return -EACCES;
    if (!strncmp(s, "READONLY", 8))
        return -EROFS;
    if (!strncmp(s, "MOVED ", 6))
        return STORE_MOVED;
    if (!strncmp(s, "ASK ", 4))
        return STORE_ASK;
    if (!strncmp(s, "CLUSTERDOWN", 11) || !strncmp(s, "TRYAGAIN", 8))
        return -ENOTCONN;        /* a failover or a migration under way: a miss for now */
    return -EIO;
}

static int r_err(const redisReply *rep)
{
    return r_err_str(rep->str);
}

/* RESP text of one command of short arguments into out (CMD_MAX per argument is enough for
   ours); returns its length. */
static size_t r_cmd(char *out, size_t cap, int argc, const char *const *argv)
{
    size_t len = (size_t)snprintf(out, cap, "*%d\r\n", argc);
    for (int i = 0; i < argc && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "$%zu\r\n%s\r\n", strlen(argv[i]),
                                argv[i]);
    return len < cap ? len : cap;
}

/* Connects, authenticates, selects the database. 0, -EACCES (refused), -EINVAL (no such
   database), -ETIMEDOUT, -ENOTCONN, -ENOMEM; nothing kept on failure. */
static int r_connect(struct rstore *r, uint64_t deadline)
{
    uint64_t left = store_left_ns(deadline);
    if (!left)
        return -ETIMEDOUT;
    struct timeval tv = { (time_t)(left / 1000000000u), (long)(left % 1000000000u / 1000) };
    redisContext *c = redisConnectWithTimeout(r->u.host, r->u.port, tv);
    if (!c)
        return -ENOMEM;
    if (c->err) {
        int rc = c->err == REDIS_ERR_IO && (errno == EINPROGRESS || errno == ETIMEDOUT)
                 ? -ETIMEDOUT : -ENOTCONN;
        snprintf(r->cause, sizeof r->cause, "%s", c->errstr);
        redisFree(c);
        return rc;
    }
    r->fd = redisFreeKeepFd(c);
    r->rd = redisReaderCreate();
    int fl = fcntl(r->fd, F_GETFL);
    if (!r->rd || fl < 0 || fcntl(r->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        r_shut(r);
        return -ENOMEM;
    }
    char buf[3 * CMD_MAX + 1024], db[16];
    size_t len = 0;
    int n = 0;
    if (r->u.pass) {
        const char *a[] = { "AUTH", r->u.user ? r->u.user : r->u.pass, r->u.pass };
        len += r_cmd(buf + len, sizeof buf - len, r->u.user ? 3 : 2, a);
        n++;
    }
    if (r->u.db) {
        snprintf(db, sizeof db, "%d", r->u.db);
        len += r_cmd(buf + len, sizeof buf - len, 2, (const char *[]){ "SELECT", db });
        n++;
    }
    len += r_cmd(buf + len, sizeof buf - len, 1, (const char *[]){ "PING" });
    n++;
    struct iovec io = { buf, len };
    int rc = r_send(r, &io, 1, deadline);
    for (int i = 0; i < n && !rc; i++) {
        redisReply *rep;
        if ((rc = r_reply(r, deadline, &rep)))
            break;
        if (rep->type == REDIS_REPLY_ERROR) {
            rc = r_err(rep) == -EACCES ? -EACCES : -EINVAL;
            klog_error("kvvm store: redis %s refused the connection: %s", r->where, rep->str);
        }
        freeReplyObject(rep);
    }
    if (rc)
        r_shut(r);                   /* the caller decides: refused, or down */
    return rc;
}

/* A connection, or the reason there is none: -ENOTCONN within the backoff, else what a
   reconnection attempt returned. */
static int r_ready(struct rstore *r, uint64_t deadline)
{
    KVVM_ASSERT((r->fd >= 0) == (r->rd != NULL));   /* a reader with each connection */
    if (r->fd >= 0)
        return 0;
    if (know_ns() < r->next_try)
        return -ENOTCONN;
    int rc = r_connect(r, deadline);
    if (rc) {
        r_drop(r, "reconnect", rc);
        return rc == -EACCES || rc == -ETIMEDOUT ? rc : -ENOTCONN;
    }
    if (r->down_logged)
        klog_info("kvvm store: redis %s is back", r->where);
    r->down_logged = 0;
    r->backoff = BACKOFF_MIN_NS;
    return 0;
}

/* ------------------------------------------------------------------ requests */

/* What a batch does with reply i, as it arrives (the pipeline frees it after: holding a
   batch of large replies at once would make the allocator map fresh memory per batch). */
typedef void (*reply_fn)(void *arg, size_t i, const redisReply *rep);

/* Sends the commands (iov[0..niov)), then hands each of the n replies to fn, in order.
   0, or the connection's failure (it was dropped); *done = the replies handed. */
static int r_pipeline(struct rstore *r, struct iovec *iov, size_t niov, size_t n,
                      reply_fn fn, void *arg, uint64_t deadline, size_t *done)
{
    int rc = r_ready(r, deadline);
    if (!rc)
        rc = r_send(r, iov, niov, deadline);
    for (*done = 0; *done < n && !rc; ++*done) {
        redisReply *rep;
        if (r->asking) {         /* ASKING's own +OK first */
            if ((rc = r_reply(r, deadline, &rep)))
                break;
            freeReplyObject(rep);
        }
        if ((rc = r_reply(r, deadline, &rep)))
            break;
        KVVM_ASSERT(rep);
        fn(arg, *done, rep);
        freeReplyObject(rep);
    }
    if (rc && r->fd >= 0)
        r_drop(r, rc == -ETIMEDOUT ? "request timed out" : "request failed", rc);
    return rc;
}

/* One command, one reply (*out, to freeReplyObject). 0 or as r_pipeline. */
static int r_call(struct rstore *r, struct iovec *io, uint64_t deadline, redisReply **out)
{
    int rc = r_ready(r, deadline);
    if (!rc)
        rc = r_send(r, io, 1, deadline);
    if (!rc)
        rc = r_reply(r, deadline, out);
    if (rc && r->fd >= 0)
        r_drop(r, rc == -ETIMEDOUT ? "request timed out" : "request failed", rc);
    return rc;
}

static const char ASKING[] = "*1\r\n$6\r\nASKING\r\n";
#define ASKING_LEN (sizeof ASKING - 1)

/* One short command per key (GET / EXISTS / UNLINK) into a buffer of n commands (each
   after an ASKING when r->asking), one iovec: the keys of items[] or, with items NULL,
   keys[]. */
static char *keys_cmds(const struct rstore *r, const char *verb, const struct store_layout *L,
                       uint64_t ns, const struct store_item *items, const store_key *keys,
                       size_t n, struct iovec *io)
{
    char *buf = malloc(n * (CMD_MAX + ASKING_LEN)), k[STORE_NAME_MAX];
    size_t len = 0;
    if (!buf)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        r->key(L, ns, items ? items[i].key : &keys[i], k);
        if (r->asking) {
            memcpy(buf + len, ASKING, ASKING_LEN);
            len += ASKING_LEN;
        }
        len += r_cmd(buf + len, CMD_MAX, 2, (const char *[]){ verb, k });
    }
    *io = (struct iovec){ buf, len };
    return buf;
}

/* The requests' per-reply work. */
struct batch_ctx {
    struct store *st;
    struct rstore *r;
    const struct store_layout *L;
    uint64_t ns;
    struct store_item *items;    /* put, get */
    uint8_t *present;            /* lookup */
    int *kst;                    /* lookup: each key's error (0 none), or NULL */
    int found, err;              /* lookup */
};

/* The errno of an error reply's text; a redirection's target ("host:port" after MOVED /
   ASK and the slot) noted in r->redir. */
static int r_err_note(struct rstore *r, const char *s)
{
    int e = r_err_str(s);
    if (e == STORE_MOVED || e == STORE_ASK) {
        const char *t = strrchr(s, ' ');
        snprintf(r->redir, sizeof r->redir, "%s", t ? t + 1 : "");
    }
    return e;
}

static void put_reply(void *arg, size_t i, const redisReply *rep)
{
    struct batch_ctx *c = arg;
    struct store_item *it = &c->items[i];
    it->status = rep->type == REDIS_REPLY_ERROR ? r_err_note(c->r, rep->str) : 0;
    if (!it->status)
        STORE_ADD(c->st, st_bytes_out, STORE_HDR_BYTES + store_iov_len(it->iov, it->iovcnt));
}

/* A get batch's replies are parsed here, not by hiredis's reader: the reader copies what it
   is fed into its own buffer, moves the unparsed rest to the front after every reply (for a
   pipeline of large values, more bytes moved than received) and a reply object copies the
   value again. Here a value whose length is the item's goes from the socket (recvmsg) straight
   to [its header, the caller's iovecs, its "\r\n"]; what an earlier recv brought into rbuf
   (a reply's first line, with what followed it) is copied from there. The value is then
   checked where it landed. */
#define LINE_MAX_BYTES 512u      /* a reply's first line ("$<length>", "-<error>") */
#define LINE_PEEK 32u            /* the recv for the line of a large value's reply: the line
                                    and a little of the header, so that the value itself
                                    goes by recvmsg into its buffers, not through rbuf */
#define LARGE_VALUE (16u << 10)
#define SPIN_NS 50000u           /* g_await: how long a batch's stream is waited for awake */
#define SPIN_TRY_NS 1000u        /* and how often the socket is tried meanwhile */

struct gets {
    struct batch_ctx *c;
    size_t n, i;                 /* replies owed; the one being read */
    size_t pos, have;            /* rbuf[pos, have): received, not yet consumed */
    int value;                   /* item i's value is coming */
    size_t left;                 /* bytes of it (its "\r\n" included) still to come */
    size_t vlen;                 /* its length */
    struct iovec *seg;           /* where it goes: seg[si, nseg); nseg 0: dropped (-EBADMSG) */
    int nseg, si;
    uint64_t got;                /* bytes received so far (g_await sees the stream move) */
    int asleep;                  /* a wait awake saw nothing come: sleep from then on */
    uint8_t hdr[STORE_HDR_BYTES];
    char crlf[2];
};

/* len bytes of the value arrived into its segments (at src: copied there first). */
static void g_take(struct gets *g, const char *src, size_t len)
{
    KVVM_ASSERT(g->value && len <= g->left);
    g->left -= len;
    while (len && g->si < g->nseg) {
        struct iovec *s = &g->seg[g->si];
        size_t c = s->iov_len < len ? s->iov_len : len;
        if (src) {
            memcpy(s->iov_base, src, c);
            src += c;
        }
        s->iov_base = (char *)s->iov_base + c;
        s->iov_len -= c;
        len -= c;
        g->si += !s->iov_len;
    }
}

/* Item i's value is complete: checked where it landed. 0 or -EIO (not RESP). */
static int g_value_done(struct gets *g)
{
    struct batch_ctx *c = g->c;
    KVVM_ASSERT(g->value && !g->left && g->i < g->n);
    struct store_item *it = &c->items[g->i++];
    g->value = 0;
    STORE_ADD(c->st, st_bytes_in, (uint64_t)g->vlen);
    if (!g->nseg) {
        it->status = -EBADMSG;
        return 0;
    }
    KVVM_ASSERT(g->si == g->nseg);      /* left 0: every segment filled */
    if (memcmp(g->crlf, "\r\n", 2) != 0)
        return -EIO;
    it->status = store_value_check_iov(g->hdr, c->L, c->ns, it->key, it->iov, it->iovcnt);
    return 0;
}

/* The first line of reply i (len bytes, "\r\n" excluded). 0 or -EIO (not RESP, or not a
   GET's reply: the connection is then in an unknown state). */
static int g_line(struct gets *g, const char *l, size_t len)
{
    KVVM_ASSERT(!g->value && g->i < g->n); /* a reply's line, one per item */
    struct store_item *it = &g->c->items[g->i];
    char msg[128];
    if (len && l[0] == '+')
        return 0;                /* an ASKING's +OK: no GET replies with a status */
    if (len == 3 && !memcmp(l, "$-1", 3)) {
        it->status = -ENOENT;
        g->i++;
        return 0;
    }
    if (len && l[0] == '-') {
        size_t m = len - 1 < sizeof msg - 1 ? len - 1 : sizeof msg - 1;
        memcpy(msg, l + 1, m);
        msg[m] = 0;
        it->status = r_err_note(g->c->r, msg);
        g->i++;
        return 0;
    }
    if (len < 2 || len > 21 || l[0] != '$')
        return -EIO;
    size_t v = 0;
    for (size_t k = 1; k < len; k++) {
        if (l[k] < '0' || l[k] > '9')
            return -EIO;
        v = v * 10 + (size_t)(l[k] - '0');
    }
    size_t want = store_iov_len(it->iov, it->iovcnt);
    g->value = 1;
    g->vlen = v;
    g->left = v + 2;
    g->si = 0;
    g->nseg = 0;
    if (v != STORE_HDR_BYTES + want)
        return 0;                /* another length: read and dropped */
    g->seg[g->nseg++] = (struct iovec){ g->hdr, STORE_HDR_BYTES };
    for (int k = 0; k < it->iovcnt; k++)
        if (it->iov[k].iov_len)
            g->seg[g->nseg++] = it->iov[k];
    g->seg[g->nseg++] = (struct iovec){ g->crlf, 2 };
    return 0;
}

/* Receives and parses what the socket has, without waiting. 1 when every reply is in, 0
   when it needs more, -ENOTCONN, -EIO (protocol). */
static int g_step(struct rstore *r)
{
    struct gets *g = r->g;
    for (;;) {
        if (g->value && !g->left) {
            int rc = g_value_done(g);
            if (rc)
                return rc;
            continue;
        }
        if (g->value && g->pos < g->have) {
            size_t c = g->have - g->pos < g->left ? g->have - g->pos : g->left;
            g_take(g, r->rbuf + g->pos, c);
            g->pos += c;
            continue;
        }
        if (g->value && g->si < g->nseg) {   /* straight into the value's segments */
            int cnt = g->nseg - g->si;
            struct msghdr m = { .msg_iov = g->seg + g->si,
                                .msg_iovlen = (size_t)(cnt < IOV_MAX ? cnt : IOV_MAX) };
            ssize_t got = recvmsg(r->fd, &m, MSG_DONTWAIT);
            if (got > 0) {
                g->got += (size_t)got;
                g_take(g, NULL, (size_t)got);
                continue;
            }
            if (got < 0 && errno == EINTR)
                continue;
            return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -ENOTCONN;
        }
        if (!g->value) {
            if (g->i == g->n)
                return 1;
            const char *l = r->rbuf + g->pos;
            const char *nl = memchr(l, '\n', g->have - g->pos);
            if (nl) {
                if (nl == l || nl[-1] != '\r')
                    return -EIO;
                g->pos += (size_t)(nl - l) + 1;
                int rc = g_line(g, l, (size_t)(nl - l) - 1);
                if (rc)
                    return rc;
                continue;
            }
            if (g->have - g->pos > LINE_MAX_BYTES)
                return -EIO;
        }
        /* more bytes into rbuf: a line's rest (kept at the front), or a dropped value's */
        memmove(r->rbuf, r->rbuf + g->pos, g->have - g->pos);
        g->have -= g->pos;
        g->pos = 0;
        size_t room = RBUF_BYTES - g->have;
        const struct store_item *it = &g->c->items[g->i];
        if (!g->value && room > LINE_PEEK &&
            store_iov_len(it->iov, it->iovcnt) >= LARGE_VALUE)
            room = LINE_PEEK;    /* small values: as much as there is, many per recv */
        ssize_t got = recv(r->fd, r->rbuf + g->have, room, MSG_DONTWAIT);
        if (got > 0) {
            g->got += (size_t)got;
            g->have += (size_t)got;
            continue;
        }
        if (got < 0 && errno == EINTR)
            continue;
        return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -ENOTCONN;
    }
}

static void spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Waits for more of a get batch's replies (g_step found the socket empty). 0, or
   r_wait's failure. Once the replies flow (a reply read, or a value begun), this thread,
   faster per byte than the server, finds the socket empty between the server's segments
   every few values, and a sleep (ppoll) there costs a wake-up per gap, which on an idle VM
   made the batch slower than the raw hiredis loop (docs/design.md): the gap is waited out
   awake for up to SPIN_NS (the socket tried every SPIN_TRY_NS); when nothing came in that
   time (a slow or busy server), the batch's later waits sleep at once (g->asleep): a loaded
   machine loses at most about SPIN_NS of CPU per batch to it. Never past the deadline. */
static int g_await(struct rstore *r, uint64_t deadline)
{
    struct gets *g = r->g;
    if (!g->asleep && (g->i || g->value)) {
        uint64_t got = g->got, now = know_ns();
        uint64_t until = now + SPIN_NS < deadline ? now + SPIN_NS : deadline;
        while (now < until) {
            uint64_t next = now + SPIN_TRY_NS;
            while ((now = know_ns()) < next)
                spin_pause();
            int rc = g_step(r);
            if (rc < 0)
                return rc;
            if (rc || g->got != got)
                return 0;        /* the caller's g_step goes on from there */
        }
        g->asleep = 1;
    }
    return r_wait(r, POLLIN, deadline);
}

static void exists_reply(void *arg, size_t i, const redisReply *rep)
{
    struct batch_ctx *c = arg;
    int e = rep->type == REDIS_REPLY_ERROR ? r_err_note(c->r, rep->str) : 0;
    if (e && !c->err)
        c->err = e;
    if (c->kst)
        c->kst[i] = e;
    c->present[i] = rep->type == REDIS_REPLY_INTEGER && rep->integer > 0;
    c->found += c->present[i];
}

/* The items past a failure get its status (-ENOMEM before anything was sent). */
static void items_rest(struct store_item *items, size_t from, size_t n, int rc)
{
    for (size_t i = from; i < n; i++)
        items[i].status = rc ? rc : -EIO;
}

int store_rconn_put(struct store *st, struct rstore *r, const struct store_layout *L,
                    uint64_t ns, struct store_item *items, size_t n, uint64_t deadline)
{
    size_t niov = 0, done = 0, ask = r->asking ? ASKING_LEN : 0;
    if (n == 0)
        return 0;                /* store.c never asks; said for the analyzer */
    for (size_t i = 0; i < n; i++)
        niov += 2 + (size_t)items[i].iovcnt;
    struct iovec *iov = malloc(niov * sizeof *iov);
    char *cmd = malloc(n * (CMD_MAX + STORE_HDR_BYTES + ASKING_LEN));
    int rc = iov && cmd ? 0 : -ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char key[STORE_NAME_MAX], *c = cmd + i * (CMD_MAX + STORE_HDR_BYTES + ASKING_LEN);
        r->key(L, ns, items[i].key, key);
        memcpy(c, ASKING, ask);
        size_t vlen = STORE_HDR_BYTES + store_iov_len(items[i].iov, items[i].iovcnt);
        size_t len = ask + (size_t)snprintf(c + ask, CMD_MAX,
                                            "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n",
                                            strlen(key), key, vlen);
        store_hdr_make((uint8_t *)c + len, L, ns, items[i].key, items[i].iov, items[i].iovcnt);
        iov[k++] = (struct iovec){ c, len + STORE_HDR_BYTES };
        memcpy(iov + k, items[i].iov, (size_t)items[i].iovcnt * sizeof *iov);
        k += (size_t)items[i].iovcnt;
        iov[k++] = (struct iovec){ "\r\n", 2 };
    }
    struct batch_ctx c = { .st = st, .r = r, .L = L, .ns = ns, .items = items };
    if (!rc)
        rc = r_pipeline(r, iov, niov, n, put_reply, &c, deadline, &done);
    items_rest(items, done, n, rc);
    free(cmd);
    free(iov);
    return 0;
}

/* A get batch between its send (r_get_start) and its replies (r_get_finish). */
struct rget {
    struct batch_ctx c;
    struct gets g;               /* g.c = &c */
    struct iovec io;
    char *buf;                   /* the commands */
    uint64_t deadline;
    int rc;                      /* r_ready's or the send's failure, or 0 */
    int ready;                   /* r_ready succeeded: the batch was (being) sent */
};

/* Connects (if needed) and sends the batch's GETs: the server works while the caller does
   (store_get_start). NULL: no memory (the items' statuses set). */
static struct rget *r_get_start(struct store *st, struct rstore *r,
                                const struct store_layout *L, uint64_t ns,
                                struct store_item *items, size_t n, uint64_t deadline)
{
    int most = 0;
    for (size_t i = 0; i < n; i++)
        most = items[i].iovcnt > most ? items[i].iovcnt : most;
    struct rget *q = calloc(1, sizeof *q);
    if (q) {
        q->c = (struct batch_ctx){ .st = st, .r = r, .L = L, .ns = ns, .items = items };
        q->g = (struct gets){ .c = &q->c, .n = n,
                              .seg = malloc(((size_t)most + 2) * sizeof *q->g.seg) };
        q->deadline = deadline;
        q->buf = q->g.seg ? keys_cmds(r, "GET", L, ns, items, NULL, n, &q->io) : NULL;
    }
    if (!q || !q->buf) {
        items_rest(items, 0, n, -ENOMEM);
        if (q)
            free(q->g.seg);
        free(q);
        return NULL;
    }
    q->rc = r_ready(r, deadline);
    if (!q->rc) {
        q->ready = 1;
        r->g = &q->g;
        q->rc = r_send(r, &q->io, 1, deadline);
        r->g = NULL;
    }
    return q;
}

/* The replies of q's batch, read into the items' buffers until its deadline; frees q. */
static void r_get_finish(struct rstore *r, struct rget *q)
{
    int rc = q->rc;
    if (q->ready) {              /* (r_ready refused: nothing sent, nothing to drop) */
        r->g = &q->g;
        while (!rc && (rc = g_step(r)) == 0)
            rc = g_await(r, q->deadline);
        r->g = NULL;
        rc = rc == 1 ? 0 : rc;
        if (rc && r->fd >= 0)
            r_drop(r, rc == -ETIMEDOUT ? "request timed out" : "request failed", rc);
        else if (!rc && q->g.pos != q->g.have)
            r_shut(r);           /* bytes no request asked for: start again clean */
    }
    items_rest(q->c.items, q->g.i, q->g.n, rc);
    free(q->buf);
    free(q->g.seg);
    free(q);
}

/* q's first reply read (store_get_first): 1 a hit. A failure or the deadline is kept in
   q->rc for r_get_finish (which drops the connection). */
static int r_get_first(struct rstore *r, struct rget *q)
{
    int rc = q->rc;
    if (!q->ready || rc)
        return 0;
    r->g = &q->g;
    while (!rc && q->g.i < 1) {
        rc = g_step(r);
        if (!rc && q->g.i < 1)
            rc = r_wait(r, POLLIN, q->deadline);
    }
    r->g = NULL;
    if (rc < 0)
        q->rc = rc;
    return q->g.i >= 1 && !q->c.items[0].status;
}

int store_rconn_get(struct store *st, struct rstore *r, const struct store_layout *L,
                    uint64_t ns, struct store_item *items, size_t n, uint64_t deadline)
{
    struct rget *q = r_get_start(st, r, L, ns, items, n, deadline);
    if (q)
        r_get_finish(r, q);
    return 0;
}

int store_rconn_keys(struct store *st, struct rstore *r, const char *verb,
                     const struct store_layout *L, uint64_t ns, const store_key *keys,
                     size_t n, uint8_t *present, int *kst, uint64_t deadline)
{
    struct iovec io;
    struct batch_ctx c = { .st = st, .r = r, .present = present, .kst = kst };
    size_t done = 0;
    char *buf = keys_cmds(r, verb, L, ns, NULL, keys, n, &io);
    int rc = buf ? r_pipeline(r, &io, 1, n, exists_reply, &c, deadline, &done) : -ENOMEM;
    free(buf);
    return rc ? rc : c.err && !kst ? c.err : c.found;
}

/* A redirection from one server (a cluster node named by a redis:// URL): a failure. Every
   item's status mapped so; returns rc. */
static int no_redirs(struct store_item *items, size_t n, int rc)
{
    for (size_t i = 0; i < n; i++)
        if (items[i].status == STORE_MOVED || items[i].status == STORE_ASK)
            items[i].status = -EIO;
    return rc;
}

static int r_put(struct store *st, const struct store_layout *L, uint64_t ns,
                 struct store_item *items, size_t n, uint64_t deadline)
{
    return no_redirs(items, n, store_rconn_put(st, st->be, L, ns, items, n, deadline));
}

/* lend unused: the replies are read and copied into the caller's buffers by this thread,
   before it returns (kept stays 0) */
static int r_get(struct store *st, const struct store_layout *L, uint64_t ns,
                 struct store_item *items, size_t n, struct store_lend *lend,
                 uint64_t deadline)
{
    (void)lend;
    return no_redirs(items, n, store_rconn_get(st, st->be, L, ns, items, n, deadline));
}

/* store_get_start / finish: the GETs sent at the start, the replies read at the finish */
static void r_get_start_op(struct store *st, const struct store_layout *L, uint64_t ns,
                           struct store_item *items, size_t n, struct store_lend *lend,
                           uint64_t deadline, void **be)
{
    (void)lend;
    *be = r_get_start(st, st->be, L, ns, items, n, deadline);
    if (!*be)
        (void)no_redirs(items, n, 0);
}

static void r_get_finish_op(struct store *st, void *be)
{
    struct rget *q = be;
    struct store_item *items = q->c.items;
    size_t n = q->g.n;
    r_get_finish(st->be, q);
    (void)no_redirs(items, n, 0);
}

static int r_get_first_op(struct store *st, void *be)
{
    return r_get_first(st->be, be);
}

static int r_lookup(struct store *st, const struct store_layout *L, uint64_t ns,
                    const store_key *keys, size_t n, uint8_t *present, uint64_t deadline)
{
    int rc = store_rconn_keys(st, st->be, "EXISTS", L, ns, keys, n, present, NULL, deadline);
    return rc == STORE_MOVED || rc == STORE_ASK ? -EIO : rc;   /* a redirection: a failure */
}

/* UNLINK of n names (each at most STORE_NAME_MAX): the count removed, or -errno. */
static int r_unlink(struct rstore *r, const char *const *names, size_t n, uint64_t deadline)
{
    char *buf = malloc(32 + n * (STORE_NAME_MAX + 16));
    if (!buf)
        return -ENOMEM;
    size_t len = (size_t)sprintf(buf, "*%zu\r\n$6\r\nUNLINK\r\n", n + 1);
    for (size_t i = 0; i < n; i++)
        len += (size_t)sprintf(buf + len, "$%zu\r\n%s\r\n", strlen(names[i]), names[i]);
    struct iovec io = { buf, len };
    redisReply *rep = NULL;
    int rc = r_call(r, &io, deadline, &rep);
    if (!rc)
        rc = rep->type == REDIS_REPLY_INTEGER ? (int)rep->integer
           : rep->type == REDIS_REPLY_ERROR ? r_err(rep) : -EIO;
    if (rep)
        freeReplyObject(rep);
    free(buf);
    return rc;
}

/* UNLINK of each of the n names by a command of its own, pipelined (a cluster refuses a
   command whose keys are in several slots): the count removed, or -errno. */
static int r_unlink_each(struct rstore *r, const char *const *names, size_t n,
                         uint64_t deadline)
{
    char *buf = malloc(n * CMD_MAX);
    uint8_t *gone = calloc(n, 1);
    size_t len = 0, done = 0;
    int rc = buf && gone ? 0 : -ENOMEM;
    for (size_t i = 0; i < n && !rc; i++)
        len += r_cmd(buf + len, CMD_MAX, 2, (const char *[]){ "UNLINK", names[i] });
    struct iovec io = { buf, len };
    struct batch_ctx c = { .r = r, .present = gone };
    if (!rc)
        rc = r_pipeline(r, &io, 1, n, exists_reply, &c, deadline, &done);
    free(buf);
    free(gone);
    return rc ? rc : c.err ? c.err : c.found;
}

static int r_del(struct store *st, const struct store_layout *L, uint64_t ns,
                 const store_key *keys, size_t n, uint64_t deadline)
{
    char (*names)[STORE_NAME_MAX] = malloc(n * sizeof *names);
    const char **np = malloc(n * sizeof *np);
    int rc = -ENOMEM;
    if (names && np) {
        for (size_t i = 0; i < n; i++) {
            store_redis_key(L, ns, &keys[i], names[i]);
            np[i] = names[i];
        }
        rc = r_unlink(st->be, np, n, deadline);
    }
    free(np);
    free(names);
    return rc;
}

int store_rconn_del_ns(struct rstore *r, const char *pat, int each, uint64_t deadline)
{
    char cursor[32] = "0", cmd[2 * CMD_MAX];
    int removed = 0, rc;
    do {
        const char *a[] = { "SCAN", cursor, "MATCH", pat, "COUNT", "1000" };
        struct iovec io = { cmd, r_cmd(cmd, sizeof cmd, 6, a) };
        redisReply *rep = NULL;
        if ((rc = r_call(r, &io, deadline, &rep)))
            return rc;
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_STRING ||
            rep->element[1]->type != REDIS_REPLY_ARRAY) {
            rc = rep->type == REDIS_REPLY_ERROR ? r_err(rep) : -EIO;
            freeReplyObject(rep);
            return rc;
        }
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        redisReply *ks = rep->element[1];
        const char **np = malloc((ks->elements + 1) * sizeof *np);
        size_t m = 0;
        for (size_t i = 0; np && i < ks->elements; i++)
            if (ks->element[i]->type == REDIS_REPLY_STRING &&
                ks->element[i]->len < STORE_NAME_MAX)
                np[m++] = ks->element[i]->str;
        rc = !np ? -ENOMEM : !m ? 0 : each ? r_unlink_each(r, np, m, deadline)
                                           : r_unlink(r, np, m, deadline);
        free(np);
        freeReplyObject(rep);
        if (rc < 0)
            return rc;
        removed += rc;
    } while (strcmp(cursor, "0") != 0);
    return removed;
}

/* SCAN with MATCH, UNLINK of each round's keys, until the cursor comes back to 0. */
static int r_del_ns(struct store *st, const struct store_layout *L, uint64_t ns,
                    uint64_t deadline)
{
    char pat[STORE_NAME_MAX];
    if (L)
        snprintf(pat, sizeof pat, "kvvm1:{%u:%llu:%llu:%016llx}:*", L->n_regions,
                 (unsigned long long)L->bytes_per_token, (unsigned long long)L->page_size,
                 (unsigned long long)ns);
    else
        snprintf(pat, sizeof pat, "kvvm1:{*:%016llx}:*", (unsigned long long)ns);
    return store_rconn_del_ns(st->be, pat, 0, deadline);
}

int store_rconn_call(struct rstore *r, const char *const *argv, int argc, uint64_t deadline,
                     redisReply **out)
{
    char cmd[4 * CMD_MAX];
    struct iovec io = { cmd, r_cmd(cmd, sizeof cmd, argc, argv) };
    return r_call(r, &io, deadline, out);
}

void store_rconn_free(struct rstore *r)
{
    if (!r)
        return;
    r_shut(r);
    free(r->u.host);
    free(r->u.user);
    free(r->u.pass);
    free(r->rbuf);
    free(r);
}

static void r_close(struct store *st)
{
    store_rconn_free(st->be);
}

static const struct store_ops redis_ops = {
    "redis", r_put, r_get, r_lookup, r_del, r_del_ns, r_close, NULL, r_get_start_op,
    r_get_finish_op, r_get_first_op,
};

static char *dup_or_null(const char *s, int *fail)
{
    char *d = s ? strdup(s) : NULL;
    if (s && !d)
        *fail = 1;
    return d;
}

int store_rconn_new(const struct store_redis_url *u, store_key_fn key, struct rstore **out)
{
    struct rstore *r = calloc(1, sizeof *r);
    int fail = 0;
    *out = NULL;
    if (!r)
        return -ENOMEM;
    r->fd = -1;
    r->backoff = BACKOFF_MIN_NS;
    r->key = key;
    r->u = (struct store_redis_url){ dup_or_null(u->host, &fail), dup_or_null(u->user, &fail),
                                     dup_or_null(u->pass, &fail), u->port, u->db };
    r->rbuf = malloc(RBUF_BYTES);
    snprintf(r->where, sizeof r->where, "%s:%d/%d", u->host, u->port, u->db);
    if (fail || !r->rbuf) {
        store_rconn_free(r);
        return -ENOMEM;
    }
    *out = r;
    return 0;
}

int store_rconn_open(struct rstore *r, uint64_t deadline)
{
    int rc = r_connect(r, deadline);
    if (rc && rc != -EACCES && rc != -EINVAL && rc != -ENOMEM)
        r_drop(r, "at open", rc);
    return rc;
}

int store_rconn_set_asking(struct rstore *r, int on)
{
    int was = r->asking;
    r->asking = on;
    return was;
}

const char *store_rconn_redir(const struct rstore *r)
{
    return r->redir;
}

int store_redis_open(struct store *st, const struct store_redis_url *u)
{
    struct rstore *r;
    int rc = store_rconn_new(u, store_redis_key, &r);
    if (rc)
        return rc;
    st->be = r;
    st->ops = &redis_ops;
    if (st->flags & STORE_F_LANE)
        return 0;                /* the read lane: connects at its first request */
    rc = store_rconn_open(r, know_ns() + st->timeout_ns);
    if (rc == -EACCES || rc == -EINVAL || rc == -ENOMEM) {
        store_rconn_free(r);
        st->be = NULL;
        return rc;
    }
    return 0;
}
