/*
 * pool/client.c: a context's connection to kvvmd (contract in pool/client.h).
 *
 * Frames handed to paging are remembered by handle, with their local uses
 * (pool/client_frames.c) so a release can name the frame to the daemon; frames leased and
 * not handed out yet wait in the stash as descriptors (a create from it imports one: no
 * request). The
 * frame pool thread's rounds make those creates, so the engine's grow takes frames that
 * are ready, imported and unmapped, as with local frames.
 */
#include "client_int.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"


/* ---- the connection ---------------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void evfd_write(struct pool_cli *c)
{
    uint64_t one = 1;
    if (c->evfd >= 0 && write(c->evfd, &one, sizeof one) < 0)
        (void)0;                    /* a full counter wakes it already */
}

/* The connection thread looks at the state under mu (an ask, stop, another socket). */
static void kick_locked(struct pool_cli *c)
{
    atomic_store(&c->kicked, true);
    evfd_write(c);
}

void pool_cli_req_begin(struct pool_cli *c)
{
    atomic_fetch_add(&c->req, 1);
}

/* The last request's end wakes a parked connection thread: what is left on the socket
   (a RECLAIM after the reply, the end) is its own again. With req's decrement before
   parked's load here, and parked's store before req's load there (sequentially
   consistent), either this end sees it parked or it sees no request. */
void pool_cli_req_end(struct pool_cli *c)
{
    KVVM_ASSERT(atomic_load(&c->req) > 0);
    if (atomic_fetch_sub(&c->req, 1) == 1 && atomic_load(&c->parked))
        evfd_write(c);
}

/* A RECLAIM read (by a requester or the connection thread): kept for the connection
   thread, unless a lease of this client waits (it needs frames: the daemon dropped the
   ask when the lease came). */
static void note_ask_locked(struct pool_cli *c, const struct pool_reclaim *m)
{
    if (c->waiting)
        return;
    c->ask_seq = m->seq;
    c->ask_n = c->ask_n + m->n < c->ask_n ? UINT32_MAX : c->ask_n + m->n;
    kick_locked(c);
}

/* The daemon is gone: the connection closed, what is held kept. */
void pool_cli_gone_locked(struct pool_cli *c, const char *why)
{
    if (c->fd < 0)
        return;
    klog_warn("pool: the daemon on %s is gone (%s): this context keeps the %llu frames it "
              "holds; calls needing more fail with ENOMEM", c->path, why,
              (unsigned long long)c->by_h.n);
    close(c->fd);
    c->fd = -1;
    c->ask_n = 0;                   /* the asks of the daemon that went */
    c->held_ret.n = 0;              /* its ids: nothing to give back to a successor */
    kick_locked(c);
}


/* One reply of type want into buf, at most max_fds descriptors in fds (more are closed, and
   the reply is malformed), within POOL_CLI_REPLY_MS (plus the wait a take-back may take); a
   RECLAIM before it is kept (note_ask_locked). 0; -EIO (the daemon is gone). */
static int recv_locked(struct pool_cli *c, unsigned want, void *buf, int *fds, int max_fds,
                       int *nfds);

int pool_cli_recv_locked(struct pool_cli *c, unsigned want, void *buf, int *fds,
                             int max_fds, int *nfds)
{
    pool_cli_req_begin(c);
    int rc = recv_locked(c, want, buf, fds, max_fds, nfds);
    pool_cli_req_end(c);
    return rc;
}

int pool_cli_ask_locked(struct pool_cli *c, const void *m, unsigned want, void *buf, int *fds,
                        int max_fds, int *nfds)
{
    pool_cli_req_begin(c);          /* from the send: its reply may come before the read */
    int rc = -EIO;
    if (pool_proto_send(c->fd, m, NULL, 0, 0))
        pool_cli_gone_locked(c, "its socket refused a request");
    else
        rc = pool_cli_recv_locked(c, want, buf, fds, max_fds, nfds);
    pool_cli_req_end(c);
    return rc;
}

static int recv_locked(struct pool_cli *c, unsigned want, void *buf, int *fds, int max_fds,
                       int *nfds)
{
    uint64_t end = now_ns() + (uint64_t)(POOL_CLI_REPLY_MS +
                                         (c->waiting || c->imp_waiting ? c->wait_ms : 0)) *
                                  1000000u;
    for (;;) {
        uint64_t now = now_ns();
        struct pollfd p = { .fd = c->fd, .events = POLLIN };
        int pr = now < end ? poll(&p, 1, (int)((end - now) / 1000000u) + 1) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        long n = pr > 0 ? pool_proto_recv(c->fd, buf, POOL_MSG_MAX, fds, max_fds, nfds,
                                          MSG_DONTWAIT) : -ETIMEDOUT;
        unsigned type = 0;
        if (pr <= 0)
            *nfds = 0;
        if (n > 0 && pool_proto_check(buf, (size_t)n, *nfds, &type))
            type = 0;                           /* malformed */
        if (type == POOL_MSG_RECLAIM) {
            note_ask_locked(c, buf);
            continue;
        }
        if (n == -EAGAIN)
            continue;
        if (n <= 0 || type != want) {
            for (int i = 0; i < *nfds; i++)
                close(fds[i]);
            *nfds = 0;
            pool_cli_gone_locked(c, n == 0 ? "it closed the connection"
                           : n < 0 && n != -EMSGSIZE ? "no reply" : "a malformed reply");
            return -EIO;
        }
        return 0;
    }
}

/* Connects to c->path and greets the daemon: the socket, or -errno with the cause in why
   (-ECONNREFUSED no daemon answers, -EPROTO not kvvmd or another version, the daemon's own
   refusal: -EINVAL page size, -ENOSPC reserve). */
static int greet(struct pool_cli *c, struct pool_welcome *w, char *why, size_t wl)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", c->path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), rc;
    if (fd < 0) {
        rc = errno ? -errno : -EIO;
        snprintf(why, wl, "socket: %s", strerror(-rc));
        return rc;
    }
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        snprintf(why, wl, "no kvvmd answers on pool_socket '%s' (%s): start the daemon "
                 "(kvvmd --socket %s) or leave pool_socket unset", c->path, strerror(errno),
                 c->path);
        rc = -ECONNREFUSED;
        goto out_close;
    }
    struct timeval tv = { POOL_CLI_REPLY_MS / 1000, 0 };
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct pool_hello h = { .version = POOL_PROTO_VERSION, .role = POOL_ROLE_CLIENT,
                            .reserve = c->p_reserve, .limit = c->p_limit,
                            .page_size = c->p_page };
    pool_proto_hdr(&h.h, POOL_MSG_HELLO);
    snprintf(h.name, sizeof h.name, "%s", c->name);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int nfds = 0;
    unsigned type = 0;
    long n = pool_proto_send(fd, &h, NULL, 0, 0) ? -1
             : pool_proto_recv(fd, buf, sizeof buf, NULL, 0, &nfds, 0);
    if (n <= 0 || pool_proto_check(buf, (size_t)n, nfds, &type) ||
        (type != POOL_MSG_WELCOME && type != POOL_MSG_REFUSED)) {
        snprintf(why, wl, "the process on pool_socket '%s' did not answer as kvvmd", c->path);
        rc = -EPROTO;
        goto out_close;
    }
    if (type == POOL_MSG_REFUSED) {
        const struct pool_refused *r = (const void *)buf;
        snprintf(why, wl, "kvvmd on '%s' refused this client: %.191s", c->path, r->why);
        rc = r->err < 0 && r->err > -4096 ? r->err : -EPROTO;
        goto out_close;
    }
    memcpy(w, buf, sizeof *w);
    if (w->version != POOL_PROTO_VERSION) {
        snprintf(why, wl, "kvvmd on '%s' speaks protocol version %u, this library version %u",
                 c->path, w->version, POOL_PROTO_VERSION);
        rc = -EPROTO;
        goto out_close;
    }
    return fd;
out_close:
    close(fd);
    return rc;
}

int pool_cli_open(const struct pool_cli_params *p, struct pool_cli **out,
                  struct pool_welcome *w)
{
    struct sockaddr_un a;
    if (strlen(p->path) >= sizeof a.sun_path)
        return kerr(-EINVAL, "kvvm_open: pool_socket '%s' is too long for a Unix socket path "
                    "(%zu bytes at most)", p->path, sizeof a.sun_path - 1);
    struct pool_cli *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    snprintf(c->path, sizeof c->path, "%s", p->path);
    snprintf(c->name, sizeof c->name, "%s", p->name);
    c->p_reserve = p->reserve;
    c->p_limit = p->limit;
    c->wait_ms = p->wait_ms;
    c->evfd = -1;
    c->p_page = p->page_size;
    char why[512];
    int fd = greet(c, w, why, sizeof why);
    if (fd < 0) {
        free(c);
        return kerr(fd, "kvvm_open: %s", why);
    }
    c->fd = fd;
    c->page = (size_t)w->page_size;
    c->welcome = *w;
    c->fig.pool_bytes = w->pool_bytes;
    c->fig.limit_bytes = w->limit ? w->limit : w->pool_bytes;
    c->fig.reserve_bytes = p->reserve;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->rd_cv, NULL);
    *out = c;
    return 0;
}

/* The daemon is gone: asks whether a new one answers on the socket, of the same shape (page
   size, backend, granule). Frames held from the old one stay this context's, never
   returned to the new one (it did not lease them: POOL_CLI_FOREIGN). 0 reconnected. */
int pool_cli_reconnect_locked(struct pool_cli *c)
{
    struct pool_welcome w = { 0 };
    char why[512];
    int fd = greet(c, &w, why, sizeof why);
    if (fd < 0)
        return fd;
    if (w.page_size != c->welcome.page_size || w.backend != c->welcome.backend ||
        w.granule != c->welcome.granule) {
        klog_warn("pool: a kvvmd answers on %s again, but of another shape (page size %llu, "
                  "was %llu): not reconnecting", c->path, (unsigned long long)w.page_size,
                  (unsigned long long)c->welcome.page_size);
        close(fd);
        return -EPROTO;
    }
    pool_cli_handles_foreign(c);
    for (unsigned i = 0; i < c->n_stash; i++)
        c->stash[i].id = POOL_CLI_FOREIGN;
    c->fd = fd;
    c->fig.pool_bytes = w.pool_bytes;
    c->reconnects++;
    kick_locked(c);                 /* the connection thread polls the new socket */
    klog_info("pool: reconnected to the kvvmd on %s (the %zu frames held from the previous "
              "daemon stay this context's)", c->path, c->by_h.n);
    return 0;
}

void pool_cli_attach(struct pool_cli *c, struct vmm *v)
{
    c->v = v;
}

/* Frames one lease asks for: a call's need (so a take-back round asks for its shortfall,
   not a batch of it: issue 34's give-back), at least a batch, at most a message's worth. */
static uint32_t lease_size(uint32_t need)
{
    return need < POOL_CLI_BATCH ? POOL_CLI_BATCH : need > POOL_BATCH_MAX ? POOL_BATCH_MAX
                                                                            : need;
}

/* Leases frames into the (empty) stash: lease_size(need). 0 (some came); -ENOMEM none (the
   figures say why); -EIO gone. */
static int lease_once_locked(struct pool_cli *c, uint32_t need)
{
    bool caller = need > 0;
    if (c->fd < 0 && pool_cli_reconnect_locked(c))
        return -EIO;
    KVVM_ASSERT(c->n_stash == 0);
    uint64_t t0 = now_ns();
    /* a call's lease may wait for a take-back; the frame pool thread's takes what is free */
    struct pool_lease m = { .n = lease_size(need), .wait_ms = caller ? c->wait_ms : 0,
                            .need = caller ? need : 0 };
    pool_proto_hdr(&m.h, POOL_MSG_LEASE);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[POOL_BATCH_MAX], nfds = 0;
    pool_cli_req_begin(c);          /* from the send: its reply may come before the read */
    if (pool_proto_send(c->fd, &m, NULL, 0, 0)) {
        pool_cli_req_end(c);
        pool_cli_gone_locked(c, "its socket refused a request");
        return -EIO;
    }
    c->waiting = m.wait_ms > 0;
    if (c->waiting)
        c->ask_n = 0;               /* it needs frames: the daemon dropped its ask */
    int rc = pool_cli_recv_locked(c, POOL_MSG_FRAMES, buf, fds, N_FDS(fds), &nfds);
    pool_cli_req_end(c);
    c->waiting = false;
    if (caller) {
        uint64_t waited = now_ns() - t0;
        c->k.waits++;
        c->k.wait_ns += waited;
        khist_add(&c->wait_hist, waited);
    }
    if (rc)
        return rc;
    const struct pool_frames *r = (const void *)buf;
    if (r->held) {                  /* a grant is fresh frames: none can be held already */
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        pool_cli_gone_locked(c, "a malformed reply (a lease's frame sent held)");
        return -EIO;
    }
    c->fig = r->fig;
    c->last_err = r->n ? 0 : r->err;
    for (uint32_t i = 0; i < r->n; i++) {
        KVVM_ASSERT(c->n_stash < POOL_BATCH_MAX);
        c->stash[c->n_stash].fd = fds[i];
        c->stash[c->n_stash++].id = r->ids[i];
        c->k.leases++;
    }
    return c->n_stash ? 0 : -ENOMEM;
}

/* A lease; when it finds the daemon gone (its socket dead since the last request), once
   more on a new daemon if one answers there now. */
static int lease_locked(struct pool_cli *c, uint32_t need)
{
    int rc = lease_once_locked(c, need);
    if (rc == -EIO && c->fd < 0 && !pool_cli_reconnect_locked(c))
        rc = lease_once_locked(c, need);
    return rc;
}

/* Sends the ids a give holds (one RETURN). */
static void held_flush_locked(struct pool_cli *c)
{
    if (!c->held_ret.n || c->fd < 0)
        return;
    pool_proto_hdr(&c->held_ret.h, POOL_MSG_RETURN);
    if (pool_proto_send(c->fd, &c->held_ret, NULL, 0, 0))
        pool_cli_gone_locked(c, "its socket refused a return");
    else
        c->k.return_msgs++;
    c->held_ret.n = 0;
}

void pool_cli_hold_returns(struct pool_cli *c, bool on)
{
    pthread_mutex_lock(&c->mu);
    held_flush_locked(c);
    c->hold_returns = on;
    pthread_mutex_unlock(&c->mu);
}

void pool_cli_returns_flush(struct pool_cli *c)
{
    pthread_mutex_lock(&c->mu);
    held_flush_locked(c);
    pthread_mutex_unlock(&c->mu);
}

/* Gives frame id back: at once, or with the next RETURN of a give that holds them
   (pool_cli_hold_returns). The ids held are distinct live frames of this client: the
   daemon counts them this client's until they are sent, so none can be leased again
   and released a second time before. */
void pool_cli_give_back_locked(struct pool_cli *c, uint64_t id)
{
    if (c->fd < 0 || id == POOL_CLI_FOREIGN)
        return;
    if (c->hold_returns) {
        KVVM_ASSERT(c->held_ret.n < POOL_BATCH_MAX);
        c->held_ret.ids[c->held_ret.n++] = id & ~POOL_CLI_MAPPED;
        if (!(id & POOL_CLI_MAPPED))
            c->k.returns++;
        if (c->held_ret.n == POOL_BATCH_MAX)
            held_flush_locked(c);
        return;
    }
    struct pool_return m = { .n = 1, .ids = { id & ~POOL_CLI_MAPPED } };
    pool_proto_hdr(&m.h, POOL_MSG_RETURN);
    if (pool_proto_send(c->fd, &m, NULL, 0, 0)) {
        pool_cli_gone_locked(c, "its socket refused a return");
        return;
    }
    c->k.return_msgs++;
    if (!(id & POOL_CLI_MAPPED))
        c->k.returns++;
}

int pool_cli_create(void *arg, vmm_handle *out, uint32_t need)
{
    struct pool_cli *c = arg;
    bool caller = need > 0;
    pthread_mutex_lock(&c->mu);
    int rc = c->n_stash ? 0 : lease_locked(c, need);
    if (!rc) {
        unsigned k = --c->n_stash;
        vmm_handle h;
        rc = vmm_handle_import(c->v, c->stash[k].fd, c->page, &h);  /* takes the fd over */
        if (!rc && (rc = pool_cli_handle_add(c, h, c->stash[k].id)))
            (void)vmm_phys_release(c->v, h);
        if (rc)
            pool_cli_give_back_locked(c, c->stash[k].id);     /* unusable here: the daemon's again */
        else
            *out = h;
    } else if (rc == -EIO) {
        rc = -ENOMEM;
        if (caller)
            klast_set("the pool daemon on %s is gone: no new frames (this context keeps "
                      "the %zu it holds)", c->path, c->by_h.n);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int pool_cli_release(void *arg, vmm_handle h)
{
    struct pool_cli *c = arg;
    pthread_mutex_lock(&c->mu);
    int rc = pool_cli_handle_put(c, h);     /* its last use: released, given back */
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int pool_cli_info(struct pool_cli *c, struct pool_figures *f, int *connected)
{
    pthread_mutex_lock(&c->mu);
    if (c->fd >= 0 || !pool_cli_reconnect_locked(c)) {
        struct pool_info m;
        pool_proto_hdr(&m.h, POOL_MSG_INFO);
        _Alignas(8) unsigned char buf[POOL_MSG_MAX];
        int fds[1], nfds = 0;
        if (!pool_cli_ask_locked(c, &m, POOL_MSG_INFO_REPLY, buf, fds, N_FDS(fds), &nfds))
            c->fig = ((struct pool_info_reply *)buf)->fig;
    }
    *f = c->fig;
    *connected = c->fd >= 0;
    if (c->fd < 0)
        f->held_bytes = (uint64_t)(c->by_h.n - c->n_mapped) * c->page;  /* the stash left
                                                                          with the daemon */
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void pool_cli_last(struct pool_cli *c, struct pool_figures *f, int *connected, int *err)
{
    pthread_mutex_lock(&c->mu);
    *f = c->fig;
    *connected = c->fd >= 0;
    if (err)
        *err = c->last_err;
    pthread_mutex_unlock(&c->mu);
}

void pool_cli_counters(struct pool_cli *c, struct pool_cli_counters *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->k;
    pthread_mutex_unlock(&c->mu);
}

void pool_cli_wait_hist(struct pool_cli *c, struct khist *out)
{
    if (c)
        khist_read(&c->wait_hist, out);
    else
        memset(out, 0, sizeof *out);
}

/* Closes the stash's descriptors and returns their frames (one message). */
static unsigned stash_return_locked(struct pool_cli *c)
{
    struct pool_return m = { 0 };
    pool_proto_hdr(&m.h, POOL_MSG_RETURN);
    while (c->n_stash) {
        c->n_stash--;
        close(c->stash[c->n_stash].fd);
        if (c->stash[c->n_stash].id != POOL_CLI_FOREIGN)
            m.ids[m.n++] = c->stash[c->n_stash].id;
    }
    if (m.n && c->fd >= 0) {
        if (pool_proto_send(c->fd, &m, NULL, 0, 0)) {
            pool_cli_gone_locked(c, "its socket refused a return");
        } else {
            c->k.returns += m.n;
            c->k.return_msgs++;
        }
    }
    return m.n;
}

int pool_cli_set_limit(struct pool_cli *c, uint64_t bytes)
{
    pthread_mutex_lock(&c->mu);
    c->p_limit = bytes;
    if (c->fd >= 0) {
        struct pool_set_limit m = { .bytes = bytes };
        pool_proto_hdr(&m.h, POOL_MSG_SET_LIMIT);
        _Alignas(8) unsigned char buf[POOL_MSG_MAX];
        int fds[1], nfds = 0;
        if (!pool_cli_ask_locked(c, &m, POOL_MSG_RESULT, buf, fds, N_FDS(fds), &nfds))
            c->fig.limit_bytes = bytes ? bytes : c->fig.pool_bytes;
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

unsigned pool_cli_trim(struct pool_cli *c)
{
    pthread_mutex_lock(&c->mu);
    unsigned n = stash_return_locked(c);
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* ---- the connection thread: the daemon's asks --------------------------------------------
   It polls the socket (and evfd) while no request is in flight (listen_wait: a message
   that comes during one is the requester's, which holds mu and reads it; the thread waits
   for the request's end rather than for mu); a message read then can only be unasked, so
   it is a RECLAIM, or the socket's end (the daemon gone: seen here before the next request
   needs it). An ask is served by give() without mu (it takes the context lock, then mu through
   the releases' RETURNs), then answered with RECLAIMED. */

/* Reads what the socket holds now (mu held): asks kept, the end noted. */
static void drain_locked(struct pool_cli *c)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[POOL_BATCH_MAX], nfds = 0;
    while (c->fd >= 0) {
        long n = pool_proto_recv(c->fd, buf, sizeof buf, fds, POOL_BATCH_MAX, &nfds,
                                 MSG_DONTWAIT);
        if (n == -EAGAIN)
            return;
        unsigned type = 0;
        if (n > 0 && !pool_proto_check(buf, (size_t)n, nfds, &type) &&
            type == POOL_MSG_RECLAIM) {
            note_ask_locked(c, (const void *)buf);
            continue;
        }
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        pool_cli_gone_locked(c, n == 0 ? "it closed the connection" : "a message out of turn");
    }
}

static void answer_locked(struct pool_cli *c, uint32_t seq, uint32_t given)
{
    if (c->fd < 0)
        return;
    struct pool_reclaimed m = { .seq = seq, .given = given };
    pool_proto_hdr(&m.h, POOL_MSG_RECLAIMED);
    if (pool_proto_send(c->fd, &m, NULL, 0, 0))
        pool_cli_gone_locked(c, "its socket refused an answer");
}

static void evfd_read(int fd)
{
    uint64_t v;
    if (read(fd, &v, sizeof v) < 0)
        (void)0;                    /* another wake-up read it */
}

/* Waits without mu until there is something to look at under mu: a kick (kick_locked), or
   a message no requester reads (unasked: a RECLAIM, or the socket's end). A message that
   arrives while a request reads the socket is the requester's: the thread then waits for
   the requests' end (pool_cli_req_end) on evfd alone. poll's result. */
static int listen_wait(struct pool_cli *c, struct pollfd *p)
{
    for (;;) {
        int pr = poll(p, p[1].fd >= 0 ? 2 : 1, -1);
        if (pr > 0 && (p[0].revents & POLLIN))
            evfd_read(p[0].fd);
        if (pr <= 0 || atomic_exchange(&c->kicked, false))
            return pr;
        if (p[1].fd < 0 || !p[1].revents)
            continue;               /* a request's end: the socket is polled again */
        atomic_store(&c->parked, true);
        bool req = atomic_load(&c->req) > 0;
        if (req) {
            struct pollfd e = { .fd = p[0].fd, .events = POLLIN };
            if (poll(&e, 1, -1) > 0 && (e.revents & POLLIN))
                evfd_read(e.fd);
        }
        atomic_store(&c->parked, false);
        if (!req || atomic_exchange(&c->kicked, false))
            return pr;
    }
}

static void *listen_main(void *arg)
{
    struct pool_cli *c = arg;
    if (vmm_make_current(c->v))     /* the reclaim's copies are this context's */
        klog_warn("pool: the connection thread could not make the device context current");
    if (vmm_thread_capture_relaxed(c->v))
        klog_warn("pool: the connection thread could not set relaxed stream capture mode");
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        if (c->ask_n) {
            uint32_t n = c->ask_n, seq = c->ask_seq;
            c->ask_n = 0;
            pthread_mutex_unlock(&c->mu);
            uint32_t given = c->give(c->give_arg, n);
            pthread_mutex_lock(&c->mu);
            c->k.takebacks++;
            c->k.taken_back += given;
            answer_locked(c, seq, given);
            continue;
        }
        struct pollfd p[2] = { { .fd = c->evfd, .events = POLLIN },
                               { .fd = c->fd, .events = POLLIN } };
        pthread_mutex_unlock(&c->mu);
        int pr = listen_wait(c, p);
        pthread_mutex_lock(&c->mu);
        c->k.listen_looks++;
        if (pr > 0 && p[1].fd >= 0 && p[1].fd == c->fd && p[1].revents)
            drain_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int pool_cli_listen(struct pool_cli *c, uint32_t (*give)(void *arg, uint32_t n), void *arg)
{
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0)
        return -errno;
    pthread_mutex_lock(&c->mu);         /* the frame pool thread may be leasing already */
    c->give = give;
    c->give_arg = arg;
    c->evfd = fd;
    pthread_mutex_unlock(&c->mu);
    int rc = -pthread_create(&c->thr, NULL, listen_main, c);
    if (rc) {
        pthread_mutex_lock(&c->mu);
        c->evfd = -1;
        pthread_mutex_unlock(&c->mu);
        close(fd);
        return rc;
    }
    c->thr_on = true;
    return 0;
}

void pool_cli_unlisten(struct pool_cli *c)
{
    if (!c || !c->thr_on)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    kick_locked(c);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thr, NULL);
    c->thr_on = false;
    pthread_mutex_lock(&c->mu);
    int fd = c->evfd;
    c->evfd = -1;
    pthread_mutex_unlock(&c->mu);
    close(fd);
}

void pool_cli_close(struct pool_cli *c)
{
    if (!c)
        return;
    pool_cli_unlisten(c);
    pool_cli_ready_stop(c);                 /* every READY queued sent first */
    pthread_mutex_lock(&c->mu);
    (void)stash_return_locked(c);
    if (c->by_h.n)
        klog_error("pool: %zu frames still held at close (released with the connection)",
                   c->by_h.n);
    for (size_t i = 0; i < c->by_h.cap; i++)
        if (c->by_h.key[i])
            (void)vmm_phys_release(c->v, (vmm_handle){ c->by_h.key[i] });
    if (c->fd >= 0)
        close(c->fd);                       /* the daemon takes back anything else */
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->rd_cv);
    pool_cli_tab_free(&c->by_h);
    pool_cli_tab_free(&c->by_id);
    free(c);
}

/* ---- hand-offs --------------------------------------------------------------------------- */

int pool_cli_export(struct pool_cli *c, const vmm_handle *hs, uint32_t n,
                    const struct pool_layout *lay, uint64_t length, uint64_t serial,
                    uint8_t *token, char *why, size_t wl)
{
    if (!n || n > POOL_HANDOFF_MAX) {
        snprintf(why, wl, "%u frames (1 .. %u in one hand-off)", n, POOL_HANDOFF_MAX);
        return -EINVAL;
    }
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    struct pool_export m = { .total = n, .length = length, .serial = serial, .lay = *lay };
    pool_proto_hdr(&m.h, POOL_MSG_EXPORT);
    /* every id first: a frame from a daemon that is gone cannot be handed off */
    for (uint32_t i = 0; i < n && !rc; i++) {
        uint64_t id = pool_cli_map_get(c, hs[i].h);
        if (!id || id == POOL_CLI_FOREIGN)
            rc = -ENOENT;
    }
    if (rc)
        snprintf(why, wl, "a page's frame was not leased from this daemon (held from a "
                 "daemon that went, or a local frame)");
    if (!rc && c->fd < 0) {
        snprintf(why, wl, "the pool daemon on %s is gone", c->path);
        rc = -EIO;
    }
    for (uint32_t off = 0; !rc && off < n; off += POOL_BATCH_MAX) {
        m.off = off;
        m.n = n - off < POOL_BATCH_MAX ? n - off : POOL_BATCH_MAX;
        for (uint32_t i = 0; i < m.n; i++)
            m.ids[i] = pool_cli_map_get(c, hs[off + i].h) & ~POOL_CLI_MAPPED;
        if (pool_proto_send(c->fd, &m, NULL, 0, 0)) {
            pool_cli_gone_locked(c, "its socket refused a request");
            snprintf(why, wl, "the pool daemon on %s is gone", c->path);
            rc = -EIO;
        }
    }
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[POOL_BATCH_MAX], nfds = 0;
    if (!rc && pool_cli_recv_locked(c, POOL_MSG_EXPORTED, buf, fds, N_FDS(fds), &nfds)) {
        snprintf(why, wl, "the pool daemon on %s is gone", c->path);
        rc = -EIO;
    } else if (!rc) {
        const struct pool_exported *r = (const void *)buf;
        rc = r->err < 0 && r->err > -4096 ? r->err : r->err ? -EPROTO : 0;
        if (rc)
            snprintf(why, wl, "the pool daemon refused the export: %s", r->text);
        else
            memcpy(token, r->token, POOL_TOKEN_BYTES);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Tells the daemon whether the import of token took (ok: spent) or not (importable again;
   its frames were given up first). */
static void import_end_locked(struct pool_cli *c, const uint8_t *token, bool ok)
{
    struct pool_import_end e = { .ok = ok };
    pool_proto_hdr(&e.h, POOL_MSG_IMPORT_END);
    memcpy(e.token, token, POOL_TOKEN_BYTES);
    if (c->fd >= 0 && pool_proto_send(c->fd, &e, NULL, 0, 0))
        pool_cli_gone_locked(c, "its socket refused a request");
}

int pool_cli_import(struct pool_cli *c, const uint8_t *token, const struct pool_layout *lay,
                    vmm_handle **out, uint32_t *n_out, uint64_t *length, char *why, size_t wl)
{
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (c->fd < 0 && pool_cli_reconnect_locked(c)) {
        snprintf(why, wl, "the pool daemon on %s is gone", c->path);
        pthread_mutex_unlock(&c->mu);
        return -EIO;
    }
    /* a pending export: the daemon answers once it is READY, within wait_ms; not while
       this client's own READYs are queued (they need this mutex: its own export would wait
       for nothing but the deadline) */
    struct pool_import m = { .lay = *lay,
                             .wait_ms = c->rd_done < c->rd_queued ? 0 : c->wait_ms };
    pool_proto_hdr(&m.h, POOL_MSG_IMPORT);
    memcpy(m.token, token, POOL_TOKEN_BYTES);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[POOL_BATCH_MAX], nfds = 0;
    if (pool_proto_send(c->fd, &m, NULL, 0, 0)) {
        pool_cli_gone_locked(c, "its socket refused a request");
        rc = -EIO;
    } else {
        c->imp_waiting = m.wait_ms > 0;
        if (pool_cli_recv_locked(c, POOL_MSG_IMPORTED, buf, fds, N_FDS(fds), &nfds))
            rc = -EIO;
        c->imp_waiting = false;
    }
    if (rc) {
        snprintf(why, wl, "the pool daemon on %s is gone", c->path);
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    const struct pool_imported *r = (const void *)buf;
    if (r->err) {
        rc = r->err < 0 && r->err > -4096 ? r->err : -EPROTO;
        snprintf(why, wl, "%s", r->text);
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    uint32_t n = r->total;
    *length = r->length;
    vmm_handle *hs = calloc(n, sizeof *hs);
    uint64_t *ids = calloc(n, sizeof *ids);
    if (!hs || !ids) {          /* the frames come anyway: the connection ends (they go) */
        pool_cli_gone_locked(c, "out of memory for an import");
        rc = -ENOMEM;
    } else {
        rc = pool_cli_frames_locked(c, hs, ids, n);
    }
    if (rc && hs && ids) {
        pool_cli_frames_undo_locked(c, hs, ids, n);     /* a local use each, or its count */
        import_end_locked(c, token, false);
    }
    free(ids);
    if (rc) {
        snprintf(why, wl, "the export's %u frames could not be mapped here (%s)", n,
                 strerror(-rc));
        free(hs);
        pthread_mutex_unlock(&c->mu);
        return rc == -EIO ? -EIO : -ENOMEM;
    }
    *out = hs;
    *n_out = n;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void pool_cli_import_end(struct pool_cli *c, const uint8_t *token, vmm_handle *hs, uint32_t n,
                         bool ok)
{
    pthread_mutex_lock(&c->mu);
    if (!ok)
        pool_cli_frames_undo_locked(c, hs, NULL, n);    /* a local use of each */
    import_end_locked(c, token, ok);
    pthread_mutex_unlock(&c->mu);
}

int pool_cli_handoff_drop(struct pool_cli *c, const uint8_t *token, char *why, size_t wl)
{
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (c->fd < 0 && pool_cli_reconnect_locked(c))
        rc = -EIO;
    struct pool_handoff_drop m;
    pool_proto_hdr(&m.h, POOL_MSG_HANDOFF_DROP);
    memcpy(m.token, token, POOL_TOKEN_BYTES);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[POOL_BATCH_MAX], nfds = 0;
    if (!rc && pool_proto_send(c->fd, &m, NULL, 0, 0)) {
        pool_cli_gone_locked(c, "its socket refused a request");
        rc = -EIO;
    }
    if (!rc && pool_cli_recv_locked(c, POOL_MSG_RESULT, buf, fds, N_FDS(fds), &nfds))
        rc = -EIO;
    if (rc) {
        snprintf(why, wl, "the pool daemon on %s is gone", c->path);
    } else {
        const struct pool_result *r = (const void *)buf;
        rc = r->err < 0 && r->err > -4096 ? r->err : r->err ? -EPROTO : 0;
        snprintf(why, wl, "%s", r->text);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}
