/*
 * The compile pool (cpool.h): a mutex-protected FIFO, worker threads that
 * skip jobs of a uid at its cap, and a uv_async that brings finished jobs
 * back to the loop.
 */
#include "cpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

enum { JOB_QUEUED = 1, JOB_RUNNING, JOB_FINISHED };

struct list {
    struct cpool_job *head, *tail;
};

struct cpool {
    uv_loop_t *loop;
    uv_async_t async;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t *threads;
    uint32_t n_threads;
    uint32_t tenant_max;
    bool stop;
    struct list queued, running, finished;
    uint32_t pending; /* loop thread: submitted, done not run yet */
};

static void list_push(struct list *l, struct cpool_job *j)
{
    j->next = NULL;
    j->prev = l->tail;
    if (l->tail != NULL)
        l->tail->next = j;
    else
        l->head = j;
    l->tail = j;
}

static void list_remove(struct list *l, struct cpool_job *j)
{
    if (j->prev != NULL)
        j->prev->next = j->next;
    else
        l->head = j->next;
    if (j->next != NULL)
        j->next->prev = j->prev;
    else
        l->tail = j->prev;
    j->next = j->prev = NULL;
}

static uint32_t running_of(const struct cpool *p, uid_t uid)
{
    uint32_t n = 0;
    for (const struct cpool_job *j = p->running.head; j != NULL; j = j->next)
        n += j->uid == uid;
    return n;
}

/* The oldest queued job whose uid is under its cap; NULL when none. */
static struct cpool_job *pick(struct cpool *p)
{
    for (struct cpool_job *j = p->queued.head; j != NULL; j = j->next) {
        if (running_of(p, j->uid) < p->tenant_max)
            return j;
    }
    return NULL;
}

static void finish_locked(struct cpool *p, struct cpool_job *j, int status)
{
    j->state = JOB_FINISHED;
    j->status = status;
    list_push(&p->finished, j);
}

static void *worker(void *arg)
{
    struct cpool *p = arg;
    pthread_setname_np(pthread_self(), "vks-cpool");
    pthread_mutex_lock(&p->lock);
    for (;;) {
        struct cpool_job *j = NULL;
        while (!p->stop && (j = pick(p)) == NULL)
            pthread_cond_wait(&p->cond, &p->lock);
        if (j == NULL)
            break;
        list_remove(&p->queued, j);
        j->state = JOB_RUNNING;
        list_push(&p->running, j);
        pthread_mutex_unlock(&p->lock);
        j->work(j);
        pthread_mutex_lock(&p->lock);
        list_remove(&p->running, j);
        finish_locked(p, j, 0);
        pthread_cond_broadcast(&p->cond); /* its uid may be under the cap now */
        uv_async_send(&p->async);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* Loop thread: runs the done callbacks of finished jobs. */
static void on_async(uv_async_t *a)
{
    struct cpool *p = a->data;
    pthread_mutex_lock(&p->lock);
    struct cpool_job *j = p->finished.head;
    p->finished.head = p->finished.tail = NULL;
    pthread_mutex_unlock(&p->lock);
    while (j != NULL) {
        struct cpool_job *next = j->next;
        if (--p->pending == 0)
            uv_unref((uv_handle_t *)&p->async); /* an idle pool keeps no loop alive */
        j->done(j, j->status);
        j = next;
    }
}

int cpool_create(uv_loop_t *loop, uint32_t threads, uint32_t tenant_max, struct cpool **out)
{
    struct cpool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    p->loop = loop;
    p->tenant_max = tenant_max ? tenant_max : 1;
    p->threads = calloc(threads ? threads : 1, sizeof(*p->threads));
    int rc = p->threads == NULL ? -ENOMEM : uv_async_init(loop, &p->async, on_async);
    if (rc != 0) {
        free(p->threads);
        free(p);
        return rc;
    }
    p->async.data = p;
    uv_unref((uv_handle_t *)&p->async);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    for (uint32_t i = 0; i < (threads ? threads : 1); i++) {
        rc = -pthread_create(&p->threads[i], NULL, worker, p);
        if (rc != 0)
            break;
        p->n_threads++;
    }
    if (rc != 0) {
        cpool_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

void cpool_cancel_all(struct cpool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    while (p->queued.head != NULL) {
        struct cpool_job *j = p->queued.head;
        list_remove(&p->queued, j);
        finish_locked(p, j, -ECANCELED);
    }
    for (struct cpool_job *j = p->running.head; j != NULL; j = j->next)
        __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->lock);
    uv_async_send(&p->async);
}

static void on_closed(uv_handle_t *h)
{
    free(h->data);
}

void cpool_destroy(struct cpool *p)
{
    if (p == NULL)
        return;
    cpool_cancel_all(p);
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    for (uint32_t i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    on_async(&p->async); /* what finished since */
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    free(p->threads);
    uv_close((uv_handle_t *)&p->async, on_closed);
}

void cpool_set_tenant_max(struct cpool *p, uint32_t tenant_max)
{
    pthread_mutex_lock(&p->lock);
    p->tenant_max = tenant_max ? tenant_max : 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

void cpool_submit(struct cpool *p, struct cpool_job *j)
{
    __atomic_store_n(&j->cancel, 0, __ATOMIC_RELAXED);
    j->status = 0;
    if (p->pending++ == 0)
        uv_ref((uv_handle_t *)&p->async); /* work in flight keeps the loop running */
    pthread_mutex_lock(&p->lock);
    j->state = JOB_QUEUED;
    list_push(&p->queued, j);
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

void cpool_cancel(struct cpool *p, struct cpool_job *j)
{
    pthread_mutex_lock(&p->lock);
    if (j->state == JOB_QUEUED) {
        list_remove(&p->queued, j);
        finish_locked(p, j, -ECANCELED);
        uv_async_send(&p->async);
    } else if (j->state == JOB_RUNNING) {
        __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED); /* the compile polls it */
    }
    pthread_mutex_unlock(&p->lock);
}

uint32_t cpool_pending(const struct cpool *p)
{
    return p != NULL ? p->pending : 0;
}

uint32_t cpool_running(struct cpool *p, uid_t uid)
{
    pthread_mutex_lock(&p->lock);
    uint32_t n = running_of(p, uid);
    pthread_mutex_unlock(&p->lock);
    return n;
}
