/*
 * The upload thread pool: a fixed set of threads that copy batch buffers
 * into persistently mapped staging memory in parallel. One memcpy thread
 * moves about 10 GB/s into touched memory; PCIe Gen5 takes 50 GB/s, so the
 * copy into staging is split across threads (docs/gpu.md).
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

struct upload_pool {
    pthread_mutex_t lock;
    pthread_cond_t work;
    pthread_cond_t idle;
    pthread_t *threads;
    uint32_t n_threads;
    uint64_t generation;
    pool_fn fn;
    void *ctx;
    uint32_t next; /* next task index to hand out */
    uint32_t n;
    uint32_t running;
    bool stop;
};

uint64_t gpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Runs tasks of the current job until none is left; called with the lock
 * held, returns with it held. */
static void drain(struct upload_pool *p)
{
    while (p->next < p->n) {
        uint32_t i = p->next++;
        p->running++;
        pthread_mutex_unlock(&p->lock);
        p->fn(p->ctx, i);
        pthread_mutex_lock(&p->lock);
        if (--p->running == 0 && p->next >= p->n)
            pthread_cond_broadcast(&p->idle);
    }
}

static void *worker(void *arg)
{
    struct upload_pool *p = arg;
    pthread_setname_np(pthread_self(), "vks-upload"); /* top -H, perf: whose time */
    pthread_mutex_lock(&p->lock);
    uint64_t seen = p->generation;
    while (!p->stop) {
        if (p->generation == seen) {
            pthread_cond_wait(&p->work, &p->lock);
            continue;
        }
        seen = p->generation;
        drain(p);
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

void upload_pool_run(struct upload_pool *p, pool_fn fn, void *ctx, uint32_t n)
{
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->ctx = ctx;
    p->next = 0;
    p->n = n;
    p->generation++;
    pthread_cond_broadcast(&p->work);
    drain(p);
    while (p->running != 0)
        pthread_cond_wait(&p->idle, &p->lock);
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
