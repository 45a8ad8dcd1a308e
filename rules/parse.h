/*
 * Pattern parser: literal, hex and regex sources -> an arena-allocated AST of
 * byte sets, concatenations, alternations, repeats and assertions.
 *
 * The AST is already "lowered": case-insensitivity, dot-all and the escape
 * classes are folded into 256-bit byte sets, capture groups are plain
 * grouping, lazy quantifiers are greedy ones (same end offsets), and
 * multi-line mode is resolved into the assertion kinds below.
 */
#ifndef VKS_RULES_PARSE_H
#define VKS_RULES_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rules.h"

enum node_type { N_SET, N_CAT, N_ALT, N_REPEAT, N_ASSERT };

/* Assertion kinds, each one a condition on the previous and next byte. */
enum assert_kind {
    A_BOS,      /* ^ (without m), \A: start of buffer */
    A_BOL,      /* ^ with m: start of buffer or after '\n' */
    A_EOD,      /* \z: end of buffer */
    A_DOLLAR,   /* $ (without m), \Z: end, or before a final '\n' */
    A_EOL,      /* $ with m: end or before any '\n' */
    A_WORDB,    /* \b */
    A_NOTWORDB, /* \B */
};

#define REPEAT_INF UINT32_MAX

/* Largest count in {m,n}: Hyperscan's limit too. A repeat stays one node
 * with its bounds, whatever the count; the compiler picks the engine. */
#define PARSE_MAX_REPEAT 32767u

struct byteset {
    uint64_t w[4];
};

struct node {
    enum node_type type;
    uint32_t pos; /* byte offset in the source, for messages */
    union {
        struct byteset set;
        struct {
            struct node **kids;
            uint32_t n;
        } list;
        struct {
            struct node *kid;
            uint32_t min, max;
        } rep;
        enum assert_kind as;
    } u;
};

struct arena;

/* A parsed rule. `root` lives in `arena`; parse_result_finish frees both. */
struct parse_result {
    struct arena *arena;
    struct node *root;
};

/*
 * Parses one rule. On a syntax error returns -EINVAL and fills `pos` (byte
 * offset of the problem) and `msg` (what is wrong and how to fix it); on
 * success returns 0. The result must be freed with parse_result_finish in
 * both cases. Semantic checks (empty matches, anchors, size) are made later,
 * on the tree, by parse_check.
 */
int parse_rule(const struct rule_src *r, struct parse_result *out, uint32_t *pos, char *msg,
               size_t msgsz);

void parse_result_finish(struct parse_result *res);

/*
 * Checks the rules every accepted pattern must meet, on a parsed tree:
 * it must not match the empty string, an end anchor must end the pattern,
 * and the expanded size must stay under `max_positions`. Returns 0 or
 * -EINVAL with `pos` and `msg` filled.
 */
int parse_check(const struct node *root, uint32_t max_positions, uint32_t *pos, char *msg,
                size_t msgsz);

/*
 * Drops leading elements that can match the empty string without any
 * assertion (`.*`, `x{0,50}`, `a?` ...): for an unanchored search they
 * change no end offset, and they would only inflate the DFA and maxlen.
 */
struct node *parse_strip_prefix(struct node *root);

/* Number of NFA positions the tree expands to (saturating); the estimate
 * of a rule's size used to fill groups. */
uint64_t parse_positions(const struct node *n);

/* Longest match in bytes, or REPEAT_INF when unbounded. */
uint32_t parse_maxlen(const struct node *n);

/* Byte-set helpers shared with the NFA builder and tests. */
static inline bool byteset_has(const struct byteset *s, unsigned c)
{
    return (s->w[c >> 6] >> (c & 63)) & 1u;
}

static inline void byteset_add(struct byteset *s, unsigned c)
{
    s->w[c >> 6] |= (uint64_t)1 << (c & 63);
}

#endif
