/*
 * The CPU reference scanner over a packed catalog. Deliberately plain: it
 * is the definition the GPU kernel is checked against.
 */
#include "refscan.h"
#include "cpuplan.h"
#include "nfastep.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static uint32_t lookahead(const uint8_t *buf, size_t len, size_t i)
{
    if (i >= len)
        return CAT_K_EOD;
    uint32_t k = catalog_byte_kind(buf[i]);
    return k == CAT_K_NL && i + 1 == len ? CAT_K_NL_LAST : k;
}

/* Reports the accept entries of state s at end i (lookahead buf[i]). */
static int dfa_report(const struct catalog_group *g, uint32_t s, const uint8_t *buf, size_t len,
                      size_t i, refscan_fn fn, void *ctx)
{
    uint32_t bit = 1u << lookahead(buf, len, i);
    const uint32_t *a = g->accepts + g->accept_index[s - g->first_accept];
    const uint32_t *end = g->accepts + g->accept_index[s - g->first_accept + 1];
    for (; a < end; a++) {
        if (CAT_ACCEPT_MASK(*a) & bit) {
            int rc = fn(ctx, CAT_ACCEPT_RULE(*a), i);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

int refscan_group_range(const struct catalog *cat, uint32_t group, const uint8_t *buf, size_t len,
                        size_t begin, uint64_t lo, uint64_t hi, refscan_fn fn, void *ctx)
{
    struct catalog_group g;
    catalog_group(cat, group, &g);
    if (hi > len)
        hi = len;
    uint32_t s = catalog_group_start(&g, buf, begin);
    for (size_t i = begin;; i++) {
        if (s >= g.first_accept && i > lo) {
            int rc = dfa_report(&g, s, buf, len, i, fn, ctx);
            if (rc != 0)
                return rc;
        }
        if (i >= hi)
            return 0;
        s = g.trans[(size_t)s * g.n_classes + g.classmap[buf[i]]];
    }
}

int refscan_group_resume(const struct catalog *cat, uint32_t group, const uint8_t *buf, size_t len,
                         uint64_t lo, uint64_t hi, uint32_t state, uint32_t guess, refscan_fn fn,
                         void *ctx, refscan_fn gfn, void *gctx, uint64_t *upto, uint32_t *out)
{
    struct catalog_group g;
    catalog_group(cat, group, &g);
    if (hi > len)
        hi = len;
    *out = UINT32_MAX;
    for (uint64_t i = lo;; i++) {
        if (state == guess) {
            *upto = i;
            return 0;
        }
        if (state >= g.first_accept && i > lo) {
            int rc = dfa_report(&g, state, buf, len, i, fn, ctx);
            if (rc != 0)
                return rc;
        }
        if (gfn != NULL && guess >= g.first_accept && i > lo) {
            int rc = dfa_report(&g, guess, buf, len, i, gfn, gctx);
            if (rc != 0)
                return rc;
        }
        if (i >= hi) {
            *upto = hi + 1;
            *out = state;
            return 0;
        }
        size_t c = g.classmap[buf[i]];
        state = g.trans[(size_t)state * g.n_classes + c];
        guess = g.trans[(size_t)guess * g.n_classes + c];
    }
}

static uint32_t prev_kind(const uint8_t *buf, size_t i)
{
    if (i == 0)
        return 0; /* P_BOS */
    switch (catalog_byte_kind(buf[i - 1])) {
    case CAT_K_WORD:
        return 1; /* P_WORD */
    case CAT_K_NL:
        return 2; /* P_NL */
    default:
        return 3; /* P_OTHER */
    }
}

/* Reports each rule whose accept entry holds in state s at end i once
 * (entries are sorted by rule). */
static int nfa_report(const struct catalog_nfa *g, const struct nvec *s, uint32_t pk, uint64_t i,
                      refscan_fn fn, void *ctx)
{
    uint32_t last = UINT32_MAX;
    if (g->small != NULL) { /* masks: one test per entry */
        catalog_mask v = nvec_small(s);
        if ((v & g->small->acc_any) == 0)
            return 0;
        for (uint32_t k = 0; k < g->small->n_acc; k++) {
            const struct catalog_nfa_acc64 *a = &g->small->acc[k];
            if (a->rule == last || !(a->cond & pk) || !(v & a->src))
                continue;
            last = a->rule;
            int rc = fn(ctx, last, i);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    for (uint32_t k = 0; s->lo <= s->hi && k < g->n_acc; k++) {
        const uint32_t *e = g->acc + (size_t)k * CAT_X_WORDS;
        const uint32_t *rg = g->ranges + 2 * (size_t)e[CAT_A_FIRST];
        if (e[CAT_A_RULE] == last || !(e[CAT_A_COND] & pk) || !span_meets(s, rg, e[CAT_A_NSRC]) ||
            !any_in(s->v, rg, e[CAT_A_NSRC]))
            continue;
        last = e[CAT_A_RULE];
        int rc = fn(ctx, last, i);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int nfa_walk(const struct catalog_nfa *gp, const uint8_t *buf, size_t len, size_t begin,
                    uint64_t lo, uint64_t hi, uint32_t *sv, uint32_t *tv, refscan_fn fn, void *ctx)
{
    const struct catalog_nfa g = *gp;
    struct nvec a = {sv, 1, 0}, b = {tv, 1, 0};
    struct nvec *s = &a, *t = &b;
    if (hi > len)
        hi = len;
    for (size_t i = begin;; i++) {
        uint32_t pk = CAT_PK(prev_kind(buf, i), lookahead(buf, len, i));
        int rc = i > lo ? nfa_report(&g, s, pk, i, fn, ctx) : 0;
        if (rc != 0)
            return rc;
        if (i >= hi)
            return 0;
        nfa_step(&g, s, t, pk, buf[i]);
        struct nvec *x = s;
        s = t;
        t = x;
    }
}

/* The exact live-word bounds of v[0..n). */
static struct nvec nvec_of(uint32_t *v, uint32_t n)
{
    struct nvec x = {v, 1, 0};
    for (uint32_t w = 0; w < n; w++) {
        if (v[w] == 0)
            continue;
        if (x.lo > x.hi)
            x.lo = w;
        x.hi = w;
    }
    return x;
}

static bool nvec_equal(const struct nvec *a, const struct nvec *b)
{
    if (a->lo > a->hi || b->lo > b->hi)
        return a->lo > a->hi && b->lo > b->hi;
    return a->lo == b->lo && a->hi == b->hi &&
           memcmp(a->v + a->lo, b->v + b->lo, (a->hi - a->lo + 1) * sizeof(uint32_t)) == 0;
}

int refscan_nfa_resume(const struct catalog *cat, uint32_t nfa, const uint8_t *buf, size_t len,
                       uint64_t lo, uint64_t hi, uint32_t *state, const uint32_t *guess,
                       refscan_fn fn, void *ctx, refscan_fn gfn, void *gctx, uint64_t *upto,
                       bool *agreed)
{
    struct catalog_nfa g;
    catalog_nfa(cat, nfa, &g);
    uint32_t nw = g.n_words;
    uint32_t *m = calloc(4 * (size_t)nw, sizeof(uint32_t));
    if (m == NULL)
        return -ENOMEM;
    memcpy(m, state, nw * sizeof(uint32_t));
    memcpy(m + 2 * nw, guess, nw * sizeof(uint32_t));
    struct nvec a = nvec_of(m, nw), b = {m + nw, 1, 0};
    struct nvec c = nvec_of(m + 2 * nw, nw), d = {m + 3 * nw, 1, 0};
    struct nvec *s = &a, *t = &b, *u = &c, *v = &d;
    if (hi > len)
        hi = len;
    int rc = 0;
    for (uint64_t i = lo;; i++) {
        if (nvec_equal(s, u)) {
            *upto = i;
            *agreed = true;
            break;
        }
        uint32_t pk = CAT_PK(prev_kind(buf, i), lookahead(buf, len, i));
        rc = i > lo ? nfa_report(&g, s, pk, i, fn, ctx) : 0;
        if (rc == 0 && gfn != NULL && i > lo)
            rc = nfa_report(&g, u, pk, i, gfn, gctx);
        if (rc != 0)
            break;
        if (i >= hi) {
            *upto = hi + 1;
            *agreed = false;
            memcpy(state, s->v, nw * sizeof(uint32_t));
            break;
        }
        nfa_step(&g, s, t, pk, buf[i]);
        nfa_step(&g, u, v, pk, buf[i]);
        struct nvec *x = s;
        s = t;
        t = x;
        x = u;
        u = v;
        v = x;
    }
    free(m);
    return rc;
}

/* Whether byte c is in a group's span set (CAT_N_SPAN). */
static inline bool span_has(const uint32_t *span, uint8_t c)
{
    return span[c >> 5] >> (c & 31) & 1;
}

/* The first start a factor end e allows: e - lookback (0 when unbounded),
 * and with a span set no earlier than the run of span bytes that ends at
 * e - SKIP (span[8]). Ends come ascending: the run's start is carried from
 * one to the next (`checked`: the bytes [rs, checked) are span bytes), so
 * every byte is tested at most once however many ends share a long run. */
static uint64_t start_from_run(struct refscan_starts *b, uint64_t e);

uint64_t refscan_start_from(struct refscan_starts *b, uint64_t e)
{
    uint64_t from = start_from_run(b, e), floor = b->floor < e ? b->floor : e;
    return from > floor ? from : floor;
}

static uint64_t start_from_run(struct refscan_starts *b, uint64_t e)
{
    uint64_t from = b->lookback == CATALOG_UNBOUNDED || e < b->lookback ? 0 : e - b->lookback;
    b->cut = false;
    if (b->span == NULL || b->buf == NULL || (b->hi > 0 && e > b->hi))
        return from;
    /* buf[i] is byte lo + i; bytes below lo are unknown (lo is 0 for a
     * whole buffer), as are those below from for this end's purpose */
    const uint8_t *at_lo = b->buf;
    uint64_t lo = b->hi > 0 ? b->lo : 0;
    uint64_t p = e > b->span[8] ? e - b->span[8] : 0, low = lo > from ? lo : from;
    if (p < b->checked) { /* out of order: nothing carried applies */
        while (p > low && span_has(b->span, at_lo[p - 1 - lo]))
            p--;
        b->cut = p <= low && lo > from;
        return p > low ? p : from;
    }
    /* Below from nothing matters: every later end allows no start before
     * its own from, which is at least this one. */
    uint64_t floor = b->checked > from ? b->checked : from, at = p;
    b->cut = lo > floor;
    floor = floor > lo ? floor : lo;
    while (p > floor && span_has(b->span, at_lo[p - 1 - lo]))
        p--;
    b->cut = b->cut && p <= floor;
    if (p > floor)
        b->rs = p; /* byte p - 1 is no span byte */
    /* else the run goes on to `at`, from rs or from below from; or it
     * reached unknown bytes (below lo, above checked), which may all be
     * span bytes: then the run goes on to the carried one, from rs again
     * (bytes [rs, checked) are span bytes, or rs is below from) */
    b->checked = at;
    return b->rs > from ? b->rs : from;
}

/* The start intervals of a forward confirmation, ascending by start:
 * [refscan_start_from(e), e) of factor ends e = v[k * stride] (ends), or
 * [v[2k], v[2k + 1]) (pairs, stride 0). */
struct start_ivs {
    const uint64_t *v;
    size_t n, stride;
    struct refscan_starts b;
    size_t memo_k; /* iv_from's last answer, for k = memo_k - 1 */
    uint64_t memo;
};

static uint64_t iv_from(struct start_ivs *q, size_t k)
{
    if (q->stride == 0)
        return q->v[2 * k];
    if (q->memo_k != k + 1) {
        q->memo = refscan_start_from(&q->b, q->v[k * q->stride]);
        q->memo_k = k + 1;
    }
    return q->memo;
}

static uint64_t iv_until(const struct start_ivs *q, size_t k)
{
    return q->stride == 0 ? q->v[2 * k + 1] : q->v[k * q->stride];
}

/* Would state s report a rule at an end whose context is pk? */
static bool nfa_accepts(const struct catalog_nfa *g, const struct nvec *s, uint32_t pk)
{
    if (g->small != NULL) {
        catalog_mask v = nvec_small(s);
        for (uint32_t k = 0; (v & g->small->acc_any) && k < g->small->n_acc; k++)
            if ((g->small->acc[k].cond & pk) && (v & g->small->acc[k].src))
                return true;
        return false;
    }
    for (uint32_t k = 0; s->lo <= s->hi && k < g->n_acc; k++) {
        const uint32_t *e = g->acc + (size_t)k * CAT_X_WORDS;
        const uint32_t *rg = g->ranges + 2 * (size_t)e[CAT_A_FIRST];
        if ((e[CAT_A_COND] & pk) && span_meets(s, rg, e[CAT_A_NSRC]) &&
            any_in(s->v, rg, e[CAT_A_NSRC]))
            return true;
    }
    return false;
}

/*
 * Runs that leave a live state as it is (docs/engine.md "Forward
 * confirmation"): data that keeps a confirmation alive (`tok[a-z]*9`
 * followed by megabytes of letters, `\s*` over spaces, `.*` over a line)
 * mostly holds the walk in one state that each byte of the run maps to
 * itself, reporting nothing. For such a state, a table over the 256 byte
 * values says which bytes keep it (STAY) whatever the byte before them, so
 * the walk skips them with one load per byte instead of a step. A byte's
 * entry is found on first use with three trial steps (one per kind of
 * previous byte: word, newline, other) and holds for every byte of the
 * same class and kind; a few states' tables are kept per walk.
 */
enum { RUN_UNKNOWN, RUN_STAY, RUN_LEAVE };
#define RUN_KEY_WORDS 8u /* states of at most this many live words have tables */
#define RUN_SLOTS     8u

struct run_slot {
    uint32_t lo, hi;
    uint32_t key[RUN_KEY_WORDS];
    uint8_t tab[256];
};

struct run_cache {
    struct run_slot slot[RUN_SLOTS];
    uint32_t used, next;
    /* Trial steps spent against bytes skipped: past zero (states that
     * change every few bytes) the walk stops trying, so the tables never
     * cost more than a bounded share of a plain walk. */
    int64_t credit;
};

/* The table of live state s, made empty when s has none yet; NULL when s
 * is too wide to keep. */
static struct run_slot *run_slot_of(struct run_cache *rc, const struct nvec *s)
{
    uint32_t n = s->hi - s->lo + 1;
    if (n > RUN_KEY_WORDS)
        return NULL;
    for (uint32_t k = 0; k < rc->used; k++) {
        struct run_slot *x = &rc->slot[k];
        if (x->lo == s->lo && x->hi == s->hi &&
            memcmp(x->key, s->v + s->lo, n * sizeof(uint32_t)) == 0)
            return x;
    }
    struct run_slot *x = &rc->slot[rc->next];
    rc->next = (rc->next + 1) % RUN_SLOTS;
    rc->used += rc->used < RUN_SLOTS;
    x->lo = s->lo;
    x->hi = s->hi;
    memcpy(x->key, s->v + s->lo, n * sizeof(uint32_t));
    memset(x->tab, RUN_UNKNOWN, sizeof(x->tab));
    return x;
}

/* Fills the entries of every byte of c's class and kind: STAY when, after
 * any previous byte, s reports nothing before c and steps to itself on it
 * with no start edge. `t` is the walk's spare vector. */
static void run_classify(const struct catalog_nfa *g, struct run_slot *x, const struct nvec *s,
                         struct nvec *t, uint8_t c)
{
    uint32_t kind = catalog_byte_kind(c), cls = g->classmap[c];
    bool stay = true;
    for (uint32_t p = 1; p <= 3 && stay; p++) { /* P_WORD, P_NL, P_OTHER: never BOS inside */
        uint32_t pk = CAT_PK(p, kind);
        if (nfa_accepts(g, s, pk))
            stay = false;
        else {
            nfa_step_starts(g, s, t, pk, c, false);
            stay = nvec_equal(s, t);
        }
    }
    for (uint32_t v = 0; v < 256; v++)
        if (g->classmap[v] == cls && catalog_byte_kind((uint8_t)v) == kind)
            x->tab[v] = stay ? RUN_STAY : RUN_LEAVE;
}

/* The first offset in [i, end) whose byte does not keep state s (end when
 * all do). */
static uint64_t run_skip(const struct catalog_nfa *g, struct run_cache *rc, const struct nvec *s,
                         struct nvec *t, const uint8_t *buf, uint64_t i, uint64_t end)
{
    struct run_slot *x = run_slot_of(rc, s);
    if (x == NULL)
        return i;
    uint64_t from = i;
    for (;;) {
        while (i < end && x->tab[buf[i]] == RUN_STAY)
            i++;
        if (i >= end || x->tab[buf[i]] == RUN_LEAVE)
            break;
        rc->credit -= 4;
        run_classify(g, x, s, t, buf[i]);
    }
    rc->credit += (int64_t)((i - from) / 4);
    return i;
}

/*
 * Forward confirmation (CAT_GF_CONFIRM): one walk in which start edges fire
 * only at offsets inside one of the intervals `q`. Where the state is
 * empty and no start is allowed the walk jumps to the next interval, so
 * each (rule, end) is reported once however the intervals overlap. Where
 * a step left the state as it was and no start is allowed, run_skip
 * passes over the bytes that keep it so (never the buffer's last byte,
 * whose lookahead differs, nor past hi or the next interval).
 */
static int confirm_walk(const struct catalog_nfa *g, const uint8_t *buf, size_t len,
                        struct start_ivs *q, uint64_t lo, uint64_t hi, uint32_t *sv, uint32_t *tv,
                        refscan_fn fn, void *ctx)
{
    struct nvec a = {sv, 1, 0}, b = {tv, 1, 0};
    struct nvec *s = &a, *t = &b;
    struct run_cache runs;
    runs.used = runs.next = 0;
    runs.credit = 256;
    bool same = false; /* the last step left the state as it was */
    if (hi > len)
        hi = len;
    size_t k = 0;
    uint64_t until = 0; /* starts are allowed below this offset */
    uint64_t i = q->n > 0 ? iv_from(q, 0) : hi;
    while (i <= hi) {
        for (; k < q->n && iv_from(q, k) <= i; k++)
            until = iv_until(q, k) > until ? iv_until(q, k) : until;
        bool alive = s->lo <= s->hi, starts = i < until;
        if (!alive && !starts) {
            if (k == q->n)
                return 0;
            i = iv_from(q, k);
            continue;
        }
        if (same && !starts && i > 0 && runs.credit > 0) {
            uint64_t end = hi < len - 1 ? hi : len - 1;
            if (k < q->n && iv_from(q, k) < end)
                end = iv_from(q, k);
            uint64_t j = run_skip(g, &runs, s, t, buf, i, end);
            same = false;
            if (j != i) {
                i = j;
                continue;
            }
        }
        uint32_t pk = CAT_PK(prev_kind(buf, i), lookahead(buf, len, i));
        int rc = i > lo ? nfa_report(g, s, pk, i, fn, ctx) : 0;
        if (rc != 0 || i >= hi)
            return rc;
        nfa_step_starts(g, s, t, pk, buf[i], starts);
        same = alive && nvec_equal(s, t);
        struct nvec *x = s;
        s = t;
        t = x;
        i++;
    }
    return 0;
}

/* Either walk of bit-NFA group nfa: the plain one from `begin`, or forward
 * confirmation from the start intervals `q` when it is not NULL. */
static int nfa_range(const struct catalog *cat, uint32_t nfa, const uint8_t *buf, size_t len,
                     size_t begin, uint64_t lo, uint64_t hi, struct start_ivs *q, refscan_fn fn,
                     void *ctx)
{
    struct catalog_nfa g;
    catalog_nfa(cat, nfa, &g);
    uint32_t a[128] = {0}, b[128] = {0};
    uint32_t *s = a, *t = b, *heap = NULL;
    if (g.n_words > 128) { /* a lone large rule: up to CAT_NFA_MAX_BITS */
        heap = calloc(2 * (size_t)g.n_words, sizeof(uint32_t));
        if (heap == NULL)
            return -ENOMEM;
        s = heap;
        t = heap + g.n_words;
    }
    if (q != NULL) {
        q->b.lookback = g.lookback;
        q->b.span = g.span;
        q->b.buf = buf;
    }
    int rc = q != NULL ? confirm_walk(&g, buf, len, q, lo, hi, s, t, fn, ctx)
                       : nfa_walk(&g, buf, len, begin, lo, hi, s, t, fn, ctx);
    free(heap);
    return rc;
}

int refscan_confirm_range(const struct catalog *cat, uint32_t nfa, const uint8_t *buf, size_t len,
                          const uint64_t *iv, size_t n, refscan_fn fn, void *ctx)
{
    struct start_ivs q = {.v = iv, .n = n, .stride = 0};
    return nfa_range(cat, nfa, buf, len, 0, 0, len, &q, fn, ctx);
}

int refscan_nfa_range(const struct catalog *cat, uint32_t nfa, const uint8_t *buf, size_t len,
                      size_t begin, uint64_t lo, uint64_t hi, refscan_fn fn, void *ctx)
{
    return nfa_range(cat, nfa, buf, len, begin, lo, hi, NULL, fn, ctx);
}

static _Atomic uint64_t raw_limit;

void refscan_set_raw_limit(uint64_t max)
{
    raw_limit = max;
}

uint64_t refscan_raw_limit(void)
{
    return raw_limit;
}

size_t refscan_raw_max(void)
{
    uint64_t max = raw_limit;
    return max > SIZE_MAX ? SIZE_MAX : (size_t)max;
}

int scan_hits_push(struct scan_hits *h, uint32_t rule, uint64_t end, uint32_t count)
{
    if (h->max != 0 && h->n >= h->max)
        return -E2BIG;
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        struct scan_hit *n = realloc(h->v, cap * sizeof(*n));
        if (n == NULL)
            return -ENOMEM;
        h->v = n;
        h->cap = cap;
    }
    h->v[h->n++] = (struct scan_hit){.rule = rule, .count = count, .end = end};
    return 0;
}

static int push_cb(void *ctx, uint32_t rule, uint64_t end)
{
    return scan_hits_push(ctx, rule, end, 1);
}

static int cmp_end_rule(const void *a, const void *b)
{
    const struct scan_hit *x = a, *y = b;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->rule < y->rule ? -1 : x->rule > y->rule;
}

static int cmp_rule_end(const void *a, const void *b)
{
    const struct scan_hit *x = a, *y = b;
    if (x->rule != y->rule)
        return x->rule < y->rule ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

#define SORT_SHORT          48u    /* lists this short take an insertion sort */
#define SORT_DIGIT_BITS     11u    /* 2,048 counters: in L1 */
#define SORT_WIDE_BITS      13u    /* 8,192 counters: in L1 on current cores */
#define SORT_WIDE_MIN       16384u /* lists this long may take wide digits */
#define SORT_HITS_RADIX_MIN 256u   /* scan_hits_sort: shorter lists take qsort */

/* How an LSD radix sort covers the `vary` bits in which its keys differ:
 * from bit *lo, in passes of equal digits of at most `max_bits`; returns
 * the passes, the digit width in *bits. */
static unsigned digit_plan(uint64_t vary, unsigned max_bits, unsigned *lo, unsigned *bits)
{
    *lo = (unsigned)__builtin_ctzll(vary);
    unsigned span = 64u - (unsigned)__builtin_clzll(vary) - *lo;
    unsigned passes = (span + max_bits - 1) / max_bits;
    *bits = (span + passes - 1) / passes;
    return passes;
}

/* One stable counting pass of scan_hits_sort: by the `bits`-bit digit at
 * `shift` of each hit's end (or rule). */
static void hits_pass(const struct scan_hit *src, struct scan_hit *dst, size_t n, bool rule,
                      unsigned shift, unsigned bits)
{
    uint32_t count[1u << SORT_DIGIT_BITS];
    const uint64_t digit = ((uint64_t)1 << bits) - 1;
    memset(count, 0, sizeof(count[0]) << bits);
    for (size_t i = 0; i < n; i++)
        count[((rule ? src[i].rule : src[i].end) >> shift) & digit]++;
    uint32_t sum = 0;
    for (size_t d = 0; d <= digit; d++) {
        uint32_t c = count[d];
        count[d] = sum;
        sum += c;
    }
    for (size_t i = 0; i < n; i++)
        dst[count[((rule ? src[i].rule : src[i].end) >> shift) & digit]++] = src[i];
}

/* The passes over one key field whose bits vary in `vary`, least
 * significant digit first; returns where the hits are now. */
static struct scan_hit *hits_field(struct scan_hit *src, struct scan_hit *dst, size_t n, bool rule,
                                   uint64_t vary)
{
    if (vary == 0)
        return src;
    unsigned lo, bits, passes = digit_plan(vary, SORT_DIGIT_BITS, &lo, &bits);
    for (unsigned p = 0; p < passes; p++) {
        hits_pass(src, dst, n, rule, lo + p * bits, bits);
        struct scan_hit *t = src;
        src = dst;
        dst = t;
    }
    return src;
}

void scan_hits_sort(struct scan_hit *v, size_t n, bool by_rule)
{
    struct scan_hit *tmp =
        n >= SORT_HITS_RADIX_MIN && n < UINT32_MAX ? malloc(n * sizeof(*tmp)) : NULL;
    if (tmp == NULL) {
        qsort(v, n, sizeof(*v), by_rule ? cmp_rule_end : cmp_end_rule);
        return;
    }
    uint64_t end_or = 0, end_and = ~0ull;
    uint32_t rule_or = 0, rule_and = ~0u;
    for (size_t i = 0; i < n; i++) {
        end_or |= v[i].end;
        end_and &= v[i].end;
        rule_or |= v[i].rule;
        rule_and &= v[i].rule;
    }
    uint64_t vary_end = end_or ^ end_and, vary_rule = rule_or ^ rule_and;
    /* the secondary key first: each pass is stable */
    struct scan_hit *at = hits_field(v, tmp, n, !by_rule, by_rule ? vary_end : vary_rule);
    at = hits_field(at, at == v ? tmp : v, n, by_rule, by_rule ? vary_rule : vary_end);
    if (at != v)
        memcpy(v, at, n * sizeof(*v));
    free(tmp);
}

/* LSD radix sort of k[0..n) over the bits in which keys differ, in digits
 * of equal width: a list of SORT_WIDE_MIN keys or more takes
 * SORT_WIDE_BITS-bit digits where that saves a pass (a bin of the GPU
 * finish, 22 bits of end and 16 of rule: 3 passes instead of 4, about 20%
 * less time), others SORT_DIGIT_BITS; tmp holds n keys. */
void scan_sort_u64(uint64_t *k, uint64_t *tmp, size_t n)
{
    if (n < SORT_SHORT) {
        for (size_t i = 1; i < n; i++) {
            uint64_t x = k[i];
            size_t p = i;
            for (; p > 0 && k[p - 1] > x; p--)
                k[p] = k[p - 1];
            k[p] = x;
        }
        return;
    }
    uint64_t all_or = 0, all_and = ~0ull;
    for (size_t i = 0; i < n; i++) {
        all_or |= k[i];
        all_and &= k[i];
    }
    uint64_t vary = all_or ^ all_and;
    if (vary == 0)
        return;
    unsigned lo, bits, passes = digit_plan(vary, SORT_DIGIT_BITS, &lo, &bits);
    unsigned wlo, wbits, wide = digit_plan(vary, SORT_WIDE_BITS, &wlo, &wbits);
    if (n >= SORT_WIDE_MIN && wide < passes)
        passes = wide, bits = wbits;
    uint32_t count[1u << SORT_WIDE_BITS];
    const uint64_t digit = ((uint64_t)1 << bits) - 1;
    uint64_t *src = k, *dst = tmp;
    for (unsigned p = 0; p < passes; p++) {
        unsigned shift = lo + p * bits;
        memset(count, 0, sizeof(count[0]) << bits);
        for (size_t i = 0; i < n; i++)
            count[(src[i] >> shift) & digit]++;
        uint32_t sum = 0;
        for (size_t d = 0; d <= digit; d++) {
            uint32_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++)
            dst[count[(src[i] >> shift) & digit]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != k)
        memcpy(k, src, n * sizeof(*k));
}

/* Hit lists this long take the radix path (below it, sorting is cheap and a
 * per-rule table would cost more than it saves). */
#define FINALIZE_RADIX_MIN 4096u
#define KEY_RULE_BITS      24u
#define KEY_END_LIMIT      ((uint64_t)1 << (64 - KEY_RULE_BITS))

int scan_reporter_init(struct scan_reporter *r, const struct catalog *cat)
{
    uint32_t n = catalog_rule_count(cat);
    *r = (struct scan_reporter){.cat = cat, .n_rules = n};
    r->stamp = calloc(n ? n : 1, sizeof(*r->stamp));
    r->first = malloc((n ? n : 1) * sizeof(*r->first));
    r->single = calloc(n ? n : 1, 1);
    if (r->stamp == NULL || r->first == NULL || r->single == NULL) {
        scan_reporter_finish(r);
        return -ENOMEM;
    }
    return 0;
}

void scan_reporter_buffer(struct scan_reporter *r)
{
    if (++r->gen == 0) { /* wrapped: no stamp may equal a new generation */
        memset(r->stamp, 0, (size_t)r->n_rules * sizeof(*r->stamp));
        r->gen = 1;
    }
}

enum scan_take scan_reporter_take(struct scan_reporter *r, enum scan_mode mode, uint32_t rule,
                                  uint64_t k, uint64_t *first)
{
    if (r->stamp[rule] != r->gen) {
        r->stamp[rule] = r->gen;
        r->first[rule] = k;
        return SCAN_TAKE_NEW;
    }
    if (r->single[rule] == 0) {
        struct catalog_rule cr;
        catalog_rule(r->cat, rule, &cr);
        r->single[rule] = (cr.flags & RULE_F_SINGLEMATCH) ? 2 : 1;
    }
    if (r->single[rule] == 2 || mode == SCAN_FIRST)
        return SCAN_TAKE_DROP;
    if (mode == SCAN_COUNT) {
        *first = r->first[rule];
        return SCAN_TAKE_COUNT;
    }
    return SCAN_TAKE_NEW;
}

void scan_reporter_finish(struct scan_reporter *r)
{
    free(r->stamp);
    free(r->first);
    free(r->single);
    r->stamp = NULL;
    r->first = NULL;
    r->single = NULL;
}

/* Keys of short lists kept on the stack (finalize_keys). */
#define KEYS_STACK 256u

/*
 * The packed-key path of scan_hits_finalize, with the same result: keys
 * (end, rule) in one sort (scan_sort_u64: insertion sort when short, radix
 * otherwise), duplicates adjacent, then the report modes. Mode `all` with
 * no single-match rule in the catalog reports every distinct (end, rule)
 * once, so the pass only drops repeats: no comparator calls and no rule
 * lookups, at any length (the GPU finish ran the sorting path once per
 * buffer, 250 ns a hit, most of a batch of flow writes' finish,
 * docs/PERFORMANCE.md "Session 32"). Other modes take a scan_reporter,
 * whose per-rule tables pay off from FINALIZE_RADIX_MIN hits. Returns
 * false when it does not apply (keys do not fit, no memory).
 */
static bool finalize_keys(struct scan_hits *h, const struct catalog *cat, enum scan_mode mode)
{
    size_t n = h->n;
    bool plain = mode == SCAN_ALL && (catalog_rule_flags_any(cat) & RULE_F_SINGLEMATCH) == 0;
    uint32_t n_rules = catalog_rule_count(cat);
    if ((!plain && n < FINALIZE_RADIX_MIN) || n >= UINT32_MAX ||
        n_rules >= ((uint32_t)1 << KEY_RULE_BITS))
        return false;
    for (size_t i = 0; i < n; i++)
        if (h->v[i].end >= KEY_END_LIMIT || h->v[i].rule >= n_rules)
            return false;
    uint64_t stack[2 * KEYS_STACK];
    uint64_t *key = n <= KEYS_STACK ? stack : malloc(2 * n * sizeof(*key));
    struct scan_reporter rep;
    if (key == NULL || (!plain && scan_reporter_init(&rep, cat) < 0)) {
        if (key != stack)
            free(key);
        return false;
    }
    if (!plain)
        scan_reporter_buffer(&rep);
    for (size_t i = 0; i < n; i++)
        key[i] = h->v[i].end << KEY_RULE_BITS | h->v[i].rule;
    scan_sort_u64(key, key + n, n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && key[i] == key[i - 1])
            continue; /* one report per (rule, end) */
        uint32_t rule = (uint32_t)(key[i] & ((1u << KEY_RULE_BITS) - 1));
        uint64_t first;
        switch (plain ? SCAN_TAKE_NEW : scan_reporter_take(&rep, mode, rule, k, &first)) {
        case SCAN_TAKE_NEW:
            /* k <= i: entries are written behind the keys being read */
            h->v[k++] = (struct scan_hit){.rule = rule, .count = 1, .end = key[i] >> KEY_RULE_BITS};
            break;
        case SCAN_TAKE_COUNT:
            h->v[first].count++;
            break;
        case SCAN_TAKE_DROP:
            break;
        }
    }
    h->n = k;
    if (key != stack)
        free(key);
    if (!plain)
        scan_reporter_finish(&rep);
    return true;
}

void scan_hits_finalize(struct scan_hits *h, const struct catalog *cat, enum scan_mode mode)
{
    if (h->n != 0 && !finalize_keys(h, cat, mode))
        scan_hits_finalize_sorting(h, cat, mode);
}

void scan_hits_finalize_sorting(struct scan_hits *h, const struct catalog *cat, enum scan_mode mode)
{
    if (h->n == 0)
        return;
    /* by rule, then end: each rule's matches are one run, first match first */
    qsort(h->v, h->n, sizeof(*h->v), cmp_rule_end);
    size_t k = 0;
    struct scan_hit prev = {.rule = UINT32_MAX};
    for (size_t i = 0; i < h->n; i++) {
        struct scan_hit *x = &h->v[i];
        bool same_rule = k > 0 && h->v[k - 1].rule == x->rule;
        /* one report per (rule, end); the kept entry may hold an earlier end
         * (count mode), so compare with the previous raw hit */
        bool dup = prev.rule == x->rule && prev.end == x->end;
        prev = *x;
        if (dup)
            continue;
        struct catalog_rule r;
        catalog_rule(cat, x->rule, &r);
        bool single = (r.flags & RULE_F_SINGLEMATCH) || mode == SCAN_FIRST;
        if (same_rule && single)
            continue;
        if (same_rule && mode == SCAN_COUNT) {
            h->v[k - 1].count++;
            continue;
        }
        h->v[k] = *x;
        h->v[k].count = 1;
        k++;
    }
    h->n = k;
    qsort(h->v, h->n, sizeof(*h->v), cmp_end_rule);
}

/* ---- gated bit-NFA groups ---- */

int refscan_gate_push(struct refscan_gate *g, uint32_t nfa, uint64_t end)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 64;
        struct refscan_cand *v = realloc(g->v, cap * sizeof(*v));
        if (v == NULL)
            return -ENOMEM;
        g->v = v;
        g->cap = cap;
    }
    g->v[g->n++] = (struct refscan_cand){.nfa = nfa, .end = end};
    return 0;
}

static int cmp_cand(const void *a, const void *b)
{
    const struct refscan_cand *x = a, *y = b;
    if (x->nfa != y->nfa)
        return x->nfa < y->nfa ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Sorts by (nfa, end) as packed keys (scan_sort_u64's radix passes over
 * the bits that differ) when both fit 64 bits together, which they do
 * for any buffer the daemon takes; qsort otherwise or without memory. The
 * comparator sort was 8% of an IDS-like set's CPU scan (wordy-2000: 1.9 M
 * factor ends and window candidates for 64 MiB). */
static bool gate_sort_packed(struct refscan_gate *g)
{
    uint64_t end_or = 0;
    uint32_t nfa_or = 0;
    for (size_t i = 0; i < g->n; i++)
        end_or |= g->v[i].end, nfa_or |= g->v[i].nfa;
    unsigned eb = end_or ? 64 - (unsigned)__builtin_clzll(end_or) : 0;
    unsigned nb = nfa_or ? 32 - (unsigned)__builtin_clz(nfa_or) : 0;
    if (eb + nb > 64 || eb == 64)
        return false;
    uint64_t *key = malloc(2 * g->n * sizeof(*key));
    if (key == NULL)
        return false;
    for (size_t i = 0; i < g->n; i++)
        key[i] = (uint64_t)g->v[i].nfa << eb | g->v[i].end;
    scan_sort_u64(key, key + g->n, g->n);
    uint64_t mask = ((uint64_t)1 << eb) - 1;
    for (size_t i = 0; i < g->n; i++)
        g->v[i] = (struct refscan_cand){.nfa = (uint32_t)(key[i] >> eb), .end = key[i] & mask};
    free(key);
    return true;
}

void refscan_gate_sort(struct refscan_gate *g)
{
    if (g->n > 1 && (g->n < SORT_SHORT || !gate_sort_packed(g)))
        qsort(g->v, g->n, sizeof(*g->v), cmp_cand);
    size_t k = 0;
    for (size_t i = 0; i < g->n; i++)
        if (k == 0 || cmp_cand(&g->v[k - 1], &g->v[i]) != 0)
            g->v[k++] = g->v[i];
    g->n = k;
}

/* Appends a candidate for every entry of factor-group state s at end i. */
static int factor_accepts(const struct catalog_group *g, uint32_t s, uint64_t i,
                          struct refscan_gate *out)
{
    const uint32_t *a = g->accepts + g->accept_index[s - g->first_accept];
    const uint32_t *end = g->accepts + g->accept_index[s - g->first_accept + 1];
    for (; a < end; a++)
        if (refscan_gate_push(out, CAT_ACCEPT_RULE(*a), i) != 0)
            return -ENOMEM;
    return 0;
}

/* The walk of refscan_group_range for a factor group, from state s at
 * `begin`: every entry counts, whatever its mask, and names a bit-NFA
 * group. */
static int factor_walk_from(const struct catalog_group *g, const uint8_t *buf, uint32_t s,
                            size_t begin, uint64_t lo, uint64_t hi, struct refscan_gate *out)
{
    for (size_t i = begin;; i++) {
        if (s >= g->first_accept && i > lo && factor_accepts(g, s, i, out) != 0)
            return -ENOMEM;
        if (i >= hi)
            return 0;
        s = g->trans[(size_t)s * g->n_classes + g->classmap[buf[i]]];
    }
}

/* Ranges shorter than this are walked in one piece. */
#define FACTOR_LANES_MIN 4096u

/* The table of a factor group, copied out of it so that the compiler
 * keeps it in registers across the candidate pushes (which may realloc). */
struct factor_tab {
    const uint32_t *trans, *cm;
    size_t nc;
    uint32_t first_accept;
};

/* One step of one lane: its candidates at end *i (when past lane_lo),
 * then byte buf[*i]. Returns 0 or -ENOMEM. */
static inline int factor_lane(const struct catalog_group *g, struct factor_tab t,
                              const uint8_t *buf, uint32_t *s, uint64_t *i, uint64_t lane_lo,
                              struct refscan_gate *out)
{
    int rc = 0;
    if (*s >= t.first_accept && *i > lane_lo)
        rc = factor_accepts(g, *s, *i, out);
    *s = t.trans[(size_t)*s * t.nc + t.cm[buf[*i]]];
    (*i)++;
    return rc;
}

/*
 * Factor ends in (lo, hi], walked from `begin` (lo + 1 - the longest
 * factor): as four walks of a quarter each, interleaved in one loop, so
 * that the chains of dependent table loads overlap (a DFA walk waits on
 * each load). Factors have no assertions: lane k > 0 starts from the start
 * state its longest factor before its quarter.
 */
static int factor_walk(const struct catalog_group *g, const uint8_t *buf, size_t begin, uint64_t lo,
                       uint64_t hi, struct refscan_gate *out)
{
    if (hi - begin < FACTOR_LANES_MIN)
        return factor_walk_from(g, buf, g->start[0], begin, lo, hi, out);
    uint64_t q = (hi - lo) / 4, llo[4], lhi[4], i[4];
    uint32_t st[4];
    for (int k = 0; k < 4; k++) {
        llo[k] = lo + k * q;
        lhi[k] = k == 3 ? hi : lo + (k + 1) * q;
        i[k] = k == 0 ? begin : llo[k] + 1 > g->maxlen ? llo[k] + 1 - g->maxlen : 0;
        st[k] = g->start[0];
    }
    uint64_t steps = UINT64_MAX;
    for (int k = 0; k < 4; k++)
        steps = lhi[k] - i[k] < steps ? lhi[k] - i[k] : steps;
    const struct factor_tab t = {g->trans, g->classmap, g->n_classes, g->first_accept};
    uint32_t s0 = st[0], s1 = st[1], s2 = st[2], s3 = st[3];
    uint64_t i0 = i[0], i1 = i[1], i2 = i[2], i3 = i[3];
    const uint64_t l0 = llo[0], l1 = llo[1], l2 = llo[2], l3 = llo[3];
    for (uint64_t n = 0; n < steps; n++) {
        if (factor_lane(g, t, buf, &s0, &i0, l0, out) != 0 ||
            factor_lane(g, t, buf, &s1, &i1, l1, out) != 0 ||
            factor_lane(g, t, buf, &s2, &i2, l2, out) != 0 ||
            factor_lane(g, t, buf, &s3, &i3, l3, out) != 0)
            return -ENOMEM;
    }
    st[0] = s0, st[1] = s1, st[2] = s2, st[3] = s3;
    i[0] = i0, i[1] = i1, i[2] = i2, i[3] = i3;
    for (int k = 0; k < 4; k++)
        if (factor_walk_from(g, buf, st[k], i[k], llo[k], lhi[k], out) != 0)
            return -ENOMEM;
    return 0;
}

static int factor_scan(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                       uint64_t hi, const uint8_t *walk, struct refscan_gate *out);

int refscan_factor_ends(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                        uint64_t hi, struct refscan_gate *out)
{
    return refscan_factor_ends_of(cat, buf, len, lo, hi, NULL, out);
}

uint64_t refscan_gated_lookback(const struct catalog *cat)
{
    uint64_t lb = 0; /* CATALOG_UNBOUNDED for confirmed groups: every end up to hi */
    for (uint32_t j = 0; j < catalog_nfa_count(cat); j++) {
        struct catalog_nfa n;
        catalog_nfa(cat, j, &n);
        if ((n.flags & CAT_GF_GATED) && n.maxlen > lb)
            lb = n.maxlen;
    }
    return lb;
}

int refscan_factor_ends_of(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                           uint64_t hi, const uint8_t *walk, struct refscan_gate *out)
{
    return refscan_factor_ends_lb(cat, buf, len, lo, hi, walk, refscan_gated_lookback(cat), out);
}

int refscan_factor_ends_lb(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                           uint64_t hi, const uint8_t *walk, uint64_t lb, struct refscan_gate *out)
{
    if (hi > len)
        hi = len;
    uint64_t flo = lo > lb && lb != CATALOG_UNBOUNDED ? lo - lb : 0;
    int rc = factor_scan(cat, buf, len, flo, hi, walk, out);
    if (rc == 0)
        refscan_gate_sort(out);
    return rc;
}

int refscan_factor_scan(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                        uint64_t hi, struct refscan_gate *out)
{
    return factor_scan(cat, buf, len, lo, hi, NULL, out);
}

static int factor_scan(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                       uint64_t hi, const uint8_t *walk, struct refscan_gate *out)
{
    if (hi > len)
        hi = len;
    for (uint32_t k = 0; k < catalog_group_count(cat) && lo < hi; k++) {
        struct catalog_group g;
        catalog_group(cat, k, &g);
        if (!(g.flags & CAT_GF_FACTOR) || (walk != NULL && !walk[k]))
            continue;
        /* factors have no assertions: any start state is the same one */
        size_t begin = lo + 1 > g.maxlen ? (size_t)(lo + 1 - g.maxlen) : 0;
        if (factor_walk(&g, buf, begin, lo, hi, out) != 0)
            return -ENOMEM;
    }
    return 0;
}

int refscan_gate_windows(uint32_t maxlen, const uint64_t *ends, size_t n, size_t stride, size_t len,
                         uint64_t lo, uint64_t hi, refscan_window_fn fn, void *ctx)
{
    uint64_t cur_lo = 0, cur_hi = 0;
    bool have = false;
    if (hi > len)
        hi = len;
    for (size_t i = 0; i < n; i++) {
        uint64_t e = ends[i * stride];
        /* a match containing a factor that ends at e ends in [e, e + maxlen] */
        uint64_t wlo = e > 0 ? e - 1 : 0, whi = e + (uint64_t)maxlen;
        wlo = wlo > lo ? wlo : lo;
        whi = whi < hi ? whi : hi;
        if (whi <= wlo)
            continue;
        if (have && wlo <= cur_hi) {
            cur_hi = whi > cur_hi ? whi : cur_hi;
            continue;
        }
        if (have) {
            int rc = fn(ctx, cur_lo, cur_hi);
            if (rc != 0)
                return rc;
        }
        cur_lo = wlo;
        cur_hi = whi;
        have = true;
    }
    return have ? fn(ctx, cur_lo, cur_hi) : 0;
}

struct gated_walk {
    const struct catalog *cat;
    uint32_t nfa, maxlen;
    const uint8_t *buf;
    size_t len;
    refscan_fn fn;
    void *ctx;
};

static int gated_window(void *ctx, uint64_t lo, uint64_t hi)
{
    const struct gated_walk *w = ctx;
    size_t begin = lo + 1 > w->maxlen ? (size_t)(lo + 1 - w->maxlen) : 0;
    return refscan_nfa_range(w->cat, w->nfa, w->buf, w->len, begin, lo, hi, w->fn, w->ctx);
}

int refscan_gated_range(const struct catalog *cat, uint32_t nfa, const uint8_t *buf, size_t len,
                        uint64_t lo, uint64_t hi, const struct refscan_gate *cands, refscan_fn fn,
                        void *ctx)
{
    struct catalog_nfa n;
    catalog_nfa(cat, nfa, &n);
    size_t a = 0, b = cands->n;
    while (a < b) { /* the first candidate of this group */
        size_t m = a + (b - a) / 2;
        if (cands->v[m].nfa < nfa)
            a = m + 1;
        else
            b = m;
    }
    size_t z = a;
    while (z < cands->n && cands->v[z].nfa == nfa)
        z++;
    if (z == a)
        return 0;
    /* forward confirmation: unbounded groups, and bounded ones that know
     * their lead (compiler version 7): starts only in [e - lead, e) */
    if ((n.flags & CAT_GF_CONFIRM) || n.lookback != 0) {
        struct start_ivs q = {.v = &cands->v[a].end,
                              .n = z - a,
                              .stride = sizeof(struct refscan_cand) / sizeof(uint64_t)};
        return nfa_range(cat, nfa, buf, len, 0, lo, hi, &q, fn, ctx);
    }
    struct gated_walk w = {cat, nfa, n.maxlen, buf, len, fn, ctx};
    return refscan_gate_windows(n.maxlen, &cands->v[a].end, z - a,
                                sizeof(struct refscan_cand) / sizeof(uint64_t), len, lo, hi,
                                gated_window, &w);
}

int refscan_confirm_starts(const struct refscan_starts *st, const uint64_t *ends, size_t n,
                           size_t stride, refscan_window_fn fn, void *ctx)
{
    struct refscan_starts run = *st;
    run.checked = run.rs = 0;
    uint64_t a = 0, b = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t e = ends[i * stride], from;
        if (st->runs != NULL) {
            uint64_t floor = st->floor < e ? st->floor : e;
            from = st->runs[i] > floor ? st->runs[i] : floor;
        } else {
            from = refscan_start_from(&run, e);
        }
        if (i > 0 && from <= b) {
            b = e > b ? e : b;
            continue;
        }
        int rc = i > 0 && b > a ? fn(ctx, a, b) : 0;
        if (rc != 0)
            return rc;
        a = from;
        b = e;
    }
    return n > 0 && b > a ? fn(ctx, a, b) : 0;
}

/* Merges start intervals closer than `gap` and cuts them into pieces of at
 * most `piece` starts; with `fn` NULL it only counts the pieces. */
struct confirm_cut {
    uint64_t gap, piece, a, b;
    size_t count;
    bool open;
    refscan_window_fn fn;
    void *ctx;
};

static int confirm_cut_flush(struct confirm_cut *c)
{
    if (!c->open)
        return 0;
    c->open = false;
    if (c->fn == NULL) {
        c->count += (size_t)((c->b - c->a + c->piece - 1) / c->piece);
        return 0;
    }
    for (uint64_t x = c->a; x < c->b; x += c->piece) {
        int rc = c->fn(c->ctx, x, x + c->piece < c->b ? x + c->piece : c->b);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int confirm_cut_add(void *ctx, uint64_t a, uint64_t b)
{
    struct confirm_cut *c = ctx;
    if (c->open && a <= c->b + c->gap) {
        c->b = b;
        return 0;
    }
    int rc = confirm_cut_flush(c);
    c->a = a;
    c->b = b;
    c->open = true;
    return rc;
}

/* The merged start intervals, kept: the cut may run more than once, and
 * each start's span test walks the buffer's bytes, so the starts are
 * found once. */
struct start_list {
    uint64_t *v; /* pairs [a, b) */
    size_t n, cap;
};

static int start_list_add(void *ctx, uint64_t a, uint64_t b)
{
    struct start_list *l = ctx;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        uint64_t *v = realloc(l->v, cap * 2 * sizeof(*v));
        if (v == NULL)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[2 * l->n] = a;
    l->v[2 * l->n + 1] = b;
    l->n++;
    return 0;
}

static int confirm_cut_run(struct confirm_cut *c, const struct start_list *l)
{
    c->count = 0;
    c->open = false;
    for (size_t i = 0; i < l->n; i++) {
        int rc = confirm_cut_add(c, l->v[2 * i], l->v[2 * i + 1]);
        if (rc != 0)
            return rc;
    }
    return confirm_cut_flush(c);
}

int refscan_confirm_items(const struct refscan_starts *st, const uint64_t *ends, size_t n,
                          size_t stride, uint64_t gap, uint64_t piece, size_t max_items,
                          refscan_window_fn fn, void *ctx)
{
    struct start_list l = {NULL, 0, 0};
    int rc = refscan_confirm_starts(st, ends, n, stride, start_list_add, &l);
    if (rc != 0) {
        free(l.v);
        return rc;
    }
    struct confirm_cut c = {.gap = gap, .piece = piece > 0 ? piece : 1};
    max_items = max_items > 0 ? max_items : 1;
    for (;;) { /* each round doubles both: at most ~64 rounds, ends are u64 */
        confirm_cut_run(&c, &l);
        if (c.count <= max_items)
            break;
        c.gap = c.gap * 2 + 1;
        c.piece = c.piece * 2;
    }
    c.fn = fn;
    c.ctx = ctx;
    rc = confirm_cut_run(&c, &l);
    free(l.v);
    return rc;
}

void refscan_gate_finish(struct refscan_gate *g)
{
    if (g == NULL)
        return;
    free(g->v);
    memset(g, 0, sizeof(*g));
}

static int push_lit(void *ctx, uint32_t id, uint64_t end)
{
    if (id & CPUPLAN_FACTOR)
        return 0; /* a window group's factor: that group is walked */
    return push_cb(ctx, id, end);
}

/* The strings of literal groups (CAT_GF_LITERAL: no automaton) by the CPU
 * engine's literal matcher, which the plan always builds for them: every
 * (report index, end) of their rules. Strings of other groups it may hold
 * are walked too; their hits come twice, once after finalizing. */
static int literal_groups(const struct catalog *cat, const uint8_t *buf, size_t len,
                          struct scan_hits *raw)
{
    bool any = false;
    for (uint32_t g = 0; g < catalog_group_count(cat) && !any; g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        any = (cg.flags & CAT_GF_LITERAL) != 0;
    }
    if (!any || len == 0)
        return 0;
    struct cpuplan *plan = NULL;
    int rc = cpuplan_get(cat, &plan);
    if (rc == 0 && plan->lit != NULL)
        rc = cpulit_scan(plan->lit, buf, len, 0, 0, len, push_lit, raw);
    cpuplan_put(plan);
    return rc;
}

static int buffer_walk(const struct catalog *cat, const uint8_t *buf, size_t len,
                       enum scan_mode mode, size_t max, struct scan_hits *out)
{
    struct scan_hits raw = {.max = max};
    struct refscan_gate gate = {0};
    int rc = refscan_factor_ends(cat, buf, len, 0, len, &gate);
    if (rc == 0)
        rc = literal_groups(cat, buf, len, &raw);
    for (uint32_t g = 0; g < catalog_group_count(cat) && rc == 0; g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        if (!(cg.flags & (CAT_GF_FACTOR | CAT_GF_LITERAL))) /* these never report */
            rc = refscan_group_range(cat, g, buf, len, 0, 0, len, push_cb, &raw);
    }
    for (uint32_t g = 0; g < catalog_nfa_count(cat) && rc == 0; g++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, g, &cn);
        if (cn.flags & CAT_GF_GATED)
            rc = refscan_gated_range(cat, g, buf, len, 0, len, &gate, push_cb, &raw);
        else
            rc = refscan_nfa_range(cat, g, buf, len, 0, 0, len, push_cb, &raw);
    }
    refscan_gate_finish(&gate);
    if (rc == 0)
        scan_hits_finalize(&raw, cat, mode);
    for (size_t i = 0; i < raw.n && rc == 0; i++)
        rc = scan_hits_push(out, raw.v[i].rule, raw.v[i].end, raw.v[i].count);
    scan_hits_finish(&raw);
    return rc;
}

int refscan_buffer(const struct catalog *cat, const uint8_t *buf, size_t len, enum scan_mode mode,
                   struct scan_hits *out)
{
    return buffer_walk(cat, buf, len, mode, 0, out);
}

int refscan_buffer_bounded(const struct catalog *cat, const uint8_t *buf, size_t len,
                           enum scan_mode mode, struct scan_hits *out)
{
    return buffer_walk(cat, buf, len, mode, refscan_raw_max(), out);
}

void scan_hits_finish(struct scan_hits *h)
{
    if (h == NULL)
        return;
    free(h->v);
    memset(h, 0, sizeof(*h));
}
