/*
 * How the CPU engine scans one catalog (docs/engine.md, "The CPU engine's
 * fast path"): worked out once per catalog from its rules' sources and
 * cached, so a scan only looks it up.
 *
 * Per engine group (DFA groups, then bit-NFA groups):
 * - CPUPLAN_LIT: every rule is one plain string (caseless letters allowed,
 *   no assertion): the literal matcher reports its rules directly and the
 *   group's automaton is never walked.
 * - CPUPLAN_WINDOW: every rule has a factor (a small set of strings, one of
 *   which every match contains) and the group's longest match is bounded:
 *   the literal matcher finds the factors, and the group's own walker runs
 *   only in windows of end offsets [e, e + MAXLEN] after each factor end e,
 *   as gated bit-NFA groups are run. Exact: a match outside every window
 *   would contain none of its rule's factors.
 * - CPUPLAN_FULL: walked over the whole range, as before. Factor groups
 *   are always FULL; gated bit-NFA groups left FULL run through refscan's
 *   gate as before, and the factor groups are walked only for them.
 * - CPUPLAN_SHADOW: a gated bit-NFA group whose rules the plan compiled
 *   again for the CPU, without gating (DFA groups where they fit): the
 *   shadow catalog's groups, planned the same way, report them instead.
 *   A bit-NFA step costs far more than a DFA step on a CPU, and the
 *   compiler gates rules whose DFA would fit for the GPU's sake.
 * One literal matcher holds the strings of every LIT and WINDOW group, so
 * each byte is looked at once for all of them; factors of two bytes (rare
 * pairs: binary signatures) are in a pair matcher instead (cpupair.h).
 */
#ifndef VKS_RULES_CPUPLAN_H
#define VKS_RULES_CPUPLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "catalog.h"
#include "cpulit.h"
#include "cpupair.h"
#include "cpurun.h"

enum { CPUPLAN_FULL = 0, CPUPLAN_LIT = 1, CPUPLAN_WINDOW = 2, CPUPLAN_SHADOW = 3 };

/* Literal matcher ids: a rule (LIT groups), or with this bit an engine
 * group whose factor ended there (WINDOW groups). With CPUPLAN_SECOND as
 * well, the low bits index cpuplan.second instead: the factor of a rule
 * that has a second one, which the candidate must have near it. */
#define CPUPLAN_FACTOR 0x80000000u
#define CPUPLAN_SECOND 0x40000000u
/* With CPUPLAN_FACTOR: the low bits are a bit-NFA group left FULL whose
 * factor ends this string's ends are (cpuplan.gate_merged). */
#define CPUPLAN_GATE 0x20000000u

/* A window rule's second factor: strings one of which every match of the
 * rule holds apart from its factor (`inflamed[^\n]{0,100}chinese`: the
 * factor `inflamed`, the second `chinese`). A match holding the factor
 * that ends at e lies within `span` bytes of e on either side, so a
 * candidate with none of the strings there has no match of that rule and
 * is dropped before its window is walked (rules/cpuscan.c on_literal). */
struct cpuplan_second {
    uint32_t group;    /* engine group */
    uint32_t span;     /* the rule's longest match */
    uint32_t first, n; /* its strings: sec_str[first .. first + n) */
};

struct cpuplan_sstr {
    uint32_t off, len; /* into sec_b (bytes) and sec_m (0x20: caseless letter) */
};

/* Idle skipping in a DFA group's walk (rules/cpuscan.c dfa_range): while
 * the walk is in one of the group's start states (start[1..3], chosen by
 * the kind of the byte before), a byte with idle[c] set leads to the start
 * state for c's kind again from each of them, so a run of such bytes is
 * passed over without the transition table and the walk goes on from the
 * start state of the run's last byte; as Hyperscan's accelerated states
 * do. `on` is false when a start state accepts or no byte is idle. */
struct cpuplan_skip {
    bool on;
    uint32_t st[3]; /* start[1], start[2], start[3] */
    uint8_t idle[256];
};

struct cpuplan {
    uint8_t fp[CATALOG_FP_LEN]; /* the catalog's fingerprint */
    struct cpuplan_skip *skip;  /* per DFA group (n_dfa) */
    uint32_t n_dfa, n_nfa;
    uint8_t *mode;      /* per engine group: CPUPLAN_* */
    struct cpulit *lit; /* NULL when no group uses it */
    /* with gate_merged: the CPUPLAN_GATE strings alone, for a split
     * buffer's unbounded pieces, which need only those (cpuscan.c) */
    struct cpulit *gate_lit;
    /* window groups' factors of two bytes (cpupair.h); NULL when none */
    struct cpupair *pair;
    /* window groups' class runs (cpurun.h), for rules with no string to
     * look for; NULL when none */
    struct cpurun *run;
    /* second factors (CPUPLAN_SECOND ids); NULL when none */
    struct cpuplan_second *second;
    struct cpuplan_sstr *sec_str;
    uint8_t *sec_b, *sec_m;
    uint32_t n_second;
    uint32_t n_lit_groups, n_window_groups, n_shadow_groups;
    /* rules compiled again for the shadow (0: none were), used or not */
    uint32_t n_shadow_compiled;
    bool gated_full; /* a gated bit-NFA group left to the catalog's factor groups */
    /* with gated_full: per DFA group, 1 for a factor group that names such
     * a group (refscan_factor_ends_of walks only those); else NULL */
    uint8_t *factor_walk;
    /* the groups a segment walks in full, found once (plan_walks): bit-NFA
     * groups gated and left FULL, the other FULL bit-NFA groups, the FULL
     * DFA groups but factor groups, each list in group order, one after
     * the other in `walks`; gate_lb: the gated groups' longest match
     * (CATALOG_UNBOUNDED with a confirmed one), for their factor ends */
    /* the gated groups' factor ends come from the literal matcher's
     * CPUPLAN_GATE strings, not from walking the factor groups (whole
     * buffers only: a forward-confirmed catalog) */
    bool gate_merged;
    uint32_t *walks;
    uint32_t n_walk_gated, n_walk_nfa, n_walk_dfa;
    uint64_t gate_lb;
    /* CPUPLAN_SHADOW groups: their rules compiled again (owned), its plan
     * (owned), and its rule indexes in this catalog */
    struct catalog *shadow;
    struct cpuplan *shadow_plan;
    uint32_t *shadow_rule;
    /* For a catalog cpuscan_lookback cannot segment (an unbounded group):
     * cpuscan_split_lookback, the lookback of its bounded groups when those
     * may be scanned apart from the unbounded ones (streams take their fast
     * path for the bounded groups alone, rules/streamscan.c), else
     * CPUSCAN_UNSEGMENTABLE; and with a finite one, per rule, 1 when its
     * group is unbounded (else NULL) */
    uint64_t split_lb;
    uint8_t *unbounded;
    int refs; /* under the cache's lock */
};

/*
 * The plan of `cat`: from the cache (keyed by fingerprint) or built and
 * added to it. The caller holds a reference until cpuplan_put. Returns 0
 * or -ENOMEM. Thread-safe; a build runs under the cache's lock.
 */
int cpuplan_get(const struct catalog *cat, struct cpuplan **out);

/* Drops a reference; NULL is allowed. */
void cpuplan_put(struct cpuplan *p);

/* Builds a plan without the cache (tests, benchmarks); cpuplan_put frees
 * it. `fast` false gives every group CPUPLAN_FULL (the walk of refscan
 * alone, for comparison). */
int cpuplan_build(const struct catalog *cat, bool fast, struct cpuplan **out);

/* One rule's string (cpuplan_rule_string); reused from call to call, the
 * caller frees b and m. m[i] is 0x20 where b[i] is a lowercase letter that
 * also matches its uppercase, else 0. */
struct cpuplan_string {
    uint8_t *b, *m;
    uint32_t n, cap;
};

/*
 * Rule r of `cat` as the one string it matches, when its source matches
 * exactly one string of at most `max` bytes and has no assertion (the rules
 * the literal matchers serve: here and gpu/lit.c). A rule written plainly
 * (a literal without escapes, a regex without metacharacters) is read
 * without the parser. Returns 1 with the string in *s, else 0.
 */
int cpuplan_rule_string(const struct catalog *cat, uint32_t r, uint32_t max,
                        struct cpuplan_string *s);

/* Whether cpuplan_get plans fast paths (default true). Tests and
 * scan_bench turn it off to compare; not for use while scans run. */
void cpuplan_set_fast(bool fast);

#endif
