/*
 * Histograms (metrics.h): fixed bounds, counts kept per bucket and summed
 * into cumulative buckets only when reported.
 */
#include "metrics.h"

#include <stdio.h>
#include <string.h>

const uint64_t metrics_ns_bounds[6] = {100000ull,    1000000ull,    10000000ull,
                                       100000000ull, 1000000000ull, 10000000000ull};
const uint64_t metrics_byte_bounds[6] = {4ull << 10,  64ull << 10,  1ull << 20,
                                         16ull << 20, 256ull << 20, 4ull << 30};

void metrics_hist_init(struct metrics_hist *h, const char *name, const uint64_t *bounds, uint32_t n)
{
    memset(h, 0, sizeof(*h));
    h->n_bounds = n < METRICS_MAX_BOUNDS ? n : METRICS_MAX_BOUNDS;
    for (uint32_t i = 0; i < h->n_bounds; i++) {
        h->bounds[i] = bounds[i];
        snprintf(h->keys[i], METRICS_KEY_MAX, "%.24s.bucket.%llu", name,
                 (unsigned long long)bounds[i]);
    }
    snprintf(h->keys[h->n_bounds], METRICS_KEY_MAX, "%.24s.bucket.inf", name);
    snprintf(h->keys[h->n_bounds + 1], METRICS_KEY_MAX, "%.24s.sum", name);
    snprintf(h->keys[h->n_bounds + 2], METRICS_KEY_MAX, "%.24s.count", name);
}

void metrics_hist_observe(struct metrics_hist *h, uint64_t v)
{
    uint32_t i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    /* atomic: engine threads count the scans whose replies they write
     * (daemon/session.c session_scan_finished) while the loop counts others */
    __atomic_fetch_add(&h->counts[i], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&h->sum, v, __ATOMIC_RELAXED);
    __atomic_fetch_add(&h->count, 1, __ATOMIC_RELAXED);
}

uint32_t metrics_hist_stats(const struct metrics_hist *h, struct proto_stat *out, uint32_t cap)
{
    uint32_t n = h->n_bounds + 3;
    if (cap < n)
        return 0;
    uint64_t cum = 0;
    for (uint32_t i = 0; i <= h->n_bounds; i++) {
        cum += __atomic_load_n(&h->counts[i], __ATOMIC_RELAXED);
        out[i] = (struct proto_stat){.key = h->keys[i], .u = cum};
    }
    out[h->n_bounds + 1] = (struct proto_stat){.key = h->keys[h->n_bounds + 1],
                                               .u = __atomic_load_n(&h->sum, __ATOMIC_RELAXED)};
    out[h->n_bounds + 2] = (struct proto_stat){.key = h->keys[h->n_bounds + 2],
                                               .u = __atomic_load_n(&h->count, __ATOMIC_RELAXED)};
    return n;
}
