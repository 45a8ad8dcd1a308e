/*
 * Subset construction and minimisation. See dfa.h for the model.
 *
 * Every DFA state contains R0, the closure of the NFA start (a match may
 * begin at any byte), so states are stored and hashed as E = S \ R0 plus the
 * previous-byte kind. When the states of E contribute nothing on a byte
 * class, the transition equals the start state's: that is the Aho-Corasick
 * "failure" shortcut, and it is what keeps literal groups fast to build.
 */
#include "dfa.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "catalog.h"

/*
 * The large arrays of a build and a minimisation (rows, state tables, their
 * maps) are mapped from the kernel from MAPPED_BYTES up, grown with mremap
 * and unmapped when done, whatever the heap's policy: once a large block has
 * been freed, glibc raises its mmap threshold (to 32 MiB), after which such
 * arrays came from the heap, where a finished build's pages stayed resident
 * and the next, larger build's were new ones. regex-500-secrets' compile
 * peaked at 5.5x its catalog that way, 4.0x with its arrays mapped
 * (session 14, docs/PERFORMANCE.md). A DFA's trans and acc_first are such
 * arrays (dfa_finish frees them).
 */
#if defined(__SANITIZE_ADDRESS__)
#define MAPPED_BYTES SIZE_MAX /* AddressSanitizer checks malloc's blocks only */
#else
#define MAPPED_BYTES (256u << 10)
#endif

struct arr_head {
    size_t mapped;    /* mapped bytes, the header's page included; 0: from malloc */
    size_t bytes;     /* asked for */
    size_t populated; /* mapped: bytes from the header known to be backed (arr_touch) */
    size_t pad;       /* keeps the data 16-byte aligned */
};

/* realloc for such arrays: NULL starts one; NULL when out of memory, the
 * array unchanged. */
static void *arr_realloc(void *p, size_t n)
{
    struct arr_head *h = p != NULL ? (struct arr_head *)p - 1 : NULL, *m;
    size_t want = sizeof(*h) + (n ? n : 1);
    /* a new mapping is backed as far as it is written here: its header, and
     * the heap copy moved into it; a remapped one keeps what it had */
    size_t backed = h == NULL        ? sizeof(*h)
                    : h->mapped != 0 ? h->populated
                                     : sizeof(*h) + (h->bytes < n ? h->bytes : n);
    if (h != NULL && h->mapped != 0) {
        m = mremap(h, h->mapped, want, MREMAP_MAYMOVE);
    } else if (want < MAPPED_BYTES) {
        m = realloc(h, want);
        if (m == NULL)
            return NULL;
        m->mapped = 0;
        m->bytes = n;
        return m + 1;
    } else {
        m = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED && h != NULL) {
            memcpy(m + 1, h + 1, h->bytes < n ? h->bytes : n);
            free(h);
        }
    }
    if (m == MAP_FAILED)
        return NULL;
    m->mapped = want;
    m->bytes = n;
    m->populated = backed < want ? backed : want;
    return m + 1;
}

/*
 * Backs the pages of a mapped array up to byte `upto` of its data ahead of
 * their first write, a chunk at a time (at least POPULATE_CHUNK, or an
 * eighth of what is backed), with one madvise(MADV_POPULATE_WRITE) instead
 * of a page fault per page. Rows are written in state order, and a fault
 * per 4 KiB page was 12-16% of a literal set's compile on the development
 * machine (perf: literals-1k, dict-15, 350-1,300 faults a compile; session
 * 23). A kernel without MADV_POPULATE_WRITE (before 5.14) faults as before.
 */
#define POPULATE_CHUNK (256u << 10)

static void arr_touch(void *p, size_t upto)
{
    struct arr_head *h = (struct arr_head *)p - 1;
    size_t end = sizeof(*h) + upto;
    if (h->mapped == 0 || end <= h->populated)
        return;
    size_t page = 4096, step = h->populated / 8;
    step = step > POPULATE_CHUNK ? step : POPULATE_CHUNK;
    size_t from = h->populated & ~(page - 1);
    size_t to = (end > h->populated + step ? end : h->populated + step) + page - 1;
    to &= ~(page - 1);
    if (to > h->mapped)
        to = h->mapped;
    if (madvise((char *)h + from, to - from, MADV_POPULATE_WRITE) != 0)
        to = h->mapped; /* not supported: leave it to the faults */
    h->populated = to;
}

static void *arr_calloc(size_t n, size_t size)
{
    uint32_t *p = arr_realloc(NULL, n * size);
    if (p != NULL && ((struct arr_head *)p - 1)->mapped == 0)
        memset(p, 0, n * size); /* mapped pages are zero */
    return p;
}

static void arr_free(void *p)
{
    if (p == NULL)
        return;
    struct arr_head *h = (struct arr_head *)p - 1;
    if (h->mapped != 0)
        munmap(h, h->mapped);
    else
        free(h);
}

#define N_NEXT   5 /* CAT_K_* */
#define PK(p, k) (1u << ((p)*N_NEXT + (k)))

struct u32vec {
    uint32_t *v;
    size_t n, cap;
};

static int vec_grow(struct u32vec *v)
{
    size_t cap = v->cap ? v->cap * 2 : 16;
    uint32_t *n = realloc(v->v, cap * sizeof(*n));
    if (n == NULL)
        return -ENOMEM;
    v->v = n;
    v->cap = cap;
    return 0;
}

static inline int vec_push(struct u32vec *v, uint32_t x)
{
    if (v->n == v->cap && vec_grow(v) != 0)
        return -ENOMEM;
    v->v[v->n++] = x;
    return 0;
}

struct builder {
    const struct nfa *nfa;
    uint32_t max_states;
    bool cond; /* the NFA has conditional edges */

    uint32_t n_classes;
    uint32_t classmap[256];
    uint8_t class_kind[256];           /* CAT_K_WORD / NL / OTHER of each class */
    uint32_t *set_cls_first, *set_cls; /* classes inside each byte set */

    uint8_t *in_r0;
    uint32_t *r0pk;     /* per NFA state: PK(p,k) bits of closure(R0, p, k) */
    uint16_t *reach_pm; /* per NFA state: prev masks of conditional edges reachable */
    uint16_t r0_pm;
    struct u32vec r0step[4]; /* per p: (class, target) pairs sorted by class */
    uint32_t *r0step_first[4];

    /* DFA states: state s's set is pool.v[set_off[s] .. set_off[s + 1]),
     * encoded (encode_set) */
    uint32_t n_states, cap_states;
    uint32_t *set_off, *hash;
    uint8_t *prev;
    struct u32vec pool;
    uint32_t set_words; /* words of a set as a bitmap of the NFA's states */
    struct u32vec enc;  /* intern's encoding of b->list */
    uint32_t *ht;
    size_t ht_cap;
    uint32_t *trans;
    struct u32vec acc;
    uint32_t *acc_first;
    uint32_t start[4];

    /* canon_prev of every prev mask, computed once each: bit 15 set when
     * known, bits 2p..2p+1 the canonical kind of p */
    uint16_t *canon;

    struct u32vec ecopy; /* expand's copy of the state's set */

    /* scratch */
    uint32_t *stamp, gen;
    struct u32vec work, list;
    struct u32vec *bkt; /* per class */
    struct u32vec touched;
    uint32_t *rule_mask;
    struct u32vec rules_touched;
};

/* ---- byte classes ---- */

static void compute_classes(struct builder *b)
{
    const struct nfa *nfa = b->nfa;
    uint32_t n = 1;
    memset(b->classmap, 0, sizeof(b->classmap));
    struct byteset kinds[2] = {{{0}}, {{0}}};
    for (unsigned c = 0; c < 256; c++) {
        uint32_t k = catalog_byte_kind((uint8_t)c);
        if (k == CAT_K_WORD)
            byteset_add(&kinds[0], c);
        else if (k == CAT_K_NL)
            byteset_add(&kinds[1], c);
    }
    uint32_t n_sets = nfa->n_sets + (b->cond ? 2 : 0);
    for (uint32_t i = 0; i < n_sets; i++) {
        const struct byteset *s = i < nfa->n_sets ? &nfa->sets[i] : &kinds[i - nfa->n_sets];
        int32_t split[256][2];
        for (uint32_t c = 0; c < n; c++)
            split[c][0] = split[c][1] = -1;
        uint32_t m = 0;
        for (unsigned c = 0; c < 256; c++) {
            int in = byteset_has(s, c);
            int32_t *slot = &split[b->classmap[c]][in];
            if (*slot < 0)
                *slot = (int32_t)m++;
            b->classmap[c] = (uint32_t)*slot;
        }
        n = m;
    }
    b->n_classes = n;
    for (unsigned c = 0; c < 256; c++)
        b->class_kind[b->classmap[c]] = (uint8_t)catalog_byte_kind((uint8_t)c);
}

static int classes_of_sets(struct builder *b)
{
    const struct nfa *nfa = b->nfa;
    int rep[256];
    for (uint32_t c = 0; c < b->n_classes; c++)
        rep[c] = -1;
    for (int c = 255; c >= 0; c--)
        rep[b->classmap[c]] = c;
    b->set_cls_first = calloc((size_t)nfa->n_sets + 1, sizeof(uint32_t));
    struct u32vec v = {0};
    if (b->set_cls_first == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < nfa->n_sets; i++) {
        for (uint32_t c = 0; c < b->n_classes; c++)
            if (byteset_has(&nfa->sets[i], (unsigned)rep[c]) && vec_push(&v, c) != 0) {
                free(v.v);
                return -ENOMEM;
            }
        b->set_cls_first[i + 1] = (uint32_t)v.n;
    }
    b->set_cls = v.v;
    return 0;
}

/* ---- closures ---- */

static bool cond_allows(uint32_t cond, uint32_t p, uint32_t k)
{
    return (cond & COND_PREV(p)) && (cond & COND_NEXT(k));
}

/* Unconditional closure of R0 from the start state, marking in_r0. */
static int close_r0(struct builder *b)
{
    const struct nfa *nfa = b->nfa;
    b->work.n = 0;
    if (vec_push(&b->work, nfa->start) != 0)
        return -ENOMEM;
    b->in_r0[nfa->start] = 1;
    for (size_t i = 0; i < b->work.n; i++) {
        uint32_t s = b->work.v[i];
        for (uint32_t e = nfa->eps_first[s]; e < nfa->eps_first[s + 1]; e++) {
            uint32_t t = nfa->eps_edges[e].to;
            if (nfa->eps_edges[e].cond == COND_ALWAYS && !b->in_r0[t]) {
                b->in_r0[t] = 1;
                if (vec_push(&b->work, t) != 0)
                    return -ENOMEM;
            }
        }
    }
    return 0;
}

/* For every NFA state: which prev masks of conditional edges can be reached
 * through epsilon edges. Fixpoint over the (possibly cyclic) epsilon graph. */
static void compute_reach_pm(struct builder *b)
{
    const struct nfa *nfa = b->nfa;
    for (uint32_t s = 0; s < nfa->n_states; s++) {
        uint16_t m = 0;
        for (uint32_t e = nfa->eps_first[s]; e < nfa->eps_first[s + 1]; e++)
            if (nfa->eps_edges[e].cond != COND_ALWAYS)
                m |= (uint16_t)(1u << (nfa->eps_edges[e].cond & COND_PREVMASK));
        b->reach_pm[s] = m;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t s = nfa->n_states; s-- > 0;) {
            uint16_t m = b->reach_pm[s];
            for (uint32_t e = nfa->eps_first[s]; e < nfa->eps_first[s + 1]; e++)
                m |= b->reach_pm[nfa->eps_edges[e].to];
            if (m != b->reach_pm[s]) {
                b->reach_pm[s] = m;
                changed = true;
            }
        }
    }
}

/* The canonical previous kind: the smallest kind that no reachable
 * conditional edge can tell apart from `p`. */
static uint32_t canon_prev(uint32_t p, uint16_t pm)
{
    uint32_t sig[4] = {0};
    for (uint32_t m = 0; m < 16; m++)
        if (pm & (1u << m))
            for (uint32_t q = 0; q < 4; q++)
                sig[q] = sig[q] << 1 | ((m >> q) & 1u);
    for (uint32_t q = 0; q < 4; q++)
        if (sig[q] == sig[p])
            return q;
    return p;
}

/*
 * Closure of `from` (a list of NFA states) under the epsilon edges that
 * (p, k) allows, leaving out states of closure(R0, p, k). The result goes to
 * b->list. With p == UINT32_MAX only unconditional edges are followed, and
 * states of R0 are left out.
 */
static int closure(struct builder *b, const uint32_t *from, size_t n, uint32_t p, uint32_t k)
{
    const struct nfa *nfa = b->nfa;
    uint32_t gen = ++b->gen;
    b->list.n = 0;
    uint32_t bit = p == UINT32_MAX ? 0 : PK(p, k);
    for (size_t i = 0; i < n; i++) {
        uint32_t s = from[i];
        bool skip = p == UINT32_MAX ? b->in_r0[s] : (b->r0pk[s] & bit) != 0;
        if (!skip && b->stamp[s] != gen) {
            b->stamp[s] = gen;
            if (vec_push(&b->list, s) != 0)
                return -ENOMEM;
        }
    }
    for (size_t i = 0; i < b->list.n; i++) {
        uint32_t s = b->list.v[i];
        for (uint32_t e = nfa->eps_first[s]; e < nfa->eps_first[s + 1]; e++) {
            uint32_t t = nfa->eps_edges[e].to, c = nfa->eps_edges[e].cond;
            bool ok = p == UINT32_MAX ? c == COND_ALWAYS : cond_allows(c, p, k);
            bool skip = p == UINT32_MAX ? b->in_r0[t] : (b->r0pk[t] & bit) != 0;
            if (ok && !skip && b->stamp[t] != gen) {
                b->stamp[t] = gen;
                if (vec_push(&b->list, t) != 0)
                    return -ENOMEM;
            }
        }
    }
    return 0;
}

/* closure(R0, p, k) for every (p, k), as bits in r0pk; and per p the step of
 * that closure on each class whose kind is k, as lists sorted by class. */
static int prepare_r0(struct builder *b)
{
    const struct nfa *nfa = b->nfa;
    struct u32vec pairs = {0};
    uint32_t *count = calloc((size_t)b->n_classes + 1, sizeof(uint32_t));
    int rc = count == NULL ? -ENOMEM : 0;
    for (uint32_t p = 0; p < 4 && rc == 0; p++) {
        pairs.n = 0;
        for (uint32_t k = 0; k < N_NEXT && rc == 0; k++) {
            uint32_t gen = ++b->gen;
            b->work.n = 0;
            for (uint32_t s = 0; s < nfa->n_states && rc == 0; s++)
                if (b->in_r0[s]) {
                    b->stamp[s] = gen;
                    rc = vec_push(&b->work, s);
                }
            for (size_t i = 0; i < b->work.n && rc == 0; i++) {
                uint32_t s = b->work.v[i];
                b->r0pk[s] |= PK(p, k);
                for (uint32_t e = nfa->eps_first[s]; e < nfa->eps_first[s + 1] && rc == 0; e++) {
                    uint32_t t = nfa->eps_edges[e].to;
                    if (cond_allows(nfa->eps_edges[e].cond, p, k) && b->stamp[t] != gen) {
                        b->stamp[t] = gen;
                        rc = vec_push(&b->work, t);
                    }
                }
            }
            if (k >= 3 || (!b->cond && k > 0))
                continue; /* EOD and NL_LAST never label a consumed byte */
            for (size_t i = 0; i < b->work.n && rc == 0; i++) {
                uint32_t s = b->work.v[i];
                for (uint32_t e = nfa->byte_first[s]; e < nfa->byte_first[s + 1]; e++) {
                    uint32_t set = nfa->byte_edges[e].set;
                    for (uint32_t j = b->set_cls_first[set];
                         j < b->set_cls_first[set + 1] && rc == 0; j++) {
                        uint32_t c = b->set_cls[j];
                        if (b->cond && b->class_kind[c] != k)
                            continue;
                        rc = vec_push(&pairs, c);
                        if (rc == 0)
                            rc = vec_push(&pairs, nfa->byte_edges[e].to);
                    }
                }
            }
        }
        if (rc != 0)
            break;
        /* counting sort of the (class, target) pairs by class */
        b->r0step_first[p] = calloc((size_t)b->n_classes + 1, sizeof(uint32_t));
        b->r0step[p].v = malloc((pairs.n / 2 + 1) * sizeof(uint32_t));
        if (b->r0step_first[p] == NULL || b->r0step[p].v == NULL) {
            rc = -ENOMEM;
            break;
        }
        for (size_t i = 0; i < pairs.n; i += 2)
            b->r0step_first[p][pairs.v[i] + 1]++;
        for (uint32_t c = 0; c < b->n_classes; c++)
            b->r0step_first[p][c + 1] += b->r0step_first[p][c];
        memcpy(count, b->r0step_first[p], ((size_t)b->n_classes + 1) * sizeof(uint32_t));
        for (size_t i = 0; i < pairs.n; i += 2)
            b->r0step[p].v[count[pairs.v[i]]++] = pairs.v[i + 1];
        b->r0step[p].n = pairs.n / 2;
    }
    free(pairs.v);
    free(count);
    return rc;
}

/* ---- the state table ---- */

static uint32_t hash_state(const uint32_t *v, size_t n, uint32_t prev)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ prev;
    for (size_t i = 0; i < n; i++) {
        h ^= v[i];
        h *= 0x100000001b3ULL;
        h ^= h >> 29;
    }
    return (uint32_t)(h ^ (h >> 32));
}

/*
 * The per-state arrays first hold the whole budget, up to RESERVE_BYTES:
 * they are written in state order, so the pages a small build never
 * reaches cost no memory, and a large one does not grow in steps. Grown by
 * doubling from the heap, they left each old copy behind, touched (before
 * they were mapped, above): phrases-3k's peak fell from 4.2x to 3.5x its
 * catalog in a compile_bench run of every workload.
 */
#define RESERVE_BYTES (16u << 20)

static uint32_t first_cap(const struct builder *b)
{
    uint64_t fit = RESERVE_BYTES / ((uint64_t)b->n_classes * sizeof(uint32_t) + 17);
    uint64_t cap = fit < 1024 ? 1024 : fit;
    return cap < b->max_states ? (uint32_t)cap : b->max_states > 0 ? b->max_states : 1;
}

/* Rehashes the states into a table of twice the size (at least 2048). */
static int grow_table(struct builder *b)
{
    size_t ht_cap = b->ht_cap ? b->ht_cap * 2 : 2048;
    uint32_t *ht = arr_calloc(ht_cap, sizeof(*ht));
    if (ht == NULL)
        return -ENOMEM;
    for (uint32_t s = 0; s < b->n_states; s++) {
        size_t j = b->hash[s] & (ht_cap - 1);
        while (ht[j] != 0)
            j = (j + 1) & (ht_cap - 1);
        ht[j] = s + 1;
    }
    arr_free(b->ht);
    b->ht = ht;
    b->ht_cap = ht_cap;
    return 0;
}

static int grow_states(struct builder *b)
{
    uint64_t want = b->cap_states ? (uint64_t)b->cap_states * 2 : first_cap(b);
    uint32_t cap = want < UINT32_MAX ? (uint32_t)want : UINT32_MAX - 1;
    uint32_t *off = arr_realloc(b->set_off, ((size_t)cap + 1) * sizeof(*off));
    if (off)
        b->set_off = off;
    uint32_t *hash = arr_realloc(b->hash, cap * sizeof(*hash));
    if (hash)
        b->hash = hash;
    uint8_t *prev = arr_realloc(b->prev, cap);
    if (prev)
        b->prev = prev;
    uint32_t *trans = arr_realloc(b->trans, (size_t)cap * b->n_classes * sizeof(*trans));
    if (trans)
        b->trans = trans;
    uint32_t *af = arr_realloc(b->acc_first, ((size_t)cap + 1) * sizeof(*af));
    if (af)
        b->acc_first = af;
    if (!off || !hash || !prev || !trans || !af)
        return -ENOMEM;
    b->cap_states = cap;
    return 0;
}

/*
 * A state's set as stored in the pool: the sorted list of its NFA states
 * when shorter than set_words, else a bitmap of set_words words. One set
 * has one encoding, so equal sets are equal words; a length of set_words
 * means a bitmap. Sets of a small NFA with a large DFA are long lists of
 * few states: a rule of 51 NFA states that reached the budget of 65,536
 * DFA states held 8 MiB of lists, 0.5 MiB as bitmaps.
 */
static int encode_set(struct builder *b, const uint32_t **v, size_t *n)
{
    if (*n < b->set_words)
        return 0;
    b->enc.n = 0;
    while (b->enc.cap < b->set_words)
        if (vec_grow(&b->enc) != 0)
            return -ENOMEM;
    memset(b->enc.v, 0, b->set_words * sizeof(uint32_t));
    for (size_t i = 0; i < *n; i++)
        b->enc.v[(*v)[i] >> 5] |= 1u << ((*v)[i] & 31u);
    *v = b->enc.v;
    *n = b->set_words;
    return 0;
}

static int pool_grow(struct u32vec *v)
{
    size_t cap = v->cap ? v->cap * 2 : 1024;
    uint32_t *n = arr_realloc(v->v, cap * sizeof(*n));
    if (n == NULL)
        return -ENOMEM;
    v->v = n;
    v->cap = cap;
    return 0;
}

/* Appends the sorted NFA states of DFA state s to `out`. */
static int decode_set(const struct builder *b, uint32_t s, struct u32vec *out)
{
    const uint32_t *w = b->pool.v + b->set_off[s];
    uint32_t len = b->set_off[s + 1] - b->set_off[s];
    if (len < b->set_words) {
        for (uint32_t i = 0; i < len; i++)
            if (vec_push(out, w[i]) != 0)
                return -ENOMEM;
        return 0;
    }
    for (uint32_t i = 0; i < len; i++)
        for (uint32_t bits = w[i]; bits != 0; bits &= bits - 1)
            if (vec_push(out, i << 5 | (uint32_t)__builtin_ctz(bits)) != 0)
                return -ENOMEM;
    return 0;
}

/* Finds or adds the state (b->list sorted, prev). Returns its id in *id;
 * -E2BIG past the budget. */
static int intern(struct builder *b, uint32_t prev, uint32_t *id)
{
    const uint32_t *v = b->list.v;
    size_t n = b->list.n;
    if (encode_set(b, &v, &n) != 0)
        return -ENOMEM;
    uint32_t h = hash_state(v, n, prev);
    if (b->ht_cap != 0) {
        size_t j = h & (b->ht_cap - 1);
        for (; b->ht[j] != 0; j = (j + 1) & (b->ht_cap - 1)) {
            uint32_t s = b->ht[j] - 1;
            if (b->hash[s] == h && b->prev[s] == prev && b->set_off[s + 1] - b->set_off[s] == n &&
                (n == 0 || memcmp(b->pool.v + b->set_off[s], v, n * sizeof(*v)) == 0)) {
                *id = s;
                return 0;
            }
        }
    }
    if (b->n_states >= b->max_states)
        return -E2BIG;
    if (b->n_states == b->cap_states && grow_states(b) != 0)
        return -ENOMEM;
    if (((size_t)b->n_states + 1) * 2 > b->ht_cap && grow_table(b) != 0)
        return -ENOMEM;
    uint32_t s = b->n_states++;
    b->hash[s] = h;
    b->prev[s] = (uint8_t)prev;
    while (b->pool.cap - b->pool.n < n)
        if (pool_grow(&b->pool) != 0)
            return -ENOMEM;
    if (n != 0)
        memcpy(b->pool.v + b->pool.n, v, n * sizeof(*v));
    b->pool.n += n;
    b->set_off[s + 1] = (uint32_t)b->pool.n;
    size_t j = h & (b->ht_cap - 1);
    while (b->ht[j] != 0)
        j = (j + 1) & (b->ht_cap - 1);
    b->ht[j] = s + 1;
    *id = s;
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* State sets are short and often almost sorted: insertion sort beats qsort
 * there; long ones go to qsort. */
static void sort_u32(uint32_t *v, size_t n)
{
    if (n > 48) {
        qsort(v, n, sizeof(*v), cmp_u32);
        return;
    }
    for (size_t i = 1; i < n; i++) {
        uint32_t x = v[i];
        size_t j = i;
        for (; j > 0 && v[j - 1] > x; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
}

/* Puts the closure just made (b->list, each member stamped b->gen) in
 * ascending order. A long list over an automaton at most 32 times its
 * length is read back from the stamps in one pass over the states: a set
 * of 200 of 400 positions (`a.*b.*c...` with 200 gaps, whose every state
 * keeps the earlier positions alive) took a comparison sort per step and
 * 30 s to compile. Others are sorted. */
static void sort_list(struct builder *b)
{
    size_t n = b->list.n;
    uint32_t states = b->nfa->n_states;
    if (n <= 48 || states / 32 > n) {
        sort_u32(b->list.v, n);
        return;
    }
    size_t k = 0;
    for (uint32_t s = 0; s < states && k < n; s++)
        if (b->stamp[s] == b->gen)
            b->list.v[k++] = s;
}

/* prev masks reachable from R0 and the states in b->list */
static uint16_t list_pm(const struct builder *b)
{
    uint16_t pm = b->r0_pm;
    for (size_t i = 0; i < b->list.n; i++)
        pm |= b->reach_pm[b->list.v[i]];
    return pm;
}

/* canon_prev through the builder's table. */
static uint32_t canon_prev_cached(struct builder *b, uint32_t p, uint16_t pm)
{
    if (pm == 0)
        return P_BOS; /* no assertion can tell the kinds apart */
    uint16_t v = b->canon[pm];
    if (!(v & 0x8000u)) {
        v = 0x8000u;
        for (uint32_t q = 0; q < 4; q++)
            v |= (uint16_t)(canon_prev(q, pm) << (2 * q));
        b->canon[pm] = v;
    }
    return (v >> (2 * p)) & 3u;
}

/* Turns the stepped targets in b->work into a state (closing, sorting,
 * canonicalising the previous kind). */
static int step_to_state(struct builder *b, uint32_t next_prev, uint32_t *id)
{
    int rc = closure(b, b->work.v, b->work.n, UINT32_MAX, 0);
    if (rc != 0)
        return rc;
    sort_list(b);
    return intern(b, canon_prev_cached(b, next_prev, b->cond ? list_pm(b) : 0), id);
}

static uint32_t prev_of_kind(uint32_t k)
{
    return k == CAT_K_WORD ? P_WORD : k == CAT_K_NL ? P_NL : P_OTHER;
}

/* ---- expanding one state ---- */

static int add_accepts(struct builder *b, uint32_t s, const uint32_t *e, size_t n, uint16_t pm)
{
    const struct nfa *nfa = b->nfa;
    uint32_t p = b->prev[s];
    b->rules_touched.n = 0;
    for (uint32_t k = 0; k < N_NEXT; k++) {
        const uint32_t *from = e;
        size_t cnt = n;
        if (pm != 0) {
            int rc = closure(b, e, n, p, k);
            if (rc != 0)
                return rc;
            from = b->list.v;
            cnt = b->list.n;
        }
        for (size_t i = 0; i < cnt; i++) {
            int32_t r = nfa->accept[from[i]];
            if (r < 0)
                continue;
            if (b->rule_mask[r] == 0 && vec_push(&b->rules_touched, (uint32_t)r) != 0)
                return -ENOMEM;
            b->rule_mask[r] |= pm != 0 ? 1u << k : CAT_ACCEPT_ALWAYS;
        }
        if (pm == 0)
            break;
    }
    if (b->rules_touched.n > 1)
        qsort(b->rules_touched.v, b->rules_touched.n, sizeof(uint32_t), cmp_u32);
    for (size_t i = 0; i < b->rules_touched.n; i++) {
        uint32_t r = b->rules_touched.v[i];
        if (vec_push(&b->acc, r << 5 | b->rule_mask[r]) != 0)
            return -ENOMEM;
        b->rule_mask[r] = 0;
    }
    return 0;
}

static int fill_buckets(struct builder *b, const uint32_t *x, size_t n, uint32_t k, bool any_k)
{
    const struct nfa *nfa = b->nfa;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = x[i];
        for (uint32_t e = nfa->byte_first[s]; e < nfa->byte_first[s + 1]; e++) {
            uint32_t set = nfa->byte_edges[e].set;
            for (uint32_t j = b->set_cls_first[set]; j < b->set_cls_first[set + 1]; j++) {
                uint32_t c = b->set_cls[j];
                if (!any_k && b->class_kind[c] != k)
                    continue;
                if (b->bkt[c].n == 0 && vec_push(&b->touched, c) != 0)
                    return -ENOMEM;
                if (vec_push(&b->bkt[c], nfa->byte_edges[e].to) != 0)
                    return -ENOMEM;
            }
        }
    }
    return 0;
}

static int expand(struct builder *b, uint32_t s)
{
    uint32_t p = b->prev[s];
    /* copy E: the pool may move while states are added */
    b->ecopy.n = 0;
    if (decode_set(b, s, &b->ecopy) != 0)
        return -ENOMEM;
    struct u32vec e = b->ecopy;
    uint16_t pm = b->r0_pm;
    for (size_t i = 0; i < e.n; i++)
        pm |= b->reach_pm[e.v[i]];
    int rc = add_accepts(b, s, e.v, e.n, pm);
    b->acc_first[s + 1] = (uint32_t)b->acc.n;
    b->touched.n = 0;
    if (rc == 0 && pm == 0) {
        rc = fill_buckets(b, e.v, e.n, 0, true);
    } else {
        for (uint32_t k = 0; k < 3 && rc == 0; k++) {
            rc = closure(b, e.v, e.n, p, k);
            /* fill_buckets does not touch b->list */
            if (rc == 0)
                rc = fill_buckets(b, b->list.v, b->list.n, k, false);
        }
    }
    uint32_t *row = NULL;
    arr_touch(b->trans, ((size_t)s + 1) * b->n_classes * sizeof(*b->trans));
    for (uint32_t c = 0; c < b->n_classes && rc == 0; c++) {
        uint32_t id;
        bool start = e.n == 0;
        if (b->bkt[c].n == 0 && !start) {
            id = b->trans[(size_t)b->start[p] * b->n_classes + c];
        } else {
            b->work.n = 0;
            for (uint32_t j = b->r0step_first[p][c]; j < b->r0step_first[p][c + 1] && rc == 0; j++)
                rc = vec_push(&b->work, b->r0step[p].v[j]);
            for (size_t j = 0; j < b->bkt[c].n && rc == 0; j++)
                rc = vec_push(&b->work, b->bkt[c].v[j]);
            if (rc == 0)
                rc = step_to_state(b, prev_of_kind(b->class_kind[c]), &id);
            if (rc != 0)
                break;
        }
        row = b->trans + (size_t)s * b->n_classes; /* trans may have moved */
        row[c] = id;
    }
    for (size_t i = 0; i < b->touched.n; i++)
        b->bkt[b->touched.v[i]].n = 0;
    return rc;
}

/* ---- building ---- */

static void builder_free(struct builder *b)
{
    free(b->set_cls_first);
    free(b->set_cls);
    free(b->in_r0);
    free(b->r0pk);
    free(b->reach_pm);
    for (int p = 0; p < 4; p++) {
        free(b->r0step[p].v);
        free(b->r0step_first[p]);
    }
    arr_free(b->set_off);
    free(b->enc.v);
    arr_free(b->hash);
    arr_free(b->prev);
    arr_free(b->pool.v);
    arr_free(b->ht);
    arr_free(b->trans);
    free(b->acc.v);
    arr_free(b->acc_first);
    free(b->stamp);
    free(b->work.v);
    free(b->list.v);
    if (b->bkt != NULL)
        for (uint32_t c = 0; c < b->n_classes; c++)
            free(b->bkt[c].v);
    free(b->bkt);
    free(b->touched.v);
    free(b->rule_mask);
    free(b->rules_touched.v);
    free(b->canon);
    free(b->ecopy.v);
}

static int builder_init(struct builder *b, const struct nfa *nfa, uint32_t max_states)
{
    memset(b, 0, sizeof(*b));
    b->nfa = nfa;
    b->max_states = max_states;
    b->cond = nfa->has_cond;
    b->set_words = (nfa->n_states + 31) / 32;
    compute_classes(b);
    size_t n = nfa->n_states;
    b->in_r0 = calloc(n, 1);
    b->r0pk = calloc(n, sizeof(uint32_t));
    b->reach_pm = calloc(n, sizeof(uint16_t));
    b->stamp = calloc(n, sizeof(uint32_t));
    b->bkt = calloc(b->n_classes, sizeof(*b->bkt));
    b->rule_mask = calloc(nfa->n_rules ? nfa->n_rules : 1, sizeof(uint32_t));
    if (!b->in_r0 || !b->r0pk || !b->reach_pm || !b->stamp || !b->bkt || !b->rule_mask)
        return -ENOMEM;
    int rc = classes_of_sets(b);
    if (rc == 0)
        rc = close_r0(b);
    if (rc != 0)
        return rc;
    compute_reach_pm(b);
    uint16_t any_pm = 0;
    for (uint32_t s = 0; s < n; s++) {
        any_pm |= b->reach_pm[s];
        if (b->in_r0[s])
            b->r0_pm |= b->reach_pm[s];
    }
    /* Every prev mask is an OR of reach_pm values, and canon_prev_cached
     * reads the table only for a non-zero one: without assertions the
     * 128 KiB table (an mmap and its page faults on every compile) is not
     * needed. */
    if (any_pm != 0) {
        b->canon = calloc(1u << 16, sizeof(*b->canon));
        if (b->canon == NULL)
            return -ENOMEM;
    }
    return prepare_r0(b);
}

/* Moves row s of the n x k table to row map[s], for every s, in place:
 * each cycle of the permutation is walked once with two spare rows. */
static void permute_rows(uint32_t *trans, uint32_t n, uint32_t k, const uint32_t *map,
                         uint8_t *done, uint32_t *spare)
{
    uint32_t *carry = spare, *next = spare + k;
    for (uint32_t s = 0; s < n; s++) {
        if (done[s])
            continue;
        memcpy(carry, trans + (size_t)s * k, k * sizeof(*carry));
        uint32_t cur = s;
        do {
            uint32_t dst = map[cur];
            memcpy(next, trans + (size_t)dst * k, k * sizeof(*next));
            memcpy(trans + (size_t)dst * k, carry, k * sizeof(*carry));
            uint32_t *t = carry;
            carry = next;
            next = t;
            done[cur] = 1;
            cur = dst;
        } while (cur != s);
    }
}

/* Renumbers so accepting states come last, keeping the order otherwise.
 * The table is renumbered in place (a copy of it was a third of the fresh
 * memory a large literal group's compile touched) and trimmed to n rows. */
static int renumber_accepting_last(struct dfa *d)
{
    uint32_t n = d->n_states, k = d->n_classes;
    uint32_t *map = arr_realloc(NULL, n * sizeof(*map));
    uint32_t *inv = arr_realloc(NULL, (size_t)n * sizeof(*inv));
    uint32_t *first = arr_realloc(NULL, ((size_t)n + 1) * sizeof(*first));
    uint32_t *acc = malloc((d->n_acc ? d->n_acc : 1) * sizeof(*acc));
    uint8_t *done = arr_calloc(n ? n : 1, 1);
    uint32_t *spare = malloc(2 * (size_t)k * sizeof(*spare));
    int rc = !map || !inv || !first || !acc || !done || !spare ? -ENOMEM : 0;
    if (rc == 0) {
        uint32_t next = 0;
        for (int pass = 0; pass < 2; pass++)
            for (uint32_t s = 0; s < n; s++) {
                bool accepting = d->acc_first[s + 1] > d->acc_first[s];
                if (accepting == (pass == 1))
                    map[s] = next++;
            }
        d->first_accept = n;
        for (uint32_t s = 0; s < n; s++) {
            inv[map[s]] = s;
            if (d->acc_first[s + 1] > d->acc_first[s] && map[s] < d->first_accept)
                d->first_accept = map[s];
        }
        first[0] = 0;
        for (uint32_t t = 0; t < n; t++) {
            uint32_t s = inv[t], cnt = d->acc_first[s + 1] - d->acc_first[s];
            if (cnt != 0)
                memcpy(acc + first[t], d->acc + d->acc_first[s], cnt * sizeof(*acc));
            first[t + 1] = first[t] + cnt;
        }
        for (size_t i = 0; i < (size_t)n * k; i++)
            d->trans[i] = map[d->trans[i]];
        permute_rows(d->trans, n, k, map, done, spare);
        for (int p = 0; p < 4; p++)
            d->start[p] = map[d->start[p]];
        size_t cells = (size_t)n * k;
        uint32_t *trimmed = arr_realloc(d->trans, (cells != 0 ? cells : 1) * sizeof(*trimmed));
        if (trimmed != NULL)
            d->trans = trimmed;
        free(d->acc);
        arr_free(d->acc_first);
        d->acc = acc;
        d->acc_first = first;
        acc = first = NULL;
    }
    arr_free(map);
    arr_free(inv);
    arr_free(first);
    free(acc);
    arr_free(done);
    free(spare);
    return rc;
}

_Thread_local const volatile int *dfa_cancel;

int dfa_build(const struct nfa *nfa, uint32_t max_states, struct dfa *out)
{
    struct builder b;
    memset(out, 0, sizeof(*out));
    int rc = builder_init(&b, nfa, max_states);
    if (rc == 0 && (grow_states(&b) != 0 || grow_table(&b) != 0))
        rc = -ENOMEM;
    if (rc == 0)
        b.set_off[0] = 0;
    for (uint32_t p = 0; p < 4 && rc == 0; p++) {
        b.list.n = 0;
        rc = intern(&b, canon_prev_cached(&b, p, b.r0_pm), &b.start[p]);
    }
    if (rc == 0)
        b.acc_first[0] = 0;
    for (uint32_t s = 0; s < b.n_states && rc == 0; s++) {
        if ((s & 255u) == 0 && dfa_cancel != NULL &&
            __atomic_load_n(dfa_cancel, __ATOMIC_RELAXED) != 0)
            rc = -ECANCELED;
        else
            rc = expand(&b, s);
    }
    if (rc == 0) {
        out->n_states = b.n_states;
        out->n_classes = b.n_classes;
        memcpy(out->classmap, b.classmap, sizeof(out->classmap));
        memcpy(out->start, b.start, sizeof(out->start));
        out->trans = b.trans;
        out->acc = b.acc.v;
        out->acc_first = b.acc_first;
        out->n_acc = (uint32_t)b.acc.n;
        out->minimal = nfa->literal;
        b.trans = NULL;
        b.acc.v = NULL;
        b.acc_first = NULL;
    }
    /* the state sets and their hash table go before the renumbering's
     * maps are taken: they were a third of a 28,156-state build's peak */
    builder_free(&b);
    if (rc == 0)
        rc = renumber_accepting_last(out);
    if (rc != 0)
        dfa_finish(out);
    return rc;
}

int dfa_init_empty(struct dfa *d)
{
    memset(d, 0, sizeof(*d));
    d->trans = arr_calloc(1, sizeof(uint32_t));
    d->acc_first = arr_calloc(2, sizeof(uint32_t));
    if (d->trans == NULL || d->acc_first == NULL) {
        dfa_finish(d);
        return -ENOMEM;
    }
    d->n_states = 1;
    d->n_classes = 1;
    d->first_accept = 1;
    return 0;
}

void dfa_finish(struct dfa *d)
{
    if (d == NULL)
        return;
    arr_free(d->trans);
    arr_free(d->acc_first);
    free(d->acc);
    memset(d, 0, sizeof(*d));
}

/* ---- minimisation ---- */

struct part {
    uint32_t *block, *next_block;
    uint32_t *size; /* members of each block of `block` */
    uint32_t *ht;
    size_t ht_cap;
};

static bool same_accepts(const struct dfa *d, uint32_t a, uint32_t b)
{
    uint32_t na = d->acc_first[a + 1] - d->acc_first[a];
    uint32_t nb = d->acc_first[b + 1] - d->acc_first[b];
    return na == nb && (na == 0 || memcmp(d->acc + d->acc_first[a], d->acc + d->acc_first[b],
                                          na * sizeof(uint32_t)) == 0);
}

static uint64_t row_hash(const struct dfa *d, const uint32_t *block, uint32_t s, int round)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    if (round == 0) {
        for (uint32_t i = d->acc_first[s]; i < d->acc_first[s + 1]; i++)
            h = (h ^ d->acc[i]) * 0x100000001b3ULL;
        return h;
    }
    h ^= block[s];
    const uint32_t *row = d->trans + (size_t)s * d->n_classes;
    for (uint32_t c = 0; c < d->n_classes; c++)
        h = (h ^ block[row[c]]) * 0x100000001b3ULL;
    return h ^ (h >> 31);
}

static bool row_equal(const struct dfa *d, const uint32_t *block, uint32_t a, uint32_t b, int round)
{
    if (round == 0)
        return same_accepts(d, a, b);
    if (block[a] != block[b])
        return false;
    const uint32_t *ra = d->trans + (size_t)a * d->n_classes;
    const uint32_t *rb = d->trans + (size_t)b * d->n_classes;
    for (uint32_t c = 0; c < d->n_classes; c++)
        if (block[ra[c]] != block[rb[c]])
            return false;
    return true;
}

/* One refinement round; returns the number of blocks. A state alone in its
 * block stays alone (blocks only split, and a state's block is part of its
 * key), so it gets the next number without hashing its row: most blocks
 * are singletons after a few rounds. Numbering stays by first member. */
static uint32_t refine(const struct dfa *d, struct part *pt, int round)
{
    memset(pt->ht, 0, pt->ht_cap * sizeof(*pt->ht));
    uint32_t nb = 0;
    for (uint32_t s = 0; s < d->n_states; s++) {
        if (round != 0 && pt->size[pt->block[s]] == 1) {
            pt->next_block[s] = nb++;
            continue;
        }
        uint64_t h = row_hash(d, pt->block, s, round);
        size_t j = h & (pt->ht_cap - 1);
        for (;; j = (j + 1) & (pt->ht_cap - 1)) {
            if (pt->ht[j] == 0) {
                pt->ht[j] = s + 1;
                pt->next_block[s] = nb++;
                break;
            }
            uint32_t r = pt->ht[j] - 1;
            if (row_equal(d, pt->block, s, r, round)) {
                pt->next_block[s] = pt->next_block[r];
                break;
            }
        }
    }
    uint32_t *t = pt->block;
    pt->block = pt->next_block;
    pt->next_block = t;
    memset(pt->size, 0, (size_t)nb * sizeof(*pt->size));
    for (uint32_t s = 0; s < d->n_states; s++)
        pt->size[pt->block[s]]++;
    return nb;
}

/*
 * Hopcroft's algorithm, from the partition Moore's rounds reached. Moore's
 * refinement needs as many rounds as the longest path that tells two
 * states apart, each round over every row still in a shared block: a rule
 * of 2,000 half bytes (11,665 states, 256 classes) took 10 s in its 2,000
 * rounds. Hopcroft's splits a block only by a block that changed, always
 * by the smaller half, in O(n k log n). It needs the transitions inverted
 * (two words per transition), so it takes over only after
 * dfa_moore_rounds rounds; the blocks it ends with are the same (the
 * coarsest partition compatible with the accepts is unique), numbered by
 * first member as Moore's are.
 */
uint32_t dfa_moore_rounds = 64;

/* A refinable partition of the states (after Valmari and Lehtinen): the
 * members of block b are elem[first[b] .. past[b]), the marked ones first. */
struct rpart {
    uint32_t *elem, *loc, *set, *first, *past, *marked, *touched;
    uint32_t n_sets, n_touched;
};

static void rp_mark(struct rpart *p, uint32_t e)
{
    uint32_t b = p->set[e], i = p->loc[e], j = p->first[b] + p->marked[b];
    if (i < j)
        return; /* marked already */
    p->elem[i] = p->elem[j];
    p->loc[p->elem[i]] = i;
    p->elem[j] = e;
    p->loc[e] = j;
    if (p->marked[b]++ == 0)
        p->touched[p->n_touched++] = b;
}

/* Splits each touched block into its marked and unmarked members; the
 * smaller part becomes a new block, whose (block, class) splitters go on
 * the stack: Hopcroft's rule, since a waiting splitter of the old block
 * still stands for the larger part. */
static void rp_split(struct rpart *p, uint32_t k, uint32_t *stack, size_t *top)
{
    while (p->n_touched > 0) {
        uint32_t b = p->touched[--p->n_touched], j = p->first[b] + p->marked[b];
        if (j == p->past[b]) {
            p->marked[b] = 0;
            continue;
        }
        uint32_t z = p->n_sets++;
        if (p->marked[b] <= p->past[b] - j) {
            p->first[z] = p->first[b];
            p->past[z] = p->first[b] = j;
        } else {
            p->past[z] = p->past[b];
            p->first[z] = p->past[b] = j;
        }
        for (uint32_t i = p->first[z]; i < p->past[z]; i++)
            p->set[p->elem[i]] = z;
        p->marked[b] = p->marked[z] = 0;
        for (uint32_t c = 0; c < k; c++)
            stack[(*top)++] = z * k + c;
    }
}

/* Refines pt->block (nb blocks, numbered by first member) to the final
 * partition. -ENOMEM leaves it as it was, for Moore's rounds to go on. */
static int hopcroft(const struct dfa *d, struct part *pt, uint32_t *nb)
{
    uint32_t n = d->n_states, k = d->n_classes;
    size_t m = (size_t)n * k;
    if (m >= UINT32_MAX)
        return -ENOMEM; /* the stack and offsets hold u32 */
    uint32_t *inv_first = arr_calloc(m + 1, sizeof(uint32_t));
    uint32_t *inv = arr_realloc(NULL, m * sizeof(uint32_t));
    uint32_t *stack = arr_realloc(NULL, m * sizeof(uint32_t));
    uint32_t *buf = arr_realloc(NULL, (size_t)n * 8 * sizeof(uint32_t));
    int rc = -ENOMEM;
    if (!inv_first || !inv || !stack || !buf)
        goto out;
    /* sources of each (class, target), counted then placed */
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t c = 0; c < k; c++)
            inv_first[(size_t)c * n + d->trans[(size_t)s * k + c] + 1]++;
    for (size_t i = 0; i < m; i++)
        inv_first[i + 1] += inv_first[i];
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t c = 0; c < k; c++)
            inv[inv_first[(size_t)c * n + d->trans[(size_t)s * k + c]]++] = s;
    for (size_t i = m; i > 0; i--)
        inv_first[i] = inv_first[i - 1];
    inv_first[0] = 0;

    struct rpart p = {.elem = buf,
                      .loc = buf + n,
                      .set = buf + 2 * (size_t)n,
                      .first = buf + 3 * (size_t)n,
                      .past = buf + 4 * (size_t)n,
                      .marked = buf + 5 * (size_t)n,
                      .touched = buf + 6 * (size_t)n,
                      .n_sets = *nb};
    uint32_t *copy = buf + 7 * (size_t)n;
    memset(p.marked, 0, (size_t)n * sizeof(uint32_t));
    memset(p.past, 0, (size_t)*nb * sizeof(uint32_t));
    for (uint32_t s = 0; s < n; s++)
        p.past[pt->block[s]]++; /* sizes, for now */
    uint32_t largest = 0, at = 0;
    for (uint32_t b = 1; b < *nb; b++)
        if (p.past[b] > p.past[largest])
            largest = b;
    for (uint32_t b = 0; b < *nb; b++) {
        uint32_t size = p.past[b];
        p.first[b] = p.past[b] = at;
        at += size;
    }
    for (uint32_t s = 0; s < n; s++) {
        uint32_t b = pt->block[s];
        p.elem[p.past[b]] = s;
        p.loc[s] = p.past[b]++;
        p.set[s] = b;
    }
    /* every block but the largest splits by each class to begin with */
    size_t top = 0;
    for (uint32_t b = 0; b < *nb; b++)
        for (uint32_t c = 0; b != largest && c < k; c++)
            stack[top++] = b * k + c;
    uint32_t steps = 0;
    while (top > 0) {
        if ((++steps & 1023u) == 0 && dfa_cancel != NULL &&
            __atomic_load_n(dfa_cancel, __ATOMIC_RELAXED) != 0) {
            rc = -ECANCELED;
            goto out;
        }
        uint32_t splitter = stack[--top], a = splitter / k, c = splitter % k;
        /* the splitter's members, copied: marking moves elements within blocks */
        uint32_t na = p.past[a] - p.first[a];
        memcpy(copy, p.elem + p.first[a], (size_t)na * sizeof(uint32_t));
        for (uint32_t i = 0; i < na; i++) {
            size_t t = (size_t)c * n + copy[i];
            for (uint32_t u = inv_first[t]; u < inv_first[t + 1]; u++)
                rp_mark(&p, inv[u]);
        }
        rp_split(&p, k, stack, &top);
    }
    /* number the blocks by first member, as refine() does */
    uint32_t *id = p.marked; /* all zero again: reused as block -> number + 1 */
    uint32_t next = 0;
    for (uint32_t s = 0; s < n; s++) {
        uint32_t b = p.set[s];
        if (id[b] == 0)
            id[b] = ++next;
        pt->block[s] = id[b] - 1;
    }
    *nb = next;
    rc = 0;
out:
    arr_free(inv_first);
    arr_free(inv);
    arr_free(stack);
    arr_free(buf);
    return rc;
}

int dfa_minimise(struct dfa *d)
{
    if (d->minimal)
        return 0;
    struct part pt = {0};
    uint32_t n = d->n_states;
    pt.block = arr_calloc(n, sizeof(uint32_t));
    pt.next_block = arr_calloc(n, sizeof(uint32_t));
    pt.size = arr_calloc(n, sizeof(uint32_t));
    pt.ht_cap = 16;
    while (pt.ht_cap < (size_t)n * 2)
        pt.ht_cap *= 2;
    pt.ht = arr_calloc(pt.ht_cap, sizeof(uint32_t));
    uint32_t *rep = arr_realloc(NULL, n * sizeof(uint32_t));
    int rc = -ENOMEM;
    if (!pt.block || !pt.next_block || !pt.size || !pt.ht || !rep)
        goto out;
    uint32_t nb = refine(d, &pt, 0);
    bool try_hopcroft = true;
    for (uint32_t round = 1;; round++) {
        if (dfa_cancel != NULL && __atomic_load_n(dfa_cancel, __ATOMIC_RELAXED) != 0) {
            rc = -ECANCELED;
            goto out;
        }
        if (try_hopcroft && round > dfa_moore_rounds) {
            rc = hopcroft(d, &pt, &nb);
            if (rc == 0)
                break;
            if (rc != -ENOMEM)
                goto out;
            try_hopcroft = false; /* no room for the inverse: Moore's rounds go on */
        }
        uint32_t nb2 = refine(d, &pt, 1);
        if (nb2 == nb)
            break;
        nb = nb2;
    }
    rc = 0;
    if (nb == n)
        goto out;
    /* blocks are numbered by first member, so the old order carries over */
    for (uint32_t s = n; s-- > 0;)
        rep[pt.block[s]] = s;
    uint32_t k = d->n_classes;
    uint32_t *trans = arr_realloc(NULL, (size_t)nb * k * sizeof(*trans));
    uint32_t *first = arr_realloc(NULL, ((size_t)nb + 1) * sizeof(*first));
    uint32_t *acc = malloc((d->n_acc ? d->n_acc : 1) * sizeof(*acc));
    if (!trans || !first || !acc) {
        arr_free(trans);
        arr_free(first);
        free(acc);
        rc = -ENOMEM;
        goto out;
    }
    first[0] = 0;
    for (uint32_t bl = 0; bl < nb; bl++) {
        uint32_t s = rep[bl];
        for (uint32_t c = 0; c < k; c++)
            trans[(size_t)bl * k + c] = pt.block[d->trans[(size_t)s * k + c]];
        uint32_t cnt = d->acc_first[s + 1] - d->acc_first[s];
        if (cnt != 0)
            memcpy(acc + first[bl], d->acc + d->acc_first[s], cnt * sizeof(*acc));
        first[bl + 1] = first[bl] + cnt;
    }
    for (int p = 0; p < 4; p++)
        d->start[p] = pt.block[d->start[p]];
    arr_free(d->trans);
    arr_free(d->acc_first);
    free(d->acc);
    d->trans = trans;
    d->acc_first = first;
    d->acc = acc;
    d->n_acc = first[nb];
    d->n_states = nb;
    rc = renumber_accepting_last(d);
out:
    arr_free(pt.block);
    arr_free(pt.next_block);
    arr_free(pt.size);
    arr_free(pt.ht);
    arr_free(rep);
    return rc;
}

/* ---- scanning (tests) ---- */

int dfa_scan(const struct dfa *d, const uint8_t *buf, size_t len,
             int (*fn)(void *ctx, uint32_t rule, uint64_t end), void *ctx)
{
    uint32_t s = d->start[P_BOS];
    for (size_t i = 0;; i++) {
        if (s >= d->first_accept) {
            uint32_t k = nfa_next_kind(buf, len, i);
            for (uint32_t j = d->acc_first[s]; j < d->acc_first[s + 1]; j++)
                if (CAT_ACCEPT_MASK(d->acc[j]) & (1u << k)) {
                    int rc = fn(ctx, CAT_ACCEPT_RULE(d->acc[j]), i);
                    if (rc != 0)
                        return rc;
                }
        }
        if (i == len)
            return 0;
        s = d->trans[(size_t)s * d->n_classes + d->classmap[buf[i]]];
    }
}
