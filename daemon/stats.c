/*
 * The stats op's map (stats.h): every key docs/daemon.md lists, gathered
 * from the server's counters, the scheduler, the store and the engine.
 */
#include "stats.h"

#include <time.h>

#include "session_host.h"
#include "stream.h"

void stats_add_u(struct stats_list *l, const char *key, uint64_t v)
{
    if (l->n < sizeof(l->v) / sizeof(l->v[0]))
        l->v[l->n++] = (struct proto_stat){.key = key, .u = v};
}

void stats_add_f(struct stats_list *l, const char *key, double v)
{
    if (l->n < sizeof(l->v) / sizeof(l->v[0]))
        l->v[l->n++] = (struct proto_stat){.key = key, .is_float = true, .f = v};
}

void stats_add_hist(struct stats_list *l, const struct metrics_hist *h)
{
    l->n += metrics_hist_stats(h, l->v + l->n, (uint32_t)(sizeof(l->v) / sizeof(l->v[0])) - l->n);
}

/* requests.<op> (decoded), requests.<op>.ok and .error (answered), and
 * their sum `requests`. */
static void stats_requests(struct stats_list *l, const struct server_counters *c)
{
#define OP_KEYS(name)                                                       \
    {                                                                       \
        "requests." name, "requests." name ".ok", "requests." name ".error" \
    }
    static const char *const keys[PROTO_OP_COUNT][3] = {
        OP_KEYS("invalid"),      OP_KEYS("hello"),       OP_KEYS("ping"),
        OP_KEYS("catalog_load"), OP_KEYS("catalog_has"), OP_KEYS("catalog_drop"),
        OP_KEYS("scan"),         OP_KEYS("stats"),       OP_KEYS("stream_open"),
        OP_KEYS("stream_write"), OP_KEYS("stream_close")};
#undef OP_KEYS
    uint64_t total = 0;
    for (int op = 0; op < PROTO_OP_COUNT; op++) {
        if (keys[op][0] == NULL)
            continue; /* an op without keys yet */
        stats_add_u(l, keys[op][0], c->requests[op]);
        stats_add_u(l, keys[op][1], __atomic_load_n(&c->replies_ok[op], __ATOMIC_RELAXED));
        stats_add_u(l, keys[op][2], __atomic_load_n(&c->replies_error[op], __ATOMIC_RELAXED));
        total += c->requests[op];
    }
    stats_add_u(l, "requests", total);
}

static void stats_limits(struct stats_list *l, const struct daemon_config *c)
{
    stats_add_u(l, "limit.max_frame", c->max_frame);
    stats_add_u(l, "limit.max_rules", c->max_rules);
    stats_add_u(l, "limit.max_buffers", c->max_buffers);
    stats_add_u(l, "limit.max_scan_bytes", c->max_scan_bytes);
    stats_add_u(l, "limit.max_hits", c->max_hits);
    stats_add_u(l, "limit.max_connections", c->max_connections);
    stats_add_u(l, "limit.tenant_max_requests", c->tenant_max_requests);
    stats_add_u(l, "limit.tenant_max_bytes", c->tenant_max_bytes);
    stats_add_u(l, "limit.tenant_max_catalogs", c->tenant_max_catalogs);
    stats_add_u(l, "limit.batch_max_bytes", c->batch_max_bytes);
    stats_add_u(l, "limit.batch_max_buffers", c->batch_max_buffers);
    stats_add_u(l, "limit.device_budget", c->device_budget);
    stats_add_u(l, "limit.host_catalog_budget", c->host_catalog_budget);
    stats_add_u(l, "limit.max_unsent_bytes", c->max_unsent_bytes);
    stats_add_u(l, "limit.frame_budget", c->frame_budget);
    stats_add_u(l, "limit.frame_timeout_ms", c->frame_timeout_ms);
    stats_add_u(l, "limit.idle_timeout_ms", c->idle_timeout_ms);
    stats_add_u(l, "limit.tenant_max_connections", c->tenant_max_connections);
    stats_add_u(l, "limit.compile_threads", c->compile_threads);
    stats_add_u(l, "limit.tenant_max_compiles", c->tenant_max_compiles);
    stats_add_u(l, "limit.max_states", c->max_states);
    stats_add_u(l, "limit.compile_timeout_ms", c->compile_timeout_ms);
    stats_add_u(l, "limit.batch_max_ms", c->batch_max_ms);
    stream_stats_add(c, l); /* limit.stream_* and stream.* */
}

/* The tenant's own figures, the limits and what is no one's secret. */
static void stats_tenant(struct server *srv, uid_t uid, struct stats_list *l)
{
    struct sched_tenant_stats ts = {0};
    sched_tenant_stats(server_sched(srv), uid, &ts);
    stats_add_u(l, "tenant.uid", uid);
    stats_add_u(l, "tenant.catalogs", store_tenant_catalogs(server_store(srv), uid));
    stats_add_u(l, "tenant.connections", server_uid_sessions(srv, uid));
    stats_add_u(l, "tenant.scans_in_flight", ts.jobs);
    stats_add_u(l, "tenant.bytes_in_flight", ts.bytes);
    stats_add_u(l, "tenant.served_scans", ts.served_jobs);
    stats_add_u(l, "tenant.served_bytes", ts.served_bytes);
    stats_limits(l, server_config(srv));
}

/* Counters of the hostile-tenant limits (docs/daemon.md). */
static void stats_guards(struct server *srv, struct stats_list *l)
{
    const struct server_counters *c = server_counters(srv);
    stats_add_u(l, "output_limit_closes", c->output_limit_closes);
    stats_add_u(l, "frame_timeouts", c->frame_timeouts);
    stats_add_u(l, "idle_closes", c->idle_closes);
    stats_add_u(l, "frame_budget_waits", c->frame_budget_waits);
    stats_add_u(l, "read_ahead", c->read_ahead);
    stats_add_u(l, "frame_budget_used", server_frame_reserved(srv));
    stats_add_u(l, "connections_refused_tenant", c->tenant_refused);
    stats_add_u(l, "accept_fd_limit", c->accept_fd_limit);
}

void stats_collect_as(struct server *srv, uid_t uid, bool admin, struct stats_list *l)
{
    l->n = 0;
    if (!admin) {
        const struct engine_info *info = engine_get_info(server_engine(srv));
        stats_add_u(l, "uptime_ns", uv_hrtime() - server_start_ns(srv));
        stats_add_u(l, "engine", info->gpu ? 0 : 1);
        stats_add_u(l, "admin", 0);
        stats_tenant(srv, uid, l);
        return;
    }
    const struct server_counters *c = server_counters(srv);
    struct store_stats ss;
    struct sched_stats qs;
    store_get_stats(server_store(srv), &ss);
    sched_get_stats(server_sched(srv), &qs);
    const struct engine_info *info = engine_get_info(server_engine(srv));
    stats_add_u(l, "uptime_ns", uv_hrtime() - server_start_ns(srv));
    stats_add_u(l, "engine", info->gpu ? 0 : 1);
    stats_add_u(l, "admin", 1);
    /* the loop thread (this one): every request's decode, dispatch and
     * reply runs on it, so near uptime it is what bounds the daemon */
    uint64_t up = uv_hrtime() - server_start_ns(srv), idle = uv_metrics_idle_time(server_loop(srv));
    struct timespec cpu;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
    stats_add_u(l, "loop_busy_ns", up > idle ? up - idle : 0);
    stats_add_u(l, "loop_cpu_ns", (uint64_t)cpu.tv_sec * 1000000000u + (uint64_t)cpu.tv_nsec);
    engine_stats_add(server_engine(srv), l);
    stats_add_u(l, "connections", server_session_count(srv));
    stats_add_u(l, "connections_total", c->connections_total);
    stats_add_u(l, "connections_refused", c->connections_refused);
    stats_add_u(l, "connections_denied", c->connections_denied);
    stats_requests(l, c);
    stats_add_u(l, "errors", c->errors);
    stats_add_u(l, "frame_errors", c->frame_errors);
    stats_add_u(l, "scans", __atomic_load_n(&c->scans, __ATOMIC_RELAXED));
    stats_add_u(l, "bytes_scanned", __atomic_load_n(&c->scan_bytes, __ATOMIC_RELAXED));
    stats_add_u(l, "scan_hits", __atomic_load_n(&c->scan_hits, __ATOMIC_RELAXED));
    stats_add_u(l, "timeouts", c->timeouts);
    stats_add_u(l, "cancelled", c->cancelled);
    stats_add_u(l, "backpressure", c->backpressure);
    stats_add_u(l, "reloads", c->reloads);
    stats_add_u(l, "batches", qs.batches);
    stats_add_u(l, "batched_scans", qs.batched_jobs);
    stats_add_u(l, "queued_scans", qs.queued_jobs);
    stats_add_u(l, "queued_bytes", qs.queued_bytes);
    stats_add_u(l, "running_scans", qs.running_jobs);
    stats_add_u(l, "tenants", qs.tenants);
    stats_add_u(l, "catalogs", ss.catalogs);
    stats_add_u(l, "catalogs_in_memory", ss.in_memory);
    stats_add_u(l, "catalog_host_bytes", ss.host_bytes);
    stats_add_u(l, "catalog_compiles", ss.compiles);
    stats_add_u(l, "catalog_compile_ns", ss.compile_ns);
    stats_add_u(l, "catalog_compiles_stopped", ss.compiles_stopped);
    stats_add_u(l, "catalog_disk_hits", ss.disk_loads);
    stats_add_u(l, "catalog_disk_read_failures", ss.disk_read_failures);
    stats_add_u(l, "catalog_memory_hits", ss.memory_hits);
    stats_add_u(l, "catalog_disk_writes", ss.disk_writes);
    stats_add_u(l, "catalog_cache_hits", ss.cache_hits);
    stats_add_u(l, "catalog_host_evictions", ss.host_evictions);
    stats_add_u(l, "catalog_tenant_evictions", ss.tenant_evictions);
    stats_add_u(l, "catalog_disk_errors", ss.disk_errors);
    stats_add_u(l, "catalogs_resident", info->resident_catalogs);
    stats_add_u(l, "device_memory_used", info->device_memory_used);
    stats_add_u(l, "device_memory_budget", info->device_memory_budget);
    stats_add_u(l, "startup_ns", c->start_ready_ns);
    stats_add_u(l, "startup_accept_ns",
                c->start_accept_ns != 0 ? c->start_accept_ns : c->start_ready_ns);
    stats_add_u(l, "startup_engine_open_ns", info->start_open_ns);
    stats_add_u(l, "startup_device_list_ns", info->start_list_ns);
    stats_add_u(l, "startup_selftest_ns", info->start_selftest_ns);
    stats_add_u(l, "preload_catalogs", c->preload_catalogs);
    stats_add_u(l, "preload_done", c->preload_done);
    stats_add_u(l, "preload_ns", c->preload_ns);
    stats_guards(srv, l);
    stats_add_hist(l, &c->hist_queue_wait);
    stats_add_hist(l, &c->hist_gpu);
    stats_add_hist(l, &c->hist_scan_total);
    stats_add_hist(l, &c->hist_scan_bytes);
    stats_tenant(srv, uid, l);
}

void stats_collect(struct server *srv, uid_t uid, struct stats_list *l)
{
    stats_collect_as(srv, uid, true, l);
}
