/*
 * disk/engine_psync.c: the psync engine (contract in disk.h): pread/pwrite on the engine
 * thread itself, one I/O at a time; a condition variable (dk->work_cv) wakes it.
 */
#include <errno.h>
#include <unistd.h>

#include "disk_int.h"

static void psync_issue(struct disk *dk, struct disk_io *io)
{
    size_t len = disk_fault_check(dk, io);
    ssize_t r;
    if (io->inject) {
        r = io->inject;
    } else {
        if (io->pr->req.op == DISK_WRITE)
            r = pwrite(dk->fd, io->buf, len, (off_t)io->off);
        else
            r = pread(dk->fd, io->buf, len, (off_t)io->off);
        if (r < 0)
            r = -errno;
    }
    disk_io_complete(dk, io, (int)r);
}

void *disk_psync_thread(void *arg)
{
    struct disk *dk = arg;
    for (;;) {
        int stop = disk_take_pending(dk);
        struct disk_io *io = disk_next_io(dk);
        if (!io) {
            pthread_mutex_lock(&dk->lock);
            if (!dk->pending_head && disk_engine_idle(dk)) {
                if (stop || dk->stop) {
                    pthread_mutex_unlock(&dk->lock);
                    break;
                }
                pthread_cond_wait(&dk->work_cv, &dk->lock);
            }
            pthread_mutex_unlock(&dk->lock);
            continue;
        }
        psync_issue(dk, io);
    }
    return NULL;
}

void disk_psync_kick(struct disk *dk)
{
    pthread_mutex_lock(&dk->lock);
    pthread_cond_signal(&dk->work_cv);
    pthread_mutex_unlock(&dk->lock);
}
