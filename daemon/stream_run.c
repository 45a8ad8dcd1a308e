/*
 * Running stream requests (daemon/stream.c says where they run): a write or
 * close on a CPU engine thread, a write's middle in a scan batch and its
 * end back on a thread, the answers in each stream's order on the loop.
 */
#include "stream.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "log.h"
#include "scheduler.h"
#include "session.h"
#include "session_host.h"
#include "stats.h"
#include "stream_internal.h"
#include "streamscan.h"

#define READ_CHUNK (1u << 20) /* fd writes are read and scanned in pieces of this size */
/* ... or of this size where the stream's catalog takes the fast path
 * (docs/engine.md "Streams"): a piece's middle spreads over the threads */
#define READ_CHUNK_FAST STREAMSCAN_WHOLE_READ_MAX

/* Requests handed to the CPU engine and finished ones coming back. */
static struct {
    uv_async_t async; /* pool thread -> loop; unreferenced: it keeps no loop alive.
                       * Requests in flight hold their sessions, so a draining
                       * daemon waits for them before the engine closes */
    bool open;
    uint32_t inflight;       /* handed to the engine, not answered yet (loop) */
    uint64_t inflight_bytes; /* their `cost` (loop) */
    bool kick;               /* middles were queued since the last server_kick (loop) */
    uid_t last;              /* the tenant served last (loop) */
    pthread_mutex_t mu;      /* guards the done list */
    struct work *done_head, *done_tail;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---- buffers of descriptor writes whose middle runs in a batch ----
 *
 * Such a write needs a buffer of its length of which only the head and the
 * tail are ever read (write_fd; the batch reads the middle from the
 * descriptor), or all of it, up to 16 MiB, for a catalog whose unbounded
 * groups walk every byte (vkscan sends a large file in such pieces). A
 * fresh anonymous mapping per write costs an mmap, faults,
 * and an munmap whose TLB shootdown interrupts every core that runs a
 * daemon thread: for a flow reassembler's 64 KiB writes, two system calls
 * and an interrupt round per write, the munmap on the loop thread
 * (docs/PERFORMANCE.md "Session 28"). Mappings of up to SPARE_MAX bytes
 * are kept for reuse instead, by size class (powers of two). A kept
 * mapping has at most its class size of resident pages, so the bytes kept
 * bound what the reuse holds: SPARE_KEEP, or more while the writes in
 * flight need more. Kept up to SPARE_KEEP only, 64 clients of 64 writes
 * of 64 KiB (256 MiB in flight) mapped a new buffer for two writes in
 * three, and the mmap and munmap doubled a begin's time on the CPU
 * engine's threads (docs/PERFORMANCE.md "Session 32"). So the bound is
 * the most bytes of these buffers in use at once over the last two
 * windows of SPARE_HOLD_MS (the peak), when that is above SPARE_KEEP:
 * the pool then holds no more than the writes themselves held at their
 * peak, and stream_spare_trim (the sweep timer) gives back what is over
 * the bound once the peak has passed. A reused buffer's middle still
 * holds an earlier write's bytes; nothing reads them
 * (streamscan_split_plan names what streamscan_write_begin reads, and the
 * CPU fallback reads the whole range into it first). */
#define SPARE_MIN_SHIFT 14u /* 16 KiB */
#define SPARE_MAX_SHIFT 24u /* 16 MiB: vkscan's pieces of a large file */
#define SPARE_KEEP      (64u << 20)
#define SPARE_HOLD_MS   2000u

static struct {
    pthread_mutex_t mu;
    void *head[SPARE_MAX_SHIFT - SPARE_MIN_SHIFT + 1]; /* linked through their first word */
    uint64_t kept;                                     /* bytes in the lists */
    uint64_t reused, mapped;                           /* stream.sparse_reused, _mapped */
    uint64_t in_use;    /* bytes of kept-class buffers handed out now */
    uint64_t peak;      /* the most in_use since peak_ms */
    uint64_t peak_prev; /* the most in the window before (a lull between bursts trims nothing) */
    uint64_t peak_ms;
    uint64_t trimmed; /* stream.sparse_trimmed: buffers given back by stream_spare_trim */
} spare = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The bytes the lists may keep (mu held). */
static uint64_t spare_bound(void)
{
    uint64_t p = spare.peak > spare.peak_prev ? spare.peak : spare.peak_prev;
    return p > SPARE_KEEP ? p : SPARE_KEEP;
}

/* The class of a buffer of `len` bytes (its size: 1 << class), or 0 when
 * buffers that long are not kept. */
static unsigned spare_class(size_t len)
{
    if (len > ((size_t)1 << SPARE_MAX_SHIFT))
        return 0;
    unsigned c = SPARE_MIN_SHIFT;
    while (((size_t)1 << c) < len)
        c++;
    return c;
}

/* A buffer of at least `len` bytes whose pages are only touched where
 * written (its size in *cap), or NULL. */
static void *sparse_get(size_t len, size_t *cap)
{
    unsigned c = spare_class(len);
    void *p = NULL;
    if (c != 0) {
        len = (size_t)1 << c;
        pthread_mutex_lock(&spare.mu);
        if ((p = spare.head[c - SPARE_MIN_SHIFT]) != NULL) {
            spare.head[c - SPARE_MIN_SHIFT] = *(void **)p;
            spare.kept -= len;
            spare.reused++;
        } else {
            spare.mapped++;
        }
        spare.in_use += len;
        if (spare.in_use > spare.peak)
            spare.peak = spare.in_use;
        pthread_mutex_unlock(&spare.mu);
    }
    if (p == NULL) {
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                 0);
        if (p == MAP_FAILED) {
            if (c != 0) {
                pthread_mutex_lock(&spare.mu);
                spare.in_use -= len;
                pthread_mutex_unlock(&spare.mu);
            }
            return NULL;
        }
    }
    *cap = len;
    return p;
}

/* Gives back the write's buffer, kept for the next write where there is
 * room (any thread). */
static void sparse_put(struct work *w)
{
    void *p = w->sparse;
    size_t cap = w->sparse_cap;
    if (p == NULL)
        return;
    w->sparse = NULL;
    w->wbuf = NULL;
    unsigned c = spare_class(cap);
    if (c != 0 && cap == (size_t)1 << c) {
        pthread_mutex_lock(&spare.mu);
        spare.in_use -= cap;
        bool keep = spare.kept + cap <= spare_bound();
        if (keep) {
            *(void **)p = spare.head[c - SPARE_MIN_SHIFT];
            spare.head[c - SPARE_MIN_SHIFT] = p;
            spare.kept += cap;
        }
        pthread_mutex_unlock(&spare.mu);
        if (keep)
            return;
    }
    munmap(p, cap);
}

void stream_spare_trim(uint64_t now_ms)
{
    enum { CLASSES = SPARE_MAX_SHIFT - SPARE_MIN_SHIFT + 1 };
    void *drop[CLASSES] = {NULL}; /* per class, linked as in the lists */
    pthread_mutex_lock(&spare.mu);
    if (now_ms - spare.peak_ms >= SPARE_HOLD_MS) { /* a new window: the peak from now */
        spare.peak_prev = spare.peak;
        spare.peak = spare.in_use;
        spare.peak_ms = now_ms;
    }
    uint64_t bound = spare_bound();
    /* the largest buffers first: fewest unmaps for the bytes */
    for (unsigned k = CLASSES; k-- > 0 && spare.kept > bound;) {
        for (void *p; spare.kept > bound && (p = spare.head[k]) != NULL; spare.trimmed++) {
            spare.head[k] = *(void **)p;
            spare.kept -= (size_t)1 << (k + SPARE_MIN_SHIFT);
            *(void **)p = drop[k];
            drop[k] = p;
        }
    }
    pthread_mutex_unlock(&spare.mu);
    for (unsigned k = 0; k < CLASSES; k++)
        for (void *p = drop[k], *next; p != NULL; p = next) {
            next = *(void **)p;
            munmap(p, (size_t)1 << (k + SPARE_MIN_SHIFT));
        }
}

static _Atomic uint64_t fd_read_ns; /* stream.fd_read_ns: reading descriptor writes here */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Reads `n` bytes at `at` of the write's range into `dst`; 0 or
 * -VKS_E_BAD_FD with w->msg set. */
static int read_range(struct work *w, const struct proto_buffer *b, void *dst, uint64_t at,
                      uint64_t n)
{
    for (uint64_t done = 0; done < n;) {
        uint64_t t0 = mono_ns();
        ssize_t k =
            pread(b->fd, (uint8_t *)dst + done, (size_t)(n - done), (off_t)(b->offset + at + done));
        atomic_fetch_add_explicit(&fd_read_ns, mono_ns() - t0, memory_order_relaxed);
        if (k <= 0) {
            snprintf(w->msg, sizeof(w->msg), "reading the descriptor failed at byte %llu: %s",
                     (unsigned long long)(b->offset + at + done), k < 0 ? strerror(errno) : "EOF");
            return -VKS_E_BAD_FD;
        }
        done += (uint64_t)k;
    }
    return 0;
}

/* A descriptor write whose middle runs in a batch: only the bytes its head
 * and tail walk are read here, into a buffer of the write's size whose
 * other pages are never touched (sparse_get); the GPU engine's upload
 * threads read the middle from the descriptor themselves. The tail is
 * read first: it holds the last byte, which the split's plan needs, so a
 * write costs two reads. 1 when the write was begun (or failed: rc in
 * *rc), 0 when it is not split and the caller reads it whole. */
static int write_fd_split(struct work *w, const struct proto_buffer *b, uint64_t len, int *rc)
{
    size_t tl = streamscan_split_tail(w->st->scan, (size_t)len), hd, plan_tl;
    if (tl == 0)
        return 0;
    size_t cap;
    uint8_t *map = sparse_get((size_t)len, &cap);
    if (map == NULL) {
        *rc = -ENOMEM;
        return 1;
    }
    w->sparse = map;
    w->sparse_cap = cap;
    if (read_range(w, b, map + len - tl, len - tl, tl) != 0 ||
        !streamscan_split_plan(w->st->scan, (size_t)len, map[len - 1], w->batch_min, &hd,
                               &plan_tl)) { /* plan_tl == tl: both are split_tail's */
        sparse_put(w);                      /* a failed read is met again by the whole read */
        w->msg[0] = '\0';
        return 0;
    }
    /* the head, less what the tail already holds */
    *rc = read_range(w, b, map, 0, hd < len - tl ? hd : len - tl);
    if (*rc == 0)
        *rc =
            streamscan_write_begin(w->st->scan, map, (size_t)len, w->batch_min, &w->hits, &w->mid);
    if (*rc == 0 && !w->mid.pending) { /* streamscan_split_plan said it would be */
        snprintf(w->msg, sizeof(w->msg), "internal error: the write's middle was not split");
        w->bytes = len; /* the state moved past unread bytes: the stream must close */
        *rc = -VKS_E_INTERNAL;
    }
    if (*rc != 0) {
        sparse_put(w);
        return 1;
    }
    w->bytes = len;
    w->wbuf = map;
    w->wlen = (size_t)len;
    return 1;
}

/* Reads the fd range of a write and scans it in pieces (pool thread). */
static int write_fd(struct work *w, const struct proto_buffer *b)
{
    uint64_t size = w->fd_size; /* the loop's fstat for every write of a stream.writes */
    if (!w->fd_known) {
        struct stat sb;
        atomic_fetch_add_explicit(&stream_fd_stats, 1, memory_order_relaxed);
        if (fstat(b->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            snprintf(w->msg, sizeof(w->msg),
                     "the descriptor is not a regular file or memfd: pass an open file");
            return -VKS_E_BAD_FD;
        }
        size = (uint64_t)sb.st_size;
    }
    uint64_t len = b->has_length ? b->length : size - (b->offset < size ? b->offset : size);
    if (b->offset > size || len > size - b->offset) {
        snprintf(w->msg, sizeof(w->msg), "range %llu+%llu is outside the file of %llu bytes",
                 (unsigned long long)b->offset, (unsigned long long)len, (unsigned long long)size);
        return -VKS_E_BAD_FD;
    }
    if (len > w->max) {
        snprintf(w->msg, sizeof(w->msg),
                 "the write has %llu bytes, the limit (max-scan-bytes) is %llu: write less at "
                 "a time",
                 (unsigned long long)len, (unsigned long long)w->max);
        return -VKS_E_LIMIT;
    }
    int rc = 0;
    if (w->batch_min != 0 && len > w->batch_min && write_fd_split(w, b, len, &rc))
        return rc;
    size_t chunk = streamscan_fast(w->st->scan) ? READ_CHUNK_FAST : READ_CHUNK;
    uint8_t *buf = malloc(len < chunk ? (len ? len : 1) : chunk);
    if (buf == NULL)
        return -ENOMEM;
    for (uint64_t done = 0; done < len && rc == 0;) {
        size_t want = len - done < chunk ? (size_t)(len - done) : chunk;
        uint64_t t0 = mono_ns();
        ssize_t n = pread(b->fd, buf, want, (off_t)(b->offset + done));
        atomic_fetch_add_explicit(&fd_read_ns, mono_ns() - t0, memory_order_relaxed);
        if (n <= 0) {
            snprintf(w->msg, sizeof(w->msg), "reading the descriptor failed at byte %llu: %s",
                     (unsigned long long)(b->offset + done), n < 0 ? strerror(errno) : "EOF");
            rc = -VKS_E_BAD_FD;
            break;
        }
        rc = streamscan_write(w->st->scan, buf, (size_t)n, &w->hits);
        done += (uint64_t)n;
        w->bytes = done;
    }
    free(buf);
    return rc;
}

/* A stream in count mode answers one hit per rule: the write's first end
 * of it and how many ends the write completed (maybe millions of raw hits:
 * done where the write ran, off the loop). */
static void count_hits(struct work *w)
{
    if (w->rc == 0 && w->st->mode == SCAN_COUNT)
        scan_hits_finalize(&w->hits, streamscan_catalog(w->st->scan), SCAN_COUNT);
}

/* A write's end once its batch is back: the middle's hits join the
 * head's and the tail's. Reads only the catalog and the write's own
 * buffers (streamscan_write_end), so it runs on a pool thread or, when the
 * hits are few, on the loop while the stream's next write begins. */
static void middle_end(struct work *w)
{
    if (w->ej.hits_dropped > 0)
        w->rc = -E2BIG; /* more than middle_queue's bound */
    for (size_t i = 0; i < w->ej.n_hits && w->rc == 0; i++)
        w->rc = streamscan_middle_add(&w->mid, w->ej.hits[i].rule, w->ej.hits[i].end);
    engine_job_finish(&w->ej);
    if (w->rc == 0)
        w->rc = streamscan_write_end(w->st->scan, &w->mid, &w->hits);
    streamscan_middle_finish(&w->mid);
    sparse_put(w);
}

/*
 * A reply of at least this many hits is encoded on the thread that took
 * them (encode_reply), not on the loop: a 1 GiB write of a hit-dense stream
 * answers millions, about 80 ns each to encode, and the loop serves every
 * connection. Smaller replies go into the connection's buffer on the loop,
 * which saves a buffer allocated on one thread and freed on the other.
 */
#define STREAM_ENCODE_HITS 256u

/* The reply to a write or close with its hits (at most max-hits:
 * truncated): its parts, in *rep, point into *v (to free), *status and
 * tel[2]; -ENOMEM. */
static int build_reply(const struct work *w, struct proto_reply *rep, struct proto_hit **v,
                       struct proto_buffer_status *status, struct proto_stat tel[2])
{
    uint32_t n = w->hits.n < w->max_hits ? (uint32_t)w->hits.n : w->max_hits;
    *v = calloc(n ? n : 1, sizeof(**v));
    if (*v == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        (*v)[i] = (struct proto_hit){
            .rule = w->hits.v[i].rule, .end = w->hits.v[i].end, .count = w->hits.v[i].count};
    *status =
        (struct proto_buffer_status){.bytes = w->bytes, .hits = n, .truncated = w->hits.n > n};
    tel[0] = (struct proto_stat){.key = "stream_offset", .u = w->offset};
    tel[1] = (struct proto_stat){.key = "state_bytes", .u = w->st->state_bytes};
    *rep = (struct proto_reply){.id = w->req->id, .op = w->req->op};
    rep->u.scan = (struct proto_scan_reply){.hits = *v,
                                            .n_hits = n,
                                            .buffers = status,
                                            .n_buffers = 1,
                                            .telemetry = tel,
                                            .n_telemetry = 2};
    return 0;
}

/* On the thread where a write or close ran: encodes its reply into w->enc
 * when it is large (STREAM_ENCODE_HITS) and for the write alone (not an
 * item of a stream.writes). A failure leaves w->enc empty: the loop then
 * builds the reply, or answers the failure. */
static void encode_reply(struct work *w)
{
    if (w->rc != 0 || w->many != NULL || w->hits.n < STREAM_ENCODE_HITS)
        return;
    struct proto_reply rep;
    struct proto_hit *v;
    struct proto_buffer_status status;
    struct proto_stat tel[2];
    struct vks_error err;
    if (build_reply(w, &rep, &v, &status, tel) != 0)
        return;
    if (proto_reply_encode(&w->enc, &rep, &err) != 0) {
        proto_buf_finish(&w->enc);
    } else { /* freed by the thread that made them (session.c's early replies) */
        w->enc_hits = rep.u.scan.n_hits;
        scan_hits_finish(&w->hits);
    }
    free(v);
}

/* What every run of a request ends with: a hit bomb's error, and a count
 * mode's hits once the write is whole (`second`: its middle is back). */
static void work_settle(struct work *w, bool second)
{
    if (w->rc == -E2BIG) { /* refscan_raw_limit: the state moved, the matches are not all kept */
        snprintf(w->msg, sizeof(w->msg),
                 "the write completes more than %llu matches (4 x max-hits), which vkscand does "
                 "not hold: the stream is closed; write less at a time or raise max-hits",
                 (unsigned long long)refscan_raw_limit());
        w->rc = -VKS_E_LIMIT;
        w->broken = true;
        scan_hits_finish(&w->hits);
    }
    if (second || !w->mid.pending)
        count_hits(w);
}

/* The write or close itself, on a pool thread. */
static void work_run(struct work *w)
{
    const struct proto_buffer *b = w->buf;
    bool second = w->mid_hits || w->mid_cpu; /* the write's last step: its middle is back */
    if (w->mid_hits) { /* the batch's hits (maybe millions: sorted off the loop) */
        middle_end(w);
    } else if (w->mid_cpu) { /* its batch failed: the middle here, then the write's end */
        w->rc = w->sparse != NULL ? read_range(w, b, w->sparse, 0, w->wlen) : 0;
        if (w->rc == 0)
            w->rc = streamscan_middle_run(w->st->scan, w->wbuf, w->wlen, &w->mid);
        if (w->rc == 0)
            w->rc = streamscan_write_end(w->st->scan, &w->mid, &w->hits);
        streamscan_middle_finish(&w->mid);
        sparse_put(w);
    } else if (b == NULL) {
        w->rc = streamscan_close(w->st->scan, &w->hits);
    } else if (!b->is_fd && b->len > w->max) {
        snprintf(w->msg, sizeof(w->msg),
                 "the write has %llu bytes, the limit (max-scan-bytes) is %llu: write less at "
                 "a time",
                 (unsigned long long)b->len, (unsigned long long)w->max);
        w->rc = -VKS_E_LIMIT;
    } else if (!b->is_fd) {
        w->rc = w->batch_min != 0
                    ? streamscan_write_begin(w->st->scan, b->data, (size_t)b->len, w->batch_min,
                                             &w->hits, &w->mid)
                    : streamscan_write(w->st->scan, b->data, (size_t)b->len, &w->hits);
        w->bytes = w->rc == 0 ? b->len : 0;
        w->wbuf = b->data;
        w->wlen = (size_t)b->len;
    } else {
        w->rc = write_fd(w, b);
    }
    /* the answer may go out after the stream's next write has begun */
    if (!second)
        w->offset = streamscan_offset(w->st->scan);
    work_settle(w, second);
    if (second || !w->mid.pending)
        encode_reply(w);
}

/* Answers a write or close with its hits. */
static void reply_hits(struct work *w)
{
    uint64_t t0 = uv_hrtime();
    uint32_t n = w->enc.len != 0           ? w->enc_hits
                 : w->hits.n < w->max_hits ? (uint32_t)w->hits.n
                                           : w->max_hits;
    if (w->enc.len != 0) {
        session_send_encoded(w->s, w->req->id, w->req->op, &w->enc);
        stream_counters.thread_replies++;
    } else {
        struct proto_reply rep;
        struct proto_hit *v;
        struct proto_buffer_status status;
        struct proto_stat tel[2];
        if (build_reply(w, &rep, &v, &status, tel) != 0) {
            session_send_error(w->s, w->req->id, w->req->op, -ENOMEM, "out of memory for the hits");
            return;
        }
        session_send_reply(w->s, &rep);
        free(v);
    }
    stream_counters.hits += n;
    stream_counters.reply_ns += uv_hrtime() - t0;
}

/* Answers a finished write, or keeps its result for its stream.writes;
 * false when the stream cannot go on. */
static bool answer_write(struct work *w)
{
    stream_counters.writes++;
    stream_counters.bytes += w->bytes;
    struct item *it = w->many != NULL ? &w->many->items[w->index] : NULL;
    if (it != NULL) {
        it->bytes = w->bytes;
        it->rc = w->rc == -ENOMEM ? -VKS_E_INTERNAL : w->rc;
    }
    if (w->rc == 0) {
        if (it != NULL) { /* the hits move to the item */
            struct scan_hits h = it->hits;
            it->hits = w->hits;
            w->hits = h;
        } else {
            reply_hits(w);
        }
        return true;
    }
    bool intact = w->bytes == 0 && w->rc != -ENOMEM && !w->broken;
    char m[400];
    if (intact || w->broken)
        snprintf(m, sizeof(m), "%s", w->msg);
    else
        snprintf(m, sizeof(m), "the write failed after %llu bytes (%s): the stream is closed",
                 (unsigned long long)w->bytes, w->msg[0] ? w->msg : "out of memory");
    if (it != NULL)
        snprintf(it->msg, sizeof(it->msg), "%.239s", m);
    else
        session_send_error(w->s, w->req->id, w->req->op,
                           intact || w->rc != -ENOMEM ? w->rc : -VKS_E_INTERNAL, m);
    return intact;
}

static void submit(struct server *srv, struct work *w);
static int middle_queue(struct work *w);

/* Answers a request that is done (or, its connection gone, only drops it)
 * and frees it; the stream may be removed, not freed (settle holds it).
 * The session's token goes last: it may close the session. */
static void finish(struct work *w)
{
    struct stream *st = w->st;
    streamscan_middle_finish(&w->mid); /* a middle never run: its stream is gone */
    bool live = st->set != NULL && !w->cancelled;
    bool keep = live;
    if (live && w->req->op == PROTO_OP_STREAM_CLOSE) {
        struct item *it = w->many != NULL ? &w->many->items[w->index] : NULL;
        if (it != NULL) { /* one of a stream.close's `streams`: its hits move to the item */
            struct scan_hits h = it->hits;
            it->hits = w->hits;
            w->hits = h;
            it->rc = w->rc == 0 ? 0 : -VKS_E_INTERNAL;
            if (w->rc != 0)
                snprintf(it->msg, sizeof(it->msg), "out of memory closing the stream");
        } else if (w->rc == 0) {
            reply_hits(w);
        } else {
            session_send_error(w->s, w->req->id, w->req->op, -ENOMEM,
                               "out of memory closing the stream");
        }
        stream_counters.closed++;
        keep = false;
    } else if (live) {
        if (w->t_back != 0) { /* its middle ran in a batch */
            uint64_t now = uv_hrtime();
            stream_counters.batch_begin_ns += w->t_mid - w->t_in;
            if (w->t_ran >= w->t_in && w->t_ran_end >= w->t_ran && w->t_mid >= w->t_ran_end) {
                stream_counters.batch_begin_wait_ns += w->t_ran - w->t_in;
                stream_counters.batch_begin_back_ns += w->t_mid - w->t_ran_end;
            }
            stream_counters.batch_queue_ns +=
                w->t_back - w->t_mid -
                (w->engine_ns < w->t_back - w->t_mid ? w->engine_ns : w->t_back - w->t_mid);
            stream_counters.batch_engine_ns += w->engine_ns;
            stream_counters.batch_end_ns += now - w->t_back;
            if (w->t_end_ran >= w->t_back && w->t_end_ran_end >= w->t_end_ran) {
                stream_counters.batch_end_wait_ns += w->t_end_ran - w->t_back;
                stream_counters.batch_end_run_ns += w->t_end_ran_end - w->t_end_ran;
            }
        }
        keep = answer_write(w);
    } else if (w->many != NULL) { /* not answered: its stream or connection is gone */
        struct item *it = &w->many->items[w->index];
        it->rc = -VKS_E_BAD_VALUE;
        snprintf(it->msg, sizeof(it->msg), "stream %u was closed before this write ran", st->id);
    } else if (st->orphaned) { /* a write before it failed and closed the stream */
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "stream %u was closed by the failure of a write before this one: open a new "
                 "stream",
                 st->id);
        session_send_error(w->s, w->req->id, w->req->op, -VKS_E_BAD_VALUE, msg);
    }
    void *token = w->token;
    struct many *m = w->many;
    scan_hits_finish(&w->hits);
    proto_buf_finish(&w->enc);
    sparse_put(w);
    free(w);
    if (!keep && st->set != NULL)
        stream_remove(st->set, st);
    if (m != NULL)
        stream_many_item_done(m);
    else
        session_stream_done(token);
}

/* Answers the stream's done requests in their order, then starts its next
 * request (or frees it, once no connection holds it); the caller pumps. */
static void settle(struct stream *st)
{
    st->hold++;
    for (struct work *w; (w = st->a_head) != NULL && w->finished;) {
        if ((st->a_head = w->a_next) == NULL)
            st->a_tail = NULL;
        finish(w);
    }
    st->hold--;
    if (!stream_maybe_free(st))
        stream_start_next(st);
}

/* Back on the loop. A request whose own run is back takes its place in
 * the stream's answer order; a write whose middle goes to a batch is
 * answered when the batch is back, and the stream's next request may begin
 * now: its state is past the write. `status` is UV_ECANCELED when the
 * request never ran (the daemon is going away). */
void stream_work_done(struct work *w, int status)
{
    struct stream *st = w->st;
    struct server *srv = st->srv;
    if (!w->mid_hits && !w->mid_cpu) {
        st->running = false;
        st->t_active = uv_now(server_loop(srv));
        stream_answer_push(st, w);
        if (st->drop_pending) /* its stream failed while it ran: those behind it follow */
            stream_queue_behind(st);
        if (w->mid.pending && status == 0 && w->rc == 0 && st->set != NULL) {
            if (middle_queue(w) != 0) {
                w->mid_cpu = true;
                submit(srv, w);
            }
            stream_start_next(st);
            return;
        }
    }
    w->cancelled = status != 0;
    w->finished = true;
    settle(st);
}

static _Atomic uint64_t run_ns;   /* stream.run_ns: time in work_run on the threads */
_Atomic uint64_t stream_fd_stats; /* stream.fd_stats */

/* On a CPU engine thread: runs the request and hands it to the loop. */
static void task_run(struct engine_task *t)
{
    struct work *w = (struct work *)t;
    bool first = !w->mid_hits && !w->mid_cpu;
    uint64_t t0 = mono_ns();
    work_run(w);
    uint64_t t1 = mono_ns();
    if (first) { /* CLOCK_MONOTONIC, as uv_hrtime's t_in and t_mid */
        w->t_ran = t0;
        w->t_ran_end = t1;
    } else {
        w->t_end_ran = t0;
        w->t_end_ran_end = t1;
    }
    atomic_fetch_add_explicit(&run_ns, t1 - t0, memory_order_relaxed);
    pthread_mutex_lock(&pool.mu);
    w->next = NULL;
    if (pool.done_tail != NULL)
        pool.done_tail->next = w;
    else
        pool.done_head = w;
    pool.done_tail = w;
    pthread_mutex_unlock(&pool.mu);
    uv_async_send(&pool.async);
}

static struct work *take_done(void)
{
    pthread_mutex_lock(&pool.mu);
    struct work *w = pool.done_head;
    if (w != NULL && (pool.done_head = w->next) == NULL)
        pool.done_tail = NULL;
    pthread_mutex_unlock(&pool.mu);
    return w;
}

static void on_done(uv_async_t *a)
{
    struct server *srv = NULL;
    for (struct work *w; (w = take_done()) != NULL;) {
        pool.inflight--;
        pool.inflight_bytes -= w->cost;
        stream_counters.engine_runs++;
        srv = w->st->srv;
        stream_work_done(w, 0);
    }
    if (srv != NULL)
        stream_pump(srv);
    if (srv != NULL && pool.kick) { /* one batch for the middles of many writes */
        pool.kick = false;
        server_kick(srv);
    }
    (void)a;
}

/* ---- middles in scan batches ---- */

static struct engine_job *middle_job(struct sched_job *j)
{
    return &CONTAINER(j, struct work, sj)->ej;
}

/* A write whose middle's batch found at most this many of its hits ends
 * on the loop (middle_end: adding them and sorting the write's few hits,
 * microseconds) instead of going to a CPU engine thread and back, two
 * hand-offs that cost a flow reassembler's 64 KiB writes about 1 ms each
 * under load (H100 host, docs/PERFORMANCE.md "Session 32"). */
#define END_HERE_HITS 1024u

/* Back on the loop when the batch is: the write ends here when its middle
 * had few hits; else it goes to a CPU engine thread again, which adds the
 * hits of the middle and answers it, or, when the batch failed, scans the
 * middle itself. */
static void middle_done(struct engine_job *j, const struct engine_telemetry *tel)
{
    struct work *w = CONTAINER(j, struct work, ej);
    struct server *srv = w->st->srv;
    sched_job_done(server_sched(srv), &w->sj);
    int rc = j->status != 0 ? j->status : w->ebuf.status;
    if (rc != 0) {
        log_warn("stream %u: the batch of a write's middle failed (%s): scanning it on the CPU",
                 w->st->id, j->status != 0 ? j->err.msg : w->ebuf.msg);
        engine_job_finish(j);
        stream_counters.batch_fallbacks++;
        w->mid_cpu = true;
    } else {
        stream_counters.batch_writes++;
        stream_counters.batch_fd_writes += w->sparse != NULL;
        stream_counters.batch_bytes += w->wlen;
        stream_counters.batch_gpu += tel->gpu;
        stream_counters.batch_jobs += tel->jobs;
        const struct gpu_telemetry *g = &tel->gpu_tel;
        stream_counters.batch_fd_read_ns += tel->fd_read_ns;
        stream_counters.batch_plan_ns += g->plan_ns;
        stream_counters.batch_upload_ns += g->upload_ns;
        stream_counters.batch_device_ns += g->device_ns;
        stream_counters.batch_readback_ns += g->readback_ns;
        stream_counters.batch_finalize_ns += g->finalize_ns;
        stream_counters.batch_idle_ns += g->device_idle_ns;
        stream_counters.batch_kernel_ns += g->kernel_ns;
        stream_counters.batch_buffers_ns += g->buffers_made_ns;
        stream_counters.batch_buffers_bytes += g->buffers_made_bytes;
        stream_counters.batch_reruns += g->hit_reruns;
        w->t_back = uv_hrtime();
        w->engine_ns = tel->wall_ns;
        w->mid_hits = true;
        if (w->ej.n_hits <= END_HERE_HITS && w->ej.hits_dropped == 0) {
            w->t_end_ran = w->t_back;
            middle_end(w);
            w->t_end_ran_end = uv_hrtime();
            work_settle(w, true);
            stream_counters.loop_ends++;
            stream_work_done(w, 0);
            stream_pump(srv);
            return;
        }
    }
    submit(srv, w);
}

/* Queues the write's middle as a scan of its bytes by the write's tenant,
 * batched with other scans of its catalog. Returns 0 or -ENOMEM. */
static int middle_queue(struct work *w)
{
    struct stream *st = w->st;
    struct server *srv = st->srv;
    const struct proto_buffer *b = w->buf;
    if (w->sparse != NULL) /* the engine reads the descriptor itself */
        w->ebuf = (struct engine_buf){
            .fd = b->fd, .offset = b->offset, .length = w->wlen, .has_length = true};
    else
        w->ebuf = (struct engine_buf){.data = w->wbuf, .len = w->wlen, .fd = -1};
    /* no result cache: a stream's bytes are rarely seen twice, and a
     * cached fd range would hide what a stream costs */
    uint64_t bound = refscan_raw_limit(); /* past it the write fails (work_run) */
    w->ej = (struct engine_job){.cat = streamscan_catalog(st->scan),
                                .mode = SCAN_ALL,
                                .max_hits = bound < UINT32_MAX ? (uint32_t)bound : UINT32_MAX,
                                .no_cache = true,
                                .bufs = &w->ebuf,
                                .n_bufs = 1,
                                .uid = (uint32_t)st->uid,
                                .done = middle_done};
    w->sj = (struct sched_job){
        .key = st->entry, .bytes = w->wlen, .n_buffers = 1, .engine_job = middle_job};
    int rc = sched_push(server_sched(srv), session_tenant(w->s), &w->sj);
    if (rc != 0)
        return rc;
    w->t_mid = uv_hrtime();
    pool.kick = true; /* on_done kicks once for all the middles it queued */
    return 0;
}

/* The tenant's oldest ready request, or NULL. */
static struct work *take_ready(struct tenant_streams *t)
{
    struct work *w = t->ready_head;
    if (w != NULL && (t->ready_head = w->next) == NULL)
        t->ready_tail = NULL;
    return w;
}

static void uv_run_work(uv_work_t *uv)
{
    work_run(uv->data);
}

static void uv_work_done(uv_work_t *uv, int status)
{
    pool.inflight--;
    struct work *w = uv->data;
    pool.inflight_bytes -= w->cost;
    struct server *srv = w->st->srv;
    stream_work_done(w, status);
    stream_pump(srv);
    if (pool.kick) {
        pool.kick = false;
        server_kick(srv);
    }
}

/* Hands the `n` requests linked from `first` (through `next`) to the CPU
 * engine at once, or to libuv's pool when there is none. */
static void submit_list(struct server *srv, struct work *first, uint32_t n)
{
    struct engine *e = server_engine(srv);
    pool.inflight += n;
    for (struct work *w = first; w != NULL; w = w->next)
        pool.inflight_bytes += w->cost;
    if (e != NULL && !pool.open && uv_async_init(server_loop(srv), &pool.async, on_done) == 0) {
        uv_unref((uv_handle_t *)&pool.async);
        pool.open = true;
    }
    if (e != NULL && pool.open) {
        struct engine_task *head = NULL, **tail = &head;
        for (struct work *w = first; w != NULL; w = w->next) {
            w->task.run = task_run;
            *tail = &w->task;
            tail = &w->task.next;
        }
        *tail = NULL;
        engine_cpu_tasks(e, head, n);
        return;
    }
    for (struct work *w = first, *next; w != NULL; w = next) {
        next = w->next;
        w->uv.data = w;
        int rc = uv_queue_work(server_loop(srv), &w->uv, uv_run_work, uv_work_done);
        if (rc != 0) { /* not expected: libuv's queue takes any number of items */
            w->rc = -ENOMEM;
            uv_work_done(&w->uv, 0);
        }
    }
}

static void submit(struct server *srv, struct work *w)
{
    w->next = NULL;
    submit_list(srv, w, 1);
}

/* Requests handed out at once. At least one per CPU engine thread; past
 * that, up to POOL_DEPTH per thread while the handed-out bytes stay under
 * POOL_BYTES per thread, so that a thread that finishes a small write
 * takes the next from the engine's queue at once instead of waiting for
 * the loop to answer and hand out more (H200, docs/PERFORMANCE.md
 * "Session 14": with one per thread, 10,000 flows of 64 KiB writes kept
 * 15 threads 8-16% busy), while large writes, whose turns are what tenant
 * fairness is about, still go out about one per thread. */
#define POOL_DEPTH 16u
#define POOL_BYTES (512u << 10)

static uint32_t pool_threads(struct server *srv)
{
    struct engine *e = server_engine(srv);
    uint32_t n = e != NULL && engine_serving(e) ? engine_get_info(e)->cpu_threads : 1;
    return n ? n : 1;
}

/* The bytes a request counts while handed out (a descriptor range with no
 * length: as much as a thread's share). A write whose middle will likely
 * go to a scan batch counts only the head and tail its thread walks: it
 * counted its whole length before, so 120 such 64 KiB writes filled the
 * H100 host's 15 threads' share while the threads sat 2% busy. (That was
 * not what a flow reassembler's writes waited 1 ms for before their
 * begin: the wait stayed; docs/PERFORMANCE.md "Session 32".) */
static uint64_t work_cost(const struct work *w)
{
    const struct proto_buffer *b = w->buf;
    if (b == NULL)
        return 0;
    if (b->is_fd && !b->has_length)
        return POOL_BYTES;
    uint64_t len = b->is_fd ? b->length : b->len;
    if (w->batch_min == 0 || len <= w->batch_min || len > w->max || w->st->scan == NULL)
        return len;
    return streamscan_split_cost(w->st->scan, (size_t)len, w->batch_min);
}

/* Hands ready requests to the engine while it has room, taking tenants in
 * turn from the one after the last served. */
void stream_pump(struct server *srv)
{
    uint32_t threads = pool_threads(srv);
    /* a large write of a bounded catalog scans its middle in pieces on as
     * many threads as the CPU engine has (streamscan's own pool: one large
     * stream reaches block mode's rate; writes of many streams at once
     * share the cores with the engine's threads) */
    streamscan_set_threads(threads, 0);
    struct work *head = NULL, **tail = &head;
    uint32_t n = 0;
    uint64_t bytes = pool.inflight_bytes;
    while (pool.inflight + n < POOL_DEPTH * threads) {
        struct tenant_streams *pick = NULL, *first = NULL;
        for (struct tenant_streams *t = stream_tenants; t != NULL; t = t->next) {
            if (t->ready_head == NULL)
                continue;
            if (first == NULL || t->uid < first->uid)
                first = t;
            if (t->uid > pool.last && (pick == NULL || t->uid < pick->uid))
                pick = t;
        }
        if (pick == NULL && (pick = first) == NULL)
            break;
        uint64_t cost = work_cost(pick->ready_head);
        if (pool.inflight + n >= threads && bytes + cost > (uint64_t)POOL_BYTES * threads)
            break;
        bytes += cost;
        pool.last = pick->uid;
        struct work *w = take_ready(pick);
        w->cost = cost;
        w->next = NULL;
        *tail = w;
        tail = &w->next;
        n++;
    }
    submit_list(srv, head, n); /* one wake-up for all */
}

/* The stream's next request becomes ready, unless one is ready or runs;
 * the caller pumps. */
void stream_start_next(struct stream *st)
{
    struct work *w = st->q_head;
    if (w == NULL || st->running || (w->buf == NULL && st->a_head != NULL))
        return; /* one at a time; a close after every write is answered */
    st->q_head = w->next;
    if (st->q_head == NULL)
        st->q_tail = NULL;
    st->running = true;
    stream_counters.overlapped += st->a_head != NULL; /* one before it is in a batch */
    struct tenant_streams *t = stream_tenant_of(st->uid, false);
    if (t == NULL) { /* not expected: an open stream counts in its tenant */
        w->rc = -ENOMEM;
        stream_work_done(w, 0);
        return;
    }
    w->next = NULL;
    if (t->ready_tail != NULL)
        t->ready_tail->next = w;
    else
        t->ready_head = w;
    t->ready_tail = w;
}

/* A close of `st` run on the loop: nothing is queued before it, and it
 * only settles the held byte and the end-anchored matches (microseconds),
 * where a thread would cost two hand-offs; a flow reassembler closes as
 * often as it opens (H200, docs/PERFORMANCE.md "Session 14"). */
bool stream_close_here(struct stream *st, struct work *w)
{
    if (st->running || st->q_head != NULL || st->a_head != NULL)
        return false;
    w->st = st;
    w->max_hits = stream_reply_max_hits(server_config(st->srv));
    st->running = true;
    w->rc = streamscan_close(st->scan, &w->hits);
    w->offset = streamscan_offset(st->scan);
    count_hits(w);
    stream_counters.loop_closes++;
    stream_work_done(w, 0);
    return true;
}

void stream_run_stats_add(struct stats_list *l)
{
    stats_add_u(l, "stream.run_ns", atomic_load_explicit(&run_ns, memory_order_relaxed));
    stats_add_u(l, "stream.fd_stats", atomic_load_explicit(&stream_fd_stats, memory_order_relaxed));
    stats_add_u(l, "stream.fd_read_ns", atomic_load_explicit(&fd_read_ns, memory_order_relaxed));
    struct streamscan_counters c;
    streamscan_counters(&c);
    stats_add_u(l, "stream.scan_whole_ns", c.whole_ns);
    stats_add_u(l, "stream.scan_head_ns", c.head_ns);
    stats_add_u(l, "stream.scan_middle_ns", c.middle_ns);
    stats_add_u(l, "stream.scan_tail_ns", c.tail_ns);
    stats_add_u(l, "stream.scan_deliver_ns", c.deliver_ns);
    stats_add_u(l, "stream.scan_factor_ns", c.factor_ns);
    stats_add_u(l, "stream.scan_mixed_writes", c.mixed_writes);
    stats_add_u(l, "stream.scan_walk_pieces", c.walk_pieces);
    stats_add_u(l, "stream.scan_spec_fixes", c.spec_fixes);
    stats_add_u(l, "stream.scan_walk_lanes", c.walk_lanes);
    pthread_mutex_lock(&spare.mu);
    uint64_t reused = spare.reused, mapped = spare.mapped, kept = spare.kept;
    uint64_t peak = spare.peak, trimmed = spare.trimmed;
    pthread_mutex_unlock(&spare.mu);
    stats_add_u(l, "stream.sparse_reused", reused);
    stats_add_u(l, "stream.sparse_mapped", mapped);
    stats_add_u(l, "stream.sparse_kept_bytes", kept);
    stats_add_u(l, "stream.sparse_peak_bytes", peak);
    stats_add_u(l, "stream.sparse_trimmed", trimmed);
}
