/*
 * Thompson construction for a group of rules, with a shared prefix trie over
 * byte sets; and a direct NFA simulation used as the DFA's test oracle.
 */
#include "nfa.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"

struct edge_rec {
    uint32_t from, label, to;
};

struct edge_vec {
    struct edge_rec *v;
    size_t n, cap;
};

/* Open-addressing map from a 64-bit key to a u32 value. */
struct u64map {
    uint64_t *keys;
    uint32_t *vals;
    size_t cap, n; /* cap is a power of two; key 0 marks an empty slot */
};

/* The literal kinds a byte set can belong to: one byte (exact), one letter
 * in both cases (folded); a non-letter byte is both. */
#define LIT_EXACT  1u
#define LIT_FOLDED 2u
#define LIT_NONE   0u

struct nfa_builder {
    uint32_t n_states;
    struct edge_vec bytes, eps;
    int32_t *accept;
    size_t accept_cap;
    struct byteset *sets;
    uint32_t n_sets, sets_cap;
    struct u64map set_index; /* hash of set -> id + 1 (chained by probing) */
    struct u64map trie;      /* (state << 32 | set) + 1 -> child */
    uint32_t n_rules;
    bool has_cond;
    unsigned lit_kinds; /* LIT_* of every rule so far, or LIT_NONE */
};

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static int map_grow(struct u64map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *keys = calloc(cap, sizeof(*keys));
    uint32_t *vals = malloc(cap * sizeof(*vals));
    if (keys == NULL || vals == NULL) {
        free(keys);
        free(vals);
        return -ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == 0)
            continue;
        size_t j = mix64(m->keys[i]) & (cap - 1);
        while (keys[j] != 0)
            j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    return 0;
}

/* Returns a pointer to the value slot of `key` (non-zero); *found tells
 * whether it existed. NULL when out of memory. */
static uint32_t *map_slot(struct u64map *m, uint64_t key, bool *found)
{
    if ((m->n + 1) * 2 > m->cap && map_grow(m) != 0)
        return NULL;
    size_t j = mix64(key) & (m->cap - 1);
    while (m->keys[j] != 0 && m->keys[j] != key)
        j = (j + 1) & (m->cap - 1);
    *found = m->keys[j] == key;
    if (!*found) {
        m->keys[j] = key;
        m->n++;
    }
    return &m->vals[j];
}

static void map_free(struct u64map *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}

struct nfa_builder *nfa_builder_create(void)
{
    struct nfa_builder *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->n_states = 1; /* state 0: the start, root of the trie */
    b->accept_cap = 1024;
    b->accept = malloc(b->accept_cap * sizeof(*b->accept));
    if (b->accept == NULL) {
        free(b);
        return NULL;
    }
    b->accept[0] = -1;
    b->lit_kinds = LIT_EXACT | LIT_FOLDED;
    return b;
}

void nfa_builder_destroy(struct nfa_builder *b)
{
    if (b == NULL)
        return;
    free(b->bytes.v);
    free(b->eps.v);
    free(b->accept);
    free(b->sets);
    map_free(&b->set_index);
    map_free(&b->trie);
    free(b);
}

static unsigned set_literal_kinds(const struct byteset *s)
{
    unsigned n = 0, c[2] = {0, 0};
    for (unsigned w = 0; w < 4; w++)
        for (uint64_t x = s->w[w]; x != 0; x &= x - 1) {
            if (n == 2)
                return LIT_NONE;
            c[n++] = w * 64 + (unsigned)__builtin_ctzll(x);
        }
    bool letter = (c[0] | 0x20u) >= 'a' && (c[0] | 0x20u) <= 'z';
    if (n == 1)
        return letter ? LIT_EXACT : LIT_EXACT | LIT_FOLDED;
    return n == 2 && letter && c[1] == (c[0] | 0x20u) && c[0] == (c[1] & ~0x20u) ? LIT_FOLDED
                                                                                 : LIT_NONE;
}

/* The literal kinds of a rule's tree (a byte-set sequence), or LIT_NONE. */
static unsigned rule_literal_kinds(const struct node *root)
{
    if (root->type == N_SET)
        return set_literal_kinds(&root->u.set);
    if (root->type != N_CAT)
        return LIT_NONE;
    unsigned k = LIT_EXACT | LIT_FOLDED;
    for (uint32_t i = 0; i < root->u.list.n && k != LIT_NONE; i++)
        k &= root->u.list.kids[i]->type == N_SET ? set_literal_kinds(&root->u.list.kids[i]->u.set)
                                                 : LIT_NONE;
    return k;
}

uint32_t nfa_builder_states(const struct nfa_builder *b)
{
    return b->n_states;
}

/* Returns a new state id, or UINT32_MAX when out of memory. */
static uint32_t new_state(struct nfa_builder *b)
{
    if (b->n_states == b->accept_cap) {
        size_t cap = b->accept_cap * 2;
        int32_t *a = realloc(b->accept, cap * sizeof(*a));
        if (a == NULL)
            return UINT32_MAX;
        b->accept = a;
        b->accept_cap = cap;
    }
    b->accept[b->n_states] = -1;
    return b->n_states++;
}

static int edge_push(struct edge_vec *v, uint32_t from, uint32_t label, uint32_t to)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        struct edge_rec *n = realloc(v->v, cap * sizeof(*n));
        if (n == NULL)
            return -ENOMEM;
        v->v = n;
        v->cap = cap;
    }
    v->v[v->n++] = (struct edge_rec){from, label, to};
    return 0;
}

/* Interns a byte set; returns its id or UINT32_MAX when out of memory. */
static uint32_t intern_set(struct nfa_builder *b, const struct byteset *s)
{
    uint64_t h = mix64(s->w[0] ^ mix64(s->w[1] ^ mix64(s->w[2] ^ mix64(s->w[3]))));
    for (uint64_t probe = 0;; probe++) {
        bool found;
        uint64_t key = (h + probe * 0x9e3779b97f4a7c15ULL) | 1;
        uint32_t *slot = map_slot(&b->set_index, key, &found);
        if (slot == NULL)
            return UINT32_MAX;
        if (found) {
            if (memcmp(&b->sets[*slot], s, sizeof(*s)) == 0)
                return *slot;
            continue;
        }
        if (b->n_sets == b->sets_cap) {
            uint32_t cap = b->sets_cap ? b->sets_cap * 2 : 64;
            struct byteset *n = realloc(b->sets, cap * sizeof(*n));
            if (n == NULL)
                return UINT32_MAX;
            b->sets = n;
            b->sets_cap = cap;
        }
        b->sets[b->n_sets] = *s;
        *slot = b->n_sets;
        return b->n_sets++;
    }
}

static uint32_t byte_step(struct nfa_builder *b, uint32_t in, const struct byteset *s)
{
    uint32_t id = intern_set(b, s);
    uint32_t t = id == UINT32_MAX ? UINT32_MAX : new_state(b);
    if (t == UINT32_MAX || edge_push(&b->bytes, in, id, t) != 0)
        return UINT32_MAX;
    return t;
}

/* Follows or creates the trie child of `in` on set `s`. */
static uint32_t trie_step(struct nfa_builder *b, uint32_t in, const struct byteset *s)
{
    uint32_t id = intern_set(b, s);
    if (id == UINT32_MAX)
        return UINT32_MAX;
    bool found;
    uint32_t *slot = map_slot(&b->trie, ((uint64_t)in << 32 | id) + 1, &found);
    if (slot == NULL)
        return UINT32_MAX;
    if (found)
        return *slot;
    uint32_t t = new_state(b);
    if (t == UINT32_MAX || edge_push(&b->bytes, in, id, t) != 0)
        return UINT32_MAX;
    /* map_slot may not be reused after new_state: look it up again */
    slot = map_slot(&b->trie, ((uint64_t)in << 32 | id) + 1, &found);
    if (slot == NULL)
        return UINT32_MAX;
    *slot = t;
    return t;
}

static int eps(struct nfa_builder *b, uint32_t from, uint32_t to, uint32_t cond)
{
    if (cond != COND_ALWAYS)
        b->has_cond = true;
    return edge_push(&b->eps, from, cond, to);
}

#define NEXT_ALL                                                                                   \
    (COND_NEXT(CAT_K_WORD) | COND_NEXT(CAT_K_NL) | COND_NEXT(CAT_K_OTHER) | COND_NEXT(CAT_K_EOD) | \
     COND_NEXT(CAT_K_NL_LAST))
#define NEXT_NONWORD (NEXT_ALL & ~COND_NEXT(CAT_K_WORD))
#define PREV_ALL     COND_PREVMASK
#define PREV_NONWORD (COND_PREV(P_BOS) | COND_PREV(P_NL) | COND_PREV(P_OTHER))

static uint32_t build_assert(struct nfa_builder *b, uint32_t in, enum assert_kind k)
{
    uint32_t t = new_state(b);
    if (t == UINT32_MAX)
        return t;
    uint32_t c1 = 0, c2 = 0;
    switch (k) {
    case A_BOS:
        c1 = COND_PREV(P_BOS) | NEXT_ALL;
        break;
    case A_BOL:
        c1 = COND_PREV(P_BOS) | COND_PREV(P_NL) | NEXT_ALL;
        break;
    case A_EOD:
        c1 = PREV_ALL | COND_NEXT(CAT_K_EOD);
        break;
    case A_DOLLAR:
        c1 = PREV_ALL | COND_NEXT(CAT_K_EOD) | COND_NEXT(CAT_K_NL_LAST);
        break;
    case A_EOL:
        c1 = PREV_ALL | COND_NEXT(CAT_K_EOD) | COND_NEXT(CAT_K_NL_LAST) | COND_NEXT(CAT_K_NL);
        break;
    case A_WORDB:
        c1 = COND_PREV(P_WORD) | NEXT_NONWORD;
        c2 = PREV_NONWORD | COND_NEXT(CAT_K_WORD);
        break;
    case A_NOTWORDB:
        c1 = COND_PREV(P_WORD) | COND_NEXT(CAT_K_WORD);
        c2 = PREV_NONWORD | NEXT_NONWORD;
        break;
    }
    if (eps(b, in, t, c1) != 0 || (c2 && eps(b, in, t, c2) != 0))
        return UINT32_MAX;
    return t;
}

/* Thompson construction: builds `n` starting at state `in` and returns the
 * state where it ends. Back edges only ever point at states created here. */
static uint32_t build(struct nfa_builder *b, const struct node *n, uint32_t in)
{
    switch (n->type) {
    case N_SET:
        return byte_step(b, in, &n->u.set);
    case N_ASSERT:
        return build_assert(b, in, n->u.as);
    case N_CAT:
        for (uint32_t k = 0; k < n->u.list.n && in != UINT32_MAX; k++)
            in = build(b, n->u.list.kids[k], in);
        return in;
    case N_ALT: {
        /* (a|b|[cd]) is one byte set: one position, not one per branch */
        struct byteset u = {{0}};
        uint32_t k = 0;
        for (; k < n->u.list.n && n->u.list.kids[k]->type == N_SET; k++)
            for (int w = 0; w < 4; w++)
                u.w[w] |= n->u.list.kids[k]->u.set.w[w];
        if (k == n->u.list.n)
            return byte_step(b, in, &u);
        uint32_t out = new_state(b);
        for (uint32_t k = 0; k < n->u.list.n && out != UINT32_MAX; k++) {
            uint32_t e = build(b, n->u.list.kids[k], in);
            if (e == UINT32_MAX || eps(b, e, out, COND_ALWAYS) != 0)
                return UINT32_MAX;
        }
        return out;
    }
    case N_REPEAT: {
        const struct node *kid = n->u.rep.kid;
        for (uint32_t k = 0; k < n->u.rep.min && in != UINT32_MAX; k++)
            in = build(b, kid, in);
        if (in == UINT32_MAX)
            return in;
        if (n->u.rep.max == REPEAT_INF) {
            uint32_t loop = new_state(b);
            if (loop == UINT32_MAX || eps(b, in, loop, COND_ALWAYS) != 0)
                return UINT32_MAX;
            uint32_t e = build(b, kid, loop);
            if (e == UINT32_MAX || eps(b, e, loop, COND_ALWAYS) != 0)
                return UINT32_MAX;
            return loop;
        }
        uint32_t out = new_state(b);
        if (out == UINT32_MAX || eps(b, in, out, COND_ALWAYS) != 0)
            return UINT32_MAX;
        for (uint32_t k = n->u.rep.min; k < n->u.rep.max; k++) {
            in = build(b, kid, in);
            if (in == UINT32_MAX || eps(b, in, out, COND_ALWAYS) != 0)
                return UINT32_MAX;
        }
        return out;
    }
    }
    return UINT32_MAX;
}

int nfa_builder_add(struct nfa_builder *b, const struct node *root, uint32_t rule)
{
    uint32_t in = 0;
    const struct node *rest = root;
    if (root->type == N_SET) {
        in = trie_step(b, 0, &root->u.set);
        rest = NULL;
    } else if (root->type == N_CAT) {
        uint32_t k = 0;
        while (k < root->u.list.n && root->u.list.kids[k]->type == N_SET && in != UINT32_MAX)
            in = trie_step(b, in, &root->u.list.kids[k++]->u.set);
        for (; k < root->u.list.n && in != UINT32_MAX; k++)
            in = build(b, root->u.list.kids[k], in);
        rest = NULL;
    }
    if (rest != NULL && in != UINT32_MAX)
        in = build(b, rest, in);
    if (in == UINT32_MAX)
        return -ENOMEM;
    /* A final state of its own, so rules with equal patterns keep apart. */
    uint32_t fin = new_state(b);
    if (fin == UINT32_MAX || eps(b, in, fin, COND_ALWAYS) != 0)
        return -ENOMEM;
    b->accept[fin] = (int32_t)rule;
    if (b->lit_kinds != LIT_NONE)
        b->lit_kinds &= rule_literal_kinds(root);
    if (rule + 1 > b->n_rules)
        b->n_rules = rule + 1;
    return 0;
}

/* Counting sort of edge records by `from` into CSR arrays. */
static int to_csr(const struct edge_vec *v, uint32_t n_states, uint32_t **first, void **edges)
{
    uint32_t *f = calloc((size_t)n_states + 1, sizeof(*f));
    uint32_t *e = malloc((v->n ? v->n : 1) * 2 * sizeof(uint32_t));
    if (f == NULL || e == NULL) {
        free(f);
        free(e);
        return -ENOMEM;
    }
    for (size_t i = 0; i < v->n; i++)
        f[v->v[i].from + 1]++;
    for (uint32_t s = 0; s < n_states; s++)
        f[s + 1] += f[s];
    uint32_t *pos = malloc(((size_t)n_states + 1) * sizeof(*pos));
    if (pos == NULL) {
        free(f);
        free(e);
        return -ENOMEM;
    }
    memcpy(pos, f, ((size_t)n_states + 1) * sizeof(*pos));
    for (size_t i = 0; i < v->n; i++) {
        uint32_t at = pos[v->v[i].from]++;
        e[2 * at] = v->v[i].label;
        e[2 * at + 1] = v->v[i].to;
    }
    free(pos);
    *first = f;
    *edges = e;
    return 0;
}

int nfa_builder_finish(struct nfa_builder *b, struct nfa *out)
{
    memset(out, 0, sizeof(*out));
    out->n_states = b->n_states;
    out->start = 0;
    out->n_rules = b->n_rules;
    out->has_cond = b->has_cond;
    out->literal = b->lit_kinds != LIT_NONE && b->n_rules > 0;
    void *be = NULL, *ee = NULL;
    if (to_csr(&b->bytes, b->n_states, &out->byte_first, &be) != 0 ||
        to_csr(&b->eps, b->n_states, &out->eps_first, &ee) != 0) {
        free(be);
        nfa_finish(out);
        return -ENOMEM;
    }
    out->byte_edges = be;
    out->eps_edges = ee;
    out->accept = malloc((size_t)b->n_states * sizeof(*out->accept));
    out->sets = malloc((b->n_sets ? b->n_sets : 1) * sizeof(*out->sets));
    if (out->accept == NULL || out->sets == NULL) {
        nfa_finish(out);
        return -ENOMEM;
    }
    memcpy(out->accept, b->accept, (size_t)b->n_states * sizeof(*out->accept));
    if (b->n_sets)
        memcpy(out->sets, b->sets, b->n_sets * sizeof(*out->sets));
    out->n_sets = b->n_sets;
    return 0;
}

void nfa_finish(struct nfa *nfa)
{
    if (nfa == NULL)
        return;
    free(nfa->byte_first);
    free(nfa->byte_edges);
    free(nfa->eps_first);
    free(nfa->eps_edges);
    free(nfa->accept);
    free(nfa->sets);
    memset(nfa, 0, sizeof(*nfa));
}

/* ---- simulation ---- */

uint32_t nfa_next_kind(const uint8_t *buf, size_t len, size_t i)
{
    if (i >= len)
        return CAT_K_EOD;
    uint32_t k = catalog_byte_kind(buf[i]);
    return k == CAT_K_NL && i + 1 == len ? CAT_K_NL_LAST : k;
}

uint32_t nfa_prev_kind(const uint8_t *buf, size_t i)
{
    if (i == 0)
        return P_BOS;
    switch (catalog_byte_kind(buf[i - 1])) {
    case CAT_K_WORD:
        return P_WORD;
    case CAT_K_NL:
        return P_NL;
    default:
        return P_OTHER;
    }
}

/* Set of states with O(1) insert and membership (sparse set). */
struct sset {
    uint32_t *dense, *sparse;
    uint32_t n;
};

static bool sset_has(const struct sset *s, uint32_t x)
{
    return s->sparse[x] < s->n && s->dense[s->sparse[x]] == x;
}

static void sset_add(struct sset *s, uint32_t x)
{
    if (!sset_has(s, x)) {
        s->sparse[x] = s->n;
        s->dense[s->n++] = x;
    }
}

/* Closes `s` under epsilon edges allowed for (prev p, next k). */
static void close_under(const struct nfa *nfa, struct sset *s, uint32_t p, uint32_t k)
{
    uint32_t want = COND_PREV(p) | COND_NEXT(k);
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t st = s->dense[i];
        for (uint32_t e = nfa->eps_first[st]; e < nfa->eps_first[st + 1]; e++) {
            uint32_t c = nfa->eps_edges[e].cond;
            if ((c & want) == want)
                sset_add(s, nfa->eps_edges[e].to);
        }
    }
}

int nfa_simulate(const struct nfa *nfa, const uint8_t *buf, size_t len,
                 int (*fn)(void *ctx, uint32_t rule, uint64_t end), void *ctx)
{
    size_t n = nfa->n_states;
    struct sset cur = {0}, nxt = {0};
    uint8_t *seen = calloc(nfa->n_rules ? nfa->n_rules : 1, 1);
    cur.dense = malloc(n * sizeof(uint32_t));
    cur.sparse = calloc(n, sizeof(uint32_t));
    nxt.dense = malloc(n * sizeof(uint32_t));
    nxt.sparse = calloc(n, sizeof(uint32_t));
    int rc = 0;
    if (seen == NULL || cur.dense == NULL || cur.sparse == NULL || nxt.dense == NULL ||
        nxt.sparse == NULL) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i <= len && rc == 0; i++) {
        sset_add(&cur, nfa->start); /* a match may start anywhere */
        uint32_t p = nfa_prev_kind(buf, i), k = nfa_next_kind(buf, len, i);
        close_under(nfa, &cur, p, k);
        memset(seen, 0, nfa->n_rules ? nfa->n_rules : 1);
        for (uint32_t j = 0; j < cur.n && rc == 0; j++) {
            int32_t r = nfa->accept[cur.dense[j]];
            if (r >= 0 && !seen[r]) {
                seen[r] = 1;
                rc = fn(ctx, (uint32_t)r, i);
            }
        }
        if (i == len)
            break;
        nxt.n = 0;
        for (uint32_t j = 0; j < cur.n; j++) {
            uint32_t st = cur.dense[j];
            for (uint32_t e = nfa->byte_first[st]; e < nfa->byte_first[st + 1]; e++)
                if (byteset_has(&nfa->sets[nfa->byte_edges[e].set], buf[i]))
                    sset_add(&nxt, nfa->byte_edges[e].to);
        }
        struct sset t = cur;
        cur = nxt;
        nxt = t;
    }
out:
    free(seen);
    free(cur.dense);
    free(cur.sparse);
    free(nxt.dense);
    free(nxt.sparse);
    return rc;
}
