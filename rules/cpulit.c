/*
 * The literal matcher of the CPU engine (cpulit.h).
 *
 * Filter: position j's domain is a hash of the bytes j-2, j-1, j. For each
 * domain value the table holds a u64 of 16 nibble lanes: bit b of lane k
 * is clear when some string of bucket b (of 4) has, at offset k
 * (2 <= k < L), a trigram with that hash. The state R shifts one lane per
 * byte and ORs the table entry in, so after byte j lane k holds what the
 * k+1 bytes ending at j say about a string starting at j - k. A clear bit
 * in lane L-1 is a candidate start. Lanes L-1..15 hold the last 17-L
 * starts, so the state is looked at once every 17-L bytes, not per byte.
 */
#include "cpulit.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "refscan.h" /* scan_hits_sort, scan_sort_u64 */

#define BUCKETS 4u
#define LANES   16u /* of 4 bits */
#define MAX_L   12u /* prefix the filter looks at */
/* Filter domain: 2^15 entries (256 KiB). A constant, so the index is one
 * multiply and one immediate shift per byte. */
#define DOM_BITS 15u
#define MUL32    0x9e3779b1u
#define MUL64    0x9e3779b97f4a7c15ull

struct lit {
    uint32_t off; /* into bytes / mask */
    uint32_t len;
    uint32_t id;
    uint16_t bucket; /* buckets hold the shortest strings first */
    uint16_t once;   /* CPULIT_ONCE, and another such string has its id */
};

/* Strings with one folded prefix key: lits[first .. first + n). A slot of
 * more than SPLIT_MIN strings whose shortest is longer than the key is
 * split: `sub` > 0 is a longer prefix, and the strings are found in
 * cpulit.subs under their `sub`-byte keys (split again the same way), so
 * a candidate compares a few strings, not every one sharing its first
 * bytes (phrases-3k's 206 strings under `the`). */
struct slot {
    uint64_t key;
    uint32_t first, n; /* n == 0: empty */
    uint32_t sub;      /* 0, or the prefix of the split (K < sub <= 8) */
};

#define SPLIT_MIN 8u

struct cpulit {
    uint32_t L;       /* prefix the filter looks at (<= MAX_L) */
    uint32_t K;       /* prefix the key holds: min(min_len, 8) */
    bool flush;       /* some bucket has strings shorter than L */
    uint32_t fold;    /* FOLD32 when some string has a caseless letter, else 0 */
    uint32_t stride;  /* 2: one trigram every other byte (stride_2 below) */
    uint32_t min_len; /* shortest string */
    uint64_t *filter; /* 1 << DOM_BITS entries */
    struct lit *lits; /* sorted by key, then input order */
    uint32_t n_lits;
    uint8_t *bytes, *mask; /* strings; mask: 0x20 where a letter is caseless */
    struct slot *slots;
    uint32_t slot_mask;
    struct slot *subs; /* split slots' parts (NULL: none) */
    uint32_t sub_mask;
};

/* The key, and the filter when some string is caseless, see every byte
 * with bit 5 set: a letter's two cases become one byte, so caseless
 * strings need no variants. Other bytes pair up too ('@' with '`', '\n'
 * with '*'), which only adds candidates that the exact comparison
 * rejects. */
#define FOLD8  0x20u
#define FOLD32 0x20202020u

/* The folded first K bytes, one per byte of the key. */
static inline uint64_t key_of(const uint8_t *p, uint32_t K)
{
    uint64_t k = 0;
    for (uint32_t i = 0; i < K; i++)
        k |= (uint64_t)(p[i] | FOLD8) << (8 * i);
    return k;
}

/* Filter index of a trigram held in the low 24 bits of x (first byte
 * lowest); the top byte of x is ignored. */
static inline uint32_t dom(uint32_t x)
{
    return (x * (MUL32 << 8)) >> (32 - DOM_BITS); /* (x << 8) * MUL32: the top byte drops out */
}

static inline uint32_t slot_hash(uint64_t key, uint32_t mask)
{
    return (uint32_t)((key * MUL64) >> 40) & mask;
}

void cpulit_destroy(struct cpulit *m)
{
    if (m == NULL)
        return;
    free(m->filter);
    free(m->lits);
    free(m->bytes);
    free(m->mask);
    free(m->slots);
    free(m->subs);
    free(m);
}

uint32_t cpulit_min_len(const struct cpulit *m)
{
    return m->min_len;
}

uint32_t cpulit_stride(const struct cpulit *m)
{
    return m->stride;
}

uint32_t cpulit_split_slots(const struct cpulit *m)
{
    uint32_t n = 0;
    for (uint32_t h = 0; h <= m->slot_mask; h++)
        n += m->slots[h].n != 0 && m->slots[h].sub != 0;
    for (uint32_t h = 0; m->subs != NULL && h <= m->sub_mask; h++)
        n += m->subs[h].n != 0 && m->subs[h].sub != 0;
    return n;
}

static int check_entries(const struct cpulit_entry *v, size_t n, uint64_t *total)
{
    *total = 0;
    if (n == 0 || n > UINT32_MAX / 2)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (v[i].len == 0 || v[i].len > CPULIT_MAX_LEN)
            return -EINVAL;
        for (uint32_t k = 0; v[i].fold != NULL && k < v[i].len; k++) {
            uint8_t c = v[i].bytes[k];
            if (v[i].fold[k] != 0 && (v[i].fold[k] != 0x20 || c < 'a' || c > 'z'))
                return -EINVAL;
        }
        *total += v[i].len;
    }
    return *total < UINT32_MAX ? 0 : -EINVAL;
}

/* Clears bucket b's bit in `lane` for the (folded) trigram ending at
 * offset k of string p. */
static void filter_add(struct cpulit *m, const uint8_t *p, uint32_t k, uint32_t lane, uint32_t b)
{
    uint32_t x = (uint32_t)p[k - 2] | (uint32_t)p[k - 1] << 8 | (uint32_t)p[k] << 16;
    m->filter[dom(x | m->fold)] &= ~((uint64_t)1 << (4 * lane + b));
}

/*
 * Stride 2, for sets sparse enough that half the constraints still reject
 * almost every position: only every other byte's trigram is looked at.
 * After the step at byte j, lane k stands for the two starts j-2k and
 * j-2k-1, whose strings have at j the trigram of offset 2k or 2k+1; a
 * string is entered at both. Half the work per byte, and a clear bit asks
 * for two starts to be confirmed.
 */
#define STRIDE2_MAX_LITS 4096u
#define STRIDE2_MIN_L    6u
/* Lane 1 looks at offsets 2 and 3, so a bucket whose shortest string has
 * 3 bytes has no constrained lane at stride 2: every position was its
 * candidate, and the confirmation ran at every byte (phrases-3k's `a i`,
 * 0.05 -> 0.17 GB/s at stride 1; regex-500's 3-byte factors, 0.11 ->
 * 0.4-0.6, both on 2 threads). */
#define STRIDE2_MIN_LEN 4u

/* The filter of one stride: lane k of bucket b is constrained while the
 * offsets it stands for are inside the bucket's shortest string and L. An
 * empty bucket (a set of fewer than BUCKETS strings) is rejected in every
 * lane: left clear, it made every position a candidate, and a single
 * string ran at 0.15 GB/s, all of it in verify (docs/PERFORMANCE.md
 * "Session 28"). */
static void fill_filter(struct cpulit *m, const uint32_t *mb)
{
    uint32_t sd = m->stride;
    uint64_t init = 0;
    for (uint32_t b = 0; b < BUCKETS; b++) {
        if (mb[b] == 0)
            init |= 0x1111111111111111ull << b;
        for (uint32_t k = 2 / sd; sd * k + sd - 1 < m->L && sd * k + sd - 1 < mb[b]; k++)
            init |= (uint64_t)1 << (4 * k + b);
    }
    for (size_t i = 0; i < ((size_t)1 << DOM_BITS); i++)
        m->filter[i] = init;
    for (uint32_t i = 0; i < m->n_lits; i++) {
        const struct lit *l = &m->lits[i];
        uint32_t b = l->bucket;
        for (uint32_t k = 2 / sd; sd * k + sd - 1 < m->L && sd * k + sd - 1 < mb[b]; k++)
            for (uint32_t o = sd * k; o < sd * k + sd; o++)
                filter_add(m, m->bytes + l->off, o, k, b);
    }
}

static int build_filter(struct cpulit *m)
{
    size_t n = (size_t)1 << DOM_BITS;
    m->filter = malloc(n * sizeof(*m->filter));
    if (m->filter == NULL)
        return -ENOMEM;
    /* a bucket's offsets past its shortest string take any byte */
    uint32_t mb[BUCKETS] = {0};
    for (uint32_t i = 0; i < m->n_lits; i++) {
        const struct lit *l = &m->lits[i];
        mb[l->bucket] = mb[l->bucket] == 0 || l->len < mb[l->bucket] ? l->len : mb[l->bucket];
    }
    for (uint32_t b = 0; b < BUCKETS; b++)
        m->flush |= mb[b] != 0 && mb[b] < m->L;
    bool sparse = m->n_lits <= STRIDE2_MAX_LITS && m->L >= STRIDE2_MIN_L;
    m->stride = sparse && m->min_len >= STRIDE2_MIN_LEN ? 2 : 1;
    fill_filter(m, mb);
    return 0;
}

/* The slot of `key` in table t (an empty one when none has it). */
static inline const struct slot *slot_find(const struct slot *t, uint32_t mask, uint64_t key)
{
    uint32_t h = slot_hash(key, mask);
    while (t[h].n != 0 && t[h].key != key)
        h = (h + 1) & mask;
    return &t[h];
}

static struct slot *slot_insert(struct slot *t, uint32_t mask, struct slot v)
{
    uint32_t h = slot_hash(v.key, mask);
    while (t[h].n != 0)
        h = (h + 1) & mask;
    t[h] = v;
    return &t[h];
}

/* Splits slot `sl` (its strings share their first `klen` folded bytes)
 * when it is large and its strings are all longer: its strings sorted by
 * their `sub`-byte keys (ties in their order, so that strings matching at
 * one start stay in entry order), each run a slot of m->subs, split
 * again in turn. `tmp` has room for the slot's strings. Keys of different
 * lengths differ (every folded byte is nonzero), so one table holds all
 * the parts. */
static void split_slot(struct cpulit *m, struct slot *sl, uint32_t klen, struct scan_hit *ord,
                       struct lit *tmp)
{
    if (sl->n <= SPLIT_MIN || klen >= 8)
        return;
    uint32_t sub = 8;
    for (uint32_t i = sl->first; i < sl->first + sl->n; i++)
        sub = m->lits[i].len < sub ? m->lits[i].len : sub;
    if (sub <= klen)
        return;
    for (uint32_t i = 0; i < sl->n; i++)
        ord[i] =
            (struct scan_hit){.rule = i, .end = key_of(m->bytes + m->lits[sl->first + i].off, sub)};
    scan_hits_sort(ord, sl->n, false);
    for (uint32_t i = 0; i < sl->n; i++)
        tmp[i] = m->lits[sl->first + ord[i].rule];
    memcpy(m->lits + sl->first, tmp, sl->n * sizeof(*tmp));
    sl->sub = sub;
    uint32_t first = sl->first, end = sl->first + sl->n;
    for (uint32_t i = first; i < end;) {
        uint64_t key = key_of(m->bytes + m->lits[i].off, sub);
        uint32_t j = i + 1;
        while (j < end && key_of(m->bytes + m->lits[j].off, sub) == key)
            j++;
        struct slot *part =
            slot_insert(m->subs, m->sub_mask, (struct slot){.key = key, .first = i, .n = j - i});
        split_slot(m, part, sub, ord, tmp);
        i = j;
    }
}

static int build_slots(struct cpulit *m)
{
    uint32_t distinct = 0;
    for (uint32_t i = 0; i < m->n_lits; i++)
        distinct += i == 0 || key_of(m->bytes + m->lits[i].off, m->K) !=
                                  key_of(m->bytes + m->lits[i - 1].off, m->K);
    uint32_t cap = 16;
    while (cap < 2 * distinct)
        cap *= 2;
    m->slots = calloc(cap, sizeof(*m->slots));
    if (m->slots == NULL)
        return -ENOMEM;
    m->slot_mask = cap - 1;
    uint32_t crowd = 0; /* strings in slots of more than SPLIT_MIN */
    for (uint32_t i = 0; i < m->n_lits;) {
        uint64_t key = key_of(m->bytes + m->lits[i].off, m->K);
        uint32_t j = i + 1;
        while (j < m->n_lits && key_of(m->bytes + m->lits[j].off, m->K) == key)
            j++;
        slot_insert(m->slots, m->slot_mask, (struct slot){.key = key, .first = i, .n = j - i});
        crowd += j - i > SPLIT_MIN ? j - i : 0;
        i = j;
    }
    if (m->K >= 8 || crowd == 0)
        return 0; /* no slot to split */
    /* Parts of a split slot's c strings: at most c leaves, and at most c/9
     * split parts at each of at most 5 depths (each holds 9 strings or
     * more, and the parts at one depth are disjoint): under 2c in all. */
    cap = 16;
    while (cap < 2 * crowd)
        cap *= 2;
    m->subs = calloc(cap, sizeof(*m->subs));
    struct scan_hit *ord = malloc(crowd * sizeof(*ord));
    struct lit *tmp = malloc(crowd * sizeof(*tmp));
    if (m->subs == NULL || ord == NULL || tmp == NULL) {
        free(ord);
        free(tmp);
        return -ENOMEM;
    }
    m->sub_mask = cap - 1;
    for (uint32_t h = 0; h <= m->slot_mask; h++)
        if (m->slots[h].n != 0)
            split_slot(m, &m->slots[h], m->K, ord, tmp);
    free(ord);
    free(tmp);
    return 0;
}

/* Keeps `once` only on CPULIT_ONCE strings whose id another such string
 * has: the others need no check. */
static int mark_once(struct cpulit *m)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->n_lits; i++)
        n += m->lits[i].once;
    if (n == 0)
        return 0;
    uint64_t *v = malloc(2 * (size_t)n * sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    n = 0;
    for (uint32_t i = 0; i < m->n_lits; i++)
        if (m->lits[i].once)
            v[n++] = (uint64_t)m->lits[i].id << 32 | i;
    scan_sort_u64(v, v + n, n);
    for (uint32_t i = 0; i < n; i++) {
        bool shared =
            (i > 0 && v[i - 1] >> 32 == v[i] >> 32) || (i + 1 < n && v[i + 1] >> 32 == v[i] >> 32);
        m->lits[(uint32_t)v[i]].once = shared;
    }
    free(v);
    return 0;
}

/* Copies the strings in key order, lowercasing caseless letters. The
 * orders are scan_hits_sort's radix sort of (key as `end`, string index as
 * `rule`): (end, rule) order is key order, ties in input order. */
static int copy_entries(struct cpulit *m, const struct cpulit_entry *v, size_t n, uint64_t total)
{
    struct scan_hit *ord = malloc(n * sizeof(*ord));
    m->lits = malloc(n * sizeof(*m->lits));
    m->bytes = malloc(total);
    m->mask = malloc(total);
    if (ord == NULL || m->lits == NULL || m->bytes == NULL || m->mask == NULL) {
        free(ord);
        return -ENOMEM;
    }
    /* buckets by length, the shortest quarter first; the filter looks at
     * the prefix that the longer half of the strings all have (the shorter
     * buckets are constrained up to their shortest string only) */
    for (size_t i = 0; i < n; i++)
        ord[i] = (struct scan_hit){.rule = (uint32_t)i, .end = v[i].len};
    scan_hits_sort(ord, n, false);
    m->min_len = (uint32_t)ord[0].end;
    m->K = m->min_len < 8 ? m->min_len : 8;
    m->L = ord[n / 2].end < MAX_L ? (uint32_t)ord[n / 2].end : MAX_L;
    uint32_t *bucket = malloc(n * sizeof(*bucket));
    if (bucket == NULL) {
        free(ord);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        bucket[ord[i].rule] = (uint32_t)(i * BUCKETS / n);
    for (size_t i = 0; i < n; i++)
        ord[i] = (struct scan_hit){.rule = (uint32_t)i, .end = key_of(v[i].bytes, m->K)};
    scan_hits_sort(ord, n, false);
    uint32_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const struct cpulit_entry *e = &v[ord[i].rule];
        m->lits[i] = (struct lit){.off = off,
                                  .len = e->len,
                                  .id = e->id,
                                  .bucket = (uint16_t)bucket[ord[i].rule],
                                  .once = (e->flags & CPULIT_ONCE) != 0};
        memcpy(m->bytes + off, e->bytes, e->len);
        for (uint32_t k = 0; e->fold != NULL && k < e->len; k++)
            m->fold |= e->fold[k] != 0 ? FOLD32 : 0;
        if (e->fold != NULL)
            memcpy(m->mask + off, e->fold, e->len);
        else
            memset(m->mask + off, 0, e->len);
        off += e->len;
    }
    m->n_lits = (uint32_t)n;
    free(ord);
    free(bucket);
    return mark_once(m);
}

int cpulit_create(const struct cpulit_entry *v, size_t n, struct cpulit **out)
{
    uint64_t total;
    int rc = check_entries(v, n, &total);
    if (rc != 0)
        return rc;
    struct cpulit *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return -ENOMEM;
    rc = copy_entries(m, v, n, total);
    if (rc == 0)
        rc = build_filter(m);
    if (rc == 0)
        rc = build_slots(m);
    if (rc != 0) {
        cpulit_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

static inline bool lit_matches(const struct cpulit *m, const struct lit *l, const uint8_t *t)
{
    const uint8_t *p = m->bytes + l->off, *q = m->mask + l->off;
    uint32_t k = 0;
    while (k < l->len && (t[k] | q[k]) == p[k])
        k++;
    return k == l->len;
}

/* Whether string `x` (a `once` one, matching at s) yields its end to
 * another `once` string of its id matching at the same end: a shorter one
 * (it starts after s) or one of equal length before it in lits (same
 * start, same key). The one none yields to reports. */
static bool yields(const struct cpulit *m, const uint8_t *buf, size_t s, uint32_t x)
{
    const struct lit *l = &m->lits[x];
    uint64_t end = (uint64_t)s + l->len;
    for (uint64_t t = s; t + m->min_len <= end; t++) {
        const struct slot *sl = slot_find(m->slots, m->slot_mask, key_of(buf + t, m->K));
        for (uint32_t i = sl->first; i < sl->first + sl->n; i++) {
            const struct lit *o = &m->lits[i];
            if (!o->once || o->id != l->id || t + o->len != end || (t == s && i >= x))
                continue;
            if (lit_matches(m, o, buf + t))
                return true;
        }
    }
    return false;
}

/* Confirms the strings that may start at s. */
static int verify(const struct cpulit *m, const uint8_t *buf, size_t s, uint64_t lo, uint64_t hi,
                  cpulit_fn fn, void *ctx)
{
    if (s + m->K > hi)
        return 0; /* every string is longer */
    const struct slot *sl = slot_find(m->slots, m->slot_mask, key_of(buf + s, m->K));
    while (sl->sub != 0) {
        if (s + sl->sub > hi)
            return 0; /* every string of the slot is longer */
        sl = slot_find(m->subs, m->sub_mask, key_of(buf + s, sl->sub));
    }
    for (uint32_t i = sl->first; i < sl->first + sl->n; i++) {
        const struct lit *l = &m->lits[i];
        uint64_t end = (uint64_t)s + l->len;
        if (end > hi || end <= lo)
            continue;
        if (lit_matches(m, l, buf + s) && !(l->once && yields(m, buf, s, i))) {
            int rc = fn(ctx, l->id, end);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

static inline uint32_t load_tri(const uint8_t *p)
{
    uint32_t x;
    memcpy(&x, p, sizeof(x));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    x = __builtin_bswap32(x);
#endif
    return x;
}

/* The trigram ending at j, with zeros for bytes before the buffer. */
static inline uint32_t tri_safe(const uint8_t *buf, size_t j)
{
    uint32_t x = (uint32_t)buf[j] << 16;
    if (j >= 1)
        x |= (uint32_t)buf[j - 1] << 8;
    if (j >= 2)
        x |= buf[j - 2];
    return x;
}

/* R after P more steps of R = R << 4 | f_t, given the f_t already placed
 * in v (f_t << 4 * (P - 1 - t)): the steps' shifts distribute over the OR,
 * so only one shift and one OR wait on R per block, not two per byte. */
static inline __attribute__((always_inline)) uint64_t advance(uint64_t R, uint64_t v,
                                                              const uint32_t P)
{
    return (P >= LANES ? 0 : R << ((4 * P) & 63)) | v;
}

/* The scan for one prefix length L, checking every P = 17 - L bytes, with
 * or without folding; constants where it is inlined, so the inner loop
 * unrolls. */
static inline __attribute__((always_inline)) int scan_l(const struct cpulit *m, const uint8_t *buf,
                                                        size_t len, size_t begin, uint64_t lo,
                                                        uint64_t hi, cpulit_fn fn, void *ctx,
                                                        const uint32_t L, const uint32_t fold)
{
    const uint32_t P = LANES + 1 - L;
    const uint64_t *f = m->filter;
    uint64_t R = ~(uint64_t)0;
    size_t j = begin;
    int rc = 0;
    for (; j < hi && j < 2 && rc == 0; j++) {
        R = R << 4 | f[dom(tri_safe(buf, j) | fold)];
        if (((~R >> (4 * (L - 1))) & 0xf) != 0)
            rc = verify(m, buf, j - (L - 1), lo, hi, fn, ctx);
    }
    while (rc == 0 && j + P < len && j + P <= hi) {
        uint64_t v = 0;
        for (uint32_t t = 0; t < P; t++)
            v |= f[dom(load_tri(buf + j + t - 2) | fold)] << (4 * (P - 1 - t));
        R = advance(R, v, P);
        j += P;
        uint64_t c = ~R >> (4 * (L - 1));
        for (uint32_t q = P; c != 0 && q-- > 0 && rc == 0;)
            if (((c >> (4 * q)) & 0xf) != 0)
                rc = verify(m, buf, j - 1 - (L - 1) - q, lo, hi, fn, ctx);
    }
    for (; j < hi && rc == 0; j++) {
        R = R << 4 | f[dom(tri_safe(buf, j) | fold)];
        if (((~R >> (4 * (L - 1))) & 0xf) != 0)
            rc = verify(m, buf, j - (L - 1), lo, hi, fn, ctx);
    }
    /* strings shorter than L starting in the last L-1 bytes: shift on
     * with no constraint (verify rejects what does not fit) */
    for (uint32_t t = 0; m->flush && t + 1 < L && rc == 0; t++, j++) {
        R <<= 4;
        if (((~R >> (4 * (L - 1))) & 0xf) != 0)
            rc = verify(m, buf, j - (L - 1), lo, hi, fn, ctx);
    }
    return rc;
}

/* Stride 2 (see above): lane C = (L-2)/2 is the last constrained one;
 * lanes C..15 are looked at every 16-C steps of two bytes. */
static inline __attribute__((always_inline)) int pair(const struct cpulit *m, const uint8_t *buf,
                                                      size_t se, uint64_t lo, uint64_t hi,
                                                      cpulit_fn fn, void *ctx)
{
    int rc = verify(m, buf, se - 1, lo, hi, fn, ctx);
    return rc != 0 ? rc : verify(m, buf, se, lo, hi, fn, ctx);
}

static inline __attribute__((always_inline)) int scan2_l(const struct cpulit *m, const uint8_t *buf,
                                                         size_t len, size_t begin, uint64_t lo,
                                                         uint64_t hi, cpulit_fn fn, void *ctx,
                                                         const uint32_t L, const uint32_t fold)
{
    const uint32_t C = (L - 2) / 2, P = LANES - C;
    const uint64_t *f = m->filter;
    uint64_t R = ~(uint64_t)0;
    size_t j = begin + 1; /* lane 0 then stands for starts begin+1 and begin */
    int rc = 0;
    for (; j < hi && j < 2 && rc == 0; j += 2) {
        R = R << 4 | f[dom(tri_safe(buf, j) | fold)];
        if (((~R >> (4 * C)) & 0xf) != 0)
            rc = pair(m, buf, j - 2 * C, lo, hi, fn, ctx);
    }
    while (rc == 0 && j + 2 * (P - 1) + 1 < len && j + 2 * (P - 1) < hi) {
        uint64_t v = 0;
        for (uint32_t t = 0; t < P; t++)
            v |= f[dom(load_tri(buf + j + 2 * t - 2) | fold)] << (4 * (P - 1 - t));
        R = advance(R, v, P);
        j += 2 * P;
        uint64_t c = ~R >> (4 * C);
        for (uint32_t q = P; c != 0 && q-- > 0 && rc == 0;)
            if (((c >> (4 * q)) & 0xf) != 0)
                rc = pair(m, buf, j - 2 - 2 * (C + q), lo, hi, fn, ctx);
    }
    for (; j < hi && rc == 0; j += 2) {
        R = R << 4 | f[dom(tri_safe(buf, j) | fold)];
        if (((~R >> (4 * C)) & 0xf) != 0)
            rc = pair(m, buf, j - 2 * C, lo, hi, fn, ctx);
    }
    for (uint32_t t = 0; m->flush && t <= C && rc == 0; t++, j += 2) {
        R <<= 4;
        if (((~R >> (4 * C)) & 0xf) != 0)
            rc = pair(m, buf, j - 2 * C, lo, hi, fn, ctx);
    }
    return rc;
}

static int scan_stride2(const struct cpulit *m, const uint8_t *buf, size_t len, size_t begin,
                        uint64_t lo, uint64_t hi, cpulit_fn fn, void *ctx)
{
    bool fold = m->fold != 0;
    switch (m->L) {
    case 6:
        return fold ? scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 6, FOLD32)
                    : scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 6, 0);
    case 7:
        return fold ? scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 7, FOLD32)
                    : scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 7, 0);
    case 8:
        return fold ? scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 8, FOLD32)
                    : scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 8, 0);
    case 9:
        return fold ? scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 9, FOLD32)
                    : scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 9, 0);
    case 10:
        return fold ? scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 10, FOLD32)
                    : scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 10, 0);
    case 11:
        return fold ? scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 11, FOLD32)
                    : scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 11, 0);
    default:
        return fold ? scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 12, FOLD32)
                    : scan2_l(m, buf, len, begin, lo, hi, fn, ctx, 12, 0);
    }
}

int cpulit_scan(const struct cpulit *m, const uint8_t *buf, size_t len, size_t begin, uint64_t lo,
                uint64_t hi, cpulit_fn fn, void *ctx)
{
    if (hi > len)
        hi = len;
    if (begin >= hi)
        return 0;
    if (m->stride == 2)
        return scan_stride2(m, buf, len, begin, lo, hi, fn, ctx);
    bool fold = m->fold != 0;
    switch (m->L) {
    case 1:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 1, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 1, 0);
    case 2:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 2, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 2, 0);
    case 3:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 3, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 3, 0);
    case 4:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 4, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 4, 0);
    case 5:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 5, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 5, 0);
    case 6:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 6, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 6, 0);
    case 7:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 7, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 7, 0);
    case 8:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 8, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 8, 0);
    case 9:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 9, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 9, 0);
    case 10:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 10, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 10, 0);
    case 11:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 11, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 11, 0);
    default:
        return fold ? scan_l(m, buf, len, begin, lo, hi, fn, ctx, 12, FOLD32)
                    : scan_l(m, buf, len, begin, lo, hi, fn, ctx, 12, 0);
    }
}
