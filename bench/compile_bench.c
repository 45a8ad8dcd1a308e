/*
 * compile_bench: the rule compiler against Hyperscan's, side by side, on the
 * same rules in one run: deterministic synthetic workloads and the real rule
 * sets in ../shared/data.
 *
 *   compile_bench [--json] [--repeat N] [--data DIR] [--only NAME] [--max-states N]
 *                 [--bitnfa-counters N] [--no-hs] [--no-minimise] [--gate-bits N]
 *                 [--gate-states N] [--gate-rare-bits N] [--gated-group-bits N]
 *                 [--heavy-states N] [--fp] [--groups] [--hs-interleave]
 *
 * Workloads: 1,000 and 10,000 random lowercase literals of 8-16 bytes;
 * regex-500, the 500 bounded regexes that scan_bench scans on the GPU
 * (bench/workloads.c: literal prefixes and suffixes around counted classes,
 * alternations, case folding); regex-500-secrets, 500 regexes shaped like
 * secret-scanning rules (counted repeats of broad classes such as
 * [A-Za-z0-9_-]{20,40} right after a word, which DFAs handle worst);
 * binary-20k, 20,000 random byte strings of 8-32 bytes as \xHH regexes;
 * phrases-3k, 3,000 caseless phrases of common English words; the gitleaks
 * regexes and keywords and rebar's dict-15 and dict-10. Every workload is
 * seeded, so two runs compile the same rules.
 *
 * Both compilers get the same rules: the ones both accept (a rule one of
 * them rejects is dropped and the other recompiles without it). For each
 * compiler it prints the median wall and CPU seconds of N runs (vkscan uses
 * several threads; Hyperscan one), the output size (catalog bytes against
 * hs_database_size) and the peak memory of one compile: the growth of the
 * process's peak resident set over its resident set before the compile
 * (/proc/self/clear_refs resets the peak). The targets of issue 9 on the
 * 2-core development machine are checked per workload: vkscan's CPU time
 * at most Hyperscan's ("time"; CPU, not wall, because wall time on the
 * shared machine varies 2-4x from run to run, and vkscan's CPU time counts
 * all its threads, so the check is not easier for it), catalog at most
 * max(4x the Hyperscan database, 8 MiB) ("size"), peak at most 4x the
 * catalog ("peak"). --fp prints each catalog's fingerprint after the table
 * (the JSON always has it), to check that a compiler change left the output
 * as it was. --groups prints each DFA group (states, classes, rules,
 * maxlen, factor or literal) on stderr.
 *
 * Every workload's vkscan compiles run before any Hyperscan compile: the
 * heap Hyperscan's compiles left behind (large blocks freed, glibc's mmap
 * threshold raised) made the next workload's vkscan peak up to 1.7x higher
 * (gitleaks-regex 2.6x -> 4.0-4.7x its catalog, session 14). vkscand has
 * no Hyperscan in it. --hs-interleave restores the old order (Hyperscan
 * right after each workload's vkscan compiles).
 */
#include <errno.h>
#include <hs/hs.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "catalog.h"
#include "patfile.h"
#include "hsrules.h"
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

static void gen_regexes(struct ruleset *rs, size_t n, uint64_t seed)
{
    uint64_t st = seed;
    char id[32], pat[WORKLOAD_SECRET_MAX];
    for (size_t i = 0; i < n; i++) {
        uint32_t flags;
        size_t len = workload_secret(&st, pat, &flags);
        flags = flags ? RULE_F_CASELESS : 0;
        snprintf(id, sizeof(id), "re%zu", i);
        ruleset_add(rs, id, RULE_REGEX, pat, len, flags, 0);
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

/* binary-N of bench/workloads.c: \xHH regexes of random bytes. */
static void gen_binary(struct ruleset *rs, size_t n)
{
    uint64_t s = workload_binary_seed((uint32_t)n);
    uint8_t bytes[WORKLOAD_BINARY_MAX];
    char id[32], pat[4 * WORKLOAD_BINARY_MAX + 1];
    for (size_t i = 0; i < n; i++) {
        size_t len = workload_binary(&s, bytes, pat);
        snprintf(id, sizeof(id), "bin%zu", i);
        ruleset_add(rs, id, RULE_REGEX, pat, 4 * len, 0, 0);
    }
}

/* phrases-N of bench/workloads.c: caseless literals. */
static void gen_phrases(struct ruleset *rs, size_t n)
{
    char **ph = workload_phrases((uint32_t)n);
    char id[32];
    if (ph == NULL) {
        fprintf(stderr, "compile_bench: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(id, sizeof(id), "ph%zu", i);
        ruleset_add(rs, id, RULE_LITERAL, ph[i], strlen(ph[i]), RULE_F_CASELESS, 0);
    }
    workload_phrases_free(ph, (uint32_t)n);
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

struct side {
    double wall_s, cpu_s; /* medians */
    size_t bytes;         /* catalog or hs_database_size */
    size_t peak;          /* peak resident growth during one compile */
};

struct figures {
    const char *name;
    size_t rules;   /* compiled by both */
    size_t rejects; /* by vkscan */
    size_t hs_rejects;
    uint32_t groups;
    uint32_t nfa_groups; /* bit-NFA groups */
    uint32_t nfa_rules;  /* rules on the bit-NFA engine */
    uint32_t passes;     /* groups that walk every byte: DFA groups and ungated bit-NFA groups */
    uint64_t states;
    char fp[2 * CATALOG_FP_LEN + 1]; /* the catalog's fingerprint (hex) */
    struct side vk, hs;
    bool has_hs;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* VmRSS or VmHWM of this process in bytes; 0 when /proc cannot say. */
static size_t proc_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0, klen = strlen(key);
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, key, klen) == 0 && line[klen] == ':')
            kib = strtoull(line + klen + 1, NULL, 10);
    if (f != NULL)
        fclose(f);
    return kib * 1024;
}

/* Starts a peak-memory window: frees what malloc holds, resets the peak
 * resident set to the current one and returns the current one. */
static size_t peak_begin(void)
{
    malloc_trim(0);
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f != NULL) {
        fputs("5", f);
        fclose(f);
    }
    return proc_kib("VmRSS");
}

static size_t peak_end(size_t base)
{
    size_t hwm = proc_kib("VmHWM");
    return hwm > base ? hwm - base : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint32_t bitnfa_counters; /* rules_options.bitnfa_counters; 0: default */
static uint32_t gate_bits;       /* rules_options.gate_bits; 0: default */
static uint32_t gate_states;     /* rules_options.gate_states; 1: gate every candidate */
static uint32_t gate_rare;       /* rules_options.gate_rare_bits; 0: default */
static uint32_t gated_bits;      /* rules_options.gated_group_bits; 0: default */
static uint32_t heavy;           /* rules_options.heavy_states; 0: default */
static bool no_minimise;         /* rules_options.no_minimise */
static bool print_groups;        /* --groups: one line per DFA group of each catalog */

/* Compiles rs with vkscan `repeat` times; on the first run also clears
 * keep[i] of the rules it rejects (keep indexes rs). */
static int measure_vk(const char *name, const struct ruleset *rs, const bool *keep_in, bool *keep,
                      int repeat, uint32_t max_states, struct figures *out)
{
    struct rule_src *v = xrealloc(NULL, rs->n * sizeof(*v));
    uint32_t *from = xrealloc(NULL, rs->n * sizeof(*from));
    size_t m = 0;
    for (size_t i = 0; i < rs->n; i++)
        if (keep_in[i]) {
            from[m] = (uint32_t)i;
            v[m++] = rs->v[i];
        }
    double wall[64], cpu[64];
    int rc = 0;
    for (int k = 0; k < repeat && rc == 0; k++) {
        struct rules_result res;
        struct vks_error err = {0};
        size_t base = k == 0 ? peak_begin() : 0;
        double t0 = now_s(), c0 = cpu_s();
        struct rules_options ro = {.max_states = max_states,
                                   .bitnfa_counters = bitnfa_counters,
                                   .gate_bits = gate_bits,
                                   .gate_states = gate_states,
                                   .gate_rare_bits = gate_rare,
                                   .gated_group_bits = gated_bits,
                                   .heavy_states = heavy,
                                   .no_minimise = no_minimise};
        rc = rules_compile(v, m, &ro, &res, &err);
        wall[k] = now_s() - t0;
        cpu[k] = cpu_s() - c0;
        if (rc != 0) {
            fprintf(stderr, "compile_bench: %s: %s\n", name, err.msg);
            break;
        }
        if (k == 0) {
            out->vk.peak = peak_end(base);
            for (size_t i = 0; i < m; i++)
                keep[from[i]] = res.rule_index[i] != UINT32_MAX;
        }
        size_t words = 0;
        catalog_words(res.catalog, &words);
        out->rules = m - res.n_rejects;
        out->rejects = res.n_rejects;
        out->groups = catalog_group_count(res.catalog);
        out->nfa_groups = catalog_nfa_count(res.catalog);
        out->nfa_rules = 0;
        out->passes = out->groups; /* the factor group walks every byte too */
        for (uint32_t g = 0; g < out->nfa_groups; g++) {
            struct catalog_nfa cn;
            catalog_nfa(res.catalog, g, &cn);
            out->passes += !(cn.flags & CAT_GF_GATED);
        }
        for (uint32_t i = 0; i < catalog_rule_count(res.catalog); i++) {
            struct catalog_rule r;
            catalog_rule(res.catalog, i, &r);
            out->nfa_rules += r.group >= out->groups;
        }
        out->states = catalog_total_states(res.catalog);
        out->vk.bytes = words * 4;
        catalog_fingerprint_hex(catalog_fingerprint(res.catalog), out->fp);
        if (k == 0 && print_groups)
            for (uint32_t g = 0; g < out->groups; g++) {
                struct catalog_group cg;
                catalog_group(res.catalog, g, &cg);
                fprintf(stderr, "%s group %u: %u states, %u classes, %u rules, maxlen %s%u%s%s\n",
                        name, g, cg.n_states, cg.n_classes, cg.n_rules,
                        cg.maxlen == CATALOG_UNBOUNDED ? "unbounded " : "",
                        cg.maxlen == CATALOG_UNBOUNDED ? 0 : cg.maxlen,
                        cg.flags & CAT_GF_FACTOR ? ", factor" : "",
                        cg.flags & CAT_GF_LITERAL ? ", literal" : "");
            }
        rules_result_finish(&res);
    }
    if (rc == 0) {
        out->vk.wall_s = median(wall, repeat);
        out->vk.cpu_s = median(cpu, repeat);
    }
    free(v);
    free(from);
    return rc;
}

/* One Hyperscan compile of the rules keep[] names; on a rule error clears
 * that rule's keep[] and returns -EAGAIN. */
static int hs_once(const struct ruleset *rs, char **expr, bool *keep, struct side *sd, bool first)
{
    const char **live = xrealloc(NULL, rs->n * sizeof(*live));
    unsigned *flags = xrealloc(NULL, rs->n * sizeof(*flags));
    unsigned *ids = xrealloc(NULL, rs->n * sizeof(*ids));
    unsigned m = 0;
    for (size_t i = 0; i < rs->n; i++)
        if (keep[i]) {
            live[m] = expr[i];
            flags[m] = hsrules_flags(rs->v[i].flags);
            ids[m++] = (unsigned)i;
        }
    hs_database_t *db = NULL;
    hs_compile_error_t *ce = NULL;
    size_t base = first ? peak_begin() : 0;
    double t0 = now_s(), c0 = cpu_s();
    int rc = m == 0 ? -ENOENT : 0;
    if (rc == 0 && hs_compile_multi(live, flags, ids, m, HS_MODE_BLOCK, NULL, &db, &ce) != 0) {
        rc = ce->expression >= 0 ? -EAGAIN : -EINVAL;
        if (ce->expression >= 0)
            keep[ids[ce->expression]] = false;
        else
            fprintf(stderr, "compile_bench: hs_compile_multi: %s\n", ce->message);
        hs_free_compile_error(ce);
    }
    sd->wall_s = now_s() - t0;
    sd->cpu_s = cpu_s() - c0;
    if (first)
        sd->peak = peak_end(base);
    if (db != NULL)
        hs_database_size(db, &sd->bytes);
    hs_free_database(db);
    free(live);
    free(flags);
    free(ids);
    return rc;
}

/* Compiles the rules keep[] names with Hyperscan `repeat` times, first
 * dropping (clearing keep[] of) the rules it rejects. */
static int measure_hs(const struct ruleset *rs, bool *keep, int repeat, struct figures *out)
{
    char **expr = xrealloc(NULL, rs->n * sizeof(*expr));
    for (size_t i = 0; i < rs->n; i++)
        expr[i] = hsrules_expr(&rs->v[i]);
    double wall[64], cpu[64];
    int rc;
    out->hs_rejects = 0;
    while ((rc = hs_once(rs, expr, keep, &out->hs, true)) == -EAGAIN)
        out->hs_rejects++;
    wall[0] = out->hs.wall_s;
    cpu[0] = out->hs.cpu_s;
    for (int k = 1; k < repeat && rc == 0; k++) {
        struct side sd = out->hs;
        rc = hs_once(rs, expr, keep, &sd, false);
        wall[k] = sd.wall_s;
        cpu[k] = sd.cpu_s;
    }
    if (rc == 0) {
        out->hs.wall_s = median(wall, repeat);
        out->hs.cpu_s = median(cpu, repeat);
        out->has_hs = true;
    }
    for (size_t i = 0; i < rs->n; i++)
        free(expr[i]);
    free(expr);
    return rc;
}

/* vkscan's compiles of one workload; keep[] (rs->n, the caller's) comes
 * back with the rules vkscan accepts. */
static int measure_vk_side(const char *name, const struct ruleset *rs, int repeat,
                           uint32_t max_states, bool *keep, struct figures *out)
{
    *out = (struct figures){.name = name};
    bool *all = xrealloc(NULL, rs->n * sizeof(bool));
    for (size_t i = 0; i < rs->n; i++)
        all[i] = true;
    int rc = measure_vk(name, rs, all, keep, repeat, max_states, out);
    free(all);
    return rc;
}

/* Hyperscan's compiles of the rules keep[] names, and vkscan's again when
 * Hyperscan rejects some, so both compile the same set (its peak is then
 * measured after Hyperscan's compiles). */
static int measure_hs_side(const char *name, const struct ruleset *rs, int repeat,
                           uint32_t max_states, bool *keep, struct figures *out)
{
    int rc = measure_hs(rs, keep, repeat, out);
    if (rc == 0 && out->hs_rejects > 0) {
        size_t rejects = out->rejects;
        bool *all = xrealloc(NULL, rs->n * sizeof(bool));
        memcpy(all, keep, rs->n * sizeof(bool));
        rc = measure_vk(name, rs, all, keep, repeat, max_states, out);
        out->rejects = rejects;
        free(all);
    }
    return rc;
}

static const char *verdict(bool ok, bool known)
{
    return !known ? "-" : ok ? "ok" : "MISS";
}

static bool size_ok(const struct figures *f)
{
    size_t lim = 4 * f->hs.bytes > (8u << 20) ? 4 * f->hs.bytes : (8u << 20);
    return f->vk.bytes <= lim;
}

static bool print_fp; /* --fp: each catalog's fingerprint after the table */

static void print_text(const struct figures *f, size_t n)
{
    printf("%-18s %6s %4s %4s | %7s %7s %7s %7s | %10s %9s %6s | %9s %5s %9s | %4s %4s %4s | "
           "%6s %8s %4s %5s %6s\n",
           "workload", "rules", "rej", "hsrj", "vk-wall", "vk-cpu", "hs-wall", "hs-cpu",
           "catalogKiB", "hsdbKiB", "x-hs", "vkpeakKiB", "x-cat", "hspeakKiB", "time", "size",
           "peak", "groups", "states", "nfaG", "nfaR", "passes");
    for (size_t i = 0; i < n; i++) {
        const struct figures *x = &f[i];
        printf("%-18s %6zu %4zu %4zu | %7.3f %7.3f %7.3f %7.3f | %10.1f %9.1f %6.1f | %9.0f %5.1f "
               "%9.0f | %4s %4s %4s | %6u %8" PRIu64 " %4u %5u %6u\n",
               x->name, x->rules, x->rejects, x->hs_rejects, x->vk.wall_s, x->vk.cpu_s,
               x->hs.wall_s, x->hs.cpu_s, (double)x->vk.bytes / 1024.0,
               (double)x->hs.bytes / 1024.0,
               x->hs.bytes ? (double)x->vk.bytes / (double)x->hs.bytes : 0.0,
               (double)x->vk.peak / 1024.0,
               x->vk.bytes ? (double)x->vk.peak / (double)x->vk.bytes : 0.0,
               (double)x->hs.peak / 1024.0, verdict(x->vk.cpu_s <= x->hs.cpu_s, x->has_hs),
               verdict(size_ok(x), x->has_hs), verdict(x->vk.peak <= 4 * x->vk.bytes, true),
               x->groups, x->states, x->nfa_groups, x->nfa_rules, x->passes);
    }
    for (size_t i = 0; print_fp && i < n; i++)
        printf("fingerprint %-18s %s\n", f[i].name, f[i].fp);
}

static void print_side(const char *key, const struct side *s)
{
    printf("\"%s\": {\"wall_s\": %.6f, \"cpu_s\": %.6f, \"bytes\": %zu, \"peak_bytes\": %zu}", key,
           s->wall_s, s->cpu_s, s->bytes, s->peak);
}

static void print_json(const struct figures *f, size_t n)
{
    printf("{\"bench\": \"compile_bench\", \"workloads\": [");
    for (size_t i = 0; i < n; i++) {
        printf("%s\n  {\"name\": \"%s\", \"rules\": %zu, \"rejects\": %zu, \"hs_rejects\": %zu, "
               "\"groups\": %u, \"states\": %" PRIu64 ", \"nfa_groups\": %u, \"nfa_rules\": %u, "
               "\"passes\": %u, \"fingerprint\": \"%s\", ",
               i ? "," : "", f[i].name, f[i].rules, f[i].rejects, f[i].hs_rejects, f[i].groups,
               f[i].states, f[i].nfa_groups, f[i].nfa_rules, f[i].passes, f[i].fp);
        print_side("vkscan", &f[i].vk);
        if (f[i].has_hs) {
            printf(", ");
            print_side("hyperscan", &f[i].hs);
        }
        printf("}");
    }
    printf("\n]}\n");
}

struct workload {
    const char *name;
    size_t count;     /* synthetic: how many rules */
    const char *file; /* real: path under the data folder */
};

static const struct workload workloads[] = {
    {"literals-1k", 1000, NULL},
    {"literals-10k", 10000, NULL},
    {"regex-500", 500, NULL},
    {"regex-500-secrets", 500, NULL},
    {"binary-20k", 20000, NULL},
    {"phrases-3k", 3000, NULL},
    {"gitleaks-regex", 0, "gitleaks/gitleaks-regex.rules"},
    {"gitleaks-keywords", 0, "gitleaks/gitleaks-keywords.rules"},
    {"dict-15", 0, "rebar/dict-15.rules"},
    {"dict-10", 0, "rebar/dict-10.rules"},
};

static int build(const struct workload *w, const char *data, struct ruleset *rs)
{
    if (w->file == NULL) {
        if (strncmp(w->name, "literals", 8) == 0)
            gen_literals(rs, w->count, 0x5eed0001u + w->count);
        else if (strcmp(w->name, "regex-500") == 0)
            gen_bounded_regexes(rs, w->count);
        else if (strncmp(w->name, "binary", 6) == 0)
            gen_binary(rs, w->count);
        else if (strncmp(w->name, "phrases", 7) == 0)
            gen_phrases(rs, w->count);
        else
            gen_regexes(rs, w->count, workload_secrets_seed());
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

/* Whether `name` is one of the comma-separated names in `only` (NULL: all). */
static bool wanted(const char *only, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = only; p != NULL; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return true;
    return only == NULL;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: compile_bench [--json] [--repeat N] [--data DIR] [--only NAME]\n"
            "                     [--max-states N] [--bitnfa-counters N] [--no-hs]\n"
            "                     [--no-minimise] [--gate-bits N] [--gate-states N] "
            "[--gate-rare-bits N] [--gated-group-bits N]\n"
            "                     [--heavy-states N] [--fp] [--groups] [--hs-interleave]\n");
    return 2;
}

int main(int argc, char **argv)
{
    bool json = false, with_hs = true, interleave = false;
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
        else if (strcmp(argv[i], "--no-hs") == 0)
            with_hs = false;
        else if (strcmp(argv[i], "--fp") == 0)
            print_fp = true;
        else if (strcmp(argv[i], "--groups") == 0)
            print_groups = true;
        else if (strcmp(argv[i], "--hs-interleave") == 0)
            interleave = true;
        else if (strcmp(argv[i], "--no-minimise") == 0)
            no_minimise = true;
        else if (strcmp(argv[i], "--bitnfa-counters") == 0 && i + 1 < argc)
            bitnfa_counters = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--gate-bits") == 0 && i + 1 < argc)
            gate_bits = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--gated-group-bits") == 0 && i + 1 < argc)
            gated_bits = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--heavy-states") == 0 && i + 1 < argc)
            heavy = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--gate-rare-bits") == 0 && i + 1 < argc)
            gate_rare = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--gate-states") == 0 && i + 1 < argc)
            gate_states = (uint32_t)strtoul(argv[++i], NULL, 10);
        else
            return usage();
    }
    if (repeat < 1 || repeat > 64)
        return usage();
    enum { NW = sizeof(workloads) / sizeof(workloads[0]) };
    struct figures figs[NW];
    struct ruleset sets[NW] = {{0}};
    bool *keeps[NW] = {NULL};
    size_t nf = 0;
    int status = 0;
    for (size_t i = 0; i < NW; i++) {
        const struct workload *w = &workloads[i];
        if (!wanted(only, w->name))
            continue;
        struct ruleset *rs = &sets[nf];
        if (build(w, data, rs) != 0) {
            status |= w->file == NULL;
            ruleset_free(rs);
            continue;
        }
        keeps[nf] = xrealloc(NULL, rs->n * sizeof(bool));
        int rc = measure_vk_side(w->name, rs, repeat, max_states, keeps[nf], &figs[nf]);
        if (rc == 0 && with_hs && interleave)
            rc = measure_hs_side(w->name, rs, repeat, max_states, keeps[nf], &figs[nf]);
        if (rc == 0) {
            nf++;
            continue;
        }
        status |= w->file == NULL;
        free(keeps[nf]);
        ruleset_free(rs);
    }
    for (size_t i = 0; i < nf && with_hs && !interleave; i++)
        if (measure_hs_side(figs[i].name, &sets[i], repeat, max_states, keeps[i], &figs[i]) != 0)
            status = 1;
    for (size_t i = 0; i < nf; i++) {
        free(keeps[i]);
        ruleset_free(&sets[i]);
    }
    if (json)
        print_json(figs, nf);
    else
        print_text(figs, nf);
    return status;
}
