/*
 * The result cache (issue 15): the hits of descriptor buffers whose file did
 * not change, so that a rescan of the same file (CI secret scans of a
 * mostly unchanged repository, the same directory every hour) neither
 * reads nor scans it again, as clamd keeps the files it found clean.
 *
 * A key is exact and cheap: the tenant, the catalog's fingerprint, the
 * report mode and the file's identity (engine_fid: st_dev, st_ino, st_size,
 * st_mtim, st_ctim and the range). Contents are never hashed: the engine
 * stores only results of files that were not modified within a second of
 * the scan's start (racily clean, as git treats its index), so a later
 * change always changes the key. A tenant never sees another's entries
 * (the uid is part of the key).
 *
 * An entry holds one buffer's complete hits (never a list cut by max_hits),
 * packed as varints. Memory (entries, their hits and the hash table) stays
 * within the configured bytes (result-cache-bytes); the least recently used
 * entries are evicted first.
 *
 * Thread-safe: one mutex. Engine threads look up and insert; the loop
 * thread reads the stats.
 */
#ifndef VKS_DAEMON_RCACHE_H
#define VKS_DAEMON_RCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "engine.h"

/* Zero it before filling it in: keys are compared as bytes. */
struct rcache_key {
    uint32_t uid;
    uint32_t mode; /* enum scan_mode */
    uint8_t fp[CATALOG_FP_LEN];
    struct engine_fid id;
};

struct rcache_stats {
    uint64_t bytes, limit, entries;
    uint64_t hits, misses, inserts, evictions;
};

struct rcache;

/* Creates a cache of at most `max_bytes`. Sets *out to NULL (and returns 0)
 * for 0: no cache. Returns 0 or -ENOMEM. */
int rcache_create(uint64_t max_bytes, struct rcache **out);

/* NULL is allowed. */
void rcache_destroy(struct rcache *c);

/* Looks `k` up. On a hit returns 0 with *hits (the caller's, free() it; each
 * hit's `buffer` set to `buffer`) and *n, and makes the entry the most
 * recently used; -ENOENT on a miss, -ENOMEM. */
int rcache_get(struct rcache *c, const struct rcache_key *k, uint32_t buffer,
               struct engine_hit **hits, size_t *n);

/* Stores the complete hits of one buffer (sorted by end, then rule) under
 * `k`, replacing an entry with that key, evicting the least recently used
 * entries to stay within the limit. An entry over an eighth of the limit is
 * not stored; neither is one that cannot be allocated. `hits` is borrowed. */
void rcache_put(struct rcache *c, const struct rcache_key *k, const struct engine_hit *hits,
                size_t n);

/* A snapshot of the counters. */
void rcache_get_stats(struct rcache *c, struct rcache_stats *out);

#endif
