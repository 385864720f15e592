/*
 * disk/engine_psync.c: the psync engine (contract in disk.h): pread/pwrite on the engine
 * thread itself, one I/O at a time; a condition variable (sp->work_cv) wakes it.
 */
#include <errno.h>
#include <unistd.h>

#include "disk_int.h"

static void psync_issue(struct spill *sp, struct spill_io *io)
{
    size_t len = disk_fault_check(sp, io);
    ssize_t r;
    if (io->inject) {
        r = io->inject;
    } else {
        if (io->pg->req.op == SPILL_WRITE)
            r = pwrite(sp->fd, io->buf, len, (off_t)io->off);
        else
            r = pread(sp->fd, io->buf, len, (off_t)io->off);
        if (r < 0)
            r = -errno;
    }
    disk_io_complete(sp, io, (int)r);
}

void *disk_psync_thread(void *arg)
{
    struct spill *sp = arg;
    for (;;) {
        int stop = disk_take_pending(sp);
        struct spill_io *io = disk_next_io(sp);
        if (!io) {
            pthread_mutex_lock(&sp->lock);
            if (!sp->pending_head && disk_engine_idle(sp)) {
                if (stop || sp->stop) {
                    pthread_mutex_unlock(&sp->lock);
                    break;
                }
                pthread_cond_wait(&sp->work_cv, &sp->lock);
            }
            pthread_mutex_unlock(&sp->lock);
            continue;
        }
        psync_issue(sp, io);
    }
    return NULL;
}

void disk_psync_kick(struct spill *sp)
{
    pthread_mutex_lock(&sp->lock);
    pthread_cond_signal(&sp->work_cv);
    pthread_mutex_unlock(&sp->lock);
}
