/*
 * The packed catalog: round trips, rejection of corrupt or truncated
 * catalogs, fingerprints (stable, and sensitive to every rule byte and
 * flag), and the reference scanner's report modes.
 */
#include <check.h>
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "refscan.h"
#include "rules.h"

static const struct rule_src sample[] = {
    {.id = "word", .kind = RULE_REGEX, .pattern = "\\bfoo\\w*", .len = 8},
    {.id = "lit", .kind = RULE_LITERAL, .pattern = "bar", .len = 3, .flags = RULE_F_CASELESS},
    {.id = "hex", .kind = RULE_HEX, .pattern = "62 ?? 72", .len = 8},
    {.id = "once", .kind = RULE_REGEX, .pattern = "o+", .len = 2, .flags = RULE_F_SINGLEMATCH},
    {.id = "tail", .kind = RULE_REGEX, .pattern = "z$", .len = 2},
};
#define N_SAMPLE (sizeof(sample) / sizeof(sample[0]))

static struct catalog *compile(const struct rule_src *r, size_t n)
{
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(r, n, NULL, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    return cat;
}

static void hex_of(const struct catalog *cat, char hex[65])
{
    catalog_fingerprint_hex(catalog_fingerprint(cat), hex);
}

START_TEST(round_trip)
{
    struct catalog *a = compile(sample, N_SAMPLE);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    struct catalog *b;
    struct vks_error err;
    ck_assert_int_eq(catalog_from_bytes(w, n * 4, &b, &err), 0);
    size_t m;
    const uint32_t *w2 = catalog_words(b, &m);
    ck_assert_uint_eq(n, m);
    ck_assert(memcmp(w, w2, n * 4) == 0);
    ck_assert(memcmp(catalog_fingerprint(a), catalog_fingerprint(b), CATALOG_FP_LEN) == 0);
    ck_assert_uint_eq(catalog_rule_count(b), N_SAMPLE);
    for (uint32_t i = 0; i < N_SAMPLE; i++) {
        struct catalog_rule r;
        catalog_rule(b, i, &r);
        ck_assert_uint_eq(r.id_len, strlen(sample[i].id));
        ck_assert(memcmp(r.id, sample[i].id, r.id_len) == 0);
        ck_assert_uint_eq(r.flags, sample[i].flags);
        ck_assert_uint_eq(r.kind, sample[i].kind);
        uint8_t fp[CATALOG_FP_LEN];
        rules_fingerprint(&sample[i], fp);
        ck_assert(memcmp(fp, r.fingerprint, CATALOG_FP_LEN) == 0);
    }
    struct catalog_rule hx;
    catalog_rule(b, 2, &hx);
    ck_assert_uint_eq(hx.src_len, 8);
    ck_assert(memcmp(hx.src, "62 ?? 72", 8) == 0);
    /* scanning the copy gives the same hits */
    const char *hay = "foo bar BAR b-r fooz";
    struct scan_hits h1 = {0}, h2 = {0};
    refscan_buffer(a, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &h1);
    refscan_buffer(b, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &h2);
    ck_assert_uint_gt(h1.n, 5);
    ck_assert_uint_eq(h1.n, h2.n);
    ck_assert(memcmp(h1.v, h2.v, h1.n * sizeof(h1.v[0])) == 0);
    scan_hits_finish(&h1);
    scan_hits_finish(&h2);
    catalog_destroy(a);
    catalog_destroy(b);
}
END_TEST

START_TEST(truncated_rejected)
{
    struct catalog *a = compile(sample, N_SAMPLE);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    struct vks_error err;
    for (size_t len = 0; len < n * 4; len += (len < 128 ? 1 : 61)) {
        struct catalog *b = NULL;
        ck_assert_int_eq(catalog_from_bytes(w, len, &b, &err), -EINVAL);
        ck_assert_ptr_null(b);
        ck_assert(strstr(err.msg, "truncated") != NULL || strstr(err.msg, "corrupt") != NULL ||
                  strstr(err.msg, "size mismatch") != NULL);
    }
    catalog_destroy(a);
}
END_TEST

START_TEST(bit_flips_rejected)
{
    struct catalog *a = compile(sample, N_SAMPLE);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    uint32_t *copy = malloc(n * 4);
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < 2000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t bit = x % (n * 32);
        memcpy(copy, w, n * 4);
        copy[bit / 32] ^= 1u << (bit % 32);
        struct catalog *b = NULL;
        struct vks_error err;
        ck_assert_msg(catalog_from_bytes(copy, n * 4, &b, &err) == -EINVAL,
                      "flip of bit %zu accepted", bit);
        ck_assert_ptr_null(b);
    }
    free(copy);
    catalog_destroy(a);
}
END_TEST

/* Re-seals the check word, as a forger would, so structural validation
 * alone must catch the damage. */
static void reseal(uint32_t *w, size_t n)
{
    uint8_t fp[CATALOG_FP_LEN];
    w[CAT_H_CHECK] = 0;
    crypto_generichash(fp, sizeof(fp), (const unsigned char *)w, n * 4, NULL, 0);
    memcpy(&w[CAT_H_CHECK], fp, 4);
}

static void expect_structural_reject(const char *what, void (*damage)(uint32_t *w, size_t n),
                                     const char *msg_part)
{
    struct catalog *a = compile(sample, N_SAMPLE);
    size_t n;
    const uint32_t *w = catalog_words(a, &n);
    uint32_t *copy = malloc(n * 4);
    memcpy(copy, w, n * 4);
    damage(copy, n);
    reseal(copy, n);
    struct catalog *b = NULL;
    struct vks_error err;
    int rc = catalog_from_bytes(copy, n * 4, &b, &err);
    ck_assert_msg(rc == -EINVAL, "%s accepted", what);
    ck_assert_msg(strstr(err.msg, msg_part) != NULL, "%s: message '%s'", what, err.msg);
    free(copy);
    catalog_destroy(a);
}

static uint32_t *group0(uint32_t *w)
{
    return w + w[CAT_H_GROUPS];
}

static void bad_transition(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = group0(w);
    w[g[CAT_G_TRANS] + 3] = g[CAT_G_NSTATES];
}
static void bad_start(uint32_t *w, size_t n)
{
    (void)n;
    group0(w)[CAT_G_START_NL] = 0xffffff;
}
static void bad_classmap(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = group0(w);
    w[g[CAT_G_CLASSMAP] + 'x'] = g[CAT_G_NCLASSES];
}
static void bad_offset(uint32_t *w, size_t n)
{
    group0(w)[CAT_G_TRANS] = (uint32_t)n - 2;
}
static void bad_rule_in_accept(uint32_t *w, size_t n)
{
    (void)n;
    uint32_t *g = group0(w);
    w[g[CAT_G_ACCEPTS]] = 999u << 5 | CAT_ACCEPT_ALWAYS;
}
static void bad_version(uint32_t *w, size_t n)
{
    (void)n;
    w[CAT_H_VERSION] = 99;
}
static void bad_string(uint32_t *w, size_t n)
{
    (void)n;
    w[w[CAT_H_RULES] + CAT_R_IDLEN] = 1u << 30;
}

START_TEST(structural_damage_rejected)
{
    expect_structural_reject("transition", bad_transition, "state that does not exist");
    expect_structural_reject("start", bad_start, "start state out of range");
    expect_structural_reject("class map", bad_classmap, "class map entry out of range");
    expect_structural_reject("offset", bad_offset, "points outside the catalog");
    expect_structural_reject("accept", bad_rule_in_accept, "names a rule that does not exist");
    expect_structural_reject("version", bad_version, "format version 99");
    expect_structural_reject("string", bad_string, "rule strings outside the string area");
}
END_TEST

START_TEST(fingerprints_stable)
{
    struct catalog *a = compile(sample, N_SAMPLE);
    struct catalog *b = compile(sample, N_SAMPLE);
    size_t n, m;
    const uint32_t *wa = catalog_words(a, &n), *wb = catalog_words(b, &m);
    ck_assert_uint_eq(n, m);
    ck_assert(memcmp(wa, wb, n * 4) == 0);
    char ha[65], hb[65];
    hex_of(a, ha);
    hex_of(b, hb);
    ck_assert_str_eq(ha, hb);
    /* and whatever the number of compile threads */
    for (uint32_t threads = 1; threads <= 4; threads += 3) {
        struct rules_options opt = {.threads = threads};
        struct rules_result res;
        struct vks_error err;
        ck_assert_int_eq(rules_compile(sample, N_SAMPLE, &opt, &res, &err), 0);
        size_t k;
        const uint32_t *wc = catalog_words(res.catalog, &k);
        ck_assert_uint_eq(k, n);
        ck_assert(memcmp(wa, wc, n * 4) == 0);
        rules_result_finish(&res);
    }
    /* the same on every run and machine: this value changes only with
     * VKS_COMPILER_VERSION or the catalog format */
    uint8_t fp[CATALOG_FP_LEN];
    char hx[65];
    rules_fingerprint(&sample[1], fp);
    catalog_fingerprint_hex(fp, hx);
    ck_assert_str_eq(hx, "6f5918f608cd6ff58f5dd823148e08becee424c441f1fef39d7b8087518b6c66");
    catalog_destroy(a);
    catalog_destroy(b);
}
END_TEST

START_TEST(fingerprints_sensitive)
{
    struct catalog *base = compile(sample, N_SAMPLE);
    char h0[65];
    hex_of(base, h0);
    struct rule_src r[N_SAMPLE];
    char pat[N_SAMPLE][16], id[N_SAMPLE][8];
    int variants = 0;
    for (size_t i = 0; i < N_SAMPLE; i++) {
        for (int what = 0; what < 4; what++) {
            memcpy(r, sample, sizeof(sample));
            for (size_t k = 0; k < N_SAMPLE; k++) {
                memcpy(pat[k], sample[k].pattern, sample[k].len);
                pat[k][sample[k].len] = '\0';
                snprintf(id[k], sizeof(id[k]), "%s", sample[k].id);
                r[k].pattern = pat[k];
                r[k].id = id[k];
            }
            if (what == 0)
                pat[i][r[i].len - 1] = pat[i][r[i].len - 1] == '2' ? '3' : 'q';
            else if (what == 1)
                r[i].flags ^= RULE_F_CASELESS;
            else if (what == 2)
                r[i].flags ^= RULE_F_SINGLEMATCH;
            else
                id[i][0] = 'X';
            uint8_t f0[CATALOG_FP_LEN], f1[CATALOG_FP_LEN];
            rules_fingerprint(&sample[i], f0);
            rules_fingerprint(&r[i], f1);
            /* a rule's fingerprint covers pattern and flags, not its id */
            ck_assert_int_eq(memcmp(f0, f1, CATALOG_FP_LEN) == 0, what == 3);
            struct catalog *c = compile(r, N_SAMPLE);
            char h1[65];
            hex_of(c, h1);
            ck_assert_msg(strcmp(h0, h1) != 0, "rule %zu change %d kept the fingerprint", i, what);
            catalog_destroy(c);
            variants++;
        }
    }
    ck_assert_int_eq(variants, 4 * (int)N_SAMPLE);
    catalog_destroy(base);
}
END_TEST

static void expect_hits(const struct catalog *cat, const char *hay, enum scan_mode mode,
                        const char *want)
{
    struct scan_hits h = {0};
    ck_assert_int_eq(refscan_buffer(cat, (const uint8_t *)hay, strlen(hay), mode, &h), 0);
    char got[512] = "";
    for (size_t i = 0; i < h.n; i++) {
        struct catalog_rule r;
        catalog_rule(cat, h.v[i].rule, &r);
        size_t l = strlen(got);
        snprintf(got + l, sizeof(got) - l, "%s%.*s@%llu", i ? " " : "", (int)r.id_len, r.id,
                 (unsigned long long)h.v[i].end);
        if (mode == SCAN_COUNT) {
            l = strlen(got);
            snprintf(got + l, sizeof(got) - l, "x%u", h.v[i].count);
        }
    }
    ck_assert_str_eq(got, want);
    scan_hits_finish(&h);
}

START_TEST(report_modes)
{
    struct catalog *cat = compile(sample, N_SAMPLE);
    const char *hay = "foo bar fooo BAR z";
    expect_hits(cat, hay, SCAN_ALL, "once@2 word@3 lit@7 hex@7 word@11 word@12 lit@16 tail@18");
    expect_hits(cat, hay, SCAN_FIRST, "once@2 word@3 lit@7 hex@7 tail@18");
    expect_hits(cat, hay, SCAN_COUNT, "once@2x1 word@3x3 lit@7x2 hex@7x1 tail@18x1");
    expect_hits(cat, "", SCAN_ALL, "");
    catalog_destroy(cat);
    /* rules sharing an id count once per end offset, across groups too */
    const struct rule_src shared[] = {
        {.id = "1", .kind = RULE_REGEX, .pattern = "b", .len = 1},
        {.id = "1", .kind = RULE_REGEX, .pattern = "[a-c]+", .len = 6},
    };
    cat = compile(shared, 2);
    expect_hits(cat, "abcb", SCAN_ALL, "1@1 1@2 1@3 1@4");
    expect_hits(cat, "abcb", SCAN_COUNT, "1@1x4");
    expect_hits(cat, "abcb", SCAN_FIRST, "1@1");
    catalog_destroy(cat);
    cat = compile(sample, N_SAMPLE);
    expect_hits(cat, "z", SCAN_ALL, "tail@1");
    catalog_destroy(cat);
}
END_TEST

Suite *catalog_suite(void)
{
    Suite *s = suite_create("catalog");
    TCase *tc = tcase_create("packed");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, truncated_rejected);
    tcase_add_test(tc, bit_flips_rejected);
    tcase_add_test(tc, structural_damage_rejected);
    tcase_add_test(tc, fingerprints_stable);
    tcase_add_test(tc, fingerprints_sensitive);
    tcase_add_test(tc, report_modes);
    suite_add_tcase(s, tc);
    return s;
}
