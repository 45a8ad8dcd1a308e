/*
 * Bit-NFA construction: the group's Thompson NFA (nfa.h), reduced to its
 * positions (the states entered by a byte edge) with the epsilon paths
 * between them folded into follow edges that carry a condition mask. See
 * bitnfa.h for the model.
 */
#include "bitnfa.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "nfa.h"

struct vec {
    uint32_t *v;
    size_t n, cap;
};

static int push(struct vec *v, uint32_t x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        uint32_t *n = realloc(v->v, cap * sizeof(*n));
        if (n == NULL)
            return -ENOMEM;
        v->v = n;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}

static int push3(struct vec *v, uint32_t a, uint32_t b, uint32_t c)
{
    return push(v, a) || push(v, b) || push(v, c) ? -ENOMEM : 0;
}

/* An epsilon-edge condition (COND_* bits) as a 20-bit (prev, next) mask. */
static uint32_t cond20(uint32_t c)
{
    uint32_t m = 0;
    for (uint32_t p = 0; p < 4; p++)
        for (uint32_t k = 0; k < 5; k++)
            if ((c & COND_PREV(p)) && (c & COND_NEXT(k)))
                m |= BITNFA_PK(p, k);
    return m;
}

#define START UINT32_MAX

struct build {
    const struct nfa *nfa;
    uint32_t *pos;  /* NFA state -> position, or UINT32_MAX */
    uint32_t *mask; /* closure scratch: condition mask per NFA state */
    uint8_t *queued;
    struct vec stack, touched;
    struct vec edges; /* (src, cond, tgt) triples; src START for start edges */
    struct vec accs;  /* (rule, cond, src) triples */
};

/* Closes `from` under epsilon edges, each path's condition the AND of its
 * edges' conditions and each state's the OR over its paths, and records the
 * follow edges and accepts of the source position `src`. */
static int close_from(struct build *b, uint32_t from, uint32_t src)
{
    const struct nfa *nfa = b->nfa;
    b->stack.n = b->touched.n = 0;
    b->mask[from] = BITNFA_COND_ALL;
    b->queued[from] = 1;
    if (push(&b->stack, from) || push(&b->touched, from))
        return -ENOMEM;
    while (b->stack.n > 0) {
        uint32_t s = b->stack.v[--b->stack.n];
        b->queued[s] = 0;
        for (uint32_t e = nfa->eps_first[s]; e < nfa->eps_first[s + 1]; e++) {
            uint32_t t = nfa->eps_edges[e].to;
            uint32_t m = b->mask[s] & cond20(nfa->eps_edges[e].cond);
            if ((m & ~b->mask[t]) == 0)
                continue;
            if (b->mask[t] == 0 && push(&b->touched, t))
                return -ENOMEM;
            b->mask[t] |= m;
            if (!b->queued[t]) {
                b->queued[t] = 1;
                if (push(&b->stack, t))
                    return -ENOMEM;
            }
        }
    }
    if (b->edges.n / 3 > BITNFA_MAX_EDGES)
        return -EFBIG;
    for (size_t i = 0; i < b->touched.n; i++) {
        uint32_t u = b->touched.v[i], m = b->mask[u];
        b->mask[u] = 0;
        for (uint32_t e = nfa->byte_first[u]; e < nfa->byte_first[u + 1]; e++)
            if (push3(&b->edges, src, m, b->pos[nfa->byte_edges[e].to]))
                return -ENOMEM;
        if (nfa->accept[u] >= 0 && src != START &&
            push3(&b->accs, (uint32_t)nfa->accept[u], m, src))
            return -ENOMEM;
    }
    return 0;
}

static int cmp3(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    for (int k = 0; k < 3; k++)
        if (x[k] != y[k])
            return x[k] < y[k] ? -1 : 1;
    return 0;
}

/* Appends the sorted positions v[0..n) as inclusive ranges; returns how
 * many, or -ENOMEM. */
static int64_t put_ranges(struct vec *r, const uint32_t *v, size_t n, size_t stride)
{
    int64_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && v[(j + 1) * stride] == v[j * stride] + 1)
            j++;
        if (push(r, v[i * stride]) || push(r, v[j * stride]))
            return -ENOMEM;
        k++;
        i = j + 1;
    }
    return k;
}

/* One source's (or the start's) targets under one condition. */
struct xrec {
    uint32_t src, cond;
    uint32_t first, n; /* into the sorted edge triples: targets at [3*i + 2] */
};

static int cmp_xrec(const void *a, const void *b, void *arg)
{
    const struct xrec *x = a, *y = b;
    const uint32_t *e = arg;
    bool xs = x->src == START, ys = y->src == START;
    if (xs != ys)
        return xs ? -1 : 1;
    if (x->cond != y->cond)
        return x->cond < y->cond ? -1 : 1;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    for (uint32_t k = 0; k < x->n; k++) {
        uint32_t p = e[3 * (x->first + k) + 2], q = e[3 * (y->first + k) + 2];
        if (p != q)
            return p < q ? -1 : 1;
    }
    return x->src < y->src ? -1 : x->src > y->src;
}

static bool same_targets(const struct xrec *x, const struct xrec *y, const uint32_t *e)
{
    if (x->src == START || y->src == START || x->cond != y->cond || x->n != y->n)
        return false;
    for (uint32_t k = 0; k < x->n; k++)
        if (e[3 * (x->first + k) + 2] != e[3 * (y->first + k) + 2])
            return false;
    return true;
}

/* Turns the follow edges into the shift mask and merged exceptions. */
static int make_exceptions(struct build *b, struct bitnfa_group *g, struct vec *ranges)
{
    uint32_t *e = b->edges.v;
    size_t ne = 0, nx = 0;
    for (size_t i = 0; i < b->edges.n / 3; i++) {
        uint32_t src = e[3 * i], cond = e[3 * i + 1], tgt = e[3 * i + 2];
        if (src != START && cond == BITNFA_COND_ALL && tgt == src + 1) {
            g->shift[tgt >> 5] |= 1u << (tgt & 31);
            continue;
        }
        /* START sorts last as a u32: store src + 1 so it sorts first */
        e[3 * ne] = src + 1;
        e[3 * ne + 1] = cond;
        e[3 * ne + 2] = tgt;
        ne++;
    }
    if (ne > 1)
        qsort(e, ne, 3 * sizeof(uint32_t), cmp3);
    for (size_t i = 0; i < ne; i++)
        e[3 * i]--;
    struct xrec *xr = malloc((ne ? ne : 1) * sizeof(*xr));
    struct vec ex = {0}, srcs = {0};
    if (xr == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < ne;) {
        uint32_t src = e[3 * i], cond = e[3 * i + 1];
        size_t j = i;
        while (j < ne && e[3 * j] == src && e[3 * j + 1] == cond)
            j++;
        xr[nx++] = (struct xrec){src, cond, (uint32_t)i, (uint32_t)(j - i)};
        i = j;
    }
    if (nx > 1)
        qsort_r(xr, nx, sizeof(*xr), cmp_xrec, e);
    int rc = 0;
    for (size_t i = 0; i < nx && rc == 0;) {
        size_t j = i + 1;
        while (j < nx && same_targets(&xr[i], &xr[j], e))
            j++;
        uint32_t first = (uint32_t)(ranges->n / 2);
        srcs.n = 0;
        for (size_t k = i; k < j && xr[i].src != START && rc == 0; k++)
            rc = push(&srcs, xr[k].src);
        int64_t ns = rc ? -ENOMEM : put_ranges(ranges, srcs.v, srcs.n, 1);
        int64_t nt = ns < 0 ? ns : put_ranges(ranges, e + 3 * xr[i].first + 2, xr[i].n, 3);
        if (nt < 0 || push(&ex, xr[i].cond) || push(&ex, (uint32_t)ns) || push(&ex, (uint32_t)nt) ||
            push(&ex, first))
            rc = -ENOMEM;
        if (xr[i].cond != BITNFA_COND_ALL)
            g->asserts = true;
        i = j;
    }
    free(xr);
    free(srcs.v);
    g->exc = ex.v;
    g->n_exc = (uint32_t)(ex.n / 4);
    if (rc == 0 && g->exc == NULL)
        g->exc = calloc(4, sizeof(uint32_t));
    return rc != 0 || g->exc == NULL ? -ENOMEM : 0;
}

/* Accept entries: one per (rule, condition), sources as ranges, sorted by
 * rule so a scanner reports each rule once per offset. */
static int make_accepts(struct build *b, struct bitnfa_group *g, struct vec *ranges)
{
    uint32_t *a = b->accs.v;
    size_t na = b->accs.n / 3;
    if (na > 1)
        qsort(a, na, 3 * sizeof(uint32_t), cmp3);
    struct vec acc = {0};
    for (size_t i = 0; i < na;) {
        size_t j = i;
        while (j < na && a[3 * j] == a[3 * i] && a[3 * j + 1] == a[3 * i + 1])
            j++;
        uint32_t first = (uint32_t)(ranges->n / 2);
        int64_t ns = put_ranges(ranges, a + 3 * i + 2, j - i, 3);
        if (ns < 0 || push(&acc, a[3 * i]) || push(&acc, a[3 * i + 1]) ||
            push(&acc, (uint32_t)ns) || push(&acc, first)) {
            free(acc.v);
            return -ENOMEM;
        }
        if (a[3 * i + 1] != BITNFA_COND_ALL)
            g->asserts = true;
        i = j;
    }
    /* a rule that can never match (a\bb) has no accept entry at all */
    g->acc = acc.v != NULL ? acc.v : calloc(4, sizeof(uint32_t));
    g->n_acc = (uint32_t)(acc.n / 4);
    return g->acc == NULL ? -ENOMEM : 0;
}

/* Byte classes: bytes with the same column of reach bits share a class. */
static int make_classes(const struct nfa *nfa, const uint32_t *pos, struct bitnfa_group *g)
{
    uint32_t nw = g->n_words;
    uint32_t *col = calloc((size_t)256 * nw, sizeof(uint32_t));
    if (col == NULL)
        return -ENOMEM;
    for (uint32_t u = 0; u < nfa->n_states; u++)
        for (uint32_t e = nfa->byte_first[u]; e < nfa->byte_first[u + 1]; e++) {
            uint32_t q = pos[nfa->byte_edges[e].to];
            const struct byteset *s = &nfa->sets[nfa->byte_edges[e].set];
            /* walk the set's bits, not all 256 bytes: this loop runs once
             * per edge and was the compiler's hottest */
            for (unsigned w = 0; w < 4; w++)
                for (uint64_t m = s->w[w]; m != 0; m &= m - 1) {
                    unsigned c = 64 * w + (unsigned)__builtin_ctzll(m);
                    col[(size_t)c * nw + (q >> 5)] |= 1u << (q & 31);
                }
        }
    uint32_t rep[256], nc = 0;
    for (unsigned c = 0; c < 256; c++) {
        const uint32_t *cc = col + (size_t)c * nw;
        /* neighbouring bytes mostly share a class: try c - 1's first */
        if (c > 0 && memcmp(col + (size_t)(c - 1) * nw, cc, nw * 4) == 0) {
            g->classmap[c] = g->classmap[c - 1];
            continue;
        }
        uint32_t k = 0;
        while (k < nc && memcmp(col + (size_t)rep[k] * nw, cc, nw * 4) != 0)
            k++;
        if (k == nc)
            rep[nc++] = c;
        g->classmap[c] = k;
    }
    g->n_classes = nc;
    g->reach = malloc((size_t)nc * nw * sizeof(uint32_t));
    if (g->reach == NULL) {
        free(col);
        return -ENOMEM;
    }
    for (uint32_t k = 0; k < nc; k++)
        memcpy(g->reach + (size_t)k * nw, col + (size_t)rep[k] * nw, nw * 4);
    free(col);
    return 0;
}

/* Numbers the positions in NFA state order (pattern order). */
static uint32_t number_positions(const struct nfa *nfa, uint32_t *pos)
{
    for (uint32_t s = 0; s < nfa->n_states; s++)
        pos[s] = 0;
    for (uint32_t u = 0; u < nfa->n_states; u++)
        for (uint32_t e = nfa->byte_first[u]; e < nfa->byte_first[u + 1]; e++)
            pos[nfa->byte_edges[e].to] = 1;
    uint32_t n = 0;
    for (uint32_t s = 0; s < nfa->n_states; s++)
        pos[s] = pos[s] ? n++ : UINT32_MAX;
    return n;
}

static int build_from_nfa(struct build *b, uint32_t max_bits, struct bitnfa_group *g,
                          uint32_t *bits_out)
{
    const struct nfa *nfa = b->nfa;
    uint32_t ns = nfa->n_states;
    b->pos = malloc(ns * sizeof(uint32_t));
    b->mask = calloc(ns, sizeof(uint32_t));
    b->queued = calloc(ns, 1);
    if (b->pos == NULL || b->mask == NULL || b->queued == NULL)
        return -ENOMEM;
    g->n_bits = number_positions(nfa, b->pos);
    *bits_out = g->n_bits;
    if (g->n_bits > max_bits)
        return -E2BIG;
    if (g->n_bits == 0)
        return -EINVAL; /* parse_check lets no pattern without a byte through */
    g->n_words = (g->n_bits + 31) / 32;
    g->n_rules = nfa->n_rules;
    g->shift = calloc(g->n_words, sizeof(uint32_t));
    if (g->shift == NULL)
        return -ENOMEM;
    int rc = close_from(b, nfa->start, START);
    for (uint32_t s = 0; s < ns && rc == 0; s++)
        if (b->pos[s] != UINT32_MAX)
            rc = close_from(b, s, b->pos[s]);
    struct vec ranges = {0};
    if (rc == 0)
        rc = make_exceptions(b, g, &ranges);
    if (rc == 0)
        rc = make_accepts(b, g, &ranges);
    if (rc == 0)
        rc = make_classes(nfa, b->pos, g);
    g->ranges = ranges.v != NULL ? ranges.v : calloc(2, sizeof(uint32_t));
    g->n_ranges = (uint32_t)(ranges.n / 2);
    if (rc == 0 && g->ranges == NULL)
        rc = -ENOMEM;
    return rc;
}

int bitnfa_build(const struct node *const *roots, uint32_t n, uint32_t max_bits,
                 struct bitnfa_group *out, uint32_t *bits_out)
{
    memset(out, 0, sizeof(*out));
    *bits_out = 0;
    struct nfa_builder *nb = nfa_builder_create();
    if (nb == NULL)
        return -ENOMEM;
    int rc = 0;
    for (uint32_t k = 0; k < n && rc == 0; k++)
        rc = nfa_builder_add(nb, roots[k], k);
    struct nfa nfa;
    if (rc == 0)
        rc = nfa_builder_finish(nb, &nfa);
    nfa_builder_destroy(nb);
    if (rc != 0)
        return rc;
    struct build b = {.nfa = &nfa};
    rc = build_from_nfa(&b, max_bits, out, bits_out);
    free(b.pos);
    free(b.mask);
    free(b.queued);
    free(b.stack.v);
    free(b.touched.v);
    free(b.edges.v);
    free(b.accs.v);
    nfa_finish(&nfa);
    if (rc != 0)
        bitnfa_group_finish(out);
    return rc;
}

void bitnfa_group_finish(struct bitnfa_group *g)
{
    if (g == NULL)
        return;
    free(g->reach);
    free(g->shift);
    free(g->exc);
    free(g->acc);
    free(g->ranges);
    memset(g, 0, sizeof(*g));
}
