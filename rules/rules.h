/*
 * The rule compiler's front door: rule sources in, a packed catalog (see
 * catalog.h) plus the list of rejected rules out.
 *
 * Pipeline: parse (parse.h) -> Thompson NFA per group (nfa.h) -> subset
 * construction over byte classes -> minimisation (dfa.h) -> packing. Rules are
 * grouped into combined DFAs under a state budget; a rule whose DFA alone
 * would not fit (bounded gaps, counted repeats) goes to a bit-parallel NFA
 * group instead (bitnfa.h, docs/engine.md). docs/rules.md is the user
 * documentation of the language; docs/catalog.md of the output.
 */
#ifndef VKS_RULES_RULES_H
#define VKS_RULES_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "error.h"

enum rule_kind {
    RULE_LITERAL = 0, /* bytes, with C-style escapes (\x41 \n \t \r \\ \" \0) */
    RULE_HEX = 1,     /* "4d 5a [2-4] (50 | 4?)": YARA hex strings (docs/rules.md) */
    RULE_REGEX = 2,   /* the regex subset of docs/rules.md */
};

/* One rule as the user wrote it. Borrowed by rules_compile. */
struct rule_src {
    const char *id; /* NUL-terminated, 1..RULES_MAX_ID bytes */
    enum rule_kind kind;
    const char *pattern; /* `len` bytes, need not be NUL-terminated */
    size_t len;
    uint32_t flags; /* RULE_F_* */
    uint32_t line;  /* line in the pattern file, 0 if none */
};

#define RULES_MAX_ID          255u
#define RULES_MAX_PATTERN     16384u
#define RULES_DEFAULT_STATES  65536u
#define RULES_DEFAULT_MAXRULE 1000000u
#define RULES_MAX_REPEAT      1000u
#define RULES_HEAVY_STATES    512u

struct rules_options {
    uint32_t max_states; /* per group; 0 means RULES_DEFAULT_STATES */
    uint32_t max_rules;  /* 0 means RULES_DEFAULT_MAXRULE */
    bool no_minimise;    /* tests: keep the unminimised DFA */
    uint32_t threads;    /* compile threads; 0 means one per online CPU (max 16) */
    bool force_bitnfa;   /* tests: every rule goes to the bit-parallel NFA engine */
    /* A rule whose counted repeats of classes add up to this many goes to
     * the bit-NFA without trying a DFA (docs/engine.md); 0: 64. */
    uint32_t bitnfa_counters;
    /* A regex whose DFA would fit goes to a gated bit-NFA group instead when
     * its weakest literal factor has at least this many bits of selectivity
     * (rules/factor.h, docs/engine.md); 0: 24; UINT32_MAX: never ... */
    uint32_t gate_bits;
    /* ... and its DFA alone has more than this many states; 0: 64; 1: any
     * DFA (every such rule gated without trying its DFA: version 4). */
    uint32_t gate_states;
    /* ... or, whatever its DFA, when its factors are rare in text: at least
     * this many bits by factor_set_text_bits (rules/factor.h); 0: 20;
     * UINT32_MAX: never (compiler version 7's rule). */
    uint32_t gate_rare_bits;
    /* Positions of one gated bit-NFA group (its windows walk every rule of
     * it); 0: BITNFA_GATED_BITS (rules/bitnfa.h); at most BITNFA_GROUP_BITS. */
    uint32_t gated_group_bits;
    /* While grouping DFA rules, one whose DFA alone has at least this many
     * states counts as a factor of its group's size rather than a term
     * (compile.c "fill"); 0: RULES_HEAVY_STATES. */
    uint32_t heavy_states;
    /* When set and non-zero (another thread sets it: vkscand's compile
     * deadline, a client that left, SIGTERM), rules_compile stops at the next
     * group and returns -ECANCELED. */
    const volatile int *cancel;
    /* Literal groups (CAT_GF_LITERAL, docs/catalog.md): 0 when the rules
     * are all plain strings and their DFA tables would be large
     * (RULES_LITERAL_MIN_BYTES), 1 whenever the rules are all plain
     * strings (tests), -1 never. */
    int literal_group;
};

/* Estimated DFA rows of a literal-only rule set over which it becomes one
 * literal group (automatic mode): 8 MiB. */
#define RULES_LITERAL_MIN_BYTES (8u << 20)

/* Why a rule was left out. `pos` is the 0-based byte offset in the pattern
 * where the problem is (0 when it is not about one place). */
struct rule_reject {
    uint32_t index; /* index into the input array */
    uint32_t line;
    uint32_t pos;
    char id[RULES_MAX_ID + 1];
    char msg[240];
};

struct rules_result {
    struct catalog *catalog; /* owned; holds the accepted rules in input order */
    struct rule_reject *rejects;
    size_t n_rejects;
    uint32_t *rule_index; /* input index -> catalog rule index, or UINT32_MAX */
    uint64_t compile_ns;
};

/*
 * Compiles `n` rules. Bad rules never fail the call: each comes back in
 * res->rejects with its reason, and the rest compile. Returns 0, or -EINVAL
 * (options or n out of range) / -ENOMEM with `err` filled; on failure `res`
 * holds nothing to free. Deterministic: the same input gives the same bytes,
 * whatever the thread count. Thread-safe; uses up to opt->threads threads.
 */
int rules_compile(const struct rule_src *rules, size_t n, const struct rules_options *opt,
                  struct rules_result *res, struct vks_error *err);

void rules_result_finish(struct rules_result *res);

/*
 * BLAKE2b-256 of one rule: kind, flags, canonical pattern bytes and the
 * compiler version. The id is not part of it: two rules that match the same
 * way have the same fingerprint.
 */
void rules_fingerprint(const struct rule_src *r, uint8_t fp[CATALOG_FP_LEN]);

/* Parses the flag letters of a pattern file ("isHm") into RULE_F_*;
 * returns -EINVAL and fills err on an unknown letter. */
int rules_parse_flags(const char *s, size_t len, uint32_t *flags, struct vks_error *err);

#endif
