/*
 * pool/server.c: the pool daemon's server (contract in pool/server.h).
 *
 * Design: one thread, epoll over the listening socket, an eventfd (stop) and the clients.
 * A message is one SOCK_SEQPACKET datagram, read whole and checked by pool_proto_check
 * before anything reads its fields. State is two tables: frames (slot -> handle, generation,
 * owner; a frame's id names slot and generation, so a stale or forged id names nothing) and
 * clients (slot -> connection; a client's frames are those whose owner is its slot). A
 * lease takes fresh frames the loop made ahead when idle (server_reserve.c) or creates
 * them, a return or a disconnect releases them (when idle): no frame is ever handed to a
 * second client, so a client that kept a mapping of a returned frame reads
 * only its own old bytes (the driver keeps that allocation alive, accounted to this device,
 * until it lets go).
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"
#include "protocol.h"
#include "server_figures.h"
#include "server_int.h"
#include "vmm/vmm.h"

/* Every live, ready or dying frame holds descriptors here: its export (srv_frame.xfd,
   kept for its life, closed at its release), and on the emulated device its memfd and
   export description too. A limit below what the whole pool and its reserve need is said
   at start: past it a frame's create or export fails, and a lease gets fewer frames
   (-ENOMEM), as on a short device. */
static void fd_limit_check(const struct pool_srv *s)
{
    struct srv_reserve_counts k;
    srv_reserve_counts(s, &k);
    size_t per = s->emulated ? 3 : 1, need = (s->pool_frames + (size_t)k.max) * per + 64;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < need)
        srv_say("the descriptor limit (RLIMIT_NOFILE) is %llu, below the %zu the pool's frames "
                "may need (%zu a frame): raise it (ulimit -n; systemd: LimitNOFILE=)",
                (unsigned long long)rl.rlim_cur, need, per);
}

/* A line on stderr, "kvvmd: " first (server_int.h). */
void srv_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvvmd: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static int why_set(char *why, size_t len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int why_set(char *why, size_t len, int rc, const char *fmt, ...)
{
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

size_t pool_srv_pool_bytes(const struct pool_srv *s) { return s->pool_frames * s->page; }
size_t pool_srv_page_size(const struct pool_srv *s) { return s->page; }
const char *pool_srv_backend(const struct pool_srv *s) { return vmm_backend_name(s->v); }

/* ---- the socket -------------------------------------------------------------------------- */

/* PATH free for us: nothing there, or a stale socket (removed). */
static int path_claim(const char *path, char *why, size_t len)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : why_set(why, len, -errno, "%s: %s", path,
                                             strerror(errno));
    if (!S_ISSOCK(st.st_mode))
        return why_set(why, len, -EEXIST, "%s exists and is not a socket; not replacing it",
                       path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return why_set(why, len, -errno, "socket: %s", strerror(errno));
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    int e = errno;
    close(fd);
    if (rc == 0)
        return why_set(why, len, -EADDRINUSE, "a daemon already answers on %s", path);
    if (e != ECONNREFUSED && e != ENOENT)
        return why_set(why, len, -e, "%s: %s", path, strerror(e));
    if (unlink(path) != 0 && errno != ENOENT)
        return why_set(why, len, -errno, "cannot remove the stale socket %s: %s", path,
                       strerror(errno));
    srv_say("replaced the stale socket file %s", path);
    return 0;
}

static int listen_open(struct pool_srv *s, char *why, size_t len)
{
    s->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s->lfd < 0)
        return why_set(why, len, -errno, "socket: %s", strerror(errno));
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", s->path);
    mode_t old = umask(0077);            /* created 0600 (no window where it is wider) */
    int rc = bind(s->lfd, (struct sockaddr *)&a, sizeof a);
    int e = errno;
    umask(old);
    if (rc != 0)
        return why_set(why, len, -e, "bind %s: %s", s->path, strerror(e));
    if (chmod(s->path, 0600) != 0 || listen(s->lfd, 128) != 0) {
        e = errno;
        unlink(s->path);
        return why_set(why, len, -e, "%s: %s", s->path, strerror(e));
    }
    return 0;
}

/* ---- open / close ------------------------------------------------------------------------ */

static int device_open(struct pool_srv *s, const struct pool_srv_params *p, char *why,
                       size_t len)
{
    struct vmm_params vp = {
        .backend = p->backend, .device = p->device,
        .emu_capacity = p->emu_device_bytes ? p->emu_device_bytes : POOL_SRV_EMU_BYTES,
        .emu_granule = p->emu_granule, .shareable = 1,
    };
    int rc = vmm_open(&vp, &s->v);
    if (rc)
        return why_set(why, len, rc, "the device could not be opened (backend %s): %s",
                       p->backend == KVVM_BACKEND_CUDA ? "cuda" :
                       p->backend == KVVM_BACKEND_EMULATED ? "emulated" : "auto",
                       strerror(-rc));
    s->emulated = !strcmp(vmm_backend_name(s->v), "emulated");
    s->emu_bytes = s->emulated ? vmm_device_bytes(s->v) : 0;
    s->granule = vmm_granule(s->v);
    s->page = p->page_size ? p->page_size : s->granule;
    if (s->page % s->granule)
        return why_set(why, len, -EINVAL, "--page-size %zu is not a multiple of the "
                       "device's granule (%zu)", s->page, s->granule);
    size_t budget = p->budget;
    if (!budget) {
        size_t fr = 0, tot = 0;
        if ((rc = vmm_mem_info(s->v, &fr, &tot)))
            return why_set(why, len, rc, "the device's free memory is unknown (%s): give "
                           "--budget", strerror(-rc));
        size_t margin = (tot / 20 + s->page - 1) / s->page * s->page;
        budget = fr > margin ? fr - margin : 0;
        char a[32], b[32], c[32], d[32];
        srv_say("budget: %s (the device's free %s minus a margin of %s, 1/20 of its %s)",
            kfmt_size(budget, a, sizeof a), kfmt_size(fr, b, sizeof b),
            kfmt_size(margin, c, sizeof c), kfmt_size(tot, d, sizeof d));
    }
    s->pool_frames = budget / s->page;
    if (!s->pool_frames)
        return why_set(why, len, -EINVAL, "the budget (%zu bytes) is below one frame (%zu)",
                       budget, s->page);
    return 0;
}

int pool_srv_open(const struct pool_srv_params *p, struct pool_srv **out, char *why,
                  size_t why_len)
{
    if (why && why_len)
        why[0] = 0;
    if (!p || !out || !p->socket_path || !*p->socket_path)
        return why_set(why, why_len, -EINVAL, "no socket path");
    struct pool_srv *s = calloc(1, sizeof *s);
    if (!s)
        return why_set(why, why_len, -ENOMEM, "out of memory");
    s->lfd = s->efd = s->stopfd = -1;
    int rc;
    if (strlen(p->socket_path) >= sizeof s->path) {
        rc = why_set(why, why_len, -EINVAL, "socket path too long (%zu bytes, at most %zu)",
                     strlen(p->socket_path), sizeof s->path - 1);
        goto out_free;
    }
    snprintf(s->path, sizeof s->path, "%s", p->socket_path);
    if ((rc = path_claim(s->path, why, why_len)) || (rc = device_open(s, p, why, why_len)))
        goto out_free;
    s->efd = epoll_create1(EPOLL_CLOEXEC);
    s->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->efd < 0 || s->stopfd < 0) {
        rc = why_set(why, why_len, -errno, "epoll/eventfd: %s", strerror(errno));
        goto out_free;
    }
    if ((rc = listen_open(s, why, why_len)))
        goto out_free;
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &s->lfd };
    struct epoll_event ev2 = { .events = EPOLLIN, .data.ptr = &s->stopfd };
    if (epoll_ctl(s->efd, EPOLL_CTL_ADD, s->lfd, &ev) ||
        epoll_ctl(s->efd, EPOLL_CTL_ADD, s->stopfd, &ev2)) {
        rc = why_set(why, why_len, -errno, "epoll_ctl: %s", strerror(errno));
        unlink(s->path);
        goto out_free;
    }
    if ((rc = srv_reserve_open(s, p->no_reserve ? 0 : p->reserve_frames ? p->reserve_frames
                                                                 : POOL_SRV_RESERVE_FRAMES))) {
        rc = why_set(why, why_len, rc, "the reserve: %s", strerror(-rc));
        unlink(s->path);
        goto out_free;
    }
    fd_limit_check(s);
    *out = s;
    return 0;

out_free:
    if (s->lfd >= 0)
        close(s->lfd);
    if (s->efd >= 0)
        close(s->efd);
    if (s->stopfd >= 0)
        close(s->stopfd);
    if (s->v)
        vmm_close(s->v);
    free(s);
    return rc;
}

void pool_srv_stop(struct pool_srv *s)
{
    uint64_t one = 1;
    ssize_t n = write(s->stopfd, &one, sizeof one);
    (void)n;                            /* a full counter already asks to stop */
}

/* ---- frames ------------------------------------------------------------------------------ */

static uint64_t frame_id(const struct pool_srv *s, size_t slot)
{
    return srv_frame_id(s, slot);
}

/* The slot of frame id held by client c, or -1. */
static long frame_find(const struct pool_srv *s, uint64_t id, const struct srv_client *c)
{
    uint64_t slot1 = id & 0xffffffffu;
    if (slot1 == 0 || slot1 > s->nframes)
        return -1;
    const struct srv_frame *f = &s->frames[slot1 - 1];
    if (!f->live || f->owner != c->slot || f->gen != (uint32_t)(id >> 32))
        return -1;
    return (long)(slot1 - 1);
}

static int frame_slot(struct pool_srv *s, size_t *slot)
{
    for (size_t k = 0; k < s->nframes; k++) {
        size_t i = (s->free_hint + k) % s->nframes;
        if (!s->frames[i].live) {
            *slot = i;
            s->free_hint = i + 1;
            return 0;
        }
    }
    if (s->nframes == s->cap_frames) {
        size_t cap = s->cap_frames ? 2 * s->cap_frames : 256;
        struct srv_frame *n = realloc(s->frames, cap * sizeof *n);
        if (!n)
            return -ENOMEM;
        s->frames = n;
        s->cap_frames = cap;
    }
    s->frames[s->nframes] = (struct srv_frame){ .xfd = -1, .gen = 1, .owner = -1 };
    *slot = s->nframes++;
    return 0;
}

/* The lease of frame slot ends; the frame dies unless a record or a mapper holds it. */
static void frame_release(struct pool_srv *s, size_t slot)
{
    struct srv_frame *f = &s->frames[slot];
    KVVM_ASSERT(f->live && f->owner >= 0 && s->leased > 0);
    struct srv_client *c = s->clients[f->owner];
    KVVM_ASSERT(c && c->held > 0);
    c->held--;
    f->owner = -1;
    srv_frame_settle(s, slot);
}

/* Frames reserved by clients other than c and not held by them. */
static size_t reserved_elsewhere(const struct pool_srv *s, const struct srv_client *c)
{
    size_t r = 0;
    for (size_t i = 0; i < s->nclients; i++) {
        const struct srv_client *o = s->clients[i];
        if (!o || o == c || o->role != POOL_ROLE_CLIENT)
            continue;
        size_t want = (size_t)(o->reserve / s->page);
        r += want > o->held ? want - o->held : 0;
    }
    return r;
}

static void figures(const struct pool_srv *s, const struct srv_client *c,
                    struct pool_figures *f)
{
    memset(f, 0, sizeof *f);
    f->pool_bytes = s->pool_frames * s->page;
    f->free_bytes = (s->pool_frames - s->leased) * s->page;
    f->held_bytes = c->held * s->page;
    f->reserve_bytes = c->reserve;
    f->limit_bytes = c->limit ? c->limit : f->pool_bytes;
    for (size_t i = 0; i < s->nclients; i++)
        f->n_clients += s->clients[i] && s->clients[i]->role == POOL_ROLE_CLIENT;
    f->shared_entries = s->npfx;
    f->shared_bytes = (uint64_t)s->pfx_frames * s->page;
}

/* ---- clients ----------------------------------------------------------------------------- */

/* Drops c: every frame it holds is released, its connection closed. */
static void client_drop(struct pool_srv *s, struct srv_client *c, const char *why)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nframes && c->held; i++) {
        if (s->frames[i].owner == c->slot) {
            frame_release(s, i);
            n++;
        }
    }
    KVVM_ASSERT(c->held == 0);
    if (c->role == POOL_ROLE_CLIENT)
        pool_fig_gone(&s->figd, &c->k, why != NULL, n);
    srv_share_client_gone(s, c);
    if (c->role == POOL_ROLE_CLIENT || why)
        srv_say("client %s (pid %d) %s; %zu frame%s back in the pool", c->name[0] ? c->name : "?",
            (int)c->pid, why ? why : "disconnected", n, n == 1 ? "" : "s");
    epoll_ctl(s->efd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    s->clients[c->slot] = NULL;
    free(c);
}

static void client_accept(struct pool_srv *s)
{
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                srv_say("accept: %s", strerror(errno));
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return;
        }
        struct ucred cr;
        socklen_t cl = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != geteuid()) {
            srv_say("refused a connection of uid %d (this daemon serves uid %d only)",
                cl == sizeof cr ? (int)cr.uid : -1, (int)geteuid());
            close(fd);
            continue;
        }
        size_t slot = 0;
        while (slot < s->nclients && s->clients[slot])
            slot++;
        struct srv_client *c = calloc(1, sizeof *c);
        if (slot == s->nclients) {
            struct srv_client **n = realloc(s->clients, (s->nclients + 1) * sizeof *n);
            if (n)
                s->clients = n;
            if (!n || !c) {
                srv_say("out of memory: refused a connection");
                free(c);
                close(fd);
                continue;
            }
            s->clients[s->nclients++] = NULL;
        }
        if (!c) {
            close(fd);
            continue;
        }
        *c = (struct srv_client){ .fd = fd, .slot = (int)slot, .pid = cr.pid };
        c->conn = ++s->figd.connections;
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
        if (epoll_ctl(s->efd, EPOLL_CTL_ADD, fd, &ev)) {
            free(c);
            close(fd);
            continue;
        }
        s->clients[slot] = c;
    }
}

/* Sends m to c (never blocks: a client that does not read its replies is dropped by the
   caller on the error). */
static int reply(struct srv_client *c, const void *m, const int *fds, int nfds)
{
    return pool_proto_send(c->fd, m, fds, nfds, MSG_DONTWAIT);
}

static int refuse(struct srv_client *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct srv_client *c, int err, const char *fmt, ...)
{
    struct pool_refused m = { .err = err, .version = POOL_PROTO_VERSION };
    pool_proto_hdr(&m.h, POOL_MSG_REFUSED);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.why, sizeof m.why, fmt, ap);
    va_end(ap);
    (void)reply(c, &m, NULL, 0);
    return -EPROTO;                 /* the caller drops c */
}

static int on_hello(struct pool_srv *s, struct srv_client *c, const struct pool_hello *m)
{
    if (c->role)
        return -EPROTO;                             /* a second HELLO */
    snprintf(c->name, sizeof c->name, "%s", m->name[0] ? m->name : "?");
    if (m->role == POOL_ROLE_CLIENT) {
        if (m->page_size && m->page_size != s->page)
            return refuse(c, -EINVAL, "page_size %llu is not the pool's page size %zu "
                          "(set 0 or %zu)", (unsigned long long)m->page_size, s->page, s->page);
        size_t others = 0;
        for (size_t i = 0; i < s->nclients; i++)
            if (s->clients[i] && s->clients[i] != c && s->clients[i]->role == POOL_ROLE_CLIENT)
                others += s->clients[i]->reserve;
        uint64_t pool = (uint64_t)s->pool_frames * s->page;
        if (m->reserve > pool || others + m->reserve > pool)
            return refuse(c, -ENOSPC, "pool_reserve %llu cannot be promised: the pool is %llu "
                          "bytes and other clients reserve %zu", (unsigned long long)m->reserve,
                          (unsigned long long)pool, others);
        c->reserve = m->reserve;
        c->limit = m->limit;
    }
    c->role = m->role;
    struct pool_welcome w = {
        .version = POOL_PROTO_VERSION,
        .backend = s->emulated ? POOL_BACKEND_EMULATED : POOL_BACKEND_CUDA,
        .page_size = s->page, .granule = s->granule,
        .pool_bytes = (uint64_t)s->pool_frames * s->page, .emu_device_bytes = s->emu_bytes,
        .limit = c->limit,
    };
    pool_proto_hdr(&w.h, POOL_MSG_WELCOME);
    if (c->role == POOL_ROLE_CLIENT) {
        char a[32];
        srv_say("client %s (pid %d) connected: reserve %llu, limit %s", c->name, (int)c->pid,
            (unsigned long long)c->reserve,
            c->limit ? kfmt_size(c->limit, a, sizeof a) : "the pool");
    }
    return reply(c, &w, NULL, 0);
}

static uint64_t mono_ns(void);

/* o's credit now (protocol.h LEASE's need): 0 once its deadline passed. */
static size_t credit(const struct srv_client *o, uint64_t now)
{
    return o->owed && now < o->owed_deadline ? o->owed : 0;
}

/* Frames kept for other clients than c: for leases that wait for a take-back and for
   credits (a frame given back for an asker is not leased to a client that asks without
   waiting: the giver's own frame pool thread would take it back at once). A waiting c
   (served in arrival order with the other waiting leases) is kept from the credits of
   clients that do not wait now only. */
static size_t pending_elsewhere(const struct pool_srv *s, const struct srv_client *c)
{
    size_t r = 0;
    uint64_t now = mono_ns();
    for (size_t i = 0; i < s->nclients; i++) {
        const struct srv_client *o = s->clients[i];
        if (!o || o == c)
            continue;
        size_t cr = credit(o, now);
        if (c->pend_n)
            r += o->pend_n ? 0 : cr;
        else
            r += o->pend_n > cr ? o->pend_n : cr;
    }
    return r;
}

/* Frames c may take now (pending: c's lease waits, served in arrival order, so the other
   askers' frames are not held from it). */
static size_t grantable(const struct pool_srv *s, const struct srv_client *c)
{
    size_t free_frames = s->pool_frames - s->leased;
    size_t others = reserved_elsewhere(s, c) + pending_elsewhere(s, c);
    size_t room = free_frames > others ? free_frames - others : 0;
    if (c->limit) {
        size_t lim = (size_t)(c->limit / s->page);
        size_t by_limit = lim > c->held ? lim - c->held : 0;
        room = room < by_limit ? room : by_limit;
    }
    return room;
}

/* Frames the pool lacks for a lease of n by c, within what c's limit allows: what
   dropping records may fix (a client short by its own limit frees nothing by it). */
static size_t pool_short(const struct pool_srv *s, const struct srv_client *c, size_t n)
{
    size_t free_frames = s->pool_frames - s->leased;
    size_t others = reserved_elsewhere(s, c) + pending_elsewhere(s, c);
    size_t room = free_frames > others ? free_frames - others : 0;
    if (c->limit) {
        size_t lim = (size_t)(c->limit / s->page);
        size_t by_limit = lim > c->held ? lim - c->held : 0;
        n = n < by_limit ? n : by_limit;
    }
    return n > room ? n - room : 0;
}

static uint64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Creates up to `want` frames for c (fewer when the device is short) and sends them in one
   FRAMES with err when fewer than asked were granted. */
static int grant(struct pool_srv *s, struct srv_client *c, size_t want, uint32_t asked,
                 int err)
{
    struct pool_frames r = { 0 };
    int fds[POOL_BATCH_MAX];
    size_t slots[POOL_BATCH_MAX], n = 0;
    KVVM_ASSERT(want <= POOL_BATCH_MAX && asked <= POOL_BATCH_MAX);
    while (n < want) {
        vmm_handle h;
        if (frame_slot(s, &slots[n]) || srv_reserve_take(s, &h, &fds[n]))
            break;                                  /* the device is short: fewer */
        struct srv_frame *f = &s->frames[slots[n]];
        *f = (struct srv_frame){ .h = h, .xfd = fds[n], .gen = f->gen, .owner = c->slot,
                                 .live = 1 };
        c->held++;
        s->leased++;
        r.ids[n] = frame_id(s, slots[n]);
        n++;
    }
    r.n = (uint32_t)n;
    r.err = n < asked ? (err ? err : -ENOMEM) : 0;
    c->k.frames_leased += n;
    c->k.leases_short += n < asked;
    pool_proto_hdr(&r.h, POOL_MSG_FRAMES);
    figures(s, c, &r.fig);
    return reply(c, &r, fds, (int)n);   /* the descriptors stay the frames' (xfd); on a
                                           failure, the drop releases the frames */
}

/* ---- take-back ---------------------------------------------------------------------------
   A lease that waits (wait_ms > 0: a call of the client needs a frame) and finds the pool
   dry starts a round: the daemon asks clients above their reserve to give frames back
   (RECLAIM; furthest above its reserve first, then least recently active), each once per
   round, until the asks cover the shortfall; a client that gives less than asked makes
   the next one asked. The lease is answered when enough is free, when no ask is left
   unanswered and no one else may be asked (a client with nothing it may give answers at
   once, so it is not waited for), or at its deadline, with what is free then. Every step
   is an event of the loop: nothing here blocks, and a client killed while asked answers
   by its death (its frames released). */

/* Frames v may be asked for: what it holds above its reserve, less what it was asked. */
static size_t excess(const struct pool_srv *s, const struct srv_client *v)
{
    size_t res = (size_t)((v->reserve + s->page - 1) / s->page);
    size_t over = v->held > res ? v->held - res : 0;
    return over > v->asked ? over - v->asked : 0;
}

static int ask(struct srv_client *v, uint32_t n)
{
    struct pool_reclaim m = { .seq = ++v->ask_seq, .n = n };
    pool_proto_hdr(&m.h, POOL_MSG_RECLAIM);
    int rc = reply(v, &m, NULL, 0);
    if (!rc) {
        v->asked += n;
        v->k.asks++;
        v->k.frames_asked += n;
    }
    return rc;
}

/* Asks others for `need` frames for asker a's round; returns the frames asked. A victim
   whose socket refuses the ask is dropped (it does not read: as elsewhere). */
static size_t ask_victims(struct pool_srv *s, struct srv_client *a, size_t need)
{
    size_t asked = 0;
    while (asked < need) {
        struct srv_client *best = NULL;
        size_t best_x = 0;
        for (size_t i = 0; i < s->nclients; i++) {
            struct srv_client *v = s->clients[i];
            if (!v || v == a || v->role != POOL_ROLE_CLIENT || v->pend_n ||
                v->asked_round == a->pend_round)
                continue;
            size_t x = excess(s, v);
            if (x && (x > best_x || (x == best_x && v->active_ns < best->active_ns))) {
                best = v;
                best_x = x;
            }
        }
        if (!best)
            break;
        uint32_t n = (uint32_t)(best_x < need - asked ? best_x : need - asked);
        best->asked_round = a->pend_round;
        if (ask(best, n)) {
            client_drop(s, best, "does not read its messages: dropped");
            continue;
        }
        srv_say("take-back: asked client %s (pid %d) for %u frame%s for %s (pid %d)", best->name,
            (int)best->pid, n, n == 1 ? "" : "s", a->name, (int)a->pid);
        asked += n;
    }
    return asked;
}

static bool asks_open(const struct pool_srv *s)
{
    for (size_t i = 0; i < s->nclients; i++)
        if (s->clients[i] && s->clients[i]->asked)
            return true;
    return false;
}

/* Answers a's waiting lease if it can be: 1 answered, 0 it waits on, -errno (drop a). */
static int pending_try(struct pool_srv *s, struct srv_client *a, uint64_t now)
{
    size_t g = grantable(s, a), want = a->pend_n;
    size_t total = a->owed > want ? a->owed : want;     /* the call's whole need */
    bool late = now >= a->pend_deadline;
    size_t sh = g < want && !late ? pool_short(s, a, want) : 0;
    if (sh && srv_share_reclaim(s, sh))
        g = grantable(s, a);                        /* unmapped entries, unimported exports
                                                       went first */
    if (g < want && !late && !asks_open(s)) {
        size_t more = ask_victims(s, a, total - g);   /* one round for all of it */
        if (more)
            return 0;
    }
    if (g < want && !late && asks_open(s))
        return 0;
    a->pend_n = 0;
    /* the rest of the call's need: its credit until the lease's deadline (none when the
       round ended short) */
    a->owed = g >= want && !late ? (uint32_t)(total - want) : 0;
    a->owed_deadline = a->pend_deadline;
    khist_add(&s->figd.takeback_wait, now - a->pend_t0);
    uint32_t asked = (uint32_t)want;
    if (g < want)
        srv_say("take-back for %s (pid %d): %zu of %zu frame%s after %llu ms%s", a->name,
            (int)a->pid, g, want, want == 1 ? "" : "s",
            (unsigned long long)((now - a->pend_t0) / 1000000u),
            late ? " (its deadline)" : " (no client could give more)");
    return grant(s, a, g < want ? g : want, asked, late ? -ETIMEDOUT : -ENOMEM) ? -EIO : 1;
}

bool srv_takeback_on(const struct pool_srv *s)
{
    uint64_t now = mono_ns();
    for (size_t i = 0; i < s->nclients; i++) {
        const struct srv_client *c = s->clients[i];
        if (c && (c->pend_n || c->asked || credit(c, now)))
            return true;
    }
    return false;
}

/* Serves the waiting leases that can be answered now, oldest first; credits past their
   deadline end. */
static void pending_serve(struct pool_srv *s)
{
    uint64_t now = mono_ns();
    for (size_t i = 0; i < s->nclients; i++)
        if (s->clients[i] && s->clients[i]->owed && now >= s->clients[i]->owed_deadline)
            s->clients[i]->owed = 0;
    for (;;) {
        struct srv_client *a = NULL;
        for (size_t i = 0; i < s->nclients; i++) {
            struct srv_client *c = s->clients[i];
            if (c && c->pend_n && (!a || c->pend_t0 < a->pend_t0))
                a = c;
        }
        if (!a)
            return;
        int rc = pending_try(s, a, now);
        if (rc < 0)
            client_drop(s, a, "does not read its replies: dropped");
        else if (rc == 0)
            return;             /* the oldest waits: those after it wait behind it */
    }
}

/* The epoll timeout: until the nearest deadline of a waiting lease or import (-1: none). */
static int pending_timeout_ms(struct pool_srv *s)
{
    uint64_t now = mono_ns(), next = srv_share_deadlines(s, now);
    for (size_t i = 0; i < s->nclients; i++) {
        const struct srv_client *c = s->clients[i];
        if (c && c->pend_n && c->pend_deadline < next)
            next = c->pend_deadline;
        if (c && c->owed && c->owed_deadline < next)
            next = c->owed_deadline;        /* its credit ends: others' leases may take it */
    }
    if (next == UINT64_MAX)
        return -1;
    return next <= now ? 0 : (int)((next - now + 999999u) / 1000000u);
}

static int on_lease(struct pool_srv *s, struct srv_client *c, const struct pool_lease *m)
{
    if (c->role != POOL_ROLE_CLIENT || c->pend_n)
        return -EPROTO;                 /* a second lease while one waits: out of turn */
    uint64_t now = mono_ns();
    c->active_ns = now;
    c->asked = 0;                       /* it needs frames itself: its ask is off */
    bool cont = credit(c, now) > 0;     /* its call goes on: what was given for it */
    size_t lim = c->limit ? (size_t)(c->limit / s->page) : SIZE_MAX;
    size_t most = lim < s->pool_frames ? lim : s->pool_frames;
    size_t room = c->held < most ? most - c->held : 0;     /* what its call may get */
    size_t need = m->wait_ms && m->need > m->n ? m->need : m->n;
    need = need < room ? need : room > m->n ? room : m->n;
    if (m->wait_ms) {                   /* a call's lease says what it still needs: its
                                           credit is replaced (a lease ahead keeps it) */
        c->owed = 0;
        srv_reserve_need(s, need);      /* ready next time */
    }
    size_t want = grantable(s, c);
    size_t sh = want < m->n && m->wait_ms && c->held < lim ? pool_short(s, c, m->n) : 0;
    if (sh && srv_share_reclaim(s, sh))
        want = grantable(s, c);         /* unmapped shared entries and unimported exports go
                                           before any take-back; never for a client short
                                           by its own limit */
    if (want || !m->wait_ms || c->held >= lim) {
        size_t g = want < m->n ? want : m->n;
        if (cont && m->wait_ms && need > g) {   /* a round for its call may give more */
            c->owed = (uint32_t)(need - g);
            c->owed_deadline = now + (uint64_t)m->wait_ms * 1000000u;
        }
        return grant(s, c, g, m->n, 0);
    }
    c->pend_n = m->n;                   /* the pool is dry: a take-back round */
    c->k.lease_waits++;
    c->pend_round = ++s->rounds;
    c->pend_t0 = now;
    c->pend_deadline = now + (uint64_t)m->wait_ms * 1000000u;
    c->owed = (uint32_t)need;           /* all of it asked for in this round */
    c->owed_deadline = c->pend_deadline;
    return 0;                           /* pending_serve asks and answers */
}

static int on_return(struct pool_srv *s, struct srv_client *c, const struct pool_return *m)
{
    if (c->role != POOL_ROLE_CLIENT)
        return -EPROTO;
    long slots[POOL_BATCH_MAX];
    for (uint32_t i = 0; i < m->n; i++) {
        slots[i] = frame_find(s, m->ids[i], c);     /* -1: not leased, maybe mapped */
        for (uint32_t j = 0; j < i && slots[i] >= 0; j++)
            if (slots[j] == slots[i])
                return -EPROTO;                     /* twice in one message */
    }
    uint32_t given = 0;
    for (uint32_t i = 0; i < m->n; i++) {
        if (slots[i] >= 0) {
            frame_release(s, (size_t)slots[i]);
            given++;
        } else if (srv_share_unmap(s, c, m->ids[i])) {
            return -EPROTO;                         /* not its frame: hostile or broken */
        }
    }
    c->k.frames_returned += given;
    return 0;
}

static int on_reclaimed(struct pool_srv *s, struct srv_client *c,
                        const struct pool_reclaimed *m)
{
    if (c->role != POOL_ROLE_CLIENT)
        return -EPROTO;
    c->k.frames_given += m->given;
    if (m->seq == c->ask_seq && c->asked) {     /* an older ask's answer: a newer one is due */
        srv_say("take-back: client %s (pid %d) gave %u frame%s", c->name, (int)c->pid, m->given,
            m->given == 1 ? "" : "s");
        c->asked = 0;
    }
    (void)s;
    return 0;
}

static int on_info(struct pool_srv *s, struct srv_client *c)
{
    if (!c->role)
        return -EPROTO;
    struct pool_info_reply r;
    pool_proto_hdr(&r.h, POOL_MSG_INFO_REPLY);
    figures(s, c, &r.fig);
    return reply(c, &r, NULL, 0);
}

static int on_clients(struct pool_srv *s, struct srv_client *c)
{
    if (c->role != POOL_ROLE_CONTROL)
        return -EPROTO;
    for (size_t i = 0; i < s->nclients; i++) {
        const struct srv_client *o = s->clients[i];
        if (!o || o->role != POOL_ROLE_CLIENT)
            continue;
        struct pool_client_row r = { .pid = (uint32_t)o->pid, .held = o->held * s->page,
                                     .shared = (uint64_t)o->maps.n * s->page,
                                     .reserve = o->reserve,
                                     .limit = o->limit ? o->limit : s->pool_frames * s->page };
        pool_proto_hdr(&r.h, POOL_MSG_CLIENT);
        snprintf(r.name, sizeof r.name, "%s", o->name);
        int rc = reply(c, &r, NULL, 0);
        if (rc)
            return rc;
    }
    struct pool_end e;
    pool_proto_hdr(&e.h, POOL_MSG_END);
    return reply(c, &e, NULL, 0);
}

static int on_limit(struct pool_srv *s, struct srv_client *c, const struct pool_limit *m)
{
    if (c->role != POOL_ROLE_CONTROL)
        return -EPROTO;
    struct pool_result r = { 0 };
    pool_proto_hdr(&r.h, POOL_MSG_RESULT);
    unsigned n = 0;
    for (size_t i = 0; i < s->nclients; i++) {
        struct srv_client *o = s->clients[i];
        if (o && o->role == POOL_ROLE_CLIENT && !strcmp(o->name, m->name)) {
            o->limit = m->bytes;
            n++;
            size_t lim = m->bytes ? (size_t)(m->bytes / s->page) : s->pool_frames;
            size_t over = o->held > lim + o->asked ? o->held - lim - o->asked : 0;
            /* above its new limit: it gives back down to it, as for a take-back (not while
               a lease of its own waits: then it gets nothing more until it is below) */
            if (over && !o->pend_n && ask(o, (uint32_t)(over < UINT32_MAX ? over
                                                                     : UINT32_MAX)))
                client_drop(s, o, "does not read its messages: dropped");
        }
    }
    char a[32];
    if (!n) {
        r.err = -ENOENT;
        snprintf(r.text, sizeof r.text, "no client named '%s'", m->name);
    } else {
        snprintf(r.text, sizeof r.text, "limit of '%s' set to %s (%u client%s; one holding "
                 "more gives back down to it)", m->name,
                 m->bytes ? kfmt_size(m->bytes, a, sizeof a) : "the whole pool", n,
                 n == 1 ? "" : "s");
        srv_say("%s", r.text);
    }
    return reply(c, &r, NULL, 0);
}

static int on_set_limit(struct pool_srv *s, struct srv_client *c,
                        const struct pool_set_limit *m)
{
    if (c->role != POOL_ROLE_CLIENT)
        return -EPROTO;
    c->limit = m->bytes;
    struct pool_result r = { 0 };
    pool_proto_hdr(&r.h, POOL_MSG_RESULT);
    char a[32];
    snprintf(r.text, sizeof r.text, "limit of '%s' set to %s", c->name,
             m->bytes ? kfmt_size(m->bytes, a, sizeof a) : "the whole pool");
    (void)s;
    return reply(c, &r, NULL, 0);
}

/* A HELLO of another version is answered with both versions before the full check (its
   size may differ): its first fields are fixed for every version. */
static bool other_version(struct srv_client *c, const unsigned char *buf, long n)
{
    struct { struct pool_hdr h; uint32_t version; } v;
    if (c->role || n < (long)sizeof v)
        return false;
    memcpy(&v, buf, sizeof v);
    if (v.h.magic != POOL_MAGIC || v.h.type != POOL_MSG_HELLO ||
        v.version == POOL_PROTO_VERSION)
        return false;
    refuse(c, -EPROTO, "protocol version %u is not this daemon's (kvvmd speaks version %u)",
           v.version, POOL_PROTO_VERSION);
    return true;
}

static int dispatch(struct pool_srv *s, struct srv_client *c, const void *buf, unsigned type)
{
    if (!c->role && type != POOL_MSG_HELLO)
        return -EPROTO;
    switch (type) {
    case POOL_MSG_HELLO:   return on_hello(s, c, buf);
    case POOL_MSG_LEASE:   return on_lease(s, c, buf);
    case POOL_MSG_RETURN:  return on_return(s, c, buf);
    case POOL_MSG_INFO:    return on_info(s, c);
    case POOL_MSG_CLIENTS: return on_clients(s, c);
    case POOL_MSG_LIMIT:   return on_limit(s, c, buf);
    case POOL_MSG_SET_LIMIT: return on_set_limit(s, c, buf);
    case POOL_MSG_RECLAIMED: return on_reclaimed(s, c, buf);
    case POOL_MSG_EXPORT:  return srv_on_export(s, c, buf);
    case POOL_MSG_IMPORT:  return srv_on_import(s, c, buf);
    case POOL_MSG_IMPORT_END: return srv_on_import_end(s, c, buf);
    case POOL_MSG_HANDOFF_DROP: return srv_on_handoff_drop(s, c, buf);
    case POOL_MSG_PREFIX_PUBLISH: return srv_on_prefix_publish(s, c, buf);
    case POOL_MSG_PREFIX_LOOKUP: return srv_on_prefix_keys(s, c, buf, false);
    case POOL_MSG_PREFIX_ATTACH: return srv_on_prefix_keys(s, c, buf, true);
    case POOL_MSG_PREFIX_DROP: return srv_on_prefix_drop(s, c, buf);
    case POOL_MSG_READY:   return srv_on_ready(s, c, buf);
    default:               return -EPROTO;          /* a daemon's message sent to it */
    }
}

/* Reads and serves c's messages until its socket is empty; drops it on EOF or error. */
static void client_serve(struct pool_srv *s, struct srv_client *c)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    for (;;) {
        int fds[1], nfds = 0;
        long n = pool_proto_recv(c->fd, buf, sizeof buf, fds, 1, &nfds, MSG_DONTWAIT);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);                  /* no client message carries descriptors */
        if (n == -EAGAIN)
            return;
        if (n == 0) {
            client_drop(s, c, NULL);
            return;
        }
        unsigned type = 0;
        if (n > 0 && other_version(c, buf, n)) {
            client_drop(s, c, "speaks another protocol version: dropped");
            return;
        }
        int rc = n < 0 ? (int)n : pool_proto_check(buf, (size_t)n, nfds, &type);
        if (!rc)
            rc = dispatch(s, c, buf, type);
        if (rc) {
            client_drop(s, c, rc == -EPROTO || rc == -EMSGSIZE
                        ? "sent a malformed message: dropped"
                        : "does not read its replies: dropped");
            return;
        }
    }
}

/* Publishes the figures for kvvmd --metrics (server_figures.h) after a round, when due. */
static void figures_publish(struct pool_srv *s)
{
    if (!pool_fig_due(s->fig))
        return;
    struct pool_fig_pool p = { .pool_bytes = s->pool_frames * s->page, .page_size = s->page,
                               .free_bytes = (s->pool_frames - s->leased) * s->page,
                               .rounds = s->rounds, .d = s->figd,
                               .shared_entries = s->npfx,
                               .shared_bytes = (uint64_t)s->pfx_frames * s->page };
    struct srv_reserve_counts r;
    srv_reserve_counts(s, &r);
    p.ready_frames = r.ready;
    p.releasing_frames = r.dying;
    p.made_ahead = r.made_ahead;
    p.made_at_lease = r.made_inline;
    pool_fig_begin(s->fig);
    for (size_t i = 0; i < s->nclients; i++) {
        const struct srv_client *c = s->clients[i];
        p.n_controls += c && c->role == POOL_ROLE_CONTROL;
        if (c && c->role == POOL_ROLE_CLIENT)
            pool_fig_row(s->fig, c->name, &(struct pool_fig_row){
                .conn = c->conn, .pid = (uint32_t)c->pid, .waiting = c->pend_n,
                .held = c->held * s->page, .reserve = c->reserve,
                .limit = c->limit ? c->limit : p.pool_bytes, .k = c->k });
    }
    pool_fig_end(s->fig, &p);
}

struct pool_fig *pool_srv_figures(struct pool_srv *s)
{
    if (!s->fig && pool_fig_create(&s->fig) == 0)
        figures_publish(s);
    return s->fig;
}

int pool_srv_run(struct pool_srv *s)
{
    for (;;) {
        struct epoll_event ev[64];
        bool idle_work = srv_reserve_busy(s);     /* the reserve: when nothing waits */
        int n = epoll_wait(s->efd, ev, 64, idle_work ? 0 : pool_fig_timeout(s->fig,
                                                              pending_timeout_ms(s)));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            srv_say("epoll_wait: %s", strerror(errno));
            return -errno;
        }
        for (int i = 0; i < n; i++) {
            void *p = ev[i].data.ptr;
            if (p == &s->stopfd)
                return 0;
            if (p == &s->lfd) {
                client_accept(s);
                continue;
            }
            /* a client dropped earlier in this batch is gone: skip stale events */
            bool live = false;
            for (size_t k = 0; k < s->nclients && !live; k++)
                live = p && s->clients[k] == p;
            if (live)
                client_serve(s, p);
        }
        if (n == 0 && idle_work)
            srv_reserve_work(s);    /* one release or one frame made ahead */
        pending_serve(s);           /* frames given back, answers, deaths, deadlines */
        (void)srv_share_deadlines(s, mono_ns());  /* imports waiting for a pending export */
        figures_publish(s);
    }
}

void pool_srv_close(struct pool_srv *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nclients; i++)
        if (s->clients[i])
            client_drop(s, s->clients[i], NULL);
    srv_share_close(s);
    KVVM_ASSERT(s->leased == 0);
    srv_reserve_close(s);
    free(s->clients);
    free(s->frames);
    close(s->lfd);
    unlink(s->path);
    close(s->efd);
    close(s->stopfd);
    vmm_close(s->v);
    pool_fig_destroy(s->fig);
    free(s);
}
