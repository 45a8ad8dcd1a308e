/*
 * The GPU literal matcher (shaders/scan_lit.comp): one pass over the data
 * for every DFA group of a catalog whose rules are all plain strings
 * (caseless letters allowed), instead of one DFA pass per group.
 * docs/gpu.md, "The literal kernel", describes the tables.
 *
 * Tables are built on the host from the catalog's rule sources (no catalog
 * format change), once per catalog fingerprint, and kept in a small cache
 * of the engine; the device copy lives with the resident catalog
 * (resident_catalog.lit) and is bound at binding 6. Engine-thread only,
 * like the rest of gpu/.
 */
#ifndef VKS_GPU_LIT_H
#define VKS_GPU_LIT_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"

/* Shortest string the kernel takes: its filter hashes the first
 * min(8, shortest) bytes of every string, and fewer than 4 select too
 * little. A group with a shorter string keeps its DFA. */
#define GPU_LIT_MIN_KEY 4u
/* Longest string it takes (segments overlap by the longest - 1). */
#define GPU_LIT_MAX_LEN 1024u

/* Host tables of one catalog's literal groups. */
struct gpu_lit {
    uint8_t fp[CATALOG_FP_LEN];
    uint64_t last_use;
    uint32_t n_dfa;
    uint8_t *route;         /* per DFA group: 1 when the literal kernel can serve it */
    uint32_t n_groups;      /* groups with route set; 0: none, nothing else is built */
    bool literal;           /* some group is CAT_GF_LITERAL: only this kernel scans it */
    bool own_reports;       /* no two rules share an id: each reports under its own index */
    bool one_group_reports; /* rules sharing an id are in one DFA group (merged accepts) */
    uint32_t n_lits, klen, fold, maxlen, min_len;
    uint32_t filter_words;                         /* power of two, from word 0 */
    uint32_t slots, slot_mask, lits, bytes, masks; /* word offsets of the sections */
    /* Loop iterations the kernel may spend on one candidate position at
     * most: the key, the probes and every string of the longest slot. */
    uint32_t pos_cost;
    uint32_t *words; /* the device image */
    uint32_t n_words;
};

/*
 * The tables of catalog `cat` for a filter of `filter_words` u32 words:
 * from the engine's cache (eng->lits, keyed by fingerprint) or built and
 * cached. `*out` stays owned by the cache and is valid until the next
 * call (at most GPU_LIT_CACHE catalogs are kept, so a batch's own ones
 * stay). A catalog without literal groups, or whose tables would be over
 * the device's storage-buffer range, gets tables with n_groups 0.
 * Returns 0 or -ENOMEM.
 */
int gpu_lit_get(struct gpu_engine *eng, const struct catalog *cat, uint32_t filter_words,
                struct gpu_lit **out);

/* Frees the engine's cache (engine destroy). */
void gpu_lit_cache_finish(struct gpu_engine *eng);

/* Copies `lit`'s image into resident catalog `rc` (rc->lit, device-local;
 * through a temporary staging buffer and a waited submit where the memory
 * is not mapped, or with gpu_options.staged_upload). Returns 0 or a negative errno with `err`
 * filled; on failure rc->lit may hold a buffer that gbuf_destroy frees. */
int gpu_lit_upload(struct gpu_engine *eng, struct resident_catalog *rc, const struct gpu_lit *lit,
                   struct vks_error *err);

/* Whether no two groups of `cat` can report the same (rule, end): 2 when
 * every rule reports under its own index (the literal kernel, which
 * matches strings apart, needs that), 1 when rules sharing an id are all
 * in one DFA group, whose states hold one accept entry per report index,
 * else 0; -ENOMEM when that cannot be found out. The counting finish and
 * counting on the device (plan.c plan_counts) rely on it. */
int gpu_reports_once(const struct catalog *cat);

/* The table part of catalog c's push constants, kept in bc->lit_pc
 * (plan.c, when the batch routes c's literal groups). */
void gpu_lit_push_tables(struct batch_ctx *bc, uint32_t c);

/* The push constants of literal range `sr` (batch.c records it, also
 * when the pass is re-run at collect, after the tables may have left the
 * cache: only bc->lit_pc is read). */
void gpu_lit_push(const struct batch_ctx *bc, const struct scan_range *sr, uint32_t head,
                  struct lit_push *pc);

#endif
