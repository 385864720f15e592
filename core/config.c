/*
 * core/config.c: configuration defaults, KVVM_* environment overrides, validation, JSON.
 *
 * Options are one table (name, kind, field offset): kvvm_config_init applies defaults, then
 * every KVVM_<NAME> variable of the table. A KVVM_* variable that names no option (and no
 * other known variable: common/env.h) or that does not parse is reported with a warning and
 * ignored.
 */
#include "core.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "common/env.h"
#include "common/log.h"

extern char **environ;

enum opt_kind { OPT_BACKEND, OPT_INT, OPT_U32, OPT_U64, OPT_SIZE, OPT_STR, OPT_DOUBLE,
                OPT_FLAGS, OPT_BOOL, OPT_URL /* a string whose password the JSON hides */ };

struct opt {
    const char *name;         /* JSON name; env = KVVM_ + upper-case name */
    enum opt_kind kind;
    size_t off;
};

#define OPT(n, k) { #n, k, offsetof(struct kvvm_config, n) }
static const struct opt opts[] = {
    OPT(backend, OPT_BACKEND),       OPT(device, OPT_INT),
    OPT(n_regions, OPT_U32),         OPT(bytes_per_token, OPT_U64),
    OPT(max_seqs, OPT_U32),          OPT(max_tokens, OPT_U64),
    OPT(page_size, OPT_SIZE),        OPT(device_budget, OPT_SIZE),
    OPT(host_budget, OPT_SIZE),      OPT(spill_dir, OPT_STR),
    OPT(spill_budget, OPT_SIZE),
    OPT(device_min, OPT_DOUBLE),     OPT(device_low, OPT_DOUBLE),
    OPT(device_high, OPT_DOUBLE),    OPT(host_min, OPT_DOUBLE),
    OPT(host_low, OPT_DOUBLE),       OPT(host_high, OPT_DOUBLE),
    OPT(flags, OPT_FLAGS),           OPT(emu_device_bytes, OPT_SIZE),
    OPT(emu_granule, OPT_SIZE),      OPT(map_ahead, OPT_U32),
    OPT(emu_opaque, OPT_BOOL),
    OPT(pool_thread, OPT_BOOL),      OPT(pool_low, OPT_U32),
    OPT(pool_high, OPT_U32),         OPT(pool_decay_ms, OPT_U32),
    OPT(create_at_open, OPT_BOOL),
    OPT(store_url, OPT_URL),         OPT(store_timeout_ms, OPT_U32),
    OPT(pool_socket, OPT_STR),       OPT(client_name, OPT_STR),
    OPT(pool_reserve, OPT_SIZE),     OPT(pool_timeout_ms, OPT_U32),
    OPT(store_queue_bytes, OPT_SIZE),
};

/* The KVVM_* variables that are not configuration fields (common/env.h). */
static const char *const other_env[] = {
#define X(name, reader, doc) #name,
    KVVM_ENV_VARS(X)
#undef X
};

static const char *backend_str(enum kvvm_backend b)
{
    switch (b) {
    case KVVM_BACKEND_AUTO: return "auto";
    case KVVM_BACKEND_CUDA: return "cuda";
    case KVVM_BACKEND_EMULATED: return "emulated";
    }
    return "?";
}

static int parse_u64(const char *s, uint64_t *out)
{
    size_t v;
    int rc = kparse_size(s, &v);
    if (!rc)
        *out = v;
    return rc;
}

/* The flags by name, for KVVM_FLAGS and for messages. */
static const struct { const char *name; unsigned bit; } flag_names[] = {
    { "auto_swap", KVVM_F_AUTO_SWAP }, { "scrub", KVVM_F_SCRUB },
    { "spill_allow_tmpfs", KVVM_F_SPILL_ALLOW_TMPFS },
    { "spill_buffered", KVVM_F_SPILL_BUFFERED }, { "cache_demote", KVVM_F_CACHE_DEMOTE },
    { "pool_view", KVVM_F_POOL_VIEW },
};
#define FLAG_LIST "auto_swap, scrub, spill_allow_tmpfs, spill_buffered, cache_demote, pool_view"

/* Parses KVVM_FLAGS: a number, or names joined by ',', '|', '+' or ' '. -EINVAL with the
   first bad name in bad[] (when not NULL). */
static int parse_flags(const char *s, unsigned *out, char *bad, size_t bad_len)
{
    char *end;
    unsigned long v = strtoul(s, &end, 0);
    if (end != s && !*end) {
        *out = (unsigned)v;
        return 0;
    }
    unsigned f = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save, *t = strtok_r(buf, ",|+ ", &save); t; t = strtok_r(NULL, ",|+ ", &save)) {
        size_t i;
        for (i = 0; i < sizeof flag_names / sizeof *flag_names; i++)
            if (!strcasecmp(t, flag_names[i].name))
                break;
        if (i == sizeof flag_names / sizeof *flag_names) {
            if (bad)
                snprintf(bad, bad_len, "%s", t);
            return -EINVAL;
        }
        f |= flag_names[i].bit;
    }
    *out = f;
    return 0;
}

/* Parses one option's value into cfg. -EINVAL malformed or out of range. */
static int opt_set(struct kvvm_config *cfg, const struct opt *o, const char *s)
{
    char *p = (char *)cfg + o->off, *end;
    uint64_t u;
    switch (o->kind) {
    case OPT_BACKEND:
        if (!strcasecmp(s, "auto")) *(enum kvvm_backend *)p = KVVM_BACKEND_AUTO;
        else if (!strcasecmp(s, "cuda")) *(enum kvvm_backend *)p = KVVM_BACKEND_CUDA;
        else if (!strcasecmp(s, "emulated") || !strcasecmp(s, "emu"))
            *(enum kvvm_backend *)p = KVVM_BACKEND_EMULATED;
        else return -EINVAL;
        return 0;
    case OPT_INT: {
        long v = strtol(s, &end, 10);
        if (end == s || *end || v < 0 || v > 1 << 20)
            return -EINVAL;
        *(int *)p = (int)v;
        return 0;
    }
    case OPT_BOOL:
        if (!strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes"))
            *(int *)p = 1;
        else if (!strcmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no"))
            *(int *)p = 0;
        else
            return -EINVAL;
        return 0;
    case OPT_U32:
        if (parse_u64(s, &u) || u > UINT32_MAX)
            return -EINVAL;
        *(uint32_t *)p = (uint32_t)u;
        return 0;
    case OPT_U64:
        if (parse_u64(s, &u))
            return -EINVAL;
        *(uint64_t *)p = u;
        return 0;
    case OPT_SIZE:
        return kparse_size(s, (size_t *)p);
    case OPT_STR: case OPT_URL:
        *(const char **)p = *s ? s : NULL;
        return 0;
    case OPT_DOUBLE: {
        double d = strtod(s, &end);
        if (end == s || *end || d != d)
            return -EINVAL;
        *(double *)p = d;
        return 0;
    }
    case OPT_FLAGS:
        return parse_flags(s, (unsigned *)p, NULL, 0);
    }
    return -EINVAL;
}

/* What a value of this kind must look like, for the warning about a malformed one. */
static const char *opt_valid(enum opt_kind k)
{
    switch (k) {
    case OPT_BACKEND: return "valid values: auto, cuda, emulated (or emu)";
    case OPT_INT: return "valid: a decimal integer from 0 to 1048576";
    case OPT_BOOL: return "valid values: 1, 0, true, false, yes, no";
    case OPT_U32: return "valid: an integer from 0 to 4294967295 (K/M/G suffixes allowed)";
    case OPT_U64: return "valid: a non-negative integer (K/M/G/T suffixes allowed)";
    case OPT_SIZE: return "valid: a size in bytes with an optional K, M, G or T suffix "
                          "(binary), e.g. 512M";
    case OPT_STR: return "valid: any string";
    case OPT_URL: return "valid: file:///dir, redis://[[user]:password@]host[:port][/db] or "
                         "redis-cluster://[[user]:password@]host:port[,host:port...]";
    case OPT_DOUBLE: return "valid: a number, e.g. 0.1";
    case OPT_FLAGS: return "valid: a number, or flag names joined by ',', '|' or '+' from: "
                           FLAG_LIST;
    }
    return "";
}

/* Applies KVVM_<NAME>=value; returns false when NAME is not an option. */
static bool env_apply(struct kvvm_config *cfg, const char *var)
{
    const char *eq = strchr(var, '=');
    if (!eq)
        return true;
    size_t klen = (size_t)(eq - var);
    for (size_t i = 0; i < sizeof other_env / sizeof *other_env; i++)
        if (strlen(other_env[i]) == klen && !strncmp(var, other_env[i], klen))
            return true;
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
        const struct opt *o = &opts[i];
        if (klen != 5 + strlen(o->name) || strncasecmp(var + 5, o->name, klen - 5) != 0)
            continue;
        if (opt_set(cfg, o, eq + 1)) {
            char bad[128] = "";
            if (o->kind == OPT_FLAGS)
                parse_flags(eq + 1, &(unsigned){ 0 }, bad, sizeof bad);
            klog_warn("%.*s=%s is malformed%s%s%s; %s; keeping %s's previous value",
                      (int)klen, var, eq + 1, *bad ? ": '" : "", bad,
                      *bad ? "' is not a flag" : "", opt_valid(o->kind), o->name);
        }
        return true;
    }
    return false;
}

void kvvm_config_init(struct kvvm_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->size = sizeof *cfg;
    cfg->backend = KVVM_BACKEND_AUTO;
    cfg->device = 0;
    cfg->n_regions = 1;
    cfg->bytes_per_token = 4096;
    cfg->max_seqs = 64;
    cfg->max_tokens = 4096;
    cfg->page_size = 0;
    cfg->device_budget = 256u << 20;
    cfg->host_budget = 0;
    cfg->spill_dir = NULL;
    cfg->spill_budget = 1ull << 30;
    cfg->device_min = cfg->host_min = 0.05;
    cfg->device_low = cfg->host_low = 0.10;
    cfg->device_high = cfg->host_high = 0.20;
    cfg->flags = 0;
    cfg->emu_device_bytes = 0;
    cfg->emu_granule = 0;
    cfg->map_ahead = 0;
    cfg->emu_opaque = 0;
    cfg->pool_thread = 1;
    cfg->pool_low = 0;
    cfg->pool_high = 0;
    cfg->pool_decay_ms = 1000;
    cfg->create_at_open = 0;
    cfg->store_url = NULL;
    cfg->store_timeout_ms = CORE_STORE_TIMEOUT_DEFAULT_MS;
    cfg->pool_socket = NULL;
    cfg->client_name = NULL;
    cfg->pool_reserve = 0;
    cfg->pool_timeout_ms = POOL_TIMEOUT_DEFAULT_MS;
    cfg->store_queue_bytes = STORE_QUEUE_DEFAULT_BYTES;
    for (char **e = environ; e && *e; e++)
        if (!strncmp(*e, "KVVM_", 5) && !env_apply(cfg, *e))
            klog_warn("unknown environment variable %.*s ignored (not a libkvvm setting)",
                      (int)(strchrnul(*e, '=') - *e), *e);
    /* the tmpfs opt-in alone, without restating KVVM_FLAGS */
    const char *t = kenv(KVVM_SPILL_ALLOW_TMPFS);
    if (t && *t && strcmp(t, "0") != 0)
        cfg->flags |= KVVM_F_SPILL_ALLOW_TMPFS;
}

#define BAD(...) return kerr(-EINVAL, "kvvm_open: " __VA_ARGS__)

static int check_marks(const char *tier, double mn, double lo, double hi)
{
    if (!(mn >= 0 && mn <= lo && lo <= hi && hi <= 1))
        BAD("%s watermarks must satisfy 0 <= min <= low <= high <= 1 (got %g, %g, %g)",
            tier, mn, lo, hi);
    return 0;
}

int config_check(const struct kvvm_config *c)
{
    if (c->backend != KVVM_BACKEND_AUTO && c->backend != KVVM_BACKEND_CUDA &&
        c->backend != KVVM_BACKEND_EMULATED)
        BAD("backend %d is not KVVM_BACKEND_AUTO (0), KVVM_BACKEND_CUDA (1) or "
            "KVVM_BACKEND_EMULATED (2)", (int)c->backend);
    if (c->device < 0)
        BAD("device ordinal %d is negative", c->device);
    if (c->n_regions < 1)
        BAD("n_regions must be >= 1");
    if (c->bytes_per_token < 1)
        BAD("bytes_per_token must be >= 1");
    if (c->max_seqs < 1)
        BAD("max_seqs must be >= 1");
    if (c->max_tokens < 1)
        BAD("max_tokens must be >= 1");
#define KNOWN_FLAGS (KVVM_F_AUTO_SWAP | KVVM_F_SCRUB | KVVM_F_SPILL_ALLOW_TMPFS | \
                     KVVM_F_SPILL_BUFFERED | KVVM_F_CACHE_DEMOTE | KVVM_F_POOL_VIEW)
    if (c->flags & ~KNOWN_FLAGS)
        BAD("flags 0x%x has unknown bits 0x%x; known: KVVM_F_AUTO_SWAP (0x1), KVVM_F_SCRUB "
            "(0x2), KVVM_F_SPILL_ALLOW_TMPFS (0x4), KVVM_F_SPILL_BUFFERED (0x8), "
            "KVVM_F_CACHE_DEMOTE (0x10), KVVM_F_POOL_VIEW (0x20)", c->flags,
            c->flags & ~KNOWN_FLAGS);
    if (c->max_tokens > UINT64_MAX / c->bytes_per_token)
        BAD("max_tokens * bytes_per_token overflows");
    if (check_marks("device", c->device_min, c->device_low, c->device_high) ||
        check_marks("host", c->host_min, c->host_low, c->host_high))
        return -EINVAL;
    if (c->emu_granule && (c->emu_granule < 4096 || c->emu_granule > (2u << 20) ||
                           (c->emu_granule & (c->emu_granule - 1))))
        BAD("emu_granule %zu must be a power of two from 4 KiB to 2 MiB", c->emu_granule);
    return 0;
}

/* Largest reservation we ask the driver for (the GPU's virtual address space is 2^47+). */
#define MAX_RESERVE (1ull << 46)

int config_layout(struct kvvm_config *c, size_t granule, uint64_t *slot_bytes,
                  uint64_t *reserve_bytes)
{
    if (!c->page_size)
        c->page_size = granule;
    if (c->page_size % granule)
        BAD("page_size %zu is not a multiple of the device granule %zu", c->page_size,
            granule);
    /* a block is page_size / bytes_per_token tokens; the window holds token t at
       t * bytes_per_token, so unless the tokens fill the page exactly, block b's tokens
       are not page b's bytes and the view would serve another block's tail */
    if ((c->flags & KVVM_F_POOL_VIEW) && c->page_size % c->bytes_per_token)
        BAD("KVVM_F_POOL_VIEW needs page_size to be a multiple of bytes_per_token: "
            "page_size %zu holds %llu tokens of bytes_per_token %llu and %llu bytes more, so "
            "a block's tokens do not fill its page (choose a page_size that is a multiple of "
            "both the granule %zu and bytes_per_token)", c->page_size,
            (unsigned long long)(c->page_size / c->bytes_per_token),
            (unsigned long long)c->bytes_per_token,
            (unsigned long long)(c->page_size % c->bytes_per_token), granule);
    uint64_t ps = c->page_size, raw = c->max_tokens * c->bytes_per_token;
    if (raw > MAX_RESERVE)
        BAD("max_tokens * bytes_per_token = %llu bytes is larger than a reservation can be",
            (unsigned long long)raw);
    uint64_t slot = (raw + ps - 1) / ps * ps;
    if (slot / ps > UINT32_MAX)
        BAD("too many pages per slot");
    if (c->device_budget / ps < c->n_regions)
        BAD("device_budget %zu holds fewer than one page of %llu bytes per region (%u)",
            c->device_budget, (unsigned long long)ps, c->n_regions);
    if (c->device_budget / ps > UINT32_MAX / 2)
        BAD("device_budget holds too many pages");
    if (c->host_budget && c->host_budget < ps)
        BAD("host_budget %zu is smaller than one page (page_size %llu): set it to 0 for no "
            "host tier or to at least %llu", c->host_budget, (unsigned long long)ps,
            (unsigned long long)ps);
    if (c->host_budget % ps) {
        size_t r = c->host_budget / ps * ps;
        klog_warn("kvvm_open: host_budget %zu is not a multiple of page_size %llu: using %zu "
                  "(%zu pages)", c->host_budget, (unsigned long long)ps, r, r / ps);
        c->host_budget = r;
    }
    uint64_t per_region = (uint64_t)c->max_seqs * slot;
    if (slot && per_region / slot != c->max_seqs)
        BAD("max_seqs * slot_bytes overflows");
    if (per_region > MAX_RESERVE / c->n_regions)
        BAD("the reservation (n_regions %u x max_seqs %u x slot_bytes %llu) is larger than "
            "the driver allows (%llu bytes)", c->n_regions, c->max_seqs,
            (unsigned long long)slot, (unsigned long long)MAX_RESERVE);
    *slot_bytes = slot;
    *reserve_bytes = per_region * c->n_regions + ps * PG_SCRATCH_PAGES;  /* + the scratch run */
    return 0;
}

void json_put(char *buf, size_t len, size_t *pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*pos < len ? buf + *pos : NULL, *pos < len ? len - *pos : 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        *pos += (size_t)n;
}

static void json_str(char *buf, size_t len, size_t *pos, const char *s)
{
    json_put(buf, len, pos, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            json_put(buf, len, pos, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            json_put(buf, len, pos, "\\u%04x", *s);
        else
            json_put(buf, len, pos, "%c", *s);
    }
    json_put(buf, len, pos, "\"");
}

void config_json(const struct kvvm_config *c, char *buf, size_t len, size_t *pos)
{
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
        const struct opt *o = &opts[i];
        const char *p = (const char *)c + o->off;
        json_put(buf, len, pos, "%s\"%s\":", i ? "," : "", o->name);
        switch (o->kind) {
        case OPT_BACKEND: json_put(buf, len, pos, "\"%s\"",
                                   backend_str(*(const enum kvvm_backend *)p)); break;
        case OPT_INT: case OPT_BOOL: json_put(buf, len, pos, "%d", *(const int *)p); break;
        case OPT_U32: json_put(buf, len, pos, "%u", *(const uint32_t *)p); break;
        case OPT_U64: json_put(buf, len, pos, "%llu",
                               (unsigned long long)*(const uint64_t *)p); break;
        case OPT_SIZE: json_put(buf, len, pos, "%zu", *(const size_t *)p); break;
        case OPT_FLAGS: json_put(buf, len, pos, "%u", *(const unsigned *)p); break;
        case OPT_DOUBLE: json_put(buf, len, pos, "%g", *(const double *)p); break;
        case OPT_STR: case OPT_URL: {
            const char *v = *(const char *const *)p;
            char red[512];
            if (v)
                json_str(buf, len, pos, o->kind == OPT_URL
                                        ? core_tiers_url_redact(v, red, sizeof red) : v);
            else
                json_put(buf, len, pos, "null");
            break;
        }
        }
    }
}
