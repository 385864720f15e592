/* A statically linked consumer whose own global names are ones the library's layers use
   internally (issue 24: libkvvm.a exported them and such a program failed to link with
   "multiple definition"). It must link against libkvvm.a and work: grows a sequence so the
   library's own pool_take, seq_lookup and page_get run beside these. */
#include <kvvm.h>
#include <stdio.h>

int pool_take(void) { return 1; }
int seq_lookup(void) { return 2; }
int page_get(void) { return 3; }
int json_put(void) { return 4; }
int config_check(void) { return 5; }
int vmm_open(void) { return 6; }
int emu_lock = 7;

int main(void)
{
    struct kvvm_config cfg;
    kvvm_config_init(&cfg);
    cfg.backend = KVVM_BACKEND_EMULATED;
    cfg.emu_granule = 64 << 10;
    cfg.device_budget = 4 << 20;
    kvvm *kv;
    kvvm_seq s;
    int err = kvvm_open(&cfg, &kv);
    if (!err && !(err = kvvm_seq_create(kv, &s)))
        err = kvvm_seq_grow(kv, s, 16);
    if (err) {
        fprintf(stderr, "collide: %s\n", kvvm_strerror(err));
        return 1;
    }
    kvvm_close(kv);
    if (pool_take() + seq_lookup() + page_get() + json_put() + config_check() + vmm_open() +
            emu_lock != 28)
        return 1;
    printf("ok: a program defining pool_take, seq_lookup, page_get ... links libkvvm.a\n");
    return 0;
}
