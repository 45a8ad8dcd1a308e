/*
 * What a session (and the stats op) may ask of the server: the narrow
 * interface between daemon/session.c and daemon/server.c. A session sees
 * the shared services (loop, configuration, scheduler, store, engine,
 * counters), hands batches and deadlines back, and registers itself; it
 * never sees how the server listens, drains or reloads (server.h).
 *
 * Loop thread only.
 */
#ifndef VKS_DAEMON_SESSION_HOST_H
#define VKS_DAEMON_SESSION_HOST_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "config.h"
#include "engine.h"
#include "metrics.h"
#include "proto.h"
#include "scheduler.h"
#include "store.h"

struct server;
struct session;

/* Service-wide counters (the stats op). replies_ok, replies_error, scans,
 * scan_bytes, scan_hits and the histograms are updated and read with atomics:
 * an engine thread that writes a scan's reply counts it first
 * (session_scan_finished), so a stats request sent after a reply sees it. */
struct server_counters {
    uint64_t connections_total;
    uint64_t connections_refused;           /* over max-connections */
    uint64_t connections_denied;            /* not in allow-uids / allow-gids */
    uint64_t requests[PROTO_OP_COUNT];      /* decoded (PROTO_OP_NONE: frames that did not) */
    uint64_t replies_ok[PROTO_OP_COUNT];    /* answered with a result */
    uint64_t replies_error[PROTO_OP_COUNT]; /* answered with an error */
    uint64_t errors;                        /* error replies */
    uint64_t frame_errors;                  /* connections closed for a broken frame */
    uint64_t scans;                         /* scan requests answered with a result */
    uint64_t scan_bytes;                    /* bytes scanned */
    uint64_t scan_hits;                     /* hits reported */
    uint64_t timeouts;
    uint64_t cancelled;    /* scans dropped because their client left */
    uint64_t backpressure; /* times a session stopped being read */
    uint64_t reloads;
    uint64_t output_limit_closes; /* connections closed past max-unsent-bytes */
    uint64_t frame_timeouts;      /* connections closed past frame-timeout-ms */
    uint64_t idle_closes;         /* connections closed past idle-timeout-ms */
    uint64_t frame_budget_waits;  /* frames that waited for frame-budget */
    uint64_t read_ahead;          /* connections whose hello turned read-ahead on */
    uint64_t tenant_refused;      /* connections over tenant-max-connections */
    uint64_t accept_fd_limit;     /* accept() hit EMFILE/ENFILE (then backed off) */
    uint64_t start_ready_ns;      /* main's start to ready (0 before) */
    uint64_t start_accept_ns;     /* main's start to the first accept (0: at ready, --engine gpu) */
    uint64_t preload_catalogs;    /* catalogs preloaded at start, on every GPU engine */
    uint64_t preload_ns;          /* ready to the preload's end */
    uint64_t preload_done;        /* 1 once the preload ended */
    struct metrics_hist hist_queue_wait; /* per scan answered: enqueue -> dispatch */
    struct metrics_hist hist_gpu;        /* per batch: run_ns (kernel, or the CPU scan) */
    struct metrics_hist hist_scan_total; /* per scan answered: receipt -> reply */
    struct metrics_hist hist_scan_bytes; /* per scan answered: bytes scanned */
};

uv_loop_t *server_loop(struct server *srv);
const struct daemon_config *server_config(const struct server *srv);
struct sched *server_sched(struct server *srv);
struct store *server_store(struct server *srv);
struct engine *server_engine(struct server *srv);
struct server_counters *server_counters(struct server *srv);
void server_proto_limits(const struct server *srv, struct proto_limits *out);
uint64_t server_start_ns(const struct server *srv);
bool server_draining(const struct server *srv);

/* Hands queued scans to the engine while it has room. */
void server_kick(struct server *srv);

/* Arms the deadline timer for the earliest queued deadline. */
void server_watch_deadlines(struct server *srv);

/* Re-enables reading on every session of `uid` that backpressure paused,
 * where the tenant is now under its quota. */
void server_resume_tenant(struct server *srv, uid_t uid);

/* Sessions register themselves so the server can resume, count and drain
 * them; a session unregisters in its close callback. */
void server_session_add(struct server *srv, struct session *s);
void server_session_remove(struct server *srv, struct session *s);

/* The list of sessions to run before the loop next polls (session.c links
 * them through session_run_later); asking for it schedules that run. */
struct session **server_later(struct server *srv);

uint32_t server_session_count(const struct server *srv);

/* Counts the open sessions of `uid`. */
uint32_t server_uid_sessions(const struct server *srv, uid_t uid);

/* Lists the distinct uids with an open session, at most `cap` of them, into
 * `out`; returns how many (the metrics endpoint's metrics-tenants). */
uint32_t server_session_uids(const struct server *srv, uid_t *out, uint32_t cap);

/* The frame budget (frame-budget): a session reserves a frame's announced
 * length before reading its body. Succeeds when the budget has room, or when
 * nothing is reserved (one frame up to max-frame always proceeds); otherwise
 * the session waits and is resumed by a later release. */
bool server_frame_reserve(struct server *srv, uint64_t bytes);
void server_frame_release(struct server *srv, uint64_t bytes);
uint64_t server_frame_reserved(const struct server *srv);

/* Called when a session finished something, so a draining server can check
 * whether it is done. */
void server_check_drained(struct server *srv);

#endif
