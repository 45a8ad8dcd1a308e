/*
 * Differential test of the rule compiler and the CPU reference scanner
 * against Hyperscan (block mode, no start of match): for every rule both
 * engines accept, the set of (rule, end offset) pairs must be the same.
 *
 * Three sources of rules:
 *  - seeded random regexes of the subset in docs/rules.md, built as a small
 *    syntax tree so that the test can also draw strings that match them and
 *    plant those in the haystacks (random text alone rarely matches a long
 *    pattern);
 *  - multi-rule catalogs of random regexes, literals and hex strings, compiled
 *    together under several state budgets, which exercises grouping;
 *  - every pattern file under tests/data (or $VKS_SHARED_DATA) against the prose haystacks
 *    there plus a synthetic "config file" full of secret-like assignments.
 *
 * Patterns Hyperscan rejects are skipped and counted. Patterns we reject
 * while Hyperscan accepts them must be ones that can match the empty string
 * or that exceed the state budget; anything else fails the test. Every
 * mismatch prints a reproducer: seed, rules with flags, the haystack as a C
 * string and the hits that only one engine reported.
 *
 * Knobs for longer local runs: VKS_HSDIFF_SEED (base seed, default 1),
 * VKS_HSDIFF_SCALE (multiplies the number of random cases, default 1; may be
 * below 1), VKS_HSDIFF_REPORTS (reproducers printed per test, default 12),
 * VKS_HSDIFF_DICT10_STRIDE (compare every k-th rule of dict-10, default 1)
 * and VKS_HSDIFF_CPU_EVERY (run the CPU engine against refscan on every k-th
 * scan, default 1; 0: never).
 */
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <glob.h>
#include <hs.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpuplan.h"
#include "cpuscan.h"
#include "factor.h"
#include "parse.h"
#include "patfile.h"
#include "refscan.h"
#include "rules.h"

/* ------------------------------------------------------------------------ */
/* Small helpers: deterministic random numbers, growable strings.           */

struct rng {
    uint64_t s;
};

/* splitmix64: tiny, fast and good enough for test-case generation. */
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

static bool rng_pct(struct rng *r, uint32_t pct)
{
    return rng_below(r, 100) < pct;
}

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n == 0 ? 1 : n);
    ck_assert_msg(q != NULL, "out of memory (%zu bytes)", n);
    return q;
}

static char *xstrndup(const char *s, size_t n)
{
    char *p = xrealloc(NULL, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* A byte string that stays NUL-terminated; it may hold NUL bytes. */
struct str {
    char *p;
    size_t n;
    size_t cap;
};

static void str_putn(struct str *s, const void *p, size_t n)
{
    if (s->n + n + 1 > s->cap) {
        s->cap = (s->n + n + 1) * 2;
        s->p = xrealloc(s->p, s->cap);
    }
    memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = '\0';
}

static void str_putc(struct str *s, char c)
{
    str_putn(s, &c, 1);
}

static void str_puts(struct str *s, const char *p)
{
    str_putn(s, p, strlen(p));
}

static VKS_PRINTF(2, 3) void str_printf(struct str *s, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    ck_assert(n >= 0 && (size_t)n < sizeof(buf));
    str_putn(s, buf, (size_t)n);
}

static void str_free(struct str *s)
{
    free(s->p);
    *s = (struct str){0};
}

/* Writes `len` bytes as the body of a C string literal. A hex escape is
 * also used for a hex digit right after one, which C would swallow. */
static void print_cstr(FILE *f, const void *p, size_t len)
{
    const uint8_t *b = p;
    bool hex = false;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = b[i];
        const char *e = c == '\n'   ? "\\n"
                        : c == '\t' ? "\\t"
                        : c == '\r' ? "\\r"
                        : c == '"'  ? "\\\""
                        : c == '\\' ? "\\\\"
                                    : NULL;
        if (e != NULL) {
            fputs(e, f);
            hex = false;
        } else if (c >= 0x20 && c < 0x7f && !(hex && isxdigit(c))) {
            fputc(c, f);
            hex = false;
        } else {
            fprintf(f, "\\x%02x", c);
            hex = true;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Rules, haystacks and hit lists as the comparison sees them.              */

struct trule {
    char id[64];
    enum rule_kind kind;
    char *pat; /* given to rules_compile, `len` bytes; owned */
    size_t len;
    char *hs; /* the same rule as a Hyperscan expression; owned */
    uint32_t flags;
    uint32_t line;
    int nullable; /* generated regexes: 1 if it can match "" (assertions as empty) */
};

struct hay {
    char name[64];
    const uint8_t *p;
    size_t len;
};

struct pair {
    uint32_t rule;
    uint64_t end;
};

struct pairs {
    struct pair *v;
    size_t n;
    size_t cap;
};

static void pairs_push(struct pairs *ps, uint32_t rule, uint64_t end)
{
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? ps->cap * 2 : 64;
        ps->v = xrealloc(ps->v, ps->cap * sizeof(*ps->v));
    }
    ps->v[ps->n++] = (struct pair){rule, end};
}

static int pair_cmp(const void *a, const void *b)
{
    const struct pair *x = a, *y = b;
    if (x->rule != y->rule)
        return x->rule < y->rule ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static void trule_free(struct trule *r)
{
    free(r->pat);
    free(r->hs);
}

static void trules_free(struct trule *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        trule_free(&v[i]);
    free(v);
}

static void print_flags(FILE *f, uint32_t flags)
{
    if (flags & RULE_F_CASELESS)
        fputc('i', f);
    if (flags & RULE_F_DOTALL)
        fputc('s', f);
    if (flags & RULE_F_MULTILINE)
        fputc('m', f);
    if (flags & RULE_F_SINGLEMATCH)
        fputc('H', f);
}

static void print_rule(FILE *f, size_t i, const struct trule *r)
{
    static const char *const kinds[] = {"literal", "hex", "regex"};
    fprintf(f, "  rule %zu (%s, id %s, flags \"", i, kinds[r->kind], r->id);
    print_flags(f, r->flags);
    fprintf(f, "\"): \"");
    print_cstr(f, r->pat, r->len);
    fprintf(f, "\"\n");
    if (r->kind != RULE_REGEX) {
        fprintf(f, "    as Hyperscan expression: \"");
        print_cstr(f, r->hs, strlen(r->hs));
        fprintf(f, "\"\n");
    }
}

/* ------------------------------------------------------------------------ */
/* Statistics and failure reports.                                           */

#define MAX_REASONS 48

/* Reproducers printed per test: VKS_HSDIFF_REPORTS, default 12. */
static unsigned max_reports(void)
{
    const char *v = getenv("VKS_HSDIFF_REPORTS");
    return v != NULL && *v != '\0' ? (unsigned)strtoul(v, NULL, 0) : 12;
}

struct reasons {
    char text[MAX_REASONS][96];
    unsigned count[MAX_REASONS];
    unsigned n;
};

struct stats {
    unsigned cases;         /* rule sets compiled and scanned */
    unsigned rules;         /* rules generated or loaded */
    unsigned compared;      /* rules accepted by both engines */
    unsigned hs_rejects;    /* rules Hyperscan rejected (skipped) */
    unsigned our_rejects;   /* rules we rejected (empty, budget) while Hyperscan accepted */
    unsigned both_rejects;  /* rules both rejected */
    unsigned scans;         /* (rule set, haystack) pairs compared */
    uint64_t hits;          /* hits both engines agreed on */
    unsigned mismatches;    /* differing (rule set, haystack) pairs */
    unsigned bad_rejects;   /* rejects or accepts that break the contract */
    unsigned size_rejects;  /* of our_rejects: for size (budget, positions) */
    unsigned nfa_rules;     /* rules compiled to the bit-NFA engine */
    unsigned gated_rules;   /* of those: in a gated group (walked around factors) */
    unsigned confirm_rules; /* of those: unbounded, confirmed forward (CAT_GF_CONFIRM) */
    unsigned gate_diffs;    /* haystacks where gated and full walks differ (check_full_walk) */
    unsigned cpu_diffs;     /* haystacks where the CPU engine and refscan differ */
    unsigned reports;       /* reproducers printed */
    struct reasons hs_why;  /* Hyperscan's reject messages */
    struct reasons our_why; /* our reject messages, digits stripped */
};

static void reasons_add(struct reasons *rs, const char *msg)
{
    char key[96];
    size_t k = 0;
    for (const char *p = msg; *p && k + 1 < sizeof(key); p++) {
        if (isdigit((unsigned char)*p)) {
            if (k == 0 || key[k - 1] != '#')
                key[k++] = '#';
        } else {
            key[k++] = *p;
        }
    }
    key[k] = '\0';
    for (unsigned i = 0; i < rs->n; i++) {
        if (strcmp(rs->text[i], key) == 0) {
            rs->count[i]++;
            return;
        }
    }
    if (rs->n < MAX_REASONS) {
        memcpy(rs->text[rs->n], key, k + 1);
        rs->count[rs->n++] = 1;
    }
}

static void reasons_print(const struct reasons *rs, const char *who)
{
    for (unsigned i = 0; i < rs->n; i++)
        printf("    %s rejected %u: %s\n", who, rs->count[i], rs->text[i]);
}

static void stats_print(const struct stats *st, const char *what)
{
    printf("hsdiff %s: %u sets, %u rules, %u compared, %u skipped (Hyperscan rejects), "
           "%u rejected by us only (empty/budget), %u by both, %u scans, %" PRIu64
           " agreeing hits, %u mismatches, %u bad rejects\n",
           what, st->cases, st->rules, st->compared, st->hs_rejects, st->our_rejects,
           st->both_rejects, st->scans, st->hits, st->mismatches, st->bad_rejects);
    printf("hsdiff %s: %u rules on the bit-NFA engine, %u rejected for size, %u haystacks where "
           "the CPU engine differs from refscan\n",
           what, st->nfa_rules, st->size_rejects, st->cpu_diffs);
    reasons_print(&st->hs_why, "Hyperscan");
    reasons_print(&st->our_why, "vkscan");
    fflush(stdout);
}

/* ------------------------------------------------------------------------ */
/* Hyperscan side.                                                           */

/*
 * Hyperscan flags for our RULE_F_*. HS_FLAG_SINGLEMATCH is left out on
 * purpose: Hyperscan reports the first match it *delivers*, and a match that
 * waits for its next byte (\b, \B, $) is delivered after the one that ends
 * one byte later, so /x\b\W?/H over "x  " gives 2, not 1. Our contract is
 * the lowest end offset; run_scan keeps the first hit per H rule instead.
 */
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

/* Why Hyperscan rejected rule i alone (its message), or "" if it accepts. */
static void hs_probe(const struct trule *r, char *why, size_t cap)
{
    hs_database_t *db = NULL;
    hs_compile_error_t *ce = NULL;
    why[0] = '\0';
    if (hs_compile(r->hs, hs_flags_of(r->flags), HS_MODE_BLOCK, NULL, &db, &ce) == HS_SUCCESS) {
        hs_free_database(db);
        return;
    }
    snprintf(why, cap, "%s", ce->message);
    hs_free_compile_error(ce);
}

/*
 * Compiles every rule Hyperscan accepts into one database (ids are input
 * indexes) and sets hs_ok[i]. A rejected expression is dropped and the rest
 * compiled again; after a few retries every rule is probed alone instead.
 * `why[i]` (may be NULL) receives Hyperscan's message. NULL if none accepted.
 */
static hs_database_t *hs_build(const struct trule *rules, size_t n, bool *hs_ok, char (*why)[96],
                               struct stats *st)
{
    const char **expr = xrealloc(NULL, (n + 1) * sizeof(*expr));
    unsigned *flags = xrealloc(NULL, (n + 1) * sizeof(*flags));
    unsigned *ids = xrealloc(NULL, (n + 1) * sizeof(*ids));
    hs_database_t *db = NULL;
    for (size_t i = 0; i < n; i++) {
        hs_ok[i] = true;
        if (why != NULL)
            why[i][0] = '\0';
    }
    for (unsigned retries = 0;; retries++) {
        if (retries == 4) {
            char msg[96];
            for (size_t i = 0; i < n; i++) {
                if (!hs_ok[i])
                    continue;
                hs_probe(&rules[i], msg, sizeof(msg));
                if (msg[0] != '\0') {
                    hs_ok[i] = false;
                    reasons_add(&st->hs_why, msg);
                    if (why != NULL)
                        memcpy(why[i], msg, sizeof(msg));
                }
            }
        }
        unsigned m = 0;
        for (size_t i = 0; i < n; i++) {
            if (hs_ok[i]) {
                expr[m] = rules[i].hs;
                flags[m] = hs_flags_of(rules[i].flags);
                ids[m++] = (unsigned)i;
            }
        }
        if (m == 0)
            break;
        hs_compile_error_t *ce = NULL;
        if (hs_compile_multi(expr, flags, ids, m, HS_MODE_BLOCK, NULL, &db, &ce) == HS_SUCCESS)
            break;
        ck_assert_msg(ce->expression >= 0, "Hyperscan failed on the whole set: %s", ce->message);
        unsigned bad = ids[ce->expression];
        hs_ok[bad] = false;
        reasons_add(&st->hs_why, ce->message);
        if (why != NULL)
            snprintf(why[bad], sizeof(why[bad]), "%s", ce->message);
        hs_free_compile_error(ce);
        db = NULL;
    }
    free(expr);
    free(flags);
    free(ids);
    return db;
}

static int on_hs_match(unsigned id, unsigned long long from, unsigned long long to, unsigned flags,
                       void *ctx)
{
    (void)from;
    (void)flags;
    pairs_push(ctx, id, to);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The comparison of one rule set over a list of haystacks.                 */

/* Set by the bit-NFA tests: every rule compiles to the bit-parallel NFA. */
static bool force_bitnfa;
/* run_scan also walks every group in full, gates ignored, and asserts the
 * gated scan gives the same hits (st->gate_diffs) */
static bool check_full_walk;

struct run {
    const struct trule *rules;
    size_t n;
    uint32_t max_states;
    uint64_t seed;
    const char *what;
    bool print_all_rules; /* print the whole set in a reproducer, not just the culprits */
    bool any;             /* some rule is compared */
    /* filled by run_compile */
    struct rules_result res;
    hs_database_t *db;
    hs_scratch_t *scratch;
    bool *hs_ok;
    uint32_t *key;    /* input index -> first input index with the same id */
    bool *both;       /* by key: compared (every rule of it accepted by both or by neither) */
    uint32_t *cat2in; /* catalog rule index -> input index */
};

struct id_index {
    const char *id;
    uint32_t i;
};

static int id_index_cmp(const void *a, const void *b)
{
    const struct id_index *x = a, *y = b;
    int d = strcmp(x->id, y->id);
    return d != 0 ? d : (x->i > y->i) - (x->i < y->i);
}

/* Rules that share an id report as one, under the first of them (gitleaks'
 * keyword list gives one id several keywords): both engines' hits are
 * compared by key[i], the first input index with rule i's id. */
static uint32_t *id_keys(const struct trule *rules, size_t n)
{
    struct id_index *v = xrealloc(NULL, (n + 1) * sizeof(*v));
    uint32_t *key = xrealloc(NULL, (n + 1) * sizeof(*key));
    for (size_t i = 0; i < n; i++)
        v[i] = (struct id_index){rules[i].id, (uint32_t)i};
    qsort(v, n, sizeof(*v), id_index_cmp);
    for (size_t i = 0, first = 0; i < n; i++) {
        if (strcmp(v[i].id, v[first].id) != 0)
            first = i;
        key[v[i].i] = v[first].i;
    }
    free(v);
    return key;
}

static bool msg_has(const char *msg, const char *word)
{
    return strstr(msg, word) != NULL;
}

/* A reject of a rule Hyperscan accepts is allowed only for "can match the
 * empty string" (and then only if it can) and for our limits: the state
 * budget, repeat counts, NFA positions. */
static bool reject_allowed(const struct trule *r, const char *msg)
{
    if (msg_has(msg, "empty string"))
        return r->nullable != 0;
    return msg_has(msg, "states") || msg_has(msg, "budget") || msg_has(msg, "over the limit");
}

static void report_header(struct run *ru, struct stats *st, const char *title)
{
    fprintf(stderr, "\n=== hsdiff %s: %s (seed %" PRIu64 ", max_states %u)\n", ru->what, title,
            ru->seed, ru->max_states);
    st->reports++;
}

/* Checks our rejects and accepts against Hyperscan's verdicts. */
static void check_verdicts(struct run *ru, struct stats *st, char (*hs_why)[96])
{
    bool *ours_ok = xrealloc(NULL, ru->n * sizeof(bool));
    for (size_t i = 0; i < ru->n; i++)
        ours_ok[i] = ru->res.rule_index[i] != UINT32_MAX;
    for (size_t k = 0; k < ru->res.n_rejects; k++) {
        const struct rule_reject *rj = &ru->res.rejects[k];
        const struct trule *r = &ru->rules[rj->index];
        reasons_add(&st->our_why, rj->msg);
        if (!ru->hs_ok[rj->index]) {
            st->both_rejects++;
            continue;
        }
        if (reject_allowed(r, rj->msg)) {
            st->our_rejects++;
            st->size_rejects += !msg_has(rj->msg, "empty string");
            if (!msg_has(rj->msg, "empty string") && st->reports < max_reports()) {
                report_header(ru, st, "we reject a rule for size");
                print_rule(stderr, rj->index, r);
                fprintf(stderr, "  our reason: %s\n", rj->msg);
            }
            continue;
        }
        st->bad_rejects++;
        if (st->reports < max_reports()) {
            report_header(ru, st, "we reject a rule Hyperscan accepts");
            print_rule(stderr, rj->index, r);
            fprintf(stderr, "  our reason (pos %u): %s\n", rj->pos, rj->msg);
        }
    }
    for (size_t i = 0; i < ru->n; i++) {
        /* `nullable` takes assertions as empty: \b[A-Z]?\B is nullable there,
         * but its empty path needs \b and \B at one offset, so it never
         * matches empty and both engines accept it. A rule we accept that
         * really matches empty shows as Hyperscan's reject or as hits. */
        bool hs_empty = !ru->hs_ok[i] && msg_has(hs_why[i], "empty");
        if (ours_ok[i] && hs_empty) {
            st->bad_rejects++;
            if (st->reports < max_reports()) {
                report_header(ru, st, "we accept a rule that can match the empty string");
                print_rule(stderr, i, &ru->rules[i]);
                fprintf(stderr, "  Hyperscan: %s\n", hs_why[i][0] ? hs_why[i] : "accepted");
            }
        }
        ru->both[i] = true;
    }
    for (size_t i = 0; i < ru->n; i++)
        if (ours_ok[i] != ru->hs_ok[i])
            ru->both[ru->key[i]] = false;
    for (size_t i = 0; i < ru->n; i++) {
        bool cmp = ours_ok[i] && ru->hs_ok[i] && ru->both[ru->key[i]];
        st->compared += cmp;
        if (cmp)
            ru->any = true;
    }
    free(ours_ok);
}

static int run_compile(struct run *ru, struct stats *st)
{
    struct rule_src *src = xrealloc(NULL, ru->n * sizeof(*src));
    for (size_t i = 0; i < ru->n; i++) {
        const struct trule *r = &ru->rules[i];
        src[i] = (struct rule_src){r->id, r->kind, r->pat, r->len, r->flags, r->line};
    }
    struct rules_options opt = {.max_states = ru->max_states, .force_bitnfa = force_bitnfa};
    struct vks_error err = {0};
    int rc = rules_compile(src, ru->n, &opt, &ru->res, &err);
    free(src);
    ck_assert_msg(rc == 0, "rules_compile failed: %d %s", rc, err.msg);

    char(*hs_why)[96] = xrealloc(NULL, ru->n * sizeof(*hs_why));
    ru->hs_ok = xrealloc(NULL, ru->n * sizeof(bool));
    ru->both = xrealloc(NULL, ru->n * sizeof(bool));
    ru->key = id_keys(ru->rules, ru->n);
    ru->db = hs_build(ru->rules, ru->n, ru->hs_ok, hs_why, st);
    for (size_t i = 0; i < ru->n; i++)
        st->hs_rejects += !ru->hs_ok[i];
    if (ru->db != NULL)
        ck_assert_int_eq(hs_alloc_scratch(ru->db, &ru->scratch), HS_SUCCESS);
    check_verdicts(ru, st, hs_why);
    free(hs_why);

    uint32_t nr = ru->res.catalog ? catalog_rule_count(ru->res.catalog) : 0;
    ru->cat2in = xrealloc(NULL, (nr + 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < nr; i++) {
        struct catalog_rule cr;
        catalog_rule(ru->res.catalog, i, &cr);
        st->nfa_rules += cr.group >= catalog_group_count(ru->res.catalog);
        if (cr.group >= catalog_group_count(ru->res.catalog)) {
            struct catalog_nfa cn;
            catalog_nfa(ru->res.catalog, cr.group - catalog_group_count(ru->res.catalog), &cn);
            st->gated_rules += (cn.flags & CAT_GF_GATED) != 0;
            st->confirm_rules += (cn.flags & CAT_GF_CONFIRM) != 0;
        }
    }
    for (size_t i = 0; i < ru->n; i++) {
        uint32_t c = ru->res.rule_index[i];
        if (c != UINT32_MAX) {
            ck_assert_uint_lt(c, nr);
            ru->cat2in[c] = (uint32_t)i;
        }
    }
    st->cases++;
    st->rules += (unsigned)ru->n;
    return 0;
}

static void run_finish(struct run *ru)
{
    rules_result_finish(&ru->res);
    hs_free_scratch(ru->scratch);
    hs_free_database(ru->db);
    free(ru->hs_ok);
    free(ru->both);
    free(ru->key);
    free(ru->cat2in);
}

static void print_hits(FILE *f, const char *who, const struct pair *v, size_t n)
{
    fprintf(f, "  only %s:", who);
    for (size_t i = 0; i < n && i < 40; i++)
        fprintf(f, " (%u,%" PRIu64 ")", v[i].rule, v[i].end);
    if (n > 40)
        fprintf(f, " ... %zu in all", n);
    fputc('\n', f);
}

static void print_hay(FILE *f, const struct hay *h, uint64_t near)
{
    if (h->len <= 600) {
        fprintf(f, "  haystack %s (%zu bytes): \"", h->name, h->len);
        print_cstr(f, h->p, h->len);
        fprintf(f, "\"\n");
        return;
    }
    uint64_t lo = near > 80 ? near - 80 : 0;
    uint64_t hi = near + 20 < h->len ? near + 20 : h->len;
    fprintf(f, "  haystack %s (%zu bytes), bytes [%" PRIu64 ", %" PRIu64 "): \"", h->name, h->len,
            lo, hi);
    print_cstr(f, h->p + lo, (size_t)(hi - lo));
    fprintf(f, "\"\n");
}

/* Prints the differing parts of two sorted pair lists, rule by rule. */
static void report_diff(struct run *ru, struct stats *st, const struct hay *h,
                        const struct pairs *ours, const struct pairs *theirs)
{
    report_header(ru, st, "hit sets differ");
    struct pairs a = {0}, b = {0};
    size_t i = 0, j = 0;
    while (i < ours->n || j < theirs->n) {
        int c = i == ours->n ? 1 : j == theirs->n ? -1 : pair_cmp(&ours->v[i], &theirs->v[j]);
        if (c < 0) {
            pairs_push(&a, ours->v[i].rule, ours->v[i].end);
            i++;
        } else if (c > 0) {
            pairs_push(&b, theirs->v[j].rule, theirs->v[j].end);
            j++;
        } else {
            i++;
            j++;
        }
    }
    for (size_t k = 0; k < ru->n; k++) {
        bool culprit = false;
        for (size_t x = 0; x < a.n && !culprit; x++)
            culprit = a.v[x].rule == ru->key[k];
        for (size_t x = 0; x < b.n && !culprit; x++)
            culprit = b.v[x].rule == ru->key[k];
        if (culprit || (ru->print_all_rules && ru->both[ru->key[k]]))
            print_rule(stderr, k, &ru->rules[k]);
    }
    uint64_t near = a.n ? a.v[0].end : b.n ? b.v[0].end : 0;
    print_hay(stderr, h, near);
    print_hits(stderr, "vkscan", a.v, a.n);
    print_hits(stderr, "Hyperscan", b.v, b.n);
    free(a.v);
    free(b.v);
}

/* Scans one haystack with both engines and compares. */
static int full_push(void *ctx, uint32_t rule, uint64_t end)
{
    return scan_hits_push(ctx, rule, end, 1);
}

/* refscan_buffer against every group walked in full over h, gates ignored
 * (the factor group reports nothing): true when they agree. */
static bool gated_equals_full(const struct catalog *cat, const struct hay *h)
{
    struct scan_hits gated = {0}, full = {0};
    ck_assert_int_eq(refscan_buffer(cat, h->p, h->len, SCAN_ALL, &gated), 0);
    for (uint32_t g = 0; g < catalog_group_count(cat); g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        if (!(cg.flags & CAT_GF_FACTOR))
            refscan_group_range(cat, g, h->p, h->len, 0, 0, h->len, full_push, &full);
    }
    for (uint32_t g = 0; g < catalog_nfa_count(cat); g++)
        refscan_nfa_range(cat, g, h->p, h->len, 0, 0, h->len, full_push, &full);
    scan_hits_finalize(&full, cat, SCAN_ALL);
    bool same = gated.n == full.n;
    for (size_t i = 0; same && i < full.n; i++)
        same = gated.v[i].rule == full.v[i].rule && gated.v[i].end == full.v[i].end;
    if (!same)
        fprintf(stderr, "  gated scan of %s: %zu hits, full walks %zu\n", h->name, gated.n, full.n);
    scan_hits_finish(&gated);
    scan_hits_finish(&full);
    return same;
}

/* A catalog with unbounded groups that cpuscan_split_lookback splits, in
 * `mode`: its unbounded groups over the whole of `h`, its bounded ones in
 * three segments, merged (daemon/engine_cpu.c's tasks), equal refscan's
 * whole-buffer walk in that mode, counts included. */
/* The unbounded groups' part of h in k pieces (cpuscan_unbounded_piece,
 * guesses from `lookback` bytes), joined. */
static void unbounded_pieces(const struct catalog *cat, const struct hay *h, enum scan_mode mode,
                             uint32_t k, uint64_t lookback, struct cpuscan_scratch *sc,
                             struct cpuscan_part *out)
{
    struct cpuscan_part pieces[4] = {0};
    uint64_t lo[4];
    int prc = 0;
    for (uint32_t i = 0; i < k; i++) {
        lo[i] = h->len * i / k;
        int rc = cpuscan_unbounded_piece(cat, h->p, h->len, lo[i], h->len * (i + 1) / k, lookback,
                                         0, sc, &pieces[i]);
        prc = prc != 0 ? prc : rc;
    }
    ck_assert_int_eq(
        cpuscan_unbounded_join(cat, h->p, h->len, pieces, lo, k, prc, mode, 0, sc, out), 0);
    for (uint32_t i = 0; i < k; i++)
        cpuscan_part_finish(&pieces[i]);
}

/* Guesses repaired by the joins of cpu_split_equal (test_shapes asserts some
 * were). */
static uint64_t piece_fixes(void)
{
    struct cpuscan_counters c;
    cpuscan_counters(&c);
    return c.fixes;
}

/* DFA pieces walked as four lanes (test_shapes asserts some were). */
static uint64_t piece_lanes(void)
{
    struct cpuscan_counters c;
    cpuscan_counters(&c);
    return c.lanes;
}

static bool cpu_split_equal(const struct catalog *cat, const struct hay *h, enum scan_mode mode,
                            uint32_t pieces)
{
    struct cpuscan_scratch *sc;
    ck_assert_int_eq(cpuscan_scratch_create(&sc), 0);
    struct cpuscan_part parts[4] = {0};
    if (pieces <= 1)
        ck_assert_int_eq(cpuscan_segment_groups(cat, CPUSCAN_UNBOUNDED, h->p, h->len, 0, h->len,
                                                mode, 0, NULL, NULL, sc, &parts[0]),
                         0);
    else /* short lookbacks, so that guesses go wrong and are repaired */
        unbounded_pieces(cat, h, mode, pieces, 3, sc, &parts[0]);
    for (size_t k = 0; k < 3; k++)
        ck_assert_int_eq(cpuscan_segment_groups(cat, CPUSCAN_BOUNDED, h->p, h->len, h->len * k / 3,
                                                h->len * (k + 1) / 3, mode, 0, NULL, NULL, sc,
                                                &parts[k + 1]),
                         0);
    struct scan_hits got = {0}, want = {0};
    uint64_t dropped = 0;
    ck_assert_int_eq(cpuscan_merge(cat, mode, parts, 4, UINT64_MAX, false, &got, &dropped), 0);
    ck_assert_int_eq(refscan_buffer(cat, h->p, h->len, mode, &want), 0);
    bool same = got.n == want.n;
    for (size_t i = 0; same && i < got.n; i++)
        same = got.v[i].rule == want.v[i].rule && got.v[i].end == want.v[i].end &&
               got.v[i].count == want.v[i].count;
    for (size_t k = 0; k < 4; k++)
        cpuscan_part_finish(&parts[k]);
    cpuscan_scratch_destroy(sc);
    scan_hits_finish(&got);
    scan_hits_finish(&want);
    return same;
}

/* Scans where the CPU engine's split of a catalog with unbounded groups
 * was compared (test_shapes asserts some were). */
static uint64_t split_checked;

/* The CPU engine (its plan's fast paths: literal, window, pair and shadow
 * groups, lanes) over `h` in three segments where the catalog allows, else
 * whole, merged, equals refscan's `want`; a catalog with unbounded groups
 * that splits also split (cpu_split_equal), in every mode. */
static bool cpu_engine_equal(const struct catalog *cat, const struct hay *h,
                             const struct scan_hits *want)
{
    if (h->len >= 3 && cpuscan_lookback(cat) == CPUSCAN_UNSEGMENTABLE &&
        cpuscan_split_lookback(cat) != CPUSCAN_UNSEGMENTABLE) {
        split_checked++;
        for (int m = SCAN_ALL; m <= SCAN_COUNT; m++)
            for (uint32_t k = 1; k <= 3 && (size_t)k <= h->len; k += 2)
                if (!cpu_split_equal(cat, h, (enum scan_mode)m, k))
                    return false;
    }
    size_t np = cpuscan_lookback(cat) == CPUSCAN_UNSEGMENTABLE || h->len < 3 ? 1 : 3;
    struct cpuscan_scratch *sc;
    ck_assert_int_eq(cpuscan_scratch_create(&sc), 0);
    struct cpuscan_part parts[3] = {0};
    for (size_t k = 0; k < np; k++)
        ck_assert_int_eq(cpuscan_segment(cat, h->p, h->len, h->len * k / np, h->len * (k + 1) / np,
                                         SCAN_ALL, 0, NULL, NULL, sc, &parts[k]),
                         0);
    struct scan_hits got = {0};
    uint64_t dropped = 0;
    ck_assert_int_eq(cpuscan_merge(cat, SCAN_ALL, parts, np, UINT64_MAX, false, &got, &dropped), 0);
    bool same = got.n == want->n;
    for (size_t i = 0; same && i < got.n; i++)
        same = got.v[i].rule == want->v[i].rule && got.v[i].end == want->v[i].end;
    for (size_t k = 0; k < np; k++)
        cpuscan_part_finish(&parts[k]);
    cpuscan_scratch_destroy(sc);
    scan_hits_finish(&got);
    return same;
}

/* Whether this scan also runs the CPU engine: every one, or every k-th
 * with VKS_HSDIFF_CPU_EVERY=k (0: none), which the sanitizer run of
 * ./dev test sets to keep CI's time. */
static bool cpu_check(const struct stats *st)
{
    static long every = -1;
    if (every < 0) {
        const char *v = getenv("VKS_HSDIFF_CPU_EVERY");
        every = v != NULL && *v != '\0' ? strtol(v, NULL, 10) : 1;
        every = every < 0 ? 1 : every;
    }
    return every > 0 && st->scans % (unsigned long)every == 0;
}

static void run_scan(struct run *ru, struct stats *st, const struct hay *h)
{
    if (check_full_walk && ru->res.catalog != NULL && !gated_equals_full(ru->res.catalog, h))
        st->gate_diffs++;
    struct pairs ours = {0}, theirs = {0};
    if (ru->res.catalog != NULL) {
        struct scan_hits hits = {0};
        ck_assert_int_eq(refscan_buffer(ru->res.catalog, h->p, h->len, SCAN_ALL, &hits), 0);
        if (cpu_check(st) && !cpu_engine_equal(ru->res.catalog, h, &hits)) {
            st->cpu_diffs++;
            st->mismatches++; /* every test asserts none */
            if (st->reports < max_reports()) {
                st->reports++;
                fprintf(stderr, "CPU engine != refscan: %s seed %" PRIu64 ", %zu rules\n", ru->what,
                        ru->seed, ru->n);
                for (size_t i = 0; i < ru->n; i++)
                    fprintf(stderr, "  %s\n", ru->rules[i].pat);
            }
        }
        for (size_t i = 0; i < hits.n; i++) {
            uint32_t k = ru->key[ru->cat2in[hits.v[i].rule]];
            ck_assert_uint_le(hits.v[i].end, h->len);
            if (ru->both[k])
                pairs_push(&ours, k, hits.v[i].end);
        }
        scan_hits_finish(&hits);
    }
    if (ru->db != NULL) {
        hs_error_t e = hs_scan(ru->db, (const char *)h->p, (unsigned)h->len, 0, ru->scratch,
                               on_hs_match, &theirs);
        ck_assert_int_eq(e, HS_SUCCESS);
    }
    for (size_t i = 0; i < theirs.n; i++)
        theirs.v[i].rule = ru->key[theirs.v[i].rule];
    if (ours.n > 1)
        qsort(ours.v, ours.n, sizeof(*ours.v), pair_cmp);
    if (theirs.n > 1)
        qsort(theirs.v, theirs.n, sizeof(*theirs.v), pair_cmp);
    size_t m = 0;
    for (size_t i = 0; i < theirs.n; i++) {
        uint32_t rule = theirs.v[i].rule;
        if (!ru->both[rule])
            continue;
        bool single = (ru->rules[rule].flags & RULE_F_SINGLEMATCH) != 0;
        if (m == 0 || theirs.v[m - 1].rule != rule ||
            (!single && theirs.v[m - 1].end != theirs.v[i].end))
            theirs.v[m++] = theirs.v[i];
    }
    theirs.n = m;
    bool same = ours.n == theirs.n;
    for (size_t i = 0; same && i < ours.n; i++)
        same = pair_cmp(&ours.v[i], &theirs.v[i]) == 0;
    st->scans++;
    if (same) {
        st->hits += ours.n;
    } else {
        st->mismatches++;
        if (st->reports < max_reports())
            report_diff(ru, st, h, &ours, &theirs);
    }
    free(ours.v);
    free(theirs.v);
}

/* Compiles `n` rules with both engines and compares them on every haystack. */
static void compare_set(const struct trule *rules, size_t n, uint32_t max_states, uint64_t seed,
                        const char *what, bool print_all, const struct hay *hays, size_t nh,
                        struct stats *st)
{
    struct run ru = {.rules = rules,
                     .n = n,
                     .max_states = max_states,
                     .seed = seed,
                     .what = what,
                     .print_all_rules = print_all};
    run_compile(&ru, st);
    for (size_t i = 0; ru.any && i < nh; i++)
        run_scan(&ru, st, &hays[i]);
    run_finish(&ru);
}

/* ------------------------------------------------------------------------ */
/* The random regex generator: a syntax tree, its text, samples from it.    */

enum gnode_kind { G_BYTE, G_ANY, G_CLASS, G_SEQ, G_ALT, G_GROUP, G_REPEAT, G_ASSERT, G_FLAGS };

#define GEN_NODES 400
#define GEN_SOFT  120
#define REP_INF   255

struct gnode {
    enum gnode_kind kind;
    int child;     /* first child or -1 */
    int last;      /* last child or -1 */
    int next;      /* next sibling or -1 */
    uint8_t byte;  /* G_BYTE: the byte; G_ASSERT: ^ $ b B */
    uint8_t flags; /* G_GROUP (scoped) and G_FLAGS: RULE_F_* bits turned on */
    uint8_t group; /* G_GROUP: 0 "(", 1 "(?:", 2 "(?flags:" */
    uint8_t form;  /* G_BYTE: spelling; G_REPEAT: 0 * 1 + 2 ? 3 {m} 4 {m,} 5 {m,n} */
    uint8_t min;
    uint8_t max;
    bool lazy;
    char text[64];   /* G_CLASS: spelling */
    uint8_t set[32]; /* G_CLASS: bytes it matches, case-sensitively */
};

struct gen {
    struct rng *rng;
    struct gnode v[GEN_NODES];
    int n;
    int root;
};

static int gen_node(struct gen *g, enum gnode_kind k)
{
    ck_assert_int_lt(g->n, GEN_NODES);
    struct gnode *nd = &g->v[g->n];
    memset(nd, 0, sizeof(*nd));
    nd->kind = k;
    nd->child = nd->last = nd->next = -1;
    return g->n++;
}

static void gen_add(struct gen *g, int parent, int child)
{
    struct gnode *p = &g->v[parent];
    if (p->last < 0)
        p->child = child;
    else
        g->v[p->last].next = child;
    p->last = child;
}

static void set_bit(uint8_t *set, int c)
{
    set[c >> 3] |= (uint8_t)(1u << (c & 7));
}

static bool has_bit(const uint8_t *set, int c)
{
    return (set[c >> 3] >> (c & 7)) & 1u;
}

/* Bytes in patterns and haystacks: a small alphabet, so matches are dense. */
static const char pat_alpha[] = "aaabbbcccAB01_ -.\n\t";

static int gen_byte(struct gen *g)
{
    int i = gen_node(g, G_BYTE);
    g->v[i].byte = (uint8_t)pat_alpha[rng_below(g->rng, sizeof(pat_alpha) - 1)];
    g->v[i].form = (uint8_t)rng_below(g->rng, 8); /* 0: \xHH, otherwise plain or \n-style */
    return i;
}

static void render_byte(struct str *s, uint8_t c, uint8_t form, bool in_class)
{
    if (form == 0) {
        str_printf(s, "\\x%02x", c);
        return;
    }
    switch (c) {
    case '\n':
        str_puts(s, "\\n");
        return;
    case '\t':
        str_puts(s, "\\t");
        return;
    case '.':
        str_puts(s, in_class ? "." : "\\.");
        return;
    case '-':
        str_puts(s, in_class ? "\\-" : "-");
        return;
    default:
        str_putc(s, (char)c);
    }
}

static bool is_word(int c)
{
    return isalnum(c) || c == '_';
}

/* The escape classes \d \w \s and their negations, into `set`. */
static void escape_set(char e, uint8_t *set)
{
    for (int c = 0; c < 256; c++) {
        bool in = tolower(e) == 'd' ? isdigit(c) : tolower(e) == 'w' ? is_word(c) : isspace(c);
        if (in != (bool)isupper(e))
            set_bit(set, c);
    }
}

static const char *const posix_names[] = {"alpha", "digit", "alnum",  "upper",
                                          "lower", "space", "xdigit", "punct"};

static bool posix_has(unsigned k, int c)
{
    switch (k) {
    case 0:
        return isalpha(c);
    case 1:
        return isdigit(c);
    case 2:
        return isalnum(c);
    case 3:
        return isupper(c);
    case 4:
        return islower(c);
    case 5:
        return isspace(c);
    case 6:
        return isxdigit(c);
    default:
        return ispunct(c);
    }
}

/* One item of a bracket class, appended to the node's text and set. */
static void gen_class_item(struct gen *g, struct gnode *nd, struct str *t)
{
    static const char *const ranges[] = {"a-c", "A-C", "0-9", "a-z", "b-c", "0-1", "A-Z"};
    static const char escs[] = "dwsDWS";
    uint32_t roll = rng_below(g->rng, 6);
    if (roll == 0) {
        const char *r = ranges[rng_below(g->rng, 7)];
        str_puts(t, r);
        for (int c = r[0]; c <= r[2]; c++)
            set_bit(nd->set, c);
    } else if (roll == 1) {
        char e = escs[rng_below(g->rng, 6)];
        str_printf(t, "\\%c", e);
        escape_set(e, nd->set);
    } else if (roll == 2) {
        unsigned k = rng_below(g->rng, 8);
        str_printf(t, "[:%s:]", posix_names[k]);
        for (int c = 0; c < 256; c++)
            if (posix_has(k, c))
                set_bit(nd->set, c);
    } else {
        uint8_t c = (uint8_t)pat_alpha[rng_below(g->rng, sizeof(pat_alpha) - 1)];
        render_byte(t, c, (uint8_t)rng_below(g->rng, 6), true);
        set_bit(nd->set, c);
    }
}

static int gen_class(struct gen *g)
{
    int i = gen_node(g, G_CLASS);
    struct gnode *nd = &g->v[i];
    struct str t = {0};
    if (rng_pct(g->rng, 35)) { /* a bare escape class: \d \D \w \W \s \S */
        char e = "dwsDWS"[rng_below(g->rng, 6)];
        str_printf(&t, "\\%c", e);
        escape_set(e, nd->set);
    } else {
        bool neg = rng_pct(g->rng, 25);
        str_puts(&t, neg ? "[^" : "[");
        unsigned items = 1 + rng_below(g->rng, 3);
        for (unsigned k = 0; k < items; k++)
            gen_class_item(g, nd, &t);
        str_putc(&t, ']');
        for (int k = 0; neg && k < 32; k++)
            nd->set[k] = (uint8_t)~nd->set[k];
    }
    ck_assert_uint_lt(t.n, sizeof(nd->text));
    memcpy(nd->text, t.p, t.n + 1);
    str_free(&t);
    return i;
}

static uint8_t gen_flag_bits(struct rng *r)
{
    uint8_t f = 0;
    while (f == 0) {
        f |= rng_pct(r, 50) ? RULE_F_CASELESS : 0;
        f |= rng_pct(r, 35) ? RULE_F_DOTALL : 0;
        f |= rng_pct(r, 35) ? RULE_F_MULTILINE : 0;
    }
    return f;
}

static int gen_alt(struct gen *g, int depth);

static int gen_group(struct gen *g, int depth)
{
    int i = gen_node(g, G_GROUP);
    g->v[i].group = (uint8_t)rng_below(g->rng, 3);
    if (g->v[i].group == 2)
        g->v[i].flags = gen_flag_bits(g->rng);
    int c = gen_alt(g, depth + 1);
    gen_add(g, i, c);
    return i;
}

static int gen_atom(struct gen *g, int depth)
{
    uint32_t roll = g->n > GEN_SOFT ? 0 : rng_below(g->rng, 100);
    if (roll < 48)
        return gen_byte(g);
    if (roll < 56)
        return gen_node(g, G_ANY);
    if (roll < 80)
        return gen_class(g);
    if (depth < 3)
        return gen_group(g, depth);
    return gen_byte(g);
}

static int gen_repeat(struct gen *g, int atom)
{
    int i = gen_node(g, G_REPEAT);
    struct gnode *nd = &g->v[i];
    nd->form = (uint8_t)rng_below(g->rng, 6);
    nd->lazy = rng_pct(g->rng, 25);
    switch (nd->form) {
    case 0:
        nd->min = 0, nd->max = REP_INF;
        break;
    case 1:
        nd->min = 1, nd->max = REP_INF;
        break;
    case 2:
        nd->min = 0, nd->max = 1;
        break;
    case 3:
        nd->min = nd->max = (uint8_t)(1 + rng_below(g->rng, 4));
        break;
    case 4:
        nd->min = (uint8_t)rng_below(g->rng, 4), nd->max = REP_INF;
        break;
    default:
        nd->min = (uint8_t)rng_below(g->rng, 3);
        nd->max = (uint8_t)(nd->min + 1 + rng_below(g->rng, 3));
    }
    gen_add(g, i, atom);
    return i;
}

static int gen_item(struct gen *g, int depth)
{
    uint32_t roll = g->n > GEN_SOFT ? 99 : rng_below(g->rng, 100);
    if (roll < 8) {
        int i = gen_node(g, G_ASSERT);
        /* ^ and $ inside a pattern mostly make Hyperscan refuse it ("embedded
         * anchors"), so they are rarer here and common at the ends (gen_seq). */
        g->v[i].byte = (uint8_t) "^$bBbBbBbB"[rng_below(g->rng, 10)];
        return i;
    }
    if (roll < 12) {
        int i = gen_node(g, G_FLAGS);
        g->v[i].flags = gen_flag_bits(g->rng);
        return i;
    }
    int a = gen_atom(g, depth);
    return rng_pct(g->rng, 30) ? gen_repeat(g, a) : a;
}

static int gen_seq(struct gen *g, int depth)
{
    int i = gen_node(g, G_SEQ);
    unsigned n = g->n > GEN_SOFT ? 1 : 1 + rng_below(g->rng, depth == 0 ? 6 : 4);
    bool bol = depth == 0 && rng_pct(g->rng, 12), eol = depth == 0 && rng_pct(g->rng, 12);
    if (bol) {
        int a = gen_node(g, G_ASSERT);
        g->v[a].byte = '^';
        gen_add(g, i, a);
    }
    for (unsigned k = 0; k < n; k++) {
        int c = gen_item(g, depth);
        gen_add(g, i, c);
    }
    if (eol) {
        int a = gen_node(g, G_ASSERT);
        g->v[a].byte = '$';
        gen_add(g, i, a);
    }
    return i;
}

static int gen_alt(struct gen *g, int depth)
{
    int i = gen_node(g, G_ALT);
    unsigned n = g->n <= GEN_SOFT && rng_pct(g->rng, 25) ? 2 + rng_below(g->rng, 2) : 1;
    for (unsigned k = 0; k < n; k++) {
        int c = gen_seq(g, depth);
        gen_add(g, i, c);
    }
    return i;
}

static void render_flags(struct str *s, uint8_t f)
{
    if (f & RULE_F_CASELESS)
        str_putc(s, 'i');
    if (f & RULE_F_DOTALL)
        str_putc(s, 's');
    if (f & RULE_F_MULTILINE)
        str_putc(s, 'm');
}

static void render(const struct gen *g, int i, struct str *s);

static void render_repeat(const struct gen *g, const struct gnode *nd, struct str *s)
{
    render(g, nd->child, s);
    switch (nd->form) {
    case 0:
        str_putc(s, '*');
        break;
    case 1:
        str_putc(s, '+');
        break;
    case 2:
        str_putc(s, '?');
        break;
    case 3:
        str_printf(s, "{%u}", nd->min);
        break;
    case 4:
        str_printf(s, "{%u,}", nd->min);
        break;
    default:
        str_printf(s, "{%u,%u}", nd->min, nd->max);
    }
    if (nd->lazy)
        str_putc(s, '?');
}

static void render(const struct gen *g, int i, struct str *s)
{
    const struct gnode *nd = &g->v[i];
    switch (nd->kind) {
    case G_BYTE:
        render_byte(s, nd->byte, nd->form, false);
        break;
    case G_ANY:
        str_putc(s, '.');
        break;
    case G_CLASS:
        str_puts(s, nd->text);
        break;
    case G_SEQ:
        for (int c = nd->child; c >= 0; c = g->v[c].next)
            render(g, c, s);
        break;
    case G_ALT:
        for (int c = nd->child; c >= 0; c = g->v[c].next) {
            if (c != nd->child)
                str_putc(s, '|');
            render(g, c, s);
        }
        break;
    case G_GROUP:
        str_puts(s, nd->group == 0 ? "(" : nd->group == 1 ? "(?:" : "(?");
        if (nd->group == 2) {
            render_flags(s, nd->flags);
            str_putc(s, ':');
        }
        render(g, nd->child, s);
        str_putc(s, ')');
        break;
    case G_REPEAT:
        render_repeat(g, nd, s);
        break;
    case G_ASSERT:
        if (nd->byte == 'b' || nd->byte == 'B')
            str_putc(s, '\\');
        str_putc(s, (char)nd->byte);
        break;
    case G_FLAGS:
        str_puts(s, "(?");
        render_flags(s, nd->flags);
        str_putc(s, ')');
        break;
    }
}

/* Can the node match the empty string, taking assertions and flags as empty? */
static bool nullable(const struct gen *g, int i)
{
    const struct gnode *nd = &g->v[i];
    switch (nd->kind) {
    case G_BYTE:
    case G_ANY:
    case G_CLASS:
        return false;
    case G_ASSERT:
    case G_FLAGS:
        return true;
    case G_SEQ:
        for (int c = nd->child; c >= 0; c = g->v[c].next)
            if (!nullable(g, c))
                return false;
        return true;
    case G_ALT:
        for (int c = nd->child; c >= 0; c = g->v[c].next)
            if (nullable(g, c))
                return true;
        return false;
    case G_GROUP:
        return nullable(g, nd->child);
    case G_REPEAT:
        return nd->min == 0 || nullable(g, nd->child);
    }
    return false;
}

/* Haystack bytes; the rare ones probe \s (\v \r), caseless (0xe9) and NUL. */
static const char hay_alpha[] = "aaaabbbbccccAABB0011__  --..\n\n\t";
static const char hay_rare[] = "\v\r\xe9*\0";

static uint8_t hay_byte(struct rng *r)
{
    if (rng_pct(r, 3))
        return (uint8_t)hay_rare[rng_below(r, sizeof(hay_rare) - 1)];
    return (uint8_t)hay_alpha[rng_below(r, sizeof(hay_alpha) - 1)];
}

static uint8_t maybe_flip(struct rng *r, uint8_t c, unsigned flags)
{
    if ((flags & RULE_F_CASELESS) && isalpha(c) && rng_pct(r, 50))
        return (uint8_t)(c ^ 0x20);
    return c;
}

static uint8_t sample_class(struct rng *r, const uint8_t *set, unsigned flags)
{
    for (int tries = 0; tries < 24; tries++) {
        uint8_t c = hay_byte(r);
        if (has_bit(set, c))
            return maybe_flip(r, c, flags);
    }
    for (int c = 0; c < 128; c++)
        if (has_bit(set, (c + 'a') & 127))
            return (uint8_t)((c + 'a') & 127);
    return 'a';
}

/* Appends a string the node (probably) matches; assertions are ignored. */
static void sample(const struct gen *g, int i, struct rng *r, unsigned *flags, struct str *out)
{
    const struct gnode *nd = &g->v[i];
    unsigned saved = *flags;
    switch (nd->kind) {
    case G_BYTE:
        str_putc(out, (char)maybe_flip(r, nd->byte, *flags));
        break;
    case G_ANY: {
        uint8_t c = hay_byte(r);
        str_putc(out, (char)(c == '\n' && !(*flags & RULE_F_DOTALL) ? 'x' : c));
        break;
    }
    case G_CLASS:
        str_putc(out, (char)sample_class(r, nd->set, *flags));
        break;
    case G_SEQ:
        for (int c = nd->child; c >= 0; c = g->v[c].next)
            sample(g, c, r, flags, out);
        break;
    case G_ALT: {
        unsigned k = 0, pick;
        for (int c = nd->child; c >= 0; c = g->v[c].next)
            k++;
        pick = rng_below(r, k);
        int c = nd->child;
        while (pick-- > 0)
            c = g->v[c].next;
        sample(g, c, r, flags, out);
        break;
    }
    case G_GROUP:
        *flags |= nd->flags;
        sample(g, nd->child, r, flags, out);
        *flags = saved;
        break;
    case G_REPEAT: {
        unsigned span = nd->max == REP_INF ? 3 : (unsigned)(nd->max - nd->min);
        unsigned k = nd->min + rng_below(r, span + 1);
        for (unsigned x = 0; x < k; x++)
            sample(g, nd->child, r, flags, out);
        break;
    }
    case G_ASSERT:
        break;
    case G_FLAGS:
        *flags |= nd->flags;
        break;
    }
}

/* Generates one random regex rule into `r` and its tree into `g`. */
static void gen_rule(struct gen *g, struct rng *rng, struct trule *r, size_t index)
{
    memset(g, 0, sizeof(*g));
    g->rng = rng;
    g->root = gen_alt(g, 0);
    struct str s = {0};
    render(g, g->root, &s);
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "r%zu", index);
    r->kind = RULE_REGEX;
    r->pat = s.p;
    r->len = s.n;
    r->hs = xstrndup(s.p, s.n);
    r->flags |= rng_pct(rng, 25) ? RULE_F_CASELESS : 0;
    r->flags |= rng_pct(rng, 25) ? RULE_F_DOTALL : 0;
    r->flags |= rng_pct(rng, 25) ? RULE_F_MULTILINE : 0;
    r->flags |= rng_pct(rng, 8) ? RULE_F_SINGLEMATCH : 0;
    r->nullable = nullable(g, g->root);
}

static void hay_random(struct rng *r, struct str *h, size_t len)
{
    for (size_t i = 0; i < len; i++)
        str_putc(h, (char)hay_byte(r));
}

/* Random filler with strings drawn from the rules' trees planted in it, often
 * at the very start and end, sometimes followed by a final '\n'. */
static void hay_planted(struct gen *const *gens, const uint32_t *flags, size_t ng, struct rng *r,
                        struct str *h)
{
    size_t target = 8 + rng_below(r, 160);
    bool first = rng_pct(r, 40);
    while (h->n < target) {
        if (first || rng_pct(r, 50)) {
            size_t k = rng_below(r, (uint32_t)ng);
            unsigned f = flags[k];
            sample(gens[k], gens[k]->root, r, &f, h);
        } else {
            hay_random(r, h, rng_below(r, 6));
        }
        first = false;
    }
    if (rng_pct(r, 30)) {
        size_t k = rng_below(r, (uint32_t)ng);
        unsigned f = flags[k];
        sample(gens[k], gens[k]->root, r, &f, h);
    }
    if (rng_pct(r, 25))
        str_putc(h, '\n');
}

/* ------------------------------------------------------------------------ */
/* Random cases.                                                             */

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? strtoull(v, NULL, 0) : dflt;
}

/* The number of random cases: `dflt` times VKS_HSDIFF_SCALE (may be < 1). */
static uint64_t case_count(uint64_t dflt)
{
    const char *v = getenv("VKS_HSDIFF_SCALE");
    double scale = v != NULL && *v != '\0' ? strtod(v, NULL) : 1.0;
    return (uint64_t)((double)dflt * (scale > 0 ? scale : 1.0) + 0.5);
}

#define HAYS_PER_CASE 8

/* Builds HAYS_PER_CASE haystacks: the empty one, random ones, planted ones. */
static void make_hays(struct gen *const *gens, const uint32_t *flags, size_t ng, struct rng *r,
                      struct str *bufs, struct hay *hays)
{
    for (int k = 0; k < HAYS_PER_CASE; k++) {
        bufs[k].n = 0;
        str_putn(&bufs[k], "", 0);
        if (k == 1)
            hay_random(r, &bufs[k], 1 + rng_below(r, 4));
        else if (k == 2 || k == 3)
            hay_random(r, &bufs[k], 16 + rng_below(r, 300));
        else if (k > 3)
            hay_planted(gens, flags, ng, r, &bufs[k]);
        snprintf(hays[k].name, sizeof(hays[k].name), "#%d", k);
        hays[k].p = (const uint8_t *)bufs[k].p;
        hays[k].len = bufs[k].n;
    }
}

static void random_single(uint64_t dflt, bool bitnfa)
{
    force_bitnfa = bitnfa;
    uint64_t base = env_u64("VKS_HSDIFF_SEED", 1);
    uint64_t cases = case_count(dflt);
    struct stats st = {0};
    struct gen *g = xrealloc(NULL, sizeof(*g));
    struct str bufs[HAYS_PER_CASE] = {{0}};
    struct hay hays[HAYS_PER_CASE];
    for (uint64_t c = 0; c < cases; c++) {
        uint64_t seed = base * 1000003u + c;
        struct rng rng = {seed};
        struct trule r;
        gen_rule(g, &rng, &r, 0);
        make_hays(&g, &r.flags, 1, &rng, bufs, hays);
        char what[64];
        snprintf(what, sizeof(what), "single case %" PRIu64, c);
        compare_set(&r, 1, 0, seed, what, true, hays, HAYS_PER_CASE, &st);
        trule_free(&r);
    }
    for (int k = 0; k < HAYS_PER_CASE; k++)
        str_free(&bufs[k]);
    free(g);
    stats_print(&st, "random single rules");
    ck_assert_msg(st.mismatches == 0,
                  "%u (rule, haystack) pairs differ from Hyperscan; "
                  "reproducers above",
                  st.mismatches);
    ck_assert_msg(st.bad_rejects == 0, "%u rules rejected or accepted against the contract",
                  st.bad_rejects);
    /* The test means nothing if most patterns were skipped or never matched. */
    ck_assert_uint_gt(st.compared, cases / 3);
    ck_assert_uint_gt(st.hits, 20 * (uint64_t)cases);
    if (force_bitnfa)
        ck_assert_uint_eq(st.nfa_rules, st.rules - st.our_rejects - st.both_rejects);
}

START_TEST(test_random_single)
{
    random_single(2500, false);
}
END_TEST

/* The same generator with every rule on the bit-NFA engine: assertions,
 * flags, alternations and repeats all through the position automaton. */
START_TEST(test_random_single_bitnfa)
{
    random_single(1500, true);
}
END_TEST

/* A random literal (with escapes) or hex-string rule and its Hyperscan form. */
static void gen_plain_rule(struct rng *rng, struct trule *r, size_t index, bool hex)
{
    static const char lit[] = "abcAB01_ -.*";
    struct str pat = {0}, hs = {0};
    size_t n = 1 + rng_below(rng, 6);
    for (size_t k = 0; k < n; k++) {
        bool any = hex && rng_pct(rng, 20);
        uint8_t c = rng_pct(rng, 10) ? '\n' : (uint8_t)lit[rng_below(rng, sizeof(lit) - 1)];
        if (hex && any)
            str_puts(&pat, k ? " ??" : "??");
        else if (hex)
            str_printf(&pat, k ? " %02x" : "%02x", c);
        else if (c == '\n')
            str_puts(&pat, "\\n");
        else if (rng_pct(rng, 10))
            str_printf(&pat, "\\x%02x", c);
        else
            str_putc(&pat, (char)c);
        if (any)
            str_puts(&hs, "[\\x00-\\xff]");
        else
            str_printf(&hs, "\\x%02x", c);
    }
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "%s%zu", hex ? "h" : "l", index);
    r->kind = hex ? RULE_HEX : RULE_LITERAL;
    r->pat = pat.p;
    r->len = pat.n;
    r->hs = hs.p;
    r->flags = rng_pct(rng, 30) ? RULE_F_CASELESS : 0;
    r->flags |= rng_pct(rng, 5) ? RULE_F_SINGLEMATCH : 0;
    r->nullable = 0;
}

#define MULTI_MAX 16

static void random_multi(uint64_t dflt, bool bitnfa)
{
    force_bitnfa = bitnfa;
    static const uint32_t budgets[] = {0, 4096, 600, 150};
    uint64_t base = env_u64("VKS_HSDIFF_SEED", 1);
    uint64_t cases = case_count(dflt);
    struct stats st = {0};
    struct gen *g = xrealloc(NULL, MULTI_MAX * sizeof(*g));
    struct str bufs[HAYS_PER_CASE] = {{0}};
    struct hay hays[HAYS_PER_CASE];
    for (uint64_t c = 0; c < cases; c++) {
        uint64_t seed = base * 7000003u + c;
        struct rng rng = {seed};
        size_t n = 2 + rng_below(&rng, MULTI_MAX - 1), ng = 0;
        struct trule r[MULTI_MAX];
        struct gen *gens[MULTI_MAX];
        uint32_t flags[MULTI_MAX];
        for (size_t k = 0; k < n; k++) {
            uint32_t kind = rng_below(&rng, 10);
            if (kind < 7) {
                gen_rule(&g[ng], &rng, &r[k], k);
                gens[ng] = &g[ng];
                flags[ng++] = r[k].flags;
            } else {
                gen_plain_rule(&rng, &r[k], k, kind == 9);
            }
        }
        if (ng == 0) { /* no regex drawn: the planted haystacks need one */
            trule_free(&r[0]);
            gen_rule(&g[0], &rng, &r[0], 0);
            gens[0] = &g[0];
            flags[ng++] = r[0].flags;
        }
        make_hays(gens, flags, ng, &rng, bufs, hays);
        /* Literals land in the haystacks through the random filler only when
         * short; plant a few outright. */
        for (size_t k = 0; k < n; k++)
            if (r[k].kind == RULE_LITERAL && !memchr(r[k].pat, '\\', r[k].len))
                str_putn(&bufs[HAYS_PER_CASE - 1], r[k].pat, r[k].len);
        hays[HAYS_PER_CASE - 1].p = (const uint8_t *)bufs[HAYS_PER_CASE - 1].p;
        hays[HAYS_PER_CASE - 1].len = bufs[HAYS_PER_CASE - 1].n;
        char what[64];
        snprintf(what, sizeof(what), "multi case %" PRIu64 " (%zu rules)", c, n);
        compare_set(r, n, budgets[c % 4], seed, what, true, hays, HAYS_PER_CASE, &st);
        for (size_t k = 0; k < n; k++)
            trule_free(&r[k]);
    }
    for (int k = 0; k < HAYS_PER_CASE; k++)
        str_free(&bufs[k]);
    free(g);
    stats_print(&st, "random multi-rule catalogs");
    ck_assert_msg(st.mismatches == 0,
                  "%u (catalog, haystack) pairs differ from Hyperscan; "
                  "reproducers above",
                  st.mismatches);
    ck_assert_msg(st.bad_rejects == 0, "%u rules rejected or accepted against the contract",
                  st.bad_rejects);
    ck_assert_uint_gt(st.compared, st.rules / 3);
    ck_assert_uint_gt(st.hits, 50 * (uint64_t)cases);
}

START_TEST(test_random_multi)
{
    random_multi(250, false);
}
END_TEST

/* Multi-rule bit-NFA groups: rules sharing ids, literals and regexes packed
 * into one position automaton. */
START_TEST(test_random_multi_bitnfa)
{
    random_multi(150, true);
}
END_TEST

/* ---- random hex strings in YARA's syntax ---- */

#define HEX_SAMPLES 6

/* Bytes the hex rules and their haystacks are made of: binary and text,
 * letters for the `i` flag, few enough that random filler matches too. */
static const uint8_t hex_alpha[] = {0x00, 0x01, 0x0a, 0x41, 0x42, 0x4d,
                                    0x5a, 0x61, 0x7f, 0x90, 0xa1, 0xff};

struct hexgen {
    struct rng *r;
    struct str pat, hs;
    struct str samp[HEX_SAMPLES]; /* strings the rule matches, built alongside */
    int depth;
};

static uint8_t hex_pick(struct rng *r)
{
    return hex_alpha[rng_below(r, sizeof(hex_alpha))];
}

/* A byte whose bits under `mask` equal those of `want` (with `negate`: differ). */
static uint8_t hex_fit(struct rng *r, uint8_t want, uint8_t mask, bool negate)
{
    for (int tries = 0; tries < 16; tries++) {
        uint8_t c = rng_pct(r, 70) ? hex_pick(r) : (uint8_t)rng_below(r, 256);
        if (((c & mask) == (want & mask)) != negate)
            return c;
    }
    return negate ? (uint8_t)((want ^ mask) & mask) : want; /* differs where the mask is set */
}

static void hex_put(struct hexgen *h, uint32_t active, uint8_t want, uint8_t mask, bool negate)
{
    for (int k = 0; k < HEX_SAMPLES; k++)
        if (active & (1u << k))
            str_putc(&h->samp[k], (char)hex_fit(h->r, want, mask, negate));
}

/* One token: a byte, ??, a half byte, a ~ negation, a jump or (a | b). */
static void hex_gen_item(struct hexgen *h, uint32_t active, bool edge)
{
    struct rng *r = h->r;
    uint32_t k = rng_below(r, 100);
    if (edge && k >= 72)
        k = rng_below(r, 72); /* the ends are bytes: never a jump, never nullable */
    if (h->pat.n)
        str_putc(&h->pat, ' ');
    uint8_t b = hex_pick(r);
    if (k < 45) { /* a byte */
        str_printf(&h->pat, rng_pct(r, 50) ? "%02x" : "%02X", b);
        str_printf(&h->hs, "\\x%02x", b);
        hex_put(h, active, b, 0xff, false);
    } else if (k < 52) { /* any byte */
        str_puts(&h->pat, "??");
        str_puts(&h->hs, "[\\x00-\\xff]");
        hex_put(h, active, 0, 0, false);
    } else if (k < 72) { /* a half byte, or a negation of a byte or half byte */
        bool negate = k >= 62;
        uint8_t mask = rng_pct(r, 40) ? 0xff : rng_pct(r, 50) ? 0xf0 : 0x0f;
        if (negate)
            str_putc(&h->pat, '~');
        if (mask == 0xff)
            str_printf(&h->pat, "%02x", b);
        else if (mask == 0xf0)
            str_printf(&h->pat, "%x?", b >> 4);
        else
            str_printf(&h->pat, "?%x", b & 15);
        str_puts(&h->hs, negate ? "[^" : "[");
        for (unsigned c = 0; c < 256; c++)
            if ((c & mask) == (b & mask))
                str_printf(&h->hs, "\\x%02x", c);
        str_putc(&h->hs, ']');
        hex_put(h, active, b, mask, negate);
    } else if (k < 86 || h->depth >= 3) { /* a jump */
        uint32_t mn = rng_below(r, 5), mx = mn + rng_below(r, 5);
        uint32_t form = rng_below(r, 8);
        if (form == 0) {
            str_puts(&h->pat, rng_pct(r, 50) ? "[-]" : "[ - ]");
            str_puts(&h->hs, "[\\x00-\\xff]*");
            mn = 0;
            mx = UINT32_MAX;
        } else if (form == 1) {
            str_printf(&h->pat, "[%u-]", mn);
            str_printf(&h->hs, "[\\x00-\\xff]{%u,}", mn);
            mx = UINT32_MAX;
        } else if (form < 4 && mn > 0) {
            str_printf(&h->pat, "[%u]", mn);
            str_printf(&h->hs, "[\\x00-\\xff]{%u}", mn);
            mx = mn;
        } else {
            mx += mx == 0;
            str_printf(&h->pat, "[%u-%u]", mn, mx);
            str_printf(&h->hs, "[\\x00-\\xff]{%u,%u}", mn, mx);
        }
        for (int s = 0; s < HEX_SAMPLES; s++) {
            if (!(active & (1u << s)))
                continue;
            uint32_t n = mn + rng_below(r, (mx == UINT32_MAX ? 6 : mx - mn + 1));
            for (uint32_t i = 0; i < n; i++)
                str_putc(&h->samp[s], (char)hex_pick(r));
        }
    } else { /* alternatives, each sample taking one of them */
        uint32_t nb = 2 + rng_below(r, 2), pick[HEX_SAMPLES];
        for (int s = 0; s < HEX_SAMPLES; s++)
            pick[s] = rng_below(r, nb);
        str_putc(&h->pat, '(');
        str_puts(&h->hs, "(?:");
        h->depth++;
        for (uint32_t br = 0; br < nb; br++) {
            if (br) {
                str_puts(&h->pat, rng_pct(r, 50) ? " |" : "|");
                str_putc(&h->hs, '|');
            }
            uint32_t sub = 0;
            for (int s = 0; s < HEX_SAMPLES; s++)
                if ((active & (1u << s)) && pick[s] == br)
                    sub |= 1u << s;
            uint32_t items = 1 + rng_below(r, 3);
            for (uint32_t i = 0; i < items; i++)
                hex_gen_item(h, sub, false);
        }
        h->depth--;
        str_puts(&h->pat, rng_pct(r, 50) ? " )" : ")");
        str_putc(&h->hs, ')');
    }
}

static void gen_hex_rule(struct hexgen *h, struct trule *r, size_t index)
{
    struct rng *rng = h->r;
    h->pat.n = h->hs.n = 0;
    str_putn(&h->pat, "", 0);
    str_putn(&h->hs, "", 0);
    for (int k = 0; k < HEX_SAMPLES; k++) {
        h->samp[k].n = 0;
        str_putn(&h->samp[k], "", 0);
    }
    uint32_t items = 1 + rng_below(rng, 6), all = (1u << HEX_SAMPLES) - 1;
    for (uint32_t i = 0; i < items; i++)
        hex_gen_item(h, all, i == 0 || i + 1 == items);
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "x%zu", index);
    r->kind = RULE_HEX;
    r->pat = xstrndup(h->pat.p, h->pat.n);
    r->len = h->pat.n;
    r->hs = xstrndup(h->hs.p, h->hs.n);
    r->flags = rng_pct(rng, 20) ? RULE_F_CASELESS : 0;
    r->flags |= rng_pct(rng, 5) ? RULE_F_SINGLEMATCH : 0;
}

/* Whether a hex string uses more than byte pairs and ??: a jump, an
 * alternative, a negation or a half byte. */
static bool hex_new_syntax(const char *pat)
{
    for (const char *q = pat; *q; q++) {
        if (*q == '[' || *q == '(' || *q == '~')
            return true;
        if (*q == '?' && !(q[1] == '?' || (q > pat && q[-1] == '?')))
            return true;
    }
    return false;
}

/* Random YARA-style hex strings (byte pairs, ??, half bytes, ~ negations,
 * bounded and unbounded jumps, nested alternatives; docs/rules.md) in sets
 * of 1 to 12, with their Hyperscan translations, against haystacks of the
 * same bytes with strings of the rules planted: every rule accepted by both
 * engines, every (rule, end) equal, on the DFA groups, the bit-NFA (every
 * third set) and the small state budgets that split groups. */
START_TEST(test_random_hex)
{
    static const uint32_t budgets[] = {0, 4096, 600, 150};
    uint64_t base = env_u64("VKS_HSDIFF_SEED", 1);
    uint64_t cases = case_count(300);
    struct stats st = {0};
    struct hexgen h = {0};
    struct str bufs[HAYS_PER_CASE] = {{0}};
    struct hay hays[HAYS_PER_CASE];
    size_t syntax = 0; /* rules that use more than pairs and ?? */
    for (uint64_t c = 0; c < cases; c++) {
        uint64_t seed = base * 9000011u + c;
        struct rng rng = {seed};
        h.r = &rng;
        size_t n = 1 + rng_below(&rng, 12);
        struct trule r[12];
        struct str plant[12][HEX_SAMPLES] = {{{0}}};
        for (size_t k = 0; k < n; k++) {
            gen_hex_rule(&h, &r[k], k);
            syntax += hex_new_syntax(r[k].pat);
            for (int s = 0; s < HEX_SAMPLES; s++)
                str_putn(&plant[k][s], h.samp[s].p, h.samp[s].n);
        }
        for (int b = 0; b < HAYS_PER_CASE; b++) {
            bufs[b].n = 0;
            str_putn(&bufs[b], "", 0);
            size_t target = b == 0 ? 0 : 4 + rng_below(&rng, 200);
            while (bufs[b].n < target) {
                if (rng_pct(&rng, 45)) {
                    size_t k = rng_below(&rng, (uint32_t)n);
                    struct str *p = &plant[k][rng_below(&rng, HEX_SAMPLES)];
                    str_putn(&bufs[b], p->p, p->n);
                } else {
                    for (uint32_t i = rng_below(&rng, 8); i > 0; i--)
                        str_putc(&bufs[b], (char)hex_pick(&rng));
                }
            }
            snprintf(hays[b].name, sizeof(hays[b].name), "#%d", b);
            hays[b].p = (const uint8_t *)bufs[b].p;
            hays[b].len = bufs[b].n;
        }
        force_bitnfa = c % 3 == 2;
        char what[64];
        snprintf(what, sizeof(what), "hex case %" PRIu64 " (%zu rules)", c, n);
        compare_set(r, n, budgets[c % 4], seed, what, true, hays, HAYS_PER_CASE, &st);
        for (size_t k = 0; k < n; k++) {
            trule_free(&r[k]);
            for (int s = 0; s < HEX_SAMPLES; s++)
                str_free(&plant[k][s]);
        }
    }
    force_bitnfa = false;
    for (int b = 0; b < HAYS_PER_CASE; b++)
        str_free(&bufs[b]);
    str_free(&h.pat);
    str_free(&h.hs);
    for (int k = 0; k < HEX_SAMPLES; k++)
        str_free(&h.samp[k]);
    stats_print(&st, "random hex strings");
    ck_assert_msg(st.mismatches == 0,
                  "%u (catalog, haystack) pairs differ from Hyperscan; reproducers above",
                  st.mismatches);
    ck_assert_msg(st.bad_rejects == 0, "%u rules rejected or accepted against the contract",
                  st.bad_rejects);
    /* every generated rule is valid for both engines */
    ck_assert_uint_eq(st.our_rejects + st.both_rejects, 0);
    ck_assert_uint_gt(st.compared, st.rules * 9 / 10);
    ck_assert_uint_gt(syntax, st.rules / 2);
    ck_assert_uint_gt(st.hits, 20 * (uint64_t)cases);
}
END_TEST

struct id_hit {
    uint32_t id;
    uint64_t end;
};

struct id_hits {
    struct id_hit *v;
    size_t n, cap;
};

static void id_hits_push(struct id_hits *h, uint32_t id, uint64_t end)
{
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 1024;
        h->v = xrealloc(h->v, h->cap * sizeof(*h->v));
    }
    h->v[h->n++] = (struct id_hit){id, end};
}

static int on_hs_id(unsigned id, unsigned long long from, unsigned long long to, unsigned flags,
                    void *ctx)
{
    (void)from;
    (void)flags;
    id_hits_push(ctx, id, to);
    return 0;
}

static int id_hit_cmp(const void *a, const void *b)
{
    const struct id_hit *x = a, *y = b;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* 20,000 random binary strings of 8 to 32 bytes covering all 256 byte
 * values (the shape of antivirus and IDS signature sets, and of
 * scan_bench's binary-20k), compiled at the default options (one literal
 * group, matched by rules/cpulit.c), against Hyperscan on 1 MiB of random
 * bytes with 6,000 of the strings planted, some overlapping: no rule
 * rejected, every (rule, end) equal. */
START_TEST(test_binary_literals_20k)
{
    enum { N = 20000, LEN = 1 << 20, PLANTS = 6000 };
    struct rng rng = {0xb1a7e5u};
    struct rule_src *src = xrealloc(NULL, N * sizeof(*src));
    char **pat = xrealloc(NULL, N * sizeof(*pat));
    char(*ids)[16] = xrealloc(NULL, N * sizeof(*ids));
    unsigned *hsid = xrealloc(NULL, N * sizeof(*hsid)), *hsfl = xrealloc(NULL, N * sizeof(*hsfl));
    uint8_t(*raw)[32] = xrealloc(NULL, N * sizeof(*raw));
    uint32_t *rawlen = xrealloc(NULL, N * sizeof(*rawlen));
    uint32_t seen[256] = {0};
    for (size_t i = 0; i < N; i++) {
        rawlen[i] = 8 + rng_below(&rng, 25);
        struct str t = {0};
        for (uint32_t k = 0; k < rawlen[i]; k++) {
            raw[i][k] = (uint8_t)rng_below(&rng, 256);
            seen[raw[i][k]]++;
            str_printf(&t, "\\x%02x", raw[i][k]);
        }
        pat[i] = t.p;
        snprintf(ids[i], sizeof(ids[i]), "b%zu", i);
        hsid[i] = (unsigned)i;
        hsfl[i] = 0;
        src[i] = (struct rule_src){ids[i], RULE_REGEX, pat[i], t.n, 0, 0};
    }
    for (int v = 0; v < 256; v++)
        ck_assert_uint_gt(seen[v], 0);
    struct rules_options ro = {0};
    struct rules_result res = {0};
    ck_assert_int_eq(rules_compile(src, N, &ro, &res, NULL), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    hs_database_t *db = NULL;
    hs_compile_error_t *ce = NULL;
    ck_assert_int_eq(
        hs_compile_multi((const char *const *)pat, hsfl, hsid, N, HS_MODE_BLOCK, NULL, &db, &ce),
        HS_SUCCESS);
    hs_scratch_t *scratch = NULL;
    ck_assert_int_eq(hs_alloc_scratch(db, &scratch), HS_SUCCESS);
    uint8_t *buf = xrealloc(NULL, LEN);
    for (size_t i = 0; i < LEN; i++)
        buf[i] = (uint8_t)rng_below(&rng, 256);
    for (int k = 0; k < PLANTS; k++) {
        uint32_t i = rng_below(&rng, N);
        size_t at = rng_below(&rng, LEN - 32);
        memcpy(buf + at, raw[i], rawlen[i]);
    }
    struct id_hits theirs = {0}, ours = {0};
    ck_assert_int_eq(hs_scan(db, (const char *)buf, LEN, 0, scratch, on_hs_id, &theirs),
                     HS_SUCCESS);
    struct scan_hits ref = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, buf, LEN, SCAN_ALL, &ref), 0);
    uint32_t *input = xrealloc(NULL, N * sizeof(*input)); /* catalog rule -> input */
    for (size_t i = 0; i < N; i++)
        input[res.rule_index[i]] = (uint32_t)i;
    for (size_t h = 0; h < ref.n; h++)
        id_hits_push(&ours, input[ref.v[h].rule], ref.v[h].end);
    qsort(theirs.v, theirs.n, sizeof(*theirs.v), id_hit_cmp);
    qsort(ours.v, ours.n, sizeof(*ours.v), id_hit_cmp);
    ck_assert_uint_ge(theirs.n, PLANTS / 2); /* later plants overwrite some */
    ck_assert_uint_eq(ours.n, theirs.n);
    for (size_t h = 0; h < ours.n; h++)
        ck_assert_msg(ours.v[h].id == theirs.v[h].id && ours.v[h].end == theirs.v[h].end,
                      "hit %zu: rule %u end %" PRIu64 " against Hyperscan's %u at %" PRIu64, h,
                      ours.v[h].id, ours.v[h].end, theirs.v[h].id, theirs.v[h].end);
    free(theirs.v);
    free(ours.v);
    free(input);
    scan_hits_finish(&ref);
    free(buf);
    hs_free_scratch(scratch);
    hs_free_database(db);
    rules_result_finish(&res);
    for (size_t i = 0; i < N; i++)
        free(pat[i]);
    free(pat);
    free(src);
    free(ids);
    free(hsid);
    free(hsfl);
    free(raw);
    free(rawlen);
}
END_TEST

/* The CPU engine's literal fast path (rules/cpuplan.c) against Hyperscan
 * for random literal sets whose rules share ids (about four rules an id,
 * suffixes and case variants of each other, caseless, binary bytes): each
 * (id, end) once, under the id's first rule, in every scan mode's terms
 * that Hyperscan has (all matches); refscan gives the CPU engine's hits.
 * _i 0: DFA groups; 1: one literal group (CAT_GF_LITERAL: refscan and the
 * CPU engine match it with rules/cpulit.c). */
/* A catalog split by cpuscan_split_lookback whose bounded part holds a
 * gated group walked in full: each bounded segment finds the factor ends
 * within the bounded groups' lookback of its start (matches straddle its
 * start), not from the buffer's start, and the unbounded part in pieces
 * joins to the whole walk; every mode against refscan, over many cuts. */
START_TEST(test_split_gated_segments)
{
    struct rule_src src[] = {
        {"conf", RULE_REGEX, "passphrase[^\"\\n]*\"", 0, 0, 0},
        {"gap", RULE_REGEX, "key[^\\n]{0,90}tal", 0, 0, 0},
        {"gap2", RULE_REGEX, "(?i)bea[ \\t]{1,9}[a-z0-9]{8,40}zz", 0, 0, 0},
    };
    for (size_t i = 0; i < 3; i++)
        src[i].len = strlen(src[i].pattern);
    /* gate what has factors, 3-byte ones too: in a forward-confirmed
     * catalog such groups are walked in full (cpuplan "strict") */
    struct rules_options ro = {.gate_states = 1, .gate_bits = 8};
    struct rules_result res = {0};
    ck_assert_int_eq(rules_compile(src, 3, &ro, &res, NULL), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    const struct catalog *cat = res.catalog;
    uint64_t lb = cpuscan_split_lookback(cat);
    ck_assert_uint_eq(cpuscan_lookback(cat), CPUSCAN_UNSEGMENTABLE);
    ck_assert_uint_ne(lb, CPUSCAN_UNSEGMENTABLE);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_get(cat, &plan), 0);
    bool bounded_gated = false; /* the walk this test is about */
    for (uint32_t i = 0; i < plan->n_walk_gated; i++)
        bounded_gated |=
            cpuscan_group_maxlen(cat, plan->n_dfa + plan->walks[i]) != CATALOG_UNBOUNDED;
    cpuplan_put(plan);
    ck_assert(bounded_gated);
    struct rng rng = {0x9a7ed5u};
    struct str h = {0};
    while (h.n < (64u << 10)) {
        uint32_t k = rng_below(&rng, 6);
        if (k == 0)
            str_printf(&h, "key");
        else if (k == 1)
            str_printf(&h, "tal");
        else if (k == 2)
            str_printf(&h, "Bea \tabc%uzz", rng_below(&rng, 1u << 30));
        else if (k == 3)
            str_printf(&h, "passphrase \"");
        else
            for (uint32_t n = rng_below(&rng, 40); n > 0; n--)
                str_putc(&h, " -x\"\n"[rng_below(&rng, 5)]);
    }
    struct hay hay = {.p = (const uint8_t *)h.p, .len = h.n};
    for (int m = SCAN_ALL; m <= SCAN_COUNT; m++) {
        struct scan_hits want = {0};
        ck_assert_int_eq(refscan_buffer(cat, hay.p, hay.len, (enum scan_mode)m, &want), 0);
        ck_assert_uint_ge(want.n, m == SCAN_ALL ? 500 : 3); /* every rule matches */
        for (uint32_t nseg = 7; nseg <= 61; nseg += 27) {
            struct cpuscan_scratch *sc;
            ck_assert_int_eq(cpuscan_scratch_create(&sc), 0);
            struct cpuscan_part *parts = calloc(nseg + 1, sizeof(*parts));
            unbounded_pieces(cat, &hay, (enum scan_mode)m, 3, 5, sc, &parts[0]);
            for (uint32_t k = 0; k < nseg; k++)
                ck_assert_int_eq(cpuscan_segment_groups(cat, CPUSCAN_BOUNDED, hay.p, hay.len,
                                                        hay.len * k / nseg,
                                                        hay.len * (k + 1) / nseg, (enum scan_mode)m,
                                                        0, NULL, NULL, sc, &parts[k + 1]),
                                 0);
            struct scan_hits got = {0};
            uint64_t dropped = 0;
            ck_assert_int_eq(cpuscan_merge(cat, (enum scan_mode)m, parts, nseg + 1, UINT64_MAX,
                                           false, &got, &dropped),
                             0);
            ck_assert_uint_eq(got.n, want.n);
            for (size_t i = 0; i < got.n; i++)
                ck_assert_msg(got.v[i].rule == want.v[i].rule && got.v[i].end == want.v[i].end &&
                                  got.v[i].count == want.v[i].count,
                              "mode %d, %u segments, hit %zu", m, nseg, i);
            for (uint32_t k = 0; k <= nseg; k++)
                cpuscan_part_finish(&parts[k]);
            free(parts);
            scan_hits_finish(&got);
            cpuscan_scratch_destroy(sc);
        }
        scan_hits_finish(&want);
    }
    free(h.p);
    rules_result_finish(&res);
}
END_TEST

START_TEST(test_cpu_engine_shared_literals)
{
    struct rng rng = {0x5eed1d5u};
    static const char alpha[] = {'a', 'b', 'A', 'c', 'z', 0x01, (char)0xfe, '\n'};
    uint64_t compared = 0;
    for (int round = 0; round < 6; round++) {
        size_t n = 80 + rng_below(&rng, 300), nid = n / 4 + 1;
        struct rule_src *src = xrealloc(NULL, n * sizeof(*src));
        char **pat = xrealloc(NULL, n * sizeof(*pat)), **hsx = xrealloc(NULL, n * sizeof(*hsx));
        char(*ids)[16] = xrealloc(NULL, n * sizeof(*ids));
        unsigned *hsid = xrealloc(NULL, n * sizeof(*hsid)),
                 *hsfl = xrealloc(NULL, n * sizeof(*hsfl));
        uint8_t(*raw)[16] = xrealloc(NULL, n * sizeof(*raw));
        uint32_t *rawlen = xrealloc(NULL, n * sizeof(*rawlen));
        for (size_t i = 0; i < n; i++) {
            uint32_t len = 4 + rng_below(&rng, 9);
            size_t from = i > 0 && rng_pct(&rng, 40) ? rng_below(&rng, (uint32_t)i) : i;
            if (from != i && rawlen[from] >= 4) { /* a suffix or a case variant */
                len = 4 + rng_below(&rng, rawlen[from] - 3);
                memcpy(raw[i], raw[from] + rawlen[from] - len, len);
                for (uint32_t k = 0; k < len; k++)
                    if (isalpha(raw[i][k]) && rng_pct(&rng, 30))
                        raw[i][k] ^= 0x20;
            } else {
                for (uint32_t k = 0; k < len; k++)
                    raw[i][k] = (uint8_t)alpha[rng_below(&rng, sizeof(alpha))];
            }
            rawlen[i] = len;
            uint32_t id =
                from != i && rng_pct(&rng, 70) ? hsid[from] : rng_below(&rng, (uint32_t)nid);
            bool ci = rng_pct(&rng, 30);
            struct str t = {0};
            for (uint32_t k = 0; k < len; k++)
                str_printf(&t, "\\x%02x", raw[i][k]);
            pat[i] = t.p;
            hsx[i] = xstrndup(t.p, t.n);
            snprintf(ids[i], sizeof(ids[i]), "s%u", id);
            hsid[i] = id;
            hsfl[i] = ci ? HS_FLAG_CASELESS : 0;
            src[i] =
                (struct rule_src){ids[i], RULE_REGEX, pat[i], t.n, ci ? RULE_F_CASELESS : 0, 0};
        }
        /* _i 1: one literal group (CAT_GF_LITERAL, no DFA rows) */
        struct rules_options ro = {.gate_bits = UINT32_MAX, .literal_group = _i == 1 ? 1 : -1};
        struct rules_result res = {0};
        ck_assert_int_eq(rules_compile(src, n, &ro, &res, NULL), 0);
        ck_assert_uint_eq(res.n_rejects, 0);
        const struct catalog *cat = res.catalog;
        struct catalog_group cg0;
        catalog_group(cat, 0, &cg0);
        ck_assert_uint_eq(cg0.flags == CAT_GF_LITERAL, _i == 1);
        /* catalog rule -> id, and each id's first catalog rule */
        uint32_t *first = xrealloc(NULL, nid * sizeof(*first)), *idof = xrealloc(NULL, n * 4);
        for (size_t k = 0; k < nid; k++)
            first[k] = UINT32_MAX;
        for (size_t i = 0; i < n; i++) {
            uint32_t r = res.rule_index[i];
            idof[r] = hsid[i];
            first[hsid[i]] = r < first[hsid[i]] ? r : first[hsid[i]];
        }
        hs_database_t *db = NULL;
        hs_compile_error_t *ce = NULL;
        ck_assert_int_eq(hs_compile_multi((const char *const *)hsx, hsfl, hsid, (unsigned)n,
                                          HS_MODE_BLOCK, NULL, &db, &ce),
                         HS_SUCCESS);
        hs_scratch_t *scratch = NULL;
        ck_assert_int_eq(hs_alloc_scratch(db, &scratch), HS_SUCCESS);
        size_t len = 20000;
        uint8_t *buf = xrealloc(NULL, len);
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)alpha[rng_below(&rng, sizeof(alpha))];
        for (size_t p = 0; p + 16 < len; p += 1 + rng_below(&rng, 30)) {
            uint32_t i = rng_below(&rng, (uint32_t)n);
            for (uint32_t k = 0; k < rawlen[i]; k++)
                buf[p + k] = isalpha(raw[i][k]) && hsfl[i] && rng_pct(&rng, 50) ? raw[i][k] ^ 0x20
                                                                                : raw[i][k];
        }
        struct id_hits theirs = {0}, ours = {0};
        ck_assert_int_eq(
            hs_scan(db, (const char *)buf, (unsigned)len, 0, scratch, on_hs_id, &theirs),
            HS_SUCCESS);
        qsort(theirs.v, theirs.n, sizeof(*theirs.v), id_hit_cmp);
        size_t m = 0;
        for (size_t i = 0; i < theirs.n; i++)
            if (m == 0 || id_hit_cmp(&theirs.v[m - 1], &theirs.v[i]) != 0)
                theirs.v[m++] = theirs.v[i];
        theirs.n = m;
        /* the CPU engine in 3 segments, its parts merged */
        struct cpuscan_scratch *sc;
        ck_assert_int_eq(cpuscan_scratch_create(&sc), 0);
        struct cpuscan_part parts[3] = {0};
        for (int k = 0; k < 3; k++)
            ck_assert_int_eq(cpuscan_segment(cat, buf, len, len * k / 3, len * (k + 1) / 3,
                                             SCAN_ALL, 0, NULL, NULL, sc, &parts[k]),
                             0);
        struct scan_hits got = {0};
        uint64_t dropped = 0;
        ck_assert_int_eq(cpuscan_merge(cat, SCAN_ALL, parts, 3, UINT64_MAX, false, &got, &dropped),
                         0);
        for (size_t i = 0; i < got.n; i++) {
            uint32_t id = idof[got.v[i].rule];
            ck_assert_msg(got.v[i].rule == first[id], "rule %u of id s%u reported, not %u",
                          got.v[i].rule, id, first[id]);
            id_hits_push(&ours, id, got.v[i].end);
        }
        qsort(ours.v, ours.n, sizeof(*ours.v), id_hit_cmp); /* by id, not rule, at one end */
        for (size_t i = 1; i < ours.n; i++)
            ck_assert_msg(id_hit_cmp(&ours.v[i - 1], &ours.v[i]) != 0, "(s%u, %" PRIu64 ") twice",
                          ours.v[i].id, ours.v[i].end);
        ck_assert_uint_eq(ours.n, theirs.n);
        for (size_t i = 0; i < ours.n; i++)
            ck_assert_msg(id_hit_cmp(&ours.v[i], &theirs.v[i]) == 0,
                          "hit %zu: ours (s%u, %" PRIu64 "), Hyperscan (s%u, %" PRIu64 ")", i,
                          ours.v[i].id, ours.v[i].end, theirs.v[i].id, theirs.v[i].end);
        compared += ours.n;
        /* refscan (the reference) the same */
        struct scan_hits ref = {0};
        ck_assert_int_eq(refscan_buffer(cat, buf, len, SCAN_ALL, &ref), 0);
        ck_assert_uint_eq(ref.n, got.n);
        for (size_t i = 0; i < ref.n; i++)
            ck_assert(ref.v[i].rule == got.v[i].rule && ref.v[i].end == got.v[i].end);
        scan_hits_finish(&ref);
        for (int k = 0; k < 3; k++)
            cpuscan_part_finish(&parts[k]);
        cpuscan_scratch_destroy(sc);
        scan_hits_finish(&got);
        free(ours.v);
        free(theirs.v);
        free(buf);
        hs_free_scratch(scratch);
        hs_free_database(db);
        rules_result_finish(&res);
        for (size_t i = 0; i < n; i++) {
            free(pat[i]);
            free(hsx[i]);
        }
        free(src);
        free(pat);
        free(hsx);
        free(ids);
        free(hsid);
        free(hsfl);
        free(raw);
        free(rawlen);
        free(first);
        free(idof);
    }
    printf("hsdiff cpu engine shared-id literals: %" PRIu64 " hits agree\n", compared);
    ck_assert_uint_gt(compared, 1000);
}
END_TEST

/* Hand-picked cases for the semantics that are easy to get wrong; each is
 * compared like the random ones, and each must produce at least one hit. */
START_TEST(test_known_semantics)
{
    force_bitnfa = false;
    static const struct {
        const char *pat;
        uint32_t flags;
        const char *hay;
    } cases[] = {
        {"a$", 0, "a\na\n"}, /* $ before a final \n only */
        {"a$", RULE_F_MULTILINE, "a\na\n"},
        {"^a", RULE_F_MULTILINE, "a\na\nba"},
        {"a.b", 0, "a\nb a\vb a\rb"}, /* . excludes only \n */
        {"a.b", RULE_F_DOTALL, "a\nb"},
        {"a\\sb", 0, "a\vb a\fb a\rb"}, /* \s includes \v */
        {"\\ba\\b", 0, "a ab a_a a"},   /* buffer edges are non-word */
        {"a\\B", 0, "ab a a_"},
        {"(?i)[[:upper:]]b", 0, "ab AB Ab"},
        {"[^a]b", RULE_F_CASELESS, "Ab ab cb"},
        {"a(?i)b|c", 0, "ab aB c C"},    /* (?i) reaches the next alternative */
        {"(a(?i)b)c", 0, "abc aBc aBC"}, /* but not past its group */
        {"x(?i:a)b", 0, "xAb xAB"},
        {"a+?b{2,}?", 0, "aabbb ab"},
        {"\\x41\\n\\t", 0, "A\n\tA\n"},
        {"a", RULE_F_SINGLEMATCH, "aaa"},
        {"\\x61+", RULE_F_CASELESS, "aAa"},
        {"a(\\B)+b", 0, "ab a b"}, /* a repeated group of an assertion is the assertion */
        {"a(?:\\b)?b", 0, "ab"},
        {"\\xc3\\xa9", RULE_F_CASELESS, "\xc3\xa9 \xc3\x89"}, /* ASCII-only caseless */
        {"\\b[A-Z]?\\B", 0, "AB x"}, /* its empty path needs \b and \B at once: never empty */
    };
    struct stats st = {0};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct trule r = {.kind = RULE_REGEX, .flags = cases[i].flags};
        snprintf(r.id, sizeof(r.id), "k%zu", i);
        r.pat = xstrndup(cases[i].pat, strlen(cases[i].pat));
        r.len = strlen(cases[i].pat);
        r.hs = xstrndup(r.pat, r.len);
        struct hay h = {"fixed", (const uint8_t *)cases[i].hay, strlen(cases[i].hay)};
        uint64_t before = st.hits;
        compare_set(&r, 1, 0, i, "known semantics", true, &h, 1, &st);
        ck_assert_msg(st.hits > before || st.mismatches > 0, "case %zu (%s) had no hits", i,
                      cases[i].pat);
        trule_free(&r);
    }
    stats_print(&st, "known semantics");
    ck_assert_uint_eq(st.compared, sizeof(cases) / sizeof(cases[0]));
    ck_assert_msg(st.mismatches == 0, "%u cases differ from Hyperscan", st.mismatches);
    ck_assert_uint_eq(st.bad_rejects, 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* The shared pattern files and haystacks.                                   */

static const char *data_dir(void)
{
    const char *d = getenv("VKS_SHARED_DATA");
    return d != NULL && *d != '\0' ? d : VKS_SOURCE_ROOT "/tests/data";
}

/* data_dir()/rel, in a buffer the next call reuses. */
static const char *data_file(const char *rel)
{
    static char path[4096];
    snprintf(path, sizeof(path), "%s/%s", data_dir(), rel);
    return path;
}

/* Reads a whole file; returns NULL (and fails the test) when it cannot. */
static uint8_t *slurp(const char *path, size_t *len, size_t limit)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL,
                  "cannot open %s: %s (tests/data holds it; VKS_SHARED_DATA "
                  "names another copy)",
                  path, strerror(errno));
    struct str s = {0};
    char buf[65536];
    size_t n;
    while (s.n < limit && (n = fread(buf, 1, sizeof(buf), f)) > 0)
        str_putn(&s, buf, n < limit - s.n ? n : limit - s.n);
    fclose(f);
    *len = s.n;
    if (s.p == NULL)
        s.p = xstrndup("", 0);
    return (uint8_t *)s.p;
}

/* Loads an hsbench pattern file through the project's reader (patfile.h);
 * the regex goes to Hyperscan unchanged. Every line of the shared files must
 * read as a regex rule. */
static struct trule *load_patfile(const char *path, size_t *count)
{
    size_t len;
    char *text = (char *)slurp(path, &len, SIZE_MAX);
    struct patfile pf;
    struct vks_error err = {0};
    ck_assert_msg(patfile_parse(text, len, &pf, &err) == 0, "%s: %s", path, err.msg);
    for (size_t k = 0; k < pf.n_rejects; k++)
        fprintf(stderr, "%s:%u: %s\n", path, pf.rejects[k].line, pf.rejects[k].msg);
    ck_assert_msg(pf.n_rejects == 0, "%s: %zu lines are not rules", path, pf.n_rejects);
    struct trule *v = xrealloc(NULL, (pf.n + 1) * sizeof(*v));
    for (size_t i = 0; i < pf.n; i++) {
        const struct rule_src *r = &pf.rules[i];
        ck_assert_msg(r->kind == RULE_REGEX, "%s:%u: not a regex rule", path, r->line);
        v[i] = (struct trule){
            .kind = RULE_REGEX, .flags = r->flags, .line = r->line, .nullable = -1, .len = r->len};
        snprintf(v[i].id, sizeof(v[i].id), "%s", r->id);
        v[i].pat = xstrndup(r->pattern, r->len);
        v[i].hs = xstrndup(r->pattern, r->len);
    }
    *count = pf.n;
    patfile_finish(&pf);
    free(text);
    return v;
}

/* A synthetic config file: secret-looking assignments built around every
 * gitleaks keyword, so that the gitleaks regexes have something to match. */
static uint8_t *hay_secrets(const char *dir, size_t *len)
{
    static const char *const fmts[] = {"%s_api_key = \"%s\"\n",
                                       "export %s_TOKEN=%s\n",
                                       "%s-secret: '%s'\n",
                                       "  \"%s\": \"%s\",\n",
                                       "%s%s\n",
                                       "url = https://%s.example.com/?key=%s&x=1\n"};
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";
    char path[4096];
    snprintf(path, sizeof(path), "%s/gitleaks/gitleaks-keywords.rules", dir);
    size_t n;
    struct trule *kw = load_patfile(path, &n);
    struct rng rng = {42};
    struct str s = {0};
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < n; i++) {
            char secret[160];
            size_t sl = 8 + rng_below(&rng, 100);
            uint32_t abc = rng_pct(&rng, 50) ? 16 : rng_pct(&rng, 50) ? 36 : 64;
            for (size_t k = 0; k < sl; k++)
                secret[k] = abc == 16 ? "0123456789abcdef"[rng_below(&rng, 16)]
                                      : alnum[rng_below(&rng, abc)];
            secret[sl] = '\0';
            str_printf(&s, fmts[rng_below(&rng, 6)], kw[i].pat, secret);
        }
    }
    trules_free(kw, n);
    *len = s.n;
    return (uint8_t *)s.p;
}

/* A byte of `set`, printable ASCII when the set has one. */
static uint8_t pick_from_set(const struct byteset *set, struct rng *r)
{
    for (int tries = 0; tries < 32; tries++) {
        uint8_t c = (uint8_t)(0x20 + rng_below(r, 0x5f));
        if (byteset_has(set, c))
            return c;
    }
    for (unsigned c = 0; c < 256; c++)
        if (byteset_has(set, (c + 0x20) & 0xff))
            return (uint8_t)((c + 0x20) & 0xff);
    return 'x';
}

/* Appends a string that (assertions aside) matches the parsed tree `n`. */
static void sample_parsed(const struct node *n, struct rng *r, struct str *out)
{
    switch (n->type) {
    case N_SET:
        str_putc(out, (char)pick_from_set(&n->u.set, r));
        break;
    case N_CAT:
        for (uint32_t k = 0; k < n->u.list.n; k++)
            sample_parsed(n->u.list.kids[k], r, out);
        break;
    case N_ALT:
        sample_parsed(n->u.list.kids[rng_below(r, n->u.list.n)], r, out);
        break;
    case N_REPEAT: {
        uint32_t span = n->u.rep.max == REPEAT_INF ? 3 : n->u.rep.max - n->u.rep.min;
        uint32_t k = n->u.rep.min + rng_below(r, (span < 3 ? span : 3) + 1);
        for (uint32_t x = 0; x < k; x++)
            sample_parsed(n->u.rep.kid, r, out);
        break;
    }
    case N_ASSERT:
        break;
    }
}

/* A haystack of strings drawn from every rule of a file (through our own
 * parser's tree), two each, between separators that suit \b and $. */
static uint8_t *hay_planted_file(const struct trule *rules, size_t n, size_t *len)
{
    static const char *const seps[] = {" ", "\n", " = ", "\"", "'", ": ", "\t"};
    struct rng rng = {7};
    struct str s = {0};
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < n; i++) {
            struct rule_src src = {rules[i].id,  rules[i].kind,  rules[i].pat,
                                   rules[i].len, rules[i].flags, 0};
            struct parse_result pr = {0};
            uint32_t pos;
            char msg[240];
            if (parse_rule(&src, &pr, &pos, msg, sizeof(msg)) == 0 && pr.root != NULL)
                sample_parsed(pr.root, &rng, &s);
            parse_result_finish(&pr);
            str_puts(&s, seps[rng_below(&rng, 7)]);
        }
    }
    *len = s.n;
    return (uint8_t *)s.p;
}

struct corpus {
    struct hay hays[12];
    uint8_t *bufs[12];
    size_t n;
};

static void corpus_add(struct corpus *c, const char *dir, const char *name, size_t limit)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/rebar/haystacks/%s", dir, name);
    struct hay *h = &c->hays[c->n];
    c->bufs[c->n] = slurp(path, &h->len, limit);
    h->p = c->bufs[c->n];
    snprintf(h->name, sizeof(h->name), "%s", name);
    c->n++;
}

/* About 420 KB: prose (English, Russian, Chinese UTF-8), tiny files for the
 * edges, and the synthetic secrets. */
static void corpus_load(struct corpus *c, const char *dir)
{
    memset(c, 0, sizeof(*c));
    corpus_add(c, dir, "sherlock.txt", 192 * 1024);
    corpus_add(c, dir, "opensubtitles/en-medium.txt", 64 * 1024);
    corpus_add(c, dir, "opensubtitles/ru-medium.txt", 32 * 1024);
    corpus_add(c, dir, "opensubtitles/zh-medium.txt", 32 * 1024);
    corpus_add(c, dir, "opensubtitles/en-teeny.txt", SIZE_MAX);
    corpus_add(c, dir, "opensubtitles/en-tiny.txt", SIZE_MAX);
    corpus_add(c, dir, "opensubtitles/en-small.txt", SIZE_MAX);
    corpus_add(c, dir, "opensubtitles/ru-tiny.txt", SIZE_MAX);
    struct hay *h = &c->hays[c->n];
    c->bufs[c->n] = hay_secrets(dir, &h->len);
    h->p = c->bufs[c->n];
    snprintf(h->name, sizeof(h->name), "synthetic secrets");
    c->n++;
}

static void corpus_free(struct corpus *c)
{
    for (size_t i = 0; i < c->n; i++)
        free(c->bufs[i]);
}

/* dict-10 has 43k rules; all of them cost about 3 s here, so the default
 * takes every one. VKS_HSDIFF_DICT10_STRIDE=k compares every k-th only. */
#define DICT10_STRIDE 1

static void check_file(const char *path, const struct corpus *c)
{
    size_t n;
    struct trule *rules = load_patfile(path, &n);
    ck_assert_uint_gt(n, 0);
    size_t stride =
        strstr(path, "dict-10") ? env_u64("VKS_HSDIFF_DICT10_STRIDE", DICT10_STRIDE) : 1;
    size_t m = 0;
    stride = stride ? stride : 1;
    for (size_t i = 0; i < n; i++) {
        if (i % stride != 0)
            trule_free(&rules[i]);
        else
            rules[m++] = rules[i];
    }
    struct stats st = {0};
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    struct hay hays[16];
    ck_assert_uint_lt(c->n, 16);
    memcpy(hays, c->hays, c->n * sizeof(*hays));
    uint8_t *planted = hay_planted_file(rules, m, &hays[c->n].len);
    hays[c->n].p = planted;
    snprintf(hays[c->n].name, sizeof(hays[c->n].name), "samples of %s", base);
    compare_set(rules, m, 0, 0, base, false, hays, c->n + 1, &st);
    free(planted);
    stats_print(&st, base);
    trules_free(rules, m);
    ck_assert_msg(st.mismatches == 0, "%s: %u haystacks give different hits; reproducers above",
                  base, st.mismatches);
    ck_assert_msg(st.bad_rejects == 0, "%s: %u rules rejected against the contract", base,
                  st.bad_rejects);
    /* Every file has most rules compared, and hits for most of them. */
    ck_assert_uint_gt(st.compared, m / 2);
    ck_assert_uint_gt(st.hits, st.compared);
}

static void check_glob(const char *pattern, const struct corpus *c, size_t *files)
{
    glob_t gl;
    int rc = glob(pattern, 0, NULL, &gl);
    ck_assert_msg(rc == 0, "no pattern files match %s", pattern);
    for (size_t i = 0; i < gl.gl_pathc; i++)
        check_file(gl.gl_pathv[i], c);
    *files += gl.gl_pathc;
    globfree(&gl);
}

START_TEST(test_shared_gitleaks)
{
    char pat[4096];
    struct corpus c;
    size_t files = 0;
    corpus_load(&c, data_dir());
    snprintf(pat, sizeof(pat), "%s/gitleaks/*.rules", data_dir());
    check_glob(pat, &c, &files);
    corpus_free(&c);
    ck_assert_uint_ge(files, 2);
}
END_TEST

START_TEST(test_shared_rebar)
{
    char pat[4096];
    struct corpus c;
    size_t files = 0;
    corpus_load(&c, data_dir());
    snprintf(pat, sizeof(pat), "%s/rebar/dict-*.rules", data_dir());
    check_glob(pat, &c, &files);
    corpus_free(&c);
    ck_assert_uint_ge(files, 2);
}
END_TEST

/* The project's own shapes (tests/data/shapes): IDS-like regexes, syntax
 * edges, small rules beside broad counters. */
START_TEST(test_shapes)
{
    char pat[4096];
    struct corpus c;
    size_t files = 0;
    corpus_load(&c, data_dir());
    snprintf(pat, sizeof(pat), "%s/shapes/*.rules", VKS_SOURCE_ROOT "/tests/data");
    uint64_t split0 = split_checked, fixes0 = piece_fixes(), lanes0 = piece_lanes();
    check_glob(pat, &c, &files);
    corpus_free(&c);
    ck_assert_uint_ge(files, 3);
    /* dense-counters and leads hold unbounded and bounded groups: the CPU
     * engine's split scan was compared (unless the CPU checks are thinned),
     * its unbounded groups in pieces too, with guesses repaired */
    const char *every = getenv("VKS_HSDIFF_CPU_EVERY");
    if (every == NULL || strcmp(every, "1") == 0) {
        ck_assert_uint_gt(split_checked, split0);
        ck_assert_uint_gt(piece_fixes(), fixes0);
        ck_assert_uint_gt(piece_lanes(), lanes0);
    }
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Bounded repeats and gaps: the rules a DFA cannot hold (the bit-NFA's).   */

/* Appends a string that (assertions aside) matches `n`, with repeat counts
 * drawn from their whole range, so long gaps are exercised too. */
static void sample_wide(const struct node *n, struct rng *r, struct str *out)
{
    switch (n->type) {
    case N_SET:
        str_putc(out, (char)pick_from_set(&n->u.set, r));
        break;
    case N_CAT:
        for (uint32_t k = 0; k < n->u.list.n; k++)
            sample_wide(n->u.list.kids[k], r, out);
        break;
    case N_ALT:
        sample_wide(n->u.list.kids[rng_below(r, n->u.list.n)], r, out);
        break;
    case N_REPEAT: {
        uint32_t hi = n->u.rep.max == REPEAT_INF ? n->u.rep.min + 3 : n->u.rep.max;
        uint32_t k = rng_pct(r, 30)   ? hi
                     : rng_pct(r, 30) ? n->u.rep.min
                                      : n->u.rep.min + rng_below(r, hi - n->u.rep.min + 1);
        for (uint32_t x = 0; x < k; x++)
            sample_wide(n->u.rep.kid, r, out);
        break;
    }
    case N_ASSERT:
        break;
    }
}

static void sample_rule_wide(const struct trule *t, struct rng *r, struct str *out)
{
    struct rule_src src = {t->id, t->kind, t->pat, t->len, t->flags, 0};
    struct parse_result pr = {0};
    uint32_t pos;
    char msg[240];
    if (parse_rule(&src, &pr, &pos, msg, sizeof(msg)) == 0 && pr.root != NULL)
        sample_wide(pr.root, r, out);
    parse_result_finish(&pr);
}

/* A rule of literals, gaps and counted repeats of classes and alternations
 * (counts up to 1000), with anchors and \b at either end. */
static void gen_big_rule(struct rng *rng, struct trule *r, size_t index)
{
    static const char *const words[] = {"key", "tok", "ab", "Secret", "x", "id=", "\"", "Q"};
    static const char *const items[] = {
        ".",   "[^\"]",    "[^x]",           "[a-z0-9_-]", "\\w",     "[0-9a-f]", "[A-Z]",
        "\\s", "(?:ab|c)", "(?:x|yz|[0-9])", "[^\\n]",     "[\\w.-]", "a",        "(?:k[a-z])"};
    struct str p = {0};
    uint32_t roll = rng_below(rng, 10);
    if (roll == 0)
        str_putc(&p, '^');
    else if (roll < 4)
        str_puts(&p, "\\b");
    str_puts(&p, words[rng_below(rng, 8)]);
    size_t parts = 1 + rng_below(rng, 3);
    for (size_t k = 0; k < parts; k++) {
        uint32_t ci = rng_below(rng, sizeof(items) / sizeof(items[0]));
        uint32_t cap = items[ci][0] == '(' ? 150 : 1000;
        uint32_t max = 1 + rng_below(rng, rng_pct(rng, 50) ? cap : 40);
        uint32_t min = rng_pct(rng, 40) ? 0 : rng_below(rng, max + 1);
        if (rng_pct(rng, 25))
            min = max;
        if (min == max)
            str_printf(&p, "%s{%u}", items[ci], max);
        else
            str_printf(&p, "%s{%u,%u}%s", items[ci], min, max, rng_pct(rng, 20) ? "?" : "");
        if (rng_pct(rng, 50) || k + 1 == parts)
            str_puts(&p, words[rng_below(rng, 8)]);
    }
    roll = rng_below(rng, 10);
    if (roll == 0)
        str_putc(&p, '$');
    else if (roll < 3)
        str_puts(&p, "\\b");
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "b%zu", index);
    r->kind = RULE_REGEX;
    r->pat = p.p;
    r->len = p.n;
    r->hs = xstrndup(p.p, p.n);
    r->flags |= rng_pct(rng, 30) ? RULE_F_CASELESS : 0;
    r->flags |= rng_pct(rng, 30) ? RULE_F_DOTALL : 0;
    r->flags |= rng_pct(rng, 20) ? RULE_F_MULTILINE : 0;
    r->flags |= rng_pct(rng, 5) ? RULE_F_SINGLEMATCH : 0;
    r->nullable = 0;
}

/* Haystacks for big rules: empty, random, and samples of the rules (long
 * gaps included) between random filler with quotes, 'x' and newlines. */
static void make_big_hays(const struct trule *rules, size_t n, struct rng *r, struct str *bufs,
                          struct hay *hays)
{
    static const char filler[] = "ab xQ\"\n=_-.kAZ09";
    for (int k = 0; k < HAYS_PER_CASE; k++) {
        bufs[k].n = 0;
        str_putn(&bufs[k], "", 0);
        if (k == 1)
            hay_random(r, &bufs[k], 200 + rng_below(r, 400));
        for (int round = 0; k > 1 && round < 1 + k / 2; round++) {
            for (uint32_t f = rng_below(r, 8); f > 0; f--)
                str_putc(&bufs[k], filler[rng_below(r, sizeof(filler) - 1)]);
            sample_rule_wide(&rules[rng_below(r, (uint32_t)n)], r, &bufs[k]);
        }
        if (k > 1 && rng_pct(r, 25))
            str_putc(&bufs[k], '\n');
        snprintf(hays[k].name, sizeof(hays[k].name), "#%d", k);
        hays[k].p = (const uint8_t *)bufs[k].p;
        hays[k].len = bufs[k].n;
    }
}

#define BIG_MAX 6

/* Bounded repeats up to {0,1000}, gaps .{0,N} and [^x]{0,N}, repeats of
 * classes and alternations, anchors, \b, caseless: no rule Hyperscan takes
 * is rejected for size, and every hit is Hyperscan's (CPU reference
 * scanner). One to six rules per catalog, so bit-NFA groups hold several. */
START_TEST(test_bounded_repeats)
{
    uint64_t base = env_u64("VKS_HSDIFF_SEED", 1);
    uint64_t cases = case_count(160);
    struct stats st = {0};
    force_bitnfa = false;
    struct str bufs[HAYS_PER_CASE] = {{0}};
    struct hay hays[HAYS_PER_CASE];
    for (uint64_t c = 0; c < cases; c++) {
        uint64_t seed = base * 5000011u + c;
        struct rng rng = {seed};
        size_t n = c % 2 ? 1 : 1 + rng_below(&rng, BIG_MAX);
        struct trule r[BIG_MAX];
        for (size_t k = 0; k < n; k++)
            gen_big_rule(&rng, &r[k], k);
        make_big_hays(r, n, &rng, bufs, hays);
        char what[64];
        snprintf(what, sizeof(what), "bounded-repeat case %" PRIu64 " (%zu rules)", c, n);
        compare_set(r, n, c % 3 == 2 ? 4096 : 0, seed, what, true, hays, HAYS_PER_CASE, &st);
        for (size_t k = 0; k < n; k++)
            trule_free(&r[k]);
    }
    for (int k = 0; k < HAYS_PER_CASE; k++)
        str_free(&bufs[k]);
    stats_print(&st, "bounded repeats");
    ck_assert_msg(st.mismatches == 0, "%u (catalog, haystack) pairs differ from Hyperscan",
                  st.mismatches);
    ck_assert_msg(st.size_rejects == 0, "%u rules Hyperscan accepts rejected for size",
                  st.size_rejects);
    ck_assert_msg(st.bad_rejects == 0, "%u rules rejected or accepted against the contract",
                  st.bad_rejects);
    ck_assert_uint_gt(st.compared, st.rules * 3 / 4);
    ck_assert_uint_gt(st.nfa_rules, st.rules / 3);
    ck_assert_uint_gt(st.hits, 5 * (uint64_t)cases);
}
END_TEST

/* Rules that open with a repeat (`[a-z]+@`, `(\w+\s)+baker`, `x{3,7}y`),
 * which the compiler cuts to their least count (parse_strip_prefix), with
 * an assertion before some of them (which keeps them whole), nested in
 * groups and alternations, counted and open: every hit is Hyperscan's, on
 * planted text and on dense text of the rules' own letters. */
static void gen_lead_rule(struct rng *rng, struct trule *r, size_t index)
{
    static const char *const first[] = {
        "", "", "", "", "\\b", "\\B", "^", "(?m)^", "ab|", "(?i)",
    };
    static const char *const lead[] = {
        "[ab]+",        "[ab]{2,}",     "[ab ]{1,5}", "(ab|b)+",       "(a+b)+",   "(a+ ?|b{2,3})",
        "(?:x[ab]+,)+", "[^x\\n]+",     "\\w+\\s",    "(ab+|ba{2,})+", ".+",       "[a-z]{3}",
        "(a|b+){2,4}",  "a*b+",         "(\\ba+)+",   "(b+a|c{2,})",   "[0-9]+,?", "(a{2,}|x)+",
        "\\s+",         "(?:(?:b+)a)+",
    };
    static const char *const body[] = {
        "xy", "x[ab]?y", "x", ",[0-9]+", "x\\b", "y$", "(x|yy)", "a", " b", "\\n",
    };
    char pat[256];
    snprintf(pat, sizeof(pat), "%s%s%s", first[rng_below(rng, 10)], lead[rng_below(rng, 20)],
             body[rng_below(rng, 10)]);
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "lead%zu", index);
    r->kind = RULE_REGEX;
    r->pat = xstrndup(pat, strlen(pat));
    r->len = strlen(pat);
    r->hs = xstrndup(pat, strlen(pat));
    r->flags |= rng_pct(rng, 20) ? RULE_F_CASELESS : 0;
    r->flags |= rng_pct(rng, 30) ? RULE_F_DOTALL : 0;
    r->flags |= rng_pct(rng, 30) ? RULE_F_MULTILINE : 0;
    r->flags |= rng_pct(rng, 8) ? RULE_F_SINGLEMATCH : 0;
}

START_TEST(test_lead_shapes)
{
    uint64_t base = env_u64("VKS_HSDIFF_SEED", 1);
    uint64_t cases = case_count(200);
    struct stats st = {0};
    force_bitnfa = false;
    struct str bufs[HAYS_PER_CASE + 1] = {{0}};
    struct hay hays[HAYS_PER_CASE + 1];
    static const char letters[] = "aabbbxy ,01\nAB\tc";
    for (uint64_t c = 0; c < cases; c++) {
        uint64_t seed = base * 7000003u + c;
        struct rng rng = {seed};
        size_t n = 1 + rng_below(&rng, BIG_MAX);
        struct trule r[BIG_MAX];
        for (size_t k = 0; k < n; k++)
            gen_lead_rule(&rng, &r[k], k);
        make_big_hays(r, n, &rng, bufs, hays);
        /* dense: runs of the leads' letters, most bytes end a match */
        struct str *d = &bufs[HAYS_PER_CASE];
        d->n = 0;
        for (size_t i = 0, len = 2000 + rng_below(&rng, 3000); i < len; i++)
            str_putc(d, letters[rng_below(&rng, sizeof(letters) - 1)]);
        snprintf(hays[HAYS_PER_CASE].name, sizeof(hays[0].name), "dense");
        hays[HAYS_PER_CASE].p = (const uint8_t *)d->p;
        hays[HAYS_PER_CASE].len = d->n;
        char what[64];
        snprintf(what, sizeof(what), "lead case %" PRIu64 " (%zu rules)", c, n);
        compare_set(r, n, c % 3 == 2 ? 4096 : 0, seed, what, true, hays, HAYS_PER_CASE + 1, &st);
        for (size_t k = 0; k < n; k++)
            trule_free(&r[k]);
    }
    for (int k = 0; k <= HAYS_PER_CASE; k++)
        str_free(&bufs[k]);
    stats_print(&st, "leading repeats");
    ck_assert_msg(st.mismatches == 0, "%u (catalog, haystack) pairs differ from Hyperscan",
                  st.mismatches);
    ck_assert_msg(st.bad_rejects == 0, "%u rules rejected or accepted against the contract",
                  st.bad_rejects);
    ck_assert_uint_gt(st.compared, st.rules / 2);
    ck_assert_uint_gt(st.hits, 50 * (uint64_t)cases);
}
END_TEST

/* Repeats past the 4096 positions a shared bit-NFA group holds: each such
 * rule gets a group of its own (up to 65536 positions), and still matches
 * exactly as Hyperscan does. */
START_TEST(test_large_repeats)
{
    static const char *const pats[] = {"a.{0,5000}b", "\\bkey[^\\n]{100,6000}end\\b",
                                       "x[a-z]{4500}y", "tok[^\"]{0,8000}\"", "(ab|c){2000,2100}Q"};
    enum { N = sizeof(pats) / sizeof(pats[0]) };
    struct trule r[N];
    force_bitnfa = false;
    for (size_t i = 0; i < N; i++) {
        memset(&r[i], 0, sizeof(r[i]));
        snprintf(r[i].id, sizeof(r[i].id), "big%zu", i);
        r[i].kind = RULE_REGEX;
        r[i].pat = xstrndup(pats[i], strlen(pats[i]));
        r[i].len = strlen(pats[i]);
        r[i].hs = xstrndup(pats[i], strlen(pats[i]));
        r[i].flags = i == 1 ? RULE_F_CASELESS : 0;
    }
    struct rng rng = {4242};
    struct str bufs[4] = {{0}};
    struct hay hays[4];
    for (int k = 0; k < 4; k++) {
        for (int round = 0; round < 3; round++) {
            str_puts(&bufs[k], k % 2 ? " Key\n" : "a tok ");
            sample_rule_wide(&r[rng_below(&rng, N)], &rng, &bufs[k]);
        }
        snprintf(hays[k].name, sizeof(hays[k].name), "#%d", k);
        hays[k].p = (const uint8_t *)bufs[k].p;
        hays[k].len = bufs[k].n;
    }
    struct stats st = {0};
    compare_set(r, N, 0, 0, "large repeats", true, hays, 4, &st);
    stats_print(&st, "large repeats");
    for (size_t i = 0; i < N; i++)
        trule_free(&r[i]);
    for (int k = 0; k < 4; k++)
        str_free(&bufs[k]);
    ck_assert_msg(st.mismatches == 0, "%u haystacks give different hits", st.mismatches);
    ck_assert_uint_eq(st.size_rejects, 0);
    ck_assert_uint_eq(st.compared, N - st.hs_rejects);
    ck_assert_uint_eq(st.nfa_rules, N);
    ck_assert_uint_gt(st.hits, 4);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Literal factors: gated bit-NFA groups (rules/factor.h).                  */

/* Whether buf[0..len) contains factor f. */
static bool has_factor(const uint8_t *buf, size_t len, const struct factor *f)
{
    for (size_t at = 0; at + f->len <= len; at++) {
        uint32_t i = 0;
        while (i < f->len && byteset_has(&f->set[i], buf[at + i]))
            i++;
        if (i == f->len)
            return true;
    }
    return false;
}

/* Every sampled string of a factored rule contains one of its factors:
 * the set is really required. Random big rules and gitleaks-regex. */
static unsigned check_factors_required(const struct trule *t, struct rng *rng)
{
    struct rule_src src = {t->id, t->kind, t->pat, t->len, t->flags, 0};
    struct parse_result pr = {0};
    struct factor_set *fs = xrealloc(NULL, sizeof(*fs));
    uint32_t pos;
    char msg[240];
    unsigned checked = 0;
    if (parse_rule(&src, &pr, &pos, msg, sizeof(msg)) == 0 && pr.root != NULL) {
        const struct node *root = parse_strip_prefix(pr.root);
        if (factor_extract(root, fs) == 0) {
            ck_assert_uint_ge(fs->n, 1);
            ck_assert_uint_le(fs->n, FACTOR_MAX_COUNT);
            for (int k = 0; k < 40; k++) {
                struct str s = {0};
                sample_wide(root, rng, &s);
                bool found = false;
                for (uint32_t i = 0; i < fs->n && !found; i++) {
                    ck_assert_uint_ge(fs->f[i].len, FACTOR_MIN_LEN);
                    found = has_factor((const uint8_t *)s.p, s.n, &fs->f[i]);
                }
                ck_assert_msg(found, "rule %s /%.*s/: sample \"%.*s\" has none of its factors",
                              t->id, (int)t->len, t->pat, (int)s.n, s.p);
                str_free(&s);
            }
            checked = 1;
        }
    }
    parse_result_finish(&pr);
    free(fs);
    return checked;
}

START_TEST(test_factors_required)
{
    struct rng rng = {777};
    unsigned factored = 0;
    for (size_t c = 0; c < 300; c++) {
        struct trule r;
        gen_big_rule(&rng, &r, c);
        factored += check_factors_required(&r, &rng);
        trule_free(&r);
    }
    ck_assert_uint_gt(factored, 100);
    size_t n;
    struct trule *rules = load_patfile(data_file("gitleaks/gitleaks-regex.rules"), &n);
    unsigned gl = 0;
    for (size_t i = 0; i < n; i++)
        gl += check_factors_required(&rules[i], &rng);
    trules_free(rules, n);
    ck_assert_uint_gt(gl, 150);
}
END_TEST

/* Factored bit-NFA rules with the factor at the start, the end or in the
 * middle of a long gap, caseless factors and alternations of factors:
 * planted near buffer starts and ends, several close together (windows
 * that overlap and touch), after word bytes (\b at a window's edge). The
 * gated groups give Hyperscan's hits exactly. */
START_TEST(test_factor_gating)
{
    static const char *const pats[] = {
        "\\bkey[^\\n]{0,120}end",
        "(?i)tok(?:en|EN)[a-z0-9_-]{32}\\b",
        "(?:adafruit|hubspot|QQQx)[ \\t]{0,20}=[0-9a-f]{10,40}",
        "^abc.{5,90}x",
        "\\Bsecret\\w{10,80}",
        "[0-9]{20,60}[xX]yz$",
        "\\W{5,70}\\bMID\\b[ =]{5,70}",
        "(?i)(?:pass|pwd)word[=:]{1,3}[^\\s]{8,64}",
        "(?:ab){3,5}[^a]{40,100}Z",
    };
    enum { N = sizeof(pats) / sizeof(pats[0]) };
    static const char *const plants[] = {
        "key",     "end",    "token",  "TOKEN", "ToKeN", "adafruit", "hubspot",
        "QQQx",    "abc",    "secret", "Xyz",   "xyz",   "MID",      "PassWord",
        "pwdWORD", "ababab", "=",      "Z",     "\n",
    };
    struct trule r[N];
    force_bitnfa = false;
    for (size_t i = 0; i < N; i++) {
        memset(&r[i], 0, sizeof(r[i]));
        snprintf(r[i].id, sizeof(r[i].id), "f%zu", i);
        r[i].kind = RULE_REGEX;
        r[i].pat = xstrndup(pats[i], strlen(pats[i]));
        r[i].len = strlen(pats[i]);
        r[i].hs = xstrndup(pats[i], strlen(pats[i]));
        r[i].flags = i == 5 ? RULE_F_MULTILINE : i == 3 ? RULE_F_DOTALL : 0;
    }
    struct rng rng = {31337};
    enum { NH = 10 };
    struct str bufs[NH] = {{0}};
    struct hay hays[NH];
    static const char filler[] = "aZ09_ x-=\t\n.f";
    for (int k = 0; k < NH; k++) {
        for (int round = 0; round < 4 + k; round++) {
            uint32_t roll = rng_below(&rng, 4);
            if (roll == 0)
                sample_rule_wide(&r[rng_below(&rng, N)], &rng, &bufs[k]);
            else if (roll == 1)
                str_puts(&bufs[k], plants[rng_below(&rng, sizeof(plants) / sizeof(plants[0]))]);
            else
                for (uint32_t f = rng_below(&rng, roll == 2 ? 6 : 90); f > 0; f--)
                    str_putc(&bufs[k], filler[rng_below(&rng, sizeof(filler) - 1)]);
        }
        if (k % 3 == 0) /* a factor right at the end: its window is clipped */
            str_puts(&bufs[k], plants[rng_below(&rng, sizeof(plants) / sizeof(plants[0]))]);
        snprintf(hays[k].name, sizeof(hays[k].name), "#%d", k);
        hays[k].p = (const uint8_t *)bufs[k].p;
        hays[k].len = bufs[k].n;
    }
    struct stats st = {0};
    compare_set(r, N, 0, 0, "factor gating", true, hays, NH, &st);
    force_bitnfa = true; /* every rule a bit-NFA rule, so all gated */
    compare_set(r, N, 0, 0, "factor gating (bit-NFA forced)", true, hays, NH, &st);
    force_bitnfa = false;
    stats_print(&st, "factor gating");
    for (size_t i = 0; i < N; i++)
        trule_free(&r[i]);
    for (int k = 0; k < NH; k++)
        str_free(&bufs[k]);
    ck_assert_msg(st.mismatches == 0, "%u haystacks give different hits", st.mismatches);
    ck_assert_uint_eq(st.hs_rejects, 0);
    ck_assert_uint_ge(st.gated_rules, N + 3);
    ck_assert_uint_gt(st.hits, 40);
}
END_TEST

/* Binary signatures: two-byte anchors around a gap (`\x2a\x94.{35}\xd1\x27`,
 * and as YARA writes them, `{2a 94 [35] d1 27}`). Alone such a rule is a
 * DFA of hundreds to tens of thousands of states (every earlier anchor in
 * the gap is tracked), so the compiler gates it on its two-byte anchors
 * (factor_extract_weak, docs/engine.md). Random sets of 1 to 6 rules: rare
 * anchor bytes (now and then a letter), bounded, ranged, dot-all and
 * unbounded gaps, an optional tail; haystacks of the anchors' bytes, `\n`
 * and filler, with the anchors planted at gap distances and inside other
 * gaps. Hyperscan's hits, the same as every group walked in full, and
 * weakly gated rules in most sets. */
START_TEST(test_weak_anchors)
{
    static const char *const gaps[] = {".{%u}",         ".{%u,%u}",     "[\\x00-\\xff]{%u}",
                                       "(?s:.{%u,%u})", "[^\\n]{0,%u}", ".*"};
    static const char *const tails[] = {"", "", "[0-9]{2}", "\\b", "(?:ab|\\xfe)"};
    static const uint32_t flagsets[] = {0, RULE_F_DOTALL, RULE_F_SINGLEMATCH, RULE_F_CASELESS};
    struct rng rng = {0x2a94d127ull};
    struct stats st = {0};
    check_full_walk = true;
    for (int set = 0; set < 60; set++) {
        enum { MAXR = 6 };
        struct trule r[MAXR];
        uint8_t anc[MAXR][4];
        uint32_t lo[MAXR], hi[MAXR];
        size_t n = 1 + rng_below(&rng, MAXR);
        for (size_t i = 0; i < n; i++) {
            for (int k = 0; k < 4; k++) /* mostly bytes outside text, now and then a letter */
                anc[i][k] = rng_pct(&rng, 10) ? (uint8_t)('a' + rng_below(&rng, 26))
                                              : (uint8_t)(0x80 + rng_below(&rng, 0x80));
            uint32_t g = rng_below(&rng, 6);
            lo[i] = 1 + rng_below(&rng, 40);
            hi[i] = lo[i] + rng_below(&rng, 30);
            char gap[48], pat[160];
            snprintf(gap, sizeof(gap), gaps[g], g == 4 ? hi[i] : lo[i], hi[i]);
            if (g == 0 || g == 2)
                hi[i] = lo[i];
            if (g == 4)
                lo[i] = 0;
            if (g == 5)
                lo[i] = 0, hi[i] = 60;
            snprintf(pat, sizeof(pat), "\\x%02x\\x%02x%s\\x%02x\\x%02x%s", anc[i][0], anc[i][1],
                     gap, anc[i][2], anc[i][3], tails[rng_below(&rng, 5)]);
            memset(&r[i], 0, sizeof(r[i]));
            snprintf(r[i].id, sizeof(r[i].id), "w%d_%zu", set, i);
            r[i].kind = RULE_REGEX;
            r[i].pat = xstrndup(pat, strlen(pat));
            r[i].len = strlen(pat);
            r[i].hs = xstrndup(pat, strlen(pat));
            r[i].flags = flagsets[rng_below(&rng, 4)];
        }
        enum { NH = 3 };
        struct str bufs[NH] = {{0}};
        struct hay hays[NH];
        for (int k = 0; k < NH; k++) {
            for (int round = 0; round < 40; round++) {
                size_t i = rng_below(&rng, (uint32_t)n);
                uint32_t roll = rng_below(&rng, 5);
                if (roll <= 1) { /* a match, maybe with an anchor inside its gap */
                    str_putc(&bufs[k], (char)anc[i][0]);
                    str_putc(&bufs[k], (char)anc[i][1]);
                    uint32_t len = lo[i] + rng_below(&rng, hi[i] - lo[i] + 1);
                    for (uint32_t b = 0; b < len; b++)
                        str_putc(&bufs[k], rng_pct(&rng, 8)   ? (char)anc[i][b & 1]
                                           : rng_pct(&rng, 3) ? '\n'
                                                              : (char)rng_below(&rng, 256));
                    str_putc(&bufs[k], (char)anc[i][2]);
                    str_putc(&bufs[k], (char)anc[i][3]);
                    if (rng_pct(&rng, 50))
                        str_puts(&bufs[k], rng_pct(&rng, 50) ? "42" : "ab");
                } else if (roll == 2) { /* anchors alone */
                    str_putc(&bufs[k], (char)anc[i][rng_below(&rng, 2) * 2]);
                    str_putc(&bufs[k], (char)anc[i][rng_below(&rng, 2) * 2 + 1]);
                } else {
                    for (uint32_t f = rng_below(&rng, roll == 3 ? 8 : 90); f > 0; f--)
                        str_putc(&bufs[k], rng_pct(&rng, 5) ? '\n' : (char)rng_below(&rng, 256));
                }
            }
            snprintf(hays[k].name, sizeof(hays[k].name), "set %d #%d", set, k);
            hays[k].p = (const uint8_t *)bufs[k].p;
            hays[k].len = bufs[k].n;
        }
        compare_set(r, n, 0, 0, "weak anchors", false, hays, NH, &st);
        for (size_t i = 0; i < n; i++)
            trule_free(&r[i]);
        for (int k = 0; k < NH; k++)
            str_free(&bufs[k]);
    }
    check_full_walk = false;
    stats_print(&st, "weak anchors");
    printf("hsdiff weak anchors: %u gated rules of %u, %u gated != full\n", st.gated_rules,
           st.rules, st.gate_diffs);
    ck_assert_msg(st.mismatches == 0, "%u haystacks give different hits", st.mismatches);
    ck_assert_uint_eq(st.gate_diffs, 0);
    ck_assert_uint_eq(st.our_rejects + st.both_rejects, 0);
    ck_assert_uint_ge(st.gated_rules, st.rules / 2);
    ck_assert_uint_gt(st.hits, 300);
}
END_TEST

/* Unbounded rules gated by forward confirmation (CAT_GF_CONFIRM): random
 * rules made of a lead (none, bounded, unbounded, \b, ^), a factor
 * (plain, caseless, an alternation) and a tail (unbounded, bounded, $),
 * with random flags (i, m, s, H), 1 to 4 per set; haystacks with factors
 * planted close together (overlapping start intervals), at both ends, and
 * samples of the rules. Hyperscan's hits, and the same as every group
 * walked in full; natural grouping and every rule on the bit-NFA. */
START_TEST(test_confirm_gating)
{
    static const char *const leads[] = {"",          "\\b",      "^",           "[a-z]*",
                                        "[a-z0-9]+", "\\w{0,8}", "x[0-9]{1,3}", "(?:ab|cd)*",
                                        ".{2,6}",    "[^\\n]*="};
    static const char *const factors[] = {"key",  "tok(?:en|EN)", "(?:pass|pwd)", "QQzz",
                                          "corp", "(?i:secret)",  "mid\\b",       "\\.ey"};
    static const char *const tails[] = {
        "[a-z]*",  "=[0-9]+",  "[^\\n]*;",      "\\w+\\b",   ".*x", "[ =]*[0-9a-f]{2,}",
        "[a-z]*$", "(?:ab)+c", "[a-z]{2,}END$", "[0-9]{2,5}"};
    static const char *const plants[] = {
        "key",  "token", "tokEN", "pass", "pwd", "QQzz", "corp", "SeCrEt", "mid", ".ey",
        "=12;", "abab",  "c",     "x",    "END", "\n",   "ab",   "ff00 ",  "q",   "key="};
    static const char filler[] = "az09_ x-=\t\n.fZ";
    static const uint32_t flagsets[] = {0, RULE_F_CASELESS, RULE_F_MULTILINE, RULE_F_DOTALL,
                                        RULE_F_SINGLEMATCH};
    struct rng rng = {0xc0f1a11dull};
    struct stats st = {0};
    check_full_walk = true;
    for (int set = 0; set < 40; set++) {
        enum { MAXR = 4 };
        struct trule r[MAXR];
        size_t n = 1 + rng_below(&rng, MAXR);
        for (size_t i = 0; i < n; i++) {
            char pat[160];
            snprintf(pat, sizeof(pat), "%s%s%s", leads[rng_below(&rng, 10)],
                     factors[rng_below(&rng, 8)], tails[rng_below(&rng, 10)]);
            memset(&r[i], 0, sizeof(r[i]));
            snprintf(r[i].id, sizeof(r[i].id), "c%d_%zu", set, i);
            r[i].kind = RULE_REGEX;
            r[i].pat = xstrndup(pat, strlen(pat));
            r[i].len = strlen(pat);
            r[i].hs = xstrndup(pat, strlen(pat));
            r[i].flags = flagsets[rng_below(&rng, 5)];
        }
        enum { NH = 3 };
        struct str bufs[NH] = {{0}};
        struct hay hays[NH];
        for (int k = 0; k < NH; k++) {
            if (k == 1) /* a factor at the very start */
                str_puts(&bufs[k], plants[rng_below(&rng, 10)]);
            for (int round = 0; round < 12; round++) {
                uint32_t roll = rng_below(&rng, 4);
                if (roll == 0)
                    sample_rule_wide(&r[rng_below(&rng, (uint32_t)n)], &rng, &bufs[k]);
                else if (roll == 1)
                    str_puts(&bufs[k], plants[rng_below(&rng, 20)]);
                else
                    for (uint32_t f = rng_below(&rng, roll == 2 ? 4 : 60); f > 0; f--)
                        str_putc(&bufs[k], filler[rng_below(&rng, sizeof(filler) - 1)]);
            }
            if (k != 1) /* and at the very end */
                str_puts(&bufs[k], plants[rng_below(&rng, 10)]);
            snprintf(hays[k].name, sizeof(hays[k].name), "set %d #%d", set, k);
            hays[k].p = (const uint8_t *)bufs[k].p;
            hays[k].len = bufs[k].n;
        }
        force_bitnfa = set % 2 == 1;
        compare_set(r, n, 0, 0, "confirm gating", false, hays, NH, &st);
        force_bitnfa = false;
        for (size_t i = 0; i < n; i++)
            trule_free(&r[i]);
        for (int k = 0; k < NH; k++)
            str_free(&bufs[k]);
    }
    check_full_walk = false;
    stats_print(&st, "confirm gating");
    printf("hsdiff confirm gating: %u gated rules, %u confirmed forward, %u gated != full\n",
           st.gated_rules, st.confirm_rules, st.gate_diffs);
    ck_assert_msg(st.mismatches == 0, "%u haystacks give different hits", st.mismatches);
    ck_assert_uint_eq(st.gate_diffs, 0);
    ck_assert_uint_ge(st.confirm_rules, 30);
    ck_assert_uint_gt(st.hits, 100);
}
END_TEST

/* The plan shape of gitleaks-regex. Every rule with selective factors gated
 * (gate_states 1): at most 3 groups walk every byte (DFA groups, ungated
 * bit-NFA groups, the factor group), every other rule is walked only around
 * its factors, the unbounded ones confirmed forward. By default, rules with
 * small DFAs (<= 64 states) stay in DFA groups: a few more passes, each
 * from shared memory (docs/engine.md), the large ones still gated. */
START_TEST(test_gitleaks_passes)
{
    size_t n;
    struct trule *rules = load_patfile(data_file("gitleaks/gitleaks-regex.rules"), &n);
    struct rule_src *src = xrealloc(NULL, n * sizeof(*src));
    for (size_t i = 0; i < n; i++)
        src[i] = (struct rule_src){rules[i].id,  rules[i].kind,  rules[i].pat,
                                   rules[i].len, rules[i].flags, rules[i].line};
    const struct {
        uint32_t gate_states, max_full, min_gated;
    } shapes[] = {{1, 3, 200}, {0, 8, 150}};
    for (size_t k = 0; k < 2; k++) {
        struct rules_options ro = {.gate_states = shapes[k].gate_states};
        struct rules_result res;
        struct vks_error err = {0};
        ck_assert_int_eq(rules_compile(src, n, &ro, &res, &err), 0);
        ck_assert_uint_eq(res.n_rejects, 0);
        const struct catalog *cat = res.catalog;
        uint32_t full = 0, gated_rules = 0, confirm = 0;
        for (uint32_t g = 0; g < catalog_group_count(cat); g++)
            full++; /* DFA groups and the factor group */
        for (uint32_t g = 0; g < catalog_nfa_count(cat); g++) {
            struct catalog_nfa cn;
            catalog_nfa(cat, g, &cn);
            full += !(cn.flags & CAT_GF_GATED);
            gated_rules += cn.flags & CAT_GF_GATED ? cn.n_rules : 0;
            confirm += (cn.flags & CAT_GF_CONFIRM) != 0;
        }
        printf("gitleaks-regex, gate_states %u: %u full passes, %u DFA groups, %u bit-NFA "
               "groups, %u gated rules, %u forward-confirmed groups\n",
               shapes[k].gate_states, full, catalog_group_count(cat), catalog_nfa_count(cat),
               gated_rules, confirm);
        ck_assert_uint_le(full, shapes[k].max_full);
        ck_assert_uint_ge(gated_rules, shapes[k].min_gated);
        ck_assert_uint_ge(confirm, 1);
        rules_result_finish(&res);
    }
    free(src);
    for (size_t i = 0; i < n; i++)
        trule_free(&rules[i]);
    free(rules);
}
END_TEST

/* gitleaks-regex's rules whose wide counters have no factor to gate them
 * (`\b[a-fA-F0-9]{40}\b`, `s\.[a-z0-9]{24}`): each has a DFA of a few
 * hundred states, so they are DFA rules (one cheap pass) instead of an
 * ungated bit-NFA group walked over every byte, and still match exactly as
 * Hyperscan does, around hex runs of 39 to 41 digits, sgp_ and hvs./s.
 * tokens cut short, glued to words and at line ends. */
START_TEST(test_wide_small_dfa)
{
    size_t n, m = 0;
    struct trule *rules = load_patfile(data_file("gitleaks/gitleaks-regex.rules"), &n);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(rules[i].id, "sourcegraph-access-token") == 0 ||
            strcmp(rules[i].id, "vault-service-token") == 0)
            rules[m++] = rules[i];
        else
            trule_free(&rules[i]);
    }
    ck_assert_uint_eq(m, 2);
    static const char *const parts[] = {"sgp_", "local_", "hvs.", "s.", " ", "\n", "'", ";",
                                        "x",    "_",      "\\n",  "-",  ".", "\"", "\t"};
    struct rng rng = {0x5a11dfaull};
    struct str t = {0};
    for (int k = 0; k < 3000; k++) {
        uint32_t r = rng_below(&rng, 4);
        if (r == 0) { /* a run of 38..42 hex digits or 22..26 base-36 letters */
            bool hex = rng_pct(&rng, 60);
            uint32_t run = hex ? 38 + rng_below(&rng, 5) : 22 + rng_below(&rng, 5);
            if (!hex && rng_pct(&rng, 40))
                run = 88 + rng_below(&rng, 36); /* hvs. tokens are 90..120 */
            for (uint32_t x = 0; x < run; x++)
                str_putc(&t, hex ? "0123456789abcdefABCDEF"[rng_below(&rng, 22)]
                                 : "abcdefghijklmnopqrstuvwxyz0123456789ABC"[rng_below(&rng, 39)]);
        } else {
            str_puts(&t, parts[rng_below(&rng, 15)]);
        }
    }
    struct hay h = {.p = (const uint8_t *)t.p, .len = t.n};
    snprintf(h.name, sizeof(h.name), "hex runs and tokens");
    struct stats st = {0};
    compare_set(rules, m, 0, 0, "wide rules as DFAs", true, &h, 1, &st);
    ck_assert_msg(st.mismatches == 0, "%u haystacks give different hits", st.mismatches);
    ck_assert_uint_eq(st.compared, 2);
    ck_assert_uint_eq(st.nfa_rules, 0); /* both are DFA rules */
    ck_assert_uint_gt(st.hits, 10);
    str_free(&t);
    trules_free(rules, m);
}
END_TEST

/* The host's factor walk (refscan_factor_scan) walks a long range as four
 * interleaved quarters: over random ranges of gitleaks-regex's synthetic
 * secrets, the same candidates as the plain walk of 1000-byte pieces. */
START_TEST(test_factor_walk_lanes)
{
    size_t n, len;
    struct trule *rules = load_patfile(data_file("gitleaks/gitleaks-regex.rules"), &n);
    struct rule_src *src = xrealloc(NULL, n * sizeof(*src));
    for (size_t i = 0; i < n; i++)
        src[i] = (struct rule_src){rules[i].id,  rules[i].kind,  rules[i].pat,
                                   rules[i].len, rules[i].flags, rules[i].line};
    struct rules_result res;
    struct vks_error err = {0};
    ck_assert_int_eq(rules_compile(src, n, NULL, &res, &err), 0);
    uint8_t *hay = hay_secrets(data_dir(), &len);
    ck_assert_uint_gt(len, 20000);
    struct rng rng = {0xfac70full};
    size_t total = 0;
    for (int round = 0; round < 40; round++) {
        uint64_t lo = rng_below(&rng, (uint32_t)(len - 10000));
        uint64_t hi = lo + 5000 + rng_below(&rng, (uint32_t)(len - lo - 5000));
        struct refscan_gate whole = {0}, parts = {0};
        ck_assert_int_eq(refscan_factor_scan(res.catalog, hay, len, lo, hi, &whole), 0);
        for (uint64_t a = lo; a < hi; a += 1000)
            ck_assert_int_eq(refscan_factor_scan(res.catalog, hay, len, a,
                                                 a + 1000 < hi ? a + 1000 : hi, &parts),
                             0);
        refscan_gate_sort(&whole);
        refscan_gate_sort(&parts);
        ck_assert_uint_eq(whole.n, parts.n);
        for (size_t k = 0; k < whole.n; k++) {
            ck_assert_uint_eq(whole.v[k].nfa, parts.v[k].nfa);
            ck_assert_uint_eq(whole.v[k].end, parts.v[k].end);
            ck_assert(whole.v[k].end > lo && whole.v[k].end <= hi);
        }
        total += whole.n;
        refscan_gate_finish(&whole);
        refscan_gate_finish(&parts);
    }
    ck_assert_uint_gt(total, 200);
    free(hay);
    rules_result_finish(&res);
    free(src);
    for (size_t i = 0; i < n; i++)
        trule_free(&rules[i]);
    free(rules);
}
END_TEST

/* The gitleaks regexes from the tree (tests/data/gitleaks, MIT): all 221
 * compile, none is rejected for size, and every hit is Hyperscan's on
 * synthetic secrets built around the gitleaks keywords and on samples
 * drawn from the rules themselves. */
START_TEST(test_gitleaks_tree)
{
    const char *dir = data_dir();
    size_t n;
    force_bitnfa = false;
    struct trule *rules = load_patfile(data_file("gitleaks/gitleaks-regex.rules"), &n);
    ck_assert_uint_eq(n, 221);
    struct hay hays[3];
    uint8_t *secrets = hay_secrets(dir, &hays[0].len);
    hays[0].p = secrets;
    snprintf(hays[0].name, sizeof(hays[0].name), "synthetic secrets");
    uint8_t *planted = hay_planted_file(rules, n, &hays[1].len);
    hays[1].p = planted;
    snprintf(hays[1].name, sizeof(hays[1].name), "samples of gitleaks-regex");
    struct rng rng = {99};
    struct str wide = {0};
    for (size_t i = 0; i < n; i++) {
        sample_rule_wide(&rules[i], &rng, &wide);
        str_puts(&wide, i % 3 ? " \n" : "\" ");
    }
    hays[2].p = (const uint8_t *)wide.p;
    hays[2].len = wide.n;
    snprintf(hays[2].name, sizeof(hays[2].name), "long samples of gitleaks-regex");
    struct stats st = {0};
    compare_set(rules, n, 0, 0, "gitleaks-regex (tests/data)", false, hays, 3, &st);
    stats_print(&st, "gitleaks-regex (tests/data)");
    free(secrets);
    free(planted);
    str_free(&wide);
    trules_free(rules, n);
    ck_assert_msg(st.mismatches == 0, "%u haystacks give different hits", st.mismatches);
    ck_assert_uint_eq(st.our_rejects + st.both_rejects, 0);
    ck_assert_uint_eq(st.compared, n - st.hs_rejects);
    ck_assert_uint_eq(st.hs_rejects, 0);
    ck_assert_uint_gt(st.nfa_rules, 0);
    ck_assert_uint_gt(st.gated_rules, 80); /* the secret rules, walked around their factors */
    ck_assert_uint_gt(st.hits, n);
}
END_TEST

Suite *hsdiff_suite(void)
{
    Suite *s = suite_create("hsdiff");
    TCase *tc = tcase_create("random");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_known_semantics);
    tcase_add_test(tc, test_random_single);
    tcase_add_test(tc, test_random_multi);
    tcase_add_test(tc, test_random_single_bitnfa);
    tcase_add_test(tc, test_random_multi_bitnfa);
    tcase_add_test(tc, test_bounded_repeats);
    tcase_add_test(tc, test_lead_shapes);
    tcase_add_test(tc, test_large_repeats);
    tcase_add_test(tc, test_gitleaks_tree);
    tcase_add_test(tc, test_factors_required);
    tcase_add_test(tc, test_factor_gating);
    suite_add_tcase(s, tc);
    TCase *hex = tcase_create("hex");
    tcase_set_timeout(hex, 600);
    tcase_add_test(hex, test_random_hex);
    suite_add_tcase(s, hex);
    TCase *gating = tcase_create("gating");
    tcase_set_timeout(gating, 600);
    tcase_add_test(gating, test_confirm_gating);
    tcase_add_test(gating, test_gitleaks_passes);
    tcase_add_test(gating, test_wide_small_dfa);
    tcase_add_test(gating, test_factor_walk_lanes);
    tcase_add_test(gating, test_weak_anchors);
    suite_add_tcase(s, gating);
    TCase *cpu = tcase_create("cpu-engine");
    tcase_set_timeout(cpu, 600);
    tcase_add_loop_test(cpu, test_cpu_engine_shared_literals, 0, 2);
    tcase_add_test(cpu, test_binary_literals_20k);
    tcase_add_test(cpu, test_split_gated_segments);
    suite_add_tcase(s, cpu);
    TCase *files = tcase_create("shared-data");
    tcase_set_timeout(files, 600);
    tcase_add_test(files, test_shared_gitleaks);
    tcase_add_test(files, test_shapes);
    tcase_add_test(files, test_shared_rebar);
    suite_add_tcase(s, files);
    return s;
}
