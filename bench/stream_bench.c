/*
 * stream_bench: vkscan streams against Hyperscan's stream mode, same data,
 * same run (issue 13, docs/PERFORMANCE.md "Streams").
 *
 *   stream_bench [--threads T] [--iters N] [--only state,flows,large,begin]
 *                [--streams N] [--write BYTES] [--rounds R] [--literals N]
 *                [--large BYTES] [--large-write BYTES] [--file PATH]
 *                [--regexes N] [--data DIR] [--socket PATH] [--no-hs] [--no-block]
 *                [--stream-count]
 *                [--flows-set literals|regex] [--stream-threads T] [--piece BYTES]
 *                [--fast-min BYTES] [--window N] [--flows-fd] [--batch N]
 *                [--clients N]
 *
 * state:  for every workload of bench/workloads.c (literals-1000,
 *         literals-10000, regex-N) and the real rule sets under --data,
 *         the bytes of state one stream holds: streamscan_size against
 *         hs_stream_size of the same rules compiled in HS_MODE_STREAM.
 * flows:  --streams concurrent streams against literals-N, --rounds writes
 *         of --write bytes each, interleaved across streams (each thread
 *         walks its streams round-robin, a flow-reassembly shape), on
 *         --threads threads; vkscan's CPU stream scanner and Hyperscan's
 *         stream mode on the same streams and bytes, and the CPU engine's
 *         block scan of each write as its own buffer. GB/s, medians of
 *         --iters, and both stream hit counts, which must be equal. With
 *         --flows-set regex: against regex-N (--regexes), an instance of
 *         one planted every ~4 KiB (flows and large).
 * large:  one stream of --large bytes of a file (--file, or written under
 *         /tmp and removed after) in writes of --large-write taken from its
 *         mapping (in process; vkscand reads the fd ranges), against
 *         block mode over the same bytes: the CPU block scanner
 *         (rules/cpuscan.h) on --threads threads over the mapped file, and
 *         Hyperscan's stream mode over the same writes. The stream's writes
 *         scan their middles in pieces of --piece bytes (default 256 KiB) on
 *         --stream-threads threads (default --threads; streamscan.h).
 *         --fast-min: a write takes that path when its middle is longer
 *         (default 1024; 1T: never, the walk of every group).
 *
 * --socket PATH runs flows and large through a running vkscand instead of
 * in-process (libvkscan; one connection per thread, --clients of them for
 * the flows, default --threads: Hyperscan keeps --threads, the cores it
 * uses, while a GPU needs more writes in flight than 16 synchronous
 * connections hold; the daemon needs stream-max-per-tenant >= --streams). Through vkscand, --window
 * N keeps up to N pipelined writes in flight per connection (vks_stream_write_send; default 1: each
 * write waits for its reply; the large stream's too),
 * --batch N sends N writes
 * (of N streams) per request instead, and opens and closes N streams per
 * request (vks_stream_write_many, _open_many, _close_many; not with
 * --window), and --flows-fd sends the flows' writes as ranges of one sealed
 * memfd holding the corpus instead of inline bytes. Deterministic: fixed
 * seeds.
 */
#include <errno.h>
#include <fcntl.h>
#include <hs/hs.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cpuplan.h"
#include "cpuscan.h"
#include "patfile.h"
#include "hsrules.h"
#include "rules.h"
#include "streamscan.h"
#include "vkscan/vkscan.h"
#include "workloads.h"

struct opts {
    uint32_t threads, iters, streams, rounds, literals, regexes;
    uint32_t clients; /* --clients: connections of the flows through vkscand (0: --threads) */
    uint32_t stream_threads; /* --stream-threads: a large write's pieces run on these */
    uint64_t write, large, large_write, piece;
    uint64_t fast_min; /* --fast-min: streamscan_tune (UINT64_MAX: default) */
    const char *file, *data, *socket, *only;
    bool no_hs;
    bool no_block; /* --no-block: large runs the stream alone (its counters apart) */
    /* --stream-count: large's stream through vkscand in count mode, as its
     * block scan is (one hit per rule and write, with its count) */
    bool stream_count;
    bool flows_regex; /* --flows-set regex: flows against regex-N, not literals-N */
    uint32_t window;  /* --window: pipelined writes in flight per connection */
    uint32_t batch;   /* --batch: writes per vks_stream_write_many */
    bool flows_fd;    /* --flows-fd: writes as ranges of a memfd of the corpus */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "stream_bench: %s: %s\n", what, msg);
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        die("out of memory", "lower --streams, --write or --large-write");
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return v[n / 2];
}

/* ---- rule sets ----------------------------------------------------------- */

struct ruleset {
    struct rule_src *v;
    size_t n, cap;
};

static void rs_add(struct ruleset *rs, enum rule_kind kind, char *pat, size_t len, uint32_t flags)
{
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? rs->cap * 2 : 256;
        rs->v = realloc(rs->v, rs->cap * sizeof(*rs->v));
        if (rs->v == NULL)
            die("out of memory", "fewer rules");
    }
    char *id = xmalloc(16);
    snprintf(id, 16, "r%zu", rs->n);
    rs->v[rs->n] = (struct rule_src){id, kind, pat, len, flags, (uint32_t)rs->n + 1};
    rs->n++;
}

static void rs_free(struct ruleset *rs)
{
    for (size_t i = 0; i < rs->n; i++) {
        free((void *)rs->v[i].id);
        free((void *)rs->v[i].pattern);
    }
    free(rs->v);
    memset(rs, 0, sizeof(*rs));
}

/* scan_bench's literals-N: N words of 8-16 letters, same seed. */
static void literal_rules(uint32_t n, struct ruleset *rs)
{
    uint64_t s = 0x1234567ull + n;
    for (uint32_t i = 0; i < n; i++) {
        size_t len;
        char *w = workload_word(&s, 8, 16, &len);
        if (w == NULL)
            die("out of memory", "fewer literals");
        rs_add(rs, RULE_LITERAL, w, len, 0);
    }
}

/* scan_bench's regex-N; `inst` (may be NULL) gets one string each rule
 * matches, as literals, for planting. */
static void regex_rules(uint32_t n, struct ruleset *rs, struct ruleset *inst)
{
    uint64_t s = workload_regex_seed(n);
    char one[64];
    for (uint32_t i = 0; i < n; i++) {
        char *pat = xmalloc(96);
        if (workload_regex(&s, i, pat, one) != 0)
            die("out of memory", "fewer regexes");
        rs_add(rs, RULE_REGEX, pat, strlen(pat), 0);
        if (inst != NULL)
            rs_add(inst, RULE_LITERAL, strdup(one), strlen(one), 0);
    }
}

static bool real_rules(const char *dir, const char *file, struct ruleset *rs)
{
    char path[1024], *text;
    size_t len;
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    if (workload_read_file(path, &text, &len) != 0)
        return false;
    struct patfile pf;
    struct vks_error err;
    if (patfile_parse(text, len, &pf, &err) < 0)
        die(file, err.msg);
    for (size_t i = 0; i < pf.n; i++) {
        char *pat = xmalloc(pf.rules[i].len + 1);
        memcpy(pat, pf.rules[i].pattern, pf.rules[i].len);
        pat[pf.rules[i].len] = '\0';
        rs_add(rs, pf.rules[i].kind, pat, pf.rules[i].len, pf.rules[i].flags);
    }
    patfile_finish(&pf);
    free(text);
    return true;
}

/* ---- both compilers, on the rules both accept --------------------------- */

/* Our catalog of the kept rules; rules we reject are dropped from `keep`. */
static struct catalog *our_build(const struct ruleset *rs, bool *keep)
{
    struct rule_src *v = xmalloc(rs->n * sizeof(*v));
    size_t m = 0;
    for (size_t i = 0; i < rs->n; i++)
        if (keep[i])
            v[m++] = rs->v[i];
    struct rules_result res = {0};
    struct vks_error err;
    if (rules_compile(v, m, NULL, &res, &err) < 0)
        die("rules_compile", err.msg);
    for (size_t i = 0, k = 0; i < rs->n; i++)
        if (keep[i] && res.rule_index[k++] == UINT32_MAX)
            keep[i] = false;
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    free(v);
    return cat;
}

struct built {
    struct catalog *cat;
    hs_database_t *db;
    bool *keep;
    size_t rules;
};

/* Both engines on the same rules: ours and Hyperscan's (in `hs_mode`). */
static void build_both(const struct ruleset *rs, unsigned hs_mode, struct built *b)
{
    b->keep = xmalloc(rs->n * sizeof(bool));
    for (size_t i = 0; i < rs->n; i++)
        b->keep[i] = true;
    b->cat = our_build(rs, b->keep);
    size_t ours = catalog_rule_count(b->cat);
    b->db = hsrules_build(rs->v, rs->n, b->keep, hs_mode, NULL);
    b->rules = 0;
    for (size_t i = 0; i < rs->n; i++)
        b->rules += b->keep[i];
    if (b->rules != ours) { /* Hyperscan dropped some: the same set for both */
        catalog_destroy(b->cat);
        b->cat = our_build(rs, b->keep);
    }
    /* the CPU engine's plan (a shadow compile may take seconds) is built
     * and cached before any timing, as a running daemon has it */
    struct cpuplan *plan = NULL;
    if (cpuplan_get(b->cat, &plan) != 0)
        die("cpuplan_get", "out of memory");
    cpuplan_put(plan);
}

static void built_finish(struct built *b)
{
    catalog_destroy(b->cat);
    hs_free_database(b->db);
    free(b->keep);
}

/* ---- corpus: scan_bench's literal text ------------------------------------ */

struct gen {
    uint8_t *p;
    uint64_t lo, hi, seed;
};

static void *gen_text(void *arg)
{
    struct gen *g = arg;
    uint64_t s = g->seed | 1;
    for (uint64_t i = g->lo; i < g->hi; i += 8) {
        uint64_t r = workload_next(&s);
        for (uint32_t k = 0; k < 8 && i + k < g->hi; k++, r >>= 8)
            g->p[i + k] = (uint8_t)((r & 0xff) % 27 == 26 ? ' ' : 'a' + (r & 0xff) % 27);
    }
    return NULL;
}

/* Random text with one of the rules planted every ~4 KiB (text made on up
 * to 64 threads, slices seeded alike whatever the count). */
static uint8_t *literal_corpus(const struct ruleset *rs, uint64_t size, uint32_t threads)
{
    uint8_t *p = xmalloc(size);
    enum { SLICES = 64 };
    struct gen g[SLICES];
    pthread_t th[SLICES];
    for (uint32_t base = 0; base < SLICES; base += threads) {
        uint32_t end = base + threads < SLICES ? base + threads : SLICES;
        for (uint32_t k = base; k < end; k++) {
            g[k] = (struct gen){p, size * k / SLICES, size * (k + 1) / SLICES,
                                0x9e3779b97f4a7c15ull * (k + 1)};
            pthread_create(&th[k], NULL, gen_text, &g[k]);
        }
        for (uint32_t k = base; k < end; k++)
            pthread_join(th[k], NULL);
    }
    uint64_t s = 0x5eed;
    for (uint64_t at = 0; at + 4096 <= size; at += 4096) {
        const struct rule_src *r = &rs->v[workload_next(&s) % rs->n];
        memcpy(p + at + workload_next(&s) % (4096 - r->len), r->pattern, r->len);
    }
    return p;
}

/* ---- state per stream ------------------------------------------------------ */

static void state_row(const char *name, const struct ruleset *rs)
{
    struct built b;
    build_both(rs, HS_MODE_STREAM, &b);
    size_t hs = 0;
    if (b.db != NULL && hs_stream_size(b.db, &hs) != HS_SUCCESS)
        die("hs_stream_size", name);
    uint32_t words = 0;
    for (uint32_t j = 0; j < catalog_nfa_count(b.cat); j++) {
        struct catalog_nfa g;
        catalog_nfa(b.cat, j, &g);
        words += g.n_words;
    }
    size_t ours = streamscan_size(b.cat);
    uint64_t lb = cpuscan_lookback(b.cat);
    char lbs[24] = "unbounded";
    if (lb != CPUSCAN_UNSEGMENTABLE)
        snprintf(lbs, sizeof(lbs), "%" PRIu64, lb);
    printf("%-20s %7zu %6u %6u %9u %9s %10zu %10zu %7.2f %s\n", name, b.rules,
           catalog_group_count(b.cat), catalog_nfa_count(b.cat), words, lbs, ours, hs,
           hs ? (double)ours / (double)hs : 0, hs && ours <= 4 * hs ? "yes" : "NO");
    built_finish(&b);
}

static void run_state(const struct opts *o)
{
    printf("state per stream (bytes): streamscan_size against hs_stream_size, same rules\n");
    printf("%-20s %7s %6s %6s %9s %9s %10s %10s %7s %s\n", "workload", "rules", "dfa", "nfa",
           "nfa words", "lookback", "vkscan", "hyperscan", "ratio", "<=4x");
    char name[64];
    uint32_t lits[] = {1000, 10000};
    for (size_t i = 0; i < 2; i++) {
        struct ruleset rs = {0};
        literal_rules(lits[i], &rs);
        snprintf(name, sizeof(name), "literals-%u", lits[i]);
        state_row(name, &rs);
        rs_free(&rs);
    }
    struct ruleset rs = {0};
    regex_rules(o->regexes, &rs, NULL);
    snprintf(name, sizeof(name), "regex-%u", o->regexes);
    state_row(name, &rs);
    rs_free(&rs);
    static const char *const real[][2] = {
        {"dict-15", "rebar/dict-15.rules"},
        {"dict-10", "rebar/dict-10.rules"},
        {"gitleaks-keywords", "gitleaks/gitleaks-keywords.rules"},
        {"gitleaks-regex", "gitleaks/gitleaks-regex.rules"},
    };
    for (size_t i = 0; i < sizeof(real) / sizeof(real[0]); i++) {
        if (!real_rules(o->data, real[i][1], &rs)) {
            printf("%-20s (not found under %s)\n", real[i][0], o->data);
            continue;
        }
        state_row(real[i][0], &rs);
        rs_free(&rs);
    }
}

/* ---- flows: many concurrent streams ---------------------------------------- */

struct flows {
    const struct opts *o;
    const struct built *b;
    const uint8_t *corpus; /* streams * write bytes */
    hs_scratch_t *proto;
    const uint8_t *fp; /* --socket: the catalog */
    int corpus_fd;     /* --flows-fd: a sealed memfd of the corpus */
    atomic_uint_fast64_t hits;
    uint32_t nt; /* the threads of this run: --threads, or --clients through vkscand */
    /* through vkscand: the threads' seconds (ns) in opens, writes, closes */
    atomic_uint_fast64_t open_ns, write_ns, close_ns;
};

enum { RUN_OURS, RUN_HS, RUN_BLOCK };

struct flow_thread {
    struct flows *f;
    uint32_t t;
    int run; /* RUN_* */
};

/* Write r of stream s: the corpus slice of stream (s + r) mod streams. */
static const uint8_t *slice(const struct flows *f, uint32_t s, uint32_t r)
{
    return f->corpus + (uint64_t)((s + r) % f->o->streams) * f->o->write;
}

static int count_hs(unsigned id, unsigned long long from, unsigned long long to, unsigned fl,
                    void *ctx)
{
    (void)id;
    (void)from;
    (void)to;
    (void)fl;
    (*(uint64_t *)ctx)++;
    return 0;
}

static uint64_t flows_ours(const struct flows *f, uint32_t t)
{
    const struct opts *o = f->o;
    uint32_t n = (o->streams - t + f->nt - 1) / f->nt;
    struct streamscan **v = xmalloc(n * sizeof(*v));
    for (uint32_t i = 0; i < n; i++)
        if (streamscan_create(f->b->cat, &v[i]) != 0)
            die("streamscan_create", "out of memory");
    struct scan_hits h = {0};
    uint64_t hits = 0;
    for (uint32_t r = 0; r < o->rounds; r++) {
        for (uint32_t i = 0; i < n; i++) {
            if (streamscan_write(v[i], slice(f, t + i * f->nt, r), o->write, &h) != 0)
                die("streamscan_write", "out of memory");
            hits += h.n;
            h.n = 0;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        if (streamscan_close(v[i], &h) != 0)
            die("streamscan_close", "out of memory");
        streamscan_destroy(v[i]);
    }
    hits += h.n;
    scan_hits_finish(&h);
    free(v);
    return hits;
}

static uint64_t flows_hs(const struct flows *f, uint32_t t)
{
    const struct opts *o = f->o;
    uint32_t n = (o->streams - t + f->nt - 1) / f->nt;
    hs_scratch_t *scr = NULL;
    if (hs_clone_scratch(f->proto, &scr) != HS_SUCCESS)
        die("hs_clone_scratch", "failed");
    hs_stream_t **v = xmalloc(n * sizeof(*v));
    for (uint32_t i = 0; i < n; i++)
        if (hs_open_stream(f->b->db, 0, &v[i]) != HS_SUCCESS)
            die("hs_open_stream", "failed");
    uint64_t hits = 0;
    for (uint32_t r = 0; r < o->rounds; r++)
        for (uint32_t i = 0; i < n; i++)
            hs_scan_stream(v[i], (const char *)slice(f, t + i * f->nt, r), (unsigned)o->write, 0,
                           scr, count_hs, &hits);
    for (uint32_t i = 0; i < n; i++)
        hs_close_stream(v[i], scr, count_hs, &hits);
    free(v);
    hs_free_scratch(scr);
    return hits;
}

/* Block mode on the same writes, each its own buffer (cpuscan_segment over
 * the whole write): what a stream write costs against a scan of its bytes.
 * Matches across writes are not found, so its hits are not compared. */
static uint64_t flows_block(const struct flows *f, uint32_t t)
{
    const struct opts *o = f->o;
    uint32_t n = (o->streams - t + f->nt - 1) / f->nt;
    struct cpuscan_scratch *scr;
    if (cpuscan_scratch_create(&scr) != 0)
        die("cpuscan_scratch_create", "out of memory");
    uint64_t hits = 0;
    for (uint32_t r = 0; r < o->rounds; r++) {
        for (uint32_t i = 0; i < n; i++) {
            struct cpuscan_part part = {0};
            if (cpuscan_segment(f->b->cat, slice(f, t + i * f->nt, r), o->write, 0, o->write,
                                SCAN_ALL, 0, NULL, NULL, scr, &part) != 0)
                die("cpuscan_segment", "out of memory");
            hits += part.hits.n;
            cpuscan_part_finish(&part);
        }
    }
    cpuscan_scratch_destroy(scr);
    return hits;
}

/* The matches a reply carries: its hits, each counting `count` (1 but in a
 * stream opened in count mode). */
static uint64_t result_hits(struct vks_scan_result *res)
{
    uint64_t n = 0;
    for (size_t i = 0; i < res->n_hits; i++)
        n += res->hits[i].count ? res->hits[i].count : 1;
    vks_scan_result_finish(res);
    return n;
}

/* Sends write r of the i-th stream of thread t (pipelined). */
static void daemon_send(const struct flows *f, struct vks_stream *s, uint32_t t, uint32_t i,
                        uint32_t r)
{
    const struct opts *o = f->o;
    const uint8_t *p = slice(f, t + i * f->nt, r);
    struct vks_error err;
    int rc = f->corpus_fd >= 0 ? vks_stream_write_fd_send(s, f->corpus_fd,
                                                          (uint64_t)(p - f->corpus), o->write, &err)
                               : vks_stream_write_send(s, p, o->write, &err);
    if (rc != 0)
        die("vks_stream_write_send", err.msg);
}

static uint64_t daemon_recv(struct vks_stream *s)
{
    struct vks_scan_result res;
    struct vks_error err;
    if (vks_stream_write_recv(s, &res, &err) != 0)
        die("vks_stream_write_recv", err.msg);
    return result_hits(&res);
}

/* One round of thread t's streams in vks_stream_write_many requests of up
 * to --batch writes. */
static uint64_t daemon_round_many(const struct flows *f, struct vks_stream **v, uint32_t n,
                                  uint32_t t, uint32_t r)
{
    const struct opts *o = f->o;
    struct vks_buffer *b = xmalloc(o->batch * sizeof(*b));
    uint64_t hits = 0;
    for (uint32_t i = 0; i < n; i += o->batch) {
        uint32_t k = n - i < o->batch ? n - i : o->batch;
        for (uint32_t j = 0; j < k; j++) {
            const uint8_t *p = slice(f, t + (i + j) * f->nt, r);
            b[j] = f->corpus_fd >= 0
                       ? (struct vks_buffer){.kind = VKS_BUFFER_FD,
                                             .fd = f->corpus_fd,
                                             .offset = (uint64_t)(p - f->corpus),
                                             .length = o->write}
                       : (struct vks_buffer){.kind = VKS_BUFFER_INLINE, .data = p, .len = o->write};
        }
        struct vks_scan_result res;
        struct vks_error err;
        if (vks_stream_write_many(v + i, b, k, &res, &err) != 0)
            die("vks_stream_write_many", err.msg);
        for (uint32_t j = 0; j < res.n_buffers; j++)
            if (res.buffers[j].code != 0)
                die("vks_stream_write_many", res.buffers[j].message);
        hits += result_hits(&res);
    }
    free(b);
    return hits;
}

/* The same streams through vkscand, one connection per thread, with up to
 * --window writes in flight: `ring` holds the streams of the writes in
 * flight in the order they were sent, which is also each stream's order. */
static uint64_t flows_daemon(const struct flows *f, uint32_t t)
{
    const struct opts *o = f->o;
    uint32_t n = (o->streams - t + f->nt - 1) / f->nt;
    struct vks_client *c;
    struct vks_error err;
    if (vks_client_connect(o->socket, NULL, &c, &err) != 0)
        die("vks_client_connect", err.msg);
    struct vks_stream **v = xmalloc(n * sizeof(*v));
    double t0 = now_s();
    for (uint32_t i = 0; i < n && o->batch > 1; i += o->batch) /* --batch: opens too */
        if (vks_stream_open_many(c, f->fp, n - i < o->batch ? n - i : o->batch, v + i, &err) != 0)
            die("vks_stream_open_many", err.msg);
    for (uint32_t i = 0; i < n && o->batch <= 1; i++)
        if (vks_stream_open(c, f->fp, NULL, &v[i], &err) != 0)
            die("vks_stream_open", err.msg);
    double t1 = now_s();
    uint32_t win = o->window, head = 0, used = 0;
    uint32_t *ring = xmalloc(win * sizeof(*ring));
    uint64_t hits = 0;
    for (uint32_t r = 0; r < o->rounds && o->batch > 1; r++)
        hits += daemon_round_many(f, v, n, t, r);
    for (uint32_t r = 0; r < o->rounds && o->batch <= 1; r++) {
        for (uint32_t i = 0; i < n; i++) {
            if (used == win) {
                hits += daemon_recv(v[ring[head]]);
                head = (head + 1) % win;
                used--;
            }
            daemon_send(f, v[i], t, i, r);
            ring[(head + used++) % win] = i;
        }
    }
    for (; used > 0; used--, head = (head + 1) % win)
        hits += daemon_recv(v[ring[head]]);
    double t2 = now_s();
    struct vks_scan_result res;
    for (uint32_t i = 0; i < n && o->batch > 1; i += o->batch) {
        if (vks_stream_close_many(v + i, n - i < o->batch ? n - i : o->batch, &res, &err) != 0)
            die("vks_stream_close_many", err.msg);
        hits += result_hits(&res);
    }
    for (uint32_t i = 0; i < n && o->batch <= 1; i++) {
        if (vks_stream_close(v[i], &res, &err) != 0)
            die("vks_stream_close", err.msg);
        hits += result_hits(&res);
    }
    double t3 = now_s();
    struct flows *fw = (struct flows *)f; /* the phase clocks are the one shared output */
    atomic_fetch_add(&fw->open_ns, (uint64_t)((t1 - t0) * 1e9));
    atomic_fetch_add(&fw->write_ns, (uint64_t)((t2 - t1) * 1e9));
    atomic_fetch_add(&fw->close_ns, (uint64_t)((t3 - t2) * 1e9));
    free(ring);
    free(v);
    vks_client_close(c);
    return hits;
}

static void *flow_main(void *arg)
{
    struct flow_thread *ft = arg;
    const struct flows *f = ft->f;
    uint64_t h = ft->run == RUN_HS      ? flows_hs(f, ft->t)
                 : ft->run == RUN_BLOCK ? flows_block(f, ft->t)
                 : f->fp != NULL        ? flows_daemon(f, ft->t)
                                        : flows_ours(f, ft->t);
    atomic_fetch_add(&ft->f->hits, h);
    return NULL;
}

/* Runs every stream once on --threads threads (through vkscand: --clients
 * connections, each its own thread); returns seconds. */
static double flows_once(struct flows *f, int run, uint64_t *hits)
{
    uint32_t n = run == RUN_OURS && f->fp != NULL ? f->o->clients : f->o->threads;
    f->nt = n;
    pthread_t *th = xmalloc(n * sizeof(*th));
    struct flow_thread *ft = xmalloc(n * sizeof(*ft));
    atomic_store(&f->hits, 0);
    double t0 = now_s();
    for (uint32_t t = 0; t < n; t++) {
        ft[t] = (struct flow_thread){f, t, run};
        pthread_create(&th[t], NULL, flow_main, &ft[t]);
    }
    for (uint32_t t = 0; t < n; t++)
        pthread_join(th[t], NULL);
    double dt = now_s() - t0;
    *hits = atomic_load(&f->hits);
    free(th);
    free(ft);
    return dt;
}

/* Loads the rules both engines kept into vkscand; returns the client. */
static struct vks_client *daemon_load(const struct opts *o, const struct ruleset *rs,
                                      const bool *keep, struct vks_catalog **cat)
{
    struct vks_client *c;
    struct vks_error err;
    if (vks_client_connect(o->socket, NULL, &c, &err) != 0)
        die("vks_client_connect", err.msg);
    struct vks_rule *v = xmalloc(rs->n * sizeof(*v));
    size_t m = 0;
    for (size_t i = 0; i < rs->n; i++) {
        const struct rule_src *r = &rs->v[i];
        if (keep[i])
            v[m++] = (struct vks_rule){r->id,
                                       r->kind == RULE_REGEX ? VKS_RULE_REGEX
                                       : r->kind == RULE_HEX ? VKS_RULE_HEX
                                                             : VKS_RULE_LITERAL,
                                       r->pattern, r->len, NULL};
    }
    if (vks_client_catalog_load(c, v, m, NULL, cat, &err) != 0)
        die("vks_client_catalog_load", err.msg);
    free(v);
    return c;
}

static void run_flows(const struct opts *o)
{
    struct ruleset rs = {0}, inst = {0};
    char name[32];
    if (o->flows_regex) {
        regex_rules(o->regexes, &rs, &inst);
        snprintf(name, sizeof(name), "regex-%u", o->regexes);
    } else {
        literal_rules(o->literals, &rs);
        snprintf(name, sizeof(name), "literals-%u", o->literals);
    }
    struct built b;
    build_both(&rs, HS_MODE_STREAM, &b);
    uint64_t bytes = (uint64_t)o->streams * o->write;
    struct flows f = {.o = o,
                      .b = &b,
                      .corpus = literal_corpus(o->flows_regex ? &inst : &rs, bytes, o->threads),
                      .corpus_fd = -1};
    if (o->socket != NULL && o->flows_fd) {
        f.corpus_fd = memfd_create("stream_bench-flows", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        for (uint64_t at = 0; f.corpus_fd >= 0 && at < bytes;) {
            ssize_t k = write(f.corpus_fd, f.corpus + at, bytes - at);
            if (k <= 0)
                die("write", "cannot fill the flows' memfd");
            at += (uint64_t)k;
        }
        if (f.corpus_fd < 0 || fcntl(f.corpus_fd, F_ADD_SEALS,
                                     F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
            die("memfd_create", strerror(errno));
    }
    struct vks_client *c = NULL;
    struct vks_catalog *vc = NULL;
    if (o->socket != NULL) {
        c = daemon_load(o, &rs, b.keep, &vc);
        f.fp = vks_catalog_fingerprint(vc);
    }
    if (!o->no_hs && hs_alloc_scratch(b.db, &f.proto) != HS_SUCCESS)
        die("hs_alloc_scratch", "failed");
    double *ours = xmalloc(o->iters * sizeof(double)), *hs = xmalloc(o->iters * sizeof(double));
    double *blk = xmalloc(o->iters * sizeof(double));
    uint64_t h_ours = 0, h_hs = 0, h_blk = 0;
    for (uint32_t it = 0; it < o->iters; it++) {
        ours[it] = flows_once(&f, RUN_OURS, &h_ours);
        blk[it] = flows_once(&f, RUN_BLOCK, &h_blk);
        hs[it] = o->no_hs ? 0 : flows_once(&f, RUN_HS, &h_hs);
    }
    double gb = (double)bytes * o->rounds / 1e9;
    double mo = gb / median(ours, o->iters), mh = o->no_hs ? 0 : gb / median(hs, o->iters);
    double mb = gb / median(blk, o->iters);
    printf("\nflows: %u streams x %u writes of %" PRIu64 " bytes, %s (%zu rules), "
           "%u threads, %s, median of %u\n",
           o->streams, o->rounds, o->write, name, b.rules, o->threads,
           o->socket ? "through vkscand" : "in process", o->iters);
    if (o->socket != NULL) {
        printf("through vkscand: %u connections (one thread each), %u writes %s per "
               "connection, %s\n",
               o->clients, o->batch > 1 ? o->batch : o->window,
               o->batch > 1 ? "per request" : "in flight",
               o->flows_fd ? "as ranges of a memfd" : "inline");
    }
    printf("%-8s %9s %9s %7s %9s %9s %12s %12s %s\n", "", "vkscanGB/s", "hsGB/s", "ratio",
           "blockGB/s", "vks/blk", "vkscan hits", "hs hits", "equal");
    printf("%-8s %9.4f %9.4f %7.3f %9.4f %9.3f %12" PRIu64 " %12" PRIu64 " %s\n", "flows", mo, mh,
           mh > 0 ? mo / mh : 0, mb, mo / mb, h_ours, h_hs,
           o->no_hs         ? "-"
           : h_ours == h_hs ? "yes"
                            : "NO");
    printf("block: the CPU engine's block scan of each write as its own buffer (cpuscan_segment, "
           "%" PRIu64 " hits: none across writes), in process\n",
           h_blk);
    if (o->socket != NULL) {
        double k = 1e-9 / ((double)o->iters * o->clients); /* mean seconds per thread and run */
        printf("through vkscand, per thread and run: opens %.3f s, writes %.3f s (%.2f GB/s "
               "over the writes alone), closes %.3f s\n",
               (double)atomic_load(&f.open_ns) * k, (double)atomic_load(&f.write_ns) * k,
               gb / ((double)atomic_load(&f.write_ns) * k), (double)atomic_load(&f.close_ns) * k);
    }
    free(ours);
    free(hs);
    free(blk);
    hs_free_scratch(f.proto);
    if (f.corpus_fd >= 0)
        close(f.corpus_fd);
    free((void *)f.corpus);
    vks_catalog_destroy(vc);
    vks_client_close(c);
    built_finish(&b);
    rs_free(&rs);
    rs_free(&inst);
}

/* ---- large: one stream from a file ----------------------------------------- */

/* Writes --large bytes of the literal corpus (a 64 MiB piece repeated) to
 * `path`. */
static void write_large(const char *path, const uint8_t *piece, uint64_t plen, uint64_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        die(path, strerror(errno));
    for (uint64_t done = 0; done < size;) {
        size_t want = size - done < plen ? (size_t)(size - done) : (size_t)plen;
        ssize_t n = write(fd, piece, want);
        if (n <= 0)
            die(path, n < 0 ? strerror(errno) : "short write");
        done += (uint64_t)n;
    }
    close(fd);
}

/* --only begin: what a batched write's begin costs a CPU engine thread in
 * user space, in process: streamscan_write_begin on --write bytes with a
 * middle of at least 16 KiB left to the caller, then streamscan_write_end
 * with no hits from the middle (vkscand's begin and loop end, no system
 * calls), against streamscan_write of the same bytes (the CPU route). One
 * thread, --streams streams of literals-N, --rounds writes each. */
static void run_begin(const struct opts *o)
{
    struct ruleset rs = {0};
    literal_rules(o->literals, &rs);
    struct built b;
    build_both(&rs, HS_MODE_STREAM, &b);
    uint64_t bytes = (uint64_t)o->streams * o->write;
    uint8_t *corpus = literal_corpus(&rs, bytes, o->threads);
    struct streamscan **v = xmalloc(o->streams * sizeof(*v));
    double t[3] = {0, 0, 0};
    uint64_t hits[3] = {0, 0, 0}, split = 0;
    for (int way = 0; way < 3; way++) {
        for (uint32_t i = 0; i < o->streams; i++)
            if (streamscan_create(b.cat, &v[i]) != 0)
                die("streamscan_create", "out of memory");
        double t0 = now_s();
        for (uint32_t r = 0; r < o->rounds; r++)
            for (uint32_t i = 0; i < o->streams; i++) {
                const uint8_t *p = corpus + (uint64_t)i * o->write;
                struct scan_hits h = {0};
                int rc;
                if (way == 0) {
                    struct streamscan_middle mid;
                    rc = streamscan_write_begin(v[i], p, o->write, 16384, &h, &mid);
                    split += mid.pending;
                    if (rc == 0)
                        rc = streamscan_write_end(v[i], &mid, &h);
                    streamscan_middle_finish(&mid);
                } else if (way == 2) { /* the end alone, with its middle's hits */
                    struct streamscan_middle mid;
                    double u = now_s();
                    rc = streamscan_write_begin(v[i], p, o->write, 16384, &h, &mid);
                    if (rc == 0 && mid.pending)
                        rc = streamscan_middle_run(v[i], p, o->write, &mid);
                    t0 += now_s() - u; /* not counted */
                    if (rc == 0)
                        rc = streamscan_write_end(v[i], &mid, &h);
                    streamscan_middle_finish(&mid);
                } else {
                    rc = streamscan_write(v[i], p, o->write, &h);
                }
                if (rc != 0)
                    die("streamscan", "a write failed");
                hits[way] += h.n;
                scan_hits_finish(&h);
            }
        t[way] = now_s() - t0;
        for (uint32_t i = 0; i < o->streams; i++)
            streamscan_destroy(v[i]);
    }
    uint64_t n = (uint64_t)o->streams * o->rounds;
    printf("begin: %u streams x %u writes of %zu bytes, %s, one thread\n", o->streams, o->rounds,
           (size_t)o->write, o->flows_regex ? "regex" : "literals");
    printf("  begin+end %.2f us a write (%llu of %llu split, %llu hits: head and tail only); "
           "whole write %.2f us (%llu hits)\n",
           t[0] * 1e6 / (double)n, (unsigned long long)split, (unsigned long long)n,
           (unsigned long long)hits[0], t[1] * 1e6 / (double)n, (unsigned long long)hits[1]);
    printf("  end with the middle's hits (as a batch gives them): %.2f us a write, %.1f ns a hit "
           "(%llu hits)\n",
           t[2] * 1e6 / (double)n, hits[2] ? t[2] * 1e9 / (double)hits[2] : 0.0,
           (unsigned long long)hits[2]);
    free(v);
    free(corpus);
    built_finish(&b);
    rs_free(&rs);
}

/* One stream over the file in writes of --large-write (in process or
 * through vkscand), or Hyperscan's stream mode over the same writes. */
static uint64_t large_stream(const struct opts *o, const struct built *b, int fd,
                             const uint8_t *map, uint64_t size, int engine, const uint8_t *fp,
                             hs_scratch_t *scr)
{
    uint8_t *buf = xmalloc(o->large_write);
    struct streamscan *s = NULL;
    hs_stream_t *hst = NULL;
    struct vks_client *c = NULL;
    struct vks_stream *vs = NULL;
    struct vks_error err;
    struct vks_scan_result res;
    struct vks_stream_options so;
    vks_stream_options_init(&so);
    so.mode = o->stream_count ? VKS_REPORT_COUNT : VKS_REPORT_ALL; /* --stream-count */
    if (engine == 0 && streamscan_create(b->cat, &s) != 0)
        die("streamscan_create", "out of memory");
    if (engine == 1 && hs_open_stream(b->db, 0, &hst) != HS_SUCCESS)
        die("hs_open_stream", "failed");
    if (engine == 2 && (vks_client_connect(o->socket, NULL, &c, &err) != 0 ||
                        vks_stream_open(c, fp, &so, &vs, &err) != 0))
        die("vkscand", err.msg);
    struct scan_hits h = {0};
    uint64_t hits = 0;
    uint32_t in_flight = 0; /* engine 2: pipelined writes (--window) */
    for (uint64_t at = 0; at < size; at += o->large_write) {
        size_t want = size - at < o->large_write ? (size_t)(size - at) : (size_t)o->large_write;
        if (engine == 2) { /* the daemon reads the range itself */
            if (in_flight == o->window) {
                if (vks_stream_write_recv(vs, &res, &err) != 0)
                    die("vks_stream_write_recv", err.msg);
                hits += result_hits(&res);
                in_flight--;
            }
            if (vks_stream_write_fd_send(vs, fd, at, want, &err) != 0)
                die("vks_stream_write_fd_send", err.msg);
            in_flight++;
            continue;
        }
        /* in process, both engines read the file's mapped pages, as block
         * mode does (a copy per write would cost as much as the scan) */
        const uint8_t *at_p = map + at;
        if (map == NULL) {
            if (pread(fd, buf, want, (off_t)at) != (ssize_t)want)
                die("pread", "short read of the large file");
            at_p = buf;
        }
        if (engine == 1) {
            hs_scan_stream(hst, (const char *)at_p, (unsigned)want, 0, scr, count_hs, &hits);
            continue;
        }
        if (streamscan_write(s, at_p, want, &h) != 0)
            die("streamscan_write", "out of memory");
        hits += h.n;
        h.n = 0;
    }
    if (engine == 0 && streamscan_close(s, &h) != 0)
        die("streamscan_close", "out of memory");
    if (engine == 1)
        hs_close_stream(hst, scr, count_hs, &hits);
    for (; engine == 2 && in_flight > 0; in_flight--) {
        if (vks_stream_write_recv(vs, &res, &err) != 0)
            die("vks_stream_write_recv", err.msg);
        hits += result_hits(&res);
    }
    if (engine == 2) {
        if (vks_stream_close(vs, &res, &err) != 0)
            die("vks_stream_close", err.msg);
        hits += result_hits(&res);
        vks_client_close(c);
    }
    hits += h.n;
    scan_hits_finish(&h);
    streamscan_destroy(s);
    free(buf);
    return hits;
}

/* Block mode over the mapped file: segments of a quarter of each thread's
 * share (1 to 64 MiB) on --threads threads (cpuscan_segment, each walking
 * from its lookback). */
struct block {
    const struct catalog *cat;
    const uint8_t *p;
    uint64_t size, seg;
    atomic_uint_fast64_t next, hits;
};

static void *block_main(void *arg)
{
    struct block *bl = arg;
    struct cpuscan_scratch *scr;
    if (cpuscan_scratch_create(&scr) != 0)
        die("cpuscan_scratch_create", "out of memory");
    uint64_t hits = 0;
    for (;;) {
        uint64_t lo = atomic_fetch_add(&bl->next, bl->seg);
        if (lo >= bl->size)
            break;
        uint64_t hi = lo + bl->seg < bl->size ? lo + bl->seg : bl->size;
        struct cpuscan_part part = {0};
        if (cpuscan_segment(bl->cat, bl->p, bl->size, lo, hi, SCAN_ALL, 0, NULL, NULL, scr,
                            &part) != 0)
            die("cpuscan_segment", "out of memory");
        hits += part.hits.n;
        cpuscan_part_finish(&part);
    }
    atomic_fetch_add(&bl->hits, hits);
    cpuscan_scratch_destroy(scr);
    return NULL;
}

static double large_block(const struct opts *o, const struct catalog *cat, const uint8_t *p,
                          uint64_t size, uint64_t *hits)
{
    uint64_t seg = size / (4 * (uint64_t)o->threads); /* every thread busy, small tails */
    seg = seg < (1u << 20) ? (1u << 20) : seg > (64u << 20) ? (64u << 20) : seg;
    struct block bl = {.cat = cat, .p = p, .size = size, .seg = seg};
    if (cpuscan_lookback(cat) == CPUSCAN_UNSEGMENTABLE)
        bl.seg = size;
    atomic_init(&bl.next, 0);
    atomic_init(&bl.hits, 0);
    pthread_t *th = xmalloc(o->threads * sizeof(*th));
    double t0 = now_s();
    for (uint32_t t = 0; t < o->threads; t++)
        pthread_create(&th[t], NULL, block_main, &bl);
    for (uint32_t t = 0; t < o->threads; t++)
        pthread_join(th[t], NULL);
    double dt = now_s() - t0;
    free(th);
    *hits = atomic_load(&bl.hits);
    return dt;
}

/* Block mode through vkscand: the file as fd buffers of up to 1 GiB in
 * one request (max-scan-bytes' default), the CPU engine's or GPU's, hits
 * counted per rule (report mode count). */
static double large_block_daemon(const struct opts *o, const uint8_t *fp, int fd, uint64_t size,
                                 uint64_t *hits)
{
    struct vks_client *c;
    struct vks_error err;
    if (vks_client_connect(o->socket, NULL, &c, &err) != 0)
        die("vks_client_connect", err.msg);
    uint64_t piece = 1ull << 30;
    size_t n = (size_t)((size + piece - 1) / piece);
    struct vks_buffer *v = xmalloc(n * sizeof(*v));
    for (size_t i = 0; i < n; i++) {
        uint64_t at = i * piece;
        v[i] = (struct vks_buffer){.kind = VKS_BUFFER_FD,
                                   .fd = fd,
                                   .offset = at,
                                   .length = size - at < piece ? size - at : piece};
    }
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.no_cache = true;
    so.mode = VKS_REPORT_COUNT; /* one entry per (buffer, rule): no max-hits cut */
    struct vks_scan_result res;
    double t0 = now_s();
    if (vks_client_scan(c, fp, v, n, &so, &res, &err) != 0)
        die("vks_client_scan", err.msg);
    double dt = now_s() - t0;
    *hits = 0;
    for (size_t i = 0; i < res.n_hits; i++)
        *hits += res.hits[i].count;
    vks_scan_result_finish(&res);
    free(v);
    vks_client_close(c);
    return dt;
}

static void run_large(const struct opts *o)
{
    struct ruleset rs = {0}, inst = {0};
    char name[32];
    if (o->flows_regex) {
        regex_rules(o->regexes, &rs, &inst);
        snprintf(name, sizeof(name), "regex-%u", o->regexes);
    } else {
        literal_rules(o->literals, &rs);
        snprintf(name, sizeof(name), "literals-%u", o->literals);
    }
    streamscan_set_threads(o->stream_threads ? o->stream_threads : o->threads, o->piece);
    struct built b;
    build_both(&rs, HS_MODE_STREAM, &b);
    char tmp[64] = "";
    const char *path = o->file;
    struct stat sb;
    if (path == NULL || stat(path, &sb) != 0 || (uint64_t)sb.st_size < o->large) {
        if (path == NULL) {
            snprintf(tmp, sizeof(tmp), "/tmp/stream_bench.%d", (int)getpid());
            path = tmp;
        }
        uint64_t plen = o->large < (64u << 20) ? o->large : (64u << 20);
        uint8_t *piece = literal_corpus(o->flows_regex ? &inst : &rs, plen, o->threads);
        write_large(path, piece, plen, o->large);
        free(piece);
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        die(path, strerror(errno));
    uint8_t *map = mmap(NULL, o->large, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        die("mmap", strerror(errno));
    struct vks_client *c = NULL;
    struct vks_catalog *vc = NULL;
    if (o->socket != NULL)
        c = daemon_load(o, &rs, b.keep, &vc);
    const uint8_t *fp = vc ? vks_catalog_fingerprint(vc) : NULL;
    hs_scratch_t *scr = NULL;
    if (!o->no_hs && hs_alloc_scratch(b.db, &scr) != HS_SUCCESS)
        die("hs_alloc_scratch", "failed");
    double *ts = xmalloc(o->iters * sizeof(double)), *tb = xmalloc(o->iters * sizeof(double));
    double *th = xmalloc(o->iters * sizeof(double));
    uint64_t hs_s = 0, hb = 0, hh = 0;
    for (uint32_t it = 0; it < o->iters; it++) {
        double t0 = now_s();
        hs_s = large_stream(o, &b, fd, map, o->large, o->socket ? 2 : 0, fp, NULL);
        ts[it] = now_s() - t0;
        tb[it] = o->no_block ? 1e-9
                 : o->socket ? large_block_daemon(o, fp, fd, o->large, &hb)
                             : large_block(o, b.cat, map, o->large, &hb);
        t0 = now_s();
        hh = o->no_hs ? 0 : large_stream(o, &b, fd, map, o->large, 1, NULL, scr);
        th[it] = o->no_hs ? 0 : now_s() - t0;
        printf("large iteration %u: stream %.3f s, block %.3f s, hyperscan %.3f s\n", it + 1,
               ts[it], o->no_block ? 0.0 : tb[it], th[it]);
    }
    double gb = (double)o->large / 1e9;
    double s = gb / median(ts, o->iters), bk = gb / median(tb, o->iters);
    double h = o->no_hs ? 0 : gb / median(th, o->iters);
    printf("\nlarge: one stream of %" PRIu64 " bytes from %s in writes of %" PRIu64
           ", %s (%zu rules), %s, stream pieces on %u threads, median of %u\n",
           o->large, path, o->large_write, name, b.rules,
           o->socket ? "through vkscand" : "in process",
           o->stream_threads ? o->stream_threads : o->threads, o->iters);
    printf("%-22s %9s %9s %9s %9s %12s %12s %12s\n", "", "streamGB/s", "blockGB/s", "stream/blk",
           "hsGB/s", "stream hits", "block hits", "hs hits");
    printf("%-22s %9.4f %9.4f %9.3f %9.4f %12" PRIu64 " %12" PRIu64 " %12" PRIu64 "\n", "large", s,
           bk, s / bk, h, hs_s, hb, hh);
    printf("block mode: %s on %u threads; stream and block hits %s\n",
           o->socket ? "vkscand scan of 1 GiB fd buffers" : "cpuscan segments of 1-64 MiB",
           o->threads, hs_s == hb ? "equal" : "DIFFER");
    free(ts);
    free(tb);
    free(th);
    hs_free_scratch(scr);
    munmap(map, o->large);
    close(fd);
    if (tmp[0])
        unlink(tmp);
    vks_catalog_destroy(vc);
    vks_client_close(c);
    built_finish(&b);
    rs_free(&rs);
    rs_free(&inst);
}

/* ---- main ------------------------------------------------------------------- */

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    double m = *end == 'k' || *end == 'K'   ? 1024.0
               : *end == 'm' || *end == 'M' ? 1048576.0
               : *end == 'g' || *end == 'G' ? 1073741824.0
                                            : 1.0;
    return (uint64_t)(v * m);
}

static bool wanted(const struct opts *o, const char *name)
{
    return o->only == NULL || strstr(o->only, name) != NULL;
}

static void usage(void)
{
    fprintf(
        stderr,
        "usage: stream_bench [--threads T] [--iters N] [--only state,flows,large,begin]\n"
        "                    [--streams N] [--write BYTES] [--rounds R] [--literals N]\n"
        "                    [--large BYTES] [--large-write BYTES] [--file PATH]\n"
        "                    [--regexes N] [--data DIR] [--socket PATH] [--no-hs] [--no-block]\n"
        "                    [--stream-count]\n"
        "                    [--flows-set literals|regex] [--stream-threads T]\n"
        "                    [--piece BYTES] [--fast-min BYTES] [--window N]\n"
        "                    [--flows-fd] [--batch N] [--clients N]\n");
    exit(2);
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.threads = 16,
                       .iters = 3,
                       .streams = 10000,
                       .rounds = 4,
                       .literals = 10000,
                       .regexes = 500,
                       .write = 64u << 10,
                       .large = 1ull << 30,
                       .large_write = 1u << 20,
                       .data = "../shared/data",
                       .fast_min = UINT64_MAX,
                       .window = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--no-hs") == 0 || strcmp(a, "--flows-fd") == 0 ||
            strcmp(a, "--no-block") == 0 || strcmp(a, "--stream-count") == 0) {
            if (strcmp(a, "--no-hs") == 0)
                o->no_hs = true;
            else if (strcmp(a, "--no-block") == 0)
                o->no_block = true;
            else if (strcmp(a, "--stream-count") == 0)
                o->stream_count = true;
            else
                o->flows_fd = true;
            continue;
        }
        if (v == NULL)
            usage();
        i++;
        if (strcmp(a, "--threads") == 0)
            o->threads = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--clients") == 0)
            o->clients = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--iters") == 0)
            o->iters = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--streams") == 0)
            o->streams = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--rounds") == 0)
            o->rounds = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--literals") == 0)
            o->literals = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--regexes") == 0)
            o->regexes = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--write") == 0)
            o->write = parse_size(v);
        else if (strcmp(a, "--large") == 0)
            o->large = parse_size(v);
        else if (strcmp(a, "--large-write") == 0)
            o->large_write = parse_size(v);
        else if (strcmp(a, "--stream-threads") == 0)
            o->stream_threads = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--piece") == 0)
            o->piece = parse_size(v);
        else if (strcmp(a, "--batch") == 0)
            o->batch = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--window") == 0)
            o->window = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--fast-min") == 0)
            o->fast_min = parse_size(v);
        else if (strcmp(a, "--file") == 0)
            o->file = v;
        else if (strcmp(a, "--data") == 0)
            o->data = v;
        else if (strcmp(a, "--socket") == 0)
            o->socket = v;
        else if (strcmp(a, "--only") == 0)
            o->only = v;
        else if (strcmp(a, "--flows-set") == 0 && strcmp(v, "regex") == 0)
            o->flows_regex = true;
        else if (strcmp(a, "--flows-set") == 0 && strcmp(v, "literals") == 0)
            o->flows_regex = false;
        else
            usage();
    }
    if (o->clients == 0)
        o->clients = o->threads;
    if (o->threads == 0 || o->threads > o->streams || o->clients > o->streams || o->iters == 0 ||
        o->rounds == 0 || o->write < 4096 || o->write > UINT32_MAX || o->large < 4096 ||
        o->large_write == 0 || o->large_write > UINT32_MAX || o->literals == 0 || o->regexes == 0 ||
        o->window == 0 || (o->batch > 1 && o->window > 1))
        usage();
}

int main(int argc, char **argv)
{
    struct opts o;
    parse_opts(argc, argv, &o);
    streamscan_tune(o.fast_min >= SIZE_MAX ? SIZE_MAX : (size_t)o.fast_min);
    printf("Hyperscan %s; %u threads\n", hs_version(), o.threads);
    if (wanted(&o, "state"))
        run_state(&o);
    if (wanted(&o, "flows"))
        run_flows(&o);
    if (wanted(&o, "large"))
        run_large(&o);
    if (o.only != NULL && strstr(o.only, "begin") != NULL) /* not with the default set */
        run_begin(&o);
    return 0;
}
