/*
 * scan_bench: the GPU engine against Hyperscan on the same data.
 *
 * Workloads: N random literals of 8-16 bytes planted in random text, a set
 * of bounded regexes with planted instances, regex-N-secrets (compile_bench's
 * secret-scanning-shaped regexes, on sherlock.txt), binary-20k (20,000 random byte
 * strings of 8-32 bytes, planted), phrases-3k (3,000 caseless common-word
 * phrases on sherlock.txt, about 32 M matches per GiB), and the real rule sets of
 * ../shared/data on their haystacks repeated to --size. Every corpus is a
 * batch of --buffer-byte buffers; Hyperscan scans the same buffers (block
 * mode) on --threads threads. Per workload it prints kernel GB/s (GPU
 * timestamps), end-to-end GB/s (upload + device + readback of a batch that
 * starts in host memory), Hyperscan GB/s, the two ratios and both hit
 * counts, which must be equal. Deterministic: fixed seeds.
 *
 *   scan_bench [--size BYTES] [--literals N,N..] [--regexes N] [--threads T]
 *              [--device NAME|INDEX] [--buffer BYTES] [--real-buffer BYTES]
 *              [--iters N] [--warm-ms MS] [--segment BYTES] [--wg N] [--max-workgroups N]
 *              [--upload-threads N] [--upload-chunk BYTES] [--only NAME,NAME..]
 *              [--data DIR] [--no-hs] [--max-states N] [--bitnfa-counters N]
 *              [--gate-bits N] [--gate-states N] [--gate-rare-bits N]
 *              [--gated-group-bits N] [--heavy-states N] [--profile 1] [--hs-interleave] [--json]
 * [--json-out FILE]
 *              [--engine gpu|cpu] [--cpu-plain] [--confirm-cap BYTES]
 *              [--spec-lookback BYTES]
 *
 * --engine cpu runs the same workloads through the CPU engine instead
 * (rules/cpuscan.h, as vkscand's CPU pool runs it: every buffer cut into
 * segments spread over --threads threads, default all cores, then each
 * buffer's parts merged), with Hyperscan on the same threads in the same
 * run, and prints the medians of --iters of both and their ratio.
 * --lit-kernel 1|-1 forces the GPU literal kernel (gpu/lit.h) on every
 * literal group or turns it off (default 0: the engine's choice). No
 * Vulkan device is opened in that mode. --cpu-plain turns the CPU fast
 * paths (rules/cpuplan.h) off: the walks of rules/refscan.c alone.
 * --warm-ms MS (default 2000): untimed GPU dispatches of each workload for
 * at least MS after its first one, before its --iters timed ones, so the device's clock is up
 * (0: one warm-up dispatch, the old behaviour); stderr shows the first and
 * last warm-up kernel times.
 */
#include <errno.h>
#include <hs/hs.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpuplan.h"
#include "cpuscan.h"
#include "gpu.h"
#include "patfile.h"
#include "hsrules.h"
#include "rules.h"
#include "workloads.h"

struct opts {
    uint64_t size;
    uint32_t literals[8];
    uint32_t n_literal_sets;
    uint32_t regexes;
    uint32_t threads;
    const char *device;
    uint64_t buffer;
    uint64_t real_buffer;
    uint32_t iters;
    uint32_t warm_ms; /* --warm-ms: untimed dispatches first, at least this long */
    uint32_t segment;
    uint32_t wg;
    uint32_t upload_threads;
    uint32_t max_wgs;
    uint32_t upload_chunk; /* staging chunk bytes; 0: the engine's choice */
    bool no_hs;
    bool hs_interleave; /* --hs-interleave: Hyperscan right after each workload's GPU runs */
    const char *only;
    const char *data;
    const char *json_out;
    const char *dump_rules;   /* directory: write each workload's rules as a pattern file */
    uint32_t max_states;      /* the compiler's per-group DFA state budget; 0: default */
    uint32_t bitnfa_counters; /* rules_options.bitnfa_counters; 0: default */
    bool json;
    bool cpu;       /* --engine cpu */
    bool cpu_plain; /* --cpu-plain: no fast paths */
    bool threads_set;
};

struct result {
    char name[64];
    uint32_t rules;
    uint32_t rejected;
    uint64_t bytes;
    uint32_t buffers;
    double kernel_gbs, e2e_gbs, hs_gbs; /* best of --iters */
    double kernel_med_gbs, e2e_med_gbs; /* median of --iters */
    uint64_t gpu_hits, hs_hits;
    double compile_s, hs_compile_s;
    uint32_t dfa_groups, nfa_groups, nfa_rules; /* engines of the catalog */
    uint32_t factor_groups, gated_groups;       /* CAT_GF_FACTOR, CAT_GF_GATED */
    struct gpu_telemetry tel;
    double cpu_med_gbs, hs_med_gbs; /* medians of --iters (--engine cpu), of Hyperscan's runs */
    uint32_t lit_groups, window_groups, full_groups; /* the CPU plan (cpuplan.h) */
    uint32_t shadow_groups;
    double plan_s; /* building it */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "scan_bench: %s: %s\n", what, msg);
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        die("out of memory", "lower --size");
    return p;
}

static uint64_t next(uint64_t *s)
{
    return workload_next(s);
}

/* ---- rule sets and corpora -------------------------------------------- */

struct ruleset {
    struct rule_src *v;
    size_t n;
    size_t cap;
    char **owned;
    size_t n_owned;
};

static void rs_add(struct ruleset *rs, enum rule_kind kind, char *pat, size_t len, uint32_t flags)
{
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? rs->cap * 2 : 256;
        rs->v = realloc(rs->v, rs->cap * sizeof(*rs->v));
        rs->owned = realloc(rs->owned, rs->cap * sizeof(*rs->owned));
        if (rs->v == NULL || rs->owned == NULL)
            die("out of memory", "fewer rules");
    }
    char *id = xmalloc(16);
    snprintf(id, 16, "r%zu", rs->n);
    rs->owned[rs->n_owned++] = pat;
    rs->v[rs->n++] = (struct rule_src){id, kind, pat, len, flags, (uint32_t)rs->n + 1};
}

static void rs_free(struct ruleset *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        free((void *)rs->v[i].id);
    for (size_t i = 0; i < rs->n_owned; i++)
        free(rs->owned[i]);
    free(rs->v);
    free(rs->owned);
    memset(rs, 0, sizeof(*rs));
}

struct corpus {
    uint8_t *p;
    uint64_t size;
};

struct gen_job {
    uint8_t *p;
    uint64_t lo, hi;
    uint64_t seed;
};

static void *gen_text(void *arg)
{
    struct gen_job *j = arg;
    uint64_t s = j->seed | 1;
    for (uint64_t i = j->lo; i < j->hi; i += 8) {
        uint64_t r = next(&s);
        for (uint32_t k = 0; k < 8 && i + k < j->hi; k++, r >>= 8)
            j->p[i + k] = (uint8_t)((r & 0xff) % 27 == 26 ? ' ' : 'a' + (r & 0xff) % 27);
    }
    return NULL;
}

/* Random lowercase text with spaces, generated on `threads` threads with
 * per-slice seeds, so the corpus does not depend on the thread count. */
static void random_text(struct corpus *c, uint64_t size, uint32_t threads)
{
    c->p = xmalloc(size);
    c->size = size;
    enum { SLICES = 64 };
    struct gen_job jobs[SLICES];
    pthread_t th[SLICES];
    for (uint32_t base = 0; base < SLICES; base += threads) {
        uint32_t n = 0;
        for (uint32_t k = base; k < SLICES && k < base + threads; k++, n++) {
            jobs[k] = (struct gen_job){c->p, size * k / SLICES, size * (k + 1) / SLICES,
                                       0x9e3779b97f4a7c15ull * (k + 1)};
            pthread_create(&th[k], NULL, gen_text, &jobs[k]);
        }
        for (uint32_t k = base; k < base + n; k++)
            pthread_join(th[k], NULL);
    }
}

static char *random_word(uint64_t *s, uint32_t min, uint32_t max, size_t *len)
{
    char *w = workload_word(s, min, max, len);
    if (w == NULL)
        die("out of memory", "fewer rules");
    return w;
}

/* N literals of 8-16 letters, one planted every ~4 KiB. */
static void literal_workload(uint32_t n, struct ruleset *rs, struct corpus *c, const struct opts *o)
{
    uint64_t s = 0x1234567ull + n;
    for (uint32_t i = 0; i < n; i++) {
        size_t len;
        char *w = random_word(&s, 8, 16, &len);
        rs_add(rs, RULE_LITERAL, w, len, 0);
    }
    random_text(c, o->size, o->threads);
    for (uint64_t at = 0; at + 4096 <= c->size; at += 4096) {
        const struct rule_src *r = &rs->v[next(&s) % rs->n];
        memcpy(c->p + at + next(&s) % (4096 - r->len), r->pattern, r->len);
    }
}

/* The bounded regexes of bench/workloads.c, with an instance of one planted
 * every ~4 KiB. */
static void regex_workload(uint32_t n, struct ruleset *rs, struct corpus *c, const struct opts *o)
{
    uint64_t s = workload_regex_seed(n);
    char **inst = xmalloc(n * sizeof(*inst));
    for (uint32_t i = 0; i < n; i++) {
        char *pat = xmalloc(96);
        inst[i] = xmalloc(64);
        if (workload_regex(&s, i, pat, inst[i]) != 0)
            die("out of memory", "fewer regexes");
        rs_add(rs, RULE_REGEX, pat, strlen(pat), 0);
    }
    random_text(c, o->size, o->threads);
    for (uint64_t at = 0; at + 4096 <= c->size; at += 4096) {
        const char *in = inst[next(&s) % n];
        size_t len = strlen(in);
        memcpy(c->p + at + next(&s) % (4096 - len), in, len);
    }
    for (uint32_t i = 0; i < n; i++)
        free(inst[i]);
    free(inst);
}

/* binary-N of bench/workloads.c: \xHH regexes of random byte strings, one
 * string planted every ~4 KiB of random text. */
static void binary_workload(uint32_t n, struct ruleset *rs, struct corpus *c, const struct opts *o)
{
    uint64_t s = workload_binary_seed(n);
    uint8_t(*inst)[WORKLOAD_BINARY_MAX] = xmalloc(n * sizeof(*inst));
    size_t *len = xmalloc(n * sizeof(*len));
    for (uint32_t i = 0; i < n; i++) {
        char *pat = xmalloc(4 * WORKLOAD_BINARY_MAX + 1);
        len[i] = workload_binary(&s, inst[i], pat);
        rs_add(rs, RULE_REGEX, pat, 4 * len[i], 0);
    }
    random_text(c, o->size, o->threads);
    for (uint64_t at = 0; at + 4096 <= c->size; at += 4096) {
        uint32_t k = (uint32_t)(next(&s) % n);
        memcpy(c->p + at + next(&s) % (4096 - len[k]), inst[k], len[k]);
    }
    free(inst);
    free(len);
}

static bool hay_corpus(const char *hay, struct corpus *c, const struct opts *o);

/* phrases-N of bench/workloads.c: caseless phrases of common words on
 * English text (sherlock.txt repeated to --size). */
static bool phrase_workload(uint32_t n, struct ruleset *rs, struct corpus *c, const struct opts *o)
{
    char **ph = workload_phrases(n);
    if (ph == NULL || !hay_corpus("rebar/haystacks/sherlock.txt", c, o)) {
        fprintf(stderr,
                "scan_bench: rebar/haystacks/sherlock.txt not found under %s: "
                "phrases skipped\n",
                o->data);
        workload_phrases_free(ph, n);
        return false;
    }
    for (uint32_t i = 0; i < n; i++) {
        rs_add(rs, RULE_LITERAL, ph[i], strlen(ph[i]), RULE_F_CASELESS);
        ph[i] = NULL; /* the rule set owns it now */
    }
    workload_phrases_free(ph, n);
    return true;
}

static char *read_file(const char *path, size_t *len)
{
    char *text;
    return workload_read_file(path, &text, len) == 0 ? text : NULL;
}

/* o->size bytes of the haystack file `hay` (under --data), repeated. */
static bool hay_corpus(const char *hay, struct corpus *c, const struct opts *o)
{
    char path[1024];
    size_t hlen;
    snprintf(path, sizeof(path), "%s/%s", o->data, hay);
    char *h = read_file(path, &hlen);
    if (h == NULL || hlen == 0) {
        free(h);
        return false;
    }
    c->size = o->size;
    c->p = xmalloc(c->size);
    for (uint64_t at = 0; at < c->size; at += hlen)
        memcpy(c->p + at, h, c->size - at < hlen ? c->size - at : hlen);
    free(h);
    return true;
}

/* A real rule set from ../shared/data on its haystack, repeated to size. */
static bool real_workload(const char *rules, const char *hay, struct ruleset *rs, struct corpus *c,
                          const struct opts *o)
{
    char path[1024];
    size_t len;
    snprintf(path, sizeof(path), "%s/%s", o->data, rules);
    char *text = read_file(path, &len);
    if (text == NULL || !hay_corpus(hay, c, o)) {
        fprintf(stderr, "scan_bench: %s or %s not found under %s: skipped\n", rules, hay, o->data);
        free(text);
        return false;
    }
    struct patfile pf;
    struct vks_error err;
    if (patfile_parse(text, len, &pf, &err) < 0)
        die(rules, err.msg);
    for (size_t i = 0; i < pf.n; i++) {
        char *pat = xmalloc(pf.rules[i].len + 1);
        memcpy(pat, pf.rules[i].pattern, pf.rules[i].len);
        pat[pf.rules[i].len] = '\0';
        rs_add(rs, pf.rules[i].kind, pat, pf.rules[i].len, pf.rules[i].flags);
    }
    patfile_finish(&pf);
    free(text);
    return true;
}

/* regex-N-secrets of bench/workloads.c (compile_bench's set) over English
 * text: like gitleaks-regex on it, a set whose matches are rare there. */
static bool secrets_workload(uint32_t n, struct ruleset *rs, struct corpus *c, const struct opts *o)
{
    if (!hay_corpus("rebar/haystacks/sherlock.txt", c, o)) {
        fprintf(stderr,
                "scan_bench: rebar/haystacks/sherlock.txt not found under %s: "
                "regex-%u-secrets skipped\n",
                o->data, n);
        return false;
    }
    uint64_t s = workload_secrets_seed();
    for (uint32_t i = 0; i < n; i++) {
        char *pat = xmalloc(WORKLOAD_SECRET_MAX);
        uint32_t flags;
        size_t len = workload_secret(&s, pat, &flags);
        rs_add(rs, RULE_REGEX, pat, len, flags ? RULE_F_CASELESS : 0);
    }
    return true;
}

/* ---- Hyperscan ---------------------------------------------------------- */

struct hs_job {
    const hs_database_t *db;
    hs_scratch_t *proto;
    const struct gpu_buffer *bufs;
    uint32_t n;
    atomic_uint next;
    atomic_uint_fast64_t hits;
};

static int on_match(unsigned id, unsigned long long from, unsigned long long to, unsigned flags,
                    void *ctx)
{
    (void)id;
    (void)from;
    (void)to;
    (void)flags;
    (*(uint64_t *)ctx)++;
    return 0;
}

static void *hs_worker(void *arg)
{
    struct hs_job *j = arg;
    hs_scratch_t *scratch = NULL;
    if (hs_clone_scratch(j->proto, &scratch) != HS_SUCCESS)
        die("hs_clone_scratch", "failed");
    uint64_t hits = 0;
    for (;;) {
        uint32_t i = atomic_fetch_add(&j->next, 64);
        if (i >= j->n)
            break;
        for (uint32_t k = i; k < i + 64 && k < j->n; k++)
            hs_scan(j->db, (const char *)j->bufs[k].data, (unsigned)j->bufs[k].len, 0, scratch,
                    on_match, &hits);
    }
    atomic_fetch_add(&j->hits, hits);
    hs_free_scratch(scratch);
    return NULL;
}

static double hs_run(const hs_database_t *db, const struct gpu_buffer *bufs, uint32_t n,
                     uint32_t threads, uint64_t *hits)
{
    struct hs_job j = {.db = db, .bufs = bufs, .n = n};
    if (hs_alloc_scratch(db, &j.proto) != HS_SUCCESS)
        die("hs_alloc_scratch", "failed");
    atomic_init(&j.next, 0);
    atomic_init(&j.hits, 0);
    pthread_t *th = xmalloc(threads * sizeof(*th));
    double t0 = now_s();
    for (uint32_t t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, hs_worker, &j);
    for (uint32_t t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    double dt = now_s() - t0;
    free(th);
    hs_free_scratch(j.proto);
    *hits = atomic_load(&j.hits);
    return dt;
}

/* ---- one workload ------------------------------------------------------- */

static uint32_t bitnfa_counters; /* --bitnfa-counters */
static uint32_t gate_bits;       /* --gate-bits: rules_options.gate_bits */
static uint32_t gate_states; /* --gate-states: rules_options.gate_states; 1: gate every candidate */
static uint32_t gate_rare;   /* --gate-rare-bits: rules_options.gate_rare_bits */
static bool profile;         /* --profile 1: gpu_options.profile (each dispatch timed alone) */
static uint32_t serialize;   /* --serialize 0|1|2: gpu_options.serialize */
static uint32_t fuse_groups; /* --fuse N: gpu_options.fuse_groups (1: no fused DFA passes) */
static uint32_t confirm_cap; /* --confirm-cap: gpu_options.confirm_cap (0: the engine's rule) */
static uint32_t spec_look;   /* --spec-lookback: gpu_options.spec_lookback */
static uint32_t gated_bits;  /* --gated-group-bits: rules_options.gated_group_bits */
static uint32_t heavy;       /* --heavy-states: rules_options.heavy_states */

static struct catalog *compile_ours(const struct ruleset *rs, bool *keep, uint32_t *rejected,
                                    double *secs, uint32_t max_states)
{
    struct rule_src *v = xmalloc(rs->n * sizeof(*v));
    size_t m = 0;
    for (size_t i = 0; i < rs->n; i++) {
        if (keep[i])
            v[m++] = rs->v[i];
    }
    struct rules_result res = {0};
    struct vks_error err;
    double t0 = now_s();
    struct rules_options ro = {.max_states = max_states,
                               .bitnfa_counters = bitnfa_counters,
                               .gate_bits = gate_bits,
                               .gate_states = gate_states,
                               .gate_rare_bits = gate_rare,
                               .gated_group_bits = gated_bits,
                               .heavy_states = heavy};
    if (rules_compile(v, m, &ro, &res, &err) < 0)
        die("rules_compile", err.msg);
    *secs = now_s() - t0;
    /* Rules we reject are dropped from Hyperscan's set too. */
    size_t k = 0;
    for (size_t i = 0; i < rs->n; i++) {
        if (!keep[i])
            continue;
        if (res.rule_index[k++] == UINT32_MAX)
            keep[i] = false;
    }
    *rejected = (uint32_t)res.n_rejects;
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    free(v);
    return cat;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Writes a workload's rules in the pattern-file form, so the compiler can be
 * studied on exactly the set the GPU scans (vkscan rules check FILE). */
static void dump_rules(const char *dir, const char *name, const struct ruleset *rs)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.rules", dir, name);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        die("cannot write the rules dump", path);
    for (size_t i = 0; i < rs->n; i++) {
        const struct rule_src *r = &rs->v[i];
        const char *open = r->kind == RULE_REGEX ? "/" : r->kind == RULE_HEX ? "{" : "\"";
        const char *close = r->kind == RULE_REGEX ? "/" : r->kind == RULE_HEX ? "}" : "\"";
        fprintf(f, "%s:%s%.*s%s%s%s\n", r->id, open, (int)r->len, r->pattern, close,
                r->flags & RULE_F_CASELESS ? "i" : "", r->flags & RULE_F_SINGLEMATCH ? "H" : "");
    }
    fclose(f);
}

/* Starts `out` for workload `name` and compiles its rules for both sides:
 * Hyperscan (none with --no-hs) and our catalog of the same rules, so that
 * a rule one side rejects is left out of both. `keep` (rs->n, the caller
 * frees it) says which rules were kept. */
static struct catalog *compile_both(const char *name, struct ruleset *rs, const struct opts *o,
                                    struct result *out, bool **keep_out, hs_database_t **db_out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", name);
    if (o->dump_rules != NULL)
        dump_rules(o->dump_rules, name, rs);
    bool *keep = xmalloc(rs->n * sizeof(bool));
    for (size_t i = 0; i < rs->n; i++)
        keep[i] = true;
    uint32_t rejected;
    struct catalog *cat = compile_ours(rs, keep, &rejected, &out->compile_s, o->max_states);
    double t0 = now_s();
    hs_database_t *db = o->no_hs ? NULL : hsrules_build(rs->v, rs->n, keep, HS_MODE_BLOCK, NULL);
    out->hs_compile_s = now_s() - t0;
    size_t both = 0;
    for (size_t i = 0; i < rs->n; i++)
        both += keep[i];
    if (both != catalog_rule_count(cat)) { /* Hyperscan dropped some: same set for both */
        catalog_destroy(cat);
        cat = compile_ours(rs, keep, &rejected, &out->compile_s, o->max_states);
    }
    out->rules = catalog_rule_count(cat);
    out->rejected = (uint32_t)(rs->n - out->rules);
    out->dfa_groups = catalog_group_count(cat);
    out->nfa_groups = catalog_nfa_count(cat);
    *keep_out = keep;
    *db_out = db;
    return cat;
}

/*
 * Hyperscan's runs of one workload: best and median of up to 3. By default
 * they run after every workload's GPU runs, not between them: on the H200
 * a second or so of Hyperscan on 16 threads before a workload's GPU runs
 * made the regex sets' kernels 3-4x slower (session 13, call 6:
 * regex-500 42 against 156 GB/s), the literal sets' not at all; the
 * rival's numbers are the same either way. --hs-interleave restores the
 * old order.
 */
struct hs_later {
    hs_database_t *db;
    struct gpu_buffer *bufs;
    uint32_t n;
    uint8_t *corpus; /* owned once deferred */
    uint64_t size;
    struct result *out;
};
#define MAX_LATER 16
static struct hs_later later[MAX_LATER];
static size_t n_later;

static void hs_measure(struct hs_later *h, const struct opts *o)
{
    double hs_t[3], best_h = 1e30;
    uint32_t hs_n = 0;
    for (uint32_t it = 0; h->db != NULL && it < (o->iters > 3 ? 3 : o->iters); it++) {
        double t = hs_run(h->db, h->bufs, h->n, o->threads, &h->out->hs_hits);
        hs_t[hs_n++] = t;
        if (t < best_h)
            best_h = t;
    }
    double gb = (double)h->size / 1e9;
    h->out->hs_gbs = hs_n > 0 ? gb / best_h : 0;
    if (hs_n > 0) {
        qsort(hs_t, hs_n, sizeof(double), cmp_double);
        h->out->hs_med_gbs = gb / hs_t[hs_n / 2];
    }
    hs_free_database(h->db);
    h->db = NULL;
}

static void run_workload(struct gpu_engine *eng, const char *name, struct ruleset *rs,
                         struct corpus *c, uint64_t buffer, const struct opts *o,
                         struct result *out)
{
    bool *keep;
    hs_database_t *db;
    struct catalog *cat = compile_both(name, rs, o, out, &keep, &db);
    for (uint32_t g = 0; g < out->dfa_groups; g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        out->factor_groups += (cg.flags & CAT_GF_FACTOR) != 0;
    }
    for (uint32_t g = 0; g < out->nfa_groups; g++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, g, &cn);
        out->gated_groups += (cn.flags & CAT_GF_GATED) != 0;
    }
    for (uint32_t i = 0; i < out->rules; i++) {
        struct catalog_rule r;
        catalog_rule(cat, i, &r);
        out->nfa_rules += r.group >= out->dfa_groups;
    }
    uint32_t n = (uint32_t)((c->size + buffer - 1) / buffer);
    struct gpu_buffer *bufs = xmalloc(n * sizeof(*bufs));
    for (uint32_t i = 0; i < n; i++) {
        uint64_t lo = (uint64_t)i * buffer;
        bufs[i] = (struct gpu_buffer){.data = c->p + lo,
                                      .len = c->size - lo < buffer ? c->size - lo : buffer};
    }
    out->bytes = c->size;
    out->buffers = n;
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, n};
    struct gpu_result res = {0};
    struct vks_error err;
    double best_k = 1e30, best_e = 1e30;
    double *ks = xmalloc(o->iters * sizeof(double)), *es = xmalloc(o->iters * sizeof(double));
    /*
     * Warm-up, untimed: pipelines, catalog upload, buffer growth, and the
     * GPU's clock. The H200 idles at 345 MHz a second after its last work
     * and takes 1.5 s of load to reach 1,980 (nvidia-smi, session 17): a
     * second of Hyperscan compile before a workload left gitleaks-regex's
     * first 15 timed iterations at 45 down to 8.7 ms. So after the first
     * dispatch (seconds of pipeline compiles for the regex sets, with the
     * GPU idle) dispatch for at least --warm-ms (default 2000) more.
     */
    double w0 = now_s(), cold_k = 0;
    uint32_t warm_n = 0;
    do {
        if (gpu_batch_dispatch(eng, &b, &res, &err) < 0)
            die(name, err.msg);
        if (warm_n++ == 0) {
            cold_k = (double)res.tel.kernel_ns * 1e-6;
            w0 = now_s();
        }
    } while ((now_s() - w0) * 1e3 < o->warm_ms);
    fprintf(stderr,
            "%s warm-up: %u dispatches, %.0f ms after the first, kernel %.2f ms first, "
            "%.2f ms last\n",
            name, warm_n, (now_s() - w0) * 1e3, cold_k, (double)res.tel.kernel_ns * 1e-6);
    for (uint32_t it = 1; it <= o->iters; it++) {
        if (gpu_batch_dispatch(eng, &b, &res, &err) < 0)
            die(name, err.msg);
        const struct gpu_telemetry *t = &res.tel;
        double k = (double)t->kernel_ns * 1e-9;
        /* to the hits as the caller gets them: sorted, copies dropped, report
         * modes applied (before session 11 e2e stopped at the readback) */
        double e = (double)(t->upload_ns + t->device_ns + t->readback_ns + t->finalize_ns) * 1e-9;
        ks[it - 1] = k;
        es[it - 1] = e;
        /* each iteration's kernel, in order: the regex sets' kernels have
         * been bimodal within one process (session 17) */
        fprintf(stderr, "%s iteration %u: kernel %.2f ms\n", name, it, k * 1e3);
        if (k < best_k)
            best_k = k;
        if (e < best_e) {
            best_e = e;
            out->tel = *t;
        }
    }
    out->gpu_hits = res.n_hits;
    double gb = (double)c->size / 1e9;
    out->kernel_gbs = gb / best_k;
    out->e2e_gbs = gb / best_e;
    qsort(ks, o->iters, sizeof(double), cmp_double);
    qsort(es, o->iters, sizeof(double), cmp_double);
    out->kernel_med_gbs = gb / ks[o->iters / 2];
    out->e2e_med_gbs = gb / es[o->iters / 2];
    free(ks);
    free(es);
    gpu_result_finish(&res);
    catalog_destroy(cat);
    free(keep);
    struct hs_later h = {db, bufs, n, c->p, c->size, out};
    if (db != NULL && !o->hs_interleave && n_later < MAX_LATER) {
        later[n_later++] = h; /* hs_measure_later: after every workload's GPU runs */
        c->p = NULL;          /* the corpus is the entry's now */
        return;
    }
    hs_measure(&h, o);
    free(bufs);
}

/* Every entry left for later (the corpora stay in memory until then). */
static void hs_measure_later(const struct opts *o)
{
    for (size_t i = 0; i < n_later; i++) {
        hs_measure(&later[i], o);
        free(later[i].bufs);
        free(later[i].corpus);
    }
    n_later = 0;
}

/* ---- the CPU engine (--engine cpu) -------------------------------------- */

/* One segment of one buffer, as vkscand's CPU pool cuts them. */
struct cpu_task {
    uint32_t buf;
    uint64_t lo, hi;
};

struct cpu_job {
    const struct catalog *cat;
    const struct gpu_buffer *bufs;
    uint32_t n_bufs;
    struct cpu_task *tasks;
    uint32_t n_tasks;
    uint32_t *first; /* per buffer: its first task; first[n_bufs] = n_tasks */
    struct cpuscan_part *parts;
    atomic_uint next, next_merge;
    atomic_uint_fast64_t hits;
};

/* Segments of `len` bytes on `threads` threads: daemon/engine_cpu.c's
 * seg_size with the default cpu-segment-bytes (4 MiB). */
static uint64_t cpu_seg_size(uint64_t lb, uint64_t len, uint32_t threads)
{
    if (lb == CPUSCAN_UNSEGMENTABLE)
        return len;
    uint64_t seg = len / threads > (64u << 10) ? len / threads : (64u << 10);
    seg = seg > (4u << 20) ? (4u << 20) : seg;
    return seg < 4 * lb ? 4 * lb : seg;
}

static void cpu_plan_tasks(struct cpu_job *j, uint32_t threads)
{
    uint64_t lb = cpuscan_lookback(j->cat), n = 0;
    for (uint32_t b = 0; b < j->n_bufs; b++) {
        uint64_t seg = cpu_seg_size(lb, j->bufs[b].len, threads);
        n += j->bufs[b].len <= seg ? 1 : (j->bufs[b].len + seg - 1) / seg;
    }
    j->tasks = xmalloc(n * sizeof(*j->tasks));
    j->first = xmalloc((j->n_bufs + 1) * sizeof(*j->first));
    j->parts = calloc(n ? n : 1, sizeof(*j->parts));
    if (j->parts == NULL)
        die("out of memory", "lower --size");
    uint32_t t = 0;
    for (uint32_t b = 0; b < j->n_bufs; b++) {
        uint64_t len = j->bufs[b].len, seg = cpu_seg_size(lb, len, threads);
        j->first[b] = t;
        for (uint64_t lo = 0; lo < len || (len == 0 && lo == 0); lo += seg) {
            j->tasks[t++] = (struct cpu_task){b, lo, lo + seg < len ? lo + seg : len};
            if (len == 0)
                break;
        }
    }
    j->first[j->n_bufs] = t;
    j->n_tasks = t;
}

/* A pool thread: segments first, in order, then the merges of whole
 * buffers (a buffer's merge needs all its segments: the threads meet in
 * between, as the daemon's last task of a batch merges). */
static void *cpu_worker(void *arg)
{
    struct cpu_job *j = arg;
    struct cpuscan_scratch *s;
    if (cpuscan_scratch_create(&s) != 0)
        die("cpuscan_scratch_create", "out of memory");
    for (;;) {
        uint32_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n_tasks)
            break;
        const struct cpu_task *t = &j->tasks[i];
        const struct gpu_buffer *b = &j->bufs[t->buf];
        if (cpuscan_segment(j->cat, b->data, (size_t)b->len, t->lo, t->hi, SCAN_ALL, 0, NULL, NULL,
                            s, &j->parts[i]) != 0)
            die("cpuscan_segment", "failed");
    }
    cpuscan_scratch_destroy(s);
    return NULL;
}

static void *cpu_merger(void *arg)
{
    struct cpu_job *j = arg;
    uint64_t hits = 0;
    struct scan_hits out = {0};
    for (;;) {
        uint32_t b = atomic_fetch_add(&j->next_merge, 1);
        if (b >= j->n_bufs)
            break;
        uint64_t dropped = 0;
        out.n = 0;
        if (cpuscan_merge(j->cat, SCAN_ALL, &j->parts[j->first[b]], j->first[b + 1] - j->first[b],
                          UINT64_MAX, false, &out, &dropped) != 0)
            die("cpuscan_merge", "out of memory");
        hits += out.n;
        for (uint32_t t = j->first[b]; t < j->first[b + 1]; t++)
            cpuscan_part_finish(&j->parts[t]);
    }
    scan_hits_finish(&out);
    atomic_fetch_add(&j->hits, hits);
    return NULL;
}

/* One scan of every buffer on `threads` threads; returns its seconds. */
static double cpu_run(struct cpu_job *j, uint32_t threads, uint64_t *hits)
{
    pthread_t *th = xmalloc(threads * sizeof(*th));
    atomic_init(&j->next, 0);
    atomic_init(&j->next_merge, 0);
    atomic_init(&j->hits, 0);
    double t0 = now_s();
    for (uint32_t t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, cpu_worker, j);
    for (uint32_t t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    for (uint32_t t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, cpu_merger, j);
    for (uint32_t t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    double dt = now_s() - t0;
    free(th);
    *hits = atomic_load(&j->hits);
    return dt;
}

static void run_workload_cpu(const char *name, struct ruleset *rs, struct corpus *c,
                             uint64_t buffer, const struct opts *o, struct result *out)
{
    bool *keep;
    hs_database_t *db;
    struct catalog *cat = compile_both(name, rs, o, out, &keep, &db);
    struct cpuplan *plan;
    double t0 = now_s();
    if (cpuplan_get(cat, &plan) != 0)
        die(name, "out of memory planning the CPU scan");
    out->plan_s = now_s() - t0;
    out->lit_groups = plan->n_lit_groups;
    out->window_groups = plan->n_window_groups;
    out->shadow_groups = plan->n_shadow_groups;
    out->full_groups = plan->n_dfa + plan->n_nfa - plan->n_lit_groups - plan->n_window_groups -
                       plan->n_shadow_groups;
    cpuplan_put(plan);
    uint32_t n = (uint32_t)((c->size + buffer - 1) / buffer);
    struct gpu_buffer *bufs = xmalloc(n * sizeof(*bufs));
    for (uint32_t i = 0; i < n; i++) {
        uint64_t lo = (uint64_t)i * buffer;
        bufs[i] = (struct gpu_buffer){.data = c->p + lo,
                                      .len = c->size - lo < buffer ? c->size - lo : buffer};
    }
    out->bytes = c->size;
    out->buffers = n;
    struct cpu_job j = {.cat = cat, .bufs = bufs, .n_bufs = n};
    cpu_plan_tasks(&j, o->threads);
    double *cs = xmalloc(o->iters * sizeof(double)), *hs = xmalloc(o->iters * sizeof(double));
    for (uint32_t it = 0; it < o->iters; it++) { /* interleaved: both see the same load */
        cs[it] = cpu_run(&j, o->threads, &out->gpu_hits);
        hs[it] = db != NULL ? hs_run(db, bufs, n, o->threads, &out->hs_hits) : 1e30;
    }
    qsort(cs, o->iters, sizeof(double), cmp_double);
    qsort(hs, o->iters, sizeof(double), cmp_double);
    double gb = (double)c->size / 1e9;
    out->cpu_med_gbs = gb / cs[o->iters / 2];
    out->hs_med_gbs = db != NULL ? gb / hs[o->iters / 2] : 0;
    out->hs_gbs = out->hs_med_gbs;
    free(cs);
    free(hs);
    free(j.tasks);
    free(j.first);
    free(j.parts);
    hs_free_database(db);
    catalog_destroy(cat);
    free(bufs);
    free(keep);
}

static void print_cpu(FILE *f, const struct result *r, size_t n, const struct opts *o, bool json)
{
    if (json) {
        fprintf(
            f,
            "{\"engine\":\"cpu\",\"threads\":%u,\"fast\":%s,\"hyperscan\":\"%s\",\"workloads\":[",
            o->threads, o->cpu_plain ? "false" : "true", hs_version());
        for (size_t i = 0; i < n; i++)
            fprintf(f,
                    "%s{\"name\":\"%s\",\"rules\":%u,\"bytes\":%" PRIu64 ",\"cpu_med_gbs\":%.4f,"
                    "\"hs_med_gbs\":%.4f,\"cpu_hits\":%" PRIu64 ",\"hs_hits\":%" PRIu64
                    ",\"lit_groups\":%u,\"window_groups\":%u,\"shadow_groups\":%u,"
                    "\"full_groups\":%u,\"plan_s\":%.3f}",
                    i ? "," : "", r[i].name, r[i].rules, r[i].bytes, r[i].cpu_med_gbs,
                    r[i].hs_med_gbs, r[i].gpu_hits, r[i].hs_hits, r[i].lit_groups,
                    r[i].window_groups, r[i].shadow_groups, r[i].full_groups, r[i].plan_s);
        fprintf(f, "]}\n");
        return;
    }
    fprintf(f, "CPU engine (%s) and Hyperscan %s, both on %u threads; medians of %u\n",
            o->cpu_plain ? "refscan walks only" : "fast paths", hs_version(), o->threads, o->iters);
    fprintf(f, "%-20s %6s %6s %9s %9s %7s %10s %10s %5s %15s %7s\n", "workload", "rules", "MiB",
            "cpuGB/s", "hsGB/s", "cpu/hs", "cpu hits", "hs hits", "equal", "lit/win/sh/full",
            "plan s");
    for (size_t i = 0; i < n; i++) {
        const struct result *x = &r[i];
        char groups[48];
        snprintf(groups, sizeof(groups), "%u/%u/%u/%u", x->lit_groups, x->window_groups,
                 x->shadow_groups, x->full_groups);
        fprintf(f, "%-20s %6u %6.0f %9.3f %9.3f %7.2f %10" PRIu64 " %10" PRIu64 " %5s %15s %7.2f\n",
                x->name, x->rules, (double)x->bytes / 1048576.0, x->cpu_med_gbs, x->hs_med_gbs,
                x->hs_med_gbs > 0 ? x->cpu_med_gbs / x->hs_med_gbs : 0, x->gpu_hits, x->hs_hits,
                x->hs_med_gbs == 0          ? "-"
                : x->gpu_hits == x->hs_hits ? "yes"
                                            : "NO",
                groups, x->plan_s);
    }
}

/* ---- output ------------------------------------------------------------- */

static void print_text(const struct result *r, size_t n, const struct gpu_device_info *d,
                       const struct opts *o)
{
    printf("device: %s (%s), subgroup %u, hit writer %s; Hyperscan %s on %u threads\n", d->name,
           d->driver, d->subgroup_size,
           r[0].tel.hit_writer == GPU_HITS_SUBGROUP ? "subgroup" : "scalar", hs_version(),
           o->threads);
    printf("%-22s %6s %6s %8s %9s %9s %8s %7s %7s %10s %10s %s\n", "workload", "rules", "rej",
           "MiB", "kernGB/s", "e2eGB/s", "hsGB/s", "k/hs", "e2e/hs", "gpu hits", "hs hits",
           "equal");
    for (size_t i = 0; i < n; i++) {
        const struct result *x = &r[i];
        printf("%-22s %6u %6u %8.0f %9.1f %9.1f %8.2f %7.1f %7.1f %10" PRIu64 " %10" PRIu64 " %s\n",
               x->name, x->rules, x->rejected, (double)x->bytes / 1048576.0, x->kernel_gbs,
               x->e2e_gbs, x->hs_gbs, x->hs_gbs > 0 ? x->kernel_gbs / x->hs_gbs : 0,
               x->hs_gbs > 0 ? x->e2e_gbs / x->hs_gbs : 0, x->gpu_hits, x->hs_hits,
               x->hs_gbs == 0              ? "-"
               : x->gpu_hits == x->hs_hits ? "yes"
                                           : "NO");
    }
    printf("\n%-22s %9s %9s %9s %7s\n", "median of iters", "kernGB/s", "e2eGB/s", "hsGB/s", "k/hs");
    for (size_t i = 0; i < n; i++)
        printf("%-22s %9.1f %9.1f %9.2f %7.1f\n", r[i].name, r[i].kernel_med_gbs, r[i].e2e_med_gbs,
               r[i].hs_med_gbs, r[i].hs_med_gbs > 0 ? r[i].kernel_med_gbs / r[i].hs_med_gbs : 0);
    /* passes: groups that walk every byte. The factor group runs on the host
     * at plan time; gated groups walk only around its factors' ends. */
    /* lit: DFA groups of plain strings that the literal kernel scans in
     * one pass of its own instead (gpu/lit.h); fused: DFA groups stepped in
     * another group's pass (gpu_options.fuse_groups) */
    printf("\n%-22s %10s %10s %10s %8s %8s %8s %8s %8s\n", "engines", "dfa groups", "nfa groups",
           "nfa rules", "gated", "factor", "lit", "fused", "passes");
    for (size_t i = 0; i < n; i++) {
        uint32_t lit = r[i].tel.lit_groups, fused = r[i].tel.fused_groups;
        printf("%-22s %10u %10u %10u %8u %8u %8u %8u %8u\n", r[i].name, r[i].dfa_groups,
               r[i].nfa_groups, r[i].nfa_rules, r[i].gated_groups, r[i].factor_groups, lit, fused,
               r[i].dfa_groups + r[i].nfa_groups - r[i].gated_groups - lit + (lit > 0) - fused);
    }
    printf("\n%-22s %8s %8s %8s %8s %8s %8s %8s %6s %6s %8s %6s %8s %8s\n", "telemetry", "plan ms",
           "fac ms", "up ms", "dev ms", "kern ms", "read ms", "fin ms", "seg", "wg", "wgroups",
           "occ", "launch", "compile s");
    for (size_t i = 0; i < n; i++) {
        const struct gpu_telemetry *t = &r[i].tel;
        printf("%-22s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %6u %6u %8u %6.2f %8u %8.2f\n",
               r[i].name, t->plan_ns / 1e6, t->factor_ns / 1e6, t->upload_ns / 1e6,
               t->device_ns / 1e6, t->kernel_ns / 1e6, t->readback_ns / 1e6, t->finalize_ns / 1e6,
               t->segment_bytes, t->workgroup_size, t->workgroups, t->occupancy, t->kernel_launches,
               r[i].compile_s);
    }
    printf("\n%-22s %8s %8s %8s %8s\n", "main plan ms", "all", "pre", "pick", "runs");
    for (size_t i = 0; i < n; i++) {
        const struct gpu_telemetry *t = &r[i].tel;
        printf("%-22s %8.2f %8.2f %8.2f %8.2f\n", r[i].name, t->plan_ns / 1e6, t->plan_pre_ns / 1e6,
               t->plan_pick_ns / 1e6, t->plan_runs_ns / 1e6);
    }
    printf("\n%-22s %8s %8s %8s %8s %8s %10s %12s\n", "factor pass ms", "plan", "upload", "wait",
           "read", "sort", "ends", "dev counted");
    for (size_t i = 0; i < n; i++) {
        const struct gpu_telemetry *t = &r[i].tel;
        printf("%-22s %8.2f %8.2f %8.2f %8.2f %8.2f %10llu %12llu\n", r[i].name,
               t->factor_plan_ns / 1e6, t->factor_upload_ns / 1e6, t->factor_wait_ns / 1e6,
               t->factor_read_ns / 1e6, t->factor_sort_ns / 1e6, (unsigned long long)t->factor_ends,
               (unsigned long long)t->hits_device_counted);
    }
    if (!profile)
        return;
    /* --profile: where the device time of one batch went, dispatch by
     * dispatch with a barrier between them (so slower than the kernel
     * column): ms (dispatches) by kind */
    printf("\n%-22s %14s %14s %14s %14s %14s %10s %10s %8s %8s\n", "profile ms (n)", "dfa",
           "factor", "gated nfa", "other nfa", "literal", "items", "spec", "fixes", "host");
    for (size_t i = 0; i < n; i++) {
        const struct gpu_telemetry *t = &r[i].tel;
        printf("%-22s", r[i].name);
        for (int k = 0; k < GPU_PROF_KINDS; k++) {
            char cell[32];
            snprintf(cell, sizeof(cell), "%.2f (%u)", t->prof_ns[k] / 1e6, t->prof_dispatches[k]);
            printf(" %14s", cell);
        }
        printf(" %10llu %10llu %8llu %8llu\n", (unsigned long long)t->items_total,
               (unsigned long long)t->spec_items, (unsigned long long)t->spec_fixes,
               (unsigned long long)t->confirm_host);
    }
}

static void print_json(FILE *f, const struct result *r, size_t n, const struct gpu_device_info *d,
                       const struct opts *o)
{
    fprintf(f,
            "{\"device\":\"%s\",\"driver\":\"%s\",\"threads\":%u,\"hyperscan\":\"%s\","
            "\"workloads\":[",
            d->name, d->driver, o->threads, hs_version());
    for (size_t i = 0; i < n; i++) {
        const struct result *x = &r[i];
        const struct gpu_telemetry *t = &x->tel;
        fprintf(f,
                "%s{\"name\":\"%s\",\"rules\":%u,\"rejected\":%u,\"bytes\":%" PRIu64
                ",\"buffers\":%u,\"kernel_gbs\":%.3f,\"e2e_gbs\":%.3f,\"kernel_med_gbs\":%.3f,"
                "\"e2e_med_gbs\":%.3f,\"hs_gbs\":%.3f,"
                "\"gpu_hits\":%" PRIu64 ",\"hs_hits\":%" PRIu64 ",\"compile_s\":%.3f,"
                "\"hs_compile_s\":%.3f,\"plan_ns\":%" PRIu64 ",\"upload_ns\":%" PRIu64
                ",\"device_ns\":%" PRIu64 ",\"kernel_ns\":%" PRIu64 ",\"readback_ns\":%" PRIu64
                ",\"finalize_ns\":%" PRIu64 ",\"segment\":%u,\"wg\":%u,\"workgroups\":%u,"
                "\"launches\":%u,\"occupancy\":%.3f,\"items\":%" PRIu64 ",\"rounds\":%u,"
                "\"dfa_groups\":%u,\"nfa_groups\":%u,\"nfa_rules\":%u,\"gated_groups\":%u,"
                "\"factor_groups\":%u,\"lit_groups\":%u}",
                i ? "," : "", x->name, x->rules, x->rejected, x->bytes, x->buffers, x->kernel_gbs,
                x->e2e_gbs, x->kernel_med_gbs, x->e2e_med_gbs, x->hs_gbs, x->gpu_hits, x->hs_hits,
                x->compile_s, x->hs_compile_s, t->plan_ns, t->upload_ns, t->device_ns, t->kernel_ns,
                t->readback_ns, t->finalize_ns, t->segment_bytes, t->workgroup_size, t->workgroups,
                t->kernel_launches, t->occupancy, t->items_total, t->rounds, x->dfa_groups,
                x->nfa_groups, x->nfa_rules, x->gated_groups, x->factor_groups, t->lit_groups);
    }
    fprintf(f, "]}\n");
}

/* ---- main --------------------------------------------------------------- */

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024;
        break;
    case 'm':
    case 'M':
        v *= 1048576;
        break;
    case 'g':
    case 'G':
        v *= 1073741824;
        break;
    default:
        break;
    }
    return (uint64_t)v;
}

static bool wanted(const struct opts *o, const char *name)
{
    if (o->only == NULL)
        return true;
    size_t n = strlen(name);
    for (const char *p = o->only; *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && strncmp(p, name, n) == 0)
            return true;
        p += l + (e != NULL);
    }
    return false;
}

/* --lit-kernel: gpu_options.lit_kernel (1: every literal group, -1: none) */
static int32_t lit_kernel;
/* --gate-windows 1: gpu_options.gate_windows (bounded gated groups in windows) */
static bool gate_windows;
/* --factor-pass 1|0|-1: gpu_options.factor_pass (factor ends on the device
 * always, by batch size, or on the host) */
static int32_t factor_pass;
static void usage(void)
{
    fprintf(stderr,
            "usage: scan_bench [--size BYTES] [--literals N,N..] [--regexes N] [--threads T]\n"
            "                  [--device NAME|INDEX] [--buffer BYTES] [--real-buffer BYTES]\n"
            "                  [--iters N] [--warm-ms MS] [--segment BYTES] [--wg N] "
            "[--max-workgroups N]\n"
            "                  [--upload-threads N] [--upload-chunk BYTES] [--only NAME,..]\n"
            "                  [--data DIR] [--no-hs] [--json] [--json-out FILE]\n"
            "                  [--dump-rules DIR] [--max-states N] [--bitnfa-counters N]\n"
            "                  [--gate-bits N] [--gate-states N] [--gate-rare-bits N]\n"
            "                  [--gated-group-bits N] [--heavy-states N] [--engine gpu|cpu] "
            "[--cpu-plain]\n"
            "                  [--lit-kernel 1|0|-1] [--gate-windows 0|1]\n"
            "                  [--factor-pass 1|0|-1] [--profile 1] [--serialize 0|1|2] "
            "[--confirm-cap BYTES]\n"
            "                  [--spec-lookback BYTES] [--fuse N] [--hs-interleave]\n");
    exit(2);
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.size = 1ull << 30,
                       .literals = {1000, 10000},
                       .n_literal_sets = 2,
                       .regexes = 500,
                       .threads = 16,
                       .buffer = 1u << 20,
                       .real_buffer = 64u << 10,
                       .iters = 5,
                       .warm_ms = 2000,
                       .data = "../shared/data"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--cpu-plain") == 0) {
            o->cpu_plain = true;
            continue;
        }
        if (strcmp(a, "--hs-interleave") == 0) {
            o->hs_interleave = true;
            continue;
        }
        if (strcmp(a, "--json") == 0 || strcmp(a, "--no-hs") == 0) {
            o->json |= a[2] == 'j';
            o->no_hs |= a[2] == 'n';
            continue;
        }
        if (v == NULL)
            usage();
        i++;
        if (strcmp(a, "--size") == 0) {
            o->size = parse_size(v);
        } else if (strcmp(a, "--literals") == 0) {
            o->n_literal_sets = 0;
            for (char *p = (char *)v; *p && o->n_literal_sets < 8;) {
                o->literals[o->n_literal_sets++] = (uint32_t)strtoul(p, &p, 10);
                if (*p == ',')
                    p++;
            }
        } else if (strcmp(a, "--regexes") == 0) {
            o->regexes = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--threads") == 0) {
            o->threads = (uint32_t)strtoul(v, NULL, 10);
            o->threads_set = true;
        } else if (strcmp(a, "--engine") == 0) {
            if (strcmp(v, "cpu") != 0 && strcmp(v, "gpu") != 0)
                usage();
            o->cpu = v[0] == 'c';
        } else if (strcmp(a, "--device") == 0) {
            o->device = v;
        } else if (strcmp(a, "--buffer") == 0) {
            o->buffer = parse_size(v);
        } else if (strcmp(a, "--real-buffer") == 0) {
            o->real_buffer = parse_size(v);
        } else if (strcmp(a, "--iters") == 0) {
            o->iters = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--warm-ms") == 0) {
            o->warm_ms = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--segment") == 0) {
            o->segment = (uint32_t)parse_size(v);
        } else if (strcmp(a, "--wg") == 0) {
            o->wg = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--max-workgroups") == 0) {
            o->max_wgs = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--upload-threads") == 0) {
            o->upload_threads = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--upload-chunk") == 0) {
            o->upload_chunk = (uint32_t)parse_size(v);
        } else if (strcmp(a, "--only") == 0) {
            o->only = v;
        } else if (strcmp(a, "--gate-windows") == 0) {
            gate_windows = strtol(v, NULL, 10) != 0;
        } else if (strcmp(a, "--confirm-cap") == 0) {
            confirm_cap = (uint32_t)parse_size(v);
        } else if (strcmp(a, "--spec-lookback") == 0) {
            spec_look = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--profile") == 0) {
            profile = strtol(v, NULL, 10) != 0;
        } else if (strcmp(a, "--serialize") == 0) {
            serialize = (uint32_t)strtoul(v, NULL, 10); /* gpu_options.serialize */
        } else if (strcmp(a, "--fuse") == 0) {
            fuse_groups = (uint32_t)strtoul(v, NULL, 10); /* gpu_options.fuse_groups */
        } else if (strcmp(a, "--factor-pass") == 0) {
            factor_pass = (int32_t)strtol(v, NULL, 10);
        } else if (strcmp(a, "--lit-kernel") == 0) {
            lit_kernel = (int32_t)strtol(v, NULL, 10); /* gpu_options.lit_kernel */
        } else if (strcmp(a, "--dump-rules") == 0) {
            o->dump_rules = v;
        } else if (strcmp(a, "--max-states") == 0) {
            o->max_states = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--bitnfa-counters") == 0) {
            o->bitnfa_counters = (uint32_t)strtoul(v, NULL, 10);
            bitnfa_counters = o->bitnfa_counters;
        } else if (strcmp(a, "--gate-bits") == 0) {
            gate_bits = (uint32_t)strtoul(v, NULL, 10); /* 4294967295: no DFA rule gated */
        } else if (strcmp(a, "--gated-group-bits") == 0) {
            gated_bits = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--heavy-states") == 0) {
            heavy = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--gate-rare-bits") == 0) {
            gate_rare = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--gate-states") == 0) {
            gate_states = (uint32_t)strtoul(v, NULL, 10); /* 1: every candidate gated */
        } else if (strcmp(a, "--data") == 0) {
            o->data = v;
        } else if (strcmp(a, "--json-out") == 0) {
            o->json_out = v;
        } else {
            usage();
        }
    }
    if (o->cpu && !o->threads_set) { /* the CPU engine: all cores, Hyperscan the same */
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = n > 0 ? (uint32_t)n : 1;
    }
    if (o->threads == 0 || o->iters == 0 || o->size < 4096 || o->buffer == 0)
        usage();
}

static void run_any(struct gpu_engine *eng, const char *name, struct ruleset *rs, struct corpus *c,
                    uint64_t buffer, const struct opts *o, struct result *out)
{
    if (eng == NULL)
        run_workload_cpu(name, rs, c, buffer, o, out);
    else
        run_workload(eng, name, rs, c, buffer, o, out);
}

int main(int argc, char **argv)
{
    struct opts o;
    parse_opts(argc, argv, &o);
    struct gpu_options go = {.device = o.device,
                             .segment_bytes = o.segment,
                             .workgroup_size = o.wg,
                             .upload_threads = o.upload_threads,
                             .max_workgroups = o.max_wgs,
                             .upload_chunk = o.upload_chunk,
                             .lit_kernel = lit_kernel,
                             .gate_windows = gate_windows,
                             .factor_pass = factor_pass,
                             .profile = profile,
                             .serialize = serialize,
                             .fuse_groups = fuse_groups,
                             .confirm_cap = confirm_cap,
                             .spec_lookback = spec_look};
    struct gpu_engine *eng = NULL;
    struct vks_error err;
    if (o.cpu) /* no device: the CPU engine and Hyperscan */
        cpuplan_set_fast(!o.cpu_plain);
    else if (gpu_engine_create(&go, &eng, &err) < 0)
        die("gpu_engine_create", err.msg);
    struct result res[16];
    size_t n = 0;
    char name[64];
    for (uint32_t i = 0; i < o.n_literal_sets; i++) {
        snprintf(name, sizeof(name), "literals-%u", o.literals[i]);
        if (!wanted(&o, name))
            continue;
        struct ruleset rs = {0};
        struct corpus c;
        literal_workload(o.literals[i], &rs, &c, &o);
        run_any(eng, name, &rs, &c, o.buffer, &o, &res[n++]);
        rs_free(&rs);
        free(c.p);
    }
    snprintf(name, sizeof(name), "regex-%u", o.regexes);
    if (o.regexes > 0 && wanted(&o, name)) {
        struct ruleset rs = {0};
        struct corpus c;
        regex_workload(o.regexes, &rs, &c, &o);
        run_any(eng, name, &rs, &c, o.buffer, &o, &res[n++]);
        rs_free(&rs);
        free(c.p);
    }
    snprintf(name, sizeof(name), "regex-%u-secrets", o.regexes);
    if (o.regexes > 0 && wanted(&o, name)) {
        struct ruleset rs = {0};
        struct corpus c = {0};
        if (secrets_workload(o.regexes, &rs, &c, &o))
            run_any(eng, name, &rs, &c, o.real_buffer, &o, &res[n++]);
        rs_free(&rs);
        free(c.p);
    }
    if (wanted(&o, "binary-20k")) {
        struct ruleset rs = {0};
        struct corpus c;
        binary_workload(20000, &rs, &c, &o);
        run_any(eng, "binary-20k", &rs, &c, o.buffer, &o, &res[n++]);
        rs_free(&rs);
        free(c.p);
    }
    if (wanted(&o, "phrases-3k")) {
        struct ruleset rs = {0};
        struct corpus c = {0};
        if (phrase_workload(3000, &rs, &c, &o))
            run_any(eng, "phrases-3k", &rs, &c, o.real_buffer, &o, &res[n++]);
        rs_free(&rs);
        free(c.p);
    }
    static const char *const real[][3] = {
        {"dict-15", "rebar/dict-15.rules", "rebar/haystacks/sherlock.txt"},
        {"dict-10", "rebar/dict-10.rules", "rebar/haystacks/opensubtitles/en-sampled.txt"},
        {"gitleaks-keywords", "gitleaks/gitleaks-keywords.rules", "rebar/haystacks/sherlock.txt"},
        {"gitleaks-regex", "gitleaks/gitleaks-regex.rules", "rebar/haystacks/sherlock.txt"},
    };
    for (size_t i = 0; i < sizeof(real) / sizeof(real[0]); i++) {
        if (!wanted(&o, real[i][0]))
            continue;
        struct ruleset rs = {0};
        struct corpus c = {0};
        if (real_workload(real[i][1], real[i][2], &rs, &c, &o))
            run_any(eng, real[i][0], &rs, &c, o.real_buffer, &o, &res[n++]);
        rs_free(&rs);
        free(c.p);
    }
    hs_measure_later(&o);
    bool equal = true;
    for (size_t i = 0; i < n && !o.no_hs; i++)
        equal &= res[i].gpu_hits == res[i].hs_hits;
    if (n > 0 && o.cpu) {
        print_cpu(stdout, res, n, &o, o.json);
        FILE *f = o.json_out ? fopen(o.json_out, "w") : NULL;
        if (f != NULL) {
            print_cpu(f, res, n, &o, true);
            fclose(f);
        }
    } else if (n > 0) {
        if (o.json)
            print_json(stdout, res, n, gpu_engine_device(eng), &o);
        else
            print_text(res, n, gpu_engine_device(eng), &o);
        FILE *f = o.json_out ? fopen(o.json_out, "w") : NULL;
        if (f != NULL) {
            print_json(f, res, n, gpu_engine_device(eng), &o);
            fclose(f);
        }
    }
    if (eng != NULL)
        gpu_engine_destroy(eng);
    return equal ? 0 : 1;
}
