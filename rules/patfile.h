/*
 * Pattern files: one rule a line, in the form hsbench and many tools use.
 *
 *     ID:/regex/flags        a regex (flags: i s m H L)
 *     ID:"literal"flags      a literal string with C escapes (flags: i H L)
 *     ID:{4d 5a ?? 00}flags  a hex string in YARA's syntax (flags: i H L)
 *
 * Blank lines and lines starting with '#' are skipped. A line that cannot be
 * read as a rule becomes a reject with its line number; the others load.
 */
#ifndef VKS_RULES_PATFILE_H
#define VKS_RULES_PATFILE_H

#include <stddef.h>

#include "rules.h"

struct patfile {
    struct rule_src *rules; /* point into `storage` */
    size_t n;
    struct rule_reject *rejects; /* index = UINT32_MAX: the line is not a rule */
    size_t n_rejects;
    char *storage;
};

/*
 * Reads `len` bytes of pattern-file text (borrowed; need not be
 * NUL-terminated). Returns 0, or -ENOMEM with `err` filled; bad lines are
 * rejects, not failures. Free with patfile_finish, also after a failure.
 */
int patfile_parse(const char *text, size_t len, struct patfile *out, struct vks_error *err);

void patfile_finish(struct patfile *pf);

#endif
