/*
 * The group NFA: a Thompson automaton for several rules sharing one start
 * state. Leading byte sets of every rule go into a trie keyed by byte set,
 * so a group of literals is an Aho-Corasick trie and the DFA built from it
 * stays the size of the trie.
 *
 * Edges are either byte edges labelled with a byte set (deduplicated, by id)
 * or epsilon edges with a condition on the kind of the previous byte and of
 * the next byte (that is how ^ $ \b \B are represented). Each rule has one
 * final state.
 */
#ifndef VKS_RULES_NFA_H
#define VKS_RULES_NFA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "parse.h"

/* Previous-byte kinds (start states are indexed the same way). */
enum { P_BOS = 0, P_WORD = 1, P_NL = 2, P_OTHER = 3 };

/* Epsilon-edge conditions: bits 0-3 allowed previous kinds (P_*), bits 4-8
 * allowed next kinds (CAT_K_*). */
#define COND_PREV(p)  (1u << (p))
#define COND_NEXT(k)  (1u << (4 + (k)))
#define COND_ALWAYS   0x1ffu
#define COND_PREVMASK 0xfu

struct nfa_byte_edge {
    uint32_t set;
    uint32_t to;
};

struct nfa_eps_edge {
    uint32_t cond;
    uint32_t to;
};

struct nfa {
    uint32_t n_states;
    uint32_t start;
    uint32_t *byte_first; /* CSR: n_states + 1 */
    struct nfa_byte_edge *byte_edges;
    uint32_t *eps_first; /* CSR: n_states + 1 */
    struct nfa_eps_edge *eps_edges;
    int32_t *accept; /* group-local rule index, or -1 */
    struct byteset *sets;
    uint32_t n_sets;
    uint32_t n_rules;
    bool has_cond;
    /* Every rule is a string of single bytes, or every rule a string of
     * bytes in both cases (caseless literals): then the DFA of the group is
     * an Aho-Corasick automaton, minimal as built (dfa.h). */
    bool literal;
};

struct nfa_builder;

/* Creates a builder for one group; returns NULL when out of memory. */
struct nfa_builder *nfa_builder_create(void);
void nfa_builder_destroy(struct nfa_builder *b);

/*
 * Adds one rule's tree as group-local rule `rule` (0, 1, 2, ... in order).
 * The tree is borrowed. Returns 0 or -ENOMEM.
 */
int nfa_builder_add(struct nfa_builder *b, const struct node *root, uint32_t rule);

/* Number of states so far (for group budgeting). */
uint32_t nfa_builder_states(const struct nfa_builder *b);

/* Builds the NFA into `out` (nfa_finish frees it). Returns 0 or -ENOMEM. */
int nfa_builder_finish(struct nfa_builder *b, struct nfa *out);

void nfa_finish(struct nfa *nfa);

/*
 * Direct NFA simulation: the independent oracle for the DFA. Calls `fn` for
 * every (rule, end offset) match in buf[0..len), in order of end offset.
 * Returns 0, -ENOMEM, or what `fn` returned when non-zero.
 */
int nfa_simulate(const struct nfa *nfa, const uint8_t *buf, size_t len,
                 int (*fn)(void *ctx, uint32_t rule, uint64_t end), void *ctx);

/* Kind of the next byte at offset i of buf[0..len) (CAT_K_*), and of the
 * previous one (P_*). */
uint32_t nfa_next_kind(const uint8_t *buf, size_t len, size_t i);
uint32_t nfa_prev_kind(const uint8_t *buf, size_t i);

#endif
