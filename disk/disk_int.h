/*
 * disk/disk_int.h: what the disk tier's own files share (the layer's contract is disk.h).
 *
 * Contract:
 *  - Included only by the files of disk/. It defines struct disk and the internal calls
 *    between those files; nothing here is part of the layer's interface.
 *  - Files: disk.c (open, close, submit, reap, wait, queries, stats, test hooks),
 *    checksum.c (disk_checksum), disk_file.c (the spill file: directory checks, O_TMPFILE,
 *    direct-I/O alignment, preallocation; and the slot allocator), sched.c (the engine
 *    thread's scheduler: splitting pages into I/Os, retries, short transfers, faults,
 *    completion), engine_psync.c and engine_uring.c (how one I/O is issued and reaped).
 *    liburing.h is included by engine_uring.c alone: the ring lives behind dk->ur.
 *  - Locks: dk->lock protects slot info, cluster counts, pending, done, inflight, faults and
 *    the stop flag; dk->work_cv signals new work (psync), dk->idle_cv that nothing is in
 *    flight any more (disk_wait_all; signalled only then, so waiters are not woken per
 *    page). The run queue, retry list and I/O slots belong to the engine thread alone (no
 *    lock). Stats are atomics (STAT_ADD). Functions named *_locked need dk->lock held.
 */
#ifndef KVVM_DISK_DISK_INT_H
#define KVVM_DISK_DISK_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "disk.h"

#define DISK_DEFAULT_QD      32
#define DISK_DEFAULT_CLUSTER 16
#define DISK_MAX_FAULTS      16

/* One page request, from disk_submit until its completion is delivered. */
struct disk_page {
    struct disk_req req;
    uint64_t sum;                /* write: checksum of the bytes, computed before the I/O */
    uint32_t ios_next;           /* next I/O index to start (engine thread) */
    uint32_t ios_left;           /* I/Os not yet finished (engine thread) */
    int status;                  /* first error, 0 so far */
    struct disk_page *next;     /* pending / run queue / done list link */
};

/* One I/O of at most io_size bytes of a page; qd of them exist (engine thread). */
struct disk_io {
    struct disk_page *pr;
    uint64_t off;                /* file offset of what is left to transfer */
    char    *buf;
    size_t   len;                /* bytes left */
    int      retries;
    int      inject;             /* injected result for the current issue (0 = none) */
    struct disk_io *next;       /* free / retry list link */
};

struct slot_info {
    uint64_t sum;                /* checksum of the last successful write */
    uint64_t page;               /* page id of that write */
    uint8_t  used;               /* allocated */
    uint8_t  busy;               /* a request on it is queued or in flight */
    uint8_t  valid;              /* sum/page describe the bytes on disk */
};

struct disk_fault {
    unsigned long at;            /* submission number it fires on */
    int kind, err;
};

struct disk_uring;               /* engine_uring.c */

/* The FIFOs of struct disk (pending, done, run: pages; retry: I/Os) are a head and a tail
   linked through ->next: DISK_FIFO_PUSH appends x, DISK_FIFO_DROP unlinks the head (the
   caller has read it). The arguments are plain lvalues, evaluated more than once. */
#define DISK_FIFO_PUSH(head, tail, x)                                              \
    do {                                                                            \
        (x)->next = NULL;                                                           \
        if (tail)                                                                   \
            (tail)->next = (x);                                                     \
        else                                                                        \
            (head) = (x);                                                           \
        (tail) = (x);                                                               \
    } while (0)
#define DISK_FIFO_DROP(head, tail)                                                 \
    do {                                                                            \
        (head) = (head)->next;                                                      \
        if (!(head))                                                                \
            (tail) = NULL;                                                          \
    } while (0)

struct disk {
    /* fixed after open */
    int fd;
    size_t page_size, io_size;
    uint32_t n_slots, cluster, n_clusters;
    size_t dio_mem_align, dio_off_align;
    int direct;
    unsigned qd;
    enum disk_engine engine;
    disk_complete_fn on_complete;
    void *on_complete_arg;
    char *buf_base;              /* buffer range to register (the host arena) */
    size_t buf_bytes;
    int bufs_registered;         /* io_uring: the range is registered as fixed buffers */
    struct disk_uring *ur;       /* io_uring engine state, or NULL */
    pthread_t thread;
    int thread_up;

    pthread_mutex_t lock;
    pthread_cond_t work_cv;      /* new work (psync engine) */
    pthread_cond_t idle_cv;      /* inflight dropped to 0 */
    struct slot_info *slots;     /* [n_slots] */
    uint32_t *cl_free;           /* [n_clusters] free slots per cluster */
    uint32_t n_free;
    uint32_t cur_cl;             /* allocator's current cluster */
    uint32_t cl_cursor;          /* where the search for a free cluster resumes */
    struct disk_page *pending_head, *pending_tail;
    struct disk_page *done_head, *done_tail;
    uint64_t inflight;           /* pages submitted and not yet delivered */
    int stop;
    struct disk_fault faults[DISK_MAX_FAULTS];
    int n_faults;

    /* engine thread only */
    struct disk_page *run_head, *run_tail;
    struct disk_io *io_free, *retry_head, *retry_tail;
    struct disk_io *ios;        /* [qd] */
    unsigned ios_busy;

    /* stats (atomic) */
    uint64_t st_writes, st_reads, st_bytes_w, st_bytes_r, st_failed, st_io_errors,
             st_csum, st_retries, st_short, st_subs;
};

#define STAT_ADD(dk, f, n) __atomic_fetch_add(&(dk)->f, (n), __ATOMIC_RELAXED)

/* --- disk_file.c ---------------------------------------------------------------------------- */
/* Refuses a RAM-backed directory unless DISK_F_ALLOW_TMPFS. 0, -EINVAL (logged), or the
   statfs errno (logged). */
int  disk_dir_check(const struct disk_params *p);
/* Creates dk->fd (unnamed, O_DIRECT or, opted in, buffered), sets the alignment, checks
   page_size/io_size against it and preallocates n_slots slots. 0 or -errno (logged), the
   file closed then. */
int  disk_file_create(struct disk *dk, const struct disk_params *p);
/* Fills the cluster free counts of a fresh slot table. */
void disk_slots_init(struct disk *dk);

/* --- sched.c (engine thread) ----------------------------------------------------------- */
/* Moves newly submitted pages to the run queue. Returns the stop flag. */
int  disk_take_pending(struct disk *dk);
/* The next I/O to issue (a retry first, then the next piece of the head page), or NULL. */
struct disk_io *disk_next_io(struct disk *dk);
/* Counts the submission, applies an armed fault: returns the length to issue and sets
   io->inject for an injected error. */
size_t disk_fault_check(struct disk *dk, struct disk_io *io);
/* One I/O's completion (res: bytes or -errno). */
void disk_io_complete(struct disk *dk, struct disk_io *io, int res);
/* Nothing queued, retried or in flight on the engine thread. */
int  disk_engine_idle(const struct disk *dk);
/* Wakes the engine thread for new work or stop (any thread). */
void disk_engine_kick(struct disk *dk);

/* --- engine_psync.c -------------------------------------------------------------------- */
void *disk_psync_thread(void *arg);
void  disk_psync_kick(struct disk *dk);

/* --- engine_uring.c -------------------------------------------------------------------- */
/* Sets up the ring, registers the file and buffers (dk->ur, dk->bufs_registered). 0 or
   -errno (nothing left set up then). */
int   disk_uring_setup(struct disk *dk, const struct disk_params *p);
void  disk_uring_teardown(struct disk *dk);   /* after the thread is joined; NULL ur ok */
void *disk_uring_thread(void *arg);
void  disk_uring_kick(struct disk *dk);

#endif
