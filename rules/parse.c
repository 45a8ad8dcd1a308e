/*
 * Recursive-descent parser for vkscan's pattern languages. See parse.h for
 * the tree it builds and docs/rules.md for the language. This file holds
 * the tree's memory, byte sets, escapes, literals, hex strings and the
 * entry point; parse_regex.c the regex grammar (parse_internal.h).
 */
#include "parse.h"
#include "parse_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A bump allocator: the tree is freed in one go with the arena. The first
 * chunk is sized from the pattern (a node or less per byte), later ones
 * double up to 64 KiB: most rules are short, and a 64 KiB chunk per rule
 * made a large literal set's parse trees the biggest part of its compile's
 * peak memory (one or two touched pages each, 10,000 rules: 40-80 MB
 * resident). */
struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

struct arena {
    struct arena_chunk *head;
    size_t next_cap; /* bytes of the next chunk; 0: 1 KiB */
};

static void *arena_alloc(struct arena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    struct arena_chunk *c = a->head;
    if (c == NULL || c->cap - c->used < n) {
        size_t want = a->next_cap ? a->next_cap : 1024;
        a->next_cap = want < 65536 ? want * 2 : 65536;
        size_t cap = n > want ? n : want;
        c = malloc(sizeof(*c) + cap);
        if (c == NULL)
            return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void *parse_alloc(struct parser *p, size_t n)
{
    void *m = arena_alloc(p->arena, n);
    if (m == NULL && p->err == 0) {
        p->err = -ENOMEM;
        snprintf(p->msg, p->msgsz, "out of memory while parsing");
    }
    return m;
}

static void arena_free(struct arena *a)
{
    if (a == NULL)
        return;
    while (a->head != NULL) {
        struct arena_chunk *next = a->head->next;
        free(a->head);
        a->head = next;
    }
    free(a);
}

void parse_result_finish(struct parse_result *res)
{
    if (res == NULL)
        return;
    arena_free(res->arena);
    res->arena = NULL;
    res->root = NULL;
}

VKS_PRINTF(3, 4) void parse_fail(struct parser *p, size_t pos, const char *fmt, ...)
{
    if (p->err != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, p->msgsz, fmt, ap);
    va_end(ap);
    p->err = -EINVAL;
    p->err_pos = (uint32_t)pos;
}

struct node *parse_node(struct parser *p, enum node_type t, size_t pos)
{
    struct node *n = parse_alloc(p, sizeof(*n));
    if (n == NULL)
        return NULL;
    n->type = t;
    n->pos = (uint32_t)pos;
    return n;
}

/* ---- byte sets ---- */

static struct byteset class_of(char c)
{
    struct byteset s = {{0}};
    switch (c) {
    case 'd':
    case 'D':
        set_range(&s, '0', '9');
        break;
    case 'w':
    case 'W':
        set_range(&s, '0', '9');
        set_range(&s, 'a', 'z');
        set_range(&s, 'A', 'Z');
        byteset_add(&s, '_');
        break;
    case 's':
    case 'S':
        set_range(&s, '\t', '\r'); /* \t \n \v \f \r, as PCRE and Hyperscan */
        byteset_add(&s, ' ');
        break;
    case 'h': /* horizontal space (PCRE, non-UTF mode) */
    case 'H':
        byteset_add(&s, '\t');
        byteset_add(&s, ' ');
        byteset_add(&s, 0xa0);
        break;
    case 'v': /* vertical space: \n \v \f \r and NEL */
    case 'V':
        set_range(&s, '\n', '\r');
        byteset_add(&s, 0x85);
        break;
    }
    if (c >= 'A' && c <= 'Z')
        set_invert(&s);
    return s;
}

struct node *parse_set_node(struct parser *p, size_t pos, struct byteset s, bool caseless)
{
    struct node *n = parse_node(p, N_SET, pos);
    if (n == NULL)
        return NULL;
    if (caseless)
        set_fold_case(&s);
    n->u.set = s;
    return n;
}

struct node *parse_byte_node(struct parser *p, size_t pos, unsigned c, bool caseless)
{
    struct byteset s = {{0}};
    byteset_add(&s, c);
    return parse_set_node(p, pos, s, caseless);
}

/* ---- lists ---- */

bool parse_vec_push(struct parser *p, struct nodevec *v, struct node *n)
{
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 8;
        struct node **nv = parse_alloc(p, cap * sizeof(*nv));
        if (nv == NULL)
            return false;
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof(*nv));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = n;
    return true;
}

struct node *parse_list_node(struct parser *p, enum node_type t, size_t pos, struct nodevec *v)
{
    if (v->n == 1)
        return v->v[0];
    struct node *n = parse_node(p, t, pos);
    if (n == NULL)
        return NULL;
    n->u.list.kids = v->v;
    n->u.list.n = v->n;
    return n;
}

/* ---- escapes ---- */

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * \xHH, \xH or \x{H...}; p->i is just past the 'x'. Returns the byte or -1.
 * In a regex a \x with no hex digit after it is the byte 0, as in PCRE.
 */
static int parse_hex_escape(struct parser *p, size_t at)
{
    if (peek(p, 0) == '{') {
        size_t j = p->i + 1;
        unsigned v = 0;
        int nd = 0;
        while (j < p->len && hexval(p->s[j]) >= 0) {
            v = v * 16 + (unsigned)hexval(p->s[j++]);
            if (v > 0xfff)
                v = 0xfff;
            nd++;
        }
        if (nd == 0 || j >= p->len || p->s[j] != '}') {
            parse_fail(p, at, "bad \\x{...} escape: write one byte as \\x{00} to \\x{ff}");
            return -1;
        }
        if (v > 255) {
            parse_fail(
                p, at,
                "\\x{...} escape is over \\x{ff}: a pattern byte is \\x{00} to \\x{ff} (there "
                "is no UTF-8 mode); write a multi-byte character as its bytes");
            return -1;
        }
        p->i = j + 1;
        return (int)v;
    }
    int h = hexval(peek(p, 0)), l = hexval(peek(p, 1));
    if (h < 0) {
        if (p->regex)
            return 0; /* PCRE: \x alone is the byte 0 */
        parse_fail(p, at, "bad \\x escape: write a byte as two hex digits, e.g. \\x41");
        return -1;
    }
    if (l < 0) { /* PCRE accepts one digit */
        p->i += 1;
        return h;
    }
    p->i += 2;
    return h * 16 + l;
}

/*
 * Up to `max` octal digits at p->i, for the escape that starts at `at`.
 * Returns the byte, or -1 (reported) when the value is over \377.
 */
static int read_octal(struct parser *p, size_t at, int max)
{
    unsigned v = 0;
    size_t start = p->i;
    for (int k = 0; k < max && peek(p, 0) >= '0' && peek(p, 0) <= '7'; k++)
        v = v * 8 + (unsigned)(p->s[p->i++] - '0');
    if (v > 0377) {
        parse_fail(p, at,
                   "octal escape \\%.*s is over \\377: a byte is \\0 to \\377 in octal; write "
                   "the byte as \\xHH",
                   (int)(p->i - start), (const char *)p->s + start);
        return -1;
    }
    return (int)v;
}

/* \o{...}; p->i is just past the 'o'. Returns the byte or -1. */
static int parse_octal_brace(struct parser *p, size_t at)
{
    size_t j = p->i + 1;
    unsigned v = 0;
    if (peek(p, 0) == '{')
        while (j < p->len && p->s[j] >= '0' && p->s[j] <= '7' && v <= 0377)
            v = v * 8 + (unsigned)(p->s[j++] - '0');
    if (peek(p, 0) != '{' || j == p->i + 1 || j >= p->len || p->s[j] != '}') {
        parse_fail(p, at, "bad \\o{...} escape: write one byte in octal as \\o{0} to \\o{377}");
        return -1;
    }
    if (v > 0377) {
        parse_fail(p, at,
                   "octal escape \\o{...} is over \\o{377}: a byte is \\o{0} to \\o{377}; write "
                   "the byte as \\xHH");
        return -1;
    }
    p->i = j + 1;
    return (int)v;
}

/*
 * A backslash and a digit in a regex, as PCRE reads it; p->i is at the digit.
 * Outside a class, \1 to \7, and \N of two or more digits for N up to the
 * number of capturing groups opened so far, are backreferences (rejected).
 * Otherwise \8 and \9 are the digits themselves, and anything else is up to three octal digits
 * (\0 included: \012 is one byte, \0123 is \012 then '3'). Inside a class
 * a digit escape is never a backreference.
 */
static int digit_escape(struct parser *p, size_t at, bool in_class)
{
    int c = peek(p, 0);
    if (!in_class && c != '0') {
        uint32_t n = 0;
        size_t j = p->i;
        while (j < p->len && p->s[j] >= '0' && p->s[j] <= '9') {
            if (n < 100000)
                n = n * 10 + (uint32_t)(p->s[j] - '0');
            j++;
        }
        if (n < 8 || (n >= 10 && n <= p->ngroups)) { /* \8 and \9 alone: digits */
            parse_fail(p, at,
                       "backreference \\%u is not supported: vkscan matches regular languages "
                       "only; repeat the group's pattern instead (for a byte in octal write "
                       "\\o{...})",
                       n);
            return -1;
        }
    }
    if (c >= '8') { /* \8 and \9 are the digits */
        p->i++;
        return c;
    }
    return read_octal(p, at, 3);
}

/*
 * Escapes that stand for one byte, shared by regexes (in and out of classes)
 * and literals. `c` is the character after the backslash, already consumed.
 * Returns the byte, -1 on error (reported), or -2 if `c` is not one of them.
 * Regexes handle \v (vertical space) and the digits before calling this.
 */
static int simple_escape(struct parser *p, int c, size_t at)
{
    switch (c) {
    case 'n':
        return '\n';
    case 't':
        return '\t';
    case 'r':
        return '\r';
    case 'f':
        return '\f';
    case 'v':
        return '\v';
    case 'a':
        return 7;
    case 'e':
        return 27;
    case 'x':
        return parse_hex_escape(p, at);
    case '0': {
        int v = 0;
        for (int k = 0; k < 2 && peek(p, 0) >= '0' && peek(p, 0) <= '7'; k++)
            v = v * 8 + (p->s[p->i++] - '0');
        return v;
    }
    case 'c': {
        int x = peek(p, 0);
        if (x < 0 || x > 0x7f) {
            parse_fail(p, at,
                       "\\c must be followed by an ASCII character, e.g. \\cA for the byte 0x01");
            return -1;
        }
        p->i++;
        if (x >= 'a' && x <= 'z')
            x -= 32;
        return x ^ 0x40;
    }
    default:
        return -2;
    }
}

/* Letters whose escape outside a class is the letter itself, as in PCRE
 * without PCRE_EXTRA and in Hyperscan. */
static bool is_literal_letter_escape(int c)
{
    return c > 0 && strchr("ijmqyFIJMOTY", c) != NULL;
}

static void unsupported_escape(struct parser *p, int c, size_t at, bool in_class)
{
    if (c == 'k' || c == 'g') {
        int n = peek(p, 0);
        if (c == 'g' && (n == '<' || n == '\''))
            parse_fail(p, at,
                       "subroutine call \\g%c...%c is not supported: vkscan matches regular "
                       "languages only; write the group's pattern out again",
                       n, n == '<' ? '>' : '\'');
        else
            parse_fail(p, at,
                       "backreference \\%c is not supported: vkscan matches regular languages "
                       "only; repeat the group's pattern instead",
                       c);
    } else if (c == 'p' || c == 'P' || c == 'X')
        parse_fail(p, at,
                   "Unicode property \\%c is not supported: use a byte class such as [\\x80-\\xff]",
                   c);
    else if (c == 'R')
        parse_fail(p, at, "\\R (any line break) is not supported: use (?:\\r\\n|\\v)");
    else if (c == 'N')
        parse_fail(p, at, "\\N (any byte but newline) is not supported: use [^\\n]");
    else if (c == 'G' || c == 'K')
        parse_fail(p, at, "\\%c is not supported: remove it", c);
    else if (c == 'u')
        parse_fail(p, at, "\\u is not supported: write a byte as \\xHH");
    else if (c == 'U' || c == 'l' || c == 'L')
        parse_fail(p, at, "case-changing escape \\%c is not supported: write the letters as wanted",
                   c);
    else if (c == -1)
        parse_fail(p, at, "pattern ends with a lone backslash: write \\\\ for a backslash");
    else if (in_class &&
             (c == 'b' || c == 'B' || c == 'A' || c == 'z' || c == 'Z' || c == 'C' || is_alnum(c)))
        parse_fail(p, at,
                   "escape \\%c is not allowed in a character class: inside [...] use only byte "
                   "escapes, \\d \\w \\s \\h \\v and their negations",
                   c);
    else
        parse_fail(p, at, "unknown escape \\%c: escape only metacharacters, or use \\xHH", c);
}

/*
 * A regex escape that stands for a byte or a byte set, in or out of a class.
 * `c` is the character after the backslash, already consumed. Returns the
 * byte (>= 0), -2 after adding a set to *into, or -1 on error (reported).
 * The caller handles assertions, \C, \Q and \E first.
 */
int parse_regex_escape(struct parser *p, int c, size_t at, bool in_class, struct byteset *into)
{
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
    case 'h':
    case 'H':
    case 'v':
    case 'V': {
        struct byteset s = class_of((char)c);
        set_union(into, &s);
        return -2;
    }
    case 'o':
        return parse_octal_brace(p, at);
    default:
        break;
    }
    if (c >= '0' && c <= '9') {
        p->i--;
        return digit_escape(p, at, in_class);
    }
    if (in_class && c == 'b')
        return 8; /* backspace inside a class, as in PCRE */
    int v = simple_escape(p, c, at);
    if (v != -2)
        return v;
    if (c >= 0 && !is_alnum(c))
        return c;
    if (!in_class && is_literal_letter_escape(c))
        return c;
    unsupported_escape(p, c, at, in_class);
    return -1;
}

/* Sequences read by `seq` and separated by '|', up to a ')' or the end:
 * an alternation, or the one sequence. Each level counts against
 * MAX_DEPTH (`what` names the levels in the message). */
struct node *parse_alternation(struct parser *p, struct node *(*seq)(struct parser *, void *),
                               void *ctx, const char *what)
{
    if (++p->depth > MAX_DEPTH) {
        parse_fail(p, p->i, "%s nested deeper than %d: flatten the pattern", what, MAX_DEPTH);
        return NULL;
    }
    struct nodevec v = {0};
    size_t at = p->i;
    for (;;) {
        struct node *c = seq(p, ctx);
        if (c == NULL || !parse_vec_push(p, &v, c))
            return NULL;
        if (peek(p, 0) != '|')
            break;
        p->i++;
    }
    p->depth--;
    return parse_list_node(p, N_ALT, at, &v);
}
static struct node *parse_literal(struct parser *p, uint32_t flags)
{
    struct nodevec v = {0};
    bool caseless = flags & RULE_F_CASELESS;
    while (p->i < p->len) {
        size_t at = p->i;
        int c = p->s[p->i++];
        if (c == '\\') {
            int e = peek(p, 0);
            p->i++;
            int b = simple_escape(p, e, at);
            if (b == -1)
                return NULL;
            if (b == -2) {
                if (e == '\\' || e == '"' || e == '\'' || e == '?')
                    b = e;
                else {
                    parse_fail(p, at,
                               e < 0 ? "literal ends with a lone backslash: write \\\\"
                                     : "unknown escape in literal: use \\xHH, \\n, \\t, \\r, "
                                       "\\0, \\\\ or \\\"");
                    return NULL;
                }
            }
            c = b;
        }
        struct node *n = parse_byte_node(p, at, (unsigned)c, caseless);
        if (n == NULL || !parse_vec_push(p, &v, n))
            return NULL;
    }
    if (v.n == 0) {
        parse_fail(p, 0, "empty literal: a rule must match at least one byte");
        return NULL;
    }
    return parse_list_node(p, N_CAT, 0, &v);
}

/* ---- hex strings ---- */

static void hex_skip_space(struct parser *p)
{
    while (p->i < p->len &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

/* One byte token at p->i: "4d" a byte, "??" any byte, "4?" or "?d" a nibble
 * with the other one free, each optionally after '~' (any byte but those). */
static struct node *hex_byte(struct parser *p, bool caseless)
{
    size_t at = p->i;
    bool negate = peek(p, 0) == '~';
    if (negate)
        p->i++;
    int hi = peek(p, 0), lo = peek(p, 1);
    bool hi_any = hi == '?', lo_any = lo == '?';
    if ((!hi_any && hexval(hi) < 0) || (!lo_any && hexval(lo) < 0)) {
        parse_fail(p, negate ? at + 1 : at,
                   "bad hex string: write bytes as pairs of hex digits (4d 5a), any byte as ??, "
                   "a half byte as 4? or ?d, a jump as [n-m] and alternatives as (4d | 5a)");
        return NULL;
    }
    if (negate && hi_any && lo_any) {
        parse_fail(p, at, "~?? matches no byte: write ?? for any byte");
        return NULL;
    }
    p->i += 2;
    struct byteset s = {{0}};
    for (unsigned c = 0; c < 256; c++)
        if ((hi_any || (int)(c >> 4) == hexval(hi)) && (lo_any || (int)(c & 15) == hexval(lo)))
            byteset_add(&s, c);
    /* `i` folds the letters first, so ~41 with `i` refuses both 'A' and 'a',
     * as [^A] does in a caseless regex */
    if (caseless)
        set_fold_case(&s);
    if (negate)
        set_invert(&s);
    return parse_set_node(p, at, s, false);
}

static bool hex_number(struct parser *p, uint32_t *v)
{
    if (peek(p, 0) < '0' || peek(p, 0) > '9')
        return false;
    uint64_t n = 0;
    while (peek(p, 0) >= '0' && peek(p, 0) <= '9') {
        n = n * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (n > PARSE_MAX_REPEAT + 1ull)
            n = PARSE_MAX_REPEAT + 1ull;
    }
    *v = (uint32_t)n;
    return true;
}

/* A jump at p->i ('['): [n] n bytes, [n-m] n to m, [n-] n or more, [-] any
 * number, [-m] up to m, as YARA writes them. */
static struct node *hex_jump(struct parser *p)
{
    size_t at = p->i++;
    uint32_t mn = 0, mx = REPEAT_INF;
    hex_skip_space(p);
    bool has_min = hex_number(p, &mn), has_dash = false;
    hex_skip_space(p);
    if (peek(p, 0) == '-') {
        has_dash = true;
        p->i++;
        hex_skip_space(p);
        if (!hex_number(p, &mx))
            mx = REPEAT_INF;
        hex_skip_space(p);
    } else {
        mx = mn;
    }
    /* "[]", "[x]", "[-0]" and an unclosed jump are all malformed */
    if (peek(p, 0) != ']' || (!has_min && !has_dash) || (!has_min && mx == 0)) {
        parse_fail(p, at,
                   "bad jump: write [n] for n bytes, [n-m] for n to m, [n-] for n or more, [-] "
                   "for any number");
        return NULL;
    }
    p->i++;
    if (mn > PARSE_MAX_REPEAT || (mx != REPEAT_INF && mx > PARSE_MAX_REPEAT)) {
        parse_fail(p, at, "jump over the limit of %u bytes: use a smaller bound or [n-]",
                   PARSE_MAX_REPEAT);
        return NULL;
    }
    if (mx != REPEAT_INF && mn > mx) {
        parse_fail(p, at, "jump [%u-%u] has min > max: swap them", mn, mx);
        return NULL;
    }
    if (mx == 0) {
        parse_fail(p, at, "jump [0] skips nothing: remove it");
        return NULL;
    }
    struct byteset any = {{0}};
    set_invert(&any);
    struct node *kid = parse_set_node(p, at, any, false);
    struct node *r = kid ? parse_node(p, N_REPEAT, at) : NULL;
    if (r == NULL)
        return NULL;
    r->u.rep.kid = kid;
    r->u.rep.min = mn;
    r->u.rep.max = mx;
    return r;
}

static struct node *hex_alt(struct parser *p, bool caseless);

/* Items up to '|', ')' or the end. *first_jump and *last_jump get the
 * offset of a jump that starts or ends the sequence (SIZE_MAX: none), so
 * that the whole string can refuse to start or end with one. */
static struct node *hex_cat(struct parser *p, bool caseless, size_t *first_jump, size_t *last_jump)
{
    struct nodevec v = {0};
    size_t at = p->i, last = SIZE_MAX;
    for (;;) {
        hex_skip_space(p);
        int c = peek(p, 0);
        if (c < 0 || c == '|' || c == ')')
            break;
        struct node *n;
        if (c == '(') {
            size_t open = p->i++;
            n = hex_alt(p, caseless);
            if (n == NULL)
                return NULL;
            if (peek(p, 0) != ')') {
                parse_fail(p, open, "unterminated alternatives: add the closing ')'");
                return NULL;
            }
            p->i++;
        } else if (c == '[') {
            n = hex_jump(p);
        } else {
            n = hex_byte(p, caseless);
        }
        if (n == NULL || !parse_vec_push(p, &v, n))
            return NULL;
        last = c == '[' ? n->pos : SIZE_MAX;
        if (v.n == 1)
            *first_jump = last;
    }
    *last_jump = last;
    if (v.n == 0) {
        parse_fail(p, at == 0 && peek(p, 0) < 0 ? 0 : p->i,
                   peek(p, 0) < 0 && at == 0
                       ? "empty hex string: a rule must match at least one byte"
                       : "empty alternative in a hex string: give each of (a | b) some bytes");
        return NULL;
    }
    return parse_list_node(p, N_CAT, at, &v);
}

static struct node *hex_seq(struct parser *p, void *caseless)
{
    size_t first_jump, last_jump; /* jumps may start or end an alternative */
    return hex_cat(p, *(bool *)caseless, &first_jump, &last_jump);
}

static struct node *hex_alt(struct parser *p, bool caseless)
{
    return parse_alternation(p, hex_seq, &caseless, "alternatives");
}

/* A hex string: byte pairs, ?? and half-byte wildcards, ~ negations, jumps
 * and (a | b) alternatives, as YARA's hex strings. Like YARA, a jump may
 * not start or end the string (it would only move the match's start, or
 * report an end where no byte of the rule is). */
static struct node *parse_hex(struct parser *p, uint32_t flags)
{
    bool caseless = flags & RULE_F_CASELESS;
    size_t first_jump = SIZE_MAX, last_jump = SIZE_MAX;
    struct node *n = hex_cat(p, caseless, &first_jump, &last_jump);
    if (n == NULL)
        return NULL;
    if (peek(p, 0) == '|') {
        /* top-level alternatives without parentheses: YARA wants them */
        parse_fail(p, p->i, "alternatives in a hex string go in parentheses: write (4d | 5a)");
        return NULL;
    }
    if (peek(p, 0) == ')') {
        parse_fail(p, p->i, "unmatched ')' in a hex string: remove it");
        return NULL;
    }
    if (first_jump != SIZE_MAX) {
        parse_fail(p, first_jump,
                   "a hex string cannot start with a jump: remove it (as in YARA; it would only "
                   "move the match's start)");
        return NULL;
    }
    if (last_jump != SIZE_MAX) {
        parse_fail(p, last_jump,
                   "a hex string cannot end with a jump: remove it, or put bytes after it (as in "
                   "YARA)");
        return NULL;
    }
    return n;
}

int parse_rule(const struct rule_src *r, struct parse_result *out, uint32_t *pos, char *msg,
               size_t msgsz)
{
    out->root = NULL;
    out->arena = calloc(1, sizeof(*out->arena));
    if (out->arena == NULL) {
        snprintf(msg, msgsz, "out of memory while parsing");
        *pos = 0;
        return -ENOMEM;
    }
    out->arena->next_cap = r->len < 1000 ? 64 * (r->len + 8) : 65536;
    struct parser p = {
        .s = (const unsigned char *)r->pattern,
        .len = r->len,
        .arena = out->arena,
        .msg = msg,
        .msgsz = msgsz,
        .regex = r->kind == RULE_REGEX,
    };
    msg[0] = '\0';
    if (r->flags & ~RULE_F_ALL)
        parse_fail(&p, 0, "unknown flag bits 0x%x", r->flags & ~RULE_F_ALL);
    else if ((r->flags & RULE_F_SOMLEFT) && (r->flags & RULE_F_SINGLEMATCH))
        parse_fail(&p, 0,
                   "flags H (single match) and L (start of match) cannot be combined, as in "
                   "Hyperscan: drop one of them");
    else if (r->len == 0)
        parse_fail(&p, 0, "empty pattern: a rule must match at least one byte");
    else if (r->len > RULES_MAX_PATTERN)
        parse_fail(&p, 0,
                   "pattern is %zu bytes, over the limit of %u (Hyperscan's is lower): split an "
                   "alternation into rules that share one id",
                   r->len, RULES_MAX_PATTERN);
    else if (r->kind == RULE_LITERAL)
        out->root = parse_literal(&p, r->flags);
    else if (r->kind == RULE_HEX)
        out->root = parse_hex(&p, r->flags);
    else if (r->kind == RULE_REGEX)
        out->root = parse_regex(&p, r->flags);
    else
        parse_fail(&p, 0, "unknown rule kind %d: use literal, hex or regex", (int)r->kind);
    if (p.err) {
        *pos = p.err_pos;
        out->root = NULL;
        return p.err;
    }
    *pos = 0;
    return 0;
}
