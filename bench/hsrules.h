/*
 * Rules for Hyperscan, the benchmarks' rival: a vkscan rule's flags and
 * expression as Hyperscan takes them, and a database of the rules it
 * accepts. The benchmarks are tools: running out of memory or a Hyperscan
 * failure that names no rule ends the process with a message.
 */
#ifndef VKS_BENCH_HSRULES_H
#define VKS_BENCH_HSRULES_H

#include <hs/hs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rules.h"

/* HS_FLAG_* for RULE_F_* (caseless, dot-all, multi-line, single-match). */
unsigned hsrules_flags(uint32_t rule_flags);

/* The rule as a NUL-terminated Hyperscan expression, which the caller
 * frees: a regex as written, a literal or hex string byte by byte as \xHH
 * (its escapes were decoded by the rules parser). */
char *hsrules_expr(const struct rule_src *r);

/*
 * Compiles v[i] for every i with keep[i] in `mode` (HS_MODE_BLOCK, ...),
 * clearing keep[i] for each rule Hyperscan rejects and compiling again
 * without it. Pattern ids are the indexes i. Returns the database, or NULL
 * when no rule is left; `accepted` (optional) gets the number compiled.
 */
hs_database_t *hsrules_build(const struct rule_src *v, size_t n, bool *keep, unsigned mode,
                             unsigned *accepted);

#endif
