/*
 * hs_file: the Hyperscan rival for bench/cli_bench.sh. Scans one file with a
 * pattern file the way a user would with Hyperscan on many cores: compile the
 * rules Hyperscan accepts (block mode), mmap the file, split it into one
 * chunk per thread, each chunk overlapping the next by --overlap bytes so
 * that matches up to that length across a cut are found, and count matches.
 *
 *     hs_file RULES FILE [--threads N] [--iters K] [--overlap BYTES]
 *
 * Prints one line: rules, rules Hyperscan accepted, compile seconds, file
 * bytes, matches (of the last iteration), the median scan seconds over K
 * iterations (the mmap'd file already in memory: the first, untimed pass
 * faults the pages in) and the median GB/s. The wall time of the whole
 * process is what cli_bench compares with `vkscan scan`.
 */
#include <errno.h>
#include <fcntl.h>
#include <hs/hs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "patfile.h"
#include "workloads.h"

static void die(const char *what, const char *why)
{
    fprintf(stderr, "hs_file: %s: %s\n", what, why);
    exit(1);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static unsigned hs_flags(uint32_t f)
{
    unsigned h = 0;
    if (f & RULE_F_CASELESS)
        h |= HS_FLAG_CASELESS;
    if (f & RULE_F_DOTALL)
        h |= HS_FLAG_DOTALL;
    if (f & RULE_F_MULTILINE)
        h |= HS_FLAG_MULTILINE;
    if (f & RULE_F_SINGLEMATCH)
        h |= HS_FLAG_SINGLEMATCH;
    return h;
}

/* Regexes as written; literals and hex strings byte by byte as \xHH, as
 * scan_bench gives them to Hyperscan. */
static char *expr_of(const struct rule_src *r)
{
    size_t cap = r->kind == RULE_REGEX ? r->len + 1 : r->len * 4 + 1;
    char *e = malloc(cap);
    if (e == NULL)
        die("malloc", strerror(ENOMEM));
    if (r->kind == RULE_REGEX) {
        memcpy(e, r->pattern, r->len);
        e[r->len] = '\0';
    } else {
        for (size_t i = 0; i < r->len; i++)
            snprintf(e + i * 4, 5, "\\x%02x", (unsigned char)r->pattern[i]);
    }
    return e;
}

/* Compiles every rule Hyperscan accepts, dropping the others one by one. */
static hs_database_t *build(const struct patfile *pf, unsigned *accepted)
{
    size_t n = pf->n;
    char **expr = calloc(n, sizeof(*expr));
    const char **live = calloc(n, sizeof(*live));
    unsigned *flags = calloc(n, sizeof(*flags)), *ids = calloc(n, sizeof(*ids));
    char *keep = malloc(n);
    if (!expr || !live || !flags || !ids || !keep)
        die("malloc", strerror(ENOMEM));
    memset(keep, 1, n);
    for (size_t i = 0; i < n; i++)
        expr[i] = expr_of(&pf->rules[i]);
    hs_database_t *db = NULL;
    for (;;) {
        unsigned m = 0;
        for (size_t i = 0; i < n; i++) {
            if (!keep[i])
                continue;
            live[m] = expr[i];
            flags[m] = hs_flags(pf->rules[i].flags);
            ids[m] = (unsigned)i;
            m++;
        }
        *accepted = m;
        if (m == 0)
            die("compile", "Hyperscan accepts none of the rules");
        hs_compile_error_t *ce = NULL;
        if (hs_compile_multi(live, flags, ids, m, HS_MODE_BLOCK, NULL, &db, &ce) == HS_SUCCESS)
            break;
        if (ce->expression < 0)
            die("hs_compile_multi", ce->message);
        keep[ids[ce->expression]] = 0;
        hs_free_compile_error(ce);
    }
    for (size_t i = 0; i < n; i++)
        free(expr[i]);
    free(expr);
    free(live);
    free(flags);
    free(ids);
    free(keep);
    return db;
}

struct job {
    const hs_database_t *db;
    hs_scratch_t *scratch;
    const char *data;
    size_t len;
    uint64_t matches;
};

static int on_match(unsigned id, unsigned long long from, unsigned long long to, unsigned flags,
                    void *ctx)
{
    (void)id;
    (void)from;
    (void)to;
    (void)flags;
    ((struct job *)ctx)->matches++;
    return 0;
}

static void *run(void *arg)
{
    struct job *j = arg;
    j->matches = 0;
    if (j->len > 0 &&
        hs_scan(j->db, j->data, (unsigned)j->len, 0, j->scratch, on_match, j) != HS_SUCCESS)
        die("hs_scan", "failed");
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: hs_file RULES FILE [--threads N] [--iters K] [--overlap BYTES]\n");
        return 2;
    }
    unsigned threads = 16, iters = 5;
    size_t overlap = 4096;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--threads") == 0)
            threads = (unsigned)atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--iters") == 0)
            iters = (unsigned)atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--overlap") == 0)
            overlap = (size_t)atol(argv[i + 1]);
        else
            die(argv[i], "unknown option");
    }
    if (threads == 0 || threads > 256 || iters == 0 || iters > 100)
        die("options", "threads must be 1..256 and iters 1..100");
    char *text;
    size_t tlen;
    if (workload_read_file(argv[1], &text, &tlen) < 0)
        die(argv[1], strerror(errno));
    struct patfile pf;
    struct vks_error err = {0};
    if (patfile_parse(text, tlen, &pf, &err) < 0)
        die(argv[1], err.msg);
    double t0 = now();
    unsigned accepted = 0;
    hs_database_t *db = build(&pf, &accepted);
    double compile_s = now() - t0;

    int fd = open(argv[2], O_RDONLY);
    if (fd < 0)
        die(argv[2], strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        die(argv[2], strerror(errno));
    size_t size = (size_t)sb.st_size;
    const char *map = size ? mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0) : "";
    if (map == MAP_FAILED)
        die("mmap", strerror(errno));

    struct job *jobs = calloc(threads, sizeof(*jobs));
    pthread_t *tid = calloc(threads, sizeof(*tid));
    double *secs = calloc(iters, sizeof(*secs));
    if (!jobs || !tid || !secs)
        die("malloc", strerror(ENOMEM));
    size_t chunk = (size + threads - 1) / threads;
    for (unsigned t = 0; t < threads; t++) {
        size_t lo = (size_t)t * chunk < size ? (size_t)t * chunk : size;
        size_t hi = lo + chunk + overlap < size ? lo + chunk + overlap : size;
        jobs[t] = (struct job){.db = db, .data = map + lo, .len = hi - lo};
        if (hs_alloc_scratch(db, &jobs[t].scratch) != HS_SUCCESS)
            die("hs_alloc_scratch", "failed");
    }
    uint64_t matches = 0;
    for (unsigned it = 0; it <= iters; it++) { /* pass 0 warms, untimed */
        double s = now();
        for (unsigned t = 0; t < threads; t++)
            pthread_create(&tid[t], NULL, run, &jobs[t]);
        matches = 0;
        for (unsigned t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            matches += jobs[t].matches;
        }
        if (it > 0)
            secs[it - 1] = now() - s;
    }
    qsort(secs, iters, sizeof(*secs), cmp_double);
    double med = secs[iters / 2];
    printf("rules %zu accepted %u compile_s %.3f bytes %zu threads %u matches %llu "
           "scan_s_median %.4f gbps_median %.2f\n",
           pf.n, accepted, compile_s, size, threads, (unsigned long long)matches, med,
           med > 0 ? (double)size / med / 1e9 : 0.0);
    for (unsigned t = 0; t < threads; t++)
        hs_free_scratch(jobs[t].scratch);
    hs_free_database(db);
    patfile_finish(&pf);
    free(text);
    free(jobs);
    free(tid);
    free(secs);
    return 0;
}
