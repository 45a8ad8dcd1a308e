/*
 * rules_compile: parse every rule, group the good ones under the state
 * budget, build and minimise one DFA per group, and pack the catalog.
 */
#include "rules.h"

#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bitnfa.h"
#include "dfa.h"
#include "factor.h"
#include "nfa.h"
#include "parse.h"

#ifndef VKS_COMPILER_VERSION
#error "VKS_COMPILER_VERSION must be defined by the build"
#endif

/* Largest NFA a single rule may expand to. */
#define MAX_RULE_POSITIONS 200000u

/* One accepted rule on its way into a group. */
struct prepared {
    uint32_t input;  /* index into the caller's array */
    uint32_t maxlen; /* CATALOG_UNBOUNDED when unbounded */
    uint64_t positions;
    struct parse_result tree;
    struct node *root; /* after prefix stripping; NULL while released */
    uint32_t plain;    /* plain_len of the tree: its bytes when a plain string, else 0 */
    /* A string sequence (each set one byte or a caseless letter) keeps no
     * tree: `str_len` bytes, then as many flags, 1 where the byte is a
     * caseless letter (string_tree makes the tree again). NULL otherwise. */
    uint32_t str_len;
    uint8_t *str;
    char *canon; /* canonical source */
    size_t canon_len;
    uint32_t group;
    bool bitnfa;                /* goes to the bit-parallel NFA engine */
    bool wide;                  /* wide_counter: tried as a small DFA (SMALL_DFA) */
    bool candidate;             /* selective factors: gated if its DFA is over gate_states */
    bool weak;                  /* candidate on weak factors: gated over WEAK_GATE_STATES */
    bool seq;                   /* is_sequence(root): a plain sequence of byte sets */
    uint32_t bits;              /* its positions there, once known */
    struct factor_set *factors; /* bit-NFA rules with a bounded maxlen: NULL if none */
};

struct group_out {
    struct dfa dfa;
    uint32_t *rules; /* indexes into the prepared array, group-local order */
    uint32_t n_rules;
    uint32_t maxlen;
    bool asserts;
    bool factor;  /* CAT_GF_FACTOR: local rule k reports bit-NFA group k */
    bool literal; /* CAT_GF_LITERAL: no DFA of its own (a trivial one) */
};

struct nfa_group_out {
    struct bitnfa_group g;
    uint32_t *rules; /* indexes into the prepared array, group-local order */
    uint32_t n_rules;
    uint32_t maxlen;
    uint32_t lookback; /* unbounded gated groups: most bytes from a start to a factor's end */
    /* gated groups: byte values from a match's start to span_skip bytes
     * before its factor's end (the last bytes of every factor are skipped) */
    struct byteset span;
    uint32_t span_skip;
    bool gated; /* CAT_GF_GATED (and CAT_GF_CONFIRM when maxlen is unbounded) */
};

struct ctx {
    const struct rule_src *src;
    const struct rules_options *opt;
    struct prepared *prep;
    uint32_t n_prep;
    struct group_out *groups;
    uint32_t n_groups, cap_groups;
    struct nfa_group_out *nfas;
    uint32_t n_nfas, cap_nfas;
    struct rule_reject *rejects;
    size_t n_rejects, cap_rejects;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int add_reject(struct ctx *c, uint32_t input, uint32_t pos, const char *msg)
{
    if (c->n_rejects == c->cap_rejects) {
        size_t cap = c->cap_rejects ? c->cap_rejects * 2 : 16;
        struct rule_reject *n = realloc(c->rejects, cap * sizeof(*n));
        if (n == NULL)
            return -ENOMEM;
        c->rejects = n;
        c->cap_rejects = cap;
    }
    struct rule_reject *r = &c->rejects[c->n_rejects++];
    memset(r, 0, sizeof(*r));
    r->index = input;
    r->line = c->src[input].line;
    r->pos = pos;
    snprintf(r->id, sizeof(r->id), "%s", c->src[input].id ? c->src[input].id : "");
    snprintf(r->msg, sizeof(r->msg), "%s", msg);
    return 0;
}

/* ---- canonical form and fingerprints ---- */

static bool hex_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

/* Hex strings are normalised to lowercase tokens separated by one space: a
 * byte pair ("4d", "??", "4?", "~4d"), a jump with no space in it ("[2-4]"),
 * '(', '|' or ')'. A string of pairs alone keeps the form (and so the
 * fingerprint) it always had: "4d 5a ?? 00". Literals and regexes are kept
 * byte for byte. */
static char *canonical(const struct rule_src *r, size_t *len)
{
    char *out = malloc(r->len * 2 + 1);
    if (out == NULL)
        return NULL;
    size_t n = 0;
    if (r->kind != RULE_HEX) {
        memcpy(out, r->pattern, r->len);
        n = r->len;
    } else {
        size_t i = 0;
        while (i < r->len) {
            char ch = r->pattern[i];
            if (hex_space(ch)) {
                i++;
                continue;
            }
            if (n > 0)
                out[n++] = ' ';
            if (ch == '[') { /* a jump, to its ']', without the spaces in it */
                for (; i < r->len && r->pattern[i] != ']'; i++)
                    if (!hex_space(r->pattern[i]))
                        out[n++] = r->pattern[i];
                if (i < r->len)
                    out[n++] = r->pattern[i++];
                continue;
            }
            size_t take = ch == '(' || ch == '|' || ch == ')' ? 1 : ch == '~' ? 3 : 2;
            for (; i < r->len && take > 0; i++, take--) {
                ch = r->pattern[i];
                out[n++] = (char)(ch >= 'A' && ch <= 'F' ? ch + 32 : ch);
            }
        }
    }
    out[n] = '\0';
    *len = n;
    return out;
}

static void fingerprint_canon(uint32_t kind, uint32_t flags, const char *canon, size_t len,
                              uint8_t fp[CATALOG_FP_LEN])
{
    crypto_generichash_state st;
    uint32_t head[4] = {VKS_COMPILER_VERSION, kind, flags, (uint32_t)len};
    crypto_generichash_init(&st, NULL, 0, CATALOG_FP_LEN);
    crypto_generichash_update(&st, (const unsigned char *)"vkscan-rule", 12);
    crypto_generichash_update(&st, (const unsigned char *)head, sizeof(head));
    crypto_generichash_update(&st, (const unsigned char *)canon, len);
    crypto_generichash_final(&st, fp, CATALOG_FP_LEN);
}

void rules_fingerprint(const struct rule_src *r, uint8_t fp[CATALOG_FP_LEN])
{
    size_t len;
    char *canon = canonical(r, &len);
    if (canon == NULL) { /* hash the raw bytes: still stable, never a crash */
        fingerprint_canon(r->kind, r->flags, r->pattern, r->len, fp);
        return;
    }
    fingerprint_canon(r->kind, r->flags, canon, len, fp);
    free(canon);
}

int rules_parse_flags(const char *s, size_t len, uint32_t *flags, struct vks_error *err)
{
    uint32_t f = 0;
    for (size_t i = 0; i < len; i++) {
        switch (s[i]) {
        case 'i':
            f |= RULE_F_CASELESS;
            break;
        case 's':
            f |= RULE_F_DOTALL;
            break;
        case 'm':
            f |= RULE_F_MULTILINE;
            break;
        case 'H':
            f |= RULE_F_SINGLEMATCH;
            break;
        case 'L':
            f |= RULE_F_SOMLEFT;
            break;
        default:
            return vks_error_set(
                err, -EINVAL,
                "unknown flag '%c': supported flags are i (caseless), s (dot "
                "matches newline), m (multi-line), H (single match) and L (start of "
                "match)",
                s[i]);
        }
    }
    *flags = f;
    return 0;
}

/* ---- per rule ---- */

static bool bad_id(const char *id)
{
    if (id == NULL || id[0] == '\0')
        return true;
    size_t n = strlen(id);
    if (n > RULES_MAX_ID)
        return true;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)id[i] < 0x20 || id[i] == 0x7f)
            return true;
    return false;
}

/*
 * A counted repeat of more than one byte value with a large finite count
 * (`.{0,200}`, `[a-z0-9]{100}`) makes the DFA track every count at once
 * wherever the repeat can overlap itself or what precedes it: such rules go
 * straight to the bit-NFA, without a subset construction that would only
 * fail at the budget.
 */
#define WIDE_REPEAT 100u

/* Sum of the finite counts of repeats of more than one byte value (nested
 * repeats multiply), saturating: a rule whose counters add up to
 * WIDE_TOTAL or more (`[\w.-]{0,20}...[a-z0-9]{32}`, `\w{82}`) has a DFA
 * that tracks every combination of them; it goes to the bit-NFA too. */
#define WIDE_TOTAL 64u /* rules_options.bitnfa_counters when 0 */

/* A wide-counter rule with no factor to gate it is still tried alone as a
 * DFA of at most this many states (prebuild): `\b[a-fA-F0-9]{40}\b` counts
 * one run at a time, and a DFA group's pass over every byte costs a
 * fraction of a bit-NFA's. Over it, the rule goes to the bit-NFA. */
#define SMALL_DFA 4096u

/* Default of rules_options.gate_states: a rule with selective factors whose
 * DFA alone has more states than this is gated (choose_gated). */
#define GATE_STATES 64u

/* The same for a rule whose only factors are weak (two rare bytes,
 * factor_extract_weak): `\x2a\x94.{35}\xd1\x27` alone is 40,000+ states,
 * `\x02\x0b.{10}\x47\x23` 555, while a plain two-byte pair and short
 * classes between stay a few dozen and group well. */
#define WEAK_GATE_STATES 256u

/*
 * Every other rule is tried alone (prebuild) as a DFA of at most this many
 * states, or the budget when smaller; over it the rule goes to the bit-NFA,
 * as it did over the budget. A rule of 51 NFA states in regex-500-secrets
 * built 65,536 DFA states before it failed (3 MB in the build, on one of
 * the prebuild threads, with more threads more such builds at once); no
 * rule of the workloads that fits alone has more than 4,632.
 */
#define LONE_STATES 16384u

static uint32_t lone_states(const struct rules_options *opt)
{
    uint32_t budget = opt->max_states ? opt->max_states : RULES_DEFAULT_STATES;
    return budget < LONE_STATES ? budget : LONE_STATES;
}

static uint32_t gate_states(const struct rules_options *opt)
{
    return opt->gate_states ? opt->gate_states : GATE_STATES;
}

static uint64_t wide_total(const struct node *n)
{
    uint64_t t = 0;
    switch (n->type) {
    case N_SET:
    case N_ASSERT:
        return 0;
    case N_REPEAT: {
        const struct node *k = n->u.rep.kid;
        uint64_t inner = wide_total(k);
        uint32_t width = 0;
        if (k->type == N_SET)
            for (int w = 0; w < 4; w++)
                width += (uint32_t)__builtin_popcountll(k->u.set.w[w]);
        uint64_t count = n->u.rep.max == REPEAT_INF ? n->u.rep.min : n->u.rep.max;
        if (k->type == N_SET && width > 1)
            return count;
        return inner > (1u << 20) || count > (1u << 20) ? 1u << 20 : inner * (count ? count : 1);
    }
    case N_CAT:
    case N_ALT:
        for (uint32_t k = 0; k < n->u.list.n; k++)
            t += wide_total(n->u.list.kids[k]);
        return t > (1u << 20) ? 1u << 20 : t;
    }
    return t;
}

static bool wide_counter(const struct node *n, uint32_t total)
{
    if (wide_total(n) >= total)
        return true;
    switch (n->type) {
    case N_SET:
    case N_ASSERT:
        return false;
    case N_REPEAT: {
        const struct node *k = n->u.rep.kid;
        uint32_t width = 0;
        if (k->type == N_SET)
            for (int w = 0; w < 4; w++)
                width += (uint32_t)__builtin_popcountll(k->u.set.w[w]);
        if (n->u.rep.max != REPEAT_INF && n->u.rep.max >= WIDE_REPEAT &&
            (k->type != N_SET || width > 1))
            return true;
        return wide_counter(k, total);
    }
    case N_CAT:
    case N_ALT:
        for (uint32_t k = 0; k < n->u.list.n; k++)
            if (wide_counter(n->u.list.kids[k], total))
                return true;
        return false;
    }
    return false;
}

static uint32_t plain_len(const struct node *n, int depth, uint32_t max);
static bool is_sequence(const struct node *n);

static int prepare_rule(struct ctx *c, uint32_t i)
{
    const struct rule_src *r = &c->src[i];
    struct prepared *p = &c->prep[c->n_prep];
    char msg[200];
    uint32_t pos = 0;
    memset(p, 0, sizeof(*p));
    if (bad_id(r->id))
        return add_reject(c, i, 0, "rule id must be 1 to 255 printable bytes");
    int rc = parse_rule(r, &p->tree, &pos, msg, sizeof(msg));
    if (rc == 0)
        rc = parse_check(p->tree.root, MAX_RULE_POSITIONS, &pos, msg, sizeof(msg));
    if (rc == -ENOMEM) {
        parse_result_finish(&p->tree);
        return rc;
    }
    if (rc != 0) {
        parse_result_finish(&p->tree);
        return add_reject(c, i, pos, msg);
    }
    p->input = i;
    p->plain = plain_len(p->tree.root, 0, CAT_LITERAL_MAX_LEN);
    p->root = parse_strip_prefix(p->tree.root);
    uint32_t ml = parse_maxlen(p->root);
    p->maxlen = ml == REPEAT_INF ? CATALOG_UNBOUNDED : ml;
    p->positions = parse_positions(p->root);
    p->seq = is_sequence(p->root);
    uint32_t total = c->opt->bitnfa_counters ? c->opt->bitnfa_counters : WIDE_TOTAL;
    p->wide = !c->opt->force_bitnfa && wide_counter(p->root, total);
    p->bitnfa = c->opt->force_bitnfa || p->wide;
    p->canon = canonical(r, &p->canon_len);
    if (p->canon == NULL) {
        parse_result_finish(&p->tree);
        return -ENOMEM;
    }
    c->n_prep++;
    return 0;
}

/* The one byte of a set, or with *fold the upper case of a caseless
 * letter; -1 when the set is neither. */
static int set_char(const struct byteset *s, bool *fold)
{
    int first = -1, n = 0;
    for (int w = 3; w >= 0; w--)
        if (s->w[w] != 0) {
            n += __builtin_popcountll(s->w[w]);
            first = w * 64 + __builtin_ctzll(s->w[w]);
        }
    *fold = n == 2 && first >= 'A' && first <= 'Z' && byteset_has(s, (unsigned)first | 0x20u);
    return n == 1 || *fold ? first : -1;
}

/*
 * Frees the tree of a string sequence (a literal, a hex string without
 * wildcards, a regex of plain letters), keeping its bytes (p->str): such a
 * rule's tree is needed only to build its group, and trees of 48-byte nodes
 * were most of a literal set's compile peak (phrases-3k: 3.3 MB for a 1.3
 * MB catalog). Leaves other rules alone.
 */
static int release_tree(struct prepared *p)
{
    const struct node *r = p->root;
    if (!p->seq)
        return 0;
    uint32_t n = r->type == N_SET ? 1 : r->u.list.n;
    uint8_t *str = malloc(2 * (size_t)n);
    if (str == NULL)
        return -ENOMEM;
    for (uint32_t k = 0; k < n; k++) {
        bool fold;
        int ch = set_char(r->type == N_SET ? &r->u.set : &r->u.list.kids[k]->u.set, &fold);
        if (ch < 0) {
            free(str);
            return 0;
        }
        str[k] = (uint8_t)ch;
        str[n + k] = fold;
    }
    p->str = str;
    p->str_len = n;
    parse_result_finish(&p->tree);
    p->root = NULL;
    return 0;
}

/* The tree of a released string sequence (p->str) in `nodes` (str_len + 1
 * of them) and `kids` (str_len): a concatenation of its byte sets, which
 * the NFA builder turns into the same states as the parsed tree. */
static const struct node *string_tree(const struct prepared *p, struct node *nodes,
                                      struct node **kids)
{
    uint32_t n = p->str_len;
    memset(nodes, 0, ((size_t)n + 1) * sizeof(*nodes));
    for (uint32_t k = 0; k < n; k++) {
        nodes[k + 1].type = N_SET;
        byteset_add(&nodes[k + 1].u.set, p->str[k]);
        if (p->str[n + k])
            byteset_add(&nodes[k + 1].u.set, p->str[k] | 0x20u);
        kids[k] = &nodes[k + 1];
    }
    nodes[0].type = N_CAT;
    nodes[0].u.list.kids = kids;
    nodes[0].u.list.n = n;
    return &nodes[0];
}

/* The tree of rule p for one use: p->root, or when released (NULL) the
 * rule parsed again into *tmp, which the caller finishes, also on failure
 * (an empty one when p->root is used). The same source gives the same
 * tree, which parse_check already accepted. Thread-safe for distinct p. */
static int borrow_tree(const struct ctx *c, const struct prepared *p, struct parse_result *tmp,
                       const struct node **root)
{
    memset(tmp, 0, sizeof(*tmp));
    *root = p->root;
    if (p->root != NULL)
        return 0;
    char msg[200];
    uint32_t pos = 0;
    int rc = parse_rule(&c->src[p->input], tmp, &pos, msg, sizeof(msg));
    if (rc != 0)
        return rc == -ENOMEM ? rc : -EIO;
    *root = parse_strip_prefix(tmp->root);
    return 0;
}

/* Gives a rule whose tree was released (root NULL) its tree again, in
 * p->tree (restore_strings). */
static int hold_tree(struct ctx *c, struct prepared *p)
{
    if (p->root != NULL)
        return 0;
    const struct node *root;
    int rc = borrow_tree(c, p, &p->tree, &root);
    if (rc != 0) {
        parse_result_finish(&p->tree);
        return rc;
    }
    p->root = (struct node *)root;
    return 0;
}

/* Whether rules_compile frees p's tree while the set may be a literal
 * group, without keeping its bytes (literal_group's test). */
static bool maybe_literal(const struct ctx *c, const struct prepared *p)
{
    return p->plain >= CAT_LITERAL_MIN_LEN && !(c->src[p->input].flags & RULE_F_SOMLEFT) &&
           !p->bitnfa;
}

/* Gives the strings whose trees rules_compile freed while the set might be
 * a literal group their bytes, parsing them again. */
static int restore_strings(struct ctx *c)
{
    int rc = 0;
    for (uint32_t i = 0; i < c->n_prep && rc == 0; i++) {
        struct prepared *p = &c->prep[i];
        if (p->str != NULL || !maybe_literal(c, p))
            continue;
        rc = hold_tree(c, p);
        if (rc == 0)
            rc = release_tree(p);
        parse_result_finish(&p->tree);
        p->root = NULL;
    }
    return rc;
}

/* The indexes of the rules not rejected so far, sorted by `cmp` (malloc'd;
 * NULL when out of memory). */
static uint32_t *live_rules(const struct ctx *c, int (*cmp)(const void *, const void *, void *),
                            void *arg, uint32_t *n_out)
{
    uint32_t *order = malloc((c->n_prep ? c->n_prep : 1) * sizeof(*order));
    if (order == NULL)
        return NULL;
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->n_prep; i++)
        if (c->prep[i].group != UINT32_MAX)
            order[n++] = i;
    if (n > 1)
        qsort_r(order, n, sizeof(*order), cmp, arg);
    *n_out = n;
    return order;
}

static int cmp_id(const void *a, const void *b, void *arg)
{
    const struct ctx *c = arg;
    const struct prepared *x = &c->prep[*(const uint32_t *)a], *y = &c->prep[*(const uint32_t *)b];
    int d = strcmp(c->src[x->input].id, c->src[y->input].id);
    if (d != 0)
        return d;
    return x->input < y->input ? -1 : x->input > y->input;
}

/*
 * Rules may share an id, as in Hyperscan and in keyword lists that give one
 * rule several keywords: such rules report as one, under the catalog index
 * of the first of them, so each (id, end offset) is reported once.
 */
static int report_indexes(struct ctx *c, const uint32_t *cat_index, uint32_t *report)
{
    uint32_t n;
    uint32_t *order = live_rules(c, cmp_id, c, &n);
    if (order == NULL)
        return -ENOMEM;
    for (uint32_t i = 0, first = 0; i < n; i++) {
        if (strcmp(c->src[c->prep[order[i]].input].id, c->src[c->prep[order[first]].input].id))
            first = i;
        report[order[i]] = cat_index[order[first]];
    }
    free(order);
    return 0;
}

/* ---- grouping ---- */

/* Builds rules idx[0..n) as one DFA group of at most `budget` states (0:
 * the options' max_states); -E2BIG when over. */
static int build_group(struct ctx *c, const uint32_t *idx, uint32_t n, bool minimise,
                       uint32_t budget, struct group_out *g)
{
    memset(g, 0, sizeof(*g));
    if (c->opt->cancel != NULL && __atomic_load_n(c->opt->cancel, __ATOMIC_RELAXED) != 0)
        return -ECANCELED;
    uint32_t longest = 0;
    for (uint32_t k = 0; k < n; k++)
        if (c->prep[idx[k]].root == NULL && c->prep[idx[k]].str_len > longest)
            longest = c->prep[idx[k]].str_len;
    struct nfa_builder *b = nfa_builder_create();
    struct node *nodes = malloc(((size_t)longest + 1) * sizeof(*nodes));
    struct node **kids = malloc(((size_t)longest + 1) * sizeof(*kids));
    int rc = b == NULL || nodes == NULL || kids == NULL ? -ENOMEM : 0;
    for (uint32_t k = 0; k < n && rc == 0; k++) {
        const struct prepared *p = &c->prep[idx[k]];
        struct parse_result again = {0};
        const struct node *root = p->root;
        if (root == NULL && p->str != NULL)
            root = string_tree(p, nodes, kids);
        else
            rc = borrow_tree(c, p, &again, &root);
        if (rc == 0)
            rc = nfa_builder_add(b, root, k);
        parse_result_finish(&again);
    }
    free(nodes);
    free(kids);
    struct nfa nfa;
    if (rc == 0)
        rc = nfa_builder_finish(b, &nfa);
    nfa_builder_destroy(b);
    if (rc != 0)
        return rc;
    if (budget == 0)
        budget = c->opt->max_states ? c->opt->max_states : RULES_DEFAULT_STATES;
    dfa_cancel = c->opt->cancel;
    rc = dfa_build(&nfa, budget, &g->dfa);
    g->asserts = nfa.has_cond;
    nfa_finish(&nfa);
    if (rc == 0 && minimise && !c->opt->no_minimise)
        rc = dfa_minimise(&g->dfa);
    dfa_cancel = NULL;
    if (rc != 0) {
        dfa_finish(&g->dfa);
        return rc;
    }
    g->rules = malloc(n * sizeof(*g->rules));
    if (g->rules == NULL) {
        dfa_finish(&g->dfa);
        return -ENOMEM;
    }
    memcpy(g->rules, idx, n * sizeof(*idx));
    g->n_rules = n;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t ml = c->prep[idx[k]].maxlen;
        g->maxlen = ml > g->maxlen ? ml : g->maxlen;
    }
    return 0;
}

static int push_group(struct ctx *c, struct group_out *g)
{
    if (c->n_groups == c->cap_groups) {
        uint32_t cap = c->cap_groups ? c->cap_groups * 2 : 8;
        struct group_out *n = realloc(c->groups, cap * sizeof(*n));
        if (n == NULL)
            return -ENOMEM;
        c->groups = n;
        c->cap_groups = cap;
    }
    c->groups[c->n_groups++] = *g;
    return 0;
}

static int reject_too_many_edges(struct ctx *c, uint32_t i)
{
    char msg[200];
    snprintf(msg, sizeof(msg),
             "rule's bit-parallel NFA has more than %u follow edges (optional items inside a "
             "large repeat, such as (a?){20000}): make the repeated item non-optional",
             BITNFA_MAX_EDGES);
    c->prep[i].group = UINT32_MAX;
    return add_reject(c, c->prep[i].input, 0, msg);
}

static int reject_too_wide(struct ctx *c, uint32_t i, uint32_t bits)
{
    char msg[200];
    snprintf(msg, sizeof(msg),
             "rule needs %u positions in a bit-parallel NFA, over the limit of %u "
             "(its DFA is over the state budget too): lower its repeat counts",
             bits, BITNFA_MAX_BITS);
    c->prep[i].group = UINT32_MAX;
    return add_reject(c, c->prep[i].input, 0, msg);
}

/* A plain sequence of byte sets (a literal, a hex string, a regex without
 * repeats or alternation) has a DFA no larger than its positions. */
static bool is_sequence(const struct node *n)
{
    if (n->type == N_SET)
        return true;
    if (n->type != N_CAT)
        return false;
    for (uint32_t k = 0; k < n->u.list.n; k++)
        if (n->u.list.kids[k]->type != N_SET)
            return false;
    return true;
}

/* Shared by the prebuild threads: the next rule to take. */
struct prebuild_work {
    struct ctx *c;
    uint32_t next;
    int rc;
    pthread_mutex_t lock;
};

static int extract_factors(const struct ctx *c, struct prepared *p);

static void *prebuild_thread(void *arg)
{
    struct prebuild_work *w = arg;
    struct ctx *c = w->c;
    for (;;) {
        pthread_mutex_lock(&w->lock);
        uint32_t i = w->next++;
        bool stop = w->rc != 0 || i >= c->n_prep;
        pthread_mutex_unlock(&w->lock);
        if (stop)
            return NULL;
        struct prepared *p = &c->prep[i];
        if ((p->bitnfa && !p->wide) || p->seq)
            continue;
        int rc = p->wide ? extract_factors(c, p) : 0;
        if (rc == 0 && p->wide && p->factors != NULL)
            continue; /* a gated bit-NFA group walks only around its factors */
        struct group_out g;
        uint32_t cap = p->wide        ? SMALL_DFA
                       : p->weak      ? WEAK_GATE_STATES
                       : p->candidate ? gate_states(c->opt)
                                      : lone_states(c->opt);
        if (rc == 0)
            rc = build_group(c, &i, 1, false, cap, &g);
        if (rc == 0) {
            p->bitnfa = false;
            p->positions = g.dfa.n_states;
            dfa_finish(&g.dfa);
            free(g.rules);
        } else if (rc == -E2BIG && p->wide) {
            continue; /* stays on the bit-NFA */
        } else if (rc == -E2BIG && p->candidate) {
            p->bitnfa = true; /* over gate_states, with selective factors: gated */
        } else if (rc == -E2BIG) {
            c->prep[i].positions = UINT64_MAX; /* rejected below, in order */
        } else {
            pthread_mutex_lock(&w->lock);
            w->rc = rc;
            pthread_mutex_unlock(&w->lock);
        }
    }
}

static uint32_t thread_count(const struct rules_options *opt)
{
    if (opt->threads != 0)
        return opt->threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 16 ? 16 : (uint32_t)n;
}

/*
 * Builds every other rule alone first, on all cores: a rule over the budget
 * then goes to the bit-NFA for the cost of one build instead of one per
 * split while grouping, and its state count is a truer estimate of its
 * share of a group.
 */
static int prebuild(struct ctx *c)
{
    struct prebuild_work w = {.c = c};
    pthread_t th[16];
    uint32_t nt = thread_count(c->opt), started = 0;
    if (nt > 16)
        nt = 16;
    if (pthread_mutex_init(&w.lock, NULL) != 0)
        return -ENOMEM;
    for (; started + 1 < nt; started++)
        if (pthread_create(&th[started], NULL, prebuild_thread, &w) != 0)
            break;
    prebuild_thread(&w); /* this thread works too */
    for (uint32_t t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    pthread_mutex_destroy(&w.lock);
    for (uint32_t i = 0; i < c->n_prep; i++)
        if (c->prep[i].positions == UINT64_MAX)
            c->prep[i].bitnfa = true; /* its DFA alone is over the budget */
    return w.rc;
}

/*
 * A group's first build stops at FIRST_FACTOR times its estimated size
 * (fill_states), at least FIRST_FLOOR states: a group over that is split
 * in halves, which are built with the whole budget, as after a failed
 * build at the budget. gitleaks-regex's group of 6 rules estimated at 924
 * states failed only at 65,536 (14.4 MB of rows, most of the compile's
 * peak and half its time). The groups that fit are up to 24.5x their
 * estimate: 21,567 states against 882 (gitleaks-regex at gate_states 1,
 * whose shape tests/test_hsdiff.c checks), 17,753 against 1,129
 * (regex-500).
 */
#define FIRST_FACTOR 32u
#define FIRST_FLOOR  16384u

/* Builds rules idx[0..n) as one group, splitting in halves while the DFA
 * is over budget (the first build: over `cap` states when not 0). A single
 * rule over budget goes to the bit-NFA. */
static int place(struct ctx *c, uint32_t *idx, uint32_t n, uint32_t cap)
{
    struct group_out g;
    int rc = build_group(c, idx, n, true, n == 1 ? 0 : cap, &g);
    if (rc == 0) {
        rc = push_group(c, &g);
        if (rc != 0) {
            dfa_finish(&g.dfa);
            free(g.rules);
        }
        return rc;
    }
    if (rc != -E2BIG)
        return rc;
    if (n == 1) {
        c->prep[idx[0]].bitnfa = true;
        return 0;
    }
    rc = place(c, idx, n / 2, 0);
    return rc != 0 ? rc : place(c, idx + n / 2, n - n / 2, 0);
}

/* Bounded rules before unbounded ones, each by maxlen, so a group's segment
 * overlap is set by rules of similar length; input order breaks ties. */
static int cmp_prep(const void *a, const void *b, void *arg)
{
    const struct prepared *p = arg;
    const struct prepared *x = &p[*(const uint32_t *)a], *y = &p[*(const uint32_t *)b];
    if (x->maxlen != y->maxlen)
        return x->maxlen < y->maxlen ? -1 : 1;
    return x->input < y->input ? -1 : x->input > y->input;
}

/*
 * The estimated size of a group. Small rules add up, but large regexes
 * (counters over broad classes) multiply: their DFAs run in parallel inside
 * the group, and the product bounds the combined DFA. Estimating those as a
 * product keeps such rules apart up front, instead of learning it from a
 * failed build at full budget (halving) for each of them. "Large" is
 * rules_options.heavy_states (RULES_HEAVY_STATES): at 2,048 four gitleaks
 * rules of 45 to 755 states each went into one group of 37,712 states and
 * 7.2 MB of rows, 700 ms of the set's 900 ms compile; at 512 the two
 * largest are kept apart and the set's groups total 16,892 states.
 */
struct fill {
    uint64_t light; /* sum of the small rules' states */
    uint64_t heavy; /* product of the large rules' states, 0 when none */
};

static struct fill fill_add(struct fill f, uint64_t states, uint64_t heavy)
{
    if (states < heavy)
        f.light += states;
    else
        f.heavy = f.heavy == 0                    ? states
                  : f.heavy > ((uint64_t)1 << 40) ? f.heavy
                                                  : f.heavy * states;
    return f;
}

static uint64_t fill_states(struct fill f)
{
    return f.light + f.heavy;
}

/* ---- literal groups ---- */

/* The length of the one string `n` matches (caseless letters allowed), or
 * 0 when it matches more than one, asserts, or is over max. */
static uint32_t plain_len(const struct node *n, int depth, uint32_t max)
{
    if (depth > 64)
        return 0;
    switch (n->type) {
    case N_SET: {
        bool fold;
        return set_char(&n->u.set, &fold) >= 0 ? 1 : 0;
    }
    case N_CAT: {
        uint32_t t = 0;
        for (uint32_t i = 0; i < n->u.list.n; i++) {
            uint32_t k = plain_len(n->u.list.kids[i], depth + 1, max);
            if (k == 0 || t + k > max)
                return 0;
            t += k;
        }
        return t;
    }
    case N_ALT:
        return n->u.list.n == 1 ? plain_len(n->u.list.kids[0], depth + 1, max) : 0;
    case N_REPEAT: {
        if (n->u.rep.min != n->u.rep.max || n->u.rep.min == 0 || n->u.rep.min > max)
            return 0;
        uint32_t k = plain_len(n->u.rep.kid, depth + 1, max);
        return k != 0 && (uint64_t)k * n->u.rep.min <= max ? k * n->u.rep.min : 0;
    }
    default:
        return 0;
    }
}

/*
 * Puts every rule into one literal group (CAT_GF_LITERAL) when all of them
 * are plain strings of CAT_LITERAL_MIN_LEN..MAX_LEN bytes (as parsed from
 * their source, which is what the scanners read) without start of match,
 * and (automatic mode) their DFA rows would be large: an Aho-Corasick DFA
 * has about one state per string byte and a row per state of about one
 * class per distinct byte. Sets *done when it did.
 */
static int literal_group(struct ctx *c, bool *done)
{
    *done = false;
    if (c->opt->literal_group < 0 || c->opt->force_bitnfa || c->n_prep == 0)
        return 0;
    uint64_t bytes = 0;
    uint32_t maxlen = 0;
    uint8_t seen[256] = {0};
    for (uint32_t i = 0; i < c->n_prep; i++) {
        const struct prepared *p = &c->prep[i];
        if (c->src[p->input].flags & RULE_F_SOMLEFT)
            return 0;
        uint32_t len = p->plain;
        if (len < CAT_LITERAL_MIN_LEN)
            return 0;
        bytes += len;
        maxlen = len > maxlen ? len : maxlen;
        for (size_t k = 0; k < c->src[p->input].len && k < 64; k++)
            seen[(uint8_t)c->src[p->input].pattern[k]] = 1;
    }
    uint32_t classes = 1;
    for (int b = 0; b < 256; b++)
        classes += seen[b];
    if (c->opt->literal_group == 0 && bytes * classes * 4 <= RULES_LITERAL_MIN_BYTES)
        return 0;
    struct group_out g = {.n_rules = c->n_prep, .maxlen = maxlen, .literal = true};
    g.rules = malloc(c->n_prep * sizeof(*g.rules));
    if (g.rules == NULL || dfa_init_empty(&g.dfa) != 0) {
        free(g.rules);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < c->n_prep; i++)
        g.rules[i] = i;
    int rc = push_group(c, &g);
    if (rc != 0) {
        dfa_finish(&g.dfa);
        free(g.rules);
        return rc;
    }
    *done = true;
    return 0;
}

/*
 * A broad counter kept a DFA (prebuild, SMALL_DFA) of DENSE_STATES or more
 * (`[^\n]{1000}`, `.{500}`, `[A-Za-z0-9+/]{300}`) is grouped only with
 * other such counters. It tracks a count wherever it can start, so every
 * state of another rule of its group pairs with every count, in state sets
 * of up to that many positions. `[^\n]{1000}` with eight small rules made
 * one group of 20,972 states (1.7 MB) in 2.1 s, against 1,001 and 47
 * states apart in 18 ms; with sixteen, the halving after failed builds
 * took 4.8 s. Counters of one class share their count (`[^\n]{300}` to
 * `[^\n]{499}`: 200 rules, two groups of 970 states in all), so they are
 * still grouped together by the estimate. This costs at most a pass per
 * kind of group (bounded, unbounded): the rules that had joined counters.
 */
#define DENSE_STATES 256u

static bool dense_counter(const struct prepared *p)
{
    return p->wide && p->positions >= DENSE_STATES;
}

/* cmp_prep's order, the dense counters after the other rules. */
static int cmp_dense_last(const void *a, const void *b, void *arg)
{
    const struct prepared *p = arg;
    bool x = dense_counter(&p[*(const uint32_t *)a]), y = dense_counter(&p[*(const uint32_t *)b]);
    return x != y ? (x ? 1 : -1) : cmp_prep(a, b, arg);
}

/* Groups rules idx[0..n) (cmp_prep order) into DFAs by their estimated
 * size (fill), bounded and unbounded rules apart, and places each group. */
static int group_run(struct ctx *c, uint32_t *idx, uint32_t n)
{
    uint32_t budget = c->opt->max_states ? c->opt->max_states : RULES_DEFAULT_STATES;
    uint64_t heavy = c->opt->heavy_states ? c->opt->heavy_states : RULES_HEAVY_STATES;
    int rc = 0;
    uint32_t begin = 0;
    struct fill f = {0, 0};
    for (uint32_t i = 0; i <= n && rc == 0; i++) {
        bool end = i == n;
        bool kind_change = !end && i > begin &&
                           (c->prep[idx[i]].maxlen == CATALOG_UNBOUNDED) !=
                               (c->prep[idx[i - 1]].maxlen == CATALOG_UNBOUNDED);
        struct fill g = end ? f : fill_add(f, c->prep[idx[i]].positions, heavy);
        if (i > begin && (end || kind_change || fill_states(g) > budget)) {
            uint64_t cap = fill_states(f) * FIRST_FACTOR;
            cap = cap > FIRST_FLOOR ? cap : FIRST_FLOOR;
            rc = place(c, idx + begin, i - begin, cap < budget ? (uint32_t)cap : 0);
            begin = i;
            g = fill_add((struct fill){0, 0}, end ? 0 : c->prep[idx[i]].positions, heavy);
        }
        f = g;
    }
    return rc;
}

/* The DFA rules' groups: the dense counters among themselves, after the
 * rest. */
static int group_rules(struct ctx *c)
{
    uint32_t n, m = 0;
    uint32_t *order = live_rules(c, cmp_dense_last, c->prep, &n);
    if (order == NULL)
        return -ENOMEM;
    uint32_t n_dense = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!c->prep[order[i]].bitnfa) {
            order[m++] = order[i];
            n_dense += dense_counter(&c->prep[order[i]]);
        }
    }
    n = m;
    int rc = group_run(c, order, n - n_dense);
    if (rc == 0)
        rc = group_run(c, order + n - n_dense, n_dense);
    free(order);
    return rc;
}

/* ---- bit-NFA groups ---- */

static int push_nfa(struct ctx *c, struct nfa_group_out *g)
{
    if (c->n_nfas == c->cap_nfas) {
        uint32_t cap = c->cap_nfas ? c->cap_nfas * 2 : 8;
        struct nfa_group_out *n = realloc(c->nfas, cap * sizeof(*n));
        if (n == NULL)
            return -ENOMEM;
        c->nfas = n;
        c->cap_nfas = cap;
    }
    c->nfas[c->n_nfas++] = *g;
    return 0;
}

/* Builds bit-NFA rules idx[0..n) as one group, in halves while over the
 * bit limit. */
static int place_nfa(struct ctx *c, uint32_t *idx, uint32_t n)
{
    const struct node *roots[64] = {NULL};
    struct parse_result trees[64];
    struct nfa_group_out g = {0};
    uint32_t bits = 0, k = 0;
    int rc = 0;
    if (n > 64)
        goto split;
    for (; k < n && rc == 0; k++)
        rc = borrow_tree(c, &c->prep[idx[k]], &trees[k], &roots[k]);
    if (rc == 0)
        rc = bitnfa_build(roots, n, n == 1 ? BITNFA_MAX_BITS : BITNFA_GROUP_BITS, &g.g, &bits);
    while (k > 0)
        parse_result_finish(&trees[--k]);
    if (rc == -E2BIG || (rc == -EFBIG && n > 1))
        goto split;
    if (rc == -EFBIG)
        return reject_too_many_edges(c, idx[0]);
    if (rc != 0)
        return rc;
    g.rules = malloc(n * sizeof(*g.rules));
    if (g.rules == NULL || push_nfa(c, &g) != 0) {
        free(g.rules);
        bitnfa_group_finish(&g.g);
        return -ENOMEM;
    }
    memcpy(g.rules, idx, n * sizeof(*idx));
    c->nfas[c->n_nfas - 1].n_rules = n;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t ml = c->prep[idx[k]].maxlen, *gm = &c->nfas[c->n_nfas - 1].maxlen;
        *gm = ml > *gm ? ml : *gm;
    }
    return 0;
split:
    if (n == 1)
        return reject_too_wide(c, idx[0], bits);
    rc = place_nfa(c, idx, n / 2);
    return rc != 0 ? rc : place_nfa(c, idx + n / 2, n - n / 2);
}

/* A weak factor set (factor_extract_weak) gates a rule only when it is at
 * least this rare in text (factor_set_text_bits, truncated): a byte outside
 * letters, digits, space and newline with any other (13-16 bits), as a
 * binary signature's anchors are, but not two letters ("th", 10 bits),
 * which would open a window every few hundred bytes. A bit-NFA rule
 * without a factor is walked over every byte, so even a common factor
 * costs it little more (the windows are walked once where they overlap). */
#define WEAK_TEXT_BITS 12u

/* Sets p->factors to the rule's factor set, trimmed to its factors
 * (FACTOR_SET_SIZE), or NULL when it has none; `weak`: with factors of two
 * bytes where there is no longer one, kept when rare in text. */
static int extract_factors_as(const struct ctx *c, struct prepared *p, bool weak)
{
    if (p->factors != NULL)
        return 0;
    struct parse_result again;
    const struct node *root;
    struct factor_set *fs = malloc(sizeof(*fs));
    int rc = fs == NULL ? -ENOMEM : borrow_tree(c, p, &again, &root);
    if (rc == 0)
        rc = weak ? factor_extract_weak(root, fs) : factor_extract(root, fs);
    if (fs != NULL)
        parse_result_finish(&again);
    if (rc == 0 && weak && factor_set_text_bits(fs) < WEAK_TEXT_BITS)
        rc = -ENOENT;
    if (rc != 0) {
        free(fs);
        return rc == -ENOMEM || rc == -EIO ? rc : 0;
    }
    struct factor_set *small = realloc(fs, FACTOR_SET_SIZE(fs->n));
    p->factors = small != NULL ? small : fs;
    return 0;
}

static int extract_factors(const struct ctx *c, struct prepared *p)
{
    return extract_factors_as(c, p, false);
}

/* How a bit-NFA rule is walked, which its group shares: 0 in full (no
 * factors), 1 in windows around its factors (bounded), 2 forward from
 * starts near its factors (unbounded, bounded lead), 3 forward from the
 * buffer's start up to its last factor (unbounded lead). */
static uint32_t gate_class(const struct prepared *p)
{
    if (p->factors == NULL)
        return 0;
    if (p->maxlen != CATALOG_UNBOUNDED)
        return 1;
    return factor_set_pre(p->factors) == FACTOR_PRE_UNBOUNDED ? 3 : 2;
}

/* The chance that a text byte ends the run of bytes a class 3 rule's
 * match may hold up to its factor (factor_span_break_chance): its starts
 * are confirmed from that run's start, and a group's run is that of the
 * union of its rules' spans (compiler version 14). */
static double span_break(const struct prepared *p)
{
    struct byteset span = {{0}};
    factor_set_span_bytes(p->factors, factor_set_min_len(p->factors), &span);
    return factor_span_break_chance(&span);
}

struct by_break {
    double br;
    uint32_t rule, at;
};

static int cmp_by_break(const void *a, const void *b)
{
    const struct by_break *x = a, *y = b;
    if (x->br != y->br)
        return x->br > y->br ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at; /* stable */
}

/* Orders the class 3 rules v[0..n) by span_break, most breaks first, each
 * computed once (thousands of such rules in a set). */
static int sort_by_break(const struct ctx *c, uint32_t *v, uint32_t n)
{
    struct by_break *b = malloc((size_t)n * sizeof(*b));
    if (b == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        b[i] = (struct by_break){span_break(&c->prep[v[i]]), v[i], i};
    qsort(b, n, sizeof(*b), cmp_by_break);
    for (uint32_t i = 0; i < n; i++)
        v[i] = b[i].rule;
    free(b);
    return 0;
}

/*
 * Finds the factors of the bit-NFA rules order[0..m) and orders them by
 * gate_class, so that whole groups hold rules of one class and can be
 * gated; each class stays in maxlen order, class 2 by lead, class 3 by
 * span_break, most breaks first.
 */
static int find_factors(struct ctx *c, uint32_t *order, uint32_t m)
{
    uint32_t *tmp = malloc((m ? m : 1) * sizeof(*tmp));
    if (tmp == NULL)
        return -ENOMEM;
    uint32_t k = 0;
    for (uint32_t i = 0; i < m; i++) {
        /* a bit-NFA rule without a factor is walked over every byte: two
         * rare bytes are worth gating it on */
        int rc = extract_factors(c, &c->prep[order[i]]);
        if (rc == 0)
            rc = extract_factors_as(c, &c->prep[order[i]], true);
        if (rc != 0) {
            free(tmp);
            return rc;
        }
    }
    for (uint32_t cls = 0; cls < 4; cls++) {
        uint32_t from = k;
        for (uint32_t i = 0; i < m; i++)
            if (gate_class(&c->prep[order[i]]) == cls)
                tmp[k++] = order[i];
        for (uint32_t i = from + 1; cls == 2 && i < k; i++) { /* stable, by lead */
            uint32_t x = tmp[i], j = i, pre = factor_set_pre(c->prep[x].factors);
            for (; j > from && factor_set_pre(c->prep[tmp[j - 1]].factors) > pre; j--)
                tmp[j] = tmp[j - 1];
            tmp[j] = x;
        }
        if (cls == 3 && k > from + 1 && sort_by_break(c, tmp + from, k - from) != 0) {
            free(tmp);
            return -ENOMEM;
        }
    }
    memcpy(order, tmp, m * sizeof(*order));
    free(tmp);
    return 0;
}

/* Factors weaker than this many bits stay in DFA groups (default of
 * rules_options.gate_bits): 3 bytes, or 4 caseless letters. A caseless
 * 3-letter word (21 bits: "key", "api") is too common in text. */
#define GATE_BITS 24u

/*
 * The same for an unbounded rule whose factors have a bounded lead (gate
 * class 2), when rules_options.gate_bits is left at 0: any factor of 3
 * positions of at most 2 values each ("(?i)woi"). Such a rule in a DFA
 * group makes that group unbounded, and an unbounded group is walked over
 * every byte in speculative segments (lookbacks, a convergence check, the
 * rare re-walk), while gated it costs forward walks from its candidates
 * that die at the first byte the rule cannot take, each capped
 * (docs/engine.md "Forward confirmation"). Measured on the H200 (session
 * 23, docs/PERFORMANCE.md): regex-500-secrets' two such rules (1,045 DFA
 * states) were 2.7 of its kernel's 5.6 ms per GiB, and 0 gated. A bounded
 * rule keeps the stronger threshold: its DFA group walks every byte
 * without speculation, while its windows around a common factor would be
 * walked in full.
 */
#define GATE_BITS_UNBOUNDED 21u

/* A rule of gate class 3 whose span bytes break a run of text less often
 * than this (factor_span_break_chance: runs of 256 bytes and more) is not
 * gated for its rare factors alone. */
#define SPAN_BREAK_MIN (1.0 / 256)

/* Default of rules_options.gate_rare_bits: a candidate whose factors are at
 * least this rare in text (factor_set_text_bits) is gated without trying
 * its DFA. */
#define GATE_RARE_BITS 20u

/*
 * A regex whose factors are selective may be walked only around them, on a
 * gated bit-NFA group, even when its DFA would fit: one pass of the factor
 * group replaces DFA groups' passes over every byte. Which ones: those
 * whose DFA alone has more than gate_states states (prebuild tries each
 * under that cap), since such DFAs multiply when grouped and make the
 * groups many, large and slow to build, while small ones group well and
 * scan from shared memory. Measured (docs/PERFORMANCE.md, session 9),
 * regex-500 (rules of 11-118 states) at 1 / 32 / 64 / 128: 2 / 3 / 9 / 11
 * passes, H200 kernel 8.4 / 28.2 / 42.9 / 70.5 GB/s (Hyperscan on 16
 * threads: 2.4-2.9), compile 0.04 / 0.9 / 2.1 / 3.1 s on the 2-core
 * development machine (Hyperscan: 1.5 s); regex-500-secrets compiles in
 * 0.4 / 1.4 / 4.7 / 9.9 s into 3 / 4 / 10 / 16 passes. 64 trades compile
 * time for scan speed. Plain
 * sequences stay DFAs: a literal is its own best factor, and literal sets
 * are what the DFA kernel does best. An unbounded rule whose lead is
 * unbounded (`jwt`: `ey\w{17,}\.ey...`) is confirmed from the buffer's
 * start up to its last factor, which costs a full walk only in buffers
 * that hold a factor.
 */
static int choose_gated(struct ctx *c)
{
    uint32_t bits = c->opt->gate_bits ? c->opt->gate_bits : GATE_BITS;
    uint32_t ubits = c->opt->gate_bits ? c->opt->gate_bits : GATE_BITS_UNBOUNDED;
    uint32_t rare = c->opt->gate_rare_bits ? c->opt->gate_rare_bits : GATE_RARE_BITS;
    for (uint32_t i = 0; i < c->n_prep && bits != UINT32_MAX; i++) {
        struct prepared *p = &c->prep[i];
        if (p->bitnfa || p->seq)
            continue;
        int rc = extract_factors(c, p);
        if (rc != 0)
            return rc;
        uint32_t need = gate_class(p) == 2 ? ubits : bits;
        if (p->factors != NULL && factor_set_bits(p->factors) >= need) {
            bool rarely = factor_set_text_bits(p->factors) >= rare;
            /* an unbounded lead whose span runs on through text
             * (`"[^"]*secret`, `(?s).*key`) would be confirmed by the
             * bit-NFA over about every byte before its factors: its DFA
             * is tried first (compiler version 14) */
            if (rarely && gate_class(p) == 3 && span_break(p) < SPAN_BREAK_MIN)
                rarely = false;
            p->candidate = gate_states(c->opt) > 1 && !rarely;
            p->bitnfa = !p->candidate; /* gated without a try */
        } else if (p->factors == NULL && gate_states(c->opt) > 1) {
            /* two rare bytes: gated only when its DFA explodes (a gap after
             * an anchor tracks every earlier occurrence of it) */
            rc = extract_factors_as(c, p, true);
            if (rc != 0)
                return rc;
            p->candidate = p->weak = p->factors != NULL;
        }
    }
    return 0;
}

/* ---- the factor group ---- */

/* One factor as a tree: a concatenation of its byte sets. */
struct factor_tree {
    struct node cat;
    struct node sets[FACTOR_MAX_LEN];
    struct node *kids[FACTOR_MAX_LEN];
};

static void factor_tree_init(struct factor_tree *t, const struct factor *f)
{
    memset(t, 0, sizeof(*t));
    for (uint32_t i = 0; i < f->len; i++) {
        t->sets[i].type = N_SET;
        t->sets[i].u.set = f->set[i];
        t->kids[i] = &t->sets[i];
    }
    t->cat.type = N_CAT;
    t->cat.u.list.kids = t->kids;
    t->cat.u.list.n = f->len;
}

/* Builds the DFA of every factor of the rules of the gated groups: local
 * rule k of the result is bit-NFA group k. */
static int build_factor_dfa(struct ctx *c, struct group_out *g)
{
    memset(g, 0, sizeof(*g));
    struct nfa_builder *b = nfa_builder_create();
    if (b == NULL)
        return -ENOMEM;
    struct factor_tree *t = malloc(sizeof(*t));
    int rc = t == NULL ? -ENOMEM : 0;
    for (uint32_t j = 0; j < c->n_nfas && rc == 0; j++) {
        const struct nfa_group_out *ng = &c->nfas[j];
        for (uint32_t k = 0; ng->gated && k < ng->n_rules && rc == 0; k++) {
            const struct factor_set *fs = c->prep[ng->rules[k]].factors;
            for (uint32_t i = 0; i < fs->n && rc == 0; i++) {
                factor_tree_init(t, &fs->f[i]);
                rc = nfa_builder_add(b, &t->cat, j);
                g->n_rules++;
                g->maxlen = fs->f[i].len > g->maxlen ? fs->f[i].len : g->maxlen;
            }
        }
    }
    free(t);
    struct nfa nfa;
    if (rc == 0)
        rc = nfa_builder_finish(b, &nfa);
    nfa_builder_destroy(b);
    if (rc != 0)
        return rc;
    uint32_t budget = c->opt->max_states ? c->opt->max_states : RULES_DEFAULT_STATES;
    dfa_cancel = c->opt->cancel;
    rc = dfa_build(&nfa, budget, &g->dfa);
    nfa_finish(&nfa);
    if (rc == 0 && !c->opt->no_minimise)
        rc = dfa_minimise(&g->dfa);
    dfa_cancel = NULL;
    if (rc != 0)
        dfa_finish(&g->dfa);
    g->factor = true;
    return rc;
}

/*
 * Gates every bit-NFA group whose rules all have factors (and so a bounded
 * maxlen), and adds the DFA group of their factors, after the other DFA
 * groups. When the factors do not fit one DFA under the state budget, no
 * group is gated: they are walked in full, as without factors.
 */
static int add_factor_group(struct ctx *c)
{
    bool any = false;
    for (uint32_t j = 0; j < c->n_nfas; j++) {
        struct nfa_group_out *ng = &c->nfas[j];
        ng->gated = true;
        ng->lookback = 0;
        memset(&ng->span, 0, sizeof(ng->span));
        ng->span_skip = UINT32_MAX;
        for (uint32_t k = 0; k < ng->n_rules; k++) {
            const struct factor_set *fs = c->prep[ng->rules[k]].factors;
            ng->gated &= fs != NULL;
            uint32_t pre = fs != NULL ? factor_set_pre(fs) : 0;
            ng->lookback = pre > ng->lookback ? pre : ng->lookback;
            uint32_t len = fs != NULL ? factor_set_min_len(fs) : 0;
            ng->span_skip = len < ng->span_skip ? len : ng->span_skip;
        }
        for (uint32_t k = 0; k < ng->n_rules && ng->gated; k++)
            factor_set_span_bytes(c->prep[ng->rules[k]].factors, ng->span_skip, &ng->span);
        any |= ng->gated;
    }
    if (!any)
        return 0;
    struct group_out g;
    int rc = build_factor_dfa(c, &g);
    if (rc == 0) {
        rc = push_group(c, &g);
        if (rc != 0)
            dfa_finish(&g.dfa);
        return rc;
    }
    for (uint32_t j = 0; j < c->n_nfas; j++)
        c->nfas[j].gated = false;
    return rc == -E2BIG ? 0 : rc;
}

/*
 * Packs the bit-NFA rules into groups of at most BITNFA_GROUP_BITS positions
 * (one pass over the data each), bounded and unbounded rules apart and by
 * maxlen, as the DFA groups are. A rule's size is its positions built alone.
 */
static int group_nfa_rules(struct ctx *c)
{
    uint32_t n, m = 0;
    uint32_t *order = live_rules(c, cmp_prep, c->prep, &n);
    if (order == NULL)
        return -ENOMEM;
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        struct prepared *p = &c->prep[order[i]];
        if (!p->bitnfa)
            continue;
        struct bitnfa_group g = {0};
        struct parse_result tree;
        const struct node *root;
        rc = borrow_tree(c, p, &tree, &root);
        if (rc == 0)
            rc = bitnfa_build(&root, 1, BITNFA_MAX_BITS, &g, &p->bits);
        parse_result_finish(&tree);
        bitnfa_group_finish(&g);
        if (rc == -E2BIG) {
            rc = reject_too_wide(c, order[i], p->bits);
        } else if (rc == -EFBIG) {
            rc = reject_too_many_edges(c, order[i]);
        } else if (rc == -EINVAL) { /* no position: parse_check should make this impossible */
            c->prep[order[i]].group = UINT32_MAX;
            rc = add_reject(c, p->input, 0, "rule consumes no byte: it cannot be compiled");
        } else if (rc == 0) {
            order[m++] = order[i];
        }
    }
    if (rc == 0)
        rc = find_factors(c, order, m);
    uint32_t gated_bits = c->opt->gated_group_bits ? c->opt->gated_group_bits : BITNFA_GATED_BITS;
    gated_bits = gated_bits < BITNFA_GROUP_BITS ? gated_bits : BITNFA_GROUP_BITS;
    uint32_t begin = 0, fill = 0;
    struct byteset span = {{0}}, both; /* class 3: the union of the group's spans */
    uint32_t skip = 0;                 /* and the shortest of their factors */
    for (uint32_t i = 0; i <= m && rc == 0; i++) {
        bool end = i == m;
        bool kind_change = !end && i > begin &&
                           ((c->prep[order[i]].maxlen == CATALOG_UNBOUNDED) !=
                                (c->prep[order[i - 1]].maxlen == CATALOG_UNBOUNDED) ||
                            gate_class(&c->prep[order[i]]) != gate_class(&c->prep[order[i - 1]]));
        bool span_rule = !end && gate_class(&c->prep[order[i]]) == 3;
        uint32_t both_skip = 0;
        if (span_rule && i > begin && !kind_change) {
            /* a rule that would lower the chance of a break in the group's
             * runs by a fifth (make them a quarter longer) starts a group
             * of its own; the group skips its shortest factor's bytes
             * (add_factor_group) */
            both_skip = factor_set_min_len(c->prep[order[i]].factors);
            both_skip = both_skip < skip ? both_skip : skip;
            memset(&both, 0, sizeof(both));
            for (uint32_t k = begin; k <= i; k++)
                factor_set_span_bytes(c->prep[order[k]].factors, both_skip, &both);
            kind_change = factor_span_break_chance(&both) < factor_span_break_chance(&span) * 0.8;
        }
        uint32_t bits = end ? 0 : c->prep[order[i]].bits;
        uint32_t cap =
            begin < m && gate_class(&c->prep[order[begin]]) != 0 ? gated_bits : BITNFA_GROUP_BITS;
        if (i > begin && (end || kind_change || fill + bits > cap || i - begin == 64)) {
            rc = place_nfa(c, order + begin, i - begin);
            begin = i;
            fill = 0;
        }
        if (span_rule && begin == i) {
            skip = factor_set_min_len(c->prep[order[i]].factors);
            memset(&span, 0, sizeof(span));
            factor_set_span_bytes(c->prep[order[i]].factors, skip, &span);
        } else if (span_rule) {
            skip = both_skip;
            span = both;
        }
        fill += bits;
    }
    free(order);
    return rc;
}

/* ---- packing ---- */

static void put_fp(uint32_t *w, const uint8_t fp[CATALOG_FP_LEN])
{
    memcpy(w, fp, CATALOG_FP_LEN);
}

/* Appends an accept entry to the list w[begin..at), merging it with an
 * entry of the same report index (rules sharing an id); returns the new end. */
static uint32_t add_accept(uint32_t *w, uint32_t begin, uint32_t at, uint32_t report, uint32_t mask)
{
    for (uint32_t k = begin; k < at; k++)
        if (CAT_ACCEPT_RULE(w[k]) == report) {
            w[k] |= mask;
            return at;
        }
    w[at] = report << 5 | mask;
    return at + 1;
}

static uint64_t nfa_words(const struct bitnfa_group *g)
{
    return 256 + (uint64_t)g->n_classes * g->n_words + g->n_words +
           (uint64_t)(g->n_exc + g->n_acc) * CAT_X_WORDS + (uint64_t)g->n_ranges * 2;
}

static int cmp_acc_rule(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    if (x[CAT_A_RULE] != y[CAT_A_RULE])
        return x[CAT_A_RULE] < y[CAT_A_RULE] ? -1 : 1;
    return x[CAT_A_FIRST] < y[CAT_A_FIRST] ? -1 : x[CAT_A_FIRST] > y[CAT_A_FIRST];
}

static uint32_t put_words(uint32_t *w, uint32_t at, const uint32_t *src, uint64_t n)
{
    if (n)
        memcpy(w + at, src, n * sizeof(uint32_t));
    return at + (uint32_t)n;
}

/* Sort key of exception x: start edges first, then wide ones, then narrow
 * ones by first source word (catalog.h CAT_X_NARROW_SPAN), each class in
 * build order: the scanners test only the narrow ones near the live
 * state words. */
static uint64_t exc_key(const uint32_t *x, const uint32_t *ranges, uint32_t i)
{
    if (x[CAT_X_NSRC] == 0)
        return i;
    uint32_t lo = catalog_exc_lo(x, ranges), hi = catalog_exc_hi(x, ranges);
    if (hi - lo > CAT_X_NARROW_SPAN)
        return 1ull << 62 | i;
    return 2ull << 62 | (uint64_t)lo << 32 | i;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Writes the exceptions of `g` at w[at..] in exc_key order. */
static int put_exceptions(const struct bitnfa_group *g, uint32_t *w, uint32_t at)
{
    uint64_t *keys = malloc(((size_t)g->n_exc + 1) * sizeof(*keys));
    if (keys == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < g->n_exc; i++)
        keys[i] = exc_key(g->exc + (size_t)i * CAT_X_WORDS, g->ranges, i);
    qsort(keys, g->n_exc, sizeof(*keys), cmp_u64);
    for (uint32_t k = 0; k < g->n_exc; k++) {
        uint32_t i = (uint32_t)(keys[k] & 0xffffffffu);
        memcpy(w + at + (size_t)k * CAT_X_WORDS, g->exc + (size_t)i * CAT_X_WORDS,
               CAT_X_WORDS * sizeof(uint32_t));
    }
    free(keys);
    return 0;
}

/* Whether a group's entry points at its span set (CAT_N_SPAN): gated,
 * and some byte value cannot occur between a match's start and its
 * factor's end. */
static bool nfa_has_span(const struct nfa_group_out *go)
{
    const struct byteset *s = &go->span;
    return go->gated && (s->w[0] & s->w[1] & s->w[2] & s->w[3]) != UINT64_MAX;
}

/* Writes one bit-NFA group's tables at w[at..] and its table entry `e`;
 * accept entries name report indexes, sorted. Returns the new end. */
static uint32_t pack_nfa(const struct nfa_group_out *go, const uint32_t *report, uint32_t *w,
                         uint32_t at, uint32_t *e)
{
    const struct bitnfa_group *g = &go->g;
    e[CAT_N_NBITS] = g->n_bits;
    e[CAT_N_NWORDS] = g->n_words;
    e[CAT_N_NCLASSES] = g->n_classes;
    e[CAT_N_MAXLEN] = go->maxlen;
    e[CAT_N_NRULES] = go->n_rules;
    e[CAT_N_FLAGS] = (g->asserts ? CAT_GF_ASSERTS : 0) | (go->gated ? CAT_GF_GATED : 0) |
                     (go->gated && go->maxlen == CATALOG_UNBOUNDED ? CAT_GF_CONFIRM : 0);
    /* gated groups: the most bytes from a match's start to the end of its
     * factor (bounded groups too, since compiler version 7: their walks
     * then start only there, docs/engine.md) */
    e[CAT_N_LOOKBACK] = go->gated ? go->lookback : 0;
    e[CAT_N_SPAN] = 0;
    if (nfa_has_span(go)) { /* compiler version 14 */
        e[CAT_N_SPAN] = at;
        for (int k = 0; k < 4; k++) {
            w[at++] = (uint32_t)go->span.w[k];
            w[at++] = (uint32_t)(go->span.w[k] >> 32);
        }
        w[at++] = go->span_skip;
    }
    e[CAT_N_NEXC] = g->n_exc;
    e[CAT_N_NACC] = g->n_acc;
    e[CAT_N_NRANGES] = g->n_ranges;
    e[CAT_N_CLASSMAP] = at;
    at = put_words(w, at, g->classmap, 256);
    e[CAT_N_REACH] = at;
    at = put_words(w, at, g->reach, (uint64_t)g->n_classes * g->n_words);
    e[CAT_N_SHIFT] = at;
    at = put_words(w, at, g->shift, g->n_words);
    e[CAT_N_EXC] = at;
    if (put_exceptions(g, w, at) < 0)
        return UINT32_MAX;
    at += g->n_exc * CAT_X_WORDS;
    e[CAT_N_ACC] = at;
    uint32_t *acc = w + at;
    at = put_words(w, at, g->acc, (uint64_t)g->n_acc * CAT_X_WORDS);
    for (uint32_t k = 0; k < g->n_acc; k++)
        acc[k * CAT_X_WORDS + CAT_A_RULE] = report[go->rules[acc[k * CAT_X_WORDS + CAT_A_RULE]]];
    if (g->n_acc > 1)
        qsort(acc, g->n_acc, CAT_X_WORDS * sizeof(uint32_t), cmp_acc_rule);
    e[CAT_N_RANGES] = at;
    return put_words(w, at, g->ranges, (uint64_t)g->n_ranges * 2);
}

/*
 * Backs a large new block (calloc's zero pages, mapped on first write) with
 * one madvise(MADV_POPULATE_WRITE) instead of a page fault per 4 KiB page:
 * every word of a packed catalog is written, and those faults were a tenth
 * of a literal set's compile on the development machine (perf, dict-15's
 * 4.3 MB catalog; session 23). Best effort: a kernel without it (before
 * 5.14) faults as before.
 */
static void populate(void *p, size_t n)
{
    const uintptr_t page = 4096;
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    if (n >= (256u << 10) && hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
}

static int pack(struct ctx *c, uint32_t *cat_index, struct catalog **out, struct vks_error *err)
{
    /* catalog rule order = input order of the rules that made it into a group */
    uint32_t nr = 0;
    uint64_t strbytes = 0;
    for (uint32_t i = 0; i < c->n_prep; i++) {
        if (c->prep[i].group == UINT32_MAX)
            continue;
        cat_index[i] = nr++;
        strbytes += strlen(c->src[c->prep[i].input].id) + c->prep[i].canon_len;
    }
    uint32_t *report = malloc((c->n_prep ? c->n_prep : 1) * sizeof(*report));
    if (report == NULL || report_indexes(c, cat_index, report) != 0) {
        free(report);
        return vks_error_set(err, -ENOMEM, "out of memory packing the catalog");
    }
    uint64_t words = CAT_HEADER_WORDS + (uint64_t)c->n_groups * CAT_GROUP_WORDS +
                     (uint64_t)c->n_nfas * CAT_NFA_WORDS + (uint64_t)nr * CAT_RULE_WORDS +
                     (strbytes + 3) / 4;
    for (uint32_t g = 0; g < c->n_nfas; g++)
        words += nfa_words(&c->nfas[g].g) + (nfa_has_span(&c->nfas[g]) ? 9 : 0);
    for (uint32_t g = 0; g < c->n_groups; g++) {
        const struct dfa *d = &c->groups[g].dfa;
        words += 256 + (uint64_t)d->n_states * d->n_classes + (d->n_states - d->first_accept + 1) +
                 d->n_acc;
    }
    if (words > UINT32_MAX) {
        free(report);
        return vks_error_set(err, -E2BIG,
                             "catalog would be %llu bytes, over the 16 GiB format "
                             "limit: split the rule set",
                             (unsigned long long)words * 4);
    }
    uint32_t *w = calloc(words, sizeof(*w));
    if (w == NULL) {
        free(report);
        return vks_error_set(err, -ENOMEM, "out of memory packing a %llu-byte catalog",
                             (unsigned long long)words * 4);
    }
    populate(w, words * sizeof(*w));
    uint32_t maxstates = 0, nacc = 0;
    w[CAT_H_MAGIC] = CATALOG_MAGIC;
    w[CAT_H_VERSION] = CATALOG_VERSION;
    w[CAT_H_COMPILER] = VKS_COMPILER_VERSION;
    w[CAT_H_WORDS] = (uint32_t)words;
    w[CAT_H_NGROUPS] = c->n_groups;
    w[CAT_H_NRULES] = nr;
    w[CAT_H_GROUPS] = CAT_HEADER_WORDS;
    w[CAT_H_NNFAS] = c->n_nfas;
    w[CAT_H_NFAS] = CAT_HEADER_WORDS + c->n_groups * CAT_GROUP_WORDS;
    w[CAT_H_RULES] = w[CAT_H_NFAS] + c->n_nfas * CAT_NFA_WORDS;
    uint32_t at = w[CAT_H_RULES] + nr * CAT_RULE_WORDS;
    for (uint32_t g = 0; g < c->n_nfas; g++) {
        at = pack_nfa(&c->nfas[g], report, w, at, w + w[CAT_H_NFAS] + g * CAT_NFA_WORDS);
        if (at == UINT32_MAX) {
            free(report);
            free(w);
            return vks_error_set(err, -ENOMEM, "out of memory packing the catalog");
        }
        if (c->nfas[g].g.n_bits > w[CAT_H_MAXBITS])
            w[CAT_H_MAXBITS] = c->nfas[g].g.n_bits;
    }
    for (uint32_t g = 0; g < c->n_groups; g++) {
        const struct group_out *go = &c->groups[g];
        const struct dfa *d = &go->dfa;
        uint32_t *e = w + CAT_HEADER_WORDS + g * CAT_GROUP_WORDS;
        e[CAT_G_NSTATES] = d->n_states;
        e[CAT_G_NCLASSES] = d->n_classes;
        e[CAT_G_FIRST_ACCEPT] = d->first_accept;
        for (int p = 0; p < 4; p++)
            e[CAT_G_START_BOS + p] = d->start[p];
        e[CAT_G_MAXLEN] = go->maxlen;
        e[CAT_G_NRULES] = go->n_rules;
        e[CAT_G_FLAGS] = go->factor    ? CAT_GF_FACTOR
                         : go->literal ? CAT_GF_LITERAL
                         : go->asserts ? CAT_GF_ASSERTS
                                       : 0;
        e[CAT_G_CLASSMAP] = at;
        memcpy(w + at, d->classmap, 256 * sizeof(uint32_t));
        at += 256;
        e[CAT_G_TRANS] = at;
        memcpy(w + at, d->trans, (size_t)d->n_states * d->n_classes * sizeof(uint32_t));
        at += d->n_states * d->n_classes;
        e[CAT_G_ACCIDX] = at;
        at += d->n_states - d->first_accept + 1;
        e[CAT_G_ACCEPTS] = at;
        uint32_t *idx = w + e[CAT_G_ACCIDX];
        for (uint32_t s = d->first_accept; s < d->n_states; s++) {
            uint32_t begin = at;
            idx[s - d->first_accept] = at - e[CAT_G_ACCEPTS];
            for (uint32_t j = d->acc_first[s]; j < d->acc_first[s + 1]; j++)
                at = go->factor
                         ? add_accept(w, begin, at, CAT_ACCEPT_RULE(d->acc[j]), 0)
                         : add_accept(w, begin, at, report[go->rules[CAT_ACCEPT_RULE(d->acc[j])]],
                                      CAT_ACCEPT_MASK(d->acc[j]));
        }
        idx[d->n_states - d->first_accept] = at - e[CAT_G_ACCEPTS];
        maxstates = d->n_states > maxstates ? d->n_states : maxstates;
        nacc += at - e[CAT_G_ACCEPTS];
    }
    w[CAT_H_STRINGS] = at;
    w[CAT_H_STRBYTES] = (uint32_t)strbytes;
    w[CAT_H_NACCEPTS] = nacc;
    w[CAT_H_MAXSTATES] = maxstates;
    char *str = (char *)(w + at);
    uint32_t so = 0;
    for (uint32_t i = 0; i < c->n_prep; i++) {
        const struct prepared *p = &c->prep[i];
        if (p->group == UINT32_MAX)
            continue;
        const struct rule_src *r = &c->src[p->input];
        uint32_t *e = w + w[CAT_H_RULES] + cat_index[i] * CAT_RULE_WORDS;
        size_t idlen = strlen(r->id);
        e[CAT_R_ID] = so;
        e[CAT_R_IDLEN] = (uint32_t)idlen;
        memcpy(str + so, r->id, idlen);
        so += (uint32_t)idlen;
        e[CAT_R_SRC] = so;
        e[CAT_R_SRCLEN] = (uint32_t)p->canon_len;
        memcpy(str + so, p->canon, p->canon_len);
        so += (uint32_t)p->canon_len;
        e[CAT_R_KIND] = r->kind;
        e[CAT_R_FLAGS] = r->flags;
        e[CAT_R_GROUP] = p->group;
        e[CAT_R_MAXLEN] = p->maxlen;
        uint8_t fp[CATALOG_FP_LEN];
        fingerprint_canon(r->kind, r->flags, p->canon, p->canon_len, fp);
        put_fp(e + CAT_R_FP, fp);
    }
    free(report);
    /* merged accept entries leave the tail unused: trim it */
    uint32_t used = w[CAT_H_STRINGS] + (uint32_t)((strbytes + 3) / 4);
    (void)c;
    w[CAT_H_WORDS] = used;
    return catalog_adopt(w, used, out, err);
}

/* ---- the front door ---- */

static void ctx_free(struct ctx *c)
{
    for (uint32_t i = 0; i < c->n_prep; i++) {
        parse_result_finish(&c->prep[i].tree);
        free(c->prep[i].str);
        free(c->prep[i].canon);
        free(c->prep[i].factors);
    }
    free(c->prep);
    for (uint32_t g = 0; g < c->n_groups; g++) {
        dfa_finish(&c->groups[g].dfa);
        free(c->groups[g].rules);
    }
    free(c->groups);
    for (uint32_t g = 0; g < c->n_nfas; g++) {
        bitnfa_group_finish(&c->nfas[g].g);
        free(c->nfas[g].rules);
    }
    free(c->nfas);
    free(c->rejects);
}

static int cmp_reject(const void *a, const void *b)
{
    const struct rule_reject *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index;
}

int rules_compile(const struct rule_src *rules, size_t n, const struct rules_options *opt,
                  struct rules_result *res, struct vks_error *err)
{
    static const struct rules_options defaults = {0};
    uint64_t t0 = now_ns();
    memset(res, 0, sizeof(*res));
    if (opt == NULL)
        opt = &defaults;
    uint32_t max_rules = opt->max_rules ? opt->max_rules : RULES_DEFAULT_MAXRULE;
    if (n > max_rules)
        return vks_error_set(err, -E2BIG,
                             "%zu rules, over the limit of %u: split the rule set "
                             "or raise max_rules",
                             n, max_rules);
    if (opt->max_states != 0 && opt->max_states < 16)
        return vks_error_set(err, -EINVAL, "max_states %u is too small: use at least 16",
                             opt->max_states);
    if (sodium_init() < 0)
        return vks_error_set(err, -EIO, "libsodium failed to initialise");
    struct ctx c = {.src = rules, .opt = opt};
    c.prep = calloc(n ? n : 1, sizeof(*c.prep));
    uint32_t *cat_index = malloc((n ? n : 1) * sizeof(*cat_index));
    res->rule_index = malloc((n ? n : 1) * sizeof(*res->rule_index));
    int rc = c.prep && cat_index && res->rule_index ? 0 : -ENOMEM;
    /* Every tree is freed as soon as its rule is prepared, and parsed again
     * where it is needed (borrow_tree), so a compile never holds its trees
     * at once (20,000 binary strings: 110 MB of them; regex-500-secrets:
     * 1.4 MB, more than its catalog). A string sequence keeps its bytes
     * (release_tree), except while every rule so far is a plain string: the
     * set may become one literal group, which needs neither. The first rule
     * that is not plain, or a set too small for the literal group, parses
     * the strings again for their bytes (restore_strings). */
    bool may_literal = opt->literal_group >= 0 && !opt->force_bitnfa;
    for (size_t i = 0; i < n && rc == 0; i++) {
        uint32_t before = c.n_prep;
        rc = prepare_rule(&c, (uint32_t)i);
        if (rc != 0 || c.n_prep == before)
            continue;
        struct prepared *p = &c.prep[before];
        if (!may_literal || !maybe_literal(&c, p)) {
            if (may_literal)
                rc = restore_strings(&c);
            may_literal = false;
            if (rc == 0 && !p->bitnfa)
                rc = release_tree(p);
        }
        parse_result_finish(&p->tree);
        p->root = NULL;
    }
    bool literal = false;
    if (rc == 0)
        rc = literal_group(&c, &literal);
    if (rc == 0 && !literal && may_literal)
        rc = restore_strings(&c);
    if (rc == 0 && !literal)
        rc = choose_gated(&c);
    if (rc == 0 && !literal)
        rc = prebuild(&c);
    if (rc == 0 && !literal)
        rc = group_rules(&c);
    if (rc == 0 && !literal)
        rc = group_nfa_rules(&c);
    if (rc == 0 && !literal)
        rc = add_factor_group(&c);
    /* group numbers, now that groups are final: DFA groups, then bit-NFAs */
    for (uint32_t g = 0; g < c.n_groups && rc == 0; g++)
        for (uint32_t k = 0; !c.groups[g].factor && k < c.groups[g].n_rules; k++)
            c.prep[c.groups[g].rules[k]].group = g;
    for (uint32_t g = 0; g < c.n_nfas && rc == 0; g++)
        for (uint32_t k = 0; k < c.nfas[g].n_rules; k++)
            c.prep[c.nfas[g].rules[k]].group = c.n_groups + g;
    if (rc == 0)
        rc = pack(&c, cat_index, &res->catalog, err);
    else if (rc == -ENOMEM)
        vks_error_set(err, rc, "out of memory compiling %zu rules", n);
    else if (rc == -EIO) /* borrow_tree: not expected */
        vks_error_set(err, rc, "internal error: a rule parsed differently the second time");
    if (rc == 0) {
        for (size_t i = 0; i < n; i++)
            res->rule_index[i] = UINT32_MAX;
        for (uint32_t i = 0; i < c.n_prep; i++)
            if (c.prep[i].group != UINT32_MAX)
                res->rule_index[c.prep[i].input] = cat_index[i];
        if (c.n_rejects > 1)
            qsort(c.rejects, c.n_rejects, sizeof(*c.rejects), cmp_reject);
        res->rejects = c.rejects;
        res->n_rejects = c.n_rejects;
        c.rejects = NULL;
    }
    free(cat_index);
    ctx_free(&c);
    if (rc != 0) {
        free(res->rule_index);
        memset(res, 0, sizeof(*res));
        return rc;
    }
    res->compile_ns = now_ns() - t0;
    return 0;
}

void rules_result_finish(struct rules_result *res)
{
    if (res == NULL)
        return;
    catalog_destroy(res->catalog);
    free(res->rejects);
    free(res->rule_index);
    memset(res, 0, sizeof(*res));
}
