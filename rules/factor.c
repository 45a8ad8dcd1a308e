/*
 * Factor extraction (factor.h). One pass over the tree: every node gives
 * back whether it matches one fixed sequence of byte sets ("exact", kept
 * up to EXACT_MAX positions) and the best factor set it requires. A
 * concatenation joins the exact sequences of neighbouring children into
 * runs; assertions consume nothing, so they do not break a run.
 */
#include "factor.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXACT_MAX 256u

struct info {
    struct byteset alpha; /* every byte value the node may match */
    bool exact;
    uint32_t len;               /* exact: positions in seq */
    const struct byteset **seq; /* exact: malloc'd, len entries */
    bool has;                   /* fs holds a required set */
    struct factor_set *fs;      /* malloc'd */
};

static void info_free(struct info *in)
{
    free(in->seq);
    free(in->fs);
    memset(in, 0, sizeof(*in));
}

static uint32_t width(const struct byteset *s)
{
    uint32_t n = 0;
    for (int w = 0; w < 4; w++)
        n += (uint32_t)__builtin_popcountll(s->w[w]);
    return n;
}

/* Bits of selectivity of one position: 8 for one byte, 7 for two, 6 for
 * three or four. */
static uint32_t pos_weight(const struct byteset *s)
{
    uint32_t n = width(s);
    return n <= 1 ? 8 : n == 2 ? 7 : 6;
}

static void set_union(struct byteset *a, const struct byteset *b)
{
    for (int w = 0; w < 4; w++)
        a->w[w] |= b->w[w];
}

void factor_set_span_bytes(const struct factor_set *fs, uint32_t skip, struct byteset *out)
{
    for (uint32_t i = 0; i < fs->n; i++) {
        set_union(out, &fs->f[i].lead);
        for (uint32_t k = 0; k + skip < fs->f[i].len; k++)
            set_union(out, &fs->f[i].set[k]);
    }
}

uint32_t factor_set_min_len(const struct factor_set *fs)
{
    uint32_t m = fs->n ? UINT32_MAX : 0;
    for (uint32_t i = 0; i < fs->n; i++)
        m = fs->f[i].len < m ? fs->f[i].len : m;
    return m;
}

static uint32_t factor_weight(const struct factor *f)
{
    uint32_t w = 0;
    for (uint32_t i = 0; i < f->len; i++)
        w += pos_weight(&f->set[i]);
    return w;
}

uint32_t factor_set_bits(const struct factor_set *fs)
{
    uint32_t min = fs->n ? UINT32_MAX : 0;
    for (uint32_t i = 0; i < fs->n; i++) {
        uint32_t w = factor_weight(&fs->f[i]);
        min = w < min ? w : min;
    }
    return min;
}

/* The chance of byte c under factor_set_text_bits' model. */
static double text_chance(unsigned c)
{
    if (c >= 'a' && c <= 'z')
        return 0.025; /* 26 of them: 65% of text */
    if (c == ' ')
        return 0.12;
    if (c == '\n')
        return 0.02;
    if (c >= '0' && c <= '9')
        return 0.005;
    return 1.0 / 256;
}

/* The chance of a byte of set `s` under that model. */
static double set_text_chance(const struct byteset *s)
{
    double p = 0;
    for (unsigned c = 0; c < 256; c++)
        if (s->w[c >> 6] >> (c & 63) & 1)
            p += text_chance(c);
    return p < 1 ? p : 1;
}

double factor_span_break_chance(const struct byteset *span)
{
    double p = 0;
    for (unsigned c = 0; c < 256; c++)
        if (!(span->w[c >> 6] >> (c & 63) & 1))
            p += text_chance(c);
    return p < 1 ? p : 1;
}

static double set_text_bits(const struct byteset *s)
{
    double p = set_text_chance(s);
    return p > 0 ? -log2(p) : 64;
}

uint32_t factor_set_text_bits(const struct factor_set *fs)
{
    double p = 0;
    for (uint32_t i = 0; i < fs->n; i++) {
        double q = 1;
        for (uint32_t k = 0; k < fs->f[i].len; k++)
            q *= set_text_chance(&fs->f[i].set[k]);
        p += q;
    }
    if (fs->n == 0 || p >= 1)
        return 0;
    return (uint32_t)-log2(p);
}

uint32_t factor_set_pre(const struct factor_set *fs)
{
    uint32_t pre = 0;
    for (uint32_t i = 0; i < fs->n; i++)
        pre = fs->f[i].pre > pre ? fs->f[i].pre : pre;
    return pre;
}

/* Higher is better: a bounded lead (forward confirmation starts near the
 * factor, not at the buffer's start), then the weakest factor, then fewer
 * factors, then the set rarer in text (of `\x70\x5d.{75}\xff\xdc`'s two
 * anchors, the one without a letter). */
static uint64_t set_score(const struct factor_set *fs)
{
    uint64_t bounded = factor_set_pre(fs) != FACTOR_PRE_UNBOUNDED;
    uint64_t text = factor_set_text_bits(fs);
    return bounded << 48 | (uint64_t)factor_set_bits(fs) << 24 | (uint64_t)(64 - fs->n) << 16 |
           (text < 0xffff ? text : 0xffff);
}

/* Offers `cand` as the node's set; keeps the better one. */
static void offer(struct info *in, const struct factor_set *cand)
{
    if (!in->has || set_score(cand) > set_score(in->fs)) {
        *in->fs = *cand;
        in->has = true;
    }
}

static uint32_t add_sat(uint32_t a, uint32_t b)
{
    uint64_t s = (uint64_t)a + b;
    return a == FACTOR_PRE_UNBOUNDED || b == FACTOR_PRE_UNBOUNDED || s >= FACTOR_PRE_UNBOUNDED
               ? FACTOR_PRE_UNBOUNDED
               : (uint32_t)s;
}

/* Offers a child's set, its factors' leads moved by the `base` bytes at
 * most that come before the child, whose byte values are `before`. */
static void offer_shifted(struct info *in, const struct factor_set *fs, uint32_t base,
                          const struct byteset *before)
{
    struct factor_set cand_mem, *cand = &cand_mem; /* not malloc: see offer_run */
    *cand = *fs;
    for (uint32_t i = 0; i < cand->n; i++) {
        cand->f[i].pre = add_sat(cand->f[i].pre, base);
        set_union(&cand->f[i].lead, before);
    }
    offer(in, cand);
}

/* The best window of up to FACTOR_MAX_LEN narrow positions in seq[0..n),
 * a run that starts at most `base` bytes into the match after bytes of
 * `before`, of `shortest` positions or more; a window shorter than
 * FACTOR_MIN_LEN only of single bytes (factor_extract_weak). */
static void offer_run(struct info *in, const struct byteset *const *seq, uint32_t n, uint32_t base,
                      const struct byteset *before, uint32_t shortest)
{
    /* On the stack, not malloc: a failed allocation here would silently
     * weaken the set and make the catalog depend on memory pressure. */
    struct factor_set cand_mem, *cand = &cand_mem;
    uint32_t best_w = 0, best_at = 0, best_len = 0;
    double best_text = 0;
    for (uint32_t at = 0; at < n; at++) {
        uint32_t w = 0, len = 0;
        double text = 0; /* -log2 of its chance in text: ties go to the rarer */
        while (at + len < n && len < FACTOR_MAX_LEN && width(seq[at + len]) <= FACTOR_MAX_WIDTH &&
               width(seq[at + len]) > 0) {
            w += pos_weight(seq[at + len]);
            text += set_text_bits(seq[at + len]);
            len++;
        }
        bool ok = len >= FACTOR_MIN_LEN || (len >= shortest && w == 8 * len);
        if (ok && (w > best_w || (w == best_w && text > best_text))) {
            best_w = w;
            best_at = at;
            best_len = len;
            best_text = text;
        }
    }
    if (best_len > 0) {
        cand->n = 1;
        cand->f[0].len = best_len;
        cand->f[0].pre = add_sat(base, best_at + best_len);
        cand->f[0].lead = *before;
        for (uint32_t i = 0; i < best_at; i++)
            set_union(&cand->f[0].lead, seq[i]);
        for (uint32_t i = 0; i < best_len; i++)
            cand->f[0].set[i] = *seq[best_at + i];
        offer(in, cand);
    }
}

static int analyze(const struct node *n, uint32_t depth, uint32_t shortest, struct info *out);

static int seq_append(const struct byteset ***seq, uint32_t *len, const struct byteset *const *add,
                      uint32_t n)
{
    const struct byteset **s = realloc(*seq, ((size_t)*len + n + 1) * sizeof(*s));
    if (s == NULL)
        return -ENOMEM;
    if (n > 0)
        memcpy(s + *len, add, n * sizeof(*s));
    *seq = s;
    *len += n;
    return 0;
}

static int analyze_cat(const struct node *n, uint32_t depth, uint32_t shortest, struct info *out)
{
    const struct byteset **run = NULL;
    uint32_t run_len = 0, run_base = 0, before = 0; /* most bytes before kid k */
    struct byteset seen = {0}, run_seen = {0};      /* byte values before kid k, the run */
    bool all_exact = true;
    int rc = 0;
    for (uint32_t k = 0; k < n->u.list.n && rc == 0; k++) {
        struct info kid;
        rc = analyze(n->u.list.kids[k], depth + 1, shortest, &kid);
        if (rc != 0)
            break;
        if (kid.exact && run_len + kid.len <= EXACT_MAX) {
            if (run_len == 0) {
                run_base = before;
                run_seen = seen;
            }
            rc = seq_append(&run, &run_len, kid.seq, kid.len);
        } else {
            offer_run(out, run, run_len, run_base, &run_seen, shortest);
            run_len = 0;
            run_base = before;
            run_seen = seen;
            if (kid.exact) { /* too long to join: starts the next run */
                all_exact = false;
                rc = seq_append(&run, &run_len, kid.seq, kid.len);
            } else {
                all_exact = false;
                if (kid.has)
                    offer_shifted(out, kid.fs, before, &seen);
            }
        }
        set_union(&seen, &kid.alpha);
        /* an exact child is one byte per set; assertions consume nothing */
        before = add_sat(before, kid.exact ? kid.len : parse_maxlen(n->u.list.kids[k]));
        info_free(&kid);
    }
    if (rc == 0)
        offer_run(out, run, run_len, run_base, &run_seen, shortest);
    out->alpha = seen;
    if (rc == 0 && all_exact) {
        out->exact = true;
        out->seq = run;
        out->len = run_len;
        run = NULL;
    }
    free(run);
    return rc;
}

static bool same_factor(const struct factor *a, const struct factor *b)
{
    return a->len == b->len && memcmp(a->set, b->set, a->len * sizeof(a->set[0])) == 0;
}

static int analyze_alt(const struct node *n, uint32_t depth, uint32_t shortest, struct info *out)
{
    struct factor_set *u = calloc(1, sizeof(*u));
    if (u == NULL)
        return -ENOMEM;
    bool ok = true;
    int rc = 0;
    /* every branch is analyzed for its byte values, also once the set is lost */
    for (uint32_t k = 0; k < n->u.list.n && rc == 0; k++) {
        struct info kid;
        rc = analyze(n->u.list.kids[k], depth + 1, shortest, &kid);
        if (rc != 0)
            break;
        if (n->u.list.n == 1 && kid.exact) { /* a group of one branch is its child */
            out->exact = true;
            out->seq = kid.seq;
            out->len = kid.len;
            kid.seq = NULL;
        }
        set_union(&out->alpha, &kid.alpha);
        ok = ok && kid.has;
        for (uint32_t i = 0; ok && i < kid.fs->n; i++) {
            bool dup = false;
            for (uint32_t j = 0; j < u->n && !dup; j++) {
                dup = same_factor(&u->f[j], &kid.fs->f[i]);
                if (dup && kid.fs->f[i].pre > u->f[j].pre)
                    u->f[j].pre = kid.fs->f[i].pre;
                if (dup)
                    set_union(&u->f[j].lead, &kid.fs->f[i].lead);
            }
            if (dup)
                continue;
            if (u->n == FACTOR_MAX_COUNT)
                ok = false;
            else
                u->f[u->n++] = kid.fs->f[i];
        }
        info_free(&kid);
    }
    if (rc == 0 && ok && u->n > 0)
        offer(out, u);
    free(u);
    return rc;
}

static int analyze_repeat(const struct node *n, uint32_t depth, uint32_t shortest, struct info *out)
{
    struct info kid;
    int rc = analyze(n->u.rep.kid, depth + 1, shortest, &kid);
    if (rc != 0)
        return rc;
    uint32_t min = n->u.rep.min, max = n->u.rep.max;
    out->alpha = kid.alpha;
    if (min >= 1 && kid.exact && (uint64_t)kid.len * min <= EXACT_MAX) {
        /* min copies in a row are required; exactly that when min == max */
        const struct byteset **seq = NULL;
        uint32_t len = 0;
        for (uint32_t i = 0; i < min && rc == 0; i++)
            rc = seq_append(&seq, &len, kid.seq, kid.len);
        if (rc == 0)
            offer_run(out, seq, len, 0, &(struct byteset){{0}}, shortest);
        if (rc == 0 && min == max) {
            out->exact = true;
            out->seq = seq;
            out->len = len;
            seq = NULL;
        }
        free(seq);
    }
    if (rc == 0 && min >= 1 && kid.has)
        offer(out, kid.fs);
    info_free(&kid);
    return rc;
}

static int analyze(const struct node *n, uint32_t depth, uint32_t shortest, struct info *out)
{
    memset(out, 0, sizeof(*out));
    out->fs = malloc(sizeof(*out->fs));
    if (out->fs == NULL)
        return -ENOMEM;
    out->fs->n = 0;
    int rc = 0;
    if (depth > 1000) { /* parse limits nesting long before this */
        memset(&out->alpha, 0xff, sizeof(out->alpha));
        return 0;
    }
    switch (n->type) {
    case N_SET:
        out->alpha = n->u.set;
        out->exact = true;
        rc = seq_append(&out->seq, &out->len, (const struct byteset *const[]){&n->u.set}, 1);
        break;
    case N_ASSERT:
        out->exact = true;
        break;
    case N_CAT:
        rc = analyze_cat(n, depth, shortest, out);
        break;
    case N_ALT:
        rc = analyze_alt(n, depth, shortest, out);
        break;
    case N_REPEAT:
        rc = analyze_repeat(n, depth, shortest, out);
        break;
    }
    if (rc != 0)
        info_free(out);
    return rc;
}

static int extract(const struct node *root, uint32_t shortest, struct factor_set *out)
{
    struct info in;
    int rc = analyze(root, 0, shortest, &in);
    if (rc != 0)
        return rc;
    rc = in.has ? 0 : -ENOENT;
    if (rc == 0)
        *out = *in.fs;
    info_free(&in);
    return rc;
}

int factor_extract(const struct node *root, struct factor_set *out)
{
    return extract(root, FACTOR_MIN_LEN, out);
}

int factor_extract_weak(const struct node *root, struct factor_set *out)
{
    return extract(root, FACTOR_WEAK_LEN, out);
}

static bool caseless_pair(const struct byteset *s, uint8_t *lower)
{
    if (width(s) != 2)
        return false;
    for (unsigned c = 'a'; c <= 'z'; c++)
        if (byteset_has(s, c) && byteset_has(s, c - 32)) {
            *lower = (uint8_t)c;
            return true;
        }
    return false;
}

static size_t put(char *buf, size_t cap, size_t n, const char *s)
{
    for (; *s; s++, n++)
        if (n + 1 < cap)
            buf[n] = *s;
    return n;
}

static size_t put_byte(char *buf, size_t cap, size_t n, unsigned c)
{
    char tmp[8];
    if (c > 0x20 && c < 0x7f && c != '\\' && c != '[' && c != ']')
        snprintf(tmp, sizeof(tmp), "%c", (char)c);
    else
        snprintf(tmp, sizeof(tmp), "\\x%02x", c);
    return put(buf, cap, n, tmp);
}

size_t factor_format(const struct factor *f, char *buf, size_t cap)
{
    bool caseless = true, any_pair = false;
    uint8_t lc;
    for (uint32_t i = 0; i < f->len; i++) {
        const struct byteset *s = &f->set[i];
        bool pair = caseless_pair(s, &lc);
        any_pair |= pair;
        bool letter = false;
        for (unsigned c = 'A'; c <= 'z' && width(s) == 1; c++)
            letter |= byteset_has(s, c) && (c <= 'Z' || c >= 'a');
        caseless &= pair || (width(s) == 1 && !letter);
    }
    caseless &= any_pair;
    size_t n = put(buf, cap, 0, caseless ? "(?i)" : "");
    for (uint32_t i = 0; i < f->len; i++) {
        const struct byteset *s = &f->set[i];
        if (caseless && caseless_pair(s, &lc)) {
            n = put_byte(buf, cap, n, lc);
        } else if (width(s) == 1) {
            unsigned c = 0;
            while (!byteset_has(s, c))
                c++;
            n = put_byte(buf, cap, n, c);
        } else {
            n = put(buf, cap, n, "[");
            for (unsigned c = 0; c < 256; c++)
                if (byteset_has(s, c))
                    n = put_byte(buf, cap, n, c);
            n = put(buf, cap, n, "]");
        }
    }
    if (cap > 0)
        buf[n < cap ? n : cap - 1] = '\0';
    return n;
}
