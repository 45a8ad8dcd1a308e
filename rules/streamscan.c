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
 * The bit-NFA step and range tests are copies of rules/refscan.c's (static
 * there; that file is the definition and is not changed for streams).
 */
#include "streamscan.h"
#include "nfastep.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define KIND_ALL                                                                       \
    ((1u << CAT_K_WORD) | (1u << CAT_K_NL) | (1u << CAT_K_OTHER) | (1u << CAT_K_EOD) | \
     (1u << CAT_K_NL_LAST))
#define KIND_NL_ANY ((1u << CAT_K_NL) | (1u << CAT_K_NL_LAST))

struct streamscan {
    const struct catalog *cat;
    uint32_t n_groups, n_nfas, n_rules;
    uint64_t total; /* bytes written */
    uint64_t pos;   /* first position not consumed: total, or total - 1 when held */
    uint32_t prev;  /* kind of the byte before pos: P_BOS 0, P_WORD 1, P_NL 2, P_OTHER 3 */
    uint32_t told;  /* lookahead kinds the check at pos assumed; 0: not checked yet */
    bool held;      /* the byte at pos is a '\n', the last byte written */
    bool closed;
    uint32_t *dfa;     /* n_groups states */
    uint32_t *nfa;     /* the bit-NFA state vectors, vector j at nfa_off[j] */
    uint32_t *nfa_off; /* n_nfas + 1 */
    uint32_t *tmp;     /* one state vector of the largest bit-NFA group */
    uint8_t *single;   /* n_rules bits: the rule is single-match */
    uint8_t *done;     /* n_rules bits: its match was reported */
};

struct layout {
    size_t dfa, nfa, nfa_off, tmp, single, done, total;
};

static size_t align8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

static struct layout layout_of(const struct catalog *cat)
{
    struct layout l;
    uint32_t words = 0, max_words = 0, bits = (catalog_rule_count(cat) + 7) / 8;
    for (uint32_t j = 0; j < catalog_nfa_count(cat); j++) {
        struct catalog_nfa g;
        catalog_nfa(cat, j, &g);
        words += g.n_words;
        max_words = g.n_words > max_words ? g.n_words : max_words;
    }
    l.dfa = align8(sizeof(struct streamscan));
    l.nfa = l.dfa + align8((size_t)catalog_group_count(cat) * 4);
    l.nfa_off = l.nfa + align8((size_t)words * 4);
    l.tmp = l.nfa_off + align8(((size_t)catalog_nfa_count(cat) + 1) * 4);
    l.single = l.tmp + align8((size_t)max_words * 4);
    l.done = l.single + align8(bits);
    l.total = l.done + align8(bits);
    return l;
}

size_t streamscan_size(const struct catalog *cat)
{
    return layout_of(cat).total;
}

int streamscan_create(const struct catalog *cat, struct streamscan **out)
{
    struct layout l = layout_of(cat);
    uint8_t *mem = calloc(1, l.total);
    if (mem == NULL)
        return -ENOMEM;
    struct streamscan *s = (struct streamscan *)mem;
    s->cat = cat;
    s->n_groups = catalog_group_count(cat);
    s->n_nfas = catalog_nfa_count(cat);
    s->n_rules = catalog_rule_count(cat);
    s->dfa = (uint32_t *)(mem + l.dfa);
    s->nfa = (uint32_t *)(mem + l.nfa);
    s->nfa_off = (uint32_t *)(mem + l.nfa_off);
    s->tmp = (uint32_t *)(mem + l.tmp);
    s->single = mem + l.single;
    s->done = mem + l.done;
    for (uint32_t i = 0; i < s->n_groups; i++) {
        struct catalog_group g;
        catalog_group(cat, i, &g);
        s->dfa[i] = g.start[0];
    }
    for (uint32_t j = 0; j < s->n_nfas; j++) {
        struct catalog_nfa g;
        catalog_nfa(cat, j, &g);
        s->nfa_off[j + 1] = s->nfa_off[j] + g.n_words;
    }
    for (uint32_t r = 0; r < s->n_rules; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        if (cr.flags & RULE_F_SINGLEMATCH)
            s->single[r / 8] |= (uint8_t)(1u << (r % 8));
    }
    *out = s;
    return 0;
}

void streamscan_destroy(struct streamscan *s)
{
    free(s);
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

/* Walks DFA group `gi` over v[0..e) and checks position e with `told_end`. */
static int dfa_write(struct streamscan *s, uint32_t gi, const struct vbuf *v, size_t e,
                     uint32_t told_end, struct scan_hits *raw)
{
    struct catalog_group g;
    catalog_group(s->cat, gi, &g);
    uint32_t st = s->dfa[gi];
    int rc = 0;
    for (size_t j = 0; j < e && rc == 0; j++) {
        uint8_t c = vbyte(v, j);
        if (st >= g.first_accept)
            rc = dfa_check(&g, st, 1u << catalog_byte_kind(c), j ? 0 : s->told, s->pos + j, raw);
        st = g.trans[(size_t)st * g.n_classes + g.classmap[c]];
    }
    if (rc == 0)
        rc = dfa_check(&g, st, told_end, e ? 0 : s->told, s->pos + e, raw);
    s->dfa[gi] = st;
    return rc;
}

static int dfa_close(struct streamscan *s, uint32_t gi, struct scan_hits *raw)
{
    struct catalog_group g;
    catalog_group(s->cat, gi, &g);
    uint32_t st = s->dfa[gi];
    if (!s->held)
        return dfa_check(&g, st, 1u << CAT_K_EOD, s->told, s->pos, raw);
    int rc = dfa_check(&g, st, 1u << CAT_K_NL_LAST, s->told, s->pos, raw);
    st = g.trans[(size_t)st * g.n_classes + g.classmap['\n']];
    return rc ? rc : dfa_check(&g, st, 1u << CAT_K_EOD, 0, s->pos + 1, raw);
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

/* Loads bit-NFA group j's carried state into `a` (span computed) and an
 * empty `b` over the scratch vector. */
static void nfa_load(struct streamscan *s, uint32_t j, const struct catalog_nfa *g, struct nvec *a,
                     struct nvec *b)
{
    *a = (struct nvec){s->nfa + s->nfa_off[j], 1, 0};
    for (uint32_t w = 0; w < g->n_words; w++) {
        if (a->v[w] == 0)
            continue;
        if (a->lo > a->hi)
            a->lo = w;
        a->hi = w;
    }
    memset(s->tmp, 0, (size_t)g->n_words * sizeof(uint32_t));
    *b = (struct nvec){s->tmp, 1, 0};
}

static void nfa_store(struct streamscan *s, uint32_t j, const struct catalog_nfa *g,
                      const struct nvec *cur)
{
    uint32_t *home = s->nfa + s->nfa_off[j];
    if (cur->v != home)
        memcpy(home, cur->v, (size_t)g->n_words * sizeof(uint32_t));
}

static int nfa_write(struct streamscan *s, uint32_t j, const struct vbuf *v, size_t e,
                     uint32_t told_end, struct scan_hits *raw)
{
    struct catalog_nfa g;
    catalog_nfa(s->cat, j, &g);
    struct nvec a, b, *cur = &a, *nxt = &b;
    nfa_load(s, j, &g, &a, &b);
    uint32_t p = s->prev;
    int rc = 0;
    for (size_t i = 0; i < e && rc == 0; i++) {
        uint8_t c = vbyte(v, i);
        uint32_t k = catalog_byte_kind(c);
        rc = nfa_check(&g, cur, p, 1u << k, i ? 0 : s->told, s->pos + i, raw);
        nfa_step(&g, cur, nxt, CAT_PK(p, k), c);
        struct nvec *x = cur;
        cur = nxt;
        nxt = x;
        p = k + 1; /* CAT_K_WORD, NL, OTHER -> P_WORD, P_NL, P_OTHER */
    }
    if (rc == 0)
        rc = nfa_check(&g, cur, p, told_end, e ? 0 : s->told, s->pos + e, raw);
    nfa_store(s, j, &g, cur);
    return rc;
}

static int nfa_close(struct streamscan *s, uint32_t j, struct scan_hits *raw)
{
    struct catalog_nfa g;
    catalog_nfa(s->cat, j, &g);
    struct nvec a, b;
    nfa_load(s, j, &g, &a, &b);
    if (!s->held)
        return nfa_check(&g, &a, s->prev, 1u << CAT_K_EOD, s->told, s->pos, raw);
    int rc = nfa_check(&g, &a, s->prev, 1u << CAT_K_NL_LAST, s->told, s->pos, raw);
    nfa_step(&g, &a, &b, CAT_PK(s->prev, CAT_K_NL_LAST), '\n');
    return rc ? rc : nfa_check(&g, &b, 2 /* P_NL */, 1u << CAT_K_EOD, 0, s->pos + 1, raw);
}

/* ---- writes --------------------------------------------------------------- */

static bool bit(const uint8_t *set, uint32_t r)
{
    return (set[r / 8] >> (r % 8)) & 1u;
}

/* Sorts and deduplicates this call's raw matches, drops single-match rules
 * already reported earlier in the stream, and appends the rest to `out`. */
static int deliver(struct streamscan *s, struct scan_hits *raw, struct scan_hits *out)
{
    scan_hits_finalize(raw, s->cat, SCAN_ALL);
    int rc = 0;
    for (size_t i = 0; i < raw->n && rc == 0; i++) {
        uint32_t r = raw->v[i].rule;
        if (bit(s->single, r)) {
            if (bit(s->done, r))
                continue;
            s->done[r / 8] |= (uint8_t)(1u << (r % 8));
        }
        rc = scan_hits_push(out, r, raw->v[i].end, 1);
    }
    scan_hits_finish(raw);
    return rc;
}

int streamscan_write(struct streamscan *s, const uint8_t *buf, size_t len, struct scan_hits *out)
{
    if (s->closed)
        return -EPIPE;
    if (len == 0)
        return 0;
    struct vbuf v = {buf, len, s->held};
    size_t m = len + (s->held ? 1 : 0);
    /* a final '\n' waits: whether it is the last byte of the data matters */
    size_t e = buf[len - 1] == '\n' ? m - 1 : m;
    uint32_t told_end = e == m ? KIND_ALL : KIND_NL_ANY;
    struct scan_hits raw = {0};
    int rc = 0;
    for (uint32_t g = 0; g < s->n_groups && rc == 0; g++)
        rc = dfa_write(s, g, &v, e, told_end, &raw);
    for (uint32_t j = 0; j < s->n_nfas && rc == 0; j++)
        rc = nfa_write(s, j, &v, e, told_end, &raw);
    if (rc != 0) {
        scan_hits_finish(&raw);
        return rc;
    }
    if (e > 0)
        s->prev = catalog_byte_kind(vbyte(&v, e - 1)) + 1;
    s->pos += e;
    s->total += len;
    s->held = e < m;
    s->told = told_end;
    return deliver(s, &raw, out);
}

int streamscan_close(struct streamscan *s, struct scan_hits *out)
{
    if (s->closed)
        return -EPIPE;
    s->closed = true;
    struct scan_hits raw = {0};
    int rc = 0;
    for (uint32_t g = 0; g < s->n_groups && rc == 0; g++)
        rc = dfa_close(s, g, &raw);
    for (uint32_t j = 0; j < s->n_nfas && rc == 0; j++)
        rc = nfa_close(s, j, &raw);
    if (rc != 0) {
        scan_hits_finish(&raw);
        return rc;
    }
    return deliver(s, &raw, out);
}
