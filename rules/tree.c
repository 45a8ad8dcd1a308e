/*
 * Checks and measures on a parsed tree: empty matches, embedded end
 * anchors, expanded size, prefix stripping and the longest match. See
 * parse.h for the contracts.
 */
#include <errno.h>
#include <stdio.h>

#include "parse.h"

/* Can `n` match the empty string? `free_only`: without passing an assertion. */
static bool nullable(const struct node *n, bool free_only)
{
    switch (n->type) {
    case N_SET:
        return false;
    case N_ASSERT:
        return !free_only;
    case N_REPEAT:
        return n->u.rep.min == 0 || nullable(n->u.rep.kid, free_only);
    case N_CAT:
        for (uint32_t k = 0; k < n->u.list.n; k++)
            if (!nullable(n->u.list.kids[k], free_only))
                return false;
        return true;
    case N_ALT:
        for (uint32_t k = 0; k < n->u.list.n; k++)
            if (nullable(n->u.list.kids[k], free_only))
                return true;
        return false;
    }
    return false;
}

/*
 * The contexts an empty match can stand in: the byte before (buffer start,
 * '\n', a word byte, another byte) times the byte after (buffer end, a
 * final '\n', another '\n', a word byte, another byte), 20 bits.
 */
enum { CTX_PREV = 4, CTX_NEXT = 5, CTX_ALL = (1u << (CTX_PREV * CTX_NEXT)) - 1 };
enum { P_BOS, P_NL, P_WORD, P_OTHER };
enum { X_EOD, X_NLFINAL, X_NL, X_WORD, X_OTHER };

static bool ctx_holds(enum assert_kind k, unsigned prev, unsigned next)
{
    switch (k) {
    case A_BOS:
        return prev == P_BOS;
    case A_BOL:
        return prev == P_BOS || prev == P_NL;
    case A_EOD:
        return next == X_EOD;
    case A_DOLLAR:
        return next == X_EOD || next == X_NLFINAL;
    case A_EOL:
        return next == X_EOD || next == X_NLFINAL || next == X_NL;
    case A_WORDB:
        return (prev == P_WORD) != (next == X_WORD);
    case A_NOTWORDB:
        return (prev == P_WORD) == (next == X_WORD);
    }
    return true;
}

static uint32_t assert_contexts(enum assert_kind k)
{
    uint32_t m = 0;
    for (unsigned prev = 0; prev < CTX_PREV; prev++)
        for (unsigned next = 0; next < CTX_NEXT; next++)
            if (ctx_holds(k, prev, next))
                m |= 1u << (prev * CTX_NEXT + next);
    return m;
}

/*
 * The contexts in which `n` matches the empty string: the assertions on
 * one empty path must all hold at one offset, so `\b[A-Z]?\B` (both \b
 * and \B on its empty path) cannot match empty, as Hyperscan finds too.
 */
static uint32_t empty_contexts(const struct node *n)
{
    uint32_t m = 0;
    switch (n->type) {
    case N_SET:
        return 0;
    case N_ASSERT:
        return assert_contexts(n->u.as);
    case N_REPEAT:
        return n->u.rep.min == 0 ? CTX_ALL : empty_contexts(n->u.rep.kid);
    case N_CAT:
        m = CTX_ALL;
        for (uint32_t k = 0; k < n->u.list.n && m != 0; k++)
            m &= empty_contexts(n->u.list.kids[k]);
        return m;
    case N_ALT:
        for (uint32_t k = 0; k < n->u.list.n && m != CTX_ALL; k++)
            m |= empty_contexts(n->u.list.kids[k]);
        return m;
    }
    return m;
}

/* The longest match of what parse_strip_prefix leaves of `root`: 0 when
 * only assertions would remain (`[a-z]?\b\B`, `\b\B`), a rule with no
 * byte to match. */
static uint32_t stripped_maxlen(const struct node *root)
{
    if (root->type != N_CAT)
        return parse_maxlen(root);
    uint32_t k = 0, len = 0;
    while (k + 1 < root->u.list.n && nullable(root->u.list.kids[k], true))
        k++;
    for (; k < root->u.list.n && len == 0; k++)
        len = parse_maxlen(root->u.list.kids[k]);
    return len;
}

static bool is_end_anchor(const struct node *n)
{
    return n->type == N_ASSERT && (n->u.as == A_EOD || n->u.as == A_DOLLAR);
}

/*
 * Walks the tree with `follow`: whether a byte may be consumed after the
 * current node before the pattern ends. An end anchor ($ without m, \Z,
 * \z) with bytes after it could only match text Hyperscan refuses too.
 */
static const struct node *embedded_end(const struct node *n, bool follow)
{
    switch (n->type) {
    case N_SET:
        return NULL;
    case N_ASSERT:
        return follow && is_end_anchor(n) ? n : NULL;
    case N_REPEAT: {
        /* A repeated node may be followed by itself, if it consumes bytes. */
        bool self =
            (n->u.rep.max == REPEAT_INF || n->u.rep.max > 1) && parse_maxlen(n->u.rep.kid) > 0;
        return embedded_end(n->u.rep.kid, follow || self);
    }
    case N_ALT:
        for (uint32_t k = 0; k < n->u.list.n; k++) {
            const struct node *e = embedded_end(n->u.list.kids[k], follow);
            if (e)
                return e;
        }
        return NULL;
    case N_CAT:
        for (uint32_t k = 0; k < n->u.list.n; k++) {
            /* any later element that can consume a byte follows it */
            bool f = follow;
            for (uint32_t j = k + 1; j < n->u.list.n && !f; j++)
                f = parse_maxlen(n->u.list.kids[j]) > 0;
            const struct node *e = embedded_end(n->u.list.kids[k], f);
            if (e)
                return e;
        }
        return NULL;
    }
    return NULL;
}

/* Number of NFA positions the tree expands to (saturating). */
uint64_t parse_positions(const struct node *n)
{
    uint64_t t = 0;
    switch (n->type) {
    case N_SET:
    case N_ASSERT:
        return 1;
    case N_REPEAT: {
        uint64_t k = parse_positions(n->u.rep.kid);
        uint64_t c = n->u.rep.max == REPEAT_INF ? (uint64_t)n->u.rep.min + 1 : n->u.rep.max;
        return k > ((uint64_t)1 << 40) ? k : k * (c ? c : 1) + 1; /* saturates */
    }
    case N_CAT:
    case N_ALT:
        for (uint32_t k = 0; k < n->u.list.n; k++)
            t += parse_positions(n->u.list.kids[k]);
        return t > ((uint64_t)1 << 40) ? t : t + 1;
    }
    return t;
}

int parse_check(const struct node *root, uint32_t max_positions, uint32_t *pos, char *msg,
                size_t msgsz)
{
    if (empty_contexts(root) != 0 || stripped_maxlen(root) == 0) {
        *pos = 0;
        snprintf(msg, msgsz,
                 "pattern can match the empty string, which would match at every "
                 "offset: make some part of it consume at least one byte");
        return -EINVAL;
    }
    const struct node *e = embedded_end(root, false);
    if (e != NULL) {
        *pos = e->pos;
        snprintf(msg, msgsz,
                 "end anchor ($, \\Z or \\z) is followed by more pattern: move it to "
                 "the end, or use (?m) for line ends");
        return -EINVAL;
    }
    uint64_t np = parse_positions(root);
    if (np > max_positions) {
        *pos = 0;
        snprintf(msg, msgsz,
                 "pattern expands to %llu positions, over the limit of %u: lower "
                 "the repeat counts",
                 (unsigned long long)np, max_positions);
        return -EINVAL;
    }
    return 0;
}

/*
 * What node n may be cut to where it starts the pattern of an unanchored
 * search, one that reports ends only: anything may stand before it, so
 * for any X and any rest R, text ending in X R ends in X' R too and back.
 * - A part that can match empty without an assertion is dropped:
 *   `.*R` ends where R ends.
 * - A repeat of at least m copies keeps m: a match of X{k} R (k > m)
 *   ends with one of X{m} R. With m = 1 its one copy is cut in turn:
 *   `(\w+\s)+baker` becomes `\w\sbaker`.
 * - A concatenation cuts its first part, an alternation each branch.
 * An assertion stops the cut: `\b\w+x` needs the run's first byte.
 * Edits the tree in place and returns what stands for n; depth bounds
 * the recursion on nested groups.
 */
static struct node *strip_lead(struct node *n, unsigned depth)
{
    if (depth > 64)
        return n;
    switch (n->type) {
    case N_SET:
    case N_ASSERT:
        return n;
    case N_REPEAT:
        if (n->u.rep.min == 0)
            return n; /* only where nothing may drop it (a branch that matches empty) */
        if (n->u.rep.min == 1)
            return strip_lead(n->u.rep.kid, depth + 1);
        n->u.rep.max = n->u.rep.min;
        return n;
    case N_CAT: {
        if (n->u.list.n == 0) /* `()`: an empty branch */
            return n;
        uint32_t k = 0;
        while (k + 1 < n->u.list.n && nullable(n->u.list.kids[k], true))
            k++;
        n->u.list.kids += k;
        n->u.list.n -= k;
        n->u.list.kids[0] = strip_lead(n->u.list.kids[0], depth + 1);
        return n->u.list.n == 1 ? n->u.list.kids[0] : n;
    }
    case N_ALT:
        for (uint32_t k = 0; k < n->u.list.n; k++)
            n->u.list.kids[k] = strip_lead(n->u.list.kids[k], depth + 1);
        return n;
    }
    return n;
}

struct node *parse_strip_prefix(struct node *root)
{
    return strip_lead(root, 0);
}

static uint32_t sat_add(uint32_t a, uint32_t b)
{
    uint64_t s = (uint64_t)a + b;
    return s >= REPEAT_INF ? REPEAT_INF : (uint32_t)s;
}

uint32_t parse_maxlen(const struct node *n)
{
    uint32_t m = 0;
    switch (n->type) {
    case N_SET:
        return 1;
    case N_ASSERT:
        return 0;
    case N_REPEAT: {
        uint32_t k = parse_maxlen(n->u.rep.kid);
        if (k == 0)
            return 0;
        if (n->u.rep.max == REPEAT_INF || k == REPEAT_INF)
            return REPEAT_INF;
        uint64_t t = (uint64_t)k * n->u.rep.max;
        return t >= REPEAT_INF ? REPEAT_INF : (uint32_t)t;
    }
    case N_CAT:
        for (uint32_t k = 0; k < n->u.list.n; k++)
            m = sat_add(m, parse_maxlen(n->u.list.kids[k]));
        return m;
    case N_ALT:
        for (uint32_t k = 0; k < n->u.list.n; k++) {
            uint32_t x = parse_maxlen(n->u.list.kids[k]);
            m = x > m ? x : m;
        }
        return m;
    }
    return m;
}
