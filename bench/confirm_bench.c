/*
 * confirm_bench: the host's share of forward confirmation on adversarial
 * data (docs/engine.md "Forward confirmation"). Gated unbounded rules are
 * walked forward from their factors' ends; data that keeps such a walk
 * alive (a factor, then megabytes of what the rule's loop takes) makes the
 * walk as long as the buffer. The GPU leaves every walk alive at its cap
 * to the host (gpu/batch.c confirm_finish), the CPU engine and streams walk
 * it themselves (refscan_gated_range), so the host walk's speed bounds
 * what one such request costs the engine thread.
 *
 *   confirm_bench [--shape NAME|all] [--layout one|many|mixed] [--size BYTES]
 *                 [--buffers N] [--every BYTES] [--cap BYTES] [--gpu 0|1]
 *                 [--check 0|1] [--reps N] [--threads N]
 *
 * Shapes (rule; the run that keeps it alive), every rule forced to the
 * bit-NFA so that it is gated and confirmed forward:
 *   tok   (?i)token[[:alnum:]]{8,}_end;  TOKEN then [[:alnum:]]
 *   ws    secret\s*=\s*[a-z0-9]+;         secret then spaces and tabs
 *   dot   (?i)apikey.*#!;                 ApiKey then newline-free text
 *   pem   (?s)-----BEGIN[ A-Z]{0,20}PRIVATE KEY-----[\s\S-]{64,}?KEY-----;
 *         a PEM header then base64 lines
 *   all   the four rules in one catalog, each buffer one shape's data
 * Layouts: one factor near each buffer's start and the run to its end
 * (one), a factor every --every bytes with the run between (many), or
 * buffer i of `one` when i is even and `many` when odd (mixed).
 *
 * Prints per shape: the host walk (refscan_factor_ends, then
 * refscan_gated_range per gated group, the CPU engine's way) in MB/s, and
 * with --gpu 1 a batch on the device with gpu_options.confirm_cap = --cap:
 * its wall time, confirm_host (walks the host finished) and
 * confirm_host_ns. --check 1 compares the batch's hits with refscan.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu.h"
#include "refscan.h"
#include "rules.h"

struct shape {
    const char *name, *rule, *factor;
    const char *run;  /* bytes the run draws from */
    const char *tail; /* ends a live walk: put 16 bytes before each buffer's end */
};

static const struct shape shapes[] = {
    {"tok", "(?i)token[[:alnum:]]{8,}_end", "TOKEN",
     "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", "_end"},
    {"ws", "secret\\s*=\\s*[a-z0-9]+", "secret", " \t  ", "=x1"},
    {"dot", "(?i)apikey.*#!", "ApiKey", "the quick brown fox jumps over a lazy dog 0123456789,.;",
     "#!"},
    {"pem", "(?s)-----BEGIN[ A-Z]{0,20}PRIVATE KEY-----[\\s\\S-]{64,}?KEY-----",
     "-----BEGIN RSA PRIVATE KEY-----\n",
     "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", "KEY-----"},
};
enum { N_SHAPES = sizeof(shapes) / sizeof(shapes[0]) };

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One buffer of shape s: the run everywhere (base64 in lines of 64 for
 * pem), a factor at 100 (layout one) or every `every` bytes (many), and
 * the shape's tail near the end, so that the walks alive there match. */
static uint8_t *make_buffer(const struct shape *s, size_t len, bool many, size_t every)
{
    uint8_t *d = malloc(len);
    if (d == NULL)
        return NULL;
    size_t nr = strlen(s->run), nf = strlen(s->factor);
    bool pem = strcmp(s->name, "pem") == 0;
    for (size_t i = 0; i < len; i++)
        d[i] = pem && i % 65 == 64 ? '\n' : (uint8_t)s->run[rnd((uint32_t)nr)];
    size_t step = many ? every : len;
    for (size_t p = 100; p + nf < len; p += step)
        memcpy(d + p, s->factor, nf);
    memcpy(d + len - 16, s->tail, strlen(s->tail));
    return d;
}

static struct catalog *compile(const struct shape *const *sh, size_t n)
{
    struct rule_src src[N_SHAPES];
    for (size_t i = 0; i < n; i++)
        src[i] = (struct rule_src){sh[i]->name,         RULE_REGEX, sh[i]->rule,
                                   strlen(sh[i]->rule), 0,          (uint32_t)i + 1};
    struct rules_options ro = {.force_bitnfa = true};
    struct rules_result res = {0};
    struct vks_error err = {0};
    if (rules_compile(src, n, &ro, &res, &err) != 0 || res.n_rejects > 0) {
        fprintf(stderr, "confirm_bench: compile: %s %s\n", err.msg,
                res.n_rejects ? res.rejects[0].msg : "");
        rules_result_finish(&res);
        return NULL;
    }
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    return cat;
}

static int count_hit(void *ctx, uint32_t rule, uint64_t end)
{
    (void)rule;
    (void)end;
    ++*(uint64_t *)ctx;
    return 0;
}

/* The CPU engine's walk of every gated group over each buffer; returns
 * the seconds it took and counts the raw hits. */
static double host_walk(const struct catalog *cat, const struct gpu_buffer *b, uint32_t n,
                        uint64_t *hits)
{
    double t0 = now_s();
    for (uint32_t i = 0; i < n; i++) {
        struct refscan_gate gate = {0};
        if (refscan_factor_ends(cat, b[i].data, b[i].len, 0, b[i].len, &gate) != 0)
            abort();
        for (uint32_t k = 0; k < catalog_nfa_count(cat); k++)
            if (refscan_gated_range(cat, k, b[i].data, b[i].len, 0, b[i].len, &gate, count_hit,
                                    hits) != 0)
                abort();
        refscan_gate_finish(&gate);
    }
    return now_s() - t0;
}

/* The batch's hits equal refscan_buffer's, buffer by buffer. */
static bool check(const struct catalog *cat, const struct gpu_buffer *b, uint32_t n,
                  const struct gpu_result *res)
{
    size_t at = 0;
    bool ok = true;
    for (uint32_t i = 0; i < n && ok; i++) {
        struct scan_hits want = {0};
        if (refscan_buffer(cat, b[i].data, b[i].len, b[i].mode, &want) != 0)
            abort();
        for (size_t k = 0; k < want.n && ok; k++, at++)
            ok = at < res->n_hits && res->hits[at].buffer == i &&
                 res->hits[at].rule == want.v[k].rule && res->hits[at].end == want.v[k].end &&
                 res->hits[at].count == want.v[k].count;
        ok = ok && (at == res->n_hits || res->hits[at].buffer != i);
        free(want.v);
    }
    return ok && at == res->n_hits;
}

struct opts {
    const char *shape, *layout;
    size_t size, every;
    uint32_t buffers, cap, reps, threads;
    bool gpu, check;
};

static int run_gpu(const struct opts *o, const struct catalog *cat, const struct gpu_buffer *b,
                   uint32_t n, const char *name, double mb)
{
    struct gpu_options go = {.confirm_cap = o->cap, .upload_threads = o->threads};
    struct gpu_engine *eng = NULL;
    struct vks_error err = {0};
    if (gpu_engine_create(&go, &eng, &err) != 0) {
        fprintf(stderr, "confirm_bench: gpu_engine_create: %s\n", err.msg);
        return 1;
    }
    const struct catalog *cats[1] = {cat};
    struct gpu_batch batch = {cats, 1, b, n};
    int bad = 0;
    for (uint32_t r = 0; r < o->reps && bad == 0; r++) {
        struct gpu_result res = {0};
        if (gpu_batch_dispatch(eng, &batch, &res, &err) != 0) {
            fprintf(stderr, "confirm_bench: gpu_batch_dispatch: %s\n", err.msg);
            bad = 1;
            break;
        }
        const struct gpu_telemetry *t = &res.tel;
        printf("%-4s gpu  %7.1f MB  wall %8.1f ms  readback %8.1f ms  confirm_host %6llu  "
               "confirm_host_ns %8.1f ms (%.0f MB/s)  hits %zu",
               name, mb, t->wall_ns / 1e6, t->readback_ns / 1e6,
               (unsigned long long)t->confirm_host, t->confirm_host_ns / 1e6,
               t->confirm_host_ns ? mb / (t->confirm_host_ns / 1e9) : 0.0, res.n_hits);
        if (o->check && r == 0) {
            bool ok = check(cat, b, n, &res);
            printf("  check %s", ok ? "ok" : "FAILED");
            bad = !ok;
        }
        printf("\n");
        gpu_result_finish(&res);
    }
    gpu_engine_destroy(eng);
    return bad;
}

static int run_shape(const struct opts *o, const struct shape *const *sh, size_t n_sh,
                     const char *name)
{
    struct catalog *cat = compile(sh, n_sh);
    if (cat == NULL)
        return 1;
    struct gpu_buffer *b = calloc(o->buffers, sizeof(*b));
    double mb = 0;
    for (uint32_t i = 0; b != NULL && i < o->buffers; i++) {
        bool many = strcmp(o->layout, "many") == 0 || (strcmp(o->layout, "mixed") == 0 && i % 2);
        b[i] = (struct gpu_buffer){.data = make_buffer(sh[i % n_sh], o->size, many, o->every),
                                   .len = o->size};
        if (b[i].data == NULL)
            abort();
        mb += o->size / 1e6;
    }
    int rc = 0;
    for (uint32_t r = 0; r < o->reps; r++) {
        uint64_t hits = 0;
        double s = host_walk(cat, b, o->buffers, &hits);
        printf("%-4s host %7.1f MB  %8.1f ms  %8.1f MB/s  raw hits %llu\n", name, mb, s * 1e3,
               mb / s, (unsigned long long)hits);
    }
    if (o->gpu)
        rc = run_gpu(o, cat, b, o->buffers, name, mb);
    for (uint32_t i = 0; b != NULL && i < o->buffers; i++)
        free((void *)b[i].data);
    free(b);
    catalog_destroy(cat);
    return rc;
}

static size_t parse_size(const char *v)
{
    char *end;
    double x = strtod(v, &end);
    switch (*end) {
    case 'k':
    case 'K':
        x *= 1024;
        break;
    case 'm':
    case 'M':
        x *= 1024 * 1024;
        break;
    case 'g':
    case 'G':
        x *= 1024.0 * 1024 * 1024;
        break;
    default:
        break;
    }
    return (size_t)x;
}

int main(int argc, char **argv)
{
    struct opts o = {"all", "one", 4 << 20, 4096, 4, 4096, 1, 0, false, false};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--shape") == 0)
            o.shape = v;
        else if (strcmp(k, "--layout") == 0)
            o.layout = v;
        else if (strcmp(k, "--size") == 0)
            o.size = parse_size(v);
        else if (strcmp(k, "--every") == 0)
            o.every = parse_size(v);
        else if (strcmp(k, "--buffers") == 0)
            o.buffers = (uint32_t)atoi(v);
        else if (strcmp(k, "--cap") == 0)
            o.cap = (uint32_t)parse_size(v);
        else if (strcmp(k, "--reps") == 0)
            o.reps = (uint32_t)atoi(v);
        else if (strcmp(k, "--threads") == 0)
            o.threads = (uint32_t)atoi(v);
        else if (strcmp(k, "--gpu") == 0)
            o.gpu = atoi(v) != 0;
        else if (strcmp(k, "--check") == 0)
            o.check = atoi(v) != 0;
        else {
            fprintf(stderr,
                    "confirm_bench: unknown option %s (see the comment at the top of "
                    "bench/confirm_bench.c)\n",
                    k);
            return 2;
        }
    }
    if (o.buffers == 0 || o.size < 256 || o.every < 64 || o.reps == 0) {
        fprintf(stderr, "confirm_bench: --buffers and --reps at least 1, --size at least 256, "
                        "--every at least 64\n");
        return 2;
    }
    const struct shape *all[N_SHAPES];
    for (size_t i = 0; i < N_SHAPES; i++)
        all[i] = &shapes[i];
    int rc = 0;
    for (size_t i = 0; i < N_SHAPES && rc == 0; i++)
        if (strcmp(o.shape, shapes[i].name) == 0)
            return run_shape(&o, &all[i], 1, shapes[i].name);
    if (strcmp(o.shape, "all") != 0) {
        fprintf(stderr, "confirm_bench: unknown shape %s: tok, ws, dot, pem or all\n", o.shape);
        return 2;
    }
    return run_shape(&o, all, N_SHAPES, "all");
}
