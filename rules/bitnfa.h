/*
 * The bit-parallel position automaton ("bit-NFA"): the engine for rules
 * whose DFA would blow up (bounded gaps and counted repeats such as
 * `.{0,200}` or `[a-z0-9]{32}`). docs/engine.md describes the model.
 *
 * Positions are the NFA states entered by a byte edge, numbered in pattern
 * order, so that most follow edges go from position i to i + 1 and are a
 * shift of the state vector. Every other edge is an exception: a set of
 * source positions, a set of target positions and a condition on the kinds
 * of the previous and the next byte (how ^ $ \b \B are carried). A counted
 * repeat x{m,n} expands into n copies of x whose edges are shifts, plus one
 * exception from the copies m..n to what follows, so it costs bits, not
 * states. An exception with no source fires at every offset: those are the
 * start edges (unanchored rules restart everywhere).
 *
 * Conditions are 20-bit masks over (previous kind P_*, next kind CAT_K_*)
 * pairs: bit p * 5 + k (BITNFA_PK). The scanner computes the one pair of the
 * current offset and tests it against each entry.
 */
#ifndef VKS_RULES_BITNFA_H
#define VKS_RULES_BITNFA_H

#include <stdbool.h>
#include <stdint.h>

#include "catalog.h"
#include "parse.h"

/* The most positions one bit-NFA group holds (2048 u32 words of state). A
 * rule that alone needs more is rejected with this limit in the message. */
#define BITNFA_MAX_BITS CAT_NFA_MAX_BITS
/* Rules are packed together into groups of up to this many positions (128
 * words: one pass over the data costs a few word operations per byte); a
 * larger rule gets a group of its own. */
#define BITNFA_GROUP_BITS 4096u
/* The same for gated groups (rules/compile.c): they walk only windows
 * around their factors' ends, so they cost no pass of their own, but each
 * window walks every rule of its group, the rules whose factor is not
 * there included. */
#define BITNFA_GATED_BITS 128u
/* The most follow edges one build may collect. Ordinary rules have about
 * one per position; nullable items inside a large repeat ((a?){20000})
 * have one per pair of positions, which would take minutes and gigabytes. */
#define BITNFA_MAX_EDGES (1u << 21)

#define BITNFA_PK(p, k) CAT_PK(p, k)
#define BITNFA_COND_ALL CAT_COND_ALL

/* One group, in memory, before packing. Ranges are inclusive [lo, hi] pairs
 * of positions; an exception's source ranges come first, then its targets. */
struct bitnfa_group {
    uint32_t n_bits, n_words, n_classes, n_rules;
    bool asserts; /* some entry has a condition: start context matters */
    uint32_t classmap[256];
    uint32_t *reach; /* n_classes * n_words: positions each class may enter */
    uint32_t *shift; /* n_words: positions entered by an unconditional i-1 -> i edge */
    uint32_t *exc;   /* n_exc * 4: cond, n_src, n_tgt, first range */
    uint32_t n_exc;
    uint32_t *acc; /* n_acc * 4: group-local rule, cond, n_src, first range */
    uint32_t n_acc;
    uint32_t *ranges; /* n_ranges * 2 */
    uint32_t n_ranges;
};

/*
 * Builds the bit-NFA of rules roots[0..n) (group-local rule k = roots[k];
 * the trees are borrowed). Returns 0, -E2BIG when the group needs more than
 * `max_bits` positions (*bits_out then holds how many), -EFBIG when it has
 * more than BITNFA_MAX_EDGES follow edges, or -ENOMEM.
 * Milliseconds for thousands of positions: there is no subset construction.
 */
int bitnfa_build(const struct node *const *roots, uint32_t n, uint32_t max_bits,
                 struct bitnfa_group *out, uint32_t *bits_out);

void bitnfa_group_finish(struct bitnfa_group *g);

#endif
