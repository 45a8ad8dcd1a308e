/*
 * coverage: which rules of the shared pattern files vkscan compiles, which
 * Hyperscan compiles, and why vkscan rejects the rest. Prints Markdown:
 * docs/rules-coverage.md is its output.
 *
 *   coverage [DATA_DIR]      (default $VKS_SHARED_DATA, else ../shared/data)
 *
 * Every file matching gitleaks/<any>.rules and rebar/dict-<any>.rules is compiled as
 * one rule set with vkscan's default options; Hyperscan (block mode) judges
 * each rule alone (for sets over 5,000 rules: the whole set, dropping each
 * expression it reports as bad and compiling the rest again).
 */
#include <errno.h>
#include <glob.h>
#include <hs.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "patfile.h"
#include "rules.h"
#include "workloads.h"

struct prule {
    char *id;
    char *pat; /* NUL-terminated */
    enum rule_kind kind;
    uint32_t flags;
    uint32_t line;
};

struct pfile {
    struct prule *v;
    size_t n;
    struct patfile bad; /* the reader's result: its rejects are unreadable lines */
};

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) {
        fprintf(stderr, "coverage: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return q;
}

static char *xmemdup(const char *s, size_t n)
{
    char *p = xrealloc(NULL, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* Loads a pattern file with the project's reader (patfile.h); lines it
 * cannot read stay in `pf->bad`. */
static int pfile_load(struct pfile *pf, const char *path)
{
    char *text;
    size_t len;
    int rd = workload_read_file(path, &text, &len);
    if (rd != 0)
        return rd;
    struct vks_error err = {0};
    int rc = patfile_parse(text, len, &pf->bad, &err);
    free(text);
    if (rc != 0)
        return rc;
    pf->v = xrealloc(NULL, (pf->bad.n + 1) * sizeof(*pf->v));
    for (size_t i = 0; i < pf->bad.n; i++) {
        const struct rule_src *r = &pf->bad.rules[i];
        pf->v[i] = (struct prule){xmemdup(r->id, strlen(r->id)), xmemdup(r->pattern, r->len),
                                  r->kind, r->flags, r->line};
    }
    pf->n = pf->bad.n;
    return 0;
}

static void pfile_free(struct pfile *pf)
{
    for (size_t i = 0; i < pf->n; i++) {
        free(pf->v[i].id);
        free(pf->v[i].pat);
    }
    free(pf->v);
    patfile_finish(&pf->bad);
}

static unsigned hs_flags_of(uint32_t f)
{
    return (f & RULE_F_CASELESS ? HS_FLAG_CASELESS : 0) | (f & RULE_F_DOTALL ? HS_FLAG_DOTALL : 0) |
           (f & RULE_F_MULTILINE ? HS_FLAG_MULTILINE : 0) |
           (f & RULE_F_SINGLEMATCH ? HS_FLAG_SINGLEMATCH : 0);
}

/* Hyperscan's verdict per rule: why[i] is "" when it compiles. */
static void hs_judge_each(const struct pfile *pf, char (*why)[160])
{
    for (size_t i = 0; i < pf->n; i++) {
        hs_database_t *db = NULL;
        hs_compile_error_t *ce = NULL;
        why[i][0] = '\0';
        if (pf->v[i].kind != RULE_REGEX) {
            snprintf(why[i], sizeof(why[i]), "not asked: not a regex rule");
            continue;
        }
        if (hs_compile(pf->v[i].pat, hs_flags_of(pf->v[i].flags), HS_MODE_BLOCK, NULL, &db, &ce) ==
            HS_SUCCESS) {
            hs_free_database(db);
            continue;
        }
        snprintf(why[i], sizeof(why[i]), "%s", ce->message);
        hs_free_compile_error(ce);
    }
}

/* The same for a large set, compiled whole; returns -1 if that fails for a
 * reason that names no expression. */
static int hs_judge_all(const struct pfile *pf, char (*why)[160])
{
    const char **expr = xrealloc(NULL, pf->n * sizeof(*expr));
    unsigned *flags = xrealloc(NULL, pf->n * sizeof(*flags));
    unsigned *ids = xrealloc(NULL, pf->n * sizeof(*ids));
    int rc = 0;
    for (size_t i = 0; i < pf->n; i++)
        snprintf(why[i], sizeof(why[i]), "%s",
                 pf->v[i].kind == RULE_REGEX ? "" : "not asked: not a regex rule");
    for (;;) {
        unsigned m = 0;
        for (size_t i = 0; i < pf->n; i++) {
            if (why[i][0] == '\0') {
                expr[m] = pf->v[i].pat;
                flags[m] = hs_flags_of(pf->v[i].flags);
                ids[m++] = (unsigned)i;
            }
        }
        hs_database_t *db = NULL;
        hs_compile_error_t *ce = NULL;
        if (m == 0 ||
            hs_compile_multi(expr, flags, ids, m, HS_MODE_BLOCK, NULL, &db, &ce) == HS_SUCCESS) {
            hs_free_database(db);
            break;
        }
        if (ce->expression < 0) {
            fprintf(stderr, "coverage: Hyperscan fails on the whole set: %s\n", ce->message);
            hs_free_compile_error(ce);
            rc = -1;
            break;
        }
        snprintf(why[ids[ce->expression]], sizeof(why[0]), "%s", ce->message);
        hs_free_compile_error(ce);
    }
    free(expr);
    free(flags);
    free(ids);
    return rc;
}

/* Prints a Markdown table cell: pipes escaped, backticks kept out. */
static void print_cell(const char *s, size_t n)
{
    for (size_t i = 0; i < n && s[i]; i++) {
        if (s[i] == '|')
            fputs("\\|", stdout);
        else if (s[i] == '`')
            fputs("'", stdout);
        else
            putchar(s[i]);
    }
}

struct verdicts {
    const char *name;
    size_t total, both, we_reject, hs_rejects, neither; /* who rejects */
    struct rules_result res;
    char (*hs_why)[160];
    struct pfile pf;
};

static int judge(struct verdicts *vd, const char *path, const char *name)
{
    memset(vd, 0, sizeof(*vd));
    vd->name = name;
    int rc = pfile_load(&vd->pf, path);
    if (rc != 0) {
        fprintf(stderr, "coverage: cannot read %s: %s\n", path, strerror(-rc));
        return rc;
    }
    struct rule_src *src = xrealloc(NULL, vd->pf.n * sizeof(*src));
    for (size_t i = 0; i < vd->pf.n; i++) {
        const struct prule *p = &vd->pf.v[i];
        src[i] = (struct rule_src){p->id, p->kind, p->pat, strlen(p->pat), p->flags, p->line};
    }
    struct vks_error err = {0};
    rc = rules_compile(src, vd->pf.n, NULL, &vd->res, &err);
    free(src);
    if (rc != 0) {
        fprintf(stderr, "coverage: %s: %s\n", path, err.msg);
        return rc;
    }
    vd->hs_why = xrealloc(NULL, vd->pf.n * sizeof(*vd->hs_why));
    if (vd->pf.n <= 5000 || hs_judge_all(&vd->pf, vd->hs_why) != 0)
        hs_judge_each(&vd->pf, vd->hs_why);
    vd->total = vd->pf.n + vd->pf.bad.n_rejects;
    vd->we_reject = vd->pf.bad.n_rejects;
    for (size_t i = 0; i < vd->pf.n; i++) {
        bool ours = vd->res.rule_index[i] != UINT32_MAX, hs = vd->hs_why[i][0] == '\0';
        vd->both += ours && hs;
        vd->hs_rejects += ours && !hs;
        vd->we_reject += !ours && hs;
        vd->neither += !ours && !hs;
    }
    return 0;
}

static void verdicts_finish(struct verdicts *vd)
{
    rules_result_finish(&vd->res);
    free(vd->hs_why);
    pfile_free(&vd->pf);
}

static void print_rejects(const struct verdicts *vd)
{
    if (vd->res.n_rejects + vd->pf.bad.n_rejects == 0)
        return;
    printf("\n### %s: rules vkscan rejects\n\n", vd->name);
    printf("| line | id | pos | vkscan's reason | Hyperscan |\n|---|---|---|---|---|\n");
    for (size_t k = 0; k < vd->pf.bad.n_rejects; k++) {
        const struct rule_reject *rj = &vd->pf.bad.rejects[k];
        printf("| %u | `%s` | %u | ", rj->line, rj->id, rj->pos);
        print_cell(rj->msg, sizeof(rj->msg));
        printf(" | not asked |\n");
    }
    for (size_t k = 0; k < vd->res.n_rejects; k++) {
        const struct rule_reject *rj = &vd->res.rejects[k];
        printf("| %u | `%s` | %u | ", rj->line, rj->id, rj->pos);
        print_cell(rj->msg, sizeof(rj->msg));
        printf(" | ");
        const char *hs = vd->hs_why[rj->index];
        print_cell(hs[0] ? hs : "accepts", 160);
        printf(" |\n");
    }
}

static void print_hs_only_rejects(const struct verdicts *vd)
{
    if (vd->hs_rejects == 0)
        return;
    printf("\n### %s: rules only Hyperscan rejects\n\n", vd->name);
    printf("| line | id | Hyperscan's reason |\n|---|---|---|\n");
    for (size_t i = 0; i < vd->pf.n; i++) {
        if (vd->res.rule_index[i] == UINT32_MAX || vd->hs_why[i][0] == '\0')
            continue;
        printf("| %u | `%s` | ", vd->pf.v[i].line, vd->pf.v[i].id);
        print_cell(vd->hs_why[i], 160);
        printf(" |\n");
    }
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    const char *data = argc > 1 ? argv[1] : getenv("VKS_SHARED_DATA");
    if (data == NULL || *data == '\0')
        data = "../shared/data";
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        fprintf(stderr, "usage: coverage [DATA_DIR] > docs/rules-coverage.md\n");
        return 2;
    }
    char pat[4096];
    glob_t gl;
    snprintf(pat, sizeof(pat), "%s/gitleaks/*.rules", data);
    int g1 = glob(pat, 0, NULL, &gl);
    snprintf(pat, sizeof(pat), "%s/rebar/dict-*.rules", data);
    int g2 = glob(pat, g1 == 0 ? GLOB_APPEND : 0, NULL, &gl);
    if (g1 != 0 && g2 != 0) {
        fprintf(stderr, "coverage: no pattern files under %s\n", data);
        return 1;
    }
    qsort(gl.gl_pathv, gl.gl_pathc, sizeof(char *), cmp_str);
    size_t skip = strlen(data) + 1;
    struct verdicts *vd = xrealloc(NULL, gl.gl_pathc * sizeof(*vd));
    int status = 0;
    printf("# Rule coverage of the shared pattern files\n\n"
           "Generated by `bench/rules_coverage` (bench/rules_coverage.c) over ../shared/data: each "
           "file is\n"
           "compiled as one rule set with vkscan's default options; Hyperscan %s (block mode)\n"
           "judges each rule. Regenerate with `build/bench/rules_coverage > "
           "docs/rules-coverage.md`.\n\n"
           "| file | rules | accepted by both | rejected by vkscan only | "
           "rejected by Hyperscan only | rejected by both |\n|---|---|---|---|---|---|\n",
           hs_version());
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        if (judge(&vd[i], gl.gl_pathv[i], gl.gl_pathv[i] + skip) != 0) {
            status = 1;
            continue;
        }
        printf("| %s | %zu | %zu | %zu | %zu | %zu |\n", vd[i].name, vd[i].total, vd[i].both,
               vd[i].we_reject, vd[i].hs_rejects, vd[i].neither);
    }
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        print_rejects(&vd[i]);
        print_hs_only_rejects(&vd[i]);
        verdicts_finish(&vd[i]);
    }
    free(vd);
    globfree(&gl);
    return status;
}
