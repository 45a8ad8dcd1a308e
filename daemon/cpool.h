/*
 * The compile pool: rule-set compiles on threads of their own, apart from
 * libuv's thread pool (which the disk cache and the engine's descriptor
 * releases share), so a tenant's slow compiles never hold up another
 * tenant's disk load, and with a cap on the compiles one uid runs at once,
 * so tenant A's compiles never take every thread from tenant B.
 *
 * Scheduling: a free thread takes the oldest queued job whose uid runs fewer
 * than `tenant_max` jobs; a tenant over its cap waits while others run.
 *
 * Cancelling: cpool_cancel on a queued job takes it out (its done callback
 * reports -ECANCELED); on a running one it sets job->cancel, which the work
 * function passes to the compiler (rules_options.cancel) so it stops at its
 * next group. Either way `done` runs exactly once, on the loop thread, never
 * inside cpool_submit or cpool_cancel.
 *
 * Threads: every function is for the loop thread; `work` runs on a pool
 * thread, `done` on the loop thread.
 */
#ifndef VKS_DAEMON_CPOOL_H
#define VKS_DAEMON_CPOOL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

struct cpool;
struct cpool_job;

/* Runs on a pool thread. */
typedef void (*cpool_work_fn)(struct cpool_job *job);
/* Runs on the loop thread once the job left the pool: `status` 0 (work ran,
 * its result may still say it was cancelled) or -ECANCELED (never ran). */
typedef void (*cpool_done_fn)(struct cpool_job *job, int status);

/* Embedded in the caller's job; the caller owns it until `done` ran. */
struct cpool_job {
    uid_t uid;
    cpool_work_fn work;
    cpool_done_fn done;
    /* Set by cpool_cancel while the work runs: read and written only with
     * __atomic_load_n / __atomic_store_n (the compiler polls it). */
    volatile int cancel;
    /* the pool's */
    struct cpool_job *next, *prev;
    int state;
    int status;
};

/* Starts `threads` threads. Returns 0 or a negative errno. */
int cpool_create(uv_loop_t *loop, uint32_t threads, uint32_t tenant_max, struct cpool **out);

/* Cancels what is queued (done: -ECANCELED), flags what runs, joins the
 * threads and runs the remaining done callbacks. NULL is allowed. */
void cpool_destroy(struct cpool *p);

/* SIGHUP: a new per-uid cap (the thread count stays). */
void cpool_set_tenant_max(struct cpool *p, uint32_t tenant_max);

/* Queues `job` (job->uid, work, done set). */
void cpool_submit(struct cpool *p, struct cpool_job *job);

/* Cancels `job` if its done callback has not run yet (see above). */
void cpool_cancel(struct cpool *p, struct cpool_job *job);

/* Cancels every job (SIGTERM drain). */
void cpool_cancel_all(struct cpool *p);

/* Jobs queued or running (their done callback not run yet). */
uint32_t cpool_pending(const struct cpool *p);

/* Jobs running now for `uid`. */
uint32_t cpool_running(struct cpool *p, uid_t uid);

#endif
