/*
 * pool/protocol.c: the pool protocol's sizes, its one parser and its socket I/O (contract in
 * pool/protocol.h).
 */
#include "protocol.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"

static const size_t sizes[POOL_MSG_TYPES] = {
    [POOL_MSG_HELLO] = sizeof(struct pool_hello),
    [POOL_MSG_WELCOME] = sizeof(struct pool_welcome),
    [POOL_MSG_REFUSED] = sizeof(struct pool_refused),
    [POOL_MSG_LEASE] = sizeof(struct pool_lease),
    [POOL_MSG_FRAMES] = sizeof(struct pool_frames),
    [POOL_MSG_RETURN] = sizeof(struct pool_return),
    [POOL_MSG_INFO] = sizeof(struct pool_info),
    [POOL_MSG_INFO_REPLY] = sizeof(struct pool_info_reply),
    [POOL_MSG_CLIENTS] = sizeof(struct pool_clients),
    [POOL_MSG_CLIENT] = sizeof(struct pool_client_row),
    [POOL_MSG_END] = sizeof(struct pool_end),
    [POOL_MSG_LIMIT] = sizeof(struct pool_limit),
    [POOL_MSG_RESULT] = sizeof(struct pool_result),
    [POOL_MSG_SET_LIMIT] = sizeof(struct pool_set_limit),
    [POOL_MSG_RECLAIM] = sizeof(struct pool_reclaim),
    [POOL_MSG_RECLAIMED] = sizeof(struct pool_reclaimed),
    [POOL_MSG_EXPORT] = sizeof(struct pool_export),
    [POOL_MSG_EXPORTED] = sizeof(struct pool_exported),
    [POOL_MSG_IMPORT] = sizeof(struct pool_import),
    [POOL_MSG_IMPORTED] = sizeof(struct pool_imported),
    [POOL_MSG_IMPORT_END] = sizeof(struct pool_import_end),
    [POOL_MSG_HANDOFF_DROP] = sizeof(struct pool_handoff_drop),
    [POOL_MSG_PREFIX_PUBLISH] = sizeof(struct pool_prefix_publish),
    [POOL_MSG_PREFIX_LOOKUP] = sizeof(struct pool_prefix_keys),
    [POOL_MSG_PREFIX_ATTACH] = sizeof(struct pool_prefix_keys),
    [POOL_MSG_PREFIX_FOUND] = sizeof(struct pool_prefix_found),
    [POOL_MSG_PREFIX_DROP] = sizeof(struct pool_prefix_drop),
    [POOL_MSG_READY] = sizeof(struct pool_ready),
};
_Static_assert(POOL_MSG_MAX <= UINT16_MAX, "sizes fit pool_hdr.size");
_Static_assert(POOL_MSG_MAX >= sizeof(struct pool_frames) &&
               POOL_MSG_MAX >= sizeof(struct pool_return) &&
               POOL_MSG_MAX >= sizeof(struct pool_refused) &&
               POOL_MSG_MAX >= sizeof(struct pool_result) &&
               POOL_MSG_MAX >= sizeof(struct pool_export) &&
               POOL_MSG_MAX >= sizeof(struct pool_exported) &&
               POOL_MSG_MAX >= sizeof(struct pool_imported) &&
               POOL_MSG_MAX >= sizeof(struct pool_prefix_publish) &&
               POOL_MSG_MAX >= sizeof(struct pool_prefix_keys),
               "POOL_MSG_MAX is the largest message");

size_t pool_proto_size(unsigned t)
{
    return t > 0 && t < POOL_MSG_TYPES ? sizes[t] : 0;
}

void pool_proto_hdr(struct pool_hdr *h, unsigned t)
{
    KVVM_ASSERT(pool_proto_size(t) > 0);
    h->magic = POOL_MAGIC;
    h->type = (uint16_t)t;
    h->size = (uint16_t)pool_proto_size(t);
}

static bool terminated(const char *s, size_t cap)
{
    return memchr(s, 0, cap) != NULL;
}

int pool_proto_check(const void *buf, size_t n, int nfds, unsigned *type)
{
    struct pool_hdr h;
    if (!buf || n < sizeof h)
        return -EPROTO;
    memcpy(&h, buf, sizeof h);
    size_t want = pool_proto_size(h.type);
    if (h.magic != POOL_MAGIC || !want || h.size != want || n != want)
        return -EPROTO;
    if (h.type != POOL_MSG_FRAMES && nfds != 0)
        return -EPROTO;
    switch (h.type) {
    case POOL_MSG_HELLO: {
        const struct pool_hello *m = buf;
        if ((m->role != POOL_ROLE_CLIENT && m->role != POOL_ROLE_CONTROL) ||
            !terminated(m->name, sizeof m->name))
            return -EPROTO;
        break;
    }
    case POOL_MSG_REFUSED:
        if (!terminated(((const struct pool_refused *)buf)->why, POOL_TEXT_MAX))
            return -EPROTO;
        break;
    case POOL_MSG_LEASE: {
        const struct pool_lease *m = buf;
        if (m->n < 1 || m->n > POOL_BATCH_MAX)
            return -EPROTO;
        break;
    }
    case POOL_MSG_FRAMES: {
        const struct pool_frames *m = buf;
        uint64_t ids = m->n >= 64 ? ~0ull : (1ull << m->n) - 1;   /* bits of ids[0..n) */
        if (m->n > POOL_BATCH_MAX || (m->held & ~ids) ||
            (int)(m->n - (uint32_t)__builtin_popcountll(m->held)) != nfds)
            return -EPROTO;
        break;
    }
    case POOL_MSG_RECLAIM:
        if (((const struct pool_reclaim *)buf)->n < 1)
            return -EPROTO;
        break;
    case POOL_MSG_RETURN: {
        const struct pool_return *m = buf;
        if (m->n < 1 || m->n > POOL_BATCH_MAX)
            return -EPROTO;
        break;
    }
    case POOL_MSG_CLIENT:
        if (!terminated(((const struct pool_client_row *)buf)->name, POOL_NAME_MAX))
            return -EPROTO;
        break;
    case POOL_MSG_LIMIT:
        if (!terminated(((const struct pool_limit *)buf)->name, POOL_NAME_MAX))
            return -EPROTO;
        break;
    case POOL_MSG_RESULT:
        if (!terminated(((const struct pool_result *)buf)->text, POOL_TEXT_MAX))
            return -EPROTO;
        break;
    case POOL_MSG_EXPORT: {
        const struct pool_export *m = buf;
        if (m->total < 1 || m->total > POOL_HANDOFF_MAX || m->n < 1 || m->n > POOL_BATCH_MAX ||
            m->off >= m->total || m->n > m->total - m->off)
            return -EPROTO;
        break;
    }
    case POOL_MSG_EXPORTED:
        if (!terminated(((const struct pool_exported *)buf)->text, POOL_TEXT_MAX))
            return -EPROTO;
        break;
    case POOL_MSG_IMPORTED: {
        const struct pool_imported *m = buf;
        if (!terminated(m->text, POOL_TEXT_MAX) || m->total > POOL_HANDOFF_MAX ||
            (m->err == 0 && m->total == 0))
            return -EPROTO;
        break;
    }
    case POOL_MSG_IMPORT_END:
        if (((const struct pool_import_end *)buf)->ok > 1)
            return -EPROTO;
        break;
    case POOL_MSG_READY: {
        const struct pool_ready *m = buf;
        if (m->serial == 0 || m->ok > 1)
            return -EPROTO;
        break;
    }
    case POOL_MSG_PREFIX_PUBLISH: {
        const struct pool_prefix_publish *m = buf;
        if (m->total < 1 || m->total > POOL_REGIONS_MAX || m->n < 1 || m->n > POOL_BATCH_MAX ||
            m->off >= m->total || m->n > m->total - m->off || m->last > 1 ||
            (m->last && m->off + m->n != m->total))
            return -EPROTO;
        break;
    }
    case POOL_MSG_PREFIX_LOOKUP:
    case POOL_MSG_PREFIX_ATTACH: {
        const struct pool_prefix_keys *m = buf;
        if (m->n < 1 || m->n > POOL_PREFIX_KEYS)
            return -EPROTO;
        break;
    }
    case POOL_MSG_PREFIX_FOUND: {
        const struct pool_prefix_found *m = buf;
        if (m->found > POOL_PREFIX_KEYS || m->total > POOL_PREFIX_KEYS * POOL_REGIONS_MAX)
            return -EPROTO;
        break;
    }
    case POOL_MSG_PREFIX_DROP: {
        const struct pool_prefix_drop *m = buf;
        if (m->scope > POOL_DROP_ALL || (m->scope == POOL_DROP_KEYS &&
                                          (m->n < 1 || m->n > POOL_PREFIX_KEYS)))
            return -EPROTO;
        break;
    }
    default:
        break;
    }
    *type = h.type;
    return 0;
}

int pool_proto_send(int sock, const void *msg, const int *fds, int nfds, int flags)
{
    struct pool_hdr h;
    memcpy(&h, msg, sizeof h);
    KVVM_ASSERT(h.size == pool_proto_size(h.type) && nfds >= 0 && nfds <= POOL_BATCH_MAX);
    union {
        char buf[CMSG_SPACE(sizeof(int) * POOL_BATCH_MAX)];
        struct cmsghdr align;
    } c;
    struct iovec io = { (void *)msg, h.size };
    struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1 };
    if (nfds > 0) {
        memset(c.buf, 0, sizeof c.buf);
        m.msg_control = c.buf;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n;
    while ((n = sendmsg(sock, &m, MSG_NOSIGNAL | flags)) < 0 && errno == EINTR)
        ;
    if (n < 0)
        return -errno;
    return n == (ssize_t)h.size ? 0 : -EIO;
}

long pool_proto_recv(int sock, void *buf, size_t cap, int *fds, int max_fds, int *nfds,
                     int flags)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * (POOL_BATCH_MAX + 1))];
        struct cmsghdr align;
    } c;
    struct iovec io = { buf, cap };
    struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = c.buf,
                        .msg_controllen = sizeof c.buf };
    *nfds = 0;
    bool excess = false;
    ssize_t n;
    while ((n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | flags)) < 0 && errno == EINTR)
        ;
    if (n < 0)
        return -errno;
    /* every descriptor received is the caller's or closed here, whatever else is wrong */
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            if (*nfds < max_fds)
                fds[(*nfds)++] = fd;
            else {
                close(fd);
                excess = true;
            }
        }
    }
    if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || excess)
        return -EMSGSIZE;
    return (long)n;
}

int pool_parse_bytes(const char *s, size_t *out)
{
    return kparse_size(s, out);
}
