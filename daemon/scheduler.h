/*
 * The scheduler: per-tenant FIFO queues of scan jobs, served by deficit round
 * robin over bytes, and cut into engine batches.
 *
 * Fairness: each time a tenant is visited it gains `quantum` bytes of credit
 * and sends jobs from the head of its queue while their bytes fit its credit;
 * a tenant whose queue empties loses its credit. So over time each backlogged
 * tenant gets an equal share of scanned bytes, whatever its request sizes.
 *
 * Batching: the tenant whose turn it is decides the batch's catalog; the
 * other backlogged tenants whose next job uses the same catalog join the same
 * batch (spending their own credit), so small scans from many clients against
 * one catalog go to the device in one dispatch.
 *
 * Latency: a batch is also bounded by its estimated run time (`batch_max_ns`
 * over the throughput of recent batches, sched_observe), so a lone tenant's
 * backlog goes to the device in pieces and a tenant that arrives later waits
 * behind at most the one piece in flight, never behind its whole backlog.
 *
 * Deadlines: queued jobs with a deadline sit in a binary min-heap, so the
 * next deadline is O(1) and a push, removal or expiry O(log n).
 *
 * Quotas: a tenant's queued-plus-running jobs and bytes are counted; the
 * server stops reading a tenant's sockets while sched_tenant_over() is true.
 *
 * Loop thread only. Jobs are intrusive: the caller embeds struct sched_job in
 * its own request and owns it; the scheduler only links it.
 */
#ifndef VKS_DAEMON_SCHEDULER_H
#define VKS_DAEMON_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "error.h"

struct sched;
struct sched_tenant;
struct engine_job;

struct sched_job {
    struct sched_job *next, *prev; /* tenant queue while queued; batch list after */
    struct sched_tenant *tenant;   /* set by sched_push */
    const void *key;               /* jobs with equal keys may share a batch (the catalog) */
    uint64_t bytes;
    uint32_t n_buffers;
    uint64_t deadline_ns; /* uv_hrtime() clock; 0 = none */
    bool queued;          /* in a tenant queue */
    bool running;         /* taken into a batch, not yet done */
    size_t heap_idx;      /* scheduler: position in the deadline heap + 1; 0 = not in it */
    /* The server's: the engine job of this job when it is taken into a
     * batch; NULL: a scan request's (session_job_engine). A stream write's
     * middle sets its own (daemon/stream.c). */
    struct engine_job *(*engine_job)(struct sched_job *job);
};

struct sched_limits {
    uint64_t quantum;
    uint32_t tenant_max_requests;
    uint64_t tenant_max_bytes;
    uint64_t batch_max_ns; /* estimated run time of one batch; 0 = no latency bound */
};

struct sched_tenant_stats {
    uid_t uid;
    uint32_t jobs;  /* queued + running */
    uint64_t bytes; /* queued + running */
    uint64_t served_bytes;
    uint64_t served_jobs;
};

struct sched_stats {
    uint32_t tenants;
    uint32_t queued_jobs;
    uint64_t queued_bytes;
    uint32_t running_jobs;
    uint64_t batches;
    uint64_t batched_jobs;
};

/* Creates an empty scheduler. Returns 0 or -ENOMEM. */
int sched_create(const struct sched_limits *limits, struct sched **out);

/* Frees the scheduler; every tenant must have been put and every job
 * removed or done. NULL is allowed. */
void sched_destroy(struct sched *s);

/* Replaces the limits (SIGHUP); takes effect at the next push or batch. */
void sched_set_limits(struct sched *s, const struct sched_limits *limits);

/* Returns the tenant for `uid`, creating it, with one more reference; NULL
 * when out of memory. Each session holds one reference. */
struct sched_tenant *sched_tenant_get(struct sched *s, uid_t uid);

/* Drops a reference; an unreferenced, idle tenant is freed, or, once served,
 * kept with its served counters for sched_tenant_stats (one record per uid). */
void sched_tenant_put(struct sched *s, struct sched_tenant *t);

uid_t sched_tenant_uid(const struct sched_tenant *t);

/* True while the tenant's queued-plus-running jobs or bytes are at or over
 * its quota: its sockets should not be read. */
bool sched_tenant_over(const struct sched *s, const struct sched_tenant *t);

/* Request bytes (frames) the tenant's requests in flight hold, whatever
 * their op: the server stops reading a tenant at tenant_max_bytes of them,
 * so loads waiting for a compile are bounded like queued scans. */
void sched_tenant_hold(struct sched_tenant *t, int64_t delta);
bool sched_tenant_holds_too_much(const struct sched *s, const struct sched_tenant *t);

/* True when a single job of `bytes` could never fit the tenant quota. */
bool sched_job_too_big(const struct sched *s, uint64_t bytes);

/* Appends `job` to `t`'s queue. The job is borrowed until it is removed or
 * taken and done. Returns 0, or -ENOMEM (the deadline heap could not grow;
 * the job is not queued). */
int sched_push(struct sched *s, struct sched_tenant *t, struct sched_job *job);

/* Takes a queued job out without running it (disconnect, timeout). */
void sched_remove(struct sched *s, struct sched_job *job);

/*
 * Takes the next batch in fair order: jobs with one key, at most `max_bytes`
 * bytes (lowered to what the throughput estimate runs in batch_max_ns) and
 * `max_buffers` buffers together (a single job larger than that is taken
 * alone). Returns the number of jobs, linked from *first through
 * job->next (NULL-terminated), each now `running`; 0 when nothing is queued.
 */
size_t sched_next_batch(struct sched *s, uint64_t max_bytes, uint32_t max_buffers,
                        struct sched_job **first);

/*
 * The express lane: when the engine is full, a tenant's small scan should
 * not wait for a large batch to finish. Takes the head job of the first
 * tenant in fair order whose head is at most `max_job_bytes`, as a batch of
 * one; the tenant pays exactly its bytes, so the DRR rounds are unchanged.
 * Returns 1 with the job in *first (now `running`), or 0 when no tenant's
 * head is that small.
 */
size_t sched_next_small(struct sched *s, uint64_t max_job_bytes, struct sched_job **first);

/* Feeds the throughput estimate: a batch of `bytes` ran in `ns`. */
void sched_observe(struct sched *s, uint64_t bytes, uint64_t ns);

/* The byte bound the latency target gives now (UINT64_MAX: none). */
uint64_t sched_latency_bytes(const struct sched *s);

/* Marks a running job finished: its bytes leave the tenant's quota. */
void sched_job_done(struct sched *s, struct sched_job *job);

/* Removes every queued job whose deadline is at or before `now_ns` and
 * links them from *first (through job->next); returns how many. */
size_t sched_take_expired(struct sched *s, uint64_t now_ns, struct sched_job **first);

/* Earliest deadline of a queued job, or 0 when none. */
uint64_t sched_next_deadline(const struct sched *s);

void sched_get_stats(const struct sched *s, struct sched_stats *out);

/* Fills the stats of tenant `uid`; returns false when it is unknown. */
bool sched_tenant_stats(const struct sched *s, uid_t uid, struct sched_tenant_stats *out);

#endif
