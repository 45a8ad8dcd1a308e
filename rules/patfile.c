/*
 * Pattern-file reader; see patfile.h for the format.
 */
#include "patfile.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int grow(void **v, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 64;
    void *p = realloc(*v, c * elem);
    if (p == NULL)
        return -ENOMEM;
    *v = p;
    *cap = c;
    return 0;
}

struct reader {
    struct patfile *pf;
    size_t rules_cap, rejects_cap;
    char *store; /* next free byte of pf->storage */
};

static int reject_line(struct reader *rd, uint32_t line, uint32_t pos, const char *id, size_t idlen,
                       const char *msg)
{
    struct patfile *pf = rd->pf;
    if (grow((void **)&pf->rejects, &rd->rejects_cap, pf->n_rejects, sizeof(*pf->rejects)) != 0)
        return -ENOMEM;
    struct rule_reject *r = &pf->rejects[pf->n_rejects++];
    memset(r, 0, sizeof(*r));
    r->index = UINT32_MAX;
    r->line = line;
    r->pos = pos;
    if (idlen > RULES_MAX_ID)
        idlen = RULES_MAX_ID;
    memcpy(r->id, id, idlen);
    snprintf(r->msg, sizeof(r->msg), "%s", msg);
    return 0;
}

/* Finds the pattern and flags of "ID:..." after the colon. Returns NULL on
 * success or the error message, with *pos at the problem. */
static const char *split_body(const char *b, size_t n, enum rule_kind *kind, size_t *pstart,
                              size_t *plen, size_t *fstart, size_t *pos)
{
    char open = n ? b[0] : 0, close;
    switch (open) {
    case '/':
        *kind = RULE_REGEX;
        close = '/';
        break;
    case '"':
        *kind = RULE_LITERAL;
        close = '"';
        break;
    case '{':
        *kind = RULE_HEX;
        close = '}';
        break;
    default:
        *pos = 0;
        return "expected /regex/flags, \"literal\"flags or {hex bytes} after the id";
    }
    /* the pattern ends at the last closing delimiter: flags are letters only */
    size_t end = n;
    while (end > 1 && b[end - 1] != close)
        end--;
    if (end <= 1) {
        *pos = n;
        return open == '/'   ? "missing closing '/': write ID:/regex/flags"
               : open == '"' ? "missing closing '\"': write ID:\"literal\"flags"
                             : "missing closing '}': write ID:{4d 5a ?? 00}";
    }
    *pstart = 1;
    *plen = end - 2;
    *fstart = end;
    return NULL;
}

static int parse_line(struct reader *rd, const char *line, size_t n, uint32_t lineno)
{
    struct patfile *pf = rd->pf;
    const char *colon = memchr(line, ':', n);
    if (colon == NULL || colon == line)
        return reject_line(rd, lineno, 0, "", 0,
                           "expected ID:/regex/flags (an id, a colon, then the pattern)");
    size_t idlen = (size_t)(colon - line);
    const char *body = colon + 1;
    size_t blen = n - idlen - 1, ps, pl, fs, pos;
    enum rule_kind kind;
    const char *msg = split_body(body, blen, &kind, &ps, &pl, &fs, &pos);
    if (msg != NULL)
        return reject_line(rd, lineno, (uint32_t)(idlen + 1 + pos), line, idlen, msg);
    uint32_t flags = 0;
    struct vks_error e;
    if (rules_parse_flags(body + fs, blen - fs, &flags, &e) != 0)
        return reject_line(rd, lineno, (uint32_t)(idlen + 1 + fs), line, idlen, e.msg);
    if (grow((void **)&pf->rules, &rd->rules_cap, pf->n, sizeof(*pf->rules)) != 0)
        return -ENOMEM;
    char *id = rd->store;
    memcpy(id, line, idlen);
    id[idlen] = '\0';
    char *pat = id + idlen + 1;
    memcpy(pat, body + ps, pl);
    pat[pl] = '\0';
    rd->store = pat + pl + 1;
    pf->rules[pf->n++] = (struct rule_src){
        .id = id, .kind = kind, .pattern = pat, .len = pl, .flags = flags, .line = lineno};
    return 0;
}

int patfile_parse(const char *text, size_t len, struct patfile *out, struct vks_error *err)
{
    memset(out, 0, sizeof(*out));
    /* ids and patterns are copied NUL-terminated: never more than the text
     * plus two bytes a line */
    out->storage = malloc(len * 2 + 2);
    if (out->storage == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory reading a %zu-byte pattern file", len);
    struct reader rd = {.pf = out, .store = out->storage};
    uint32_t lineno = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t n = nl ? (size_t)(nl - (text + i)) : len - i;
        const char *line = text + i;
        i += n + (nl != NULL);
        lineno++;
        if (n > 0 && line[n - 1] == '\r')
            n--;
        size_t lead = 0;
        while (lead < n && (line[lead] == ' ' || line[lead] == '\t'))
            lead++;
        if (lead == n || line[lead] == '#')
            continue;
        if (parse_line(&rd, line + lead, n - lead, lineno) != 0)
            return vks_error_set(err, -ENOMEM, "out of memory reading a pattern file");
    }
    return 0;
}

void patfile_finish(struct patfile *pf)
{
    if (pf == NULL)
        return;
    free(pf->rules);
    free(pf->rejects);
    free(pf->storage);
    memset(pf, 0, sizeof(*pf));
}
