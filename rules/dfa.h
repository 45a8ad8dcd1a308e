/*
 * Subset construction over byte classes, and Moore minimisation.
 *
 * A DFA state is a set of NFA states plus the kind of the previous byte
 * (only where some assertion can still look at it). Acceptance is decided
 * before the next byte is consumed, knowing its kind: every accept entry
 * carries a mask of CAT_K_* lookahead kinds for which it holds.
 */
#ifndef VKS_RULES_DFA_H
#define VKS_RULES_DFA_H

#include <stdbool.h>
#include <stdint.h>

#include "nfa.h"

struct dfa {
    uint32_t n_states;
    uint32_t n_classes;
    uint32_t first_accept; /* states >= first_accept accept something */
    uint32_t start[4];     /* by P_* */
    uint32_t classmap[256];
    uint32_t *trans;     /* n_states * n_classes */
    uint32_t *acc_first; /* n_states + 1, into acc */
    uint32_t *acc;       /* entries: group-local rule << 5 | CAT_K_* mask */
    uint32_t n_acc;
    /* Minimal as built, so dfa_minimise leaves it alone: the group is
     * literals only (nfa.literal). Its DFA is then the Aho-Corasick
     * automaton, whose states are the distinct longest trie-node suffixes of
     * the input; two of them always differ on some continuation (the rest
     * of a rule through the longer one), so none can merge. test_dfa checks
     * it against Moore's refinement on random literal sets. */
    bool minimal;
};

/*
 * Builds the DFA of `nfa`. Fails with -E2BIG when it would have more than
 * `max_states` states (the caller splits the group or rejects the rule),
 * or -ENOMEM. States are numbered accepting-last.
 */
int dfa_build(const struct nfa *nfa, uint32_t max_states, struct dfa *out);

/* This thread's cancel flag for dfa_build (rules_options.cancel, set by the
 * compiler around each build): non-zero stops the subset construction with
 * -ECANCELED every 256 states. NULL: never. */
extern _Thread_local const volatile int *dfa_cancel;

/* Rounds of Moore's refinement before dfa_minimise turns to Hopcroft's
 * algorithm for the rest (64; tests set 0 to run Hopcroft's alone). */
extern uint32_t dfa_moore_rounds;

/* Minimises in place (Moore's partition refinement, then Hopcroft's
 * algorithm past dfa_moore_rounds rounds); keeps accepting-last
 * numbering. Does nothing to a DFA marked minimal. Returns 0, -ENOMEM, or
 * -ECANCELED when this thread's dfa_cancel flag is set (checked every
 * refinement round); on failure the DFA is unchanged. */
int dfa_minimise(struct dfa *d);

/* Makes `d` a DFA of one state that accepts nothing (a literal group's: no
 * walk of its own). Returns 0 or -ENOMEM. dfa_finish frees it. */
int dfa_init_empty(struct dfa *d);

/* Frees the tables of `d` (its trans and acc_first are dfa.c's own
 * allocations, not malloc's); accepts NULL and a zeroed DFA. */
void dfa_finish(struct dfa *d);

/* Runs the DFA over buf[0..len) exactly as the catalog scanner does; for tests. */
int dfa_scan(const struct dfa *d, const uint8_t *buf, size_t len,
             int (*fn)(void *ctx, uint32_t rule, uint64_t end), void *ctx);

#endif
