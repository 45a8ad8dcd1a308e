/*
 * hs_file: the Hyperscan rival for bench/cli_bench.sh. Scans one file with a
 * pattern file the way a user would with Hyperscan on many cores: compile the
 * rules Hyperscan accepts (block mode), mmap the file, split it into one
 * chunk per thread, each chunk after the first starting --overlap bytes
 * early so that matches up to that length across a cut are found, and count
 * matches: a chunk counts only those that end in its own part, so a match
 * is counted once (before, chunks that overlapped the next counted the
 * matches inside the overlap twice: 319 too many for dict-10 on 1 GiB).
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

#include "hsrules.h"
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

/* Compiles every rule Hyperscan accepts, dropping the others one by one. */
static hs_database_t *build(const struct patfile *pf, unsigned *accepted)
{
    bool *keep = malloc(pf->n ? pf->n : 1);
    if (keep == NULL)
        die("malloc", strerror(ENOMEM));
    for (size_t i = 0; i < pf->n; i++)
        keep[i] = true;
    hs_database_t *db = hsrules_build(pf->rules, pf->n, keep, HS_MODE_BLOCK, accepted);
    free(keep);
    if (db == NULL)
        die("compile", "Hyperscan accepts none of the rules");
    return db;
}

struct job {
    const hs_database_t *db;
    hs_scratch_t *scratch;
    const char *data;
    size_t len;
    size_t skip; /* matches ending at or before this offset are the chunk before's */
    uint64_t matches;
};

static int on_match(unsigned id, unsigned long long from, unsigned long long to, unsigned flags,
                    void *ctx)
{
    (void)id;
    (void)from;
    (void)flags;
    struct job *j = ctx;
    j->matches += to > j->skip;
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
        size_t hi = lo + chunk < size ? lo + chunk : size;
        size_t from = lo > overlap ? lo - overlap : 0;
        jobs[t] = (struct job){.db = db, .data = map + from, .len = hi - from, .skip = lo - from};
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
