/*
 * Stream scanning over a packed catalog: refscan's walks with the automaton
 * state carried from one write to the next (streamscan.h).
 *
 * Positions. The walk at position i first checks the accepts of the state
 * (lookahead: the kind of byte i, or end of data) and then consumes byte i.
 * A write can finish every position whose lookahead it knows. The stream
 * keeps `pos`, the first position not consumed: the end of the data, or the
 * position of a final '\n' (whether that '\n' is the last byte of the data
 * changes `$` and the bit-NFA's step over it, so it waits for the next byte).
 *
 * The accept check at `pos` is done twice. The write that ends there reports
 * the rules whose condition holds for every lookahead still possible
 * (`told`: the set of kinds it assumed); the write or close that brings the
 * next byte reports the rules whose condition holds for the real one and
 * that the first check did not report. Knowledge only grows, so this is
 * exact and reports each (rule, end) once.
 *
 * The bit-NFA step is nfastep.h's, the one refscan.c walks.
 *
 * A large write into a catalog of bounded groups takes the fast path
 * (below, and docs/engine.md "Streams"): its middle is the CPU engine's
 * block scan (cpuscan_segment) in pieces on a thread pool, and only its
 * head and tail touch the carried state. The groups that must see a whole
 * write (a catalog's unbounded ones, or all on the slow path) walk a long
 * one in pieces on the same pool ("long walks in pieces", below).
 */
#include "streamscan.h"
#include "cpuplan.h"
#include "cpuscan.h"
#include "nfastep.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KIND_ALL                                                                       \
    ((1u << CAT_K_WORD) | (1u << CAT_K_NL) | (1u << CAT_K_OTHER) | (1u << CAT_K_EOD) | \
     (1u << CAT_K_NL_LAST))
#define KIND_NL_ANY ((1u << CAT_K_NL) | (1u << CAT_K_NL_LAST))

/* The stream: this header, then the DFA states (`width` bytes each: the
 * narrowest that holds every group's state ids), the bit-NFA state vectors
 * of the groups not kept by history (u32 words, group after group) and the
 * history, in one allocation. The single-match bits are allocated at the
 * first single-match hit. */
struct streamscan {
    const struct catalog *cat;
    uint64_t total;       /* bytes written */
    uint8_t *done;        /* n_rules bits: the single-match rule was reported; NULL: none yet */
    struct cpuplan *plan; /* the CPU engine's plan, taken at the first write; NULL: none */
    uint8_t prev;         /* kind of the byte before pos: P_BOS 0, P_WORD 1, P_NL 2, P_OTHER 3 */
    uint8_t told;         /* lookahead kinds the check at pos assumed; 0: not checked yet */
    uint8_t held;         /* the byte at pos is a '\n', the last byte written */
    uint8_t closed;       /* streamscan_close ran */
    uint8_t width;        /* bytes per DFA state: 1, 2 or 4 */
    uint8_t planned;      /* the plan was asked for */
    uint16_t hist_len;    /* bytes in the history: min(pos, hist + 1) */
};

/* pos, the first position not consumed: total, or total - 1 when held */
static uint64_t pos_of(const struct streamscan *s)
{
    return s->total - s->held;
}

/* History instead of a state vector: a bounded bit-NFA group whose longest
 * match is shorter than its vector (in bytes) keeps no vector. The stream
 * keeps the last `hist` + 1 bytes consumed instead, `hist` being the
 * longest match of those groups, and a write rebuilds such a group's state
 * by walking them (nfa_rebuild). */
#define HIST_MAX 4096u

/* DFA groups whose rules are all plain strings (the CPU engine's plan,
 * CPUPLAN_LIT) are matched by its literal matcher over the history and the
 * write, not walked, when their longest string is at most this long: the
 * history covers every bounded DFA group up to it. */
#define LIT_HIST 64u

struct layout {
    size_t nfa, hist_at, total;
    uint32_t hist; /* 0: no group keeps history */
    uint8_t width;
};

static bool by_hist(const struct catalog_nfa *g, uint32_t hist)
{
    return hist != 0 && g->maxlen <= hist; /* CATALOG_UNBOUNDED is over any hist */
}

static size_t align4(size_t n)
{
    return (n + 3) & ~(size_t)3;
}

/* Whether some rule reports once per stream (flag H); O(1): streams open
 * and write far more often than catalogs load. */
static bool any_single(const struct catalog *cat)
{
    return (catalog_rule_flags_any(cat) & RULE_F_SINGLEMATCH) != 0;
}

static struct layout layout_of(const struct catalog *cat)
{
    struct layout l = {.width = 1};
    uint32_t words = 0, n_groups = catalog_group_count(cat);
    for (uint32_t i = 0; i < n_groups; i++) {
        struct catalog_group g;
        catalog_group(cat, i, &g);
        if ((g.maxlen <= LIT_HIST || (g.flags & CAT_GF_LITERAL)) && g.maxlen > l.hist)
            l.hist = g.maxlen; /* a literal group may be matched from history;
                                * CAT_GF_LITERAL ones (<= 1024 bytes) must be */
        if (g.n_states > 65536)
            l.width = 4;
        else if (g.n_states > 256 && l.width < 2)
            l.width = 2;
    }
    uint32_t n_nfas = catalog_nfa_count(cat);
    for (uint32_t j = 0; j < n_nfas; j++) {
        struct catalog_nfa g;
        catalog_nfa(cat, j, &g);
        /* a gated group kept by history is walked only around its factors
         * (gated_walk), so it keeps history however small its vector */
        bool gated = (g.flags & CAT_GF_GATED) && !(g.flags & CAT_GF_CONFIRM);
        if (g.maxlen < HIST_MAX && (gated || g.maxlen + 1 < (uint64_t)g.n_words * 4) &&
            g.maxlen > l.hist)
            l.hist = g.maxlen;
        /* a forward-confirmed group walks again from a factor's allowed
         * starts, up to `lookback` bytes before the write (confirm_walk) */
        if ((g.flags & CAT_GF_CONFIRM) && g.lookback < HIST_MAX && g.lookback > l.hist)
            l.hist = g.lookback;
    }
    for (uint32_t j = 0; j < n_nfas; j++) {
        struct catalog_nfa g;
        catalog_nfa(cat, j, &g);
        words += by_hist(&g, l.hist) ? 0 : g.n_words;
    }
    l.nfa = align4(sizeof(struct streamscan) + (size_t)n_groups * l.width);
    l.hist_at = l.nfa + (size_t)words * 4;
    l.total = l.hist_at + (l.hist ? l.hist + 1 : 0);
    return l;
}

size_t streamscan_size(const struct catalog *cat)
{
    size_t bits = any_single(cat) ? (catalog_rule_count(cat) + 7) / 8 : 0;
    return layout_of(cat).total + bits;
}

static uint8_t *dfa_states(struct streamscan *s)
{
    return (uint8_t *)(s + 1);
}

static uint32_t dfa_get(struct streamscan *s, uint32_t gi)
{
    const uint8_t *p = dfa_states(s) + (size_t)gi * s->width;
    if (s->width == 1)
        return p[0];
    if (s->width == 2)
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void dfa_set(struct streamscan *s, uint32_t gi, uint32_t st)
{
    uint8_t *p = dfa_states(s) + (size_t)gi * s->width;
    if (s->width == 1) {
        p[0] = (uint8_t)st;
    } else if (s->width == 2) {
        p[0] = (uint8_t)st;
        p[1] = (uint8_t)(st >> 8);
    } else {
        memcpy(p, &st, 4);
    }
}

static uint32_t *nfa_words(struct streamscan *s)
{
    size_t at = align4(sizeof(*s) + (size_t)catalog_group_count(s->cat) * s->width);
    return (uint32_t *)((uint8_t *)s + at);
}

int streamscan_create(const struct catalog *cat, struct streamscan **out)
{
    struct layout l = layout_of(cat);
    struct streamscan *s = calloc(1, l.total);
    if (s == NULL)
        return -ENOMEM;
    s->cat = cat;
    s->width = l.width;
    for (uint32_t i = 0; i < catalog_group_count(cat); i++) {
        struct catalog_group g;
        catalog_group(cat, i, &g);
        dfa_set(s, i, g.start[0]);
    }
    *out = s;
    return 0;
}

void streamscan_destroy(struct streamscan *s)
{
    if (s != NULL) {
        free(s->done);
        cpuplan_put(s->plan);
    }
    free(s);
}

const struct catalog *streamscan_catalog(const struct streamscan *s)
{
    return s->cat;
}

uint64_t streamscan_offset(const struct streamscan *s)
{
    return s->total;
}

/* The bytes a write walks: the held '\n' (if any), then the new bytes. */
struct vbuf {
    const uint8_t *w;
    size_t n;
    bool held;
};

static inline uint8_t vbyte(const struct vbuf *v, size_t j)
{
    if (v->held)
        return j == 0 ? '\n' : v->w[j - 1];
    return v->w[j];
}

/* ---- DFA groups ---------------------------------------------------------- */

/* Was `rule` reported by the earlier check at this position, which assumed
 * the lookahead kinds `told`? Entries [a, end) are the state's. */
static bool dfa_told(const uint32_t *a, const uint32_t *end, uint32_t rule, uint32_t told)
{
    for (; a < end; a++)
        if (CAT_ACCEPT_RULE(*a) == rule && (CAT_ACCEPT_MASK(*a) & told) == told)
            return true;
    return false;
}

/* Reports the accepts of state `st` at `end` whose condition holds for every
 * kind in `now`, except those an earlier check (`told`, 0: none) reported. */
static int dfa_check(const struct catalog_group *g, uint32_t st, uint32_t now, uint32_t told,
                     uint64_t end, struct scan_hits *raw)
{
    if (st < g->first_accept)
        return 0;
    const uint32_t *a = g->accepts + g->accept_index[st - g->first_accept];
    const uint32_t *e = g->accepts + g->accept_index[st - g->first_accept + 1];
    for (const uint32_t *x = a; x < e; x++) {
        uint32_t rule = CAT_ACCEPT_RULE(*x);
        if ((CAT_ACCEPT_MASK(*x) & now) != now || (told && dfa_told(a, e, rule, told)))
            continue;
        int rc = scan_hits_push(raw, rule, end, 1);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Walks DFA group `g` from state *st over v[a..b), checking positions
 * a .. b - 1 (position j at stream offset pos + j; position 0 with what
 * the last write told), and leaves the state at b in *st. */
static int dfa_span(const struct catalog_group *g, uint32_t *st, const struct vbuf *v, size_t a,
                    size_t b, uint64_t pos, uint32_t told, struct scan_hits *raw)
{
    uint32_t q = *st;
    int rc = 0;
    size_t j = a;
    if (j < b && j < (size_t)v->held) { /* the held '\n' */
        if (q >= g->first_accept)
            rc = dfa_check(g, q, 1u << CAT_K_NL, told, pos, raw);
        q = g->trans[(size_t)q * g->n_classes + g->classmap['\n']];
        j++;
    }
    /* the walk with the table in locals: a check's pushes may alias g */
    const uint32_t *trans = g->trans;
    const uint32_t *classmap = g->classmap;
    const uint8_t *w = j < b ? v->w + (j - v->held) : v->w; /* j >= held when j < b */
    size_t nc = g->n_classes;
    uint32_t first = g->first_accept;
    for (; j < b && rc == 0; j++) {
        uint8_t c = *w++;
        if (q >= first)
            rc = dfa_check(g, q, 1u << catalog_byte_kind(c), j ? 0 : told, pos + j, raw);
        q = trans[(size_t)q * nc + classmap[c]];
    }
    *st = q;
    return rc;
}

/* Position e of a DFA group's write, checked from its state there with
 * `told_end` (0: left to the caller, the fast path's tail); the state is
 * carried on. */
static int dfa_end(struct streamscan *s, uint32_t gi, const struct catalog_group *g, uint32_t st,
                   size_t e, uint32_t told_end, struct scan_hits *raw)
{
    int rc = 0;
    if (told_end != 0)
        rc = dfa_check(g, st, told_end, e ? 0 : s->told, pos_of(s) + e, raw);
    dfa_set(s, gi, st);
    return rc;
}

/* Walks DFA group `gi` over v[0..e) and checks position e with `told_end`. */
static int dfa_write(struct streamscan *s, uint32_t gi, const struct vbuf *v, size_t e,
                     uint32_t told_end, struct scan_hits *raw)
{
    struct catalog_group g;
    catalog_group(s->cat, gi, &g);
    uint32_t st = dfa_get(s, gi);
    int rc = dfa_span(&g, &st, v, 0, e, pos_of(s), s->told, raw);
    return rc ? rc : dfa_end(s, gi, &g, st, e, told_end, raw);
}

static int dfa_close(struct streamscan *s, uint32_t gi, struct scan_hits *raw)
{
    struct catalog_group g;
    catalog_group(s->cat, gi, &g);
    uint32_t st = dfa_get(s, gi);
    uint64_t pos = pos_of(s);
    if (!s->held)
        return dfa_check(&g, st, 1u << CAT_K_EOD, s->told, pos, raw);
    int rc = dfa_check(&g, st, 1u << CAT_K_NL_LAST, s->told, pos, raw);
    st = g.trans[(size_t)st * g.n_classes + g.classmap['\n']];
    return rc ? rc : dfa_check(&g, st, 1u << CAT_K_EOD, 0, pos + 1, raw);
}

/* ---- bit-NFA groups (the step is nfastep.h's, as refscan.c's) -------------- */

static bool in_state(const struct nvec *s, const uint32_t *rg, uint32_t n)
{
    return span_meets(s, rg, n) && any_in(s->v, rg, n);
}

/* The lookahead kinds accept entry `e` allows after previous kind `p`. */
static uint32_t acc_kinds(const uint32_t *e, uint32_t p)
{
    return (e[CAT_A_COND] >> (p * 5u)) & 31u;
}

static bool nfa_told(const struct catalog_nfa *g, const struct nvec *s, uint32_t p, uint32_t rule,
                     uint32_t told)
{
    for (uint32_t k = 0; k < g->n_acc; k++) {
        const uint32_t *e = g->acc + (size_t)k * CAT_X_WORDS;
        if (e[CAT_A_RULE] == rule && (acc_kinds(e, p) & told) == told &&
            in_state(s, g->ranges + 2 * (size_t)e[CAT_A_FIRST], e[CAT_A_NSRC]))
            return true;
    }
    return false;
}

/* dfa_check for a bit-NFA state `s` after previous kind `p`. */
static int nfa_check(const struct catalog_nfa *g, const struct nvec *s, uint32_t p, uint32_t now,
                     uint32_t told, uint64_t end, struct scan_hits *raw)
{
    uint32_t last = UINT32_MAX;
    for (uint32_t k = 0; s->lo <= s->hi && k < g->n_acc; k++) {
        const uint32_t *e = g->acc + (size_t)k * CAT_X_WORDS;
        uint32_t rule = e[CAT_A_RULE];
        if (rule == last || (acc_kinds(e, p) & now) != now ||
            !in_state(s, g->ranges + 2 * (size_t)e[CAT_A_FIRST], e[CAT_A_NSRC]))
            continue;
        last = rule;
        if (told && nfa_told(g, s, p, rule, told))
            continue;
        int rc = scan_hits_push(raw, rule, end, 1);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Loads a bit-NFA group's carried state `home` into `a` (span computed)
 * and an empty `b` over the scratch vector `tmp`. */
static void nfa_load(const struct catalog_nfa *g, uint32_t *home, uint32_t *tmp, struct nvec *a,
                     struct nvec *b)
{
    *a = (struct nvec){home, 1, 0};
    for (uint32_t w = 0; w < g->n_words; w++) {
        if (a->v[w] == 0)
            continue;
        if (a->lo > a->hi)
            a->lo = w;
        a->hi = w;
    }
    memset(tmp, 0, (size_t)g->n_words * sizeof(uint32_t));
    *b = (struct nvec){tmp, 1, 0};
}

/* The bit-NFA group being walked: its view, its carried state vector and
 * the scratch vector the step writes to. */
struct nfa_at {
    struct catalog_nfa g;
    uint32_t *home, *tmp;
};

/* A walk of at least this many bytes skips, while its state is empty, the
 * bytes that fire no start edge (start_bytes). */
#define SKIP_MIN   4096u
#define SKIP_WORDS 64u

/* Which bytes fire a start edge of group g from the empty state after some
 * previous kind: starts[c] = 1. False when g is wider than SKIP_WORDS. */
static bool start_bytes(const struct catalog_nfa *g, uint8_t starts[256])
{
    uint32_t a[SKIP_WORDS], b[SKIP_WORDS];
    if (g->n_words > SKIP_WORDS)
        return false;
    for (uint32_t c = 0; c < 256; c++) {
        uint32_t k = catalog_byte_kind((uint8_t)c);
        starts[c] = 0;
        for (uint32_t p = 0; p <= 3 && !starts[c]; p++) { /* P_BOS, P_WORD, P_NL, P_OTHER */
            memset(a, 0, (size_t)g->n_words * sizeof(uint32_t));
            memset(b, 0, (size_t)g->n_words * sizeof(uint32_t));
            struct nvec sa = {a, 1, 0}, sb = {b, 1, 0};
            nfa_step(g, &sa, &sb, CAT_PK(p, k), (uint8_t)c);
            starts[c] = sb.lo <= sb.hi;
        }
    }
    return true;
}

static int nfa_write(struct streamscan *s, struct nfa_at *n, const struct vbuf *v, size_t e,
                     uint32_t told_end, struct scan_hits *raw)
{
    const struct catalog_nfa *g = &n->g;
    struct nvec a, b, *cur = &a, *nxt = &b;
    nfa_load(g, n->home, n->tmp, &a, &b);
    uint32_t p = s->prev;
    uint64_t pos = pos_of(s);
    uint8_t starts[256];
    bool skip = e >= SKIP_MIN && start_bytes(g, starts);
    /* every position an accept names: a state with none of them reports
     * nothing, so the check is skipped */
    uint32_t acc[SKIP_WORDS];
    if (skip) {
        memset(acc, 0, (size_t)g->n_words * sizeof(uint32_t));
        for (uint32_t k = 0; k < g->n_acc; k++) {
            const uint32_t *x = g->acc + (size_t)k * CAT_X_WORDS;
            set_in(acc, g->ranges + 2 * (size_t)x[CAT_A_FIRST], x[CAT_A_NSRC]);
        }
    }
    int rc = 0;
    for (size_t i = 0; i < e && rc == 0; i++) {
        if (skip && i > 0 && cur->lo > cur->hi && !starts[vbyte(v, i)]) {
            /* nothing is live and this byte starts nothing: no match ends
             * before the next byte that does (the check at i reports
             * from an empty state) */
            size_t j = i + 1;
            while (j < e && !starts[vbyte(v, j)])
                j++;
            p = catalog_byte_kind(vbyte(v, j - 1)) + 1;
            i = j;
            if (i == e)
                break;
        }
        uint8_t c = vbyte(v, i);
        uint32_t k = catalog_byte_kind(c);
        bool may = !skip || i == 0;
        for (uint32_t w = cur->lo; !may && w <= cur->hi; w++)
            may = (cur->v[w] & acc[w]) != 0;
        if (may)
            rc = nfa_check(g, cur, p, 1u << k, i ? 0 : s->told, pos + i, raw);
        nfa_step(g, cur, nxt, CAT_PK(p, k), c);
        struct nvec *x = cur;
        cur = nxt;
        nxt = x;
        p = k + 1; /* CAT_K_WORD, NL, OTHER -> P_WORD, P_NL, P_OTHER */
    }
    if (rc == 0 && told_end != 0)
        rc = nfa_check(g, cur, p, told_end, e ? 0 : s->told, pos + e, raw);
    if (cur->v != n->home)
        memcpy(n->home, cur->v, (size_t)g->n_words * sizeof(uint32_t));
    return rc;
}

static int nfa_close(struct streamscan *s, struct nfa_at *n, struct scan_hits *raw)
{
    const struct catalog_nfa *g = &n->g;
    struct nvec a, b;
    nfa_load(g, n->home, n->tmp, &a, &b);
    uint64_t pos = pos_of(s);
    if (!s->held)
        return nfa_check(g, &a, s->prev, 1u << CAT_K_EOD, s->told, pos, raw);
    int rc = nfa_check(g, &a, s->prev, 1u << CAT_K_NL_LAST, s->told, pos, raw);
    nfa_step(g, &a, &b, CAT_PK(s->prev, CAT_K_NL_LAST), '\n');
    return rc ? rc : nfa_check(g, &b, 2 /* P_NL */, 1u << CAT_K_EOD, 0, pos + 1, raw);
}

/* Rebuilds the state of a group kept by history into `rb` (`tmp` is
 * scratch): the walk of the history's last maxlen bytes from an empty
 * state, start edges firing as they did. A match is at most maxlen bytes
 * long, so every position the real walk holds at pos was entered from a
 * start edge within them, and the step is a union over positions: the
 * result is the real state exactly (cpuscan's segments rely on the same). */
static void nfa_rebuild(const struct catalog_nfa *g, const uint8_t *h, uint32_t hl, uint32_t hist,
                        uint32_t *rb, uint32_t *tmp)
{
    memset(rb, 0, (size_t)g->n_words * sizeof(uint32_t));
    memset(tmp, 0, (size_t)g->n_words * sizeof(uint32_t));
    struct nvec a = {rb, 1, 0}, b = {tmp, 1, 0}, *cur = &a, *nxt = &b;
    /* hl <= hist: the history is the whole stream so far, from its start */
    uint32_t i = hl > g->maxlen ? hl - g->maxlen : (hl > hist ? 1 : 0);
    uint32_t p = i ? catalog_byte_kind(h[i - 1]) + 1 : 0 /* P_BOS */;
    for (; i < hl; i++) {
        uint32_t k = catalog_byte_kind(h[i]);
        nfa_step(g, cur, nxt, CAT_PK(p, k), h[i]);
        struct nvec *x = cur;
        cur = nxt;
        nxt = x;
        p = k + 1;
    }
    if (cur->v != rb)
        memcpy(rb, cur->v, (size_t)g->n_words * sizeof(uint32_t));
}

/* Walks every bit-NFA group: a write over v[0..e) (v != NULL) or the
 * close. The scratch vectors (and the rebuilt state of groups kept by
 * history) are on the stack for groups up to STACK_WORDS words, else on
 * the heap for the call: the stream does not carry them. */
#define STACK_WORDS 512u

/* A gated bounded bit-NFA group kept by history: the fast path's head and
 * tail walk it only around its factors (gated_walk, tail). */
static bool gated_hist(const struct catalog_nfa *g, uint32_t hist)
{
    return (g->flags & CAT_GF_GATED) && !(g->flags & CAT_GF_CONFIRM) && by_hist(g, hist);
}

/* A forward-confirmed (unbounded) group whose starts the history covers,
 * or whose lookback has no bound but whose matches start in a run of its
 * span bytes (catalog_nfa.span): a write from the carried state walks it
 * only from its factors' allowed starts and while its state lives
 * (confirm_walk); it keeps its vector. */
static bool confirm_hist(const struct catalog_nfa *g, uint32_t hist)
{
    bool starts = g->lookback <= hist || (g->lookback == CATALOG_UNBOUNDED && g->span != NULL);
    return (g->flags & CAT_GF_CONFIRM) && starts && g->n_words <= STACK_WORDS;
}

/* Walked apart from the byte-by-byte walk (gated_walk). */
static bool walked_apart(const struct catalog_nfa *g, uint32_t hist)
{
    return gated_hist(g, hist) || confirm_hist(g, hist);
}

/* Whether a group of longest match `maxlen` is among the groups `part`
 * names: all, the bounded ones or the unbounded ones (a catalog with an
 * unbounded group takes the fast path for its bounded groups alone). */
static bool in_part(uint32_t maxlen, enum cpuscan_groups part)
{
    return part == CPUSCAN_ALL || (maxlen == CATALOG_UNBOUNDED) == (part == CPUSCAN_UNBOUNDED);
}

static int nfa_all(struct streamscan *s, const struct vbuf *v, size_t e, uint32_t told_end,
                   bool gated_apart, enum cpuscan_groups part, struct scan_hits *raw)
{
    struct layout l = layout_of(s->cat);
    uint32_t n = catalog_nfa_count(s->cat), max = 0;
    for (uint32_t j = 0; j < n; j++) {
        struct catalog_nfa g;
        catalog_nfa(s->cat, j, &g);
        max = g.n_words > max ? g.n_words : max;
    }
    uint32_t stack[2 * STACK_WORDS], *heap = NULL;
    if (max > STACK_WORDS && (heap = malloc(2 * (size_t)max * sizeof(uint32_t))) == NULL)
        return -ENOMEM;
    uint32_t *tmp = heap ? heap : stack, *rb = tmp + (heap ? max : STACK_WORDS);
    uint32_t *home = nfa_words(s);
    const uint8_t *h = (const uint8_t *)s + l.hist_at;
    struct nfa_at at = {.tmp = tmp};
    int rc = 0;
    for (uint32_t j = 0; j < n && rc == 0; j++) {
        catalog_nfa(s->cat, j, &at.g);
        if (!in_part(at.g.maxlen, part)) {
            home += by_hist(&at.g, l.hist) ? 0 : at.g.n_words;
            continue;
        }
        if (gated_apart && gated_hist(&at.g, l.hist))
            continue; /* kept by history: no vector to skip */
        if (gated_apart && confirm_hist(&at.g, l.hist)) {
            home += at.g.n_words; /* gated_walk moves its vector */
            continue;
        }
        if (by_hist(&at.g, l.hist)) {
            nfa_rebuild(&at.g, h, s->hist_len, l.hist, rb, tmp);
            at.home = rb;
        } else {
            at.home = home;
            home += at.g.n_words;
        }
        rc = v != NULL ? nfa_write(s, &at, v, e, told_end, raw) : nfa_close(s, &at, raw);
    }
    free(heap);
    return rc;
}

/* Appends the bytes a write consumed, v[0..e), to the history. */
static void hist_push(struct streamscan *s, const struct vbuf *v, size_t e)
{
    struct layout l = layout_of(s->cat);
    if (l.hist == 0 || e == 0)
        return;
    uint8_t *h = (uint8_t *)s + l.hist_at;
    size_t cap = l.hist + 1, keep = e >= cap ? 0 : cap - e;
    keep = keep < s->hist_len ? keep : s->hist_len;
    memmove(h, h + s->hist_len - keep, keep);
    size_t from = e > cap ? e - cap : 0;
    for (size_t j = from; j < e; j++)
        h[keep + j - from] = vbyte(v, j);
    s->hist_len = (uint16_t)(keep + e - from);
}

/* ---- literal groups (the CPU engine's matcher) -------------------------- */

/* Is DFA group `gi` matched by the plan's literal matcher? */
static bool by_lit(const struct streamscan *s, uint32_t gi, uint32_t hist)
{
    if (s->plan == NULL || s->plan->lit == NULL || s->plan->mode[gi] != CPUPLAN_LIT)
        return false;
    struct catalog_group g;
    catalog_group(s->cat, gi, &g);
    return g.maxlen <= hist;
}

struct lit_ctx {
    struct scan_hits *raw;
    uint64_t base; /* stream offset of the scanned buffer's byte 0 */
    int rc;
};

static int on_lit(void *ctx, uint32_t id, uint64_t end)
{
    struct lit_ctx *c = ctx;
    if (id & CPUPLAN_FACTOR)
        return 0; /* a WINDOW group's factor: those groups are walked */
    c->rc = scan_hits_push(c->raw, id, c->base + end, 1);
    return c->rc;
}

/* Reports the strings of literal groups ending at pos + 1 .. pos + e, the
 * consumed bytes being v[0..e): their rules have no assertion, so nothing
 * waits for a lookahead. The first bytes are matched in a copy that starts
 * with the history's last hist bytes; the rest in the write's own buffer. */
static int lit_write(struct streamscan *s, const struct layout *l, const struct vbuf *v, size_t e,
                     struct scan_hits *raw)
{
    const uint8_t *h = (const uint8_t *)s + l->hist_at;
    uint32_t tail = s->hist_len < l->hist ? s->hist_len : l->hist;
    size_t head = e < (size_t)l->hist + 1 ? e : (size_t)l->hist + 1;
    uint8_t stitch[2 * HIST_MAX + 2];
    memcpy(stitch, h + s->hist_len - tail, tail);
    for (size_t j = 0; j < head; j++)
        stitch[tail + j] = vbyte(v, j);
    uint64_t pos = pos_of(s);
    struct lit_ctx c = {raw, pos - tail, 0};
    cpulit_scan(s->plan->lit, stitch, tail + head, 0, tail, tail + head, on_lit, &c);
    if (c.rc != 0 || e <= head)
        return c.rc;
    /* ends pos + head + 1 .. pos + e start at or after v[1] (a string is
     * at most hist bytes), all in the caller's buffer: v[j] is w[j - held] */
    size_t held = v->held ? 1 : 0;
    c.base = pos + held;
    cpulit_scan(s->plan->lit, v->w, v->n, 0, head - held, e - held, on_lit, &c);
    return c.rc;
}

/* Takes the plan at the first write (it may build the matcher). */
static void plan_once(struct streamscan *s)
{
    if (s->planned)
        return;
    s->planned = 1;
    if (cpuplan_get(s->cat, &s->plan) != 0)
        s->plan = NULL; /* every group is walked */
}

/* ---- the fast path: the CPU engine's block scan of a write's middle ------ */

/* A write into a catalog of bounded groups (cpuscan_lookback, L, is
 * finite) finishes most of its positions as block mode does: a match that
 * ends at position q starts at or after q - L, so the ends
 * pos + h .. pos + e - 1 (h = L + 2 past the write's first byte) are those
 * of cpuscan_segment over the write's own bytes, every walk starting in
 * them and seeing the real byte before it, with the plan's literal matcher,
 * window and shadow groups. That middle is cut into pieces run on the
 * stream's threads. Only the head (the check at pos with what the last
 * write told, and the ends up to pos + h) is walked from the carried state,
 * and the state at the end is rebuilt from the write's last maxlen bytes
 * per group: for a DFA that is a different state id with the same accepts
 * from here on (the threads it lacks started more than maxlen bytes back
 * and can accept nothing), for a bit-NFA the same vector. */

/* Middle bytes a write needs past its head to take the fast path (its
 * fixed cost is a walk of about 2 L bytes per group, so short writes are
 * walked), and bytes a piece of the middle gets at least. */
#define FAST_MIN_DEFAULT 1024u
#define PIECE_DEFAULT    (1u << 20)

static atomic_size_t fast_min = FAST_MIN_DEFAULT;
static atomic_uint_fast64_t n_fast, n_pieces, n_parallel, n_gated, n_split, n_mixed;
static atomic_uint_fast64_t n_walk_pieces, n_spec_fixes, n_walk_lanes;
/* where writes spend their time (streamscan_counters) */
static atomic_uint_fast64_t ns_whole, ns_head, ns_middle, ns_tail, ns_deliver, ns_factor;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Adds the time since *t to `c` and restarts *t. */
static void lap(atomic_uint_fast64_t *c, uint64_t *t)
{
    uint64_t n = now_ns();
    atomic_fetch_add_explicit(c, n - *t, memory_order_relaxed);
    *t = n;
}

void streamscan_tune(size_t min_middle)
{
    atomic_store(&fast_min, min_middle == SIZE_MAX ? FAST_MIN_DEFAULT : min_middle);
}

void streamscan_counters(struct streamscan_counters *c)
{
    c->fast_writes = atomic_load(&n_fast);
    c->pieces = atomic_load(&n_pieces);
    c->parallel_writes = atomic_load(&n_parallel);
    c->gated_writes = atomic_load(&n_gated);
    c->split_writes = atomic_load(&n_split);
    c->mixed_writes = atomic_load(&n_mixed);
    c->walk_pieces = atomic_load(&n_walk_pieces);
    c->spec_fixes = atomic_load(&n_spec_fixes);
    c->walk_lanes = atomic_load(&n_walk_lanes);
    c->whole_ns = atomic_load(&ns_whole);
    c->head_ns = atomic_load(&ns_head);
    c->middle_ns = atomic_load(&ns_middle);
    c->tail_ns = atomic_load(&ns_tail);
    c->deliver_ns = atomic_load(&ns_deliver);
    c->factor_ns = atomic_load(&ns_factor);
}

static atomic_uint par_threads = 1;
static atomic_size_t par_piece = PIECE_DEFAULT;

void streamscan_set_threads(uint32_t threads, size_t piece)
{
    atomic_store(&par_threads, threads == 0 ? 1 : threads > 256 ? 256 : threads);
    atomic_store(&par_piece, piece == 0 ? PIECE_DEFAULT : piece);
}

/* One cpuscan scratch per thread, kept for the thread's life (it holds
 * the last catalog's plan reference and single-match flags). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static bool scratch_key_ok;

static void scratch_free(void *p)
{
    cpuscan_scratch_destroy(p);
}

static void scratch_key_make(void)
{
    scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0;
}

static struct cpuscan_scratch *thread_scratch(void)
{
    pthread_once(&scratch_once, scratch_key_make);
    if (!scratch_key_ok)
        return NULL;
    struct cpuscan_scratch *scr = pthread_getspecific(scratch_key);
    if (scr == NULL && cpuscan_scratch_create(&scr) == 0 &&
        pthread_setspecific(scratch_key, scr) != 0) {
        cpuscan_scratch_destroy(scr);
        scr = NULL;
    }
    return scr;
}

/* One piece of a write's middle: ends (lo, hi] of w[0..n). Or, with
 * `run`, piece `idx` of a walk the function runs (`job`: what the pieces
 * share), its matches into `hits`. */
struct piece {
    const struct catalog *cat;
    const uint8_t *w;
    size_t n;
    uint64_t lo, hi;
    enum cpuscan_groups groups; /* a catalog with an unbounded group: the bounded ones */
    bool factors;               /* the factor ends in (lo, hi] into `gate`, not a scan */
    const uint8_t *want;        /* factors: keep only these bit-NFA groups' (NULL: all) */
    struct refscan_gate gate;
    struct cpuscan_part part;
    void (*run)(struct piece *);
    void *job;
    uint32_t idx;
    struct scan_hits hits;
    int rc;
    struct piece *next; /* the pool's queue */
    uint32_t *left;     /* the write's pieces not finished, under the pool's lock */
};

static void piece_run(struct piece *p)
{
    if (p->run != NULL) {
        p->run(p);
        return;
    }
    if (p->factors) {
        p->rc = refscan_factor_scan(p->cat, p->w, p->n, p->lo, p->hi, &p->gate);
        size_t kept = 0;
        for (size_t i = 0; i < p->gate.n && p->want != NULL; i++)
            if (p->want[p->gate.v[i].nfa])
                p->gate.v[kept++] = p->gate.v[i];
        if (p->want != NULL)
            p->gate.n = kept;
        refscan_gate_sort(&p->gate); /* here: the pieces sort at once */
        return;
    }
    struct cpuscan_scratch *scr = thread_scratch();
    uint64_t limit = refscan_raw_limit(); /* a hit-dense piece: -E2BIG, not all its hits */
    p->rc = scr == NULL ? -ENOMEM
                        : cpuscan_segment_groups(p->cat, p->groups, p->w, p->n, p->lo, p->hi,
                                                 SCAN_ALL, limit, NULL, NULL, scr, &p->part);
    if (p->rc == 0 && p->part.dropped > 0)
        p->rc = -E2BIG;
}

/* The workers that run pieces: started on demand, up to the threads asked
 * for less one (the writing thread runs a piece too), and kept for the
 * process, idle on a condition variable. A writer that waits for its
 * pieces runs queued ones itself (its own or another write's), so a write
 * finishes even when no worker could be started. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    struct piece *head, *tail;
    uint32_t workers;
} pool = {
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0};

/* Takes the next queued piece; under the lock. */
static struct piece *pool_pop(void)
{
    struct piece *p = pool.head;
    if (p != NULL && (pool.head = p->next) == NULL)
        pool.tail = NULL;
    return p;
}

/* Runs `p` (popped, lock not held) and counts it finished. */
static void pool_run(struct piece *p)
{
    piece_run(p);
    pthread_mutex_lock(&pool.mu);
    if (--*p->left == 0)
        pthread_cond_broadcast(&pool.done);
    pthread_mutex_unlock(&pool.mu);
}

static void *pool_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&pool.mu);
        struct piece *p;
        while ((p = pool_pop()) == NULL)
            pthread_cond_wait(&pool.work, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
        pool_run(p);
    }
    return NULL;
}

/* Queues p[1..k), runs p[0] and helps until all k are finished. */
static void pool_pieces(struct piece *p, uint32_t k)
{
    uint32_t left = k - 1;
    pthread_mutex_lock(&pool.mu);
    while (pool.workers < k - 1) {
        pthread_t th;
        pthread_attr_t at;
        bool ok = pthread_attr_init(&at) == 0;
        ok = ok && pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED) == 0 &&
             pthread_create(&th, &at, pool_main, NULL) == 0;
        pthread_attr_destroy(&at);
        if (!ok)
            break; /* fewer workers: the writer runs the rest */
        pool.workers++;
    }
    for (uint32_t i = 1; i < k; i++) {
        p[i].left = &left;
        p[i].next = NULL;
        if (pool.tail != NULL)
            pool.tail->next = &p[i];
        else
            pool.head = &p[i];
        pool.tail = &p[i];
    }
    pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.mu);
    piece_run(&p[0]);
    pthread_mutex_lock(&pool.mu);
    while (left > 0) {
        struct piece *q = pool_pop();
        if (q == NULL) {
            pthread_cond_wait(&pool.done, &pool.mu);
            continue;
        }
        pthread_mutex_unlock(&pool.mu);
        pool_run(q);
        pthread_mutex_lock(&pool.mu);
    }
    pthread_mutex_unlock(&pool.mu);
}

/* Cuts the ends (lo, lo + span] (a walk's positions [lo, lo + span)) into
 * k pieces like `like`. */
static void cut_pieces(struct piece *p, uint32_t k, const struct piece *like, uint64_t lo,
                       uint64_t span)
{
    for (uint32_t i = 0; i < k; i++) {
        p[i] = *like;
        p[i].lo = lo + span * i / k;
        p[i].hi = lo + span * (i + 1) / k;
    }
}

/* Block scan of the ends (lo, hi] of w[0..n), lo > the lookback, in up to
 * streamscan_set_threads pieces of at least its piece bytes, the first on
 * this thread; the matches go to `raw` at stream offset base + end. */
static int middle(struct streamscan *s, const uint8_t *w, size_t n, uint64_t lo, uint64_t hi,
                  uint64_t base, enum cpuscan_groups groups, struct scan_hits *raw)
{
    uint64_t span = hi - lo, piece = atomic_load(&par_piece);
    uint32_t threads = atomic_load(&par_threads);
    uint64_t fit = span / piece;
    uint32_t k = fit < threads ? (fit > 1 ? (uint32_t)fit : 1) : threads;
    struct piece one, *p = k == 1 ? &one : calloc(k, sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    cut_pieces(p, k, &(struct piece){.cat = s->cat, .w = w, .n = n, .groups = groups}, lo, span);
    if (k == 1)
        piece_run(&p[0]);
    else
        pool_pieces(p, k);
    int rc = 0;
    for (uint32_t i = 0; i < k; i++) {
        rc = rc ? rc : p[i].rc;
        for (size_t j = 0; j < p[i].part.hits.n && rc == 0; j++)
            rc = scan_hits_push(raw, p[i].part.hits.v[j].rule, base + p[i].part.hits.v[j].end, 1);
        cpuscan_part_finish(&p[i].part);
    }
    atomic_fetch_add(&n_pieces, k);
    if (k > 1)
        atomic_fetch_add(&n_parallel, 1);
    if (p != &one)
        free(p);
    return rc;
}

/* Ranges of factor ends, and walks of the groups that see a whole write,
 * shorter than this many pieces' bytes run on one thread. */
#define PAR_MIN_PIECES 4u

/* refscan_factor_ends over w[0..n) for ends in (lo, hi], on up to
 * streamscan_set_threads threads when the range is long (a large write of
 * a catalog whose unbounded groups walk all of it), keeping there only the
 * candidates of the groups of `part` that gated_walk walks. Each piece
 * sorts its own candidates; the pieces' ranges of ends follow each other,
 * so each group's candidates, piece after piece, are sorted: the join is
 * a merge by group, not a sort. `gate` is empty on entry. */
static int factor_ends(struct streamscan *s, const uint8_t *w, size_t n, uint64_t lo, uint64_t hi,
                       const struct layout *l, enum cpuscan_groups part, struct refscan_gate *gate)
{
    uint32_t threads = atomic_load(&par_threads);
    if (hi - lo < PAR_MIN_PIECES * (uint64_t)atomic_load(&par_piece) || threads < 2)
        return refscan_factor_ends(s->cat, w, n, lo, hi, gate);
    uint32_t nn = catalog_nfa_count(s->cat);
    uint8_t *want = malloc(nn ? nn : 1); /* NULL: the pieces keep every candidate */
    for (uint32_t j = 0; j < nn && want != NULL; j++) {
        struct catalog_nfa g;
        catalog_nfa(s->cat, j, &g);
        want[j] = in_part(g.maxlen, part) && walked_apart(&g, l->hist);
    }
    uint64_t lb = refscan_gated_lookback(s->cat);
    uint64_t from = lo > lb && lb != CATALOG_UNBOUNDED ? lo - lb : 0, span = hi - from;
    uint32_t k = threads;
    struct piece *p = calloc(k, sizeof(*p));
    if (p == NULL) {
        free(want);
        return -ENOMEM;
    }
    cut_pieces(p, k, &(struct piece){.cat = s->cat, .w = w, .n = n, .factors = true, .want = want},
               from, span);
    pool_pieces(p, k);
    int rc = 0;
    size_t total = 0, *at = calloc(k, sizeof(*at));
    for (uint32_t i = 0; i < k; i++) {
        rc = rc ? rc : p[i].rc;
        total += p[i].gate.n;
    }
    if (rc == 0 &&
        (at == NULL || (total > 0 && (gate->v = malloc(total * sizeof(*gate->v))) == NULL)))
        rc = -ENOMEM;
    gate->cap = rc == 0 ? total : 0;
    for (;;) { /* group by group, its candidates piece after piece */
        uint32_t nfa = UINT32_MAX;
        for (uint32_t i = 0; i < k && rc == 0; i++)
            if (at[i] < p[i].gate.n && p[i].gate.v[at[i]].nfa < nfa)
                nfa = p[i].gate.v[at[i]].nfa;
        if (nfa == UINT32_MAX)
            break;
        for (uint32_t i = 0; i < k; i++)
            for (; at[i] < p[i].gate.n && p[i].gate.v[at[i]].nfa == nfa; at[i]++)
                gate->v[gate->n++] = p[i].gate.v[at[i]];
    }
    for (uint32_t i = 0; i < k; i++)
        refscan_gate_finish(&p[i].gate);
    free(at);
    free(p);
    free(want);
    return rc;
}

/* ---- long walks in pieces: the groups that see a whole write ------------- */

/* Bytes before a piece (or a lane of one) that its guess of a DFA state
 * walks (streamscan_tune_spec). */
#define SPEC_LOOKBACK 1024u
static atomic_size_t spec_lb = SPEC_LOOKBACK;

void streamscan_tune_spec(size_t lookback)
{
    atomic_store(&spec_lb, lookback == 0 ? SPEC_LOOKBACK : lookback);
}

/* How many pieces a walk of e bytes takes: one (this thread) under
 * PAR_MIN_PIECES pieces' bytes, else one a thread, each of at least the
 * piece bytes and of SPEC_LOOKBACK (a shorter piece's guess would walk
 * more than the piece). */
static uint32_t walk_k(size_t e)
{
    uint32_t threads = atomic_load(&par_threads);
    uint64_t piece = atomic_load(&par_piece);
    size_t lb = atomic_load(&spec_lb);
    piece = piece < lb ? lb : piece;
    if (threads < 2 || e < PAR_MIN_PIECES * piece)
        return 1;
    uint64_t fit = e / piece;
    return fit < threads ? (uint32_t)fit : threads;
}

/* Runs `run` as pieces 0 .. k - 1 of `job` over positions [a, b) (piece
 * i: [lo, hi), the first on this thread): the pieces, their matches and
 * errors in them, or NULL (-ENOMEM). */
static struct piece *walk_run(void (*run)(struct piece *), void *job, uint32_t k, size_t a,
                              size_t b)
{
    struct piece *p = calloc(k, sizeof(*p));
    if (p == NULL)
        return NULL;
    cut_pieces(p, k, &(struct piece){.run = run, .job = job, .hits = {.max = refscan_raw_max()}}, a,
               b - a);
    for (uint32_t i = 0; i < k; i++)
        p[i].idx = i;
    if (k == 1)
        piece_run(p);
    else
        pool_pieces(p, k);
    return p;
}

static void walk_free(struct piece *p, uint32_t k)
{
    for (uint32_t i = 0; i < k; i++)
        scan_hits_finish(&p[i].hits);
    free(p);
}

/* A long copy in pieces (its pages, new to the process, are touched on
 * every thread at once). */
struct copy_job {
    uint8_t *dst;
    const uint8_t *src;
};

static void copy_piece(struct piece *p)
{
    const struct copy_job *J = p->job;
    memcpy(J->dst + p->lo, J->src + p->lo, p->hi - p->lo);
}

static void copy_par(uint8_t *dst, const uint8_t *src, size_t n)
{
    struct copy_job job = {dst, src};
    uint32_t k = walk_k(n);
    struct piece *p = k > 1 ? walk_run(copy_piece, &job, k, 0, n) : NULL;
    if (p == NULL)
        memcpy(dst, src, n);
    else
        walk_free(p, k);
}

/* DFA groups walked over a whole write in pieces, as the GPU walks an
 * unbounded group in speculative segments (docs/gpu.md "Unbounded groups in
 * parallel"): piece i > 0 walks from a guess, the state the
 * SPEC_LOOKBACK bytes before it lead to from a start state. A DFA forgets
 * the past within a few bytes of most data, so the guess is usually the
 * true state; where it is not, the true walk steps beside the guessed one
 * from the piece's start until the two agree (from there the guessed walk
 * is exact) and replaces its matches before that point. A guess that never
 * agrees costs a walk of the piece: linear, never wrong. */
struct dfa_seg {
    uint32_t guess, end; /* the state the piece began in, and where it ended */
    size_t from, to;     /* its matches in the piece's hits, by position */
};

struct dfa_job {
    struct streamscan *s;
    const struct vbuf *v;
    const uint32_t *groups;
    uint32_t n;
    struct dfa_seg *seg; /* piece after piece, n each */
};

static uint32_t dfa_guess(const struct catalog_group *g, const struct vbuf *v, size_t a)
{
    size_t lb = atomic_load(&spec_lb);
    size_t i = a > lb ? a - lb : 0;
    uint32_t st = g->start[i ? catalog_byte_kind(vbyte(v, i - 1)) + 1 : 0];
    for (; i < a; i++)
        st = g->trans[(size_t)st * g->n_classes + g->classmap[vbyte(v, i)]];
    return st;
}

/* dfa_span of a piece, v[a..b) with a past the held byte, as four lanes
 * walked interleaved so that their chains of dependent table loads overlap:
 * lanes 1-3 from guesses (dfa_guess), each repaired after the walk as
 * dfa_par repairs pieces (the true walk beside the guessed one until they
 * agree; the guess's matches are true ones, and the deliver keeps each
 * (rule, end) once). Shorter spans, or lanes under 4 lookbacks: dfa_span. */
static int dfa_lanes(const struct catalog_group *g, uint32_t *st, const struct vbuf *v, size_t a,
                     size_t b, uint64_t pos, uint32_t told, struct scan_hits *raw)
{
    size_t q = (b - a) / 4;
    if (a < (size_t)v->held || a == 0 || q < 4 * atomic_load(&spec_lb))
        return dfa_span(g, st, v, a, b, pos, told, raw);
    const uint32_t *trans = g->trans, *cm = g->classmap;
    const size_t nc = g->n_classes;
    const uint32_t fa = g->first_accept;
    size_t lo[4], hi[4];
    uint32_t x[4], guess[4];
    const uint8_t *w[4];
    for (int k = 0; k < 4; k++) {
        lo[k] = a + (size_t)k * q;
        hi[k] = k == 3 ? b : a + (size_t)(k + 1) * q;
        x[k] = guess[k] = k == 0 ? *st : dfa_guess(g, v, lo[k]);
        w[k] = v->w + (lo[k] - v->held);
    }
    int rc = 0;
    for (size_t n = 0; n < q && rc == 0; n++)
        for (int k = 0; k < 4 && rc == 0; k++) {
            uint8_t c = w[k][n];
            if (x[k] >= fa)
                rc = dfa_check(g, x[k], 1u << catalog_byte_kind(c), 0, pos + lo[k] + n, raw);
            x[k] = trans[(size_t)x[k] * nc + cm[c]];
        }
    if (rc == 0) /* the last lane's rest */
        rc = dfa_span(g, &x[3], v, lo[3] + q, hi[3], pos, told, raw);
    uint32_t t = x[0];
    for (int k = 1; k < 4 && rc == 0; k++) {
        uint32_t gs = guess[k];
        size_t j = lo[k];
        if (t != gs)
            atomic_fetch_add(&n_spec_fixes, 1);
        for (; j < hi[k] && t != gs && rc == 0; j++) {
            uint8_t c = vbyte(v, j);
            if (t >= fa)
                rc = dfa_check(g, t, 1u << catalog_byte_kind(c), 0, pos + j, raw);
            t = trans[(size_t)t * nc + cm[c]];
            gs = trans[(size_t)gs * nc + cm[c]];
        }
        t = t == gs ? x[k] : t;
    }
    atomic_fetch_add(&n_walk_lanes, 1);
    *st = t;
    return rc;
}

static void dfa_piece(struct piece *p)
{
    struct dfa_job *J = p->job;
    size_t a = p->lo, b = p->hi;
    for (uint32_t x = 0; x < J->n && p->rc == 0; x++) {
        struct catalog_group g;
        catalog_group(J->s->cat, J->groups[x], &g);
        struct dfa_seg *o = &J->seg[(size_t)p->idx * J->n + x];
        uint32_t st = p->idx == 0 ? dfa_get(J->s, J->groups[x]) : dfa_guess(&g, J->v, a);
        o->guess = st;
        o->from = p->hits.n;
        p->rc = dfa_lanes(&g, &st, J->v, a, b, pos_of(J->s), J->s->told, &p->hits);
        o->to = p->hits.n;
        o->end = st;
    }
}

/* Appends hits[from, to) whose ends are at least `min` to raw. */
static int push_from(struct scan_hits *raw, const struct scan_hits *h, size_t from, size_t to,
                     uint64_t min)
{
    int rc = 0;
    for (size_t i = from; i < to && rc == 0; i++)
        if (h->v[i].end >= min)
            rc = scan_hits_push(raw, h->v[i].rule, h->v[i].end, 1);
    return rc;
}

/* dfa_write of the DFA groups groups[0..n) over v[0..e) in k pieces. */
static int dfa_par(struct streamscan *s, const uint32_t *groups, uint32_t n, const struct vbuf *v,
                   size_t e, uint32_t k, uint32_t told_end, struct scan_hits *raw)
{
    struct dfa_seg *seg = malloc((size_t)k * n * sizeof(*seg));
    struct dfa_job job = {s, v, groups, n, seg};
    struct piece *p = NULL;
    int rc = seg == NULL ? -ENOMEM : 0;
    if (rc == 0) {
        rc = (p = walk_run(dfa_piece, &job, k, 0, e)) == NULL ? -ENOMEM : 0;
        atomic_fetch_add(&n_walk_pieces, k);
    }
    for (uint32_t i = 0; i < k && rc == 0; i++)
        rc = p[i].rc;
    uint64_t pos = pos_of(s);
    for (uint32_t x = 0; x < n && rc == 0; x++) {
        struct catalog_group g;
        catalog_group(s->cat, groups[x], &g);
        uint32_t st = 0;
        for (uint32_t i = 0; i < k && rc == 0; i++) {
            const struct dfa_seg *o = &seg[(size_t)i * n + x];
            uint32_t gs = o->guess;
            size_t j = p[i].lo;
            if (i > 0) /* the true walk beside the guessed one, until they agree */
                for (; j < p[i].hi && st != gs && rc == 0; j++) {
                    uint8_t c = vbyte(v, j);
                    if (st >= g.first_accept)
                        rc = dfa_check(&g, st, 1u << catalog_byte_kind(c), 0, pos + j, raw);
                    st = g.trans[(size_t)st * g.n_classes + g.classmap[c]];
                    gs = g.trans[(size_t)gs * g.n_classes + g.classmap[c]];
                }
            if (rc == 0 && (i == 0 || st == gs)) {
                rc = push_from(raw, &p[i].hits, o->from, o->to, pos + j);
                st = o->end;
            }
            if (i > 0 && j > p[i].lo)
                atomic_fetch_add(&n_spec_fixes, 1);
        }
        if (rc == 0)
            rc = dfa_end(s, groups[x], &g, st, e, told_end, raw);
    }
    if (p != NULL)
        walk_free(p, k);
    free(seg);
    return rc;
}

/* The state of DFA group `g` after w[0..n), n > maxlen: walked from the
 * start state that w[n - maxlen - 1] selects. */
static uint32_t dfa_rebuild(const struct catalog_group *g, const uint8_t *w, size_t n)
{
    size_t i = n - g->maxlen;
    uint32_t st = catalog_group_start(g, w, i);
    for (; i < n; i++)
        st = g->trans[(size_t)st * g->n_classes + g->classmap[w[i]]];
    return st;
}

/* The first candidate at or after (group j, end `at`) in the gate,
 * sorted by (group, end): a binary search (a long write's gate holds
 * candidates by the hundred thousand, and each group and piece asks). */
static size_t cand_from(const struct refscan_gate *g, uint32_t j, uint64_t at)
{
    size_t lo = 0, hi = g->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct refscan_cand *c = &g->v[mid];
        if (c->nfa < j || (c->nfa == j && c->end < at))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Whether gated group `nfa` has a candidate whose factor ends in
 * [a, b] (`a` may be below 0 as an unsigned wrap: then from 0). */
static bool has_cand(const struct refscan_gate *g, uint32_t nfa, uint64_t a, uint64_t b)
{
    if (a > b)
        a = 0;
    size_t k = cand_from(g, nfa, a);
    return k < g->n && g->v[k].nfa == nfa && g->v[k].end <= b;
}

/* The head's gated groups kept by history need the history and the head
 * in one copy (stack, bounded). */
#define GATED_COPY (2 * HIST_MAX + 8)

/* Some group of `part` is walked apart (gated_walk), and each gated group
 * kept by history fits the stack's scratch. */
static bool gated_any(const struct streamscan *s, const struct layout *l, enum cpuscan_groups part)
{
    if (l->hist == 0)
        return false;
    for (uint32_t j = 0; j < catalog_nfa_count(s->cat); j++) {
        struct catalog_nfa g;
        catalog_nfa(s->cat, j, &g);
        if (gated_hist(&g, l->hist) && g.n_words > STACK_WORDS)
            return false; /* its scratch would not fit the stack */
    }
    for (uint32_t j = 0; j < catalog_nfa_count(s->cat); j++) {
        struct catalog_nfa g;
        catalog_nfa(s->cat, j, &g);
        if (walked_apart(&g, l->hist) && in_part(g.maxlen, part))
            return true;
    }
    return false;
}

/* The fast path's head walks its gated groups apart when its copy fits the stack. */
static bool gated_ok(const struct streamscan *s, const struct layout *l, size_t h,
                     enum cpuscan_groups part)
{
    return (size_t)l->hist + 1 + h + 1 <= GATED_COPY && gated_any(s, l, part);
}

struct gated_ctx {
    struct scan_hits *raw;
    uint64_t base; /* stream offset of the copy's byte 0 */
};

static int on_gated(void *ctx, uint32_t rule, uint64_t end)
{
    struct gated_ctx *c = ctx;
    return scan_hits_push(c->raw, rule, c->base + end, 1);
}

/* The first candidate of group j ending after `after`, in the sorted gate. */
static size_t cand_after(const struct refscan_gate *g, uint32_t j, uint64_t after)
{
    return cand_from(g, j, after + 1);
}

/* Forward-confirmed group `g` over copy[..stop): the copy holds the
 * history before pos (hl bytes), then the write. Its factor ends allow
 * starts up to lookback bytes earlier, some in the history, which the
 * carried state could not have fired. A walk fires starts only where
 * allowed, jumps over the stretches where the state is empty and no start
 * is, and reports from pos on (a match ends at or after its factor's end,
 * past pos). Exact: what the full walk finds, as block mode's
 * confirmation (refscan.c confirm_walk).
 *
 * This is one piece of that walk: it fires the starts allowed at
 * positions [a, b). The first piece (a == hl) begins at the first start
 * the history allows and takes in the carried state `home` at hl. From b
 * on a piece fires nothing and walks what it holds until its state is
 * empty or it reaches stop; the state at stop is left in *end (empty when
 * the walk ended before). The step is a union over positions, so the
 * pieces together walk the whole walk, and their matches are its matches
 * (some found twice, which deliver drops). */
static int confirm_span(const struct streamscan *s, const struct catalog_nfa *g, uint32_t j,
                        const uint32_t *home, const uint8_t *copy, size_t hl, size_t a, size_t b,
                        size_t stop, const struct refscan_gate *gate, uint32_t *va, uint32_t *vb,
                        struct nvec *end, struct scan_hits *raw)
{
    memset(va, 0, (size_t)g->n_words * sizeof(uint32_t));
    memset(vb, 0, (size_t)g->n_words * sizeof(uint32_t));
    struct nvec x = {va, 1, 0}, y = {vb, 1, 0}, *cur = &x, *nxt = &y;
    uint64_t lb = g->lookback, until = 0, pos = pos_of(s);
    size_t c = cand_after(gate, j, a);
    /* No bound on the lookback: a factor ending at E allows the starts in
     * the run of span bytes that ends SKIP bytes before E (block mode's
     * refscan_start_from), within the copy. A run that reaches the copy's
     * start goes on in earlier writes, whose walks fired every start of
     * their last run (`spec`): a run that reaches SKIP bytes before a
     * write's end may hold the start of a match whose factor a later
     * write completes. Starts fired without a factor find only real
     * matches, so the walk's matches are the full walk's. */
    bool runs = lb == CATALOG_UNBOUNDED;
    struct refscan_starts rs = {.lookback = lb, .span = g->span, .buf = copy};
    uint64_t spec = stop;
    if (runs) {
        struct refscan_starts sp = rs;
        spec = refscan_start_from(&sp, g->span[8] > 0 ? stop + 1 : stop);
    }
#define START_OF(k) \
    (runs ? refscan_start_from(&rs, gate->v[k].end) : gate->v[k].end > lb ? gate->v[k].end - lb : 0)
#define LIVE(k) ((k) < gate->n && gate->v[k].nfa == j && gate->v[k].end <= stop)
    bool merged = a != hl; /* a later piece: the carried state is the first's */
    uint64_t i = !merged && LIVE(c) && START_OF(c) < hl ? START_OF(c) : a;
    int rc = 0;
    for (;;) {
        bool firing = i < b;
        for (; firing && LIVE(c) && START_OF(c) <= i; c++)
            until = gate->v[c].end > until ? gate->v[c].end : until;
        if (firing && i >= spec)
            until = stop;         /* the last run's starts, for later writes */
        if (i == hl && !merged) { /* the carried state joins */
            merged = true;
            cur->lo = 1;
            cur->hi = 0;
            for (uint32_t w = 0; w < g->n_words; w++) {
                if ((cur->v[w] |= home[w]) == 0)
                    continue;
                if (cur->lo > cur->hi)
                    cur->lo = w;
                cur->hi = w;
            }
        }
        bool alive = cur->lo <= cur->hi, starts = firing && i < until;
        if (i == stop)
            break;
        uint32_t p = i ? catalog_byte_kind(copy[i - 1]) + 1 : 0 /* P_BOS */;
        uint32_t k = catalog_byte_kind(copy[i]);
        if (alive && i >= hl &&
            (rc = nfa_check(g, cur, p, 1u << k, i == hl ? s->told : 0, pos + (i - hl), raw)) != 0)
            break;
        if (!alive && !starts) { /* nothing to walk until the next allowed start */
            if (!firing)
                break;
            uint64_t next = LIVE(c) ? START_OF(c) : stop;
            next = next > spec ? spec : next;
            next = next > stop ? stop : next;
            i = !merged && next > hl ? hl : next;
            continue;
        }
        nfa_step_starts(g, cur, nxt, CAT_PK(p, k), copy[i], starts);
        struct nvec *t = cur;
        cur = nxt;
        nxt = t;
        i++;
    }
#undef START_OF
#undef LIVE
    *end = i == stop ? *cur : (struct nvec){cur->v, 1, 0};
    return rc;
}

/* The state of each confirmed group at stop, from its pieces' ends: the
 * union, checked at stop with `told_end`, carried on in its vector. */
static int confirm_end(const struct streamscan *s, const struct catalog_nfa *g, uint32_t *home,
                       const uint8_t *copy, size_t stop, size_t e, uint32_t told_end, uint32_t *tmp,
                       struct scan_hits *raw)
{
    struct nvec a, b;
    nfa_load(g, home, tmp, &a, &b);
    int rc = 0;
    if (told_end != 0) {
        uint32_t p = stop ? catalog_byte_kind(copy[stop - 1]) + 1 : 0;
        rc = nfa_check(g, &a, p, told_end, e ? 0 : s->told, pos_of(s) + e, raw);
    }
    return rc;
}

/* The confirmed groups of a write, walked in pieces (confirm_span). */
struct confirm_job {
    const struct streamscan *s;
    const uint8_t *copy;
    size_t hl, stop;
    const struct refscan_gate *gate;
    const uint32_t *groups; /* nfa indices, n of them */
    uint32_t *const *homes; /* each group's carried vector */
    const size_t *at;       /* each group's words in a piece's ends */
    uint32_t n, words;
    uint32_t *ends; /* piece after piece, `words` each: the states at stop */
};

static void confirm_piece(struct piece *p)
{
    const struct confirm_job *J = p->job;
    uint32_t va[STACK_WORDS], vb[STACK_WORDS];
    uint32_t *ends = J->ends + (size_t)p->idx * J->words;
    for (uint32_t x = 0; x < J->n && p->rc == 0; x++) {
        struct catalog_nfa g;
        catalog_nfa(J->s->cat, J->groups[x], &g);
        struct nvec end;
        p->rc = confirm_span(J->s, &g, J->groups[x], J->homes[x], J->copy, J->hl, p->lo, p->hi,
                             J->stop, J->gate, va, vb, &end, &p->hits);
        for (uint32_t w = 0; w < g.n_words; w++)
            ends[J->at[x] + w] = end.lo <= end.hi ? end.v[w] : 0;
    }
}

/* Every confirmed group of `part` over copy[hl..hl + e), in pieces on the
 * stream threads when the write is long; position hl + e is checked with
 * `told_end` (0: left to the caller). */
static int confirm_all(struct streamscan *s, const struct layout *l, const uint8_t *copy, size_t hl,
                       size_t e, uint32_t told_end, enum cpuscan_groups part,
                       const struct refscan_gate *gate, struct scan_hits *raw)
{
    uint32_t nn = catalog_nfa_count(s->cat), n = 0, words = 0, k = walk_k(e);
    uint32_t *groups = malloc(nn * sizeof(*groups));
    uint32_t **homes = malloc(nn * sizeof(*homes));
    size_t *at = malloc(nn * sizeof(*at));
    int rc = groups && homes && at ? 0 : -ENOMEM;
    uint32_t *home = nfa_words(s);
    for (uint32_t j = 0; j < nn && rc == 0; j++) {
        struct catalog_nfa g;
        catalog_nfa(s->cat, j, &g);
        uint32_t *vec = home;
        home += by_hist(&g, l->hist) ? 0 : g.n_words;
        if (!in_part(g.maxlen, part) || !confirm_hist(&g, l->hist))
            continue;
        groups[n] = j;
        homes[n] = vec;
        at[n++] = words;
        words += g.n_words;
    }
    uint32_t *ends = rc == 0 && n > 0 ? calloc((size_t)k * words, sizeof(*ends)) : NULL;
    if (rc == 0 && n > 0 && ends == NULL)
        rc = -ENOMEM;
    struct piece *p = NULL;
    if (rc == 0 && n > 0) {
        struct confirm_job job = {s, copy, hl, hl + e, gate, groups, homes, at, n, words, ends};
        if ((p = walk_run(confirm_piece, &job, k, hl, hl + e)) == NULL)
            rc = -ENOMEM;
        atomic_fetch_add(&n_walk_pieces, k);
        for (uint32_t i = 0; i < k && rc == 0; i++) {
            rc = p[i].rc;
            for (size_t h = 0; h < p[i].hits.n && rc == 0; h++)
                rc = scan_hits_push(raw, p[i].hits.v[h].rule, p[i].hits.v[h].end, 1);
        }
    }
    uint32_t tmp[STACK_WORDS];
    for (uint32_t x = 0; x < n && rc == 0; x++) {
        struct catalog_nfa g;
        catalog_nfa(s->cat, groups[x], &g);
        for (uint32_t w = 0; w < g.n_words; w++) {
            uint32_t u = 0;
            for (uint32_t i = 0; i < k; i++)
                u |= ends[(size_t)i * words + at[x] + w];
            homes[x][w] = u;
        }
        rc = confirm_end(s, &g, homes[x], copy, hl + e, e, told_end, tmp, raw);
    }
    if (p != NULL)
        walk_free(p, k);
    free(ends);
    free(groups);
    free(homes);
    free(at);
    return rc;
}

/* Positions pos .. pos + e - 1 of the gated bit-NFA groups kept by
 * history, walked only around their factors as block mode walks them, over
 * a copy of the history and v[0..e] (v[e], when the write has it, is the
 * lookahead of the last end), and position pos + e with `told_end` (0: left
 * to the caller, the fast path's tail). Position pos, whose check depends
 * on what the last write told, is checked from the state rebuilt from the
 * history, and only for a group with a factor end in its last maxlen bytes:
 * without one no match of it ends there; position pos + e likewise from the
 * copy's last bytes. */
static int gated_walk(struct streamscan *s, const struct layout *l, const struct vbuf *v, size_t e,
                      uint32_t told_end, enum cpuscan_groups part, struct scan_hits *raw)
{
    uint8_t stack[GATED_COPY], *copy = stack;
    const uint8_t *hist = (const uint8_t *)s + l->hist_at;
    size_t hl = s->hist_len, more = e < v->n + v->held ? 1 : 0, n = hl + e + more;
    if (n > sizeof(stack) && (copy = malloc(n)) == NULL)
        return -ENOMEM;
    memcpy(copy, hist, hl);
    size_t held = v->held ? 1 : 0, m = e + more; /* v[j] is '\n' (held), then w[j - held] */
    if (held && m > 0)
        copy[hl] = '\n';
    if (m > held)
        copy_par(copy + hl + held, v->w, m - held);
    struct refscan_gate gate = {0};
    uint64_t t = now_ns();
    int rc = factor_ends(s, copy, n, hl ? hl - 1 : 0, hl + e, l, part, &gate);
    lap(&ns_factor, &t);
    uint32_t tmp[2 * STACK_WORDS], *rb = tmp + STACK_WORDS;
    struct gated_ctx c = {raw, pos_of(s) - hl};
    uint32_t k0 = catalog_byte_kind(vbyte(v, 0)), p_end = catalog_byte_kind(copy[hl + e - 1]) + 1;
    size_t take_end = hl + e; /* the bytes before pos + e a rebuild may walk */
    if (rc == 0 && e > 0)
        rc = confirm_all(s, l, copy, hl, e, told_end, part, &gate, raw);
    for (uint32_t j = 0; j < catalog_nfa_count(s->cat) && rc == 0; j++) {
        struct catalog_nfa g;
        catalog_nfa(s->cat, j, &g);
        if (!in_part(g.maxlen, part))
            continue;
        if (!gated_hist(&g, l->hist))
            continue;
        struct nvec a, b;
        if (hl > 0 && has_cand(&gate, j, hl - g.maxlen, hl)) {
            nfa_rebuild(&g, hist, (uint32_t)hl, l->hist, rb, tmp);
            nfa_load(&g, rb, tmp, &a, &b);
            rc = nfa_check(&g, &a, s->prev, 1u << k0, s->told, pos_of(s), raw);
        }
        if (rc == 0 && e > 1)
            rc = refscan_gated_range(s->cat, j, copy, n, hl, hl + e - 1, &gate, on_gated, &c);
        if (rc == 0 && told_end != 0 && has_cand(&gate, j, hl + e - g.maxlen, hl + e)) {
            size_t take = take_end < (size_t)g.maxlen + 1 ? take_end : (size_t)g.maxlen + 1;
            nfa_rebuild(&g, copy + take_end - take, (uint32_t)take, l->hist, rb, tmp);
            nfa_load(&g, rb, tmp, &a, &b);
            rc = nfa_check(&g, &a, p_end, told_end, 0, pos_of(s) + e, raw);
        }
    }
    refscan_gate_finish(&gate);
    if (copy != stack)
        free(copy);
    return rc;
}

/* The tail: every group's state after w[0..n) rebuilt, position `end`
 * checked with `told_end`, and the carried states replaced. */
static int tail(struct streamscan *s, const struct layout *l, const uint8_t *w, size_t n,
                uint64_t end, uint32_t told_end, bool gated_apart, enum cpuscan_groups part,
                struct scan_hits *raw)
{
    int rc = 0;
    for (uint32_t gi = 0; gi < catalog_group_count(s->cat) && rc == 0; gi++) {
        struct catalog_group g;
        catalog_group(s->cat, gi, &g);
        if (!in_part(g.maxlen, part))
            continue;
        uint32_t st = dfa_rebuild(&g, w, n);
        rc = dfa_check(&g, st, told_end, 0, end, raw);
        dfa_set(s, gi, st);
    }
    uint32_t nn = catalog_nfa_count(s->cat), max = 0;
    for (uint32_t j = 0; j < nn; j++) {
        struct catalog_nfa g;
        catalog_nfa(s->cat, j, &g);
        max = g.n_words > max ? g.n_words : max;
    }
    uint32_t stack[2 * STACK_WORDS], *heap = NULL;
    if (max > STACK_WORDS && (heap = malloc(2 * (size_t)max * sizeof(uint32_t))) == NULL)
        return -ENOMEM;
    uint32_t *tmp = heap ? heap : stack, *rb = tmp + (heap ? max : STACK_WORDS);
    uint32_t *home = nfa_words(s), p = catalog_byte_kind(w[n - 1]) + 1;
    struct refscan_gate gate = {0};
    if (gated_apart && rc == 0)      /* factor ends that can make a match end at n */
        rc = part == CPUSCAN_BOUNDED /* the bounded groups' ends only, not every one */
                 ? refscan_factor_ends_lb(s->cat, w, n, n - 1, n, NULL, s->plan->split_lb, &gate)
                 : refscan_factor_ends(s->cat, w, n, n - 1, n, &gate);
    for (uint32_t j = 0; j < nn && rc == 0; j++) {
        struct catalog_nfa g;
        catalog_nfa(s->cat, j, &g);
        if (!in_part(g.maxlen, part)) {
            home += by_hist(&g, l->hist) ? 0 : g.n_words;
            continue;
        }
        if (gated_apart && gated_hist(&g, l->hist) && !has_cand(&gate, j, n - g.maxlen, n))
            continue; /* no match of it can end at n, and it keeps no vector */
        /* its last maxlen bytes and the byte before them */
        nfa_rebuild(&g, w + n - g.maxlen - 1, g.maxlen + 1, 0, rb, tmp);
        struct nvec a, b;
        nfa_load(&g, rb, tmp, &a, &b);
        rc = nfa_check(&g, &a, p, told_end, 0, end, raw);
        if (!by_hist(&g, l->hist)) {
            memcpy(home, rb, (size_t)g.n_words * sizeof(uint32_t));
            home += g.n_words;
        }
    }
    refscan_gate_finish(&gate);
    free(heap);
    return rc;
}

/* ---- writes --------------------------------------------------------------- */

static bool bit(const uint8_t *set, uint32_t r)
{
    return (set[r / 8] >> (r % 8)) & 1u;
}

static bool single(const struct catalog *cat, uint32_t r)
{
    struct catalog_rule cr;
    catalog_rule(cat, r, &cr);
    return (cr.flags & RULE_F_SINGLEMATCH) != 0;
}

/* Sorts and deduplicates this call's raw matches, drops single-match rules
 * already reported earlier in the stream, and appends the rest to `out`. */
static int deliver(struct streamscan *s, struct scan_hits *raw, struct scan_hits *out)
{
    scan_hits_finalize(raw, s->cat, SCAN_ALL);
    int rc = 0;
    for (size_t i = 0; i < raw->n && rc == 0; i++) {
        uint32_t r = raw->v[i].rule;
        if (single(s->cat, r)) {
            if (s->done == NULL &&
                (s->done = calloc((catalog_rule_count(s->cat) + 7) / 8, 1)) == NULL) {
                rc = -ENOMEM;
                break;
            }
            if (bit(s->done, r))
                continue;
            s->done[r / 8] |= (uint8_t)(1u << (r % 8));
        }
        rc = scan_hits_push(out, r, raw->v[i].end, 1);
    }
    scan_hits_finish(raw);
    return rc;
}

/* A factor group (CAT_GF_FACTOR): its accepts name bit-NFA groups with
 * mask 0, so walking it reports nothing; gated_walk finds its ends itself. */
static bool factor_group(const struct catalog *cat, uint32_t gi)
{
    struct catalog_group g;
    catalog_group(cat, gi, &g);
    return (g.flags & CAT_GF_FACTOR) != 0;
}

/* Walks every group over v[0..e) from the carried state: checks positions
 * pos .. pos + e (pos + e with `told_end`; 0: not checked). */
static int walk_all(struct streamscan *s, const struct layout *l, const struct vbuf *v, size_t e,
                    uint32_t told_end, bool gated_apart, enum cpuscan_groups part,
                    struct scan_hits *raw)
{
    bool lits = false;
    int rc = 0;
    uint32_t n = catalog_group_count(s->cat), k = walk_k(e), nw = 0;
    uint32_t *walked = k > 1 ? malloc(n * sizeof(*walked)) : NULL;
    for (uint32_t g = 0; g < n && rc == 0; g++) {
        struct catalog_group cg;
        catalog_group(s->cat, g, &cg);
        if (!in_part(cg.maxlen, part))
            continue;
        if (by_lit(s, g, l->hist))
            lits = true;
        else if (factor_group(s->cat, g)) /* its entries are never reported */
            continue;
        else if (walked != NULL)
            walked[nw++] = g;
        else
            rc = dfa_write(s, g, v, e, told_end, raw);
    }
    if (rc == 0 && nw > 0)
        rc = dfa_par(s, walked, nw, v, e, k, told_end, raw);
    free(walked);
    if (rc == 0 && lits && e > 0)
        rc = lit_write(s, l, v, e, raw);
    if (rc == 0)
        rc = nfa_all(s, v, e, told_end, gated_apart, part, raw);
    return rc;
}

/* The groups the fast path takes: all of them in a catalog of bounded
 * groups, the bounded ones in a catalog whose bounded groups may be
 * scanned apart (cpuplan's split_lb; the unbounded ones walk the whole
 * write), and *lb their lookback; CPUSCAN_UNSEGMENTABLE in *lb when none. */
static enum cpuscan_groups fast_part(const struct streamscan *s, uint64_t *lb)
{
    *lb = cpuscan_lookback(s->cat);
    if (*lb != CPUSCAN_UNSEGMENTABLE || s->plan == NULL)
        return CPUSCAN_ALL;
    *lb = s->plan->split_lb;
    return CPUSCAN_BOUNDED;
}

/* The fast path's head, in bytes of v (L + 2, the held '\n' included),
 * when a write of e bytes to consume takes it; else 0. */
static size_t head_of(const struct streamscan *s, size_t e)
{
    uint64_t lb;
    fast_part(s, &lb);
    if (lb == CPUSCAN_UNSEGMENTABLE || lb > e)
        return 0;
    size_t h = (size_t)lb + 2 + s->held;
    return e > h && e - h > atomic_load(&fast_min) ? h : 0;
}

/* A write, but for the middle of a fast-path write when `split` allows one
 * of more than `split` bytes: that is then left to the caller (mid->pending,
 * its range in mid, the write's other matches in mid->raw, undelivered). */
static int write_split(struct streamscan *s, const uint8_t *buf, size_t len, size_t split,
                       struct scan_hits *out, struct streamscan_middle *mid)
{
    if (mid != NULL)
        *mid = (struct streamscan_middle){0};
    if (s->closed)
        return -EPIPE;
    if (len == 0)
        return 0;
    struct vbuf v = {buf, len, s->held};
    size_t m = len + (s->held ? 1 : 0);
    /* a final '\n' waits: whether it is the last byte of the data matters */
    size_t e = buf[len - 1] == '\n' ? m - 1 : m;
    uint32_t told_end = e == m ? KIND_ALL : KIND_NL_ANY;
    struct scan_hits raw = {.max = refscan_raw_max()}; /* a hit bomb: -E2BIG */
    plan_once(s);
    struct layout l = layout_of(s->cat);
    size_t h = head_of(s, e);
    bool apart_mid = false;
    uint64_t t = now_ns();
    int rc;
    if (h == 0) {
        /* the gated groups kept by history around their factors, the others
         * byte by byte */
        bool apart = e > 0 && gated_any(s, &l, CPUSCAN_ALL);
        rc = walk_all(s, &l, &v, e, told_end, apart, CPUSCAN_ALL, &raw);
        if (rc == 0 && apart) {
            atomic_fetch_add(&n_gated, 1);
            rc = gated_walk(s, &l, &v, e, told_end, CPUSCAN_ALL, &raw);
        }
        lap(&ns_whole, &t);
    } else {
        /* the head from the carried state, the middle as block mode, the
         * tail's state rebuilt (the fast path, above); in a catalog with
         * unbounded groups, for its bounded groups, the unbounded ones
         * walked over the whole write first as the slow path walks them */
        size_t held = s->held, ew = e - held;
        uint64_t base = s->total, lo = h - held - 1, hi = ew - 1, lb;
        enum cpuscan_groups part = fast_part(s, &lb);
        atomic_fetch_add(&n_fast, 1);
        rc = 0;
        if (part == CPUSCAN_BOUNDED) {
            atomic_fetch_add(&n_mixed, 1);
            bool ua = gated_any(s, &l, CPUSCAN_UNBOUNDED);
            rc = walk_all(s, &l, &v, e, told_end, ua, CPUSCAN_UNBOUNDED, &raw);
            if (rc == 0 && ua)
                rc = gated_walk(s, &l, &v, e, told_end, CPUSCAN_UNBOUNDED, &raw);
            lap(&ns_whole, &t);
        }
        bool apart = gated_ok(s, &l, h, part);
        if (rc == 0)
            rc = walk_all(s, &l, &v, h, 0, apart, part, &raw);
        if (rc == 0 && apart) {
            atomic_fetch_add(&n_gated, 1);
            rc = gated_walk(s, &l, &v, h, 0, part, &raw);
        }
        lap(&ns_head, &t);
        apart_mid = mid != NULL && hi - lo > split && !any_single(s->cat);
        if (rc == 0 && apart_mid)
            *mid = (struct streamscan_middle){.pending = true,
                                              .lo = lo,
                                              .hi = hi,
                                              .base = base,
                                              .drop = part == CPUSCAN_BOUNDED ? s->plan->unbounded
                                                                              : NULL};
        else if (rc == 0)
            rc = middle(s, buf, len, lo, hi, base, part, &raw);
        lap(&ns_middle, &t);
        if (rc == 0)
            rc = tail(s, &l, buf, ew, pos_of(s) + e, told_end, apart, part, &raw);
        lap(&ns_tail, &t);
    }
    if (rc != 0) {
        scan_hits_finish(&raw);
        if (mid != NULL)
            *mid = (struct streamscan_middle){0};
        return rc;
    }
    hist_push(s, &v, e);
    if (e > 0)
        s->prev = (uint8_t)(catalog_byte_kind(vbyte(&v, e - 1)) + 1);
    s->total += len;
    s->held = e < m;
    s->told = (uint8_t)told_end;
    if (apart_mid) {
        atomic_fetch_add(&n_split, 1);
        mid->raw = raw;
        return 0;
    }
    rc = deliver(s, &raw, out);
    lap(&ns_deliver, &t);
    return rc;
}

int streamscan_write(struct streamscan *s, const uint8_t *buf, size_t len, struct scan_hits *out)
{
    return write_split(s, buf, len, 0, out, NULL);
}

/* The bytes a split write's tail walk reads: the rebuilt states' last
 * maxlen + 1 bytes, the factor ends before the last byte (two lookbacks: a
 * gated group's and its factors'), the history, the final '\n'. */
static uint64_t split_tail(const struct streamscan *s)
{
    uint64_t lb;
    fast_part(s, &lb);
    return 2 * lb + layout_of(s->cat).hist + 130;
}

/* The bytes of a write of `len` that a split write reads at its end: all
 * of them where the catalog's unbounded groups walk the whole write. */
static size_t split_read(const struct streamscan *s, size_t len)
{
    uint64_t lb;
    if (fast_part(s, &lb) == CPUSCAN_BOUNDED)
        return len;
    uint64_t t = split_tail(s);
    return t < len ? (size_t)t : len;
}

bool streamscan_split_plan(struct streamscan *s, size_t len, uint8_t last, size_t min_middle,
                           size_t *head, size_t *tail)
{
    if (s->closed || len == 0 || any_single(s->cat))
        return false;
    plan_once(s);
    uint64_t lb;
    if (fast_part(s, &lb) == CPUSCAN_BOUNDED && len > STREAMSCAN_WHOLE_READ_MAX)
        return false; /* read whole: in chunks, each a write of its own */
    size_t m = len + (s->held ? 1 : 0);
    size_t e = last == '\n' ? m - 1 : m;
    size_t h = head_of(s, e);
    if (h == 0)
        return false;
    size_t held = s->held, lo = h - held - 1, hi = e - held - 1;
    if (hi - lo <= min_middle)
        return false;
    /* the head: v[0..h] (gated_head's lookahead byte) */
    *head = h + 2 < len ? h + 2 : len;
    *tail = split_read(s, len);
    return true;
}

size_t streamscan_split_tail(struct streamscan *s, size_t len)
{
    if (s->closed || len == 0 || any_single(s->cat))
        return 0;
    plan_once(s);
    uint64_t lb;
    enum cpuscan_groups part = fast_part(s, &lb);
    if (lb == CPUSCAN_UNSEGMENTABLE || (part == CPUSCAN_BOUNDED && len > STREAMSCAN_WHOLE_READ_MAX))
        return 0;
    return split_read(s, len);
}

bool streamscan_fast(struct streamscan *s)
{
    if (s->closed)
        return false;
    plan_once(s);
    uint64_t lb;
    fast_part(s, &lb);
    return lb != CPUSCAN_UNSEGMENTABLE;
}

size_t streamscan_split_cost(const struct streamscan *s, size_t len, size_t min_middle)
{
    if (s->closed || any_single(s->cat) || len <= min_middle)
        return len;
    uint64_t lb = cpuscan_lookback(s->cat);
    if (lb == CPUSCAN_UNSEGMENTABLE)
        return len;
    uint64_t c =
        lb + 5 + split_tail(s); /* streamscan_split_plan's head (held: 1 at most) and tail */
    return c < len ? (size_t)c : len;
}

int streamscan_write_begin(struct streamscan *s, const uint8_t *buf, size_t len, size_t min_middle,
                           struct scan_hits *out, struct streamscan_middle *mid)
{
    return write_split(s, buf, len, min_middle, out, mid);
}

int streamscan_middle_add(struct streamscan_middle *mid, uint32_t rule, uint64_t end)
{
    if (end <= mid->lo || end > mid->hi || (mid->drop != NULL && mid->drop[rule]))
        return 0; /* outside the middle, or found by the walk of the unbounded groups */
    return scan_hits_push(&mid->raw, rule, mid->base + end, 1);
}

int streamscan_middle_run(struct streamscan *s, const uint8_t *buf, size_t len,
                          struct streamscan_middle *mid)
{
    return middle(s, buf, len, mid->lo, mid->hi, mid->base,
                  mid->drop != NULL ? CPUSCAN_BOUNDED : CPUSCAN_ALL, &mid->raw);
}

int streamscan_write_end(struct streamscan *s, struct streamscan_middle *mid, struct scan_hits *out)
{
    mid->pending = false;
    return deliver(s, &mid->raw, out);
}

void streamscan_middle_finish(struct streamscan_middle *mid)
{
    scan_hits_finish(&mid->raw);
    *mid = (struct streamscan_middle){0};
}

int streamscan_close(struct streamscan *s, struct scan_hits *out)
{
    if (s->closed)
        return -EPIPE;
    s->closed = true;
    struct scan_hits raw = {.max = refscan_raw_max()}; /* a hit bomb: -E2BIG */
    plan_once(s);
    struct layout l = layout_of(s->cat);
    bool lits = false;
    int rc = 0;
    for (uint32_t g = 0; g < catalog_group_count(s->cat) && rc == 0; g++) {
        if (by_lit(s, g, l.hist))
            lits = true;
        else
            rc = dfa_close(s, g, &raw);
    }
    /* a held final '\n' may end a string: it is consumed now */
    struct vbuf nl = {NULL, 0, true};
    if (rc == 0 && lits && s->held)
        rc = lit_write(s, &l, &nl, 1, &raw);
    if (rc == 0)
        rc = nfa_all(s, NULL, 0, 0, false, CPUSCAN_ALL, &raw);
    if (rc != 0) {
        scan_hits_finish(&raw);
        return rc;
    }
    return deliver(s, &raw, out);
}
