/*
 * The key/value lists of the stats op and of scan telemetry
 * (docs/daemon.md lists every key). Keys are borrowed: string literals, or
 * histogram keys that live in the server's counters.
 *
 * Loop thread only.
 */
#ifndef VKS_DAEMON_STATS_H
#define VKS_DAEMON_STATS_H

#include <stdint.h>
#include <sys/types.h>

#include "metrics.h"
#include "proto.h"

struct server;

/* A bounded list of named values; entries past its capacity are dropped. */
struct stats_list {
    struct proto_stat v[192];
    uint32_t n;
};

void stats_add_u(struct stats_list *l, const char *key, uint64_t v);
void stats_add_f(struct stats_list *l, const char *key, double v);

/* Appends the histogram's keys (metrics.h); `h` must outlive the list. */
void stats_add_hist(struct stats_list *l, const struct metrics_hist *h);

/* Fills `l` (emptied first) with the stats op's map as the tenant `uid`
 * sees it: service-wide figures, its own tenant.* figures, the limits. */
void stats_collect(struct server *srv, uid_t uid, struct stats_list *l);

#endif
