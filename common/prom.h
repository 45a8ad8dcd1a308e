/*
 * Prometheus text exposition (format 0.0.4) of vkscand's stats map: one
 * renderer shared by `vkscan status --prometheus` (client/vkscan_status.c)
 * and vkscand's own GET /metrics endpoint (daemon/metrics_http.c), so both
 * print the same metric names, types and help texts.
 *
 * Known keys get their metric name, type and help text from a table;
 * prefixes give labels (requests.OP[.RESULT], limit.NAME, tenant.X with a
 * uid label); `NAME.bucket.LE`, `NAME.sum` and `NAME.count` keys form a
 * histogram; a `_ns` unit becomes seconds; any other key is exported
 * untyped, so new daemon counters appear without a client release.
 */
#ifndef VKS_COMMON_PROM_H
#define VKS_COMMON_PROM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct prom_stat {
    const char *key;
    bool is_float;
    uint64_t u;
    double f;
    /* tenant.* keys: the tenant's uid label. When false, the value of the
     * `tenant.uid` entry of the same list is used. */
    bool has_uid;
    uint64_t uid;
};

/*
 * Writes the exposition of `stats[0..n)` to `out`: vkscand_info (server,
 * protocol and engine labels; the `engine` key is 0 for gpu), then every
 * family sorted by name. `requests` (a sum) and `tenant.uid` (a label) are
 * not exported as series. Returns 0, or -ENOMEM.
 */
int prom_write(FILE *out, const char *server, uint32_t protocol, const struct prom_stat *stats,
               size_t n);

#endif
