/*
 * Prometheus text exposition (prom.h), moved here from vkscan status so that
 * vkscand's metrics endpoint prints exactly the same families. Integer
 * stats print as integers, all 64 bits (never 1.23e+06), nanoseconds as
 * exact decimal seconds, and only float stats through a double.
 */
#include "prom.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct prom_def {
    const char *key, *name, *type, *help;
};

static const struct prom_def prom_defs[] = {
    {"uptime_ns", "uptime_seconds", "gauge", "Seconds since vkscand started."},
    {"connections", "connections", "gauge", "Open client connections."},
    {"connections_total", "connections_total", "counter", "Connections accepted."},
    {"connections_refused", "connections_refused_total", "counter",
     "Connections closed at once: over max-connections."},
    {"connections_denied", "connections_denied_total", "counter",
     "Connections refused: the peer is not in allow-uids / allow-gids."},
    {"errors", "errors_total", "counter", "Requests answered with an error."},
    {"frame_errors", "frame_errors_total", "counter", "Frames that could not be decoded."},
    {"scans", "scans_total", "counter", "Scan requests answered."},
    {"bytes_scanned", "scanned_bytes_total", "counter", "Bytes scanned."},
    {"scan_hits", "hits_total", "counter", "Hits reported."},
    {"timeouts", "timeouts_total", "counter", "Scans that passed their deadline."},
    {"cancelled", "cancelled_scans_total", "counter", "Scans dropped: their client left."},
    {"backpressure", "backpressure_total", "counter",
     "Times a tenant's socket stopped being read: over its quota."},
    {"reloads", "reloads_total", "counter", "Configuration reloads (SIGHUP)."},
    {"batches", "batches_total", "counter", "Engine batches run."},
    {"batched_scans", "batched_scans_total", "counter", "Scans carried by engine batches."},
    {"queued_scans", "queued_scans", "gauge", "Scans waiting in the tenant queues."},
    {"queued_bytes", "queued_bytes", "gauge", "Bytes of the scans waiting."},
    {"running_scans", "running_scans", "gauge", "Scans on the engine now."},
    {"tenants", "tenants", "gauge", "Tenants (uids) with queued or running work."},
    {"catalogs", "catalogs", "gauge", "Catalogs known to the store."},
    {"catalogs_in_memory", "catalogs_in_memory", "gauge", "Catalogs held in host memory."},
    {"catalog_host_bytes", "catalog_host_bytes", "gauge", "Host bytes of catalogs."},
    {"catalog_compiles", "catalog_compiles_total", "counter", "Catalogs compiled (cache misses)."},
    {"catalog_compile_ns", "catalog_compile_seconds_total", "counter",
     "Seconds spent compiling catalogs."},
    {"catalog_disk_hits", "catalog_disk_hits_total", "counter",
     "Catalogs loaded from the disk cache."},
    {"catalog_memory_hits", "catalog_memory_hits_total", "counter",
     "Catalog loads served from host memory."},
    {"catalog_disk_writes", "catalog_disk_writes_total", "counter",
     "Catalogs written to the disk cache."},
    {"catalog_cache_hits", "catalog_cache_hits_total", "counter",
     "Catalog loads that compiled nothing."},
    {"catalog_host_evictions", "catalog_host_evictions_total", "counter",
     "Catalogs evicted from host memory."},
    {"catalog_disk_errors", "catalog_disk_errors_total", "counter",
     "Disk cache reads or writes that failed."},
    {"catalogs_resident", "catalogs_resident", "gauge", "Catalogs resident on the device."},
    {"device_memory_used", "device_memory_used_bytes", "gauge", "Device bytes in use."},
    {"device_memory_budget", "device_memory_budget_bytes", "gauge", "Device memory budget."},
};

struct prom_sample {
    char family[128];
    const char *type, *help;
    char suffix[16]; /* "", "_bucket", "_sum", "_count" */
    char labels[160];
    double le; /* bucket bound, for ordering */
    /* The value: an integer printed as one, exactly (all 64 bits); with
     * `ns`, nanoseconds printed as exact decimal seconds; else a double. */
    bool is_float, ns;
    uint64_t u;
    double f;
    size_t order;
};

/* `v` nanoseconds as decimal seconds, exactly: 1500000 -> "0.0015". */
static void fmt_ns(char *buf, size_t cap, uint64_t v)
{
    int n = snprintf(buf, cap, "%" PRIu64 ".%09" PRIu64, v / 1000000000u, v % 1000000000u);
    while (n > 0 && (size_t)n < cap && buf[n - 1] == '0')
        buf[--n] = '\0';
    if (n > 0 && (size_t)n < cap && buf[n - 1] == '.')
        buf[--n] = '\0';
}

/* The shortest of %.15g..%.17g that reads back as the same double. */
static void fmt_double(char *buf, size_t cap, double v)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* A sample's value as Prometheus text: integers never in float notation. */
static void fmt_value(char *buf, size_t cap, const struct prom_sample *p)
{
    if (p->is_float)
        fmt_double(buf, cap, p->ns ? p->f * 1e-9 : p->f);
    else if (p->ns)
        fmt_ns(buf, cap, p->u);
    else
        snprintf(buf, cap, "%" PRIu64, p->u);
}

/* Metric names allow [a-zA-Z0-9_:]: other bytes become '_'. */
static void prom_name(char *dst, size_t cap, const char *src, size_t len)
{
    size_t n = snprintf(dst, cap, "vkscand_");
    for (size_t i = 0; i < len && n + 1 < cap; i++) {
        char c = src[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        dst[n++] = ok ? c : '_';
    }
    dst[n] = '\0';
}

/* Turns a `_ns` name into `_seconds`; returns whether it did (the values
 * are then nanoseconds, printed as seconds). */
static bool prom_unit(char *name)
{
    size_t n = strlen(name);
    if (n > 3 && strcmp(name + n - 3, "_ns") == 0) {
        snprintf(name + n - 3, 12, "_seconds");
        return true;
    }
    return false;
}

static bool prom_histogram(struct prom_sample *p, const char *key)
{
    const char *m = strstr(key, ".bucket.");
    size_t len = m != NULL ? (size_t)(m - key) : 0;
    const char *suffix = "_bucket";
    if (m == NULL) {
        size_t kl = strlen(key);
        if (kl > 4 && strcmp(key + kl - 4, ".sum") == 0)
            len = kl - 4, suffix = "_sum";
        else if (kl > 6 && strcmp(key + kl - 6, ".count") == 0)
            len = kl - 6, suffix = "_count";
        else
            return false;
    }
    static const struct {
        const char *name, *help;
    } helps[] = {
        {"queue_wait_ns", "Seconds each answered scan waited in its tenant queue."},
        {"gpu_ns", "Seconds each engine batch ran on the device (or the CPU scanner)."},
        {"scan_total_ns", "Seconds from receiving each answered scan to its reply."},
        {"scan_bytes", "Bytes of each answered scan."},
    };
    prom_name(p->family, sizeof(p->family) - 12, key, len);
    bool ns = prom_unit(p->family);
    p->type = "histogram";
    p->help = "Histogram.";
    for (size_t i = 0; i < sizeof(helps) / sizeof(helps[0]); i++) {
        if (strlen(helps[i].name) == len && strncmp(key, helps[i].name, len) == 0)
            p->help = helps[i].help;
    }
    snprintf(p->suffix, sizeof(p->suffix), "%s", suffix);
    p->ns = ns && strcmp(suffix, "_sum") == 0;
    if (m != NULL) {
        /* The bound is the key's integer: printed exactly, as the value. */
        const char *le = m + 8;
        bool inf = strcmp(le, "inf") == 0 || strcmp(le, "+Inf") == 0;
        struct prom_sample bound = {.ns = ns, .u = strtoull(le, NULL, 10)};
        char text[48];
        fmt_value(text, sizeof(text), &bound);
        p->le = inf ? 1e300 : (double)bound.u;
        snprintf(p->labels, sizeof(p->labels), "le=\"%s\"", inf ? "+Inf" : text);
    }
    return true;
}

static void prom_classify(struct prom_sample *p, const char *key, uint64_t uid)
{
    p->type = "untyped";
    p->help = "vkscand statistic.";
    if (prom_histogram(p, key))
        return;
    for (size_t i = 0; i < sizeof(prom_defs) / sizeof(prom_defs[0]); i++) {
        if (strcmp(key, prom_defs[i].key) == 0) {
            snprintf(p->family, sizeof(p->family), "vkscand_%s", prom_defs[i].name);
            p->type = prom_defs[i].type;
            p->help = prom_defs[i].help;
            size_t kl = strlen(key);
            p->ns = kl > 3 && strcmp(key + kl - 3, "_ns") == 0;
            return;
        }
    }
    if (strncmp(key, "requests.", 9) == 0) {
        /* requests.OP.RESULT: answered requests; requests.OP: received ones,
         * a family of its own so that no sum counts a request twice. */
        const char *op = key + 9, *dot = strchr(op, '.');
        p->type = "counter";
        if (dot != NULL) {
            snprintf(p->family, sizeof(p->family), "vkscand_requests_total");
            p->help = "Requests answered, by operation and result.";
            snprintf(p->labels, sizeof(p->labels), "op=\"%.*s\",result=\"%s\"", (int)(dot - op), op,
                     dot + 1);
        } else {
            snprintf(p->family, sizeof(p->family), "vkscand_requests_received_total");
            p->help = "Requests received, by operation (invalid: frames that did not decode).";
            snprintf(p->labels, sizeof(p->labels), "op=\"%s\"", op);
        }
    } else if (strncmp(key, "limit.", 6) == 0) {
        snprintf(p->family, sizeof(p->family), "vkscand_limit");
        p->type = "gauge";
        p->help = "Configured limits (vkscand.conf).";
        snprintf(p->labels, sizeof(p->labels), "name=\"%s\"", key + 6);
    } else if (strncmp(key, "tenant.", 7) == 0) {
        prom_name(p->family, sizeof(p->family) - 12, key, strlen(key));
        p->ns = prom_unit(p->family);
        bool served = strstr(key, "served") != NULL;
        if (served)
            strcat(p->family, "_total");
        p->type = served ? "counter" : "gauge";
        p->help = "The calling tenant's own figures.";
        snprintf(p->labels, sizeof(p->labels), "uid=\"%llu\"", (unsigned long long)uid);
    } else {
        prom_name(p->family, sizeof(p->family) - 12, key, strlen(key));
        p->ns = prom_unit(p->family);
    }
}

static int prom_cmp(const void *a, const void *b)
{
    const struct prom_sample *x = a, *y = b;
    int c = strcmp(x->family, y->family);
    if (c != 0)
        return c;
    static const char *const order[] = {"", "_bucket", "_sum", "_count"};
    int ox = 0, oy = 0;
    for (int i = 0; i < 4; i++) {
        ox = strcmp(x->suffix, order[i]) == 0 ? i : ox;
        oy = strcmp(y->suffix, order[i]) == 0 ? i : oy;
    }
    if (ox != oy)
        return ox - oy;
    if (x->le != y->le)
        return x->le < y->le ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* A label value: backslash, double quote and newline escaped. */
static void prom_label(FILE *f, const char *v)
{
    fputc('"', f);
    for (; *v != '\0'; v++) {
        if (*v == '\\' || *v == '"')
            fprintf(f, "\\%c", *v);
        else if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
    fputc('"', f);
}

int prom_write(FILE *out, const char *server, uint32_t protocol, const struct prom_stat *stats,
               size_t n)
{
    struct prom_sample *v = calloc(n + 1, sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    uint64_t uid = 0;
    bool gpu = true;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(stats[i].key, "tenant.uid") == 0)
            uid = stats[i].u;
        else if (strcmp(stats[i].key, "engine") == 0)
            gpu = stats[i].u == 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const struct prom_stat *st = &stats[i];
        if (strcmp(st->key, "requests") == 0 || strcmp(st->key, "tenant.uid") == 0 ||
            strcmp(st->key, "engine") == 0)
            continue; /* a sum of requests.*, a label, and part of vkscand_info */
        prom_classify(&v[k], st->key, st->has_uid ? st->uid : uid);
        v[k].is_float = st->is_float;
        v[k].u = st->u;
        v[k].f = st->f;
        v[k].order = i;
        k++;
    }
    qsort(v, k, sizeof(*v), prom_cmp);
    fprintf(out, "# HELP vkscand_info The daemon's version and engine.\n"
                 "# TYPE vkscand_info gauge\nvkscand_info{server=");
    prom_label(out, server != NULL ? server : "");
    fprintf(out, ",protocol=\"%u\",engine=\"%s\"} 1\n", protocol, gpu ? "gpu" : "cpu");
    for (size_t i = 0; i < k; i++) {
        if (i == 0 || strcmp(v[i].family, v[i - 1].family) != 0)
            fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", v[i].family, v[i].help, v[i].family,
                    v[i].type);
        char value[48];
        fmt_value(value, sizeof(value), &v[i]);
        fprintf(out, "%s%s%s%s%s %s\n", v[i].family, v[i].suffix, v[i].labels[0] ? "{" : "",
                v[i].labels, v[i].labels[0] ? "}" : "", value);
    }
    free(v);
    return 0;
}
