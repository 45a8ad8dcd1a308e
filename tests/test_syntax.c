/*
 * Regex syntax against Hyperscan: escapes, classes, groups, flags and
 * quantifiers, one rule at a time. For every pattern both engines must give
 * the same verdict (accept or reject), and when both accept, the same end
 * offsets over three haystacks: all 256 byte values in order, a haystack
 * written for the case, and strings drawn from our own parse tree (so a
 * wrong tree shows up as hits Hyperscan does not report).
 *
 * Two sources of patterns: a table of hand-picked cases (each construct of
 * docs/rules.md and the PCRE corner cases around it), and seeded random
 * patterns built from the same pieces. Known, documented disagreements are
 * allowed by reason (see `allowed`); anything else fails with a reproducer.
 *
 * Knobs: VKS_SYNTAX_SEED (default 1), VKS_SYNTAX_CASES (random patterns,
 * default 1500), VKS_SYNTAX_VERBOSE (print every allowed disagreement).
 */
#include <check.h>
#include <errno.h>
#include <hs.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"
#include "refscan.h"
#include "rules.h"

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

/* A growable byte string, kept NUL-terminated. */
struct buf {
    char *p;
    size_t n, cap;
};

static void buf_putn(struct buf *b, const void *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        ck_assert(b->p != NULL);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void buf_puts(struct buf *b, const char *s)
{
    buf_putn(b, s, strlen(s));
}

static void buf_putc(struct buf *b, char c)
{
    buf_putn(b, &c, 1);
}

static void print_bytes(const char *what, const void *p, size_t n)
{
    const unsigned char *s = p;
    fprintf(stderr, "%s \"", what);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' || s[i] == '"')
            fprintf(stderr, "\\%c", s[i]);
        else if (s[i] >= 0x20 && s[i] < 0x7f)
            fputc(s[i], stderr);
        else
            fprintf(stderr, "\\x%02x", s[i]);
    }
    fprintf(stderr, "\"\n");
}

/* ------------------------------------------------------------------------ */
/* Haystacks drawn from a parse tree.                                       */

static void sample(const struct node *n, struct rng *r, struct buf *out, int depth)
{
    if (out->n > 4096 || depth > 60)
        return;
    switch (n->type) {
    case N_SET: {
        unsigned pick = rng_below(r, 256), c;
        for (c = 0; c < 256; c++)
            if (byteset_has(&n->u.set, (pick + c) & 255))
                break;
        if (c < 256)
            buf_putc(out, (char)((pick + c) & 255));
        return;
    }
    case N_ASSERT:
        return;
    case N_CAT:
        for (uint32_t k = 0; k < n->u.list.n; k++)
            sample(n->u.list.kids[k], r, out, depth + 1);
        return;
    case N_ALT:
        if (n->u.list.n > 0)
            sample(n->u.list.kids[rng_below(r, n->u.list.n)], r, out, depth + 1);
        return;
    case N_REPEAT: {
        uint32_t k = n->u.rep.min;
        if (k < 64) {
            uint32_t extra = rng_below(r, 3);
            if (n->u.rep.max == REPEAT_INF || k + extra <= n->u.rep.max)
                k += extra;
        }
        for (uint32_t j = 0; j < k && out->n <= 4096; j++)
            sample(n->u.rep.kid, r, out, depth + 1);
        return;
    }
    }
}

/* ------------------------------------------------------------------------ */
/* One pattern through both engines.                                        */

struct ends {
    uint64_t *v;
    size_t n, cap;
};

static void ends_push(struct ends *e, uint64_t x)
{
    if (e->n == e->cap) {
        e->cap = e->cap ? e->cap * 2 : 64;
        e->v = realloc(e->v, e->cap * sizeof(*e->v));
        ck_assert(e->v != NULL);
    }
    e->v[e->n++] = x;
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void ends_norm(struct ends *e)
{
    if (e->n == 0)
        return;
    qsort(e->v, e->n, sizeof(*e->v), u64_cmp);
    size_t m = 1;
    for (size_t i = 1; i < e->n; i++)
        if (e->v[i] != e->v[m - 1])
            e->v[m++] = e->v[i];
    e->n = m;
}

static int on_hs(unsigned id, unsigned long long from, unsigned long long to, unsigned fl,
                 void *ctx)
{
    (void)id;
    (void)from;
    (void)fl;
    ends_push(ctx, to);
    return 0;
}

static unsigned hs_flags_of(uint32_t f)
{
    unsigned h = 0;
    if (f & RULE_F_CASELESS)
        h |= HS_FLAG_CASELESS;
    if (f & RULE_F_DOTALL)
        h |= HS_FLAG_DOTALL;
    if (f & RULE_F_MULTILINE)
        h |= HS_FLAG_MULTILINE;
    return h;
}

struct stats {
    unsigned both, neither, hs_only, ours_only, allowed;
    unsigned failures;
};

/*
 * Disagreements on the verdict that docs/rules.md documents: we reject pure
 * assertions (Hyperscan accepts some), Unicode properties and rules over the
 * state budget; Hyperscan refuses (?x) comments that run to the end of the
 * pattern, patterns that can never match (an empty class), embedded anchors
 * under multi-line mode, repeats over its resource limits, and a byte over
 * 0x7f escaped in a class or quoted with \Q...\E (a signed-char slip).
 */
static bool allowed(bool hs_ok, const char *hs_msg, const char *our_msg)
{
    if (hs_ok)
        return strstr(our_msg, "Unicode property") != NULL ||
               strstr(our_msg, "empty string") != NULL || strstr(our_msg, "DFA states") != NULL ||
               strstr(our_msg, "positions") != NULL;
    return strstr(hs_msg, "Unterminated comment") != NULL ||
           strstr(hs_msg, "can never match") != NULL || strstr(hs_msg, "too large") != NULL ||
           /* Hyperscan reads a byte over 0x7f after '\' in a class or
            * inside \Q...\E as a negative char; we reject \x{100} too */
           strstr(hs_msg, "greater than \\xFF") != NULL ||
           strstr(hs_msg, "Embedded end anchors") != NULL ||
           strstr(hs_msg, "Embedded start anchors") != NULL ||
           strstr(hs_msg, "Embedded anchors") != NULL || strstr(hs_msg, "Resource limit") != NULL;
}

/*
 * Compares one pattern. `hay` (may be NULL) is the case's own haystack.
 * Returns 1 if both engines accepted it, 0 otherwise; a disagreement is
 * counted in st->failures and printed.
 */
static int compare(const char *pat, uint32_t flags, const char *hay, size_t hay_len, uint64_t seed,
                   struct stats *st)
{
    size_t len = strlen(pat);
    struct rule_src src = {
        .id = "t", .kind = RULE_REGEX, .pattern = pat, .len = len, .flags = flags};
    struct rules_options opt = {.max_states = 20000, .threads = 1};
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(&src, 1, &opt, &res, &err), 0);
    bool ours = res.n_rejects == 0;
    char our_msg[256] = "";
    if (!ours)
        snprintf(our_msg, sizeof(our_msg), "%s (at %u)", res.rejects[0].msg, res.rejects[0].pos);

    hs_database_t *db = NULL;
    hs_compile_error_t *ce = NULL;
    char hs_msg[256] = "";
    bool hs_ok = hs_compile(pat, hs_flags_of(flags), HS_MODE_BLOCK, NULL, &db, &ce) == HS_SUCCESS;
    if (!hs_ok) {
        snprintf(hs_msg, sizeof(hs_msg), "%s", ce->message);
        hs_free_compile_error(ce);
    }

    int both = 0;
    if (ours != hs_ok) {
        if (allowed(hs_ok, hs_msg, our_msg)) {
            st->allowed++;
            if (getenv("VKS_SYNTAX_VERBOSE") != NULL)
                fprintf(stderr, "allowed: ours: %s | Hyperscan: %s | %s\n",
                        ours ? "accepts" : our_msg, hs_ok ? "accepts" : hs_msg, pat);
        } else {
            st->failures++;
            print_bytes("verdicts differ for pattern", pat, len);
            fprintf(stderr, "  flags %u, seed %llu: ours %s%s, Hyperscan %s%s\n", flags,
                    (unsigned long long)seed, ours ? "accepts" : "rejects: ", our_msg,
                    hs_ok ? "accepts" : "rejects: ", hs_msg);
        }
        if (ours)
            st->ours_only++;
        else
            st->hs_only++;
    } else if (!ours) {
        st->neither++;
    } else {
        both = 1;
        st->both++;
        /* haystacks: every byte, the case's own, samples from our tree */
        struct buf h = {0};
        for (int c = 0; c < 256; c++)
            buf_putc(&h, (char)c);
        buf_puts(&h, "\n");
        if (hay != NULL)
            buf_putn(&h, hay, hay_len);
        struct parse_result pr;
        char msg[256];
        uint32_t pos;
        ck_assert_int_eq(parse_rule(&src, &pr, &pos, msg, sizeof(msg)), 0);
        struct rng r = {seed};
        for (int k = 0; k < 4; k++) {
            buf_puts(&h, k & 1 ? "\n" : " ");
            sample(pr.root, &r, &h, 0);
        }
        parse_result_finish(&pr);

        struct ends a = {0}, b = {0};
        struct scan_hits hits = {0};
        ck_assert_int_eq(refscan_buffer(res.catalog, (const uint8_t *)h.p, h.n, SCAN_ALL, &hits),
                         0);
        for (size_t i = 0; i < hits.n; i++)
            ends_push(&a, hits.v[i].end);
        scan_hits_finish(&hits);
        hs_scratch_t *scratch = NULL;
        ck_assert_int_eq(hs_alloc_scratch(db, &scratch), HS_SUCCESS);
        ck_assert_int_eq(hs_scan(db, h.p, (unsigned)h.n, 0, scratch, on_hs, &b), HS_SUCCESS);
        hs_free_scratch(scratch);
        ends_norm(&a);
        ends_norm(&b);
        bool same = a.n == b.n && (a.n == 0 || memcmp(a.v, b.v, a.n * sizeof(*a.v)) == 0);
        if (!same) {
            st->failures++;
            print_bytes("hits differ for pattern", pat, len);
            fprintf(stderr, "  flags %u, seed %llu\n", flags, (unsigned long long)seed);
            print_bytes("  haystack", h.p, h.n);
            fprintf(stderr, "  ours:");
            for (size_t i = 0; i < a.n && i < 40; i++)
                fprintf(stderr, " %llu", (unsigned long long)a.v[i]);
            fprintf(stderr, "\n  Hyperscan:");
            for (size_t i = 0; i < b.n && i < 40; i++)
                fprintf(stderr, " %llu", (unsigned long long)b.v[i]);
            fprintf(stderr, "\n");
        }
        free(a.v);
        free(b.v);
        free(h.p);
    }
    if (db != NULL)
        hs_free_database(db);
    rules_result_finish(&res);
    return both;
}

/* ------------------------------------------------------------------------ */
/* Hand-picked cases.                                                       */

enum want {
    W_BOTH,   /* both accept; hits compared */
    W_NONE,   /* both reject */
    W_EITHER, /* whatever Hyperscan does, we must agree (or be allowed) */
};

struct tcase {
    const char *pat;
    uint32_t flags;
    const char *hay; /* NULL: only the generic haystacks */
    enum want want;
};

#define I RULE_F_CASELESS
#define S RULE_F_DOTALL
#define M RULE_F_MULTILINE

static const struct tcase cases[] = {
    /* \v \V \h \H, in and out of classes */
    {"a\\vb", 0,
     "a\nb a\x0b"
     "b a\x0c"
     "b a\rb a\x85"
     "b a b a\tb",
     W_BOTH},
    {"a\\Vb", 0,
     "a\nb a\x0b"
     "b axb a\x85"
     "b",
     W_BOTH},
    {"a[\\v]b", 0,
     "a\nb a\x0b"
     "b a\x85"
     "b",
     W_BOTH},
    {"a[^\\v]b", 0,
     "a\nb axb a\x85"
     "b",
     W_BOTH},
    {"a[\\Vx]b", 0,
     "a\nb axb a\x85"
     "b",
     W_BOTH},
    {"a\\hb", 0,
     "a b a\tb a\xa0"
     "b a\nb",
     W_BOTH},
    {"a\\Hb", 0,
     "a b a\tb a\xa0"
     "b axb",
     W_BOTH},
    {"a[\\h]b", 0,
     "a b a\xa0"
     "b",
     W_BOTH},
    {"a[\\H]b", 0,
     "a b a\xa0"
     "b a-b",
     W_BOTH},
    {"[\\h-z]", 0, "-z", W_BOTH},
    {"x\\v+y", I, "X\r\nY", W_BOTH},
    /* octal and digit escapes */
    {"\\101", 0, "ABA", W_BOTH},
    {"\\101\\102", I, "ab", W_BOTH},
    {"[\\101-\\103]", 0, "ABCD", W_BOTH},
    {"\\0", 0, NULL, W_BOTH},
    {"\\00", 0, NULL, W_BOTH},
    {"\\000", 0, NULL, W_BOTH},
    {"\\0000", 0,
     "\x00"
     "0",
     W_BOTH},
    {"\\012x", 0, "\nx", W_BOTH},
    {"\\0123", 0, "\n3", W_BOTH},
    {"\\08", 0, "8", W_BOTH},
    {"\\10", 0, "\x08", W_BOTH},
    {"\\18", 0,
     "\x01"
     "8",
     W_BOTH},
    {"\\11", 0, "\t", W_BOTH},
    {"\\40", 0, " ", W_BOTH},
    {"\\377", 0, NULL, W_BOTH},
    {"\\1011", 0, "A1", W_BOTH},
    {"\\8", 0, "8", W_BOTH},
    {"(a)(b)(c)(d)(e)(f)(g)(h)(i)\\8", 0, "abcdefghi8", W_BOTH},
    {"(a)(b)(c)(d)(e)(f)(g)(h)(i)\\9", 0, "abcdefghi9", W_BOTH},
    {"\\9", 0, "9", W_BOTH},
    {"\\81", 0, "81", W_BOTH},
    {"\\91", 0, "91", W_BOTH},
    {"[\\1]", 0, NULL, W_BOTH},
    {"[\\18]", 0,
     "\x01"
     "8",
     W_BOTH},
    {"[\\08]", 0, NULL, W_BOTH},
    {"[\\9]", 0, NULL, W_BOTH},
    {"[\\0]", 0, NULL, W_BOTH},
    {"[\\101]", 0, NULL, W_BOTH},
    {"(a)(b)(c)(d)(e)(f)(g)(h)(i)\\10", 0, "abcdefghi\x08", W_BOTH},
    {"\\10(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)", 0,
     "\x08"
     "abcdefghij",
     W_BOTH},
    {"(a)(b)(c)(d)(e)(f)(g)(h)(i)(?:j)\\10", 0, "abcdefghij\x08", W_BOTH},
    {"(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)\\10", 0, NULL, W_NONE},
    {"(?<n1>a)(b)(c)(d)(e)(f)(g)(h)(i)(j)\\10", 0, NULL, W_NONE},
    {"\\1", 0, NULL, W_NONE},
    {"(a)\\1", 0, NULL, W_NONE},
    {"\\7", 0, NULL, W_NONE},
    {"\\400", 0, NULL, W_NONE},
    {"[\\400]", 0, NULL, W_NONE},
    {"\\o{101}", 0, "A", W_BOTH},
    {"[\\o{101}-\\o{103}]", 0, "ABC", W_BOTH},
    {"\\o{}", 0, NULL, W_NONE},
    {"\\o{400}", 0, NULL, W_NONE},
    {"\\o101", 0, NULL, W_NONE},
    /* hex, control and other byte escapes */
    {"\\x41", 0, "A", W_BOTH},
    {"\\x4", 0, NULL, W_BOTH},
    {"\\x4g", 0, "\x04g", W_BOTH},
    {"a\\x", 0, NULL, W_BOTH},
    {"\\xg", 0, NULL, W_BOTH},
    {"\\x{41}", 0, "A", W_BOTH},
    {"\\x{0041}", 0, "A", W_BOTH},
    {"\\x{000000ff}", 0, NULL, W_BOTH},
    {"\\x{}", 0, NULL, W_NONE},
    {"\\x{100}", 0, NULL, W_NONE},
    {"\\x{41", 0, NULL, W_NONE},
    {"\\x{ 41}", 0, NULL, W_NONE},
    {"[\\x{41}-\\x{5a}]", 0, NULL, W_BOTH},
    {"\\cA\\ca\\c?\\c1\\c{", 0, "\x01\x01\x7fq;", W_BOTH},
    {"[\\cA-\\cC]", 0, NULL, W_BOTH},
    {"\\c", 0, NULL, W_NONE},
    {"\\e\\a\\f\\t\\n\\r", 0, "\x1b\x07\f\t\n\r", W_BOTH},
    {"[\\e\\a\\f\\t\\n\\r\\b]", 0, NULL, W_BOTH},
    {"x\\C", 0, "x\nxa", W_BOTH},
    /* letters that are literal when escaped outside a class */
    {"\\i\\j\\m\\q\\y", 0, "ijmqy", W_BOTH},
    {"\\F\\I\\J\\M\\O\\T\\Y", 0, "FIJMOTY", W_BOTH},
    {"[\\q]", 0, NULL, W_NONE},
    {"[\\B]", 0, NULL, W_NONE},
    {"[\\A]", 0, NULL, W_NONE},
    {"[\\z]", 0, NULL, W_NONE},
    {"[\\C]", 0, NULL, W_NONE},
    {"\\N", 0, NULL, W_NONE},
    {"\\R", 0, NULL, W_NONE},
    {"\\X", 0, NULL, W_NONE},
    {"\\G", 0, NULL, W_NONE},
    {"\\K", 0, NULL, W_NONE},
    {"\\u0041", 0, NULL, W_NONE},
    {"\\L", 0, NULL, W_NONE},
    {"\\l", 0, NULL, W_NONE},
    {"\\U", 0, NULL, W_NONE},
    {"\\k<n>", 0, NULL, W_NONE},
    {"\\g1", 0, NULL, W_NONE},
    {"\\g{1}", 0, NULL, W_NONE},
    {"\\p{L}", 0, NULL, W_EITHER},
    /* \Q...\E */
    {"a\\Qb.c\\Ed", 0, "ab.cd abxcd", W_BOTH},
    {"a\\Qb.c", 0, "ab.c", W_BOTH},
    {"a\\Q\\Eb", 0, "ab", W_BOTH},
    {"\\Qa\\E+", 0, "aaa", W_BOTH},
    {"\\Qab\\E+", 0, "abbb", W_BOTH},
    {"a\\Eb", 0, "ab", W_BOTH},
    {"\\Q(a|b)*\\E", 0, "(a|b)*", W_BOTH},
    {"\\Q[a]\\E", I, "[A]", W_BOTH},
    {"[\\Q]\\E]", 0, "]", W_BOTH},
    {"[\\Q]-\\E]", 0, "]-", W_BOTH},
    {"[a\\Q-\\Ez]", 0, "-az", W_BOTH},
    {":[\\Q-\\E-K]", 0, ":; :- :K", W_BOTH},
    {"[\\Q]\\E-[:lower:]]", 0, NULL, W_NONE},
    {"[a-\\Qz\\E]", 0, NULL, W_BOTH},
    {"[\\Q^\\E]", 0, "^a", W_BOTH},
    {"[\\E]", 0, NULL, W_NONE},
    {"[\\E]]", 0, "]", W_BOTH},
    {"[]-\\E]", 0, "]-", W_BOTH},
    {"[a-\\Q\\E]", 0, "a-", W_BOTH},
    {"[\\E^\\E]a]", 0, "]a ^a", W_BOTH},
    {"[\\Q\\E^a]", 0, NULL, W_BOTH},
    {"[^^]", 0, NULL, W_BOTH},
    {"[\\E^\\E]", 0, NULL, W_NONE},
    {"(?x)\\Q a b\\E", 0, " a b", W_BOTH},
    {"a\\Q\xe9\\E", 0, "a\xe9", W_EITHER},
    {"[\\\xe9]", 0, NULL, W_EITHER},
    {"[\xe9]", I, "\xe9\xc9", W_BOTH},
    {"\xe9", I, "\xe9\xc9", W_BOTH},
    {"\\\xe9", 0, "\xe9", W_BOTH},
    /* POSIX classes outside brackets, collating elements */
    {"[:alpha:]", 0, NULL, W_NONE},
    {"a[:digit:]", 0, NULL, W_NONE},
    {"[:al pha:]", 0, NULL, W_NONE},
    {"[::]", 0, NULL, W_NONE},
    {"[:alpha]", 0, ":alph", W_BOTH},
    {"[:]", 0, NULL, W_BOTH},
    {"[:]:]", 0, ":]", W_BOTH},
    {"[^:alpha:]", 0, NULL, W_BOTH},
    {"[.a.]", 0, NULL, W_NONE},
    {"[=a=]", 0, NULL, W_NONE},
    {"[[.a.]]", 0, NULL, W_NONE},
    {"[[=a=]]", 0, NULL, W_NONE},
    {"[[:foo:]]", 0, NULL, W_NONE},
    {"[[:al pha:]]", 0, NULL, W_NONE},
    {"[[:Alpha:]]", 0, NULL, W_NONE},
    {"[[:alpha]", 0, NULL, W_BOTH},
    {"[[:alpha:][:digit:]_]", 0, NULL, W_BOTH},
    {"[[:^alpha:]]", 0, NULL, W_BOTH},
    {"[^[:^alpha:]]", 0, NULL, W_BOTH},
    {"[[:alpha:]-z]", 0, NULL, W_BOTH},
    {"[[:upper:]]", I, NULL, W_BOTH},
    {"[[:lower:]]", I, NULL, W_BOTH},
    /* an empty path whose assertions contradict (\b then \B) is no empty
     * match: Hyperscan accepts these, and so do we */
    {"\\b[A-Z]?\\B", 0, "AB x", W_BOTH},
    {"\\b\\w*\\B", 0, "abc d", W_BOTH},
    {"(?:\\b|x)(?:\\B|y)", 0, "xy ab", W_BOTH},
    /* under (?i) a negated POSIX item is folded, then negated: letters out */
    {"[[:^lower:]]", I, "aA1", W_BOTH},
    {"[[:^upper:]x]", I, "aAxX1", W_BOTH},
    {"[^[:^lower:]]", I, "aA1", W_BOTH},
    {"a(?i:[[:^upper:]])", 0, "aBab1", W_BOTH},
    {"[[:alnum:][:blank:][:cntrl:]]", 0, NULL, W_BOTH},
    {"[[:graph:][:print:]]", 0, NULL, W_BOTH},
    {"[[:punct:][:space:][:xdigit:]]", 0, NULL, W_BOTH},
    {"[[:word:][:ascii:]]", 0, NULL, W_BOTH},
    /* class corner cases */
    {"[]abc]", 0, NULL, W_BOTH},
    {"[^]]", 0, NULL, W_BOTH},
    {"[a-]", 0, NULL, W_BOTH},
    {"[-a]", 0, NULL, W_BOTH},
    {"[---]", 0, NULL, W_BOTH},
    {"[%--]", 0, NULL, W_BOTH},
    {"[a-z-0]", 0, NULL, W_BOTH},
    {"[\\d-z]", 0, NULL, W_BOTH},
    {"[\\w-.]", 0, NULL, W_BOTH},
    {"[a-\\d]", 0, NULL, W_NONE},
    {"[.-\\w]", 0, NULL, W_NONE},
    {"[a-[:digit:]]", 0, NULL, W_NONE},
    {"[z-a]", 0, NULL, W_NONE},
    {"[]", 0, NULL, W_NONE},
    {"[^]", 0, NULL, W_NONE},
    {"[[]", 0, NULL, W_BOTH},
    {"[a[]", 0, NULL, W_BOTH},
    {"[\\]]", 0, NULL, W_BOTH},
    {"[\\\\]", 0, NULL, W_BOTH},
    {"[\\d\\s\\w]", 0, NULL, W_BOTH},
    {"[\\D\\S]", 0, NULL, W_BOTH},
    {"[^\\W\\d]", 0, NULL, W_BOTH},
    {"[^a-z]", I, NULL, W_BOTH},
    {"[^k]", I, NULL, W_BOTH},
    {"[K-k]", I, NULL, W_BOTH},
    {"[Z-a]", I, NULL, W_BOTH},
    /* quantifiers and literal braces */
    {"x{,3}", 0, "x{,3}", W_BOTH},
    {"x{,}", 0, "x{,}", W_BOTH},
    {"x{ 3}", 0, "x{ 3}", W_BOTH},
    {"x{3 }", 0, "x{3 }", W_BOTH},
    {"x{3", 0, "x{3", W_BOTH},
    {"x{a}", 0, "x{a}", W_BOTH},
    {"x{2}", 0, "xxx", W_BOTH},
    {"x{2,}", 0, "xxxx", W_BOTH},
    {"x{1,3}", 0, "xxxx", W_BOTH},
    {"x{00002}", 0, "xxx", W_BOTH},
    {"x{2}?", 0, "xxx", W_BOTH},
    {"x{2,3}?y", 0, "xxxy", W_BOTH},
    {"}", 0, NULL, W_BOTH},
    {"a}", 0, NULL, W_BOTH},
    {"{", 0, NULL, W_BOTH},
    {"{3}", 0, NULL, W_NONE},
    {"a|{3}", 0, NULL, W_NONE},
    {"x{3,2}", 0, NULL, W_NONE},
    {"x{0}y", 0, NULL, W_NONE},
    {"x{0,0}y", 0, NULL, W_NONE},
    {"x{3}{2}", 0, NULL, W_NONE},
    {"x**", 0, NULL, W_NONE},
    {"x*+", 0, NULL, W_NONE},
    {"x{2}+", 0, NULL, W_NONE},
    {"x{1001}", 0, NULL, W_BOTH},
    {"ab[0-9]{2000}", 0, NULL, W_BOTH},
    {"^x{32767}", 0, NULL, W_EITHER},
    {"x{32768}", 0, NULL, W_NONE},
    {"x{1,32768}", 0, NULL, W_NONE},
    {"x{40000,}", 0, NULL, W_NONE},
    /* groups */
    {"(?<name>ab)c", 0, "abc", W_BOTH},
    {"(?'name'ab)c", 0, "abc", W_BOTH},
    {"(?P<name>ab)c", 0, "abc", W_BOTH},
    {"(?<n_1>a)(?'n_2'b)", 0, "ab", W_BOTH},
    {"(?<1n>a)", 0, NULL, W_NONE},
    {"(?<>a)", 0, NULL, W_NONE},
    {"(?<n>a)\\k<n>", 0, NULL, W_NONE},
    {"(?P<n>a)(?P=n)", 0, NULL, W_NONE},
    {"(?P<n>a)(?P>n)", 0, NULL, W_NONE},
    {"(a)(?1)", 0, NULL, W_NONE},
    {"(a)(?R)?", 0, NULL, W_NONE},
    {"(?>a)", 0, NULL, W_NONE},
    {"(?|a)", 0, NULL, W_NONE},
    {"(?(1)a|b)", 0, NULL, W_NONE},
    {"a(?=b)", 0, NULL, W_NONE},
    {"(?<=a)b", 0, NULL, W_NONE},
    {"a(?#comment)b", 0, "ab", W_BOTH},
    {"a(?#x)+", 0, "aa", W_BOTH},
    {"(?#a", 0, NULL, W_NONE},
    {"(?)a", 0, "a", W_BOTH},
    /* flags and their scope */
    {"a(?i)b|c", 0, "aB C ab c", W_BOTH},
    {"(a(?i)b|c)d", 0, "aBd Cd cD", W_BOTH},
    {"(?i:a|b)c", 0, "AcBC", W_BOTH},
    {"(?i)a(?-i)b", 0, "AbAB", W_BOTH},
    {"(?i-i)a", 0, "Aa", W_BOTH},
    {"(?is)a.", 0, "A\n", W_BOTH},
    {"(?s-i:a.)", I, "a\nA\n", W_BOTH},
    {"a(?m)$\\nb", 0, "a\nb", W_EITHER},
    {"(?-)a", 0, NULL, W_NONE},
    {"(?i-)a", 0, NULL, W_NONE},
    {"(?U)a", 0, NULL, W_NONE},
    {"(?J)a", 0, NULL, W_NONE},
    {"(?n)a", 0, NULL, W_NONE},
    {"(?i", 0, NULL, W_NONE},
    /* extended mode */
    {"(?x) a b c ", 0, "abc a b c", W_BOTH},
    {"(?x)a\\ b", 0, "ab a b", W_BOTH},
    {"(?x)a[ ]b", 0, "ab a b", W_BOTH},
    {"(?x)a#c\nb", 0, "ab", W_BOTH},
    {"(?x)a # one\n b # two\n", 0, "ab", W_BOTH},
    {"(?x)a\x0b"
     "b\x0c"
     "c\rd\te\nf",
     0, "abcdef", W_BOTH},
    {"(?x)a\x85"
     "b",
     0,
     "ab a\x85"
     "b",
     W_BOTH},
    {"(?x)a +", 0, "aaa", W_BOTH},
    {"(?x)a {2}", 0, "aaa", W_BOTH},
    {"(?x)a{ 2}", 0, "aa a{2}", W_BOTH},
    {"(?x)ab{2 }", 0, "abb ab{2}", W_BOTH},
    {"(?x)a (?-x) b", 0, "ab a b", W_BOTH},
    {"(?x)a(?-x: b) c", 0, "a bc a b c", W_BOTH},
    {"(?x: a b )c d", 0, "abc d abcd", W_BOTH},
    {"(?x)a | b", 0, "a b", W_BOTH},
    {"(?x)( a | b ) c", 0, "ac bc", W_BOTH},
    {"(?x)a\\#", 0, "a#", W_BOTH},
    {"(?x)[#]a", 0, "#a", W_BOTH},
    {"(?xx)a b", 0, "ab", W_BOTH},
    {"(?x)a #end", 0, "a", W_EITHER},
    {"(?x)a+ ?b", 0, NULL, W_EITHER},
    {"(?x)\\12 3", 0, "\n3", W_BOTH},
    /* anchors and assertions next to the new syntax */
    {"a\\b*", 0, NULL, W_EITHER},
    {"a\\b+c", 0, NULL, W_EITHER},
    {"a\\b?", 0, NULL, W_EITHER},
    {"a\\b{2}c", 0, NULL, W_EITHER},
    {"a\\B*", 0, NULL, W_EITHER},
    {"a(?:\\b)*", 0, NULL, W_EITHER},
    {"a(?:\\b)+ ", 0, "a a", W_EITHER},
    {"a(\\b)?", 0, NULL, W_EITHER},
    {"a^*", 0, NULL, W_EITHER},
    {"a(?:^)*", 0, NULL, W_EITHER},
    {"a$?", 0, NULL, W_EITHER},
    {"\\A{2}a", 0, NULL, W_EITHER},
    {"a\\z?", 0, NULL, W_EITHER},
    {"a\\Z?", 0, NULL, W_EITHER},
    {"(?:\\A)+a", 0, NULL, W_EITHER},
    {"(?m)^+a", 0, NULL, W_EITHER},
    {"a(?:$){2}", 0, "a", W_BOTH},
    {"a(?:\\z)+", 0, "a", W_BOTH},
    {"a(?:$)+b", 0, NULL, W_NONE},
    {"(?<n>a)(?<n>b)", 0, NULL, W_NONE},
    {"(?<n>a)|(?'n'b)", 0, NULL, W_NONE},
    {"(?<n>a)(?<nn>b)", 0, "ab", W_BOTH},
    {"\\Aab", 0, "abab", W_BOTH},
    {"ab\\z", 0, "abab", W_BOTH},
    {"ab\\Z", 0, "ab\n", W_BOTH},
    {"\\bab\\B", 0, "abc ab", W_BOTH},
};

START_TEST(table)
{
    struct stats st = {0};
    const struct tcase *c = &cases[_i];
    int both =
        compare(c->pat, c->flags, c->hay, c->hay ? strlen(c->hay) : 0, 7 + (uint64_t)_i, &st);
    if (c->want == W_BOTH && !both && st.failures == 0) {
        print_bytes("expected both engines to accept", c->pat, strlen(c->pat));
        st.failures++;
    }
    if (c->want == W_NONE && st.neither != 1 && st.failures == 0) {
        print_bytes("expected both engines to reject", c->pat, strlen(c->pat));
        st.failures++;
    }
    ck_assert_msg(st.failures == 0, "case %d: %s", _i, c->pat);
}
END_TEST

/* Strings (such as "\0" and "\x85") are not NUL-safe in the table; the
 * cases above avoid NUL in patterns since Hyperscan takes C strings. */

/* ------------------------------------------------------------------------ */
/* Random patterns.                                                         */

static const char *pick(struct rng *r, const char *const *v, size_t n)
{
    return v[rng_below(r, (uint32_t)n)];
}

#define PICK(r, arr) pick((r), (arr), sizeof(arr) / sizeof((arr)[0]))

static const char *const lits[] = {"a", "b", "k",   "K",    "x",    "0",    "1",    "9",   "-",
                                   "_", ":", "]",   "}",    "{",    " ",    "#",    "=",   ".",
                                   "^", "$", "\\.", "\xe9", "\xc9", "\x85", "\xa0", "\x0b"};
static const char *const escs[] = {
    "\\d",      "\\D",   "\\w",   "\\W",    "\\s",       "\\S",       "\\h",   "\\H",
    "\\v",      "\\V",   "\\n",   "\\t",    "\\r",       "\\f",       "\\e",   "\\a",
    "\\0",      "\\01",  "\\012", "\\0123", "\\1",       "\\7",       "\\8",   "\\9",
    "\\10",     "\\12",  "\\18",  "\\81",   "\\101",     "\\141",     "\\377", "\\400",
    "\\x",      "\\x4",  "\\x41", "\\x6b",  "\\x{4b}",   "\\x{0061}", "\\x{}", "\\x{100}",
    "\\o{141}", "\\o{}", "\\cA",  "\\cj",   "\\c1",      "\\c[",      "\\C",   "\\i",
    "\\q",      "\\F",   "\\Y",   "\\N",    "\\R",       "\\G",       "\\g1",  "\\k<a>",
    "\\p{L}",   "\\-",   "\\]",   "\\[",    "\\{",       "\\}",       "\\ ",   "\\#",
    "\\b",      "\\B",   "\\A",   "\\z",    "\\Z",       "\\Qa.\\E",  "\\Q",   "\\E",
    "\\Q\\E",   "\\xe9", "\\xC9", "\\\xe9", "\\Q\xe9\\E"};
static const char *const cls_members[] = {
    "a",           "k",        "K",           "z",         "0",       "9",         "-",
    "]",           "[",        "^",           ":",         "\\]",     "\\-",       "\\\\",
    "\\d",         "\\w",      "\\s",         "\\h",       "\\v",     "\\H",       "\\V",
    "\\D",         "\\W",      "\\S",         "\\b",       "\\n",     "\\x41",     "\\x{6b}",
    "\\101",       "\\1",      "\\18",        "\\8",       "\\0",     "\\o{141}",  "\\cK",
    "\\e",         "\\q",      "\\B",         "\\Q]\\E",   "\\Q-\\E", "\\E",       "[:alpha:]",
    "[:^digit:]",  "[:word:]", "[:space:]",   "[:punct:]", "[:foo:]", "[:upper:]", "[:lower:]",
    "[.a.]",       "[:alpha]", "a-z",         "A-Z",       "0-9",     "z-a",       "a-\\d",
    "\\d-z",       "!--",      "\\x20-\\x7e", "k-k",       "K-k",     "\xe9",      "\x80-\xff",
    "\\xc9-\\xe9", "\xa0",     "[:^lower:]",  "[:^upper:]"};
static const char *const quants[] = {"*",      "+",    "?",      "{2}", "{1,3}", "{2,}",
                                     "{,3}",   "{ 2}", "{3,2}",  "{0}", "*?",    "+?",
                                     "{1,2}?", "**",   "{2}{2}", " *",  " +",    "{1000,1002}"};
static const char *const opens[] = {"(",     "(?:",   "(?i:",   "(?-i:",  "(?x:",  "(?s:", "(?m:",
                                    "(?<n>", "(?'n'", "(?P<n>", "(?i-x:", "(?<1>", "(?="};
static const char *const inlines[] = {"(?i)",  "(?-i)", "(?x)", "(?-x)", "(?s)",   "(?m)",
                                      "(?#c)", "(?ix)", "(?)",  "(?-)",  "(?P=n)", "(?U)"};
static const char *const spaces[] = {" ", "  ", "\t", "\n", "#c\n", " # c\n"};

static void gen_class(struct rng *r, struct buf *b)
{
    buf_putc(b, '[');
    if (rng_below(r, 4) == 0)
        buf_putc(b, '^');
    if (rng_below(r, 8) == 0)
        buf_putc(b, ']');
    unsigned n = 1 + rng_below(r, 3);
    for (unsigned k = 0; k < n; k++)
        buf_puts(b, PICK(r, cls_members));
    if (rng_below(r, 8) == 0)
        buf_putc(b, '-');
    buf_putc(b, ']');
}

static void gen_seq(struct rng *r, struct buf *b, int depth);

static void gen_piece(struct rng *r, struct buf *b, int depth)
{
    switch (rng_below(r, 10)) {
    case 0:
    case 1:
        buf_puts(b, PICK(r, lits));
        break;
    case 2:
    case 3:
        buf_puts(b, PICK(r, escs));
        break;
    case 4:
    case 5:
        gen_class(r, b);
        break;
    case 6:
        if (depth < 3) {
            buf_puts(b, PICK(r, opens));
            gen_seq(r, b, depth + 1);
            if (rng_below(r, 3) == 0) {
                buf_putc(b, '|');
                gen_seq(r, b, depth + 1);
            }
            buf_putc(b, ')');
        } else {
            buf_puts(b, PICK(r, lits));
        }
        break;
    case 7:
        buf_puts(b, PICK(r, inlines));
        break;
    case 8:
        buf_puts(b, PICK(r, spaces));
        break;
    default:
        if (rng_below(r, 6) == 0)
            buf_puts(b, "[:alpha:]");
        else
            buf_puts(b, PICK(r, lits));
        break;
    }
    if (rng_below(r, 4) == 0)
        buf_puts(b, PICK(r, quants));
}

static void gen_seq(struct rng *r, struct buf *b, int depth)
{
    unsigned n = 1 + rng_below(r, 4);
    for (unsigned k = 0; k < n; k++)
        gen_piece(r, b, depth);
}

static unsigned env_uint(const char *name, unsigned dflt)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? (unsigned)strtoul(v, NULL, 0) : dflt;
}

START_TEST(random_patterns)
{
    unsigned seed0 = env_uint("VKS_SYNTAX_SEED", 1), n = env_uint("VKS_SYNTAX_CASES", 1500);
    struct stats st = {0};
    for (unsigned k = 0; k < n && st.failures < 20; k++) {
        uint64_t seed = ((uint64_t)seed0 << 32) | k;
        struct rng r = {seed};
        struct buf b = {0};
        gen_seq(&r, &b, 0);
        if (rng_below(&r, 3) == 0) {
            buf_putc(&b, '|');
            gen_seq(&r, &b, 0);
        }
        static const uint32_t fl[] = {0, 0, 0, I, S, M, I | S};
        compare(b.p, fl[rng_below(&r, 7)], "aKk0-9_: ]{}#\n", 14, seed, &st);
        free(b.p);
    }
    fprintf(stderr,
            "syntax random: %u patterns: both accept %u, both reject %u, only Hyperscan %u, "
            "only ours %u (allowed %u), failures %u\n",
            n, st.both, st.neither, st.hs_only, st.ours_only, st.allowed, st.failures);
    ck_assert_msg(st.failures == 0, "%u random patterns disagree with Hyperscan", st.failures);
    /* the generator must exercise both verdicts */
    ck_assert(st.both > n / 10 && st.neither > n / 10);
}
END_TEST

Suite *syntax_suite(void)
{
    Suite *s = suite_create("syntax");
    TCase *tc = tcase_create("hyperscan");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, table, 0, (int)(sizeof(cases) / sizeof(cases[0])));
    tcase_add_test(tc, random_patterns);
    suite_add_tcase(s, tc);
    return s;
}
