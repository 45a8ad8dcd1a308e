/*
 * The automata agree: for seeded random patterns and haystacks, a direct
 * NFA simulation, the unminimised DFA, the minimised DFA and the packed
 * catalog scanned by the reference scanner report the same (rule, end)
 * pairs. Segment scans (the GPU's walk) give the same hits as whole scans.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfa.h"
#include "nfa.h"
#include "parse.h"
#include "refscan.h"
#include "rules.h"

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

struct sbuf {
    char s[512];
    size_t n;
};

static void put(struct sbuf *b, const char *t)
{
    size_t l = strlen(t);
    if (b->n + l < sizeof(b->s)) {
        memcpy(b->s + b->n, t, l);
        b->n += l;
        b->s[b->n] = '\0';
    }
}

static void gen(struct sbuf *b, int depth);

static void gen_atom(struct sbuf *b, int depth)
{
    static const char *atoms[] = {"a",   "b",   "c",   "ab",          "[ab]",   "[^a]",
                                  "\\d", "\\w", "\\s", ".",           "[a-c1]", "\\x61",
                                  "\\n", "_",   "1",   "[[:alpha:]]", "A"};
    static const char *asserts[] = {"^", "$", "\\b", "\\B"};
    uint32_t r = rnd(20);
    if (r < 14 || depth > 2) {
        put(b, atoms[rnd(sizeof(atoms) / sizeof(atoms[0]))]);
    } else if (r < 16) {
        put(b, asserts[rnd(4)]);
    } else if (r < 17) {
        put(b, rnd(2) ? "(?i:" : "(?:");
        gen(b, depth + 1);
        put(b, ")");
        return;
    } else {
        put(b, "(");
        gen(b, depth + 1);
        put(b, "|");
        gen(b, depth + 1);
        put(b, ")");
    }
    static const char *quant[] = {"?", "*", "+", "{2}", "{1,3}", "{2,}", "*?", "{0,2}"};
    if (rnd(4) == 0 && b->s[b->n - 1] != '^' && b->s[b->n - 1] != '$' &&
        !(b->n >= 2 && b->s[b->n - 2] == '\\' && (b->s[b->n - 1] == 'b' || b->s[b->n - 1] == 'B')))
        put(b, quant[rnd(8)]);
}

static void gen(struct sbuf *b, int depth)
{
    uint32_t n = 1 + rnd(4);
    for (uint32_t i = 0; i < n; i++)
        gen_atom(b, depth);
}

static void gen_hay(uint8_t *h, size_t n)
{
    static const char alpha[] = "aabbcc1_ \nA.";
    for (size_t i = 0; i < n; i++)
        h[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
}

struct hitset {
    uint64_t v[4096];
    size_t n;
};

static int collect(void *ctx, uint32_t rule, uint64_t end)
{
    struct hitset *h = ctx;
    if (h->n < 4096)
        h->v[h->n++] = end << 16 | rule;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void sort_hits(struct hitset *h)
{
    qsort(h->v, h->n, sizeof(h->v[0]), cmp_u64);
}

static void expect_same(const char *what, struct hitset *a, struct hitset *b, const char **pats,
                        size_t np, const uint8_t *hay, size_t len)
{
    sort_hits(a);
    sort_hits(b);
    bool same = a->n == b->n && memcmp(a->v, b->v, a->n * sizeof(a->v[0])) == 0;
    if (!same) {
        fprintf(stderr, "MISMATCH (%s): seed state %llu\n", what, (unsigned long long)rng_state);
        for (size_t i = 0; i < np; i++)
            fprintf(stderr, "  pattern %zu: /%s/\n", i, pats[i]);
        fprintf(stderr, "  haystack: \"");
        for (size_t i = 0; i < len; i++)
            fprintf(stderr, hay[i] == '\n' ? "\\n" : "%c", hay[i]);
        fprintf(stderr, "\"\n  got %zu vs %zu hits\n", a->n, b->n);
    }
    ck_assert_msg(same, "%s disagree (%zu vs %zu hits)", what, a->n, b->n);
}

/* Parses and checks; returns false when the pattern is rejected. */
static bool parse_ok(const char *pat, struct parse_result *pr)
{
    struct rule_src r = {.id = "r", .kind = RULE_REGEX, .pattern = pat, .len = strlen(pat)};
    char msg[200];
    uint32_t pos;
    if (parse_rule(&r, pr, &pos, msg, sizeof(msg)) != 0 ||
        parse_check(pr->root, 100000, &pos, msg, sizeof(msg)) != 0) {
        parse_result_finish(pr);
        return false;
    }
    return true;
}

/* The bit-NFA engine against the NFA simulation: whole buffers, and
 * segments of 7 bytes starting maxlen-1 early (or whole walks when
 * unbounded), as the GPU scans them. */
/* Gated bit-NFA groups walked only around their factors' ends, over the
 * whole buffer and in segments of 7 bytes: the same hits as a full walk. */
static void gated_scans(const struct catalog *cat, const uint8_t *hay, size_t len,
                        const char **pats, size_t np, struct hitset *want)
{
    static struct hitset whole, seg;
    whole.n = seg.n = 0;
    for (size_t s = 0; s < len || s == 0; s += 7) {
        size_t t = s + 7 < len ? s + 7 : len;
        for (int pass = 0; pass < 2; pass++) {
            uint64_t lo = pass == 0 ? s : 0, hi = pass == 0 ? t : len;
            if (pass == 1 && s > 0)
                break;
            struct hitset *out = pass == 0 ? &seg : &whole;
            struct refscan_gate gate = {0};
            ck_assert_int_eq(refscan_factor_ends(cat, hay, len, lo, hi, &gate), 0);
            for (uint32_t g = 0; g < catalog_nfa_count(cat); g++) {
                struct catalog_nfa grp;
                catalog_nfa(cat, g, &grp);
                size_t begin = lo + 1 > grp.maxlen ? lo + 1 - grp.maxlen : 0;
                if (grp.flags & CAT_GF_GATED)
                    refscan_gated_range(cat, g, hay, len, lo, hi, &gate, collect, out);
                else if (grp.maxlen != CATALOG_UNBOUNDED || pass == 1)
                    refscan_nfa_range(cat, g, hay, len, begin, lo, hi, collect, out);
                else if (s == 0)
                    refscan_nfa_range(cat, g, hay, len, 0, 0, len, collect, out);
            }
            refscan_gate_finish(&gate);
        }
        if (len == 0)
            break;
    }
    expect_same("NFA simulation vs gated bit-NFA", want, &whole, pats, np, hay, len);
    expect_same("NFA simulation vs gated bit-NFA segments", want, &seg, pats, np, hay, len);
}

static void bit_nfa_scans(const struct catalog *cat, const uint8_t *hay, size_t len,
                          const char **pats, size_t np, struct hitset *want)
{
    static struct hitset whole, seg;
    whole.n = seg.n = 0;
    for (uint32_t g = 0; g < catalog_nfa_count(cat); g++) {
        struct catalog_nfa grp;
        catalog_nfa(cat, g, &grp);
        ck_assert_int_eq(refscan_nfa_range(cat, g, hay, len, 0, 0, len, collect, &whole), 0);
        if (grp.maxlen == CATALOG_UNBOUNDED) {
            refscan_nfa_range(cat, g, hay, len, 0, 0, len, collect, &seg);
            continue;
        }
        for (size_t s = 0; s < len; s += 7) {
            size_t t = s + 7 < len ? s + 7 : len;
            size_t begin = s + 1 > grp.maxlen ? s + 1 - grp.maxlen : 0;
            refscan_nfa_range(cat, g, hay, len, begin, s, t, collect, &seg);
        }
    }
    expect_same("NFA simulation vs bit-NFA", want, &whole, pats, np, hay, len);
    expect_same("NFA simulation vs bit-NFA segments", want, &seg, pats, np, hay, len);
    gated_scans(cat, hay, len, pats, np, want);
}

/* Two minimisations of one DFA (Moore's and Hopcroft's) must give the same
 * automaton: one partition, blocks numbered by first member. */
static void same_dfa(const struct dfa *a, const struct dfa *b)
{
    ck_assert_uint_eq(a->n_states, b->n_states);
    ck_assert_uint_eq(a->n_classes, b->n_classes);
    ck_assert_uint_eq(a->first_accept, b->first_accept);
    ck_assert_mem_eq(a->start, b->start, sizeof(a->start));
    ck_assert_mem_eq(a->trans, b->trans, (size_t)a->n_states * a->n_classes * sizeof(uint32_t));
    ck_assert_mem_eq(a->acc_first, b->acc_first, ((size_t)a->n_states + 1) * sizeof(uint32_t));
    ck_assert_uint_eq(a->n_acc, b->n_acc);
    if (a->n_acc)
        ck_assert_mem_eq(a->acc, b->acc, a->n_acc * sizeof(uint32_t));
}

static void check_group(const char **pats, size_t np, int rounds)
{
    struct parse_result pr[8];
    struct nfa_builder *b = nfa_builder_create();
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < np; i++) {
        ck_assert(parse_ok(pats[i], &pr[i]));
        ck_assert_int_eq(nfa_builder_add(b, pr[i].root, (uint32_t)i), 0);
    }
    struct nfa nfa;
    ck_assert_int_eq(nfa_builder_finish(b, &nfa), 0);
    nfa_builder_destroy(b);
    struct dfa raw, min, hop;
    ck_assert_int_eq(dfa_build(&nfa, 1u << 20, &raw), 0);
    ck_assert_int_eq(dfa_build(&nfa, 1u << 20, &min), 0);
    ck_assert_int_eq(dfa_build(&nfa, 1u << 20, &hop), 0);
    uint32_t moore = dfa_moore_rounds;
    dfa_moore_rounds = UINT32_MAX; /* Moore's rounds alone */
    ck_assert_int_eq(dfa_minimise(&min), 0);
    dfa_moore_rounds = 0; /* Hopcroft's algorithm alone */
    ck_assert_int_eq(dfa_minimise(&hop), 0);
    dfa_moore_rounds = moore;
    ck_assert_uint_le(min.n_states, raw.n_states);
    same_dfa(&min, &hop);
    if (min.minimal) { /* literals only: Moore's refinement finds nothing to merge */
        min.minimal = false;
        ck_assert_int_eq(dfa_minimise(&min), 0);
        ck_assert_uint_eq(min.n_states, raw.n_states);
    }

    struct rule_src src[8];
    char ids[8][4];
    for (size_t i = 0; i < np; i++) {
        snprintf(ids[i], sizeof(ids[i]), "r%zu", i);
        src[i] = (struct rule_src){
            .id = ids[i], .kind = RULE_REGEX, .pattern = pats[i], .len = strlen(pats[i])};
    }
    struct rules_result res;
    struct vks_error err;
    struct rules_options dopt = {.gate_bits = UINT32_MAX}; /* DFA groups: no gating */
    ck_assert_int_eq(rules_compile(src, np, &dopt, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    /* the same rules, every one on the bit-NFA engine */
    struct rules_result bit;
    struct rules_options bopt = {.force_bitnfa = true};
    ck_assert_int_eq(rules_compile(src, np, &bopt, &bit, &err), 0);
    ck_assert_uint_eq(bit.n_rejects, 0);
    /* no DFA group but the factor group of gated bit-NFA groups */
    for (uint32_t g = 0; g < catalog_group_count(bit.catalog); g++) {
        struct catalog_group grp;
        catalog_group(bit.catalog, g, &grp);
        ck_assert(grp.flags & CAT_GF_FACTOR);
    }
    ck_assert_uint_le(catalog_group_count(bit.catalog), 1);
    ck_assert_uint_ge(catalog_nfa_count(bit.catalog), 1);

    static struct hitset h_nfa, h_raw, h_min, h_cat, h_seg;
    uint8_t hay[300];
    for (int round = 0; round < rounds; round++) {
        size_t len = rnd(sizeof(hay));
        gen_hay(hay, len);
        h_nfa.n = h_raw.n = h_min.n = h_cat.n = h_seg.n = 0;
        ck_assert_int_eq(nfa_simulate(&nfa, hay, len, collect, &h_nfa), 0);
        ck_assert_int_eq(dfa_scan(&raw, hay, len, collect, &h_raw), 0);
        ck_assert_int_eq(dfa_scan(&min, hay, len, collect, &h_min), 0);
        expect_same("NFA simulation vs DFA", &h_nfa, &h_raw, pats, np, hay, len);
        expect_same("DFA vs minimised DFA", &h_raw, &h_min, pats, np, hay, len);
        /* the catalog reports catalog rule indexes: same as input order here */
        for (uint32_t g = 0; g < catalog_group_count(res.catalog); g++)
            refscan_group_range(res.catalog, g, hay, len, 0, 0, len, collect, &h_cat);
        expect_same("NFA vs packed catalog", &h_nfa, &h_cat, pats, np, hay, len);
        /* segments of 7 bytes starting maxlen-1 early, as the GPU scans them */
        for (uint32_t g = 0; g < catalog_group_count(res.catalog); g++) {
            struct catalog_group grp;
            catalog_group(res.catalog, g, &grp);
            if (grp.maxlen == CATALOG_UNBOUNDED) {
                refscan_group_range(res.catalog, g, hay, len, 0, 0, len, collect, &h_seg);
                continue;
            }
            for (size_t s = 0; s < len; s += 7) {
                size_t t = s + 7 < len ? s + 7 : len;
                size_t begin = s + 1 > grp.maxlen ? s + 1 - grp.maxlen : 0;
                refscan_group_range(res.catalog, g, hay, len, begin, s, t, collect, &h_seg);
            }
        }
        expect_same("whole scan vs segment scans", &h_cat, &h_seg, pats, np, hay, len);
        bit_nfa_scans(bit.catalog, hay, len, pats, np, &h_nfa);
    }
    rules_result_finish(&bit);
    rules_result_finish(&res);
    dfa_finish(&raw);
    dfa_finish(&min);
    dfa_finish(&hop);
    nfa_finish(&nfa);
    for (size_t i = 0; i < np; i++)
        parse_result_finish(&pr[i]);
}

START_TEST(random_single_patterns)
{
    rng_state = 0x9e3779b97f4a7c15ULL;
    int tested = 0;
    for (int i = 0; i < 600; i++) {
        struct sbuf b = {.n = 0};
        gen(&b, 0);
        struct parse_result pr;
        if (!parse_ok(b.s, &pr))
            continue;
        parse_result_finish(&pr);
        const char *p = b.s;
        check_group(&p, 1, 8);
        tested++;
    }
    ck_assert_int_gt(tested, 300);
}
END_TEST

START_TEST(random_groups)
{
    rng_state = 0x2545f4914f6cdd1dULL;
    for (int i = 0; i < 150; i++) {
        struct sbuf b[5];
        const char *p[5];
        size_t n = 0;
        while (n < 5) {
            b[n].n = 0;
            gen(&b[n], 0);
            struct parse_result pr;
            if (!parse_ok(b[n].s, &pr))
                continue;
            parse_result_finish(&pr);
            p[n] = b[n].s;
            n++;
        }
        check_group(p, n, 6);
    }
}
END_TEST

START_TEST(fixed_cases)
{
    rng_state = 77;
    static const char *cases[][3] = {
        {"foo$", "\\bbar\\b", "(?m)^baz$"},
        {"a\\Bb", "\\ba+", "c\\b"},
        {"(?i)abc", "ABC", "[[:digit:]]{2,3}"},
        {"a.c", "(?s)a.c", "a\\nc"},
        {"x{3,}", "(x|y)+z", "^x"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_group(cases[i], 3, 40);
}
END_TEST

/* Subset states of more than 48 NFA positions (each `.*` keeps the
 * positions before it alive), which dfa.c reads back from its stamps in
 * state order instead of sorting: the DFA and the minimised one still scan
 * as the NFA simulates, and the matches are long enough to need them. */
START_TEST(long_closures)
{
    static const char *const cls[] = {"[ab1]", "[bc_]", "[ac ]", "[abc]", "[1_A]"};
    char p1[400] = "(?s)", p2[400] = "(?s)";
    for (int i = 0; i < 36; i++) {
        strcat(p1, i ? ".*" : "");
        strcat(p1, cls[i % 5]);
        strcat(p2, i ? "[^\\n]*" : "");
        strcat(p2, cls[(i * 3 + 1) % 5]);
    }
    const char *pats[] = {p1, p2};
    rng_state = 4711;
    check_group(pats, 2, 60);
}
END_TEST

/* The literal shortcut: 2,000 literals sharing prefixes build a DFA no
 * larger than their trie, and scan like a direct simulation. */
START_TEST(literal_trie_size)
{
    rng_state = 12345;
    static char lits[2000][17];
    struct parse_result pr[2000];
    struct nfa_builder *b = nfa_builder_create();
    uint64_t total = 0;
    for (int i = 0; i < 2000; i++) {
        size_t n = 8 + rnd(9);
        for (size_t k = 0; k < n; k++)
            lits[i][k] = (char)('a' + rnd(4));
        lits[i][n] = '\0';
        total += n;
        struct rule_src r = {.id = "x", .kind = RULE_LITERAL, .pattern = lits[i], .len = n};
        char msg[200];
        uint32_t pos;
        ck_assert_int_eq(parse_rule(&r, &pr[i], &pos, msg, sizeof(msg)), 0);
        ck_assert_int_eq(nfa_builder_add(b, pr[i].root, (uint32_t)i), 0);
    }
    struct nfa nfa;
    ck_assert_int_eq(nfa_builder_finish(b, &nfa), 0);
    nfa_builder_destroy(b);
    struct dfa d;
    ck_assert_int_eq(dfa_build(&nfa, 1u << 20, &d), 0);
    /* trie nodes + one final state per rule bound the NFA; the DFA is below */
    ck_assert_uint_le(d.n_states, total + 1);
    ck_assert_uint_eq(d.n_classes, 5); /* a b c d, everything else */
    static struct hitset h1, h2;
    uint8_t hay[2000];
    for (size_t i = 0; i < sizeof(hay); i++)
        hay[i] = (uint8_t)('a' + rnd(4));
    h1.n = h2.n = 0;
    nfa_simulate(&nfa, hay, sizeof(hay), collect, &h1);
    dfa_scan(&d, hay, sizeof(hay), collect, &h2);
    const char *p[1] = {"<2000 literals>"};
    expect_same("literal NFA vs DFA", &h1, &h2, p, 1, hay, sizeof(hay));
    ck_assert_uint_gt(h1.n, 0);
    dfa_finish(&d);
    nfa_finish(&nfa);
    for (int i = 0; i < 2000; i++)
        parse_result_finish(&pr[i]);
}
END_TEST

/* Builds the group NFA of `n` rules; the parse results go to pr. */
static void build_nfa(const struct rule_src *src, size_t n, struct parse_result *pr,
                      struct nfa *nfa)
{
    struct nfa_builder *b = nfa_builder_create();
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < n; i++) {
        char msg[200];
        uint32_t pos;
        ck_assert_int_eq(parse_rule(&src[i], &pr[i], &pos, msg, sizeof(msg)), 0);
        ck_assert_int_eq(nfa_builder_add(b, pr[i].root, (uint32_t)i), 0);
    }
    ck_assert_int_eq(nfa_builder_finish(b, nfa), 0);
    nfa_builder_destroy(b);
}

/*
 * Literal-only groups skip minimisation (dfa.h: their DFA is minimal as
 * built). On random literal sets over small alphabets, where prefixes and
 * suffixes overlap the most: exact letters, caseless letters with digits
 * and spaces, binary bytes as \xHH, and caseless mixed with exact
 * non-letters, the DFA is marked minimal, Moore's refinement cannot shrink
 * it, and it scans like the NFA. Exact and caseless letters mixed in one
 * group are not marked (their sets overlap), and neither is a class.
 */
START_TEST(literal_groups_minimal)
{
    rng_state = 4242;
    static const char *const alphabets[] = {"abc", "aB1 ", "\\x00\\x7f\\x80\\xff", "aB-"};
    static char pats[60][80];
    struct rule_src src[61];
    struct parse_result pr[61];
    for (int kind = 0; kind < 6; kind++) {
        for (int round = 0; round < 8; round++) {
            size_t n = 5 + rnd(55);
            for (size_t i = 0; i < n; i++) {
                size_t len = 1 + rnd(6), at = 0;
                bool bin = kind == 2;
                for (size_t k = 0; k < len; k++) {
                    if (bin) {
                        memcpy(pats[i] + at, alphabets[2] + 4 * rnd(4), 4);
                        at += 4;
                    } else {
                        const char *a = alphabets[kind >= 3 ? 3 : kind];
                        pats[i][at++] = a[rnd((uint32_t)strlen(a))];
                    }
                }
                pats[i][at] = '\0';
                /* kind 3: caseless letters, exact '-'; 4: one exact letter
                 * rule among caseless ones; 5: a class */
                bool caseless = kind == 1 || kind == 3 || (kind == 4 && i > 0);
                src[i] = (struct rule_src){.id = "x",
                                           .kind = bin ? RULE_REGEX : RULE_LITERAL,
                                           .pattern = pats[i],
                                           .len = at,
                                           .flags = caseless ? RULE_F_CASELESS : 0};
            }
            if (kind == 4)
                src[0] =
                    (struct rule_src){.id = "x", .kind = RULE_LITERAL, .pattern = "a", .len = 1};
            if (kind == 5)
                src[n++] =
                    (struct rule_src){.id = "x", .kind = RULE_REGEX, .pattern = "a[bc]", .len = 5};
            struct nfa nfa;
            build_nfa(src, n, pr, &nfa);
            struct dfa d, m;
            ck_assert_int_eq(dfa_build(&nfa, 1u << 20, &d), 0);
            ck_assert_int_eq(dfa_build(&nfa, 1u << 20, &m), 0);
            ck_assert_int_eq(d.minimal, kind < 4);
            m.minimal = false;
            ck_assert_int_eq(dfa_minimise(&m), 0);
            if (kind < 4)
                ck_assert_uint_eq(m.n_states, d.n_states);
            static struct hitset h1, h2, h3;
            uint8_t hay[600];
            static const uint8_t bytes[] = {'a', 'b', 'c',  'A',  'B',  'C', '1',
                                            ' ', '-', 0x00, 0x7f, 0x80, 0xff};
            for (size_t i = 0; i < sizeof(hay); i++)
                hay[i] = bytes[rnd(sizeof(bytes))];
            h1.n = h2.n = h3.n = 0;
            ck_assert_int_eq(nfa_simulate(&nfa, hay, sizeof(hay), collect, &h1), 0);
            ck_assert_int_eq(dfa_scan(&d, hay, sizeof(hay), collect, &h2), 0);
            ck_assert_int_eq(dfa_scan(&m, hay, sizeof(hay), collect, &h3), 0);
            const char *p[1] = {"<random literals>"};
            expect_same("literal NFA vs DFA", &h1, &h2, p, 1, hay, sizeof(hay));
            expect_same("literal DFA vs Moore-minimised DFA", &h2, &h3, p, 1, hay, sizeof(hay));
            ck_assert_uint_gt(h1.n, 0);
            dfa_finish(&d);
            dfa_finish(&m);
            nfa_finish(&nfa);
            for (size_t i = 0; i < n; i++)
                parse_result_finish(&pr[i]);
        }
    }
}
END_TEST

/* dfa_minimise stops with -ECANCELED when the compile is cancelled (the
 * daemon's compile deadline), leaving the DFA as it was. */
START_TEST(minimise_cancelled)
{
    struct rule_src src = {
        .id = "x", .kind = RULE_REGEX, .pattern = "a[ab]{6}c|b[ab]{6}c", .len = 19};
    struct parse_result pr;
    struct nfa nfa;
    build_nfa(&src, 1, &pr, &nfa);
    struct dfa d;
    ck_assert_int_eq(dfa_build(&nfa, 1u << 16, &d), 0);
    ck_assert(!d.minimal);
    uint32_t before = d.n_states;
    static volatile int cancel = 1;
    dfa_cancel = &cancel;
    ck_assert_int_eq(dfa_minimise(&d), -ECANCELED);
    ck_assert_uint_eq(d.n_states, before);
    cancel = 0;
    ck_assert_int_eq(dfa_minimise(&d), 0);
    dfa_cancel = NULL;
    ck_assert_uint_lt(d.n_states, before);
    dfa_finish(&d);
    nfa_finish(&nfa);
    parse_result_finish(&pr);
}
END_TEST

/* The bit-NFA's limits: a lone rule up to 65536 positions gets a group of
 * its own; past that, or with a quadratic number of follow edges, it is
 * rejected with its reason, quickly, and the other rules still compile. */
START_TEST(bitnfa_limits)
{
    static const char *const pats[] = {"a.{0,5000}b", "y(ab|cd){0,20000}x", "x([ab]?){30000}y",
                                       "ok"};
    struct rule_src src[4];
    for (int i = 0; i < 4; i++)
        src[i] = (struct rule_src){
            .id = pats[i], .kind = RULE_REGEX, .pattern = pats[i], .len = strlen(pats[i])};
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(src, 4, NULL, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 2);
    ck_assert_uint_eq(res.rejects[0].index, 1);
    ck_assert_ptr_nonnull(strstr(res.rejects[0].msg, "over the limit of 65536"));
    ck_assert_uint_eq(res.rejects[1].index, 2);
    ck_assert_ptr_nonnull(strstr(res.rejects[1].msg, "follow edges"));
    ck_assert_uint_eq(catalog_nfa_count(res.catalog), 1);
    struct catalog_nfa g;
    catalog_nfa(res.catalog, 0, &g);
    ck_assert_uint_eq(g.n_bits, 5002);
    ck_assert_uint_eq(g.maxlen, 5002);
    rules_result_finish(&res);
}
END_TEST

START_TEST(state_budget_enforced)
{
    /* (a|b)*a(a|b){12} needs 2^13 states: over a budget of 4096 */
    const char *pat = "[ab]*a[ab]{12}";
    struct parse_result pr;
    ck_assert(parse_ok(pat, &pr));
    struct nfa_builder *b = nfa_builder_create();
    ck_assert_int_eq(nfa_builder_add(b, pr.root, 0), 0);
    struct nfa nfa;
    ck_assert_int_eq(nfa_builder_finish(b, &nfa), 0);
    nfa_builder_destroy(b);
    struct dfa d;
    ck_assert_int_eq(dfa_build(&nfa, 4096, &d), -E2BIG);
    ck_assert_int_eq(dfa_build(&nfa, 1u << 16, &d), 0);
    ck_assert_uint_ge(d.n_states, 8192);
    dfa_finish(&d);
    nfa_finish(&nfa);
    parse_result_finish(&pr);
}
END_TEST

Suite *dfa_suite(void)
{
    Suite *s = suite_create("dfa");
    TCase *tc = tcase_create("equivalence");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, random_single_patterns);
    tcase_add_test(tc, random_groups);
    tcase_add_test(tc, fixed_cases);
    tcase_add_test(tc, long_closures);
    tcase_add_test(tc, literal_trie_size);
    tcase_add_test(tc, literal_groups_minimal);
    tcase_add_test(tc, minimise_cancelled);
    tcase_add_test(tc, state_budget_enforced);
    tcase_add_test(tc, bitnfa_limits);
    suite_add_tcase(s, tc);
    return s;
}
