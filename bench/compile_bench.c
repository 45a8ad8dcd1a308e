/*
 * compile_bench: how long the rule compiler takes, and what it produces, on
 * deterministic synthetic workloads and on the real rule sets in
 * ../shared/data.
 *
 *   compile_bench [--json] [--repeat N] [--data DIR] [--only NAME] [--max-states N]
 *                 [--bitnfa-counters N]
 *
 * Workloads: 1,000 and 10,000 random lowercase literals of 8-16 bytes;
 * regex-500, the 500 bounded regexes that scan_bench scans on the GPU
 * (bench/workloads.c: literal prefixes and suffixes around counted classes,
 * alternations, case folding); regex-500-secrets, 500 regexes shaped like
 * secret-scanning rules (counted repeats of broad classes such as
 * [A-Za-z0-9_-]{20,40} right after a word, which DFAs handle worst); the
 * gitleaks regexes and keywords and rebar's dict-15
 * (dict-10 too with --only dict-10). Every workload is seeded, so two runs
 * compile the same rules. For each it prints the best wall time of N runs,
 * rules, rejects, groups and total DFA states. Targets on the 2-core
 * development machine: 10,000 literals under 2 s, 500 regexes under 5 s.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "catalog.h"
#include "patfile.h"
#include "rules.h"
#include "workloads.h"

struct rng {
    uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uint32_t rng_below(struct rng *r, uint32_t n)
{
    return (uint32_t)(rng_next(r) % n);
}

static bool rng_pct(struct rng *r, uint32_t pct)
{
    return rng_below(r, 100) < pct;
}

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) {
        fprintf(stderr, "compile_bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return q;
}

/* A rule set that owns its ids and patterns. */
struct ruleset {
    struct rule_src *v;
    size_t n;
    size_t cap;
};

static char *xmemdup(const char *s, size_t n)
{
    char *p = xrealloc(NULL, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static void ruleset_add(struct ruleset *rs, const char *id, enum rule_kind kind, const char *pat,
                        size_t len, uint32_t flags, uint32_t line)
{
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? rs->cap * 2 : 1024;
        rs->v = xrealloc(rs->v, rs->cap * sizeof(*rs->v));
    }
    rs->v[rs->n++] =
        (struct rule_src){xmemdup(id, strlen(id)), kind, xmemdup(pat, len), len, flags, line};
}

static void ruleset_free(struct ruleset *rs)
{
    for (size_t i = 0; i < rs->n; i++) {
        free((char *)rs->v[i].id);
        free((char *)rs->v[i].pattern);
    }
    free(rs->v);
    *rs = (struct ruleset){0};
}

/* ---- synthetic workloads ---- */

static void gen_literals(struct ruleset *rs, size_t n, uint64_t seed)
{
    struct rng r = {seed};
    char id[32], lit[17];
    for (size_t i = 0; i < n; i++) {
        size_t len = 8 + rng_below(&r, 9);
        for (size_t k = 0; k < len; k++)
            lit[k] = (char)('a' + rng_below(&r, 26));
        snprintf(id, sizeof(id), "lit%zu", i);
        ruleset_add(rs, id, RULE_LITERAL, lit, len, 0, 0);
    }
}

struct buf {
    char s[512];
    size_t n;
};

static VKS_PRINTF(2, 3) void buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s + b->n, sizeof(b->s) - b->n, fmt, ap);
    va_end(ap);
    if (k > 0)
        b->n += (size_t)k < sizeof(b->s) - b->n ? (size_t)k : sizeof(b->s) - 1 - b->n;
}

static void put_word(struct buf *b, struct rng *r, uint32_t lo, uint32_t hi)
{
    uint32_t len = lo + rng_below(r, hi - lo + 1);
    for (uint32_t k = 0; k < len; k++)
        buf_printf(b, "%c", 'a' + (int)rng_below(r, 26));
}

/* One piece after the prefix of a secret-scanning-like regex. */
static void put_piece(struct buf *b, struct rng *r)
{
    uint32_t m = 8 + rng_below(r, 13);
    switch (rng_below(r, 9)) {
    case 0:
        buf_printf(b, "[a-z0-9]{%u}", 8 + rng_below(r, 33));
        break;
    case 1:
        buf_printf(b, "[A-Za-z0-9_-]{%u,%u}", m, m + rng_below(r, 21));
        break;
    case 2:
        buf_printf(b, "\\d{%u}", 2 + rng_below(r, 7));
        break;
    case 3:
        buf_printf(b, "[a-f0-9]{%u}", rng_pct(r, 50) ? 32 : 40);
        break;
    case 4:
        buf_printf(b, "(?:");
        for (uint32_t k = 0, n = 2 + rng_below(r, 3); k < n; k++) {
            buf_printf(b, k ? "|" : "");
            put_word(b, r, 3, 6);
        }
        buf_printf(b, ")");
        break;
    case 5:
        buf_printf(b, "\\s{0,3}[=:]\\s{0,3}");
        break;
    case 6:
        buf_printf(b, "[^\\s\"']{4,%u}", 8 + rng_below(r, 17));
        break;
    case 7:
        buf_printf(b, "[-_.]");
        break;
    default:
        buf_printf(b, "[[:alnum:]]{%u,}", 4 + rng_below(r, 8));
    }
}

static void gen_regexes(struct ruleset *rs, size_t n, uint64_t seed)
{
    struct rng r = {seed};
    char id[32];
    for (size_t i = 0; i < n; i++) {
        struct buf b = {.n = 0};
        uint32_t flags = 0;
        if (rng_pct(&r, 10))
            buf_printf(&b, "(?i)");
        else if (rng_pct(&r, 10))
            flags |= RULE_F_CASELESS;
        if (rng_pct(&r, 20))
            buf_printf(&b, "\\b");
        put_word(&b, &r, 3, 8);
        if (rng_pct(&r, 40))
            buf_printf(&b, "%c", "_-"[rng_below(&r, 2)]);
        for (uint32_t k = 0, np = 1 + rng_below(&r, 3); k < np; k++)
            put_piece(&b, &r);
        if (rng_pct(&r, 20))
            buf_printf(&b, "\\b");
        snprintf(id, sizeof(id), "re%zu", i);
        ruleset_add(rs, id, RULE_REGEX, b.s, b.n, flags, 0);
    }
}

/* The bounded regexes scan_bench scans on the GPU (bench/workloads.c). */
static void gen_bounded_regexes(struct ruleset *rs, size_t n)
{
    uint64_t s = workload_regex_seed((uint32_t)n);
    char id[32], pat[96], inst[64];
    for (size_t i = 0; i < n; i++) {
        if (workload_regex(&s, (uint32_t)i, pat, inst) != 0) {
            fprintf(stderr, "compile_bench: out of memory\n");
            exit(2);
        }
        snprintf(id, sizeof(id), "r%zu", i);
        ruleset_add(rs, id, RULE_REGEX, pat, strlen(pat), 0, 0);
    }
}

/* ---- the shared rule sets (hsbench files, read by patfile.h) ---- */

static int load_patfile(struct ruleset *rs, const char *path)
{
    char *text;
    size_t len;
    int rd = workload_read_file(path, &text, &len);
    if (rd != 0)
        return rd;
    struct patfile pf;
    struct vks_error err = {0};
    int rc = patfile_parse(text, len, &pf, &err);
    for (size_t i = 0; rc == 0 && i < pf.n; i++) {
        const struct rule_src *r = &pf.rules[i];
        ruleset_add(rs, r->id, r->kind, r->pattern, r->len, r->flags, r->line);
    }
    patfile_finish(&pf);
    free(text);
    return rc;
}

/* ---- running and printing ---- */

struct figures {
    const char *name;
    size_t rules;
    size_t rejects;
    uint32_t groups;
    uint32_t nfa_groups; /* bit-NFA groups */
    uint32_t nfa_rules;  /* rules on the bit-NFA engine */
    uint64_t states;
    size_t bytes;
    double wall_s;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint32_t bitnfa_counters; /* rules_options.bitnfa_counters; 0: default */

static int measure(const char *name, const struct ruleset *rs, int repeat, uint32_t max_states,
                   struct figures *out)
{
    *out = (struct figures){.name = name, .rules = rs->n, .wall_s = 1e30};
    for (int k = 0; k < repeat; k++) {
        struct rules_result res;
        struct vks_error err = {0};
        double t0 = now_s();
        struct rules_options ro = {.max_states = max_states, .bitnfa_counters = bitnfa_counters};
        int rc = rules_compile(rs->v, rs->n, &ro, &res, &err);
        double t = now_s() - t0;
        if (rc != 0) {
            fprintf(stderr, "compile_bench: %s: %s\n", name, err.msg);
            return rc;
        }
        size_t words = 0;
        catalog_words(res.catalog, &words);
        out->wall_s = t < out->wall_s ? t : out->wall_s;
        out->rejects = res.n_rejects;
        out->groups = catalog_group_count(res.catalog);
        out->nfa_groups = catalog_nfa_count(res.catalog);
        out->nfa_rules = 0;
        for (uint32_t i = 0; i < catalog_rule_count(res.catalog); i++) {
            struct catalog_rule r;
            catalog_rule(res.catalog, i, &r);
            out->nfa_rules += r.group >= out->groups;
        }
        out->states = catalog_total_states(res.catalog);
        out->bytes = words * 4;
        rules_result_finish(&res);
    }
    return 0;
}

static void print_text(const struct figures *f, size_t n)
{
    printf("%-22s %8s %8s %7s %10s %9s %9s %12s %10s\n", "workload", "rules", "rejects", "groups",
           "states", "nfa-grps", "nfa-rules", "catalog KiB", "wall s");
    for (size_t i = 0; i < n; i++)
        printf("%-22s %8zu %8zu %7u %10" PRIu64 " %9u %9u %12.1f %10.3f\n", f[i].name, f[i].rules,
               f[i].rejects, f[i].groups, f[i].states, f[i].nfa_groups, f[i].nfa_rules,
               (double)f[i].bytes / 1024.0, f[i].wall_s);
}

static void print_json(const struct figures *f, size_t n)
{
    printf("{\"bench\": \"compile_bench\", \"workloads\": [");
    for (size_t i = 0; i < n; i++)
        printf("%s\n  {\"name\": \"%s\", \"rules\": %zu, \"rejects\": %zu, \"groups\": %u, "
               "\"states\": %" PRIu64 ", \"nfa_groups\": %u, \"nfa_rules\": %u, "
               "\"catalog_bytes\": %zu, \"wall_s\": %.6f}",
               i ? "," : "", f[i].name, f[i].rules, f[i].rejects, f[i].groups, f[i].states,
               f[i].nfa_groups, f[i].nfa_rules, f[i].bytes, f[i].wall_s);
    printf("\n]}\n");
}

struct workload {
    const char *name;
    size_t count;     /* synthetic: how many rules */
    const char *file; /* real: path under the data folder */
    bool only_on_request;
};

static const struct workload workloads[] = {
    {"literals-1k", 1000, NULL, false},
    {"literals-10k", 10000, NULL, false},
    {"regex-500", 500, NULL, false},
    {"regex-500-secrets", 500, NULL, false},
    {"gitleaks-regex", 0, "gitleaks/gitleaks-regex.rules", false},
    {"gitleaks-keywords", 0, "gitleaks/gitleaks-keywords.rules", false},
    {"dict-15", 0, "rebar/dict-15.rules", false},
    {"dict-10", 0, "rebar/dict-10.rules", true},
};

static int build(const struct workload *w, const char *data, struct ruleset *rs)
{
    if (w->file == NULL) {
        if (strncmp(w->name, "literals", 8) == 0)
            gen_literals(rs, w->count, 0x5eed0001u + w->count);
        else if (strcmp(w->name, "regex-500") == 0)
            gen_bounded_regexes(rs, w->count);
        else
            gen_regexes(rs, w->count, 0x5eed0002u);
        return 0;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", data, w->file);
    int rc = load_patfile(rs, path);
    if (rc != 0)
        fprintf(stderr, "compile_bench: skipping %s: cannot read %s: %s (use --data DIR)\n",
                w->name, path, strerror(-rc));
    return rc;
}

static int usage(void)
{
    fprintf(stderr, "usage: compile_bench [--json] [--repeat N] [--data DIR] [--only NAME]\n"
                    "                     [--max-states N] [--bitnfa-counters N]\n");
    return 2;
}

int main(int argc, char **argv)
{
    bool json = false;
    int repeat = 1;
    uint32_t max_states = 0; /* the compiler's default budget */
    const char *only = NULL;
    const char *data = getenv("VKS_SHARED_DATA");
    if (data == NULL || *data == '\0')
        data = "../shared/data";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc)
            data = argv[++i];
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--max-states") == 0 && i + 1 < argc)
            max_states = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--bitnfa-counters") == 0 && i + 1 < argc)
            bitnfa_counters = (uint32_t)strtoul(argv[++i], NULL, 10);
        else
            return usage();
    }
    if (repeat < 1)
        return usage();
    size_t nw = sizeof(workloads) / sizeof(workloads[0]), nf = 0;
    struct figures figs[sizeof(workloads) / sizeof(workloads[0])];
    int status = 0;
    for (size_t i = 0; i < nw; i++) {
        const struct workload *w = &workloads[i];
        if (only ? strcmp(only, w->name) != 0 : w->only_on_request)
            continue;
        struct ruleset rs = {0};
        if (build(w, data, &rs) == 0 && measure(w->name, &rs, repeat, max_states, &figs[nf]) == 0)
            nf++;
        else if (w->file == NULL)
            status = 1;
        ruleset_free(&rs);
    }
    if (json)
        print_json(figs, nf);
    else
        print_text(figs, nf);
    return status;
}
