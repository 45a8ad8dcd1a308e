/*
 * One step of a bit-NFA group (docs/engine.md): the state vector, its
 * live-word bounds and the step itself, shared by the block scanner
 * (refscan.c) and the stream scanner (streamscan.c) so that both walk a
 * group exactly alike. Internal to rules/.
 */
#ifndef VKS_RULES_NFASTEP_H
#define VKS_RULES_NFASTEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"

/* Does the state have a position in one of ranges rg[0..n)? */
static inline bool any_in(const uint32_t *s, const uint32_t *rg, uint32_t n)
{
    for (uint32_t r = 0; r < n; r++) {
        uint32_t lo = rg[2 * r], hi = rg[2 * r + 1];
        for (uint32_t w = lo >> 5; w <= hi >> 5; w++) {
            uint32_t m = ~0u;
            if (w == lo >> 5)
                m &= ~0u << (lo & 31);
            if (w == hi >> 5)
                m &= ~0u >> (31 - (hi & 31));
            if (s[w] & m)
                return true;
        }
    }
    return false;
}

static inline void set_in(uint32_t *s, const uint32_t *rg, uint32_t n)
{
    for (uint32_t r = 0; r < n; r++) {
        uint32_t lo = rg[2 * r], hi = rg[2 * r + 1];
        for (uint32_t w = lo >> 5; w <= hi >> 5; w++) {
            uint32_t m = ~0u;
            if (w == lo >> 5)
                m &= ~0u << (lo & 31);
            if (w == hi >> 5)
                m &= ~0u >> (31 - (hi & 31));
            s[w] |= m;
        }
    }
}

/* A state vector whose words outside [lo, hi] are all zero (lo > hi: the
 * state is empty). Most of the time few positions are active, so a step
 * touches few words and tests few exceptions. */
struct nvec {
    uint32_t *v;
    uint32_t lo, hi;
};

/* Can the state meet ranges rg[0..n) at all? Ranges are ascending
 * (catalog_from_bytes checks it), so their span is first lo .. last hi. */
static inline bool span_meets(const struct nvec *s, const uint32_t *rg, uint32_t n)
{
    return n != 0 && s->lo <= s->hi && (rg[0] >> 5) <= s->hi && (rg[2 * n - 1] >> 5) >= s->lo;
}

/* Applies exception e when its condition holds and the state meets its
 * sources (or it has none), widening the touched words [*lo, *hi]. */
static inline void nfa_exc_apply(const struct catalog_nfa *g, const uint32_t *e,
                                 const struct nvec *s, struct nvec *t, uint32_t pk, uint32_t *lo,
                                 uint32_t *hi)
{
    uint32_t ns = e[CAT_X_NSRC], nt = e[CAT_X_NTGT];
    const uint32_t *rg = g->ranges + 2 * (size_t)e[CAT_X_FIRST];
    if (!(e[CAT_X_COND] & pk) || (ns && (!span_meets(s, rg, ns) || !any_in(s->v, rg, ns))))
        return;
    const uint32_t *tg = rg + 2 * (size_t)ns;
    set_in(t->v, tg, nt);
    *lo = tg[0] >> 5 < *lo ? tg[0] >> 5 : *lo;
    *hi = tg[2 * nt - 1] >> 5 > *hi ? tg[2 * nt - 1] >> 5 : *hi;
}

/* The first narrow exception (index >= g->x_narrow) whose first source
 * word is at least `from`: they are sorted by it. */
static inline uint32_t nfa_narrow_from(const struct catalog_nfa *g, uint32_t from)
{
    uint32_t a = g->x_narrow, z = g->n_exc;
    while (a < z) {
        uint32_t m = a + (z - a) / 2;
        if (catalog_exc_lo(g->exc + (size_t)m * CAT_X_WORDS, g->ranges) < from)
            a = m + 1;
        else
            z = m;
    }
    return a;
}

/* The state of a group with masks (catalog_nfa.small) as one mask: its
 * live words only. */
static inline catalog_mask nvec_small(const struct nvec *s)
{
    catalog_mask v = 0;
    for (uint32_t w = s->lo; w <= s->hi; w++)
        v |= (catalog_mask)s->v[w] << (32 * w);
    return v;
}

/* nfa_step_starts of a group with masks (catalog_nfa.small):
 * the same next state from masks. */
static inline void nfa_step_small(const struct catalog_nfa *g, const struct nvec *s, struct nvec *t,
                                  uint32_t pk, uint8_t c, bool starts)
{
    const struct catalog_nfa_small *m = g->small;
    catalog_mask v = nvec_small(s);
    catalog_mask n = (v << 1) & m->shift;
    for (uint32_t x = 0; x < m->n_exc; x++) {
        const struct catalog_nfa_exc64 *e = &m->exc[x];
        if ((e->cond & pk) && (e->src != 0 ? (v & e->src) != 0 : starts))
            n |= e->tgt;
    }
    n &= m->reach[g->classmap[c]];
    t->lo = 1;
    t->hi = 0; /* empty until a live word */
    for (uint32_t w = 0; w < g->n_words; w++) {
        t->v[w] = (uint32_t)(n >> (32 * w));
        if (t->v[w] == 0)
            continue;
        if (t->lo > t->hi)
            t->lo = w;
        t->hi = w;
    }
}

/* One step of the bit-NFA on byte c: shift, exceptions, reach. Without
 * `starts` the start edges do not fire: no match starts at this byte
 * (forward confirmation, refscan.c). Exceptions come as start edges, wide
 * ones, then narrow ones sorted by their first source word (catalog.h):
 * of those, only the ones whose sources can reach the live words
 * [s->lo, s->hi] are tested. A group with masks (catalog_nfa.small) steps
 * by nfa_step_small instead. */
static inline void nfa_step_starts(const struct catalog_nfa *g, const struct nvec *s,
                                   struct nvec *t, uint32_t pk, uint8_t c, bool starts)
{
    if (g->small != NULL) {
        nfa_step_small(g, s, t, pk, c, starts);
        return;
    }
    for (uint32_t w = t->lo; w <= t->hi; w++)
        t->v[w] = 0;
    bool any = s->lo <= s->hi;
    uint32_t lo = UINT32_MAX, hi = 0;
    if (any) {
        uint32_t end = s->hi + 1 < g->n_words ? s->hi + 1 : s->hi;
        for (uint32_t w = s->lo; w <= end; w++)
            t->v[w] = ((s->v[w] << 1) | (w ? s->v[w - 1] >> 31 : 0)) & g->shift[w];
        lo = s->lo;
        hi = end;
    }
    for (uint32_t x = 0; x < g->x_narrow; x++) {
        const uint32_t *e = g->exc + (size_t)x * CAT_X_WORDS;
        if (e[CAT_X_NSRC] != 0 && !any)
            break; /* entries without sources (start edges) come first */
        if (e[CAT_X_NSRC] == 0 && !starts)
            continue;
        nfa_exc_apply(g, e, s, t, pk, &lo, &hi);
    }
    if (any && g->x_narrow < g->n_exc) {
        uint32_t x = nfa_narrow_from(g, s->lo > g->x_span ? s->lo - g->x_span : 0);
        for (; x < g->n_exc; x++) {
            const uint32_t *e = g->exc + (size_t)x * CAT_X_WORDS;
            if (catalog_exc_lo(e, g->ranges) > s->hi)
                break;
            nfa_exc_apply(g, e, s, t, pk, &lo, &hi);
        }
    }
    const uint32_t *reach = g->reach + (size_t)g->classmap[c] * g->n_words;
    t->lo = 1;
    t->hi = 0;
    for (uint32_t w = lo; w <= hi && lo != UINT32_MAX; w++) {
        if ((t->v[w] &= reach[w]) == 0)
            continue;
        if (t->lo > t->hi)
            t->lo = w;
        t->hi = w;
    }
}

/* One step of the bit-NFA on byte c, start edges included. */
static inline void nfa_step(const struct catalog_nfa *g, const struct nvec *s, struct nvec *t,
                            uint32_t pk, uint8_t c)
{
    nfa_step_starts(g, s, t, pk, c, true);
}

#endif
