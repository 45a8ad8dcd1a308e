/*
 * The CPU engine's literal matcher: many fixed strings (some or all of
 * their letters caseless) found in one pass, as Hyperscan's FDR does it.
 *
 * A shift-or filter over hashed 3-byte windows, with the strings split into
 * 4 buckets (one bit each in a nibble lane per window offset), marks the
 * positions where some bucket's prefixes may start; a hash table keyed on
 * the case-folded prefix then confirms candidates exactly, byte by byte.
 * Scalar C, word at a time: no CPU feature checks needed.
 *
 * Built once per catalog (rules/cpuplan.h caches it); read-only after
 * cpulit_create, so any number of threads may scan with one matcher.
 */
#ifndef VKS_RULES_CPULIT_H
#define VKS_RULES_CPULIT_H

#include <stddef.h>
#include <stdint.h>

/* One string: `len` bytes; where fold[i] is 0x20 (fold may be NULL: none),
 * bytes[i] is a lowercase ASCII letter that also matches its uppercase. */
struct cpulit_entry {
    const uint8_t *bytes;
    const uint8_t *fold;
    uint32_t len;   /* 1 .. CPULIT_MAX_LEN */
    uint32_t id;    /* reported with each occurrence */
    uint32_t flags; /* CPULIT_ONCE */
};

/* Entries with this flag that share an id report each (id, end) once:
 * where several of them match at one end, only the shortest (of equal
 * lengths, the first in the matcher's order) reports. Rules sharing an id
 * are one rule (docs/catalog.md). Costs a look at the shorter entries'
 * starts for each occurrence of such an entry; other entries are as
 * before, even with equal ids. */
#define CPULIT_ONCE 1u

#define CPULIT_MAX_LEN 65536u

struct cpulit;

/* Builds a matcher over entries v[0..n) (copied; n >= 1). Returns 0,
 * -EINVAL (a length out of range, a fold on a byte that is not a lowercase
 * letter) or -ENOMEM. */
int cpulit_create(const struct cpulit_entry *v, size_t n, struct cpulit **out);

void cpulit_destroy(struct cpulit *m);

/* The shortest entry's length. */
uint32_t cpulit_min_len(const struct cpulit *m);

/* 1 or 2: how many bytes the filter advances per trigram it looks at (2
 * for sets of at most 4096 strings whose filter prefix is 6 bytes or
 * more and whose shortest string has 4 bytes or more). Tests use it to
 * cover both. */
uint32_t cpulit_stride(const struct cpulit *m);

/* How many slots of the confirmation table are split by a longer prefix
 * (a key shared by more than 8 strings, all longer than it). Tests use
 * it. */
uint32_t cpulit_split_slots(const struct cpulit *m);

/*
 * Calls fn(ctx, id, end) for every occurrence of every entry in buf that
 * starts at or after `begin` and ends at `end` with lo < end <= hi
 * (hi <= len, the buffer's length), in increasing start order (equal
 * starts: in entry order), but for CPULIT_ONCE entries as said above. Reads up to two bytes before
 * `begin` and one past `hi`, never outside buf[0..len). `fn` returning non-zero stops the scan with
 * that value.
 */
typedef int (*cpulit_fn)(void *ctx, uint32_t id, uint64_t end);
int cpulit_scan(const struct cpulit *m, const uint8_t *buf, size_t len, size_t begin, uint64_t lo,
                uint64_t hi, cpulit_fn fn, void *ctx);

#endif
