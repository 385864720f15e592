/*
 * tests/metrics_print.c: prints kvvm_metrics of an emulated context after a few operations
 * (writes past the device budget: direct reclaim and swaps; a published prefix and its
 * lookup), for tests/metrics_promtool.sh (promtool check metrics). Public API only.
 * Exit 0, or 1 with the failed call on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvvm.h"

#define PS 4096u
#define BPT 256u
#define T (PS / BPT)

#define CHK(call) do { int rc_ = (call); if (rc_ < 0) { \
    fprintf(stderr, "metrics_print: %s: %d (%s)\n", #call, rc_, kvvm_last_error()); \
    return 1; } } while (0)

int main(void)
{
    struct kvvm_config c;
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.emu_granule = c.page_size = PS;
    c.n_regions = 2;
    c.bytes_per_token = BPT;
    c.max_seqs = 16;
    c.max_tokens = 8 * T;
    c.device_budget = 8 * PS;
    c.host_budget = 64 * PS;
    c.spill_dir = NULL;
    c.flags = KVVM_F_AUTO_SWAP;
    kvvm *kv;
    CHK(kvvm_open(&c, &kv));
    static unsigned char buf[2 * T * BPT];
    memset(buf, 7, sizeof buf);
    kvvm_seq s[6];
    for (int i = 0; i < 6; i++) {
        CHK(kvvm_seq_create(kv, &s[i]));
        CHK(kvvm_seq_grow(kv, s[i], 2 * T));
        for (uint32_t r = 0; r < 2; r++)
            CHK(kvvm_seq_write(kv, s[i], r, 0, buf, sizeof buf));
        CHK(kvvm_step(kv));              /* two steps end its protection (reclaim may */
        CHK(kvvm_step(kv));              /* take it) */
    }
    int32_t tok[2 * T];
    for (unsigned i = 0; i < 2 * T; i++)
        tok[i] = (int32_t)i;
    kvvm_key k[2];
    kvvm_prefix_keys(tok, 2 * T, T, NULL, 0, k, 2);
    CHK(kvvm_prefix_publish(kv, s[5], 1, k, 2));
    CHK(kvvm_prefix_lookup(kv, 1, k, 2, NULL));
    int n = kvvm_metrics(kv, NULL, 0);
    CHK(n);
    char *t = malloc((size_t)n + 1);
    if (!t)
        return 1;
    CHK(kvvm_metrics(kv, t, (size_t)n + 1));
    fputs(t, stdout);
    free(t);
    kvvm_close(kv);
    return 0;
}
