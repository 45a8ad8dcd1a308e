/*
 * Two-byte strings for the CPU engine: the factors the literal matcher
 * (cpulit.h) cannot filter, since its filter looks at 3-byte windows.
 *
 * Binary signatures often have nothing longer in common than two exact
 * bytes around a gap (`{82 b7 [71] 0e ee}`, `\x7f\x1a.{24}\x39\xbe`). A
 * bitmap of the 65,536 byte pairs marks the pairs of the set; a marked
 * pair in the buffer is looked up in the sorted entries and reported.
 * rules/cpuplan.c uses it for such factors when the pair is rare in text
 * (cpupair_rare), so that their groups are walked in windows around the
 * pairs' ends instead of over every byte.
 *
 * Read-only after cpupair_create: any number of threads may scan with one.
 */
#ifndef VKS_RULES_CPUPAIR_H
#define VKS_RULES_CPUPAIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpulit.h" /* struct cpulit_entry, cpulit_fn */

struct cpupair;

/* Builds a matcher over entries v[0..n) (n >= 1), each of length 2 (its
 * fold masks as in cpulit_entry; flags are ignored: every occurrence is
 * reported). Returns 0, -EINVAL (a length other than 2, a fold on a byte
 * that is not a lowercase letter) or -ENOMEM. */
int cpupair_create(const struct cpulit_entry *v, size_t n, struct cpupair **out);

void cpupair_destroy(struct cpupair *m);

/* Whether the exact pair b0 b1 is rare enough in text and in binaries to
 * gate on: at least one byte that text seldom has (a control byte other
 * than tab, newline and carriage return, or one of 0x7f..0xff), and not
 * two equal bytes (the padding runs of binaries: 00 00, ff ff, 90 90). */
bool cpupair_rare(uint8_t b0, uint8_t b1);

/* Whether scans skip the starts that hold no byte text seldom has and no
 * pair of the at most 8 that lack one (tests). */
bool cpupair_fast(const struct cpupair *m);

/* As cpulit_scan: fn(ctx, id, end) for every occurrence of an entry that
 * starts at or after `begin` and ends at `end` with lo < end <= hi (hi <=
 * len), in increasing start order. Reads nothing outside buf[begin..hi). */
int cpupair_scan(const struct cpupair *m, const uint8_t *buf, size_t len, size_t begin, uint64_t lo,
                 uint64_t hi, cpulit_fn fn, void *ctx);

#endif
