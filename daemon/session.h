/*
 * One client connection: reads frames with proto_reader_recv (which also
 * collects descriptors passed with SCM_RIGHTS), decodes and answers requests,
 * queues scans with the scheduler, and writes replies in any order.
 *
 * A session is reference-counted: the socket's poll handle holds one
 * reference, every request in flight (a compile, a disk load, a queued or
 * running scan) holds one. Closing stops the poll handle (uv_close), drops
 * queued scans and lets running ones finish unseen; the memory goes in the
 * last unref, never inside one of the session's own callbacks.
 *
 * Loop thread only, but for session_scan_finished, which an engine thread
 * calls to write a scan's reply itself.
 */
#ifndef VKS_DAEMON_SESSION_H
#define VKS_DAEMON_SESSION_H

#include <stdbool.h>
#include <sys/types.h>

#include "engine.h"
#include "proto.h"
#include "scheduler.h"

struct server;
struct session;

/*
 * Starts serving the accepted socket `fd` (non-blocking; the session takes
 * ownership, also on failure). The tenant is the peer's uid (SO_PEERCRED).
 * Returns 0 or -errno.
 */
int session_create(struct server *srv, int fd, struct session **out);

/* Closes the connection: queued work dropped, replies not yet written lost. */
void session_close(struct session *s);

/* Closes the connection once every reply it is owed has been written
 * (SIGTERM drain). */
void session_close_when_done(struct session *s);

/* Whether the session has no request in flight and nothing left to write. */
bool session_idle(const struct session *s);

/* The tenant uid. */
uid_t session_uid(const struct session *s);

/* Reading was stopped for backpressure: read again if the quota allows. */
void session_resume(struct session *s);

/* Handles the frames waiting in the session's read-ahead (the server's
 * idle run, server_later), drops the list's reference, and returns the
 * next session of the list. */
struct session *session_run_later(struct session *s);

/* Applies frame-timeout-ms and idle-timeout-ms at `now_ms` (uv_now):
 * a session past one gets a TIMEOUT error and is closed. */
void session_sweep(struct session *s, uint64_t now_ms);

/* Batch plumbing for the server: the engine job of a scheduled scan, and the
 * hand-back of a finished one (replies, frees, releases the quota). */
struct engine_job *session_job_engine(struct sched_job *job);
void session_scan_done(struct engine_job *job, const struct engine_telemetry *tel);
/*
 * Engine thread, the one exception to "loop thread only": the scan's batch
 * is finished (engine_batch.finished) and its `done` will follow on the
 * loop. Encodes the reply and, when nothing else waits to be written on the
 * connection, writes it to the socket there, so the client has it before
 * the loop gets the batch back; session_scan_done then only counts and
 * frees. Touches nothing of the session but what its output lock guards
 * (the socket, the unsent bytes, whether it is closed) and the request,
 * which the loop leaves alone while the scan runs. Failed jobs, and replies
 * that cannot be encoded, are left to session_scan_done.
 */
void session_scan_finished(struct engine_job *job, const struct engine_telemetry *tel);

/* A queued scan the scheduler dropped for passing its deadline. */
void session_scan_expired(struct sched_job *job);

/* Replies for daemon/stream.c: encode and write (an error code is -VKS_E_*
 * or -errno, sent as INTERNAL); nothing happens on a closed session. */
void session_send_reply(struct session *s, const struct proto_reply *rep);
/* Sends the reply to request `id` (`op`) that a thread encoded in `b`. */
void session_send_encoded(struct session *s, uint32_t id, enum proto_op op, struct proto_buf *b);
void session_send_error(struct session *s, uint32_t id, enum proto_op op, int code,
                        const char *msg);

/* The session's scheduler tenant (its uid's), for daemon/stream.c's GPU
 * middles: borrowed while the session lives. */
struct sched_tenant *session_tenant(struct session *s);

/* daemon/stream.c is done with the stream.write or stream.close whose token
 * it got: frees the request (and its session reference). */
void session_stream_done(void *token);

#endif
