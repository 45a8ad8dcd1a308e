/*
 * Literal factors of a rule (Hyperscan's "decomposition"): a small set of
 * short byte strings such that every match of the rule contains at least
 * one of them. A bit-NFA group whose rules all have factors and a bounded
 * longest match need only be walked in windows around the factors' ends
 * (docs/engine.md, "Gated bit-NFA groups"): the factors are found first by
 * one DFA group of literals, which is fast on every engine.
 *
 * A factor position is a byte set of at most FACTOR_MAX_WIDTH values: a
 * caseless letter is the set {a, A}, a small class such as [xX_] stays a
 * class. Extraction works on the lowered parse tree (parse.h), so it sees
 * exactly what the engines match.
 */
#ifndef VKS_RULES_FACTOR_H
#define VKS_RULES_FACTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "parse.h"

#define FACTOR_MIN_LEN   3u  /* shorter factors would fire everywhere */
#define FACTOR_WEAK_LEN  2u  /* factor_extract_weak: two exact bytes */
#define FACTOR_MAX_LEN   16u /* a longer required string is cut to its best window */
#define FACTOR_MAX_COUNT 16u /* alternatives per rule */
#define FACTOR_MAX_WIDTH 4u  /* byte values per position */

/* factor.pre when the part of a match before the factor has no bound */
#define FACTOR_PRE_UNBOUNDED UINT32_MAX

struct factor {
    uint32_t len; /* FACTOR_MIN_LEN .. FACTOR_MAX_LEN (weak: from FACTOR_WEAK_LEN) */
    /* The most bytes from a match's start to the end of this factor in it
     * (the factor included), or FACTOR_PRE_UNBOUNDED: a match holding the
     * factor that ends at e starts at or after e - pre. Forward
     * confirmation of unbounded rules starts there (docs/engine.md). */
    uint32_t pre;
    /* Every byte value a match may hold before this factor (from its start
     * to the factor's first byte): a match holding the factor that ends at
     * e starts inside the run of bytes of lead and of the factor's own sets
     * that ends at e. That bounds forward confirmation where pre does not
     * (`^\s*#\s*include`: the run of blanks and `#` before the factor). */
    struct byteset lead;
    struct byteset set[FACTOR_MAX_LEN];
};

struct factor_set {
    uint32_t n; /* 1 .. FACTOR_MAX_COUNT when found */
    struct factor f[FACTOR_MAX_COUNT];
};

/* Bytes of a factor set of n factors: the functions below read only f[0..n),
 * so a set may be kept in an allocation of this size (the compiler keeps one
 * per rule: 8 KiB each at FACTOR_MAX_COUNT, most rules have one or two). */
#define FACTOR_SET_SIZE(n) (offsetof(struct factor_set, f) + (size_t)(n) * sizeof(struct factor))

/*
 * Finds a factor set of the tree `root` (the one the engines run, after
 * parse_strip_prefix): every string the tree matches contains one of the
 * factors as a substring, at most `pre` bytes from its start to the
 * factor's end. Prefers sets whose shortest factor is longest.
 * Returns 0 and fills `out`, -ENOENT when the rule has no usable set
 * (something optional everywhere, or only short literals), or -ENOMEM.
 * `root` is borrowed. Thread-safe.
 */
int factor_extract(const struct node *root, struct factor_set *out);

/* factor_extract, also taking factors of two exact bytes where a rule has
 * no longer one (`\x2a\x94.{35}\xd1\x27`, a binary signature's anchors
 * around a jump). They fire too often in most data to gate a rule that a
 * DFA can hold; the compiler uses them for rules that would otherwise be
 * walked over every byte (docs/engine.md "Which engine a rule gets"). */
int factor_extract_weak(const struct node *root, struct factor_set *out);

/*
 * Writes factor `f` as text into buf[0..cap) (always NUL-terminated):
 * printable bytes as themselves, a caseless letter as the lowercase letter
 * with the whole factor marked "(?i)" when every letter is caseless, other
 * sets as [\xNN...]. Returns the length it wanted (snprintf style).
 */
size_t factor_format(const struct factor *f, char *buf, size_t cap);

/* Adds to `out` every byte value a match of a rule with factor set `fs`
 * may hold from its start to `skip` bytes before the end of the factor it
 * holds: each factor's lead and its positions' sets but the last `skip`
 * (at most factor_set_min_len). */
void factor_set_span_bytes(const struct factor_set *fs, uint32_t skip, struct byteset *out);

/* The length of the set's shortest factor (0 for an empty set). */
uint32_t factor_set_min_len(const struct factor_set *fs);

/* The chance that a byte of text is not in `span`, under
 * factor_set_text_bits' model: 1 / that is about the mean length of a run
 * of span bytes in text (0: every byte is in it). */
double factor_span_break_chance(const struct byteset *span);

/* The selectivity of a set: the weight in bits of its weakest factor (8 per
 * single byte, 7 per caseless letter or 2-value set, 6 per wider set). */
uint32_t factor_set_bits(const struct factor_set *fs);

/* How rare the set is in text, in bits: -log2 of the chance that one of
 * its factors ends at a given byte, under a model in which lowercase
 * letters, spaces and newlines are as frequent as in English prose or
 * code and every other byte has the chance of a random one (1/256). A
 * 6-byte `shpat_` is 34 bits, 4 lowercase letters 21, `(?i)key` 15. */
uint32_t factor_set_text_bits(const struct factor_set *fs);

/* The largest `pre` of the set's factors (FACTOR_PRE_UNBOUNDED if any is). */
uint32_t factor_set_pre(const struct factor_set *fs);

#endif
