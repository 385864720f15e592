/*
 * tests/metrics_doc.c: docs/api.md's metrics table against the one table of the code
 * (core/metrics.c, through core_metrics_doc), as the man pages against docs/api.md.
 *
 * usage: metrics_doc --check|--write API_MD
 * The table lies between the lines BEGIN and END below. --check exits 0 when it is the
 * code's, else 1 with the first line that differs; --write replaces it with the code's
 * (run it after changing KVVM_METRICS and commit docs/api.md). CTest metrics_doc runs
 * --check.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

#define BEGIN "<!-- metrics table: generated from core/metrics.c " \
              "(build/tests/metrics_doc --write docs/api.md) -->\n"
#define END   "<!-- end of the metrics table -->\n"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *b = NULL;
    size_t cap = 0, n = 0, r;
    do {
        if (n + 65536 > cap) {
            char *nb = realloc(b, cap = 2 * cap + 65536);
            if (!nb) {
                free(b);
                fclose(f);
                return NULL;
            }
            b = nb;
        }
        r = fread(b + n, 1, cap - n - 1, f);
        n += r;
    } while (r);
    fclose(f);
    b[n] = 0;
    *len = n;
    return b;
}

/* Checks or writes the table; 0 done, 1 differs or cannot write, 2 cannot read. */
static int run(const char *mode, const char *path, char *doc, size_t n, char *md)
{
    char *b = strstr(md, BEGIN), *e = b ? strstr(b, END) : NULL;
    if (!b || !e) {
        fprintf(stderr, "metrics_doc: %s has no table between the lines\n%s...\n%s", path,
                BEGIN, END);
        return 1;
    }
    b += strlen(BEGIN);
    if (!strcmp(mode, "--write")) {
        FILE *f = fopen(path, "wb");
        int bad = !f || fwrite(md, 1, (size_t)(b - md), f) != (size_t)(b - md) ||
                  fwrite(doc, 1, n, f) != n || fputs(e, f) == EOF;
        if ((f && fclose(f)) || bad) {
            fprintf(stderr, "metrics_doc: cannot write %s\n", path);
            return 1;
        }
        printf("metrics_doc: %s: the metrics table written (%zu bytes)\n", path, n);
        return 0;
    }
    if ((size_t)(e - b) == n && !memcmp(b, doc, n)) {
        printf("metrics_doc: %s's metrics table is core/metrics.c's\n", path);
        return 0;
    }
    size_t i = 0, line = 1;
    while (i < n && b + i < e && b[i] == doc[i])
        line += doc[i++] == '\n';
    size_t s = i;
    while (s > 0 && doc[s - 1] != '\n')
        s--;
    fprintf(stderr, "metrics_doc: %s's metrics table differs from core/metrics.c's at its "
            "line %zu:\n  docs: %.*s\n  code: %.*s\nrun build/tests/metrics_doc --write "
            "docs/api.md\n", path, line, (int)strcspn(b + s, "\n"), b + s,
            (int)strcspn(doc + s, "\n"), doc + s);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "--check") && strcmp(argv[1], "--write"))) {
        fprintf(stderr, "usage: metrics_doc --check|--write API_MD\n");
        return 2;
    }
    size_t len, n = core_metrics_doc(NULL, 0);
    char *doc = malloc(n + 1), *md = slurp(argv[2], &len);
    int rc = 2;
    if (!doc || !md)
        fprintf(stderr, "metrics_doc: cannot read %s\n", argv[2]);
    else {
        core_metrics_doc(doc, n + 1);
        rc = run(argv[1], argv[2], doc, n, md);
    }
    free(doc);
    free(md);
    return rc;
}
