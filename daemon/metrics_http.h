/*
 * vkscand's Prometheus endpoint: with `metrics-listen HOST:PORT` the daemon
 * serves GET /metrics on that TCP address from its libuv loop, in the text
 * exposition format `vkscan status --prometheus` prints (common/prom.h).
 * Anything else gets 404 or 405. Service-wide series only; with
 * `metrics-tenants yes` also the tenant.* series of every uid with an open
 * connection, labelled uid="N".
 *
 * Loop thread only. The listener and its connections are unreferenced
 * handles: they never keep the loop (and so a draining daemon) alive.
 */
#ifndef VKS_DAEMON_METRICS_HTTP_H
#define VKS_DAEMON_METRICS_HTTP_H

#include <sys/socket.h>

#include "error.h"

struct server;
struct metrics_http;

/* Parses "HOST:PORT" (an IPv4 literal, or "[IPv6]:PORT") into `sa`.
 * Returns 0 or -EINVAL with `err` saying what is accepted. */
int metrics_http_parse_addr(const char *text, struct sockaddr_storage *sa, struct vks_error *err);

/* Binds and listens on `addr` (metrics-listen) on the server's loop. */
int metrics_http_create(struct server *srv, const char *addr, struct metrics_http **out,
                        struct vks_error *err);

/* Closes the listener and every connection and waits for their close
 * callbacks; NULL is allowed. Call before server_destroy. */
void metrics_http_destroy(struct metrics_http *m);

#endif
