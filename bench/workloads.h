/*
 * Synthetic rule sets shared by the benchmarks, so that compile_bench and
 * scan_bench measure the very same rules (docs/PERFORMANCE.md compares them).
 */
#ifndef VKS_BENCH_WORKLOADS_H
#define VKS_BENCH_WORKLOADS_H

#include <stddef.h>
#include <stdint.h>

/* Reads a whole file into a malloc'd, NUL-terminated buffer; returns 0 or
 * a negative errno. */
int workload_read_file(const char *path, char **text, size_t *len);

/* xorshift64: deterministic on every machine. */
uint64_t workload_next(uint64_t *s);

/* A malloc'd word of min..max lowercase letters; NULL when out of memory. */
char *workload_word(uint64_t *s, uint32_t min, uint32_t max, size_t *len);

/* The seed of the bounded-regex set of n rules. */
uint64_t workload_regex_seed(uint32_t n);

/*
 * Rule i of the bounded-regex set (counted repetitions, classes,
 * alternations, case folding): writes the pattern into `pat` and one string
 * it matches into `inst`. Returns 0, or -1 when out of memory.
 */
int workload_regex(uint64_t *s, uint32_t i, char pat[96], char inst[64]);

#endif
