/*
 * vkscan rules check / rules scan (vkscan_cli.h): compile a pattern file
 * here and report, or scan files with the CPU reference scanner; no daemon.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "catalog.h"
#include "factor.h"
#include "parse.h"
#include "patfile.h"
#include "refscan.h"
#include "rules.h"
#include "vkscan_cli.h"

static void print_maxlen(uint32_t maxlen)
{
    if (maxlen == CATALOG_UNBOUNDED)
        printf("max match unbounded\n");
    else
        printf("max match %u bytes\n", maxlen);
}

/* The catalog's engines: one line per DFA and bit-NFA group, and the
 * passes over the data a scan makes: one per group, except gated groups,
 * walked only around their factors' ends. */
static void print_groups(const struct catalog *cat)
{
    uint32_t ng = catalog_group_count(cat), nn = catalog_nfa_count(cat);
    for (uint32_t g = 0; g < ng; g++) {
        struct catalog_group grp;
        catalog_group(cat, g, &grp);
        if (grp.flags & CAT_GF_FACTOR)
            printf("group %u: factor group, %u factors, %u states, %u classes, ", g, grp.n_rules,
                   grp.n_states, grp.n_classes);
        else
            printf("group %u: %u rules, %u states, %u classes, ", g, grp.n_rules, grp.n_states,
                   grp.n_classes);
        print_maxlen(grp.maxlen);
    }
    uint32_t gated = 0;
    for (uint32_t k = 0; k < nn; k++) {
        struct catalog_nfa n;
        catalog_nfa(cat, k, &n);
        gated += (n.flags & CAT_GF_GATED) != 0;
        printf("nfa group %u: %u rules, %u bits, %u classes, %u exceptions, %s", ng + k, n.n_rules,
               n.n_bits, n.n_classes, n.n_exc, n.flags & CAT_GF_GATED ? "gated, " : "");
        if (n.flags & CAT_GF_CONFIRM) { /* unbounded: confirmed forward from a lead */
            if (n.lookback == CATALOG_UNBOUNDED && n.span == NULL)
                printf("confirmed from the buffer's start, ");
            else if (n.lookback == CATALOG_UNBOUNDED)
                printf("confirmed from the run of its span bytes before a factor's end, ");
            else
                printf("confirmed from %u bytes before a factor's end, ", n.lookback);
        } else if ((n.flags & CAT_GF_GATED) && n.lookback != 0) {
            printf("starts from %u bytes before a factor's end, ", n.lookback);
        }
        if (n.span != NULL) {
            uint32_t k = 0;
            for (int w = 0; w < 8; w++)
                k += (uint32_t)__builtin_popcount(n.span[w]);
            printf("span %u byte values to %u bytes before a factor's end, ", k, n.span[8]);
        }
        print_maxlen(n.maxlen);
    }
    printf("passes: %u (%u DFA groups, %u ungated of %u bit-NFA groups)\n", ng + nn - gated, ng,
           nn - gated, nn);
}

/* Prints " factors: f1 | f2 ..." for a bit-NFA rule: the set the compiler
 * found (the same extraction, on the rule parsed again), or "none". */
static void print_factors(const struct catalog_rule *r)
{
    char id[RULES_MAX_ID + 1];
    snprintf(id, sizeof(id), "%.*s", (int)r->id_len, r->id);
    struct rule_src src = {id, (enum rule_kind)r->kind, r->src, r->src_len, r->flags, 0};
    struct parse_result pr = {0};
    struct factor_set *fs = malloc(sizeof(*fs));
    uint32_t pos;
    char msg[240], text[256];
    int rc = fs == NULL ? -ENOMEM : parse_rule(&src, &pr, &pos, msg, sizeof(msg));
    /* unbounded rules have factors too: their groups are confirmed forward */
    if (rc == 0)
        rc = factor_extract(parse_strip_prefix(pr.root), fs);
    printf(", factors:");
    for (uint32_t i = 0; rc == 0 && i < fs->n; i++) {
        factor_format(&fs->f[i], text, sizeof(text));
        printf("%s %s", i ? " |" : "", text);
    }
    if (rc != 0)
        printf(" none");
    parse_result_finish(&pr);
    free(fs);
}

/* One line per rule: its engine, group and that group's size. */
static void print_rules(const struct catalog *cat)
{
    uint32_t ng = catalog_group_count(cat);
    for (uint32_t i = 0; i < catalog_rule_count(cat); i++) {
        struct catalog_rule r;
        catalog_rule(cat, i, &r);
        printf("rule %.*s: ", (int)r.id_len, r.id);
        if (r.group < ng) {
            struct catalog_group grp;
            catalog_group(cat, r.group, &grp);
            printf("dfa group %u (%u states), ", r.group, grp.n_states);
        } else {
            struct catalog_nfa n;
            catalog_nfa(cat, r.group - ng, &n);
            printf("nfa group %u (%u bits%s), ", r.group, n.n_bits,
                   n.flags & CAT_GF_GATED ? ", gated" : "");
            printf("max match ");
            if (r.maxlen == CATALOG_UNBOUNDED)
                printf("unbounded");
            else
                printf("%u bytes", r.maxlen);
            print_factors(&r);
            printf("\n");
            continue;
        }
        print_maxlen(r.maxlen);
    }
}

/* Compiles FILE; prints what `rules check` prints when `verbose` (and one
 * line per rule when `per_rule`). */
static int compile_file(const char *file, bool verbose, bool per_rule, struct rules_result *res,
                        size_t *n_rejects)
{
    char *text;
    size_t len;
    int rc = cli_read_file(file, &text, &len);
    if (rc != 0) {
        fprintf(stderr, "vkscan: cannot read %s: %s\n", file, strerror(-rc));
        return 2;
    }
    struct patfile pf;
    struct vks_error err = {0};
    rc = patfile_parse(text, len, &pf, &err);
    if (rc == 0)
        rc = rules_compile(pf.rules, pf.n, NULL, res, &err);
    if (rc != 0) {
        fprintf(stderr, "vkscan: %s: %s\n", file, err.msg);
        patfile_finish(&pf);
        free(text);
        return 2;
    }
    for (size_t i = 0; i < pf.n_rejects; i++) {
        const struct rule_reject *r = &pf.rejects[i];
        cli_print_reject(file, r->line, r->pos, r->id, r->msg);
    }
    for (size_t i = 0; i < res->n_rejects; i++) {
        const struct rule_reject *r = &res->rejects[i];
        cli_print_reject(file, r->line, r->pos, r->id, r->msg);
    }
    *n_rejects = pf.n_rejects + res->n_rejects;
    if (verbose) {
        const struct catalog *cat = res->catalog;
        char hex[2 * CATALOG_FP_LEN + 1];
        size_t words;
        catalog_words(cat, &words);
        catalog_fingerprint_hex(catalog_fingerprint(cat), hex);
        printf("%s: %u rules compiled, %zu rejected, %u groups, %llu states, %u bit-NFA groups, "
               "%zu bytes, %.1f ms\n",
               file, catalog_rule_count(cat), *n_rejects, catalog_group_count(cat),
               (unsigned long long)catalog_total_states(cat), catalog_nfa_count(cat), words * 4,
               (double)res->compile_ns / 1e6);
        printf("fingerprint %s\n", hex);
        print_groups(cat);
        if (per_rule)
            print_rules(cat);
    }
    patfile_finish(&pf);
    free(text);
    return 0;
}

int cli_rules_check(int argc, char **argv)
{
    bool per_rule = argc == 2 && strcmp(argv[0], "-v") == 0;
    if (argc != 1 && !per_rule) {
        fprintf(stderr, "usage: vkscan rules check [-v] FILE\n");
        return 2;
    }
    struct rules_result res;
    size_t rejects = 0;
    int rc = compile_file(argv[argc - 1], true, per_rule, &res, &rejects);
    if (rc != 0)
        return rc;
    rules_result_finish(&res);
    return rejects ? 1 : 0;
}

static int local_scan_path(const struct catalog *cat, const char *path, bool *matched)
{
    char *data;
    size_t len;
    int rc = cli_read_file(path, &data, &len);
    if (rc != 0) {
        fprintf(stderr, "vkscan: %s: %s (skipped)\n", path, strerror(-rc));
        return rc;
    }
    struct scan_hits hits = {0};
    rc = refscan_buffer(cat, (const uint8_t *)data, len, SCAN_ALL, &hits);
    for (size_t i = 0; i < hits.n && rc == 0; i++) {
        struct catalog_rule r;
        catalog_rule(cat, hits.v[i].rule, &r);
        printf("%s:%llu:%.*s\n", path, (unsigned long long)hits.v[i].end, (int)r.id_len, r.id);
        *matched = true;
    }
    scan_hits_finish(&hits);
    free(data);
    return rc;
}

int cli_rules_scan(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: vkscan rules scan RULES PATH...\n");
        return 2;
    }
    struct rules_result res;
    size_t rejects = 0;
    int rc = compile_file(argv[0], false, false, &res, &rejects);
    if (rc != 0)
        return rc;
    bool matched = false, failed = false;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (strcmp(argv[i], "-") != 0 && stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            fprintf(stderr, "vkscan: %s: is a directory (the local scanner takes files)\n",
                    argv[i]);
            failed = true;
            continue;
        }
        failed |= local_scan_path(res.catalog, argv[i], &matched) != 0;
    }
    rules_result_finish(&res);
    return failed ? 2 : matched ? 0 : 1;
}
