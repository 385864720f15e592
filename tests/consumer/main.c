/* A ten-line engine-side consumer of the installed libkvvm package. */
#include <kvvm.h>
#include <stdio.h>

int main(void)
{
    struct kvvm_config cfg;
    kvvm_config_init(&cfg);
    cfg.backend = KVVM_BACKEND_EMULATED;
    cfg.emu_granule = 64 << 10;
    cfg.device_budget = 4 << 20;
    kvvm *kv;
    int err = kvvm_open(&cfg, &kv);
    if (err) {
        fprintf(stderr, "kvvm_open: %s\n", kvvm_strerror(err));
        return 1;
    }
    printf("libkvvm %s on %s\n", kvvm_version(), kvvm_backend_name(kv));
    kvvm_close(kv);
    return 0;
}
