/*
 * disk/disk_file.c: the spill file and its slots (contract in disk.h).
 *
 *  - File: opened unnamed (O_TMPFILE, else create + unlink at once), O_DIRECT (buffered only
 *    when opted in), fallocated to the slot count. Slot i lives at byte i * page_size. A
 *    RAM-backed directory is refused before anything is created.
 *  - Slots: a per-slot info array (allocated, busy, checksum) and a free count per cluster of
 *    cluster_pages slots. Allocation tries: after the hint, the current cluster, a wholly
 *    free cluster, then any cluster with room (after Linux's swap cluster allocator: a
 *    sequence's pages stay close, and concurrent streams do not interleave within a cluster).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"
#include "disk_int.h"

#ifndef RAMFS_MAGIC
#define RAMFS_MAGIC 0x858458f6
#endif
#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif

/* Opens an unnamed file in dir: O_TMPFILE, else create + unlink at once. 0 or -errno. */
static int disk_open_file(const char *dir, int direct, int no_tmpfile, int *fd_out)
{
    int flags = O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0);
    int fd = no_tmpfile ? -1 : open(dir, flags | O_TMPFILE, 0600);
    if (fd >= 0) {
        *fd_out = fd;
        return 0;
    }
    int e = no_tmpfile ? EOPNOTSUPP : errno;
    if (e != EOPNOTSUPP && e != EISDIR && e != EINVAL)
        return -e;
    /* No O_TMPFILE here (or O_DIRECT refused; the named open below tells which). */
    static unsigned long counter;
    char path[4096];
    for (int tries = 0; tries < 16; tries++) {
        unsigned long c = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        int n = snprintf(path, sizeof(path), "%s/.kvvm-spill-%d-%lu-%llx", dir, (int)getpid(),
                         c, (unsigned long long)know_ns());
        if (n < 0 || (size_t)n >= sizeof(path))
            return -ENAMETOOLONG;
        fd = open(path, flags | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            if (unlink(path) != 0) {
                e = errno;
                close(fd);
                return -e;
            }
            klog_info("spill: %s has no O_TMPFILE; created and unlinked a file instead", dir);
            *fd_out = fd;
            return 0;
        }
        if (errno != EEXIST)
            return -errno;
    }
    return -EEXIST;
}

static size_t disk_sysfs_lbs(unsigned maj, unsigned min)
{
    static const char *const fmts[] = { "/sys/dev/block/%u:%u/queue/logical_block_size",
                                        "/sys/dev/block/%u:%u/../queue/logical_block_size" };
    for (size_t i = 0; i < 2; i++) {
        char path[128];
        snprintf(path, sizeof(path), fmts[i], maj, min);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        unsigned long v = 0;
        int ok = fscanf(f, "%lu", &v) == 1;
        fclose(f);
        if (ok && v)
            return v;
    }
    return 0;
}

/* Direct-I/O alignment: statx(STATX_DIOALIGN), else the device's logical block size, else
   4096. */
static void disk_dio_alignment(struct disk *dk)
{
    struct statx stx;
    memset(&stx, 0, sizeof(stx));
    if (statx(dk->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN | STATX_BASIC_STATS, &stx) == 0 &&
        (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align) {
        dk->dio_off_align = stx.stx_dio_offset_align;
        dk->dio_mem_align = stx.stx_dio_mem_align ? stx.stx_dio_mem_align : 1;
        klog_debug("spill: direct-I/O alignment from statx: offset %zu, memory %zu",
                   dk->dio_off_align, dk->dio_mem_align);
        return;
    }
    size_t lbs = 0;
    struct stat st;
    if (fstat(dk->fd, &st) == 0) {
        char dev[64];
        snprintf(dev, sizeof(dev), "/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
        int bfd = open(dev, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (bfd >= 0) {
            int v = 0;
            if (ioctl(bfd, BLKSSZGET, &v) == 0 && v > 0)
                lbs = (size_t)v;
            close(bfd);
        }
        if (!lbs)
            lbs = disk_sysfs_lbs(major(st.st_dev), minor(st.st_dev));
    }
    if (!lbs)
        lbs = 4096;
    dk->dio_off_align = lbs;
    dk->dio_mem_align = lbs;
    klog_debug("spill: statx reports no direct-I/O alignment; using %zu bytes", lbs);
}

int disk_dir_check(const struct disk_params *p)
{
    struct statfs sfs;
    if (statfs(p->dir, &sfs) != 0) {
        int err = -errno;
        klog_error("spill: spill directory %s: %s", p->dir, strerror(-err));
        return err;
    }
    if ((sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC) &&
        !(p->flags & DISK_F_ALLOW_TMPFS)) {
        klog_error("spill: spill directory %s is RAM-backed (%s): spilling there would take "
                   "memory, not free it. Use a directory on a local disk (e.g. /var/tmp), or "
                   "opt in with the flag KVVM_F_SPILL_ALLOW_TMPFS (environment: "
                   "KVVM_SPILL_ALLOW_TMPFS=1 or KVVM_FLAGS=spill_allow_tmpfs)", p->dir,
                   sfs.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs");
        return -EINVAL;
    }
    /* a budget the file system cannot hold is -ENOSPC (docs/api.md), before any other limit
       on it (the slot count) can call it invalid */
    unsigned long long unit = sfs.f_frsize ? (unsigned long long)sfs.f_frsize
                                           : (unsigned long long)sfs.f_bsize;
    unsigned long long avail = (unsigned long long)sfs.f_bavail * unit;
    if (p->budget > avail) {
        klog_error("spill: spill_budget %zu bytes is more than the %llu bytes free in %s's "
                   "file system: lower spill_budget (KVVM_SPILL_BUDGET) or free space",
                   p->budget, avail, p->dir);
        return -ENOSPC;
    }
    return 0;
}

/* Opens dk->fd: O_DIRECT, else (opted in) buffered. 0 or -errno (logged). */
static int disk_file_open(struct disk *dk, const struct disk_params *p)
{
    dk->direct = 1;
    int no_tmpfile = !!(p->flags & DISK_F_TEST_NO_TMPFILE);
    int err = disk_open_file(p->dir, 1, no_tmpfile, &dk->fd);
    if (err == -EINVAL) {
        int fd2 = -1;
        if (disk_open_file(p->dir, 0, no_tmpfile, &fd2) == 0) {
            if (!(p->flags & DISK_F_BUFFERED)) {
                close(fd2);
                klog_error("spill: %s refuses O_DIRECT; refusing to spill through the page "
                           "cache unless buffered mode is opted in with the flag "
                           "KVVM_F_SPILL_BUFFERED (environment: KVVM_FLAGS=spill_buffered)",
                           p->dir);
                return -EINVAL;
            }
            klog_warn("spill: %s refuses O_DIRECT; spilling through the page cache "
                      "(buffered mode, opted in)", p->dir);
            dk->fd = fd2;
            dk->direct = 0;
            err = 0;
        }
    }
    if (err)
        klog_error("spill: cannot create the spill file in %s: %s", p->dir, strerror(-err));
    return err;
}

int disk_file_create(struct disk *dk, const struct disk_params *p)
{
    int err = disk_file_open(dk, p);
    if (err)
        return err;
    if (dk->direct) {
        disk_dio_alignment(dk);
    } else {
        dk->dio_off_align = 1;
        dk->dio_mem_align = 1;
    }
    if (dk->page_size % dk->dio_off_align || dk->io_size % dk->dio_off_align) {
        klog_error("spill: page_size %zu / io_size %zu not multiples of the direct-I/O "
                   "alignment %zu of %s", dk->page_size, dk->io_size, dk->dio_off_align,
                   p->dir);
        err = -EINVAL;
        goto out_close;
    }
    off_t fbytes = (off_t)((size_t)dk->n_slots * dk->page_size);
    if (fallocate(dk->fd, 0, 0, fbytes) != 0) {
        err = -errno;
        if (err != -EOPNOTSUPP) {
            klog_error("spill: cannot reserve %lld bytes in %s: %s", (long long)fbytes,
                       p->dir, strerror(-err));
            goto out_close;
        }
        klog_info("spill: %s cannot preallocate; the file is sparse", p->dir);
        if (ftruncate(dk->fd, fbytes) != 0) {
            err = -errno;
            goto out_close;
        }
    }
    return 0;

out_close:
    close(dk->fd);
    dk->fd = -1;
    return err;
}

/* ---- slots ---------------------------------------------------------------------------- */

/* Takes slot i (free). Caller holds the lock. */
static void slot_take_locked(struct disk *dk, uint32_t i)
{
    KVVM_ASSERT(i < dk->n_slots && !dk->slots[i].used && !dk->slots[i].busy);
    dk->slots[i].used = 1;
    dk->slots[i].valid = 0;
    KVVM_ASSERT(dk->cl_free[i / dk->cluster] > 0 && dk->n_free > 0);
    dk->cl_free[i / dk->cluster]--;
    dk->n_free--;
}

static uint32_t cluster_end(const struct disk *dk, uint32_t c)
{
    uint64_t e = (uint64_t)(c + 1) * dk->cluster;
    return e > dk->n_slots ? dk->n_slots : (uint32_t)e;
}

static uint32_t cluster_size(const struct disk *dk, uint32_t c)
{
    return cluster_end(dk, c) - c * dk->cluster;
}

void disk_slots_init(struct disk *dk)
{
    for (uint32_t c = 0; c < dk->n_clusters; c++)
        dk->cl_free[c] = cluster_size(dk, c);
    dk->n_free = dk->n_slots;
}

/* First free slot in [from, cluster c's end), or UINT32_MAX. */
static uint32_t cluster_scan(const struct disk *dk, uint32_t c, uint32_t from)
{
    if (dk->cl_free[c] == 0)
        return UINT32_MAX;
    uint32_t start = c * dk->cluster;
    if (from < start)
        from = start;
    for (uint32_t i = from; i < cluster_end(dk, c); i++)
        if (!dk->slots[i].used)
            return i;
    return UINT32_MAX;
}

/* One slot, near hint when possible. Caller holds the lock and has checked n_free > 0. */
static uint32_t slot_alloc_one_locked(struct disk *dk, uint32_t hint)
{
    uint32_t i;
    if (hint < dk->n_slots) {
        uint32_t c = hint / dk->cluster;
        if ((i = cluster_scan(dk, c, hint + 1)) != UINT32_MAX)
            return i;
        /* Continue into the next cluster only if nobody else has started it. */
        if (c + 1 < dk->n_clusters && dk->cl_free[c + 1] == cluster_size(dk, c + 1)) {
            dk->cur_cl = c + 1;
            return (c + 1) * dk->cluster;
        }
    }
    if ((i = cluster_scan(dk, dk->cur_cl, 0)) != UINT32_MAX)
        return i;
    for (uint32_t k = 0; k < dk->n_clusters; k++) {
        uint32_t c = (dk->cl_cursor + k) % dk->n_clusters;
        if (dk->cl_free[c] == cluster_size(dk, c)) {
            dk->cur_cl = c;
            dk->cl_cursor = (c + 1) % dk->n_clusters;
            return c * dk->cluster;
        }
    }
    for (uint32_t k = 0; k < dk->n_clusters; k++) {
        uint32_t c = (dk->cl_cursor + k) % dk->n_clusters;
        if ((i = cluster_scan(dk, c, 0)) != UINT32_MAX) {
            dk->cur_cl = c;
            return i;
        }
    }
    return UINT32_MAX;   /* not reached when n_free > 0 */
}

int disk_slot_alloc(struct disk *dk, size_t n, disk_slot hint, disk_slot *out)
{
    if (!dk || !out || n == 0)
        return -EINVAL;
    pthread_mutex_lock(&dk->lock);
    if (n > dk->n_free) {
        pthread_mutex_unlock(&dk->lock);
        return -ENOMEM;
    }
    uint32_t h = hint.idx;
    for (size_t k = 0; k < n; k++) {
        uint32_t i = slot_alloc_one_locked(dk, h);
        slot_take_locked(dk, i);
        out[k].idx = i;
        h = i;
    }
    pthread_mutex_unlock(&dk->lock);
    return 0;
}

int disk_slot_free(struct disk *dk, disk_slot s)
{
    if (!dk)
        return -EINVAL;
    pthread_mutex_lock(&dk->lock);
    int err = 0;
    if (s.idx >= dk->n_slots || !dk->slots[s.idx].used) {
        err = -EINVAL;
    } else if (dk->slots[s.idx].busy) {
        err = -EBUSY;
    } else {
        dk->slots[s.idx].used = 0;
        dk->slots[s.idx].valid = 0;
        KVVM_ASSERT(dk->cl_free[s.idx / dk->cluster] < dk->cluster && dk->n_free < dk->n_slots);
        dk->cl_free[s.idx / dk->cluster]++;
        dk->n_free++;
    }
    pthread_mutex_unlock(&dk->lock);
    if (err == -EINVAL)
        klog_error("spill: free of slot %u that is not allocated", s.idx);
    return err;
}
