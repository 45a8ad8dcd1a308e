/*
 * The rules of one `vkscan scan` (vkscan_ruleset.c): every -r file and every
 * -e pattern joined into ONE pattern-file text, so they make one catalog, and
 * the way back from a line of that text to the file and line it came from.
 * Not installed; main thread only.
 */
#ifndef VKS_CLIENT_VKSCAN_RULESET_H
#define VKS_CLIENT_VKSCAN_RULESET_H

#include <stddef.h>
#include <stdint.h>

struct ruleset_part {
    char *label;         /* the file as named, or "-e N" */
    uint32_t first_line; /* its line 1 in the joined text */
};

struct ruleset {
    char *text; /* the joined pattern-file text, `len` bytes */
    size_t len;
    struct ruleset_part *parts;
    size_t n_parts;
};

/*
 * Joins `files` (pattern files, "-" for standard input) and `exprs` (-e
 * arguments: a whole rule line `ID:/regex/flags`, `ID:"literal"` or
 * `ID:{hex}`, else a regex that gets the id eN, N counting -e from 1).
 * Returns 0, or prints what is wrong on stderr (a file that cannot be read,
 * an id defined twice, naming both FILE:LINE) and returns 2, the exit
 * status. Free with ruleset_finish, also after a failure.
 */
int ruleset_gather(struct ruleset *rs, const char *const *files, size_t n_files,
                   const char *const *exprs, size_t n_exprs);

/* Where line `line` of the joined text came from: *label (borrowed) and the
 * line in that file (for -e: 1). */
void ruleset_where(const struct ruleset *rs, uint32_t line, const char **label, uint32_t *out_line);

void ruleset_finish(struct ruleset *rs);

#endif
