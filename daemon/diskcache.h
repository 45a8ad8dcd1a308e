/*
 * The catalog store's disk cache under the state directory:
 *   catalogs/<fp>.cat     the packed catalog bytes (validated when read back)
 *   catalogs/<fp>.owners  one uid per line: who holds it
 *   sources/<src>.src     a rule set's catalog fingerprint and rejected rules
 * Every file is written to a temporary name and renamed, so a crash leaves
 * the old or the new file, never half of one. All disk operations go through
 * one FIFO run in uv_queue_work, one at a time, so a delete never overtakes
 * the write it follows. A failed operation is counted (disk_errors) and
 * logged; the store stays correct, only colder.
 *
 * Part of the store (store_internal.h): every function takes the store and
 * runs on the loop thread; without a state directory (st->disk false) the
 * save and delete functions do nothing.
 */
#ifndef VKS_DAEMON_DISKCACHE_H
#define VKS_DAEMON_DISKCACHE_H

#include <stdbool.h>

#include "error.h"

struct store;
struct store_entry;
struct store_source;

/*
 * Sets up `state_dir` (creating it and its catalogs/ and sources/
 * directories) and reads its index into the store: entries with their
 * owners, and the source records written by this compiler version.
 * Blocking; call from store_create. Returns 0, or a negative code with
 * `err` naming the directory that cannot be used.
 */
int diskcache_open(struct store *st, const char *state_dir, struct vks_error *err);

/* Queues writing the body of `e` (referenced until written); marks it
 * on_disk when done. */
void diskcache_save_catalog(struct store *st, struct store_entry *e);

/* Queues writing the owners of `e`; a change while a write is queued is
 * written after it. */
void diskcache_save_owners(struct store *st, struct store_entry *e);

/* Queues writing the source record `s` (copied now). */
void diskcache_save_source(struct store *st, const struct store_source *s);

/* Queues reading the body of `e` from disk; store_catalog_read gets the
 * result. Returns 0, or -ENOMEM when nothing was queued. */
int diskcache_read_catalog(struct store *st, struct store_entry *e);

/* Queues deleting every file of `e` (its catalog, owners and sources),
 * after the writes queued before. */
void diskcache_delete(struct store *st, const struct store_entry *e);

/* True while disk operations are queued or running. */
bool diskcache_busy(const struct store *st);

/*
 * Writes <state-dir>/recent: the fingerprints of the catalogs used last,
 * most recent first (at most DISKCACHE_RECENT_MAX), which the next start's
 * store_preload reads first. Blocking (a few hundred bytes): called once,
 * at exit. A failure is logged; the next start only preloads less.
 */
void diskcache_save_recent(struct store *st);

/* The same list written by the disk thread, only when it changed since the
 * last write (store_sweep, every recent-save-ms): a daemon killed without
 * its clean stop still preloads what it used up to then. */
void diskcache_save_recent_changed(struct store *st);

#define DISKCACHE_RECENT_MAX 64u

#endif
