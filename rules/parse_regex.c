/*
 * The regex half of the parser (parse_internal.h): bracket expressions
 * and POSIX classes, groups and inline flags, atoms, quantifiers and
 * alternation, as docs/rules.md describes the language.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"
#include "parse_internal.h"

/* ---- character classes ---- */

struct posix_class {
    const char *name;
    void (*fill)(struct byteset *);
};

static void fill_alpha(struct byteset *s)
{
    set_range(s, 'a', 'z');
    set_range(s, 'A', 'Z');
}
static void fill_digit(struct byteset *s)
{
    set_range(s, '0', '9');
}
static void fill_alnum(struct byteset *s)
{
    fill_alpha(s);
    fill_digit(s);
}
static void fill_upper(struct byteset *s)
{
    set_range(s, 'A', 'Z');
}
static void fill_lower(struct byteset *s)
{
    set_range(s, 'a', 'z');
}
static void fill_space(struct byteset *s)
{
    set_range(s, '\t', '\r');
    byteset_add(s, ' ');
}
static void fill_blank(struct byteset *s)
{
    byteset_add(s, ' ');
    byteset_add(s, '\t');
}
static void fill_cntrl(struct byteset *s)
{
    set_range(s, 0, 31);
    byteset_add(s, 127);
}
static void fill_graph(struct byteset *s)
{
    set_range(s, 33, 126);
}
static void fill_print(struct byteset *s)
{
    set_range(s, 32, 126);
}
static void fill_punct(struct byteset *s)
{
    set_range(s, 33, 47);
    set_range(s, 58, 64);
    set_range(s, 91, 96);
    set_range(s, 123, 126);
}
static void fill_xdigit(struct byteset *s)
{
    fill_digit(s);
    set_range(s, 'a', 'f');
    set_range(s, 'A', 'F');
}
static void fill_word(struct byteset *s)
{
    fill_alnum(s);
    byteset_add(s, '_');
}
static void fill_ascii(struct byteset *s)
{
    set_range(s, 0, 127);
}

static const struct posix_class posix_classes[] = {
    {"alpha", fill_alpha}, {"digit", fill_digit}, {"alnum", fill_alnum}, {"upper", fill_upper},
    {"lower", fill_lower}, {"space", fill_space}, {"blank", fill_blank}, {"cntrl", fill_cntrl},
    {"graph", fill_graph}, {"print", fill_print}, {"punct", fill_punct}, {"xdigit", fill_xdigit},
    {"word", fill_word},   {"ascii", fill_ascii},
};

/*
 * A POSIX bracket item at `at` ("[:", "[." or "[="), as Hyperscan reads
 * it: the opener, then any bytes but ']' ("\]" counts as a byte), then the
 * closer ":]" (".]", "=]"). Returns the index of the closing ':' ('.',
 * '='), or 0 if there is none.
 */
static size_t posix_end(const struct parser *p, size_t at)
{
    if (at + 1 >= p->len || p->s[at] != '[')
        return 0;
    unsigned char term = p->s[at + 1];
    if (term != ':' && term != '.' && term != '=')
        return 0;
    for (size_t j = at + 2; j < p->len; j++) {
        if (p->s[j] == '\\' && j + 1 < p->len && p->s[j + 1] == ']')
            j++;
        else if (p->s[j] == term && j + 1 < p->len && p->s[j + 1] == ']')
            return j;
        else if (p->s[j] == ']')
            return 0;
    }
    return 0;
}

/* [:name:] at p->i (which points at '['); returns true if one was parsed
 * (or an error reported). */
static bool parse_posix(struct parser *p, struct byteset *into)
{
    size_t at = p->i, end = posix_end(p, p->i);
    if (end == 0)
        return false;
    if (p->s[at + 1] != ':') {
        parse_fail(p, at,
                   "POSIX collating element %.*s is not supported: list the bytes in the class",
                   (int)(end + 2 - at > 40 ? 40 : end + 2 - at), (const char *)p->s + at);
        return true;
    }
    size_t name = at + 2;
    bool neg = false;
    if (name < end && p->s[name] == '^') {
        neg = true;
        name++;
    }
    for (size_t k = 0; k < sizeof(posix_classes) / sizeof(posix_classes[0]); k++) {
        const char *nm = posix_classes[k].name;
        if (strlen(nm) == end - name && memcmp(nm, p->s + name, end - name) == 0) {
            struct byteset s = {{0}};
            posix_classes[k].fill(&s);
            /* Hyperscan folds a negated POSIX item before negating it:
             * (?i)[[:^lower:]] is every byte but the letters, not every
             * byte (the fold of [^a-z]). Only upper and lower differ. */
            if (neg && p->class_caseless)
                set_fold_case(&s);
            if (neg)
                set_invert(&s);
            set_union(into, &s);
            p->i = end + 2;
            return true;
        }
    }
    if (end - name > 32)
        end = name + 32;
    parse_fail(p, at,
               "unknown POSIX class [:%.*s:]: use alpha, digit, alnum, upper, lower, space, "
               "blank, cntrl, graph, print, punct, xdigit, word or ascii",
               (int)(end - name), (const char *)p->s + name);
    return true;
}

/* Skips \E, and \Q (which starts quoting), at p->i in a class. */
static void class_skip_quotes(struct parser *p)
{
    while (peek(p, 0) == '\\' && (peek(p, 1) == 'E' || (peek(p, 1) == 'Q' && !p->quote))) {
        p->quote = peek(p, 1) == 'Q';
        p->i += 2;
    }
}

/*
 * One class member at p->i: returns a single byte (>= 0), or -2 after adding
 * a multi-byte set (\d, [:alpha:]) to `into`, or -1 on error.
 */
static int class_atom(struct parser *p, struct byteset *into)
{
    size_t at = p->i;
    if (p->quote)
        return p->s[p->i++];
    if (parse_posix(p, into))
        return p->err ? -1 : -2;
    int c = p->s[p->i++];
    if (c != '\\')
        return c;
    c = peek(p, 0);
    p->i++;
    return parse_regex_escape(p, c, at, true, into);
}

static struct node *parse_class(struct parser *p, const struct pflags *fl)
{
    size_t at = p->i++; /* '[' */
    struct byteset s = {{0}};
    bool neg = false;
    for (;;) { /* '^' after any \E or empty \Q\E still negates, as in Hyperscan */
        if (peek(p, 0) == '\\' && peek(p, 1) == 'E') {
            p->i += 2;
        } else if (peek(p, 0) == '\\' && peek(p, 1) == 'Q' && peek(p, 2) == '\\' &&
                   peek(p, 3) == 'E') {
            p->i += 4;
        } else if (peek(p, 0) == '^' && !neg) {
            neg = true;
            p->i++;
        } else {
            break;
        }
    }
    bool first = true;
    p->class_caseless = fl->caseless;
    for (;;) {
        class_skip_quotes(p);
        if (p->i >= p->len) {
            parse_fail(p, at, "unterminated character class: add the closing ']'");
            return NULL;
        }
        if (p->s[p->i] == ']' && !first && !p->quote)
            break;
        first = false;
        int lo = class_atom(p, &s);
        if (lo == -1)
            return NULL;
        if (lo >= 0)
            class_skip_quotes(p); /* a quoted byte may start a range: [\Q-\E-z] */
        if (lo >= 0 && !p->quote && peek(p, 0) == '-' && peek(p, 1) >= 0 && peek(p, 1) != ']') {
            p->i++;
            class_skip_quotes(p);
            if (!p->quote && peek(p, 0) == ']') { /* [a-\E]: the '-' is last */
                byteset_add(&s, (unsigned)lo);
                byteset_add(&s, '-');
                continue;
            }
            size_t hi_at = p->i;
            int hi = p->i < p->len ? class_atom(p, &s) : -1;
            if (hi == -1) {
                parse_fail(p, at, "unterminated character class: add the closing ']'");
                return NULL;
            }
            if (hi == -2) {
                parse_fail(p, hi_at,
                           "range in character class ends in a class escape or POSIX class: "
                           "write '-' last for a literal '-', e.g. [a\\d-]");
                return NULL;
            }
            if (hi < lo) {
                parse_fail(p, hi_at,
                           "range out of order in character class: write the smaller byte "
                           "first, e.g. [a-z]");
                return NULL;
            }
            set_range(&s, (unsigned)lo, (unsigned)hi);
            continue;
        }
        if (lo >= 0)
            byteset_add(&s, (unsigned)lo);
    }
    p->i++; /* ']' */
    if (fl->caseless)
        set_fold_case(&s);
    if (neg)
        set_invert(&s);
    return parse_set_node(p, at, s, false);
}

/* ---- regex grammar ---- */

static struct node *parse_alt(struct parser *p, struct pflags fl);

static bool is_quant_brace(const struct parser *p, uint32_t *min, uint32_t *max, size_t *end);

static struct node *assert_node(struct parser *p, size_t pos, enum assert_kind k)
{
    struct node *n = parse_node(p, N_ASSERT, pos);
    if (n != NULL)
        n->u.as = k;
    return n;
}

static bool is_pattern_space(int c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/*
 * Skips what stands for nothing between atoms: \E outside a quote, an empty
 * \Q\E, comments (?#...), and with (?x) whitespace and # comments (to the
 * next '\n' or the end of the pattern). Nothing is skipped inside \Q...\E.
 */
static void skip_ignored(struct parser *p, const struct pflags *fl)
{
    while (!p->quote && p->i < p->len) {
        int c = p->s[p->i];
        if (c == '\\' && peek(p, 1) == 'E') {
            p->i += 2;
        } else if (c == '\\' && peek(p, 1) == 'Q' && peek(p, 2) == '\\' && peek(p, 3) == 'E') {
            p->i += 4;
        } else if (fl->extended && is_pattern_space(c)) {
            p->i++;
        } else if (fl->extended && c == '#') {
            while (p->i < p->len && p->s[p->i] != '\n')
                p->i++;
        } else if (c == '(' && peek(p, 1) == '?' && peek(p, 2) == '#' &&
                   memchr(p->s + p->i, ')', p->len - p->i) != NULL) {
            p->i =
                (size_t)((const unsigned char *)memchr(p->s + p->i, ')', p->len - p->i) - p->s) + 1;
        } else {
            break;
        }
    }
}

/* Parses "(?flags)" / "(?flags:" after "(?"; returns 1 for a bare flag group
 * (flags changed in *fl), 2 for a scoped group (flags in *inner), 0 on error. */
static int parse_flag_group(struct parser *p, size_t at, struct pflags *fl, struct pflags *inner)
{
    struct pflags f = *fl;
    bool on = true;
    for (;;) {
        int c = peek(p, 0);
        p->i++;
        switch (c) {
        case 'i':
            f.caseless = on;
            break;
        case 's':
            f.dotall = on;
            break;
        case 'm':
            f.multiline = on;
            break;
        case 'x':
            f.extended = on;
            break;
        case '-':
            if (!on) {
                parse_fail(p, p->i - 1,
                           "two '-' in an inline flag group: list the flags to turn off after one "
                           "'-', e.g. (?i-sm)");
                return 0;
            }
            if (peek(p, 0) == ')' || peek(p, 0) == ':') {
                parse_fail(p, p->i - 1,
                           "'-' with no flag after it in an inline flag group: write e.g. (?-i)");
                return 0;
            }
            on = false;
            break;
        case ')':
            *fl = f;
            return 1;
        case ':':
            *inner = f;
            return 2;
        case -1:
            parse_fail(p, at, "unterminated group: add the closing ')'");
            return 0;
        default:
            if (c == 'U' || c == 'J' || c == 'n' || c == 'X')
                parse_fail(p, p->i - 1,
                           "inline flag '%c' is not supported: only i, s, m and x are; remove it",
                           c);
            else
                parse_fail(p, p->i - 1,
                           "unknown group construct (?%c...): use (?:...), (?<name>...), (?i), "
                           "(?s), (?m), (?x) or (?i:...)",
                           c);
            return 0;
        }
    }
}

/* A group name at p->s[j] ending in `close`; returns the index of `close`,
 * or 0 if the name is not letters, digits and '_' starting with a non-digit. */
static size_t group_name_end(const struct parser *p, size_t j, int close)
{
    size_t k = j;
    while (k < p->len && (is_alnum(p->s[k]) || p->s[k] == '_'))
        k++;
    if (k == j || k >= p->len || p->s[k] != close || (p->s[j] >= '0' && p->s[j] <= '9'))
        return 0;
    return k;
}

/*
 * The name of a named group, (?<name>, (?'name' or (?P<name>, with p->i
 * just past "(?". Named groups are plain grouping for us, but they count
 * for \N (backreference or octal) and a name may be used once, as in
 * Hyperscan. Returns false after reporting an error.
 */
static bool parse_group_name(struct parser *p, size_t at)
{
    int c = peek(p, 0);
    size_t j = p->i + (c == 'P' ? 2 : 1);
    size_t end = group_name_end(p, j, c == '\'' ? '\'' : '>');
    if (end == 0) {
        parse_fail(p, at,
                   "bad group name: write (?<name>...), (?'name'...) or (?P<name>...) with "
                   "a name of letters, digits and '_' that does not start with a digit");
        return false;
    }
    for (uint32_t k = 0; k < p->nnames; k++) {
        if (p->names[2 * k + 1] == end - j &&
            memcmp(p->s + p->names[2 * k], p->s + j, end - j) == 0) {
            parse_fail(p, at, "two named groups use the name '%.*s': rename one", (int)(end - j),
                       (const char *)p->s + j);
            return false;
        }
    }
    if (p->nnames == p->capnames) {
        uint32_t cap = p->capnames ? p->capnames * 2 : 8;
        uint32_t *nv = parse_alloc(p, 2 * cap * sizeof(*nv));
        if (nv == NULL)
            return false;
        if (p->nnames)
            memcpy(nv, p->names, 2 * p->nnames * sizeof(*nv));
        p->names = nv;
        p->capnames = cap;
    }
    p->names[2 * p->nnames] = (uint32_t)j;
    p->names[2 * p->nnames + 1] = (uint32_t)(end - j);
    p->nnames++;
    p->i = end + 1;
    p->ngroups++;
    return true;
}

static struct node *parse_group(struct parser *p, struct pflags *fl)
{
    size_t at = p->i++; /* '(' */
    struct pflags inner = *fl;
    if (peek(p, 0) != '?') {
        p->ngroups++;
    } else {
        p->i++;
        int c = peek(p, 0), c1 = peek(p, 1);
        if (c == ':') {
            p->i++;
        } else if (c == '=' || c == '!') {
            parse_fail(p, at,
                       "lookahead (?%c...) is not supported: vkscan reports end offsets of "
                       "regular patterns only; match the text itself instead",
                       c);
            return NULL;
        } else if (c == '<' && (c1 == '=' || c1 == '!')) {
            parse_fail(p, at,
                       "lookbehind (?<%c...) is not supported: vkscan reports end offsets of "
                       "regular patterns only; match the text itself instead",
                       c1);
            return NULL;
        } else if (c == 'P' && c1 == '=') {
            parse_fail(p, at,
                       "named backreference (?P=name) is not supported: vkscan matches regular "
                       "languages only; repeat the group's pattern instead");
            return NULL;
        } else if (c == 'P' && c1 == '>') {
            parse_fail(p, at,
                       "subroutine call (?P>name) is not supported: vkscan matches regular "
                       "languages only; write the group's pattern out again");
            return NULL;
        } else if (c == '<' || c == '\'' || (c == 'P' && c1 == '<')) {
            if (!parse_group_name(p, at))
                return NULL;
        } else if (c == '#') {
            while (p->i < p->len && p->s[p->i] != ')')
                p->i++;
            if (p->i >= p->len) {
                parse_fail(p, at, "unterminated comment (?#...: add the closing ')'");
                return NULL;
            }
            p->i++;
            return NULL; /* a comment: no node and no error */
        } else if (c == '>') {
            parse_fail(p, at, "atomic group (?>...) is not supported: use (?:...)");
            return NULL;
        } else if (c == '|') {
            parse_fail(p, at, "branch reset group (?|...) is not supported: use (?:...)");
            return NULL;
        } else if (c == '(') {
            parse_fail(p, at,
                       "conditional group (?(...)...) is not supported: vkscan matches regular "
                       "languages only; use an alternation (...|...)");
            return NULL;
        } else if (c == 'R' || c == '&' || (c >= '0' && c <= '9') ||
                   ((c == '+' || c == '-') && c1 >= '0' && c1 <= '9')) {
            parse_fail(p, at,
                       "recursion or subroutine call (?%c...) is not supported: vkscan matches "
                       "regular languages only; write the group's pattern out again",
                       c);
            return NULL;
        } else {
            int r = parse_flag_group(p, at, fl, &inner);
            if (r == 0)
                return NULL;
            if (r == 1)
                return NULL; /* flags changed; caller sees no node and no error */
        }
    }
    struct node *n = parse_alt(p, inner);
    if (p->err)
        return NULL;
    if (peek(p, 0) != ')') {
        parse_fail(p, at, "unterminated group: add the closing ')'");
        return NULL;
    }
    p->i++;
    return n;
}

static struct node *parse_escape(struct parser *p, const struct pflags *fl)
{
    size_t at = p->i++;
    int c = peek(p, 0);
    p->i++;
    switch (c) {
    case 'b':
        return assert_node(p, at, A_WORDB);
    case 'B':
        return assert_node(p, at, A_NOTWORDB);
    case 'A':
        return assert_node(p, at, A_BOS);
    case 'z':
        return assert_node(p, at, A_EOD);
    case 'Z':
        return assert_node(p, at, A_DOLLAR);
    case 'C': { /* one code unit: any byte, newline included */
        struct byteset s = {{0}};
        set_invert(&s);
        return parse_set_node(p, at, s, false);
    }
    case 'Q':
        p->quote = true;
        return NULL; /* no node and no error */
    case 'E':
        return NULL;
    default:
        break;
    }
    struct byteset s = {{0}};
    int v = parse_regex_escape(p, c, at, false, &s);
    if (v == -1)
        return NULL;
    if (v == -2)
        return parse_set_node(p, at, s, false);
    return parse_byte_node(p, at, (unsigned)v, fl->caseless);
}

/*
 * A '[' outside a class that starts a POSIX item ("[:alpha:]", "[.a.]"):
 * PCRE and Hyperscan refuse these; reports and returns true.
 */
static bool posix_outside_class(struct parser *p)
{
    size_t end = posix_end(p, p->i);
    if (end == 0)
        return false;
    if (end - p->i > 40) /* keep the message short */
        parse_fail(p, p->i,
                   "POSIX class or collating element outside a bracket expression: write "
                   "[[:name:]] for a class, or escape the '[' as \\[");
    else if (p->s[p->i + 1] == ':')
        parse_fail(p, p->i,
                   "POSIX class [:%.*s:] is only valid inside a bracket expression: write "
                   "[[:%.*s:]]",
                   (int)(end - p->i - 2), (const char *)p->s + p->i + 2, (int)(end - p->i - 2),
                   (const char *)p->s + p->i + 2);
    else
        parse_fail(p, p->i,
                   "POSIX collating element %.*s is not supported: list the bytes in a class "
                   "instead",
                   (int)(end + 2 - p->i), (const char *)p->s + p->i);
    return true;
}

/* An atom, or NULL with no error for what stands for nothing: an inline
 * flag group "(?i)", a comment, \Q or \E. */
static struct node *parse_atom(struct parser *p, struct pflags *fl)
{
    size_t at = p->i;
    int c = p->s[p->i];
    uint32_t mn, mx;
    size_t end;
    if (p->quote) {
        if (c == '\\' && peek(p, 1) == 'E') {
            p->i += 2;
            p->quote = false;
            return NULL;
        }
        p->i++;
        return parse_byte_node(p, at, (unsigned)c, fl->caseless);
    }
    switch (c) {
    case '(':
        return parse_group(p, fl);
    case '[':
        if (posix_outside_class(p))
            return NULL;
        return parse_class(p, fl);
    case '\\':
        return parse_escape(p, fl);
    case '.': {
        p->i++;
        struct byteset s = {{0}};
        set_invert(&s);
        if (!fl->dotall)
            s.w['\n' >> 6] &= ~((uint64_t)1 << ('\n' & 63));
        return parse_set_node(p, at, s, false);
    }
    case '^':
        p->i++;
        return assert_node(p, at, fl->multiline ? A_BOL : A_BOS);
    case '$':
        p->i++;
        return assert_node(p, at, fl->multiline ? A_EOL : A_DOLLAR);
    case '*':
    case '+':
    case '?':
        parse_fail(p, at, "quantifier '%c' has nothing to repeat: escape it as \\%c", c, c);
        return NULL;
    case '{':
        if (is_quant_brace(p, &mn, &mx, &end)) {
            parse_fail(p, at, "quantifier '{' has nothing to repeat: escape it as \\{");
            return NULL;
        }
        p->i++;
        return parse_byte_node(p, at, '{', fl->caseless);
    default:
        p->i++;
        return parse_byte_node(p, at, (unsigned)c, fl->caseless);
    }
}

static bool read_uint(const struct parser *p, size_t *j, uint32_t *v)
{
    size_t k = *j;
    uint64_t x = 0;
    while (k < p->len && p->s[k] >= '0' && p->s[k] <= '9') {
        x = x * 10 + (p->s[k] - '0');
        if (x > 100000000)
            x = 100000000;
        k++;
    }
    if (k == *j)
        return false;
    *j = k;
    *v = (uint32_t)x;
    return true;
}

/* Is there a {m}, {m,} or {m,n} at p->i? (Anything else is a literal '{'.) */
static bool is_quant_brace(const struct parser *p, uint32_t *min, uint32_t *max, size_t *end)
{
    size_t j = p->i;
    if (j >= p->len || p->s[j] != '{')
        return false;
    j++;
    if (!read_uint(p, &j, min))
        return false;
    *max = *min;
    if (j < p->len && p->s[j] == ',') {
        j++;
        if (!read_uint(p, &j, max))
            *max = REPEAT_INF;
    }
    if (j >= p->len || p->s[j] != '}')
        return false;
    *end = j + 1;
    return true;
}

/*
 * The quantifiers after `atom`. `bare_assert`: the atom is an assertion
 * written as such (^, \b, ...), which Hyperscan and PCRE refuse to repeat;
 * a group around one may be repeated.
 */
static struct node *parse_quantified(struct parser *p, struct node *atom, bool bare_assert,
                                     const struct pflags *fl)
{
    for (int nq = 0;; nq++) {
        if (p->quote) {
            /* bytes in \Q...\E are literal; a quantifier may follow the \E */
            if (peek(p, 0) != '\\' || peek(p, 1) != 'E')
                return atom;
            p->i += 2;
            p->quote = false;
        }
        skip_ignored(p, fl);
        int c = peek(p, 0);
        size_t at = p->i;
        uint32_t mn, mx;
        size_t end;
        if (c == '*' || c == '+' || c == '?') {
            mn = c == '+' ? 1 : 0;
            mx = c == '?' ? 1 : REPEAT_INF;
            end = p->i + 1;
        } else if (!is_quant_brace(p, &mn, &mx, &end)) {
            return atom;
        }
        if (nq > 0) {
            parse_fail(p, at,
                       "a quantifier follows another quantifier: wrap the repeated part in "
                       "(?:...) first");
            return NULL;
        }
        if (bare_assert) {
            parse_fail(p, at,
                       "quantifier after an assertion (^, $, \\b, \\B, \\A, \\Z or \\z): an "
                       "assertion cannot be repeated; remove the quantifier");
            return NULL;
        }
        if (mx != REPEAT_INF && mn > mx) {
            parse_fail(p, at, "repeat {%u,%u} has min > max: swap them", mn, mx);
            return NULL;
        }
        if ((mx != REPEAT_INF && mx > PARSE_MAX_REPEAT) || mn > PARSE_MAX_REPEAT) {
            parse_fail(p, at, "repeat count over the limit of %u: use a smaller bound or {m,}",
                       PARSE_MAX_REPEAT);
            return NULL;
        }
        if (mx == 0) {
            parse_fail(p, at, "repeat {0} matches nothing: remove it");
            return NULL;
        }
        p->i = end;
        if (peek(p, 0) == '?') {
            p->i++; /* lazy: same end offsets as greedy */
        } else if (peek(p, 0) == '+') {
            parse_fail(p, p->i, "possessive quantifiers are not supported: drop the '+'");
            return NULL;
        }
        struct node *r = parse_node(p, N_REPEAT, at);
        if (r == NULL)
            return NULL;
        r->u.rep.kid = atom;
        r->u.rep.min = mn;
        r->u.rep.max = mx;
        atom = r;
    }
}

static struct node *empty_cat(struct parser *p, size_t pos)
{
    struct node *n = parse_node(p, N_CAT, pos);
    if (n != NULL)
        n->u.list.n = 0;
    return n;
}

/* A concatenation; stops at '|', ')' or the end. Inline flag groups change
 * *fl for the rest of the enclosing group, alternatives included. */
static struct node *parse_cat(struct parser *p, struct pflags *fl)
{
    struct nodevec v = {0};
    size_t at = p->i;
    for (;;) {
        skip_ignored(p, fl);
        if (p->i >= p->len || (!p->quote && (p->s[p->i] == '|' || p->s[p->i] == ')')))
            break;
        bool group = p->s[p->i] == '(' && !p->quote;
        struct node *a = parse_atom(p, fl);
        if (p->err)
            return NULL;
        if (a == NULL)
            continue; /* (?i), (?#...), \Q, \E */
        a = parse_quantified(p, a, a->type == N_ASSERT && !group, fl);
        if (a == NULL || !parse_vec_push(p, &v, a))
            return NULL;
    }
    if (v.n == 0)
        return empty_cat(p, at);
    return parse_list_node(p, N_CAT, at, &v);
}

static struct node *regex_seq(struct parser *p, void *fl)
{
    return parse_cat(p, fl);
}

/* Inline flags set in one alternative hold for the ones after it, up to
 * the group's end: the alternatives share `fl`, a copy of the group's. */
static struct node *parse_alt(struct parser *p, struct pflags fl)
{
    return parse_alternation(p, regex_seq, &fl, "groups");
}

struct node *parse_regex(struct parser *p, uint32_t flags)
{
    struct pflags fl = {
        .caseless = flags & RULE_F_CASELESS,
        .dotall = flags & RULE_F_DOTALL,
        .multiline = flags & RULE_F_MULTILINE,
    };
    struct node *n = parse_alt(p, fl);
    if (p->err)
        return NULL;
    if (p->i < p->len) { /* only a ')' stops parse_alt early */
        parse_fail(p, p->i, "unmatched ')': remove it or escape it as \\)");
        return NULL;
    }
    return n;
}
