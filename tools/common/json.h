/*
 * tools/common/json.h: the one JSON string writer of the tools (kvvm-bench, kvvm-stress).
 * Header-only so each tool stays one binary with no extra library.
 */
#ifndef KVVM_TOOLS_JSON_H
#define KVVM_TOOLS_JSON_H

#include <stdio.h>

/* Writes s as a JSON string literal (NULL as ""), escaping quotes, backslashes and controls. */
static inline void tool_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

#endif
