/*
 * What daemon/stream.c (the requests' protocol side: stream tables, opens,
 * queues, stream.writes, sweeps, stats) and daemon/stream_run.c (running
 * them: writes on the CPU engine's threads, middles in scan batches,
 * answers in order) share. Loop thread unless a comment says otherwise.
 * Nothing outside daemon/stream*.c includes this.
 */
#ifndef VKSCAND_STREAM_INTERNAL_H
#define VKSCAND_STREAM_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine.h"
#include "scheduler.h"
#include "stream.h"
#include "streamscan.h"

struct work;

struct stream {
    struct stream *next, **pprev; /* in set->list: unlinked in O(1) */
    struct stream_set *set;       /* NULL once its connection closed while a write ran */
    struct server *srv;
    uid_t uid;
    uint32_t id;
    struct streamscan *scan; /* NULL once expired */
    struct store_entry *entry;
    uint64_t t_active; /* uv_now of the last request */
    size_t state_bytes;
    enum scan_mode mode;          /* SCAN_ALL, or SCAN_COUNT: a hit per rule and write */
    struct work *q_head, *q_tail; /* writes and the close waiting their turn */
    struct work *a_head, *a_tail; /* requests that have run, not answered yet: in order */
    uint32_t hold;                /* settle() runs: not freed under it */
    bool running;                 /* one of them is ready or runs (on the CPU engine) */
    bool closing;                 /* a close is queued: the id takes no more requests */
    bool orphaned; /* removed while its connection is open: what is in a_head gets an error */
    /* orphaned while a request of it ran: the queued ones are answered
     * (with the error) behind it once it is back (stream_work_done) */
    bool drop_pending;
};

/* One stream.write or stream.close: queued on its stream, then ready in
 * its tenant's queue, run on a CPU engine thread (only `st->scan`, the
 * request's bytes and descriptor are touched there), answered on the loop.
 * `req` is borrowed until session_stream_done (token). */
struct work {
    struct engine_task task; /* first: the task is the work */
    uv_work_t uv;            /* when no engine runs (not expected): libuv's pool */
    struct work *next;
    struct work *a_next; /* in st->a_head */
    struct stream *st;
    struct session *s;
    const struct proto_request *req;
    const struct proto_buffer *buf; /* the write's bytes or range (NULL: a close) */
    void *token;                    /* NULL for an item of a stream.writes */
    struct many *many;              /* the stream.writes this write is item `index` of */
    uint32_t index;
    uint64_t max;      /* max-scan-bytes */
    uint32_t max_hits; /* max-hits */
    uint64_t fd_size;  /* a descriptor write's file size, when fd_known */
    bool fd_known;     /* fstat on the loop, once per descriptor of a stream.writes */
    struct scan_hits hits;
    uint64_t bytes;
    int rc;
    char msg[256];
    /* An inline write whose middle runs in a scan batch, as a block scan
     * of the write (docs/engine.md "Streams"): streamscan leaves it in
     * `mid`; the job is queued like a scan request of the tenant. */
    uint64_t cost;       /* bytes it counts in pool.inflight_bytes while handed out */
    size_t batch_min;    /* stream-gpu-min-bytes while a GPU engine runs; 0: never */
    const uint8_t *wbuf; /* the write's bytes: the frame's, or `sparse` */
    size_t wlen;
    void *sparse; /* a descriptor write's buffer (owned, sparse_get): head and tail read */
    size_t sparse_cap;
    struct streamscan_middle mid;
    bool mid_cpu;    /* the batch failed: the middle runs on a CPU engine thread */
    bool broken;     /* failed after its state moved (a hit bomb): the stream closes */
    bool mid_hits;   /* the batch is back: its hits go to the write on a CPU engine thread */
    bool finished;   /* nothing runs for it any more: answered in its turn */
    bool cancelled;  /* it never ran (the daemon is going away) */
    uint64_t offset; /* the stream's offset after it (taken where it ran) */
    /* the reply of a write or close with STREAM_ENCODE_HITS hits or more,
     * encoded where it ran; the loop sends it in the stream's turn */
    struct proto_buf enc;
    uint32_t enc_hits; /* the hits in it (w->hits is then freed) */
    /* where a batched write's time goes (loop clock, ns): queued on its
     * stream, middle queued, batch back; and the engine's wall time; and
     * (the same clock, set on the thread) when its begin started and ended */
    uint64_t t_in, t_mid, t_back, engine_ns;
    uint64_t t_ran, t_ran_end;
    uint64_t t_end_ran, t_end_ran_end; /* the end's run (thread or loop), the same clock */
    struct sched_job sj;
    struct engine_job ej;
    struct engine_buf ebuf;
};

#define CONTAINER(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* One stream.writes: its items run as writes of their streams (in parallel
 * across streams, in order within one) and are answered together, as a
 * scan of as many buffers, once the last is done. */
struct item {
    struct scan_hits hits;
    uint64_t bytes;
    int rc;
    char msg[240];
};

struct many {
    struct session *s;
    const struct proto_request *req;
    void *token;
    uint32_t n; /* items */
    uint32_t max_hits;
    uint32_t left; /* items not done yet */
    struct item *items;
};

/* Open streams per uid, over all connections, and their ready requests.
 * An entry lives while the uid has a stream open; a stream with a ready
 * request is `running` and stays open until it is answered. */
struct tenant_streams {
    struct tenant_streams *next;
    uid_t uid;
    uint32_t n;
    struct work *ready_head, *ready_tail;
};
extern struct tenant_streams *stream_tenants; /* stream.c */

/* Service-wide stream counters (stream_stats_add). */
struct stream_counters {
    uint64_t open, opened, closed, expired, dropped, writes, bytes, hits, state_bytes, engine_runs;
    uint64_t batch_writes, batch_fd_writes, batch_bytes, batch_gpu, batch_fallbacks;
    uint64_t loop_closes, loop_ends, overlapped;
    uint64_t batch_begin_ns, batch_queue_ns, batch_engine_ns, batch_end_ns, batch_jobs;
    uint64_t batch_begin_wait_ns, batch_begin_back_ns; /* of begin: before and after its run */
    uint64_t batch_end_wait_ns, batch_end_run_ns;      /* of end: for a thread, its run */
    uint64_t reply_ns;       /* loop time answering writes and closes (hits encoded and sent) */
    uint64_t thread_replies; /* of those, replies encoded on the thread that ran them */
    /* the engine's phases of those batches, summed per write like batch_engine_ns */
    uint64_t batch_fd_read_ns, batch_plan_ns, batch_upload_ns, batch_device_ns, batch_readback_ns,
        batch_finalize_ns, batch_idle_ns, batch_kernel_ns, batch_buffers_ns, batch_buffers_bytes;
    uint64_t batch_reruns; /* passes of those batches re-run for a full hit ring, per write */
};
extern struct stream_counters stream_counters; /* stream.c */
/* stream.fd_stats: fstat calls for descriptor writes (loop and threads) */
extern _Atomic uint64_t stream_fd_stats; /* stream_run.c */

/* stream.c: the stream's entry in its tenant's list (created on demand). */
struct tenant_streams *stream_tenant_of(uid_t uid, bool create);
/* stream.c: unlinks and frees the stream, or only unlinks one that runs. */
void stream_remove(struct stream_set *set, struct stream *st);
/* stream.c: `w` takes the last place in the stream's answer order. */
void stream_answer_push(struct stream *st, struct work *w);
/* stream.c: the stream's queued requests join its answer order behind
 * what is in it, done, to be answered with the error of an orphaned
 * stream (settle, finish). */
void stream_queue_behind(struct stream *st);
/* stream.c: frees a stream no connection holds once nothing of it is left. */
bool stream_maybe_free(struct stream *st);
/* stream.c: item `index` of `m` is answered; the last answers the request. */
void stream_many_item_done(struct many *m);

/* stream_run.c: the stream's next request becomes ready, unless one is
 * ready or runs; the caller pumps. */
void stream_start_next(struct stream *st);
/* stream_run.c: hands ready requests to the CPU engine while it has room. */
void stream_pump(struct server *srv);
/* stream_run.c: a request's own run is back (status: 0, or UV_ECANCELED
 * when it never ran). */
void stream_work_done(struct work *w, int status);
/* stream_run.c: runs a close on the loop when nothing of its stream is
 * queued or running (true), else leaves it to be queued (false). */
bool stream_close_here(struct stream *st, struct work *w);
/* stream_run.c: stream.run_ns and the head-and-tail buffers' counters. */
void stream_run_stats_add(struct stats_list *l);

/* Hits one stream reply may carry: max-hits, and no more than fit
 * max-unsent-bytes and libvkscan's 64 MiB max_frame at 25 bytes a hit
 * (the most one takes: [buffer, rule, end, count]), past which the
 * connection would be closed or the reply refused; 1 MiB is kept for the
 * statuses. Past it the reply is cut as at max-hits. */
static inline uint32_t stream_reply_max_hits(const struct daemon_config *cfg)
{
    uint64_t room = cfg->max_unsent_bytes < PROTO_DEFAULT_MAX_FRAME ? cfg->max_unsent_bytes
                                                                    : PROTO_DEFAULT_MAX_FRAME;
    room = room > (2u << 20) ? room - (1u << 20) : room / 2;
    return room / 25 < cfg->max_hits ? (uint32_t)(room / 25) : cfg->max_hits;
}

#endif
