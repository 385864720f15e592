/*
 * tests/tsan_takeback.c: the pool's take-back under ThreadSanitizer (a plain program:
 * Criterion cannot start there; scripts/test.sh runs it in its TSan stage). It starts a
 * kvvmd (argv[1]) on a socket in a mkdtemp directory, opens two pool clients in this
 * process: A fills the pool with CACHED sequences and one LIVE one, B's grows (a thread of
 * its own) need A's frames, so A's connection thread serves the daemon's asks (under A's
 * context lock, releasing frames through the connection's mutex) while A's own thread
 * reads its LIVE bytes and steps, and B's engine thread waits on its lease. Rounds repeat
 * with B freeing and trimming. Exit 0: every byte right and no report (halt_on_error).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "kvvm.h"

#define PAGE (64u * 1024u)
#define BPT 4096u
#define TPP (PAGE / BPT)

static char path[128];

static void cfg(struct kvvm_config *c, const char *name)
{
    kvvm_config_init(c);
    c->backend = KVVM_BACKEND_AUTO;
    c->pool_socket = path;
    c->client_name = name;
    c->page_size = 0;
    c->n_regions = 1;
    c->bytes_per_token = BPT;
    c->max_seqs = 8;
    c->max_tokens = 16 * TPP;
    c->device_budget = 0;
    c->host_budget = 0;
    c->emu_opaque = 1;
    c->pool_timeout_ms = 60000;
}

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "tsan_takeback: %s failed (line %d): %s\n", \
                                          #x, __LINE__, kvvm_last_error()); exit(1); } } while (0)

static volatile int stop;

static void *a_reader(void *arg)
{
    kvvm *a = arg;
    unsigned char r[BPT];
    kvvm_seq live = 0;
    CHECK(kvvm_seq_create(a, &live) == 0);
    CHECK(kvvm_seq_grow(a, live, TPP) == 0);
    unsigned char w[BPT];
    memset(w, 0x4d, sizeof w);
    CHECK(kvvm_seq_write(a, live, 0, 0, w, sizeof w) == 0);
    while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
        CHECK(kvvm_seq_read(a, live, 0, 0, r, sizeof r) == 0);
        CHECK(memcmp(r, w, sizeof r) == 0);
        CHECK(kvvm_step(a) == 0);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: tsan_takeback KVVMD\n");
        return 2;
    }
    char dir[] = "/tmp/kvvmtsan.XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof path, "%s/sock", dir);
    int po[2];
    if (pipe2(po, O_CLOEXEC))
        return 1;
    pid_t d = fork();
    if (d == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(po[1], 1);
        execl(argv[1], argv[1], "--socket", path, "--backend", "emulated",
              "--emu-device-bytes", "64M", "--emu-granule", "64K", "--budget", "1M",
              (char *)NULL);
        _exit(127);
    }
    close(po[1]);
    char line[256];
    ssize_t n = read(po[0], line, sizeof line - 1);   /* the ready line */
    if (n <= 0)
        return 1;
    struct kvvm_config c;
    kvvm *a = NULL, *b = NULL;
    cfg(&c, "A");
    CHECK(kvvm_open(&c, &a) == 0);
    cfg(&c, "B");
    CHECK(kvvm_open(&c, &b) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, a_reader, a) == 0);
    unsigned char w[BPT], r[BPT];
    memset(w, 0x62, sizeof w);
    for (int round = 0; round < 20; round++) {
        kvvm_seq cs[3];
        for (int i = 0; i < 3; i++) {       /* A's cache fills the pool again */
            CHECK(kvvm_seq_create(a, &cs[i]) == 0);
            int rc = kvvm_seq_grow(a, cs[i], 4 * TPP);
            CHECK(rc == 0 || rc == -ENOMEM);
            CHECK(kvvm_seq_set_class(a, cs[i], KVVM_SEQ_CACHED) == 0);
        }
        CHECK(kvvm_step(a) == 0);
        CHECK(kvvm_sync(a) == 0);           /* synchronous mode: only quiet victims move */
        kvvm_seq s;
        CHECK(kvvm_seq_create(b, &s) == 0);
        CHECK(kvvm_seq_grow(b, s, 8 * TPP) == 0);
        CHECK(kvvm_seq_write(b, s, 0, 0, w, sizeof w) == 0);
        CHECK(kvvm_seq_read(b, s, 0, 0, r, sizeof r) == 0);
        CHECK(memcmp(w, r, sizeof r) == 0);
        CHECK(kvvm_seq_free(b, s) == 0);
        CHECK(kvvm_trim(b, 0) == 0);
        for (int i = 0; i < 3; i++)
            CHECK(kvvm_seq_free(a, cs[i]) == 0);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    struct kvvm_stats st = { .size = sizeof st };
    CHECK(kvvm_stats(b, &st) == 0);
    CHECK(st.pool_waits > 0);
    kvvm_close(b);
    kvvm_close(a);
    kill(d, SIGTERM);
    int ws;
    waitpid(d, &ws, 0);
    rmdir(dir);
    printf("tsan_takeback: 20 rounds, B waited %llu times, %.3f ms in all\n",
           (unsigned long long)st.pool_waits, (double)st.pool_wait_ns / 1e6);
    return WIFEXITED(ws) && WEXITSTATUS(ws) == 0 ? 0 : 1;
}
