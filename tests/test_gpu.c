/*
 * The GPU engine against the CPU reference scanner: for seeded random
 * catalogs and haystacks, every buffer's hits from gpu_batch_dispatch must
 * equal refscan_buffer's, exactly. Also residency, pipeline and plan caches
 * (from telemetry), the hit-ring overflow re-run, the memory budget refusal,
 * the timeout, device choice and lavapipe's loop limit.
 *
 * Runs on whatever Vulkan device the host has (lavapipe in CI), so data
 * stays small. Exits 77 (skip) only when there is no Vulkan device at all.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"
#include "refscan.h"
#include "rules.h"

static uint64_t rng;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 11) % n);
}

/* ---- catalogs ----------------------------------------------------------- */

struct trule {
    char id[16];
    enum rule_kind kind;
    const char *pat;
    uint32_t flags;
};

static struct catalog *compile_rules_opt(const struct trule *t, size_t n,
                                         const struct rules_options *opt);

static struct catalog *compile_rules(const struct trule *t, size_t n)
{
    return compile_rules_opt(t, n, NULL);
}

static struct catalog *compile_rules_opt(const struct trule *t, size_t n,
                                         const struct rules_options *opt)
{
    struct rule_src *src = calloc(n, sizeof(*src));
    ck_assert_ptr_nonnull(src);
    for (size_t i = 0; i < n; i++)
        src[i] = (struct rule_src){t[i].id,          t[i].kind,  t[i].pat,
                                   strlen(t[i].pat), t[i].flags, (uint32_t)i + 1};
    struct rules_result res = {0};
    struct vks_error err = {0};
    int rc = rules_compile(src, n, opt, &res, &err);
    ck_assert_msg(rc == 0, "rules_compile: %d %s", rc, err.msg);
    ck_assert_msg(res.n_rejects < n, "every rule rejected, first: %s",
                  res.n_rejects ? res.rejects[0].msg : "");
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    free(src);
    return cat;
}

static const char *const literals[] = {"a",   "ab", "abc", "ba",   "b\nb",   "cab",
                                       "aaa", "_a", "bcb", "acab", "abcabc", "c c"};
static const char *const regexes[] = {
    "a[bc]{1,3}",  "^ab",      "b$",   "\\bab\\b", "a[^\\n]*c", "(ab|ba)+",
    "c[ab]{0,5}a", "^[abc]+$", "\\Ba", "b\\b",     "[a-c]{2}_", "a.{3,7}b",
    "(?i)AB",      "\\n[a-c]", "c+",   "^c",       "a(b|c)*a",  "\\d|_b",
};

/* A random catalog: literals (bounded groups) and regexes, some anchored,
 * some unbounded, with random flags. */
static struct catalog *random_catalog(uint32_t n)
{
    struct trule t[64];
    if (n > 64)
        n = 64;
    for (uint32_t i = 0; i < n; i++) {
        snprintf(t[i].id, sizeof(t[i].id), "r%u", i);
        if (rnd(2)) {
            t[i].kind = RULE_LITERAL;
            t[i].pat = literals[rnd(sizeof(literals) / sizeof(literals[0]))];
            t[i].flags = rnd(4) == 0 ? RULE_F_CASELESS : 0;
        } else {
            t[i].kind = RULE_REGEX;
            t[i].pat = regexes[rnd(sizeof(regexes) / sizeof(regexes[0]))];
            t[i].flags = (rnd(3) == 0 ? RULE_F_MULTILINE : 0) | (rnd(3) == 0 ? RULE_F_DOTALL : 0);
        }
        if (rnd(8) == 0)
            t[i].flags |= RULE_F_SINGLEMATCH;
    }
    return compile_rules(t, n);
}

/* ---- haystacks and comparison ------------------------------------------ */

static uint8_t *random_text(size_t len)
{
    static const char alpha[] = "abcabcab \n_ABC1";
    uint8_t *p = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    return p;
}

static struct gpu_engine *engine(const struct gpu_options *opt)
{
    struct gpu_engine *eng = NULL;
    struct vks_error err = {0};
    int rc = gpu_engine_create(opt, &eng, &err);
    ck_assert_msg(rc == 0, "gpu_engine_create: %d %s", rc, err.msg);
    return eng;
}

static size_t check_result(const struct gpu_batch *b, const struct gpu_result *res);

/* Dispatches the batch and asserts every buffer's hits equal refscan's.
 * Returns the number of hits. */
static size_t check_batch(struct gpu_engine *eng, const struct gpu_batch *b, struct gpu_result *res)
{
    struct vks_error err = {0};
    int rc = gpu_batch_dispatch(eng, b, res, &err);
    ck_assert_msg(rc == 0, "gpu_batch_dispatch: %d %s", rc, err.msg);
    return check_result(b, res);
}

/* Asserts every buffer's hits in `res` equal refscan's; the hit count. */
static size_t check_result(const struct gpu_batch *b, const struct gpu_result *res)
{
    ck_assert_uint_eq(res->tel.items_processed, res->tel.items_total);
    ck_assert_uint_eq(res->tel.items_remaining, 0);
    size_t k = 0;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        const struct gpu_buffer *gb = &b->buffers[i];
        struct scan_hits want = {0};
        ck_assert_int_eq(
            refscan_buffer(b->catalogs[gb->catalog], gb->data, gb->len, gb->mode, &want), 0);
        for (size_t j = 0; j < want.n; j++, k++) {
            ck_assert_msg(k < res->n_hits, "buffer %u (len %zu): GPU has %zu hits in all, CPU more",
                          i, gb->len, res->n_hits);
            const struct gpu_hit *h = &res->hits[k];
            ck_assert_msg(h->buffer == i && h->rule == want.v[j].rule && h->end == want.v[j].end &&
                              h->count == want.v[j].count,
                          "buffer %u (len %zu, mode %d) hit %zu: GPU (buf %u rule %u end %" PRIu64
                          " count %u), CPU (rule %u end %" PRIu64 " count %u)",
                          i, gb->len, (int)gb->mode, j, h->buffer, h->rule, h->end, h->count,
                          want.v[j].rule, want.v[j].end, want.v[j].count);
        }
        scan_hits_finish(&want);
    }
    ck_assert_msg(k == res->n_hits, "GPU returned %zu hits, CPU %zu", res->n_hits, k);
    return k;
}

struct bufset {
    struct gpu_buffer *v;
    uint32_t n;
};

static void bufset_random(struct bufset *s, uint32_t n, size_t max_len, uint32_t n_cats)
{
    s->v = calloc(n, sizeof(*s->v));
    s->n = n;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = rnd(5) == 0 ? rnd(2) : rnd((uint32_t)max_len + 1);
        s->v[i] = (struct gpu_buffer){.data = random_text(len),
                                      .len = len,
                                      .id = i,
                                      .mode = (enum scan_mode)rnd(3),
                                      .catalog = rnd(n_cats)};
    }
}

static void bufset_free(struct bufset *s)
{
    for (uint32_t i = 0; i < s->n; i++)
        free((void *)s->v[i].data);
    free(s->v);
}

/* One seeded random batch checked against refscan; returns its telemetry. */
static struct gpu_telemetry random_round(struct gpu_engine *eng, uint32_t seed, uint32_t n_bufs,
                                         size_t max_len)
{
    rng = 0x9e3779b97f4a7c15ull ^ seed;
    uint32_t n_cats = 1 + rnd(3);
    struct catalog *cats[3];
    for (uint32_t c = 0; c < n_cats; c++)
        cats[c] = random_catalog(2 + rnd(20));
    struct bufset s;
    bufset_random(&s, n_bufs, max_len, n_cats);
    struct gpu_batch b = {(const struct catalog *const *)cats, n_cats, s.v, s.n};
    struct gpu_result res = {0};
    check_batch(eng, &b, &res);
    struct gpu_telemetry tel = res.tel;
    gpu_result_finish(&res);
    bufset_free(&s);
    for (uint32_t c = 0; c < n_cats; c++)
        catalog_destroy(cats[c]);
    return tel;
}

/* ---- bit-NFA groups ----------------------------------------------------- */

/* Rules for the bit-NFA engine: gaps, counted repeats, anchors, \b, an
 * unbounded one (chained rounds) and literals beside them. */
static const char *const nfa_regexes[] = {
    "a.{0,40}b",          "[a-c]{2,30}_",   "\\bab[^\\n]{0,60}c\\b", "(ab|c){3,20}",
    "a[^_]*b.{0,30}1",    "^c[abc ]{0,50}", "b[a-c]{5,9}$",          "(?i)_A.{1,20}B",
    "\\Bc(a|b){1,12}\\B", "1.{0,200}a",     "\\n[abc]{3}",           "ab{2,4}c{0,3}",
};

/* A random catalog with bit-NFA groups: every rule forced onto the bit-NFA
 * engine, or a mix where only the wide counters go there. */
static struct catalog *random_nfa_catalog(uint32_t n, bool force)
{
    struct trule t[32];
    if (n > 32)
        n = 32;
    for (uint32_t i = 0; i < n; i++) {
        snprintf(t[i].id, sizeof(t[i].id), "n%u", i);
        bool lit = rnd(4) == 0;
        t[i].kind = lit ? RULE_LITERAL : RULE_REGEX;
        t[i].pat = lit ? literals[rnd(sizeof(literals) / sizeof(literals[0]))]
                       : nfa_regexes[rnd(sizeof(nfa_regexes) / sizeof(nfa_regexes[0]))];
        t[i].flags = (rnd(3) == 0 ? RULE_F_MULTILINE : 0) | (rnd(3) == 0 ? RULE_F_DOTALL : 0);
        if (rnd(8) == 0)
            t[i].flags |= RULE_F_SINGLEMATCH;
    }
    struct rules_options opt = {.force_bitnfa = force};
    struct catalog *cat = compile_rules_opt(t, n, &opt);
    for (uint32_t g = 0; force && g < catalog_group_count(cat); g++) {
        struct catalog_group grp; /* only the factor group of gated groups */
        catalog_group(cat, g, &grp);
        ck_assert(grp.flags & CAT_GF_FACTOR);
    }
    return cat;
}

/* GPU hits equal the CPU reference scanner's for catalogs with bit-NFA
 * groups: random batches, all report modes, small segments and chains so
 * that lookback and carried state vectors cross boundaries often. */
START_TEST(test_bitnfa_random)
{
    struct gpu_options opt = {.segment_bytes = 48, .chain_bytes = 80};
    struct gpu_engine *eng = engine(&opt);
    size_t hits = 0;
    uint32_t nfa_ranges = 0;
    for (uint32_t seed = 1; seed <= 12; seed++) {
        rng = 0x51ed27a3b1c4f00dull ^ seed;
        uint32_t n_cats = 1 + rnd(2);
        struct catalog *cats[2];
        for (uint32_t c = 0; c < n_cats; c++)
            cats[c] = random_nfa_catalog(2 + rnd(10), rnd(2) == 0);
        for (uint32_t c = 0; c < n_cats; c++)
            nfa_ranges += catalog_nfa_count(cats[c]);
        struct bufset s;
        bufset_random(&s, 6, 400, n_cats);
        struct gpu_batch b = {(const struct catalog *const *)cats, n_cats, s.v, s.n};
        struct gpu_result res = {0};
        hits += check_batch(eng, &b, &res);
        gpu_result_finish(&res);
        bufset_free(&s);
        for (uint32_t c = 0; c < n_cats; c++)
            catalog_destroy(cats[c]);
    }
    ck_assert_uint_gt(nfa_ranges, 12);
    ck_assert_uint_gt(hits, 100);
    gpu_engine_destroy(eng);
}
END_TEST

/* Gated bit-NFA groups (factor prefilter): the host finds the factors'
 * ends and the NFA kernel walks only windows around them, cut into items
 * of 48 bytes; factors planted densely in some buffers make windows longer
 * than an item, so windows and matches straddle item boundaries. Factors
 * also sit at buffer starts and ends. GPU == refscan in every mode, with
 * fewer items than full segments. */
START_TEST(test_gated_nfa)
{
    static const struct trule rules[] = {
        {"key", RULE_REGEX, "\\bkey[^\\n]{0,12}end", 0},
        {"tok", RULE_REGEX, "tok(?:en|EN)[a-z0-9]{4,10}\\b", RULE_F_CASELESS},
        {"alt", RULE_REGEX, "(?:abc|xyz)[0-9]{2,12}Q", RULE_F_SINGLEMATCH},
        {"run", RULE_REGEX, "zzz[a-c_ ]{1,12}", 0}, /* a match at most ends of a window */
    };
    static const char *const plants[] = {
        "key = 1 end", "TOKEN0123abcd9 ", "zzz", "xyz123Q", "zzzab c",
        "key",         "token",           "abc", "end"};
    /* _i 1: 48 buffers on 3 upload threads, so the plan makes each gated
     * group's items in parts of the buffers (gpu/plan.c plan_pre) */
    struct gpu_options opt = {
        .segment_bytes = 48, .chain_bytes = 80, .upload_threads = _i == 1 ? 3 : 0};
    struct gpu_engine *eng = engine(&opt);
    struct rules_options ro = {.force_bitnfa = true};
    struct catalog *cat = compile_rules_opt(rules, sizeof(rules) / sizeof(rules[0]), &ro);
    uint32_t gated = 0;
    for (uint32_t k = 0; k < catalog_nfa_count(cat); k++) {
        struct catalog_nfa g;
        catalog_nfa(cat, k, &g);
        gated += (g.flags & CAT_GF_GATED) != 0;
    }
    ck_assert_uint_eq(gated, catalog_nfa_count(cat));
    rng = 0x6a7e5eedull;
    const uint32_t NB = _i == 1 ? 48 : 12;
    struct gpu_buffer bufs[48];
    uint64_t full_items = 0;
    for (uint32_t i = 0; i < NB; i++) {
        size_t len = i == 0 ? 0 : 200 + rnd(3000);
        uint8_t *d = (uint8_t *)random_text(len);
        for (size_t p = 0; len > 20 && p + 16 < len; p += 1 + rnd(i % 4 == 1 ? 12 : 1500)) {
            const char *x = plants[rnd(9)];
            memcpy(d + p, x, strlen(x));
        }
        if (len > 20) { /* factors at both ends */
            memcpy(d, "xyz12Q", 6);
            memcpy(d + len - 3, "key", 3);
        }
        bufs[i] = (struct gpu_buffer){
            .data = d, .len = len, .id = i, .mode = (enum scan_mode)(i % 3), .catalog = 0};
        full_items += (len + 47) / 48 * catalog_nfa_count(cat);
    }
    const struct catalog *cats[1] = {cat};
    struct gpu_batch b = {cats, 1, bufs, NB};
    struct gpu_result res = {0};
    size_t hits = check_batch(eng, &b, &res);
    ck_assert_uint_ge(hits, 15);
    /* Segments (windows), not chained walks, and fewer items than full
     * segments: unless lavapipe cut a loop and the batch was re-planned
     * with smaller items (under load a subgroup's claims can pass the
     * modelled budget), which changes the plan's shape but not the hits. */
    if (res.tel.cut_reruns == 0) {
        ck_assert_uint_eq(res.tel.rounds, 1);
        ck_assert_uint_lt(res.tel.items_total, full_items * 3 / 4);
    }
    gpu_result_finish(&res);
    for (uint32_t i = 0; i < NB; i++)
        free((void *)bufs[i].data);
    catalog_destroy(cat);
    gpu_engine_destroy(eng);
}
END_TEST

/* Binary signatures gated on two-byte anchors (factor_extract_weak): a
 * bounded gap, a ranged dot-all gap, an unbounded gap and a YARA jump, with
 * no factor of three bytes. The three bounded ones land in a gated group
 * (the unbounded one is a small DFA), and the GPU engine's hits equal
 * refscan's with the anchors planted at the gaps'
 * distances, repeated inside the gaps and at both buffer ends, in every
 * mode. */
START_TEST(test_weak_anchor_gates)
{
    static const struct trule rules[] = {
        {"gap", RULE_REGEX, "\\x2a\\x94.{35}\\xd1\\x27", 0},
        {"rng", RULE_REGEX, "\\xf6\\x83.{3,40}\\x82\\xf3", RULE_F_DOTALL},
        {"any", RULE_REGEX, "\\xc1\\x9f.*\\x39\\xfe", 0},
        {"hex", RULE_HEX, "e8 90 [10-20] 0f 05", 0},
    };
    static const char *const plants[] = {"\x2a\x94", "\xd1\x27", "\xf6\x83", "\x82\xf3",
                                         "\xc1\x9f", "\x39\xfe", "\xe8\x90", "\x0f\x05"};
    static const uint32_t gaps[] = {35, 17, 60, 14};
    struct gpu_options opt = {.segment_bytes = 64, .chain_bytes = 128};
    struct gpu_engine *eng = engine(&opt);
    struct catalog *cat = compile_rules(rules, sizeof(rules) / sizeof(rules[0]));
    uint32_t gated = 0;
    for (uint32_t k = 0; k < catalog_nfa_count(cat); k++) {
        struct catalog_nfa g;
        catalog_nfa(cat, k, &g);
        gated += (g.flags & CAT_GF_GATED) != 0 ? g.n_rules : 0;
    }
    /* the gaps' DFAs track every earlier anchor (hundreds to 40,000+
     * states): gated; `.*` between anchors is a DFA of 5 states: kept */
    ck_assert_uint_eq(gated, 3);
    rng = 0x2a94d127ull;
    enum { NB = 12 };
    struct gpu_buffer bufs[NB];
    for (uint32_t i = 0; i < NB; i++) {
        size_t len = i == 0 ? 0 : 100 + rnd(4000);
        uint8_t *d = malloc(len ? len : 1);
        ck_assert_ptr_nonnull(d);
        for (size_t p = 0; p < len; p++)
            d[p] = rnd(20) == 0 ? '\n' : (uint8_t)rnd(256);
        for (size_t p = 0; len > 80 && p + 70 < len; p += 1 + rnd(i % 3 == 1 ? 20 : 400)) {
            uint32_t r = rnd(4);
            memcpy(d + p, plants[2 * r], 2);
            size_t end = p + 2 + gaps[r];
            if (rnd(3) == 0) /* an anchor inside the gap */
                memcpy(d + p + 2 + rnd(gaps[r] - 2), plants[2 * r], 2);
            memcpy(d + end, plants[2 * r + 1], 2);
        }
        if (len > 80) {
            memcpy(d, plants[6], 2);
            memcpy(d + len - 2, plants[7], 2);
        }
        bufs[i] = (struct gpu_buffer){
            .data = d, .len = len, .id = i, .mode = (enum scan_mode)(i % 3), .catalog = 0};
    }
    const struct catalog *cats[1] = {cat};
    struct gpu_batch b = {cats, 1, bufs, NB};
    struct gpu_result res = {0};
    size_t hits = check_batch(eng, &b, &res);
    ck_assert_uint_ge(hits, 40);
    gpu_result_finish(&res);
    for (uint32_t i = 0; i < NB; i++)
        free((void *)bufs[i].data);
    catalog_destroy(cat);
    gpu_engine_destroy(eng);
}
END_TEST

static int confirm_push(void *ctx, uint32_t rule, uint64_t end)
{
    return scan_hits_push(ctx, rule, end, 1);
}

/* Every group of `cat` walked in full, gates ignored: what gating must equal. */
static void confirm_full_walk(const struct catalog *cat, const uint8_t *d, size_t len,
                              enum scan_mode mode, struct scan_hits *out)
{
    for (uint32_t g = 0; g < catalog_group_count(cat); g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        if (!(cg.flags & CAT_GF_FACTOR))
            refscan_group_range(cat, g, d, len, 0, 0, len, confirm_push, out);
    }
    for (uint32_t g = 0; g < catalog_nfa_count(cat); g++)
        refscan_nfa_range(cat, g, d, len, 0, 0, len, confirm_push, out);
    scan_hits_finalize(out, cat, mode);
}

/* Unbounded rules confirmed forward from their factors (CAT_GF_CONFIRM):
 * factors at the start, middle and end of the rule, a lead of unbounded
 * length (starts from the buffer's start), \b ^ $ and caseless, factors
 * close together (overlapping intervals) and at both buffer ends. GPU ==
 * refscan == every group walked in full, in every mode; one item per
 * merged interval, no chained rounds. */
START_TEST(test_confirm_nfa)
{
    static const struct trule rules[] = {
        {"start", RULE_REGEX, "\\bkey[a-z]*=[0-9]+", 0},
        {"mid", RULE_REGEX, "q[0-9]{1,5}zq9[^\\n]*;", 0},
        {"end", RULE_REGEX, "\\btok[a-z0-9]+END$", RULE_F_CASELESS},
        /* not `[a-z]+@corp`, which the compiler cuts to `[a-z]@corp` */
        {"lead", RULE_REGEX, "[a-z][a-z]*@corp[a-z]*", 0},
        {"line", RULE_REGEX, "^lin[a-z ]*x", RULE_F_MULTILINE},
        {"one", RULE_REGEX, "abc[^#]*def", RULE_F_SINGLEMATCH},
    };
    static const char *const plants[] = {"key=12",    "keyab=9", "q12zq9 ab;", "zq9;",
                                         "TOKab1END", "tokEND",  "bob@corp",   "@corpx",
                                         "\nline x",  "abc",     "def",        "key"};
    /* _i 1: the pool's way of finishing hits (gpu/hits.c), which must drop
     * the copies that overlapping confirmation items report; _i 2: counting
     * on the device asked for, which must leave those items on the ring
     * (their copies cannot be dropped from a count) */
    struct gpu_options opt = {.segment_bytes = 48,
                              .chain_bytes = 80,
                              .hits_parallel_min = (uint32_t)(_i == 1),
                              .count_device = _i == 2 ? 1 : 0};
    struct gpu_engine *eng = engine(&opt);
    struct rules_options ro = {.force_bitnfa = true};
    struct catalog *cat = compile_rules_opt(rules, sizeof(rules) / sizeof(rules[0]), &ro);
    uint32_t confirm = 0, from_start = 0, runs = 0;
    for (uint32_t k = 0; k < catalog_nfa_count(cat); k++) {
        struct catalog_nfa g;
        catalog_nfa(cat, k, &g);
        ck_assert(g.flags & CAT_GF_GATED);
        ck_assert(g.flags & CAT_GF_CONFIRM);
        confirm++;
        from_start += g.lookback == CATALOG_UNBOUNDED;
        /* "lead": its starts from the run of [a-z@corp] before its factor */
        runs += g.lookback == CATALOG_UNBOUNDED && g.span != NULL;
    }
    ck_assert_uint_ge(confirm, 2);
    ck_assert_uint_ge(from_start, 1); /* "lead" */
    ck_assert_uint_ge(runs, 1);
    rng = 0xc0f1a5eedull;
    enum { NB = 15 }; /* the last in mode count */
    struct gpu_buffer bufs[NB];
    for (uint32_t i = 0; i < NB; i++) {
        size_t len = i == 0        ? 0
                     : i == NB - 1 ? 400
                                   : 100 + rnd(400); /* whole walks fit lavapipe's loop budget */
        uint8_t *d = (uint8_t *)random_text(len);
        for (size_t p = 0; len > 20 && p + 12 < len; p += 1 + rnd(i % 4 == 1 ? 6 : 300)) {
            const char *x = plants[rnd(12)];
            memcpy(d + p, x, strlen(x));
        }
        if (len > 20) { /* factors at both ends */
            memcpy(d, "corp=", 5);
            memcpy(d + len - 3, "key", 3);
        }
        if (i == NB - 1) { /* two items of "mid", far apart, whose walks meet one ';' */
            memset(d, '#', len);
            memcpy(d + 10, "q12zq9", 6);
            memcpy(d + 90, "q34zq9", 6);
            memcpy(d + 96, ";;;", 3);
            /* and one run of "lead" longer than a piece of starts */
            memset(d + 120, 'a', 200);
            memcpy(d + 320, "@corpxyz", 8);
        }
        bufs[i] = (struct gpu_buffer){
            .data = d, .len = len, .id = i, .mode = (enum scan_mode)(i % 3), .catalog = 0};
        struct scan_hits gated = {0}, full = {0};
        ck_assert_int_eq(refscan_buffer(cat, d, len, bufs[i].mode, &gated), 0);
        confirm_full_walk(cat, d, len, bufs[i].mode, &full);
        ck_assert_uint_eq(gated.n, full.n);
        for (size_t j = 0; j < full.n; j++)
            ck_assert(gated.v[j].rule == full.v[j].rule && gated.v[j].end == full.v[j].end &&
                      gated.v[j].count == full.v[j].count);
        scan_hits_finish(&gated);
        scan_hits_finish(&full);
    }
    const struct catalog *cats[1] = {cat};
    struct gpu_batch b = {cats, 1, bufs, NB};
    struct gpu_result res = {0};
    size_t hits = check_batch(eng, &b, &res);
    ck_assert_uint_ge(hits, 10);
    if (res.tel.cut_reruns == 0) /* chained walks of 80 bytes would take several rounds */
        ck_assert_uint_eq(res.tel.rounds, 1);
    gpu_result_finish(&res);
    for (uint32_t i = 0; i < NB; i++)
        free((void *)bufs[i].data);
    catalog_destroy(cat);
    gpu_engine_destroy(eng);
}
END_TEST

/* Forward confirmations whose walks outlive their cap (docs/engine.md): a
 * rule that never dies after its prefix (`(?s)BEGINKEY.*END`, as a PEM
 * block in gitleaks' private-key rule) and one that lives through long
 * runs (`tok[a-z]*9`), in buffers much longer than the cap, with live
 * items close together and far apart. The device walks each item at most
 * `cap` bytes past its starts and leaves the live ones to the host, which
 * walks them again to where they die: hits equal refscan's in every mode,
 * and the test asserts that the host finished some (without it the ends
 * past the caps would be lost). */
/* Asserts that two results hold the same hits, in the same order. */
static void assert_same_hits(const struct gpu_result *a, const struct gpu_result *b)
{
    ck_assert_uint_eq(a->n_hits, b->n_hits);
    for (size_t k = 0; k < a->n_hits; k++)
        ck_assert_msg(a->hits[k].buffer == b->hits[k].buffer &&
                          a->hits[k].rule == b->hits[k].rule && a->hits[k].end == b->hits[k].end &&
                          a->hits[k].count == b->hits[k].count,
                      "hit %zu differs", k);
}

/* A gpu_read_fn over bytes in memory at ctx. */
static int read_from(void *ctx, uint8_t *dst, uint64_t off, size_t len)
{
    memcpy(dst, (const uint8_t *)ctx + off, len);
    return 0;
}

START_TEST(test_confirm_cap)
{
    static const struct trule rules[] = {
        {"pem", RULE_REGEX, "(?s)BEGINKEY.*END", 0},
        {"run", RULE_REGEX, "tok[a-z]*9", 0},
        {"short", RULE_REGEX, "\\bkey[a-z]*=[0-9]+", 0},
    };
    struct rules_options ro = {.force_bitnfa = true};
    struct catalog *cat = compile_rules_opt(rules, 3, &ro);
    for (uint32_t k = 0; k < catalog_nfa_count(cat); k++) {
        struct catalog_nfa g;
        catalog_nfa(cat, k, &g);
        ck_assert(g.flags & CAT_GF_CONFIRM);
    }
    rng = 0x5eedcafeull;
    enum { NB = 4 };
    struct gpu_buffer bufs[NB];
    for (uint32_t i = 0; i < NB; i++) {
        size_t len = 20000 + rnd(20000);
        uint8_t *d = (uint8_t *)random_text(len);
        for (size_t p = 0; p < len; p++) /* no stray END / 9 / = except where planted */
            if (d[p] == 'E' || d[p] == '9' || d[p] == '=')
                d[p] = 'x';
        memcpy(d + 100 + i, "BEGINKEY", 8);
        memcpy(d + 5000 + rnd(100), "BEGINKEY", 8);
        for (size_t p = 3000; p + 4 < len; p += 1000 + rnd(3000))
            memcpy(d + p, "END", 3);
        size_t t = 7000 + rnd(1000);
        memcpy(d + t, "tok", 3);
        for (size_t p = t + 3; p < t + 9000 && p < len; p++)
            d[p] = "abcdef9"[rnd(7)]; /* a run of [a-z9] far past the cap */
        memcpy(d + len - 20, "key=12 tokab9", 13);
        bufs[i] = (struct gpu_buffer){.data = d, .len = len, .mode = (enum scan_mode)(i % 3)};
    }
    const struct catalog *cats[1] = {cat};
    struct gpu_batch b = {cats, 1, bufs, NB};
    uint32_t caps[] = {512, 1024};
    for (uint32_t c = 0; c < 2; c++) {
        /* _i 1: the hits of the copies that overlapping items report
         * are dropped on the pool's way too (gpu/hits.c), and the factor
         * ends are found on the device, uploads through staging: the host
         * finishes the live walks of a buffer read by callback from the
         * haystack's copy there, kept when the main pass grows it */
        struct gpu_options opt = {.confirm_cap = caps[c],
                                  .hits_parallel_min = (uint32_t)(_i == 1),
                                  .factor_pass = _i ? 1 : 0,
                                  .staged_upload = _i == 1,
                                  .count_device = _i == 2 ? 1 : 0};
        struct gpu_engine *eng = engine(&opt);
        struct gpu_result res = {0};
        ck_assert_uint_ge(check_batch(eng, &b, &res), 10);
        ck_assert_uint_ge(res.tel.confirm_host, NB);
        /* every group is a forward confirmation, whose pieces may report
         * an end twice: none counts on the device (an H100 over-counted a
         * set by 17,360 when they did: docs/PERFORMANCE.md "Session 38") */
        ck_assert_uint_eq(res.tel.hits_device_counted, 0);
        if (_i == 1) {
            ck_assert_uint_gt(res.tel.factor_ends, 0);
            struct gpu_buffer keep = bufs[0];
            bufs[0].data = NULL;
            bufs[0].read = read_from;
            bufs[0].read_ctx = (void *)keep.data;
            struct gpu_result res2 = {0};
            struct vks_error err = {0};
            ck_assert_int_eq(gpu_batch_dispatch(eng, &b, &res2, &err), 0);
            bufs[0] = keep;
            ck_assert_uint_ge(res2.tel.confirm_host, NB);
            assert_same_hits(&res2, &res);
            gpu_result_finish(&res2);
        }
        gpu_result_finish(&res);
        gpu_engine_destroy(eng);
    }
    for (uint32_t i = 0; i < NB; i++)
        free((void *)bufs[i].data);
    catalog_destroy(cat);
}
END_TEST

struct confirm_spans {
    uint64_t bytes, most, last_b;
    size_t n;
    bool ordered;
};

static int confirm_span(void *ctx, uint64_t a, uint64_t b)
{
    struct confirm_spans *s = ctx;
    s->ordered &= a < b && a >= s->last_b;
    s->last_b = b;
    s->bytes += b - a;
    s->most = b - a > s->most ? b - a : s->most;
    s->n++;
    return 0;
}

static int confirm_iv(void *ctx, uint64_t a, uint64_t b)
{
    uint64_t(*iv)[2] = ctx;
    size_t n = (size_t)iv[0][0]++;
    iv[n + 1][0] = a;
    iv[n + 1][1] = b;
    return 0;
}

/* gpu/plan.c's confirmation items (refscan_confirm_items) for hundreds of
 * factor ends spread over a 64 KiB buffer, lookback 121 (gitleaks-regex's
 * generic-api-key group): many pieces of at most a segment, which cover
 * every start interval, walk far fewer start bytes than the old fallback
 * (one walk from the first start to the last end, past 16 intervals) and
 * stay under the item cap, which grows gap and piece when it is reached. */
START_TEST(test_confirm_items_bounded)
{
    enum { N = 300, LEN = 65536, LOOK = 121 };
    static uint64_t ends[N];
    static uint64_t iv[N + 1][2];
    rng = 0x5eed0c0full;
    const struct refscan_starts look = {.lookback = LOOK};
    uint64_t e = 0;
    for (size_t i = 0; i < N; i++) {
        e += 1 + rnd(i % 50 == 0 ? 8 : 430); /* clusters and gaps: 300 ends in about 64 KiB */
        ends[i] = e < LEN ? e : LEN;
    }
    iv[0][0] = 0;
    ck_assert_int_eq(refscan_confirm_starts(&look, ends, N, 1, confirm_iv, iv), 0);
    size_t n_iv = (size_t)iv[0][0];
    ck_assert_uint_gt(n_iv, 16); /* the old plan fell back to one walk */
    uint64_t old_bytes = iv[n_iv][1] - iv[1][0];
    ck_assert_uint_gt(old_bytes, LEN * 9 / 10);
    struct confirm_spans s = {.ordered = true};
    ck_assert_int_eq(
        refscan_confirm_items(&look, ends, N, 1, 64, 2048, LEN / 256, confirm_span, &s), 0);
    ck_assert(s.ordered);
    ck_assert_uint_gt(s.n, 100);
    ck_assert_uint_le(s.n, LEN / 256);
    ck_assert_uint_le(s.most, 2048);
    ck_assert_uint_lt(s.bytes, old_bytes * 3 / 4);
    /* every start interval lies inside the pieces' union: walk both */
    struct confirm_spans cover = {.ordered = true};
    uint64_t(*pc)[2] = calloc(N + 1, sizeof(*pc));
    ck_assert_int_eq(refscan_confirm_items(&look, ends, N, 1, 64, 2048, LEN / 256, confirm_iv, pc),
                     0);
    size_t n_pc = (size_t)pc[0][0], q = 1;
    for (size_t x = 1; x <= n_iv; x++) {
        for (uint64_t at = iv[x][0]; at < iv[x][1]; at++) {
            while (q <= n_pc && pc[q][1] <= at)
                q++;
            ck_assert_msg(q <= n_pc && pc[q][0] <= at, "start %" PRIu64 " in no piece", at);
        }
    }
    /* a cap of 8 items: gap and piece grow until it holds */
    ck_assert_int_eq(refscan_confirm_items(&look, ends, N, 1, 64, 2048, 8, confirm_span, &cover),
                     0);
    ck_assert_uint_ge(cover.n, 1);
    ck_assert_uint_le(cover.n, 8);
    ck_assert(cover.ordered);
    free(pc);
}
END_TEST

/* Buffers dense with factor candidates of a forward-confirmed group, each
 * short enough for one whole walk on lavapipe: planned as pieces of a
 * segment (the old plan joined intervals closer than a segment: one walk
 * a buffer here), and the
 * hits equal refscan's in every mode; a 64 KiB buffer of them too (on
 * lavapipe it is walked in chained rounds, on the H200 confirmed). */
START_TEST(test_confirm_many)
{
    static const struct trule rules[] = {
        {"start", RULE_REGEX, "\\bkey[a-z]*=[0-9]+", 0},
    };
    struct gpu_options opt = {.segment_bytes = 64};
    struct gpu_engine *eng = engine(&opt);
    struct rules_options ro = {.force_bitnfa = true};
    struct catalog *cat = compile_rules_opt(rules, 1, &ro);
    struct catalog_nfa g;
    catalog_nfa(cat, 0, &g);
    ck_assert(g.flags & CAT_GF_CONFIRM);
    rng = 0x0c0f12aa7ull;
    enum { NB = 13 };
    static const char *const plants[] = {"key=12", "keyab=9", "key", "KEY=1", " key=77 "};
    struct gpu_buffer bufs[NB];
    size_t cands = 0;
    for (uint32_t i = 0; i < NB; i++) {
        size_t len = i == NB - 1 ? 65536 : 450 + rnd(200);
        uint8_t *d = (uint8_t *)random_text(len);
        for (size_t p = rnd(20); p + 10 < len; p += 6 + rnd(i == NB - 1 ? 400 : 40), cands++) {
            const char *x = plants[rnd(5)];
            memcpy(d + p, x, strlen(x));
        }
        bufs[i] = (struct gpu_buffer){
            .data = d, .len = len, .id = i, .mode = (enum scan_mode)(i % 3), .catalog = 0};
    }
    ck_assert_uint_gt(cands, 500);
    const struct catalog *cats[1] = {cat};
    struct gpu_batch b = {cats, 1, bufs, NB - 1};
    struct gpu_result res = {0};
    ck_assert_uint_ge(check_batch(eng, &b, &res), 50);
    if (res.tel.cut_reruns == 0) { /* confirmed: pieces of a segment, not one walk */
        ck_assert_uint_eq(res.tel.rounds, 1);
        ck_assert_uint_gt(res.tel.items_total, 4 * (NB - 1));
    }
    gpu_result_finish(&res);
    b = (struct gpu_batch){cats, 1, bufs, NB};
    res = (struct gpu_result){0};
    ck_assert_uint_ge(check_batch(eng, &b, &res), 200);
    gpu_result_finish(&res);
    for (uint32_t i = 0; i < NB; i++)
        free((void *)bufs[i].data);
    catalog_destroy(cat);
    gpu_engine_destroy(eng);
}
END_TEST

/* The host walks the factor group of a long buffer in pieces of 256 KiB
 * (gpu/plan.c, GATE_PIECE) on several threads: factors that end just
 * before, at and just after a piece's edge, or straddle it, still gate
 * their windows and forward confirmations. The main pass's items of one
 * buffer are planned on those threads in parts of at least 1 MiB
 * (PRE_PIECE), here cut at 1 and 2 MiB: a match starts in one part and
 * its factor ends in the next (at 1 MiB), or its factor ends in one part
 * and the match in the next (at 2 MiB): the unbounded rule (_i 0), and
 * the bounded one walked in windows (_i 1) or confirmed forward (_i 2). */
START_TEST(test_gated_pieces)
{
    static const struct trule rules[] = {
        {"win", RULE_REGEX, "qzkey[0-9]{2,8}x", 0},
        {"fwd", RULE_REGEX, "wvtok[a-z]*;", 0},
    };
    struct gpu_engine *eng =
        engine(&(struct gpu_options){.gate_windows = _i == 1, .upload_threads = 4});
    struct rules_options ro = {.force_bitnfa = true};
    struct catalog *cat = compile_rules_opt(rules, 2, &ro);
    for (uint32_t k = 0; k < catalog_nfa_count(cat); k++) {
        struct catalog_nfa g;
        catalog_nfa(cat, k, &g);
        ck_assert(g.flags & CAT_GF_GATED);
    }
    const size_t piece = 1u << 18, len = 10 * piece + 1000;
    uint8_t *d = malloc(len);
    memset(d, '.', len);
    size_t planted = 0;
    for (size_t k = 1; k <= 10; k++) {
        /* the factor (5 bytes) ends at edge - 1 .. edge + 8: before, at,
         * and straddling the edge */
        size_t end = k * piece + k - 2;
        const char *x = k % 2 ? "qzkey123x" : "wvtokab;";
        if (k == 4 || k == 8) /* across 1 and 2 MiB, one rule or the other */
            x = _i != 0 ? "qzkey123x" : "wvtokab;";
        if (k == 8) /* the match ends at 2 MiB + 1, its factor before 2 MiB */
            end = k * piece + 1 - strlen(x) + 5;
        memcpy(d + end - 5, x, strlen(x));
        memcpy(d + k * piece - 5000, x, strlen(x)); /* and inside a piece */
        planted += 2;
    }
    struct gpu_buffer buf = {.data = d, .len = len, .mode = SCAN_ALL};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, &buf, 1};
    struct gpu_result res = {0};
    size_t hits = check_batch(eng, &b, &res);
    ck_assert_uint_eq(hits, planted);
    gpu_result_finish(&res);
    free(d);
    catalog_destroy(cat);
    gpu_engine_destroy(eng);
}
END_TEST

/* The parts of one long buffer (gpu/plan.c plan_pre) cost no more work
 * than one part: `\b[a-z ]+ qzend` is confirmed forward from its factor
 * with no bound on how far back a start lies, and a buffer read at upload
 * has no bytes at plan time for the span test, so every factor end's
 * start interval reaches back to the buffer's start. A part starts its
 * intervals at the group's last end in the parts before it; without that
 * each part walked every earlier part's bytes again (an H100 host: the
 * CLI's leads.rules 7.6x slower, docs/PERFORMANCE.md "Session 40"). The
 * items of four upload threads (parts at 1, 2 and 3 MiB) stay within a
 * few of one thread's (no parts), and the hits equal refscan's. */
START_TEST(test_gated_parts_items)
{
    static const struct trule rules[] = {{"end", RULE_REGEX, "\\b[a-z ]+ qzend", 0}};
    struct rules_options ro = {.force_bitnfa = true};
    struct catalog *cat = compile_rules_opt(rules, 1, &ro);
    struct catalog_nfa g;
    catalog_nfa(cat, 0, &g);
    ck_assert(g.flags & CAT_GF_CONFIRM);
    const size_t len = (4u << 20) + 777;
    uint8_t *d = malloc(len);
    for (size_t i = 0; i < len; i++)
        d[i] = "lorem ipsum dolor sit amet;\n"[i % 28];
    for (size_t at = 5000; at + 16 < len; at += 99991)
        memcpy(d + at, " qzend", 6);
    const struct catalog *cats[] = {cat};
    uint64_t items[2];
    struct gpu_result res[2] = {{0}};
    struct gpu_engine *eng = NULL;
    for (int t = 0; t < 2; t++) {
        if (eng != NULL)
            gpu_engine_destroy(eng);
        eng = engine(&(struct gpu_options){.upload_threads = t ? 4 : 1});
        struct gpu_buffer buf = {.len = len, .mode = SCAN_ALL, .read = read_from, .read_ctx = d};
        struct gpu_batch b = {cats, 1, &buf, 1};
        struct vks_error err = {0};
        ck_assert_int_eq(gpu_batch_dispatch(eng, &b, &res[t], &err), 0);
        items[t] = res[t].tel.items_total;
    }
    ck_assert_uint_gt(res[0].n_hits, 30);
    assert_same_hits(&res[1], &res[0]);
    ck_assert_msg(items[1] <= items[0] + 8, "items: %llu with parts, %llu without",
                  (unsigned long long)items[1], (unsigned long long)items[0]);
    struct gpu_buffer mem = {.data = d, .len = len, .mode = SCAN_ALL};
    struct gpu_batch bm = {cats, 1, &mem, 1};
    ck_assert_uint_eq(check_result(&bm, &res[1]), res[1].n_hits);
    /* the same bytes in memory: the span test reads them where they are;
     * read at upload, the plan read them back (plan_runs) for the same
     * items, where the lookback alone walked from each end to the next */
    struct gpu_result rm = {0}; /* on the four threads' engine */
    struct vks_error err = {0};
    ck_assert_int_eq(gpu_batch_dispatch(eng, &bm, &rm, &err), 0);
    assert_same_hits(&rm, &res[0]);
    for (int t = 0; t < 2; t++) {
        ck_assert_msg(items[t] <= rm.tel.items_total + 8,
                      "items: %llu read at upload (%d threads), %llu in memory",
                      (unsigned long long)items[t], t ? 4 : 1,
                      (unsigned long long)rm.tel.items_total);
    }
    gpu_result_finish(&rm);
    gpu_engine_destroy(eng);
    gpu_result_finish(&res[0]);
    gpu_result_finish(&res[1]);
    free(d);
    catalog_destroy(cat);
}
END_TEST

/* A buffer read at upload whose confirmation groups need their run starts
 * read back from it (gpu/plan.c plan_runs): runs of letters of 3,000 to
 * 6,000 bytes before "qzend" (longer than the 4 KiB read before a window),
 * laid across the 1 MiB windows and the 2 MiB tasks the reads are cut in,
 * and one of 70,000 (longer than the 64 KiB read then), for two rules of
 * no lookback bound and different spans. Every hit, on four upload
 * threads, equals refscan's on the same bytes in memory (one thread:
 * test_gated_parts_items). */
START_TEST(test_gated_runs)
{
    static const struct trule rules[] = {
        {"unb", RULE_REGEX, "\\b[a-z ]+ qzend", 0},
        {"digit", RULE_REGEX, "7[a-z]+qzend;", 0},
    };
    struct rules_options ro = {.force_bitnfa = true};
    struct catalog *cat = compile_rules_opt(rules, 2, &ro);
    const size_t len = (2u << 20) + 99999;
    uint8_t *d = malloc(len);
    for (size_t i = 0; i < len; i++)
        d[i] = "lorem ipsum dolor sit amet;\n"[i % 28];
    uint64_t seed = 12345;
    /* a run across each MiB edge (the 2 MiB one is a task's), one after */
    for (uint64_t at = 300000; at + 10000 < len; at += at % (1u << 20) ? 748576 : 300000) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t run = 3000 + (seed >> 33) % 3000, lo = at % (1u << 20) ? at : at - run / 2;
        bool unb = (seed >> 12) & 1;
        d[lo] = unb ? ' ' : '7';
        for (uint64_t k = 1; k < run; k++)
            d[lo + k] = (uint8_t)('a' + (seed >> (k % 40)) % 26);
        memcpy(d + lo + run, unb ? " qzend" : "qzend;", 6);
    }
    /* and one longer than the 64 KiB read before a window (RUN_BACK) */
    d[1700000] = '7';
    memset(d + 1700001, 'q', 70000);
    memcpy(d + 1770001, "qzend;", 6);
    const struct catalog *cats[] = {cat};
    struct gpu_buffer mem = {.data = d, .len = len, .mode = SCAN_ALL};
    struct gpu_batch bm = {cats, 1, &mem, 1};
    {
        struct gpu_engine *eng = engine(&(struct gpu_options){.upload_threads = 4});
        struct gpu_buffer buf = {.len = len, .mode = SCAN_ALL, .read = read_from, .read_ctx = d};
        struct gpu_batch b = {cats, 1, &buf, 1};
        struct gpu_result res = {0};
        struct vks_error err = {0};
        int rc = gpu_batch_dispatch(eng, &b, &res, &err);
        ck_assert_msg(rc == 0, "gpu_batch_dispatch: %d %s", rc, err.msg);
        ck_assert_uint_ge(check_result(&bm, &res), 5); /* each run ends a match */
        gpu_result_finish(&res);
        gpu_engine_destroy(eng);
    }
    free(d);
    catalog_destroy(cat);
}
END_TEST

/* A buffer longer than a segment with matches of bit-NFA rules straddling
 * segment boundaries: a bounded gap rule (segments start maxlen-1 early),
 * an unbounded one (chained rounds carry the state vector) and a 1000-wide
 * gap whose lookback is over lavapipe's loop budget (chained as well). */
START_TEST(test_bitnfa_segments)
{
    struct trule t[] = {{"gap", RULE_REGEX, "needle.{0,100}12", 0},
                        {"unb", RULE_REGEX, "n[a-z]+d[a-z]e[^#]*1[0-9]{1,40}2", 0},
                        {"wide", RULE_REGEX, "\\bneedle[^#]{0,1000}12\\b", 0},
                        {"lit", RULE_LITERAL, "needle12", 0},
                        {"huge", RULE_REGEX, "ne[^#]{0,5000}Z9", 0}};
    /* "unb" has no factor (no 3 bytes in a row with at most 4 values each),
     * so it is an ungated unbounded group (chained rounds, or speculative
     * segments) on every device:
     * a factored one would be confirmed forward from its factor
     * (test_confirm_nfa), and an H200 has no loop budget to chain "wide". */
    struct rules_options ro = {.gate_bits = UINT32_MAX};
    struct catalog *cat = compile_rules_opt(t, 5, &ro);
    ck_assert_uint_ge(catalog_nfa_count(cat), 2); /* "huge" (5006 bits) has a group of its own */
    uint32_t chained = 0;
    for (uint32_t g = 0; g < catalog_nfa_count(cat); g++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, g, &cn);
        chained += cn.maxlen == CATALOG_UNBOUNDED && !(cn.flags & CAT_GF_GATED);
    }
    ck_assert_uint_eq(chained, 1);
    const uint32_t seg = 64;
    /* chained rounds, not speculative segments (test_spec_segments) */
    struct gpu_options opt = {.segment_bytes = seg, .chain_bytes = 96, .spec_lookback = UINT32_MAX};
    struct gpu_engine *eng = engine(&opt);
    enum { N = 12 };
    struct gpu_buffer bufs[N];
    uint8_t *data[N];
    for (uint32_t i = 0; i < N; i++) {
        size_t len = 40 * seg + i;
        data[i] = malloc(len);
        memset(data[i], '.', len);
        memcpy(data[i] + 2 * seg - 10 + i, "needle12", 8); /* straddles a boundary */
        memcpy(data[i] + 5 * seg - 3, "needle", 6);        /* gap of ~90 bytes */
        memcpy(data[i] + 6 * seg + 30 - i, "12 ", 3);
        memcpy(data[i] + 10 * seg, " needle", 7); /* gap of ~700 bytes */
        memcpy(data[i] + 21 * seg + i, "12 ", 3);
        memcpy(data[i] + 38 * seg + i, "Z9", 2); /* 'huge' from every "ne" before */
        bufs[i] = (struct gpu_buffer){.data = data[i], .len = len, .mode = SCAN_ALL};
    }
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, N};
    struct gpu_result res = {0};
    size_t n = check_batch(eng, &b, &res);
    ck_assert_uint_ge(n, 4 * N);
    ck_assert_uint_ge(res.tel.rounds, 2);
    gpu_result_finish(&res);
    /* speculative segments (docs/gpu.md): "unb" (and, over lavapipe's loop
     * budget, "wide" and "huge") in segments of 200 bytes that guess their
     * state vector from 8 bytes before them; most guesses inside a gap are
     * wrong, and the host re-walks those segments */
    gpu_engine_destroy(eng);
    struct gpu_options spec = {.segment_bytes = 200, .spec_lookback = 8};
    eng = engine(&spec);
    n = check_batch(eng, &b, &res);
    ck_assert_uint_ge(n, 4 * N);
    if (gpu_engine_device(eng)->loop_budget == 0xffffffffu) /* lavapipe still chains "huge" */
        ck_assert_uint_eq(res.tel.rounds, 1);
    ck_assert_uint_ge(res.tel.spec_items, N * 12);
    ck_assert_uint_ge(res.tel.spec_fixes, N);
    gpu_result_finish(&res);
    /* the default launch policy as well: real segment sizes */
    gpu_engine_destroy(eng);
    eng = engine(NULL);
    n = check_batch(eng, &b, &res);
    ck_assert_uint_ge(n, 4 * N);
    gpu_result_finish(&res);
    for (uint32_t i = 0; i < N; i++)
        free(data[i]);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* ---- tests -------------------------------------------------------------- */

/* Small segments and chained rounds: every boundary case appears often. */
static void random_with(enum gpu_hit_writer w)
{
    struct gpu_options opt = {.hit_writer = w, .segment_bytes = 48, .chain_bytes = 160};
    struct gpu_engine *eng = engine(&opt);
    for (uint32_t seed = 1; seed <= 12; seed++)
        random_round(eng, seed, 1 + rnd(40), 700);
    gpu_engine_destroy(eng);
}

START_TEST(test_random_scalar)
{
    random_with(GPU_HITS_SCALAR);
}
END_TEST

START_TEST(test_random_subgroup)
{
    struct gpu_device_info info[8];
    uint32_t n = 0;
    ck_assert_int_eq(gpu_device_list(info, 8, &n, NULL), 0);
    struct gpu_engine *probe = engine(NULL);
    bool sub = gpu_engine_device(probe)->subgroup_hits;
    gpu_engine_destroy(probe);
    if (!sub) {
        /* The writer cannot run here; asking for it must say so. */
        struct gpu_options opt = {.hit_writer = GPU_HITS_SUBGROUP};
        struct gpu_engine *eng = NULL;
        ck_assert_int_eq(gpu_engine_create(&opt, &eng, NULL), -EINVAL);
        return;
    }
    random_with(GPU_HITS_SUBGROUP);
}
END_TEST

/* The staged upload of discrete devices, forced here: small chunks, each
 * filled by several threads and submitted by whichever fills its last
 * piece. A chunk that never reached the haystack would lose its hits. */
START_TEST(test_staged_upload)
{
    struct gpu_options opt = {
        .staged_upload = true, .upload_chunk = 256u << 10, .upload_threads = 4};
    struct gpu_engine *eng = engine(&opt);
    for (uint32_t seed = 1; seed <= 3; seed++) {
        struct gpu_telemetry tel = random_round(eng, 310 + seed, 12, 120000);
        /* Under 16 MiB the chunk is the forced 256 KiB. */
        uint64_t chunks = (tel.haystack_bytes_uploaded + (256u << 10) - 1) / (256u << 10);
        ck_assert_uint_gt(chunks, 1);
        ck_assert_uint_ge(tel.submits, chunks + 1);
    }
    opt.upload_chunk = 16;
    gpu_engine_destroy(eng);
    eng = engine(&opt);
    for (uint32_t seed = 4; seed <= 6; seed++)
        random_round(eng, 300 + seed, 1 + rnd(30), 600);
    gpu_engine_destroy(eng);
}
END_TEST

/* Staging grows with room to spare (gpu/batch.c stage_size, docs/gpu.md
 * "Batch buffers"): on one frame, a batch a little larger than the first
 * grows the haystack but not staging, so it makes less than twice its
 * haystack in buffers, and a smaller batch makes none. Every hit exact. */
START_TEST(test_staging_room)
{
    struct gpu_options opt = {.staged_upload = true, .inflight = 1};
    struct gpu_engine *eng = engine(&opt);
    const struct trule t[] = {{"abc", RULE_LITERAL, "abc", 0}};
    struct catalog *cat = compile_rules(t, 1);
    const struct catalog *cats[1] = {cat};
    const size_t sizes[3] = {17u << 20, 20u << 20, 16u << 20};
    rng = 0x57a9e5eedull;
    uint8_t *text = random_text(sizes[1]);
    uint64_t made[3];
    for (int k = 0; k < 3; k++) {
        struct gpu_buffer gb = {.data = text, .len = sizes[k], .mode = SCAN_ALL};
        struct gpu_batch b = {.catalogs = cats, .n_catalogs = 1, .buffers = &gb, .n_buffers = 1};
        struct gpu_result res = {0};
        ck_assert_uint_gt(check_batch(eng, &b, &res), 0);
        made[k] = res.tel.buffers_made_bytes;
        ck_assert_msg(made[k] == 0 || res.tel.buffers_made_ns > 0, "batch %d: made in no time", k);
        gpu_result_finish(&res);
    }
    ck_assert_msg(made[0] >= 2 * (uint64_t)sizes[0], "first batch made %llu bytes",
                  (unsigned long long)made[0]);
    ck_assert_msg(made[1] > 0 && made[1] < sizes[1] + sizes[1] / 2,
                  "a 20 MiB batch after a 17 MiB one made %llu bytes: staging grew again",
                  (unsigned long long)made[1]);
    ck_assert_msg(made[2] == 0, "a smaller batch made %llu bytes", (unsigned long long)made[2]);
    free(text);
    catalog_destroy(cat);
    gpu_engine_destroy(eng);
}
END_TEST

/* The caller's largest batch (gpu_options.batch_bytes_hint, vkscand's
 * batch-max-bytes): the first batch of a quarter of it or more grows the
 * frame's haystack and staging to it, so larger batches after it make no
 * haystack or staging again; without the hint the second batch grows
 * them. Every hit exact. */
START_TEST(test_batch_bytes_hint)
{
    const struct trule t[] = {{"abc", RULE_LITERAL, "abc", 0}};
    struct catalog *cat = compile_rules(t, 1);
    const struct catalog *cats[1] = {cat};
    const size_t sizes[3] = {5u << 20, 10u << 20, 15u << 20};
    rng = 0xb16ba7c4ull;
    uint8_t *text = random_text(sizes[2]);
    for (int hinted = 1; hinted >= 0; hinted--) {
        struct gpu_options opt = {
            .staged_upload = true, .inflight = 1, .batch_bytes_hint = hinted ? 16u << 20 : 0};
        struct gpu_engine *eng = engine(&opt);
        uint64_t made[3];
        for (int k = 0; k < (hinted ? 3 : 2); k++) {
            struct gpu_buffer gb = {.data = text, .len = sizes[k], .mode = SCAN_ALL};
            struct gpu_batch b = {
                .catalogs = cats, .n_catalogs = 1, .buffers = &gb, .n_buffers = 1};
            struct gpu_result res = {0};
            ck_assert_uint_gt(check_batch(eng, &b, &res), 0);
            made[k] = res.tel.buffers_made_bytes;
            gpu_result_finish(&res);
        }
        if (hinted) {
            ck_assert_msg(made[0] >= 2 * (16ull << 20), "the first batch made %llu bytes",
                          (unsigned long long)made[0]);
            for (int k = 1; k < 3; k++) /* work items and the hit ring may grow, no more */
                ck_assert_msg(made[k] < sizes[k] / 4, "batch %d of %zu MiB made %llu bytes", k,
                              sizes[k] >> 20, (unsigned long long)made[k]);
        } else {
            ck_assert_msg(made[1] >= sizes[1], "no hint: the second batch made %llu bytes",
                          (unsigned long long)made[1]);
        }
        gpu_engine_destroy(eng);
    }
    free(text);
    catalog_destroy(cat);
}
END_TEST

/* Discrete devices (forced): a pass copies back in its own command
 * buffer the hits the last pass's rate predicts. A few hits need no second
 * submit; a batch of many more than predicted takes one (and is exact);
 * the next batch like it is predicted and takes none. */
START_TEST(test_hit_copy_ahead)
{
    struct gpu_options opt = {.staged_upload = true, .inflight = 2};
    struct gpu_engine *eng = engine(&opt);
    const struct trule t[] = {{"ab", RULE_LITERAL, "ab", 0}, {"b.b", RULE_REGEX, "b.b", 0}};
    struct catalog *cat = compile_rules(t, 2);
    const struct catalog *cats[1] = {cat};
    size_t len = 48000;
    uint8_t *sparse = random_text(len), *dense = malloc(len);
    ck_assert_ptr_nonnull(dense);
    for (size_t i = 0; i < len; i++)
        dense[i] = "ab"[i % 2]; /* a hit of each rule every other byte */
    for (size_t i = 0; i < len; i++)
        sparse[i] = sparse[i] == 'b' ? 'c' : sparse[i];
    for (size_t i = 100; i < len; i += 1000)
        sparse[i] = 'a', sparse[i + 1] = 'b'; /* 48 hits of "ab" */
    const uint8_t *data[4] = {sparse, dense, dense, sparse};
    const uint32_t submits[4] = {0, 1, 0, 0};
    for (int k = 0; k < 4; k++) {
        struct gpu_buffer gb = {.data = data[k], .len = len, .mode = SCAN_ALL};
        struct gpu_batch b = {.catalogs = cats, .n_catalogs = 1, .buffers = &gb, .n_buffers = 1};
        struct gpu_result res = {0};
        size_t n = check_batch(eng, &b, &res);
        ck_assert_uint_eq(n, data[k] == dense ? len - 1 : 48);
        ck_assert_uint_eq(res.tel.hit_reruns, 0);
        ck_assert_msg(res.tel.hit_copy_submits == submits[k], "batch %d: %u hit copy submits", k,
                      res.tel.hit_copy_submits);
        gpu_result_finish(&res);
    }
    free(sparse);
    free(dense);
    catalog_destroy(cat);
    gpu_engine_destroy(eng);
}
END_TEST

/* Default launch policy (no forced sizes): many buffers, hundreds in one
 * batch, a few catalogs. */
START_TEST(test_many_buffers)
{
    struct gpu_engine *eng = engine(NULL);
    random_round(eng, 101, 400, 300);
    random_round(eng, 102, 250, 2000);
    gpu_engine_destroy(eng);
}
END_TEST

/* A literal planted at every offset around segment boundaries. */
/* ---- the literal kernel (gpu/lit.h, shaders/scan_lit.comp) ------------- */

/* A random string of `len` bytes for variant v: 0 letters (some rules
 * caseless), 1 any byte value, 2 letters, digits and punctuation. */
static void lit_string(uint32_t v, uint8_t *out, uint32_t len)
{
    static const char text[] = "etaoinshrdlucmfwypvbgkjqxz0123456789 .,_-";
    for (uint32_t k = 0; k < len; k++)
        out[k] = v == 1 ? (uint8_t)rnd(256) : (uint8_t)text[rnd(v == 0 ? 26 : sizeof(text) - 1)];
}

/* The rule for string b: a \xHH regex (any byte), or a plain literal. */
static void lit_rule(struct trule *t, char *pat, const uint8_t *b, uint32_t len, bool caseless)
{
    bool plain = true;
    for (uint32_t k = 0; k < len; k++)
        plain = plain && b[k] >= 0x20 && b[k] < 0x7f;
    if (plain) {
        memcpy(pat, b, len);
        pat[len] = 0;
        t->kind = RULE_LITERAL;
    } else {
        for (uint32_t k = 0; k < len; k++)
            snprintf(pat + 4 * k, 5, "\\x%02x", b[k]);
        t->kind = RULE_REGEX;
    }
    t->pat = pat;
    t->flags = caseless ? RULE_F_CASELESS : 0;
}

/* Haystack of `len` bytes for variant v, with strings of the set planted
 * densely (every ~`gap` bytes, often overlapping) and at both ends. */
static uint8_t *lit_haystack(uint32_t v, uint8_t *const *str, const uint32_t *slen, uint32_t n,
                             size_t len, uint32_t gap)
{
    uint8_t *p = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(p);
    lit_string(v == 1 ? 1 : 2, p, (uint32_t)len);
    for (size_t at = 0; at < len; at += 1 + rnd(gap)) {
        uint32_t i = rnd(n);
        if (at + slen[i] > len)
            continue;
        memcpy(p + at, str[i], slen[i]);
        for (uint32_t k = 0; v == 0 && k < slen[i]; k++) /* other cases */
            if (rnd(3) == 0 && p[at + k] >= 'a' && p[at + k] <= 'z')
                p[at + k] ^= 0x20;
    }
    for (uint32_t e = 0; e < 2 && len > 0; e++) {
        uint32_t i = rnd(n);
        if (slen[i] <= len)
            memcpy(e ? p + len - slen[i] : p, str[i], slen[i]);
    }
    return p;
}

/*
 * The literal kernel against refscan, 3,000 strings: _i 0 text words
 * (a third caseless), 1 binary strings over all 256 byte values, 2
 * strings of 1 to 64 bytes (those under 4 bytes keep their groups on the
 * DFA), 3 as 0 in several groups under the automatic choice; a tenth
 * share an id with the rule before. Hit-dense
 * buffers of 0 to 3000 bytes with strings at both ends, small segments so
 * that many straddle a segment boundary, every report mode, single-match
 * rules. Telemetry says how many groups the kernel took; the test fails
 * when none (or not all) went to it.
 */
START_TEST(test_literal_kernel)
{
    rng = 0x51ed270b27a3c1d5ull + (uint64_t)_i;
    uint32_t v = _i >= 3 ? 0 : (uint32_t)_i;
    enum { N = 3000, MAXLEN = 64 };
    struct trule *t = calloc(N, sizeof(*t));
    char(*pat)[4 * MAXLEN + 1] = calloc(N, sizeof(*pat));
    uint8_t **str = calloc(N, sizeof(*str));
    uint32_t *slen = calloc(N, sizeof(*slen));
    ck_assert(t != NULL && pat != NULL && str != NULL && slen != NULL);
    for (uint32_t i = 0; i < N; i++) {
        slen[i] = v == 2 ? 1 + rnd(MAXLEN) : 4 + rnd(v == 1 ? 29 : 13);
        str[i] = malloc(slen[i]);
        lit_string(v, str[i], slen[i]);
        /* some rules share the id of the one before (report as one) */
        snprintf(t[i].id, sizeof(t[i].id), "l%u", i > 0 && rnd(10) == 0 ? i - 1 : i);
        lit_rule(&t[i], pat[i], str[i], slen[i], v == 0 && rnd(3) == 0);
        if (rnd(16) == 0)
            t[i].flags |= RULE_F_SINGLEMATCH;
    }
    /* variant 2: small groups, so that the short strings (grouped by
     * length) leave some groups to the kernel; 3: several groups, which
     * the automatic choice gives the kernel (one such group it leaves on
     * the DFA unless its rows are over 8 MiB) */
    /* 4: one literal group (CAT_GF_LITERAL, no DFA), the automatic choice:
     * the kernel serves it though it is one group */
    struct rules_options ro = {.max_states = v == 2 || _i == 3 ? 3000 : 0,
                               .literal_group = _i == 4 ? 1 : 0};
    struct catalog *cat = compile_rules_opt(t, N, &ro);
    if (_i == 4) {
        struct catalog_group cg;
        ck_assert_uint_eq(catalog_group_count(cat), 1);
        catalog_group(cat, 0, &cg);
        ck_assert_uint_eq(cg.flags, CAT_GF_LITERAL);
    }
    uint32_t plain_groups = 0;
    for (uint32_t g = 0; g < catalog_group_count(cat); g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        plain_groups += cg.flags == 0 || cg.flags == CAT_GF_LITERAL;
    }
    struct gpu_options opt = {.lit_kernel = _i >= 3 ? 0 : 1, .segment_bytes = _i == 3 ? 0 : 256};
    struct gpu_engine *eng = engine(&opt);
    enum { NB = 12 };
    struct gpu_buffer bufs[NB];
    for (uint32_t i = 0; i < NB; i++) {
        size_t len = i == 0 ? 0 : i == 1 ? 3 : rnd(3000);
        bufs[i] = (struct gpu_buffer){.data = lit_haystack(v, str, slen, N, len, 24),
                                      .len = len,
                                      .id = i,
                                      .mode = i < 8 ? SCAN_ALL : (enum scan_mode)rnd(3)};
    }
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, NB};
    struct gpu_result res = {0};
    size_t hits = check_batch(eng, &b, &res);
    ck_assert_uint_ge(hits, 200);
    ck_assert_uint_ge(res.tel.lit_groups, 1);
    if (v != 2) /* every group holds only strings of 4 bytes or more */
        ck_assert_uint_eq(res.tel.lit_groups, plain_groups);
    else
        ck_assert_uint_lt(res.tel.lit_groups, plain_groups);
    if (_i == 3)
        ck_assert_uint_ge(plain_groups, 2);
    gpu_result_finish(&res);
    /* resident now: the tables are not built or uploaded again */
    ck_assert_uint_ge(check_batch(eng, &b, &res), hits);
    ck_assert_uint_eq(res.tel.catalog_uploads, 0);
    ck_assert_uint_ge(res.tel.lit_groups, 1);
    gpu_result_finish(&res);
    gpu_engine_destroy(eng);
    for (uint32_t i = 0; i < NB; i++)
        free((void *)bufs[i].data);
    for (uint32_t i = 0; i < N; i++)
        free(str[i]);
    free(str);
    free(slen);
    free(pat);
    free(t);
    catalog_destroy(cat);
}
END_TEST

/* Strings that straddle segment and buffer boundaries, two rules with one
 * id (each end reported once, under the first rule's index, as the DFA
 * does), a caseless and a binary one: _i 0 with the
 * kernel; 1 with it, the tables copied through staging (the discrete
 * devices' path), a second catalog beside it (a literal group with a
 * regex group) and a ring of 16 hits, so the pass is re-run at collect
 * from the kept push constants; 2 with the kernel off (0 groups in
 * telemetry, the same hits from the DFA); 3 the automatic choice, which
 * leaves one small group on the DFA. */
START_TEST(test_literal_boundaries)
{
    struct trule t[] = {{"a", RULE_LITERAL, "needle12", 0},
                        {"b", RULE_LITERAL, "NeEdLe", RULE_F_CASELESS},
                        {"c", RULE_LITERAL, "dle12nee", 0},
                        {"a", RULE_LITERAL, "edle12", 0}, /* "a" again: reports as the first */
                        {"d", RULE_REGEX, "\\x00\\xffneedle", 0}};
    struct trule t2[] = {{"e", RULE_LITERAL, "edle12", 0}, {"f", RULE_REGEX, "n[a-f]+dle1", 0}};
    struct catalog *cat = compile_rules(t, 5), *cat2 = compile_rules(t2, 2);
    const uint32_t seg = 64;
    enum { N = 24 };
    struct gpu_buffer bufs[N];
    for (uint32_t i = 0; i < N; i++) {
        size_t len = 4 * seg + (i % 3);
        uint8_t *d = malloc(len);
        memset(d, '.', len);
        memcpy(d + 2 * seg - 10 + i, "needle12", 8); /* straddles or touches the boundary */
        memcpy(d + seg - 8 + (i % 9), "NEEDLE12", 8);
        memcpy(d + len - 8, "\x00\xffneedle", 8);
        memcpy(d, "needle12", 8);
        bufs[i] = (struct gpu_buffer){.data = d, .len = len, .mode = SCAN_ALL};
        bufs[i].catalog = _i == 1 ? i % 2 : 0;
    }
    const struct catalog *cats[] = {cat, cat2};
    struct gpu_batch b = {cats, _i == 1 ? 2 : 1, bufs, N};
    struct gpu_options opt = {.segment_bytes = seg,
                              .lit_kernel = _i == 2   ? -1
                                            : _i == 3 ? 0
                                                      : 1,
                              .staged_upload = _i == 1,
                              .hit_capacity = _i == 1 ? 16 : 0};
    struct gpu_engine *eng = engine(&opt);
    struct gpu_result res = {0};
    ck_assert_uint_ge(check_batch(eng, &b, &res), 2 * N);
    uint32_t want = _i >= 2 ? 0 : catalog_group_count(cat) + (_i == 1);
    ck_assert_uint_eq(catalog_group_count(cat), 1);
    ck_assert_uint_eq(res.tel.lit_groups, want);
    if (_i == 1)
        ck_assert_uint_ge(res.tel.hit_reruns, 1);
    gpu_result_finish(&res);
    gpu_engine_destroy(eng);
    for (uint32_t i = 0; i < N; i++)
        free((void *)bufs[i].data);
    catalog_destroy(cat);
    catalog_destroy(cat2);
}
END_TEST

START_TEST(test_segment_boundaries)
{
    struct trule t[] = {{"lit", RULE_LITERAL, "needle12", 0},
                        {"re", RULE_REGEX, "n[a-z]{4}e1", 0},
                        {"un", RULE_REGEX, "ne+dle1[0-9]*2", 0}};
    struct rules_options ro = {.gate_bits = UINT32_MAX}; /* "un" a chained DFA, not gated */
    struct catalog *cat = compile_rules_opt(t, 3, &ro);
    const uint32_t seg = 64;
    /* chained rounds, not speculative segments (test_spec_segments) */
    struct gpu_options opt = {.segment_bytes = seg, .chain_bytes = 96, .spec_lookback = UINT32_MAX};
    struct gpu_engine *eng = engine(&opt);
    enum { N = 24 };
    struct gpu_buffer bufs[N];
    uint8_t *data[N];
    for (uint32_t i = 0; i < N; i++) {
        size_t len = 4 * seg;
        data[i] = malloc(len);
        memset(data[i], '.', len);
        size_t at = 2 * seg - 10 + i; /* needle12 straddles or touches the boundary */
        memcpy(data[i] + at, "needle12", 8);
        memcpy(data[i] + seg - 8 + (i % 9), "needle12", 8);
        bufs[i] = (struct gpu_buffer){.data = data[i], .len = len, .mode = SCAN_ALL};
    }
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, N};
    struct gpu_result res = {0};
    size_t n = check_batch(eng, &b, &res);
    ck_assert_uint_ge(n, 2 * N * 2);
    ck_assert_uint_ge(res.tel.rounds, 2);
    gpu_result_finish(&res);
    for (uint32_t i = 0; i < N; i++)
        free(data[i]);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* Buffers much longer than a segment, with bounded and unbounded groups
 * and matches at the very end, under the default launch policy. On
 * lavapipe a walk past 65535 loop iterations would be cut short: this
 * needs several chained rounds and full-length bounded segments, and
 * would lose the last matches if the loop budget were wrong. */
/* Long buffers against hit-dense random catalogs with the default plan:
 * lavapipe cut a loop that the cost model thought fit (seed 303). The
 * engine re-plans smaller and re-runs; every hit still comes back. */
START_TEST(test_cut_loops_rerun)
{
    struct gpu_engine *eng = engine(NULL);
    uint32_t reruns = 0;
    for (uint32_t seed = 301; seed <= 304; seed++)
        reruns += random_round(eng, seed, 12, 120000).cut_reruns;
    /* on a device without a loop budget nothing is ever cut */
    if (gpu_engine_device(eng)->loop_budget == 0xffffffffu)
        ck_assert_uint_eq(reruns, 0);
    gpu_engine_destroy(eng);
}
END_TEST

START_TEST(test_long_buffers)
{
    struct trule t[] = {{"lit", RULE_LITERAL, "zzqq", 0},
                        {"end", RULE_REGEX, "q$", 0},
                        {"un", RULE_REGEX, "x[^y]*zzqq", 0},
                        {"a", RULE_LITERAL, "a", 0}};
    /* "un" in a DFA group (its factor zzqq would gate it): what this test
     * walks is speculative DFA segments */
    struct rules_options ro = {.gate_bits = UINT32_MAX};
    struct catalog *cat = compile_rules_opt(t, 4, &ro);
    struct gpu_engine *eng = engine(NULL);
    size_t lens[] = {1u << 20, 300000, 70000, 65536, 65535};
    enum { N = 5 };
    struct gpu_buffer bufs[N];
    for (uint32_t i = 0; i < N; i++) {
        uint8_t *p = malloc(lens[i]);
        memset(p, 'b', lens[i]);
        p[0] = 'x';
        for (size_t k = 4096; k + 4 < lens[i]; k += 4099)
            memcpy(p + k, "zzqq", 4);
        memcpy(p + lens[i] - 4, "zzqq", 4);
        p[lens[i] / 2] = 'a';
        bufs[i] = (struct gpu_buffer){.data = p, .len = lens[i], .mode = SCAN_ALL};
    }
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, N};
    struct gpu_result res = {0};
    check_batch(eng, &b, &res);
    /* the last byte's matches of the longest buffer are there */
    bool last = false;
    for (size_t k = 0; k < res.n_hits; k++)
        last |= res.hits[k].buffer == 0 && res.hits[k].end == lens[0] && res.hits[k].rule == 2;
    ck_assert(last);
    /* "un" is walked in speculative segments; no segment after the first
     * guesses the 'x' at 0, and the host re-walks them (exactly) */
    ck_assert_uint_eq(res.tel.rounds, 1);
    ck_assert_uint_ge(res.tel.spec_items, lens[0] / (64 * 1024));
    ck_assert_uint_ge(res.tel.spec_fixes, 1);
    gpu_result_finish(&res);
    for (uint32_t i = 0; i < N; i++)
        free((void *)bufs[i].data);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* Asked for chained walks longer than the device's loop budget allows,
 * the engine cuts them into more rounds instead of letting the driver cut
 * a loop short: every match, including the last byte's, is still found. */
START_TEST(test_loop_budget)
{
    struct gpu_engine *probe = engine(NULL);
    uint32_t budget = gpu_engine_device(probe)->loop_budget;
    gpu_engine_destroy(probe);
    struct trule t[] = {{"un", RULE_REGEX, "x[^y]*z", 0}, {"b", RULE_LITERAL, "zz", 0}};
    struct catalog *cat = compile_rules(t, 2);
    struct gpu_options opt = {
        .chain_bytes = 4u << 20, .segment_bytes = 1u << 20, .spec_lookback = UINT32_MAX};
    struct gpu_engine *eng = engine(&opt);
    size_t len = 2u << 20;
    uint8_t *p = calloc(1, len);
    p[0] = 'x';
    p[len - 1] = 'z';
    p[len - 2] = 'z';
    struct gpu_buffer buf = {.data = p, .len = len};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, &buf, 1};
    struct gpu_result res = {0};
    ck_assert_uint_eq(check_batch(eng, &b, &res), 3);
    if (budget != 0xffffffffu) {
        ck_assert_uint_ge(res.tel.rounds, 2 * len / budget);
        ck_assert_uint_lt(res.tel.segment_bytes, len);
    }
    gpu_result_finish(&res);
    free(p);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* One buffer's end offsets of rule `rule` in `res`, as a bitmap test. */
static size_t count_rule(const struct gpu_result *res, uint32_t buf, uint32_t rule)
{
    size_t n = 0;
    for (size_t k = 0; k < res->n_hits; k++)
        n += res->hits[k].buffer == buf && res->hits[k].rule == rule;
    return n;
}

/* The factor pass (docs/gpu.md): the device finds the factor ends of
 * gated groups, the plan of the pass after it uses them, and the hits are
 * refscan's whichever finds them, also for a buffer read by callback.
 * _i 0: on the device; 1: on the device, uploads through staging; 2: on
 * the host, which refuses a buffer read by callback. (test_confirm_cap
 * runs the factor pass with host-finished confirmations.) */
START_TEST(test_factor_pass)
{
    static const struct trule rules[] = {
        {"key", RULE_REGEX, "\\bkey[^\\n]{0,12}end", 0},
        {"tok", RULE_REGEX, "tok(?:en|EN)[a-z0-9]{4,10}\\b", RULE_F_CASELESS},
        {"alt", RULE_REGEX, "(?:abc|xyz)[0-9]{2,12}Q", RULE_F_SINGLEMATCH},
        {"start", RULE_REGEX, "\\bkey[a-z]*=[0-9]+", 0},
        {"mid", RULE_REGEX, "q[0-9]{1,5}zq9[^\\n]*;", 0},
        /* not `[a-z]+@corp`, which the compiler cuts to `[a-z]@corp` */
        {"lead", RULE_REGEX, "[a-z][a-z]*@corp[a-z]*", 0},
        {"pem", RULE_REGEX, "(?s)BEGINKEY.*END", 0},
    };
    static const char *const plants[] = {"key = 1 end", "TOKEN0123abcd9 ", "xyz123Q",  "key=12",
                                         "q12zq9 ab;",  "bob@corp",        "BEGINKEY", "END"};
    struct rules_options ro = {.force_bitnfa = true};
    struct catalog *cat = compile_rules_opt(rules, sizeof(rules) / sizeof(rules[0]), &ro);
    uint32_t gated = 0;
    for (uint32_t k = 0; k < catalog_nfa_count(cat); k++) {
        struct catalog_nfa g;
        catalog_nfa(cat, k, &g);
        gated += (g.flags & CAT_GF_GATED) != 0;
    }
    ck_assert_uint_gt(gated, 1);
    /* 3: the ends (and hits) sorted on the upload threads */
    struct gpu_options opt = {.segment_bytes = _i == 1 ? 0 : 256,
                              .factor_pass = _i == 2 ? -1 : 1,
                              .staged_upload = _i == 1,
                              .hits_parallel_min = _i == 3 ? 1 : 0,
                              .upload_threads = _i == 3 ? 3 : 0};
    struct gpu_engine *eng = engine(&opt);
    rng = 0xfac7012ull + (uint64_t)_i;
    enum { NB = 9 };
    struct gpu_buffer bufs[NB];
    for (uint32_t i = 0; i < NB; i++) {
        size_t len = i == 0 ? 0 : i == NB - 1 ? 200000 : 100 + rnd(5000);
        uint8_t *d = (uint8_t *)random_text(len);
        for (size_t p = rnd(30); len > 20 && p + 16 < len; p += 1 + rnd(i % 3 == 1 ? 20 : 900)) {
            const char *x = plants[rnd(8)];
            memcpy(d + p, x, strlen(x));
        }
        enum scan_mode mode = i == NB - 1 ? SCAN_ALL : (enum scan_mode)(i % 3);
        bufs[i] = (struct gpu_buffer){.data = d, .len = len, .id = i, .mode = mode, .catalog = 0};
    }
    const struct catalog *cats[1] = {cat};
    struct gpu_batch b = {cats, 1, bufs, NB};
    struct gpu_result res = {0};
    ck_assert_uint_ge(check_batch(eng, &b, &res), 100);
    if (_i == 2) {
        ck_assert_uint_eq(res.tel.factor_ends, 0);
    } else {
        ck_assert_uint_gt(res.tel.factor_ends, 100);
        ck_assert_uint_gt(res.tel.factor_ns, 0);
    }
    /* the long buffer's bytes read by callback instead */
    struct gpu_buffer keep = bufs[NB - 1];
    bufs[NB - 1].data = NULL;
    bufs[NB - 1].read = read_from;
    bufs[NB - 1].read_ctx = (void *)keep.data;
    struct gpu_result res2 = {0};
    struct vks_error err = {0};
    int rc = gpu_batch_dispatch(eng, &b, &res2, &err);
    if (_i == 2) {
        ck_assert_int_eq(rc, -EINVAL);
        ck_assert(strstr(err.msg, "callback") != NULL);
    } else {
        ck_assert_msg(rc == 0, "read by callback: %d %s", rc, err.msg);
        assert_same_hits(&res2, &res);
    }
    bufs[NB - 1] = keep;
    gpu_result_finish(&res);
    gpu_result_finish(&res2);
    for (uint32_t i = 0; i < NB; i++)
        free((void *)bufs[i].data);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* The factor pass's ends go to their own gated group, on one thread and
 * on the upload threads: three rules in three gated groups whose factors
 * are planted far apart, so that a window planned from another group's
 * ends would miss every match. */
START_TEST(test_factor_ends_groups)
{
    static const struct trule rules[] = {
        {"a", RULE_REGEX, "alpha[0-9]{2,8}x", 0},
        {"b", RULE_REGEX, "omega[a-f]{3,9}y", 0},
        {"c", RULE_REGEX, "gamma[0-9]{1,4}z", 0},
    };
    struct rules_options ro = {.gated_group_bits = 1};
    struct catalog *cat = compile_rules_opt(rules, 3, &ro);
    ck_assert_uint_eq(catalog_nfa_count(cat), 3);
    struct gpu_engine *eng = engine(&(struct gpu_options){
        .factor_pass = 1, .hits_parallel_min = _i == 1 ? 1 : 0, .upload_threads = 3});
    enum { LEN = 300000 };
    uint8_t *d = malloc(LEN);
    for (size_t i = 0; i < LEN; i++)
        d[i] = "klmnrstuv "[i % 10];
    for (size_t at = 1000; at + 10000 < LEN; at += 10000) {
        memcpy(d + at, "alpha123x", 9);
        memcpy(d + at + 3000, "omegaabcy", 9);
        memcpy(d + at + 6000, "gamma9z", 7);
    }
    struct gpu_buffer bufs[] = {{.data = d, .len = LEN, .mode = SCAN_ALL},
                                {.data = d + 500, .len = 40000, .mode = SCAN_COUNT}};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, 2};
    struct gpu_result res = {0};
    ck_assert_uint_ge(check_batch(eng, &b, &res), 3 * 29);
    ck_assert_uint_ge(res.tel.factor_ends, 3 * 29);
    uint32_t per_rule[3] = {0};
    for (size_t k = 0; k < res.n_hits; k++)
        if (res.hits[k].buffer == 0)
            per_rule[res.hits[k].rule]++;
    for (int r = 0; r < 3; r++)
        ck_assert_uint_eq(per_rule[r], 29);
    gpu_result_finish(&res);
    free(d);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* Factor ends that are common in the data (a factor in every sentence),
 * gathered on one thread, on the upload threads in bins of (buffer, group,
 * range of ends), and (16 buffers: as many as the threads' tasks) on the
 * threads by whole buffers: instances planted at every range's edge give
 * refscan's hits, so no end was lost or misplaced between ranges or
 * buffers. */
START_TEST(test_factor_ends_ranges)
{
    static const struct trule rules[] = {
        {"a", RULE_REGEX, "wyqzk[0-9]{2,8}x", 0},
        {"b", RULE_REGEX, "omega[a-f]{3,9}y", 0},
    };
    struct rules_options ro = {.gated_group_bits = 1};
    struct catalog *cat = compile_rules_opt(rules, 2, &ro);
    ck_assert_uint_ge(catalog_nfa_count(cat), 1);
    struct gpu_engine *eng = engine(&(struct gpu_options){
        .factor_pass = 1, .hits_parallel_min = _i >= 1 ? 1 : 0, .upload_threads = 3});
    enum { LEN = 200000 };
    static const char prose[] = "wyqzk cat and wyqzk dog ran ";
    uint8_t *d = malloc(LEN);
    for (size_t i = 0; i < LEN; i++)
        d[i] = (uint8_t)prose[i % (sizeof(prose) - 1)];
    /* a 200000-byte buffer has 64 ranges of 4096 ends: "wyqzk" ending 8
     * bytes before, at and 8 bytes after an edge, then its digits and x */
    uint32_t planted = 0;
    for (size_t edge = 4096; edge + 16 < LEN; edge += 4096 * 3) {
        for (int o = -1; o <= 1; o++, planted++)
            memcpy(d + (size_t)((long)edge + o * 8 - 5), "wyqzk77x", 8);
        memcpy(d + edge + 40, "omegaabcy", 9);
    }
    /* _i 3: 64 buffers, so the main pass's plan makes each gated group's
     * items in parts of the buffers on the threads (plan_pre) */
    struct gpu_buffer bufs[64] = {{.data = d, .len = LEN, .mode = SCAN_ALL},
                                  {.data = d + 777, .len = 70000, .mode = SCAN_COUNT}};
    uint32_t nb = _i == 3 ? 64 : _i == 2 ? 16 : 2;
    for (uint32_t k = 2; k < nb; k++)
        bufs[k] = (struct gpu_buffer){.data = d + (k * 9001) % (LEN - 30000),
                                      .len = 5000 + k * 333,
                                      .mode = k % 3 == 0 ? SCAN_FIRST : SCAN_ALL};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, nb};
    struct gpu_result res = {0};
    check_batch(eng, &b, &res);
    ck_assert_uint_ge(res.tel.factor_ends, 2 * LEN / (sizeof(prose) - 1));
    uint32_t in0 = 0;
    for (size_t k = 0; k < res.n_hits; k++)
        in0 += res.hits[k].buffer == 0 && res.hits[k].rule == 0;
    ck_assert_uint_eq(in0, planted);
    gpu_result_finish(&res);
    free(d);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* A set of many rules with rare factors (secret-scanner prefixes): each is
 * gated without trying its DFA and the groups stay small, so the catalog
 * has hundreds of gated groups and a batch a dispatch for each group with
 * a factor end; every planted instance is found, as refscan finds it, on
 * one thread and on the upload threads (factor ends and hits). */
START_TEST(test_many_gated_groups)
{
    enum { NR = 600, LEN = 400000 };
    static char pats[NR][48], pre[NR][8];
    struct trule *t = calloc(NR, sizeof(*t));
    uint64_t r = 0x5ec7e75ull;
    for (uint32_t i = 0; i < NR; i++) {
        for (int k = 0; k < 6; k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            pre[i][k] = (char)('a' + (r >> 33) % 26);
        }
        pre[i][6] = '\0';
        snprintf(pats[i], sizeof(pats[i]), "%.6s_[a-z0-9]{20,32}\\b", pre[i]);
        snprintf(t[i].id, sizeof(t[i].id), "g%u", i);
        t[i].kind = RULE_REGEX;
        t[i].pat = pats[i];
    }
    struct catalog *cat = compile_rules(t, NR);
    ck_assert_uint_gt(catalog_nfa_count(cat), 100);
    uint8_t *d = malloc(LEN);
    for (size_t i = 0; i < LEN; i++)
        d[i] = "the quick brown fox jumps over a lazy dog "[i % 42];
    uint32_t planted = 0;
    for (size_t at = 100; at + 64 < LEN; at += 997, planted++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        char inst[48];
        int n = snprintf(inst, sizeof(inst), "%.6s_0123456789abcdef0123x ", pre[(r >> 33) % NR]);
        memcpy(d + at, inst, (size_t)n);
    }
    struct gpu_buffer bufs[] = {{.data = d, .len = LEN, .mode = SCAN_ALL},
                                {.data = d + 5000, .len = 60000, .mode = SCAN_COUNT}};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, 2};
    struct gpu_engine *eng = engine(&(struct gpu_options){
        .factor_pass = 1, .hits_parallel_min = _i == 1 ? 1 : 0, .upload_threads = 3});
    struct gpu_result res = {0};
    check_batch(eng, &b, &res);
    uint32_t in0 = 0;
    for (size_t k = 0; k < res.n_hits; k++)
        in0 += res.hits[k].buffer == 0;
    ck_assert_uint_eq(in0, planted);
    ck_assert_uint_gt(res.tel.kernel_launches, 100);
    gpu_result_finish(&res);
    gpu_engine_destroy(eng);
    free(d);
    free(t);
    catalog_destroy(cat);
}
END_TEST

/* Unbounded DFA groups on long buffers are walked in speculative segments
 * (docs/gpu.md): each guesses its start state from a short lookback, and
 * the host re-walks the segments whose guess was wrong. The data makes
 * both kinds: runs of `[a-z]*` state that a lookback sees whole (guesses
 * right), an 'x' whose `x[^y]*z` state lasts across many segments (wrong,
 * converging at the next 'y'), `(?s)q.*r` after one 'q' (wrong, never
 * converging), matches right at segment ends, `^`/`$` and `\b`. Every
 * hit equals refscan's, in every report mode, with the bytes in memory and
 * read by a callback (the host re-walks from the upload copy), and a wrong
 * repair would add or lose hits: the counts of `x[^y]*z` are asserted. */
START_TEST(test_spec_segments)
{
    struct trule t[] = {{"xz", RULE_REGEX, "x[^y]*z", 0},
                        {"qr", RULE_REGEX, "(?s)q.*r", 0},
                        {"w", RULE_REGEX, "\\bab[a-z]*c\\b", 0},
                        {"anch", RULE_REGEX, "^k[^k]*k$", 0},
                        {"lit", RULE_LITERAL, "zz", 0}};
    struct rules_options ro = {.gate_bits = UINT32_MAX}; /* plain DFA groups, none gated */
    struct catalog *cat = compile_rules_opt(t, 5, &ro);
    const size_t len = 200000;
    uint8_t *p = malloc(len);
    uint32_t rng = 77;
    for (size_t i = 0; i < len; i++) {
        rng = rng * 1103515245u + 12345u;
        p[i] = "abcdefghz .\n"[(rng >> 16) % 12];
    }
    p[0] = 'k';
    p[len - 1] = 'k';
    for (size_t i = 1; i + 1 < len; i++)
        if (p[i] == 'x' || p[i] == 'y' || p[i] == 'q' || p[i] == 'r' || p[i] == 'k')
            p[i] = 'a';
    /* x at 1000 lasts until the y at 150000: ~9 segments of 16 KiB guess
     * wrong and converge only there */
    p[1000] = 'x';
    p[150000] = 'y';
    p[120000] = 'q'; /* q.*r: wrong from here on, never converging */
    for (size_t i = 130000; i < len; i += 7919)
        p[i] = 'r';
    for (size_t i = 16384 - 1; i < len; i += 16384) /* matches ending at segment ends */
        memcpy(p + i - 2, "zz", 2);
    size_t want_xz = 0;
    for (size_t i = 1001; i < 150000; i++)
        want_xz += p[i] == 'z';
    uint32_t looks[] = {0, 16, 1024};
    for (uint32_t l = 0; l < 3; l++) {
        /* _i 1: the re-walk jobs in slices of one on 4 upload threads, so
         * a chain that does not converge is walked by one job while the
         * jobs around it run on other threads */
        struct gpu_options opt = {.segment_bytes = 16384,
                                  .spec_lookback = looks[l],
                                  .upload_threads = _i == 1 ? 4 : 1,
                                  .spec_slice_jobs = _i == 1 ? 1 : 0};
        if (looks[l] == 0)
            opt.spec_lookback = 1; /* 0 is the default; 1 byte of lookback */
        struct gpu_engine *eng = engine(&opt);
        for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
            struct gpu_buffer bufs[3] = {
                {.data = p, .len = len, .mode = (enum scan_mode)mode},
                {.data = p + 3, .len = len - 3, .mode = (enum scan_mode)mode},
                {.data = p, .len = 16384 + 5, .mode = (enum scan_mode)mode},
            };
            const struct catalog *cats[] = {cat};
            struct gpu_batch b = {cats, 1, bufs, 3};
            struct gpu_result res = {0};
            check_batch(eng, &b, &res);
            ck_assert_uint_eq(res.tel.rounds, 1);
            ck_assert_uint_ge(res.tel.spec_items, 2 * (len / 16384));
            ck_assert_uint_ge(res.tel.spec_fixes, 4); /* x..z in both long buffers, q..r */
            if (mode == SCAN_ALL)
                ck_assert_uint_eq(count_rule(&res, 0, 0), want_xz);
            /* the same bytes read by a callback into the upload memory */
            bufs[0] = (struct gpu_buffer){
                .len = len, .mode = (enum scan_mode)mode, .read = read_from, .read_ctx = p};
            struct gpu_result res2 = {0};
            struct vks_error err = {0};
            ck_assert_int_eq(gpu_batch_dispatch(eng, &b, &res2, &err), 0);
            size_t n0 = 0, n1 = 0;
            for (size_t k = 0; k < res.n_hits; k++)
                n0 += res.hits[k].buffer == 0;
            for (size_t k = 0; k < res2.n_hits; k++) {
                n1 += res2.hits[k].buffer == 0;
                if (res2.hits[k].buffer == 0)
                    ck_assert(k < res.n_hits && res2.hits[k].rule == res.hits[k].rule &&
                              res2.hits[k].end == res.hits[k].end);
            }
            ck_assert_uint_eq(n0, n1);
            gpu_result_finish(&res);
            gpu_result_finish(&res2);
        }
        gpu_engine_destroy(eng);
    }
    free(p);
    catalog_destroy(cat);
}
END_TEST

/* A match at every byte, in buffers of every length from a few bytes to
 * many segments, several rules accepting at once: the subgroup writer
 * queues accepting steps and flushes them in batches (shaders/scan.comp),
 * and no queued step may be lost at an item's end, at a full queue or
 * when the lanes of a subgroup walk items of different lengths. */
START_TEST(test_hit_dense)
{
    struct trule t[] = {{"dot", RULE_REGEX, "(?s).", 0},
                        {"xx", RULE_LITERAL, "xx", 0},
                        {"xy", RULE_REGEX, "[xy]{2}", 0}};
    struct catalog *cat = compile_rules(t, 3);
    struct gpu_engine *eng = engine(NULL);
    enum { N = 40 };
    struct gpu_buffer bufs[N];
    uint8_t *data[N];
    for (uint32_t i = 0; i < N; i++) {
        size_t len = i == 0 ? 60000 : i < 20 ? i : 100 + 97 * i;
        data[i] = malloc(len);
        memset(data[i], i % 2 ? 'y' : 'x', len);
        bufs[i] = (struct gpu_buffer){.data = data[i], .len = len, .mode = SCAN_ALL};
    }
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, N};
    struct gpu_result res = {0};
    ck_assert_uint_ge(check_batch(eng, &b, &res), 60000);
    gpu_result_finish(&res);
    for (uint32_t i = 0; i < N; i++)
        free(data[i]);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* Fused DFA passes (gpu_options.fuse_groups, docs/gpu.md "Fused DFA
 * groups"): catalogs split into many small DFA groups (a tiny state
 * budget, no gating, no literal kernel) so that several bounded groups
 * share each pass, 2, 3 and 4 to a pass, with both hit writers and small
 * segments, one or two catalogs a batch; every hit equals refscan's, and the fused ranges must have
 * run (fused_groups: the passes saved). Then a hit-dense catalog of one rule a group, each
 * reporting at every byte, which fills the per-lane hit queue NG steps a byte. */
START_TEST(test_fused_groups)
{
    struct gpu_engine *probe = engine(NULL);
    bool sub = gpu_engine_device(probe)->subgroup_hits;
    gpu_engine_destroy(probe);
    const struct rules_options ro = {.max_states = 24,
                                     .gate_bits = UINT32_MAX,
                                     .gate_rare_bits = UINT32_MAX,
                                     .literal_group = -1};
    const uint32_t widths[] = {0, 2, 3, 1};
    for (uint32_t w = 0; w < 4; w++) {
        for (int writer = GPU_HITS_SCALAR; writer <= (sub ? GPU_HITS_SUBGROUP : GPU_HITS_SCALAR);
             writer++) {
            struct gpu_options opt = {.hit_writer = (enum gpu_hit_writer)writer,
                                      .segment_bytes = 64,
                                      .fuse_groups = widths[w],
                                      .lit_kernel = -1};
            struct gpu_engine *eng = engine(&opt);
            uint32_t saved = 0, launches = 0;
            for (uint32_t seed = 1; seed <= 6; seed++) {
                rng = 0x51ed270b7f4a7c15ull ^ (seed * 7 + w);
                /* even seeds: two catalogs in the batch, each with its tables */
                uint32_t n_cats = 1 + (seed % 2 == 0);
                struct catalog *cats[2];
                for (uint32_t c = 0; c < n_cats; c++) {
                    struct trule t[24];
                    uint32_t n = 10 + rnd(14);
                    for (uint32_t i = 0; i < n; i++) {
                        snprintf(t[i].id, sizeof(t[i].id), "f%u", i);
                        bool lit = rnd(2);
                        t[i].kind = lit ? RULE_LITERAL : RULE_REGEX;
                        t[i].pat = lit ? literals[rnd(sizeof(literals) / sizeof(literals[0]))]
                                       : regexes[rnd(sizeof(regexes) / sizeof(regexes[0]))];
                        t[i].flags = rnd(4) == 0 ? RULE_F_CASELESS : 0;
                    }
                    cats[c] = compile_rules_opt(t, n, &ro);
                }
                struct bufset bs;
                bufset_random(&bs, 1 + rnd(24), 900, n_cats);
                struct gpu_batch b = {(const struct catalog *const *)cats, n_cats, bs.v, bs.n};
                struct gpu_result res = {0};
                check_batch(eng, &b, &res);
                saved += res.tel.fused_groups;
                launches += res.tel.kernel_launches;
                gpu_result_finish(&res);
                bufset_free(&bs);
                for (uint32_t c = 0; c < n_cats; c++)
                    catalog_destroy(cats[c]);
            }
            if (widths[w] == 1)
                ck_assert_uint_eq(saved, 0); /* off: one pass a group */
            else
                ck_assert_msg(saved > 0, "fuse_groups %u: no group was fused in %u launches",
                              widths[w], launches);
            gpu_engine_destroy(eng);
        }
    }

    /* hit-dense: from byte 9 on, every byte ends a match of each rule; each
     * rule's DFA needs about 11 states, so the budget of 16 keeps one a group */
    struct trule d[] = {{"any10", RULE_REGEX, "(?s).{10}", 0},
                        {"xy10", RULE_REGEX, "[xy]{10}", 0},
                        {"x", RULE_REGEX, "(?s)[xy].{8}[xy]", 0},
                        {"short", RULE_REGEX, "[xy]{2}", 0}};
    struct rules_options one = ro;
    one.max_states = 16;
    struct catalog *cat = compile_rules_opt(d, 4, &one);
    ck_assert_uint_ge(catalog_group_count(cat), 3);
    struct gpu_engine *eng = engine(&(struct gpu_options){.lit_kernel = -1});
    enum { N = 12 };
    struct gpu_buffer bufs[N];
    uint8_t *data[N];
    for (uint32_t i = 0; i < N; i++) {
        size_t len = i == 0 ? 50000 : i < 6 ? i : 61 + 131 * i;
        data[i] = malloc(len);
        for (size_t j = 0; j < len; j++)
            data[i][j] = (uint8_t)((j * 7 + i) % 5 < 3 ? 'x' : 'y');
        bufs[i] = (struct gpu_buffer){.data = data[i], .len = len, .mode = SCAN_ALL};
    }
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, N};
    struct gpu_result res = {0};
    ck_assert_uint_ge(check_batch(eng, &b, &res), 4 * (50000 - 9));
    ck_assert_uint_ge(res.tel.fused_groups, 2);
    gpu_result_finish(&res);
    for (uint32_t i = 0; i < N; i++)
        free(data[i]);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* The pool's way of finishing hits (gpu/hits.c: raw hits binned by 4 MiB
 * of ends, each bin sorted on an upload thread, then the report modes in
 * one pass) gives refscan's hits: random batches of every mode and several
 * catalogs; and a hit-dense buffer of three bins with an unbounded rule in
 * speculative segments, whose repairs drop device hits and add the host's,
 * and whose count and first modes must carry a rule across bins. */
START_TEST(test_hits_pool)
{
    /* 3 threads: a task per bin; 1 thread: 4 tasks for 5 bins, so a task
     * squeezes once hits across bins and buffers */
    unsigned threads = _i == 0 ? 3 : 1;
    /* every hit through the ring (test_hits_device_counted and
     * test_spec_count_bet: the counts) */
    struct gpu_options opt = {
        .hits_parallel_min = 1, .upload_threads = threads, .count_device = -1};
    struct gpu_engine *eng = engine(&opt);
    for (uint32_t seed = 0; seed < 8; seed++)
        random_round(eng, 9100 + seed + 8 * _i, 30, 3000);
    struct trule t[] = {{"ab", RULE_LITERAL, "ab", 0},
                        {"bx", RULE_REGEX, "b[^a]", 0},
                        {"ba1", RULE_LITERAL, "ba", RULE_F_SINGLEMATCH},
                        {"xz", RULE_REGEX, "x[^y]*z", 0}};
    struct rules_options ro = {.gate_bits = UINT32_MAX};
    struct catalog *cat = compile_rules_opt(t, 4, &ro);
    const size_t len = (17u << 19) + 77; /* 8.5 MiB: bins 0, 1 and 2 */
    uint8_t *p = malloc(len);
    uint32_t r = 5;
    for (size_t i = 0; i < len; i++) {
        r = r * 1103515245u + 12345u;
        p[i] = "ab cz."[(r >> 16) % 6];
    }
    p[100] = 'x'; /* x[^y]*z lives until the y: segments guess wrong */
    p[3u << 20] = 'y';
    p[(4u << 20) + 9] = 'x';
    p[(4u << 20) + 40000] = 'y';
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        struct gpu_buffer bufs[] = {
            {.data = p, .len = len, .mode = (enum scan_mode)mode},
            {.data = p + 5, .len = 3000, .mode = (enum scan_mode)mode},
            {.data = p + (4u << 20) - 100, .len = 200, .mode = (enum scan_mode)mode},
        };
        const struct catalog *cats[] = {cat};
        struct gpu_batch b = {cats, 1, bufs, 3};
        struct gpu_result res = {0};
        size_t n = check_batch(eng, &b, &res);
        ck_assert_uint_ge(res.tel.hits_raw, 1u << 20);
        ck_assert_uint_gt(res.tel.spec_fixes, 0);
        if (mode == SCAN_ALL)
            ck_assert_uint_gt(n, 1u << 20);
        gpu_result_finish(&res);
    }
    free(p);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* Count and first modes of hit-dense buffers are finished by counting per
 * (buffer, rule) when no (rule, end) can repeat (gpu/hits.c
 * finish_counts): a literal group on the literal kernel and a bounded DFA
 * group, several buffers and two catalogs in one batch, and a DFA group
 * whose rules share an id (one merged accept entry), give refscan's hits
 * and count every raw hit (hits_counted); the same batches with the
 * counting off, or with a mode that lists every hit, and shared ids on the
 * literal kernel (strings matched apart) or an unbounded rule, take the
 * sort and give the same hits. */
START_TEST(test_hits_counted)
{
    static const char *const words[] = {"ab", "ba", "abc", "cab", "bb", "a a", "cc", "bca"};
    struct trule lit[8], dfa[] = {{"d1", RULE_REGEX, "a[bc]{1,3}", 0},
                                  {"d2", RULE_LITERAL, "ca", RULE_F_SINGLEMATCH},
                                  {"d3", RULE_REGEX, "\\bb[a ]", 0}};
    for (int i = 0; i < 8; i++) {
        lit[i] = (struct trule){"", RULE_LITERAL, words[i], i == 3 ? RULE_F_SINGLEMATCH : 0};
        snprintf(lit[i].id, sizeof(lit[i].id), "w%d", i);
    }
    /* the shared ids' strings end together: "abca" in "cabca" */
    struct trule shared[] = {{"s", RULE_LITERAL, "cabca", 0},
                             {"s", RULE_LITERAL, "abca", 0},
                             {"t", RULE_LITERAL, "bcab", 0}};
    struct trule shared_dfa[] = {
        {"s", RULE_LITERAL, "ab", 0}, {"s", RULE_REGEX, "[ab]b", 0}, {"t", RULE_LITERAL, "ca", 0}};
    struct trule unbounded[] = {{"u", RULE_REGEX, "a[^c]*b", 0}, {"v", RULE_LITERAL, "cc", 0}};
    struct rules_options lo = {.literal_group = 1};
    struct catalog *cl = compile_rules_opt(lit, 8, &lo);
    struct catalog *cd = compile_rules(dfa, 3);
    struct catalog *cs = compile_rules(shared, 3);
    struct catalog *cg = compile_rules(shared_dfa, 3);
    struct catalog *cu = compile_rules(unbounded, 2);
    enum { LEN = 300000 };
    uint8_t *p = malloc(LEN);
    uint32_t r = 11;
    for (size_t i = 0; i < LEN; i++) {
        r = r * 1103515245u + 12345u;
        p[i] = "abc "[(r >> 16) % 4];
    }
    for (int run = 0; run < 2; run++) {
        struct gpu_engine *eng = engine(&(struct gpu_options){
            .upload_threads = 3, .lit_kernel = 1, .count_direct = run == 0 ? 0 : -1});
        const struct catalog *sets[][2] = {{cl, cd}, {cg, cd}, {cs, cd}, {cu, cl}};
        for (size_t k = 0; k < 4; k++) {
            for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
                struct gpu_buffer bufs[] = {
                    {.data = p, .len = LEN, .mode = (enum scan_mode)mode, .catalog = 0},
                    {.data = p + 7, .len = LEN - 7, .mode = (enum scan_mode)mode, .catalog = 1},
                    {.data = p + 100, .len = 5000, .mode = (enum scan_mode)mode, .catalog = 0},
                    {.data = p, .len = 0, .mode = (enum scan_mode)mode, .catalog = 1},
                };
                struct gpu_batch b = {sets[k], 2, bufs, 4};
                struct gpu_result res = {0};
                size_t n = check_batch(eng, &b, &res);
                ck_assert_uint_gt(n, 0);
                ck_assert_uint_ge(res.tel.hits_raw, 65536);
                bool counted = run == 0 && k <= 1 && mode != SCAN_ALL;
                ck_assert_msg(
                    counted ? res.tel.hits_counted == res.tel.hits_raw : res.tel.hits_counted == 0,
                    "set %zu mode %d count_direct %d: %" PRIu64 " of %" PRIu64 " raw hits counted",
                    k, mode, run == 0 ? 0 : -1, res.tel.hits_counted, res.tel.hits_raw);
                gpu_result_finish(&res);
            }
        }
        gpu_engine_destroy(eng);
    }
    free(p);
    catalog_destroy(cl);
    catalog_destroy(cd);
    catalog_destroy(cs);
    catalog_destroy(cg);
    catalog_destroy(cu);
}
END_TEST

/* A speculative range that counts on the device and guesses a segment's
 * state wrong (docs/gpu.md "Counting on the device"). Here the x of
 * x[^y]*z lives until the y, so segments guess wrong: the host re-walks
 * them, adds the true walk's matches and takes the guessed walk's out of
 * the counts, with no re-run of the pass (spec_count_reruns 0), in modes
 * count and first. With c[^y]*z beside it in the group, the guessed walk
 * of a wrong segment matches too before it agrees: not taken out, those
 * matches would count twice. The bounded rule counts on the device
 * throughout. */
START_TEST(test_spec_count_bet)
{
    struct trule t[] = {{"xz", RULE_REGEX, "x[^y]*z", 0},
                        {"cz", RULE_REGEX, "c[^y]*z", 0},
                        {"ab", RULE_LITERAL, "ab", 0}};
    struct catalog *cat = compile_rules(t, 3);
    enum { LEN = 256 << 10 };
    uint8_t *p = malloc(LEN);
    uint32_t r = 5;
    for (size_t i = 0; i < LEN; i++) {
        r = r * 1103515245u + 12345u;
        p[i] = "ab cz."[(r >> 16) % 6];
    }
    p[100] = 'x';
    p[200000] = 'y';
    struct gpu_engine *eng = engine(&(struct gpu_options){.count_device = 1});
    const struct catalog *cats[] = {cat};
    for (int k = 0; k < 2; k++) {
        struct gpu_buffer one = {.data = p, .len = LEN, .mode = k == 0 ? SCAN_COUNT : SCAN_FIRST};
        struct gpu_batch b = {cats, 1, &one, 1};
        struct gpu_result res = {0};
        ck_assert_uint_gt(check_batch(eng, &b, &res), 0);
        ck_assert_uint_gt(res.tel.spec_fixes, 0);
        ck_assert_uint_eq(res.tel.spec_count_reruns, 0);
        ck_assert_uint_gt(res.tel.hits_device_counted, 0);
        ck_assert_uint_eq(res.tel.hits_raw, 0); /* the speculative range counted too */
        gpu_result_finish(&res);
    }
    gpu_engine_destroy(eng);
    free(p);
    catalog_destroy(cat);
}
END_TEST

/* Counting on the device (gpu/plan.c plan_counts, docs/gpu.md): count and
 * first buffers of catalogs whose groups cannot repeat a (rule, end) are
 * counted per rule by the kernels, their DFA, bit-NFA and literal-kernel
 * hits never in the ring. A rule matching every byte, single-match and
 * shared-id rules, ungated and gated bit-NFA rules (the gated one
 * confirmed forward writes to the ring; its hits are added to the
 * counts), an unbounded rule, strings on the literal kernel, a buffer of
 * mode all with the same catalog (the ring alone), an empty buffer: every
 * buffer's hits equal refscan's, with the counting forced on and off.
 * hits_device_counted says the counts came from the device, and is 0
 * where ids shared across groups, or strings of one id on the literal
 * kernel, could repeat a (rule, end); the ring holds no more than the
 * matches of the ranges that cannot count. (test_spec_count_bet: a
 * speculative range that guesses wrong.) */
START_TEST(test_hits_device_counted)
{
    struct trule dense[] = {{"every", RULE_REGEX, "[abc ]", 0},
                            {"pair", RULE_REGEX, "a[bc]{1,3}", 0},
                            {"once", RULE_LITERAL, "ca", RULE_F_SINGLEMATCH},
                            {"wb", RULE_REGEX, "\\bb[a ]", 0},
                            {"unb", RULE_REGEX, "c[^ ]*bab", 0},
                            {"tail", RULE_REGEX, "cb\\z", 0},
                            {"wide", RULE_REGEX, "a[^ ]{0,60}b", 0},
                            {"gated", RULE_REGEX, "cabb[^ ]{10,200}cab", 0}};
    struct trule shared_dfa[] = {
        {"s", RULE_LITERAL, "ab", 0}, {"s", RULE_REGEX, "[ab]b", 0}, {"t", RULE_LITERAL, "ca", 0}};
    struct trule shared_apart[] = {{"s", RULE_LITERAL, "bc", 0},
                                   {"s", RULE_REGEX, "a[^c]*b", 0},
                                   {"t", RULE_REGEX, "[ab]c", 0}};
    /* on the literal kernel: strings with their own ids (counted), and
     * two of one id that end together in "cabca" (the ring's) */
    struct trule words[] = {{"w0", RULE_LITERAL, "ab", 0},
                            {"w1", RULE_LITERAL, "bca", 0},
                            {"w2", RULE_LITERAL, "c a", 0},
                            {"w3", RULE_LITERAL, "cab", 0},
                            {"w4", RULE_LITERAL, "b", RULE_F_SINGLEMATCH}};
    struct trule shared_lit[] = {{"s", RULE_LITERAL, "cabca", 0},
                                 {"s", RULE_LITERAL, "abca", 0},
                                 {"t", RULE_LITERAL, "bcab", 0}};
    struct rules_options lo = {.literal_group = 1};
    struct catalog *cats[] = {compile_rules(dense, 8), compile_rules(shared_dfa, 3),
                              compile_rules(shared_apart, 3), compile_rules_opt(words, 5, &lo),
                              compile_rules_opt(shared_lit, 3, &lo)};
    /* whether shared_apart's "s" rules landed in two groups (then its
     * counts stay in the ring) */
    struct catalog_rule r0, r1;
    catalog_rule(cats[2], 0, &r0);
    catalog_rule(cats[2], 1, &r1);
    bool apart = r0.group != r1.group;
    const bool counts[] = {true, true, !apart, true, false}; /* alone, on the device */
    enum { LEN = 60000 };
    uint8_t *p = malloc(LEN);
    uint32_t r = 5;
    for (size_t i = 0; i < LEN; i++) {
        r = r * 1103515245u + 12345u;
        p[i] = "abc ab"[(r >> 16) % 6];
    }
    memcpy(p + LEN - 2, "cb", 2);
    /* runs: counting on the device, with the gated rule confirmed forward
     * (items may overlap: the ring's) and walked in windows (counted)
     * around factor ends the device found (the factor pass); then no
     * counting on the device */
    for (int run = 0; run < 3; run++) {
        struct gpu_engine *eng = engine(&(struct gpu_options){.upload_threads = 2,
                                                              .lit_kernel = 1,
                                                              .count_device = run < 2 ? 1 : -1,
                                                              .gate_windows = run == 1,
                                                              .factor_pass = run == 1 ? 1 : 0});
        for (uint32_t k = 0; k < 5; k++) {
            for (int mode = SCAN_FIRST; mode <= SCAN_COUNT; mode++) {
                enum scan_mode m = (enum scan_mode)mode;
                const struct catalog *bc[] = {cats[k], cats[0]};
                struct gpu_buffer bufs[] = {
                    {.data = p, .len = LEN, .mode = m, .catalog = 0},
                    {.data = p + 9, .len = 20000, .mode = SCAN_ALL, .catalog = 0},
                    {.data = p + 31, .len = LEN - 31, .mode = m, .catalog = 1},
                    {.data = p, .len = 0, .mode = m, .catalog = 0},
                    {.data = p + 3, .len = 4000, .mode = m, .catalog = 0},
                };
                struct gpu_batch b = {bc, 2, bufs, 5};
                struct gpu_result res = {0};
                ck_assert_uint_gt(check_batch(eng, &b, &res), 0);
                bool counted = run < 2 && counts[k];
                /* buffer 2 (catalog dense) counts whatever k is */
                ck_assert_msg(run < 2 ? res.tel.hits_device_counted > 0
                                      : res.tel.hits_device_counted == 0,
                              "set %u mode %d run %d: %" PRIu64 " hits counted on the device", k,
                              mode, run, res.tel.hits_device_counted);
                gpu_result_finish(&res);
                /* catalog k alone: counted unless its ids could repeat */
                struct gpu_buffer one = {.data = p, .len = LEN, .mode = m, .catalog = 0};
                struct gpu_batch b1 = {bc, 1, &one, 1};
                ck_assert_uint_gt(check_batch(eng, &b1, &res), 0);
                ck_assert_msg(counted == (res.tel.hits_device_counted > 0),
                              "set %u alone, mode %d run %d: %" PRIu64 " counted on the device", k,
                              mode, run, res.tel.hits_device_counted);
                if (k == 0 && run == 1) /* the gated rule's factors, found on the device */
                    ck_assert_uint_gt(res.tel.factor_ends, 0);
                if (k == 3 && counted) /* the literal kernel's hits: all counted */
                    ck_assert_uint_eq(res.tel.hits_raw, 0);
                if (k == 0 && counted && m == SCAN_COUNT) {
                    /* the ring's: the gated rule (7) where it is
                     * confirmed forward */
                    uint32_t ring = 0;
                    for (size_t h = 0; h < res.n_hits; h++) {
                        uint32_t rule = res.hits[h].rule;
                        ring += rule == 7 && run == 0 ? res.hits[h].count : 0;
                    }
                    ck_assert_msg(res.tel.hits_raw <= ring,
                                  "run %d: %" PRIu64 " hits in the ring, %u expected at most", run,
                                  res.tel.hits_raw, ring);
                }
                gpu_result_finish(&res);
            }
        }
        gpu_engine_destroy(eng);
    }
    free(p);
    for (int k = 0; k < 5; k++)
        catalog_destroy(cats[k]);
}
END_TEST

/* A few hits in a few bytes do not size the ring of the batches after
 * them: a 64-byte batch with 6 hits (as the daemon's start self-test has)
 * then a 4 MiB batch without hits, which keeps the initial ring. */
START_TEST(test_ring_not_learned_from_few_hits)
{
    struct trule t[] = {{"xx", RULE_LITERAL, "xyz", 0}};
    struct catalog *cat = compile_rules(t, 1);
    struct gpu_engine *eng = engine(&(struct gpu_options){.inflight = 1});
    const struct catalog *cats[] = {cat};
    uint8_t small[64];
    memset(small, '.', sizeof(small));
    for (int k = 0; k < 6; k++)
        memcpy(small + 10 * k, "xyz", 3);
    struct gpu_buffer sb = {.data = small, .len = sizeof(small), .mode = SCAN_ALL};
    struct gpu_batch b = {cats, 1, &sb, 1};
    struct gpu_result res = {0};
    ck_assert_uint_eq(check_batch(eng, &b, &res), 6);
    uint64_t ring = res.tel.hit_capacity;
    gpu_result_finish(&res);
    enum { LEN = 4 << 20 };
    uint8_t *big = malloc(LEN);
    ck_assert_ptr_nonnull(big);
    memset(big, '.', LEN);
    struct gpu_buffer bb = {.data = big, .len = LEN, .mode = SCAN_ALL};
    b.buffers = &bb;
    ck_assert_uint_eq(check_batch(eng, &b, &res), 0);
    ck_assert_msg(res.tel.hit_capacity == ring, "the ring grew from %llu to %llu hits",
                  (unsigned long long)ring, (unsigned long long)res.tel.hit_capacity);
    /* haystack, staging (discrete devices), the initial ring and its copy,
     * the items: under three haystacks (the H200 made 10.5 MB) */
    ck_assert_msg(res.tel.buffers_made_bytes < 3 * (uint64_t)LEN, "%llu bytes of buffers made",
                  (unsigned long long)res.tel.buffers_made_bytes);
    gpu_result_finish(&res);
    free(big);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* A frame sizes its hit ring from the hit rate batches have had: after
 * one hit-dense batch grew frame 0's ring (one re-run), a batch on frame
 * 1, whose ring is new, runs once. */
START_TEST(test_ring_learned)
{
    struct trule t[] = {{"dot", RULE_REGEX, "(?s).", 0}, {"xx", RULE_LITERAL, "xx", 0}};
    struct catalog *cat = compile_rules(t, 2);
    struct gpu_engine *eng = engine(&(struct gpu_options){.inflight = 2, .hit_capacity = 64});
    enum { LEN = 50000 };
    uint8_t *p = malloc(LEN);
    memset(p, 'x', LEN);
    struct gpu_buffer buf = {.data = p, .len = LEN, .mode = SCAN_ALL};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, &buf, 1};
    struct gpu_result first = {0}, a = {0}, c = {0};
    ck_assert_uint_eq(check_batch(eng, &b, &first), 2 * LEN - 1);
    ck_assert_uint_eq(first.tel.hit_reruns, 1);
    struct vks_error err = {0};
    ck_assert_int_eq(gpu_batch_submit(eng, &b, &a, &err), 0); /* frame 0 */
    ck_assert_int_eq(gpu_batch_submit(eng, &b, &c, &err), 0); /* frame 1: a new ring */
    struct gpu_result *out = NULL;
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(gpu_batch_collect(eng, &out, &err), 0);
        check_result(&b, out);
        ck_assert_uint_eq(out->tel.hit_reruns, 0);
    }
    gpu_result_finish(&first);
    gpu_result_finish(&a);
    gpu_result_finish(&c);
    free(p);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* gpu_options.profile times every dispatch alone, by kind: a catalog of a
 * DFA group and a gated bit-NFA group (its factor pass on the device) has
 * device time in those three kinds, one dispatch counted per launch, and
 * the same hits as without it. */
START_TEST(test_profile)
{
    struct trule t[] = {{"lit", RULE_LITERAL, "zzqq", 0},
                        {"gap", RULE_REGEX, "tok[a-z]{2,40}end", 0}};
    struct rules_options ro = {.gate_rare_bits = 1};
    struct catalog *cat = compile_rules_opt(t, 2, &ro);
    ck_assert_uint_eq(catalog_nfa_count(cat), 1);
    struct gpu_engine *eng = engine(&(struct gpu_options){.profile = true, .factor_pass = 1});
    enum { LEN = 200000 };
    uint8_t *p = malloc(LEN);
    for (size_t i = 0; i < LEN; i++)
        p[i] = "abcdefgh zq"[i % 11];
    for (size_t at = 1000; at + 64 < LEN; at += 9000) {
        memcpy(p + at, "tokabcend", 9);
        memcpy(p + at + 30, "zzqq", 4);
    }
    struct gpu_buffer buf = {.data = p, .len = LEN, .mode = SCAN_ALL};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, &buf, 1};
    struct gpu_result res = {0};
    ck_assert_uint_gt(check_batch(eng, &b, &res), 40);
    uint32_t n = 0;
    for (int k = 0; k < GPU_PROF_KINDS; k++)
        n += res.tel.prof_dispatches[k];
    ck_assert_uint_eq(n, res.tel.kernel_launches);
    ck_assert_uint_gt(res.tel.prof_dispatches[GPU_PROF_FACTOR], 0);
    ck_assert_uint_gt(res.tel.prof_dispatches[GPU_PROF_GATED], 0);
    ck_assert_uint_gt(res.tel.prof_ns[GPU_PROF_FACTOR], 0);
    ck_assert_uint_gt(res.tel.prof_ns[GPU_PROF_GATED] + res.tel.prof_ns[GPU_PROF_DFA] +
                          res.tel.prof_ns[GPU_PROF_LIT],
                      0);
    gpu_result_finish(&res);
    free(p);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* gpu_options.serialize: no barriers between dispatches (the default),
 * one after every dispatch, or one between kinds of dispatch, on a pass with literal, DFA and gated
 * bit-NFA dispatches: the same hits as the reference scanner each way, and
 * the same launches. */
START_TEST(test_serialize)
{
    struct trule t[] = {{"lit", RULE_LITERAL, "zzqq", 0},
                        {"gap", RULE_REGEX, "tok[a-z]{2,40}end", 0},
                        {"open", RULE_REGEX, "q[^x]*hz", 0},
                        {"two", RULE_REGEX, "(ab|cd)+e", 0}};
    struct rules_options ro = {.gate_rare_bits = 1};
    struct catalog *cat = compile_rules_opt(t, 4, &ro);
    enum { LEN = 150000 };
    uint8_t *p = malloc(LEN);
    for (size_t i = 0; i < LEN; i++)
        p[i] = "abcdefgh zq"[i % 11];
    for (size_t at = 700; at + 64 < LEN; at += 7000) {
        memcpy(p + at, "tokabcend", 9);
        memcpy(p + at + 30, "zzqq hz", 7);
    }
    uint64_t hits = 0, launches = 0;
    const uint32_t modes[] = {0, 1, 2};
    for (int m = 0; m < 3; m++) {
        struct gpu_engine *eng =
            engine(&(struct gpu_options){.serialize = modes[m], .factor_pass = 1});
        struct gpu_buffer buf = {.data = p, .len = LEN, .mode = SCAN_ALL};
        const struct catalog *cats[] = {cat};
        struct gpu_batch b = {cats, 1, &buf, 1};
        struct gpu_result res = {0};
        uint64_t n = check_batch(eng, &b, &res);
        ck_assert_uint_gt(n, 40);
        ck_assert_uint_gt(res.tel.kernel_launches, 2);
        if (m == 0) {
            hits = n;
            launches = res.tel.kernel_launches;
        }
        ck_assert_uint_eq(n, hits);
        ck_assert_uint_eq(res.tel.kernel_launches, launches);
        gpu_result_finish(&res);
        gpu_engine_destroy(eng);
    }
    free(p);
    catalog_destroy(cat);
}
END_TEST

/* ^ $ \b \B with and without multiline, on buffers full of newlines,
 * including buffers that end in one. */
START_TEST(test_anchored)
{
    struct trule t[] = {{"a1", RULE_REGEX, "^ab", 0},
                        {"a2", RULE_REGEX, "ab$", 0},
                        {"a3", RULE_REGEX, "^ab", RULE_F_MULTILINE},
                        {"a4", RULE_REGEX, "ab$", RULE_F_MULTILINE},
                        {"a5", RULE_REGEX, "\\bab\\b", 0},
                        {"a6", RULE_REGEX, "\\Bb", 0},
                        {"a7", RULE_REGEX, "^[ab\\n]*$", 0},
                        {"a8", RULE_REGEX, "^$", RULE_F_MULTILINE}};
    struct catalog *cat = compile_rules(t, 8);
    struct gpu_options opt = {.segment_bytes = 32, .chain_bytes = 64};
    struct gpu_engine *eng = engine(&opt);
    static const char *texts[] = {
        "ab", "ab\n", "\nab\nab", "xab ab_ab\n\nab\n",
        "",   "a",    "\n",       "ab\nab\nab\nab\nab\nab\nab\nab\nab\nab\nab\nab\nab\nab\nab\n"};
    enum { N = 8 };
    struct gpu_buffer bufs[N];
    for (uint32_t i = 0; i < N; i++)
        bufs[i] = (struct gpu_buffer){
            .data = (const uint8_t *)texts[i], .len = strlen(texts[i]), .mode = SCAN_ALL};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, N};
    struct gpu_result res = {0};
    ck_assert_uint_gt(check_batch(eng, &b, &res), 10);
    gpu_result_finish(&res);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* Catalogs whose transition tables overflow shared memory: the cold rows
 * come from device memory. One group has more than 65536 states, so its
 * shared rows are u32, not packed u16. */
static struct catalog *many_literals(uint32_t n, uint32_t max_states, char **store)
{
    struct rule_src *src = calloc(n, sizeof(*src));
    char *p = *store = malloc((size_t)n * 32);
    for (uint32_t i = 0; i < n; i++) {
        char *id = p + (size_t)i * 32, *pat = id + 8;
        snprintf(id, 8, "l%u", i);
        uint32_t len = 8 + rnd(9);
        for (uint32_t k = 0; k < len; k++)
            pat[k] = (char)('a' + rnd(26));
        src[i] = (struct rule_src){id, RULE_LITERAL, pat, len, 0, i + 1};
    }
    /* DFA groups: the large tables are what is tested (a literal group
     * would hold no rows) */
    struct rules_options opt = {.max_states = max_states, .literal_group = -1};
    struct rules_result res = {0};
    struct vks_error err = {0};
    ck_assert_msg(rules_compile(src, n, &opt, &res, &err) == 0, "%s", err.msg);
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    free(src);
    return cat;
}

START_TEST(test_large_catalogs)
{
    rng = 4242;
    char *s1, *s2;
    struct catalog *cats[2] = {many_literals(600, 0, &s1), many_literals(7000, 200000, &s2)};
    struct catalog_group g;
    catalog_group(cats[1], 0, &g);
    ck_assert_uint_gt(g.n_states, 65536);
    struct gpu_engine *eng = engine(NULL);
    enum { N = 6, LEN = 40000 };
    struct gpu_buffer bufs[N];
    for (uint32_t i = 0; i < N; i++) {
        uint8_t *p = malloc(LEN);
        for (uint32_t k = 0; k < LEN; k++)
            p[k] = (uint8_t)(rnd(27) == 26 ? ' ' : 'a' + rnd(26));
        const char *lits = i % 2 ? s2 : s1;
        uint32_t n_lits = i % 2 ? 7000 : 600;
        for (uint32_t at = 100; at + 20 < LEN; at += 700) {
            const char *pat = lits + (size_t)rnd(n_lits) * 32 + 8;
            memcpy(p + at, pat, strlen(pat));
        }
        bufs[i] = (struct gpu_buffer){.data = p, .len = LEN, .catalog = i % 2};
    }
    struct gpu_batch b = {(const struct catalog *const *)cats, 2, bufs, N};
    struct gpu_result res = {0};
    ck_assert_uint_gt(check_batch(eng, &b, &res), N * 50);
    gpu_result_finish(&res);
    for (uint32_t i = 0; i < N; i++)
        free((void *)bufs[i].data);
    gpu_engine_destroy(eng);
    catalog_destroy(cats[0]);
    catalog_destroy(cats[1]);
    free(s1);
    free(s2);
}
END_TEST

/* The three report modes and the H flag on the same data. */
START_TEST(test_modes)
{
    struct trule t[] = {{"m1", RULE_LITERAL, "ab", 0},
                        {"m2", RULE_REGEX, "b+", 0},
                        {"m3", RULE_LITERAL, "a", RULE_F_SINGLEMATCH}};
    struct catalog *cat = compile_rules(t, 3);
    struct gpu_engine *eng = engine(&(struct gpu_options){.segment_bytes = 16});
    rng = 77;
    uint8_t *p = random_text(3000);
    struct gpu_buffer bufs[3];
    for (uint32_t m = 0; m < 3; m++)
        bufs[m] = (struct gpu_buffer){.data = p, .len = 3000, .mode = (enum scan_mode)m};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, bufs, 3};
    struct gpu_result res = {0};
    check_batch(eng, &b, &res);
    size_t per[3] = {0};
    for (size_t k = 0; k < res.n_hits; k++)
        per[res.hits[k].buffer]++;
    ck_assert_uint_gt(per[0], per[1]);
    ck_assert_uint_eq(per[1], 3); /* one per rule in first and count modes */
    ck_assert_uint_eq(per[2], 3);
    gpu_result_finish(&res);
    free(p);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* A tiny ring: the engine sees the head passed the capacity, re-runs with
 * a ring that fits and returns every hit, with both writers. */
START_TEST(test_ring_overflow)
{
    struct trule t[] = {{"o1", RULE_LITERAL, "a", 0}, {"o2", RULE_REGEX, "[ab]{2}", 0}};
    struct catalog *cat = compile_rules(t, 2);
    for (int w = GPU_HITS_SCALAR; w <= GPU_HITS_SUBGROUP; w++) {
        struct gpu_engine *probe = engine(NULL);
        bool sub = gpu_engine_device(probe)->subgroup_hits;
        gpu_engine_destroy(probe);
        if (w == GPU_HITS_SUBGROUP && !sub)
            continue;
        struct gpu_options opt = {
            .hit_writer = (enum gpu_hit_writer)w, .hit_capacity = 4, .segment_bytes = 64};
        struct gpu_engine *eng = engine(&opt);
        rng = 5 + (uint64_t)w;
        uint8_t *p = random_text(5000);
        struct gpu_buffer bufs[2] = {{.data = p, .len = 5000}, {.data = p + 7, .len = 900}};
        const struct catalog *cats[] = {cat};
        struct gpu_batch b = {cats, 1, bufs, 2};
        struct gpu_result res = {0};
        size_t n = check_batch(eng, &b, &res);
        ck_assert_uint_gt(n, 1000);
        ck_assert_uint_ge(res.tel.hit_reruns, 1);
        ck_assert_uint_ge(res.tel.hit_capacity, res.tel.hits_raw);
        ck_assert_uint_eq(res.tel.hit_writer, (unsigned)w);
        /* the ring stays grown: no re-run the second time */
        check_batch(eng, &b, &res);
        ck_assert_uint_eq(res.tel.hit_reruns, 0);
        gpu_result_finish(&res);
        free(p);
        gpu_engine_destroy(eng);
    }
    catalog_destroy(cat);
}
END_TEST

/* Second dispatch with the same catalog: zero catalog bytes, pipeline and
 * plan cache hits. A changed catalog is uploaded; the pipeline cache file
 * is written and read back. */
START_TEST(test_resident_catalogs)
{
    char path[] = "/tmp/vks-gpu-cache-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    unlink(path);
    struct trule t1[] = {{"x", RULE_LITERAL, "abc", 0}, {"y", RULE_REGEX, "b[ac]+", 0}};
    struct trule t2[] = {{"x", RULE_LITERAL, "abd", 0}, {"y", RULE_REGEX, "b[ac]+", 0}};
    struct catalog *c1 = compile_rules(t1, 2), *c2 = compile_rules(t2, 2);
    size_t w1, w2;
    catalog_words(c1, &w1);
    catalog_words(c2, &w2);
    struct gpu_options opt = {.pipeline_cache_path = path};
    struct gpu_engine *eng = engine(&opt);
    rng = 9;
    uint8_t *p = random_text(4000);
    struct gpu_buffer buf = {.data = p, .len = 4000};
    const struct catalog *cats[] = {c1};
    struct gpu_batch b = {cats, 1, &buf, 1};
    struct gpu_result res = {0};

    check_batch(eng, &b, &res);
    ck_assert_uint_eq(res.tel.catalog_bytes_uploaded, w1 * 4);
    ck_assert_uint_eq(res.tel.catalog_uploads, 1);
    ck_assert_uint_ge(res.tel.pipeline_compiles, 1);
    ck_assert(!res.tel.plan_cache_hit);
    ck_assert_uint_ge(res.tel.kernel_launches, 1);
    ck_assert_uint_ge(res.tel.sync_points, 1);
    ck_assert_uint_eq(res.tel.haystack_bytes_uploaded, 4000);

    check_batch(eng, &b, &res);
    ck_assert_uint_eq(res.tel.catalog_bytes_uploaded, 0);
    ck_assert_uint_eq(res.tel.catalog_cache_hits, 1);
    ck_assert_uint_eq(res.tel.catalog_uploads, 0);
    ck_assert_uint_eq(res.tel.pipeline_compiles, 0);
    ck_assert_uint_ge(res.tel.pipeline_cache_hits, 1);
    ck_assert(res.tel.plan_cache_hit);
    ck_assert_uint_eq(res.tel.bytes_uploaded,
                      res.tel.haystack_bytes_uploaded + res.tel.meta_bytes_uploaded);
    uint32_t allocs = res.tel.resident_allocations;

    cats[0] = c2;
    check_batch(eng, &b, &res);
    ck_assert_uint_eq(res.tel.catalog_bytes_uploaded, w2 * 4);
    ck_assert_uint_eq(res.tel.catalog_uploads, 1);
    ck_assert_uint_eq(res.tel.resident_catalogs, 2);
    ck_assert_uint_eq(res.tel.resident_allocations, allocs + 1);
    ck_assert_uint_eq(gpu_engine_resident_catalogs(eng), 2);

    cats[0] = c1; /* still resident */
    check_batch(eng, &b, &res);
    ck_assert_uint_eq(res.tel.catalog_bytes_uploaded, 0);
    gpu_engine_destroy(eng);

    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "pipeline cache file %s was not written", path);
    fseek(f, 0, SEEK_END);
    ck_assert_int_gt(ftell(f), 0);
    fclose(f);
    eng = engine(&opt); /* loads it */
    check_batch(eng, &b, &res);
    gpu_engine_destroy(eng);
    unlink(path);
    gpu_result_finish(&res);
    free(p);
    catalog_destroy(c1);
    catalog_destroy(c2);
}
END_TEST

/* Under a budget that holds one catalog beside the batch, a new catalog
 * evicts the least recently used one. */
START_TEST(test_catalog_eviction)
{
    /* three catalogs of the same shape and size */
    struct catalog *cats_v[3];
    static const char *const pats[3][3] = {{"needle-a", "pin-a", "^x[a-z]{2,9}a"},
                                           {"needle-b", "pin-b", "^x[a-z]{2,9}b"},
                                           {"needle-c", "pin-c", "^x[a-z]{2,9}c"}};
    for (uint32_t i = 0; i < 3; i++) {
        struct trule t[] = {{"n", RULE_LITERAL, pats[i][0], 0},
                            {"p", RULE_LITERAL, pats[i][1], 0},
                            {"r", RULE_REGEX, pats[i][2], 0}};
        cats_v[i] = compile_rules(t, 3);
    }
    struct gpu_engine *probe = engine(NULL);
    uint8_t data[256];
    memset(data, 'a', sizeof(data));
    struct gpu_buffer buf = {.data = data, .len = sizeof(data)};
    const struct catalog *cats[1] = {cats_v[0]};
    struct gpu_batch b = {cats, 1, &buf, 1};
    struct gpu_result res = {0};
    check_batch(probe, &b, &res);
    /* budget: what one batch with one catalog holds, plus 1.5 catalogs */
    uint64_t held = res.tel.device_bytes;
    gpu_engine_destroy(probe);
    /* room for one more catalog beside the one `held` has, not two */
    uint64_t most = 0;
    for (uint32_t i = 0; i < 3; i++) {
        size_t words;
        catalog_words(cats_v[i], &words);
        uint64_t bytes = (words * 4 + 4095) & ~(uint64_t)4095;
        most = bytes > most ? bytes : most;
    }
    struct gpu_options opt = {.memory_budget = held + most + most / 2};
    struct gpu_engine *eng = engine(&opt);
    uint32_t evictions = 0;
    for (uint32_t round = 0; round < 2; round++) {
        for (uint32_t i = 0; i < 3; i++) {
            cats[0] = cats_v[i];
            check_batch(eng, &b, &res);
            evictions += res.tel.catalog_evictions;
            ck_assert_msg(gpu_engine_resident_catalogs(eng) <= 2,
                          "%u resident, budget %llu, held %llu, largest catalog %llu",
                          gpu_engine_resident_catalogs(eng), (unsigned long long)opt.memory_budget,
                          (unsigned long long)held, (unsigned long long)most);
        }
    }
    ck_assert_uint_ge(evictions, 1);
    gpu_result_finish(&res);
    gpu_engine_destroy(eng);
    for (uint32_t i = 0; i < 3; i++)
        catalog_destroy(cats_v[i]);
}
END_TEST

/* A batch over the memory budget fails before any upload, naming the
 * requested and available bytes. */
START_TEST(test_over_budget)
{
    struct trule t[] = {{"x", RULE_LITERAL, "abc", 0}};
    struct catalog *cat = compile_rules(t, 1);
    const uint64_t budget = 3u << 20;
    struct gpu_options opt = {.memory_budget = budget};
    struct gpu_engine *eng = engine(&opt);
    size_t len = 4u << 20;
    uint8_t *p = calloc(1, len);
    struct gpu_buffer buf = {.data = p, .len = len};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, &buf, 1};
    struct gpu_result res = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(gpu_batch_dispatch(eng, &b, &res, &err), -E2BIG);
    ck_assert_int_eq(err.code, -E2BIG);
    unsigned long long need = 0, avail = 0;
    const char *s = strstr(err.msg, "needs ");
    ck_assert_msg(s != NULL, "message: %s", err.msg);
    ck_assert_int_eq(sscanf(s, "needs %llu", &need), 1);
    s = strstr(err.msg, "only ");
    ck_assert_msg(s != NULL, "message: %s", err.msg);
    ck_assert_int_eq(sscanf(s, "only %llu are available", &avail), 1);
    ck_assert_msg(need >= len, "message: %s", err.msg);
    ck_assert_uint_lt(avail, need);
    ck_assert_uint_eq(avail, budget);
    ck_assert_uint_eq(res.tel.bytes_uploaded, 0);
    ck_assert_uint_eq(res.tel.kernel_launches, 0);
    ck_assert_uint_eq(res.tel.catalog_uploads, 0);
    /* a batch that fits still runs on the same engine */
    buf.len = 4096;
    check_batch(eng, &b, &res);
    gpu_result_finish(&res);
    free(p);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* A fence wait past the timeout returns -ETIMEDOUT; the engine refuses
 * more work, is destroyed cleanly, and a new one works. */
START_TEST(test_timeout)
{
    struct trule t[] = {{"x", RULE_REGEX, "a[^q]*b", 0}, {"y", RULE_LITERAL, "ab", 0}};
    struct catalog *cat = compile_rules(t, 2);
    struct gpu_options opt = {.timeout_us = 1};
    struct gpu_engine *eng = engine(&opt);
    rng = 3;
    size_t len = 4u << 20;
    uint8_t *p = random_text(len);
    struct gpu_buffer buf = {.data = p, .len = len};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, &buf, 1};
    struct gpu_result res = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(gpu_batch_dispatch(eng, &b, &res, &err), -ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "timeout"));
    ck_assert_int_eq(gpu_batch_dispatch(eng, &b, &res, &err), -ENODEV);
    gpu_engine_destroy(eng);
    eng = engine(NULL);
    buf.len = 20000;
    check_batch(eng, &b, &res);
    gpu_result_finish(&res);
    gpu_engine_destroy(eng);
    free(p);
    catalog_destroy(cat);
}
END_TEST

START_TEST(test_devices)
{
    struct gpu_device_info info[8];
    uint32_t n = 0;
    struct vks_error err = {0};
    ck_assert_int_eq(gpu_device_list(info, 8, &n, &err), 0);
    ck_assert_uint_ge(n, 1);
    for (uint32_t i = 0; i < n && i < 8; i++) {
        ck_assert_uint_eq(info[i].index, i);
        ck_assert_uint_gt(strlen(info[i].name), 0);
        ck_assert_uint_gt(strlen(info[i].driver), 1);
        ck_assert_uint_ge(info[i].n_heaps, 1);
        ck_assert_uint_gt(info[i].heaps[0].size, 0);
        ck_assert_uint_gt(info[i].subgroup_size, 0);
        ck_assert_uint_ge(info[i].max_shared_bytes, 16384);
    }
    struct gpu_engine *eng = engine(&(struct gpu_options){.device = "0"});
    ck_assert_str_eq(gpu_engine_device(eng)->name, info[0].name);
    gpu_engine_destroy(eng);
    char part[8];
    snprintf(part, sizeof(part), "%.5s", info[0].name);
    eng = engine(&(struct gpu_options){.device = part});
    gpu_engine_destroy(eng);
    eng = NULL;
    ck_assert_int_eq(
        gpu_engine_create(&(struct gpu_options){.device = "no such gpu 9z"}, &eng, &err), -ENODEV);
    ck_assert_ptr_nonnull(strstr(err.msg, "no such gpu 9z"));
    ck_assert_ptr_null(eng);
}
END_TEST

START_TEST(test_bad_batches)
{
    struct trule t[] = {{"x", RULE_LITERAL, "abc", 0}};
    struct catalog *cat = compile_rules(t, 1);
    struct gpu_engine *eng = engine(NULL);
    uint8_t data[4] = "abc";
    struct gpu_buffer buf = {.data = data, .len = 3, .catalog = 1};
    const struct catalog *cats[] = {cat};
    struct gpu_batch b = {cats, 1, &buf, 1};
    struct gpu_result res = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(gpu_batch_dispatch(eng, &b, &res, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "catalog 1"));
    buf.catalog = 0;
    b.n_catalogs = 0;
    ck_assert_int_eq(gpu_batch_dispatch(eng, &b, &res, &err), -EINVAL);
    b.n_catalogs = 1;
    buf.mode = (enum scan_mode)7;
    ck_assert_int_eq(gpu_batch_dispatch(eng, &b, &res, &err), -EINVAL);
    buf.mode = SCAN_ALL;
    /* empty batch and empty buffers: no device work, no hits */
    struct gpu_buffer empty[2] = {{.data = NULL, .len = 0}, {.data = data, .len = 0}};
    struct gpu_batch e = {cats, 1, empty, 2};
    ck_assert_int_eq(gpu_batch_dispatch(eng, &e, &res, &err), 0);
    ck_assert_uint_eq(res.n_hits, 0);
    ck_assert_uint_eq(res.tel.kernel_launches, 0);
    check_batch(eng, &b, &res);
    ck_assert_uint_eq(res.n_hits, 1);
    gpu_result_finish(&res);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* ---- pipelined batches (gpu_batch_submit / gpu_batch_collect) ---------- */

#define PJOBS 9u

/* A batch of one client: its catalog and random buffers. */
struct pjob {
    const struct catalog *cats[1];
    struct bufset bufs;
    struct gpu_batch batch;
    struct gpu_result res;
};

static void pjob_init(struct pjob *j, const struct catalog *cat, uint32_t n_bufs)
{
    j->cats[0] = cat;
    bufset_random(&j->bufs, n_bufs, 3000, 1);
    j->batch = (struct gpu_batch){j->cats, 1, j->bufs.v, j->bufs.n};
}

/* gpu_telemetry_add, which the daemon uses for a batch split because it did
 * not fit the device: counters and times of the parts add up, the largest
 * of workgroups, hit_capacity and inflight stays, and the state and choices
 * are the later part's. */
// clang-format off
#define TEL_SUMS(X)                                                                  \
    X(bytes_uploaded) X(haystack_bytes_uploaded) X(catalog_bytes_uploaded)           \
    X(meta_bytes_uploaded) X(bytes_read_back) X(bytes_moved) X(kernel_launches)      \
    X(submits) X(sync_points) X(pipeline_cache_hits) X(pipeline_compiles)            \
    X(catalog_cache_hits) X(catalog_uploads) X(catalog_evictions) X(rounds)          \
    X(items_total) X(items_processed) X(items_remaining) X(hits_raw) X(hit_reruns)   \
    X(cut_reruns) X(spec_items) X(spec_fixes) X(spec_fix_bytes) X(plan_ns)           \
    X(confirm_host) X(confirm_host_ns) X(upload_ns) X(kernel_ns) X(device_ns) X(readback_ns)                            \
    X(finalize_ns) X(hits_counted) X(total_ns) X(wall_ns) X(device_idle_ns)            \
    X(collect_overlapped)
#define TEL_MAXES(X) X(workgroups) X(hit_capacity) X(inflight)
#define TEL_LATEST(X)                                                                \
    X(resident_allocations) X(resident_bytes) X(device_bytes) X(resident_catalogs)   \
    X(workgroup_size) X(segment_bytes)

START_TEST(test_telemetry_add)
{
    struct gpu_telemetry sum, part;
    memset(&sum, 0, sizeof(sum));
    memset(&part, 0, sizeof(part));
#define SET(f) sum.f = 3, part.f = 4;
    TEL_SUMS(SET)
    TEL_LATEST(SET)
#undef SET
#define SET(f) sum.f = 9, part.f = 4;
    TEL_MAXES(SET)
#undef SET
    sum.hit_writer = GPU_HITS_SUBGROUP;
    part.hit_writer = GPU_HITS_SCALAR;
    part.occupancy = 0.5;
    gpu_telemetry_add(&sum, &part);
#define CHECK(f, v) ck_assert_msg(sum.f == (v), #f " is %llu", (unsigned long long)sum.f);
#define SUM(f)      CHECK(f, 7)
#define MAXED(f)    CHECK(f, 9)
#define LATEST(f)   CHECK(f, 4)
    TEL_SUMS(SUM)
    TEL_MAXES(MAXED)
    TEL_LATEST(LATEST)
#undef SUM
#undef MAXED
#undef LATEST
#undef CHECK
    ck_assert_int_eq(sum.hit_writer, GPU_HITS_SCALAR);
    ck_assert(sum.occupancy == 0.5);
}
END_TEST
// clang-format on

/* Two clients take turns (job i is client i % 2) with up to three batches
 * on the device at once. From job 4 on each client scans a catalog new to
 * the engine: job 4 uploads it while jobs 2 and 3 run, and job 6 finds it
 * resident while job 4 is still in flight. Batches come back in submission
 * order (so in order per client), each equal to refscan. The counters show
 * the overlap: three batches on the device at once, none idle meanwhile,
 * and idle time before the first. _i: 0 mapped uploads, 1 staged. */
START_TEST(test_pipelined)
{
    struct gpu_options opt = {.inflight = 3, .staged_upload = _i, .hit_capacity = 64};
    struct gpu_engine *eng = engine(&opt);
    ck_assert_uint_eq(gpu_engine_max_inflight(eng), 3);
    rng = 77;
    struct catalog *cats[2][2];
    for (int c = 0; c < 2; c++) {
        cats[c][0] = random_catalog(4 + rnd(12));
        cats[c][1] = random_catalog(3 + rnd(8));
    }
    struct pjob jobs[PJOBS + 1];
    memset(jobs, 0, sizeof(jobs));
    for (uint32_t i = 0; i <= PJOBS; i++)
        pjob_init(&jobs[i], cats[i % 2][i >= 4], 2 + rnd(6));
    struct pjob *extra = &jobs[PJOBS];
    /* Warm: one batch the synchronous way; then the device sits idle. */
    check_batch(eng, &extra->batch, &extra->res);

    struct vks_error err = {0};
    struct gpu_result *out = NULL;
    ck_assert_int_eq(gpu_batch_collect(eng, &out, &err), -ENOENT);
    uint32_t next = 0, done = 0;
    while (done < PJOBS) {
        while (next < PJOBS && gpu_engine_inflight(eng) < 3) {
            int rc = gpu_batch_submit(eng, &jobs[next].batch, &jobs[next].res, &err);
            ck_assert_msg(rc == 0, "submit %u: %d %s", next, rc, err.msg);
            next++;
        }
        if (next < PJOBS) { /* the window is full */
            ck_assert_int_eq(gpu_batch_submit(eng, &extra->batch, &extra->res, &err), -EBUSY);
            ck_assert_int_eq(gpu_batch_dispatch(eng, &extra->batch, &extra->res, &err), -EBUSY);
            ck_assert(err.msg[0] != '\0');
        }
        int rc = gpu_batch_collect(eng, &out, &err);
        ck_assert_msg(rc == 0, "collect %u: %d %s", done, rc, err.msg);
        ck_assert_ptr_eq(out, &jobs[done].res);
        check_result(&jobs[done].batch, out);
        done++;
    }
    ck_assert_uint_eq(gpu_engine_inflight(eng), 0);

    ck_assert_uint_gt(jobs[0].res.tel.device_idle_ns, 0);
    ck_assert_uint_eq(jobs[0].res.tel.inflight, 1);
    for (uint32_t i = 1; i < PJOBS; i++) {
        const struct gpu_telemetry *t = &jobs[i].res.tel;
        ck_assert_uint_ge(t->inflight, 2);
        ck_assert_uint_eq(t->device_idle_ns, 0);
        ck_assert_uint_ge(t->wall_ns, t->total_ns);
    }
    ck_assert_uint_eq(jobs[2].res.tel.inflight, 3);
    ck_assert_uint_eq(jobs[4].res.tel.catalog_uploads, 1);
    ck_assert_uint_eq(jobs[6].res.tel.catalog_uploads, 0);
    ck_assert_uint_eq(jobs[6].res.tel.catalog_cache_hits, 1);
    struct gpu_engine_stats st;
    gpu_engine_stats(eng, &st);
    ck_assert_uint_eq(st.max_inflight, 3);
    ck_assert_uint_eq(st.batches, PJOBS + 1);
    ck_assert_uint_gt(st.busy_ns, 0);
    ck_assert_uint_gt(st.idle_ns, 0);

    gpu_engine_destroy(eng);
    for (uint32_t i = 0; i <= PJOBS; i++) {
        bufset_free(&jobs[i].bufs);
        gpu_result_finish(&jobs[i].res);
    }
    for (int c = 0; c < 2; c++) {
        catalog_destroy(cats[c][0]);
        catalog_destroy(cats[c][1]);
    }
}
END_TEST

/* A catalog forgotten while a batch in flight scans it stays until that
 * batch is collected (exact hits), then goes; an engine destroyed with
 * batches never collected waits for them and frees everything (ASan and
 * LeakSanitizer check the second part). */
START_TEST(test_pipelined_forget_destroy)
{
    struct gpu_options opt = {.inflight = 2};
    struct gpu_engine *eng = engine(&opt);
    rng = 78;
    struct catalog *cat = random_catalog(6);
    struct pjob jobs[2];
    memset(jobs, 0, sizeof(jobs));
    pjob_init(&jobs[0], cat, 5);
    pjob_init(&jobs[1], cat, 5);
    struct vks_error err = {0};
    struct gpu_result *out;
    ck_assert_int_eq(gpu_batch_submit(eng, &jobs[0].batch, &jobs[0].res, &err), 0);
    ck_assert(gpu_engine_forget(eng, catalog_fingerprint(cat)));
    ck_assert_uint_eq(gpu_engine_resident_catalogs(eng), 1);
    ck_assert_int_eq(gpu_batch_collect(eng, &out, &err), 0);
    check_result(&jobs[0].batch, out);
    ck_assert_uint_eq(gpu_engine_resident_catalogs(eng), 0);

    ck_assert_int_eq(gpu_batch_submit(eng, &jobs[0].batch, &jobs[0].res, &err), 0);
    ck_assert_int_eq(gpu_batch_submit(eng, &jobs[1].batch, &jobs[1].res, &err), 0);
    ck_assert_uint_eq(gpu_engine_inflight(eng), 2);
    gpu_engine_destroy(eng);
    for (int i = 0; i < 2; i++) {
        bufset_free(&jobs[i].bufs);
        gpu_result_finish(&jobs[i].res);
    }
    catalog_destroy(cat);
}
END_TEST

/* ---- collect overlapped with the next upload (gpu_batch_begin / end) --- */

#define OJOBS 6u

/*
 * The daemon's order with two batches in flight: batch i is begun (its
 * upload started on the upload threads), batch i-1 collected and checked
 * against refscan while that upload runs, then batch i ended (submitted).
 * Every batch after the first counts its predecessor's collect as
 * overlapped; without the split none would. Buffers of 1-2 MiB a batch
 * so the upload has many pieces; _i: 0 mapped, 1 staged in 64 KiB chunks
 * (the upload threads submit them while the collect submits too), 2
 * staged, buffers read by callback and the hits finished on the pool (its
 * waited-for jobs beside the background upload).
 */
START_TEST(test_collect_overlap)
{
    struct gpu_options opt = {.inflight = 2,
                              .upload_threads = 4,
                              .staged_upload = _i > 0,
                              .upload_chunk = _i > 0 ? 64u << 10 : 0,
                              .hits_parallel_min = _i == 2 ? 1 : 0};
    struct gpu_engine *eng = engine(&opt);
    rng = 91 + (uint64_t)_i;
    struct catalog *cat = random_catalog(10);
    struct pjob jobs[OJOBS];
    struct gpu_buffer reads[OJOBS][4];
    memset(jobs, 0, sizeof(jobs));
    for (uint32_t i = 0; i < OJOBS; i++) {
        jobs[i].cats[0] = cat;
        bufset_random(&jobs[i].bufs, 4, 1, 1);
        for (uint32_t b = 0; b < 4; b++) { /* 256 to 512 KiB each */
            struct gpu_buffer *gb = &jobs[i].bufs.v[b];
            free((void *)gb->data);
            gb->len = (256u << 10) + rnd(256u << 10);
            gb->data = random_text(gb->len);
            reads[i][b] = *gb;
            if (_i == 2) {
                reads[i][b].data = NULL;
                reads[i][b].read = read_from;
                reads[i][b].read_ctx = (void *)gb->data;
            }
        }
        jobs[i].batch = (struct gpu_batch){jobs[i].cats, 1, reads[i], 4};
    }
    struct vks_error err = {0};
    struct gpu_result *out = NULL, spare = {0};
    ck_assert_int_eq(gpu_batch_end(eng, &err), -ENOENT);
    ck_assert(!gpu_batch_upload_help(eng));
    ck_assert(!gpu_batch_oldest_done(eng));
    ck_assert_int_eq(gpu_batch_submit(eng, &jobs[0].batch, &jobs[0].res, &err), 0);
    for (uint32_t i = 1; i <= OJOBS; i++) {
        if (i < OJOBS) {
            int rc = gpu_batch_begin(eng, &jobs[i].batch, &jobs[i].res, &err);
            ck_assert_msg(rc == 0, "begin %u: %d %s", i, rc, err.msg);
            ck_assert_int_eq(gpu_batch_begin(eng, &jobs[0].batch, &spare, &err), -EBUSY);
            ck_assert_int_eq(gpu_batch_dispatch(eng, &jobs[0].batch, &spare, &err), -EBUSY);
            if (i % 2 == 0) /* the daemon's way: pieces on this thread until it is done */
                while (!gpu_batch_oldest_done(eng))
                    if (!gpu_batch_upload_help(eng))
                        sched_yield();
        }
        int rc = gpu_batch_collect(eng, &out, &err);
        ck_assert_msg(rc == 0, "collect %u: %d %s", i - 1, rc, err.msg);
        ck_assert_ptr_eq(out, &jobs[i - 1].res);
        struct gpu_batch mem = {jobs[i - 1].cats, 1, jobs[i - 1].bufs.v, 4};
        ck_assert_uint_gt(check_result(&mem, out), 0);
        if (i < OJOBS) {
            rc = gpu_batch_end(eng, &err);
            ck_assert_msg(rc == 0, "end %u: %d %s", i, rc, err.msg);
            ck_assert_uint_eq(gpu_engine_inflight(eng), 1);
        }
    }
    ck_assert_uint_eq(gpu_engine_inflight(eng), 0);
    ck_assert_uint_eq(jobs[0].res.tel.collect_overlapped, 0);
    for (uint32_t i = 1; i < OJOBS; i++) {
        ck_assert_msg(jobs[i].res.tel.collect_overlapped == 1, "batch %u: not overlapped", i);
        ck_assert_uint_gt(jobs[i].res.tel.haystack_bytes_uploaded, 1u << 20);
        if (_i > 0) /* every 64 KiB chunk's copy was submitted */
            ck_assert_uint_gt(jobs[i].res.tel.submits, 16);
    }
    struct gpu_engine_stats st;
    gpu_engine_stats(eng, &st);
    ck_assert_uint_eq(st.collects_overlapped, OJOBS - 1);
    ck_assert_uint_eq(st.batches, OJOBS);
    gpu_engine_destroy(eng);
    gpu_result_finish(&spare);
    for (uint32_t i = 0; i < OJOBS; i++) {
        bufset_free(&jobs[i].bufs);
        gpu_result_finish(&jobs[i].res);
    }
    catalog_destroy(cat);
}
END_TEST

/* Forward confirmations kept alive by adversarial data (the shapes of
 * bench/confirm_bench.c): a factor, then a run the rule's loop takes (`\s*`
 * over spaces, `.*` over a line, `[[:alnum:]]{8,}` over letters, base64
 * after a PEM header), far longer than a small cap, sometimes ended by
 * what completes the match. The host finishes the walks alive at the cap,
 * skipping the runs (rules/refscan.c run_skip), one (buffer, group) per
 * task on 4 upload threads, their hit lists merged: every buffer's hits
 * equal those of a plain walk of each group over the whole buffer
 * (refscan_nfa_range, no gate and no skip), so a lost hit, one filed under
 * another buffer or a wrong skip fails. */
static int push_raw(void *ctx, uint32_t rule, uint64_t end)
{
    return scan_hits_push(ctx, rule, end, 1);
}

START_TEST(test_confirm_runs)
{
    static const struct trule rules[] = {
        {"tok", RULE_REGEX, "(?i)token[[:alnum:]]{8,}_end", 0},
        {"ws", RULE_REGEX, "secret\\s*=\\s*[a-z0-9]+", 0},
        {"dot", RULE_REGEX, "(?i)apikey.*#!", 0},
        {"pem", RULE_REGEX, "(?s)-----BEGIN[ A-Z]{0,20}PRIVATE KEY-----[\\s\\S-]{64,}?KEY-----", 0},
    };
    static const char *const factor[] = {"TOKEN", "secret", "ApiKey",
                                         "-----BEGIN RSA PRIVATE KEY-----\n"};
    static const char *const run[] = {"abcXYZ019", " \t", "lazy dog,.;", "AKbE+/Y9\n"};
    static const char *const tail[] = {"_end", " =x1", "#!", "KEY-----"};
    struct rules_options ro = {.force_bitnfa = true};
    struct catalog *cat = compile_rules_opt(rules, 4, &ro);
    ck_assert_uint_ge(catalog_nfa_count(cat), 2);
    rng = 0xc0ffee77ull;
    enum { NB = 12 };
    struct gpu_buffer bufs[NB];
    for (uint32_t i = 0; i < NB; i++) {
        size_t len = 3000 + rnd(3000);
        uint8_t *d = random_text(len);
        for (size_t p = 50 + rnd(100); p + 1600 < len; p += 100 + rnd(300)) {
            uint32_t k = rnd(4), nr = (uint32_t)strlen(run[k]);
            size_t nf = strlen(factor[k]), l = 300 + rnd(900);
            memcpy(d + p, factor[k], nf);
            for (p += nf; l-- > 0; p++)
                d[p] = (uint8_t)run[k][rnd(nr)];
            if (rnd(4) != 0) {
                memcpy(d + p, tail[k], strlen(tail[k]));
                p += strlen(tail[k]);
            }
        }
        bufs[i] = (struct gpu_buffer){.data = d, .len = len, .mode = (enum scan_mode)(i % 3)};
    }
    const struct catalog *cats[1] = {cat};
    struct gpu_batch b = {cats, 1, bufs, NB};
    struct gpu_options opt = {.confirm_cap = 256, .upload_threads = 4};
    struct gpu_engine *eng = engine(&opt);
    struct gpu_result res = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(gpu_batch_dispatch(eng, &b, &res, &err), 0);
    ck_assert_uint_ge(res.tel.confirm_host, NB);
    size_t at = 0;
    for (uint32_t i = 0; i < NB; i++) {
        struct scan_hits want = {0};
        for (uint32_t k = 0; k < catalog_nfa_count(cat); k++)
            ck_assert_int_eq(refscan_nfa_range(cat, k, bufs[i].data, bufs[i].len, 0, 0, bufs[i].len,
                                               push_raw, &want),
                             0);
        scan_hits_finalize(&want, cat, bufs[i].mode);
        ck_assert_uint_gt(want.n, 0);
        for (size_t k = 0; k < want.n; k++, at++) {
            ck_assert_uint_lt(at, res.n_hits);
            const struct gpu_hit *h = &res.hits[at];
            ck_assert_msg(h->buffer == i && h->rule == want.v[k].rule && h->end == want.v[k].end &&
                              h->count == want.v[k].count,
                          "buffer %u hit %zu differs", i, k);
        }
        free(want.v);
    }
    ck_assert_uint_eq(at, res.n_hits);
    gpu_result_finish(&res);
    gpu_engine_destroy(eng);
    for (uint32_t i = 0; i < NB; i++)
        free((void *)bufs[i].data);
    catalog_destroy(cat);
}
END_TEST

/* The Vulkan loader unloads its drivers and layers at vkDestroyInstance;
 * what lavapipe keeps in its globals then looks leaked to LeakSanitizer
 * (128 bytes from an unnamed module per engine). Pinning the modules
 * loaded keeps that memory reachable, so the suite needs no suppressions
 * and LeakSanitizer still checks all of our own code. */
static void pin_vulkan_modules(void)
{
    static const char *const libs[] = {"libvulkan_lvp.so", "libVkLayer_MESA_device_select.so",
                                       "libvulkan_intel.so", "libvulkan_radeon.so",
                                       "libvulkan_intel_hasvk.so"};
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++)
        dlopen(libs[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
}

Suite *gpu_suite(void)
{
    pin_vulkan_modules();
    struct gpu_device_info info;
    uint32_t n = 0;
    if (gpu_device_list(&info, 1, &n, NULL) < 0 || n == 0) {
        fprintf(stderr, "no Vulkan device: gpu suite skipped\n");
        exit(77);
    }
    Suite *s = suite_create("gpu");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_devices);
    tcase_add_test(tc, test_bad_batches);
    tcase_add_test(tc, test_random_scalar);
    tcase_add_test(tc, test_random_subgroup);
    tcase_add_test(tc, test_many_buffers);
    tcase_add_test(tc, test_staged_upload);
    tcase_add_test(tc, test_staging_room);
    tcase_add_test(tc, test_batch_bytes_hint);
    tcase_add_test(tc, test_ring_not_learned_from_few_hits);
    tcase_add_test(tc, test_hit_copy_ahead);
    tcase_add_test(tc, test_segment_boundaries);
    tcase_add_test(tc, test_bitnfa_random);
    tcase_add_test(tc, test_bitnfa_segments);
    tcase_add_loop_test(tc, test_gated_nfa, 0, 2);
    tcase_add_test(tc, test_weak_anchor_gates);
    tcase_add_loop_test(tc, test_confirm_nfa, 0, 3);
    tcase_add_loop_test(tc, test_confirm_cap, 0, 3);
    tcase_add_test(tc, test_confirm_items_bounded);
    tcase_add_test(tc, test_confirm_many);
    tcase_add_loop_test(tc, test_gated_pieces, 0, 3);
    tcase_add_test(tc, test_gated_parts_items);
    tcase_add_test(tc, test_long_buffers);
    tcase_add_test(tc, test_cut_loops_rerun);
    tcase_add_test(tc, test_loop_budget);
    tcase_add_loop_test(tc, test_spec_segments, 0, 2);
    tcase_add_loop_test(tc, test_factor_pass, 0, 4);
    tcase_add_loop_test(tc, test_factor_ends_groups, 0, 2);
    tcase_add_loop_test(tc, test_factor_ends_ranges, 0, 4);
    tcase_add_loop_test(tc, test_many_gated_groups, 0, 2);
    tcase_add_test(tc, test_hit_dense);
    tcase_add_loop_test(tc, test_hits_pool, 0, 2);
    tcase_add_test(tc, test_hits_counted);
    tcase_add_test(tc, test_hits_device_counted);
    tcase_add_test(tc, test_spec_count_bet);
    tcase_add_test(tc, test_ring_learned);
    tcase_add_test(tc, test_profile);
    tcase_add_test(tc, test_serialize);
    tcase_add_test(tc, test_anchored);
    tcase_add_test(tc, test_large_catalogs);
    tcase_add_test(tc, test_modes);
    tcase_add_test(tc, test_ring_overflow);
    tcase_add_test(tc, test_resident_catalogs);
    tcase_add_test(tc, test_catalog_eviction);
    tcase_add_test(tc, test_over_budget);
    tcase_add_test(tc, test_timeout);
    tcase_add_loop_test(tc, test_pipelined, 0, 2);
    tcase_add_test(tc, test_pipelined_forget_destroy);
    tcase_add_test(tc, test_telemetry_add);
    suite_add_tcase(s, tc);
    tc = tcase_create("literal");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, test_literal_kernel, 0, 5);
    tcase_add_loop_test(tc, test_literal_boundaries, 0, 4);
    suite_add_tcase(s, tc);
    tc = tcase_create("overlap");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, test_collect_overlap, 0, 3);
    suite_add_tcase(s, tc);
    tc = tcase_create("fused");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_fused_groups);
    suite_add_tcase(s, tc);
    tc = tcase_create("read_runs");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_gated_runs);
    suite_add_tcase(s, tc);
    tc = tcase_create("confirm_runs");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_confirm_runs);
    suite_add_tcase(s, tc);
    return s;
}
