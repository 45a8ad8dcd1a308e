/*
 * Segment scans and their merge for the CPU engine (cpuscan.h). The walks
 * are refscan's (refscan_nfa_range, the gate) or the same DFA walk with the
 * accept check out of the byte loop (dfa_range); the plan (cpuplan.h)
 * decides which groups are walked where, and this file what to keep.
 */
#include "cpuscan.h"

#include <errno.h>

#include "cpuplan.h"
#include <stdlib.h>
#include <string.h>

#define NONE UINT64_MAX

/* cpuscan_counters */
static _Atomic uint64_t n_pieces, n_fixes, n_whole, n_lanes;

/* What one segment saw of one rule: a slot of the scratch's hash table
 * (memory follows the rules a segment touches, not the catalog's size). */
struct rstate {
    uint32_t key;   /* rule + 1; 0: empty */
    uint32_t count; /* SCAN_COUNT */
    uint64_t first; /* first end */
    uint64_t last;  /* last end: a duplicate (rule, end) pair is skipped */
};

struct cpuscan_scratch {
    bool ready;                 /* `single` is for the catalog with this */
    uint8_t fp[CATALOG_FP_LEN]; /* fingerprint (a freed catalog's address may */
    uint32_t n_rules;           /* come back for another one) */
    uint8_t *single;            /* per rule: RULE_F_SINGLEMATCH */
    uint8_t *shared;            /* per rule: the report index of several rules */
    struct scan_hits counted;   /* SCAN_COUNT: shared rules' ends, deduplicated last */
    struct rstate *tab;         /* open addressing, cap a power of two */
    uint32_t cap;
    uint32_t *used; /* slots in use, n_used of them */
    uint32_t n_used;
    struct cpuplan *plan; /* the catalog's (cpuplan.h), referenced */
    /* the catalog's, found once (scratch_prepare): cpuscan_lookback,
     * bounded_lookback, walkable with the plan */
    uint64_t lb_all, lb_bounded;
    bool walk_ok;
};

/* Whether refscan's range walks (refscan_group_range, refscan_nfa_range)
 * cover every group of the catalog: DFA and bit-NFA groups with the flags
 * this file knows. Anything else goes through refscan_buffer, whole
 * buffers, so group kinds added there keep working. Forward-confirmed
 * groups (unbounded: whole buffers either way) are walked here around the
 * catalog's factor ends as refscan_buffer walks them, so that the other
 * groups get the plan's fast paths, once the plan is known (`plan` not
 * NULL: cpuscan_lookback asks before). */
static bool walkable(const struct catalog *cat, const struct cpuplan *plan)
{
    for (uint32_t g = 0; g < catalog_group_count(cat); g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        if ((cg.flags & ~(CAT_GF_ASSERTS | CAT_GF_FACTOR | CAT_GF_LITERAL)) != 0)
            return false; /* literal groups: the plan's matcher (always LIT) */
    }
    for (uint32_t g = 0; g < catalog_nfa_count(cat); g++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, g, &cn);
        if ((cn.flags & ~(CAT_GF_ASSERTS | CAT_GF_GATED | CAT_GF_CONFIRM)) != 0)
            return false;
        if ((cn.flags & CAT_GF_CONFIRM) && plan == NULL)
            return false;
    }
    return true;
}

uint64_t cpuscan_lookback(const struct catalog *cat)
{
    if (!walkable(cat, NULL))
        return CPUSCAN_UNSEGMENTABLE;
    uint64_t lb = 0;
    for (uint32_t g = 0; g < catalog_group_count(cat); g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        if (cg.maxlen == CATALOG_UNBOUNDED)
            return CPUSCAN_UNSEGMENTABLE;
        lb = cg.maxlen > lb ? cg.maxlen : lb;
    }
    for (uint32_t g = 0; g < catalog_nfa_count(cat); g++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, g, &cn);
        if (cn.maxlen == CATALOG_UNBOUNDED)
            return CPUSCAN_UNSEGMENTABLE;
        lb = cn.maxlen > lb ? cn.maxlen : lb;
    }
    return lb;
}

uint32_t cpuscan_group_maxlen(const struct catalog *cat, uint32_t g)
{
    uint32_t nd = catalog_group_count(cat);
    if (g < nd) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        return cg.maxlen;
    }
    struct catalog_nfa cn;
    catalog_nfa(cat, g - nd, &cn);
    return cn.maxlen;
}

/* Whether group g is among the groups a split part walks: the unbounded
 * ones (CPUSCAN_UNBOUNDED) or the rest (CPUSCAN_BOUNDED). */
static bool group_in(const struct catalog *cat, enum cpuscan_groups groups, uint32_t g)
{
    return groups == CPUSCAN_ALL ||
           (cpuscan_group_maxlen(cat, g) == CATALOG_UNBOUNDED) == (groups == CPUSCAN_UNBOUNDED);
}

/* The lookback of the bounded groups of a catalog whose groups the range
 * walks know, and whether one of them reports (*bounded); else
 * CPUSCAN_UNSEGMENTABLE. A pass over the groups only. */
static uint64_t bounded_lookback(const struct catalog *cat, bool *bounded)
{
    uint32_t nd = catalog_group_count(cat), nn = catalog_nfa_count(cat);
    uint64_t lb = 0;
    *bounded = false;
    for (uint32_t g = 0; g < nd; g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        if ((cg.flags & ~(CAT_GF_ASSERTS | CAT_GF_FACTOR | CAT_GF_LITERAL)) != 0)
            return CPUSCAN_UNSEGMENTABLE;
        if (cg.maxlen != CATALOG_UNBOUNDED) {
            lb = cg.maxlen > lb ? cg.maxlen : lb;
            *bounded |= !(cg.flags & CAT_GF_FACTOR);
        }
    }
    for (uint32_t g = 0; g < nn; g++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, g, &cn);
        if ((cn.flags & ~(CAT_GF_ASSERTS | CAT_GF_GATED | CAT_GF_CONFIRM)) != 0)
            return CPUSCAN_UNSEGMENTABLE;
        if (cn.maxlen != CATALOG_UNBOUNDED) {
            lb = cn.maxlen > lb ? cn.maxlen : lb;
            *bounded = true;
        }
    }
    return lb;
}

uint64_t cpuscan_split_lookback(const struct catalog *cat)
{
    uint32_t nr = catalog_rule_count(cat);
    bool bounded;
    uint64_t lb = bounded_lookback(cat, &bounded);
    if (lb == CPUSCAN_UNSEGMENTABLE || !bounded || nr == 0)
        return CPUSCAN_UNSEGMENTABLE;
    /* every report index in one part: a shared id's ends are counted once
     * only within a part (count_shared) */
    uint32_t *report = malloc((size_t)nr * sizeof(*report));
    uint8_t *part = calloc(nr, 1); /* per report index: 1 bounded, 2 unbounded */
    bool ok = report != NULL && part != NULL && catalog_report_indexes(cat, report) == 0;
    for (uint32_t r = 0; ok && r < nr; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        uint8_t p = cpuscan_group_maxlen(cat, cr.group) == CATALOG_UNBOUNDED ? 2 : 1;
        ok = part[report[r]] == 0 || part[report[r]] == p;
        part[report[r]] = p;
    }
    free(report);
    free(part);
    return ok ? lb : CPUSCAN_UNSEGMENTABLE;
}

int cpuscan_scratch_create(struct cpuscan_scratch **out)
{
    *out = calloc(1, sizeof(**out));
    return *out != NULL ? 0 : -ENOMEM;
}

void cpuscan_scratch_destroy(struct cpuscan_scratch *s)
{
    if (s == NULL)
        return;
    free(s->single);
    free(s->shared);
    scan_hits_finish(&s->counted);
    free(s->tab);
    free(s->used);
    cpuplan_put(s->plan);
    free(s);
}

static int scratch_prepare(struct cpuscan_scratch *s, const struct catalog *cat)
{
    uint32_t n = catalog_rule_count(cat);
    const uint8_t *fp = catalog_fingerprint(cat);
    if (s->ready && s->n_rules == n && memcmp(s->fp, fp, CATALOG_FP_LEN) == 0)
        return 0;
    s->ready = false;
    cpuplan_put(s->plan);
    s->plan = NULL;
    int rc = cpuplan_get(cat, &s->plan);
    if (rc != 0)
        return rc;
    free(s->single);
    free(s->shared);
    s->single = malloc(n ? n : 1);
    s->shared = calloc(n ? n : 1, 1);
    uint32_t *report = malloc((n ? n : 1) * sizeof(*report));
    rc = s->single != NULL && s->shared != NULL && report != NULL ? 0 : -ENOMEM;
    if (rc == 0)
        rc = catalog_report_indexes(cat, report);
    for (uint32_t r = 0; rc == 0 && r < n; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        s->single[r] = (cr.flags & RULE_F_SINGLEMATCH) != 0;
        s->shared[report[r]] |= report[r] != r;
    }
    free(report);
    if (rc != 0)
        return rc;
    bool any;
    s->lb_all = cpuscan_lookback(cat);
    s->lb_bounded = bounded_lookback(cat, &any);
    s->walk_ok = walkable(cat, s->plan);
    memcpy(s->fp, fp, CATALOG_FP_LEN);
    s->n_rules = n;
    s->ready = true;
    return 0;
}

static uint32_t slot_of(const struct rstate *tab, uint32_t cap, uint32_t rule)
{
    uint32_t h = (rule * 2654435761u) & (cap - 1);
    while (tab[h].key != 0 && tab[h].key != rule + 1)
        h = (h + 1) & (cap - 1);
    return h;
}

/* Doubles the table (at least 64 slots), keeping its entries. */
static int grow(struct cpuscan_scratch *s)
{
    uint32_t cap = s->cap ? 2 * s->cap : 64;
    struct rstate *tab = calloc(cap, sizeof(*tab));
    uint32_t *used = malloc(cap / 2 * sizeof(*used));
    if (tab == NULL || used == NULL) {
        free(tab);
        free(used);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < s->n_used; i++) {
        const struct rstate *x = &s->tab[s->used[i]];
        uint32_t h = slot_of(tab, cap, x->key - 1);
        tab[h] = *x;
        used[i] = h;
    }
    free(s->tab);
    free(s->used);
    s->tab = tab;
    s->used = used;
    s->cap = cap;
    return 0;
}

/* The rule's state in this segment, added when new; NULL without memory. */
static struct rstate *lookup(struct cpuscan_scratch *s, uint32_t rule)
{
    if (s->cap != 0) {
        uint32_t h = slot_of(s->tab, s->cap, rule);
        if (s->tab[h].key != 0)
            return &s->tab[h];
    }
    if ((s->n_used + 1) * 2 > s->cap && grow(s) != 0)
        return NULL;
    uint32_t h = slot_of(s->tab, s->cap, rule);
    s->tab[h] = (struct rstate){.key = rule + 1, .first = NONE, .last = NONE};
    s->used[s->n_used++] = h;
    return &s->tab[h];
}

static void scratch_reset(struct cpuscan_scratch *s)
{
    for (uint32_t i = 0; i < s->n_used; i++)
        s->tab[s->used[i]].key = 0;
    s->n_used = 0;
}

/* The state of one segment walk. */
struct walk {
    struct cpuscan_scratch *s;
    struct cpuscan_part *part;
    enum scan_mode mode;
    uint64_t limit; /* SCAN_ALL: 0 = none */
    uint64_t plain; /* hits in the part of rules without single-match */
    cpuscan_enough_fn enough;
    void *ctx;
    uint32_t since; /* plain hits since `enough` was last asked */
    bool full;      /* part holds `limit` such hits: keep only smaller (end, rule) */
    uint64_t thr_end;
    uint32_t thr_rule;
    const uint32_t *map; /* walking a plan's shadow: its rule -> the catalog's */
    enum cpuscan_groups groups;
};

/* SCAN_ALL with a limit: keeps the `limit` smallest hits of rules without
 * single-match, and every single-match rule's first hit (at most one per
 * rule: the merge needs each rule's first, which an earlier segment may
 * have, to decide which of them stays). */
static void trim(struct walk *w)
{
    struct cpuscan_part *p = w->part;
    const uint8_t *single = w->s->single;
    if (p->hits.n == 0)
        return;
    scan_hits_sort(p->hits.v, p->hits.n, false);
    size_t k = 0;
    uint64_t plain = 0;
    for (size_t i = 0; i < p->hits.n; i++) {
        struct scan_hit h = p->hits.v[i];
        if (k > 0 && p->hits.v[k - 1].rule == h.rule && p->hits.v[k - 1].end == h.end)
            continue; /* a shared id's end from two groups */
        if (!single[h.rule] && plain == w->limit) {
            p->dropped++;
            continue;
        }
        if (!single[h.rule]) {
            plain++;
            w->thr_end = h.end;
            w->thr_rule = h.rule;
        }
        p->hits.v[k++] = h;
    }
    p->hits.n = k;
    w->plain = plain;
    w->full = plain == w->limit;
}

static int on_match(void *ctx, uint32_t rule, uint64_t end)
{
    struct walk *w = ctx;
    struct cpuscan_scratch *s = w->s;
    if (w->map != NULL)
        rule = w->map[rule];
    if (rule >= s->n_rules)
        return 0;
    struct rstate *r = lookup(s, rule);
    if (r == NULL)
        return -ENOMEM;
    if (r->last == end)
        return 0; /* the same (rule, end) twice */
    r->last = end;
    /* a rule's walk reports its ends in order; rules sharing an id may be
     * walked in several groups, each in order, so ends may come back
     * lower and twice (not in a row): SCAN_ALL's duplicates go at the
     * sort, SCAN_COUNT's through `counted` */
    bool first = end < r->first;
    bool was_none = r->first == NONE;
    if (first)
        r->first = end;
    if (w->mode == SCAN_FIRST)
        return 0;
    if (w->mode == SCAN_COUNT) {
        if (s->shared[rule])
            return scan_hits_push(&s->counted, rule, end, 1);
        if (was_none || !s->single[rule])
            r->count++;
        return 0;
    }
    if (s->single[rule])
        return first ? scan_hits_push(&w->part->hits, rule, end, 1) : 0;
    if (w->full && (end > w->thr_end || (end == w->thr_end && rule > w->thr_rule))) {
        w->part->dropped++;
        return 0;
    }
    int rc = scan_hits_push(&w->part->hits, rule, end, 1);
    if (rc != 0)
        return rc;
    w->plain++;
    if (w->enough != NULL && ++w->since >= CPUSCAN_CHECK_EVERY && w->limit > 1) {
        w->since = 0;
        /* what this segment will keep at least, for the caller's sum */
        if (w->enough(w->ctx, w->plain < w->limit ? w->plain : w->limit)) {
            w->limit = 1;
            trim(w);
        }
    }
    if (w->limit > 0 && w->plain >= 2 * w->limit)
        trim(w);
    return 0;
}

/* The accepts of state s before byte i: refscan_group_range's check. */
static int accepts_at(const struct catalog_group *g, uint32_t s, const uint8_t *buf, size_t len,
                      size_t i, struct walk *w)
{
    uint32_t k = i >= len ? CAT_K_EOD : catalog_byte_kind(buf[i]);
    if (k == CAT_K_NL && i + 1 == len)
        k = CAT_K_NL_LAST;
    const uint32_t *a = g->accepts + g->accept_index[s - g->first_accept];
    const uint32_t *end = g->accepts + g->accept_index[s - g->first_accept + 1];
    for (; a < end; a++) {
        if (CAT_ACCEPT_MASK(*a) & (1u << k)) {
            int rc = on_match(w, CAT_ACCEPT_RULE(*a), i);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

/* dfa_range's skipping stops for the rest of a walk whose first SKIP_PROBE
 * runs of idle bytes averaged under SKIP_MIN_RUN bytes: then the checks
 * cost more than the steps they save. */
#define SKIP_PROBE   64u
#define SKIP_MIN_RUN 4u

/* Ranges shorter than this are walked as one lane. */
#define DFA_LANES_MIN 16384u

/* One step of one lane of dfa_lanes: the accepts before byte *i (ends past
 * lane_lo), then byte buf[*i]. */
static inline __attribute__((always_inline)) int
dfa_lane(const struct catalog_group *g, const uint32_t *trans, const uint32_t *cm, size_t nc,
         uint32_t fa, const uint8_t *buf, size_t len, uint32_t *s, size_t *i, uint64_t lane_lo,
         struct walk *w)
{
    int rc = 0;
    if (*s >= fa && *i > lane_lo)
        rc = accepts_at(g, *s, buf, len, *i, w);
    *s = trans[(size_t)*s * nc + cm[buf[*i]]];
    (*i)++;
    return rc;
}

/* Four lanes of a DFA group's walk interleaved in one loop, so that their
 * chains of dependent table loads overlap: lane k from state st[k] at byte
 * at[k], reporting ends in (llo[k], lhi[k]]; then each lane's rest alone.
 * st[k] is left the state at lhi[k]. */
static int walk_lanes(const struct catalog_group *g, const uint8_t *buf, size_t len, uint32_t st[4],
                      const size_t at[4], const uint64_t llo[4], const uint64_t lhi[4],
                      struct walk *w)
{
    const uint32_t *trans = g->trans, *cm = g->classmap;
    const size_t nc = g->n_classes;
    const uint32_t fa = g->first_accept;
    uint64_t steps = UINT64_MAX;
    for (int k = 0; k < 4; k++)
        steps = lhi[k] - at[k] < steps ? lhi[k] - at[k] : steps;
    uint32_t s0 = st[0], s1 = st[1], s2 = st[2], s3 = st[3];
    size_t i0 = at[0], i1 = at[1], i2 = at[2], i3 = at[3];
    int rc = 0;
    for (uint64_t n = 0; n < steps && rc == 0; n++) {
        rc = dfa_lane(g, trans, cm, nc, fa, buf, len, &s0, &i0, llo[0], w);
        rc = rc ? rc : dfa_lane(g, trans, cm, nc, fa, buf, len, &s1, &i1, llo[1], w);
        rc = rc ? rc : dfa_lane(g, trans, cm, nc, fa, buf, len, &s2, &i2, llo[2], w);
        rc = rc ? rc : dfa_lane(g, trans, cm, nc, fa, buf, len, &s3, &i3, llo[3], w);
    }
    st[0] = s0, st[1] = s1, st[2] = s2, st[3] = s3;
    size_t j4[4] = {i0, i1, i2, i3};
    for (int k = 0; k < 4 && rc == 0; k++) { /* each lane's rest, and its last end */
        uint32_t x = st[k];
        size_t j = j4[k];
        for (;;) {
            if (x >= fa && j > llo[k] && (rc = accepts_at(g, x, buf, len, j, w)) != 0)
                break;
            if (j >= lhi[k])
                break;
            x = trans[(size_t)x * nc + cm[buf[j++]]];
        }
        st[k] = x;
    }
    return rc;
}

/*
 * The table walk of dfa_range from state s at byte i, ends in (lo, hi]. A
 * long range of a bounded group is walked as four lanes of a quarter each
 * (walk_lanes); lane k > 0 starts MAXLEN bytes before its quarter in its
 * start state there, as a segment does. Ends come out of order across lanes, which on_match allows (the
 * part is sorted, counts and firsts do not depend on it).
 */
static int dfa_lanes(const struct catalog_group *g, const uint8_t *buf, size_t len, uint32_t s,
                     size_t i, uint64_t lo, uint64_t hi, struct walk *w, uint32_t *last)
{
    const uint32_t *trans = g->trans, *cm = g->classmap;
    const size_t nc = g->n_classes;
    const uint32_t fa = g->first_accept;
    uint64_t from = lo > i ? lo : i; /* the first end looked at, less one */
    if (g->maxlen != CATALOG_UNBOUNDED && hi - from >= DFA_LANES_MIN &&
        g->maxlen < (hi - from) / 8) {
        uint64_t q = (hi - from) / 4, llo[4], lhi[4];
        size_t at[4];
        uint32_t st[4];
        for (int k = 0; k < 4; k++) {
            llo[k] = k == 0 ? lo : from + k * q;
            lhi[k] = k == 3 ? hi : from + (k + 1) * q;
            at[k] = k == 0 ? i : (size_t)(llo[k] + 1 - g->maxlen);
            st[k] = k == 0 ? s : catalog_group_start(g, buf, at[k]);
        }
        return walk_lanes(g, buf, len, st, at, llo, lhi, w);
    }
    for (;;) {
        if (s >= fa && i > lo) {
            int rc = accepts_at(g, s, buf, len, i, w);
            if (rc != 0)
                return rc;
        }
        if (i >= hi) {
            if (last != NULL)
                *last = s;
            return 0;
        }
        do {
            s = trans[(size_t)s * nc + cm[buf[i++]]];
        } while (s < fa && i < hi);
    }
}

/* DFA group g's state at `a` walked from a start state `lookback` bytes
 * before: its true state there when the walk reaches back to the buffer's
 * start, else a guess that holds a subset of the true state's threads. */
static uint32_t dfa_guess(const struct catalog_group *g, const uint8_t *buf, size_t a,
                          uint64_t lookback)
{
    size_t i = a > lookback ? (size_t)(a - lookback) : 0;
    uint32_t st = catalog_group_start(g, buf, i);
    for (; i < a; i++)
        st = g->trans[(size_t)st * g->n_classes + g->classmap[buf[i]]];
    return st;
}

/* Where piece i's guessed state at its start was not the state the pieces
 * before it left, the true walk steps beside the guessed one until the two
 * agree, reporting the true state's ends on the way (a guess holds a subset
 * of the true threads, so the piece's own ends stand and these add to
 * them). Returns the true state at the piece's end. */
static int piece_repair(const struct catalog_group *g, const uint8_t *buf, size_t len, uint64_t lo,
                        uint64_t hi, uint32_t t, uint32_t guess, uint32_t end, struct walk *w,
                        uint32_t *out)
{
    const uint32_t *trans = g->trans, *cm = g->classmap;
    const size_t nc = g->n_classes;
    size_t j = (size_t)lo;
    int rc = 0;
    if (t != guess)
        n_fixes++;
    while (t != guess) {
        if (j > lo && t >= g->first_accept && (rc = accepts_at(g, t, buf, len, j, w)) != 0)
            return rc;
        if (j >= hi)
            break;
        uint32_t c = cm[buf[j++]];
        t = trans[(size_t)t * nc + c];
        guess = trans[(size_t)guess * nc + c];
    }
    *out = t == guess ? end : t;
    return 0;
}

/* An unbounded DFA group's piece (ends in (lo, hi]) from `st`, its state
 * at lo, as four lanes walked interleaved, so that their chains of
 * dependent table loads overlap (dfa_lanes does so for bounded groups):
 * lanes 1-3 start from guesses (dfa_guess), repaired after the walk as
 * the join repairs pieces. *last gets the state at hi. Used when each
 * lane is at least 4 lookbacks long (a guess walks one). */
static int dfa_spec_lanes(const struct catalog_group *g, const uint8_t *buf, size_t len,
                          uint32_t st, uint64_t lo, uint64_t hi, uint64_t lookback, struct walk *w,
                          uint32_t *last)
{
    uint64_t q = (hi - lo) / 4, llo[4], lhi[4];
    uint32_t guess[4];
    for (int k = 0; k < 4; k++) {
        llo[k] = lo + k * q;
        lhi[k] = k == 3 ? hi : lo + (k + 1) * q;
        guess[k] = k == 0 ? st : dfa_guess(g, buf, (size_t)llo[k], lookback);
    }
    uint32_t end[4] = {guess[0], guess[1], guess[2], guess[3]};
    size_t at[4] = {(size_t)llo[0], (size_t)llo[1], (size_t)llo[2], (size_t)llo[3]};
    int rc = walk_lanes(g, buf, len, end, at, llo, lhi, w);
    uint32_t t = end[0];
    for (int k = 1; k < 4 && rc == 0; k++)
        rc = piece_repair(g, buf, len, llo[k], lhi[k], t, guess[k], end[k], w, &t);
    n_lanes++;
    *last = t;
    return rc;
}

/* A DFA group's walk over buf[begin..hi), reporting ends in (lo, hi]: the
 * walk of refscan_group_range, with the accept check out of the byte loop
 * (accepting states are numbered from first_accept, and most bytes lead to
 * a state below it). With `k` on, a walk in a start state passes over the
 * run of idle bytes that follows without the transition table (a table
 * step waits for the one before: two dependent loads a byte; a skip step
 * does not) and goes on from the start state of the run's last byte.
 * Without skipping (or once it stops paying) the rest goes by dfa_lanes.
 * `last` (NULL: not wanted) gets the state at hi of an unbounded group's
 * walk (a bounded group's lanes leave it unset). With `spec` (a lookback;
 * 0: none) an unbounded group's rest is walked as speculative lanes
 * (dfa_spec_lanes) where they are long enough. */
static int dfa_range(const struct catalog_group *g, const struct cpuplan_skip *k,
                     const uint8_t *buf, size_t len, size_t begin, uint64_t lo, uint64_t hi,
                     struct walk *w, uint32_t *last, uint64_t spec)
{
    if (hi > len)
        hi = len;
    const uint32_t *trans = g->trans, *cm = g->classmap;
    const uint32_t nc = g->n_classes, fa = g->first_accept;
    uint32_t s = catalog_group_start(g, buf, begin);
    size_t i = begin, skipped = 0;
    uint32_t runs = 0;
    bool skip = k != NULL && k->on;
    for (;;) {
        if (!skip && spec != 0 && g->maxlen == CATALOG_UNBOUNDED &&
            (hi - (i > lo ? i : lo)) / 4 >= 4 * spec) { /* to lo, then lanes */
            while (i < lo)
                s = trans[(size_t)s * nc + cm[buf[i++]]];
            if (s >= fa && i > lo) {
                int rc = accepts_at(g, s, buf, len, i, w);
                if (rc != 0)
                    return rc;
            }
            return dfa_spec_lanes(g, buf, len, s, i, hi, spec, w, last);
        }
        if (!skip) /* the rest by the table: as lanes where it is long */
            return dfa_lanes(g, buf, len, s, i, lo, hi, w, last);
        if (s >= fa && i > lo) {
            int rc = accepts_at(g, s, buf, len, i, w);
            if (rc != 0)
                return rc;
        }
        if (i >= hi) {
            if (last != NULL)
                *last = s;
            return 0;
        }
        const uint32_t a = k->st[0], b = k->st[1], c = k->st[2];
        do {
            if ((s == a || s == b || s == c) && k->idle[buf[i]]) {
                size_t from = i;
                do
                    i++;
                while (i < hi && k->idle[buf[i]]);
                s = catalog_group_start(g, buf, i); /* i > begin: the run's last byte */
                skipped += i - from;
                if (++runs == SKIP_PROBE && skipped < SKIP_PROBE * SKIP_MIN_RUN)
                    skip = false; /* runs too short to pay (`[A-Za-z0-9._%+-]+@` in text) */
                if (i >= hi || !skip)
                    break;
            }
            s = trans[(size_t)s * nc + cm[buf[i++]]];
        } while (s < fa && i < hi);
    }
}

/* ---- fast paths (cpuplan.h) ---- */

/* A literal matcher's report: a rule of a literal group, or a factor end
 * of a window group. */
struct litwalk {
    struct walk *w;
    const struct cpuplan *plan;
    const uint8_t *buf;
    size_t len;
    struct second_memo *memo; /* per second factor; NULL until the first */
    struct refscan_gate *cands;
    uint64_t lo;
    size_t cap;                /* candidates kept at most */
    uint32_t ng;               /* engine groups */
    uint8_t *full;             /* per engine group: its factors came too often, it is
                                  walked in full (NULL until the first such group) */
    bool dense;                /* out of memory for `full`: window groups are walked in full */
    struct refscan_gate *gate; /* CPUPLAN_GATE ends (cpuplan.gate_merged), or NULL */
    const struct catalog *cat;
    size_t begin;     /* of the matchers' scan */
    uint32_t run_id;  /* the run entry being scanned (on_run) */
    uint64_t run_pts; /* and its points so far */
};

/* Drops the candidates of the groups marked in `full` (walked in full). */
static void drop_full(struct refscan_gate *c, const uint8_t *full)
{
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++)
        if (!full[c->v[i].nfa])
            c->v[k++] = c->v[i];
    c->n = k;
}

/* The candidates reached the cap: the groups with the most of them are
 * walked in full instead, their candidates dropped, until at most half
 * the cap is left. A group whose factor is everywhere (`ab` in text, a
 * pair of zero bytes in a binary) costs no more than before, and the
 * other groups keep their windows. */
static void shed_dense(struct litwalk *lw)
{
    uint32_t *count = calloc(lw->ng, sizeof(*count));
    if (lw->full == NULL)
        lw->full = calloc(lw->ng, 1);
    if (count == NULL || lw->full == NULL) {
        free(count);
        lw->dense = true;
        return;
    }
    struct refscan_gate *c = lw->cands;
    for (size_t i = 0; i < c->n; i++)
        count[c->v[i].nfa]++;
    while (c->n > lw->cap / 2) {
        uint32_t top = 0;
        for (uint32_t g = 1; g < lw->ng; g++)
            top = count[g] > count[top] ? g : top;
        lw->full[top] = 1;
        count[top] = 0;
        drop_full(c, lw->full);
    }
    free(count);
}

/* What the searches of one second factor found so far in this scan: no
 * string of it lies wholly inside [a, z) (when z > a), and one lies at
 * [hit, hit_end) (when hit_end > 0). Candidates come in increasing order
 * (per matcher), so each byte is searched about once per second factor,
 * however close the candidates: without it, a factor every few bytes made
 * each search cover twice the span again. */
struct second_memo {
    uint64_t a, z, hit, hit_end;
};

/* Whether a string of second factor `sf` lies within its span of `end`
 * (cpuplan.h struct cpuplan_second). */
static bool second_near(const struct cpuplan *p, const struct cpuplan_second *sf,
                        struct second_memo *mo, const uint8_t *buf, size_t len, uint64_t end)
{
    size_t a = end > sf->span ? (size_t)(end - sf->span) : 0;
    size_t z = end + sf->span < len ? (size_t)(end + sf->span) : len;
    if (mo->hit_end > 0 && mo->hit >= a && mo->hit_end <= z)
        return true;
    bool known = mo->z > mo->a && a >= mo->a && mo->z >= a; /* [a, mo->z) searched */
    for (uint32_t i = 0; i < sf->n; i++) {
        const struct cpuplan_sstr *x = &p->sec_str[sf->first + i];
        const uint8_t *b = p->sec_b + x->off, *m = p->sec_m + x->off;
        size_t from = a;
        if (known && mo->z + 1 > a + x->len)
            from = (size_t)mo->z + 1 - x->len; /* the first start not searched */
        for (size_t q = from; q + x->len <= z; q++) {
            if (m[0] == 0) { /* to the next exact first byte */
                const uint8_t *h = memchr(buf + q, b[0], z - x->len + 1 - q);
                if (h == NULL)
                    break;
                q = (size_t)(h - buf);
            } else if ((buf[q] | m[0]) != b[0]) {
                continue;
            }
            uint32_t k = 1;
            while (k < x->len && (buf[q + k] | m[k]) == b[k])
                k++;
            if (k == x->len) {
                mo->hit = q, mo->hit_end = q + x->len;
                return true;
            }
        }
    }
    mo->a = known ? mo->a : a;
    mo->z = z;
    return false;
}

static int on_literal(void *ctx, uint32_t id, uint64_t end)
{
    struct litwalk *lw = ctx;
    if (!(id & CPUPLAN_FACTOR))
        return end > lw->lo ? on_match(lw->w, id, end) : 0;
    uint32_t g = id & ~CPUPLAN_FACTOR;
    if (g & CPUPLAN_GATE) /* a gated group left FULL: its candidates */
        return lw->gate == NULL || refscan_gate_push(lw->gate, g & ~CPUPLAN_GATE, end) == 0
                   ? 0
                   : -ENOMEM;
    const struct cpuplan_second *sf = NULL;
    if (g & CPUPLAN_SECOND) {
        sf = &lw->plan->second[g & ~CPUPLAN_SECOND];
        g = sf->group;
    }
    if (lw->dense || (lw->full != NULL && lw->full[g]))
        return 0;     /* walked in full: no search for a second factor either */
    if (sf != NULL) { /* no second factor near: no match of its rule */
        if (lw->memo == NULL && (lw->memo = calloc(lw->plan->n_second, sizeof(*lw->memo))) == NULL)
            return -ENOMEM;
        if (!second_near(lw->plan, sf, &lw->memo[sf - lw->plan->second], lw->buf, lw->len, end))
            return 0;
    }
    if (lw->cands->n == lw->cap) {
        shed_dense(lw);
        if (lw->dense || lw->full[g])
            return 0;
    }
    return refscan_gate_push(lw->cands, g, end);
}

/* Class runs common in the data (hashes in a git log, a lockfile's
 * checksums): once a run entry's windows, 2 x MAXLEN about each point,
 * would cover more than the bytes it has looked at (past the first
 * CPURUN_DENSE_MIN), or the matcher gives up on its class
 * (CPURUN_GAVE_UP), its group is walked in full and the entry scans no
 * further: the run pass then costs a fraction of the data, not its
 * every byte on top of a walk that covers them all anyway. */
static int on_run(void *ctx, uint32_t id, uint64_t end)
{
    struct litwalk *lw = ctx;
    uint32_t g = id & ~CPUPLAN_FACTOR;
    if (lw->dense || (lw->full != NULL && lw->full[g]))
        return CPURUN_SKIP;
    if (id != lw->run_id) {
        lw->run_id = id;
        lw->run_pts = 0;
    }
    uint64_t seen = end == CPURUN_GAVE_UP ? UINT64_MAX : end - lw->begin;
    if (end == CPURUN_GAVE_UP ||
        (++lw->run_pts * 2 * (uint64_t)cpuscan_group_maxlen(lw->cat, g) > seen &&
         seen >= CPURUN_DENSE_MIN)) {
        if (lw->full == NULL && (lw->full = calloc(lw->ng, 1)) == NULL) {
            lw->dense = true;
            return CPURUN_SKIP;
        }
        lw->full[g] = 1;
        drop_full(lw->cands, lw->full);
        return CPURUN_SKIP;
    }
    return on_literal(ctx, id, end);
}

/* One window group's walks. */
struct winwalk {
    const struct catalog *cat;
    const struct cpuplan *plan;
    uint32_t g, maxlen;
    const uint8_t *buf;
    size_t len;
    struct walk *w;
};

static int on_window(void *ctx, uint64_t lo, uint64_t hi)
{
    const struct winwalk *x = ctx;
    size_t begin = lo + 1 > x->maxlen ? (size_t)(lo + 1 - x->maxlen) : 0;
    if (x->g >= x->plan->n_dfa)
        return refscan_nfa_range(x->cat, x->g - x->plan->n_dfa, x->buf, x->len, begin, lo, hi,
                                 on_match, x->w);
    struct catalog_group cg;
    catalog_group(x->cat, x->g, &cg);
    return dfa_range(&cg, &x->plan->skip[x->g], x->buf, x->len, begin, lo, hi, x->w, NULL, 0);
}

/* The window groups walked over the whole range: all of them, or those
 * marked in `only`. */
static int window_groups_full(const struct catalog *cat, const struct cpuplan *plan,
                              const uint8_t *buf, size_t len, size_t begin, uint64_t lo,
                              uint64_t hi, const uint8_t *only, struct walk *w)
{
    int rc = 0;
    for (uint32_t g = 0; g < plan->n_dfa + plan->n_nfa && rc == 0; g++) {
        if (plan->mode[g] != CPUPLAN_WINDOW || (only != NULL && !only[g]) ||
            !group_in(cat, w->groups, g))
            continue;
        if (g >= plan->n_dfa) {
            rc = refscan_nfa_range(cat, g - plan->n_dfa, buf, len, begin, lo, hi, on_match, w);
            continue;
        }
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        rc = dfa_range(&cg, &plan->skip[g], buf, len, begin, lo, hi, w, NULL, 0);
    }
    return rc;
}

/* The literal and window groups: one pass of each literal matcher, then
 * each window group's walks around its factors' ends. */
static int fast_groups(const struct catalog *cat, const struct cpuplan *plan, const uint8_t *buf,
                       size_t len, size_t begin, uint64_t lo, uint64_t hi,
                       struct refscan_gate *gate, struct walk *w)
{
    struct refscan_gate cands = {0};
    /* candidates cost 16 bytes: at most a quarter of the segment's size */
    size_t span = (hi < len ? (size_t)hi : len) - begin;
    struct litwalk lw = {.w = w,
                         .plan = plan,
                         .buf = buf,
                         .len = len,
                         .cands = &cands,
                         .lo = lo,
                         .cap = span / 64 > 4096 ? span / 64 : 4096,
                         .ng = plan->n_dfa + plan->n_nfa,
                         .gate = gate,
                         .cat = cat,
                         .begin = begin,
                         .run_id = UINT32_MAX};
    int rc = 0;
    if (plan->lit != NULL)
        rc = cpulit_scan(plan->lit, buf, len, begin, begin, hi, on_literal, &lw);
    if (rc == 0 && plan->pair != NULL && !lw.dense)
        rc = cpupair_scan(plan->pair, buf, len, begin, begin, hi, on_literal, &lw);
    if (rc == 0 && plan->run != NULL && !lw.dense)
        rc = cpurun_scan(plan->run, buf, len, begin, hi, on_run, &lw);
    free(lw.memo);
    if (rc == 0 && lw.dense) {
        refscan_gate_finish(&cands);
        free(lw.full);
        return window_groups_full(cat, plan, buf, len, begin, lo, hi, NULL, w);
    }
    if (rc == 0 && lw.full != NULL)
        rc = window_groups_full(cat, plan, buf, len, begin, lo, hi, lw.full, w);
    free(lw.full);
    if (rc == 0 && cands.n > 0)
        refscan_gate_sort(&cands);
    for (size_t a = 0; rc == 0 && a < cands.n;) {
        size_t z = a;
        while (z < cands.n && cands.v[z].nfa == cands.v[a].nfa)
            z++;
        uint32_t g = cands.v[a].nfa;
        if (!group_in(cat, w->groups, g)) {
            a = z;
            continue;
        }
        struct winwalk x = {cat, plan, g, cpuscan_group_maxlen(cat, g), buf, len, w};
        rc = refscan_gate_windows(x.maxlen, &cands.v[a].end, z - a,
                                  sizeof(struct refscan_cand) / sizeof(uint64_t), len, lo, hi,
                                  on_window, &x);
        a = z;
    }
    refscan_gate_finish(&cands);
    return rc;
}

/* Every group of `cat` but its CPUPLAN_SHADOW ones over the segment. */
static int walk_catalog(const struct catalog *cat, const struct cpuplan *plan, const uint8_t *buf,
                        size_t len, size_t begin, uint64_t lo, uint64_t hi, struct walk *w)
{
    /* gated bit-NFA groups left FULL are walked around the catalog's own
     * factor groups' ends */
    struct refscan_gate gate = {0};
    int rc = 0;
    const uint32_t *gated = plan->walks, *nfas = gated + plan->n_walk_gated,
                   *dfas = nfas + plan->n_walk_nfa;
    bool gated_full = false; /* such a group among the groups walked here */
    for (uint32_t i = 0; i < plan->n_walk_gated && !gated_full; i++)
        gated_full = group_in(cat, w->groups, plan->n_dfa + gated[i]);
    /* their candidates from the literal pass (whole buffers), which then
     * runs first, or from walking the factor groups */
    bool merged = gated_full && plan->gate_merged && w->groups == CPUSCAN_ALL;
    if (merged) {
        rc = fast_groups(cat, plan, buf, len, begin, lo, hi, &gate, w);
        if (rc == 0)
            refscan_gate_sort(&gate);
    } else if (gated_full) {
        /* a bounded part's gated groups need the factor ends within the
         * bounded groups' lookback of lo, not the catalog's (unbounded with
         * a confirmed group: every segment walked from the buffer's start,
         * quadratic in the buffer's size) */
        uint64_t lb = w->groups == CPUSCAN_BOUNDED ? w->s->lb_bounded : plan->gate_lb;
        rc = refscan_factor_ends_lb(cat, buf, len, lo, hi, plan->factor_walk, lb, &gate);
    }
    for (uint32_t i = 0; i < plan->n_walk_gated && gated_full && rc == 0; i++)
        if (group_in(cat, w->groups, plan->n_dfa + gated[i]))
            rc = refscan_gated_range(cat, gated[i], buf, len, lo, hi, &gate, on_match, w);
    refscan_gate_finish(&gate);
    /* the literal matchers serve literal groups and window groups, all
     * bounded: not run for the unbounded groups alone */
    if (rc == 0 && w->groups != CPUSCAN_UNBOUNDED && !merged)
        rc = fast_groups(cat, plan, buf, len, begin, lo, hi, NULL, w);
    for (uint32_t i = 0; i < plan->n_walk_nfa && rc == 0; i++)
        if (group_in(cat, w->groups, plan->n_dfa + nfas[i]))
            rc = refscan_nfa_range(cat, nfas[i], buf, len, begin, lo, hi, on_match, w);
    /* factor groups are not in the list: they found the candidates above
     * and report nothing */
    for (uint32_t i = 0; i < plan->n_walk_dfa && rc == 0; i++) {
        uint32_t g = dfas[i];
        if (!group_in(cat, w->groups, g))
            continue;
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        rc = dfa_range(&cg, &plan->skip[g], buf, len, begin, lo, hi, w, NULL, 0);
        /* dedup state is per group walk: a rule lives in one group */
    }
    return rc;
}

/* SCAN_COUNT: the ends of shared rules (reported by several groups, maybe
 * twice), each counted once. */
static int count_shared(struct cpuscan_scratch *s)
{
    struct scan_hits *c = &s->counted;
    if (c->n > 1)
        scan_hits_sort(c->v, c->n, true);
    for (size_t i = 0; i < c->n; i++) {
        if (i > 0 && c->v[i].rule == c->v[i - 1].rule && c->v[i].end == c->v[i - 1].end)
            continue;
        bool first = i == 0 || c->v[i].rule != c->v[i - 1].rule;
        struct rstate *r = lookup(s, c->v[i].rule); /* there: on_match added it */
        if (r == NULL)
            return -ENOMEM;
        if (first || !s->single[c->v[i].rule])
            r->count++;
    }
    return 0;
}

/* Sorts the part's hits from `base` by (end, rule), dropping repeats (a
 * shared id's end reported by two groups). */
static void sort_unique(struct cpuscan_part *part, size_t base)
{
    struct scan_hit *v = part->hits.v + base;
    size_t n = part->hits.n - base, k = 0;
    scan_hits_sort(v, n, false);
    for (size_t i = 0; i < n; i++)
        if (k == 0 || v[k - 1].rule != v[i].rule || v[k - 1].end != v[i].end)
            v[k++] = v[i];
    part->hits.n = base + k;
}

/* A walk's part in its mode, from what it saw since `base`: SCAN_FIRST
 * and SCAN_COUNT entries from the rules' states, SCAN_ALL's hits sorted,
 * unique and within the limit. The scratch is reset by the caller. */
static int walk_done(struct walk *w, size_t base)
{
    struct cpuscan_scratch *s = w->s;
    struct cpuscan_part *part = w->part;
    int rc = 0;
    if (w->mode == SCAN_COUNT)
        rc = count_shared(s);
    if (rc == 0 && w->mode != SCAN_ALL) {
        for (uint32_t i = 0; i < s->n_used && rc == 0; i++) {
            const struct rstate *r = &s->tab[s->used[i]];
            rc = scan_hits_push(&part->hits, r->key - 1, r->first,
                                w->mode == SCAN_COUNT ? r->count : 1);
        }
        if (rc == 0 && part->hits.n > base)
            scan_hits_sort(part->hits.v + base, part->hits.n - base, false);
    }
    if (rc == 0 && w->mode == SCAN_ALL) {
        if (w->limit > 0)
            trim(w);
        else if (part->hits.n > base)
            sort_unique(part, base);
        part->plain = 0;
        for (size_t i = base; i < part->hits.n; i++)
            part->plain += !s->single[part->hits.v[i].rule];
    }
    return rc;
}

int cpuscan_segment(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                    uint64_t hi, enum scan_mode mode, uint64_t limit, cpuscan_enough_fn enough,
                    void *ctx, struct cpuscan_scratch *s, struct cpuscan_part *part)
{
    return cpuscan_segment_groups(cat, CPUSCAN_ALL, buf, len, lo, hi, mode, limit, enough, ctx, s,
                                  part);
}

int cpuscan_segment_groups(const struct catalog *cat, enum cpuscan_groups groups,
                           const uint8_t *buf, size_t len, uint64_t lo, uint64_t hi,
                           enum scan_mode mode, uint64_t limit, cpuscan_enough_fn enough, void *ctx,
                           struct cpuscan_scratch *s, struct cpuscan_part *part)
{
    /* the parts of a split (the caller asked cpuscan_split_lookback, which
     * also checks the rules): the bounded groups' lookback, or whole
     * buffers for the unbounded ones */
    int rc = scratch_prepare(s, cat);
    if (rc != 0)
        return rc;
    uint64_t lb = groups == CPUSCAN_ALL       ? s->lb_all
                  : groups == CPUSCAN_BOUNDED ? s->lb_bounded
                                              : CPUSCAN_UNSEGMENTABLE;
    if (groups == CPUSCAN_BOUNDED && lb == CPUSCAN_UNSEGMENTABLE)
        return -EINVAL; /* a group kind only refscan_buffer scans */
    if (lb == CPUSCAN_UNSEGMENTABLE && (lo != 0 || hi < len))
        return -EINVAL; /* an unbounded match may start anywhere before lo */
    if (!s->walk_ok) {
        if (groups != CPUSCAN_ALL)
            return -EINVAL;
        /* refscan_buffer is the only walker for such catalogs: no limit
         * applies while it scans */
        part->final = true;
        return refscan_buffer_bounded(cat, buf, len, mode, &part->hits);
    }
    size_t base = part->hits.n;
    struct walk w = {.s = s,
                     .part = part,
                     .mode = mode,
                     .limit = mode == SCAN_ALL ? limit : 0,
                     .enough = enough,
                     .ctx = ctx,
                     .groups = groups};
    size_t begin = lb != CPUSCAN_UNSEGMENTABLE && lo > lb ? (size_t)(lo - lb) : 0;
    rc = walk_catalog(cat, s->plan, buf, len, begin, lo, hi, &w);
    /* the gated groups' rules, as DFAs: bounded ones */
    if (rc == 0 && s->plan->shadow != NULL && groups != CPUSCAN_UNBOUNDED) {
        w.map = s->plan->shadow_rule;
        rc = walk_catalog(s->plan->shadow, s->plan->shadow_plan, buf, len, begin, lo, hi, &w);
        w.map = NULL;
    }
    if (rc == 0)
        rc = walk_done(&w, base);
    s->counted.n = 0;
    scratch_reset(s);
    return rc < 0 ? rc : 0;
}

/* ---- a split buffer's unbounded groups in pieces ---------------------- */

void cpuscan_counters(struct cpuscan_counters *c)
{
    c->pieces = n_pieces;
    c->fixes = n_fixes;
    c->whole = n_whole;
    c->lanes = n_lanes;
}

/* The plan's FULL DFA groups that are unbounded: the groups whose states a
 * piece keeps, two each, in this order. */
static uint32_t piece_dfas(const struct catalog *cat, const struct cpuplan *plan,
                           const uint32_t **dfas)
{
    *dfas = plan->walks + plan->n_walk_gated + plan->n_walk_nfa;
    uint32_t n = 0;
    for (uint32_t i = 0; i < plan->n_walk_dfa; i++)
        n += group_in(cat, CPUSCAN_UNBOUNDED, (*dfas)[i]);
    return n;
}

/* cpulit_fn of gate_strings: a CPUPLAN_GATE string's end is a candidate of
 * its gated group; the matcher's other strings serve other walks. */
static int on_gate(void *ctx, uint32_t id, uint64_t end)
{
    uint32_t g = id & ~CPUPLAN_FACTOR;
    if (!(id & CPUPLAN_FACTOR) || !(g & CPUPLAN_GATE))
        return 0;
    return refscan_gate_push(ctx, g & ~CPUPLAN_GATE, end) == 0 ? 0 : -ENOMEM;
}

/* The gated groups' candidates with ends in (lo, hi], as walk_catalog's
 * merged path finds them (cpuplan.gate_merged: the factors are strings of
 * at most 64 bytes in the literal matcher; here a matcher of those strings
 * alone), or by walking the factor groups. Sorted. */
static int piece_gate(const struct catalog *cat, const struct cpuplan *plan, const uint8_t *buf,
                      size_t len, uint64_t lo, uint64_t hi, struct refscan_gate *gate)
{
    const struct cpulit *m = plan->gate_lit != NULL ? plan->gate_lit : plan->lit;
    if (!plan->gate_merged || m == NULL)
        return refscan_factor_ends_lb(cat, buf, len, lo, hi, plan->factor_walk, 0, gate);
    size_t begin = lo > 64 ? (size_t)(lo - 64) : 0;
    int rc = cpulit_scan(m, buf, len, begin, lo, hi, on_gate, gate);
    if (rc == 0)
        refscan_gate_sort(gate);
    return rc;
}

int cpuscan_unbounded_piece(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                            uint64_t hi, uint64_t lookback, size_t max_raw,
                            struct cpuscan_scratch *s, struct cpuscan_part *part)
{
    int rc = scratch_prepare(s, cat);
    if (rc != 0)
        return rc;
    if (!s->walk_ok || hi > len || lo > hi)
        return -EINVAL;
    const struct cpuplan *plan = s->plan;
    const uint32_t *gated = plan->walks, *nfas = gated + plan->n_walk_gated, *dfas;
    uint32_t nd = piece_dfas(cat, plan, &dfas);
    free(part->states);
    part->states = calloc(2 * (size_t)nd + 1, sizeof(*part->states));
    part->n_states = nd;
    if (part->states == NULL)
        return -ENOMEM;
    /* a hit bomb's piece stops: the join walks the buffer whole */
    part->hits.max = max_raw != 0 ? max_raw : refscan_raw_max();
    size_t base = part->hits.n;
    struct walk w = {.s = s, .part = part, .mode = SCAN_ALL, .groups = CPUSCAN_UNBOUNDED};
    /* forward-confirmed groups: the starts their factor ends in (lo, hi]
     * allow, each walk carried past hi until its state is empty (a match
     * found from two pieces' starts is reported twice; the join keeps one) */
    bool confirm = false;
    for (uint32_t i = 0; i < plan->n_walk_gated && !confirm; i++)
        confirm = group_in(cat, CPUSCAN_UNBOUNDED, plan->n_dfa + gated[i]);
    if (confirm) {
        struct refscan_gate gate = {0};
        rc = piece_gate(cat, plan, buf, len, lo, hi, &gate);
        for (uint32_t i = 0; i < plan->n_walk_gated && rc == 0; i++) {
            if (!group_in(cat, CPUSCAN_UNBOUNDED, plan->n_dfa + gated[i]))
                continue;
            struct catalog_nfa cn;
            catalog_nfa(cat, gated[i], &cn);
            rc = (cn.flags & CAT_GF_CONFIRM)
                     ? refscan_gated_range(cat, gated[i], buf, len, 0, len, &gate, on_match, &w)
                     : -ENOTSUP; /* windows need every candidate */
        }
        refscan_gate_finish(&gate);
    }
    /* unbounded bit-NFA groups without factors: walked whole by the first piece */
    for (uint32_t i = 0; i < plan->n_walk_nfa && rc == 0 && lo == 0; i++)
        if (group_in(cat, CPUSCAN_UNBOUNDED, plan->n_dfa + nfas[i]))
            rc = refscan_nfa_range(cat, nfas[i], buf, len, 0, 0, len, on_match, &w);
    /* unbounded DFA groups: from a guess of their state at lo */
    for (uint32_t i = 0, x = 0; i < plan->n_walk_dfa && rc == 0; i++) {
        uint32_t g = dfas[i];
        if (!group_in(cat, CPUSCAN_UNBOUNDED, g))
            continue;
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        size_t begin = lo > lookback ? (size_t)(lo - lookback) : 0;
        part->states[2 * x] = dfa_guess(&cg, buf, (size_t)lo, lookback);
        rc = dfa_range(&cg, &plan->skip[g], buf, len, begin, lo, hi, &w, &part->states[2 * x + 1],
                       lookback);
        x++;
    }
    if (rc == 0 && part->hits.n > base)
        sort_unique(part, base);
    n_pieces++;
    scratch_reset(s);
    return rc;
}

int cpuscan_unbounded_join(const struct catalog *cat, const uint8_t *buf, size_t len,
                           struct cpuscan_part *pieces, const uint64_t *lo, uint32_t k,
                           int piece_rc, enum scan_mode mode, uint64_t limit,
                           struct cpuscan_scratch *s, struct cpuscan_part *out)
{
    int rc = piece_rc;
    if (rc == 0)
        rc = scratch_prepare(s, cat);
    struct cpuscan_part raw = {0};
    raw.hits.max = refscan_raw_max();
    struct walk w = {.s = s, .part = &raw, .mode = SCAN_ALL, .groups = CPUSCAN_UNBOUNDED};
    const uint32_t *dfas = NULL;
    uint32_t nd = rc == 0 ? piece_dfas(cat, s->plan, &dfas) : 0;
    for (uint32_t i = 0; i < k && rc == 0; i++)
        rc = pieces[i].states != NULL && pieces[i].n_states == nd ? 0 : -EINVAL;
    for (uint32_t i = 0, x = 0; rc == 0 && k > 0 && i < s->plan->n_walk_dfa; i++) {
        if (!group_in(cat, CPUSCAN_UNBOUNDED, dfas[i]))
            continue;
        struct catalog_group cg;
        catalog_group(cat, dfas[i], &cg);
        uint32_t t = pieces[0].states[2 * x + 1];
        for (uint32_t p = 1; p < k && rc == 0; p++)
            rc = piece_repair(&cg, buf, len, lo[p], p + 1 < k ? lo[p + 1] : len, t,
                              pieces[p].states[2 * x], pieces[p].states[2 * x + 1], &w, &t);
        x++;
    }
    size_t total = raw.hits.n;
    for (uint32_t i = 0; i < k && rc == 0; i++)
        total += pieces[i].hits.n;
    struct scan_hit *v = rc == 0 && total > 0 ? malloc(total * sizeof(*v)) : NULL;
    if (rc == 0 && total > 0 && v == NULL)
        rc = -ENOMEM;
    if (rc == 0 && total > 0) {
        size_t n = raw.hits.n;
        if (n > 0)
            memcpy(v, raw.hits.v, n * sizeof(*v));
        for (uint32_t i = 0; i < k; i++) {
            if (pieces[i].hits.n > 0)
                memcpy(v + n, pieces[i].hits.v, pieces[i].hits.n * sizeof(*v));
            n += pieces[i].hits.n;
        }
        scan_hits_sort(v, total, false);
    }
    scratch_reset(s);
    cpuscan_part_finish(&raw);
    if (rc == -E2BIG || rc == -ENOTSUP) { /* a hit bomb, or a walk pieces do not know */
        free(v);
        n_whole++;
        return cpuscan_segment_groups(cat, CPUSCAN_UNBOUNDED, buf, len, 0, len, mode, limit, NULL,
                                      NULL, s, out);
    }
    /* the ends in (end, rule) order through the mode's walk, which keeps a
     * repeated (rule, end) once */
    size_t base = out->hits.n;
    struct walk m = {.s = s,
                     .part = out,
                     .mode = mode,
                     .limit = mode == SCAN_ALL ? limit : 0,
                     .groups = CPUSCAN_UNBOUNDED};
    for (size_t i = 0; i < total && rc == 0; i++)
        rc = on_match(&m, v[i].rule, v[i].end);
    if (rc == 0)
        rc = walk_done(&m, base);
    free(v);
    s->counted.n = 0;
    scratch_reset(s);
    return rc < 0 ? rc : 0;
}

int cpuscan_merge(const struct catalog *cat, enum scan_mode mode, struct cpuscan_part *parts,
                  size_t n, uint64_t budget, bool marker, struct scan_hits *out, uint64_t *dropped)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        total += parts[i].hits.n;
        *dropped += parts[i].dropped;
    }
    if (total == 0)
        return 0;
    struct scan_hit *v = malloc(total * sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (parts[i].hits.n > 0)
            memcpy(v + k, parts[i].hits.v, parts[i].hits.n * sizeof(*v));
        k += parts[i].hits.n;
    }
    /* SCAN_ALL without single-match rules: each part is sorted by (end,
     * rule) and unique (cpuscan_segment), and parts in segment order end in
     * ascending ranges, so the concatenation is the answer when it is in
     * order, as checked here; two sorts otherwise. A hit-dense buffer (1.4 M
     * hits in 4 MiB) spent 64% of its scan in those sorts. */
    bool ordered = mode == SCAN_ALL && !(catalog_rule_flags_any(cat) & RULE_F_SINGLEMATCH);
    for (size_t i = 1; ordered && i < total; i++)
        ordered =
            v[i - 1].end < v[i].end || (v[i - 1].end == v[i].end && v[i - 1].rule < v[i].rule);
    size_t m = ordered ? total : 0;
    /* by rule, then end: each rule's entries are one run, earliest first */
    if (!ordered)
        scan_hits_sort(v, total, true);
    for (size_t i = 0; i < total && !ordered; i++) {
        struct scan_hit x = v[i];
        bool same_rule = m > 0 && v[m - 1].rule == x.rule;
        if (same_rule && mode == SCAN_ALL && v[m - 1].end == x.end)
            continue;
        struct catalog_rule cr;
        catalog_rule(cat, x.rule, &cr);
        bool single = (cr.flags & RULE_F_SINGLEMATCH) != 0;
        if (same_rule && (single || mode == SCAN_FIRST))
            continue;
        if (same_rule && mode == SCAN_COUNT) {
            v[m - 1].count += x.count;
            continue;
        }
        v[m++] = x;
    }
    if (!ordered)
        scan_hits_sort(v, m, false);
    size_t keep = m < budget ? m : (size_t)budget;
    int rc = 0;
    for (size_t i = 0; i < keep && rc == 0; i++)
        rc = scan_hits_push(out, v[i].rule, v[i].end, v[i].count);
    if (rc == 0 && keep < m && marker)
        rc = scan_hits_push(out, v[keep].rule, v[keep].end, v[keep].count);
    *dropped += m - keep;
    free(v);
    return rc;
}

void cpuscan_part_finish(struct cpuscan_part *p)
{
    if (p == NULL)
        return;
    scan_hits_finish(&p->hits);
    free(p->states);
    p->states = NULL;
    p->n_states = 0;
    p->plain = p->dropped = 0;
    p->final = false;
}
