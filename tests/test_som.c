/*
 * Start of match (flag L) against Hyperscan with HS_FLAG_SOM_LEFTMOST: for
 * random rules (literals, classes, bounded and unbounded repeats,
 * alternations, ^ $ \b \B, caseless and multi-line) and random data, the
 * CPU reference scanner's ends plus rules/som.c's starts must equal the
 * (from, to) pairs Hyperscan reports. Also: the flag letter, the catalog
 * flag, and hand-picked cases whose starts are known.
 *
 * Knobs: VKS_SOM_SEED (default 1), VKS_SOM_CASES (random rules, default 300).
 */
#include <check.h>
#include <errno.h>
#include <hs.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oomfault.h"
#include "patfile.h"
#include "refscan.h"
#include "rules.h"
#include "som.h"

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
    return n == 0 ? 0 : (uint32_t)(rng_next(r) % n);
}

static unsigned env_uint(const char *name, unsigned dflt)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? (unsigned)strtoul(v, NULL, 0) : dflt;
}

/* (end, start) pairs, sorted. */
struct pairs {
    uint64_t (*v)[2];
    size_t n, cap;
};

static void pairs_push(struct pairs *p, uint64_t end, uint64_t start)
{
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->v = realloc(p->v, p->cap * sizeof(*p->v));
        ck_assert(p->v != NULL);
    }
    p->v[p->n][0] = end;
    p->v[p->n][1] = start;
    p->n++;
}

static int pair_cmp(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Sorts and keeps, per end, the smallest start. */
static void pairs_norm(struct pairs *p)
{
    if (p->n == 0)
        return;
    qsort(p->v, p->n, sizeof(*p->v), pair_cmp);
    size_t m = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (m > 0 && p->v[m - 1][0] == p->v[i][0])
            continue;
        p->v[m][0] = p->v[i][0];
        p->v[m][1] = p->v[i][1];
        m++;
    }
    p->n = m;
}

static int on_hs(unsigned id, unsigned long long from, unsigned long long to, unsigned fl,
                 void *ctx)
{
    (void)id;
    (void)fl;
    pairs_push(ctx, to, from);
    return 0;
}

static unsigned hs_flags_of(uint32_t f)
{
    unsigned h = HS_FLAG_SOM_LEFTMOST;
    if (f & RULE_F_CASELESS)
        h |= HS_FLAG_CASELESS;
    if (f & RULE_F_DOTALL)
        h |= HS_FLAG_DOTALL;
    if (f & RULE_F_MULTILINE)
        h |= HS_FLAG_MULTILINE;
    return h;
}

/* Our (end, start) pairs: ends from the reference scanner, starts from
 * som_fill. Returns false when vkscan rejects the rule. */
static bool ours_kind(enum rule_kind kind, const char *pat, uint32_t flags, const uint8_t *hay,
                      size_t len, struct pairs *out)
{
    struct rule_src src = {.id = "t",
                           .kind = kind,
                           .pattern = pat,
                           .len = strlen(pat),
                           .flags = flags | RULE_F_SOMLEFT};
    struct rules_options opt = {.max_states = 20000, .threads = 1};
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(&src, 1, &opt, &res, &err), 0);
    if (res.n_rejects != 0) {
        rules_result_finish(&res);
        return false;
    }
    struct scan_hits hits = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, hay, len, SCAN_ALL, &hits), 0);
    struct som_hit *sh = calloc(hits.n + 1, sizeof(*sh));
    ck_assert(sh != NULL);
    for (size_t i = 0; i < hits.n; i++)
        sh[i] = (struct som_hit){.rule = hits.v[i].rule, .end = hits.v[i].end};
    struct som_set *set = som_set_create(res.catalog);
    ck_assert(set != NULL);
    ck_assert_int_eq(som_fill(set, hay, len, sh, hits.n, 0, &err), 0);
    for (size_t i = 0; i < hits.n; i++)
        pairs_push(out, sh[i].end, sh[i].start);
    som_set_destroy(set);
    free(sh);
    scan_hits_finish(&hits);
    rules_result_finish(&res);
    pairs_norm(out);
    return true;
}

static bool ours(const char *pat, uint32_t flags, const uint8_t *hay, size_t len, struct pairs *out)
{
    return ours_kind(RULE_REGEX, pat, flags, hay, len, out);
}

/* Hyperscan's pairs; false when it rejects the rule with SOM_LEFTMOST. */
static bool theirs(const char *pat, uint32_t flags, const uint8_t *hay, size_t len,
                   struct pairs *out, char *msg, size_t msgsz)
{
    hs_database_t *db = NULL;
    hs_compile_error_t *ce = NULL;
    if (hs_compile(pat, hs_flags_of(flags), HS_MODE_BLOCK, NULL, &db, &ce) != HS_SUCCESS) {
        snprintf(msg, msgsz, "%s", ce->message);
        hs_free_compile_error(ce);
        return false;
    }
    hs_scratch_t *scratch = NULL;
    ck_assert_int_eq(hs_alloc_scratch(db, &scratch), HS_SUCCESS);
    ck_assert_int_eq(hs_scan(db, (const char *)hay, (unsigned)len, 0, scratch, on_hs, out),
                     HS_SUCCESS);
    hs_free_scratch(scratch);
    hs_free_database(db);
    pairs_norm(out);
    return true;
}

struct stats {
    unsigned both, hs_only, ours_only, neither, failures, with_hits, som_limit;
};

/* Whether Hyperscan accepts the rule without HS_FLAG_SOM_LEFTMOST. */
static bool plain_ok(const char *pat, uint32_t flags)
{
    hs_database_t *db = NULL;
    hs_compile_error_t *ce = NULL;
    unsigned f = hs_flags_of(flags) & ~(unsigned)HS_FLAG_SOM_LEFTMOST;
    if (hs_compile(pat, f, HS_MODE_BLOCK, NULL, &db, &ce) != HS_SUCCESS) {
        hs_free_compile_error(ce);
        return false;
    }
    hs_free_database(db);
    return true;
}

static void compare(const char *pat, uint32_t flags, const uint8_t *hay, size_t len, uint64_t seed,
                    struct stats *st)
{
    struct pairs a = {0}, b = {0};
    char msg[256] = "";
    bool o = ours(pat, flags, hay, len, &a);
    bool h = theirs(pat, flags, hay, len, &b, msg, sizeof(msg));
    if (o && !h && plain_ok(pat, flags)) {
        /* Hyperscan takes the rule without SOM: its SOM limit refused it */
        st->som_limit++;
        if (strstr(msg, "too large") == NULL) {
            st->failures++;
            fprintf(stderr, "Hyperscan refuses SOM for /%s/ for another reason: %s\n", pat, msg);
        }
    }
    if (!o || !h) {
        /* vkscan takes L on every rule it accepts; Hyperscan refuses SOM
         * for some (docs/engine.md) and rejects a few we accept anyway */
        st->neither += !o && !h;
        st->hs_only += h && !o;
        st->ours_only += o && !h;
        if (h && !o && getenv("VKS_SOM_VERBOSE") != NULL)
            fprintf(stderr, "only Hyperscan accepts /%s/ (flags %u)\n", pat, flags);
        goto out;
    }
    st->both++;
    st->with_hits += b.n > 0;
    bool same = a.n == b.n && (a.n == 0 || memcmp(a.v, b.v, a.n * sizeof(*a.v)) == 0);
    if (!same) {
        st->failures++;
        fprintf(stderr, "starts differ for /%s/ flags %u seed %llu: ours %zu, Hyperscan %zu\n", pat,
                flags, (unsigned long long)seed, a.n, b.n);
        for (size_t i = 0; i < a.n || i < b.n; i++) {
            if (i < a.n && i < b.n && a.v[i][0] == b.v[i][0] && a.v[i][1] == b.v[i][1])
                continue;
            fprintf(stderr,
                    "  first difference at #%zu: ours (%lld, %lld), Hyperscan (%lld, %lld)\n", i,
                    i < a.n ? (long long)a.v[i][1] : -1, i < a.n ? (long long)a.v[i][0] : -1,
                    i < b.n ? (long long)b.v[i][1] : -1, i < b.n ? (long long)b.v[i][0] : -1);
            break;
        }
    }
out:
    free(a.v);
    free(b.v);
}

/* ---- random rules -------------------------------------------------------- */

struct sbuf {
    char p[512];
    size_t n;
};

static void put(struct sbuf *b, const char *s)
{
    size_t k = strlen(s);
    if (b->n + k < sizeof(b->p)) {
        memcpy(b->p + b->n, s, k + 1);
        b->n += k;
    }
}

static const char *pick(struct rng *r, const char *const *v, size_t n)
{
    return v[rng_below(r, (uint32_t)n)];
}

#define N(v) (sizeof(v) / sizeof((v)[0]))

static const char *const atoms[] = {"a",     "b",   "ab",  "ba",    "x",   "[ab]",  "[^b]",
                                    "[a-c]", "\\w", "\\d", "\\s",   ".",   "A",     "\\W",
                                    "[^a]",  "\\n", "-",   "[ax-]", "aba", "[\\w-]"};
static const char *const quants[] = {"",      "",       "",       "*",     "+",
                                     "?",     "{2}",    "{1,3}",  "{0,4}", "{2,}",
                                     "{3,6}", "{0,20}", "{1,40}", "+?",    "*?"};
static const char *const asserts[] = {"\\b", "\\B", "^", "$"};

static void gen_seq(struct rng *r, struct sbuf *b, int depth);

static void gen_piece(struct rng *r, struct sbuf *b, int depth)
{
    uint32_t k = rng_below(r, 10);
    if (k == 0 && depth < 2) {
        put(b, rng_below(r, 2) ? "(" : "(?:");
        gen_seq(r, b, depth + 1);
        put(b, "|");
        gen_seq(r, b, depth + 1);
        put(b, ")");
    } else {
        put(b, pick(r, atoms, N(atoms)));
    }
    put(b, pick(r, quants, N(quants)));
}

static void gen_seq(struct rng *r, struct sbuf *b, int depth)
{
    uint32_t n = 1 + rng_below(r, 4);
    for (uint32_t i = 0; i < n; i++) {
        if (rng_below(r, 8) == 0)
            put(b, pick(r, asserts, 3)); /* $ only at the end */
        gen_piece(r, b, depth);
    }
}

static void gen_rule(struct rng *r, struct sbuf *b)
{
    b->n = 0;
    b->p[0] = '\0';
    if (rng_below(r, 6) == 0)
        put(b, rng_below(r, 2) ? "^" : ".*");
    gen_seq(r, b, 0);
    if (rng_below(r, 4) == 0) {
        put(b, "|");
        gen_seq(r, b, 0);
    }
    uint32_t e = rng_below(r, 8);
    if (e == 0)
        put(b, "$");
    else if (e == 1)
        put(b, "\\b");
}

static void gen_data(struct rng *r, uint8_t *p, size_t n)
{
    static const char alpha[] = "aaabbbxAB-- \n0_c";
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)alpha[rng_below(r, sizeof(alpha) - 1)];
}

START_TEST(random_rules)
{
    unsigned seed0 = env_uint("VKS_SOM_SEED", 1), n = env_uint("VKS_SOM_CASES", 300);
    static const uint32_t fl[] = {0,
                                  0,
                                  0,
                                  RULE_F_CASELESS,
                                  RULE_F_MULTILINE,
                                  RULE_F_DOTALL,
                                  RULE_F_CASELESS | RULE_F_MULTILINE};
    struct stats st = {0};
    uint8_t hay[600];
    for (unsigned k = 0; k < n && st.failures < 10; k++) {
        uint64_t seed = ((uint64_t)seed0 << 32) | k;
        struct rng r = {seed};
        struct sbuf b;
        gen_rule(&r, &b);
        size_t len = 50 + rng_below(&r, sizeof(hay) - 50);
        gen_data(&r, hay, len);
        compare(b.p, fl[rng_below(&r, N(fl))], hay, len, seed, &st);
    }
    fprintf(stderr,
            "som random: %u rules: both accept %u (%u with matches), only Hyperscan %u, only "
            "ours %u (%u by Hyperscan's SOM size limit), neither %u, failures %u\n",
            n, st.both, st.with_hits, st.hs_only, st.ours_only, st.som_limit, st.neither,
            st.failures);
    ck_assert_msg(st.failures == 0, "%u random rules get other starts than Hyperscan's",
                  st.failures);
    /* the generator must give rules with matches to compare */
    ck_assert(st.with_hits > n / 4);
}
END_TEST

/* Long bounded and unbounded gaps: windows that overlap, and a walk that
 * runs from the buffer's start. */
START_TEST(long_gaps)
{
    static const char *const pats[] = {"a[^x]{0,100}b", "ab.*ba",         "(a|b){50,120}x",
                                       "\\bb[a-c ]+x",  "x.{40,80}$",     "^.*a.{3}b",
                                       "a\\w{20,}b",    "(ab|ba){20,40}", "\\bx[^\\n]{10,99}"};
    struct stats st = {0};
    struct rng r = {77};
    uint8_t hay[4000];
    for (size_t k = 0; k < N(pats); k++) {
        gen_data(&r, hay, sizeof(hay));
        compare(pats[k], k % 2 ? RULE_F_DOTALL : 0, hay, sizeof(hay), k, &st);
    }
    /* many ends whose backward walks reach the buffer's start: past its
     * budget the walk goes forward for the rest (rules/som.c) */
    static uint8_t big[200000];
    gen_data(&r, big, sizeof(big));
    compare("a.*b", RULE_F_DOTALL, big, sizeof(big), 99, &st);
    compare("\\w+", 0, big, sizeof(big), 100, &st);
    ck_assert_int_eq(st.failures, 0);
    ck_assert_uint_eq(st.both, N(pats) + 2);
}
END_TEST

/* Starts we can tell by hand, and that hits of rules without L get none
 * unless every start is asked for. */
START_TEST(known)
{
    static const char text[] = "r1:/foo.*bar/L\n"
                               "r2:/bar/\n"
                               "r3:/.*o+/L\n"
                               "r4:/^b.r$/mL\n";
    struct patfile pf;
    struct vks_error err;
    ck_assert_int_eq(patfile_parse(text, strlen(text), &pf, &err), 0);
    ck_assert_uint_eq(pf.n_rejects, 0);
    ck_assert_uint_eq(pf.n, 4);
    ck_assert(pf.rules[0].flags & RULE_F_SOMLEFT);
    ck_assert(!(pf.rules[1].flags & RULE_F_SOMLEFT));
    struct rules_options opt = {.threads = 1};
    struct rules_result res;
    ck_assert_int_eq(rules_compile(pf.rules, pf.n, &opt, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    ck_assert(som_catalog_wants(res.catalog));
    const char *hay = "xfoo foo bar\nbar";
    struct scan_hits hits = {0};
    ck_assert_int_eq(
        refscan_buffer(res.catalog, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &hits), 0);
    struct som_hit sh[32];
    ck_assert_uint_le(hits.n, 32);
    for (size_t i = 0; i < hits.n; i++)
        sh[i] = (struct som_hit){.rule = hits.v[i].rule, .end = hits.v[i].end};
    struct som_set *set = som_set_create(res.catalog);
    ck_assert(set != NULL);
    ck_assert_int_eq(som_fill(set, (const uint8_t *)hay, strlen(hay), sh, hits.n, 0, &err), 0);
    unsigned seen = 0;
    for (size_t i = 0; i < hits.n; i++) {
        uint32_t rule = res.rule_index[0] == sh[i].rule   ? 0
                        : res.rule_index[1] == sh[i].rule ? 1
                        : res.rule_index[2] == sh[i].rule ? 2
                                                          : 3;
        if (rule == 0) { /* foo.*bar: leftmost foo */
            ck_assert_uint_eq(sh[i].start, 1);
            seen |= 1;
        } else if (rule == 1) { /* no L */
            ck_assert_uint_eq(sh[i].start, SOM_NONE);
            seen |= 2;
        } else if (rule == 2) { /* the leading .* is kept: start of the line */
            ck_assert_uint_eq(sh[i].start, 0);
            seen |= 4;
        } else { /* ^b.r$ with m: the second line */
            ck_assert_uint_eq(sh[i].start, 13);
            ck_assert_uint_eq(sh[i].end, 16);
            seen |= 8;
        }
    }
    ck_assert_uint_eq(seen, 15);
    /* every start on request: bar ends at 12 and 16 */
    ck_assert_int_eq(som_fill(set, (const uint8_t *)hay, strlen(hay), sh, hits.n, 1, &err), 0);
    for (size_t i = 0; i < hits.n; i++) {
        ck_assert(sh[i].start != SOM_NONE);
        ck_assert_uint_lt(sh[i].start, sh[i].end);
        if (sh[i].rule == res.rule_index[1])
            ck_assert_uint_eq(sh[i].start, sh[i].end - 3);
    }
    som_set_destroy(set);
    scan_hits_finish(&hits);
    rules_result_finish(&res);
    patfile_finish(&pf);
}
END_TEST

/* The pattern-file letter L, and the message that lists it. */
/* Hex strings with jumps, alternatives, half bytes and negations: the
 * starts are found by parsing the catalog's stored (canonical) form of the
 * rule again, so they check that form too. Each against Hyperscan on the
 * same rule written as a regex, over random bytes of the rules' alphabet. */
START_TEST(hex_starts)
{
    static const struct {
        const char *hex, *re;
    } cases[] = {
        {"41 [1-3] 42", "\\x41[\\x00-\\xff]{1,3}\\x42"},
        {"41 [ 2 - ] 42", "\\x41[\\x00-\\xff]{2,}\\x42"},
        {"( 41 | 42 43 ) [-] 44", "(?:\\x41|\\x42\\x43)[\\x00-\\xff]*\\x44"},
        {"4? ~42 ?3", "[\\x40-\\x4f][^\\x42][\\x03\\x13\\x23\\x33\\x43\\x53\\x63\\x73\\x83"
                      "\\x93\\xa3\\xb3\\xc3\\xd3\\xe3\\xf3]"},
        {"41 ( 42 [1] | (43 | 44) ) 41", "\\x41(?:\\x42[\\x00-\\xff]|\\x43|\\x44)\\x41"},
    };
    static const uint8_t alpha[] = {0x41, 0x42, 0x43, 0x44, 0x00, 0x13};
    struct rng r = {0x4e5u};
    struct stats st = {0};
    uint8_t hay[300];
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int k = 0; k < 20; k++) {
            size_t len = 1 + rng_below(&r, sizeof(hay));
            for (size_t i = 0; i < len; i++)
                hay[i] = alpha[rng_below(&r, sizeof(alpha))];
            struct pairs a = {0}, b = {0};
            char msg[256] = "";
            ck_assert_msg(ours_kind(RULE_HEX, cases[c].hex, 0, hay, len, &a), "{%s} rejected",
                          cases[c].hex);
            ck_assert_msg(theirs(cases[c].re, 0, hay, len, &b, msg, sizeof(msg)), "%s: %s",
                          cases[c].re, msg);
            st.with_hits += b.n > 0;
            ck_assert_msg(a.n == b.n && (a.n == 0 || memcmp(a.v, b.v, a.n * sizeof(*a.v)) == 0),
                          "{%s}: %zu (end, start) pairs, Hyperscan %zu", cases[c].hex, a.n, b.n);
            free(a.v);
            free(b.v);
        }
    }
    ck_assert_uint_gt(st.with_hits, 50);
}
END_TEST

START_TEST(flag_letter)
{
    uint32_t f = 0;
    struct vks_error err;
    ck_assert_int_eq(rules_parse_flags("iL", 2, &f, &err), 0);
    ck_assert_uint_eq(f, RULE_F_CASELESS | RULE_F_SOMLEFT);
    ck_assert_int_eq(rules_parse_flags("Q", 1, &f, &err), -EINVAL);
    ck_assert(strstr(err.msg, "L (start of match)") != NULL);
    /* Hyperscan refuses SOM_LEFTMOST with SINGLEMATCH: so do we, per rule */
    struct rule_src src[2] = {
        {.id = "hl",
         .kind = RULE_REGEX,
         .pattern = "ab",
         .len = 2,
         .flags = RULE_F_SOMLEFT | RULE_F_SINGLEMATCH},
        {.id = "l", .kind = RULE_REGEX, .pattern = "ab", .len = 2, .flags = RULE_F_SOMLEFT}};
    struct rules_options opt = {.threads = 1};
    struct rules_result res;
    ck_assert_int_eq(rules_compile(src, 2, &opt, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 1);
    ck_assert_str_eq(res.rejects[0].id, "hl");
    ck_assert(strstr(res.rejects[0].msg, "H (single match) and L") != NULL);
    hs_database_t *db = NULL;
    hs_compile_error_t *ce = NULL;
    ck_assert_int_ne(
        hs_compile("ab", HS_FLAG_SOM_LEFTMOST | HS_FLAG_SINGLEMATCH, HS_MODE_BLOCK, NULL, &db, &ce),
        HS_SUCCESS);
    hs_free_compile_error(ce);
    rules_result_finish(&res);
}
END_TEST

/* Every allocation of building a finder and of finding starts (backward,
 * and forward past the budget) fails in turn: each failure is -ENOMEM with
 * a message (nothing leaks under ASan), and the starts are exact again once
 * allocations succeed. */
START_TEST(allocation_failures)
{
    static const char text[] = "a:/(?s)a.*b/L\nw:/\\bx\\w+/L\n";
    struct patfile pf;
    struct vks_error err;
    ck_assert_int_eq(patfile_parse(text, strlen(text), &pf, &err), 0);
    struct rules_options opt = {.threads = 1};
    struct rules_result res;
    ck_assert_int_eq(rules_compile(pf.rules, pf.n, &opt, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    static uint8_t hay[100000];
    struct rng r = {5};
    gen_data(&r, hay, sizeof(hay));
    struct scan_hits hits = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, hay, sizeof(hay), SCAN_ALL, &hits), 0);
    ck_assert_uint_gt(hits.n, 1000);
    struct som_hit *want = calloc(hits.n, sizeof(*want)), *got = calloc(hits.n, sizeof(*got));
    ck_assert(want != NULL && got != NULL);
    for (size_t i = 0; i < hits.n; i++)
        want[i] = (struct som_hit){.rule = hits.v[i].rule, .end = hits.v[i].end};
    struct som_set *ref = som_set_create(res.catalog);
    ck_assert_int_eq(som_fill(ref, hay, sizeof(hay), want, hits.n, 0, &err), 0);
    long fails = 0;
    for (long nth = 1;; nth++) {
        memcpy(got, want, hits.n * sizeof(*got));
        oomfault_open(nth);
        struct som_set *set = som_set_create(res.catalog);
        int rc = set == NULL ? -ENOMEM : som_fill(set, hay, sizeof(hay), got, hits.n, 0, &err);
        som_set_destroy(set);
        oomfault_close();
        if (!oomfault_fired()) {
            ck_assert_int_eq(rc, 0);
            break;
        }
        fails++;
        ck_assert_int_eq(rc, -ENOMEM);
        if (set != NULL)
            ck_assert_ptr_nonnull(strstr(err.msg, "out of memory"));
    }
    ck_assert_int_gt(fails, 10);
    ck_assert(memcmp(got, want, hits.n * sizeof(*got)) == 0);
    som_set_destroy(ref);
    free(want);
    free(got);
    scan_hits_finish(&hits);
    rules_result_finish(&res);
    patfile_finish(&pf);
}
END_TEST

Suite *som_suite(void)
{
    Suite *s = suite_create("som");
    TCase *tc = tcase_create("hyperscan");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, flag_letter);
    tcase_add_test(tc, hex_starts);
    tcase_add_test(tc, known);
    tcase_add_test(tc, long_gaps);
    tcase_add_test(tc, random_rules);
    tcase_add_test(tc, allocation_failures);
    suite_add_tcase(s, tc);
    return s;
}
