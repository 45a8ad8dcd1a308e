/*
 * Stream scanning: one logical buffer that arrives in writes. A stream
 * carries, between writes, the automaton state of its groups (1 to 4 bytes
 * per DFA group, the state vector of each long bit-NFA group), the last
 * bytes that its short bounded groups and its groups of plain strings need
 * (their state is rebuilt from them, or their strings matched over them),
 * the kind of the byte before, and the single-match rules already
 * reported, so a match that straddles writes is found and no more than
 * those last bytes are kept. docs/engine.md ("Streams") gives the model.
 *
 * The union of the hits of every write plus the close equals
 * refscan_buffer(SCAN_ALL) over the concatenation, exactly. Ends are counted
 * from the stream's first byte. A match whose end needs the next byte to be
 * decided (`\b`, `\B`, `$`, a '\n' that may be the last byte) is reported by
 * the write that brings that byte, or by the close, as Hyperscan's stream
 * mode does; every other match is reported by the write that completes it.
 *
 * A stream is used by one thread at a time; several streams may share one
 * catalog on any threads.
 */
#ifndef VKS_RULES_STREAMSCAN_H
#define VKS_RULES_STREAMSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "refscan.h"

struct streamscan;

/*
 * Bytes a stream over `cat` holds (all of its state, scratch included): what
 * the daemon reports as the stream size and checks against its per-stream
 * limit, like hs_stream_size.
 */
size_t streamscan_size(const struct catalog *cat);

/*
 * Opens a stream at offset 0. `cat` is borrowed and must outlive the stream.
 * Returns 0 or -ENOMEM.
 */
int streamscan_create(const struct catalog *cat, struct streamscan **out);

/* Frees the stream; NULL is allowed. */
void streamscan_destroy(struct streamscan *s);

/*
 * Scans the next `len` bytes (borrowed for the call) and appends the matches
 * this write decides to `out`, sorted by (end, rule), each (rule, end) once
 * over the whole stream, single-match rules once per stream. An empty write
 * does nothing. Returns 0, -ENOMEM (the stream is then unusable: destroy
 * it) or -EPIPE after streamscan_close.
 */
int streamscan_write(struct streamscan *s, const uint8_t *buf, size_t len, struct scan_hits *out);

/*
 * Ends the stream: appends the matches only the end of data decides (`$`,
 * `\z`, `\b` at the end, a match that ends before a final '\n'). Returns 0,
 * -ENOMEM or -EPIPE when already closed.
 */
int streamscan_close(struct streamscan *s, struct scan_hits *out);

/* Bytes written so far. */
uint64_t streamscan_offset(const struct streamscan *s);

/* The catalog the stream was opened on. */
const struct catalog *streamscan_catalog(const struct streamscan *s);

/*
 * Large writes (docs/engine.md, "Streams": the fast path). A write into a
 * catalog whose groups are all bounded scans most of its bytes as block
 * mode does (rules/cpuscan.h); in a catalog whose bounded groups
 * cpuscan_split_lookback splits from its unbounded ones, the bounded
 * groups do, and the unbounded ones walk the whole write. The middle runs
 * in pieces of at least `piece` bytes (0: 1 MiB) on up to `threads`
 * threads (0 or 1: the writing thread alone); so do the walks over a whole
 * write of at least four pieces' bytes (DFA groups from guessed states,
 * forward-confirmed groups piece by piece) and their factor ends. The
 * other threads are a pool of the process, started at the first write
 * that needs them and kept idle afterwards; a writer runs queued pieces
 * itself while it waits, so a write finishes even when none could be
 * started. For the whole process; default 1. Thread-safe.
 */
void streamscan_set_threads(uint32_t threads, size_t piece);

/*
 * Tests and benchmarks: the fast path is taken by writes with more than
 * `min_middle` bytes past their head (SIZE_MAX: the default, 1024; 0: every
 * write long enough to have a middle). For the whole process.
 */
void streamscan_tune(size_t min_middle);

/* Tests: the bytes a guessed DFA state at a piece's or lane's start is
 * walked from (0: the default, 1024); shorter ones guess wrong more often,
 * and let small writes' pieces be walked as lanes (a lane is at least 4 of
 * them). For the whole process. */
void streamscan_tune_spec(size_t lookback);

/*
 * A fast-path write whose middle runs elsewhere (vkscand: in a GPU batch,
 * docs/engine.md "Streams"). streamscan_write_begin is streamscan_write,
 * except that when the write's middle has more than `min_middle` ends and
 * the catalog has no single-match rules, the middle is not scanned:
 * mid->pending is set, and the middle is a block scan of buf[0..len) whose
 * ends in (mid->lo, mid->hi] the caller hands to streamscan_middle_add, in
 * any order, with end offsets counted from buf[0] (block mode's, as
 * refscan_buffer or the GPU engine give them: buf[0] taken as the start of
 * the data is right for every end in that range). The write's other
 * matches wait in mid->raw; streamscan_write_end delivers them all to
 * `out`. The stream's state is already past the write when begin returns,
 * so the next write may begin before this one's end: a catalog that
 * leaves a middle has no single-match rules, and streamscan_middle_run and
 * streamscan_write_end read only the catalog (not the state), so they may
 * run on another thread while the next write begins. The caller delivers
 * the writes' matches in write order, and closes the stream only after the
 * last write's end.
 * streamscan_middle_run scans the middle on this thread instead (the
 * caller's fallback). streamscan_middle_finish frees what a middle holds
 * (after streamscan_write_end, or when the stream is dropped).
 */
struct streamscan_middle {
    bool pending;
    uint64_t lo, hi; /* the ends (lo, hi] of buf */
    uint64_t base;   /* stream offset of buf[0] */
    /* per rule, 1: its matches are not the middle's (an unbounded group's:
     * the write's walk found them); NULL: every rule's are */
    const uint8_t *drop;
    struct scan_hits raw;
};

int streamscan_write_begin(struct streamscan *s, const uint8_t *buf, size_t len, size_t min_middle,
                           struct scan_hits *out, struct streamscan_middle *mid);

/*
 * Before a write of `len` bytes whose last byte is `last`: whether
 * streamscan_write_begin(..., min_middle, ...) will leave its middle to the
 * caller, and then which bytes it reads: buf[0..*head) and
 * buf[len - *tail..len). The rest of buf may be left unread by the caller
 * (vkscand reads only those two ranges of a descriptor write and lets the
 * GPU engine read the middle itself). In a catalog with unbounded groups
 * the tail is the whole write (their walk reads every byte), and only
 * writes of at most STREAMSCAN_WHOLE_READ_MAX bytes are split.
 */
bool streamscan_split_plan(struct streamscan *s, size_t len, uint8_t last, size_t min_middle,
                           size_t *head, size_t *tail);
/*
 * The tail streamscan_split_plan would name for a write of `len` bytes,
 * known before the write's last byte is: 0 where no write of this stream
 * can be split now. A caller that reads the tail first learns the last
 * byte with it (vkscand: one read of a descriptor fewer per write).
 */
size_t streamscan_split_tail(struct streamscan *s, size_t len);
/*
 * A catalog with unbounded groups walks every byte of a write on the CPU,
 * so a split write of it is read whole (its tail is the write): only up to
 * this many bytes, which bounds what a write in flight holds. Larger
 * writes are not split (streamscan_split_tail 0); vkscand reads them in
 * chunks, each a write of its own.
 */
#define STREAMSCAN_WHOLE_READ_MAX (16u << 20)
/* Whether large writes of this stream take a fast path (a catalog of
 * bounded groups, or one whose bounded groups may be scanned apart): its
 * middles spread over threads, so a caller reads in larger chunks. */
bool streamscan_fast(struct streamscan *s);
/*
 * About the bytes streamscan_write_begin(..., min_middle, ...) will walk
 * for a write of `len` bytes: the head and the tail when its middle is
 * likely left to the caller, else `len`. An estimate from the catalog
 * alone (the state decides the split itself), for weighing queued writes.
 */
size_t streamscan_split_cost(const struct streamscan *s, size_t len, size_t min_middle);
int streamscan_middle_add(struct streamscan_middle *mid, uint32_t rule, uint64_t end);
int streamscan_middle_run(struct streamscan *s, const uint8_t *buf, size_t len,
                          struct streamscan_middle *mid);
int streamscan_write_end(struct streamscan *s, struct streamscan_middle *mid,
                         struct scan_hits *out);
void streamscan_middle_finish(struct streamscan_middle *mid);

/* What the fast path did in this process (tests assert it was taken):
 * writes that took it, pieces of middles scanned, writes whose middle ran
 * on more than one thread, writes whose head and tail walked gated bit-NFA
 * groups only around their factors, writes whose middle was left to the
 * caller (streamscan_write_begin). */
struct streamscan_counters {
    uint64_t fast_writes, pieces, parallel_writes, gated_writes, split_writes;
    uint64_t mixed_writes; /* fast-path writes of a catalog with unbounded groups */
    uint64_t walk_pieces;  /* pieces of walks over a whole write (DFA and confirmed groups) */
    uint64_t spec_fixes; /* pieces (or lanes) of a DFA group's walk whose guessed state was wrong */
    uint64_t walk_lanes; /* DFA pieces walked as four interleaved lanes */
    /* nanoseconds writes spent: walking every group over the whole write
     * (the slow path) or a catalog's unbounded groups (the fast path's
     * mixed writes); the fast path's head, middle (scanned here, not
     * handed over) and tail; sorting and delivering the matches; of
     * those, finding the factor ends of walks around factors */
    uint64_t whole_ns, head_ns, middle_ns, tail_ns, deliver_ns, factor_ns;
};
void streamscan_counters(struct streamscan_counters *c);

#endif
