/*
 * The key/value lists of the stats op and of scan telemetry
 * (docs/daemon.md lists every key). Keys are borrowed: string literals, or
 * histogram keys that live in the server's counters.
 *
 * Loop thread only.
 */
#ifndef VKS_DAEMON_STATS_H
#define VKS_DAEMON_STATS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "metrics.h"
#include "proto.h"

struct server;

/* A bounded list of named values; entries past its capacity are dropped. */
struct stats_list {
    struct proto_stat v[384]; /* room for engine.N.* of 16 GPU engines */
    uint32_t n;
};

void stats_add_u(struct stats_list *l, const char *key, uint64_t v);
void stats_add_f(struct stats_list *l, const char *key, double v);

/* Appends the histogram's keys (metrics.h); `h` must outlive the list. */
void stats_add_hist(struct stats_list *l, const struct metrics_hist *h);

/* Fills `l` (emptied first) with the stats op's map as the tenant `uid`
 * sees it: its own tenant.* figures and the limits, plus the service-wide
 * figures (every tenant's volume) when `admin` (root or admin-gids). */
void stats_collect_as(struct server *srv, uid_t uid, bool admin, struct stats_list *l);

/* stats_collect_as with `admin` set (the operator's own views). */
void stats_collect(struct server *srv, uid_t uid, struct stats_list *l);

#endif
