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

/*
 * binary-N: random byte strings of 8..32 bytes over all 256 byte values
 * (the shape of antivirus and IDS signature sets). workload_binary_seed(n)
 * starts the set of n strings; each call writes the next string's bytes
 * into `bytes`, its rule (a regex of \xHH escapes, which Hyperscan reads
 * the same way) into `pat`, and returns the string's length.
 */
#define WORKLOAD_BINARY_MAX 32
uint64_t workload_binary_seed(uint32_t n);
size_t workload_binary(uint64_t *s, uint8_t bytes[WORKLOAD_BINARY_MAX],
                       char pat[4 * WORKLOAD_BINARY_MAX + 1]);

/*
 * phrases-N: N distinct phrases of 2 or 3 common English words separated by
 * one space, to be compiled caseless, that hit English text densely
 * (sherlock.txt: docs/PERFORMANCE.md has the matches per GiB). Returns a
 * malloc'd array of N malloc'd strings (workload_phrases_free frees it), or
 * NULL when out of memory. Deterministic.
 */
char **workload_phrases(uint32_t n);
void workload_phrases_free(char **phrases, uint32_t n);

/*
 * regex-N-secrets: regexes shaped like secret-scanning rules (a word, then
 * counted repeats of broad classes such as [A-Za-z0-9_-]{20,40}, gaps,
 * alternations; 10% caseless by (?i), 10% by the flag). Start with
 * *s = workload_secrets_seed(); each call writes the next pattern into pat,
 * sets *flags to 0 or 1 (caseless: RULE_F_CASELESS), and returns its length.
 */
#define WORKLOAD_SECRET_MAX 512
uint64_t workload_secrets_seed(void);
size_t workload_secret(uint64_t *s, char pat[WORKLOAD_SECRET_MAX], uint32_t *flags);

#endif
