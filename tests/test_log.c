/* tests/test_log.c: logging, size parsing, version. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvvm.h"
#include "common/log.h"

static char last[1024];
static int last_level = -1, calls;

static void capture(int level, const char *msg, void *arg)
{
    (void)arg;
    last_level = level;
    calls++;
    snprintf(last, sizeof last, "%s", msg);
}

static char all[8192];

static void capture_all(int level, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    size_t n = strlen(all);
    snprintf(all + n, sizeof all - n, "%s\n", msg);
}

Test(log, sink_receives_messages_at_or_above_level)
{
    kvvm_set_log(capture, NULL, KVVM_LOG_INFO);
    klog_debug("hidden %d", 1);
    cr_expect_eq(calls, 0, "a debug message passed an info threshold");
    klog_warn("shown %d", 2);
    cr_expect_eq(calls, 1);
    cr_expect_eq(last_level, KVVM_LOG_WARN);
    cr_expect_str_eq(last, "shown 2");
    kvvm_set_log(capture, NULL, KVVM_LOG_OFF);
    klog_error("off");
    cr_expect_eq(calls, 1, "a message passed with logging off");
}

Test(log, env_level_read_on_first_use)
{
    setenv("KVVM_LOG", "error", 1);
    cr_expect(!klog_enabled(KVVM_LOG_WARN));
    cr_expect(klog_enabled(KVVM_LOG_ERROR));
}

Test(log, sizes_with_suffixes)
{
    size_t v = 0;
    cr_expect_eq(kparse_size("4096", &v), 0);
    cr_expect_eq(v, 4096);
    cr_expect_eq(kparse_size("64K", &v), 0);
    cr_expect_eq(v, 65536);
    cr_expect_eq(kparse_size("2M", &v), 0);
    cr_expect_eq(v, 2u << 20);
    cr_expect_eq(kparse_size("3GiB", &v), 0);
    cr_expect_eq(v, 3ull << 30);
    v = 7;
    cr_expect_eq(kparse_size("12Q", &v), -EINVAL);
    cr_expect_eq(kparse_size("", &v), -EINVAL);
    cr_expect_eq(kparse_size("-1", &v), -EINVAL);
    cr_expect_eq(kparse_size("99999999999T", &v), -EINVAL);
    cr_expect_eq(v, 7, "a failed parse changed the output");
}

/* Bug (issue 32): the open's info line showed a 512 KiB emulated device as "0 MiB". */
Test(log, sizes_are_written_in_a_unit_they_reach)
{
    char b[32];
    cr_expect_str_eq(kfmt_size(0, b, sizeof b), "0 B");
    cr_expect_str_eq(kfmt_size(1000, b, sizeof b), "1000 B");
    cr_expect_str_eq(kfmt_size(512 << 10, b, sizeof b), "512 KiB");
    cr_expect_str_eq(kfmt_size(3 << 19, b, sizeof b), "1.5 MiB");
    cr_expect_str_eq(kfmt_size(80ull << 30, b, sizeof b), "80 GiB");
    cr_expect_str_eq(kfmt_size(3ull << 40, b, sizeof b), "3 TiB");
    cr_expect_str_eq(kfmt_size(5ull << 50, b, sizeof b), "5120 TiB");

    struct kvvm_config c;
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.emu_granule = 4096;
    c.emu_device_bytes = 512 << 10;
    c.device_budget = 256 << 10;
    c.bytes_per_token = 64;
    c.max_tokens = 256;
    c.max_seqs = 4;
    calls = 0;
    last[0] = 0;
    kvvm_set_log(capture_all, NULL, KVVM_LOG_INFO);
    kvvm *kv = NULL;
    int rc = kvvm_open(&c, &kv);
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
    cr_assert_eq(rc, 0, "kvvm_open: %s", kvvm_last_error());
    kvvm_close(kv);
    cr_expect(strstr(all, "emulated backend") && strstr(all, ", 512 KiB, granule 4 KiB"),
              "the device's size is not in a unit it reaches: %s", all);
    cr_expect_null(strstr(all, " 0 MiB"), "%s", all);
}

Test(log, version_string)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", KVVM_VERSION_MAJOR, KVVM_VERSION_MINOR,
             KVVM_VERSION_PATCH);
    cr_expect_str_eq(kvvm_version(), want);
    /* the header's version is the CMake project's (the package, kvvm.pc, the soname) */
    cr_expect_str_eq(kvvm_version(), KVVMTEST_PROJECT_VERSION);
}

/* Regression: kvvm_config_init warned "unknown environment variable" for KVVM_EMU_MAX_MAPS
   (read by the emulated device) and KVVM_LIBRARY (read by the Python package). */
Test(config_env, known_variables_read_elsewhere_are_not_unknown)
{
    setenv("KVVM_EMU_MAX_MAPS", "1000", 1);
    setenv("KVVM_LIBRARY", "/nonexistent/libkvvm.so", 1);
    kvvm_set_log(capture, NULL, KVVM_LOG_WARN);
    struct kvvm_config cfg;
    kvvm_config_init(&cfg);
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
    cr_expect_eq(calls, 0, "config_init warned: %s", last);
}
