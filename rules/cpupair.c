/*
 * Two-byte strings for the CPU engine (cpupair.h).
 *
 * Each entry becomes its case variants as (pair, id) keys, pair = first
 * byte | second byte << 8, sorted and without repeats. The scan tests each
 * position's pair against the bitmap (8 KiB: stays in the L1 cache) and,
 * for a marked pair, reports the ids of its keys, found by binary search;
 * marked pairs are rare by construction (cpupair_rare), so the search is
 * off the hot path.
 */
#include "cpupair.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "refscan.h" /* scan_sort_u64 */

struct cpupair {
    uint64_t bits[65536 / 64];
    uint64_t *keys; /* pair << 32 | id, ascending, unique */
    size_t n;
    uint32_t from[257]; /* keys of pairs whose second byte is b: [from[b], from[b + 1]) */
};

void cpupair_destroy(struct cpupair *m)
{
    if (m == NULL)
        return;
    free(m->keys);
    free(m);
}

bool cpupair_rare(uint8_t b0, uint8_t b1)
{
    /* bytes that text seldom holds */
    bool odd0 = (b0 < 0x20 && b0 != '\t' && b0 != '\n' && b0 != '\r') || b0 >= 0x7f;
    bool odd1 = (b1 < 0x20 && b1 != '\t' && b1 != '\n' && b1 != '\r') || b1 >= 0x7f;
    return (odd0 || odd1) && b0 != b1;
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
    for (size_t i = 0; i < u; i++) {
        uint32_t p = (uint32_t)(m->keys[i] >> 32);
        m->bits[p >> 6] |= 1ull << (p & 63);
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

int cpupair_scan(const struct cpupair *m, const uint8_t *buf, size_t len, size_t begin, uint64_t lo,
                 uint64_t hi, cpulit_fn fn, void *ctx)
{
    if (hi > len)
        hi = len;
    /* pairs at s end at s + 2: lo < s + 2 <= hi */
    size_t s = lo >= 1 && lo - 1 > begin ? (size_t)(lo - 1) : begin;
    if (hi < 2)
        return 0;
    size_t last = (size_t)hi - 2; /* the last start */
    int rc = 0;
    /* eight starts a round: one test each, one branch for the eight */
    while (s + 8 <= last + 1 && rc == 0) {
        const uint8_t *p = buf + s;
        uint32_t any = 0;
        for (uint32_t t = 0; t < 8; t++)
            any |= (uint32_t)marked(m, p[t] | (uint32_t)p[t + 1] << 8) << t;
        for (uint32_t t = 0; any != 0 && rc == 0; t++, any >>= 1)
            if (any & 1)
                rc = report(m, p[t] | (uint32_t)p[t + 1] << 8, s + t + 2, fn, ctx);
        s += 8;
    }
    for (; s <= last && rc == 0; s++) {
        uint32_t x = buf[s] | (uint32_t)buf[s + 1] << 8;
        if (marked(m, x))
            rc = report(m, x, s + 2, fn, ctx);
    }
    return rc;
}
