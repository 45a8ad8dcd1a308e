/*
 * vkscan status (vkscan_cli.h): the daemon's hello and stats as text, as one
 * JSON object, or as Prometheus text exposition.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prom.h"
#include "vkscan/vkscan.h"
#include "vkscan_cli.h"

struct status {
    struct vks_server_info info;
    struct vks_stats st;
};

static uint64_t stat_u(const struct status *s, const char *key, bool *ok)
{
    const struct vks_stat *v = vks_stat_find(s->st.stats, s->st.n_stats, key);
    if (v == NULL && ok != NULL)
        *ok = false;
    return v != NULL ? v->u : 0;
}

/* One line per engine (engine.N.* keys): kind, device or threads,
 * batches, bytes and busy share. */
static void print_engines(const struct status *s)
{
    for (uint32_t i = 0; i < 64; i++) {
        char key[48];
        snprintf(key, sizeof(key), "engine.%u.kind", i);
        const struct vks_stat *kind = vks_stat_find(s->st.stats, s->st.n_stats, key);
        if (kind == NULL)
            break;
        snprintf(key, sizeof(key), "engine.%u.device", i);
        uint64_t dev = stat_u(s, key, NULL);
        snprintf(key, sizeof(key), "engine.%u.batches", i);
        uint64_t batches = stat_u(s, key, NULL);
        snprintf(key, sizeof(key), "engine.%u.bytes", i);
        char b[32];
        cli_fmt_bytes(stat_u(s, key, NULL), b, sizeof(b));
        snprintf(key, sizeof(key), "engine.%u.busy_share", i);
        const struct vks_stat *busy = vks_stat_find(s->st.stats, s->st.n_stats, key);
        snprintf(key, sizeof(key), "engine.%u.max_inflight", i);
        uint64_t overlap = stat_u(s, key, NULL);
        char what[48], most[64] = "";
        if (kind->u == 0)
            snprintf(what, sizeof(what), "gpu, device %llu", (unsigned long long)dev);
        else
            snprintf(what, sizeof(what), "cpu, %llu threads", (unsigned long long)dev);
        /* a GPU engine is busy while the device holds a batch; batches overlap */
        if (overlap > 0)
            snprintf(most, sizeof(most), " (device), up to %llu batches on it at once",
                     (unsigned long long)overlap);
        printf("engine %u:   %s: %llu batches, %s, %.1f%% busy%s\n", i, what,
               (unsigned long long)batches, b, busy != NULL ? 100.0 * busy->f : 0.0, most);
    }
}

/*
 * Catalogs and memory. The CPU engine (the default without a GPU) scans the
 * catalogs where the store keeps them, in host memory, and holds nothing
 * on a device: its daemon reports device figures of 0, which are not shown
 * as if a GPU used them. A GPU engine adds its resident catalogs and device
 * memory.
 */
static void print_memory(const struct status *s, bool *ok)
{
    bool gpu = stat_u(s, "engine", ok) == 0;
    char used[32], budget[32];
    printf("catalogs:   %llu known, %llu in host memory",
           (unsigned long long)stat_u(s, "catalogs", ok),
           (unsigned long long)stat_u(s, "catalogs_in_memory", ok));
    if (gpu)
        printf(", %llu resident on the device",
               (unsigned long long)stat_u(s, "catalogs_resident", ok));
    printf("\n");
    cli_fmt_bytes(stat_u(s, "catalog_host_bytes", ok), used, sizeof(used));
    cli_fmt_bytes(stat_u(s, "limit.host_catalog_budget", ok), budget, sizeof(budget));
    printf("memory:     host %s of %s (catalogs%s)", used, budget,
           gpu ? "" : ", scanned there by the CPU engine");
    if (gpu) {
        cli_fmt_bytes(stat_u(s, "device_memory_used", ok), used, sizeof(used));
        cli_fmt_bytes(stat_u(s, "device_memory_budget", ok), budget, sizeof(budget));
        printf(", device %s of %s", used, budget);
    }
    printf("\n");
}

static void print_status_text(const struct status *s)
{
    bool ok = true;
    uint64_t up = stat_u(s, "uptime_ns", &ok) / 1000000000u;
    char b1[32], b2[32], b3[32];
    printf("%s at %s (protocol %u)\n", s->info.server, cli_daemon_socket(), s->info.protocol);
    printf("uptime:     %llud %02lluh %02llum %02llus\n", (unsigned long long)up / 86400,
           (unsigned long long)up / 3600 % 24, (unsigned long long)up / 60 % 60,
           (unsigned long long)up % 60);
    printf("engine:     %s\n", stat_u(s, "engine", NULL) == 0 ? "gpu" : "cpu");
    print_engines(s);
    for (uint32_t i = 0; i < s->info.n_devices; i++) {
        const struct vks_device *d = &s->info.devices[i];
        cli_fmt_bytes(d->memory, b1, sizeof(b1));
        printf("device %u:   %s (%s, %s)%s\n", d->index, d->name, d->type, b1,
               d->active ? ", active" : ", not used");
    }
    print_memory(s, &ok);
    cli_fmt_bytes(stat_u(s, "queued_bytes", &ok), b1, sizeof(b1));
    printf("queues:     %llu scans queued (%s), %llu running, %llu tenants\n",
           (unsigned long long)stat_u(s, "queued_scans", &ok), b1,
           (unsigned long long)stat_u(s, "running_scans", &ok),
           (unsigned long long)stat_u(s, "tenants", &ok));
    cli_fmt_bytes(stat_u(s, "bytes_scanned", &ok), b3, sizeof(b3));
    printf("served:     %llu requests (%llu errors), %llu scans, %s, %llu hits\n",
           (unsigned long long)stat_u(s, "requests", &ok),
           (unsigned long long)stat_u(s, "errors", &ok),
           (unsigned long long)stat_u(s, "scans", &ok), b3,
           (unsigned long long)stat_u(s, "scan_hits", &ok));
    cli_fmt_bytes(stat_u(s, "result_cache.bytes", &ok), b1, sizeof(b1));
    cli_fmt_bytes(stat_u(s, "result_cache.limit", &ok), b2, sizeof(b2));
    cli_fmt_bytes(stat_u(s, "dedup.bytes_not_scanned", &ok) +
                      stat_u(s, "result_cache.bytes_not_scanned", &ok),
                  b3, sizeof(b3));
    printf("reuse:      %llu buffers deduplicated, %llu result cache hits, %s not scanned; "
           "cache %s of %s, %llu entries\n",
           (unsigned long long)stat_u(s, "dedup.buffers", &ok),
           (unsigned long long)stat_u(s, "result_cache.hits", &ok), b3, b1, b2,
           (unsigned long long)stat_u(s, "result_cache.entries", &ok));
    printf("clients:    %llu connected, %llu since start\n",
           (unsigned long long)stat_u(s, "connections", &ok),
           (unsigned long long)stat_u(s, "connections_total", &ok));
    cli_fmt_bytes(stat_u(s, "tenant.served_bytes", &ok), b1, sizeof(b1));
    printf("this user:  uid %llu, %llu catalogs, %llu scans in flight, %llu served (%s)\n",
           (unsigned long long)stat_u(s, "tenant.uid", &ok),
           (unsigned long long)stat_u(s, "tenant.catalogs", &ok),
           (unsigned long long)stat_u(s, "tenant.scans_in_flight", &ok),
           (unsigned long long)stat_u(s, "tenant.served_scans", &ok), b1);
    if (!ok)
        printf("(this vkscand reports fewer statistics: missing values are shown as 0)\n");
}

static void print_status_json(const struct status *s)
{
    fputs("{\"server\":", stdout);
    cli_json_str(stdout, s->info.server, NULL);
    fputs(",\"socket\":", stdout);
    cli_json_str(stdout, cli_daemon_socket(), NULL);
    printf(",\"protocol\":%u,\"devices\":[", s->info.protocol);
    for (uint32_t i = 0; i < s->info.n_devices; i++) {
        const struct vks_device *d = &s->info.devices[i];
        printf("%s{\"index\":%u,\"name\":", i ? "," : "", d->index);
        cli_json_str(stdout, d->name, NULL);
        fputs(",\"type\":", stdout);
        cli_json_str(stdout, d->type, NULL);
        printf(",\"memory\":%llu,\"active\":%s}", (unsigned long long)d->memory,
               d->active ? "true" : "false");
    }
    fputs("],\"stats\":{", stdout);
    for (size_t i = 0; i < s->st.n_stats; i++) {
        const struct vks_stat *v = &s->st.stats[i];
        fputs(i ? "," : "", stdout);
        cli_json_str(stdout, v->key, NULL);
        if (v->is_float)
            printf(":%.17g", v->f);
        else
            printf(":%llu", (unsigned long long)v->u);
    }
    fputs("}}\n", stdout);
}

/* Prometheus text exposition: the renderer vkscand's metrics endpoint also
 * uses (common/prom.h), so both print the same families. */
static int print_status_prometheus(const struct status *s)
{
    struct prom_stat *v = calloc(s->st.n_stats + 1, sizeof(*v));
    if (v == NULL)
        return 2;
    for (size_t i = 0; i < s->st.n_stats; i++) {
        const struct vks_stat *st = &s->st.stats[i];
        v[i] = (struct prom_stat){.key = st->key, .is_float = st->is_float, .u = st->u, .f = st->f};
    }
    int rc = prom_write(stdout, s->info.server, s->info.protocol, v, s->st.n_stats);
    free(v);
    return rc == 0 ? 0 : 2;
}

int cli_status(int argc, char **argv)
{
    static const struct option longs[] = {{"json", no_argument, NULL, 'J'},
                                          {"prometheus", no_argument, NULL, 'P'},
                                          {"socket", required_argument, NULL, 'S'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    int c, format = 0;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        if (c == 'J' || c == 'P') {
            format = c;
        } else if (c == 'S') {
            cli_socket_path = optarg;
        } else {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: vkscan status [--json | --prometheus] [--socket PATH]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "usage: vkscan status [--json | --prometheus] [--socket PATH]\n");
        return 2;
    }
    struct status s = {0};
    struct vks_client *cl;
    struct vks_error err = {0};
    int rc = cli_daemon_connect(0, false, &cl);
    if (rc != 0)
        return rc;
    rc = vks_client_info(cl, &s.info);
    if (rc == 0)
        rc = vks_client_stats(cl, &s.st, &err);
    vks_client_close(cl);
    if (rc != 0) {
        fprintf(stderr, "vkscan: %s\n", err.msg);
        return 2;
    }
    int status = 0;
    if (format == 'J')
        print_status_json(&s);
    else if (format == 'P')
        status = print_status_prometheus(&s);
    else
        print_status_text(&s);
    vks_stats_finish(&s.st);
    return status;
}
