/*
 * Start of match (hsbench flag L, Hyperscan's HS_FLAG_SOM_LEFTMOST): for an
 * end offset e that an engine reported for a rule, the smallest s such that
 * buf[s..e) matches the rule. docs/engine.md ("Start of match") gives the
 * design; in short, the engines keep finding ends only, and starts are
 * computed afterwards on the host, per (buffer, rule), from the rule's own
 * Thompson NFA (its leading `.*` kept): backward from each end over the
 * reversed NFA until no state is live, or, when those walks reach too far
 * back, by one forward leftmost-start walk over the window that reaches the
 * rule's longest match back from each end.
 *
 * The NFA is rebuilt from the rule's canonical source in the catalog, so a
 * catalog needs no extra section and any rule can be asked for starts.
 */
#ifndef VKS_RULES_SOM_H
#define VKS_RULES_SOM_H

#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "error.h"

/* No start: the rule has no match ending at that offset (not a reported
 * end), or starts were not asked for. */
#define SOM_NONE UINT64_MAX

/* One rule's start finder: immutable once built, so threads may share it. */
struct som_rule;

/*
 * Builds the start finder of catalog rule `rule` (< catalog_rule_count) from
 * its canonical source. Returns 0, -ENOMEM, or -EINVAL when the source does
 * not parse (a catalog from another compiler version), with `err` filled.
 */
int som_rule_create(const struct catalog *cat, uint32_t rule, struct som_rule **out,
                    struct vks_error *err);

/* Frees it; NULL is allowed. */
void som_rule_destroy(struct som_rule *sr);

/* The rule's longest match with its leading unbounded part kept (the
 * backward reach of a start search), or CATALOG_UNBOUNDED. */
uint32_t som_rule_reach(const struct som_rule *sr);

/*
 * Fills starts[i] with the leftmost start of a match of the rule that ends
 * at ends[i] in buf[0..len) (SOM_NONE when none does). `ends` must be sorted
 * ascending (duplicates allowed) and each <= len. No walk goes back further
 * than the rule's reach before an end (for unbounded rules: the buffer's
 * start); the backward walks together take at most an eighth of the
 * window's bytes (plus 64 Ki) before the rest go forward. Returns 0 or
 * -ENOMEM.
 * Thread-safe: the scratch is the call's own.
 */
int som_rule_starts(const struct som_rule *sr, const uint8_t *buf, size_t len, const uint64_t *ends,
                    size_t n, uint64_t *starts);

/* The start finders of one catalog, built on first use and kept: shared by
 * every thread that scans with the catalog. */
struct som_set;

/* Returns NULL when out of memory. `cat` is borrowed for the set's life. */
struct som_set *som_set_create(const struct catalog *cat);
void som_set_destroy(struct som_set *s);

/* Whether some rule of the catalog has RULE_F_SOMLEFT. */
int som_catalog_wants(const struct catalog *cat);

/*
 * The finder of rule `rule`, built on the first call (under the set's lock)
 * and borrowed until som_set_destroy. Returns 0, or what som_rule_create
 * returned, with `err` filled. Thread-safe.
 */
int som_set_get(struct som_set *s, uint32_t rule, const struct som_rule **out,
                struct vks_error *err);

/* One hit whose start is wanted: `start` is the output. */
struct som_hit {
    uint32_t rule;
    uint64_t end;
    uint64_t start;
};

/*
 * Fills the start of every hit of one buffer whose rule has RULE_F_SOMLEFT,
 * or of every hit when `all`; the others get SOM_NONE. Any order of hits.
 * Returns 0, -ENOMEM or -EINVAL (with `err` filled).
 */
int som_fill(struct som_set *s, const uint8_t *buf, size_t len, struct som_hit *hits, size_t n,
             int all, struct vks_error *err);

#endif
