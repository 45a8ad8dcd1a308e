/*
 * Class runs for the CPU engine: the factors of rules that have no string
 * to look for, only a long counted class.
 *
 * Secret scanners' generic rules (`\b[a-fA-F0-9]{40}\b`,
 * `\d{15,16}[|%][0-9a-z_-]{27,40}`) hold no literal, so their groups were
 * walked over every byte. Every match of such a rule holds `n` bytes in a
 * row of one class (rules/cpuplan.c finds the class and n from the parsed
 * rule); text seldom has such a run. A run matcher finds the maximal runs
 * of at least n bytes of the class and reports points in each, so that the
 * rule's group is walked only in windows around them, as around a literal
 * factor's ends.
 *
 * A run of n or more bytes holds exactly one offset of every residue
 * modulo n, so the scan looks at every n-th byte only and, where that byte
 * is in the class, widens it to its maximal run.
 *
 * Read-only after cpurun_create: any number of threads may scan with one.
 */
#ifndef VKS_RULES_CPURUN_H
#define VKS_RULES_CPURUN_H

#include <stddef.h>
#include <stdint.h>

#include "cpulit.h" /* cpulit_fn */

struct cpurun_entry {
    uint64_t set[4]; /* the class: bit c of set[c / 64] */
    uint32_t n;      /* bytes in a row, >= 1 */
    uint32_t id;     /* reported to fn */
};

struct cpurun;

/* Builds a matcher over entries v[0..n) (n >= 1). Returns 0, -EINVAL (an
 * entry with n == 0 or an empty class) or -ENOMEM. */
int cpurun_create(const struct cpurun_entry *v, size_t n, struct cpurun **out);

void cpurun_destroy(struct cpurun *m);

/* Returned by fn: no more points of this entry in this scan (the next
 * entry goes on). */
#define CPURUN_SKIP 1

/* The end fn is given, once, when an entry's class is so common in the
 * data that widening its samples costs more than half the bytes looked at
 * (past the first CPURUN_DENSE_MIN): its scan ends there, with points
 * missing, and the caller must scan its rules some other way (the plan's
 * window group walked in full). */
#define CPURUN_GAVE_UP   UINT64_MAX
#define CPURUN_DENSE_MIN 4096u

/*
 * For each entry and each maximal run [a, b) of its class inside
 * buf[begin, min(hi, len)) with b - a >= n: fn(ctx, id, e) for e = a + n,
 * a + 2n, ... below b, and for e = b. Each point ends n bytes of the class
 * (b - n <= e - n, a <= e - n), and every end of n such bytes in the run is
 * at most n - 1 after a point, so a rule whose matches hold the run and are
 * at most MAXLEN long ends within [e, e + MAXLEN] of a point e. Entries
 * are scanned one after the other, each in increasing e. fn returning
 * CPURUN_SKIP ends its entry's scan; another non-zero return stops the
 * scan and is returned.
 */
int cpurun_scan(const struct cpurun *m, const uint8_t *buf, size_t len, size_t begin, uint64_t hi,
                cpulit_fn fn, void *ctx);

#endif
