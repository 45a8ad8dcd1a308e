/*
 * The rule language: the parser on valid and invalid patterns (exact error
 * text and position), pattern files (line numbers, forms, flags), and the
 * compiler's handling of bad rules (rejected with a reason, the rest load).
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "factor.h"
#include "nfastep.h"
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
    {RULE_REGEX, "a(?=b)", 1, "lookahead (?=...) is not supported"},
    {RULE_REGEX, "(?<!a)b", 0, "lookbehind (?<!...) is not supported"},
    {RULE_REGEX, "(?U)ab", 2,
     "inline flag 'U' is not supported: only i, s, m and x are; remove it"},
    {RULE_REGEX, "a[\\q]", 2,
     "escape \\q is not allowed in a character class: inside [...] use only byte escapes, "
     "\\d \\w \\s \\h \\v and their negations"},
    {RULE_REGEX, "\\p{L}", 0, "Unicode property \\p is not supported"},
    {RULE_REGEX, "a{5,2}", 1, "repeat {5,2} has min > max: swap them"},
    {RULE_REGEX, "a{32768}", 1,
     "repeat count over the limit of 32767: use a smaller bound or {m,}"},
    {RULE_REGEX, "a{1,40000}", 1, "repeat count over the limit of 32767"},
    {RULE_REGEX, "a{0}b", 1, "repeat {0} matches nothing: remove it"},
    {RULE_REGEX, "ab\\", 2, "pattern ends with a lone backslash"},
    {RULE_REGEX, "[[:foo:]]", 1, "unknown POSIX class [:foo:]"},
    {RULE_REGEX, "\\x{41", 0, "bad \\x{...} escape: write one byte as \\x{00} to \\x{ff}"},
    {RULE_REGEX, "a++", 2, "possessive quantifiers are not supported"},
    /* backreferences, octal escapes and the PCRE rule between them */
    {RULE_REGEX, "(a)\\1", 3,
     "backreference \\1 is not supported: vkscan matches regular languages only; repeat the "
     "group's pattern instead (for a byte in octal write \\o{...})"},
    {RULE_REGEX, "\\7", 0, "backreference \\7 is not supported"},
    {RULE_REGEX, "(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)\\10", 30, "backreference \\10 is not supported"},
    {RULE_REGEX, "(?<n>a)(b)(c)(d)(e)(f)(g)(h)(i)(j)\\10", 34,
     "backreference \\10 is not supported"},
    {RULE_REGEX, "x\\400", 1,
     "octal escape \\400 is over \\377: a byte is \\0 to \\377 in octal; write the byte as "
     "\\xHH"},
    {RULE_REGEX, "[\\777]", 1, "octal escape \\777 is over \\377"},
    {RULE_REGEX, "\\o{400}", 0,
     "octal escape \\o{...} is over \\o{377}: a byte is \\o{0} to \\o{377}; write the byte "
     "as \\xHH"},
    {RULE_REGEX, "\\o{}", 0, "bad \\o{...} escape: write one byte in octal as \\o{0} to \\o{377}"},
    {RULE_REGEX, "\\o101", 0, "bad \\o{...} escape"},
    {RULE_REGEX, "(?P<n>a)(?P=n)", 8,
     "named backreference (?P=name) is not supported: vkscan matches regular languages only; "
     "repeat the group's pattern instead"},
    {RULE_REGEX, "(?P<n>a)(?P>n)", 8,
     "subroutine call (?P>name) is not supported: vkscan matches regular languages only; write "
     "the group's pattern out again"},
    {RULE_REGEX, "(?<n>a)\\k<n>", 7,
     "backreference \\k is not supported: vkscan matches regular languages only; repeat the "
     "group's pattern instead"},
    {RULE_REGEX, "(a)\\g{1}", 3, "backreference \\g is not supported"},
    {RULE_REGEX, "(a)\\g<1>", 3, "subroutine call \\g<...> is not supported"},
    {RULE_REGEX, "(a)(?1)", 3, "recursion or subroutine call (?1...) is not supported"},
    {RULE_REGEX, "(?R)", 0, "recursion or subroutine call (?R...) is not supported"},
    {RULE_REGEX, "(?>a)", 0, "atomic group (?>...) is not supported: use (?:...)"},
    {RULE_REGEX, "(?|a)", 0, "branch reset group (?|...) is not supported: use (?:...)"},
    {RULE_REGEX, "(?(1)a|b)", 0,
     "conditional group (?(...)...) is not supported: vkscan matches regular languages only; "
     "use an alternation (...|...)"},
    /* POSIX items outside brackets */
    {RULE_REGEX, "x[:alpha:]", 1,
     "POSIX class [:alpha:] is only valid inside a bracket expression: write [[:alpha:]]"},
    {RULE_REGEX, "[:al pha:]", 0, "POSIX class [:al pha:] is only valid inside"},
    {RULE_REGEX, "[.a.]", 0,
     "POSIX collating element [.a.] is not supported: list the bytes in a class instead"},
    {RULE_REGEX, "[[=a=]]", 1,
     "POSIX collating element [=a=] is not supported: list the bytes in the class"},
    {RULE_REGEX, "[[:al pha:]]", 1, "unknown POSIX class [:al pha:]"},
    /* groups, flags, quantifiers */
    {RULE_REGEX, "(?<n>a)(?'n'b)", 7, "two named groups use the name 'n': rename one"},
    {RULE_REGEX, "(?<1a>x)", 0,
     "bad group name: write (?<name>...), (?'name'...) or (?P<name>...) with a name of letters, "
     "digits and '_' that does not start with a digit"},
    {RULE_REGEX, "ab(?#x", 2, "unterminated comment (?#...: add the closing ')'"},
    {RULE_REGEX, "(?-)a", 2, "'-' with no flag after it in an inline flag group: write e.g. (?-i)"},
    {RULE_REGEX, "(?i-s-m)a", 5,
     "two '-' in an inline flag group: list the flags to turn off after one '-', e.g. (?i-sm)"},
    {RULE_REGEX, "(?Y)a", 2, "unknown group construct (?Y...)"},
    {RULE_REGEX, "a\\b*", 3,
     "quantifier after an assertion (^, $, \\b, \\B, \\A, \\Z or \\z): an assertion cannot "
     "be repeated; remove the quantifier"},
    {RULE_REGEX, "a^{2}", 2, "quantifier after an assertion"},
    {RULE_REGEX, "x(?x) a + +", 10, "a quantifier follows another quantifier"},
    /* classes and escapes */
    {RULE_REGEX, "[a-\\d]", 3,
     "range in character class ends in a class escape or POSIX class: write '-' last for a "
     "literal '-', e.g. [a\\d-]"},
    {RULE_REGEX, "[a-[:digit:]]", 3, "range in character class ends in a class escape"},
    {RULE_REGEX, "[\\B]", 1, "escape \\B is not allowed in a character class"},
    {RULE_REGEX, "\\x{100}", 0,
     "\\x{...} escape is over \\x{ff}: a pattern byte is \\x{00} to \\x{ff} (there is no "
     "UTF-8 mode); write a multi-byte character as its bytes"},
    {RULE_REGEX, "\\x{}", 0, "bad \\x{...} escape: write one byte as \\x{00} to \\x{ff}"},
    {RULE_REGEX, "\\c\xc3", 0,
     "\\c must be followed by an ASCII character, e.g. \\cA for the byte 0x01"},
    {RULE_REGEX, "\\R", 0, "\\R (any line break) is not supported: use (?:\\r\\n|\\v)"},
    {RULE_REGEX, "\\N", 0, "\\N (any byte but newline) is not supported: use [^\\n]"},
    {RULE_REGEX, "\\u0041", 0, "\\u is not supported: write a byte as \\xHH"},
    {RULE_REGEX, "\\L", 0, "case-changing escape \\L is not supported"},
    {RULE_REGEX, "\\K", 0, "\\K is not supported: remove it"},
    {RULE_HEX, "4d 5a ?", 6, "bad hex string: write bytes as pairs of hex digits"},
    {RULE_HEX, "4g", 0, "bad hex string"},
    {RULE_HEX, "41 ~?? 42", 3, "~?? matches no byte"},
    {RULE_HEX, "[2] 41", 0, "a hex string cannot start with a jump"},
    {RULE_HEX, "41 [2-]", 3, "a hex string cannot end with a jump"},
    {RULE_HEX, "41 [3-2] 42", 3, "jump [3-2] has min > max: swap them"},
    {RULE_HEX, "41 [0] 42", 3, "jump [0] skips nothing"},
    {RULE_HEX, "41 [40000] 42", 3, "jump over the limit of 32767 bytes"},
    {RULE_HEX, "41 [2-x] 42", 3, "bad jump: write [n] for n bytes"},
    {RULE_HEX, "41 [] 42", 3, "bad jump"},
    {RULE_HEX, "41 [2 42", 3, "bad jump"},
    {RULE_HEX, "41 | 42", 3, "alternatives in a hex string go in parentheses"},
    {RULE_HEX, "41 (42 | ) 43", 9, "empty alternative in a hex string"},
    {RULE_HEX, "41 (42 | 43 44", 3, "unterminated alternatives: add the closing ')'"},
    {RULE_HEX, "41 42) 43", 5, "unmatched ')' in a hex string"},
    {RULE_HEX, "41 ~4", 4, "bad hex string"},
    {RULE_LITERAL, "ab\\q", 2, "unknown escape in literal"},
    {RULE_LITERAL, "ab\\x", 2, "bad \\x escape: write a byte as two hex digits, e.g. \\x41"},
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

/* The pattern length limit: at it a rule parses, one byte over it is
 * rejected at column 0 with what to do. */
START_TEST(pattern_length_limit)
{
    char *pat = malloc(RULES_MAX_PATTERN + 2);
    ck_assert_ptr_nonnull(pat);
    for (uint32_t n = RULES_MAX_PATTERN; n <= RULES_MAX_PATTERN + 1; n++) {
        for (uint32_t i = 0; i < n; i++)
            pat[i] = (char)('a' + i % 26);
        struct rule_src r = {.id = "t", .kind = RULE_LITERAL, .pattern = pat, .len = n};
        struct parse_result pr;
        char msg[200];
        uint32_t pos = 999;
        int rc = parse_rule(&r, &pr, &pos, msg, sizeof(msg));
        if (n == RULES_MAX_PATTERN) {
            ck_assert_msg(rc == 0, "a pattern at the limit: %s", msg);
        } else {
            ck_assert_int_eq(rc, -EINVAL);
            ck_assert_uint_eq(pos, 0);
            ck_assert_msg(strstr(msg, "over the limit of 16384") != NULL &&
                              strstr(msg, "split an alternation") != NULL,
                          "got '%s'", msg);
        }
        parse_result_finish(&pr);
    }
    free(pat);
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
    {"a(?:$){2}", NULL}, /* a repeated end anchor is still at the end */
    {"a(?:$)+b", "end anchor ($, \\Z or \\z) is followed by more pattern"},
    {"(?x) a b # c", NULL},
    {"(?#only a comment)", "pattern can match the empty string"},
    {"\\Q\\E", "pattern can match the empty string"},
    {"a{32767}", NULL},
};

struct set_case {
    const char *pattern;
    uint32_t flags;
    const char *bytes; /* the set, as `n` bytes */
    size_t n;
    bool invert; /* the set is the complement of `bytes` */
};

#define SET(pat, fl, b, inv)           \
    {                                  \
        pat, fl, b, sizeof(b) - 1, inv \
    }

static const struct set_case set_cases[] = {
    SET("\\v", 0, "\n\x0b\x0c\r\x85", false),
    SET("\\V", 0, "\n\x0b\x0c\r\x85", true),
    SET("[\\v]", 0, "\n\x0b\x0c\r\x85", false),
    SET("[^\\v]", 0, "\n\x0b\x0c\r\x85", true),
    SET("[\\V]", 0, "\n\x0b\x0c\r\x85", true),
    SET("\\h", 0, "\t \xa0", false),
    SET("\\H", 0, "\t \xa0", true),
    SET("[\\h]", 0, "\t \xa0", false),
    SET("[\\H]", 0, "\t \xa0", true),
    SET("\\s", 0, "\t\n\x0b\x0c\r ", false),
    SET("\\101", 0, "A", false),
    SET("\\101", RULE_F_CASELESS, "Aa", false),
    SET("\\141", 0, "a", false),
    SET("\\0", 0, "\0", false),
    SET("\\012", 0, "\n", false),
    SET("\\377", 0, "\xff", false),
    SET("\\40", 0, " ", false),
    SET("\\8", 0, "8", false),
    SET("[\\1]", 0, "\x01", false),
    SET("[\\18]", 0,
        "\x01"
        "8",
        false),
    SET("[\\101-\\103]", 0, "ABC", false),
    SET("\\o{101}", 0, "A", false),
    SET("\\x", 0, "\0", false),
    SET("\\x{0041}", 0, "A", false),
    SET("\\cA", 0, "\x01", false),
    SET("\\c1", 0, "q", false),
    SET("\\C", 0, "", true),
    SET("\\q", 0, "q", false),
    SET("\\Y", 0, "Y", false),
    SET("[\\Q]\\E]", 0, "]", false),
    SET("[\\Q-\\E-/]", 0, "-./", false),
    SET("[\\Q^\\E]", 0, "^", false),
    SET("[\\E^a]", 0, "a", true),
    SET("[\\d-]", 0, "-0123456789", false),
    SET("(?x) a ", 0, "a", false),
    SET("\\Qa\\E", RULE_F_CASELESS, "Aa", false),
    SET("[[:^alpha:][:digit:]]", 0, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", true),
};

START_TEST(escape_sets)
{
    const struct set_case *c = &set_cases[_i];
    struct rule_src r = {.id = "t",
                         .kind = RULE_REGEX,
                         .pattern = c->pattern,
                         .len = strlen(c->pattern),
                         .flags = c->flags};
    struct parse_result pr;
    char msg[200];
    uint32_t pos;
    ck_assert_msg(parse_rule(&r, &pr, &pos, msg, sizeof(msg)) == 0, "'%s': %s", c->pattern, msg);
    ck_assert_msg(pr.root->type == N_SET, "'%s' is not one byte set", c->pattern);
    for (unsigned b = 0; b < 256; b++) {
        bool want = memchr(c->bytes, (int)b, c->n) != NULL;
        if (c->invert)
            want = !want;
        ck_assert_msg(byteset_has(&pr.root->u.set, b) == want, "'%s': byte 0x%02x %s", c->pattern,
                      b, want ? "missing" : "present");
    }
    parse_result_finish(&pr);
}
END_TEST

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

/* YARA's hex syntax: half bytes, ~ negations, jumps, nested alternatives;
 * spacing and case do not change a rule's fingerprint, and a string of
 * byte pairs keeps the fingerprint it always had. */
START_TEST(hex_strings)
{
    ck_assert_str_eq(ENDS(RULE_HEX, "4? 5a", 0, "MZ@Z\x50Z"), "2,4");
    ck_assert_str_eq(ENDS(RULE_HEX, "?d 5a", 0, "MZ]Z\x0cZ"), "2,4");
    ck_assert_str_eq(ENDS(RULE_HEX, "~4d 5a", 0, "MZ@Z"), "4");
    ck_assert_str_eq(ENDS(RULE_HEX, "~4? 5a", 0, "MZ@ZpZ"), "6");
    ck_assert_str_eq(ENDS(RULE_HEX, "41 [2] 42", 0, "AB AxxB AxxxB"), "7");
    ck_assert_str_eq(ENDS(RULE_HEX, "41 [1-2] 42", 0, "AB AxB AxxB AxxxB"), "6,11");
    ck_assert_str_eq(ENDS(RULE_HEX, "41 [2-] 42", 0, "AB AxB AxxB AxxxxxB"), "6,11,19");
    ck_assert_str_eq(ENDS(RULE_HEX, "41 [-] 42", 0, "AB"), "2");
    ck_assert_str_eq(ENDS(RULE_HEX, "41 [-3] 42", 0, "AB AxxxB AxxxxB"), "2,8");
    ck_assert_str_eq(ENDS(RULE_HEX, "41 (42 | 43 44) 45", 0, "ABE ACDE ACE"), "3,8");
    ck_assert_str_eq(ENDS(RULE_HEX, "41 (42 | (43 | 44 [1] 44)) 45", 0, "ACE ADxDE ADDE"), "3,9");
    ck_assert_str_eq(ENDS(RULE_HEX, "41 ~42", RULE_F_CASELESS, "Ab AB Ax"), "8");
    ck_assert_str_eq(ENDS(RULE_HEX, "4? 42", RULE_F_CASELESS, "Ab ab"), "2,5");
    ck_assert_str_eq(ENDS(RULE_HEX, "(41 | [-])", 0, "A"),
                     "rejected: pattern can match the empty string, which would match at every "
                     "offset: make some part of it consume at least one byte");

    static const struct {
        const char *a, *b;
        bool same;
    } fps[] = {
        {"4D5A [ 2 - 4 ] (41|42)", "4d 5a [2-4] ( 41 | 42 )", true},
        {"4D5A??00", "4d 5a ?? 00", true},
        {"~4D\t?A (3? |[-] 4f)", "~4d ?a ( 3? | [-] 4f )", true},
        {"4d 5a [2-4] (41 | 42)", "4d 5a [2-5] (41 | 42)", false},
        {"4d 5a [2-4] (41 | 42)", "4d 5a [2-4] 41 42", false},
        {"~4d 5a", "4d 5a", false},
        {"4? 5a", "?4 5a", false},
    };
    for (size_t i = 0; i < sizeof(fps) / sizeof(fps[0]); i++) {
        uint8_t fa[CATALOG_FP_LEN], fb[CATALOG_FP_LEN];
        struct rule_src ra = {
            .id = "t", .kind = RULE_HEX, .pattern = fps[i].a, .len = strlen(fps[i].a)};
        struct rule_src rb = {
            .id = "t", .kind = RULE_HEX, .pattern = fps[i].b, .len = strlen(fps[i].b)};
        rules_fingerprint(&ra, fa);
        rules_fingerprint(&rb, fb);
        ck_assert_msg((memcmp(fa, fb, sizeof(fa)) == 0) == fps[i].same,
                      "{%s} and {%s}: the fingerprints should %s", fps[i].a, fps[i].b,
                      fps[i].same ? "be equal" : "differ");
    }
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

/* A broad counter kept a DFA (`[^\n]{1000}`: 1,001 states) multiplies the
 * states of every rule grouped with it. Once a group holding one is over
 * the budget it is split off whole, and the other rules stay together;
 * halving kept it in halves that failed again at the full budget, and
 * split the rest into four groups (compile.c `place`). Every rule still
 * reports, the counter at the end of each long line. */
START_TEST(dense_counter_kept_apart)
{
    static const char *const pats[] = {
        "((a|b)c){3,5}d",
        "[a-f]{2,}[0-9]{3}\\B",
        "\\Bthe\\b",
        "^foo$",
        "bar\\z",
        "baz\\Z",
        "\\Aqux",
        "(?i:HeLLo) world",
        "\\xe4\\xb8[\\x80-\\xbf]",
        "[^\\n]{1000}",
    };
    enum { N = sizeof(pats) / sizeof(pats[0]) };
    struct rule_src r[N];
    for (uint32_t i = 0; i < N; i++)
        r[i] = (struct rule_src){.id = pats[i],
                                 .kind = RULE_REGEX,
                                 .pattern = pats[i],
                                 .len = strlen(pats[i]),
                                 .flags = i == 3 ? RULE_F_MULTILINE : 0};
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(r, N, NULL, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    struct catalog_rule counter;
    catalog_rule(res.catalog, res.rule_index[N - 1], &counter);
    uint32_t ng = catalog_group_count(res.catalog);
    ck_assert_uint_lt(counter.group, ng); /* a DFA group, of its own */
    struct catalog_group grp;
    catalog_group(res.catalog, counter.group, &grp);
    ck_assert_uint_eq(grp.n_rules, 1);
    ck_assert_uint_eq(grp.n_states, 1001);
    /* the rest in at most two DFA groups (halving: four) */
    uint32_t others = 0;
    for (uint32_t g = 0; g < ng; g++) {
        catalog_group(res.catalog, g, &grp);
        others += g != counter.group && !(grp.flags & CAT_GF_FACTOR);
    }
    ck_assert_uint_le(others, 2);
    static char hay[2600];
    size_t n = (size_t)snprintf(hay, sizeof(hay), "foo\nHello world acacacd xyz123 ");
    memset(hay + n, 'w', 1200);
    n += 1200;
    n += (size_t)snprintf(hay + n, sizeof(hay) - n, "\nbar");
    struct scan_hits h = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, (const uint8_t *)hay, n, SCAN_ALL, &h), 0);
    uint32_t seen[N] = {0};
    for (size_t i = 0; i < h.n; i++)
        seen[h.v[i].rule]++;
    ck_assert_uint_eq(seen[res.rule_index[3]], 1);                   /* ^foo$ */
    ck_assert_uint_eq(seen[res.rule_index[7]], 1);                   /* Hello world */
    ck_assert_uint_eq(seen[res.rule_index[0]], 1);                   /* acacacd */
    ck_assert_uint_eq(seen[res.rule_index[4]], 1);                   /* bar at the end */
    ck_assert_uint_eq(seen[res.rule_index[N - 1]], 1227 - 1000 + 1); /* line 2: 1,227 bytes */
    scan_hits_finish(&h);
    rules_result_finish(&res);
}
END_TEST

/* Counters of one class share their count: 200 rules `[^\n]{300}` to
 * `[^\n]{499}` are dense counters (301 to 500 states each) and still fit
 * few groups together (two, 970 states in all); each alone would be 200
 * DFA passes. */
START_TEST(dense_counters_share)
{
    enum { N = 200 };
    static char pats[N][24];
    struct rule_src r[N];
    for (uint32_t i = 0; i < N; i++) {
        snprintf(pats[i], sizeof(pats[i]), "[^\\n]{%u}", 300 + i);
        r[i] = (struct rule_src){
            .id = pats[i], .kind = RULE_REGEX, .pattern = pats[i], .len = strlen(pats[i])};
    }
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(r, N, NULL, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    ck_assert_uint_le(catalog_group_count(res.catalog), 3);
    static char hay[700];
    memset(hay, 'x', sizeof(hay));
    struct scan_hits h = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, (const uint8_t *)hay, sizeof(hay), SCAN_ALL, &h),
                     0);
    /* rule i ends at every offset from 300 + i to 700 */
    uint64_t want = 0;
    for (uint32_t i = 0; i < N; i++)
        want += 700 - (300 + i) + 1;
    ck_assert_uint_eq(h.n, want);
    scan_hits_finish(&h);
    rules_result_finish(&res);
}
END_TEST

/* rules_compile frees the tree of each plain string while the set may still
 * become a literal group, and parses them again when a later rule (here a
 * regex at position `_i` of 3) rules that out: every string must still be
 * found, and the catalog must not depend on where the regex came. */
START_TEST(released_trees_parsed_again)
{
    enum { N = 120 };
    static char pats[N + 1][20], ids[N + 1][8];
    struct rule_src r[N + 1];
    uint32_t at = (uint32_t)(_i == 0 ? 0 : _i == 1 ? N / 2 : N);
    for (uint32_t i = 0, k = 0; i <= N; i++) {
        snprintf(ids[i], sizeof(ids[i]), "L%u", i);
        if (i == at)
            snprintf(pats[i], sizeof(pats[i]), "q[0-9]{3}z");
        else
            snprintf(pats[i], sizeof(pats[i]), "lit%03uxy%03u", k, (k * 11) % 1000), k++;
        r[i] = (struct rule_src){.id = ids[i],
                                 .kind = i == at ? RULE_REGEX : RULE_LITERAL,
                                 .pattern = pats[i],
                                 .len = strlen(pats[i])};
    }
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(r, N + 1, NULL, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    static char hay[(N + 2) * 20];
    size_t n = 0;
    for (uint32_t i = 0; i <= N; i++)
        n += (size_t)snprintf(hay + n, sizeof(hay) - n, "%s ", i == at ? "q123z" : pats[i]);
    struct scan_hits h = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, (const uint8_t *)hay, n, SCAN_ALL, &h), 0);
    ck_assert_uint_eq(h.n, N + 1);
    for (size_t i = 0; i < h.n; i++)
        ck_assert_uint_eq(h.v[i].rule, res.rule_index[i]); /* the haystack is in input order */
    scan_hits_finish(&h);
    rules_result_finish(&res);
}
END_TEST

/* The trees of string sequences are freed after parsing and made again from
 * their bytes (caseless letters included) to build a DFA group, or parsed
 * again when such a rule goes to the bit-NFA engine (_i == 1: a budget of
 * 16 states puts every string over 16 bytes there): each rule is found
 * once, in input order, with the other forms of rules around them. */
START_TEST(strings_kept_as_bytes)
{
    static const struct {
        enum rule_kind kind;
        const char *pat;
        uint32_t flags;
        const char *text;
    } cases[] = {
        {RULE_LITERAL, "Secret-Token-ABC-0042", RULE_F_CASELESS, "sEcReT-tOkEn-abc-0042"},
        {RULE_HEX, "de ad be ef 00 11", 0, "\\xde\\xad\\xbe\\xef\\x00\\x11"},
        {RULE_REGEX, "[Aa][Pp][Ii]_key_value_of_length", 0, "aPi_key_value_of_length"},
        {RULE_REGEX, "q[0-9]{3}z", 0, "q123z"},
        {RULE_REGEX, "[0-9]x[0-9]yz", 0, "7x8yz"},
        {RULE_LITERAL, "plain literal string here", 0, "plain literal string here"},
        {RULE_REGEX, "(?i)mixed CASE phrase", 0, "MIXED case PHRASE"},
    };
    enum { N = sizeof(cases) / sizeof(cases[0]) };
    struct rule_src r[N];
    static char ids[N][8];
    uint8_t hay[512]; /* each text (\xHH: that byte) and a space */
    size_t n = 0;
    for (uint32_t i = 0; i < N; i++) {
        snprintf(ids[i], sizeof(ids[i]), "S%u", i);
        r[i] = (struct rule_src){.id = ids[i],
                                 .kind = cases[i].kind,
                                 .pattern = cases[i].pat,
                                 .len = strlen(cases[i].pat),
                                 .flags = cases[i].flags};
        for (const char *t = cases[i].text; *t != '\0'; t++) {
            if (t[0] == '\\' && t[1] == 'x') {
                hay[n++] = (uint8_t)strtoul((char[3]){t[2], t[3], 0}, NULL, 16);
                t += 3;
            } else {
                hay[n++] = (uint8_t)*t;
            }
        }
        hay[n++] = ' ';
    }
    struct rules_options opt = {.max_states = _i == 1 ? 16 : 0};
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(r, N, &opt, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    if (_i == 1)
        ck_assert_uint_gt(catalog_nfa_count(res.catalog), 0);
    struct scan_hits h = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, hay, n, SCAN_ALL, &h), 0);
    ck_assert_uint_eq(h.n, N);
    for (size_t i = 0; i < h.n; i++)
        ck_assert_uint_eq(h.v[i].rule, res.rule_index[i]);
    scan_hits_finish(&h);
    rules_result_finish(&res);
}
END_TEST

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* scan_sort_u64 (the hit finish's sort) against qsort: short lists, lists
 * on both sides of the wide-digit threshold, keys differing in a few low,
 * middle or high bits, in 38 bits (a GPU bin's 22 bits of end and 16 of
 * rule), and in all 64. */
START_TEST(radix_sort_orders)
{
    const size_t sizes[] = {0, 1, 47, 48, 1000, 16383, 16384, 40000};
    const struct {
        unsigned lo, bits;
    } spans[] = {{0, 3}, {20, 5}, {0, 38}, {7, 38}, {0, 64}, {50, 14}};
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        for (size_t pi = 0; pi < sizeof(spans) / sizeof(spans[0]); pi++) {
            size_t n = sizes[si];
            uint64_t *k = malloc((2 * n + 1) * sizeof(*k)), *ref = malloc((n + 1) * sizeof(*ref));
            ck_assert_ptr_nonnull(k);
            ck_assert_ptr_nonnull(ref);
            uint64_t mask = spans[pi].bits == 64 ? ~0ull : ((1ull << spans[pi].bits) - 1);
            for (size_t i = 0; i < n; i++) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                k[i] = 0xa5ull << 56 ^ ((seed & mask) << spans[pi].lo);
                ref[i] = k[i];
            }
            qsort(ref, n, sizeof(*ref), cmp_u64);
            scan_sort_u64(k, k + n, n);
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(k[i] == ref[i], "n %zu span %u+%u: key %zu out of order", n,
                              spans[pi].lo, spans[pi].bits, i);
            free(k);
            free(ref);
        }
    }
}
END_TEST

static int cmp_hit_end_rule(const void *a, const void *b)
{
    const struct scan_hit *x = a, *y = b;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->rule < y->rule ? -1 : x->rule > y->rule;
}

static int cmp_hit_rule_end(const void *a, const void *b)
{
    const struct scan_hit *x = a, *y = b;
    if (x->rule != y->rule)
        return x->rule < y->rule ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* scan_hits_sort (the CPU engine's hit sorts) against qsort, in both key
 * orders: lists on both sides of the radix threshold (256), duplicates,
 * ends past 32 bits, rules over 16 bits, and keys equal in one field. Each
 * hit's count travels with it (the (end, rule, count) multisets match). */
START_TEST(hit_sort_orders)
{
    const size_t sizes[] = {0, 1, 255, 256, 257, 5000, 70000};
    const struct {
        uint64_t end_mask;
        uint32_t rule_mask;
    } spans[] = {{0xff, 0x3}, {0xffffff, 0xff}, {0xfffffffffull, 0xfffff}, {0, 0xffff}, {0xfff, 0}};
    uint64_t seed = 0x2545f4914f6cdd1dull;
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        for (size_t pi = 0; pi < sizeof(spans) / sizeof(spans[0]); pi++) {
            for (int by_rule = 0; by_rule < 2; by_rule++) {
                size_t n = sizes[si];
                struct scan_hit *v = malloc((n + 1) * sizeof(*v)),
                                *ref = malloc((n + 1) * sizeof(*ref));
                ck_assert_ptr_nonnull(v);
                ck_assert_ptr_nonnull(ref);
                for (size_t i = 0; i < n; i++) {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    v[i] = (struct scan_hit){.rule = (uint32_t)(seed >> 40) & spans[pi].rule_mask,
                                             .count = (uint32_t)i,
                                             .end = (seed & spans[pi].end_mask) | 1u << 30};
                }
                memcpy(ref, v, n * sizeof(*v));
                int (*cmp)(const void *, const void *) =
                    by_rule ? cmp_hit_rule_end : cmp_hit_end_rule;
                qsort(ref, n, sizeof(*ref), cmp);
                scan_hits_sort(v, n, by_rule);
                for (size_t i = 0; i < n; i++)
                    ck_assert_msg(cmp(&v[i], &ref[i]) == 0, "n %zu span %zu by_rule %d: hit %zu", n,
                                  pi, by_rule, i);
                /* the same hits, counts included: sort both by count too */
                uint64_t sum_v = 0, sum_r = 0;
                for (size_t i = 0; i < n; i++) {
                    sum_v += (v[i].count + 1) * (v[i].end ^ v[i].rule);
                    sum_r += (ref[i].count + 1) * (ref[i].end ^ ref[i].rule);
                }
                ck_assert_uint_eq(sum_v, sum_r);
                free(v);
                free(ref);
            }
        }
    }
}
END_TEST

/* refscan_start_from (forward confirmation's first start, docs/engine.md)
 * against the definition: the greater of e - lookback and the start of
 * the run of span bytes that ends at e - SKIP, over random buffers of span
 * and other bytes, for ascending ends with repeats, unbounded and bounded
 * lookbacks, skips of 0 to 3 bytes, no span, and an end out of order
 * (nothing carried). Beside it the same ends with only a window of the
 * buffer, [wlo, len) (gpu/plan.c plan_runs' reads of a file): the same
 * start where the definition's lies after wlo, never a later one where
 * it does not. */
START_TEST(confirm_start_runs)
{
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    uint32_t span[9] = {0};
    for (unsigned c = 'a'; c <= 'z'; c++)
        span[c >> 5] |= 1u << (c & 31);
    span[' ' >> 5] |= 1u << (' ' & 31);
    const uint32_t looks[] = {CATALOG_UNBOUNDED, 1, 7, 40};
    for (int round = 0; round < 200; round++) {
        size_t len = 1 + round * 13 % 3000;
        uint8_t *buf = malloc(len);
        ck_assert_ptr_nonnull(buf);
        uint32_t breaks = 1 + round % 60; /* one byte in `breaks` ends a run */
        for (size_t i = 0; i < len; i++) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            buf[i] = seed % breaks == 0 ? (uint8_t)(seed >> 8 & 1 ? '\n' : '9')
                                        : (uint8_t)('a' + (seed >> 16) % 27);
            if (buf[i] == 'a' + 26)
                buf[i] = ' ';
        }
        span[8] = (uint32_t)(round / 4 % 4); /* SKIP */
        struct refscan_starts b = {
            .lookback = looks[round % 4], .span = round % 10 == 9 ? NULL : span, .buf = buf};
        uint64_t wlo = (uint64_t)(seed >> 11) % len;
        struct refscan_starts bw = {
            .lookback = b.lookback, .span = b.span, .buf = buf + wlo, .lo = wlo, .hi = len};
        uint64_t e = 0;
        while (e <= len) {
            uint64_t want = b.lookback == CATALOG_UNBOUNDED || e < b.lookback ? 0 : e - b.lookback;
            uint64_t rs = b.span == NULL ? 0 : e > span[8] ? e - span[8] : 0;
            while (b.span != NULL && rs > 0 && span[buf[rs - 1] >> 5] >> (buf[rs - 1] & 31) & 1)
                rs--;
            want = rs > want ? rs : want;
            ck_assert_msg(refscan_start_from(&b, e) == want,
                          "round %d: end %" PRIu64 " of %zu gives %" PRIu64 ", not %" PRIu64, round,
                          e, len, refscan_start_from(&b, e), want);
            uint64_t w = refscan_start_from(&bw, e);
            ck_assert_msg(want > wlo ? w == want : w <= want,
                          "round %d: end %" PRIu64 " of %zu, window from %" PRIu64 ": %" PRIu64
                          ", not %" PRIu64,
                          round, e, len, wlo, w, want);
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            e += seed % 4 == 0 ? 0 : 1 + seed % (round % 3 == 0 ? 400 : 9);
        }
        if (len > 10) { /* an end before the last one: answered without the carried run */
            uint64_t x = len / 2, want = b.span != NULL ? x - span[8] : 0;
            while (b.span != NULL && want > 0 &&
                   span[buf[want - 1] >> 5] >> (buf[want - 1] & 31) & 1)
                want--;
            uint64_t lb = b.lookback == CATALOG_UNBOUNDED || x < b.lookback ? 0 : x - b.lookback;
            ck_assert_uint_eq(refscan_start_from(&b, x), want > lb ? want : lb);
        }
        free(buf);
    }
}
END_TEST

/* Whether every byte of string s is in set `b`. */
static bool bytes_in(const struct byteset *b, const char *s)
{
    for (; *s; s++)
        if (!byteset_has(b, (uint8_t)*s))
            return false;
    return true;
}

/* factor_extract's leads (compiler version 14): the bytes a match may hold
 * before its factor, from the part of the rule before it, through
 * concatenations, alternations (a shared factor's leads joined), repeats
 * and groups; factor_set_span_bytes adds the factors' own bytes. The
 * checks name bytes that must be there (a missing one loses matches) and
 * bytes that must not (an extra one only costs walking). */
START_TEST(factor_leads)
{
    static const struct {
        const char *pat;
        const char *lead_has, *lead_lacks; /* of every factor */
    } cases[] = {
        {"(?m)^\\s*#\\s*include\\s*<[a-z]+\\.h>$", " \t\n#", "abz<.h>"},
        {"[a-z]+@[a-z]+\\.com", "abz@", ".0 \n"},
        {"[^\\n]*(password|passwd)=", "abz=.0 ", "\n"},
        {"(\\w+\\s)+baker street", "az09_ \n", "-."},
        {"\\d+(px|em) (solid|dotted)", "0129pxem ", "abz"},
        {"x*(ab|cd)*xyzzy", "xabcd", "yz ."},
        {"q{2,}rst{0,3}uvw", "qrst", "uvw ."},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct rule_src src = {"t", RULE_REGEX, cases[i].pat, strlen(cases[i].pat), 0, 0};
        struct parse_result pr = {0};
        uint32_t pos;
        char msg[240];
        ck_assert_int_eq(parse_rule(&src, &pr, &pos, msg, sizeof(msg)), 0);
        struct factor_set *fs = malloc(sizeof(*fs));
        ck_assert_ptr_nonnull(fs);
        ck_assert_msg(factor_extract(pr.root, fs) == 0, "%s: no factor", cases[i].pat);
        for (uint32_t k = 0; k < fs->n; k++) {
            const struct byteset *l = &fs->f[k].lead;
            for (const char *c = cases[i].lead_has; *c; c++)
                ck_assert_msg(byteset_has(l, (uint8_t)*c), "%s: factor %u's lead lacks '%c'",
                              cases[i].pat, k, *c);
            for (const char *c = cases[i].lead_lacks; *c; c++)
                ck_assert_msg(!byteset_has(l, (uint8_t)*c), "%s: factor %u's lead has '%c'",
                              cases[i].pat, k, *c);
        }
        struct byteset all = {{0}};
        factor_set_span_bytes(fs, 0, &all);
        ck_assert(bytes_in(&all, cases[i].lead_has));
        for (uint32_t k = 0; k < fs->n; k++)
            for (uint32_t j = 0; j < fs->f[k].len; j++)
                for (unsigned c = 0; c < 256; c++)
                    ck_assert(!byteset_has(&fs->f[k].set[j], c) || byteset_has(&all, c));
        ck_assert(factor_span_break_chance(&all) > 0);
        free(fs);
        parse_result_finish(&pr);
    }
}
END_TEST

/* A rule's leading repeat is cut to its least count where nothing is
 * asserted before it: in an unanchored search that reports ends, text
 * ending in X{k}R (k > m) ends in X{m}R. So `[a-z ]+ the end` is a
 * bounded rule of 9 bytes, gated or run as a DFA, not an unbounded one
 * confirmed from the run of letters before each factor. An assertion
 * first (`\b\w+`, `^`) keeps the repeat whole. Matches are checked against
 * Hyperscan in test_hsdiff (test_lead_shapes). */
START_TEST(leading_repeats_cut)
{
    static const struct {
        const char *pat;
        uint32_t flags;
        uint32_t maxlen; /* after parse_strip_prefix; REPEAT_INF: unbounded */
    } cases[] = {
        {"[a-z ]+ the end", 0, 9},
        {"(\\w+\\s)+baker", 0, 7},
        {"(\\d+,)+total", 0, 7},
        {"x{3,7}yz", 0, 5},
        {"(b+a|c{2,})d", 0, 3},
        {"(a+b|c)+d", 0, 3},
        {"(?s).*holmes", 0, 6},
        {"a+", 0, 1},
        {"[a-z]+@[a-z]+\\.com", 0, REPEAT_INF},
        {"\\b\\w+foo", 0, REPEAT_INF},
        {"^a+b", RULE_F_MULTILINE, REPEAT_INF},
        {"(\\bq+)+r", 0, REPEAT_INF},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct rule_src src = {"t", RULE_REGEX, cases[i].pat, strlen(cases[i].pat), cases[i].flags,
                               0};
        struct parse_result pr = {0};
        uint32_t pos;
        char msg[240];
        ck_assert_int_eq(parse_rule(&src, &pr, &pos, msg, sizeof(msg)), 0);
        uint32_t got = parse_maxlen(parse_strip_prefix(pr.root));
        ck_assert_msg(got == cases[i].maxlen, "%s: maxlen %u, want %u", cases[i].pat, got,
                      cases[i].maxlen);
        parse_result_finish(&pr);
    }
    /* the catalog holds the cut rule: one bounded group */
    struct rule_src r = {"t", RULE_REGEX, "[a-z ]+ the end", 15, 0, 0};
    struct rules_result res;
    struct vks_error err;
    ck_assert_int_eq(rules_compile(&r, 1, NULL, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    ck_assert_uint_eq(catalog_nfa_count(res.catalog), 0);
    ck_assert_uint_eq(catalog_group_count(res.catalog), 1);
    struct catalog_group grp;
    catalog_group(res.catalog, 0, &grp);
    ck_assert_uint_eq(grp.maxlen, 9);
    ck_assert_str_eq(ENDS(RULE_REGEX, "[a-z ]+ the end", 0, "at the end. the end"), "10");
    ck_assert_str_eq(ENDS(RULE_REGEX, "(\\w+\\s)+baker", 0, "a b c baker _\tbaker"), "11,19");
    ck_assert_str_eq(ENDS(RULE_REGEX, "\\b\\w+foo", 0, "xfoo foo zzfoo"), "4,14");
    rules_result_finish(&res);
}
END_TEST

/* The mask step of small bit-NFA groups (catalog_nfa.small, rules/nfastep.h)
 * against the range step it replaces, state for state: groups of 1 to 4
 * state words with assertions, start edges on and off, caseless, classes
 * and counted repeats, over random bytes from an alphabet that feeds them. */
START_TEST(small_step_equals_ranges)
{
    static const char *const pats[] = {
        "\\bab[0-9]{2,5}c\\b", "(?m)^x[a-c ]{0,9}y$",       "(ab|cd){2,4}e",
        "[^\\n]{3,20}q\\b",    "(?i)hello\\s+w[a-z]{1,30}", "\\Bz{2}[0-9a-f]{8,40}",
        "a.{5,60}b",           "\\d{3}-\\d{2}-\\d{4}",
    };
    enum { N = sizeof(pats) / sizeof(pats[0]) };
    static const char alpha[] = "abcdexyqz0123456789 \n-hHeElLoOwW\t.";
    uint64_t seed = 0x853c49e6748fea9bull;
    uint32_t small = 0;
    for (uint32_t r = 0; r < N; r++) {
        struct rule_src src = {"r", RULE_REGEX, pats[r], strlen(pats[r]), 0, 0};
        struct rules_options opt = {.force_bitnfa = true};
        struct rules_result res;
        struct vks_error err;
        ck_assert_int_eq(rules_compile(&src, 1, &opt, &res, &err), 0);
        ck_assert_uint_eq(catalog_nfa_count(res.catalog), 1);
        struct catalog_nfa g, plain;
        uint32_t k = r;
        catalog_nfa(res.catalog, 0, &g);
        if (g.small == NULL) {
            rules_result_finish(&res);
            continue;
        }
        small++;
        plain = g;
        plain.small = NULL;
        uint32_t a[8] = {0}, b[8] = {0}, c[8] = {0}, d[8] = {0};
        struct nvec s1 = {a, 1, 0}, t1 = {b, 1, 0}, s2 = {c, 1, 0}, t2 = {d, 1, 0};
        for (int i = 0; i < 20000; i++) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            uint8_t ch = (uint8_t)alpha[seed % (sizeof(alpha) - 1)];
            uint32_t pk = CAT_PK((uint32_t)(seed >> 20) % 4, (uint32_t)(seed >> 24) % 5);
            bool starts = (seed >> 30) % 4 != 0;
            nfa_step_starts(&g, &s1, &t1, pk, ch, starts);
            nfa_step_starts(&plain, &s2, &t2, pk, ch, starts);
            ck_assert_msg(t1.lo == t2.lo && t1.hi == t2.hi, "group %u byte %d: live words differ",
                          k, i);
            for (uint32_t w = t1.lo; w <= t1.hi && t1.lo <= t1.hi; w++)
                ck_assert_msg(t1.v[w] == t2.v[w], "group %u byte %d word %u differ", k, i, w);
            struct nvec x = s1;
            s1 = t1;
            t1 = x;
            x = s2;
            s2 = t2;
            t2 = x;
        }
        rules_result_finish(&res);
    }
    ck_assert_uint_ge(small, 6);
}
END_TEST

Suite *rules_suite(void)
{
    Suite *s = suite_create("rules");
    TCase *tc = tcase_create("language");
    /* hit_sort_orders sorts 70,000 hits twenty times: over Check's default
     * 4 s under ASan and UBSan */
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, parse_errors, 0, sizeof(bad_cases) / sizeof(bad_cases[0]));
    tcase_add_test(tc, pattern_length_limit);
    tcase_add_loop_test(tc, semantic_checks, 0, sizeof(check_cases) / sizeof(check_cases[0]));
    tcase_add_loop_test(tc, escape_sets, 0, sizeof(set_cases) / sizeof(set_cases[0]));
    tcase_add_test(tc, matching_semantics);
    tcase_add_test(tc, hex_strings);
    tcase_add_test(tc, pattern_file);
    tcase_add_test(tc, bad_rules_do_not_stop_the_rest);
    tcase_add_test(tc, grouping_under_budget);
    tcase_add_test(tc, dense_counter_kept_apart);
    tcase_add_test(tc, dense_counters_share);
    tcase_add_loop_test(tc, released_trees_parsed_again, 0, 3);
    tcase_add_loop_test(tc, strings_kept_as_bytes, 0, 2);
    tcase_add_test(tc, radix_sort_orders);
    tcase_add_test(tc, hit_sort_orders);
    tcase_add_test(tc, confirm_start_runs);
    tcase_add_test(tc, factor_leads);
    tcase_add_test(tc, leading_repeats_cut);
    tcase_add_test(tc, small_step_equals_ranges);
    suite_add_tcase(s, tc);
    return s;
}
