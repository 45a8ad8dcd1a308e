/*
 * rpc_bench: vkscand round trips through libvkscan.
 *
 *   rpc_bench --socket PATH [--seconds S] [--clients 1,8,64] [--big-mib 64]
 *             [--workloads small,large] [--inputs inline,memfd] [--cache] [--json]
 *
 * For each client count and each transport (inline bytes, memfd passed with
 * SCM_RIGHTS) it runs two workloads for S seconds each, every client on its
 * own thread and connection, all on one catalog of 1,000 random literals:
 *   small: 4 KiB scans, reported as round-trip latency p50 / p99 and requests/s;
 *   large: 64 MiB scans, reported as aggregate GB/s.
 * Each line also gives the means of the daemon's own telemetry per request
 * (docs/daemon.md): receipt to reply, queue wait, descriptor reading, plan,
 * upload, device run, readback, the batch on the engine thread (scan_us),
 * how long that thread had waited for work before it (wait_us, GPU
 * engines), the batch buffers made for it (made_us, GPU engines), and how
 * many requests shared a batch, so the
 * client's round trip can be split into transport and daemon time.
 * Every scan bypasses the daemon's result cache (`cache: false`), because
 * the clients send the same bytes again and again: a sealed memfd seen
 * before would be answered from the cache without scanning. `--cache`
 * measures the cached path instead.
 * Start the daemon first, with a frame limit that fits a 64 MiB inline buffer:
 *   build-release/daemon/vkscand --socket /tmp/v.sock --state-dir /tmp/vs --max-frame 80M
 * Numbers count only from the H200 (docs/PERFORMANCE.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "vkscan/vkscan.h"

#define N_LITERALS 1000

struct opts {
    const char *socket;
    double seconds;
    int clients[8];
    int n_clients;
    size_t big;
    int json;
    int small, large; /* workloads to run */
    int inputs;       /* bit 0: inline, bit 1: memfd */
    int cache;        /* let the daemon answer from its result cache */
};

/* Telemetry keys summed per run; their means are reported. */
static const char *const tel_keys[] = {
    "total_ns",    "queue_ns", "fd_read_ns",     "plan_ns",         "upload_ns",     "run_ns",
    "readback_ns", "scan_ns",  "worker_wait_ns", "buffers_made_ns", "batch_requests"};
#define N_TEL (sizeof(tel_keys) / sizeof(tel_keys[0]))

struct job {
    const struct opts *o;
    const uint8_t *fp;
    const uint8_t *data;
    size_t len;
    int use_fd;
    double stop_at;
    double *lat; /* seconds per request */
    size_t n_lat, cap_lat;
    uint64_t bytes;
    double tel[N_TEL]; /* sums over the requests */
    int failed;
    char err[256];
};

static void scan_options(const struct opts *o, struct vks_scan_options *so)
{
    vks_scan_options_init(so);
    so->mode = VKS_REPORT_COUNT;
    so->no_cache = !o->cache;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 11) % n);
}

static void *client_main(void *arg)
{
    struct job *j = arg;
    struct vks_client *c = NULL;
    struct vks_error err = {0};
    if (vks_client_connect(j->o->socket, NULL, &c, &err) != 0) {
        j->failed = 1;
        snprintf(j->err, sizeof(j->err), "%s", err.msg);
        return NULL;
    }
    int fd = -1;
    if (j->use_fd) {
        fd = memfd_create("rpc_bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || write(fd, j->data, j->len) != (ssize_t)j->len ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0) {
            j->failed = 1;
            snprintf(j->err, sizeof(j->err), "memfd: %s", strerror(errno));
            vks_client_close(c);
            return NULL;
        }
    }
    struct vks_buffer b =
        j->use_fd ? (struct vks_buffer){.kind = VKS_BUFFER_FD, .fd = fd}
                  : (struct vks_buffer){.kind = VKS_BUFFER_INLINE, .data = j->data, .len = j->len};
    struct vks_scan_options so;
    scan_options(j->o, &so);
    while (now() < j->stop_at) {
        struct vks_scan_result res = {0};
        double t0 = now();
        int rc = vks_client_scan(c, j->fp, &b, 1, &so, &res, &err);
        double t1 = now();
        if (rc != 0) {
            j->failed = 1;
            snprintf(j->err, sizeof(j->err), "%s", err.msg);
            break;
        }
        for (size_t k = 0; k < N_TEL; k++) {
            const struct vks_stat *st = vks_stat_find(res.telemetry, res.n_telemetry, tel_keys[k]);
            j->tel[k] += st != NULL ? (double)st->u : 0;
        }
        vks_scan_result_finish(&res);
        if (j->n_lat == j->cap_lat) {
            j->cap_lat = j->cap_lat ? 2 * j->cap_lat : 4096;
            j->lat = realloc(j->lat, j->cap_lat * sizeof(double));
        }
        j->lat[j->n_lat++] = t1 - t0;
        j->bytes += j->len;
    }
    if (fd >= 0)
        close(fd);
    vks_client_close(c);
    return NULL;
}

/*
 * One untimed scan of each size first: the first scans on a new catalog pay
 * one-time costs (device upload of the catalog, pipelines for its shape)
 * that are not what the runs measure. Their times are printed on their own.
 */
static int warm_up(struct vks_client *c, const struct opts *o, const uint8_t *fp,
                   const uint8_t *data, size_t big, int json)
{
    const size_t sizes[2] = {4096, big};
    struct vks_scan_options so;
    scan_options(o, &so);
    for (int i = 0; i < 2; i++) {
        struct vks_buffer b = {.kind = VKS_BUFFER_INLINE, .data = data, .len = sizes[i]};
        struct vks_scan_result res = {0};
        struct vks_error err = {0};
        double t0 = now();
        if (vks_client_scan(c, fp, &b, 1, &so, &res, &err) != 0) {
            fprintf(stderr, "rpc_bench: warm-up scan: %s\n", err.msg);
            return -1;
        }
        double ms = (now() - t0) * 1e3;
        const struct vks_stat *pc =
            vks_stat_find(res.telemetry, res.n_telemetry, "pipeline_compiles");
        const struct vks_stat *pl = vks_stat_find(res.telemetry, res.n_telemetry, "plan_ns");
        const struct vks_stat *cu =
            vks_stat_find(res.telemetry, res.n_telemetry, "catalog_bytes_uploaded");
        printf(json ? "{\"warm_up_bytes\":%zu,\"ms\":%.2f,\"pipeline_compiles\":%llu,"
                      "\"plan_ms\":%.2f,\"catalog_bytes_uploaded\":%llu}\n"
                    : "# warm-up scan of %zu bytes: %.2f ms (pipeline compiles %llu, plan %.2f ms, "
                      "catalog bytes uploaded %llu)\n",
               sizes[i], ms, pc ? (unsigned long long)pc->u : 0ull, pl ? (double)pl->u / 1e6 : 0.0,
               cu ? (unsigned long long)cu->u : 0ull);
        vks_scan_result_finish(&res);
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run(const struct opts *o, const uint8_t *fp, const uint8_t *data, size_t len,
               int clients, int use_fd, const char *name)
{
    struct job *jobs = calloc((size_t)clients, sizeof(*jobs));
    pthread_t *th = calloc((size_t)clients, sizeof(*th));
    double t0 = now(), stop = t0 + o->seconds;
    for (int i = 0; i < clients; i++) {
        jobs[i] = (struct job){
            .o = o, .fp = fp, .data = data, .len = len, .use_fd = use_fd, .stop_at = stop};
        pthread_create(&th[i], NULL, client_main, &jobs[i]);
    }
    size_t n = 0;
    uint64_t bytes = 0;
    double tel[N_TEL] = {0};
    int failed = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        n += jobs[i].n_lat;
        bytes += jobs[i].bytes;
        for (size_t k = 0; k < N_TEL; k++)
            tel[k] += jobs[i].tel[k];
        if (jobs[i].failed && !failed) {
            fprintf(stderr, "rpc_bench: client %d: %s\n", i, jobs[i].err);
            failed = 1;
        }
    }
    double wall = now() - t0;
    double *all = malloc((n ? n : 1) * sizeof(double));
    size_t k = 0;
    for (int i = 0; i < clients; i++) {
        memcpy(all + k, jobs[i].lat, jobs[i].n_lat * sizeof(double));
        k += jobs[i].n_lat;
        free(jobs[i].lat);
    }
    qsort(all, n, sizeof(double), cmp_double);
    double p50 = n ? all[n / 2] * 1e6 : 0, p99 = n ? all[(size_t)((double)n * 0.99)] * 1e6 : 0;
    double gbs = (double)bytes / wall / 1e9, rps = (double)n / wall;
    for (size_t k = 0; k < N_TEL; k++) /* means; durations in us */
        tel[k] = n ? tel[k] / (double)n / (k + 1 < N_TEL ? 1e3 : 1) : 0;
    if (o->json) {
        printf("{\"workload\":\"%s\",\"transport\":\"%s\",\"clients\":%d,\"requests\":%zu,"
               "\"p50_us\":%.1f,\"p99_us\":%.1f,\"req_per_s\":%.1f,\"gb_per_s\":%.3f",
               name, use_fd ? "memfd" : "inline", clients, n, p50, p99, rps, gbs);
        for (size_t k = 0; k < N_TEL; k++)
            printf(",\"mean_%.*s%s\":%.1f", (int)(strlen(tel_keys[k]) - (k + 1 < N_TEL ? 3 : 0)),
                   tel_keys[k], k + 1 < N_TEL ? "_us" : "", tel[k]);
        printf("}\n");
    } else {
        printf("%-6s %-7s %8d %10zu %10.1f %10.1f %12.1f %9.3f", name, use_fd ? "memfd" : "inline",
               clients, n, p50, p99, rps, gbs);
        for (size_t k = 0; k < N_TEL; k++)
            printf(k + 1 < N_TEL ? " %9.1f" : " %6.1f", tel[k]);
        printf("\n");
    }
    fflush(stdout);
    free(all);
    free(jobs);
    free(th);
    return failed;
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.seconds = 5,
                       .clients = {1, 8, 64},
                       .n_clients = 3,
                       .big = 64u << 20,
                       .small = 1,
                       .large = 1,
                       .inputs = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--cache") == 0) {
            o->cache = 1;
        } else if (strcmp(a, "--socket") == 0 && v) {
            o->socket = v, i++;
        } else if (strcmp(a, "--seconds") == 0 && v) {
            o->seconds = atof(v), i++;
        } else if (strcmp(a, "--big-mib") == 0 && v) {
            o->big = (size_t)atoi(v) << 20, i++;
        } else if (strcmp(a, "--workloads") == 0 && v) {
            o->small = strstr(v, "small") != NULL;
            o->large = strstr(v, "large") != NULL;
            i++;
        } else if (strcmp(a, "--inputs") == 0 && v) {
            o->inputs = (strstr(v, "inline") != NULL) | (strstr(v, "memfd") != NULL) << 1;
            i++;
        } else if (strcmp(a, "--clients") == 0 && v) {
            o->n_clients = 0;
            for (char *p = argv[++i]; *p && o->n_clients < 8;) {
                o->clients[o->n_clients++] = (int)strtol(p, &p, 10);
                p += *p == ',';
            }
        } else {
            fprintf(stderr,
                    "usage: rpc_bench --socket PATH [--seconds S] [--clients 1,8,64] "
                    "[--big-mib N] [--workloads small,large] [--inputs inline,memfd] [--cache] "
                    "[--json]\n");
            return -1;
        }
    }
    if (o->socket == NULL) {
        fprintf(stderr, "rpc_bench: --socket PATH is required (start vkscand first)\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse(argc, argv, &o) != 0)
        return 2;
    /* 1,000 random literals of 8-16 bytes, some planted in the haystack. */
    static struct vks_rule rules[N_LITERALS];
    static char pats[N_LITERALS][17], ids[N_LITERALS][8];
    for (int i = 0; i < N_LITERALS; i++) {
        int len = 8 + (int)rnd(9);
        for (int k = 0; k < len; k++)
            pats[i][k] = (char)('a' + rnd(26));
        snprintf(ids[i], sizeof(ids[i]), "%d", i);
        rules[i] = (struct vks_rule){.id = ids[i], .kind = VKS_RULE_LITERAL, .pattern = pats[i]};
    }
    uint8_t *big = malloc(o.big);
    for (size_t i = 0; i < o.big; i++)
        big[i] = (uint8_t)('a' + rnd(26));
    for (size_t p = 0; p + 16 < o.big; p += 4096)
        memcpy(big + p, pats[rnd(N_LITERALS)], 8);
    struct vks_client *c = NULL;
    struct vks_catalog *cat = NULL;
    struct vks_error err = {0};
    if (vks_client_connect(o.socket, NULL, &c, &err) != 0 ||
        vks_client_catalog_load(c, rules, N_LITERALS, NULL, &cat, &err) != 0) {
        fprintf(stderr, "rpc_bench: %s\n", err.msg);
        return 1;
    }
    if (warm_up(c, &o, vks_catalog_fingerprint(cat), big, o.big, o.json) != 0)
        return 1;
    /* N clients are N connections: the catalog stays loaded (this uid holds
     * it until a catalog.drop), and the set-up connection would be one over
     * tenant-max-connections (256 by default) at 256 clients */
    vks_client_close(c);
    if (!o.json)
        printf("%-6s %-7s %8s %10s %10s %10s %12s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s "
               "%6s\n",
               "load", "input", "clients", "requests", "p50_us", "p99_us", "req/s", "GB/s",
               "daemon_us", "queue_us", "fd_us", "plan_us", "upload_us", "run_us", "rdback_us",
               "scan_us", "wait_us", "made_us", "batch");
    int failed = 0;
    for (int use_fd = 0; use_fd < 2; use_fd++) {
        if (!(o.inputs >> use_fd & 1))
            continue;
        for (int i = 0; i < o.n_clients; i++) {
            if (o.small)
                failed |=
                    run(&o, vks_catalog_fingerprint(cat), big, 4096, o.clients[i], use_fd, "4KiB");
            if (o.large)
                failed |= run(&o, vks_catalog_fingerprint(cat), big, o.big, o.clients[i], use_fd,
                              "large");
        }
    }
    vks_catalog_destroy(cat);
    free(big);
    return failed ? 1 : 0;
}
