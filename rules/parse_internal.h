/*
 * What the parser's two files share (parse.c: the tree's memory, byte sets,
 * escapes, literals, hex strings and the entry point; parse_regex.c: regex
 * classes and grammar). Not installed, not for other modules: they use
 * parse.h.
 */
#ifndef VKS_RULES_PARSE_INTERNAL_H
#define VKS_RULES_PARSE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "parse.h"

/* Groups (regex) and alternatives (hex strings) nest at most this deep. */
#define MAX_DEPTH 200

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

struct nodevec {
    struct node **v;
    uint32_t n, cap;
};

/* Zeroed memory from the tree's arena (freed with it), or NULL with
 * -ENOMEM recorded as the parse's error. */
void *parse_alloc(struct parser *p, size_t n);

/* Records the first error: its offset and message (the later ones are
 * dropped, so the first cause is what the user reads). */
VKS_PRINTF(3, 4) void parse_fail(struct parser *p, size_t pos, const char *fmt, ...);

/* Nodes in the arena; NULL (and -ENOMEM recorded) when it is out of memory. */
struct node *parse_node(struct parser *p, enum node_type t, size_t pos);
struct node *parse_set_node(struct parser *p, size_t pos, struct byteset s, bool caseless);
struct node *parse_byte_node(struct parser *p, size_t pos, unsigned c, bool caseless);
bool parse_vec_push(struct parser *p, struct nodevec *v, struct node *n);
/* A node of type t over the vector's nodes, or its one node alone. */
struct node *parse_list_node(struct parser *p, enum node_type t, size_t pos, struct nodevec *v);

/* A regex escape that stands for a byte or a byte set, in or out of a
 * class (`c` the character after the backslash): the byte, -2 after adding
 * a set to *into, or -1 on an error (recorded). */
int parse_regex_escape(struct parser *p, int c, size_t at, bool in_class, struct byteset *into);

/* Sequences read by `seq` and separated by '|', up to a ')' or the end:
 * an alternation, or the one sequence. Each level counts against
 * MAX_DEPTH (`what` names the levels in the message). */
struct node *parse_alternation(struct parser *p, struct node *(*seq)(struct parser *, void *),
                               void *ctx, const char *what);

/* A regex rule with its flags (parse_regex.c). */
struct node *parse_regex(struct parser *p, uint32_t flags);

static inline void set_range(struct byteset *s, unsigned lo, unsigned hi)
{
    for (unsigned c = lo; c <= hi; c++)
        byteset_add(s, c);
}

static inline void set_fold_case(struct byteset *s)
{
    for (unsigned c = 'a'; c <= 'z'; c++) {
        if (byteset_has(s, c) || byteset_has(s, c - 32)) {
            byteset_add(s, c);
            byteset_add(s, c - 32);
        }
    }
}

static inline void set_invert(struct byteset *s)
{
    for (int k = 0; k < 4; k++)
        s->w[k] = ~s->w[k];
}

static inline void set_union(struct byteset *d, const struct byteset *s)
{
    for (int k = 0; k < 4; k++)
        d->w[k] |= s->w[k];
}

static inline int peek(const struct parser *p, size_t off)
{
    return p->i + off < p->len ? p->s[p->i + off] : -1;
}

static inline bool is_alnum(int c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

#endif
