/*
 * The upload thread pool: a fixed set of threads that copy batch buffers
 * into persistently mapped staging memory in parallel. One memcpy thread
 * moves about 10 GB/s into touched memory; PCIe Gen5 takes 50 GB/s, so the
 * copy into staging is split across threads (docs/gpu.md).
 *
 * Two jobs at most: the one upload_pool_run waits for (the caller takes
 * part), and one started in the background (upload_pool_start, a batch's
 * upload while the engine thread collects the batch before it), which the
 * caller joins at upload_pool_wait. The threads hand out the waited-for
 * job's tasks first: it is what the calling thread stands still for.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

struct pool_job {
    pool_fn fn;
    void *ctx;
    uint32_t next; /* next task index to hand out */
    uint32_t n;
    uint32_t running;
};

struct upload_pool {
    pthread_mutex_t lock;
    pthread_cond_t work;
    pthread_cond_t idle;
    pthread_t *threads;
    uint32_t n_threads;
    struct pool_job run; /* upload_pool_run's */
    struct pool_job bg;  /* upload_pool_start's */
    bool stop;
};

uint64_t gpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool has_tasks(const struct pool_job *j)
{
    return j->next < j->n;
}

static bool done(const struct pool_job *j)
{
    return j->next >= j->n && j->running == 0;
}

/* Runs one task of `j`; called with the lock held, returns with it held. */
static void run_one(struct upload_pool *p, struct pool_job *j)
{
    uint32_t i = j->next++;
    j->running++;
    pthread_mutex_unlock(&p->lock);
    j->fn(j->ctx, i);
    pthread_mutex_lock(&p->lock);
    if (--j->running == 0 && j->next >= j->n)
        pthread_cond_broadcast(&p->idle);
}

static void *worker(void *arg)
{
    struct upload_pool *p = arg;
    pthread_setname_np(pthread_self(), "vks-upload"); /* top -H, perf: whose time */
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        if (has_tasks(&p->run))
            run_one(p, &p->run);
        else if (has_tasks(&p->bg))
            run_one(p, &p->bg);
        else
            pthread_cond_wait(&p->work, &p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int upload_pool_create(uint32_t threads, struct upload_pool **out)
{
    struct upload_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    p->threads = calloc(threads ? threads : 1, sizeof(pthread_t));
    if (p->threads == NULL) {
        upload_pool_destroy(p);
        return -ENOMEM;
    }
    /* The caller's thread is one of the workers. */
    for (uint32_t i = 1; i < threads; i++) {
        if (pthread_create(&p->threads[p->n_threads], NULL, worker, p) != 0)
            break;
        p->n_threads++;
    }
    *out = p;
    return 0;
}

/* With the lock held: the caller takes the pieces of `j` nobody has
 * taken, waits for those running on other threads, and clears the job. */
static void finish(struct upload_pool *p, struct pool_job *j)
{
    while (has_tasks(j))
        run_one(p, j);
    while (!done(j))
        pthread_cond_wait(&p->idle, &p->lock);
    *j = (struct pool_job){0};
}

void upload_pool_run(struct upload_pool *p, pool_fn fn, void *ctx, uint32_t n)
{
    pthread_mutex_lock(&p->lock);
    p->run = (struct pool_job){.fn = fn, .ctx = ctx, .n = n};
    pthread_cond_broadcast(&p->work);
    finish(p, &p->run);
    pthread_mutex_unlock(&p->lock);
}

bool upload_pool_start(struct upload_pool *p, pool_fn fn, void *ctx, uint32_t n)
{
    pthread_mutex_lock(&p->lock);
    p->bg = (struct pool_job){.fn = fn, .ctx = ctx, .n = n};
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    return p->n_threads > 0;
}

bool upload_pool_help(struct upload_pool *p)
{
    pthread_mutex_lock(&p->lock);
    bool ran = has_tasks(&p->bg);
    if (ran)
        run_one(p, &p->bg);
    pthread_mutex_unlock(&p->lock);
    return ran;
}

void upload_pool_wait(struct upload_pool *p)
{
    pthread_mutex_lock(&p->lock);
    finish(p, &p->bg);
    pthread_mutex_unlock(&p->lock);
}

uint32_t upload_pool_threads(const struct upload_pool *p)
{
    return p->n_threads + 1;
}

void upload_pool_destroy(struct upload_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (uint32_t i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
