/*
 * Per-catalog plans of the CPU engine (cpuplan.h): which groups the
 * literal matcher serves, and the strings it looks for. Worked out from
 * each rule's parsed source, so the catalog format is unchanged.
 */
#include "cpuplan.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpupair.h"
#include "cpuscan.h"
#include "dfa.h"
#include "nfa.h"
#include "parse.h"
#include "rules.h"

/* Factor sets: at most FS_MAX strings of at most FS_LEN bytes. */
#define FS_MAX 16u
#define FS_LEN 24u
/* Shortest string worth a literal pass (shorter: the automaton walk). */
#define MIN_LIT   3u
#define MAX_DEPTH 64

struct fstr {
    uint8_t len;
    uint8_t b[FS_LEN], m[FS_LEN];
};

struct fset {
    uint32_t n;
    struct fstr v[FS_MAX];
};

/* A byte set as folded characters (a lowercase letter with its uppercase
 * counts once, mask 0x20). Returns how many, or max + 1 when more. */
static uint32_t set_chars(const struct byteset *s, uint8_t *b, uint8_t *m, uint32_t max)
{
    uint32_t n = 0;
    for (unsigned w = 0; w < 4; w++) { /* the members only: sets are mostly one or two bytes */
        for (uint64_t bits = s->w[w]; bits != 0; bits &= bits - 1) {
            unsigned c = w * 64 + (unsigned)__builtin_ctzll(bits);
            if (c >= 'A' && c <= 'Z' && byteset_has(s, c | 0x20))
                continue; /* counted with its lowercase */
            if (n == max)
                return max + 1;
            bool fold = c >= 'a' && c <= 'z' && byteset_has(s, c & ~0x20u);
            b[n] = (uint8_t)c;
            m[n] = fold ? 0x20 : 0;
            n++;
        }
    }
    return n;
}

static bool fs_product(const struct fset *a, const struct fset *b, struct fset *out)
{
    if (a->n * b->n > FS_MAX)
        return false;
    struct fset r = {0};
    for (uint32_t i = 0; i < a->n; i++) {
        for (uint32_t j = 0; j < b->n; j++) {
            const struct fstr *x = &a->v[i], *y = &b->v[j];
            if (x->len + y->len > FS_LEN)
                return false;
            struct fstr *z = &r.v[r.n++];
            z->len = (uint8_t)(x->len + y->len);
            memcpy(z->b, x->b, x->len);
            memcpy(z->m, x->m, x->len);
            memcpy(z->b + x->len, y->b, y->len);
            memcpy(z->m + x->len, y->m, y->len);
        }
    }
    *out = r;
    return true;
}

static bool fs_union(struct fset *a, const struct fset *b)
{
    if (a->n + b->n > FS_MAX)
        return false;
    memcpy(&a->v[a->n], b->v, b->n * sizeof(*b->v));
    a->n += b->n;
    return true;
}

static void fs_empty_string(struct fset *s)
{
    s->n = 1;
    s->v[0].len = 0;
}

/* The strings `n` matches exactly, when they are few and short. */
static bool exact_of(const struct node *n, int depth, struct fset *out)
{
    if (depth > MAX_DEPTH)
        return false;
    switch (n->type) {
    case N_SET: {
        uint8_t b[FS_MAX], m[FS_MAX];
        uint32_t k = set_chars(&n->u.set, b, m, FS_MAX);
        if (k > FS_MAX || k == 0)
            return false;
        out->n = k;
        for (uint32_t i = 0; i < k; i++)
            out->v[i] = (struct fstr){.len = 1, .b = {b[i]}, .m = {m[i]}};
        return true;
    }
    case N_ASSERT:
        fs_empty_string(out); /* no byte: the strings around it stay adjacent */
        return true;
    case N_CAT: {
        struct fset *t = malloc(sizeof(*t));
        bool ok = t != NULL;
        fs_empty_string(out);
        for (uint32_t i = 0; ok && i < n->u.list.n; i++)
            ok = exact_of(n->u.list.kids[i], depth + 1, t) && fs_product(out, t, out);
        free(t);
        return ok;
    }
    case N_ALT: {
        struct fset *t = malloc(sizeof(*t));
        bool ok = t != NULL;
        out->n = 0;
        for (uint32_t i = 0; ok && i < n->u.list.n; i++)
            ok = exact_of(n->u.list.kids[i], depth + 1, t) && fs_union(out, t);
        free(t);
        return ok;
    }
    case N_REPEAT: {
        uint32_t lo = n->u.rep.min, hi = n->u.rep.max;
        if (hi > FS_LEN || !(lo == hi || (lo == 0 && hi == 1)))
            return false;
        struct fset *t = malloc(sizeof(*t));
        bool ok = t != NULL && exact_of(n->u.rep.kid, depth + 1, t);
        fs_empty_string(out);
        for (uint32_t i = 0; ok && lo == hi && i < lo; i++)
            ok = fs_product(out, t, out);
        if (ok && lo != hi)
            ok = fs_union(out, t); /* x? : "" or x */
        free(t);
        return ok;
    }
    }
    return false;
}

/* A string's length as a filter sees it: a pair of bytes common in text
 * or binaries (cpupair_rare) counts as one byte, since its ends would be
 * everywhere. */
static uint32_t fs_len(const struct fstr *s)
{
    return s->len == 2 && !cpupair_rare(s->b[0], s->b[1]) ? 1 : s->len;
}

/* The shortest string's length (fs_len) of a set. */
static uint32_t fs_min(const struct fset *s)
{
    uint32_t min = FS_LEN;
    for (uint32_t i = 0; i < s->n; i++)
        min = fs_len(&s->v[i]) < min ? fs_len(&s->v[i]) : min;
    return min;
}

/* The shortest string's length in bytes. */
static uint32_t fs_raw_min(const struct fset *s)
{
    uint32_t min = FS_LEN;
    for (uint32_t i = 0; i < s->n; i++)
        min = s->v[i].len < min ? s->v[i].len : min;
    return min;
}

/* How selective a set is: its shortest string counts most. */
static int fs_score(const struct fset *s)
{
    uint32_t lg = 0;
    while ((1u << lg) < s->n)
        lg++;
    return (int)(fs_min(s) * 5) - (int)lg;
}

/* A lowercase letter, or a caseless one (sets keep those lowercase). */
static bool is_lower(uint8_t c)
{
    return c >= 'a' && c <= 'z';
}

/* Whether some string of `s` is a pair of lowercase (or caseless)
 * letters: as common as text itself. */
static bool fs_lower_pair(const struct fset *s)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (s->v[i].len == 2 && is_lower(s->v[i].b[0]) && is_lower(s->v[i].b[1]))
            return true;
    return false;
}

/* Whether a rule's factor set is worth a filter pass: strings of MIN_LIT
 * bytes or more, at most 16 of them (the literal matcher), or at most
 * four when some are pairs of bytes (the pair matcher, cpupair.h: binary
 * signatures' two exact bytes around a gap). A pair common in text is
 * taken too when the rule has nothing better (`=g`, `3b`, `pK`): its
 * windows cost no more than the walks of every byte they replace, and
 * past the candidate cap its group is walked in full (cpuscan.c
 * shed_dense). Not a pair of lowercase (or caseless) letters, as most of
 * any text is (`ey`, one of gitleaks' keywords: its windows took that set
 * from 0.6 to 0.04 GB/s). `strict` (a forward-confirmed catalog, below):
 * no 3-byte strings, which would make the literal matcher's confirmation
 * key 3 bytes for all its strings. */
static bool fs_worth(const struct fset *s, bool strict)
{
    if (strict && fs_min(s) == MIN_LIT)
        return false;
    if (fs_min(s) >= MIN_LIT)
        return fs_score(s) >= (int)(MIN_LIT * 5) - 4;
    return !fs_lower_pair(s) && fs_raw_min(s) == 2 && s->n <= 4;
}

static bool fs_nonempty(const struct fset *s)
{
    if (s->n == 0)
        return false;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->v[i].len == 0)
            return false;
    return true;
}

/* Keeps `s` in `best` when it is better. `strict` (fs_worth): no set with
 * a 3-byte string, so that a rule whose best strings are 3 bytes
 * (`\x20\x9c\x2b.{3,6}\x8c\x35`) keeps the next best (its pair) rather
 * than no factor at all, which would walk its whole group in full. */
static void consider(const struct fset *s, bool strict, struct fset *best, bool *have)
{
    if (!fs_nonempty(s) || (strict && fs_min(s) == MIN_LIT))
        return;
    /* equal scores: the longer strings (a common pair over one byte), then
     * the set without a pair of lowercase letters (fs_worth takes none) */
    int ds = fs_score(s) - (*have ? fs_score(best) : 0);
    int dr = *have ? (int)fs_raw_min(s) - (int)fs_raw_min(best) : 0;
    if (!*have || ds > 0 || (ds == 0 && dr > 0) ||
        (ds == 0 && dr == 0 && !fs_lower_pair(s) && fs_lower_pair(best))) {
        *best = *s;
        *have = true;
    }
}

struct fwork {
    struct fset e, acc, f;
};

/* Calls take(ctx, set, i, j) for each run kids[i..j] of adjacent exact
 * children of a concatenation, with the set of strings it matches. */
typedef void run_fn(void *ctx, const struct fset *s, uint32_t i, uint32_t j);

static void cat_runs(const struct node *n, int depth, struct fwork *w, run_fn *take, void *ctx)
{
    uint32_t k = n->u.list.n;
    for (uint32_t i = 0; i < k; i++) {
        fs_empty_string(&w->acc);
        for (uint32_t j = i; j < k; j++) {
            if (!exact_of(n->u.list.kids[j], depth + 1, &w->e) ||
                !fs_product(&w->acc, &w->e, &w->acc))
                break;
            take(ctx, &w->acc, i, j);
        }
    }
}

/* The best set so far (cat_runs' callback for factor_of). */
struct pick {
    bool strict, have;
    struct fset *best;
};

static void pick_run(void *ctx, const struct fset *s, uint32_t i, uint32_t j)
{
    struct pick *pk = ctx;
    (void)i, (void)j;
    consider(s, pk->strict, pk->best, &pk->have);
}

/* A set of strings one of which every match of `n` contains. */
static bool factor_of(const struct node *n, int depth, bool strict, struct fset *best)
{
    if (depth > MAX_DEPTH)
        return false;
    struct fwork *w = malloc(sizeof(*w));
    if (w == NULL)
        return false;
    bool have = false;
    if (exact_of(n, depth, &w->e))
        consider(&w->e, strict, best, &have);
    switch (n->type) {
    case N_CAT: {
        struct pick pk = {strict, have, best};
        cat_runs(n, depth, w, pick_run, &pk);
        have = pk.have;
        for (uint32_t i = 0; i < n->u.list.n; i++)
            if (factor_of(n->u.list.kids[i], depth + 1, strict, &w->f))
                consider(&w->f, strict, best, &have);
        break;
    }
    case N_ALT: {
        bool ok = true;
        w->acc.n = 0;
        for (uint32_t i = 0; ok && i < n->u.list.n; i++)
            ok = factor_of(n->u.list.kids[i], depth + 1, strict, &w->f) && fs_union(&w->acc, &w->f);
        if (ok)
            consider(&w->acc, strict, best, &have);
        break;
    }
    case N_REPEAT:
        if (n->u.rep.min >= 1 && factor_of(n->u.rep.kid, depth + 1, strict, &w->f))
            consider(&w->f, strict, best, &have);
        break;
    default:
        break;
    }
    free(w);
    return have;
}

static bool fs_equal(const struct fset *a, const struct fset *b)
{
    if (a->n != b->n)
        return false;
    for (uint32_t i = 0; i < a->n; i++)
        if (a->v[i].len != b->v[i].len || memcmp(a->v[i].b, b->v[i].b, a->v[i].len) != 0 ||
            memcmp(a->v[i].m, b->v[i].m, a->v[i].len) != 0)
            return false;
    return true;
}

/* The pieces of a top-level concatenation that factor sets come from:
 * runs kids[i..j] of exact children, and each child's own factor. Calls
 * back with each piece's set and its children. */
struct pieces {
    const struct fset *first; /* find: its piece; pick: the best apart from it */
    uint32_t fa, fb;          /* first's children, once found */
    bool found, have;
    struct fset best;
};

static void piece(void *ctx, const struct fset *s, uint32_t i, uint32_t j)
{
    struct pieces *pc = ctx;
    if (!pc->found) {
        if (fs_equal(s, pc->first)) {
            pc->fa = i, pc->fb = j;
            pc->found = true;
        }
        return;
    }
    if (j < pc->fa || i > pc->fb)
        consider(s, false, &pc->best, &pc->have);
}

static void pieces_walk(const struct node *n, struct fwork *w, struct pieces *pc)
{
    cat_runs(n, 0, w, piece, pc);
    for (uint32_t i = 0; i < n->u.list.n; i++)
        if (factor_of(n->u.list.kids[i], 1, false, &w->f))
            piece(pc, &w->f, i, i);
}

/* A second factor of rule `root` whose factor is `first`: the best set
 * among the children of its top-level concatenation that `first` does not
 * come from, so that every match holds a string of each, apart. Strings
 * of MIN_LIT bytes or more, as the literal matcher's (they are only
 * searched for near a candidate). */
static bool second_of(const struct node *root, const struct fset *first, struct fset *out)
{
    if (root->type != N_CAT)
        return false;
    struct fwork *w = malloc(sizeof(*w));
    struct pieces *pc = malloc(sizeof(*pc));
    bool ok = w != NULL && pc != NULL;
    if (ok) {
        pc->first = first;
        pc->found = pc->have = false;
        pieces_walk(root, w, pc); /* find first's children */
        if (pc->found)
            pieces_walk(root, w, pc); /* the best apart from them */
        ok = pc->found && pc->have && fs_raw_min(&pc->best) >= MIN_LIT;
        if (ok)
            *out = pc->best;
    }
    free(w);
    free(pc);
    return ok;
}

/* Room in `s` for `want` bytes and masks in all (below UINT32_MAX). */
static bool sbuf_reserve(struct cpuplan_string *s, uint64_t want)
{
    if (want <= s->cap)
        return true;
    if (want >= UINT32_MAX)
        return false;
    uint64_t cap = s->cap ? 2 * (uint64_t)s->cap : 64;
    cap = cap < want ? want : cap > UINT32_MAX - 1 ? UINT32_MAX - 1 : cap;
    uint8_t *nb = realloc(s->b, cap);
    if (nb != NULL)
        s->b = nb;
    uint8_t *nm = realloc(s->m, cap);
    if (nm != NULL)
        s->m = nm;
    if (nb == NULL || nm == NULL)
        return false;
    s->cap = (uint32_t)cap;
    return true;
}

/* Appends one byte and its fold mask, up to `limit` bytes. */
static bool sbuf_push(struct cpuplan_string *s, uint8_t b, uint8_t m, uint32_t limit)
{
    if (s->n >= limit || !sbuf_reserve(s, (uint64_t)s->n + 1))
        return false;
    s->b[s->n] = b;
    s->m[s->n++] = m;
    return true;
}

/* Appends the one string `n` matches, when it matches exactly one and has
 * no assertion. */
static bool lit_of(const struct node *n, int depth, uint32_t max, struct cpuplan_string *s)
{
    if (depth > MAX_DEPTH)
        return false;
    switch (n->type) {
    case N_SET: {
        uint8_t b, m;
        return set_chars(&n->u.set, &b, &m, 1) == 1 && sbuf_push(s, b, m, max);
    }
    case N_CAT:
        for (uint32_t i = 0; i < n->u.list.n; i++)
            if (!lit_of(n->u.list.kids[i], depth + 1, max, s))
                return false;
        return true;
    case N_ALT:
        return n->u.list.n == 1 && lit_of(n->u.list.kids[0], depth + 1, max, s);
    case N_REPEAT:
        if (n->u.rep.min != n->u.rep.max || n->u.rep.min > max)
            return false;
        for (uint32_t i = 0; i < n->u.rep.min; i++)
            if (!lit_of(n->u.rep.kid, depth + 1, max, s))
                return false;
        return true;
    default:
        return false;
    }
}

/* ---- building a plan -------------------------------------------------- */

/* The matcher entries under construction. `bytes` holds an offset into the
 * pool until every string is in (the pool moves while it grows). */
/* ---- class runs (cpurun.h) ---- */

/* A class every byte of a match of `x` is in (ok), and the fewest bytes
 * a match of it has, at most RUN_CAP (a lower bound is still one: every
 * match then holds a run at least that long). */
struct pure {
    bool ok;
    uint32_t min;
    struct byteset u;
};

#define RUN_CAP    (1u << 20)
#define RUN_MIN_N  8u
#define RUN_MAX_IN 64u /* bytes in the class, at most */
#define RUN_SPAN   64u /* parts of a concatenation in one run, at most */
/* the least a run must say in text (run_score), in bits */
#define RUN_MIN_BITS 40u

static void set_or(struct byteset *a, const struct byteset *b)
{
    for (unsigned w = 0; w < 4; w++)
        a->w[w] |= b->w[w];
}

static uint32_t set_size(const struct byteset *s)
{
    uint32_t n = 0;
    for (unsigned w = 0; w < 4; w++)
        n += (uint32_t)__builtin_popcountll(s->w[w]);
    return n;
}

static uint32_t cap_add(uint64_t a, uint64_t b)
{
    return a + b < RUN_CAP ? (uint32_t)(a + b) : RUN_CAP;
}

static void pure_of(const struct node *x, int depth, struct pure *out)
{
    memset(out, 0, sizeof(*out));
    if (depth > MAX_DEPTH)
        return;
    switch (x->type) {
    case N_SET:
        *out = (struct pure){.ok = true, .min = 1, .u = x->u.set};
        return;
    case N_ASSERT: /* no byte */
        out->ok = true;
        return;
    case N_REPEAT: {
        pure_of(x->u.rep.kid, depth + 1, out);
        uint64_t m = (uint64_t)out->min * x->u.rep.min;
        out->min = m < RUN_CAP ? (uint32_t)m : RUN_CAP;
        return;
    }
    case N_CAT:
    case N_ALT:
        out->ok = true;
        out->min = x->type == N_ALT ? RUN_CAP : 0;
        for (uint32_t i = 0; i < x->u.list.n && out->ok; i++) {
            struct pure k;
            pure_of(x->u.list.kids[i], depth + 1, &k);
            out->ok = k.ok;
            set_or(&out->u, &k.u);
            out->min =
                x->type == N_ALT ? (k.min < out->min ? k.min : out->min) : cap_add(out->min, k.min);
        }
        if (x->u.list.n == 0)
            out->min = 0;
        return;
    }
}

/* A class run: every match holds n bytes in a row of class c (n 0: none
 * known). */
struct run_req {
    uint32_t n;
    struct byteset c;
};

/* run_score, below */
static uint32_t run_score(const struct run_req *r);

static void run_better(struct run_req *best, const struct run_req *r)
{
    uint32_t a = run_score(r), b = run_score(best);
    if (a > b || (a == b && a > 0 && r->n > best->n))
        *best = *r;
}

static void run_of(const struct node *x, int depth, struct run_req *out)
{
    memset(out, 0, sizeof(*out));
    if (depth > MAX_DEPTH)
        return;
    switch (x->type) {
    case N_SET:
        *out = (struct run_req){.n = 1, .c = x->u.set};
        return;
    case N_ASSERT:
        return;
    case N_REPEAT: {
        if (x->u.rep.min == 0)
            return;
        run_of(x->u.rep.kid, depth + 1, out); /* it is there at least once */
        struct pure p;
        pure_of(x->u.rep.kid, depth + 1, &p);
        if (p.ok && p.min > 0) {
            uint64_t m = (uint64_t)p.min * x->u.rep.min;
            struct run_req r = {.n = m < RUN_CAP ? (uint32_t)m : RUN_CAP, .c = p.u};
            run_better(out, &r);
        }
        return;
    }
    case N_ALT: /* every branch has one: the union, the shortest */
        for (uint32_t i = 0; i < x->u.list.n; i++) {
            struct run_req k;
            run_of(x->u.list.kids[i], depth + 1, &k);
            if (k.n == 0) {
                memset(out, 0, sizeof(*out));
                return;
            }
            out->n = i == 0 || k.n < out->n ? k.n : out->n;
            set_or(&out->c, &k.c);
        }
        return;
    case N_CAT: { /* a part's, or the bytes of consecutive parts that are
                   * all of one class (`[0-9a-f]{8}-[0-9a-f]{4}`: 8, or 13 of
                   * the union): those from each part, at most RUN_SPAN
                   * parts and a class of RUN_MAX_IN bytes, each class
                   * judged at its longest (a 16 KiB rule of `\d`s is
                   * 16,384 parts) */
        uint32_t k = x->u.list.n;
        struct pure *p = malloc((k ? k : 1) * sizeof(*p));
        for (uint32_t i = 0; i < k; i++) {
            struct run_req r;
            run_of(x->u.list.kids[i], depth + 1, &r);
            run_better(out, &r);
            if (p != NULL)
                pure_of(x->u.list.kids[i], depth + 1, &p[i]);
        }
        for (uint32_t i = 0; p != NULL && i < k; i++) {
            struct run_req r = {0};
            for (uint32_t j = i; j < k && j - i < RUN_SPAN && p[j].ok; j++) {
                set_or(&r.c, &p[j].u);
                if (set_size(&r.c) > RUN_MAX_IN)
                    break;
                r.n = cap_add(r.n, p[j].min);
                bool last = j + 1 == k || j + 1 - i == RUN_SPAN || !p[j + 1].ok;
                struct byteset next = r.c;
                if (!last)
                    set_or(&next, &p[j + 1].u);
                if (last || memcmp(&next, &r.c, sizeof(next)) != 0)
                    run_better(out, &r);
            }
        }
        free(p);
        return;
    }
    }
}

/* Parts per thousand of English text a byte is, roughly: the letters by
 * their frequency (lowercase 62% of the text, uppercase 3%), space 16%,
 * newline 2%, digits 1%, the rest of the printable bytes 6% among them. */
static uint32_t text_share(unsigned c)
{
    /* English letter frequencies, per ten thousand letters, a to z */
    static const uint16_t f[26] = {817, 149, 278, 425, 1270, 223, 202, 609, 697, 15,  77, 403, 241,
                                   675, 751, 193, 10,  599,  633, 906, 276, 98,  236, 15, 197, 7};
    if (c >= 'a' && c <= 'z')
        return f[c - 'a'] * 620 / 10000;
    if (c >= 'A' && c <= 'Z')
        return f[c - 'A'] * 30 / 10000 + 1;
    if (c == ' ')
        return 160;
    if (c == '\n')
        return 20;
    if (c >= '0' && c <= '9')
        return 1;
    return c > ' ' && c < 0x7f ? 2 : 0;
}

/* log2(x) in 1/256ths, x >= 1 */
static uint32_t log2_q8(uint32_t x)
{
    uint32_t i = 31u - (uint32_t)__builtin_clz(x), r = i << 8;
    uint64_t y = ((uint64_t)x << 16) >> i; /* x / 2^i, in [1, 2) as Q16 */
    for (int b = 7; b >= 0; b--) {
        y = (y * y) >> 16;
        if (y >= (2u << 16)) {
            y >>= 1;
            r |= 1u << b;
        }
    }
    return r;
}

/* The class's share of English text, in parts per thousand. */
static uint32_t run_share(const struct run_req *r)
{
    uint32_t share = 0;
    for (unsigned w = 0; w < 4; w++)
        for (uint64_t bits = r->c.w[w]; bits != 0; bits &= bits - 1)
            share += text_share(w * 64 + (unsigned)__builtin_ctzll(bits));
    return share;
}

/* What a run says in text, in 1/256 bits: n * log2(1000 / share). A
 * longer run of a wider class can say less than a shorter one of a
 * narrower class (`sgp_[a-f0-9]{40}` with (?i): 44 bytes of a class of
 * 29% of text; `[a-f0-9]{40}` alone: 40 of 22%, which says more). */
static uint32_t run_score(const struct run_req *r)
{
    uint32_t share = run_share(r);
    share = share < 1 ? 1 : share;
    if (r->n == 0 || share >= 1000)
        return 0;
    uint64_t v = (uint64_t)r->n * (log2_q8(1000) - log2_q8(share));
    return v < UINT32_MAX ? (uint32_t)v : UINT32_MAX;
}

/* Whether a rule's class run is worth a run pass: RUN_MIN_N bytes or more
 * of a class of at most RUN_MAX_IN bytes, at most RUN_TEXT_MAX parts per
 * thousand of English text, saying RUN_MIN_BITS or more. The scan widens
 * every sample in the class to its run, so a class text is full of costs
 * more than the walk it saves: `[a-fA-F0-9]{40}` (22% of text), `\d{15}`
 * and `[A-Z0-9]{20}` are taken, `[A-Za-z0-9]{32}` (68%) and `[a-z]{10}`
 * are not. */
#define RUN_TEXT_MAX 300u

static bool run_worth(const struct run_req *r)
{
    return r->n >= RUN_MIN_N && set_size(&r->c) <= RUN_MAX_IN && run_share(r) <= RUN_TEXT_MAX &&
           run_score(r) >= RUN_MIN_BITS * 256;
}

struct entries {
    struct cpulit_entry *v;
    uint32_t *group; /* per entry: its engine group */
    size_t n, cap;
    struct cpuplan_string pool;
    /* take no factor of MIN_LIT bytes (common in text: `key`, `api`):
     * such a group is walked in full */
    bool strict;
    /* second factors (struct cpuplan_second), their strings and bytes */
    struct cpuplan_second *sec;
    uint32_t n_sec, cap_sec;
    struct cpuplan_sstr *sstr;
    uint32_t n_sstr, cap_sstr;
    struct cpuplan_string spool;
    /* class runs (window groups' rules with no factor string) and their
     * groups */
    struct cpurun_entry *runs;
    uint32_t *run_group;
    uint32_t n_runs, cap_runs;
};

/* Room for `more` entries and `bytes` more pool bytes. */
static int entries_reserve(struct entries *e, size_t more, uint64_t bytes)
{
    if (e->n + more > e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 256;
        cap = cap < e->n + more ? e->n + more : cap;
        struct cpulit_entry *v = realloc(e->v, cap * sizeof(*v));
        if (v != NULL)
            e->v = v;
        uint32_t *g = realloc(e->group, cap * sizeof(*g));
        if (g != NULL)
            e->group = g;
        if (v == NULL || g == NULL)
            return -ENOMEM;
        e->cap = cap;
    }
    return sbuf_reserve(&e->pool, (uint64_t)e->pool.n + bytes) ? 0 : -ENOMEM;
}

static int entries_add(struct entries *e, const uint8_t *b, const uint8_t *m, uint32_t len,
                       uint32_t id, uint32_t group)
{
    int rc = entries_reserve(e, 1, len);
    if (rc != 0)
        return rc;
    /* a rule's string reports under its rule's report index, once per end
     * among the rules sharing its id; factor ends need not be unique */
    e->v[e->n] = (struct cpulit_entry){.bytes = (const uint8_t *)(uintptr_t)e->pool.n,
                                       .fold = NULL,
                                       .len = len,
                                       .id = id,
                                       .flags = id & CPUPLAN_FACTOR ? 0 : CPULIT_ONCE};
    e->group[e->n++] = group;
    memcpy(e->pool.b + e->pool.n, b, len);
    memcpy(e->pool.m + e->pool.n, m, len);
    e->pool.n += len;
    return 0;
}

static void entries_finish(struct entries *e)
{
    free(e->v);
    free(e->group);
    free(e->pool.b);
    free(e->pool.m);
    free(e->sec);
    free(e->sstr);
    free(e->spool.b);
    free(e->spool.m);
    free(e->runs);
    free(e->run_group);
}

/* Whether engine group g is a literal group (CAT_GF_LITERAL): no DFA of
 * its own, so the literal matcher is its only scanner. */
static bool literal_group(const struct catalog *cat, uint32_t g)
{
    if (g >= catalog_group_count(cat))
        return false;
    struct catalog_group cg;
    catalog_group(cat, g, &cg);
    return (cg.flags & CAT_GF_LITERAL) != 0;
}

/* Which engine groups may take each fast path, from their flags alone. */
static void eligible(const struct catalog *cat, uint8_t *lit, uint8_t *win)
{
    uint32_t nd = catalog_group_count(cat);
    for (uint32_t g = 0; g < nd; g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        bool plain = (cg.flags & ~CAT_GF_ASSERTS) == 0 && cg.n_rules > 0;
        lit[g] = (plain && !(cg.flags & CAT_GF_ASSERTS)) || (cg.flags & CAT_GF_LITERAL);
        win[g] = plain && cg.maxlen != CATALOG_UNBOUNDED;
    }
    for (uint32_t j = 0; j < catalog_nfa_count(cat); j++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, j, &cn);
        /* gated groups too: the plan's own strings replace the factor walk */
        bool plain = (cn.flags & ~(CAT_GF_ASSERTS | CAT_GF_GATED)) == 0 && cn.n_rules > 0;
        lit[nd + j] = plain && !(cn.flags & CAT_GF_ASSERTS);
        win[nd + j] = plain && cn.maxlen != CATALOG_UNBOUNDED;
    }
}

/* Parses rule r's source; *group is its engine group. The caller frees
 * `pr` whatever this returns. */
static int parse_src(const struct catalog *cat, uint32_t r, struct parse_result *pr,
                     uint32_t *group)
{
    struct catalog_rule cr;
    catalog_rule(cat, r, &cr);
    struct rule_src src = {.id = "r",
                           .kind = (enum rule_kind)cr.kind,
                           .pattern = cr.src,
                           .len = cr.src_len,
                           .flags = cr.flags};
    uint32_t pos;
    char msg[240];
    *group = cr.group;
    return parse_rule(&src, pr, &pos, msg, sizeof(msg));
}

/* Rule r as one plain string without the parser, when it is written as
 * one: a literal without escapes, a regex without metacharacters. Its
 * letters are caseless (lowercase, mask 0x20) under RULE_F_CASELESS, as
 * lit_of gives them from the parsed rule. dict-sized catalogs (40,000
 * words) are planned in a fraction of the parser's time, which counts at a
 * restart's first scan. */
static bool plain_of(const struct catalog_rule *cr, uint32_t max, struct cpuplan_string *s)
{
    if (cr->kind != RULE_LITERAL && cr->kind != RULE_REGEX)
        return false;
    /* 1: a regex metacharacter; 2: also a literal's (its escapes) */
    static const uint8_t meta[256] = {
        ['\\'] = 2, ['^'] = 1, ['$'] = 1, ['.'] = 1, ['|'] = 1, ['?'] = 1, ['*'] = 1,
        ['+'] = 1,  ['('] = 1, [')'] = 1, ['['] = 1, [']'] = 1, ['{'] = 1, ['}'] = 1};
    uint8_t stop = cr->kind == RULE_LITERAL ? 2 : 1;
    for (uint32_t i = 0; i < cr->src_len; i++)
        if (meta[(uint8_t)cr->src[i]] >= stop)
            return false;
    bool fold = (cr->flags & RULE_F_CASELESS) != 0;
    for (uint32_t i = 0; i < cr->src_len; i++) {
        uint8_t c = (uint8_t)cr->src[i];
        bool letter = fold && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
        if (!sbuf_push(s, letter ? c | 0x20 : c, letter ? 0x20 : 0, max))
            return false;
    }
    return true;
}

int cpuplan_rule_string(const struct catalog *cat, uint32_t r, uint32_t max,
                        struct cpuplan_string *s)
{
    struct catalog_rule cr;
    catalog_rule(cat, r, &cr);
    s->n = 0;
    if (plain_of(&cr, max, s))
        return 1;
    s->n = 0;
    struct parse_result pr = {0};
    uint32_t g;
    bool good = parse_src(cat, r, &pr, &g) == 0 && pr.root != NULL && lit_of(pr.root, 0, max, s);
    parse_result_finish(&pr);
    return good;
}

/* Records second factor `f2` of a rule of group g whose matches are at
 * most `span` bytes long (e->sec[e->n_sec - 1]). */
/* Room for `need` elements of `elem` bytes in *p (capacity *cap), below
 * CPUPLAN_SECOND of them. */
static bool room(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    uint32_t c = *cap ? *cap : 64;
    while (c < need && c < CPUPLAN_SECOND)
        c *= 2;
    void *v = c >= need ? realloc(*p, c * elem) : NULL;
    if (v == NULL)
        return false;
    *p = v;
    *cap = c;
    return true;
}

static int second_add(struct entries *e, const struct fset *f2, uint32_t g, uint32_t span)
{
    if (!room((void **)&e->sec, &e->cap_sec, e->n_sec + 1, sizeof(*e->sec)) ||
        !room((void **)&e->sstr, &e->cap_sstr, e->n_sstr + f2->n, sizeof(*e->sstr)))
        return -ENOMEM;
    e->sec[e->n_sec++] =
        (struct cpuplan_second){.group = g, .span = span, .first = e->n_sstr, .n = f2->n};
    for (uint32_t i = 0; i < f2->n; i++) {
        const struct fstr *x = &f2->v[i];
        if (!sbuf_reserve(&e->spool, (uint64_t)e->spool.n + x->len))
            return -ENOMEM;
        e->sstr[e->n_sstr++] = (struct cpuplan_sstr){.off = e->spool.n, .len = x->len};
        memcpy(e->spool.b + e->spool.n, x->b, x->len);
        memcpy(e->spool.m + e->spool.n, x->m, x->len);
        e->spool.n += x->len;
    }
    return 0;
}

static int run_add(struct entries *e, const struct run_req *r, uint32_t g)
{
    if (!room((void **)&e->runs, &e->cap_runs, e->n_runs + 1, sizeof(*e->runs)))
        return -ENOMEM;
    uint32_t *rg = realloc(e->run_group, (size_t)e->cap_runs * sizeof(*rg));
    if (rg == NULL)
        return -ENOMEM;
    e->run_group = rg;
    struct cpurun_entry *x = &e->runs[e->n_runs];
    memcpy(x->set, r->c.w, sizeof(x->set));
    x->n = r->n;
    x->id = CPUPLAN_FACTOR | g;
    e->run_group[e->n_runs++] = g;
    return 0;
}

/* Pass over the rules of groups still marked in `ok`: each adds its
 * strings (its literal under its report index, or its factor set) or
 * unmarks its group. */
static int collect(const struct catalog *cat, const uint32_t *report, uint32_t ng, uint8_t *ok,
                   bool factors, struct entries *e)
{
    struct fset *f = malloc(sizeof(*f)), *f2 = malloc(sizeof(*f2));
    int rc = f != NULL && f2 != NULL ? 0 : -ENOMEM;
    if (!factors) { /* one string a rule, mostly as long as its source */
        size_t n = 0;
        uint64_t bytes = 0;
        for (uint32_t r = 0; r < catalog_rule_count(cat); r++) {
            struct catalog_rule cr;
            catalog_rule(cat, r, &cr);
            n += cr.group < ng && ok[cr.group];
            bytes += cr.group < ng && ok[cr.group] ? cr.src_len : 0;
        }
        rc = rc == 0 ? entries_reserve(e, n, bytes) : rc;
    }
    struct cpuplan_string s = {0}; /* one rule's string */
    for (uint32_t r = 0; r < catalog_rule_count(cat) && rc == 0; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        if (cr.group >= ng || !ok[cr.group])
            continue;
        struct parse_result pr = {0};
        uint32_t g = cr.group;
        bool good;
        if (!factors) {
            good = cpuplan_rule_string(cat, r, CPULIT_MAX_LEN, &s) == 1 && s.n >= MIN_LIT;
            if (good)
                rc = entries_add(e, s.b, s.m, s.n, report[r], g);
        } else if ((good = parse_src(cat, r, &pr, &g) == 0 && pr.root != NULL)) {
            good = factor_of(pr.root, 0, e->strict, f) && fs_worth(f, e->strict);
            bool run = false;
            /* no string of MIN_LIT bytes (not even one judged too weak, as
             * 3-byte ones are in forward-confirmed catalogs: there the
             * group's walk in full, with the others, costs less than a run
             * pass; regex-500-secrets' `lji[a-f0-9]{40}`): a class run,
             * when it has one */
            if (!good && !(e->strict && factor_of(pr.root, 0, false, f) && fs_min(f) >= MIN_LIT)) {
                struct run_req rq;
                run_of(pr.root, 0, &rq);
                if ((good = run = run_worth(&rq)))
                    rc = run_add(e, &rq, g);
                f->n = 0;
            }
            uint32_t id = CPUPLAN_FACTOR | g;
            if (good && !run && cr.maxlen != CATALOG_UNBOUNDED && second_of(pr.root, f, f2)) {
                rc = second_add(e, f2, g, cr.maxlen);
                id = CPUPLAN_FACTOR | CPUPLAN_SECOND | (e->n_sec - 1);
            }
            for (uint32_t i = 0; good && i < f->n && rc == 0; i++)
                rc = entries_add(e, f->v[i].b, f->v[i].m, f->v[i].len, id, g);
        }
        parse_result_finish(&pr);
        if (!good && !literal_group(cat, g))
            ok[g] = 0; /* a literal group's rule that is no string: skipped */
    }
    free(s.b);
    free(s.m);
    free(f);
    free(f2);
    return rc;
}

/* The matchers over the kept entries (e->v is reused for their input):
 * strings of two bytes (window groups' pair factors; a literal group's
 * rules have MIN_LIT bytes or more) in the pair matcher, the rest in the
 * literal matcher. */
static int make_matcher(struct entries *e, const uint8_t *mode, struct cpuplan *p)
{
    size_t k = 0, pairs = 0;
    for (size_t i = 0; i < e->n; i++) {
        uint32_t id = e->v[i].id;
        uint32_t want = !(id & CPUPLAN_FACTOR) ? CPUPLAN_LIT
                        : id & CPUPLAN_GATE    ? CPUPLAN_FULL
                                               : CPUPLAN_WINDOW;
        if (mode[e->group[i]] != want)
            continue;
        size_t off = (size_t)(uintptr_t)e->v[i].bytes;
        e->v[k] = e->v[i];
        e->v[k].bytes = e->pool.b + off;
        e->v[k].fold = e->pool.m + off;
        pairs += e->v[k].len == 2;
        k++;
    }
    e->n = 0; /* the offsets are gone */
    /* pairs to the back, the order of the rest kept (the literal matcher
     * reports equal starts in entry order) */
    size_t a = 0;
    struct cpulit_entry *two = pairs > 0 ? malloc(pairs * sizeof(*two)) : NULL;
    if (pairs > 0 && two == NULL)
        return -ENOMEM;
    for (size_t i = 0, t = 0; i < k; i++) {
        if (e->v[i].len == 2)
            two[t++] = e->v[i];
        else
            e->v[a++] = e->v[i];
    }
    int rc = pairs > 0 ? cpupair_create(two, pairs, &p->pair) : 0;
    free(two);
    /* the class runs of window groups */
    uint32_t nr = 0;
    for (uint32_t i = 0; i < e->n_runs; i++)
        if (mode[e->run_group[i]] == CPUPLAN_WINDOW)
            e->runs[nr++] = e->runs[i];
    if (rc == 0 && nr > 0)
        rc = cpurun_create(e->runs, nr, &p->run);
    if (rc == 0 && a > 0)
        rc = cpulit_create(e->v, a, &p->lit);
    size_t ng = 0; /* the gate strings, to the front (the matcher is built) */
    for (size_t i = 0; rc == 0 && p->gate_merged && i < a; i++)
        if ((e->v[i].id & CPUPLAN_FACTOR) && (e->v[i].id & CPUPLAN_GATE))
            e->v[ng++] = e->v[i];
    if (rc == 0 && ng > 0)
        rc = cpulit_create(e->v, ng, &p->gate_lit);
    return rc;
}

/* A gated group is compiled again only when each of its rules expands to
 * at most this many NFA positions: such rules were gated by choice (their
 * DFA fits), while larger ones would make the compiler try DFAs that do
 * not fit, which takes seconds (gitleaks-regex: 19 s) and gains nothing. */
#define SHADOW_MAX_POSITIONS 96u

/* Unmarks the groups in `take` with a rule over SHADOW_MAX_POSITIONS. */
static void small_rules_only(const struct catalog *cat, uint32_t ng, uint8_t *take)
{
    for (uint32_t r = 0; r < catalog_rule_count(cat); r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        if (cr.group >= ng || !take[cr.group])
            continue;
        struct parse_result pr = {0};
        uint32_t g;
        bool small = parse_src(cat, r, &pr, &g) == 0 && pr.root != NULL &&
                     parse_positions(pr.root) <= SHADOW_MAX_POSITIONS;
        parse_result_finish(&pr);
        if (!small)
            take[g] = 0;
    }
}

/*
 * Few positions do not make a small DFA: `dtf[A-Za-z0-9_-]{20,37}` has 40
 * and a DFA of over 16,384 states (each "dtf" inside the run starts a new
 * count). The compiler leaves such a rule on a bit-NFA, gated, and one
 * gated group makes the whole shadow unusable (plan_shadow): regex-500-
 * secrets spent 8.4-15 s (2-core machine) compiling 470 rules again, and
 * gitleaks-regex 1-1.6 s on 80, both for nothing. So before the compile,
 * each rule's DFA is built alone, as the compiler's first step does, up
 * to SHADOW_RULE_STATES states, and all of them together up to
 * SHADOW_ALL_STATES; at the first rule over, nothing is compiled again.
 * The total bounds the probe (about 0.5 us a state, plus each rule's parse
 * and NFA: regex-500, whose shadow is used, 435 rules of at most 118
 * states and 12,925 in all, 33 ms) and the shadow compile, which grows
 * with it (regex-500's: 1.2-1.3 s). A rule between SHADOW_RULE_STATES and
 * the compiler's own bound (16,384) would fit a DFA, but its shadow would
 * cost seconds too.
 */
#define SHADOW_RULE_STATES 4096u
#define SHADOW_ALL_STATES  32768u

/* The states of the DFA of `root` alone, unminimised, as the compiler's
 * first try builds it; cap + 1 when over `cap` (or not built). Returns 0
 * or -ENOMEM. */
static int lone_dfa_states(struct node *root, uint32_t cap, uint32_t *states)
{
    struct nfa_builder *b = nfa_builder_create();
    if (b == NULL)
        return -ENOMEM;
    struct nfa nfa;
    int rc = nfa_builder_add(b, parse_strip_prefix(root), 0);
    if (rc == 0)
        rc = nfa_builder_finish(b, &nfa);
    nfa_builder_destroy(b);
    if (rc != 0)
        return rc;
    struct dfa d;
    rc = dfa_build(&nfa, cap, &d);
    nfa_finish(&nfa);
    *states = rc == 0 ? d.n_states : cap + 1; /* -E2BIG: over the cap */
    if (rc == 0)
        dfa_finish(&d);
    return rc == -ENOMEM ? rc : 0;
}

/* Clears `take` unless the DFA of each rule of its marked groups fits
 * SHADOW_RULE_STATES, and all of them SHADOW_ALL_STATES. Stops at the
 * first rule over. Returns 0 or -ENOMEM. */
static int small_dfas_only(const struct catalog *cat, uint32_t ng, uint8_t *take)
{
    uint32_t left = SHADOW_ALL_STATES;
    bool fit = true;
    int rc = 0;
    for (uint32_t r = 0; r < catalog_rule_count(cat) && fit && rc == 0; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        if (cr.group >= ng || !take[cr.group])
            continue;
        struct parse_result pr = {0};
        uint32_t g, states = 0, cap = left < SHADOW_RULE_STATES ? left : SHADOW_RULE_STATES;
        rc = parse_src(cat, r, &pr, &g);
        fit = rc == 0 && pr.root != NULL && cap > 0;
        rc = rc == -ENOMEM ? rc : 0;
        if (fit)
            rc = lone_dfa_states(pr.root, cap, &states);
        fit = fit && rc == 0 && states <= cap;
        left -= fit ? states : 0;
        parse_result_finish(&pr);
    }
    if (!fit || rc != 0)
        memset(take, 0, ng);
    return rc;
}

/* Rules of gated groups compiled again with this many at most (a bound
 * on the plan's time). */
#define SHADOW_MAX_RULES 5000u

/* Compiles the rules of the groups marked in `take` (gated bit-NFA groups)
 * again, without gating (rules_options.gate_bits), and plans the result.
 * Rules keep their ids (rules sharing one report as one in the shadow too)
 * and the shadow's rules map to their report indexes here.
 * Clears `take` when there are too many or the result still has gated
 * groups (the catalog's own gate serves them then); -ENOMEM only for
 * memory. */
static int plan_shadow(const struct catalog *cat, const uint32_t *report, struct cpuplan *p,
                       uint8_t *take)
{
    uint32_t n = 0, nr = catalog_rule_count(cat);
    for (uint32_t r = 0; r < nr; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        n += cr.group < p->n_dfa + p->n_nfa && take[cr.group];
    }
    if (n == 0 || n > SHADOW_MAX_RULES)
        return 0;
    struct rule_src *src = calloc(n, sizeof(*src));
    uint32_t *map = calloc(n, sizeof(*map));
    char **ids = calloc(n, sizeof(*ids)); /* the rules' own, NUL-terminated */
    uint32_t k = 0;
    for (uint32_t r = 0; r < nr && src != NULL && map != NULL && ids != NULL; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        if (cr.group >= p->n_dfa + p->n_nfa || !take[cr.group])
            continue;
        ids[k] = strndup(cr.id, cr.id_len);
        if (ids[k] == NULL)
            break;
        src[k] = (struct rule_src){.id = ids[k],
                                   .kind = (enum rule_kind)cr.kind,
                                   .pattern = cr.src,
                                   .len = cr.src_len,
                                   .flags = cr.flags};
        map[k++] = report[r];
    }
    if (k < n) {
        for (uint32_t i = 0; ids != NULL && i < k; i++)
            free(ids[i]);
        free(src);
        free(map);
        free(ids);
        return -ENOMEM;
    }
    /* bitnfa_counters: the compiler puts a rule whose counted repeats add
     * up to 64 (`uzv[a-f0-9]{32}[a-f0-9]{40}`) on a bit-NFA without trying
     * its DFA, gated when it has factors, as every rule here has; its DFA
     * fits (small_dfas_only), so it is tried. */
    struct rules_options ro = {.gate_bits = UINT32_MAX, .bitnfa_counters = UINT32_MAX};
    struct rules_result res = {0};
    struct vks_error err;
    int rc = rules_compile(src, n, &ro, &res, &err);
    p->n_shadow_compiled = n;
    for (uint32_t i = 0; i < n; i++)
        free(ids[i]);
    free(src);
    free(ids);
    bool usable = rc == 0 && res.n_rejects == 0 && catalog_rule_count(res.catalog) == n;
    for (uint32_t j = 0; usable && j < catalog_nfa_count(res.catalog); j++) {
        struct catalog_nfa cn;
        catalog_nfa(res.catalog, j, &cn);
        usable = (cn.flags & ~CAT_GF_ASSERTS) == 0; /* nothing gated: no factor groups */
    }
    struct cpuplan *sp = NULL;
    if (usable)
        rc = cpuplan_build(res.catalog, true, &sp);
    if (!usable || rc != 0) {
        rules_result_finish(&res);
        free(map);
        memset(take, 0, p->n_dfa + p->n_nfa);
        return rc == -ENOMEM ? rc : 0;
    }
    p->shadow = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    p->shadow_plan = sp;
    p->shadow_rule = map;
    return 0;
}

/* Without fast paths: literal groups still get the matcher (they have no
 * automaton), every other group is walked. */
static int plan_literal_groups(const struct catalog *cat, struct cpuplan *p)
{
    uint32_t ng = p->n_dfa + p->n_nfa, nr = catalog_rule_count(cat);
    uint8_t *lit = calloc(ng + 1, 1);
    uint32_t *report = malloc((nr ? nr : 1) * sizeof(*report));
    struct entries e = {0};
    int rc = lit != NULL && report != NULL ? 0 : -ENOMEM;
    uint32_t n = 0;
    for (uint32_t g = 0; rc == 0 && g < p->n_dfa; g++) {
        lit[g] = literal_group(cat, g);
        n += lit[g];
    }
    if (rc == 0 && n > 0)
        rc = catalog_report_indexes(cat, report);
    if (rc == 0 && n > 0)
        rc = collect(cat, report, ng, lit, false, &e);
    for (uint32_t g = 0; rc == 0 && g < ng; g++) {
        p->mode[g] = lit[g] ? CPUPLAN_LIT : CPUPLAN_FULL;
        p->n_lit_groups += lit[g] != 0;
    }
    if (rc == 0 && n > 0)
        rc = make_matcher(&e, p->mode, p);
    entries_finish(&e);
    free(report);
    free(lit);
    return rc;
}

/* The factor groups that name a gated bit-NFA group left FULL
 * (cpuplan.factor_walk): the groups the other factor groups gate are
 * windowed or shadowed by the plan, which finds their factors itself. */
static int plan_factor_walks(const struct catalog *cat, struct cpuplan *p)
{
    p->factor_walk = calloc(p->n_dfa + 1, 1);
    if (p->factor_walk == NULL)
        return -ENOMEM;
    for (uint32_t k = 0; k < p->n_dfa; k++) {
        struct catalog_group cg;
        catalog_group(cat, k, &cg);
        if (!(cg.flags & CAT_GF_FACTOR) || cg.first_accept >= cg.n_states)
            continue;
        const uint32_t *a = cg.accepts + cg.accept_index[0];
        const uint32_t *end = cg.accepts + cg.accept_index[cg.n_states - cg.first_accept];
        for (; a < end && !p->factor_walk[k]; a++) {
            uint32_t j = CAT_ACCEPT_RULE(*a);
            p->factor_walk[k] = j >= p->n_nfa || p->mode[p->n_dfa + j] == CPUPLAN_FULL;
        }
    }
    return 0;
}

/* cpuplan.walks, gate_lb and gated_full, once the modes are known. */
static int plan_walks(const struct catalog *cat, struct cpuplan *p)
{
    p->walks = malloc(((size_t)p->n_dfa + p->n_nfa + 1) * sizeof(*p->walks));
    if (p->walks == NULL)
        return -ENOMEM;
    uint32_t n = 0;
    for (int gated = 1; gated >= 0; gated--) {
        for (uint32_t j = 0; j < p->n_nfa; j++) {
            struct catalog_nfa cn;
            catalog_nfa(cat, j, &cn);
            if (gated && (cn.flags & CAT_GF_GATED) && cn.maxlen > p->gate_lb)
                p->gate_lb = cn.maxlen;
            if (((cn.flags & CAT_GF_GATED) != 0) == gated && p->mode[p->n_dfa + j] == CPUPLAN_FULL)
                p->walks[n++] = j;
        }
        if (gated)
            p->n_walk_gated = n;
    }
    p->n_walk_nfa = n - p->n_walk_gated;
    for (uint32_t g = 0; g < p->n_dfa; g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        if (!(cg.flags & CAT_GF_FACTOR) && p->mode[g] == CPUPLAN_FULL)
            p->walks[n++] = g;
    }
    p->n_walk_dfa = n - p->n_walk_gated - p->n_walk_nfa;
    p->gated_full = p->n_walk_gated > 0;
    return 0;
}

/*
 * The strings of a factor group (plan_gate_strings). A factor group is an
 * unanchored DFA over literal factors, with no assertions: its state after
 * any text is its state after the text's last `maxlen` bytes, and it
 * accepts group j at an end exactly where a factor of j ends. Call a string
 * w "alive" when the state after w differs from the state after w without
 * its first byte (that byte still matters). Take the shortest suffix u of
 * a text that leaves the group in the same state as the whole text: u is
 * alive, and so is each prefix of u (a prefix that is not would make the
 * state after u equal to the state after u's own tail). So a walk from the
 * start state over byte classes, depth first, dropping strings that are
 * not alive, reaches every such u, and the alive strings whose state
 * accepts are the strings to look for: where one of them ends, the group's
 * walk accepts the same groups (the state after it accepts j only if a
 * factor of j is a suffix of it), and every accept of the walk is at the
 * end of one of them. Alive strings are the factors' prefixes, so the walk
 * is small; it gives up past GL_NODES of them.
 */
/* VKS_GATE_LIT=0 in the environment keeps the factor groups' walk
 * (benchmarks and tests compare both). */
static bool gate_lit_on(void)
{
    const char *v = getenv("VKS_GATE_LIT");
    return v == NULL || strcmp(v, "0") != 0;
}

#define GL_NODES   200000u
#define GL_STRINGS 20000u /* entries, after case and set expansion */
#define GL_EXPAND  16u    /* byte strings a class string may expand to */

struct gl_node {
    uint32_t s, p; /* state after the string, and after it without its first byte */
    uint32_t depth, next_class;
};

struct gl_build {
    const struct catalog_group *g;
    const uint8_t *want; /* per bit-NFA group: its factor ends are needed */
    uint32_t n_nfa;
    uint8_t cls_bytes[256][4]; /* a class's bytes: its first 4 */
    uint32_t cls_n[256];       /* how many bytes it has */
    uint32_t *path;            /* classes of the current string */
    uint8_t *path_fold;        /* 1: that class's letter, caseless (its other case merged) */
    struct cpulit_entry *v;
    uint8_t *pool; /* bytes and fold masks of the entries */
    size_t n, cap, pool_n, pool_cap;
    uint32_t nodes;
};

static int gl_grow(struct gl_build *b, size_t bytes)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        struct cpulit_entry *v = realloc(b->v, cap * sizeof(*v));
        if (v == NULL)
            return -ENOMEM;
        b->v = v, b->cap = cap;
    }
    if (b->pool_n + bytes > b->pool_cap) {
        size_t cap = b->pool_cap ? 2 * b->pool_cap : 4096;
        while (cap < b->pool_n + bytes)
            cap *= 2;
        uint8_t *pool = realloc(b->pool, cap);
        if (pool == NULL)
            return -ENOMEM;
        b->pool = pool, b->pool_cap = cap;
    }
    return 0;
}

static bool gl_letter(uint8_t x)
{
    return (x | 0x20) >= 'a' && (x | 0x20) <= 'z';
}

/* Class c is one letter in both cases. */
static bool gl_caseless(const struct gl_build *b, uint32_t c)
{
    return b->cls_n[c] == 2 && (b->cls_bytes[c][0] ^ b->cls_bytes[c][1]) == 0x20 &&
           gl_letter(b->cls_bytes[c][0]);
}

/* Entries for the class string path[0..len) ending in state s: each of
 * its byte strings (a class of a letter in both cases is one caseless
 * position; other classes of 2 to 4 bytes multiply), once per group that
 * s accepts. Returns 0, 1 (too many: give up) or -ENOMEM. Entry bytes are
 * stored as pool offsets until the end (the pool moves). */
static int gl_emit(struct gl_build *b, uint32_t len, uint32_t s)
{
    const struct catalog_group *g = b->g;
    uint32_t total = 1;
    for (uint32_t i = 0; i < len; i++) {
        uint32_t c = b->path[i], k = b->cls_n[c];
        bool caseless = gl_caseless(b, c) || b->path_fold[i];
        if (k > 4)
            return 1;
        total *= caseless ? 1 : k;
        if (total > GL_EXPAND)
            return 1;
    }
    const uint32_t *a = g->accepts + g->accept_index[s - g->first_accept];
    const uint32_t *end = g->accepts + g->accept_index[s - g->first_accept + 1];
    for (uint32_t x = 0; x < total; x++) {
        for (const uint32_t *e = a; e < end; e++) {
            uint32_t j = CAT_ACCEPT_RULE(*e);
            if (j >= b->n_nfa || !b->want[j])
                continue; /* a group the plan finds its own factors for */
            if (b->n == GL_STRINGS)
                return 1;
            if (gl_grow(b, 2 * (size_t)len) != 0)
                return -ENOMEM;
            uint8_t *bytes = b->pool + b->pool_n, *fold = bytes + len;
            uint32_t r = x;
            for (uint32_t i = 0; i < len; i++) {
                uint32_t c = b->path[i], k = b->cls_n[c];
                if (gl_caseless(b, c) || b->path_fold[i]) {
                    bytes[i] = b->cls_bytes[c][0] | 0x20;
                    fold[i] = 0x20;
                } else {
                    bytes[i] = b->cls_bytes[c][r % k];
                    fold[i] = 0;
                    r /= k;
                }
            }
            b->v[b->n++] =
                (struct cpulit_entry){(const uint8_t *)(uintptr_t)b->pool_n, NULL, len, j, 0};
            b->pool_n += 2 * (size_t)len;
        }
    }
    return 0;
}

/* The alive strings of factor group g, depth first (an explicit stack of
 * depth g->maxlen). Returns 0, 1 (give up) or -ENOMEM. */
static int gl_walk(struct gl_build *b)
{
    const struct catalog_group *g = b->g;
    uint32_t nc = g->n_classes, depth = g->maxlen;
    struct gl_node *st = malloc((depth + 1) * sizeof(*st));
    b->path = malloc((depth + 1) * sizeof(*b->path));
    b->path_fold = malloc(depth + 1);
    if (st == NULL || b->path == NULL || b->path_fold == NULL) {
        free(st);
        return -ENOMEM;
    }
    int rc = 0;
    uint32_t top = 0;
    st[0] = (struct gl_node){g->start[0], g->start[0], 0, 0};
    while (rc == 0) {
        struct gl_node *n = &st[top];
        if (n->next_class == nc || n->depth == depth) {
            if (top == 0)
                break;
            top--;
            continue;
        }
        uint32_t c = n->next_class++;
        uint32_t s = g->trans[(size_t)n->s * nc + c];
        uint32_t p = n->depth == 0 ? g->start[0] : g->trans[(size_t)n->p * nc + c];
        if (s == p)
            continue; /* not alive */
        /* a letter class whose other case is a class of its own that goes
         * to the same states here: one caseless position, taken at the
         * lowercase one */
        uint8_t x = b->cls_bytes[c][0];
        bool fold = false;
        if (b->cls_n[c] == 1 && gl_letter(x)) {
            uint32_t o = g->classmap[x ^ 0x20];
            fold = b->cls_n[o] == 1 && g->trans[(size_t)n->s * nc + o] == s &&
                   (n->depth == 0 || g->trans[(size_t)n->p * nc + o] == p);
            if (fold && !(x & 0x20))
                continue;
        }
        if (++b->nodes > GL_NODES) {
            rc = 1;
            break;
        }
        b->path[n->depth] = c;
        b->path_fold[n->depth] = fold;
        if (s >= g->first_accept)
            rc = gl_emit(b, n->depth + 1, s);
        st[top + 1] = (struct gl_node){s, p, n->depth + 1, 0};
        top++;
    }
    free(st);
    return rc;
}

/* Order of gl_compress: id, length, bytes with letters folded, bytes. */
static int gl_cmp(const void *x, const void *y)
{
    const struct cpulit_entry *a = x, *b = y;
    if (a->id != b->id)
        return a->id < b->id ? -1 : 1;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    for (uint32_t i = 0; i < a->len; i++) {
        uint8_t fa = gl_letter(a->bytes[i]) ? a->bytes[i] | 0x20 : a->bytes[i];
        uint8_t fb = gl_letter(b->bytes[i]) ? b->bytes[i] | 0x20 : b->bytes[i];
        if (fa != fb)
            return fa < fb ? -1 : 1;
    }
    int c = memcmp(a->bytes, b->bytes, a->len);
    return c != 0 ? c : memcmp(a->fold, b->fold, a->len);
}

/* Entries of one id and length that differ only in the case of their
 * letters, all 2^m cases of their m letters present (a caseless factor
 * whose cases the DFA told apart, because other factors do), become one
 * caseless entry. Leaves the rest as they are; keeps b->v[0..b->n). */
static void gl_compress(struct gl_build *b)
{
    qsort(b->v, b->n, sizeof(*b->v), gl_cmp);
    size_t out = 0;
    for (size_t a = 0; a < b->n;) {
        size_t z = a + 1;
        while (z < b->n && b->v[z].id == b->v[a].id && b->v[z].len == b->v[a].len) {
            const struct cpulit_entry *e = &b->v[z], *f = &b->v[a];
            uint32_t i = 0;
            for (; i < e->len; i++)
                if ((gl_letter(e->bytes[i]) ? e->bytes[i] | 0x20 : e->bytes[i]) !=
                        (gl_letter(f->bytes[i]) ? f->bytes[i] | 0x20 : f->bytes[i]) ||
                    e->fold[i] != f->fold[i])
                    break;
            if (i < e->len)
                break;
            z++;
        }
        /* [a, z): one folded string, sorted; copies dropped */
        size_t u = a;
        for (size_t i = a + 1; i < z; i++)
            if (memcmp(b->v[i].bytes, b->v[u].bytes, b->v[u].len) != 0)
                b->v[++u] = b->v[i];
        size_t distinct = u - a + 1;
        struct cpulit_entry *f = &b->v[a];
        uint32_t m = 0;
        for (uint32_t i = 0; i < f->len; i++)
            m += gl_letter(f->bytes[i]) && f->fold[i] == 0;
        if (m > 0 && m < 32 && distinct == (size_t)1 << m) {
            uint8_t *bytes = (uint8_t *)f->bytes, *fold = (uint8_t *)f->fold;
            for (uint32_t i = 0; i < f->len; i++)
                if (gl_letter(bytes[i])) {
                    bytes[i] |= 0x20;
                    fold[i] = 0x20;
                }
            b->v[out++] = *f;
        } else {
            for (size_t i = a; i <= u; i++)
                b->v[out++] = b->v[i];
        }
        a = z;
    }
    b->n = out;
}

/*
 * In a forward-confirmed catalog (scanned as whole buffers), the gated
 * groups the plan leaves FULL are walked from the catalog's factor ends,
 * which a walk of its factor groups over every byte finds. When those
 * groups' factors read back as strings of 4 bytes or more (gl_walk), they
 * join the plan's literal matcher instead, with ids CPUPLAN_GATE: the one
 * literal pass finds the same (group, end) candidates, and the factor
 * groups are not walked (cpuplan.gate_merged). Shorter strings would turn
 * that matcher to stride 1 (or need the pair matcher), so then nothing
 * changes.
 */
static int plan_gate_strings(const struct catalog *cat, struct cpuplan *p, struct entries *e)
{
    uint8_t *want = calloc(p->n_nfa + 1, 1);
    if (want == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < p->n_walk_gated; i++)
        want[p->walks[i]] = 1;
    struct gl_build b = {.want = want, .n_nfa = p->n_nfa};
    int rc = p->gate_lb == CATALOG_UNBOUNDED ? 0 : 1;
    for (uint32_t k = 0; k < p->n_dfa && rc == 0; k++) {
        struct catalog_group cg;
        catalog_group(cat, k, &cg);
        if (!p->factor_walk[k])
            continue;
        if ((cg.flags & CAT_GF_ASSERTS) || cg.maxlen == 0 || cg.maxlen > 64 ||
            cg.first_accept >= cg.n_states) {
            rc = 1;
            break;
        }
        b.g = &cg;
        memset(b.cls_n, 0, sizeof(b.cls_n));
        for (uint32_t x = 0; x < 256; x++) {
            uint32_t c = cg.classmap[x];
            if (b.cls_n[c] < 4)
                b.cls_bytes[c][b.cls_n[c]] = (uint8_t)x;
            b.cls_n[c]++;
        }
        rc = gl_walk(&b);
        free(b.path);
        free(b.path_fold);
        b.path = NULL;
        b.path_fold = NULL;
    }
    for (size_t i = 0; rc == 0 && i < b.n; i++) {
        size_t off = (size_t)(uintptr_t)b.v[i].bytes; /* pool offsets to pointers */
        b.v[i].bytes = b.pool + off;
        b.v[i].fold = b.pool + off + b.v[i].len;
        if (b.v[i].len < 4)
            rc = 1;
    }
    if (rc == 0 && b.n > 0) {
        gl_compress(&b);
        for (size_t i = 0; rc == 0 && i < b.n; i++)
            rc = entries_add(e, b.v[i].bytes, b.v[i].fold, b.v[i].len,
                             CPUPLAN_FACTOR | CPUPLAN_GATE | b.v[i].id, p->n_dfa + b.v[i].id);
        p->gate_merged = rc == 0;
    }
    free(b.v);
    free(b.pool);
    free(want);
    return rc < 0 ? rc : 0;
}

static int plan_fast(const struct catalog *cat, struct cpuplan *p)
{
    uint32_t ng = p->n_dfa + p->n_nfa;
    uint8_t *lit = malloc(ng), *win = malloc(ng), *shadow = calloc(ng, 1);
    uint32_t nr = catalog_rule_count(cat);
    uint32_t *report = malloc((nr ? nr : 1) * sizeof(*report));
    struct entries e = {0};
    int rc = lit != NULL && win != NULL && shadow != NULL && report != NULL ? 0 : -ENOMEM;
    if (rc == 0)
        rc = catalog_report_indexes(cat, report);
    if (rc == 0) {
        eligible(cat, lit, win);
        rc = collect(cat, report, ng, lit, false, &e);
    }
    for (uint32_t j = 0; rc == 0 && j < p->n_nfa; j++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, j, &cn);
        /* forward-confirmed groups are unbounded: a shadow DFA would be
         * walked over every byte, where their factors gate them */
        shadow[p->n_dfa + j] =
            (cn.flags & CAT_GF_GATED) && !(cn.flags & CAT_GF_CONFIRM) && !lit[p->n_dfa + j];
    }
    if (rc == 0)
        small_rules_only(cat, ng, shadow);
    if (rc == 0)
        rc = small_dfas_only(cat, ng, shadow);
    if (rc == 0)
        rc = plan_shadow(cat, report, p, shadow);
    for (uint32_t g = 0; rc == 0 && g < ng; g++)
        win[g] = win[g] && !lit[g] && !shadow[g]; /* these need no factors */
    /* A forward-confirmed catalog is scanned whole, and a literal matcher
     * with 3-byte strings passes much of any text to its confirmation, with
     * a 3-byte key for all its strings (gitleaks-regex: `key`, `sec`):
     * walking those groups in full, as lanes, is cheaper there (0.05 ->
     * 0.13-0.18 GB/s, one thread). Other catalogs keep such windows
     * (regex-200: 0.41-0.43 with them, 0.20-0.27 without). */
    for (uint32_t j = 0; j < p->n_nfa; j++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, j, &cn);
        e.strict |= (cn.flags & CAT_GF_CONFIRM) != 0;
    }
    if (rc == 0)
        rc = collect(cat, report, ng, win, true, &e);
    for (uint32_t g = 0; rc == 0 && g < ng; g++) {
        p->mode[g] = lit[g]      ? CPUPLAN_LIT
                     : shadow[g] ? CPUPLAN_SHADOW
                     : win[g]    ? CPUPLAN_WINDOW
                                 : CPUPLAN_FULL;
        p->n_lit_groups += lit[g] != 0;
        p->n_window_groups += p->mode[g] == CPUPLAN_WINDOW;
        p->n_shadow_groups += p->mode[g] == CPUPLAN_SHADOW;
    }
    if (rc == 0)
        rc = plan_walks(cat, p);
    if (rc == 0 && p->gated_full)
        rc = plan_factor_walks(cat, p);
    if (rc == 0 && p->gated_full && gate_lit_on())
        rc = plan_gate_strings(cat, p, &e);
    if (rc == 0)
        rc = make_matcher(&e, p->mode, p);
    if (rc == 0 && e.n_sec > 0) { /* the plan takes them over */
        p->second = e.sec, p->n_second = e.n_sec, p->sec_str = e.sstr;
        p->sec_b = e.spool.b, p->sec_m = e.spool.m;
        e.sec = NULL, e.sstr = NULL, e.spool.b = e.spool.m = NULL;
    }
    entries_finish(&e);
    free(report);
    free(lit);
    free(win);
    free(shadow);
    return rc;
}

/* The idle bytes of DFA group `g` (struct cpuplan_skip). */
static void plan_skip(const struct catalog *cat, uint32_t g, struct cpuplan_skip *k)
{
    struct catalog_group cg;
    catalog_group(cat, g, &cg);
    memset(k, 0, sizeof(*k));
    for (int j = 0; j < 3; j++) {
        k->st[j] = cg.start[j + 1];
        if (k->st[j] >= cg.first_accept)
            return; /* an accepting start state reports at every byte */
    }
    uint32_t idle = 0;
    for (unsigned c = 0; c < 256; c++) {
        uint32_t kind = catalog_byte_kind((uint8_t)c);
        uint32_t next = kind == CAT_K_WORD ? k->st[0] : kind == CAT_K_NL ? k->st[1] : k->st[2];
        bool all = true;
        for (int j = 0; j < 3 && all; j++)
            all = cg.trans[(size_t)k->st[j] * cg.n_classes + cg.classmap[c]] == next;
        k->idle[c] = all;
        idle += all;
    }
    k->on = idle > 0;
}

static void plan_free(struct cpuplan *p)
{
    if (p == NULL)
        return;
    free(p->walks);
    free(p->skip);
    plan_free(p->shadow_plan);
    catalog_destroy(p->shadow);
    free(p->shadow_rule);
    cpulit_destroy(p->lit);
    cpulit_destroy(p->gate_lit);
    cpupair_destroy(p->pair);
    cpurun_destroy(p->run);
    free(p->second);
    free(p->sec_str);
    free(p->sec_b);
    free(p->sec_m);
    free(p->factor_walk);
    free(p->unbounded);
    free(p->mode);
    free(p);
}

/* split_lb and unbounded (struct cpuplan). */
static int plan_split(const struct catalog *cat, struct cpuplan *p)
{
    p->split_lb = CPUSCAN_UNSEGMENTABLE;
    if (cpuscan_lookback(cat) != CPUSCAN_UNSEGMENTABLE)
        return 0;
    uint64_t lb = cpuscan_split_lookback(cat);
    if (lb == CPUSCAN_UNSEGMENTABLE)
        return 0;
    uint32_t n = catalog_rule_count(cat);
    if ((p->unbounded = calloc(n ? n : 1, 1)) == NULL)
        return -ENOMEM;
    for (uint32_t r = 0; r < n; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        p->unbounded[r] = cpuscan_group_maxlen(cat, cr.group) == CATALOG_UNBOUNDED;
    }
    p->split_lb = lb;
    return 0;
}

int cpuplan_build(const struct catalog *cat, bool fast, struct cpuplan **out)
{
    struct cpuplan *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    memcpy(p->fp, catalog_fingerprint(cat), CATALOG_FP_LEN);
    p->n_dfa = catalog_group_count(cat);
    p->n_nfa = catalog_nfa_count(cat);
    p->refs = 1;
    p->mode = calloc(p->n_dfa + p->n_nfa + 1, 1);
    p->skip = calloc(p->n_dfa + 1, sizeof(*p->skip));
    int rc = p->mode != NULL && p->skip != NULL ? 0 : -ENOMEM;
    for (uint32_t g = 0; rc == 0 && g < p->n_dfa; g++)
        plan_skip(cat, g, &p->skip[g]);
    if (rc == 0 && fast)
        rc = plan_fast(cat, p); /* with plan_walks */
    else if (rc == 0) {
        rc = plan_literal_groups(cat, p);
        if (rc == 0) /* every bit-NFA group FULL: gated ones on the factor groups */
            rc = plan_walks(cat, p);
    }
    if (rc == 0)
        rc = plan_split(cat, p);
    if (rc != 0) {
        plan_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* ---- the cache ---------------------------------------------------------- */

#define CACHE_SLOTS 8

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cpuplan *cache[CACHE_SLOTS];
static uint64_t cache_used[CACHE_SLOTS], cache_tick;
static bool plan_fast_paths = true;

/* Drops one reference (cache_mu held). */
static void unref(struct cpuplan *p)
{
    if (p != NULL && --p->refs == 0)
        plan_free(p);
}

/* The cached plan of fingerprint `fp`, with a reference for the caller, or
 * NULL. Called with cache_mu held. */
static struct cpuplan *cache_find(const uint8_t *fp)
{
    for (uint32_t i = 0; i < CACHE_SLOTS; i++) {
        if (cache[i] != NULL && memcmp(cache[i]->fp, fp, CATALOG_FP_LEN) == 0) {
            cache[i]->refs++;
            cache_used[i] = ++cache_tick;
            return cache[i];
        }
    }
    return NULL;
}

int cpuplan_get(const struct catalog *cat, struct cpuplan **out)
{
    const uint8_t *fp = catalog_fingerprint(cat);
    pthread_mutex_lock(&cache_mu);
    *out = cache_find(fp);
    bool fast = plan_fast_paths;
    pthread_mutex_unlock(&cache_mu);
    if (*out != NULL)
        return 0;
    /* Built without the lock (a shadow compile can take seconds): threads
     * scanning other catalogs go on. Two threads may build the same plan;
     * the first one cached is kept. */
    struct cpuplan *p;
    int rc = cpuplan_build(cat, fast, &p);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&cache_mu);
    struct cpuplan *cached = fast == plan_fast_paths ? cache_find(fp) : NULL;
    if (cached != NULL) {
        unref(p);
        p = cached;
    } else if (fast == plan_fast_paths) { /* else the mode changed: not cached */
        uint32_t victim = 0;
        for (uint32_t i = 1; i < CACHE_SLOTS && cache[victim] != NULL; i++)
            if (cache[i] == NULL || cache_used[i] < cache_used[victim])
                victim = i;
        unref(cache[victim]);
        cache[victim] = p;
        cache_used[victim] = ++cache_tick;
        p->refs = 2; /* the cache's and the caller's */
    }
    pthread_mutex_unlock(&cache_mu);
    *out = p;
    return 0;
}

void cpuplan_put(struct cpuplan *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&cache_mu);
    unref(p);
    pthread_mutex_unlock(&cache_mu);
}

void cpuplan_set_fast(bool fast)
{
    pthread_mutex_lock(&cache_mu);
    plan_fast_paths = fast;
    for (uint32_t i = 0; i < CACHE_SLOTS; i++) {
        unref(cache[i]);
        cache[i] = NULL;
    }
    pthread_mutex_unlock(&cache_mu);
}
