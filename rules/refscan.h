/*
 * The CPU reference scanner: walks every group of a packed catalog over one
 * buffer, exactly as the GPU megakernel must. It is the oracle the GPU engine
 * is tested against, and the daemon's fallback for tiny requests.
 *
 * Semantics (ARCHITECTURE.md): a rule matches at end offset e when some
 * substring ending at byte e-1 matches it; every (rule, e) is reported once.
 */
#ifndef VKS_RULES_REFSCAN_H
#define VKS_RULES_REFSCAN_H

#include <stddef.h>
#include <stdint.h>

#include "catalog.h"

enum scan_mode {
    SCAN_ALL = 0,   /* every (rule, end) pair */
    SCAN_FIRST = 1, /* the first (lowest end) match per rule */
    SCAN_COUNT = 2, /* one entry per matching rule: count and first end */
};

/* One hit. In SCAN_ALL and SCAN_FIRST `count` is 1; in SCAN_COUNT, `end` is
 * the rule's first end offset and `count` the number of its matches. Rules
 * flagged RULE_F_SINGLEMATCH contribute at most one match in every mode. */
struct scan_hit {
    uint32_t rule;
    uint32_t count;
    uint64_t end;
};

/* A growable hit list; zero-initialise, then scan_hits_finish. */
struct scan_hits {
    struct scan_hit *v;
    size_t n;
    size_t cap;
};

/*
 * Scans `buf[0..len)` against every group of `cat` (DFA and bit-NFA) and appends the hits to
 * `out`, sorted by (end, rule). Returns 0 or -ENOMEM. `cat` and `buf` are
 * borrowed. Thread-safe for concurrent calls on the same catalog.
 */
int refscan_buffer(const struct catalog *cat, const uint8_t *buf, size_t len, enum scan_mode mode,
                   struct scan_hits *out);

/*
 * Scans one group over buf[begin..end) of a buffer of `len` bytes and calls
 * `fn` for every match whose end offset e satisfies lo < e <= hi (raw, before
 * report modes). The scan starts at `begin` from the start state the byte at
 * begin-1 selects, which is how a segment of a bounded group is scanned: the
 * GPU kernel does the same walk. `fn` returning non-zero stops the scan.
 */
typedef int (*refscan_fn)(void *ctx, uint32_t rule, uint64_t end);
int refscan_group_range(const struct catalog *cat, uint32_t group, const uint8_t *buf, size_t len,
                        size_t begin, uint64_t lo, uint64_t hi, refscan_fn fn, void *ctx);

/*
 * The same for bit-NFA group `nfa` (< catalog_nfa_count): the scan starts
 * at `begin` with no position active, and the start edges see the byte at
 * begin-1 as the previous byte, as a DFA group's start state does.
 */
int refscan_nfa_range(const struct catalog *cat, uint32_t nfa, const uint8_t *buf, size_t len,
                      size_t begin, uint64_t lo, uint64_t hi, refscan_fn fn, void *ctx);

/* Appends one hit; returns 0 or -ENOMEM. */
int scan_hits_push(struct scan_hits *h, uint32_t rule, uint64_t end, uint32_t count);

/* Sorts by (end, rule) and applies `mode` and RULE_F_SINGLEMATCH to raw
 * one-per-match hits, in place. Any engine uses this to turn raw matches
 * into the reply a client sees. */
void scan_hits_finalize(struct scan_hits *h, const struct catalog *cat, enum scan_mode mode);

/* The same by two comparison sorts: what scan_hits_finalize does for short
 * lists, and the reference its radix path (long lists: one radix sort of
 * (end, rule) keys, per-rule tables) is tested against. */
void scan_hits_finalize_sorting(struct scan_hits *h, const struct catalog *cat,
                                enum scan_mode mode);

void scan_hits_finish(struct scan_hits *h);

#endif
