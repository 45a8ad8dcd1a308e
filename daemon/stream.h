/*
 * Streams (issue 13, docs/protocol.md "Streams"): stream.open, stream.write
 * and stream.close of one connection. A stream holds a rules/streamscan
 * state and a reference to its catalog; its writes run on the CPU engine's
 * threads (engine_cpu_task), one at a time per stream and in arrival order,
 * tenants served in turn (docs/engine.md "Streams"). While a GPU engine
 * runs, the middle of a large write (stream-gpu-min-bytes) is queued as a
 * scan of its tenant and scanned in the GPU's batches; the write is
 * answered when its batch is back.
 *
 * Limits (vkscand.conf, docs/daemon.md): streams per tenant over all its
 * connections (stream-max-per-tenant), bytes of state per stream
 * (stream-max-state-bytes), and an idle timeout (stream-idle-timeout-ms):
 * an idle stream's state is freed and its next write or close gets a
 * TIMEOUT error that says so.
 *
 * Loop thread only (but for the writes themselves).
 */
#ifndef VKS_DAEMON_STREAM_H
#define VKS_DAEMON_STREAM_H

#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "proto.h"
#include "store.h"

struct server;
struct session;
struct stats_list;
struct stream_set;

/* The streams of one connection of tenant `uid`. Returns 0 or -ENOMEM. */
int stream_set_create(struct server *srv, uid_t uid, struct stream_set **out);

/* Closes every stream of the connection (the client left); NULL allowed. */
void stream_set_destroy(struct stream_set *set);

/*
 * Answers stream.open on `s` once `entry`, the catalog it names, is loaded
 * (borrowed: the stream takes its own reference). `req` is borrowed.
 */
void stream_open(struct stream_set *set, struct session *s, const struct proto_request *req,
                 struct store_entry *entry);

/*
 * Answers stream.write or stream.close on `s`. The request runs on a CPU
 * engine thread once the stream's earlier requests are done (one at a time
 * per stream, in arrival order); then session_stream_done(token) is called,
 * exactly once, also when the request fails at once or its connection
 * closed meanwhile. `req` is borrowed until then. `set` may be NULL (the
 * connection opened no stream yet).
 */
void stream_op(struct stream_set *set, struct session *s, const struct proto_request *req,
               void *token);

/* Frees the state of streams idle past stream-idle-timeout-ms at `now_ms`. */
void stream_set_sweep(struct stream_set *set, uint64_t now_ms);

/* Gives back the descriptor writes' kept head-and-tail buffers that are
 * over the pool's bound once the peak of their use has passed
 * (daemon/stream_run.c; the sweep timer, any thread). */
void stream_spare_trim(uint64_t now_ms);

/* Appends the stream limits (limit.stream_*) and the service-wide stream
 * counters (stream.*) to `l`. */
void stream_stats_add(const struct daemon_config *cfg, struct stats_list *l);

#endif
