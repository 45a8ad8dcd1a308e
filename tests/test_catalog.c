/*
 * The packed catalog: round trips, rejection of corrupt or truncated
 * catalogs, fingerprints (stable, and sensitive to every rule byte and
 * flag), and the reference scanner's report modes.
 */
#include <check.h>
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "bitnfa.h"
#include "catalog.h"
#include "refscan.h"
#include "rules.h"
#include "som.h"

static const struct rule_src sample[] = {
    {.id = "word", .kind = RULE_REGEX, .pattern = "\\bfoo\\w*", .len = 8},
    {.id = "lit", .kind = RULE_LITERAL, .pattern = "bar", .len = 3, .flags = RULE_F_CASELESS},
    {.id = "hex", .kind = RULE_HEX, .pattern = "62 ?? 72", .len = 8},
    {.id = "once", .kind = RULE_REGEX, .pattern = "o+", .len = 2, .flags = RULE_F_SINGLEMATCH},
    {.id = "tail", .kind = RULE_REGEX, .pattern = "z$", .len = 2},
};
#define N_SAMPLE (sizeof(sample) / sizeof(sample[0]))

static struct catalog *compile(const struct rule_src *r, size_t n)
{
    struct rules_result res;
    struct vks_error err;
    /* the samples' shapes (which rules are DFAs, which bit-NFAs) predate
     * gating regexes with selective factors and gated groups of at most
     * BITNFA_GATED_BITS positions: keep them */
    struct rules_options opt = {.gate_bits = UINT32_MAX, .gated_group_bits = BITNFA_GROUP_BITS};
    ck_assert_int_eq(rules_compile(r, n, &opt, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    return cat;
}

static void hex_of(const struct catalog *cat, char hex[65])
{
    catalog_fingerprint_hex(catalog_fingerprint(cat), hex);
}

START_TEST(round_trip)
{
    struct catalog *a = compile(sample, N_SAMPLE);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    struct catalog *b;
    struct vks_error err;
    ck_assert_int_eq(catalog_from_bytes(w, n * 4, &b, &err), 0);
    size_t m;
    const uint32_t *w2 = catalog_words(b, &m);
    ck_assert_uint_eq(n, m);
    ck_assert(memcmp(w, w2, n * 4) == 0);
    ck_assert(memcmp(catalog_fingerprint(a), catalog_fingerprint(b), CATALOG_FP_LEN) == 0);
    ck_assert_uint_eq(catalog_rule_count(b), N_SAMPLE);
    for (uint32_t i = 0; i < N_SAMPLE; i++) {
        struct catalog_rule r;
        catalog_rule(b, i, &r);
        ck_assert_uint_eq(r.id_len, strlen(sample[i].id));
        ck_assert(memcmp(r.id, sample[i].id, r.id_len) == 0);
        ck_assert_uint_eq(r.flags, sample[i].flags);
        ck_assert_uint_eq(r.kind, sample[i].kind);
        uint8_t fp[CATALOG_FP_LEN];
        rules_fingerprint(&sample[i], fp);
        ck_assert(memcmp(fp, r.fingerprint, CATALOG_FP_LEN) == 0);
    }
    struct catalog_rule hx;
    catalog_rule(b, 2, &hx);
    ck_assert_uint_eq(hx.src_len, 8);
    ck_assert(memcmp(hx.src, "62 ?? 72", 8) == 0);
    /* scanning the copy gives the same hits */
    const char *hay = "foo bar BAR b-r fooz";
    struct scan_hits h1 = {0}, h2 = {0};
    refscan_buffer(a, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &h1);
    refscan_buffer(b, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &h2);
    ck_assert_uint_gt(h1.n, 5);
    ck_assert_uint_eq(h1.n, h2.n);
    ck_assert(memcmp(h1.v, h2.v, h1.n * sizeof(h1.v[0])) == 0);
    scan_hits_finish(&h1);
    scan_hits_finish(&h2);
    catalog_destroy(a);
    catalog_destroy(b);
}
END_TEST

/* Flag L survives the round trip, shows in catalog_rule_flags_any, and a
 * flag bit past it is corruption; the catalog's start finders are made
 * once and find starts of every rule kind. */
START_TEST(som_flag_and_finders)
{
    const struct rule_src r[] = {
        {.id = "hex", .kind = RULE_HEX, .pattern = "62 ?? 72", .len = 8, .flags = RULE_F_SOMLEFT},
        {.id = "lit", .kind = RULE_LITERAL, .pattern = "o b", .len = 3},
    };
    struct rules_result res;
    struct rules_options opt = {.threads = 1};
    struct vks_error err;
    ck_assert_int_eq(rules_compile(r, 2, &opt, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    size_t n;
    const uint32_t *w = catalog_words(res.catalog, &n);
    struct catalog *b;
    ck_assert_int_eq(catalog_from_bytes(w, n * 4, &b, &err), 0);
    struct catalog_rule cr;
    catalog_rule(b, res.rule_index[0], &cr);
    ck_assert_uint_eq(cr.flags, RULE_F_SOMLEFT);
    ck_assert(catalog_rule_flags_any(b) & RULE_F_SOMLEFT);
    struct rules_result pres;
    ck_assert_int_eq(rules_compile(r + 1, 1, &opt, &pres, &err), 0);
    ck_assert(!(catalog_rule_flags_any(pres.catalog) & RULE_F_SOMLEFT));
    /* one set of finders per catalog */
    struct som_set *set = catalog_som(b);
    ck_assert_ptr_nonnull(set);
    ck_assert_ptr_eq(catalog_som(b), set);
    struct som_hit hits[2] = {{.rule = res.rule_index[0], .end = 7},
                              {.rule = res.rule_index[1], .end = 5}};
    ck_assert_int_eq(som_fill(set, (const uint8_t *)"foo bxr", 7, hits, 2, 0, &err), 0);
    ck_assert_uint_eq(hits[0].start, 4);        /* "b?r" */
    ck_assert_uint_eq(hits[1].start, SOM_NONE); /* no L: no start unless asked */
    ck_assert_int_eq(som_fill(set, (const uint8_t *)"foo bxr", 7, hits, 2, 1, &err), 0);
    ck_assert_uint_eq(hits[0].start, 4);
    ck_assert_uint_eq(hits[1].start, 2); /* "o b" */
    /* a flag bit past L is corruption */
    uint32_t *c = malloc(n * 4);
    ck_assert_ptr_nonnull(c);
    memcpy(c, w, n * 4);
    c[c[CAT_H_RULES] + CAT_R_FLAGS] |= RULE_F_ALL + 1;
    struct catalog *bad = NULL;
    ck_assert_int_eq(catalog_adopt(c, n, &bad, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "flags"));
    catalog_destroy(b);
    rules_result_finish(&pres);
    rules_result_finish(&res);
}
END_TEST

START_TEST(truncated_rejected)
{
    struct catalog *a = compile(sample, N_SAMPLE);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    struct vks_error err;
    for (size_t len = 0; len < n * 4; len += (len < 128 ? 1 : 61)) {
        struct catalog *b = NULL;
        ck_assert_int_eq(catalog_from_bytes(w, len, &b, &err), -EINVAL);
        ck_assert_ptr_null(b);
        ck_assert(strstr(err.msg, "truncated") != NULL || strstr(err.msg, "corrupt") != NULL ||
                  strstr(err.msg, "size mismatch") != NULL);
    }
    catalog_destroy(a);
}
END_TEST

START_TEST(bit_flips_rejected)
{
    struct catalog *a = compile(sample, N_SAMPLE);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    uint32_t *copy = malloc(n * 4);
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < 2000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t bit = x % (n * 32);
        memcpy(copy, w, n * 4);
        copy[bit / 32] ^= 1u << (bit % 32);
        struct catalog *b = NULL;
        struct vks_error err;
        ck_assert_msg(catalog_from_bytes(copy, n * 4, &b, &err) == -EINVAL,
                      "flip of bit %zu accepted", bit);
        ck_assert_ptr_null(b);
    }
    free(copy);
    catalog_destroy(a);
}
END_TEST

/* Re-seals the check word, as a forger would, so structural validation
 * alone must catch the damage. */
static void reseal(uint32_t *w, size_t n)
{
    uint8_t fp[CATALOG_FP_LEN];
    w[CAT_H_CHECK] = 0;
    crypto_generichash(fp, sizeof(fp), (const unsigned char *)w, n * 4, NULL, 0);
    memcpy(&w[CAT_H_CHECK], fp, 4);
}

static void expect_structural_reject(const char *what, void (*damage)(uint32_t *w, size_t n),
                                     const char *msg_part)
{
    struct catalog *a = compile(sample, N_SAMPLE);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    uint32_t *copy = malloc(n * 4);
    memcpy(copy, w, n * 4);
    damage(copy, n);
    reseal(copy, n);
    struct catalog *b = NULL;
    struct vks_error err;
    int rc = catalog_from_bytes(copy, n * 4, &b, &err);
    ck_assert_msg(rc == -EINVAL, "%s accepted", what);
    ck_assert_msg(strstr(err.msg, msg_part) != NULL, "%s: message '%s'", what, err.msg);
    free(copy);
    catalog_destroy(a);
}

static uint32_t *group0(uint32_t *w)
{
    return w + w[CAT_H_GROUPS];
}

static void bad_transition(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = group0(w);
    w[g[CAT_G_TRANS] + 3] = g[CAT_G_NSTATES];
}
static void bad_start(uint32_t *w, size_t n)
{
    (void)n;
    group0(w)[CAT_G_START_NL] = 0xffffff;
}
static void bad_classmap(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = group0(w);
    w[g[CAT_G_CLASSMAP] + 'x'] = g[CAT_G_NCLASSES];
}
static void bad_offset(uint32_t *w, size_t n)
{
    group0(w)[CAT_G_TRANS] = (uint32_t)n - 2;
}
static void bad_rule_in_accept(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = group0(w);
    w[g[CAT_G_ACCEPTS]] = 999u << 5 | CAT_ACCEPT_ALWAYS;
}
static void bad_version(uint32_t *w, size_t n)
{
    (void)n;
    w[CAT_H_VERSION] = 99;
}
static void bad_string(uint32_t *w, size_t n)
{
    (void)n;
    w[w[CAT_H_RULES] + CAT_R_IDLEN] = 1u << 30;
}

START_TEST(structural_damage_rejected)
{
    expect_structural_reject("transition", bad_transition, "state that does not exist");
    expect_structural_reject("start", bad_start, "start state out of range");
    expect_structural_reject("class map", bad_classmap, "class map entry out of range");
    expect_structural_reject("offset", bad_offset, "points outside the catalog");
    expect_structural_reject("accept", bad_rule_in_accept, "names a rule that does not exist");
    expect_structural_reject("version", bad_version, "format version 99");
    expect_structural_reject("string", bad_string, "rule strings outside the string area");
}
END_TEST

/* ---- the bit-NFA section ---- */

/* Two rules whose DFAs would blow up (bit-NFA group 0, accept entries of
 * two rules) beside rules that stay DFAs. */
#define NFA_RULE(i, k, p)                                      \
    {                                                          \
        .id = i, .kind = k, .pattern = p, .len = sizeof(p) - 1 \
    }
static const struct rule_src nfa_sample[] = {
    NFA_RULE("gap", RULE_REGEX, "key.{0,300}[0-9a-f]{32}\\b"),
    NFA_RULE("lit", RULE_LITERAL, "bar"),
    NFA_RULE("tok", RULE_REGEX, "^tok[^\"]{0,120}\""),
    NFA_RULE("word", RULE_REGEX, "\\bfoo\\w*"),
};
#define N_NFA_SAMPLE (sizeof(nfa_sample) / sizeof(nfa_sample[0]))

static uint32_t *nfa0(uint32_t *w)
{
    return w + w[CAT_H_NFAS];
}

START_TEST(bitnfa_round_trip)
{
    struct catalog *a = compile(nfa_sample, N_NFA_SAMPLE);
    ck_assert_uint_eq(catalog_nfa_count(a), 1);
    struct catalog_nfa g;
    catalog_nfa(a, 0, &g);
    ck_assert_uint_eq(g.n_rules, 2);
    ck_assert_uint_eq(g.n_words, (g.n_bits + 31) / 32);
    ck_assert_uint_gt(g.n_bits, 300 + 32 + 120);
    ck_assert_uint_ne(g.n_bits % 32, 0); /* the tail tests below need unused bits */
    ck_assert_uint_ge(g.n_acc, 2);
    ck_assert_uint_eq(g.maxlen, 3 + 300 + 32);
    ck_assert(g.flags & CAT_GF_ASSERTS);
    uint32_t ng = catalog_group_count(a);
    struct catalog_rule r;
    catalog_rule(a, 0, &r);
    ck_assert_uint_eq(r.group, ng);
    catalog_rule(a, 2, &r);
    ck_assert_uint_eq(r.group, ng);
    catalog_rule(a, 1, &r);
    ck_assert_uint_lt(r.group, ng);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    ck_assert_uint_eq(w[CAT_H_VERSION], CATALOG_VERSION);
    ck_assert_uint_eq(w[CAT_H_MAXBITS], g.n_bits);
    struct catalog *b;
    struct vks_error err;
    ck_assert_int_eq(catalog_from_bytes(w, n * 4, &b, &err), 0);
    size_t m;
    ck_assert(memcmp(w, catalog_words(b, &m), n * 4) == 0);
    ck_assert_uint_eq(catalog_nfa_count(b), 1);
    /* the reloaded catalog scans the same */
    const char *hay = "tok = \"x\" key: 0123456789abcdef0123456789abcdef bar foo_ key\n"
                      "0123456789abcdef0123456789abcdefg";
    struct scan_hits ha = {0}, hb = {0};
    ck_assert_int_eq(refscan_buffer(a, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &ha), 0);
    ck_assert_int_eq(refscan_buffer(b, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &hb), 0);
    ck_assert_uint_eq(ha.n, hb.n);
    ck_assert(memcmp(ha.v, hb.v, ha.n * sizeof(*ha.v)) == 0);
    /* tok (^, end 7), gap (\b after 32 hex digits; not before 'g'), bar, foo_ */
    bool tok = false, gap = false;
    for (size_t i = 0; i < ha.n; i++) {
        tok |= ha.v[i].rule == 2 && ha.v[i].end == 7;
        gap |= ha.v[i].rule == 0;
        ck_assert(ha.v[i].rule != 0 || ha.v[i].end == 47);
    }
    ck_assert(tok && gap);
    scan_hits_finish(&ha);
    scan_hits_finish(&hb);
    catalog_destroy(a);
    catalog_destroy(b);
}
END_TEST

static void expect_nfa_reject(const char *what, void (*damage)(uint32_t *w, size_t n),
                              const char *msg_part)
{
    struct catalog *a = compile(nfa_sample, N_NFA_SAMPLE);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    uint32_t *copy = malloc(n * 4);
    memcpy(copy, w, n * 4);
    damage(copy, n);
    reseal(copy, n);
    struct catalog *b = NULL;
    struct vks_error err;
    int rc = catalog_from_bytes(copy, n * 4, &b, &err);
    ck_assert_msg(rc == -EINVAL, "%s accepted", what);
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(err.msg, msg_part) != NULL, "%s: message '%s'", what, err.msg);
    free(copy);
    catalog_destroy(a);
}

static void nfa_zero_bits(uint32_t *w, size_t n)
{
    (void)n;
    nfa0(w)[CAT_N_NBITS] = 0;
}
static void nfa_too_many_bits(uint32_t *w, size_t n)
{
    (void)n;
    nfa0(w)[CAT_N_NBITS] = CAT_NFA_MAX_BITS + 1;
    nfa0(w)[CAT_N_NWORDS] = CAT_NFA_MAX_BITS / 32 + 1;
}
static void nfa_words_mismatch(uint32_t *w, size_t n)
{
    (void)n;
    nfa0(w)[CAT_N_NWORDS]++;
}
static void nfa_classmap(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    w[g[CAT_N_CLASSMAP] + 'k'] = g[CAT_N_NCLASSES];
}
static void nfa_reach_tail(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    w[g[CAT_N_REACH] + g[CAT_N_NWORDS] - 1] |= 0x80000000u;
}
static void nfa_shift_tail(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    w[g[CAT_N_SHIFT] + g[CAT_N_NWORDS] - 1] |= 0x80000000u;
}
static void nfa_range_past_bits(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    w[g[CAT_N_RANGES] + 1] = g[CAT_N_NBITS];
}
static void nfa_range_reversed(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    uint32_t *r = w + g[CAT_N_RANGES] + 2 * (g[CAT_N_NRANGES] - 1);
    r[0] = r[1] + 1;
}
static void nfa_exc_no_target(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    w[g[CAT_N_EXC] + CAT_X_NTGT] = 0;
}
static void nfa_exc_cond(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    w[g[CAT_N_EXC] + CAT_X_COND] = 1u << 20;
}
static void nfa_exc_ranges(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    w[g[CAT_N_EXC] + CAT_X_FIRST] = g[CAT_N_NRANGES];
}
static void nfa_exc_order(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    w[g[CAT_N_EXC] + (g[CAT_N_NEXC] - 1) * CAT_X_WORDS + CAT_X_NSRC] = 0;
}
static void nfa_acc_rule(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    w[g[CAT_N_ACC] + CAT_A_RULE] = w[CAT_H_NRULES];
}
static void nfa_acc_order(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = nfa0(w);
    uint32_t na = g[CAT_N_NACC];
    w[g[CAT_N_ACC] + (na - 1) * CAT_X_WORDS + CAT_A_RULE] = 0;
    w[g[CAT_N_ACC] + CAT_A_RULE] = 2;
}
static void nfa_table_offset(uint32_t *w, size_t n)
{
    nfa0(w)[CAT_N_REACH] = (uint32_t)n - 2;
}
static void nfa_header_count(uint32_t *w, size_t n)
{
    (void)n;
    w[CAT_H_NNFAS] = 1000000;
}
static void nfa_header_maxbits(uint32_t *w, size_t n)
{
    (void)n;
    w[CAT_H_MAXBITS] = 0;
}
static void nfa_rule_group(uint32_t *w, size_t n)
{
    (void)n;
    w[w[CAT_H_RULES] + CAT_R_GROUP] = w[CAT_H_NGROUPS] + w[CAT_H_NNFAS];
}
static void nfa_flags(uint32_t *w, size_t n)
{
    (void)n;
    nfa0(w)[CAT_N_FLAGS] |= 1u << 7;
}

/* Every field of the bit-NFA section is validated, with the check word
 * re-sealed so that only the structural checks can catch the damage. */
START_TEST(bitnfa_damage_rejected)
{
    expect_nfa_reject("zero bits", nfa_zero_bits, "bad bit count");
    expect_nfa_reject("too many bits", nfa_too_many_bits, "bad bit count");
    expect_nfa_reject("words", nfa_words_mismatch, "bad bit count");
    expect_nfa_reject("class map", nfa_classmap, "bit-NFA class map entry out of range");
    expect_nfa_reject("reach tail", nfa_reach_tail, "reach row has bits past the last position");
    expect_nfa_reject("shift tail", nfa_shift_tail, "shift mask has bits past the last position");
    expect_nfa_reject("range past bits", nfa_range_past_bits, "malformed");
    expect_nfa_reject("range reversed", nfa_range_reversed, "malformed");
    expect_nfa_reject("exception target", nfa_exc_no_target, "exception entry is malformed");
    expect_nfa_reject("exception cond", nfa_exc_cond, "exception entry is malformed");
    expect_nfa_reject("exception ranges", nfa_exc_ranges, "exception entry is malformed");
    expect_nfa_reject("exception order", nfa_exc_order, "do not come first");
    expect_nfa_reject("accept rule", nfa_acc_rule, "accept entry is malformed");
    expect_nfa_reject("accept order", nfa_acc_order, "out of rule order");
    expect_nfa_reject("table offset", nfa_table_offset, "points outside the catalog");
    expect_nfa_reject("header count", nfa_header_count, "header points outside the catalog");
    expect_nfa_reject("header maxbits", nfa_header_maxbits, "bit");
    expect_nfa_reject("rule group", nfa_rule_group, "bad group");
    expect_nfa_reject("flags", nfa_flags, "flags");
}
END_TEST

/* ---- factor groups and gated bit-NFA groups (version 3) ---- */

/* The table entry of the catalog's factor group (nfa_sample has one: its
 * two bounded bit-NFA rules have the factors "key" and "tok"). */
static uint32_t *factor_group(uint32_t *w)
{
    for (uint32_t g = 0; g < w[CAT_H_NGROUPS]; g++) {
        uint32_t *e = w + w[CAT_H_GROUPS] + g * CAT_GROUP_WORDS;
        if (e[CAT_G_FLAGS] & CAT_GF_FACTOR)
            return e;
    }
    ck_abort_msg("no factor group");
    return NULL;
}

/* Gated groups are packed up to BITNFA_GATED_BITS positions (each window
 * walks every rule of its group): by default nfa_sample's two gated rules
 * (over 330 and about 125 positions) get a group each, every group gated,
 * and the catalog finds what the one-group catalog finds. */
START_TEST(gated_groups_small)
{
    struct catalog *one = compile(nfa_sample, N_NFA_SAMPLE);
    struct rules_options opt = {.gate_bits = UINT32_MAX};
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(nfa_sample, N_NFA_SAMPLE, &opt, &res, &err), 0);
    struct catalog *two = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    ck_assert_uint_eq(catalog_nfa_count(one), 1);
    ck_assert_uint_eq(catalog_nfa_count(two), 2);
    uint32_t bits = 0;
    for (uint32_t i = 0; i < 2; i++) {
        struct catalog_nfa g;
        catalog_nfa(two, i, &g);
        ck_assert(g.flags & CAT_GF_GATED);
        ck_assert_uint_eq(g.n_rules, 1);
        bits += g.n_bits;
    }
    ck_assert_uint_gt(bits, BITNFA_GATED_BITS); /* they could not share one */
    const char *hay = "tok = \"x\" key: 0123456789abcdef0123456789abcdef bar foo_ key\n"
                      "0123456789abcdef0123456789abcdefg tok\"";
    struct scan_hits ha = {0}, hb = {0};
    ck_assert_int_eq(refscan_buffer(one, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &ha), 0);
    ck_assert_int_eq(refscan_buffer(two, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &hb), 0);
    ck_assert_uint_ge(ha.n, 4);
    ck_assert_uint_eq(ha.n, hb.n);
    ck_assert(memcmp(ha.v, hb.v, ha.n * sizeof(*ha.v)) == 0);
    scan_hits_finish(&ha);
    scan_hits_finish(&hb);
    catalog_destroy(one);
    catalog_destroy(two);
}
END_TEST

/* How many DFA groups of `cat` are unbounded (walked over every byte in
 * speculative segments on the GPU), and how many bit-NFA groups are
 * confirmed forward from their factors. */
static void count_unbounded(const struct catalog *cat, uint32_t *dfa, uint32_t *confirm)
{
    *dfa = *confirm = 0;
    for (uint32_t i = 0; i < catalog_group_count(cat); i++) {
        struct catalog_group g;
        catalog_group(cat, i, &g);
        *dfa += g.maxlen == CATALOG_UNBOUNDED;
    }
    for (uint32_t i = 0; i < catalog_nfa_count(cat); i++) {
        struct catalog_nfa n;
        catalog_nfa(cat, i, &n);
        *confirm += (n.flags & CAT_GF_CONFIRM) != 0;
    }
}

/* An unbounded rule whose factor is a caseless 3-letter word (21 bits) is
 * gated by default and confirmed forward from it (GATE_BITS_UNBOUNDED),
 * where a bounded rule with the same factor, and the unbounded one at an
 * explicit gate_bits of 24, stay in DFA groups; every catalog finds the
 * same (rule, end) pairs. */
START_TEST(weak_factor_unbounded_gated)
{
    static const char *pats[] = {"(?i)woi[[:alnum:]]{9,}", "(?i)ehu[0-9a-f]{4,12}x", "plain[0-9]+"};
    struct rule_src r[3];
    for (int i = 0; i < 3; i++)
        r[i] = (struct rule_src){
            .id = pats[i], .kind = RULE_REGEX, .pattern = pats[i], .len = strlen(pats[i])};
    struct catalog *cat[2];
    for (int k = 0; k < 2; k++) {
        struct rules_options opt = {.gate_bits = k == 0 ? 0 : 24};
        struct rules_result res;
        struct vks_error err;
        ck_assert_int_eq(rules_compile(r, 3, &opt, &res, &err), 0);
        ck_assert_uint_eq(res.n_rejects, 0);
        cat[k] = res.catalog;
        res.catalog = NULL;
        rules_result_finish(&res);
    }
    uint32_t dfa, confirm;
    count_unbounded(cat[0], &dfa, &confirm);
    ck_assert_uint_eq(dfa, 0);     /* no speculative pass left */
    ck_assert_uint_ge(confirm, 1); /* woi..., and plain[0-9]+ (24 bits) */
    for (uint32_t i = 0; i < catalog_group_count(cat[0]); i++) {
        struct catalog_group g;
        catalog_group(cat[0], i, &g);
        if (!(g.flags & CAT_GF_FACTOR))
            ck_assert_uint_eq(g.n_rules, 1); /* ehu...x: bounded, a DFA rule */
    }
    count_unbounded(cat[1], &dfa, &confirm);
    ck_assert_uint_eq(dfa, 1); /* woi... in a DFA group of its own */
    const char *hay = "WoI123456789 woiabcdefghijklmn-woi12345678 ehu0a1bx EHUffffx "
                      "plain0 plain12 woi\nwoiZZZZZZZZZZZZ";
    struct scan_hits h[2] = {{0}, {0}};
    for (int k = 0; k < 2; k++)
        ck_assert_int_eq(refscan_buffer(cat[k], (const uint8_t *)hay, strlen(hay), SCAN_ALL, &h[k]),
                         0);
    ck_assert_uint_ge(h[0].n, 12);
    ck_assert_uint_eq(h[0].n, h[1].n);
    ck_assert(memcmp(h[0].v, h[1].v, h[0].n * sizeof(*h[0].v)) == 0);
    for (int k = 0; k < 2; k++) {
        scan_hits_finish(&h[k]);
        catalog_destroy(cat[k]);
    }
}
END_TEST

START_TEST(factor_round_trip)
{
    struct catalog *a = compile(nfa_sample, N_NFA_SAMPLE);
    struct catalog_nfa n;
    catalog_nfa(a, 0, &n);
    ck_assert(n.flags & CAT_GF_GATED);
    ck_assert_uint_ne(n.maxlen, CATALOG_UNBOUNDED);
    size_t nw;
    uint32_t *w = (uint32_t *)catalog_words(a, &nw);
    uint32_t *f = factor_group(w);
    ck_assert_uint_eq(f[CAT_G_NRULES], 2); /* factors */
    ck_assert_uint_eq(f[CAT_G_MAXLEN], 3);
    uint32_t na = w[f[CAT_G_ACCIDX] + f[CAT_G_NSTATES] - f[CAT_G_FIRST_ACCEPT]];
    ck_assert_uint_ge(na, 2);
    for (uint32_t i = 0; i < na; i++)
        ck_assert_uint_eq(w[f[CAT_G_ACCEPTS] + i], 0u << 5 | 0u); /* group 0, mask 0 */
    /* the factor group reports nothing in a plain walk */
    struct catalog_group g;
    catalog_group(a, (uint32_t)((f - w - w[CAT_H_GROUPS]) / CAT_GROUP_WORDS), &g);
    ck_assert(g.flags & CAT_GF_FACTOR);
    catalog_destroy(a);
}
END_TEST

/* The compiler writes a bit-NFA group's exceptions as start edges, wide
 * ones, then narrow ones sorted by first source word, and the catalog
 * finds that sorted suffix (x_narrow, x_span) at load: the scanners test
 * only its entries near the live state words. Many rules, each with
 * several narrow exceptions (alternations, optional parts), make the
 * order visible; a bounded gated group also carries its lead. */
START_TEST(exceptions_sorted)
{
    static const char *pats[] = {"k(ab|cd)e?f[0-9]{1,3}x", "q(rs|tu)+v", "w(x|yz)(a|bc)?d",
                                 "gh(ij|kl)m{2,4}n",       "(op|qr)s*t", "uv(w|xy)z{0,3}!"};
    struct rule_src r[6];
    for (int i = 0; i < 6; i++)
        r[i] = (struct rule_src){
            .id = pats[i], .kind = RULE_REGEX, .pattern = pats[i], .len = strlen(pats[i])};
    struct rules_result res;
    struct vks_error err;
    struct rules_options opt = {.force_bitnfa = true};
    ck_assert_int_eq(rules_compile(r, 6, &opt, &res, &err), 0);
    ck_assert_uint_ge(catalog_nfa_count(res.catalog), 1);
    for (uint32_t k = 0; k < catalog_nfa_count(res.catalog); k++) {
        struct catalog_nfa n;
        catalog_nfa(res.catalog, k, &n);
        ck_assert_uint_lt(n.x_narrow, n.n_exc); /* a non-empty sorted suffix */
        ck_assert_uint_le(n.x_span, CAT_X_NARROW_SPAN);
        uint32_t sourced = 0, prev = 0;
        for (uint32_t x = 0; x < n.n_exc; x++) {
            const uint32_t *e = n.exc + (size_t)x * CAT_X_WORDS;
            if (e[CAT_X_NSRC] == 0) {
                ck_assert_uint_eq(sourced, 0); /* start edges first */
                continue;
            }
            sourced++;
            uint32_t lo = catalog_exc_lo(e, n.ranges), hi = catalog_exc_hi(e, n.ranges);
            if (x < n.x_narrow) { /* before the suffix: wide ones only */
                ck_assert_uint_gt(hi - lo, CAT_X_NARROW_SPAN);
                continue;
            }
            ck_assert_uint_le(hi - lo, n.x_span);
            ck_assert_uint_ge(lo, prev);
            prev = lo;
        }
        ck_assert_uint_ge(sourced, 6);
        if (n.flags & CAT_GF_GATED) /* bounded and gated: its lead */
            ck_assert_uint_gt(n.lookback, 0);
    }
    rules_result_finish(&res);
}
END_TEST

static void factor_flag_cleared(uint32_t *w, size_t n)
{
    (void)n;
    factor_group(w)[CAT_G_FLAGS] = 0;
}
static void factor_entry_mask(uint32_t *w, size_t n)
{
    (void)n;
    w[factor_group(w)[CAT_G_ACCEPTS]] |= CAT_ACCEPT_ALWAYS;
}
static void factor_entry_group(uint32_t *w, size_t n)
{
    (void)n;
    w[factor_group(w)[CAT_G_ACCEPTS]] = w[CAT_H_NNFAS] << 5;
}
static void factor_asserts(uint32_t *w, size_t n)
{
    (void)n;
    factor_group(w)[CAT_G_FLAGS] |= CAT_GF_ASSERTS;
}
static void factor_unbounded(uint32_t *w, size_t n)
{
    (void)n;
    factor_group(w)[CAT_G_MAXLEN] = CATALOG_UNBOUNDED;
}
static void gated_unbounded(uint32_t *w, size_t n)
{
    (void)n;
    nfa0(w)[CAT_N_MAXLEN] = CATALOG_UNBOUNDED;
}
static void gated_unnamed(uint32_t *w, size_t n)
{
    (void)n; /* the factor flag moved off the group: nothing gates nfa 0 */
    uint32_t *f = factor_group(w);
    uint32_t na = w[f[CAT_G_ACCIDX] + f[CAT_G_NSTATES] - f[CAT_G_FIRST_ACCEPT]];
    for (uint32_t i = 0; i < na; i++)
        w[f[CAT_G_ACCEPTS] + i] = 0 << 5 | CAT_ACCEPT_ALWAYS;
    f[CAT_G_FLAGS] = 0;
}
static void gated_flag_unknown(uint32_t *w, size_t n)
{
    (void)n;
    nfa0(w)[CAT_N_FLAGS] |= CAT_GF_FACTOR;
}

/* The version 3 flags are validated: a factor group's entries name bit-NFA
 * groups with mask 0, and a gated group is bounded and named by one. */
START_TEST(factor_damage_rejected)
{
    expect_nfa_reject("factor flag cleared", factor_flag_cleared, "names a rule");
    expect_nfa_reject("factor entry mask", factor_entry_mask, "factor group entry");
    expect_nfa_reject("factor entry group", factor_entry_group, "factor group entry");
    expect_nfa_reject("factor asserts", factor_asserts, "factor group has assertions");
    expect_nfa_reject("factor unbounded", factor_unbounded, "factor group has assertions");
    expect_nfa_reject("gated unbounded", gated_unbounded, "gated bit-NFA group");
    expect_nfa_reject("gated unnamed", gated_unnamed, "no factor group names it");
    expect_nfa_reject("gated flag", gated_flag_unknown, "flags");
}
END_TEST

/* Random words of the bit-NFA section overwritten (and re-sealed): the
 * catalog is rejected or, when the damage is benign, scans without
 * touching memory outside it (ASan runs say so). */
START_TEST(bitnfa_random_damage)
{
    struct catalog *a = compile(nfa_sample, N_NFA_SAMPLE);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    uint32_t *copy = malloc(n * 4);
    uint32_t lo = w[CAT_H_NFAS], hi = w[CAT_H_RULES];
    uint32_t *g = (uint32_t *)w + lo;
    uint32_t tab_lo = g[CAT_N_CLASSMAP], tab_hi = w[CAT_H_STRINGS];
    uint64_t x = 0x2545f4914f6cdd1dull;
    unsigned rejected = 0;
    for (int i = 0; i < 600; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(copy, w, n * 4);
        uint32_t at =
            i % 2 ? lo + (uint32_t)(x % (hi - lo)) : tab_lo + (uint32_t)(x % (tab_hi - tab_lo));
        copy[at] = (uint32_t)(x >> 32) % (i % 3 ? 0xffffffffu : 64u);
        reseal(copy, n);
        struct catalog *b = NULL;
        struct vks_error err;
        if (catalog_from_bytes(copy, n * 4, &b, &err) != 0) {
            ck_assert_ptr_null(b);
            rejected++;
            continue;
        }
        struct scan_hits h = {0};
        const char *hay = "key 0123456789abcdef0123456789abcdef tok\"";
        ck_assert_int_eq(refscan_buffer(b, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &h), 0);
        scan_hits_finish(&h);
        catalog_destroy(b);
    }
    ck_assert_uint_gt(rejected, 100);
    free(copy);
    catalog_destroy(a);
}
END_TEST

START_TEST(fingerprints_stable)
{
    struct catalog *a = compile(sample, N_SAMPLE);
    struct catalog *b = compile(sample, N_SAMPLE);
    size_t n, m;
    const uint32_t *wa = catalog_words(a, &n), *wb = catalog_words(b, &m);
    ck_assert_uint_eq(n, m);
    ck_assert(memcmp(wa, wb, n * 4) == 0);
    char ha[65], hb[65];
    hex_of(a, ha);
    hex_of(b, hb);
    ck_assert_str_eq(ha, hb);
    /* and whatever the number of compile threads */
    for (uint32_t threads = 1; threads <= 4; threads += 3) {
        struct rules_options opt = {.threads = threads, .gate_bits = UINT32_MAX};
        struct rules_result res;
        struct vks_error err;
        ck_assert_int_eq(rules_compile(sample, N_SAMPLE, &opt, &res, &err), 0);
        size_t k;
        const uint32_t *wc = catalog_words(res.catalog, &k);
        ck_assert_uint_eq(k, n);
        ck_assert(memcmp(wa, wc, n * 4) == 0);
        rules_result_finish(&res);
    }
    /* the same on every run and machine: this value changes only with
     * VKS_COMPILER_VERSION or the catalog format */
    uint8_t fp[CATALOG_FP_LEN];
    char hx[65];
    rules_fingerprint(&sample[1], fp);
    catalog_fingerprint_hex(fp, hx);
    ck_assert_str_eq(hx, "2bc6e90cccd84c7fd2142af532b01377079ffa0f71d842e70aded06917cdaa8d");
    catalog_destroy(a);
    catalog_destroy(b);
}
END_TEST

START_TEST(fingerprints_sensitive)
{
    struct catalog *base = compile(sample, N_SAMPLE);
    char h0[65];
    hex_of(base, h0);
    struct rule_src r[N_SAMPLE];
    char pat[N_SAMPLE][16], id[N_SAMPLE][8];
    int variants = 0;
    for (size_t i = 0; i < N_SAMPLE; i++) {
        for (int what = 0; what < 4; what++) {
            memcpy(r, sample, sizeof(sample));
            for (size_t k = 0; k < N_SAMPLE; k++) {
                memcpy(pat[k], sample[k].pattern, sample[k].len);
                pat[k][sample[k].len] = '\0';
                snprintf(id[k], sizeof(id[k]), "%s", sample[k].id);
                r[k].pattern = pat[k];
                r[k].id = id[k];
            }
            if (what == 0)
                pat[i][r[i].len - 1] = pat[i][r[i].len - 1] == '2' ? '3' : 'q';
            else if (what == 1)
                r[i].flags ^= RULE_F_CASELESS;
            else if (what == 2)
                r[i].flags ^= RULE_F_SINGLEMATCH;
            else
                id[i][0] = 'X';
            uint8_t f0[CATALOG_FP_LEN], f1[CATALOG_FP_LEN];
            rules_fingerprint(&sample[i], f0);
            rules_fingerprint(&r[i], f1);
            /* a rule's fingerprint covers pattern and flags, not its id */
            ck_assert_int_eq(memcmp(f0, f1, CATALOG_FP_LEN) == 0, what == 3);
            struct catalog *c = compile(r, N_SAMPLE);
            char h1[65];
            hex_of(c, h1);
            ck_assert_msg(strcmp(h0, h1) != 0, "rule %zu change %d kept the fingerprint", i, what);
            catalog_destroy(c);
            variants++;
        }
    }
    ck_assert_int_eq(variants, 4 * (int)N_SAMPLE);
    catalog_destroy(base);
}
END_TEST

static void expect_hits(const struct catalog *cat, const char *hay, enum scan_mode mode,
                        const char *want)
{
    struct scan_hits h = {0};
    ck_assert_int_eq(refscan_buffer(cat, (const uint8_t *)hay, strlen(hay), mode, &h), 0);
    char got[512] = "";
    for (size_t i = 0; i < h.n; i++) {
        struct catalog_rule r;
        catalog_rule(cat, h.v[i].rule, &r);
        size_t l = strlen(got);
        snprintf(got + l, sizeof(got) - l, "%s%.*s@%llu", i ? " " : "", (int)r.id_len, r.id,
                 (unsigned long long)h.v[i].end);
        if (mode == SCAN_COUNT) {
            l = strlen(got);
            snprintf(got + l, sizeof(got) - l, "x%u", h.v[i].count);
        }
    }
    ck_assert_str_eq(got, want);
    scan_hits_finish(&h);
}

START_TEST(report_modes)
{
    struct catalog *cat = compile(sample, N_SAMPLE);
    const char *hay = "foo bar fooo BAR z";
    expect_hits(cat, hay, SCAN_ALL, "once@2 word@3 lit@7 hex@7 word@11 word@12 lit@16 tail@18");
    expect_hits(cat, hay, SCAN_FIRST, "once@2 word@3 lit@7 hex@7 tail@18");
    expect_hits(cat, hay, SCAN_COUNT, "once@2x1 word@3x3 lit@7x2 hex@7x1 tail@18x1");
    expect_hits(cat, "", SCAN_ALL, "");
    catalog_destroy(cat);
    /* rules sharing an id count once per end offset, across groups too */
    const struct rule_src shared[] = {
        {.id = "1", .kind = RULE_REGEX, .pattern = "b", .len = 1},
        {.id = "1", .kind = RULE_REGEX, .pattern = "[a-c]+", .len = 6},
    };
    cat = compile(shared, 2);
    expect_hits(cat, "abcb", SCAN_ALL, "1@1 1@2 1@3 1@4");
    expect_hits(cat, "abcb", SCAN_COUNT, "1@1x4");
    expect_hits(cat, "abcb", SCAN_FIRST, "1@1");
    catalog_destroy(cat);
    cat = compile(sample, N_SAMPLE);
    expect_hits(cat, "z", SCAN_ALL, "tail@1");
    catalog_destroy(cat);
}
END_TEST

Suite *catalog_suite(void)
{
    Suite *s = suite_create("catalog");
    TCase *tc = tcase_create("packed");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, som_flag_and_finders);
    tcase_add_test(tc, truncated_rejected);
    tcase_add_test(tc, bit_flips_rejected);
    tcase_add_test(tc, structural_damage_rejected);
    tcase_add_test(tc, fingerprints_stable);
    tcase_add_test(tc, fingerprints_sensitive);
    tcase_add_test(tc, report_modes);
    tcase_add_test(tc, bitnfa_round_trip);
    tcase_add_test(tc, bitnfa_damage_rejected);
    tcase_add_test(tc, bitnfa_random_damage);
    tcase_add_test(tc, factor_round_trip);
    tcase_add_test(tc, gated_groups_small);
    tcase_add_test(tc, weak_factor_unbounded_gated);
    tcase_add_test(tc, exceptions_sorted);
    tcase_add_test(tc, factor_damage_rejected);
    suite_add_tcase(s, tc);
    return s;
}
