/*
 * The catalog store: every compiled catalog the daemon knows, by catalog
 * fingerprint, with
 *   - the tenants (uids) that loaded it: only they may see or use it;
 *   - the rule sets (source fingerprints, proto_source_canon) that compile to
 *     it, with their rejected rules, so an identical catalog.load or a
 *     catalog.has by source is answered without compiling;
 *   - its packed bytes in host memory while used, dropped again (LRU, under
 *     a host budget) when idle and safely on disk;
 *   - a disk cache in <state-dir>/catalogs and <state-dir>/sources, read at
 *     start, so a restarted daemon loads known catalogs instead of compiling.
 *
 * Device residency is the engine's (gpu/ keeps its own LRU by fingerprint);
 * the store only says which fingerprints are gone for good (store_set_forget).
 *
 * Threads: every function runs on the loop thread. Compilation and disk
 * reads and writes run in uv_queue_work; callbacks come back on the loop
 * thread, possibly before the function that started them returns.
 */
#ifndef VKS_DAEMON_STORE_H
#define VKS_DAEMON_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "catalog.h"
#include "error.h"
#include "proto.h"
#include "rules.h"

struct cpool;
struct store;
struct store_entry;

struct store_options {
    const char *state_dir;        /* "" or NULL: no disk cache */
    uint64_t host_budget;         /* bytes of idle catalogs kept in memory */
    uint32_t tenant_max_catalogs; /* catalogs one uid may hold */
    struct cpool *pool;           /* compiles run here (borrowed; the server's) */
    uint32_t compile_timeout_ms;  /* a compile running longer stops: TIMEOUT; 0 = none */
    uint32_t recent_save_ms;      /* the catalogs used last are written this often when
                                   * they changed (store_sweep); 0: only at a clean stop */
};

struct store_stats {
    uint64_t catalogs;           /* known catalogs (in memory or on disk) */
    uint64_t in_memory;          /* of those, with their bytes loaded */
    uint64_t host_bytes;         /* packed bytes in memory */
    uint64_t compiles;           /* rule sets compiled since start */
    uint64_t compile_ns;         /* time spent compiling */
    uint64_t compiles_stopped;   /* compiles stopped: timeout, client gone, shutdown */
    uint64_t disk_loads;         /* catalogs read back from the disk cache */
    uint64_t disk_read_failures; /* cached catalogs found unreadable, deleted */
    uint64_t memory_hits;        /* has/load/scan lookups that found the catalog in memory */
    uint64_t disk_writes;        /* catalogs written to the disk cache */
    uint64_t cache_hits;         /* catalog.load answered without compiling */
    uint64_t host_evictions;
    uint64_t tenant_evictions; /* catalogs a tenant at tenant-max-catalogs gave up for a new one */
    uint64_t disk_errors;      /* disk cache files that could not be read or written */
};

/* What a catalog.load or catalog.has gets back; borrowed for the callback. */
struct store_result {
    bool known;                /* has: the tenant holds it; load: true on success */
    struct store_entry *entry; /* with the body loaded; NULL when !known */
    const uint8_t *source;     /* source fingerprint, or NULL when not known */
    const struct rule_reject *rejects;
    size_t n_rejects;
    bool cached;         /* load: this tenant held the catalog already */
    uint64_t compile_ns; /* load: the compile time (when it compiled, or when it first
                          * compiled since start for a tenant new to it), 0 when cached */
};

/* `status` is 0, or a negative code (-VKS_E_*, -errno) with `err` filled. */
typedef void (*store_cb)(void *ctx, int status, const struct store_result *res,
                         const struct vks_error *err);

/* Called when a catalog is gone for good (last owner dropped it). */
typedef void (*store_forget_fn)(void *ctx, const uint8_t fp[CATALOG_FP_LEN]);

/*
 * Creates the store and reads the disk cache index (blocking: call before
 * serving). A missing state directory is created. Returns 0, or -errno with
 * `err` saying which directory cannot be used.
 */
int store_create(uv_loop_t *loop, const struct store_options *opt, struct store **out,
                 struct vks_error *err);

/* Frees everything; no work may be pending (store_busy() false). NULL is
 * allowed. */
void store_destroy(struct store *st);

/* True while compiles or disk I/O are in flight. */
bool store_busy(const struct store *st);

void store_set_options(struct store *st, const struct store_options *opt);

/* Called (loop thread) each time the last compile or disk operation in
 * flight finishes, so a draining server knows when the store is done. */
void store_set_idle(struct store *st, void (*fn)(void *ctx), void *ctx);
void store_set_forget(struct store *st, store_forget_fn fn, void *ctx);

/*
 * catalog.load for tenant `uid`: finds the rule set by source fingerprint, or
 * compiles it (uv_queue_work), makes `uid` an owner and calls `cb`. `load` is
 * borrowed until `cb` runs. Bad rules are rejects in the result, not errors;
 * errors: -VKS_E_RULES (no rule compiled and none could: e.g. bad options),
 * -VKS_E_BUSY (tenant at its catalog limit), -ENOMEM.
 */
void store_load(struct store *st, uid_t uid, const struct proto_catalog_load *load, store_cb cb,
                void *ctx);

/* The client of the load whose callback context is `ctx` left: its compile
 * stops (at the compiler's next group); the callback still runs, with
 * -ECANCELED. No effect when `ctx` has no compile in flight. */
void store_cancel(struct store *st, void *ctx);

/* SIGTERM drain: every compile stops; their loads get -VKS_E_SHUTDOWN. */
void store_shutdown(struct store *st);

/* Stops compiles running longer than compile_timeout_ms; their loads get
 * -VKS_E_TIMEOUT. Called from the server's sweep timer. */
void store_sweep(struct store *st);

/*
 * catalog.has: `known` is true only when `uid` holds the catalog (by catalog
 * or source fingerprint); the body is then loaded before `cb`, so the
 * result can list its rules.
 */
void store_has(struct store *st, uid_t uid, const struct proto_catalog_ref *ref, store_cb cb,
               void *ctx);

/*
 * catalog.drop: `uid` stops holding the catalog. Returns 1 when it held it,
 * 0 when it did not. A catalog no one holds is deleted from memory (once
 * unused), from disk and from the device.
 */
int store_drop(struct store *st, uid_t uid, const uint8_t fp[CATALOG_FP_LEN]);

/*
 * For a scan: looks up `fp` among `uid`'s catalogs and calls `cb` with the
 * entry once its body is loaded. Errors: -VKS_E_UNKNOWN_CATALOG (not held by
 * this uid, whoever else holds it), -EIO (the disk copy is unreadable).
 */
void store_acquire(struct store *st, uid_t uid, const uint8_t fp[CATALOG_FP_LEN], store_cb cb,
                   void *ctx);

/* References keep an entry's body in memory (queued and running scans). */
void store_entry_ref(struct store_entry *e);
void store_entry_unref(struct store *st, struct store_entry *e);

/* The loaded catalog (borrowed while referenced). */
const struct catalog *store_entry_catalog(const struct store_entry *e);
const uint8_t *store_entry_fp(const struct store_entry *e);

/* The loaded catalog's rules (ids and fingerprints, or with `ids_only` the
 * ids, in catalog order) packed for a catalog result's `rules`
 * (proto_pack_rules): made on the first call and kept with the body, in its
 * host bytes, so a catalog.has of a 43 k-rule catalog is a copy. The bytes
 * stay valid while the entry is referenced. */
int store_entry_rules_packed(struct store *st, struct store_entry *e, bool ids_only,
                             const uint8_t **p, size_t *len, struct vks_error *err);

/*
 * Reads into memory the catalogs used last (at most `n`, most recent
 * first: those <state-dir>/catalogs/recent lists, written when the last
 * run stopped, and those used since), one after the other, and calls `cb`
 * with each (res->entry, referenced for the call: store_entry_ref keeps
 * it), then once with res->entry NULL when done. Stops early at the host
 * budget (host-catalog-budget) and at store_shutdown; an unreadable file
 * is skipped (counted and deleted as for any read). Nothing else changes:
 * the owners do not (no tenant may use a catalog it did not load), nor how
 * recently each was used; the bodies stay in memory as any idle catalog
 * does (host LRU). Called once, at start.
 */
void store_preload(struct store *st, uint32_t n, store_cb cb, void *ctx);

/* Number of catalogs `uid` holds. */
uint32_t store_tenant_catalogs(const struct store *st, uid_t uid);

void store_get_stats(const struct store *st, struct store_stats *out);

#endif
