/*
 * The store's internals, shared by store.c (entries, sources, LRU, compile,
 * requests) and diskcache.c (the state directory). Nothing else includes
 * this file. Loop thread only, like store.h.
 */
#ifndef VKS_DAEMON_STORE_INTERNAL_H
#define VKS_DAEMON_STORE_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "catalog.h"
#include "rules.h"
#include "store.h"

#define STORE_HEX_LEN (2 * CATALOG_FP_LEN)
#define STORE_BUCKETS 256u

struct disk_op;

struct store_source {
    struct store_source *next;  /* all sources */
    struct store_source *enext; /* sources of the same entry */
    uint8_t src[CATALOG_FP_LEN];
    struct store_entry *entry;
    struct rule_reject *rejects;
    size_t n_rejects;
    uint64_t compile_ns; /* what compiling it took, when this run compiled it; else 0 */
};

struct compile_job;

struct waiter {
    struct waiter *next;
    store_cb cb;
    void *ctx;
    struct store_result res; /* entry filled in when the body arrives */
    /* A catalog.load waiting on a disk read (NULL otherwise): when the
     * cached file turns out unreadable, the load compiles instead. */
    const struct proto_catalog_load *load;
    uid_t uid;
    bool has; /* a catalog.has: an unreadable entry is answered as unknown */
};

struct store_entry {
    struct store_entry *hnext;
    struct store_entry *lru_prev, *lru_next; /* idle, loaded, evictable */
    bool in_lru;
    uint8_t fp[CATALOG_FP_LEN];
    struct catalog *cat; /* NULL while only on disk */
    size_t bytes;        /* of cat and rules_packed, in host_bytes */
    struct proto_buf
        rules_packed[2]; /* a catalog result's rules, [1]: ids only; made on first use */
    unsigned refs;
    unsigned disk_refs; /* of refs, those the disk cache's queued writes hold */
    uid_t *owners;
    size_t n_owners, cap_owners;
    bool on_disk; /* the .cat file is written */
    bool loading;
    bool dead; /* no owner left: out of the table, freed when unreferenced */
    bool owners_writing, owners_dirty;
    /* When a tenant last used it (st->tick; 0: not since start, and not
     * listed in <state-dir>/recent): what store_preload picks by. */
    uint64_t last_use;
    struct store_source *sources;
    struct waiter *waiters;
};

struct store {
    uv_loop_t *loop;
    struct store_options opt;
    char dir_cat[PATH_MAX], dir_src[PATH_MAX];
    bool disk;
    uint32_t compiler; /* the rules compiler version of this build */
    struct store_entry *table[STORE_BUCKETS];
    struct store_source *sources;
    struct store_entry *lru_head, *lru_tail; /* head = least recently used */
    struct disk_op *disk_head, *disk_tail;
    bool disk_running;
    uint64_t recent_saved_ms; /* when store_sweep last looked at the recent list */
    uint64_t recent_hash;     /* FNV-1a of the recent list last written */
    unsigned compiling;
    struct compile_job *compiles; /* in flight, for cancelling */
    store_forget_fn forget;
    void *forget_ctx;
    void (*idle)(void *ctx);
    void *idle_ctx;
    struct store_stats stats;
    uint64_t tick; /* entries' last_use */
    bool shutdown;
    /* store_preload: the fingerprints left to read, one at a time. */
    struct {
        uint8_t (*fp)[CATALOG_FP_LEN];
        uint32_t n, next;
        store_cb cb;
        void *ctx;
    } preload;
};

/* The entry with catalog fingerprint `fp`, or NULL. */
struct store_entry *store_table_find(const struct store *st, const uint8_t fp[CATALOG_FP_LEN]);

/* Unlinks `e` from the table (the caller frees or kills it). */
void store_table_remove(struct store *st, struct store_entry *e);

/* A new entry without a body or owners, in the table; NULL when out of
 * memory. */
struct store_entry *store_entry_new(struct store *st, const uint8_t fp[CATALOG_FP_LEN]);

/* Frees `e`, its body and its sources; it must be out of the table. */
void store_entry_free(struct store *st, struct store_entry *e);

/* Adds `uid` to the owners: 1 when added, 0 when it was one, -ENOMEM. */
int store_entry_add_owner(struct store_entry *e, uid_t uid);

/* The source record with source fingerprint `src`, or NULL. */
struct store_source *store_source_find(const struct store *st, const uint8_t src[CATALOG_FP_LEN]);

/* Adds a source record for `e`; takes ownership of `rejects`, also on
 * failure (NULL when out of memory). */
struct store_source *store_source_add(struct store *st, struct store_entry *e,
                                      const uint8_t src[CATALOG_FP_LEN],
                                      struct rule_reject *rejects, size_t n_rejects);

/* Entries by last_use, most recent first: at most `cap` live entries
 * with a last_use, into `out`; returns how many. */
uint32_t store_recent(const struct store *st, struct store_entry **out, uint32_t cap);

/* The end of diskcache_read_catalog: `status` 0 with `cat` (ownership
 * taken), or an error with `err`; answers the entry's waiters. */
void store_catalog_read(struct store *st, struct store_entry *e, int status, struct catalog *cat,
                        const struct vks_error *err);

#endif
