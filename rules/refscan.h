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

#include <stdbool.h>
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
    size_t max; /* scan_hits_push past this many: -E2BIG (0: no bound) */
};

/*
 * The most raw matches one whole-buffer walk may collect before it fails
 * with -E2BIG (refscan_buffer_bounded, the GPU host's finished
 * confirmations): catalogs that only refscan walks (unbounded rules) keep
 * every raw match of a buffer until it is finalized, so without a bound a
 * hit-dense buffer costs 16-32 bytes of memory per byte scanned. 0 (the
 * default): no bound. vkscand sets it from max-hits. Any thread.
 */
void refscan_set_raw_limit(uint64_t max);
uint64_t refscan_raw_limit(void);
/* The same as a scan_hits.max (at most SIZE_MAX). */
size_t refscan_raw_max(void);

/*
 * Scans `buf[0..len)` against every group of `cat` (DFA and bit-NFA) and appends the hits to
 * `out`, sorted by (end, rule). Returns 0 or -ENOMEM. `cat` and `buf` are
 * borrowed. Thread-safe for concurrent calls on the same catalog.
 */
int refscan_buffer(const struct catalog *cat, const uint8_t *buf, size_t len, enum scan_mode mode,
                   struct scan_hits *out);

/* refscan_buffer, but -E2BIG (nothing appended) once the buffer has more
 * than refscan_raw_limit() raw matches. */
int refscan_buffer_bounded(const struct catalog *cat, const uint8_t *buf, size_t len,
                           enum scan_mode mode, struct scan_hits *out);

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
 * Repairs a speculative segment (lo, hi] of DFA group `group` (gpu/batch.c:
 * a long buffer's unbounded group is walked in segments, each from a guess
 * of its state at lo). `state` is the true state at lo (where the segment
 * before ended), `guess` the state the segment's walk had there. Walks both
 * from lo in step until they agree; from there the guessed walk was exact.
 * Calls `fn` for the true walk's matches with ends in (lo, *upto), where
 * *upto is the first offset at which the two agree, or hi + 1 when they
 * never do; then *out is the true state at hi (else UINT32_MAX: the
 * guessed walk's state at hi stands). The guessed walk's matches in (lo,
 * *upto) are the ones to drop: `gfn` (NULL: not wanted) gets them, as
 * `fn` gets the true walk's. `fn` or `gfn` returning non-zero stops the
 * walk.
 */
int refscan_group_resume(const struct catalog *cat, uint32_t group, const uint8_t *buf, size_t len,
                         uint64_t lo, uint64_t hi, uint32_t state, uint32_t guess, refscan_fn fn,
                         void *ctx, refscan_fn gfn, void *gctx, uint64_t *upto, uint32_t *out);

/*
 * The same for bit-NFA group `nfa` (< catalog_nfa_count): the scan starts
 * at `begin` with no position active, and the start edges see the byte at
 * begin-1 as the previous byte, as a DFA group's start state does.
 */
int refscan_nfa_range(const struct catalog *cat, uint32_t nfa, const uint8_t *buf, size_t len,
                      size_t begin, uint64_t lo, uint64_t hi, refscan_fn fn, void *ctx);

/*
 * refscan_group_resume for bit-NFA group `nfa` (speculative segments of
 * ungated unbounded bit-NFA groups): `state` and `guess` are state vectors
 * of the group's n_words words. When the walks never agree, *agreed is
 * false and `state` is overwritten with the true state at hi. Returns 0,
 * -ENOMEM or what `fn` returned.
 */
int refscan_nfa_resume(const struct catalog *cat, uint32_t nfa, const uint8_t *buf, size_t len,
                       uint64_t lo, uint64_t hi, uint32_t *state, const uint32_t *guess,
                       refscan_fn fn, void *ctx, refscan_fn gfn, void *gctx, uint64_t *upto,
                       bool *agreed);

/*
 * Gated bit-NFA groups (CAT_GF_GATED, docs/engine.md): a match of such a
 * group ends within its MAXLEN after the end of one of its factors, which
 * the catalog's CAT_GF_FACTOR groups find. Candidates are (nfa, factor end)
 * pairs, sorted and unique. Zero-initialise; refscan_gate_finish frees.
 */
struct refscan_cand {
    uint32_t nfa;
    uint64_t end;
};
struct refscan_gate {
    struct refscan_cand *v;
    size_t n, cap;
};

/* Walks the factor groups and appends the candidates that can matter for
 * match ends in (lo, hi] (factor ends in (lo - MAXLEN, hi]), then sorts
 * them. Returns 0 or -ENOMEM. */
int refscan_factor_ends(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                        uint64_t hi, struct refscan_gate *out);

/* As refscan_factor_ends, walking only the factor groups k with walk[k]
 * set (walk: one flag per DFA group; NULL: all). The CPU plan skips the
 * factor groups whose gated groups it finds otherwise. */
int refscan_factor_ends_of(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                           uint64_t hi, const uint8_t *walk, struct refscan_gate *out);

/* The gated groups' longest match (CATALOG_UNBOUNDED with a confirmed
 * one): how far before lo the factor ends that matter may lie. */
uint64_t refscan_gated_lookback(const struct catalog *cat);

/* As refscan_factor_ends_of, given lb, refscan_gated_lookback (that call
 * finds it first). */
int refscan_factor_ends_lb(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                           uint64_t hi, const uint8_t *walk, uint64_t lb, struct refscan_gate *out);

/* Appends the candidates whose factor ends lie in (lo, hi] exactly,
 * unsorted: pieces of one buffer can be walked on several threads and their
 * candidates joined, then sorted (gpu/plan.c). Returns 0 or -ENOMEM.
 * Thread-safe for concurrent calls with different `out`. */
int refscan_factor_scan(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                        uint64_t hi, struct refscan_gate *out);

/* Appends one candidate (unsorted; refscan_gate_sort before use). */
int refscan_gate_push(struct refscan_gate *g, uint32_t nfa, uint64_t end);
void refscan_gate_sort(struct refscan_gate *g);

/*
 * Reports the matches of gated bit-NFA group `nfa` that end in (lo, hi]:
 * windows of ends [e, e + MAXLEN] around its candidates, merged when they
 * overlap or touch, each walked by refscan_nfa_range from MAXLEN before it.
 * A CAT_GF_CONFIRM group (unbounded) is instead walked once forward, with
 * starts allowed only in [e - LOOKBACK, e) of some candidate e, jumping
 * over the stretches where its state is empty and no start is allowed;
 * its candidates must then hold every factor end up to hi.
 * Gives exactly what refscan_nfa_range over (lo, hi] gives, each (rule, end)
 * once, in increasing end order per rule.
 */
int refscan_gated_range(const struct catalog *cat, uint32_t nfa, const uint8_t *buf, size_t len,
                        uint64_t lo, uint64_t hi, const struct refscan_gate *cands, refscan_fn fn,
                        void *ctx);

/* Calls `fn(ctx, lo', hi')` for every merged window of end offsets (lo', hi']
 * of one gated group of maxlen `maxlen` inside (lo, hi] of a buffer of `len`
 * bytes, given its sorted factor ends ends[0..n). The GPU host builds its
 * window items with it. `fn` returning non-zero stops the calls. */
typedef int (*refscan_window_fn)(void *ctx, uint64_t lo, uint64_t hi);
int refscan_gate_windows(uint32_t maxlen, const uint64_t *ends, size_t n, size_t stride, size_t len,
                         uint64_t lo, uint64_t hi, refscan_window_fn fn, void *ctx);

/*
 * Where a forward confirmation's starts may begin for a factor end e: at
 * e - lookback (0 when lookback is CATALOG_UNBOUNDED) and, with a group's
 * span set (catalog_nfa.span) and its buffer, no earlier than the run of
 * span bytes that ends at e (docs/engine.md, "Forward confirmation").
 * checked and rs carry that run from one end to the next: set both to 0
 * before the first end, and give the ends ascending.
 */
struct refscan_starts {
    uint32_t lookback;
    const uint32_t *span; /* NULL: lookback alone */
    const uint8_t *buf;   /* NULL: lookback alone */
    /* hi 0: buf is the whole buffer. Else buf holds only the buffer's
     * bytes [lo, hi) (buf[0] is byte lo), as when the GPU host reads a
     * buffer read at upload a window at a time: an end past hi gets
     * lookback alone, and a run of span bytes that reaches lo is taken to
     * go on as far as the carried run allows (never a later start than
     * the true one). */
    uint64_t lo, hi;
    /* set by each refscan_start_from with a window: its run reached lo,
     * so the start it gave is the carried run's (or lookback's), not
     * known; a caller that reads more bytes before lo may ask again with
     * the fields as they were before the call */
    bool cut;
    /* refscan_confirm_starts and _items only: per end (ends[i], index i
     * whatever the stride), its refscan_start_from found ahead with floor
     * 0, here clamped to floor; NULL: found there */
    const uint64_t *runs;
    /* no start before this (at most e): the starts below it are another
     * caller's, as when the GPU host plans a buffer in parts whose
     * earlier parts cover every start below their last factor end */
    uint64_t floor;
    uint64_t checked, rs;
};
uint64_t refscan_start_from(struct refscan_starts *b, uint64_t e);

/*
 * Forward confirmation (CAT_GF_CONFIRM groups, docs/engine.md): a factor
 * ending at e allows match starts in [refscan_start_from(e), e). Calls `fn(ctx, a, b)` for every
 * merged interval [a, b) of allowed starts, given the ascending factor ends ends[0..n) (every
 * `stride` u64). A walker starts at a with an empty state, fires start edges only below b and goes
 * on until its state is empty. The GPU host builds its confirmation items with it. `fn` returning
 * non-zero stops the calls.
 */
int refscan_confirm_starts(const struct refscan_starts *st, const uint64_t *ends, size_t n,
                           size_t stride, refscan_window_fn fn, void *ctx);

/*
 * The confirmation items of one CAT_GF_CONFIRM group (gpu/plan.c): the
 * intervals of refscan_confirm_starts, joined when fewer than `gap` bytes
 * apart, then cut into pieces of at most `piece` starts. A piece [a, b)
 * is walked like an interval (starts fire only below b, the walk goes on
 * until its state is empty), so every match is still found, by the piece
 * that holds its start; a match may also be found again by an earlier
 * piece whose walk runs past b (the caller drops copies). When that gives
 * more than `max_items` pieces, gap and piece are doubled until it does
 * not: a rule whose walks never die (`key(?s).*x`) costs at most
 * max_items walks to the buffer's end. Calls `fn(ctx, a, b)` per piece in
 * ascending order; `fn` returning non-zero stops the calls and is
 * returned. The starts are found once (each end's run read once, even
 * when the pieces are cut again); -ENOMEM when they cannot be kept.
 */
int refscan_confirm_items(const struct refscan_starts *st, const uint64_t *ends, size_t n,
                          size_t stride, uint64_t gap, uint64_t piece, size_t max_items,
                          refscan_window_fn fn, void *ctx);

/*
 * One forward-confirmation walk of CAT_GF_CONFIRM group `nfa` over the
 * whole buffer, with starts allowed only in the intervals [iv[2k],
 * iv[2k + 1]), k < n, ascending by start: the GPU host finishes with it
 * the confirmation items that reached their walk's cap alive (gpu/batch.c).
 * Calls `fn` for every match found, each (rule, end) once. Returns 0,
 * -ENOMEM or what `fn` returned.
 */
int refscan_confirm_range(const struct catalog *cat, uint32_t nfa, const uint8_t *buf, size_t len,
                          const uint64_t *iv, size_t n, refscan_fn fn, void *ctx);

void refscan_gate_finish(struct refscan_gate *g);

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

/* Sorts v[0..n) by (end, rule), or by (rule, end) when `by_rule`: an LSD
 * radix sort of the hits themselves (digits in which every hit agrees are
 * skipped) from SORT_HITS_RADIX_MIN hits, qsort below that or when its
 * buffer cannot be had. Hits with equal keys keep no particular order. */
void scan_hits_sort(struct scan_hit *v, size_t n, bool by_rule);

/* Sorts k[0..n) ascending (LSD radix on 11-bit digits, skipping digits in
 * which every key agrees; insertion sort for short lists); tmp holds n
 * keys. No allocation. */
void scan_sort_u64(uint64_t *k, uint64_t *tmp, size_t n);

/*
 * Report modes over deduplicated hits in (end, rule) order, one buffer after
 * another: what scan_hits_finalize applies after its sort, for callers that
 * sort themselves (the GPU host's parallel finish, gpu/hits.c). Per rule it
 * keeps whether the rule was seen in the current buffer (a generation stamp,
 * so a new buffer costs nothing) and where its first entry went.
 */
struct scan_reporter {
    const struct catalog *cat;
    uint32_t n_rules;
    uint32_t gen;    /* the current buffer's stamp, from 1 */
    uint32_t *stamp; /* gen of the buffer the rule was last seen in */
    uint64_t *first; /* output index of the rule's first entry there */
    uint8_t *single; /* RULE_F_SINGLEMATCH: 0 not looked up, 1 no, 2 yes */
};

enum scan_take {
    SCAN_TAKE_NEW,   /* append the hit as a new entry (count 1) */
    SCAN_TAKE_COUNT, /* add one to entry *first (count mode) */
    SCAN_TAKE_DROP,  /* leave it out (single-match, first mode) */
};

/* Returns 0 or -ENOMEM; then scan_reporter_buffer before each buffer. */
int scan_reporter_init(struct scan_reporter *r, const struct catalog *cat);
void scan_reporter_buffer(struct scan_reporter *r);
/* What becomes of the next hit of `rule` (rule < n_rules) in `mode`; `k` is
 * the index the entry gets if it is new, *first the one to count into. */
enum scan_take scan_reporter_take(struct scan_reporter *r, enum scan_mode mode, uint32_t rule,
                                  uint64_t k, uint64_t *first);
void scan_reporter_finish(struct scan_reporter *r);

#endif
