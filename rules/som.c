/*
 * Start of match: a leftmost-start simulation of one rule's Thompson NFA.
 *
 * The simulation is a Pike VM whose threads carry the offset where they
 * started. The list of live states is kept in order of start offset; a
 * state reached by two threads keeps the earlier start, since what the rule
 * does next depends on the state and the bytes, never on the start. At an
 * end offset the first accepting state of the list holds the leftmost start.
 */
#include "som.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "nfa.h"
#include "parse.h"
#include "rules.h"

struct som_rule {
    struct nfa nfa;
    uint32_t reach;
    /* Bytes a match can begin with (a superset: assertions ignored). Where
     * no thread is live and the next byte is not one of them, a thread
     * started there dies at once, so the walk skips ahead. */
    struct byteset first;
    /* The same NFA with every edge turned around (CSR by target state):
     * the backward walk from an end. */
    uint32_t *rbyte_first;
    struct nfa_byte_edge *rbyte; /* .to is the edge's source */
    uint32_t *reps_first;
    struct nfa_eps_edge *reps;
};

/* Builds the reversed edges. */
static int reverse_edges(struct som_rule *sr)
{
    const struct nfa *nfa = &sr->nfa;
    uint32_t ns = nfa->n_states;
    uint32_t nb = nfa->byte_first[ns], ne = nfa->eps_first[ns];
    sr->rbyte_first = calloc(ns + 1, sizeof(uint32_t));
    sr->reps_first = calloc(ns + 1, sizeof(uint32_t));
    sr->rbyte = malloc((nb ? nb : 1) * sizeof(*sr->rbyte));
    sr->reps = malloc((ne ? ne : 1) * sizeof(*sr->reps));
    uint32_t *fill = malloc((ns + 1) * sizeof(uint32_t));
    if (sr->rbyte_first == NULL || sr->reps_first == NULL || sr->rbyte == NULL ||
        sr->reps == NULL || fill == NULL) {
        free(fill);
        return -ENOMEM;
    }
    const struct nfa_byte_edge *be = nfa->byte_edges;
    const struct nfa_eps_edge *ee = nfa->eps_edges;
    uint32_t *rbf = sr->rbyte_first, *ref = sr->reps_first;
    for (uint32_t x = 0; x < ns; x++)
        for (uint32_t e = nfa->byte_first[x]; e < nfa->byte_first[x + 1]; e++)
            rbf[be[e].to + 1]++;
    for (uint32_t x = 0; x < ns; x++)
        rbf[x + 1] += rbf[x];
    memcpy(fill, rbf, (ns + 1) * sizeof(uint32_t));
    for (uint32_t x = 0; x < ns; x++)
        for (uint32_t e = nfa->byte_first[x]; e < nfa->byte_first[x + 1]; e++)
            sr->rbyte[fill[be[e].to]++] = (struct nfa_byte_edge){.set = be[e].set, .to = x};
    for (uint32_t x = 0; x < ns; x++)
        for (uint32_t e = nfa->eps_first[x]; e < nfa->eps_first[x + 1]; e++)
            ref[ee[e].to + 1]++;
    for (uint32_t x = 0; x < ns; x++)
        ref[x + 1] += ref[x];
    memcpy(fill, ref, (ns + 1) * sizeof(uint32_t));
    for (uint32_t x = 0; x < ns; x++)
        for (uint32_t e = nfa->eps_first[x]; e < nfa->eps_first[x + 1]; e++)
            sr->reps[fill[ee[e].to]++] = (struct nfa_eps_edge){.cond = ee[e].cond, .to = x};
    free(fill);
    return 0;
}

/* The first-byte set: byte edges out of the start's epsilon closure, with
 * every condition taken as met. */
static int first_bytes(struct som_rule *sr)
{
    const struct nfa *nfa = &sr->nfa;
    uint8_t *seen = calloc(nfa->n_states ? nfa->n_states : 1, 1);
    uint32_t *stack = malloc((nfa->n_states + 1) * sizeof(*stack));
    if (seen == NULL || stack == NULL) {
        free(seen);
        free(stack);
        return -ENOMEM;
    }
    uint32_t sp = 0;
    stack[sp++] = nfa->start;
    seen[nfa->start] = 1;
    while (sp > 0) {
        uint32_t x = stack[--sp];
        for (uint32_t e = nfa->byte_first[x]; e < nfa->byte_first[x + 1]; e++) {
            for (int k = 0; k < 4; k++)
                sr->first.w[k] |= nfa->sets[nfa->byte_edges[e].set].w[k];
        }
        for (uint32_t e = nfa->eps_first[x]; e < nfa->eps_first[x + 1]; e++) {
            uint32_t to = nfa->eps_edges[e].to;
            if (!seen[to]) {
                seen[to] = 1;
                stack[sp++] = to;
            }
        }
    }
    free(seen);
    free(stack);
    return 0;
}

int som_rule_create(const struct catalog *cat, uint32_t rule, struct som_rule **out,
                    struct vks_error *err)
{
    struct catalog_rule cr;
    catalog_rule(cat, rule, &cr);
    struct rule_src src = {.id = "som",
                           .kind = (enum rule_kind)cr.kind,
                           .pattern = cr.src,
                           .len = cr.src_len,
                           .flags = cr.flags};
    struct parse_result pr = {0};
    char msg[200];
    uint32_t pos = 0;
    *out = NULL;
    int rc = parse_rule(&src, &pr, &pos, msg, sizeof(msg));
    if (rc != 0) {
        parse_result_finish(&pr);
        if (rc == -ENOMEM)
            return vks_error_set(err, rc, "out of memory building the start finder of rule %u",
                                 rule);
        return vks_error_set(err, -EINVAL,
                             "rule %u of the catalog does not parse for start of match (%s): "
                             "reload the rules with this daemon's compiler",
                             rule, msg);
    }
    struct som_rule *sr = calloc(1, sizeof(*sr));
    struct nfa_builder *b = sr != NULL ? nfa_builder_create() : NULL;
    rc = b == NULL ? -ENOMEM : nfa_builder_add(b, pr.root, 0);
    if (rc == 0)
        rc = nfa_builder_finish(b, &sr->nfa);
    if (rc == 0)
        rc = first_bytes(sr);
    if (rc == 0)
        rc = reverse_edges(sr);
    if (rc == 0) {
        uint32_t m = parse_maxlen(pr.root);
        sr->reach = m == REPEAT_INF ? CATALOG_UNBOUNDED : m;
    }
    nfa_builder_destroy(b);
    parse_result_finish(&pr);
    if (rc != 0) {
        if (sr != NULL && sr->nfa.n_states == 0)
            free(sr);
        else
            som_rule_destroy(sr);
        return vks_error_set(err, -ENOMEM, "out of memory building the start finder of rule %u",
                             rule);
    }
    *out = sr;
    return 0;
}

void som_rule_destroy(struct som_rule *sr)
{
    if (sr == NULL)
        return;
    nfa_finish(&sr->nfa);
    free(sr->rbyte_first);
    free(sr->rbyte);
    free(sr->reps_first);
    free(sr->reps);
    free(sr);
}

uint32_t som_rule_reach(const struct som_rule *sr)
{
    return sr->reach;
}

/* ---- the leftmost-start walk -------------------------------------------- */

/* Live states in order of start offset. */
struct tlist {
    uint32_t *state;
    uint64_t *start;
    uint32_t n;
};

struct walk {
    const struct nfa *nfa;
    const uint8_t *buf;
    size_t len;
    struct tlist cur, nxt;
    uint32_t *mark; /* per state: the generation that last listed it */
    uint32_t gen;
    uint32_t *stack;
};

static void mark_next(struct walk *w)
{
    if (++w->gen == 0) { /* wrapped: forget every mark */
        memset(w->mark, 0, w->nfa->n_states * sizeof(*w->mark));
        w->gen = 1;
    }
}

/* Appends `seed` and every state its epsilon edges reach at offset i,
 * each with `start` unless a thread that started earlier holds it. */
static void close_from(struct walk *w, struct tlist *out, uint32_t seed, uint64_t start,
                       uint32_t want)
{
    const struct nfa *nfa = w->nfa;
    uint32_t sp = 0;
    w->stack[sp++] = seed;
    while (sp > 0) {
        uint32_t x = w->stack[--sp];
        if (w->mark[x] == w->gen)
            continue;
        w->mark[x] = w->gen;
        out->state[out->n] = x;
        out->start[out->n++] = start;
        for (uint32_t e = nfa->eps_first[x]; e < nfa->eps_first[x + 1]; e++) {
            uint32_t to = nfa->eps_edges[e].to;
            if ((nfa->eps_edges[e].cond & want) == want && w->mark[to] != w->gen)
                w->stack[sp++] = to;
        }
    }
}

/* The closed list at offset i from the states that consumed byte i-1 (in
 * w->nxt), plus a thread starting at i. Returns the leftmost start of an
 * accepting state, or SOM_NONE. */
static uint64_t step_close(struct walk *w, size_t i)
{
    uint32_t want =
        COND_PREV(nfa_prev_kind(w->buf, i)) | COND_NEXT(nfa_next_kind(w->buf, w->len, i));
    mark_next(w);
    w->cur.n = 0;
    for (uint32_t j = 0; j < w->nxt.n; j++)
        close_from(w, &w->cur, w->nxt.state[j], w->nxt.start[j], want);
    close_from(w, &w->cur, w->nfa->start, i, want);
    for (uint32_t j = 0; j < w->cur.n; j++) {
        if (w->nfa->accept[w->cur.state[j]] >= 0)
            return w->cur.start[j];
    }
    return SOM_NONE;
}

/* Moves the closed list over byte i into w->nxt, keeping the order. */
static void step_byte(struct walk *w, size_t i)
{
    const struct nfa *nfa = w->nfa;
    uint8_t c = w->buf[i];
    mark_next(w);
    w->nxt.n = 0;
    for (uint32_t j = 0; j < w->cur.n; j++) {
        uint32_t x = w->cur.state[j];
        for (uint32_t e = nfa->byte_first[x]; e < nfa->byte_first[x + 1]; e++) {
            uint32_t to = nfa->byte_edges[e].to;
            if (w->mark[to] != w->gen && byteset_has(&nfa->sets[nfa->byte_edges[e].set], c)) {
                w->mark[to] = w->gen;
                w->nxt.state[w->nxt.n] = to;
                w->nxt.start[w->nxt.n++] = w->cur.start[j];
            }
        }
    }
}

/* The first offset a walk that reports at `end` must start from. */
static size_t window_start(uint32_t reach, uint64_t end)
{
    if (reach == CATALOG_UNBOUNDED || end <= reach)
        return 0;
    return (size_t)(end - reach);
}

/* The forward walk (above) for ends[0..n), sorted. */
static void forward_starts(const struct som_rule *sr, struct walk *w, const uint64_t *ends,
                           size_t n, uint64_t *starts)
{
    size_t pos = 0;    /* next offset to close at */
    bool live = false; /* whether w->nxt holds the walk's states before pos */
    for (size_t k = 0; k < n; k++) {
        if (k > 0 && ends[k] == ends[k - 1]) {
            starts[k] = starts[k - 1];
            continue;
        }
        size_t e = ends[k] < w->len ? (size_t)ends[k] : w->len;
        size_t from = window_start(sr->reach, e);
        if (!live || from > pos) { /* a new window: the walk so far cannot reach e */
            pos = from;
            w->nxt.n = 0;
            live = true;
        }
        for (; pos < e; pos++) {
            if (w->nxt.n == 0) { /* nothing live: to the next possible first byte */
                while (pos < e && !byteset_has(&sr->first, w->buf[pos]))
                    pos++;
                if (pos == e)
                    break;
            }
            step_close(w, pos);
            step_byte(w, pos);
        }
        starts[k] = step_close(w, e);
        if (e < w->len)
            step_byte(w, e);
        pos = e + 1;
        live = e < w->len;
    }
}

/* ---- the backward walk -------------------------------------------------- */

/* Closes w->cur (a plain set) under the reversed epsilon edges allowed at
 * offset i. */
static void back_close(struct walk *w, const struct som_rule *sr, size_t i)
{
    uint32_t want =
        COND_PREV(nfa_prev_kind(w->buf, i)) | COND_NEXT(nfa_next_kind(w->buf, w->len, i));
    uint32_t sp = 0;
    for (uint32_t j = 0; j < w->cur.n; j++)
        w->stack[sp++] = w->cur.state[j];
    while (sp > 0) {
        uint32_t x = w->stack[--sp];
        for (uint32_t e = sr->reps_first[x]; e < sr->reps_first[x + 1]; e++) {
            uint32_t to = sr->reps[e].to;
            if ((sr->reps[e].cond & want) == want && w->mark[to] != w->gen) {
                w->mark[to] = w->gen;
                w->cur.state[w->cur.n++] = to;
                w->stack[sp++] = to;
            }
        }
    }
}

/* The leftmost start of a match ending at e, walking the reversed NFA from
 * the rule's final state back until no state is live (or `lo`): the
 * furthest-back offset where the forward start state is reached. Takes one
 * unit of *budget per byte; returns false, with *budget 0, when it ran out. */
static bool back_walk(const struct som_rule *sr, struct walk *w, size_t e, size_t lo,
                      uint64_t *budget, uint64_t *start)
{
    const struct nfa *nfa = &sr->nfa;
    uint64_t best = SOM_NONE;
    mark_next(w);
    w->cur.n = 0;
    for (uint32_t x = 0; x < nfa->n_states; x++) {
        if (nfa->accept[x] >= 0) {
            w->mark[x] = w->gen;
            w->cur.state[w->cur.n++] = x;
        }
    }
    for (size_t i = e;; i--) {
        back_close(w, sr, i);
        if (w->mark[nfa->start] == w->gen)
            best = i;
        if (i == lo || w->cur.n == 0)
            break;
        if (*budget == 0)
            return false;
        --*budget;
        uint8_t c = w->buf[i - 1];
        mark_next(w);
        w->nxt.n = 0;
        for (uint32_t j = 0; j < w->cur.n; j++) {
            uint32_t x = w->cur.state[j];
            for (uint32_t k = sr->rbyte_first[x]; k < sr->rbyte_first[x + 1]; k++) {
                uint32_t to = sr->rbyte[k].to;
                if (w->mark[to] != w->gen && byteset_has(&nfa->sets[sr->rbyte[k].set], c)) {
                    w->mark[to] = w->gen;
                    w->nxt.state[w->nxt.n++] = to;
                }
            }
        }
        struct tlist t = w->cur;
        w->cur = w->nxt;
        w->nxt = t;
    }
    *start = best;
    return true;
}

int som_rule_starts(const struct som_rule *sr, const uint8_t *buf, size_t len, const uint64_t *ends,
                    size_t n, uint64_t *starts)
{
    size_t ns = sr->nfa.n_states ? sr->nfa.n_states : 1;
    /* a closure pushes each state at most once per incoming edge */
    size_t stack = ns + (sr->nfa.eps_first ? sr->nfa.eps_first[sr->nfa.n_states] : 0) + 1;
    struct walk w = {.nfa = &sr->nfa, .buf = buf, .len = len};
    w.cur.state = malloc(ns * sizeof(uint32_t));
    w.cur.start = malloc(ns * sizeof(uint64_t));
    w.nxt.state = malloc(ns * sizeof(uint32_t));
    w.nxt.start = malloc(ns * sizeof(uint64_t));
    w.mark = calloc(ns, sizeof(uint32_t));
    w.stack = malloc(stack * sizeof(uint32_t));
    if (w.cur.state == NULL || w.cur.start == NULL || w.nxt.state == NULL || w.nxt.start == NULL ||
        w.mark == NULL || w.stack == NULL) {
        free(w.cur.state);
        free(w.cur.start);
        free(w.nxt.state);
        free(w.nxt.start);
        free(w.mark);
        free(w.stack);
        return -ENOMEM;
    }
    /* Backward from each end first: most walks die within a few bytes of
     * the match. Walks that reach far back (a `.*` with s, many ends) would
     * cost a pass each, so past a budget of an eighth of the forward walk's
     * bytes (a backward step costs about ten forward ones) the rest go
     * forward, in one pass: at worst about twice the forward walk alone. */
    size_t k = 0;
    if (n > 0) {
        size_t last = ends[n - 1] < len ? (size_t)ends[n - 1] : len;
        uint64_t budget =
            (last - window_start(sr->reach, ends[0] < len ? ends[0] : len)) / 8 + 65536;
        for (; k < n; k++) {
            size_t e = ends[k] < len ? (size_t)ends[k] : len;
            if (k > 0 && ends[k] == ends[k - 1]) {
                starts[k] = starts[k - 1];
                continue;
            }
            if (!back_walk(sr, &w, e, window_start(sr->reach, e), &budget, &starts[k]))
                break;
        }
    }
    if (k < n)
        forward_starts(sr, &w, ends + k, n - k, starts + k);
    free(w.cur.state);
    free(w.cur.start);
    free(w.nxt.state);
    free(w.nxt.start);
    free(w.mark);
    free(w.stack);
    return 0;
}

/* ---- per-catalog finders ------------------------------------------------ */

struct som_set {
    const struct catalog *cat;
    pthread_mutex_t mu;
    struct som_rule **rules; /* per catalog rule, NULL until built */
    uint32_t n;
};

struct som_set *som_set_create(const struct catalog *cat)
{
    struct som_set *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->cat = cat;
    s->n = catalog_rule_count(cat);
    s->rules = calloc(s->n ? s->n : 1, sizeof(*s->rules));
    if (s->rules == NULL || pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s->rules);
        free(s);
        return NULL;
    }
    return s;
}

void som_set_destroy(struct som_set *s)
{
    if (s == NULL)
        return;
    for (uint32_t i = 0; i < s->n; i++)
        som_rule_destroy(s->rules[i]);
    free(s->rules);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int som_catalog_wants(const struct catalog *cat)
{
    uint32_t n = catalog_rule_count(cat);
    for (uint32_t i = 0; i < n; i++) {
        struct catalog_rule cr;
        catalog_rule(cat, i, &cr);
        if (cr.flags & RULE_F_SOMLEFT)
            return 1;
    }
    return 0;
}

int som_set_get(struct som_set *s, uint32_t rule, const struct som_rule **out,
                struct vks_error *err)
{
    if (rule >= s->n)
        return vks_error_set(err, -EINVAL, "rule %u is not in the catalog", rule);
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (s->rules[rule] == NULL)
        rc = som_rule_create(s->cat, rule, &s->rules[rule], err);
    *out = s->rules[rule];
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int by_rule_end(const void *a, const void *b)
{
    const struct som_hit *x = *(const struct som_hit *const *)a;
    const struct som_hit *y = *(const struct som_hit *const *)b;
    if (x->rule != y->rule)
        return x->rule < y->rule ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Fills the starts of order[0..n), hits of one rule sorted by end. */
static int fill_rule(const struct som_rule *sr, const uint8_t *buf, size_t len,
                     struct som_hit **order, size_t n)
{
    uint64_t *ends = malloc(n * sizeof(*ends) * 2);
    if (ends == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        ends[i] = order[i]->end;
    int rc = som_rule_starts(sr, buf, len, ends, n, ends + n);
    for (size_t i = 0; rc == 0 && i < n; i++)
        order[i]->start = ends[n + i];
    free(ends);
    return rc;
}

int som_fill(struct som_set *s, const uint8_t *buf, size_t len, struct som_hit *hits, size_t n,
             int all, struct vks_error *err)
{
    struct som_hit **order = malloc((n ? n : 1) * sizeof(*order));
    if (order == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory computing match starts");
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        hits[i].start = SOM_NONE;
        if (hits[i].rule >= s->n)
            continue;
        struct catalog_rule cr;
        catalog_rule(s->cat, hits[i].rule, &cr);
        if (all || (cr.flags & RULE_F_SOMLEFT))
            order[m++] = &hits[i];
    }
    qsort(order, m, sizeof(*order), by_rule_end);
    int rc = 0;
    for (size_t a = 0, b; a < m && rc == 0; a = b) {
        for (b = a + 1; b < m && order[b]->rule == order[a]->rule; b++) {
        }
        const struct som_rule *sr;
        rc = som_set_get(s, order[a]->rule, &sr, err);
        if (rc == 0 && fill_rule(sr, buf, len, order + a, b - a) != 0)
            rc = vks_error_set(err, -ENOMEM, "out of memory computing match starts");
    }
    free(order);
    return rc;
}
