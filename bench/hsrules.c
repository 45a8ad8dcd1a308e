/* Rules for Hyperscan (hsrules.h). */
#include "hsrules.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *alloc_or_die(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory building the Hyperscan database\n");
        exit(1);
    }
    return p;
}

unsigned hsrules_flags(uint32_t f)
{
    unsigned h = 0;
    if (f & RULE_F_CASELESS)
        h |= HS_FLAG_CASELESS;
    if (f & RULE_F_DOTALL)
        h |= HS_FLAG_DOTALL;
    if (f & RULE_F_MULTILINE)
        h |= HS_FLAG_MULTILINE;
    if (f & RULE_F_SINGLEMATCH)
        h |= HS_FLAG_SINGLEMATCH;
    return h;
}

char *hsrules_expr(const struct rule_src *r)
{
    if (r->kind == RULE_REGEX) {
        char *e = alloc_or_die(r->len + 1);
        memcpy(e, r->pattern, r->len);
        e[r->len] = '\0';
        return e;
    }
    char *e = alloc_or_die(r->len * 4 + 1);
    e[0] = '\0';
    for (size_t i = 0; i < r->len; i++)
        snprintf(e + i * 4, 5, "\\x%02x", (unsigned char)r->pattern[i]);
    return e;
}

hs_database_t *hsrules_build(const struct rule_src *v, size_t n, bool *keep, unsigned mode,
                             unsigned *accepted)
{
    char **expr = alloc_or_die(n * sizeof(*expr));
    const char **live = alloc_or_die(n * sizeof(*live));
    unsigned *flags = alloc_or_die(n * sizeof(*flags)), *ids = alloc_or_die(n * sizeof(*ids));
    for (size_t i = 0; i < n; i++)
        expr[i] = hsrules_expr(&v[i]);
    hs_database_t *db = NULL;
    unsigned m;
    for (;;) {
        m = 0;
        for (size_t i = 0; i < n; i++) {
            if (!keep[i])
                continue;
            live[m] = expr[i];
            flags[m] = hsrules_flags(v[i].flags);
            ids[m++] = (unsigned)i;
        }
        hs_compile_error_t *ce = NULL;
        if (m == 0 || hs_compile_multi(live, flags, ids, m, mode, NULL, &db, &ce) == HS_SUCCESS)
            break;
        if (ce->expression < 0) {
            fprintf(stderr, "hs_compile_multi: %s\n", ce->message);
            exit(1);
        }
        keep[ids[ce->expression]] = false;
        hs_free_compile_error(ce);
    }
    for (size_t i = 0; i < n; i++)
        free(expr[i]);
    free(expr);
    free(live);
    free(flags);
    free(ids);
    if (accepted != NULL)
        *accepted = m;
    return db;
}
