/*
 * Streams of one connection (stream.h). Each stream is a rules/streamscan
 * state plus a reference to its catalog's store entry. The per-tenant
 * stream count is service-wide (one table, loop thread only).
 *
 * Where requests run. A stream's next request becomes ready when the one
 * before it has run; ready requests wait in their tenant's queue and are
 * handed to the CPU engine's threads (engine_cpu_task), at most one per
 * thread at a time, taking tenants in turn: a tenant with many busy streams
 * gets no more of the pool than one with a single stream. The pool threads
 * alternate between these and scan batches. A thread reports a finished
 * request through `pool.async`, and the loop answers it. A write whose
 * middle goes to a scan batch (streamscan_write_begin) comes back to the
 * loop to queue the batch job; when the batch is back (middle_done) it runs
 * on an engine thread again to take the batch's hits, and the loop answers
 * it. The stream's state is past such a write as soon as its begin has
 * run, so the stream's next write begins while the middle is in a batch
 * (several middles of one stream share batches or overlap on the device);
 * a stream's answers wait in `a_head` and go out in the order of its
 * requests, and a close waits until every write before it is answered.
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
#include "streamscan.h"

#define READ_CHUNK  (1u << 20) /* fd writes are read and scanned in pieces of this size */
#define MAX_EXPIRED 64u        /* expired ids remembered per connection, for the error */

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
    uint64_t max; /* max-scan-bytes */
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
    /* where a batched write's time goes (loop clock, ns): queued on its
     * stream, middle queued, batch back; and the engine's wall time */
    uint64_t t_in, t_mid, t_back, engine_ns;
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

struct stream_set {
    struct server *srv;
    uid_t uid;
    uint32_t next_id;
    uint32_t n_expired;
    struct stream *list;
    /* the streams of `list` by id: open addressing, linear probing, at
     * most half full (a flow reassembler writes to thousands of streams
     * of one connection in turn) */
    struct stream **tab;
    uint32_t tab_cap, tab_n; /* tab_cap: 0 or a power of two */
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
static struct tenant_streams *tenants;

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

static struct {
    uint64_t open, opened, closed, expired, dropped, writes, bytes, hits, state_bytes, engine_runs;
    uint64_t batch_writes, batch_fd_writes, batch_bytes, batch_gpu, batch_fallbacks;
    uint64_t loop_closes, overlapped;
    uint64_t batch_begin_ns, batch_queue_ns, batch_engine_ns, batch_end_ns, batch_jobs;
    /* the engine's phases of those batches, summed per write like batch_engine_ns */
    uint64_t batch_fd_read_ns, batch_plan_ns, batch_upload_ns, batch_device_ns, batch_readback_ns,
        batch_finalize_ns, batch_idle_ns;
} counters;

static uint32_t slot_of(uint32_t id, uint32_t cap)
{
    return (id * 2654435761u) & (cap - 1);
}

static struct stream *set_lookup(const struct stream_set *set, uint32_t id)
{
    if (set == NULL || set->tab_cap == 0)
        return NULL;
    for (uint32_t i = slot_of(id, set->tab_cap);; i = (i + 1) & (set->tab_cap - 1)) {
        struct stream *st = set->tab[i];
        if (st == NULL || st->id == id)
            return st;
    }
}

/* Adds `st` to the table (growing it first); -ENOMEM. */
static int set_insert(struct stream_set *set, struct stream *st)
{
    if (2 * (set->tab_n + 1) > set->tab_cap) {
        uint32_t cap = set->tab_cap ? 2 * set->tab_cap : 16;
        struct stream **tab = calloc(cap, sizeof(*tab));
        if (tab == NULL)
            return -ENOMEM;
        for (uint32_t i = 0; i < set->tab_cap; i++) {
            struct stream *x = set->tab[i];
            if (x == NULL)
                continue;
            uint32_t j = slot_of(x->id, cap);
            while (tab[j] != NULL)
                j = (j + 1) & (cap - 1);
            tab[j] = x;
        }
        free(set->tab);
        set->tab = tab;
        set->tab_cap = cap;
    }
    uint32_t i = slot_of(st->id, set->tab_cap);
    while (set->tab[i] != NULL)
        i = (i + 1) & (set->tab_cap - 1);
    set->tab[i] = st;
    set->tab_n++;
    return 0;
}

/* Removes `st`, moving the entries after it back so that every probe
 * chain stays unbroken (no tombstones). */
static void set_delete(struct stream_set *set, const struct stream *st)
{
    if (set->tab_cap == 0)
        return;
    uint32_t mask = set->tab_cap - 1, i = slot_of(st->id, set->tab_cap);
    while (set->tab[i] != st) {
        if (set->tab[i] == NULL)
            return; /* not expected: every listed stream is in the table */
        i = (i + 1) & mask;
    }
    set->tab[i] = NULL;
    set->tab_n--;
    for (uint32_t j = (i + 1) & mask; set->tab[j] != NULL; j = (j + 1) & mask) {
        uint32_t home = slot_of(set->tab[j]->id, set->tab_cap);
        /* the entry at j may move to the hole at i unless its home lies
         * cyclically in (i, j] */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        set->tab[i] = set->tab[j];
        set->tab[j] = NULL;
        i = j;
    }
}

static struct tenant_streams *tenant_of(uid_t uid, bool create)
{
    for (struct tenant_streams *t = tenants; t != NULL; t = t->next)
        if (t->uid == uid)
            return t;
    if (!create)
        return NULL;
    struct tenant_streams *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->uid = uid;
    t->next = tenants;
    tenants = t;
    return t;
}

static void tenant_put(uid_t uid)
{
    struct tenant_streams **p = &tenants;
    for (; *p != NULL && (*p)->uid != uid; p = &(*p)->next)
        ;
    if (*p == NULL || --(*p)->n > 0)
        return;
    struct tenant_streams *t = *p;
    *p = t->next;
    free(t);
}

int stream_set_create(struct server *srv, uid_t uid, struct stream_set **out)
{
    struct stream_set *set = calloc(1, sizeof(*set));
    if (set == NULL)
        return -ENOMEM;
    set->srv = srv;
    set->uid = uid;
    set->next_id = 1;
    *out = set;
    return 0;
}

/* Frees the stream's state and catalog reference; the entry stays. */
static void stream_release(struct stream *st)
{
    if (st->scan == NULL)
        return;
    streamscan_destroy(st->scan);
    st->scan = NULL;
    store_entry_unref(server_store(st->srv), st->entry);
    st->entry = NULL;
    counters.open--;
    counters.state_bytes -= st->state_bytes;
    tenant_put(st->uid);
}

static void many_item_done(struct many *m);

/* Answers the requests still queued on `st` with `msg` (none when the
 * connection is gone) and hands them back to the session; when requests
 * that ran before them wait to be answered, queues them behind those with
 * the error instead, so replies keep their order. */
static void drop_queue(struct stream *st, const char *msg)
{
    if (msg != NULL && st->a_head != NULL) {
        /* Writes that began before these still run (their middles in a GPU
         * batch): these are answered after them, in order, with the error
         * of a stream a failed write closed (settle, finish). Answered here,
         * they overtook the replies of the writes ahead of them. */
        for (struct work *w = st->q_head; w != NULL; w = w->next) {
            w->finished = true;
            w->a_next = NULL;
            st->a_tail->a_next = w;
            st->a_tail = w;
        }
        st->q_head = st->q_tail = NULL;
        return;
    }
    for (struct work *w = st->q_head, *next; w != NULL; w = next) {
        next = w->next;
        if (w->many != NULL) {
            struct item *it = &w->many->items[w->index];
            it->rc = -VKS_E_BAD_VALUE;
            snprintf(it->msg, sizeof(it->msg), "%s", msg != NULL ? msg : "");
            many_item_done(w->many);
        } else {
            if (msg != NULL)
                session_send_error(w->s, w->req->id, w->req->op, -VKS_E_BAD_VALUE, msg);
            session_stream_done(w->token);
        }
        free(w);
    }
    st->q_head = st->q_tail = NULL;
}

/* Frees a stream no connection holds once nothing of it runs or waits to
 * be answered; true when it did. */
static bool stream_maybe_free(struct stream *st)
{
    if (st->set != NULL || st->running || st->a_head != NULL || st->hold != 0)
        return false;
    stream_release(st);
    free(st);
    return true;
}

/* Unlinks and frees the stream; one whose request runs now, or has run and
 * waits for the answers before it, is only unlinked (set NULL) and freed
 * when the last of them is answered. */
static void stream_remove(struct stream_set *set, struct stream *st)
{
    if (set != NULL) {
        *st->pprev = st->next;
        if (st->next != NULL)
            st->next->pprev = st->pprev;
        set_delete(set, st);
        if (st->scan == NULL)
            set->n_expired--;
    }
    st->set = NULL;
    st->orphaned = set != NULL;
    char msg[128];
    snprintf(msg, sizeof(msg), "stream %u was closed before this request ran", st->id);
    drop_queue(st, set != NULL ? msg : NULL);
    stream_maybe_free(st);
}

void stream_set_destroy(struct stream_set *set)
{
    if (set == NULL)
        return;
    while (set->list != NULL) {
        counters.dropped += set->list->scan != NULL;
        struct stream *st = set->list;
        set->list = st->next;
        if (set->list != NULL)
            set->list->pprev = &set->list;
        if (st->scan == NULL)
            set->n_expired--;
        stream_remove(NULL, st);
    }
    free(set->tab);
    free(set);
}

/* Opens one stream over `entry` (its checks done); 0 or -ENOMEM. */
static int open_one(struct stream_set *set, struct store_entry *entry, size_t size,
                    enum scan_mode mode, struct stream **out)
{
    const struct catalog *cat = store_entry_catalog(entry);
    struct tenant_streams *t = tenant_of(set->uid, true);
    struct stream *st = calloc(1, sizeof(*st));
    if (st != NULL) {
        for (st->id = set->next_id; st->id == 0 || set_lookup(set, st->id) != NULL; st->id++)
            ; /* after a wrap, past ids still in use */
    }
    if (t == NULL || st == NULL || set_insert(set, st) != 0 ||
        streamscan_create(cat, &st->scan) != 0) {
        if (t != NULL && t->n == 0) {
            t->n = 1;
            tenant_put(set->uid); /* forgets the empty entry */
        }
        if (st != NULL && set_lookup(set, st->id) == st)
            set_delete(set, st);
        free(st);
        return -ENOMEM;
    }
    set->next_id = st->id + 1;
    if (set->next_id == 0)
        set->next_id = 1;
    st->set = set;
    st->srv = set->srv;
    st->uid = set->uid;
    st->entry = entry;
    store_entry_ref(entry);
    st->state_bytes = size;
    st->mode = mode;
    st->t_active = uv_now(server_loop(set->srv));
    st->next = set->list;
    st->pprev = &set->list;
    if (set->list != NULL)
        set->list->pprev = &st->next;
    set->list = st;
    t->n++;
    counters.open++;
    counters.opened++;
    counters.state_bytes += size;
    *out = st;
    return 0;
}

void stream_open(struct stream_set *set, struct session *s, const struct proto_request *req,
                 struct store_entry *entry)
{
    const struct daemon_config *cfg = server_config(set->srv);
    const struct catalog *cat = store_entry_catalog(entry);
    size_t size = streamscan_size(cat);
    uint32_t count = req->u.stream.count ? req->u.stream.count : 1;
    struct tenant_streams *t = tenant_of(set->uid, false);
    uint32_t open = t != NULL ? t->n : 0;
    char msg[256];
    if (open + (uint64_t)count > cfg->stream_max_per_tenant) {
        snprintf(msg, sizeof(msg),
                 "uid %u has %u streams open and asks for %u more, the limit "
                 "(stream-max-per-tenant) is %u: close streams you are done with",
                 (unsigned)set->uid, open, count, cfg->stream_max_per_tenant);
        session_send_error(s, req->id, req->op, -VKS_E_BUSY, msg);
        return;
    }
    if (catalog_rule_flags_any(cat) & RULE_F_SOMLEFT) {
        /* a start may lie in any earlier write, which a stream does not keep */
        session_send_error(s, req->id, req->op, -VKS_E_BAD_VALUE,
                           "the catalog has rules with flag L (start of match), which streams "
                           "cannot report: load the rules without L for streaming, or scan "
                           "whole buffers");
        return;
    }
    if (req->u.stream.mode == PROTO_REPORT_FIRST) {
        /* a first end per rule over the whole stream would be state per rule */
        session_send_error(s, req->id, req->op, -VKS_E_BAD_VALUE,
                           "a stream reports mode all or count, not first: open it with count "
                           "and keep the first end of each rule from the first write that "
                           "reports it");
        return;
    }
    if (size > cfg->stream_max_state_bytes) {
        snprintf(msg, sizeof(msg),
                 "a stream of this catalog needs %zu bytes of state, the limit "
                 "(stream-max-state-bytes) is %llu: split the rule set or scan whole buffers",
                 size, (unsigned long long)cfg->stream_max_state_bytes);
        session_send_error(s, req->id, req->op, -VKS_E_LIMIT, msg);
        return;
    }
    uint32_t *ids = count > 1 ? calloc(count, sizeof(*ids)) : NULL;
    struct stream *st = NULL;
    uint32_t k = 0;
    while (k < count && (count == 1 || ids != NULL) &&
           open_one(set, entry, size, (enum scan_mode)req->u.stream.mode, &st) == 0) {
        if (ids != NULL)
            ids[k] = st->id;
        k++;
    }
    if (k < count) { /* all or none */
        for (uint32_t i = 0; i < k && ids != NULL; i++)
            stream_remove(set, set_lookup(set, ids[i]));
        counters.opened -= k;
        free(ids);
        session_send_error(s, req->id, req->op, -ENOMEM, "out of memory opening a stream");
        return;
    }
    struct proto_reply rep = {.id = req->id, .op = req->op};
    rep.u.stream = (struct proto_stream_reply){.stream = ids != NULL ? ids[0] : st->id,
                                               .state_bytes = size,
                                               .streams = ids,
                                               .n_streams = ids != NULL ? count : 0};
    session_send_reply(s, &rep);
    free(ids);
}

/* The stream `id` names, or NULL with the error (`*code`, `msg`). An
 * expired stream gets its TIMEOUT error once, then is forgotten. */
static struct stream *lookup(struct stream_set *set, uint32_t id, int *code, char *msg, size_t cap)
{
    struct stream *st = set_lookup(set, id);
    if (st != NULL && !st->closing) {
        if (st->scan != NULL)
            return st;
        snprintf(msg, cap,
                 "stream %u was closed after it was idle for %u ms (stream-idle-timeout-ms) and "
                 "its matches across that point are lost: open a new stream",
                 id, server_config(set->srv)->stream_idle_timeout_ms);
        *code = -VKS_E_TIMEOUT;
        stream_remove(set, st);
        return NULL;
    }
    snprintf(msg, cap,
             "stream %u is not open on this connection: open one with stream.open (stream ids "
             "belong to the connection that opened them)",
             id);
    *code = -VKS_E_BAD_VALUE;
    return NULL;
}

/* Reads `n` bytes at `at` of the write's range into `dst`; 0 or
 * -VKS_E_BAD_FD with w->msg set. */
/* ---- buffers of descriptor writes whose middle runs in a batch ----
 *
 * Such a write needs a buffer of its length of which only the head and the
 * tail are ever read (write_fd; the batch reads the middle from the
 * descriptor). A fresh anonymous mapping per write costs an mmap, faults,
 * and an munmap whose TLB shootdown interrupts every core that runs a
 * daemon thread: for a flow reassembler's 64 KiB writes, two system calls
 * and an interrupt round per write, the munmap on the loop thread
 * (docs/PERFORMANCE.md "Session 28"). Mappings of up to SPARE_MAX bytes
 * are kept for reuse instead, by size class (powers of two), SPARE_KEEP
 * bytes of them at most: a kept mapping has at most its class size of
 * resident pages, so that bounds what the reuse holds. A reused buffer's
 * middle still holds an earlier write's bytes; nothing reads them
 * (streamscan_split_plan names what streamscan_write_begin reads, and the
 * CPU fallback reads the whole range into it first). */
#define SPARE_MIN_SHIFT 14u /* 16 KiB */
#define SPARE_MAX_SHIFT 22u /* 4 MiB */
#define SPARE_KEEP      (64u << 20)

static struct {
    pthread_mutex_t mu;
    void *head[SPARE_MAX_SHIFT - SPARE_MIN_SHIFT + 1]; /* linked through their first word */
    uint64_t kept;                                     /* bytes in the lists */
    uint64_t reused, mapped;                           /* stream.sparse_reused, _mapped */
} spare = {.mu = PTHREAD_MUTEX_INITIALIZER};

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
        pthread_mutex_unlock(&spare.mu);
    }
    if (p == NULL) {
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                 0);
        if (p == MAP_FAILED)
            return NULL;
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
        bool keep = spare.kept + cap <= SPARE_KEEP;
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

static int read_range(struct work *w, const struct proto_buffer *b, void *dst, uint64_t at,
                      uint64_t n)
{
    for (uint64_t done = 0; done < n;) {
        ssize_t k =
            pread(b->fd, (uint8_t *)dst + done, (size_t)(n - done), (off_t)(b->offset + at + done));
        if (k <= 0) {
            snprintf(w->msg, sizeof(w->msg), "reading the descriptor failed at byte %llu: %s",
                     (unsigned long long)(b->offset + at + done), k < 0 ? strerror(errno) : "EOF");
            return -VKS_E_BAD_FD;
        }
        done += (uint64_t)k;
    }
    return 0;
}

/* Reads the fd range of a write and scans it in pieces (pool thread). */
static int write_fd(struct work *w, const struct proto_buffer *b)
{
    struct stat sb;
    if (fstat(b->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(w->msg, sizeof(w->msg),
                 "the descriptor is not a regular file or memfd: pass an open file");
        return -VKS_E_BAD_FD;
    }
    uint64_t size = (uint64_t)sb.st_size;
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
    /* A write that runs its middle in a batch: only the bytes its head and
     * tail walk are read here, into an anonymous mapping of the write's
     * size whose other pages are never touched; the GPU engine's upload
     * threads read the middle from the descriptor themselves. */
    uint8_t last;
    size_t hd, tl;
    if (w->batch_min != 0 && len > w->batch_min && read_range(w, b, &last, len - 1, 1) == 0 &&
        streamscan_split_plan(w->st->scan, (size_t)len, last, w->batch_min, &hd, &tl)) {
        size_t cap;
        uint8_t *map = sparse_get((size_t)len, &cap);
        if (map == NULL)
            return -ENOMEM;
        int rc = read_range(w, b, map, 0, hd);
        if (rc == 0)
            rc = read_range(w, b, map + len - tl, len - tl, tl);
        if (rc == 0)
            rc = streamscan_write_begin(w->st->scan, map, (size_t)len, w->batch_min, &w->hits,
                                        &w->mid);
        if (rc == 0 && !w->mid.pending) { /* streamscan_split_plan said it would be */
            snprintf(w->msg, sizeof(w->msg), "internal error: the write's middle was not split");
            w->bytes = len; /* the state moved past unread bytes: the stream must close */
            rc = -VKS_E_INTERNAL;
        }
        w->sparse = map;
        w->sparse_cap = cap;
        if (rc != 0) {
            sparse_put(w);
            return rc;
        }
        w->bytes = len;
        w->wbuf = map;
        w->wlen = (size_t)len;
        return 0;
    }
    w->msg[0] = '\0'; /* a failed read of the last byte is met again below */
    uint8_t *buf = malloc(len < READ_CHUNK ? (len ? len : 1) : READ_CHUNK);
    if (buf == NULL)
        return -ENOMEM;
    int rc = 0;
    for (uint64_t done = 0; done < len && rc == 0;) {
        size_t want = len - done < READ_CHUNK ? (size_t)(len - done) : READ_CHUNK;
        ssize_t n = pread(b->fd, buf, want, (off_t)(b->offset + done));
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

/* The write or close itself, on a pool thread. */
static void work_run(struct work *w)
{
    const struct proto_buffer *b = w->buf;
    bool second = w->mid_hits || w->mid_cpu; /* the write's last step: its middle is back */
    if (w->mid_hits) { /* the batch's hits (maybe millions: sorted off the loop) */
        if (w->ej.hits_dropped > 0)
            w->rc = -E2BIG; /* more than middle_queue's bound */
        for (size_t i = 0; i < w->ej.n_hits && w->rc == 0; i++)
            w->rc = streamscan_middle_add(&w->mid, w->ej.hits[i].rule, w->ej.hits[i].end);
        engine_job_finish(&w->ej);
        if (w->rc == 0)
            w->rc = streamscan_write_end(w->st->scan, &w->mid, &w->hits);
        streamscan_middle_finish(&w->mid);
        sparse_put(w);
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

/* Answers a write or close with its hits (at most max-hits: truncated). */
static void reply_hits(struct work *w)
{
    struct stream *st = w->st;
    uint32_t max = server_config(st->srv)->max_hits;
    uint32_t n = w->hits.n < max ? (uint32_t)w->hits.n : max;
    struct proto_hit *v = calloc(n ? n : 1, sizeof(*v));
    if (v == NULL) {
        session_send_error(w->s, w->req->id, w->req->op, -ENOMEM, "out of memory for the hits");
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        v[i] = (struct proto_hit){
            .rule = w->hits.v[i].rule, .end = w->hits.v[i].end, .count = w->hits.v[i].count};
    struct proto_buffer_status status = {.bytes = w->bytes, .hits = n, .truncated = w->hits.n > n};
    struct proto_stat tel[2] = {
        {.key = "stream_offset", .u = w->offset},
        {.key = "state_bytes", .u = st->state_bytes},
    };
    struct proto_reply rep = {.id = w->req->id, .op = w->req->op};
    rep.u.scan = (struct proto_scan_reply){.hits = v,
                                           .n_hits = n,
                                           .buffers = &status,
                                           .n_buffers = 1,
                                           .telemetry = tel,
                                           .n_telemetry = 2};
    counters.hits += n;
    session_send_reply(w->s, &rep);
    free(v);
}

/* Answers a finished write, or keeps its result for its stream.writes;
 * false when the stream cannot go on. */
static bool answer_write(struct work *w)
{
    counters.writes++;
    counters.bytes += w->bytes;
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

static void start_next(struct stream *st);
static void pump(struct server *srv);
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
        counters.closed++;
        keep = false;
    } else if (live) {
        if (w->t_back != 0) { /* its middle ran in a batch */
            uint64_t now = uv_hrtime();
            counters.batch_begin_ns += w->t_mid - w->t_in;
            counters.batch_queue_ns +=
                w->t_back - w->t_mid -
                (w->engine_ns < w->t_back - w->t_mid ? w->engine_ns : w->t_back - w->t_mid);
            counters.batch_engine_ns += w->engine_ns;
            counters.batch_end_ns += now - w->t_back;
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
    sparse_put(w);
    free(w);
    if (!keep && st->set != NULL)
        stream_remove(st->set, st);
    if (m != NULL)
        many_item_done(m);
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
        start_next(st);
}

/* Back on the loop. A request whose own run is back takes its place in
 * the stream's answer order; a write whose middle goes to a batch is
 * answered when the batch is back, and the stream's next request may begin
 * now: its state is past the write. `status` is UV_ECANCELED when the
 * request never ran (the daemon is going away). */
static void work_done(struct work *w, int status)
{
    struct stream *st = w->st;
    struct server *srv = st->srv;
    if (!w->mid_hits && !w->mid_cpu) {
        st->running = false;
        st->t_active = uv_now(server_loop(srv));
        w->a_next = NULL;
        if (st->a_tail != NULL)
            st->a_tail->a_next = w;
        else
            st->a_head = w;
        st->a_tail = w;
        if (w->mid.pending && status == 0 && w->rc == 0 && st->set != NULL) {
            if (middle_queue(w) != 0) {
                w->mid_cpu = true;
                submit(srv, w);
            }
            start_next(st);
            return;
        }
    }
    w->cancelled = status != 0;
    w->finished = true;
    settle(st);
}

static _Atomic uint64_t run_ns; /* stream.run_ns: time in work_run on the threads */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* On a CPU engine thread: runs the request and hands it to the loop. */
static void task_run(struct engine_task *t)
{
    struct work *w = (struct work *)t;
    uint64_t t0 = mono_ns();
    work_run(w);
    atomic_fetch_add_explicit(&run_ns, mono_ns() - t0, memory_order_relaxed);
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
        counters.engine_runs++;
        srv = w->st->srv;
        work_done(w, 0);
    }
    if (srv != NULL)
        pump(srv);
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

/* Back on the loop when the batch is: the write goes to a CPU engine
 * thread again, which adds the hits of the middle and answers it, or, when
 * the batch failed, scans the middle itself. */
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
        counters.batch_fallbacks++;
        w->mid_cpu = true;
    } else {
        counters.batch_writes++;
        counters.batch_fd_writes += w->sparse != NULL;
        counters.batch_bytes += w->wlen;
        counters.batch_gpu += tel->gpu;
        counters.batch_jobs += tel->jobs;
        const struct gpu_telemetry *g = &tel->gpu_tel;
        counters.batch_fd_read_ns += tel->fd_read_ns;
        counters.batch_plan_ns += g->plan_ns;
        counters.batch_upload_ns += g->upload_ns;
        counters.batch_device_ns += g->device_ns;
        counters.batch_readback_ns += g->readback_ns;
        counters.batch_finalize_ns += g->finalize_ns;
        counters.batch_idle_ns += g->device_idle_ns;
        w->t_back = uv_hrtime();
        w->engine_ns = tel->wall_ns;
        w->mid_hits = true;
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
    work_done(w, status);
    pump(srv);
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
 * length: as much as a thread's share). */
static uint64_t work_cost(const struct work *w)
{
    const struct proto_buffer *b = w->buf;
    if (b == NULL)
        return 0;
    if (!b->is_fd)
        return b->len;
    return b->has_length ? b->length : POOL_BYTES;
}

/* Hands ready requests to the engine while it has room, taking tenants in
 * turn from the one after the last served. */
static void pump(struct server *srv)
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
        for (struct tenant_streams *t = tenants; t != NULL; t = t->next) {
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
static void start_next(struct stream *st)
{
    struct work *w = st->q_head;
    if (w == NULL || st->running || (w->buf == NULL && st->a_head != NULL))
        return; /* one at a time; a close after every write is answered */
    st->q_head = w->next;
    if (st->q_head == NULL)
        st->q_tail = NULL;
    st->running = true;
    counters.overlapped += st->a_head != NULL; /* one before it is in a batch */
    struct tenant_streams *t = tenant_of(st->uid, false);
    if (t == NULL) { /* not expected: an open stream counts in its tenant */
        w->rc = -ENOMEM;
        work_done(w, 0);
        return;
    }
    w->next = NULL;
    if (t->ready_tail != NULL)
        t->ready_tail->next = w;
    else
        t->ready_head = w;
    t->ready_tail = w;
}

static void stream_many(struct stream_set *set, struct session *s, const struct proto_request *req,
                        void *token);
static bool close_here(struct stream *st, struct work *w);

/* Queues `w` on `st` (stream_op's and stream_writes' common part). */
static void enqueue(struct stream *st, struct work *w)
{
    st->t_active = uv_now(server_loop(st->srv));
    const struct daemon_config *cfg = server_config(st->srv);
    struct engine *e = server_engine(st->srv);
    bool gpu = e != NULL && engine_ready(e) && engine_get_info(e)->gpu;
    w->st = st;
    w->t_in = uv_hrtime();
    w->max = cfg->max_scan_bytes;
    w->batch_min = gpu ? (size_t)cfg->stream_gpu_min_bytes : 0;
    if (st->q_tail != NULL)
        st->q_tail->next = w;
    else
        st->q_head = w;
    st->q_tail = w;
    start_next(st);
}

void stream_op(struct stream_set *set, struct session *s, const struct proto_request *req,
               void *token)
{
    if (req->op == PROTO_OP_STREAM_WRITES || req->u.stream.n_streams > 0) {
        stream_many(set, s, req, token);
        return;
    }
    char msg[256];
    int code = 0;
    struct stream *st = lookup(set, req->u.stream.stream, &code, msg, sizeof(msg));
    struct work *w = st != NULL ? calloc(1, sizeof(*w)) : NULL;
    if (st == NULL)
        session_send_error(s, req->id, req->op, code, msg);
    else if (w == NULL)
        session_send_error(s, req->id, req->op, -ENOMEM, "out of memory queueing the request");
    if (w == NULL) {
        session_stream_done(token);
        return;
    }
    *w = (struct work){.s = s, .req = req, .token = token};
    if (req->op != PROTO_OP_STREAM_CLOSE)
        w->buf = &req->u.stream.buffer;
    st->closing = req->op == PROTO_OP_STREAM_CLOSE;
    if (st->closing && close_here(st, w))
        return;
    enqueue(st, w);
    pump(set->srv);
}

/* ---- stream.writes ---- */

/* Answers the stream.writes once its last item is done: a scan reply with
 * a buffer status per item and its hits (`buffer`: the item), at most
 * max-hits in all (the items past it truncated). */
static void many_finish(struct many *m)
{
    uint32_t n = m->n, max = m->max_hits;
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += m->items[i].hits.n;
    uint32_t keep = total < max ? (uint32_t)total : max;
    struct proto_hit *v = calloc(keep ? keep : 1, sizeof(*v));
    struct proto_buffer_status *bs = calloc(n ? n : 1, sizeof(*bs));
    if (v == NULL || bs == NULL) {
        session_send_error(m->s, m->req->id, m->req->op, -ENOMEM, "out of memory for the hits");
    } else {
        uint32_t k = 0;
        for (uint32_t i = 0; i < n; i++) {
            const struct item *it = &m->items[i];
            uint32_t from = k;
            for (size_t j = 0; j < it->hits.n && k < keep; j++)
                v[k++] = (struct proto_hit){.buffer = i,
                                            .rule = it->hits.v[j].rule,
                                            .end = it->hits.v[j].end,
                                            .count = it->hits.v[j].count};
            bs[i] = (struct proto_buffer_status){.code = it->rc,
                                                 .message = it->rc != 0 ? it->msg : NULL,
                                                 .bytes = it->bytes,
                                                 .hits = k - from,
                                                 .truncated = k - from < it->hits.n};
        }
        counters.hits += k;
        struct proto_reply rep = {.id = m->req->id, .op = m->req->op};
        rep.u.scan =
            (struct proto_scan_reply){.hits = v, .n_hits = k, .buffers = bs, .n_buffers = n};
        session_send_reply(m->s, &rep);
    }
    free(v);
    free(bs);
    for (uint32_t i = 0; i < n; i++)
        scan_hits_finish(&m->items[i].hits);
    void *token = m->token;
    free(m->items);
    free(m);
    session_stream_done(token);
}

static void many_item_done(struct many *m)
{
    if (--m->left == 0)
        many_finish(m);
}

/* A close of `st` run on the loop: nothing is queued before it, and it
 * only settles the held byte and the end-anchored matches (microseconds),
 * where a thread would cost two hand-offs; a flow reassembler closes as
 * often as it opens (H200, docs/PERFORMANCE.md "Session 14"). */
static bool close_here(struct stream *st, struct work *w)
{
    if (st->running || st->q_head != NULL || st->a_head != NULL)
        return false;
    w->st = st;
    st->running = true;
    w->rc = streamscan_close(st->scan, &w->hits);
    w->offset = streamscan_offset(st->scan);
    count_hits(w);
    counters.loop_closes++;
    work_done(w, 0);
    return true;
}

/* stream.writes (`writes`) or stream.close with `streams`: one item per
 * stream id, answered together. */
static void stream_many(struct stream_set *set, struct session *s, const struct proto_request *req,
                        void *token)
{
    bool writes = req->op == PROTO_OP_STREAM_WRITES;
    const uint32_t *ids = writes ? req->u.writes.streams : req->u.stream.streams;
    uint32_t n = writes ? req->u.writes.n_buffers : req->u.stream.n_streams;
    struct many *m = calloc(1, sizeof(*m));
    struct item *items = calloc(n ? n : 1, sizeof(*items));
    if (m == NULL || items == NULL) {
        free(m);
        free(items);
        session_send_error(s, req->id, req->op, -ENOMEM, "out of memory queueing the requests");
        session_stream_done(token);
        return;
    }
    *m = (struct many){.s = s,
                       .req = req,
                       .token = token,
                       .n = n,
                       .items = items,
                       .max_hits = set != NULL ? server_config(set->srv)->max_hits : 0};
    m->left = n + 1; /* + 1 until every item is queued */
    for (uint32_t i = 0; i < n; i++) {
        struct item *it = &items[i];
        struct stream *st = lookup(set, ids[i], &it->rc, it->msg, sizeof(it->msg));
        struct work *w = st != NULL ? calloc(1, sizeof(*w)) : NULL;
        if (st != NULL && w == NULL) {
            it->rc = -VKS_E_INTERNAL;
            snprintf(it->msg, sizeof(it->msg), "out of memory queueing the request");
        }
        if (w == NULL) {
            m->left--;
            continue;
        }
        *w = (struct work){.s = s,
                           .req = req,
                           .buf = writes ? &req->u.writes.buffers[i] : NULL,
                           .many = m,
                           .index = i};
        if (!writes) {
            st->closing = true;
            if (close_here(st, w))
                continue;
        }
        enqueue(st, w);
    }
    if (set != NULL)
        pump(set->srv); /* the items' first turn, handed out at once */
    many_item_done(m);
}

void stream_set_sweep(struct stream_set *set, uint64_t now_ms)
{
    if (set == NULL)
        return;
    uint32_t idle = server_config(set->srv)->stream_idle_timeout_ms;
    if (idle == 0)
        return;
    for (struct stream *st = set->list, *next; st != NULL; st = next) {
        next = st->next;
        if (st->scan == NULL || st->running || st->q_head != NULL || st->a_head != NULL ||
            now_ms - st->t_active < idle)
            continue;
        log_notice("uid %u: stream %u idle for %u ms (stream-idle-timeout-ms): closed",
                   (unsigned)set->uid, st->id, idle);
        stream_release(st);
        counters.expired++;
        if (++set->n_expired > MAX_EXPIRED)
            stream_remove(set, st); /* forgotten: its id gets "not open" */
    }
}

void stream_stats_add(const struct daemon_config *cfg, struct stats_list *l)
{
    stats_add_u(l, "limit.stream_max_per_tenant", cfg->stream_max_per_tenant);
    stats_add_u(l, "limit.stream_max_state_bytes", cfg->stream_max_state_bytes);
    stats_add_u(l, "limit.stream_idle_timeout_ms", cfg->stream_idle_timeout_ms);
    stats_add_u(l, "stream.open", counters.open);
    stats_add_u(l, "stream.opened", counters.opened);
    stats_add_u(l, "stream.closed", counters.closed);
    stats_add_u(l, "stream.expired", counters.expired);
    stats_add_u(l, "stream.dropped", counters.dropped);
    stats_add_u(l, "stream.writes", counters.writes);
    stats_add_u(l, "stream.bytes", counters.bytes);
    stats_add_u(l, "stream.hits", counters.hits);
    stats_add_u(l, "stream.state_bytes", counters.state_bytes);
    stats_add_u(l, "limit.stream_gpu_min_bytes", cfg->stream_gpu_min_bytes);
    stats_add_u(l, "stream.engine_runs", counters.engine_runs);
    stats_add_u(l, "stream.loop_closes", counters.loop_closes);
    stats_add_u(l, "stream.run_ns", atomic_load_explicit(&run_ns, memory_order_relaxed));
    stats_add_u(l, "stream.batch_writes", counters.batch_writes);
    stats_add_u(l, "stream.batch_fd_writes", counters.batch_fd_writes);
    stats_add_u(l, "stream.batch_bytes", counters.batch_bytes);
    stats_add_u(l, "stream.batch_gpu", counters.batch_gpu);
    stats_add_u(l, "stream.batch_fallbacks", counters.batch_fallbacks);
    stats_add_u(l, "stream.overlapped_writes", counters.overlapped);
    stats_add_u(l, "stream.batch_begin_ns", counters.batch_begin_ns);
    stats_add_u(l, "stream.batch_queue_ns", counters.batch_queue_ns);
    stats_add_u(l, "stream.batch_engine_ns", counters.batch_engine_ns);
    stats_add_u(l, "stream.batch_end_ns", counters.batch_end_ns);
    stats_add_u(l, "stream.batch_jobs", counters.batch_jobs);
    stats_add_u(l, "stream.batch_fd_read_ns", counters.batch_fd_read_ns);
    stats_add_u(l, "stream.batch_plan_ns", counters.batch_plan_ns);
    stats_add_u(l, "stream.batch_upload_ns", counters.batch_upload_ns);
    stats_add_u(l, "stream.batch_device_ns", counters.batch_device_ns);
    stats_add_u(l, "stream.batch_readback_ns", counters.batch_readback_ns);
    stats_add_u(l, "stream.batch_finalize_ns", counters.batch_finalize_ns);
    stats_add_u(l, "stream.batch_idle_ns", counters.batch_idle_ns);
    pthread_mutex_lock(&spare.mu);
    uint64_t reused = spare.reused, mapped = spare.mapped, kept = spare.kept;
    pthread_mutex_unlock(&spare.mu);
    stats_add_u(l, "stream.sparse_reused", reused);
    stats_add_u(l, "stream.sparse_mapped", mapped);
    stats_add_u(l, "stream.sparse_kept_bytes", kept);
}
