/*
 * Two-byte strings for the CPU engine (cpupair.h).
 *
 * Each entry becomes its case variants as (pair, id) keys, pair = first
 * byte | second byte << 8, sorted and without repeats. The scan tests each
 * position's pair against the bitmap (8 KiB: stays in the L1 cache) and,
 * for a marked pair, reports the ids of its keys, found by binary search;
 * marked pairs are rare by construction (cpupair_rare), so the search is
 * off the hot path. When at most COMMON_MAX pairs lack a byte that text
 * seldom holds (odd_byte), the scan looks only at the starts next to such
 * bytes and at those of the other pairs, found sixteen at a time (SSE2),
 * and skips the rest: a text has few of either.
 */
#include "cpupair.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#endif

#include "refscan.h" /* scan_sort_u64 */

#define COMMON_MAX 8u

struct cpupair {
    uint64_t bits[65536 / 64];
    uint64_t *keys; /* pair << 32 | id, ascending, unique */
    size_t n;
    uint32_t from[257]; /* keys of pairs whose second byte is b: [from[b], from[b + 1]) */
    /* pairs with no odd_byte (all of them when fast), first | second << 8 */
    uint16_t common[COMMON_MAX];
    uint8_t splat[COMMON_MAX][2][16]; /* their bytes, each 16 times */
    uint32_t n_common;
    bool fast; /* at most COMMON_MAX pairs without an odd_byte */
    bool avx2; /* scan_odd_avx2 may run (the CPU has it; VKS_NO_AVX2 unset) */
};

void cpupair_destroy(struct cpupair *m)
{
    if (m == NULL)
        return;
    free(m->keys);
    free(m);
}

/* A byte that text seldom holds: a control byte other than tab, newline
 * and carriage return, or one of 0x7f..0xff. odd_mask16 tests the same. */
static inline bool odd_byte(uint8_t b)
{
    return (b < 0x20 && b != '\t' && b != '\n' && b != '\r') || b >= 0x7f;
}

bool cpupair_rare(uint8_t b0, uint8_t b1)
{
    return (odd_byte(b0) || odd_byte(b1)) && b0 != b1;
}

/* The byte and, where it is a caseless letter, its other case. */
static uint32_t variants(uint8_t b, uint8_t fold, uint8_t out[2])
{
    out[0] = b;
    if (fold == 0)
        return 1;
    out[1] = b ^ 0x20;
    return 2;
}

int cpupair_create(const struct cpulit_entry *v, size_t n, struct cpupair **out)
{
    if (n == 0 || n > (SIZE_MAX / 4) / sizeof(uint64_t) / 2)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (v[i].len != 2)
            return -EINVAL;
        for (uint32_t k = 0; v[i].fold != NULL && k < 2; k++)
            if (v[i].fold[k] != 0 &&
                (v[i].fold[k] != 0x20 || v[i].bytes[k] < 'a' || v[i].bytes[k] > 'z'))
                return -EINVAL;
    }
    struct cpupair *m = calloc(1, sizeof(*m));
    uint64_t *tmp = malloc(4 * n * sizeof(*tmp));
    if (m != NULL)
        m->keys = malloc(4 * n * sizeof(*m->keys));
    if (m == NULL || tmp == NULL || m->keys == NULL) {
        free(tmp);
        cpupair_destroy(m);
        return -ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t a[2], b[2];
        uint32_t na = variants(v[i].bytes[0], v[i].fold ? v[i].fold[0] : 0, a);
        uint32_t nb = variants(v[i].bytes[1], v[i].fold ? v[i].fold[1] : 0, b);
        for (uint32_t x = 0; x < na; x++)
            for (uint32_t y = 0; y < nb; y++)
                m->keys[k++] = (uint64_t)(a[x] | (uint32_t)b[y] << 8) << 32 | v[i].id;
    }
    scan_sort_u64(m->keys, tmp, k);
    free(tmp);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || m->keys[u - 1] != m->keys[i])
            m->keys[u++] = m->keys[i];
    m->n = u;
    m->fast = true;
#if HAVE_AVX2_PATH
    m->avx2 = __builtin_cpu_supports("avx2") && getenv("VKS_NO_AVX2") == NULL;
#endif
    for (size_t i = 0; i < u; i++) {
        uint32_t p = (uint32_t)(m->keys[i] >> 32);
        m->bits[p >> 6] |= 1ull << (p & 63);
        if (odd_byte((uint8_t)p) || odd_byte((uint8_t)(p >> 8)) || !m->fast)
            continue;
        if (i > 0 && (uint32_t)(m->keys[i - 1] >> 32) == p)
            continue; /* another id of the same pair */
        if (m->n_common == COMMON_MAX)
            m->fast = false;
        else {
            memset(m->splat[m->n_common][0], (int)(p & 0xff), 16);
            memset(m->splat[m->n_common][1], (int)(p >> 8), 16);
            m->common[m->n_common++] = (uint16_t)p;
        }
    }
    /* keys ascend by pair, whose low byte is the first: by first byte
     * they are not contiguous, so index by the pair's high byte (the
     * second) instead */
    for (uint32_t b = 0, i = 0; b <= 256; b++) {
        while (i < u && (uint32_t)(m->keys[i] >> 40) < b)
            i++;
        m->from[b] = i;
    }
    *out = m;
    return 0;
}

/* Reports the ids of pair p, which ends at `end`: a binary search in the
 * keys of p's second byte (a few, mostly). */
static int report(const struct cpupair *m, uint32_t p, uint64_t end, cpulit_fn fn, void *ctx)
{
    size_t a = m->from[p >> 8], z = m->from[(p >> 8) + 1];
    uint64_t want = (uint64_t)p << 32;
    while (a < z) { /* the first key >= want */
        size_t mid = a + (z - a) / 2;
        if (m->keys[mid] < want)
            a = mid + 1;
        else
            z = mid;
    }
    for (; a < m->n && m->keys[a] >> 32 == p; a++) {
        int rc = fn(ctx, (uint32_t)m->keys[a], end);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static inline bool marked(const struct cpupair *m, uint32_t p)
{
    return (m->bits[p >> 6] >> (p & 63)) & 1;
}

/* Every start in [s, e) (e <= the last start + 1): eight a round, one
 * test each, one branch for the eight. */
static int scan_all(const struct cpupair *m, const uint8_t *buf, size_t s, size_t e, cpulit_fn fn,
                    void *ctx)
{
    int rc = 0;
    while (s + 8 <= e && rc == 0) {
        const uint8_t *p = buf + s;
        uint32_t any = 0;
        for (uint32_t t = 0; t < 8; t++)
            any |= (uint32_t)marked(m, p[t] | (uint32_t)p[t + 1] << 8) << t;
        for (uint32_t t = 0; any != 0 && rc == 0; t++, any >>= 1)
            if (any & 1)
                rc = report(m, p[t] | (uint32_t)p[t + 1] << 8, s + t + 2, fn, ctx);
        s += 8;
    }
    for (; s < e && rc == 0; s++) {
        uint32_t x = buf[s] | (uint32_t)buf[s + 1] << 8;
        if (marked(m, x))
            rc = report(m, x, s + 2, fn, ctx);
    }
    return rc;
}

#if defined(__SSE2__)
/* Bit t: whether p[t] is an odd_byte, for t < 16. */
static inline uint32_t odd_mask16(const uint8_t *p)
{
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    /* signed: 0x00..0x1f and 0x80..0xff are below 0x20 */
    __m128i low = _mm_cmplt_epi8(v, _mm_set1_epi8(0x20));
    __m128i ws = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\t')),
                                           _mm_cmpeq_epi8(v, _mm_set1_epi8('\n'))),
                              _mm_cmpeq_epi8(v, _mm_set1_epi8('\r')));
    __m128i odd = _mm_or_si128(_mm_andnot_si128(ws, low), _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7f)));
    return (uint32_t)_mm_movemask_epi8(odd);
}

/* Bit t: whether a pair of m->common starts at p[t], for t < 16 (reads
 * p[0..16]). */
static inline uint32_t common_mask16(const struct cpupair *m, const uint8_t *p)
{
    __m128i v0 = _mm_loadu_si128((const __m128i *)p);
    __m128i v1 = _mm_loadu_si128((const __m128i *)(p + 1));
    __m128i any = _mm_setzero_si128();
    for (uint32_t k = 0; k < m->n_common; k++) {
        __m128i a = _mm_cmpeq_epi8(v0, _mm_loadu_si128((const __m128i *)m->splat[k][0]));
        __m128i b = _mm_cmpeq_epi8(v1, _mm_loadu_si128((const __m128i *)m->splat[k][1]));
        any = _mm_or_si128(any, _mm_and_si128(a, b));
    }
    return (uint32_t)_mm_movemask_epi8(any);
}

/* A block of 64 starts with more candidates than this is tested whole
 * (binaries), as scan_all does. */
#define CAND_DENSE 16

/* The block of 64 starts at s: `odd` has bit t for an odd byte at s + t,
 * `common` for a common pair starting there. Start t holds bytes t and
 * t + 1, so the candidates are the starts with an odd byte in either and
 * those of a common pair; they are tested, or the whole block is where
 * they are dense. */
static inline int test_block(const struct cpupair *m, const uint8_t *buf, size_t s, uint64_t odd,
                             uint64_t common, cpulit_fn fn, void *ctx)
{
    const uint8_t *p = buf + s;
    uint64_t cand = odd | odd >> 1 | (uint64_t)odd_byte(p[64]) << 63 | common;
    if (cand == 0)
        return 0;
    if (__builtin_popcountll(cand) > CAND_DENSE)
        return scan_all(m, buf, s, s + 64, fn, ctx);
    int rc = 0;
    for (; cand != 0 && rc == 0; cand &= cand - 1) {
        uint32_t t = (uint32_t)__builtin_ctzll(cand);
        uint32_t x = p[t] | (uint32_t)p[t + 1] << 8;
        if (marked(m, x))
            rc = report(m, x, s + t + 2, fn, ctx);
    }
    return rc;
}

#if HAVE_AVX2_PATH
/* odd_mask16 and common_mask16 for 32 bytes, where the CPU has AVX2. */
__attribute__((target("avx2"))) static inline uint32_t odd_mask32(const uint8_t *p)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    __m256i low = _mm256_cmpgt_epi8(_mm256_set1_epi8(0x20), v);
    __m256i ws = _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi8('\t')),
                                                 _mm256_cmpeq_epi8(v, _mm256_set1_epi8('\n'))),
                                 _mm256_cmpeq_epi8(v, _mm256_set1_epi8('\r')));
    __m256i odd =
        _mm256_or_si256(_mm256_andnot_si256(ws, low), _mm256_cmpeq_epi8(v, _mm256_set1_epi8(0x7f)));
    return (uint32_t)_mm256_movemask_epi8(odd);
}

__attribute__((target("avx2"))) static inline uint32_t common_mask32(const struct cpupair *m,
                                                                     const uint8_t *p)
{
    __m256i v0 = _mm256_loadu_si256((const __m256i *)p);
    __m256i v1 = _mm256_loadu_si256((const __m256i *)(p + 1));
    __m256i any = _mm256_setzero_si256();
    for (uint32_t k = 0; k < m->n_common; k++) {
        __m256i a = _mm256_cmpeq_epi8(v0, _mm256_set1_epi8((char)(m->common[k] & 0xff)));
        __m256i b = _mm256_cmpeq_epi8(v1, _mm256_set1_epi8((char)(m->common[k] >> 8)));
        any = _mm256_or_si256(any, _mm256_and_si256(a, b));
    }
    return (uint32_t)_mm256_movemask_epi8(any);
}

/* scan_odd with 32 bytes a compare. */
__attribute__((target("avx2"))) static int scan_odd_avx2(const struct cpupair *m,
                                                         const uint8_t *buf, size_t s, size_t e,
                                                         cpulit_fn fn, void *ctx)
{
    int rc = 0;
    for (; s + 64 < e && rc == 0; s += 64) {
        const uint8_t *p = buf + s;
        uint64_t odd = (uint64_t)odd_mask32(p) | (uint64_t)odd_mask32(p + 32) << 32;
        uint64_t common = m->n_common == 0 ? 0
                                           : (uint64_t)common_mask32(m, p) |
                                                 (uint64_t)common_mask32(m, p + 32) << 32;
        rc = test_block(m, buf, s, odd, common, fn, ctx);
    }
    return rc == 0 ? scan_all(m, buf, s, e, fn, ctx) : rc;
}
#endif

/* Starts [s, e) (e <= the last start + 1) of a fast matcher: only those
 * with an odd byte in them (either of the two) or holding a common pair
 * can be marked. Blocks of 64 starts (test_block); byte s + 64 must exist
 * for the last start of a block, so the tail goes to scan_all. */
static int scan_odd(const struct cpupair *m, const uint8_t *buf, size_t s, size_t e, cpulit_fn fn,
                    void *ctx)
{
    int rc = 0;
    for (; s + 64 < e && rc == 0; s += 64) {
        const uint8_t *p = buf + s;
        uint64_t odd = (uint64_t)odd_mask16(p) | (uint64_t)odd_mask16(p + 16) << 16 |
                       (uint64_t)odd_mask16(p + 32) << 32 | (uint64_t)odd_mask16(p + 48) << 48;
        uint64_t common = 0;
        if (m->n_common > 0)
            common = (uint64_t)common_mask16(m, p) | (uint64_t)common_mask16(m, p + 16) << 16 |
                     (uint64_t)common_mask16(m, p + 32) << 32 |
                     (uint64_t)common_mask16(m, p + 48) << 48;
        rc = test_block(m, buf, s, odd, common, fn, ctx);
    }
    return rc == 0 ? scan_all(m, buf, s, e, fn, ctx) : rc;
}
#endif

bool cpupair_fast(const struct cpupair *m)
{
#if defined(__SSE2__)
    return m->fast;
#else
    return false;
#endif
}

int cpupair_scan(const struct cpupair *m, const uint8_t *buf, size_t len, size_t begin, uint64_t lo,
                 uint64_t hi, cpulit_fn fn, void *ctx)
{
    if (hi > len)
        hi = len;
    /* pairs at s end at s + 2: lo < s + 2 <= hi */
    size_t s = lo >= 1 && lo - 1 > begin ? (size_t)(lo - 1) : begin;
    if (hi < 2 || s > (size_t)hi - 2)
        return 0;
    size_t e = (size_t)hi - 1; /* past the last start */
#if defined(__SSE2__)
#if HAVE_AVX2_PATH
    if (m->fast && m->avx2)
        return scan_odd_avx2(m, buf, s, e, fn, ctx);
#endif
    if (m->fast)
        return scan_odd(m, buf, s, e, fn, ctx);
#endif
    return scan_all(m, buf, s, e, fn, ctx);
}
