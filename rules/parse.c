/*
 * Recursive-descent parser for vkscan's pattern languages. See parse.h for
 * the tree it builds and docs/rules.md for the language.
 */
#include "parse.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 200

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

/* Parser state for one pattern. `fl` holds the flags in force. */
struct parser {
    const unsigned char *s;
    size_t len, i;
    struct arena *arena;
    int depth;
    int err; /* 0, -EINVAL or -ENOMEM */
    uint32_t err_pos;
    char *msg;
    size_t msgsz;
    bool regex;          /* regex rules: PCRE escapes; literals: C escapes */
    bool quote;          /* inside \Q...\E: every byte is literal */
    bool class_caseless; /* inside a class under (?i): [:^lower:] folds before negating */
    uint32_t ngroups;    /* capturing groups opened so far (for \N: backref or octal) */
    uint32_t *names;     /* group names seen: (offset, length) pairs */
    uint32_t nnames, capnames;
};

struct pflags {
    bool caseless, dotall, multiline, extended;
};

static VKS_PRINTF(3, 4) void fail(struct parser *p, size_t pos, const char *fmt, ...)
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

static struct node *new_node(struct parser *p, enum node_type t, size_t pos)
{
    struct node *n = arena_alloc(p->arena, sizeof(*n));
    if (n == NULL) {
        if (p->err == 0) {
            p->err = -ENOMEM;
            snprintf(p->msg, p->msgsz, "out of memory while parsing");
        }
        return NULL;
    }
    n->type = t;
    n->pos = (uint32_t)pos;
    return n;
}

/* ---- byte sets ---- */

static void set_range(struct byteset *s, unsigned lo, unsigned hi)
{
    for (unsigned c = lo; c <= hi; c++)
        byteset_add(s, c);
}

static void set_fold_case(struct byteset *s)
{
    for (unsigned c = 'a'; c <= 'z'; c++) {
        if (byteset_has(s, c) || byteset_has(s, c - 32)) {
            byteset_add(s, c);
            byteset_add(s, c - 32);
        }
    }
}

static void set_invert(struct byteset *s)
{
    for (int k = 0; k < 4; k++)
        s->w[k] = ~s->w[k];
}

static void set_union(struct byteset *d, const struct byteset *s)
{
    for (int k = 0; k < 4; k++)
        d->w[k] |= s->w[k];
}

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

static struct node *set_node(struct parser *p, size_t pos, struct byteset s, bool caseless)
{
    struct node *n = new_node(p, N_SET, pos);
    if (n == NULL)
        return NULL;
    if (caseless)
        set_fold_case(&s);
    n->u.set = s;
    return n;
}

static struct node *byte_node(struct parser *p, size_t pos, unsigned c, bool caseless)
{
    struct byteset s = {{0}};
    byteset_add(&s, c);
    return set_node(p, pos, s, caseless);
}

/* ---- lists ---- */

struct nodevec {
    struct node **v;
    uint32_t n, cap;
};

static bool vec_push(struct parser *p, struct nodevec *v, struct node *n)
{
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 8;
        struct node **nv = arena_alloc(p->arena, cap * sizeof(*nv));
        if (nv == NULL) {
            if (p->err == 0) {
                p->err = -ENOMEM;
                snprintf(p->msg, p->msgsz, "out of memory while parsing");
            }
            return false;
        }
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof(*nv));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = n;
    return true;
}

static struct node *list_node(struct parser *p, enum node_type t, size_t pos, struct nodevec *v)
{
    if (v->n == 1)
        return v->v[0];
    struct node *n = new_node(p, t, pos);
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

static int peek(const struct parser *p, size_t off)
{
    return p->i + off < p->len ? p->s[p->i + off] : -1;
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
            fail(p, at, "bad \\x{...} escape: write one byte as \\x{00} to \\x{ff}");
            return -1;
        }
        if (v > 255) {
            fail(p, at,
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
        fail(p, at, "bad \\x escape: write a byte as two hex digits, e.g. \\x41");
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
        fail(p, at,
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
        fail(p, at, "bad \\o{...} escape: write one byte in octal as \\o{0} to \\o{377}");
        return -1;
    }
    if (v > 0377) {
        fail(p, at,
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
            fail(p, at,
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
            fail(p, at, "\\c must be followed by an ASCII character, e.g. \\cA for the byte 0x01");
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

static bool is_alnum(int c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
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
            fail(p, at,
                 "subroutine call \\g%c...%c is not supported: vkscan matches regular "
                 "languages only; write the group's pattern out again",
                 n, n == '<' ? '>' : '\'');
        else
            fail(p, at,
                 "backreference \\%c is not supported: vkscan matches regular languages "
                 "only; repeat the group's pattern instead",
                 c);
    } else if (c == 'p' || c == 'P' || c == 'X')
        fail(p, at,
             "Unicode property \\%c is not supported: use a byte class such as [\\x80-\\xff]", c);
    else if (c == 'R')
        fail(p, at, "\\R (any line break) is not supported: use (?:\\r\\n|\\v)");
    else if (c == 'N')
        fail(p, at, "\\N (any byte but newline) is not supported: use [^\\n]");
    else if (c == 'G' || c == 'K')
        fail(p, at, "\\%c is not supported: remove it", c);
    else if (c == 'u')
        fail(p, at, "\\u is not supported: write a byte as \\xHH");
    else if (c == 'U' || c == 'l' || c == 'L')
        fail(p, at, "case-changing escape \\%c is not supported: write the letters as wanted", c);
    else if (c == -1)
        fail(p, at, "pattern ends with a lone backslash: write \\\\ for a backslash");
    else if (in_class &&
             (c == 'b' || c == 'B' || c == 'A' || c == 'z' || c == 'Z' || c == 'C' || is_alnum(c)))
        fail(p, at,
             "escape \\%c is not allowed in a character class: inside [...] use only byte "
             "escapes, \\d \\w \\s \\h \\v and their negations",
             c);
    else
        fail(p, at, "unknown escape \\%c: escape only metacharacters, or use \\xHH", c);
}

/*
 * A regex escape that stands for a byte or a byte set, in or out of a class.
 * `c` is the character after the backslash, already consumed. Returns the
 * byte (>= 0), -2 after adding a set to *into, or -1 on error (reported).
 * The caller handles assertions, \C, \Q and \E first.
 */
static int regex_escape(struct parser *p, int c, size_t at, bool in_class, struct byteset *into)
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
        fail(p, at, "POSIX collating element %.*s is not supported: list the bytes in the class",
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
    fail(p, at,
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
    return regex_escape(p, c, at, true, into);
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
            fail(p, at, "unterminated character class: add the closing ']'");
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
                fail(p, at, "unterminated character class: add the closing ']'");
                return NULL;
            }
            if (hi == -2) {
                fail(p, hi_at,
                     "range in character class ends in a class escape or POSIX class: "
                     "write '-' last for a literal '-', e.g. [a\\d-]");
                return NULL;
            }
            if (hi < lo) {
                fail(p, hi_at,
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
    return set_node(p, at, s, false);
}

/* ---- regex grammar ---- */

static struct node *parse_alt(struct parser *p, struct pflags fl);

static bool is_quant_brace(const struct parser *p, uint32_t *min, uint32_t *max, size_t *end);

static struct node *assert_node(struct parser *p, size_t pos, enum assert_kind k)
{
    struct node *n = new_node(p, N_ASSERT, pos);
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
                fail(p, p->i - 1,
                     "two '-' in an inline flag group: list the flags to turn off after one "
                     "'-', e.g. (?i-sm)");
                return 0;
            }
            if (peek(p, 0) == ')' || peek(p, 0) == ':') {
                fail(p, p->i - 1,
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
            fail(p, at, "unterminated group: add the closing ')'");
            return 0;
        default:
            if (c == 'U' || c == 'J' || c == 'n' || c == 'X')
                fail(p, p->i - 1,
                     "inline flag '%c' is not supported: only i, s, m and x are; remove it", c);
            else
                fail(p, p->i - 1,
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
        fail(p, at,
             "bad group name: write (?<name>...), (?'name'...) or (?P<name>...) with "
             "a name of letters, digits and '_' that does not start with a digit");
        return false;
    }
    for (uint32_t k = 0; k < p->nnames; k++) {
        if (p->names[2 * k + 1] == end - j &&
            memcmp(p->s + p->names[2 * k], p->s + j, end - j) == 0) {
            fail(p, at, "two named groups use the name '%.*s': rename one", (int)(end - j),
                 (const char *)p->s + j);
            return false;
        }
    }
    if (p->nnames == p->capnames) {
        uint32_t cap = p->capnames ? p->capnames * 2 : 8;
        uint32_t *nv = arena_alloc(p->arena, 2 * cap * sizeof(*nv));
        if (nv == NULL) {
            if (p->err == 0) {
                p->err = -ENOMEM;
                snprintf(p->msg, p->msgsz, "out of memory while parsing");
            }
            return false;
        }
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
            fail(p, at,
                 "lookahead (?%c...) is not supported: vkscan reports end offsets of "
                 "regular patterns only; match the text itself instead",
                 c);
            return NULL;
        } else if (c == '<' && (c1 == '=' || c1 == '!')) {
            fail(p, at,
                 "lookbehind (?<%c...) is not supported: vkscan reports end offsets of "
                 "regular patterns only; match the text itself instead",
                 c1);
            return NULL;
        } else if (c == 'P' && c1 == '=') {
            fail(p, at,
                 "named backreference (?P=name) is not supported: vkscan matches regular "
                 "languages only; repeat the group's pattern instead");
            return NULL;
        } else if (c == 'P' && c1 == '>') {
            fail(p, at,
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
                fail(p, at, "unterminated comment (?#...: add the closing ')'");
                return NULL;
            }
            p->i++;
            return NULL; /* a comment: no node and no error */
        } else if (c == '>') {
            fail(p, at, "atomic group (?>...) is not supported: use (?:...)");
            return NULL;
        } else if (c == '|') {
            fail(p, at, "branch reset group (?|...) is not supported: use (?:...)");
            return NULL;
        } else if (c == '(') {
            fail(p, at,
                 "conditional group (?(...)...) is not supported: vkscan matches regular "
                 "languages only; use an alternation (...|...)");
            return NULL;
        } else if (c == 'R' || c == '&' || (c >= '0' && c <= '9') ||
                   ((c == '+' || c == '-') && c1 >= '0' && c1 <= '9')) {
            fail(p, at,
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
        fail(p, at, "unterminated group: add the closing ')'");
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
        return set_node(p, at, s, false);
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
    int v = regex_escape(p, c, at, false, &s);
    if (v == -1)
        return NULL;
    if (v == -2)
        return set_node(p, at, s, false);
    return byte_node(p, at, (unsigned)v, fl->caseless);
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
        fail(p, p->i,
             "POSIX class or collating element outside a bracket expression: write "
             "[[:name:]] for a class, or escape the '[' as \\[");
    else if (p->s[p->i + 1] == ':')
        fail(p, p->i,
             "POSIX class [:%.*s:] is only valid inside a bracket expression: write "
             "[[:%.*s:]]",
             (int)(end - p->i - 2), (const char *)p->s + p->i + 2, (int)(end - p->i - 2),
             (const char *)p->s + p->i + 2);
    else
        fail(p, p->i,
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
        return byte_node(p, at, (unsigned)c, fl->caseless);
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
        return set_node(p, at, s, false);
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
        fail(p, at, "quantifier '%c' has nothing to repeat: escape it as \\%c", c, c);
        return NULL;
    case '{':
        if (is_quant_brace(p, &mn, &mx, &end)) {
            fail(p, at, "quantifier '{' has nothing to repeat: escape it as \\{");
            return NULL;
        }
        p->i++;
        return byte_node(p, at, '{', fl->caseless);
    default:
        p->i++;
        return byte_node(p, at, (unsigned)c, fl->caseless);
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
            fail(p, at,
                 "a quantifier follows another quantifier: wrap the repeated part in "
                 "(?:...) first");
            return NULL;
        }
        if (bare_assert) {
            fail(p, at,
                 "quantifier after an assertion (^, $, \\b, \\B, \\A, \\Z or \\z): an "
                 "assertion cannot be repeated; remove the quantifier");
            return NULL;
        }
        if (mx != REPEAT_INF && mn > mx) {
            fail(p, at, "repeat {%u,%u} has min > max: swap them", mn, mx);
            return NULL;
        }
        if ((mx != REPEAT_INF && mx > PARSE_MAX_REPEAT) || mn > PARSE_MAX_REPEAT) {
            fail(p, at, "repeat count over the limit of %u: use a smaller bound or {m,}",
                 PARSE_MAX_REPEAT);
            return NULL;
        }
        if (mx == 0) {
            fail(p, at, "repeat {0} matches nothing: remove it");
            return NULL;
        }
        p->i = end;
        if (peek(p, 0) == '?') {
            p->i++; /* lazy: same end offsets as greedy */
        } else if (peek(p, 0) == '+') {
            fail(p, p->i, "possessive quantifiers are not supported: drop the '+'");
            return NULL;
        }
        struct node *r = new_node(p, N_REPEAT, at);
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
    struct node *n = new_node(p, N_CAT, pos);
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
        if (a == NULL || !vec_push(p, &v, a))
            return NULL;
    }
    if (v.n == 0)
        return empty_cat(p, at);
    return list_node(p, N_CAT, at, &v);
}

/* Sequences read by `seq` and separated by '|', up to a ')' or the end:
 * an alternation, or the one sequence. Each level counts against
 * MAX_DEPTH (`what` names the levels in the message). */
static struct node *alternation(struct parser *p, struct node *(*seq)(struct parser *, void *),
                                void *ctx, const char *what)
{
    if (++p->depth > MAX_DEPTH) {
        fail(p, p->i, "%s nested deeper than %d: flatten the pattern", what, MAX_DEPTH);
        return NULL;
    }
    struct nodevec v = {0};
    size_t at = p->i;
    for (;;) {
        struct node *c = seq(p, ctx);
        if (c == NULL || !vec_push(p, &v, c))
            return NULL;
        if (peek(p, 0) != '|')
            break;
        p->i++;
    }
    p->depth--;
    return list_node(p, N_ALT, at, &v);
}

static struct node *regex_seq(struct parser *p, void *fl)
{
    return parse_cat(p, fl);
}

/* Inline flags set in one alternative hold for the ones after it, up to
 * the group's end: the alternatives share `fl`, a copy of the group's. */
static struct node *parse_alt(struct parser *p, struct pflags fl)
{
    return alternation(p, regex_seq, &fl, "groups");
}

static struct node *parse_regex(struct parser *p, uint32_t flags)
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
        fail(p, p->i, "unmatched ')': remove it or escape it as \\)");
        return NULL;
    }
    return n;
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
                    fail(p, at,
                         e < 0 ? "literal ends with a lone backslash: write \\\\"
                               : "unknown escape in literal: use \\xHH, \\n, \\t, \\r, "
                                 "\\0, \\\\ or \\\"");
                    return NULL;
                }
            }
            c = b;
        }
        struct node *n = byte_node(p, at, (unsigned)c, caseless);
        if (n == NULL || !vec_push(p, &v, n))
            return NULL;
    }
    if (v.n == 0) {
        fail(p, 0, "empty literal: a rule must match at least one byte");
        return NULL;
    }
    return list_node(p, N_CAT, 0, &v);
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
        fail(p, negate ? at + 1 : at,
             "bad hex string: write bytes as pairs of hex digits (4d 5a), any byte as ??, "
             "a half byte as 4? or ?d, a jump as [n-m] and alternatives as (4d | 5a)");
        return NULL;
    }
    if (negate && hi_any && lo_any) {
        fail(p, at, "~?? matches no byte: write ?? for any byte");
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
    return set_node(p, at, s, false);
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
    bool has_min = hex_number(p, &mn);
    hex_skip_space(p);
    if (peek(p, 0) == '-') {
        p->i++;
        hex_skip_space(p);
        if (!hex_number(p, &mx))
            mx = REPEAT_INF;
        hex_skip_space(p);
    } else if (has_min) {
        mx = mn;
    } else {
        mx = 0; /* "[]": reported below as a bad jump */
        has_min = false;
    }
    if (peek(p, 0) != ']' || (!has_min && mx == 0)) {
        fail(p, at,
             "bad jump: write [n] for n bytes, [n-m] for n to m, [n-] for n or more, [-] "
             "for any number");
        return NULL;
    }
    p->i++;
    if (mn > PARSE_MAX_REPEAT || (mx != REPEAT_INF && mx > PARSE_MAX_REPEAT)) {
        fail(p, at, "jump over the limit of %u bytes: use a smaller bound or [n-]",
             PARSE_MAX_REPEAT);
        return NULL;
    }
    if (mx != REPEAT_INF && mn > mx) {
        fail(p, at, "jump [%u-%u] has min > max: swap them", mn, mx);
        return NULL;
    }
    if (mx == 0) {
        fail(p, at, "jump [0] skips nothing: remove it");
        return NULL;
    }
    struct byteset any = {{0}};
    set_invert(&any);
    struct node *kid = set_node(p, at, any, false);
    struct node *r = kid ? new_node(p, N_REPEAT, at) : NULL;
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
                fail(p, open, "unterminated alternatives: add the closing ')'");
                return NULL;
            }
            p->i++;
        } else if (c == '[') {
            n = hex_jump(p);
        } else {
            n = hex_byte(p, caseless);
        }
        if (n == NULL || !vec_push(p, &v, n))
            return NULL;
        last = c == '[' ? n->pos : SIZE_MAX;
        if (v.n == 1)
            *first_jump = last;
    }
    *last_jump = last;
    if (v.n == 0) {
        fail(p, at == 0 && peek(p, 0) < 0 ? 0 : p->i,
             peek(p, 0) < 0 && at == 0
                 ? "empty hex string: a rule must match at least one byte"
                 : "empty alternative in a hex string: give each of (a | b) some bytes");
        return NULL;
    }
    return list_node(p, N_CAT, at, &v);
}

static struct node *hex_seq(struct parser *p, void *caseless)
{
    size_t first_jump, last_jump; /* jumps may start or end an alternative */
    return hex_cat(p, *(bool *)caseless, &first_jump, &last_jump);
}

static struct node *hex_alt(struct parser *p, bool caseless)
{
    return alternation(p, hex_seq, &caseless, "alternatives");
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
        fail(p, p->i, "alternatives in a hex string go in parentheses: write (4d | 5a)");
        return NULL;
    }
    if (peek(p, 0) == ')') {
        fail(p, p->i, "unmatched ')' in a hex string: remove it");
        return NULL;
    }
    if (first_jump != SIZE_MAX) {
        fail(p, first_jump,
             "a hex string cannot start with a jump: remove it (as in YARA; it would only "
             "move the match's start)");
        return NULL;
    }
    if (last_jump != SIZE_MAX) {
        fail(p, last_jump,
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
        fail(&p, 0, "unknown flag bits 0x%x", r->flags & ~RULE_F_ALL);
    else if ((r->flags & RULE_F_SOMLEFT) && (r->flags & RULE_F_SINGLEMATCH))
        fail(&p, 0,
             "flags H (single match) and L (start of match) cannot be combined, as in "
             "Hyperscan: drop one of them");
    else if (r->len == 0)
        fail(&p, 0, "empty pattern: a rule must match at least one byte");
    else if (r->len > RULES_MAX_PATTERN)
        fail(&p, 0, "pattern is %zu bytes, over the limit of %u", r->len, RULES_MAX_PATTERN);
    else if (r->kind == RULE_LITERAL)
        out->root = parse_literal(&p, r->flags);
    else if (r->kind == RULE_HEX)
        out->root = parse_hex(&p, r->flags);
    else if (r->kind == RULE_REGEX)
        out->root = parse_regex(&p, r->flags);
    else
        fail(&p, 0, "unknown rule kind %d: use literal, hex or regex", (int)r->kind);
    if (p.err) {
        *pos = p.err_pos;
        out->root = NULL;
        return p.err;
    }
    *pos = 0;
    return 0;
}
