/*
 * Histograms for the stats op. A histogram is reported as flat stats keys
 * (docs/daemon.md, "Stats keys"): `<name>.bucket.<le>`, the cumulative
 * count of observations <= le in the histogram's own unit, one key per
 * bound; `<name>.bucket.inf`, `<name>.sum` and `<name>.count`. `vkscan
 * status --prometheus` turns them into Prometheus histograms.
 *
 * Loop thread only: nothing here locks.
 */
#ifndef VKS_DAEMON_METRICS_H
#define VKS_DAEMON_METRICS_H

#include <stdint.h>

#include "proto.h"

#define METRICS_MAX_BOUNDS 8
#define METRICS_KEY_MAX    48

struct metrics_hist {
    uint32_t n_bounds;
    uint64_t bounds[METRICS_MAX_BOUNDS];     /* ascending */
    uint64_t counts[METRICS_MAX_BOUNDS + 1]; /* per bucket; the last is above every bound */
    uint64_t sum, count;
    char keys[METRICS_MAX_BOUNDS + 3][METRICS_KEY_MAX]; /* buckets, inf, sum, count */
};

/* Bounds of the duration histograms, in ns: 100 us .. 10 s by decades. */
extern const uint64_t metrics_ns_bounds[6];
/* Bounds of the size histograms, in bytes: 4 KiB .. 4 GiB by 16x. */
extern const uint64_t metrics_byte_bounds[6];

/* Sets `h` up empty with the key prefix `name` (at most 24 bytes) and `n`
 * ascending bounds (at most METRICS_MAX_BOUNDS; more are ignored). */
void metrics_hist_init(struct metrics_hist *h, const char *name, const uint64_t *bounds,
                       uint32_t n);

/* Counts one observation. */
void metrics_hist_observe(struct metrics_hist *h, uint64_t v);

/*
 * Writes the histogram's stats entries (buckets cumulative) to out[0..cap)
 * and returns how many; the keys are borrowed from `h`, which must outlive
 * the entries. Writes nothing when `cap` is too small for all of them.
 */
uint32_t metrics_hist_stats(const struct metrics_hist *h, struct proto_stat *out, uint32_t cap);

#endif
