/*
 * The packed catalog: validation, views and fingerprints. The layout is in
 * catalog.h and docs/catalog.md; the writer is in compile.c.
 */
#include "catalog.h"

#include <errno.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "som.h"

struct catalog {
    uint32_t *words;
    size_t n_words;
    uint32_t *x_index;                /* per bit-NFA group: x_narrow, x_span */
    struct catalog_nfa_small **small; /* per bit-NFA group: its masks, or NULL */
    uint8_t fp[CATALOG_FP_LEN];
    uint32_t rule_flags; /* OR of every rule's RULE_F_* */
    uint32_t cpu_weight; /* catalog_cpu_weight */
    /* Start-of-match finders (som.h), made on first use by any thread: the
     * one mutable part of a catalog, published by compare-and-swap. */
    _Atomic(struct som_set *) som;
};

/* Host byte order must be little-endian: the words are used in place. */
static int check_host_endian(struct vks_error *err)
{
    const uint32_t probe = 1;
    uint8_t first;
    memcpy(&first, &probe, 1);
    if (first != 1)
        return vks_error_set(err, -ENOTSUP, "catalogs are little-endian; this host is not");
    return 0;
}

/* [off, off + len) within [lo, n) */
static bool in_range(uint64_t off, uint64_t len, uint64_t lo, uint64_t n)
{
    return off >= lo && off <= n && len <= n - off;
}

static int bad(struct vks_error *err, const char *what, uint64_t i)
{
    return vks_error_set(err, -EINVAL,
                         "corrupt catalog: %s (item %llu); recompile the rules instead of "
                         "trusting this file",
                         what, (unsigned long long)i);
}

static int validate_group(const uint32_t *w, size_t n, uint32_t g, uint32_t n_rules, uint32_t body,
                          struct vks_error *err)
{
    const uint32_t *e = w + w[CAT_H_GROUPS] + (size_t)g * CAT_GROUP_WORDS;
    uint64_t ns = e[CAT_G_NSTATES], nc = e[CAT_G_NCLASSES], fa = e[CAT_G_FIRST_ACCEPT];
    if (ns == 0 || nc == 0 || nc > 256 || fa > ns)
        return bad(err, "group has bad state or class counts", g);
    for (int k = CAT_G_START_BOS; k <= CAT_G_START_OTHER; k++)
        if (e[k] >= ns)
            return bad(err, "group start state out of range", g);
    if (!in_range(e[CAT_G_CLASSMAP], 256, body, n) || !in_range(e[CAT_G_TRANS], ns * nc, body, n) ||
        !in_range(e[CAT_G_ACCIDX], ns - fa + 1, body, n))
        return bad(err, "group table points outside the catalog", g);
    const uint32_t *cm = w + e[CAT_G_CLASSMAP];
    for (int c = 0; c < 256; c++)
        if (cm[c] >= nc)
            return bad(err, "class map entry out of range", g);
    const uint32_t *tr = w + e[CAT_G_TRANS];
    for (uint64_t i = 0; i < ns * nc; i++)
        if (tr[i] >= ns)
            return bad(err, "transition to a state that does not exist", g);
    const uint32_t *ai = w + e[CAT_G_ACCIDX];
    uint64_t n_acc = ai[ns - fa];
    if (!in_range(e[CAT_G_ACCEPTS], n_acc, body, n))
        return bad(err, "accept list outside the catalog", g);
    for (uint64_t s = 0; s < ns - fa; s++)
        if (ai[s] > ai[s + 1] || (s == 0 && ai[0] != 0) || ai[s + 1] == ai[s])
            return bad(err, "accept index not increasing, or an accepting state accepts nothing",
                       g);
    const uint32_t *acc = w + e[CAT_G_ACCEPTS];
    if (e[CAT_G_FLAGS] & ~(CAT_GF_ASSERTS | CAT_GF_FACTOR | CAT_GF_LITERAL))
        return bad(err, "unknown group flags", g);
    if (e[CAT_G_FLAGS] & CAT_GF_LITERAL) {
        /* no DFA of its own: one state that accepts nothing; its rules are
         * read from their sources (a rule that is not a plain string is
         * skipped by the scanners, never walked) */
        if (e[CAT_G_FLAGS] != CAT_GF_LITERAL || ns != 1 || fa != 1 || e[CAT_G_NRULES] == 0 ||
            e[CAT_G_NRULES] > n_rules || e[CAT_G_MAXLEN] < CAT_LITERAL_MIN_LEN ||
            e[CAT_G_MAXLEN] > CAT_LITERAL_MAX_LEN)
            return bad(err, "literal group has other flags, states, no rules or a bad length", g);
        return 0;
    }
    if (e[CAT_G_FLAGS] & CAT_GF_FACTOR) {
        /* entries name bit-NFA groups, with mask 0 */
        uint32_t nn = w[CAT_H_NNFAS];
        if ((e[CAT_G_FLAGS] & CAT_GF_ASSERTS) || e[CAT_G_MAXLEN] == CATALOG_UNBOUNDED)
            return bad(err, "factor group has assertions or an unbounded length", g);
        for (uint64_t i = 0; i < n_acc; i++)
            if (CAT_ACCEPT_RULE(acc[i]) >= nn || CAT_ACCEPT_MASK(acc[i]) != 0)
                return bad(err, "factor group entry names no bit-NFA group or has a mask", g);
        return 0;
    }
    for (uint64_t i = 0; i < n_acc; i++)
        if (CAT_ACCEPT_RULE(acc[i]) >= n_rules || CAT_ACCEPT_MASK(acc[i]) == 0)
            return bad(err, "accept entry names a rule that does not exist", g);
    return 0;
}

/* Ranges first .. first+count-1 exist, lie within the positions and, taken
 * as one list (sources) or two (sources, then targets from `split`), are
 * ascending and disjoint: scanners test a list's span first. */
static bool ranges_ok(const uint32_t *rg, uint64_t n_ranges, uint64_t first, uint64_t count,
                      uint64_t split, uint32_t n_bits)
{
    if (first > n_ranges || count > n_ranges - first)
        return false;
    for (uint64_t r = first; r < first + count; r++) {
        if (rg[2 * r] > rg[2 * r + 1] || rg[2 * r + 1] >= n_bits)
            return false;
        if (r > first && r != first + split && rg[2 * r] <= rg[2 * r - 1])
            return false;
    }
    return true;
}

/* Bits past n_bits must stay clear: a shift could carry them into the
 * state otherwise. */
static bool tail_clear(const uint32_t *v, uint32_t n_bits, uint32_t n_words)
{
    return n_bits % 32 == 0 || (v[n_words - 1] >> (n_bits % 32)) == 0;
}

static int validate_nfa(const uint32_t *w, size_t n, uint32_t g, uint32_t n_rules, uint32_t body,
                        struct vks_error *err)
{
    const uint32_t *e = w + w[CAT_H_NFAS] + (size_t)g * CAT_NFA_WORDS;
    uint32_t nb = e[CAT_N_NBITS], nw = e[CAT_N_NWORDS], nc = e[CAT_N_NCLASSES];
    uint64_t nx = e[CAT_N_NEXC], na = e[CAT_N_NACC], nr = e[CAT_N_NRANGES];
    if (nb == 0 || nb > CAT_NFA_MAX_BITS || nw != (nb + 31) / 32 || nb > w[CAT_H_MAXBITS])
        return bad(err, "bit-NFA group has a bad bit count", g);
    if (nc == 0 || nc > 256 || e[CAT_N_NRULES] == 0 ||
        (e[CAT_N_FLAGS] & ~(CAT_GF_ASSERTS | CAT_GF_GATED | CAT_GF_CONFIRM)) ||
        (e[CAT_N_FLAGS] & (CAT_GF_GATED | CAT_GF_CONFIRM)) == CAT_GF_CONFIRM)
        return bad(err, "bit-NFA group has bad class or rule counts or flags", g);
    if (!in_range(e[CAT_N_CLASSMAP], 256, body, n) ||
        !in_range(e[CAT_N_REACH], (uint64_t)nc * nw, body, n) ||
        !in_range(e[CAT_N_SHIFT], nw, body, n) ||
        !in_range(e[CAT_N_EXC], nx * CAT_X_WORDS, body, n) ||
        !in_range(e[CAT_N_ACC], na * CAT_X_WORDS, body, n) ||
        !in_range(e[CAT_N_RANGES], nr * 2, body, n) ||
        (e[CAT_N_SPAN] != 0 && !in_range(e[CAT_N_SPAN], 9, body, n)))
        return bad(err, "bit-NFA group table points outside the catalog", g);
    if (e[CAT_N_SPAN] != 0 && !(e[CAT_N_FLAGS] & CAT_GF_GATED))
        return bad(err, "bit-NFA group has a span set but is not gated", g);
    const uint32_t *cm = w + e[CAT_N_CLASSMAP];
    for (int c = 0; c < 256; c++)
        if (cm[c] >= nc)
            return bad(err, "bit-NFA class map entry out of range", g);
    for (uint32_t c = 0; c < nc; c++)
        if (!tail_clear(w + e[CAT_N_REACH] + (size_t)c * nw, nb, nw))
            return bad(err, "bit-NFA reach row has bits past the last position", g);
    if (!tail_clear(w + e[CAT_N_SHIFT], nb, nw))
        return bad(err, "bit-NFA shift mask has bits past the last position", g);
    const uint32_t *rg = w + e[CAT_N_RANGES];
    const uint32_t *x = w + e[CAT_N_EXC];
    for (uint64_t i = 0; i < nx; i++, x += CAT_X_WORDS) {
        if (x[CAT_X_COND] == 0 || (x[CAT_X_COND] & ~CAT_COND_ALL) || x[CAT_X_NTGT] == 0 ||
            !ranges_ok(rg, nr, x[CAT_X_FIRST], (uint64_t)x[CAT_X_NSRC] + x[CAT_X_NTGT],
                       x[CAT_X_NSRC], nb))
            return bad(err, "bit-NFA exception entry is malformed", g);
        if (i > 0 && x[CAT_X_NSRC] == 0 && (x - CAT_X_WORDS)[CAT_X_NSRC] != 0)
            return bad(err, "bit-NFA start exceptions (no sources) do not come first", g);
    }
    const uint32_t *a = w + e[CAT_N_ACC];
    for (uint64_t i = 0; i < na; i++, a += CAT_X_WORDS)
        if (a[CAT_A_RULE] >= n_rules || (i > 0 && a[CAT_A_RULE] < (a - CAT_X_WORDS)[CAT_A_RULE]) ||
            a[CAT_A_COND] == 0 || (a[CAT_A_COND] & ~CAT_COND_ALL) || a[CAT_A_NSRC] == 0 ||
            !ranges_ok(rg, nr, a[CAT_A_FIRST], a[CAT_A_NSRC], a[CAT_A_NSRC], nb))
            return bad(err, "bit-NFA accept entry is malformed or out of rule order", g);
    return 0;
}

/* Every gated bit-NFA group is bounded (unbounded when forward-confirmed,
 * CAT_GF_CONFIRM) and named by some factor group's entry: otherwise a
 * gating scanner would never walk it. Runs after the
 * groups are validated, so their tables are in range. */
static int validate_gates(const uint32_t *w, uint32_t ng, uint32_t nn, struct vks_error *err)
{
    for (uint32_t j = 0; j < nn; j++) {
        const uint32_t *e = w + w[CAT_H_NFAS] + (size_t)j * CAT_NFA_WORDS;
        if (!(e[CAT_N_FLAGS] & CAT_GF_GATED))
            continue;
        bool named = false;
        for (uint32_t g = 0; g < ng && !named; g++) {
            const uint32_t *ge = w + w[CAT_H_GROUPS] + (size_t)g * CAT_GROUP_WORDS;
            if (!(ge[CAT_G_FLAGS] & CAT_GF_FACTOR))
                continue;
            const uint32_t *ai = w + ge[CAT_G_ACCIDX];
            const uint32_t *acc = w + ge[CAT_G_ACCEPTS];
            uint32_t na = ai[ge[CAT_G_NSTATES] - ge[CAT_G_FIRST_ACCEPT]];
            for (uint32_t i = 0; i < na && !named; i++)
                named = CAT_ACCEPT_RULE(acc[i]) == j;
        }
        bool confirm = (e[CAT_N_FLAGS] & CAT_GF_CONFIRM) != 0;
        if ((e[CAT_N_MAXLEN] == CATALOG_UNBOUNDED) != confirm || !named)
            return bad(err, "gated bit-NFA group is unbounded or no factor group names it", j);
    }
    return 0;
}

static int validate(const uint32_t *w, size_t n, struct vks_error *err)
{
    if (n < CAT_HEADER_WORDS)
        return vks_error_set(err, -EINVAL, "catalog truncated: %zu bytes, a header alone is %u",
                             n * 4, CAT_HEADER_WORDS * 4);
    if (w[CAT_H_MAGIC] != CATALOG_MAGIC)
        return vks_error_set(err, -EINVAL, "not a vkscan catalog (bad magic 0x%08x)",
                             w[CAT_H_MAGIC]);
    if (w[CAT_H_VERSION] != CATALOG_VERSION)
        return vks_error_set(err, -EINVAL,
                             "catalog format version %u, this build reads version %u: recompile "
                             "the rules",
                             w[CAT_H_VERSION], CATALOG_VERSION);
    if (w[CAT_H_WORDS] != n)
        return vks_error_set(err, -EINVAL,
                             "catalog size mismatch: header says %u words, got %zu (truncated?)",
                             w[CAT_H_WORDS], n);
    uint64_t ng = w[CAT_H_NGROUPS], nr = w[CAT_H_NRULES], nn = w[CAT_H_NNFAS];
    uint32_t body = CAT_HEADER_WORDS;
    if (!in_range(w[CAT_H_GROUPS], ng * CAT_GROUP_WORDS, body, n) ||
        !in_range(w[CAT_H_NFAS], nn * CAT_NFA_WORDS, body, n) ||
        !in_range(w[CAT_H_RULES], nr * CAT_RULE_WORDS, body, n) ||
        !in_range(w[CAT_H_STRINGS], ((uint64_t)w[CAT_H_STRBYTES] + 3) / 4, body, n))
        return bad(err, "header points outside the catalog", 0);
    for (uint32_t g = 0; g < ng; g++) {
        int rc = validate_group(w, n, g, (uint32_t)nr, body, err);
        if (rc != 0)
            return rc;
    }
    if ((nn == 0) != (w[CAT_H_MAXBITS] == 0) || w[CAT_H_MAXBITS] > CAT_NFA_MAX_BITS)
        return bad(err, "header's largest bit-NFA size does not fit its groups", 0);
    for (uint32_t g = 0; g < nn; g++) {
        int rc = validate_nfa(w, n, g, (uint32_t)nr, body, err);
        if (rc != 0)
            return rc;
    }
    int rc = validate_gates(w, (uint32_t)ng, (uint32_t)nn, err);
    if (rc != 0)
        return rc;
    uint64_t sb = w[CAT_H_STRBYTES];
    for (uint32_t r = 0; r < nr; r++) {
        const uint32_t *e = w + w[CAT_H_RULES] + (size_t)r * CAT_RULE_WORDS;
        if (!in_range(e[CAT_R_ID], e[CAT_R_IDLEN], 0, sb) ||
            !in_range(e[CAT_R_SRC], e[CAT_R_SRCLEN], 0, sb) || e[CAT_R_IDLEN] == 0)
            return bad(err, "rule strings outside the string area", r);
        if (e[CAT_R_GROUP] >= ng + nn || e[CAT_R_KIND] > 2 || (e[CAT_R_FLAGS] & ~RULE_F_ALL))
            return bad(err, "rule has a bad group, kind or flags", r);
        const uint32_t *ge = w + w[CAT_H_GROUPS] + (size_t)e[CAT_R_GROUP] * CAT_GROUP_WORDS;
        if (e[CAT_R_GROUP] < ng && (ge[CAT_G_FLAGS] & CAT_GF_LITERAL) &&
            (e[CAT_R_FLAGS] & RULE_F_SOMLEFT))
            return bad(err, "rule of a literal group wants its start of match", r);
    }
    return 0;
}

/* The fingerprint hashes the catalog with its check word zeroed, and the
 * check word is the fingerprint's first four bytes: one pass both seals and
 * verifies, and any flipped bit is caught. */
static void fingerprint_words(uint32_t *w, size_t n, uint8_t fp[CATALOG_FP_LEN])
{
    uint32_t check = w[CAT_H_CHECK];
    w[CAT_H_CHECK] = 0;
    crypto_generichash(fp, CATALOG_FP_LEN, (const unsigned char *)w, n * 4, NULL, 0);
    w[CAT_H_CHECK] = check;
}

static uint32_t check_word(const uint8_t fp[CATALOG_FP_LEN])
{
    uint32_t c;
    memcpy(&c, fp, sizeof(c));
    return c;
}

/* Finds each bit-NFA group's sorted narrow suffix of exceptions (struct
 * catalog_nfa x_narrow, x_span): the longest run at the end whose sources
 * span at most CAT_X_NARROW_SPAN words past their first and whose first
 * words ascend. Any valid catalog has one, maybe empty (x_narrow = n_exc):
 * its steps then test every exception, as before the compiler sorted them. */
/* The mask of positions in the n ranges rg (inclusive [lo, hi] pairs),
 * all below 128. */
static catalog_mask ranges_mask(const uint32_t *rg, uint32_t n)
{
    catalog_mask m = 0;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t p = rg[2 * r]; p <= rg[2 * r + 1]; p++)
            m |= (catalog_mask)1 << p;
    return m;
}

/* Words w[0..n) as one mask. */
static catalog_mask words_mask(const uint32_t *w, uint32_t n)
{
    catalog_mask m = 0;
    for (uint32_t k = 0; k < n; k++)
        m |= (catalog_mask)w[k] << (32 * k);
    return m;
}

/* Builds the masks of each bit-NFA group of at most 128 positions
 * (struct catalog_nfa_small), in one allocation each. */
static int build_small(struct catalog *cat)
{
    const uint32_t *w = cat->words;
    uint32_t nn = w[CAT_H_NNFAS];
    cat->small = calloc(nn ? nn : 1, sizeof(*cat->small));
    if (cat->small == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < nn; i++) {
        const uint32_t *e = w + w[CAT_H_NFAS] + (size_t)i * CAT_NFA_WORDS;
        if (e[CAT_N_NWORDS] > CATALOG_SMALL_WORDS)
            continue;
        uint32_t nc = e[CAT_N_NCLASSES], nx = e[CAT_N_NEXC], na = e[CAT_N_NACC];
        size_t bytes = sizeof(struct catalog_nfa_small) + (size_t)nc * sizeof(catalog_mask) +
                       (size_t)nx * sizeof(struct catalog_nfa_exc64) +
                       (size_t)na * sizeof(struct catalog_nfa_acc64);
        struct catalog_nfa_small *sm = calloc(1, bytes);
        if (sm == NULL)
            return -ENOMEM;
        catalog_mask *reach = (catalog_mask *)(sm + 1);
        struct catalog_nfa_exc64 *x = (struct catalog_nfa_exc64 *)(reach + nc);
        struct catalog_nfa_acc64 *a = (struct catalog_nfa_acc64 *)(x + nx);
        uint32_t nw = e[CAT_N_NWORDS];
        const uint32_t *rw = w + e[CAT_N_REACH], *sh = w + e[CAT_N_SHIFT],
                       *rg = w + e[CAT_N_RANGES];
        for (uint32_t c = 0; c < nc; c++)
            reach[c] = words_mask(rw + (size_t)c * nw, nw);
        sm->shift = words_mask(sh, nw);
        const uint32_t *xe = w + e[CAT_N_EXC];
        for (uint32_t k = 0; k < nx; k++, xe += CAT_X_WORDS) {
            const uint32_t *r = rg + 2 * (size_t)xe[CAT_X_FIRST];
            x[k].src = ranges_mask(r, xe[CAT_X_NSRC]);
            x[k].tgt = ranges_mask(r + 2 * (size_t)xe[CAT_X_NSRC], xe[CAT_X_NTGT]);
            x[k].cond = xe[CAT_X_COND];
        }
        const uint32_t *ae = w + e[CAT_N_ACC];
        for (uint32_t k = 0; k < na; k++, ae += CAT_X_WORDS) {
            a[k].src = ranges_mask(rg + 2 * (size_t)ae[CAT_A_FIRST], ae[CAT_A_NSRC]);
            a[k].cond = ae[CAT_A_COND];
            a[k].rule = ae[CAT_A_RULE];
            sm->acc_any |= a[k].src;
        }
        sm->reach = reach;
        sm->exc = x;
        sm->acc = a;
        sm->n_exc = nx;
        sm->n_acc = na;
        cat->small[i] = sm;
    }
    return 0;
}

static void free_small(struct catalog *cat)
{
    for (uint32_t i = 0; cat->small != NULL && i < cat->words[CAT_H_NNFAS]; i++)
        free(cat->small[i]);
    free(cat->small);
    cat->small = NULL;
}

static int index_exceptions(struct catalog *cat)
{
    const uint32_t *w = cat->words;
    uint32_t nn = w[CAT_H_NNFAS];
    cat->x_index = calloc(2 * (size_t)nn + 2, sizeof(uint32_t));
    if (cat->x_index == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < nn; i++) {
        const uint32_t *e = w + w[CAT_H_NFAS] + (size_t)i * CAT_NFA_WORDS;
        const uint32_t *x = w + e[CAT_N_EXC], *rg = w + e[CAT_N_RANGES];
        uint32_t k = e[CAT_N_NEXC], span = 0, next = UINT32_MAX;
        for (; k > 0; k--) {
            const uint32_t *p = x + (size_t)(k - 1) * CAT_X_WORDS;
            if (p[CAT_X_NSRC] == 0)
                break;
            uint32_t lo = catalog_exc_lo(p, rg), width = catalog_exc_hi(p, rg) - lo;
            if (width > CAT_X_NARROW_SPAN || lo > next)
                break;
            next = lo;
            span = width > span ? width : span;
        }
        cat->x_index[2 * i] = k;
        cat->x_index[2 * i + 1] = span;
    }
    return 0;
}

static int wrap(uint32_t *words, size_t n, bool seal, struct catalog **out, struct vks_error *err)
{
    *out = NULL;
    uint8_t fp[CATALOG_FP_LEN];
    int rc = check_host_endian(err);
    if (rc == 0 && sodium_init() < 0)
        rc = vks_error_set(err, -EIO, "libsodium failed to initialise");
    if (rc == 0 && n >= CAT_HEADER_WORDS) {
        fingerprint_words(words, n, fp);
        if (seal)
            words[CAT_H_CHECK] = check_word(fp);
        else if (words[CAT_H_MAGIC] == CATALOG_MAGIC && words[CAT_H_WORDS] == n &&
                 words[CAT_H_CHECK] != check_word(fp))
            rc = vks_error_set(err, -EINVAL,
                               "corrupt catalog: the check word does not match "
                               "its contents; recompile the rules");
    }
    if (rc == 0)
        rc = validate(words, n, err);
    struct catalog *cat = rc == 0 ? calloc(1, sizeof(*cat)) : NULL;
    if (rc == 0 && cat == NULL)
        rc = vks_error_set(err, -ENOMEM, "out of memory for a catalog of %zu bytes", n * 4);
    if (rc != 0) {
        free(words);
        return rc;
    }
    cat->words = words;
    cat->n_words = n;
    if (index_exceptions(cat) < 0 || build_small(cat) < 0) {
        free_small(cat);
        free(cat->x_index);
        free(words);
        free(cat);
        return vks_error_set(err, -ENOMEM, "out of memory for a catalog of %zu bytes", n * 4);
    }
    memcpy(cat->fp, fp, sizeof(fp));
    for (uint32_t r = 0; r < words[CAT_H_NRULES]; r++)
        cat->rule_flags |= words[words[CAT_H_RULES] + (size_t)r * CAT_RULE_WORDS + CAT_R_FLAGS];
    uint64_t weight = words[CAT_H_NGROUPS] + (uint64_t)CATALOG_NFA_WEIGHT * words[CAT_H_NNFAS];
    for (uint32_t g = 0; g < words[CAT_H_NNFAS]; g++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, g, &cn);
        if (cn.flags & CAT_GF_CONFIRM) {
            weight *= CATALOG_CONFIRM_WEIGHT;
            break;
        }
    }
    cat->cpu_weight = weight > UINT32_MAX ? UINT32_MAX : weight < 1 ? 1 : (uint32_t)weight;
    atomic_init(&cat->som, NULL);
    *out = cat;
    return 0;
}

int catalog_adopt(uint32_t *words, size_t n, struct catalog **out, struct vks_error *err)
{
    return wrap(words, n, true, out, err);
}

int catalog_from_bytes(const void *bytes, size_t len, struct catalog **out, struct vks_error *err)
{
    *out = NULL;
    if (len % 4 != 0)
        return vks_error_set(err, -EINVAL,
                             "catalog truncated: %zu bytes is not a whole number of words", len);
    uint32_t *w = malloc(len ? len : 4);
    if (w == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory for a catalog of %zu bytes", len);
    memcpy(w, bytes, len);
    return wrap(w, len / 4, false, out, err);
}

int catalog_from_words(uint32_t *words, size_t len, struct catalog **out, struct vks_error *err)
{
    *out = NULL;
    if (len % 4 != 0) {
        free(words);
        return vks_error_set(err, -EINVAL,
                             "catalog truncated: %zu bytes is not a whole number of words", len);
    }
    return wrap(words, len / 4, false, out, err);
}

void catalog_destroy(struct catalog *cat)
{
    if (cat == NULL)
        return;
    som_set_destroy(atomic_load(&cat->som));
    free_small(cat);
    free(cat->x_index);
    free(cat->words);
    free(cat);
}

uint32_t catalog_rule_flags_any(const struct catalog *cat)
{
    return cat->rule_flags;
}

uint32_t catalog_cpu_weight(const struct catalog *cat)
{
    return cat->cpu_weight;
}

struct som_set *catalog_som(const struct catalog *cat)
{
    struct catalog *c = (struct catalog *)cat; /* the finders are a cache */
    struct som_set *s = atomic_load(&c->som);
    if (s != NULL)
        return s;
    s = som_set_create(cat);
    struct som_set *was = NULL;
    if (s != NULL && !atomic_compare_exchange_strong(&c->som, &was, s)) {
        som_set_destroy(s); /* another thread was first */
        return was;
    }
    return s;
}

const uint32_t *catalog_words(const struct catalog *cat, size_t *n_words)
{
    if (n_words != NULL)
        *n_words = cat->n_words;
    return cat->words;
}

const uint8_t *catalog_fingerprint(const struct catalog *cat)
{
    return cat->fp;
}

void catalog_fingerprint_hex(const uint8_t fp[CATALOG_FP_LEN], char hex[2 * CATALOG_FP_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < CATALOG_FP_LEN; i++) {
        hex[2 * i] = digits[fp[i] >> 4];
        hex[2 * i + 1] = digits[fp[i] & 15];
    }
    hex[2 * CATALOG_FP_LEN] = '\0';
}

uint32_t catalog_group_count(const struct catalog *cat)
{
    return cat->words[CAT_H_NGROUPS];
}

uint32_t catalog_rule_count(const struct catalog *cat)
{
    return cat->words[CAT_H_NRULES];
}

void catalog_group(const struct catalog *cat, uint32_t i, struct catalog_group *out)
{
    const uint32_t *w = cat->words;
    const uint32_t *e = w + w[CAT_H_GROUPS] + (size_t)i * CAT_GROUP_WORDS;
    out->n_states = e[CAT_G_NSTATES];
    out->n_classes = e[CAT_G_NCLASSES];
    out->first_accept = e[CAT_G_FIRST_ACCEPT];
    for (int k = 0; k < 4; k++)
        out->start[k] = e[CAT_G_START_BOS + k];
    out->maxlen = e[CAT_G_MAXLEN];
    out->n_rules = e[CAT_G_NRULES];
    out->flags = e[CAT_G_FLAGS];
    out->classmap = w + e[CAT_G_CLASSMAP];
    out->trans = w + e[CAT_G_TRANS];
    out->accept_index = w + e[CAT_G_ACCIDX];
    out->accepts = w + e[CAT_G_ACCEPTS];
}

void catalog_rule(const struct catalog *cat, uint32_t i, struct catalog_rule *out)
{
    const uint32_t *w = cat->words;
    const uint32_t *e = w + w[CAT_H_RULES] + (size_t)i * CAT_RULE_WORDS;
    const char *str = (const char *)(w + w[CAT_H_STRINGS]);
    out->id = str + e[CAT_R_ID];
    out->id_len = e[CAT_R_IDLEN];
    out->src = str + e[CAT_R_SRC];
    out->src_len = e[CAT_R_SRCLEN];
    out->kind = e[CAT_R_KIND];
    out->flags = e[CAT_R_FLAGS];
    out->group = e[CAT_R_GROUP];
    out->maxlen = e[CAT_R_MAXLEN];
    out->fingerprint = (const uint8_t *)(e + CAT_R_FP);
}

static uint32_t id_hash(const char *id, uint32_t len)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (uint32_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)id[i]) * 16777619u;
    return h;
}

int catalog_report_indexes(const struct catalog *cat, uint32_t *report)
{
    uint32_t n = catalog_rule_count(cat), cap = 16;
    while (cap < 2 * (uint64_t)n)
        cap *= 2;
    uint32_t *slot = malloc(cap * sizeof(*slot)); /* rule + 1; 0: empty */
    if (slot == NULL)
        return -ENOMEM;
    memset(slot, 0, cap * sizeof(*slot));
    /* rules in order: the first rule with an id takes its slot */
    for (uint32_t r = 0; r < n; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        uint32_t h = id_hash(cr.id, cr.id_len) & (cap - 1);
        for (;; h = (h + 1) & (cap - 1)) {
            if (slot[h] == 0) {
                slot[h] = r + 1;
                report[r] = r;
                break;
            }
            struct catalog_rule first;
            catalog_rule(cat, slot[h] - 1, &first);
            if (first.id_len == cr.id_len && memcmp(first.id, cr.id, cr.id_len) == 0) {
                report[r] = slot[h] - 1;
                break;
            }
        }
    }
    free(slot);
    return 0;
}

uint32_t catalog_nfa_count(const struct catalog *cat)
{
    return cat->words[CAT_H_NNFAS];
}

void catalog_nfa(const struct catalog *cat, uint32_t i, struct catalog_nfa *out)
{
    const uint32_t *w = cat->words;
    const uint32_t *e = w + w[CAT_H_NFAS] + (size_t)i * CAT_NFA_WORDS;
    out->n_bits = e[CAT_N_NBITS];
    out->n_words = e[CAT_N_NWORDS];
    out->n_classes = e[CAT_N_NCLASSES];
    out->maxlen = e[CAT_N_MAXLEN];
    out->n_rules = e[CAT_N_NRULES];
    out->flags = e[CAT_N_FLAGS];
    out->n_exc = e[CAT_N_NEXC];
    out->n_acc = e[CAT_N_NACC];
    out->n_ranges = e[CAT_N_NRANGES];
    out->lookback = e[CAT_N_LOOKBACK];
    out->span = e[CAT_N_SPAN] != 0 ? w + e[CAT_N_SPAN] : NULL;
    out->small = cat->small[i];
    out->x_narrow = cat->x_index[2 * i];
    out->x_span = cat->x_index[2 * i + 1];
    out->classmap = w + e[CAT_N_CLASSMAP];
    out->reach = w + e[CAT_N_REACH];
    out->shift = w + e[CAT_N_SHIFT];
    out->exc = w + e[CAT_N_EXC];
    out->acc = w + e[CAT_N_ACC];
    out->ranges = w + e[CAT_N_RANGES];
}

uint64_t catalog_total_states(const struct catalog *cat)
{
    uint64_t t = 0;
    for (uint32_t g = 0; g < catalog_group_count(cat); g++) {
        struct catalog_group grp;
        catalog_group(cat, g, &grp);
        t += grp.n_states;
    }
    return t;
}
