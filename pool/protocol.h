/*
 * pool/protocol.h: the pool daemon's protocol (kvvmd <-> clients and kvvmctl), one header:
 * message types, their sizes, the version. Design: docs/design.md "The pool daemon".
 *
 * Contract:
 *  - Transport: a Unix SOCK_SEQPACKET socket, so one message = one datagram: a message is
 *    exactly the size of its type's struct (sizes fixed per type, no lengths to trust), and
 *    frames travel as file descriptors (SCM_RIGHTS) attached to a FRAMES message only.
 *  - The daemon speaks unasked only with RECLAIM (a take-back: give frames back); every
 *    other daemon message answers the request just sent. A client reading a reply may find
 *    a RECLAIM before it (kept for its connection thread) and reads on.
 *  - Every message starts with struct pool_hdr: POOL_MAGIC, its type, its size. The first
 *    message of a connection is HELLO with POOL_PROTO_VERSION; a daemon that does not speak
 *    it answers REFUSED naming both versions, and a client refuses a WELCOME of another
 *    version the same way.
 *  - pool_proto_check is the one parser of received bytes (the daemon's and the client's):
 *    a message it refuses is malformed, and the daemon then drops that client (as if it had
 *    died), never itself.
 *  - Integers are host-endian (both ends run on one machine); strings are NUL-terminated
 *    within their arrays (checked).
 */
#ifndef KVVM_POOL_PROTOCOL_H
#define KVVM_POOL_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

/* 1: the pool (leases, take-back, limits); 2: sharing between clients (EXPORT..IMPORT_END,
   HANDOFF_DROP, PREFIX_*); 3: pending shares (EXPORT's and PREFIX_PUBLISH's serial, READY:
   a share is visible only once the publisher's device work before it completed); 4: held
   frames (FRAMES's held mask: a frame the client holds already comes without a descriptor
   and adds no count); 5: a LEASE's need (a call's whole shortfall asked of other clients in
   one take-back round, the surplus held for the asker until its deadline). Daemon and
   library ship together: a pair of two versions refuses
   with both named, rather than a version 1 daemon dropping a version 2 client as malformed
   at its first EXPORT. */
#define POOL_PROTO_VERSION 5u
#define POOL_MAGIC         0x4b56504cu    /* "KVPL" */
#define POOL_NAME_MAX      64             /* a client's name, NUL included */
#define POOL_TEXT_MAX      192            /* a refusal's or result's message, NUL included */
#define POOL_BATCH_MAX     64             /* frames per LEASE, FRAMES and RETURN */
#define POOL_TOKEN_BYTES   32             /* a hand-off's token (all random: 256 bits) */
#define POOL_HANDOFF_MAX   (1u << 24)     /* frames of one hand-off at most */
#define POOL_KEY_BYTES     32             /* a prefix entry's key (kvvm_key) */
#define POOL_PREFIX_KEYS   64             /* keys per LOOKUP, ATTACH and DROP */
#define POOL_REGIONS_MAX   (1u << 16)     /* frames of one prefix entry at most (regions) */

enum pool_msg_type {
    POOL_MSG_HELLO = 1,     /* c -> d: the first message: version, role, name, reserve, limit */
    POOL_MSG_WELCOME,       /* d -> c: version, the pool's shape (page size, backend...) */
    POOL_MSG_REFUSED,       /* d -> c: HELLO refused (version, reserve); then closed */
    POOL_MSG_LEASE,         /* c -> d: n frames, please */
    POOL_MSG_FRAMES,        /* d -> c: frames: a lease's grant (ids; one descriptor each;
                               the pool's figures: a short grant says why), or an import's
                               or attach's frames (a descriptor each but the held ones) */
    POOL_MSG_RETURN,        /* c -> d: these frames are given back (unmapped, released) */
    POOL_MSG_INFO,          /* c -> d: the pool's figures, please */
    POOL_MSG_INFO_REPLY,    /* d -> c */
    POOL_MSG_CLIENTS,       /* control -> d: list the clients */
    POOL_MSG_CLIENT,        /* d -> control: one client; the list ends with END */
    POOL_MSG_END,           /* d -> control */
    POOL_MSG_LIMIT,         /* control -> d: set a client's limit */
    POOL_MSG_RESULT,        /* d -> control or client: 0 or -errno, and a message */
    POOL_MSG_SET_LIMIT,     /* c -> d: this client's own limit changed (kvvm_set_budget) */
    POOL_MSG_RECLAIM,       /* d -> c, UNASKED: give n frames back (a take-back, or a limit
                               below what it holds); the one message the daemon sends
                               without a request */
    POOL_MSG_RECLAIMED,     /* c -> d: the reclaim of ask seq is done (its frames went back
                               in RETURNs before this) */
    POOL_MSG_EXPORT,        /* c -> d: one chunk of a hand-off's frames (ids it leased or
                               maps); the last chunk makes the record, answered EXPORTED */
    POOL_MSG_EXPORTED,      /* d -> c: 0 and the token, or -errno and why */
    POOL_MSG_IMPORT,        /* c -> d: a token and the importer's layout */
    POOL_MSG_IMPORTED,      /* d -> c: 0, the length and the frame count (then that many
                               frames in FRAMES messages), or -errno and why */
    POOL_MSG_IMPORT_END,    /* c -> d: the import of a token took (ok 1: spent) or not (ok
                               0: the record is importable again; its frames were RETURNed) */
    POOL_MSG_HANDOFF_DROP,  /* c -> d: give up an unimported export; answered RESULT */
    POOL_MSG_PREFIX_PUBLISH,/* c -> d: one chunk of one shared prefix entry's frames (ids it
                               leased or maps); the call's last chunk is answered RESULT (err:
                               the new entries, >= 0) */
    POOL_MSG_PREFIX_LOOKUP, /* c -> d: keys: how many leading ones the index has; answered
                               PREFIX_FOUND */
    POOL_MSG_PREFIX_ATTACH, /* c -> d: keys: the leading ones' frames, mapped by the client;
                               answered PREFIX_FOUND, then the frames in FRAMES messages */
    POOL_MSG_PREFIX_FOUND,  /* d -> c */
    POOL_MSG_PREFIX_DROP,   /* c or control -> d: drop entries; answered RESULT (err: the
                               entries dropped, >= 0) */
    POOL_MSG_READY,         /* c -> d: the shares this client sent PENDING under serial are
                               complete (ok 1: visible from now) or never will be (ok 0:
                               dropped); answered RESULT (err: the shares it named, >= 0) */
    POOL_MSG_TYPES          /* one past the last type */
};

enum pool_role { POOL_ROLE_CLIENT = 1,   /* a context: leases frames, counted in n_clients */
                 POOL_ROLE_CONTROL = 2 };/* kvvmctl: reads and sets, leases nothing */

enum pool_backend { POOL_BACKEND_CUDA = 1, POOL_BACKEND_EMULATED = 2 };

struct pool_hdr {
    uint32_t magic;         /* POOL_MAGIC */
    uint16_t type;          /* enum pool_msg_type */
    uint16_t size;          /* bytes of the whole message: sizeof its type's struct */
};

struct pool_hello {
    struct pool_hdr h;
    uint32_t version;       /* POOL_PROTO_VERSION */
    uint32_t role;          /* enum pool_role */
    uint64_t reserve;       /* bytes never asked back (CLIENT) */
    uint64_t limit;         /* bytes it may hold; 0 = the whole pool (CLIENT) */
    uint64_t page_size;     /* the client's page size; 0 = the daemon's */
    char name[POOL_NAME_MAX];
};

struct pool_welcome {
    struct pool_hdr h;
    uint32_t version;
    uint32_t backend;       /* enum pool_backend */
    uint64_t page_size;     /* bytes of one frame */
    uint64_t granule;       /* the device's allocation granule */
    uint64_t pool_bytes;
    uint64_t emu_device_bytes; /* the emulated device's capacity (EMULATED) */
    uint64_t limit;         /* the limit the daemon applies to this client */
};

struct pool_refused {
    struct pool_hdr h;
    int32_t err;            /* -errno: -EPROTO version, -ENOSPC reserve, -EINVAL page size */
    uint32_t version;       /* the daemon's */
    char why[POOL_TEXT_MAX];
};

struct pool_lease {
    struct pool_hdr h;
    uint32_t n;             /* 1 .. POOL_BATCH_MAX */
    uint32_t wait_ms;       /* 0: what is free now (a lease ahead, off the engine's thread);
                               else a call needs a frame: when the pool is dry, the daemon
                               takes frames back from clients above their reserve and
                               answers within wait_ms */
    uint32_t need;          /* with wait_ms: the frames the call still needs, this lease's
                               n included (0 or below n: n). A take-back round asks others
                               for all of it at once; what it frees past n is held for this
                               client (its credit: other clients' leases do not take it)
                               until its next waiting lease, or until wait_ms from this
                               lease has passed */
    uint32_t pad;
};

struct pool_figures {       /* the pool as one client sees it */
    uint64_t pool_bytes, free_bytes, held_bytes, reserve_bytes, limit_bytes;
    uint64_t shared_entries, shared_bytes;
    uint32_t n_clients, pad;
};

/* Held frames (version 4). A client holds a frame when it leased it (and has not returned
   it) or maps it from an import or an attach (and has not given the mapping up): the daemon
   counts that once, however many of the client's sequences use the frame. An import's or
   attach's frame the client holds already is sent held: its id only, no descriptor, and no
   count taken (the client uses the handle it has: one more local use of it, its RETURN sent
   when its last local use goes). A frame appearing twice in one reply is held the second
   time. A held id the client does not hold is malformed (it drops the connection); a
   lease's grant holds none. */
struct pool_frames {
    struct pool_hdr h;
    uint32_t n;             /* frames: ids[0..n); a descriptor attached for each id not
                               held, in ids' order */
    int32_t err;            /* a lease's: 0: all asked; -ENOMEM: fewer (the pool is dry or
                               the limit reached: fig says which; a take-back found no more
                               to give); -ETIMEDOUT: fewer, the take-back did not end within
                               wait_ms */
    struct pool_figures fig;
    uint64_t ids[POOL_BATCH_MAX];
    uint64_t held;          /* bit i: ids[i] is held (above); no bit at or past n */
};
_Static_assert(POOL_BATCH_MAX <= 64, "FRAMES's held mask has a bit per id");

struct pool_return {
    struct pool_hdr h;
    uint32_t n;             /* 1 .. POOL_BATCH_MAX */
    uint32_t pad;
    uint64_t ids[POOL_BATCH_MAX];
};

struct pool_info { struct pool_hdr h; };
struct pool_info_reply { struct pool_hdr h; struct pool_figures fig; };
struct pool_clients { struct pool_hdr h; };
struct pool_end { struct pool_hdr h; };

struct pool_client_row {
    struct pool_hdr h;
    uint32_t pid;
    uint32_t pad;
    uint64_t held, reserve, limit, shared;
    char name[POOL_NAME_MAX];
};

struct pool_limit {
    struct pool_hdr h;
    uint64_t bytes;         /* 0 = the whole pool */
    char name[POOL_NAME_MAX];
};

struct pool_set_limit {
    struct pool_hdr h;
    uint64_t bytes;         /* 0 = the whole pool */
};

struct pool_result {
    struct pool_hdr h;
    int32_t err;
    uint32_t pad;
    char text[POOL_TEXT_MAX];
};

struct pool_reclaim {
    struct pool_hdr h;
    uint32_t seq;           /* the ask's number (RECLAIMED names it) */
    uint32_t n;             /* frames asked: 1 .. the client's frames above its reserve */
};

struct pool_reclaimed {
    struct pool_hdr h;
    uint32_t seq;           /* the ask answered (the latest one taken) */
    uint32_t given;         /* frames given back for it */
};

/* A sequence's layout, which an importer's must equal. */
struct pool_layout {
    uint32_t n_regions, pad;
    uint64_t bytes_per_token, page_size;
};

/* RETURN names frames the client leased or maps (from an import or an attach): either is
   given up, each once (the client sends it when its last local use of the frame goes). */

struct pool_export {
    struct pool_hdr h;
    uint32_t total;         /* frames of the hand-off: 1 .. POOL_HANDOFF_MAX */
    uint32_t off;           /* this chunk's first: the chunks come in order, from 0 */
    uint32_t n;             /* 1 .. POOL_BATCH_MAX, off + n <= total */
    uint32_t pad;
    uint64_t length;        /* tokens */
    uint64_t serial;        /* 0: complete now; else PENDING until READY names serial (an
                               IMPORT of it is then -EAGAIN) */
    struct pool_layout lay;
    uint64_t ids[POOL_BATCH_MAX];   /* region-major */
};

struct pool_exported {
    struct pool_hdr h;
    int32_t err;            /* 0; -ENOMEM no record; -ENOENT a frame it neither leased nor
                               maps; -EINVAL a bad chunk */
    uint32_t pad;
    uint8_t token[POOL_TOKEN_BYTES];
    char text[POOL_TEXT_MAX];
};

struct pool_import {
    struct pool_hdr h;
    struct pool_layout lay;
    uint8_t token[POOL_TOKEN_BYTES];
    uint32_t wait_ms;       /* a PENDING export: the answer waits this long for its READY
                               (0: -EAGAIN at once); then -EAGAIN, or -ENOENT if it was
                               dropped meanwhile */
    uint32_t pad;
};

struct pool_imported {
    struct pool_hdr h;
    int32_t err;            /* 0; -ENOENT unknown or spent; -EINVAL another layout */
    uint32_t total;         /* frames to follow (FRAMES messages of up to POOL_BATCH_MAX) */
    uint64_t length;
    char text[POOL_TEXT_MAX];
};

struct pool_import_end {
    struct pool_hdr h;
    uint32_t ok;            /* 1 spent; 0 the import failed here: importable again */
    uint32_t pad;
    uint8_t token[POOL_TOKEN_BYTES];
};

struct pool_handoff_drop {
    struct pool_hdr h;
    uint8_t token[POOL_TOKEN_BYTES];
};

/* The shared prefix index (pool/server_prefix.c). An entry is keyed by (layout, ns, key)
   and holds one frame per region. */
struct pool_prefix_publish {
    struct pool_hdr h;
    struct pool_layout lay;
    uint64_t ns;
    uint8_t key[POOL_KEY_BYTES];
    uint32_t total;         /* the entry's frames: lay.n_regions */
    uint32_t off;           /* this chunk's first: the chunks of one entry come in order */
    uint32_t n;             /* 1 .. POOL_BATCH_MAX, off + n <= total */
    uint32_t last;          /* 1: the call's last chunk (the entry's last too): answered */
    uint64_t serial;        /* 0: complete now; else PENDING (a miss for every lookup and
                               attach) until READY names serial */
    uint64_t ids[POOL_BATCH_MAX];   /* region order */
};

struct pool_prefix_keys {   /* LOOKUP and ATTACH */
    struct pool_hdr h;
    struct pool_layout lay;
    uint64_t ns;
    uint32_t n;             /* 1 .. POOL_PREFIX_KEYS */
    uint32_t pad;
    uint8_t keys[POOL_PREFIX_KEYS][POOL_KEY_BYTES];
};

struct pool_prefix_found {
    struct pool_hdr h;
    int32_t err;            /* 0; -ENOMEM (ATTACH: the daemon could not count the mappings) */
    uint32_t found;         /* leading keys present */
    uint32_t total;         /* ATTACH: frames to follow (found * n_regions) in FRAMES */
    uint32_t pad;
};

struct pool_prefix_drop {
    struct pool_hdr h;
    struct pool_layout lay; /* n_regions 0: every layout */
    uint64_t ns;
    uint32_t scope;         /* 0: keys[0..n) of ns; 1: every entry of ns; 2: every entry */
    uint32_t n;             /* scope 0: 1 .. POOL_PREFIX_KEYS */
    uint8_t keys[POOL_PREFIX_KEYS][POOL_KEY_BYTES];
};
enum { POOL_DROP_KEYS = 0, POOL_DROP_NS = 1, POOL_DROP_ALL = 2 };

/* PENDING and READY: a publisher sends its shares (an export, a publish's entries) at the
   call, before the device work that wrote their bytes is known complete, under a serial of
   its own (> 0, increasing); the daemon holds their frames but shows them to no one (an
   IMPORT of a pending export waits for its READY up to the import's wait_ms). Once
   that work completed (an event the publisher's library waits for off the engine's thread)
   READY ok 1 makes them visible; ok 0 (the wait failed) drops them. A client that goes
   before READY takes its pending shares with it: their bytes were never known complete. */
struct pool_ready {
    struct pool_hdr h;
    uint64_t serial;        /* > 0 */
    uint32_t ok;            /* 1 visible; 0 dropped */
    uint32_t pad;
};

/* The largest message (a receive buffer's size). */
#define POOL_MSG_MAX sizeof(struct pool_prefix_drop)

/* The size of a message of type t; 0 for an unknown type. */
size_t pool_proto_size(unsigned t);
/* Fills a header for type t (its size). */
void pool_proto_hdr(struct pool_hdr *h, unsigned t);
/* Checks received bytes: 0 and the type in *type, or -EPROTO (malformed: magic, type, size,
   a count out of range, an unterminated string, descriptors on a message that carries none,
   or a FRAMES with a held bit at or past n, or whose descriptors are not one per id not
   held). nfds: descriptors received with it. */
int pool_proto_check(const void *buf, size_t n, int nfds, unsigned *type);
/* One message over a SOCK_SEQPACKET socket (MSG_NOSIGNAL; flags: e.g. MSG_DONTWAIT), with
   nfds descriptors attached. 0; -errno. */
int pool_proto_send(int sock, const void *msg, const int *fds, int nfds, int flags);
/* One message: its bytes in buf (cap POOL_MSG_MAX) and up to max_fds descriptors (close-on-
   exec; any beyond are closed). Returns the bytes (> 0); 0 the peer closed; -errno
   (-EMSGSIZE: truncated, -EAGAIN with MSG_DONTWAIT). *nfds: descriptors received (the
   caller's, also on -EMSGSIZE). */
long pool_proto_recv(int sock, void *buf, size_t cap, int *fds, int max_fds, int *nfds,
                     int flags);

/* BYTES in kvvmd's and kvvmctl's options: a number with an optional K, M, G or T suffix
   (powers of 1024), as the KVVM_* variables are read. 0 or -EINVAL. */
int pool_parse_bytes(const char *s, size_t *out);

#endif
