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
#include "patfile.h"
#include "refscan.h"
#include "rules.h"
#include "vkscan_cli.h"

/* Compiles FILE; prints what `rules check` prints when `verbose`. */
static int compile_file(const char *file, bool verbose, struct rules_result *res, size_t *n_rejects)
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
        printf("%s: %u rules compiled, %zu rejected, %u groups, %llu states, %zu bytes, %.1f ms\n",
               file, catalog_rule_count(cat), *n_rejects, catalog_group_count(cat),
               (unsigned long long)catalog_total_states(cat), words * 4,
               (double)res->compile_ns / 1e6);
        printf("fingerprint %s\n", hex);
        for (uint32_t g = 0; g < catalog_group_count(cat); g++) {
            struct catalog_group grp;
            catalog_group(cat, g, &grp);
            if (grp.maxlen == CATALOG_UNBOUNDED)
                printf("group %u: %u rules, %u states, %u classes, max match unbounded\n", g,
                       grp.n_rules, grp.n_states, grp.n_classes);
            else
                printf("group %u: %u rules, %u states, %u classes, max match %u bytes\n", g,
                       grp.n_rules, grp.n_states, grp.n_classes, grp.maxlen);
        }
    }
    patfile_finish(&pf);
    free(text);
    return 0;
}

int cli_rules_check(int argc, char **argv)
{
    if (argc != 1) {
        fprintf(stderr, "usage: vkscan rules check FILE\n");
        return 2;
    }
    struct rules_result res;
    size_t rejects = 0;
    int rc = compile_file(argv[0], true, &res, &rejects);
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
    int rc = compile_file(argv[0], false, &res, &rejects);
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
