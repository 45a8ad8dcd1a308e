/*
 * The CPU engine's scanning step: one segment of one buffer against every
 * group of a catalog, with report modes and a hit limit applied while the
 * walk runs, so a hit bomb costs no memory past the limit. The daemon's CPU
 * pool (daemon/engine.c) runs segments on several threads and merges them;
 * the hits equal refscan_buffer's exactly (rules/refscan.h is the
 * definition). Which groups are walked where comes from the catalog's
 * plan (rules/cpuplan.h: literal groups matched by rules/cpulit.c, window
 * groups walked only after their factors, gated groups compiled again as
 * DFAs), built on a scratch's first segment of a catalog and cached.
 *
 * Segments: a buffer splits into (lo, hi] ranges of end offsets. A segment
 * walks from lo minus the catalog's longest match (cpuscan_lookback), from
 * the start state (DFA groups) or start edges (bit-NFA groups) the byte
 * before selects, so matches straddling lo are found by the segment their
 * end falls in. A catalog with an unbounded group is walked one buffer per
 * piece. A catalog with groups refscan's range walks do not cover (a kind
 * added later) goes through refscan_buffer, one buffer per piece, with the
 * limit applied after the buffer instead of while it is walked.
 *
 * No threads here, no allocation per hit past the limit. A scratch is used
 * by one thread at a time.
 */
#ifndef VKS_RULES_CPUSCAN_H
#define VKS_RULES_CPUSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "refscan.h"

#define CPUSCAN_UNSEGMENTABLE UINT64_MAX

/*
 * How far before a segment's first end offset its walk must start: the
 * largest group maxlen. CPUSCAN_UNSEGMENTABLE when some group is unbounded
 * or the catalog holds groups only refscan_buffer scans: then every buffer
 * is one segment.
 */
uint64_t cpuscan_lookback(const struct catalog *cat);

/* The longest match of engine group g (DFA groups first, then bit-NFA
 * groups, as rules and the plan number them); CATALOG_UNBOUNDED. */
uint32_t cpuscan_group_maxlen(const struct catalog *cat, uint32_t g);

/*
 * Which of a catalog's groups a segment walks: all of them, or for a
 * catalog cpuscan_split_lookback splits, its bounded groups (in segments,
 * that function's lookback) or its unbounded ones (whole buffers). The two
 * parts of one buffer report disjoint rules, so their hits merge as any
 * two segments' do (cpuscan_merge). docs/engine.md "Unbounded catalogs on
 * the CPU engine".
 */
enum cpuscan_groups { CPUSCAN_ALL = 0, CPUSCAN_BOUNDED, CPUSCAN_UNBOUNDED };

/*
 * For a catalog cpuscan_lookback cannot segment: the lookback of its
 * bounded groups when a buffer may be scanned as CPUSCAN_UNBOUNDED over
 * the whole buffer plus CPUSCAN_BOUNDED segments, else
 * CPUSCAN_UNSEGMENTABLE (no bounded group that reports, a group only
 * refscan_buffer scans, or a rule id shared by a bounded and an unbounded
 * group, whose ends the two parts would count apart). Costs a pass over
 * the catalog's rules: ask for buffers worth splitting.
 */
uint64_t cpuscan_split_lookback(const struct catalog *cat);

/* Per-thread state: the last catalog's single-match flags and plan (a
 * reference), and a hash of the rules a segment touches. */
struct cpuscan_scratch;
int cpuscan_scratch_create(struct cpuscan_scratch **out);
void cpuscan_scratch_destroy(struct cpuscan_scratch *s);

/* What one segment found: entries (rule, count, end). In SCAN_ALL one per
 * kept match, sorted by (end, rule); in SCAN_FIRST / SCAN_COUNT one per
 * matching rule (first end; count). No hit list is built in those modes. */
struct cpuscan_part {
    struct scan_hits hits;
    uint64_t plain;   /* SCAN_ALL: kept hits of rules without RULE_F_SINGLEMATCH */
    uint64_t dropped; /* SCAN_ALL: matches found past `limit` and not kept */
    bool final;       /* entries are already final (refscan_buffer fallback) */
    /* cpuscan_unbounded_piece: per unbounded DFA group, the state guessed
     * at the piece's start and the one at its end */
    uint32_t *states;
    uint32_t n_states;
};

/*
 * SCAN_ALL with a limit: asked after every CPUSCAN_CHECK_EVERY kept matches
 * with `kept`, how many matches of rules without single-match this segment
 * will keep at least. Returning true says earlier segments already hold the
 * limit, so none of this segment's matches can be reported: from then on it
 * keeps one (the caller's truncation marker) and counts the rest as
 * dropped. This bounds memory when many segments of a hit-dense buffer run
 * at once.
 */
#define CPUSCAN_CHECK_EVERY 4096u
typedef bool (*cpuscan_enough_fn)(void *ctx, uint64_t kept);

/*
 * Scans the end offsets (lo, hi] of buf[0..len) (lo = 0, hi = len: the
 * whole buffer). In SCAN_ALL at most `limit` matches of rules without
 * RULE_F_SINGLEMATCH are kept, the ones with the smallest (end, rule) (0: no
 * limit), and each single-match rule's first; the others are counted in
 * `dropped`. `enough` (NULL: never asked) may lower the limit to 1. Appends to `part`. Returns 0 or
 * -ENOMEM (-EINVAL: a segment of an unsegmentable catalog). A segment (lo > 0 or hi < len) needs
 * cpuscan_lookback != UNSEGMENTABLE.
 */
/* cpuscan_segment over the groups `groups` selects: CPUSCAN_ALL is
 * cpuscan_segment; CPUSCAN_BOUNDED takes segments under
 * cpuscan_split_lookback, CPUSCAN_UNBOUNDED only whole buffers. */
int cpuscan_segment_groups(const struct catalog *cat, enum cpuscan_groups groups,
                           const uint8_t *buf, size_t len, uint64_t lo, uint64_t hi,
                           enum scan_mode mode, uint64_t limit, cpuscan_enough_fn enough, void *ctx,
                           struct cpuscan_scratch *s, struct cpuscan_part *part);

int cpuscan_segment(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                    uint64_t hi, enum scan_mode mode, uint64_t limit, cpuscan_enough_fn enough,
                    void *ctx, struct cpuscan_scratch *s, struct cpuscan_part *part);

/*
 * Merges the parts of one buffer (in segment order) into final hits, as
 * refscan_buffer gives them: sorted by (end, rule), report mode and
 * RULE_F_SINGLEMATCH applied. Only the first `budget` are appended to
 * `out`; past it, one more (the first) is appended when `marker` is set, so
 * the caller can tell the buffer had more. `*dropped` grows by the entries
 * not appended (and by the parts' own dropped counts). Returns 0 or -ENOMEM.
 */
int cpuscan_merge(const struct catalog *cat, enum scan_mode mode, struct cpuscan_part *parts,
                  size_t n, uint64_t budget, bool marker, struct scan_hits *out, uint64_t *dropped);

void cpuscan_part_finish(struct cpuscan_part *p);

/*
 * A split buffer's unbounded groups in pieces (docs/engine.md "Unbounded
 * catalogs on the CPU engine"), so that they too run on several threads:
 * cpuscan_unbounded_piece walks them for the piece of end offsets (lo, hi]
 * (pieces are contiguous from 0 to len), and cpuscan_unbounded_join makes
 * of the pieces what cpuscan_segment_groups(CPUSCAN_UNBOUNDED) over the
 * whole buffer gives, in `mode` with `limit`.
 *
 * - A DFA group's piece walks from a guess of its state at lo: the state
 *   `lookback` bytes before lo lead to from a start state. The join walks
 *   the true state (the previous piece's end) beside the guessed one until
 *   they agree, which most data brings about within a few bytes.
 * - A forward-confirmed group's piece starts only where its own factor
 *   ends allow and walks on past hi until its state is empty; the join
 *   keeps each (rule, end) once.
 * - An unbounded bit-NFA group without factors is walked whole by the
 *   first piece.
 * A piece's part holds raw SCAN_ALL ends, at most `max_raw` (0:
 * refscan_raw_max; vkscand gives each of k pieces a k-th of it, so that a
 * buffer's pieces hold no more than its whole walk may): past it a piece
 * returns -E2BIG. Pass the pieces' first error as piece_rc:
 * -E2BIG or -ENOTSUP (a walk pieces do not know) make the join walk the
 * buffer whole, as before. The pieces' parts stay the caller's.
 */
int cpuscan_unbounded_piece(const struct catalog *cat, const uint8_t *buf, size_t len, uint64_t lo,
                            uint64_t hi, uint64_t lookback, size_t max_raw,
                            struct cpuscan_scratch *s, struct cpuscan_part *part);
int cpuscan_unbounded_join(const struct catalog *cat, const uint8_t *buf, size_t len,
                           struct cpuscan_part *pieces, const uint64_t *lo, uint32_t k,
                           int piece_rc, enum scan_mode mode, uint64_t limit,
                           struct cpuscan_scratch *s, struct cpuscan_part *out);

/* Bytes before a piece that its guessed DFA states walk. */
#define CPUSCAN_PIECE_LOOKBACK 1024u

/* For the whole process: pieces walked, guesses repaired (of pieces and of
 * the lanes a DFA group's piece is walked in), joins that walked the buffer
 * whole instead, and DFA pieces walked as four interleaved lanes. */
struct cpuscan_counters {
    uint64_t pieces, fixes, whole, lanes;
};
void cpuscan_counters(struct cpuscan_counters *c);

#endif
