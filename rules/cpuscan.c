/*
 * Segment scans and their merge for the CPU engine (cpuscan.h). Every walk
 * is refscan_group_range's; this file only decides what to keep.
 */
#include "cpuscan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT64_MAX

struct cpuscan_scratch {
    bool ready;                 /* the arrays below are for the catalog with */
    uint8_t fp[CATALOG_FP_LEN]; /* this fingerprint (a freed catalog's address */
    uint32_t n_rules;           /* may come back for another one) */
    uint8_t *single;            /* per rule: RULE_F_SINGLEMATCH */
    uint64_t *first;            /* per rule: first end seen in this segment, NONE */
    uint64_t *last;             /* per rule: last end seen (duplicate (rule, end) pairs) */
    uint32_t *count;            /* per rule: SCAN_COUNT */
    uint32_t *touched;          /* rules whose entries above are set */
    uint32_t n_touched;
};

uint64_t cpuscan_lookback(const struct catalog *cat)
{
    if (catalog_nfa_count(cat) != 0)
        return CPUSCAN_UNSEGMENTABLE; /* refscan_buffer scans those; no range walk */
    uint64_t lb = 0;
    for (uint32_t g = 0; g < catalog_group_count(cat); g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        if (cg.maxlen == CATALOG_UNBOUNDED || (cg.flags & ~CAT_GF_ASSERTS) != 0)
            return CPUSCAN_UNSEGMENTABLE;
        if (cg.maxlen > lb)
            lb = cg.maxlen;
    }
    return lb;
}

int cpuscan_scratch_create(struct cpuscan_scratch **out)
{
    *out = calloc(1, sizeof(**out));
    return *out != NULL ? 0 : -ENOMEM;
}

static void scratch_free_arrays(struct cpuscan_scratch *s)
{
    free(s->single);
    free(s->first);
    free(s->last);
    free(s->count);
    free(s->touched);
    s->single = NULL;
    s->first = s->last = NULL;
    s->count = s->touched = NULL;
    s->ready = false;
    s->n_rules = 0;
}

void cpuscan_scratch_destroy(struct cpuscan_scratch *s)
{
    if (s == NULL)
        return;
    scratch_free_arrays(s);
    free(s);
}

static int scratch_prepare(struct cpuscan_scratch *s, const struct catalog *cat)
{
    uint32_t n = catalog_rule_count(cat);
    const uint8_t *fp = catalog_fingerprint(cat);
    if (s->ready && s->n_rules == n && memcmp(s->fp, fp, CATALOG_FP_LEN) == 0)
        return 0;
    scratch_free_arrays(s);
    size_t m = n ? n : 1;
    s->single = malloc(m);
    s->first = malloc(m * sizeof(*s->first));
    s->last = malloc(m * sizeof(*s->last));
    s->count = calloc(m, sizeof(*s->count));
    s->touched = malloc(m * sizeof(*s->touched));
    if (s->single == NULL || s->first == NULL || s->last == NULL || s->count == NULL ||
        s->touched == NULL) {
        scratch_free_arrays(s);
        return -ENOMEM;
    }
    for (uint32_t r = 0; r < n; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        s->single[r] = (cr.flags & RULE_F_SINGLEMATCH) != 0;
        s->first[r] = s->last[r] = NONE;
    }
    memcpy(s->fp, fp, CATALOG_FP_LEN);
    s->ready = true;
    s->n_rules = n;
    s->n_touched = 0;
    return 0;
}

static void scratch_reset(struct cpuscan_scratch *s)
{
    for (uint32_t i = 0; i < s->n_touched; i++) {
        uint32_t r = s->touched[i];
        s->first[r] = s->last[r] = NONE;
        s->count[r] = 0;
    }
    s->n_touched = 0;
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
};

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
    qsort(p->hits.v, p->hits.n, sizeof(*p->hits.v), cmp_end_rule);
    size_t k = 0;
    uint64_t plain = 0;
    for (size_t i = 0; i < p->hits.n; i++) {
        struct scan_hit h = p->hits.v[i];
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

static void touch(struct cpuscan_scratch *s, uint32_t rule)
{
    if (s->first[rule] == NONE && s->last[rule] == NONE)
        s->touched[s->n_touched++] = rule;
}

static int on_match(void *ctx, uint32_t rule, uint64_t end)
{
    struct walk *w = ctx;
    struct cpuscan_scratch *s = w->s;
    if (rule >= s->n_rules || s->last[rule] == end)
        return 0; /* the same (rule, end) twice */
    touch(s, rule);
    s->last[rule] = end;
    bool first = s->first[rule] == NONE;
    if (first)
        s->first[rule] = end;
    if (w->mode == SCAN_FIRST)
        return 0;
    if (w->mode == SCAN_COUNT) {
        if (first || !s->single[rule])
            s->count[rule]++;
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

int cpuscan_segment(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                    uint64_t hi, enum scan_mode mode, uint64_t limit, cpuscan_enough_fn enough,
                    void *ctx, struct cpuscan_scratch *s, struct cpuscan_part *part)
{
    uint64_t lb = cpuscan_lookback(cat);
    if (lb == CPUSCAN_UNSEGMENTABLE) {
        /* refscan_buffer is the only walker for such catalogs: whole buffers. */
        if (lo != 0 || hi < len)
            return -EINVAL;
        part->final = true;
        return refscan_buffer(cat, buf, len, mode, &part->hits);
    }
    int rc = scratch_prepare(s, cat);
    if (rc != 0)
        return rc;
    size_t base = part->hits.n;
    struct walk w = {.s = s,
                     .part = part,
                     .mode = mode,
                     .limit = mode == SCAN_ALL ? limit : 0,
                     .enough = enough,
                     .ctx = ctx};
    size_t begin = lo > lb ? (size_t)(lo - lb) : 0;
    for (uint32_t g = 0; g < catalog_group_count(cat) && rc == 0; g++) {
        rc = refscan_group_range(cat, g, buf, len, begin, lo, hi, on_match, &w);
        /* dedup state is per group walk: a rule lives in one group */
    }
    if (rc == 0 && mode != SCAN_ALL) {
        for (uint32_t i = 0; i < s->n_touched && rc == 0; i++) {
            uint32_t r = s->touched[i];
            if (s->first[r] != NONE)
                rc = scan_hits_push(&part->hits, r, s->first[r],
                                    mode == SCAN_COUNT ? s->count[r] : 1);
        }
        if (rc == 0 && part->hits.n > base)
            qsort(part->hits.v + base, part->hits.n - base, sizeof(*part->hits.v), cmp_end_rule);
    }
    if (rc == 0 && mode == SCAN_ALL) {
        if (w.limit > 0)
            trim(&w);
        else if (part->hits.n > base)
            qsort(part->hits.v + base, part->hits.n - base, sizeof(*part->hits.v), cmp_end_rule);
        part->plain = 0;
        for (size_t i = base; i < part->hits.n; i++)
            part->plain += !s->single[part->hits.v[i].rule];
    }
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
    /* by rule, then end: each rule's entries are one run, earliest first */
    qsort(v, total, sizeof(*v), cmp_rule_end);
    size_t m = 0;
    for (size_t i = 0; i < total; i++) {
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
    qsort(v, m, sizeof(*v), cmp_end_rule);
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
    p->plain = p->dropped = 0;
    p->final = false;
}
