/*
 * Deficit round robin over per-tenant queues, with same-catalog batching
 * (sched.h explains the policy).
 */
#include "scheduler.h"

#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

struct sched_tenant {
    struct sched_tenant *next;                /* all tenants */
    struct sched_tenant *act_next, *act_prev; /* ring of tenants with queued jobs */
    bool active;
    uid_t uid;
    unsigned refs;
    struct sched_job *head, *tail; /* queue */
    uint64_t deficit;
    uint32_t jobs;  /* queued + running */
    uint64_t bytes; /* queued + running */
    uint64_t served_bytes, served_jobs;
    uint64_t held; /* frame bytes of requests in flight (sched_tenant_hold) */
    bool live;     /* counted in n_tenants: referenced or with jobs */
};

struct sched {
    struct sched_limits limits;
    struct sched_tenant *tenants;
    struct sched_tenant *cursor; /* next tenant to visit in the active ring */
    uint32_t queued_jobs, running_jobs, n_tenants, n_active;
    uint64_t queued_bytes, batches, batched_jobs;
    struct sched_job **heap; /* queued jobs with a deadline, earliest first */
    size_t n_heap, cap_heap;
    double rate; /* bytes per ns of recent batches; 0 = nothing seen yet */
};

#define RATE_DEFAULT 1.0 /* bytes per ns (1 GB/s) before the first batch */

/* ---- the deadline heap ------------------------------------------------ */

static void heap_set(struct sched *s, size_t i, struct sched_job *j)
{
    s->heap[i] = j;
    j->heap_idx = i + 1;
}

static void heap_up(struct sched *s, size_t i)
{
    struct sched_job *j = s->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (s->heap[p]->deadline_ns <= j->deadline_ns)
            break;
        heap_set(s, i, s->heap[p]);
        i = p;
    }
    heap_set(s, i, j);
}

static void heap_down(struct sched *s, size_t i)
{
    struct sched_job *j = s->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->n_heap)
            break;
        if (c + 1 < s->n_heap && s->heap[c + 1]->deadline_ns < s->heap[c]->deadline_ns)
            c++;
        if (s->heap[c]->deadline_ns >= j->deadline_ns)
            break;
        heap_set(s, i, s->heap[c]);
        i = c;
    }
    heap_set(s, i, j);
}

static int heap_push(struct sched *s, struct sched_job *j)
{
    if (s->n_heap == s->cap_heap) {
        size_t cap = s->cap_heap ? 2 * s->cap_heap : 64;
        struct sched_job **h = realloc(s->heap, cap * sizeof(*h));
        if (h == NULL)
            return -ENOMEM;
        s->heap = h;
        s->cap_heap = cap;
    }
    heap_set(s, s->n_heap++, j);
    heap_up(s, s->n_heap - 1);
    return 0;
}

static void heap_remove(struct sched *s, struct sched_job *j)
{
    if (j->heap_idx == 0)
        return;
    size_t i = j->heap_idx - 1;
    j->heap_idx = 0;
    struct sched_job *last = s->heap[--s->n_heap];
    if (i == s->n_heap)
        return;
    heap_set(s, i, last);
    heap_up(s, i);
    heap_down(s, last->heap_idx - 1);
}

int sched_create(const struct sched_limits *limits, struct sched **out)
{
    struct sched *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return -ENOMEM;
    s->limits = *limits;
    *out = s;
    return 0;
}

void sched_destroy(struct sched *s)
{
    if (s == NULL)
        return;
    while (s->tenants != NULL) {
        struct sched_tenant *t = s->tenants;
        s->tenants = t->next;
        free(t);
    }
    free(s->heap);
    free(s);
}

void sched_set_limits(struct sched *s, const struct sched_limits *limits)
{
    s->limits = *limits;
}

struct sched_tenant *sched_tenant_get(struct sched *s, uid_t uid)
{
    for (struct sched_tenant *t = s->tenants; t != NULL; t = t->next) {
        if (t->uid == uid) {
            t->refs++;
            s->n_tenants += !t->live;
            t->live = true;
            return t;
        }
    }
    struct sched_tenant *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->uid = uid;
    t->refs = 1;
    t->live = true;
    t->next = s->tenants;
    s->tenants = t;
    s->n_tenants++;
    return t;
}

/* An idle tenant that was served keeps its record (one per uid ever
 * served), so its served counters survive idle periods and reconnects;
 * it no longer counts in n_tenants. */
static void tenant_free_if_idle(struct sched *s, struct sched_tenant *t)
{
    if (t->refs > 0 || t->jobs > 0 || !t->live)
        return;
    s->n_tenants--;
    t->live = false;
    if (t->served_jobs > 0)
        return;
    for (struct sched_tenant **p = &s->tenants; *p != NULL; p = &(*p)->next) {
        if (*p == t) {
            *p = t->next;
            break;
        }
    }
    free(t);
}

void sched_tenant_put(struct sched *s, struct sched_tenant *t)
{
    if (t == NULL)
        return;
    assert(t->refs > 0);
    t->refs--;
    tenant_free_if_idle(s, t);
}

uid_t sched_tenant_uid(const struct sched_tenant *t)
{
    return t->uid;
}

bool sched_tenant_over(const struct sched *s, const struct sched_tenant *t)
{
    return t->jobs >= s->limits.tenant_max_requests || t->bytes >= s->limits.tenant_max_bytes;
}

void sched_tenant_hold(struct sched_tenant *t, int64_t delta)
{
    t->held += (uint64_t)delta;
}

bool sched_tenant_holds_too_much(const struct sched *s, const struct sched_tenant *t)
{
    return t->held >= s->limits.tenant_max_bytes;
}

bool sched_job_too_big(const struct sched *s, uint64_t bytes)
{
    return bytes > s->limits.tenant_max_bytes;
}

static void ring_insert(struct sched *s, struct sched_tenant *t)
{
    if (s->cursor == NULL) {
        t->act_next = t->act_prev = t;
        s->cursor = t;
    } else {
        /* Join just before the cursor: last in the current round. */
        t->act_next = s->cursor;
        t->act_prev = s->cursor->act_prev;
        t->act_prev->act_next = t;
        s->cursor->act_prev = t;
    }
    t->active = true;
    s->n_active++;
}

static void ring_remove(struct sched *s, struct sched_tenant *t)
{
    if (t->act_next == t) {
        s->cursor = NULL;
    } else {
        t->act_prev->act_next = t->act_next;
        t->act_next->act_prev = t->act_prev;
        if (s->cursor == t)
            s->cursor = t->act_next;
    }
    t->act_next = t->act_prev = NULL;
    t->active = false;
    s->n_active--;
    t->deficit = 0; /* DRR: an idle tenant keeps no credit */
}

int sched_push(struct sched *s, struct sched_tenant *t, struct sched_job *job)
{
    job->heap_idx = 0;
    if (job->deadline_ns != 0 && heap_push(s, job) != 0)
        return -ENOMEM;
    job->tenant = t;
    job->next = NULL;
    job->prev = t->tail;
    if (t->tail != NULL)
        t->tail->next = job;
    else
        t->head = job;
    t->tail = job;
    job->queued = true;
    job->running = false;
    t->jobs++;
    t->bytes += job->bytes;
    s->queued_jobs++;
    s->queued_bytes += job->bytes;
    if (!t->active)
        ring_insert(s, t);
    return 0;
}

/* Unlinks a queued job; the tenant's quota counters are left to the caller. */
static void unlink_job(struct sched *s, struct sched_job *job)
{
    struct sched_tenant *t = job->tenant;
    if (job->prev != NULL)
        job->prev->next = job->next;
    else
        t->head = job->next;
    if (job->next != NULL)
        job->next->prev = job->prev;
    else
        t->tail = job->prev;
    job->next = job->prev = NULL;
    job->queued = false;
    heap_remove(s, job);
    s->queued_jobs--;
    s->queued_bytes -= job->bytes;
    if (t->head == NULL && t->active)
        ring_remove(s, t);
}

void sched_remove(struct sched *s, struct sched_job *job)
{
    assert(job->queued);
    struct sched_tenant *t = job->tenant;
    unlink_job(s, job);
    t->jobs--;
    t->bytes -= job->bytes;
    tenant_free_if_idle(s, t);
}

void sched_job_done(struct sched *s, struct sched_job *job)
{
    assert(job->running);
    struct sched_tenant *t = job->tenant;
    job->running = false;
    s->running_jobs--;
    t->jobs--;
    t->bytes -= job->bytes;
    tenant_free_if_idle(s, t);
}

struct batch {
    struct sched_job *first, *last;
    size_t n;
    uint64_t bytes;
    uint32_t buffers;
    uint64_t max_bytes;
    uint32_t max_buffers;
};

static bool batch_fits(const struct batch *b, const struct sched_job *job)
{
    if (b->n == 0)
        return true;
    return b->bytes + job->bytes <= b->max_bytes && b->buffers + job->n_buffers <= b->max_buffers;
}

static void batch_add(struct sched *s, struct batch *b, struct sched_job *job)
{
    struct sched_tenant *t = job->tenant;
    t->deficit -= job->bytes < t->deficit ? job->bytes : t->deficit;
    t->served_bytes += job->bytes;
    t->served_jobs++;
    unlink_job(s, job);
    job->running = true;
    s->running_jobs++;
    if (b->last != NULL)
        b->last->next = job;
    else
        b->first = job;
    b->last = job;
    b->n++;
    b->bytes += job->bytes;
    b->buffers += job->n_buffers;
}

/* Serves `t`'s head jobs that use `key` while its credit and the batch allow.
 * The first job of a batch is taken even when larger than the batch. */
static void serve(struct sched *s, struct batch *b, struct sched_tenant *t, const void *key)
{
    while (t->head != NULL && t->head->key == key && t->head->bytes <= t->deficit &&
           batch_fits(b, t->head))
        batch_add(s, b, t->head);
}

size_t sched_next_batch(struct sched *s, uint64_t max_bytes, uint32_t max_buffers,
                        struct sched_job **first)
{
    *first = NULL;
    if (s->cursor == NULL)
        return 0;
    uint64_t lat = sched_latency_bytes(s);
    struct batch b = {.max_bytes = lat < max_bytes ? lat : max_bytes, .max_buffers = max_buffers};
    uint64_t quantum = s->limits.quantum > 0 ? s->limits.quantum : 1;

    /* Phase 1: classic DRR visits until some tenant can send its head job. */
    struct sched_tenant *lead = s->cursor;
    for (;;) {
        lead->deficit += quantum;
        if (lead->head->bytes <= lead->deficit)
            break;
        lead = lead->act_next;
    }
    const void *key = lead->head->key;
    /* The next round starts after the lead; capture before it may leave the ring. */
    struct sched_tenant *after = lead->act_next;
    serve(s, &b, lead, key);

    /* Phase 2: the other backlogged tenants whose head uses the same catalog
     * ride along in this batch, each paying from its own credit. */
    uint32_t others = s->n_active - (lead->active ? 1u : 0u);
    struct sched_tenant *t = lead->active ? lead->act_next : after;
    for (uint32_t i = 0; i < others; i++) {
        struct sched_tenant *next = t->act_next;
        if (t->head->key == key && batch_fits(&b, t->head)) {
            t->deficit += quantum;
            serve(s, &b, t, key);
        }
        t = next;
    }
    /* Phase 3: no other tenant is waiting, so fairness has no one to protect
     * and the lead's further scans on this catalog fill the batch: each batch
     * pays a fixed launch, upload and hand-off cost (docs/PERFORMANCE.md,
     * rpc_bench: one 64 MiB scan per batch capped the daemon at 11 GB/s).
     * The credit is spent, not banked, so a tenant that arrives next starts
     * even. */
    if (lead->active && s->n_active == 1) {
        while (lead->head != NULL && lead->head->key == key && batch_fits(&b, lead->head)) {
            lead->deficit = lead->head->bytes;
            batch_add(s, &b, lead->head);
        }
        lead->deficit = 0;
    }
    if (lead->active)
        s->cursor = lead->act_next;
    else if (after->active)
        s->cursor = after;
    for (struct sched_job *j = b.first; j != NULL; j = j->next)
        j->prev = NULL;
    s->batches++;
    s->batched_jobs += b.n;
    *first = b.first;
    return b.n;
}

size_t sched_next_small(struct sched *s, uint64_t max_job_bytes, struct sched_job **first)
{
    *first = NULL;
    struct sched_tenant *t = s->cursor;
    for (uint32_t i = 0; t != NULL && i < s->n_active; i++, t = t->act_next) {
        if (t->head->bytes > max_job_bytes)
            continue;
        struct batch b = {.max_bytes = max_job_bytes, .max_buffers = UINT32_MAX};
        t->deficit += t->head->bytes; /* batch_add takes it back */
        batch_add(s, &b, t->head);
        b.first->prev = NULL;
        s->batches++;
        s->batched_jobs++;
        *first = b.first;
        return 1;
    }
    return 0;
}

size_t sched_take_expired(struct sched *s, uint64_t now_ns, struct sched_job **first)
{
    struct sched_job *out = NULL, **tail = &out;
    size_t n = 0;
    while (s->n_heap > 0 && s->heap[0]->deadline_ns <= now_ns) {
        struct sched_job *j = s->heap[0];
        struct sched_tenant *t = j->tenant;
        unlink_job(s, j); /* also leaves the heap */
        t->jobs--;
        t->bytes -= j->bytes;
        tenant_free_if_idle(s, t);
        *tail = j;
        tail = &j->next;
        n++;
    }
    *first = out;
    return n;
}

uint64_t sched_next_deadline(const struct sched *s)
{
    return s->n_heap > 0 ? s->heap[0]->deadline_ns : 0;
}

void sched_observe(struct sched *s, uint64_t bytes, uint64_t ns)
{
    if (bytes == 0 || ns == 0)
        return;
    double r = (double)bytes / (double)ns;
    s->rate = s->rate == 0 ? r : 0.75 * s->rate + 0.25 * r;
}

uint64_t sched_latency_bytes(const struct sched *s)
{
    if (s->limits.batch_max_ns == 0)
        return UINT64_MAX;
    double r = s->rate != 0 ? s->rate : RATE_DEFAULT;
    double b = r * (double)s->limits.batch_max_ns;
    return b >= 18e18 ? UINT64_MAX : b < 1 ? 1 : (uint64_t)b;
}

void sched_get_stats(const struct sched *s, struct sched_stats *out)
{
    out->tenants = s->n_tenants;
    out->queued_jobs = s->queued_jobs;
    out->queued_bytes = s->queued_bytes;
    out->running_jobs = s->running_jobs;
    out->batches = s->batches;
    out->batched_jobs = s->batched_jobs;
}

bool sched_tenant_stats(const struct sched *s, uid_t uid, struct sched_tenant_stats *out)
{
    for (const struct sched_tenant *t = s->tenants; t != NULL; t = t->next) {
        if (t->uid != uid)
            continue;
        out->uid = uid;
        out->jobs = t->jobs;
        out->bytes = t->bytes;
        out->served_bytes = t->served_bytes;
        out->served_jobs = t->served_jobs;
        return true;
    }
    return false;
}
