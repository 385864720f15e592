/*
 * metrics.c: kvvm-stress --metrics-port PORT, the context's kvvm_metrics served on
 * http://127.0.0.1:PORT/metrics for the run (tools/common/httpd.c: its own thread, so a
 * slow scraper never stalls the run's steps; the library's calls take its context lock
 * for the copy of the stats only).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "stress.h"
#include "../common/httpd.h"

/* The exposition, malloc'ed (httpd.h's body); NULL when kvvm_metrics fails. */
static char *metrics_body(void *arg, size_t *len)
{
    kvvm *kv = arg;
    int n = kvvm_metrics(kv, NULL, 0);
    for (int tries = 0; n >= 0 && tries < 4; tries++) {
        size_t cap = (size_t)n + 4096;          /* room for figures that grow meanwhile */
        char *b = malloc(cap);
        if (!b)
            return NULL;
        int m = kvvm_metrics(kv, b, cap);
        if (m >= 0 && (size_t)m < cap) {
            *len = (size_t)m;
            return b;
        }
        free(b);
        n = m;
    }
    return NULL;
}

int stress_metrics_start(kvvm *kv, int port, FILE *info, struct tool_httpd **out)
{
    char err[160];
    int rc = tool_httpd_start("127.0.0.1", (uint16_t)port, metrics_body, kv, out, err,
                              sizeof err);
    if (rc) {
        fprintf(stderr, "kvvm-stress: --metrics-port %d: %s\n", port, err);
        return rc;
    }
    fprintf(info, "kvvm-stress: metrics at http://127.0.0.1:%u/metrics\n",
            (unsigned)tool_httpd_port(*out));
    fflush(info);
    return 0;
}

void stress_metrics_stop(struct tool_httpd *h, FILE *info)
{
    if (!h)
        return;
    uint64_t ok, refused;
    tool_httpd_counts(h, &ok, &refused);
    tool_httpd_stop(h);
    fprintf(info, "kvvm-stress: metrics: %llu scrapes answered, %llu requests refused or "
            "dropped\n", (unsigned long long)ok, (unsigned long long)refused);
}
