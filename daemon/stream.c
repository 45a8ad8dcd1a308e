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
 *
 * This file holds the stream tables, opens, the queues and stream.writes;
 * stream_run.c runs the requests (stream_internal.h is what they share).
 */
#include "stream.h"

#include <errno.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"
#include "log.h"
#include "session.h"
#include "session_host.h"
#include "stats.h"
#include "stream_internal.h"
#include "streamscan.h"

#define MAX_EXPIRED 64u /* expired ids remembered per connection, for the error */

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

struct tenant_streams *stream_tenants;
struct stream_counters stream_counters;

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

struct tenant_streams *stream_tenant_of(uid_t uid, bool create)
{
    for (struct tenant_streams *t = stream_tenants; t != NULL; t = t->next)
        if (t->uid == uid)
            return t;
    if (!create)
        return NULL;
    struct tenant_streams *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->uid = uid;
    t->next = stream_tenants;
    stream_tenants = t;
    return t;
}

static void tenant_put(uid_t uid)
{
    struct tenant_streams **p = &stream_tenants;
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
    stream_counters.open--;
    stream_counters.state_bytes -= st->state_bytes;
    tenant_put(st->uid);
}

void stream_answer_push(struct stream *st, struct work *w)
{
    w->a_next = NULL;
    if (st->a_tail != NULL)
        st->a_tail->a_next = w;
    else
        st->a_head = w;
    st->a_tail = w;
}

void stream_queue_behind(struct stream *st)
{
    for (struct work *w = st->q_head; w != NULL; w = w->next) {
        w->finished = true;
        stream_answer_push(st, w);
    }
    st->q_head = st->q_tail = NULL;
    st->drop_pending = false;
}

/* Answers the requests still queued on `st` with `msg` (none when the
 * connection is gone) and hands them back to the session; when requests
 * that ran before them wait to be answered, queues them behind those with
 * the error instead, so replies keep their order. */
static void drop_queue(struct stream *st, const char *msg)
{
    if (msg != NULL && st->running && st->q_head != NULL) {
        /* A request of the stream runs on a CPU engine thread (in neither
         * list): these wait for it and are answered behind it
         * (stream_queue_behind), in order. Answered here, they overtook
         * its reply (test_daemon_gpu_middle_fails_behind, once under ASan). */
        st->drop_pending = true;
        return;
    }
    if (msg != NULL && st->a_head != NULL) {
        /* Writes that began before these still run (their middles in a GPU
         * batch): these are answered after them, in order, with the error
         * of a stream a failed write closed (settle, finish). Answered here,
         * they overtook the replies of the writes ahead of them. */
        stream_queue_behind(st);
        return;
    }
    for (struct work *w = st->q_head, *next; w != NULL; w = next) {
        next = w->next;
        if (w->many != NULL) {
            struct item *it = &w->many->items[w->index];
            it->rc = -VKS_E_BAD_VALUE;
            snprintf(it->msg, sizeof(it->msg), "%s", msg != NULL ? msg : "");
            stream_many_item_done(w->many);
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
bool stream_maybe_free(struct stream *st)
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
void stream_remove(struct stream_set *set, struct stream *st)
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
        stream_counters.dropped += set->list->scan != NULL;
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
    struct tenant_streams *t = stream_tenant_of(set->uid, true);
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
    stream_counters.open++;
    stream_counters.opened++;
    stream_counters.state_bytes += size;
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
    struct tenant_streams *t = stream_tenant_of(set->uid, false);
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
        stream_counters.opened -= k;
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

static void stream_many(struct stream_set *set, struct session *s, const struct proto_request *req,
                        void *token);

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
    w->max_hits = stream_reply_max_hits(cfg);
    w->batch_min = gpu ? (size_t)cfg->stream_gpu_min_bytes : 0;
    if (st->q_tail != NULL)
        st->q_tail->next = w;
    else
        st->q_head = w;
    st->q_tail = w;
    stream_start_next(st);
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
    if (st->closing && stream_close_here(st, w))
        return;
    enqueue(st, w);
    stream_pump(set->srv);
}

/* ---- stream.writes ---- */

/* Answers the stream.writes once its last item is done: a scan reply with
 * a buffer status per item and its hits (`buffer`: the item), at most
 * max-hits in all (the items past it truncated). */
static void many_finish(struct many *m)
{
    uint64_t t0 = uv_hrtime();
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
        stream_counters.hits += k;
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
    stream_counters.reply_ns += uv_hrtime() - t0;
}

void stream_many_item_done(struct many *m)
{
    if (--m->left == 0)
        many_finish(m);
}

/* The size of a regular file (a memfd) a stream.writes passes, asked once
 * per descriptor: libvkscan packs a request's writes into one memfd, whose
 * size each of up to max-buffers writes would otherwise fstat on its
 * thread. Writes that find it unknown fstat themselves and say what is
 * wrong with the descriptor. */
struct fd_size {
    int fd;
    bool ok;
    uint64_t size;
};

static bool fd_size_of(struct fd_size *c, int fd, uint64_t *size)
{
    if (fd != c->fd) {
        struct stat sb;
        c->fd = fd;
        atomic_fetch_add_explicit(&stream_fd_stats, 1, memory_order_relaxed);
        c->ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
        c->size = c->ok ? (uint64_t)sb.st_size : 0;
    }
    *size = c->size;
    return c->ok;
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
    *m =
        (struct many){.s = s,
                      .req = req,
                      .token = token,
                      .n = n,
                      .items = items,
                      .max_hits = set != NULL ? stream_reply_max_hits(server_config(set->srv)) : 0};
    m->left = n + 1; /* + 1 until every item is queued */
    struct fd_size sz = {.fd = -1};
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
        if (w->buf != NULL && w->buf->is_fd)
            w->fd_known = fd_size_of(&sz, w->buf->fd, &w->fd_size);
        if (!writes) {
            st->closing = true;
            if (stream_close_here(st, w))
                continue;
        }
        enqueue(st, w);
    }
    if (set != NULL)
        stream_pump(set->srv); /* the items' first turn, handed out at once */
    stream_many_item_done(m);
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
        stream_counters.expired++;
        if (++set->n_expired > MAX_EXPIRED)
            stream_remove(set, st); /* forgotten: its id gets "not open" */
    }
}

void stream_stats_add(const struct daemon_config *cfg, struct stats_list *l)
{
    stats_add_u(l, "limit.stream_max_per_tenant", cfg->stream_max_per_tenant);
    stats_add_u(l, "limit.stream_max_state_bytes", cfg->stream_max_state_bytes);
    stats_add_u(l, "limit.stream_idle_timeout_ms", cfg->stream_idle_timeout_ms);
    stats_add_u(l, "stream.open", stream_counters.open);
    stats_add_u(l, "stream.opened", stream_counters.opened);
    stats_add_u(l, "stream.closed", stream_counters.closed);
    stats_add_u(l, "stream.expired", stream_counters.expired);
    stats_add_u(l, "stream.dropped", stream_counters.dropped);
    stats_add_u(l, "stream.writes", stream_counters.writes);
    stats_add_u(l, "stream.bytes", stream_counters.bytes);
    stats_add_u(l, "stream.hits", stream_counters.hits);
    stats_add_u(l, "stream.state_bytes", stream_counters.state_bytes);
    stats_add_u(l, "limit.stream_gpu_min_bytes", cfg->stream_gpu_min_bytes);
    stats_add_u(l, "stream.engine_runs", stream_counters.engine_runs);
    stats_add_u(l, "stream.loop_closes", stream_counters.loop_closes);
    stats_add_u(l, "stream.loop_ends", stream_counters.loop_ends);
    stats_add_u(l, "stream.batch_writes", stream_counters.batch_writes);
    stats_add_u(l, "stream.batch_fd_writes", stream_counters.batch_fd_writes);
    stats_add_u(l, "stream.batch_bytes", stream_counters.batch_bytes);
    stats_add_u(l, "stream.batch_gpu", stream_counters.batch_gpu);
    stats_add_u(l, "stream.batch_fallbacks", stream_counters.batch_fallbacks);
    stats_add_u(l, "stream.overlapped_writes", stream_counters.overlapped);
    stats_add_u(l, "stream.batch_begin_ns", stream_counters.batch_begin_ns);
    stats_add_u(l, "stream.batch_begin_wait_ns", stream_counters.batch_begin_wait_ns);
    stats_add_u(l, "stream.batch_begin_back_ns", stream_counters.batch_begin_back_ns);
    stats_add_u(l, "stream.batch_end_wait_ns", stream_counters.batch_end_wait_ns);
    stats_add_u(l, "stream.batch_end_run_ns", stream_counters.batch_end_run_ns);
    stats_add_u(l, "stream.reply_ns", stream_counters.reply_ns);
    stats_add_u(l, "stream.thread_replies", stream_counters.thread_replies);
    stats_add_u(l, "stream.batch_queue_ns", stream_counters.batch_queue_ns);
    stats_add_u(l, "stream.batch_engine_ns", stream_counters.batch_engine_ns);
    stats_add_u(l, "stream.batch_end_ns", stream_counters.batch_end_ns);
    stats_add_u(l, "stream.batch_jobs", stream_counters.batch_jobs);
    stats_add_u(l, "stream.batch_fd_read_ns", stream_counters.batch_fd_read_ns);
    stats_add_u(l, "stream.batch_plan_ns", stream_counters.batch_plan_ns);
    stats_add_u(l, "stream.batch_upload_ns", stream_counters.batch_upload_ns);
    stats_add_u(l, "stream.batch_device_ns", stream_counters.batch_device_ns);
    stats_add_u(l, "stream.batch_readback_ns", stream_counters.batch_readback_ns);
    stats_add_u(l, "stream.batch_finalize_ns", stream_counters.batch_finalize_ns);
    stats_add_u(l, "stream.batch_idle_ns", stream_counters.batch_idle_ns);
    stats_add_u(l, "stream.batch_kernel_ns", stream_counters.batch_kernel_ns);
    stats_add_u(l, "stream.batch_buffers_ns", stream_counters.batch_buffers_ns);
    stats_add_u(l, "stream.batch_buffers_bytes", stream_counters.batch_buffers_bytes);
    stats_add_u(l, "stream.batch_reruns", stream_counters.batch_reruns);
    stream_run_stats_add(l);
}
