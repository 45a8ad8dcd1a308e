/*
 * The vkscand server: the libuv loop and everything that lives on it — the
 * listening socket (bound here or passed by socket activation), the
 * sessions, signals (SIGTERM drains, SIGHUP reloads), the scheduler, the
 * catalog store and the engine worker, plus the counters `stats` reports.
 *
 * Loop thread only, except where a function says otherwise.
 */
#ifndef VKS_DAEMON_SERVER_H
#define VKS_DAEMON_SERVER_H

#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "engine.h"
#include "error.h"
#include "metrics.h"
#include "proto.h"
#include "scheduler.h"
#include "store.h"

#include "session_host.h"

/*
 * Starts the engine worker, opens the store (reading the disk cache) and
 * the listening socket (socket activation first, else binds
 * cfg->socket_path, replacing a stale socket file but refusing to take over
 * a live daemon's). `argv` is kept for SIGHUP, which re-reads flags and the
 * config file. `main_ns` is when main started (uv_hrtime; 0: now), for the
 * start-up times logged at ready. Returns 0 or a negative code with `err`
 * filled.
 */
int server_create(const struct daemon_config *cfg, int argc, char **argv, uint64_t main_ns,
                  struct server **out, struct vks_error *err);

/* Runs the loop until SIGTERM/SIGINT has drained the server (or the engine
 * failed to start). Returns the process exit status. */
int server_run(struct server *srv);

/* Frees what server_run left; NULL is allowed. */
void server_destroy(struct server *srv);

#endif
