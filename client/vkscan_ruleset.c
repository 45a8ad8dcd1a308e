/*
 * One pattern-file text from every -r file and -e pattern (vkscan_ruleset.h).
 */
#include "vkscan_ruleset.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "patfile.h"
#include "vkscan_cli.h"

/* Appends `len` bytes and a newline when they lack one. */
static int append(struct ruleset *rs, const char *label, const char *s, size_t len)
{
    struct ruleset_part *p = realloc(rs->parts, (rs->n_parts + 1) * sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    rs->parts = p;
    uint32_t line = 1;
    for (size_t i = 0; i < rs->len; i++)
        line += rs->text[i] == '\n';
    char *t = realloc(rs->text, rs->len + len + 2);
    if (t == NULL)
        return -ENOMEM;
    rs->text = t;
    char *l = strdup(label);
    if (l == NULL)
        return -ENOMEM;
    rs->parts[rs->n_parts++] = (struct ruleset_part){.label = l, .first_line = line};
    memcpy(t + rs->len, s, len);
    rs->len += len;
    if (len == 0 || s[len - 1] != '\n')
        t[rs->len++] = '\n';
    return 0;
}

static bool id_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
}

/* Whether an -e argument is a whole rule line (ID:/regex/, ID:"lit", ID:{hex}). */
static bool is_rule_line(const char *e)
{
    size_t n = 0;
    while (id_char(e[n]))
        n++;
    if (n == 0 || e[n] != ':' || strchr("/\"{", e[n + 1]) == NULL || e[n + 1] == '\0')
        return false;
    struct patfile pf;
    struct vks_error err = {0};
    bool ok = patfile_parse(e, strlen(e), &pf, &err) == 0 && pf.n == 1 && pf.n_rejects == 0 &&
              pf.rules[0].len > 0;
    patfile_finish(&pf);
    return ok;
}

static int add_expr(struct ruleset *rs, const char *e, size_t k)
{
    char label[32];
    snprintf(label, sizeof(label), "-e %zu", k);
    if (e[0] == '\0' || strchr(e, '\n') != NULL) {
        fprintf(stderr, "vkscan: -e %s: write one pattern on one line, not empty\n",
                e[0] == '\0' ? "''" : "PATTERN");
        return 2;
    }
    char *line = NULL;
    int rc = is_rule_line(e) ? asprintf(&line, "%s", e) : asprintf(&line, "e%zu:/%s/", k, e);
    if (rc < 0 || append(rs, label, line, strlen(line)) != 0) {
        free(line);
        fprintf(stderr, "vkscan: out of memory\n");
        return 2;
    }
    free(line);
    return 0;
}

struct rule_at {
    const char *id;
    size_t part;
    uint32_t line;
};

static int by_id(const void *a, const void *b)
{
    const struct rule_at *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c != 0 ? c : x->line < y->line ? -1 : x->line > y->line;
}

/* Every rule id comes from one place: prints each id defined in two files
 * (or a file and -e) with both places. Within one file an id may repeat:
 * such rules report as one rule, as Hyperscan ids do, and real sets rely
 * on it (gitleaks' keyword list gives several keywords one id). */
static int check_ids(const struct ruleset *rs)
{
    struct patfile pf;
    struct vks_error err = {0};
    if (patfile_parse(rs->text, rs->len, &pf, &err) != 0) {
        fprintf(stderr, "vkscan: %s\n", err.msg);
        patfile_finish(&pf);
        return 2;
    }
    struct rule_at *v = calloc(pf.n + 1, sizeof(*v));
    int status = v == NULL ? 2 : 0;
    for (size_t i = 0; v != NULL && i < pf.n; i++)
        v[i] = (struct rule_at){.id = pf.rules[i].id, .line = pf.rules[i].line};
    if (v != NULL)
        qsort(v, pf.n, sizeof(*v), by_id);
    for (size_t i = 1; v != NULL && i < pf.n; i++) {
        if (strcmp(v[i - 1].id, v[i].id) != 0)
            continue;
        const char *la, *lb;
        uint32_t a, b;
        ruleset_where(rs, v[i - 1].line, &la, &a);
        ruleset_where(rs, v[i].line, &lb, &b);
        if (la == lb)
            continue; /* a shared id within one file */
        fprintf(stderr, "vkscan: rule id '%s' is defined twice: %s:%u and %s:%u: rename one\n",
                v[i].id, la, a, lb, b);
        status = 2;
    }
    free(v);
    patfile_finish(&pf);
    return status;
}

int ruleset_gather(struct ruleset *rs, const char *const *files, size_t n_files,
                   const char *const *exprs, size_t n_exprs)
{
    memset(rs, 0, sizeof(*rs));
    for (size_t i = 0; i < n_files; i++) {
        char *text;
        size_t len;
        int rc = cli_read_file(files[i], &text, &len);
        if (rc != 0) {
            fprintf(stderr, "vkscan: cannot read %s: %s\n", files[i], strerror(-rc));
            return 2;
        }
        rc = append(rs, files[i], text, len);
        free(text);
        if (rc != 0) {
            fprintf(stderr, "vkscan: out of memory reading %s\n", files[i]);
            return 2;
        }
    }
    for (size_t i = 0; i < n_exprs; i++) {
        int st = add_expr(rs, exprs[i], i + 1);
        if (st != 0)
            return st;
    }
    /* one file or one -e alone cannot define an id in two places: skip the
     * second parse and the sort (43,029 rules: a third of the rules' load) */
    return n_files + n_exprs > 1 ? check_ids(rs) : 0;
}

void ruleset_where(const struct ruleset *rs, uint32_t line, const char **label, uint32_t *out_line)
{
    size_t i = 0;
    while (i + 1 < rs->n_parts && rs->parts[i + 1].first_line <= line)
        i++;
    if (rs->n_parts == 0) {
        *label = "?";
        *out_line = line;
        return;
    }
    *label = rs->parts[i].label;
    *out_line = line >= rs->parts[i].first_line ? line - rs->parts[i].first_line + 1 : line;
}

void ruleset_finish(struct ruleset *rs)
{
    for (size_t i = 0; i < rs->n_parts; i++)
        free(rs->parts[i].label);
    free(rs->parts);
    free(rs->text);
    memset(rs, 0, sizeof(*rs));
}
