/*
 * libFuzzer target for the rule parser, the compiler and the reference
 * scanner. The first input byte b picks what the rest is, from v = b - 0x20
 * (so printable seeds read naturally):
 *
 *   v & 3         0 literal, 1 hex string, 2 regex, 3 a whole pattern file
 *   (v >> 2) & 15 RULE_F_* flags for kinds 0-2 (' ' none, '&' i, '*' s, '2' m)
 *   v & 0x40      compile without minimisation as well and compare the scans
 *   v & 0x80      a state budget of 256 instead of 32 (printable seeds keep 32)
 *
 * Every compile runs on one thread with a budget of 32 states (256 with
 * v & 0x80), inputs over 128 bytes are skipped and rules that expand to
 * more than 256 NFA positions are only parsed, so an input cannot spend
 * long in subset construction, minimisation or a wide bit-NFA; rules over
 * the state budget still go through the bit-parallel NFA path.
 *
 * Checked on every input: the call returns 0, every rule is either accepted
 * or rejected with a message and a position inside its pattern, the packed
 * catalog passes catalog_from_bytes, and the hits of every scan mode are
 * sorted, in range and consistent with each other.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"
#include "patfile.h"
#include "refscan.h"
#include "rules.h"

/* Small budgets keep one input fast (docs/testing.md has the rates):
 * minimisation time grows with the square of the states, and long inputs
 * mostly repeat what short ones cover. */
#define FUZZ_MAX_STATES     32u
#define FUZZ_MAX_STATES_BIG 256u
#define FUZZ_MAX_INPUT      128
/* Inputs whose rules expand to more NFA positions than this in all (a{30000},
 * ((a|b){50}){50}) are parsed and size-checked but not compiled: a compile
 * of thousands of positions takes 0.1-0.3 s under ASan, where the mean input
 * takes about 1 ms, and the fuzzer keeps finding more of them. The limits
 * that only such rules reach (the bit-NFA's width and edge count) have
 * their own cases in tests/test_dfa.c and tests/test_rules.c. */
#define FUZZ_MAX_POSITIONS 256u
/* compile.c's MAX_RULE_POSITIONS: the size check the compiler makes */
#define RULE_MAX_POSITIONS 200000u
#define STR_(x)            #x
#define STR(x)             STR_(x)

/* A small text with words, line breaks, digits and a high byte. */
static const uint8_t text[] = "The quick brown fox_42 jumps\nover the lazy dog.\n\tA3-BC "
                              "key=\"abc123\" \xe9t\xc3\xa9\n";

static void require(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_rules: invariant broken: %s\n", what);
        abort();
    }
}

static void check_hits(const struct catalog *cat, const struct scan_hits *h, size_t len)
{
    uint32_t nr = catalog_rule_count(cat);
    for (size_t i = 0; i < h->n; i++) {
        require(h->v[i].rule < nr, "hit names a rule the catalog lacks");
        require(h->v[i].end <= len, "hit ends past the buffer");
        require(h->v[i].count >= 1, "hit with a zero count");
        if (i > 0) {
            const struct scan_hit *a = &h->v[i - 1], *b = &h->v[i];
            require(a->end < b->end || (a->end == b->end && a->rule < b->rule),
                    "hits not sorted by (end, rule) or reported twice");
        }
    }
}

/* Scans `buf` in every mode; returns the SCAN_ALL hit count. */
static size_t scan_all_modes(const struct catalog *cat, const uint8_t *buf, size_t len,
                             struct scan_hits *all)
{
    struct scan_hits first = {0}, count = {0};
    require(refscan_buffer(cat, buf, len, SCAN_ALL, all) == 0, "scan failed");
    require(refscan_buffer(cat, buf, len, SCAN_FIRST, &first) == 0, "scan failed");
    require(refscan_buffer(cat, buf, len, SCAN_COUNT, &count) == 0, "scan failed");
    check_hits(cat, all, len);
    check_hits(cat, &first, len);
    require(first.n == count.n, "first-per-rule and count modes disagree on matching rules");
    size_t total = 0;
    for (size_t i = 0; i < count.n; i++)
        total += count.v[i].count;
    require(total == all->n, "count mode does not add up to all mode");
    scan_hits_finish(&first);
    scan_hits_finish(&count);
    return all->n;
}

static void check_result(const struct rules_result *res, const struct rule_src *rules, size_t n)
{
    require(res->catalog != NULL, "no catalog");
    uint32_t nr = catalog_rule_count(res->catalog);
    size_t accepted = 0;
    for (size_t i = 0; i < n; i++)
        accepted += res->rule_index[i] != UINT32_MAX;
    require(accepted == nr, "rule_index does not match the catalog's rules");
    require(accepted + res->n_rejects == n, "a rule neither accepted nor rejected");
    for (size_t k = 0; k < res->n_rejects; k++) {
        require(memchr(res->rejects[k].msg, '\0', sizeof(res->rejects[k].msg)) != NULL &&
                    res->rejects[k].msg[0] != '\0',
                "reject without a message");
        require(res->rejects[k].index < n, "reject of a rule that does not exist");
        require(res->rejects[k].pos <= rules[res->rejects[k].index].len,
                "reject position past the end of the pattern");
    }
    size_t nw = 0;
    const uint32_t *w = catalog_words(res->catalog, &nw);
    struct catalog *copy = NULL;
    struct vks_error err;
    require(catalog_from_bytes(w, nw * 4, &copy, &err) == 0, "packed catalog fails validation");
    catalog_destroy(copy);
}

static void compile_and_scan(const struct rule_src *rules, size_t n, bool compare_unminimised,
                             uint32_t max_states, const uint8_t *data, size_t size)
{
    struct rules_options opt = {.max_states = max_states, .threads = 1};
    struct rules_result res;
    struct vks_error err;
    require(rules_compile(rules, n, &opt, &res, &err) == 0, "rules_compile failed");
    check_result(&res, rules, n);
    struct scan_hits a = {0}, b = {0};
    scan_all_modes(res.catalog, text, sizeof(text) - 1, &a);
    scan_hits_finish(&a);
    scan_all_modes(res.catalog, data, size, &a);
    if (compare_unminimised) {
        struct rules_result raw;
        opt.no_minimise = true;
        require(rules_compile(rules, n, &opt, &raw, &err) == 0, "rules_compile failed");
        /* The unminimised DFA may hit the state budget where the minimised
         * one did not, so only compare when both accepted the same rules. */
        if (raw.n_rejects == res.n_rejects) {
            scan_all_modes(raw.catalog, data, size, &b);
            require(a.n == b.n && (a.n == 0 || memcmp(a.v, b.v, a.n * sizeof(*a.v)) == 0),
                    "minimised and unminimised catalogs give different hits");
        }
        rules_result_finish(&raw);
    }
    scan_hits_finish(&a);
    scan_hits_finish(&b);
    rules_result_finish(&res);
}

/*
 * Parses every rule as rules_compile would and adds up the positions they
 * expand to; a rule over FUZZ_MAX_POSITIONS is also put through the size
 * check. Returns true when the set is small enough to compile.
 */
static bool small_enough(const struct rule_src *rules, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        struct parse_result pr;
        uint32_t pos = 0;
        char msg[256];
        if (parse_rule(&rules[i], &pr, &pos, msg, sizeof(msg)) == 0) {
            uint64_t p = parse_positions(pr.root);
            total += p < FUZZ_MAX_POSITIONS ? p : FUZZ_MAX_POSITIONS + 1;
            if (p > FUZZ_MAX_POSITIONS &&
                parse_check(pr.root, RULE_MAX_POSITIONS, &pos, msg, sizeof(msg)) != 0)
                require(msg[0] != '\0' && pos <= rules[i].len, "size check without a message");
        } else {
            require(msg[0] != '\0' && pos <= rules[i].len, "parse error without a message");
        }
        parse_result_finish(&pr);
    }
    return total <= FUZZ_MAX_POSITIONS;
}

static void fuzz_patfile(const uint8_t *data, size_t size, bool compare, uint32_t max_states)
{
    struct patfile pf;
    struct vks_error err;
    if (patfile_parse((const char *)data, size, &pf, &err) == 0) {
        for (size_t k = 0; k < pf.n_rejects; k++)
            require(pf.rejects[k].msg[0] != '\0' && pf.rejects[k].line >= 1,
                    "pattern-file reject without a message or line");
        /* An id may still be bad (a NUL byte in it): rules_compile rejects it. */
        for (size_t i = 0; i < pf.n; i++)
            require(pf.rules[i].line >= 1, "pattern-file rule without a line");
        if (pf.n > 0 && small_enough(pf.rules, pf.n))
            compile_and_scan(pf.rules, pf.n, compare, max_states, data, size);
    }
    patfile_finish(&pf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/*
 * Flags this target runs best with, added unless the command line sets them
 * (libFuzzer parses the flags after this hook, so an added flag counts):
 * entropic scheduling off, as its per-feature bookkeeping over ~20k
 * features halves the execution rate; and a maximum length equal to the
 * harness's own cap, so that the mutator does not spend executions on
 * inputs the harness skips.
 */
static struct {
    const char *prefix;
    char flag[24];
} defaults[] = {
    {"-entropic=", "-entropic=0"},
    {"-max_len=", "-max_len=" STR(FUZZ_MAX_INPUT)},
};
#define N_DEFAULTS (sizeof(defaults) / sizeof(defaults[0]))

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char **v = malloc(((size_t)*argc + N_DEFAULTS + 1) * sizeof(*v));
    if (v == NULL)
        return 0;
    memcpy(v, *argv, (size_t)*argc * sizeof(*v));
    int n = *argc;
    for (size_t d = 0; d < N_DEFAULTS; d++) {
        bool set = false;
        for (int k = 1; k < *argc && !set; k++)
            set = strncmp((*argv)[k], defaults[d].prefix, strlen(defaults[d].prefix)) == 0;
        if (!set)
            v[n++] = defaults[d].flag;
    }
    v[n] = NULL;
    *argv = v; /* kept for the life of the process */
    *argc = n;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0 || size > (size_t)FUZZ_MAX_INPUT)
        return 0;
    uint8_t v = (uint8_t)(data[0] - 0x20);
    bool compare = (v & 0x40) != 0;
    uint32_t max_states = (v & 0x80) ? FUZZ_MAX_STATES_BIG : FUZZ_MAX_STATES;
    if ((v & 3) == 3) {
        fuzz_patfile(data + 1, size - 1, compare, max_states);
        return 0;
    }
    struct rule_src r = {
        .id = "fuzz",
        .kind = (enum rule_kind)(v & 3),
        .pattern = (const char *)data + 1,
        .len = size - 1,
        .flags = (v >> 2) & RULE_F_ALL,
    };
    if (small_enough(&r, 1))
        compile_and_scan(&r, 1, compare, max_states, data + 1, size - 1);
    return 0;
}
