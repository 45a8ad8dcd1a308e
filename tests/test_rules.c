/*
 * The rule language: the parser on valid and invalid patterns (exact error
 * text and position), pattern files (line numbers, forms, flags), and the
 * compiler's handling of bad rules (rejected with a reason, the rest load).
 */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "parse.h"
#include "patfile.h"
#include "refscan.h"
#include "rules.h"

struct bad_case {
    enum rule_kind kind;
    const char *pattern;
    uint32_t pos;
    const char *msg; /* the message starts with this */
};

static const struct bad_case bad_cases[] = {
    {RULE_REGEX, "ab(c", 2, "unterminated group: add the closing ')'"},
    {RULE_REGEX, "abc)", 3, "unmatched ')': remove it or escape it as \\)"},
    {RULE_REGEX, "*a", 0, "quantifier '*' has nothing to repeat: escape it as \\*"},
    {RULE_REGEX, "a**", 2, "a quantifier follows another quantifier"},
    {RULE_REGEX, "[a-", 0, "unterminated character class: add the closing ']'"},
    {RULE_REGEX, "x[z-a]", 4, "range out of order in character class"},
    {RULE_REGEX, "(a)\\1", 3, "backreference \\1 is not supported"},
    {RULE_REGEX, "a(?=b)", 1, "lookahead (?=...) is not supported"},
    {RULE_REGEX, "(?<!a)b", 0, "lookbehind (?<!...) is not supported"},
    {RULE_REGEX, "(?x)ab", 2, "inline flag 'x' is not supported: only i, s and m are"},
    {RULE_REGEX, "a\\q", 1, "unknown escape \\q: escape only metacharacters, or use \\xHH"},
    {RULE_REGEX, "\\p{L}", 0, "Unicode property \\p is not supported"},
    {RULE_REGEX, "a{5,2}", 1, "repeat {5,2} has min > max: swap them"},
    {RULE_REGEX, "a{2000}", 1, "repeat count over the limit of 1000"},
    {RULE_REGEX, "a{0}b", 1, "repeat {0} matches nothing: remove it"},
    {RULE_REGEX, "ab\\", 2, "pattern ends with a lone backslash"},
    {RULE_REGEX, "[[:foo:]]", 1, "unknown POSIX class [:foo:]"},
    {RULE_REGEX, "\\xZZ", 0, "bad \\x escape: write a byte as two hex digits"},
    {RULE_REGEX, "a++", 2, "possessive quantifiers are not supported"},
    {RULE_HEX, "4d 5a ?", 6, "bad hex string: write bytes as pairs of hex digits"},
    {RULE_HEX, "4g", 0, "bad hex string"},
    {RULE_LITERAL, "ab\\q", 2, "unknown escape in literal"},
    {RULE_LITERAL, "", 0, "empty pattern: a rule must match at least one byte"},
};

START_TEST(parse_errors)
{
    const struct bad_case *c = &bad_cases[_i];
    struct rule_src r = {
        .id = "t", .kind = c->kind, .pattern = c->pattern, .len = strlen(c->pattern)};
    struct parse_result pr;
    char msg[200];
    uint32_t pos = 999;
    int rc = parse_rule(&r, &pr, &pos, msg, sizeof(msg));
    ck_assert_msg(rc == -EINVAL, "'%s' parsed", c->pattern);
    ck_assert_msg(strncmp(msg, c->msg, strlen(c->msg)) == 0, "'%s': got message '%s'", c->pattern,
                  msg);
    ck_assert_msg(pos == c->pos, "'%s': error at %u, expected %u", c->pattern, pos, c->pos);
    parse_result_finish(&pr);
}
END_TEST

struct check_case {
    const char *pattern;
    const char *msg; /* NULL: accepted */
};

static const struct check_case check_cases[] = {
    {"a*", "pattern can match the empty string"},
    {"(a|)", "pattern can match the empty string"},
    {"\\b", "pattern can match the empty string"},
    {"^$", "pattern can match the empty string"},
    {"a$b", "end anchor ($, \\Z or \\z) is followed by more pattern"},
    {"(a$)+", "end anchor ($, \\Z or \\z) is followed by more pattern"},
    {"a\\z\\n", "end anchor"},
    {"(?m)a$\\nb", NULL},
    {"a$", NULL},
    {"a+?b{2,}?", NULL},
    {"[\\w.-]{0,50}?(?:adafruit)", NULL},
    {"(?i)\\bA3-[A-Z0-9]{6}\\b", NULL},
    {"x{,3}", NULL}, /* a literal '{' as in PCRE */
    {"(?<name>ab)c", NULL},
    {"(?i)a(?-i)b", NULL},
};

START_TEST(semantic_checks)
{
    const struct check_case *c = &check_cases[_i];
    struct rule_src r = {
        .id = "t", .kind = RULE_REGEX, .pattern = c->pattern, .len = strlen(c->pattern)};
    struct parse_result pr;
    char msg[200];
    uint32_t pos;
    int rc = parse_rule(&r, &pr, &pos, msg, sizeof(msg));
    ck_assert_msg(rc == 0, "'%s': %s", c->pattern, msg);
    rc = parse_check(pr.root, 100000, &pos, msg, sizeof(msg));
    if (c->msg == NULL)
        ck_assert_msg(rc == 0, "'%s' rejected: %s", c->pattern, msg);
    else
        ck_assert_msg(rc == -EINVAL && strncmp(msg, c->msg, strlen(c->msg)) == 0, "'%s': got '%s'",
                      c->pattern, rc ? msg : "accepted");
    parse_result_finish(&pr);
}
END_TEST

/* Compiles one rule and scans `hay`; returns the end offsets as a string
 * "3,7" (or "rejected: ..."). */
static const char *ends(enum rule_kind kind, const char *pat, uint32_t flags, const char *hay,
                        size_t hay_len)
{
    static char out[512];
    struct rule_src r = {
        .id = "t", .kind = kind, .pattern = pat, .len = strlen(pat), .flags = flags};
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(&r, 1, NULL, &res, &err), 0);
    if (res.n_rejects) {
        snprintf(out, sizeof(out), "rejected: %s", res.rejects[0].msg);
        rules_result_finish(&res);
        return out;
    }
    struct scan_hits h = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, (const uint8_t *)hay, hay_len, SCAN_ALL, &h), 0);
    out[0] = '\0';
    for (size_t i = 0; i < h.n; i++) {
        size_t l = strlen(out);
        snprintf(out + l, sizeof(out) - l, "%s%llu", i ? "," : "", (unsigned long long)h.v[i].end);
    }
    scan_hits_finish(&h);
    rules_result_finish(&res);
    return out;
}

#define ENDS(kind, pat, flags, hay) ends(kind, pat, flags, hay, sizeof(hay) - 1)

/* Semantics measured against Hyperscan (see docs/rules.md). */
START_TEST(matching_semantics)
{
    ck_assert_str_eq(ENDS(RULE_REGEX, "foo$", 0, "foo\nfoo\n"), "7");
    ck_assert_str_eq(ENDS(RULE_REGEX, "foo$", RULE_F_MULTILINE, "foo\nfoo\n"), "3,7");
    ck_assert_str_eq(ENDS(RULE_REGEX, "^foo", 0, "foo\nfoo"), "3");
    ck_assert_str_eq(ENDS(RULE_REGEX, "^foo", RULE_F_MULTILINE, "foo\nfoo"), "3,7");
    ck_assert_str_eq(ENDS(RULE_REGEX, "a\\s", 0, "a\va\fa\r"), "2,4,6");
    ck_assert_str_eq(ENDS(RULE_REGEX, "a.", 0, "a\na\r"), "4");
    ck_assert_str_eq(ENDS(RULE_REGEX, "a.", RULE_F_DOTALL, "a\na\r"), "2,4");
    ck_assert_str_eq(ENDS(RULE_REGEX, "a+?", 0, "aaa"), "1,2,3");
    ck_assert_str_eq(ENDS(RULE_REGEX, "\\bab\\b", 0, "ab abc ab"), "2,9");
    ck_assert_str_eq(ENDS(RULE_REGEX, "\\Bb", 0, "ab b"), "2");
    ck_assert_str_eq(ENDS(RULE_REGEX, "ab(?i)c", 0, "abC ABc"), "3");
    ck_assert_str_eq(ENDS(RULE_REGEX, "a(?i:b)c", 0, "aBc aBC"), "3");
    ck_assert_str_eq(ENDS(RULE_REGEX, "a{3}", RULE_F_SINGLEMATCH, "aaaaaa"), "3");
    ck_assert_str_eq(ENDS(RULE_REGEX, "a{3}", 0, "aaaaa"), "3,4,5");
    ck_assert_str_eq(ENDS(RULE_REGEX, "[^a]b", 0, "\nb"), "2");
    ck_assert_str_eq(ENDS(RULE_REGEX, "x{,3}", 0, "x{,3}"), "5");
    ck_assert_str_eq(ENDS(RULE_REGEX, "\\x41\\x{42}\\0", 0, "AB\0"), "3");
    ck_assert_str_eq(ENDS(RULE_LITERAL, "a\\x00b\\n", 0, "a\0b\n"), "4");
    ck_assert_str_eq(ENDS(RULE_LITERAL, "AbC", RULE_F_CASELESS, "abc ABC"), "3,7");
    ck_assert_str_eq(ENDS(RULE_HEX, "4D 5a ?? 00", 0, "MZ\x90\x00MZ\x01"), "4");
    ck_assert_str_eq(ENDS(RULE_REGEX, "[\\w.-]{0,50}?(?:adafruit)", 0, "x.adafruit"), "10");
    ck_assert_str_eq(ENDS(RULE_REGEX, "a*", 0, "aaa"),
                     "rejected: pattern can match the empty string, which would match at every "
                     "offset: make some part of it consume at least one byte");
}
END_TEST

START_TEST(pattern_file)
{
    const char text[] = "# comment\n"
                        "\n"
                        "1:/ab+c/i\n"
                        "two:\"lit\\x41\"H\r\n"
                        "hex:{4d 5A ?? 00}\n"
                        "bad line without colon\n"
                        "4:/unterminated\n"
                        "5:/x/q\n"
                        "6:/a(b/\n"
                        "  7:/slash/inside/\n";
    struct patfile pf;
    struct vks_error err;
    ck_assert_int_eq(patfile_parse(text, sizeof(text) - 1, &pf, &err), 0);
    ck_assert_uint_eq(pf.n, 5);
    ck_assert_str_eq(pf.rules[0].id, "1");
    ck_assert_int_eq(pf.rules[0].kind, RULE_REGEX);
    ck_assert_str_eq(pf.rules[0].pattern, "ab+c");
    ck_assert_uint_eq(pf.rules[0].flags, RULE_F_CASELESS);
    ck_assert_uint_eq(pf.rules[0].line, 3);
    ck_assert_str_eq(pf.rules[1].id, "two");
    ck_assert_int_eq(pf.rules[1].kind, RULE_LITERAL);
    ck_assert_str_eq(pf.rules[1].pattern, "lit\\x41");
    ck_assert_uint_eq(pf.rules[1].flags, RULE_F_SINGLEMATCH);
    ck_assert_int_eq(pf.rules[2].kind, RULE_HEX);
    ck_assert_str_eq(pf.rules[3].id, "6");
    ck_assert_str_eq(pf.rules[4].pattern, "slash/inside");
    ck_assert_uint_eq(pf.rules[4].line, 10);

    ck_assert_uint_eq(pf.n_rejects, 3);
    ck_assert_uint_eq(pf.rejects[0].line, 6);
    ck_assert_str_eq(pf.rejects[0].msg, "expected ID:/regex/flags (an id, a colon, then the "
                                        "pattern)");
    ck_assert_uint_eq(pf.rejects[1].line, 7);
    ck_assert_str_eq(pf.rejects[1].msg, "missing closing '/': write ID:/regex/flags");
    ck_assert_uint_eq(pf.rejects[2].line, 8);
    ck_assert_str_eq(pf.rejects[2].id, "5");
    ck_assert(strstr(pf.rejects[2].msg, "unknown flag 'q'") == pf.rejects[2].msg);

    /* the compiler keeps the line of a rule it rejects; the rest compile */
    struct rules_result res;
    ck_assert_int_eq(rules_compile(pf.rules, pf.n, NULL, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 1);
    ck_assert_str_eq(res.rejects[0].id, "6");
    ck_assert_uint_eq(res.rejects[0].line, 9);
    ck_assert_uint_eq(res.rejects[0].pos, 1);
    ck_assert_uint_eq(catalog_rule_count(res.catalog), 4);
    ck_assert_uint_eq(res.rule_index[3], UINT32_MAX);
    ck_assert_uint_eq(res.rule_index[4], 3);
    rules_result_finish(&res);
    patfile_finish(&pf);
}
END_TEST

START_TEST(bad_rules_do_not_stop_the_rest)
{
    struct rule_src r[] = {
        {.id = "ok1", .kind = RULE_LITERAL, .pattern = "hello", .len = 5},
        {.id = "", .kind = RULE_LITERAL, .pattern = "x", .len = 1},
        {.id = "bad", .kind = RULE_REGEX, .pattern = "(", .len = 1},
        {.id = "ok1", .kind = RULE_LITERAL, .pattern = "dup", .len = 3},
        {.id = "huge", .kind = RULE_REGEX, .pattern = "[ab]*a[ab]{20}", .len = 14},
        {.id = "ok2", .kind = RULE_REGEX, .pattern = "wor(ld)", .len = 7},
    };
    struct rules_result res;
    struct vks_error err;
    struct rules_options opt = {.max_states = 4096};
    ck_assert_int_eq(rules_compile(r, 6, &opt, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 2);
    ck_assert_uint_eq(res.rejects[0].index, 1);
    ck_assert_str_eq(res.rejects[0].msg, "rule id must be 1 to 255 printable bytes");
    ck_assert_uint_eq(res.rejects[1].index, 2);
    /* "huge" is over the DFA budget: it runs on the bit-NFA engine instead */
    ck_assert_uint_eq(catalog_rule_count(res.catalog), 4);
    struct catalog_rule huge;
    catalog_rule(res.catalog, res.rule_index[4], &huge);
    ck_assert_uint_ge(huge.group, catalog_group_count(res.catalog));
    /* rules sharing an id ("ok1") report as one: the first one's index */
    struct scan_hits h = {0};
    const char *hay = "hello world dup";
    ck_assert_int_eq(refscan_buffer(res.catalog, (const uint8_t *)hay, strlen(hay), SCAN_ALL, &h),
                     0);
    ck_assert_uint_eq(h.n, 3);
    ck_assert_uint_eq(h.v[0].end, 5);
    ck_assert_uint_eq(h.v[0].rule, 0);
    ck_assert_uint_eq(h.v[1].end, 11);
    ck_assert_uint_eq(h.v[1].rule, 3);
    ck_assert_uint_eq(h.v[2].end, 15);
    ck_assert_uint_eq(h.v[2].rule, 0);
    scan_hits_finish(&h);
    rules_result_finish(&res);

    opt.max_rules = 3;
    ck_assert_int_eq(rules_compile(r, 6, &opt, &res, &err), -E2BIG);
    ck_assert_str_eq(err.msg, "6 rules, over the limit of 3: split the rule set or raise "
                              "max_rules");
}
END_TEST

/* Groups split under the budget, and every rule still reports. */
START_TEST(grouping_under_budget)
{
    enum { N = 300 };
    static char pats[N][16], ids[N][8];
    struct rule_src r[N];
    for (int i = 0; i < N; i++) {
        snprintf(pats[i], sizeof(pats[i]), "k%03dxyzzy%03d", i, (i * 7) % 1000);
        snprintf(ids[i], sizeof(ids[i]), "L%d", i);
        r[i] = (struct rule_src){
            .id = ids[i], .kind = RULE_LITERAL, .pattern = pats[i], .len = strlen(pats[i])};
    }
    struct rules_result res;
    struct vks_error err;
    struct rules_options opt = {.max_states = 512};
    ck_assert_int_eq(rules_compile(r, N, &opt, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    uint32_t ng = catalog_group_count(res.catalog);
    ck_assert_uint_ge(ng, 7); /* ~3,300 trie states over budgets of 512 */
    for (uint32_t g = 0; g < ng; g++) {
        struct catalog_group grp;
        catalog_group(res.catalog, g, &grp);
        ck_assert_uint_le(grp.n_states, 512);
        ck_assert_uint_eq(grp.maxlen, 12);
    }
    /* every literal planted once is found once */
    static char hay[N * 16];
    size_t n = 0;
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(hay + n, sizeof(hay) - n, "%s ", pats[i]);
    struct scan_hits h = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, (const uint8_t *)hay, n, SCAN_ALL, &h), 0);
    ck_assert_uint_eq(h.n, N);
    for (size_t i = 0; i < h.n; i++)
        ck_assert_uint_eq(h.v[i].rule, i);
    scan_hits_finish(&h);
    rules_result_finish(&res);
}
END_TEST

Suite *rules_suite(void)
{
    Suite *s = suite_create("rules");
    TCase *tc = tcase_create("language");
    tcase_add_loop_test(tc, parse_errors, 0, sizeof(bad_cases) / sizeof(bad_cases[0]));
    tcase_add_loop_test(tc, semantic_checks, 0, sizeof(check_cases) / sizeof(check_cases[0]));
    tcase_add_test(tc, matching_semantics);
    tcase_add_test(tc, pattern_file);
    tcase_add_test(tc, bad_rules_do_not_stop_the_rest);
    tcase_add_test(tc, grouping_under_budget);
    suite_add_tcase(s, tc);
    return s;
}
