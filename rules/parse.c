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

/* A bump allocator: the tree is freed in one go with the arena. */
struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

struct arena {
    struct arena_chunk *head;
};

static void *arena_alloc(struct arena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    struct arena_chunk *c = a->head;
    if (c == NULL || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
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
};

struct pflags {
    bool caseless, dotall, multiline;
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

/* \xHH or \x{H..}; p->i is just past the 'x'. Returns the byte or -1. */
static int parse_hex_escape(struct parser *p, size_t at)
{
    if (peek(p, 0) == '{') {
        size_t j = p->i + 1;
        unsigned v = 0;
        int nd = 0;
        while (j < p->len && hexval(p->s[j]) >= 0 && nd < 3) {
            v = v * 16 + (unsigned)hexval(p->s[j++]);
            nd++;
        }
        if (nd == 0 || j >= p->len || p->s[j] != '}' || v > 255) {
            fail(p, at, "bad \\x{...} escape: write one byte as \\x{00} to \\x{ff}");
            return -1;
        }
        p->i = j + 1;
        return (int)v;
    }
    int h = hexval(peek(p, 0)), l = hexval(peek(p, 1));
    if (h < 0) {
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
 * Escapes that stand for one byte, shared by regexes (in and out of classes)
 * and literals. `c` is the character after the backslash, already consumed.
 * Returns the byte, -1 on error (reported), or -2 if `c` is not one of them.
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
        if (x < 0x20 || x > 0x7e) {
            fail(p, at, "\\c must be followed by a printable character, e.g. \\cA");
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

static void unsupported_escape(struct parser *p, int c, size_t at)
{
    if (c >= '1' && c <= '9')
        fail(p, at, "backreference \\%c is not supported: vkscan matches regular languages only",
             c);
    else if (c == 'k' || c == 'g')
        fail(p, at, "backreference \\%c is not supported: vkscan matches regular languages only",
             c);
    else if (c == 'p' || c == 'P' || c == 'X')
        fail(p, at,
             "Unicode property \\%c is not supported: use a byte class such as [\\x80-\\xff]", c);
    else if (c == 'Q' || c == 'E')
        fail(p, at, "\\Q...\\E quoting is not supported: escape each metacharacter with \\");
    else if (c == 'G' || c == 'K')
        fail(p, at, "\\%c is not supported", c);
    else if (c == -1)
        fail(p, at, "pattern ends with a lone backslash: write \\\\ for a backslash");
    else
        fail(p, at, "unknown escape \\%c: escape only metacharacters, or use \\xHH", c);
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

/* [:name:] at p->i (which points at '['); returns true if one was parsed. */
static bool parse_posix(struct parser *p, struct byteset *into)
{
    if (peek(p, 0) != '[' || peek(p, 1) != ':')
        return false;
    size_t at = p->i, j = p->i + 2;
    bool neg = false;
    if (j < p->len && p->s[j] == '^') {
        neg = true;
        j++;
    }
    size_t name = j;
    while (j < p->len && p->s[j] >= 'a' && p->s[j] <= 'z')
        j++;
    if (j + 1 >= p->len || p->s[j] != ':' || p->s[j + 1] != ']')
        return false;
    for (size_t k = 0; k < sizeof(posix_classes) / sizeof(posix_classes[0]); k++) {
        const char *nm = posix_classes[k].name;
        if (strlen(nm) == j - name && memcmp(nm, p->s + name, j - name) == 0) {
            struct byteset s = {{0}};
            posix_classes[k].fill(&s);
            if (neg)
                set_invert(&s);
            set_union(into, &s);
            p->i = j + 2;
            return true;
        }
    }
    fail(p, at,
         "unknown POSIX class [:%.*s:]: use alpha, digit, alnum, upper, lower, space, "
         "blank, cntrl, graph, print, punct, xdigit, word or ascii",
         (int)(j - name), (const char *)p->s + name);
    return true;
}

/*
 * One class member at p->i: returns a single byte (>= 0), or -2 after adding
 * a multi-byte set (\d, [:alpha:]) to `into`, or -1 on error.
 */
static int class_atom(struct parser *p, struct byteset *into)
{
    size_t at = p->i;
    if (parse_posix(p, into))
        return p->err ? -1 : -2;
    int c = p->s[p->i++];
    if (c != '\\')
        return c;
    c = peek(p, 0);
    p->i++;
    if (c == 'd' || c == 'D' || c == 'w' || c == 'W' || c == 's' || c == 'S') {
        struct byteset s = class_of((char)c);
        set_union(into, &s);
        return -2;
    }
    if (c == 'b')
        return 8; /* backspace inside a class, as in PCRE */
    int v = simple_escape(p, c, at);
    if (v != -2)
        return v;
    if (c >= 0 && !is_alnum(c))
        return c;
    unsupported_escape(p, c, at);
    return -1;
}

static struct node *parse_class(struct parser *p, const struct pflags *fl)
{
    size_t at = p->i++; /* '[' */
    struct byteset s = {{0}};
    bool neg = false;
    if (peek(p, 0) == '^') {
        neg = true;
        p->i++;
    }
    bool first = true;
    for (;;) {
        if (p->i >= p->len) {
            fail(p, at, "unterminated character class: add the closing ']'");
            return NULL;
        }
        if (p->s[p->i] == ']' && !first)
            break;
        first = false;
        int lo = class_atom(p, &s);
        if (lo == -1)
            return NULL;
        if (lo >= 0 && peek(p, 0) == '-' && peek(p, 1) >= 0 && peek(p, 1) != ']') {
            p->i++;
            size_t hi_at = p->i;
            int hi = class_atom(p, &s);
            if (hi == -1)
                return NULL;
            if (hi == -2) { /* [a-\d]: the '-' is literal, as in PCRE */
                byteset_add(&s, (unsigned)lo);
                byteset_add(&s, '-');
                continue;
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
        case '-':
            if (!on) {
                fail(p, p->i - 1, "two '-' in an inline flag group");
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
            if (c == 'x' || c == 'U' || c == 'J' || c == 'n')
                fail(p, p->i - 1, "inline flag '%c' is not supported: only i, s and m are", c);
            else
                fail(p, p->i - 1,
                     "unknown group construct (?%c...): use (?:...), (?i), (?s), "
                     "(?m) or (?i:...)",
                     c);
            return 0;
        }
    }
}

static struct node *parse_group(struct parser *p, struct pflags *fl)
{
    size_t at = p->i++; /* '(' */
    struct pflags inner = *fl;
    if (peek(p, 0) == '?') {
        p->i++;
        int c = peek(p, 0);
        if (c == ':') {
            p->i++;
        } else if (c == '=' || c == '!') {
            fail(p, at,
                 "lookahead (?%c...) is not supported: vkscan reports end offsets of "
                 "regular patterns only",
                 c);
            return NULL;
        } else if (c == '<' && (peek(p, 1) == '=' || peek(p, 1) == '!')) {
            fail(p, at, "lookbehind (?<%c...) is not supported", peek(p, 1));
            return NULL;
        } else if (c == '<' || (c == 'P' && peek(p, 1) == '<')) {
            /* named group: plain grouping for us */
            size_t j = p->i + (c == 'P' ? 2 : 1);
            while (j < p->len && (is_alnum(p->s[j]) || p->s[j] == '_'))
                j++;
            if (j >= p->len || p->s[j] != '>') {
                fail(p, at, "bad named group: write (?<name>...)");
                return NULL;
            }
            p->i = j + 1;
        } else if (c == '#') {
            fail(p, at, "comments (?#...) are not supported");
            return NULL;
        } else if (c == '>' || c == '|' || c == '(' || c == 'R' || c == '&') {
            fail(p, at, "group construct (?%c...) is not supported", c);
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
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        return set_node(p, at, class_of((char)c), false);
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
    default:
        break;
    }
    int v = simple_escape(p, c, at);
    if (v == -1)
        return NULL;
    if (v >= 0)
        return byte_node(p, at, (unsigned)v, fl->caseless);
    if (c >= 0 && !is_alnum(c))
        return byte_node(p, at, (unsigned)c, fl->caseless);
    unsupported_escape(p, c, at);
    return NULL;
}

/* An atom, or NULL with no error for an inline flag group "(?i)". */
static struct node *parse_atom(struct parser *p, struct pflags *fl)
{
    size_t at = p->i;
    int c = p->s[p->i];
    uint32_t mn, mx;
    size_t end;
    switch (c) {
    case '(':
        return parse_group(p, fl);
    case '[':
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

static struct node *parse_quantified(struct parser *p, struct node *atom)
{
    for (int nq = 0;; nq++) {
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
        if (mx != REPEAT_INF && mn > mx) {
            fail(p, at, "repeat {%u,%u} has min > max: swap them", mn, mx);
            return NULL;
        }
        if ((mx != REPEAT_INF && mx > RULES_MAX_REPEAT) || mn > RULES_MAX_REPEAT) {
            fail(p, at, "repeat count over the limit of %u: use a smaller bound or {m,}",
                 RULES_MAX_REPEAT);
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
    while (p->i < p->len && p->s[p->i] != '|' && p->s[p->i] != ')') {
        struct node *a = parse_atom(p, fl);
        if (p->err)
            return NULL;
        if (a == NULL)
            continue; /* (?i) */
        a = parse_quantified(p, a);
        if (a == NULL || !vec_push(p, &v, a))
            return NULL;
    }
    if (v.n == 0)
        return empty_cat(p, at);
    return list_node(p, N_CAT, at, &v);
}

static struct node *parse_alt(struct parser *p, struct pflags fl)
{
    if (++p->depth > MAX_DEPTH) {
        fail(p, p->i, "groups nested deeper than %d: flatten the pattern", MAX_DEPTH);
        return NULL;
    }
    struct nodevec v = {0};
    size_t at = p->i;
    for (;;) {
        struct node *c = parse_cat(p, &fl);
        if (c == NULL || !vec_push(p, &v, c))
            return NULL;
        if (peek(p, 0) != '|')
            break;
        p->i++;
    }
    p->depth--;
    return list_node(p, N_ALT, at, &v);
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

static struct node *parse_hex(struct parser *p, uint32_t flags)
{
    struct nodevec v = {0};
    while (p->i < p->len) {
        int c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->i++;
            continue;
        }
        size_t at = p->i;
        struct node *n;
        if (c == '?' && peek(p, 1) == '?') {
            struct byteset s = {{0}};
            set_invert(&s);
            n = set_node(p, at, s, false);
        } else if (hexval(c) >= 0 && hexval(peek(p, 1)) >= 0) {
            n = byte_node(p, at, (unsigned)(hexval(c) * 16 + hexval(peek(p, 1))),
                          flags & RULE_F_CASELESS);
        } else {
            fail(p, at,
                 "bad hex string: write bytes as pairs of hex digits (4d 5a) and any "
                 "byte as ??");
            return NULL;
        }
        p->i += 2;
        if (n == NULL || !vec_push(p, &v, n))
            return NULL;
    }
    if (v.n == 0) {
        fail(p, 0, "empty hex string: a rule must match at least one byte");
        return NULL;
    }
    return list_node(p, N_CAT, 0, &v);
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
    struct parser p = {
        .s = (const unsigned char *)r->pattern,
        .len = r->len,
        .arena = out->arena,
        .msg = msg,
        .msgsz = msgsz,
    };
    msg[0] = '\0';
    if (r->flags & ~RULE_F_ALL)
        fail(&p, 0, "unknown flag bits 0x%x", r->flags & ~RULE_F_ALL);
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
