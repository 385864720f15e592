/*
 * tools/kvvm-bench/spawn.c: helper processes (bench.h, "helper processes"): this binary
 * again, by fork and exec, with its argument in shared memory.
 *
 * Why not a bare fork: the CUDA driver refuses a child forked from a process that used it
 * (cuInit: CUDA_ERROR_NOT_INITIALIZED), and so does the emulated device, whose locks and
 * threads are the parent's. A group runs after other groups (or the --backend probe) opened
 * contexts here, so its helpers must start from an exec. The shared memory is a memfd, which
 * survives the exec as a descriptor the helper maps.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

int bench_shm_new(struct bench_shm *s, size_t len)
{
    *s = (struct bench_shm){ .fd = memfd_create("kvvm-bench-helper", MFD_CLOEXEC) };
    if (s->fd < 0)
        return -errno;
    if (ftruncate(s->fd, (off_t)len) != 0) {
        int e = -errno;
        close(s->fd);
        return e;
    }
    s->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->p == MAP_FAILED) {
        int e = -errno;
        close(s->fd);
        return e;
    }
    s->len = len;
    return 0;
}

void bench_shm_free(struct bench_shm *s)
{
    if (s->p)
        munmap(s->p, s->len);
    if (s->fd >= 0)
        close(s->fd);
    *s = (struct bench_shm){ .fd = -1 };
}

static int put_str(char *dst, size_t cap, const char **field)
{
    if (!*field)
        return 0;
    if (strlen(*field) >= cap)
        return -ENAMETOOLONG;
    strcpy(dst, *field);
    *field = NULL;
    return 0;
}

int bench_wire_put(struct bench_wire *w, const struct kvvm_config *c)
{
    memset(w, 0, sizeof *w);
    w->c = *c;
    int rc = put_str(w->spill_dir, sizeof w->spill_dir, &w->c.spill_dir);
    if (!rc)
        rc = put_str(w->store_url, sizeof w->store_url, &w->c.store_url);
    if (!rc)
        rc = put_str(w->pool_socket, sizeof w->pool_socket, &w->c.pool_socket);
    if (!rc)
        rc = put_str(w->client_name, sizeof w->client_name, &w->c.client_name);
    return rc;
}

void bench_wire_get(const struct bench_wire *w, struct kvvm_config *c)
{
    *c = w->c;
    c->spill_dir = w->spill_dir[0] ? w->spill_dir : NULL;
    c->store_url = w->store_url[0] ? w->store_url : NULL;
    c->pool_socket = w->pool_socket[0] ? w->pool_socket : NULL;
    c->client_name = w->client_name[0] ? w->client_name : NULL;
}

/* The roles (a group left out has none: they are weak). */
static bench_role_fn role_fn(const char *role)
{
    const struct { const char *name; bench_role_fn fn; } table[] = {
        { "handoff-b", bench_handoff_b },       { "handoff-sys", bench_handoff_sys },
        { "handoff-xsys", bench_handoff_xsys }, { "share-sys", bench_share_sys },
        { "calls", bench_calls_traced },        { "pool-a", bench_pool_a },
        { "pool-sys", bench_pool_sys },
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (!strcmp(table[i].name, role))
            return table[i].fn;
    return NULL;
}

/* In the forked child: keeps arg's and fds' descriptors across the exec and becomes the
   helper. Never returns (status ENOEXEC: the exec failed). */
void bench_helper_exec(const char *role, const struct bench_shm *arg, const int *fds,
                       int n_fds)
{
    char self[4096], num[1 + BENCH_HELPER_FDS][16];
    char *av[4 + BENCH_HELPER_FDS + 1] = { "kvvm-bench", "--helper", (char *)role };
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || n_fds < 0 || n_fds > BENCH_HELPER_FDS)
        _exit(ENOEXEC);
    self[n] = 0;
    int k = 3;
    for (int i = -1; i < n_fds; i++) {
        int fd = i < 0 ? arg->fd : fds[i];
        if (fcntl(fd, F_SETFD, 0) != 0)
            _exit(ENOEXEC);
        snprintf(num[i + 1], sizeof num[i + 1], "%d", fd);
        av[k++] = num[i + 1];
    }
    av[k] = NULL;
    execv(self, av);
    _exit(ENOEXEC);
}

int bench_helper_start(const char *role, const struct bench_shm *arg, const int *fds,
                       int n_fds, pid_t *pid)
{
    fflush(NULL);                       /* nothing buffered is written twice */
    pid_t p = fork();
    if (p < 0)
        return -errno;
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* a bench that dies takes its helpers along */
        bench_helper_exec(role, arg, fds, n_fds);
    }
    *pid = p;
    return 0;
}

int bench_helper_piped(const char *role, const struct bench_shm *arg, pid_t *pid, int *to,
                       int *from)
{
    int req[2], ans[2];
    if (pipe2(req, O_CLOEXEC))
        return -errno;
    if (pipe2(ans, O_CLOEXEC)) {
        int e = -errno;
        close(req[0]);
        close(req[1]);
        return e;
    }
    int rc = bench_helper_start(role, arg, (int[]){ req[0], ans[1] }, 2, pid);
    close(req[0]);
    close(ans[1]);
    if (rc) {
        close(req[1]);
        close(ans[0]);
        return rc;
    }
    *to = req[1];
    *from = ans[0];
    return 0;
}

int bench_helper_main(int argc, char **argv)
{
    bench_role_fn fn = argc >= 4 && argc <= 4 + BENCH_HELPER_FDS ? role_fn(argv[2]) : NULL;
    if (!fn) {
        fprintf(stderr, "kvvm-bench --helper: not a helper's command line (the groups start "
                "helpers themselves)\n");
        return 2;
    }
    int shm = atoi(argv[3]), fds[BENCH_HELPER_FDS], n_fds = argc - 4;
    for (int i = 0; i < n_fds; i++)
        fds[i] = atoi(argv[4 + i]);
    struct stat st;
    void *arg = MAP_FAILED;
    if (fstat(shm, &st) == 0 && st.st_size > 0)
        arg = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
    if (arg == MAP_FAILED) {
        fprintf(stderr, "kvvm-bench --helper %s: its argument could not be mapped\n", argv[2]);
        return EBADF;
    }
    close(shm);
    int rc = fn(arg, fds, n_fds);
    return rc ? (rc < 0 ? -rc : rc) & 0xff : 0;
}
