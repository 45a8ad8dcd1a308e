/*
 * The GPU engines (engine.h): each worker thread runs its batches on its
 * gpu_engine and hands jobs the device cannot run (too big, too slow,
 * device lost) to the CPU engine. Opening, warming and the setup thread
 * are in engine_gpu_open.c.
 */
#include "engine_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rules.h"
#include "vkscan/errors.h"

/* ---- the GPU engines -------------------------------------------------- */

/* A buffer of the GPU batch: where its hits go. */
struct slot {
    uint32_t job; /* index into the jobs array */
    uint32_t buf;
};

/* The engine failed a batch in a way that leaves it unusable: open it
 * again, exactly as at start (warm-up self-test included). No batch of it
 * may be pending. */
static void gpu_reopen(struct gworker *w)
{
    struct vks_error err = {0};
    __atomic_add_fetch(&w->reopens, 1, __ATOMIC_RELAXED);
    if (w->gpu != NULL) {
        struct gpu_engine_stats gs;
        gpu_engine_stats(w->gpu, &gs);
        w->busy_base += gs.busy_ns;
    }
    gpu_engine_destroy(w->gpu);
    w->gpu = NULL;
    if (engine_gpu_open(w->e, w, &err) != 0) {
        log_err("GPU engine %u could not be re-created after a device failure (%s): its batches "
                "go to the other engines from now on; restart vkscand to use it again",
                w->index, err.msg);
        pthread_mutex_lock(&w->e->mu);
        __atomic_store_n(&w->alive, false, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&w->e->mu);
    }
}

/* What collecting keeps of a job, also between the batches of its slices
 * (run_gpu_slices): its hit array's capacity, the hits kept, the buffer
 * whose marker it pushed (-1: none). */
struct collect_state {
    size_t cap;
    uint64_t kept;
    int64_t marked;
};

static void collect_into(struct gpu_result *res, struct engine_job **jobs, const struct slot *slots,
                         struct collect_state *cs);

/* Keeps at most max_hits hits of each job after readback, plus one marker
 * per buffer with more (engine_job.max_hits). */
static int gpu_collect(struct gpu_result *res, struct engine_job **jobs, size_t n,
                       const struct slot *slots)
{
    struct collect_state *cs = calloc(n ? n : 1, sizeof(*cs));
    if (cs == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        cs[i].marked = -1;
    collect_into(res, jobs, slots, cs);
    free(cs);
    return 0;
}

/* collect_state cs[i] for jobs[i]. */
static void collect_into(struct gpu_result *res, struct engine_job **jobs, const struct slot *slots,
                         struct collect_state *cs)
{
    for (size_t h = 0; h < res->n_hits; h++) {
        const struct gpu_hit *g = &res->hits[h];
        const struct slot *s = &slots[g->buffer];
        struct engine_job *j = jobs[s->job];
        if (j->status != 0 || j->bufs[s->buf].read_err != 0)
            continue; /* a buffer whose read failed: engine_batch_read_errors fails it */
        struct collect_state *c = &cs[s->job];
        if (c->kept >= engine_job_budget(j)) {
            j->hits_dropped++;
            if (c->marked == (int64_t)s->buf)
                continue;
            c->marked = s->buf;
        } else {
            c->kept++;
        }
        if (engine_job_push_hit(j, &c->cap, s->buf, g->rule, g->count, g->end) != 0)
            engine_job_fail(j, -VKS_E_INTERNAL, "out of memory collecting hits");
    }
    if (res->cap > RES_KEEP_HITS)
        gpu_result_finish(res);
}

static void gpu_unbuild(struct gpend *p)
{
    free(p->gb);
    free(p->slots);
    p->gb = NULL;
    p->slots = NULL;
}

static int gpu_build_range(struct gpend *p, struct engine_job **jobs, size_t n, uint32_t b0,
                           uint32_t b1);

/* Builds the jobs j[0..n) into one GPU batch in `p`. Returns 0, -E2BIG
 * (more catalogs than a batch takes) or -ENOMEM. */
static int gpu_build(struct gpend *p, struct engine_job **jobs, size_t n)
{
    return gpu_build_range(p, jobs, n, 0, UINT32_MAX);
}

/* The same, with only the buffers [b0, b1) of each job. */
static int gpu_build_range(struct gpend *p, struct engine_job **jobs, size_t n, uint32_t b0,
                           uint32_t b1)
{
    size_t nb = 0;
    for (size_t i = 0; i < n; i++)
        nb += jobs[i]->n_bufs;
    p->gb = calloc(nb ? nb : 1, sizeof(*p->gb));
    p->slots = calloc(nb ? nb : 1, sizeof(*p->slots));
    if (p->gb == NULL || p->slots == NULL) {
        gpu_unbuild(p);
        return -ENOMEM;
    }
    uint32_t n_cats = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        struct engine_job *j = jobs[i];
        uint32_t c = 0;
        while (c < n_cats && p->cats[c] != j->cat)
            c++;
        if (c == n_cats) {
            if (n_cats == GPU_MAX_BATCH_CATALOGS) {
                gpu_unbuild(p);
                return -E2BIG;
            }
            p->cats[n_cats++] = j->cat;
        }
        for (uint32_t b = b0; b < j->n_bufs && b < b1; b++) {
            if (j->bufs[b].status != 0 || j->bufs[b].skip)
                continue;
            struct engine_buf *eb = &j->bufs[b];
            p->gb[k] = (struct gpu_buffer){.data = eb->data,
                                           .len = (size_t)eb->len,
                                           .id = k,
                                           .mode = j->mode,
                                           .catalog = c,
                                           .read = eb->deferred ? engine_buf_read : NULL,
                                           .read_ctx = eb};
            p->slots[k++] = (struct slot){(uint32_t)i, b};
        }
    }
    p->batch = (struct gpu_batch){
        .catalogs = p->cats, .n_catalogs = n_cats, .buffers = p->gb, .n_buffers = k};
    return 0;
}

/* Settles the jobs of a GPU batch that finished with status `rc` and
 * result `res`. Returns -E2BIG when the batch of several jobs does not fit
 * the device (nothing ran: split it), else 0. A job the device cannot run
 * (one too large, a timeout, a lost device) is marked for the CPU engine;
 * after a failure that leaves the engine unusable, w->reopen is set. */
static int gpu_settle(struct gworker *w, struct gpu_result *res, const struct slot *slots,
                      struct engine_job **jobs, size_t n, int rc, const struct vks_error *err,
                      struct gpu_telemetry *tel)
{
    if (rc == -E2BIG && n > 1)
        return rc;
    if (rc == -ENOTSUP) {
        /* A kernel the driver cannot build (gpu_pipeline_get): the device
         * is fine. Every batch of such a catalog comes here, so only the
         * worker's first is a warning. */
        log_msg(w->refusals++ == 0 ? LOG_LVL_WARNING : LOG_LVL_INFO,
                "GPU engine %u: %s: the batch's %zu scans run on the CPU engine", w->index,
                err->msg, n);
        for (size_t i = 0; i < n; i++)
            jobs[i]->cpu_retry = rc;
        return 0;
    }
    if (rc == -E2BIG || rc == -ETIMEDOUT || rc == -ENODEV || rc == -EIO) {
        log_warn("GPU engine %u: %s: the batch's %zu scans re-run on the CPU engine", w->index,
                 err->msg, n);
        for (size_t i = 0; i < n; i++)
            jobs[i]->cpu_retry = rc;
        if (rc != -E2BIG)
            w->reopen = true;
        return 0;
    }
    if (rc != 0) {
        char msg[300];
        snprintf(msg, sizeof(msg), "the GPU failed the scan: %.250s", err->msg);
        for (size_t i = 0; i < n; i++)
            engine_job_fail(jobs[i], -VKS_E_DEVICE, msg);
        return 0;
    }
    *tel = res->tel;
    if (gpu_collect(res, jobs, n, slots) != 0) {
        for (size_t i = 0; i < n; i++)
            engine_job_fail(jobs[i], -VKS_E_INTERNAL, "out of memory collecting hits");
    }
    return 0;
}

/* Bytes of the first slice of a job too large for one batch: under the 4
 * GiB a batch can index (gpu_plan_batch); halved while a slice does not
 * fit the device's memory budget. */
#define SLICE_BYTES (2ull << 30)

/*
 * A job whose buffers together are over what one batch takes (the 4 GiB a
 * batch can index, the device-memory budget) runs on the GPU in slices of
 * whole buffers, one batch each, in buffer order, its hits collected as
 * one batch's would be. Returns 0 when the job ran so (or failed for
 * good); 1 when it cannot be sliced (one buffer alone is too large, or a
 * slice failed the device), with the job's hits from slices before reset:
 * the caller hands it to the CPU engine.
 */
static int run_gpu_slices(struct gworker *w, struct engine_job *j, struct gpu_telemetry *tel)
{
    uint32_t live = 0;
    for (uint32_t b = 0; b < j->n_bufs; b++)
        live += j->bufs[b].status == 0 && !j->bufs[b].skip;
    if (live < 2)
        return 1;
    struct collect_state cs = {.marked = -1};
    uint64_t limit = SLICE_BYTES;
    uint32_t slices = 0;
    for (uint32_t b0 = 0; b0 < j->n_bufs;) {
        uint64_t bytes = 0;
        uint32_t b1 = b0;
        while (b1 < j->n_bufs && (b1 == b0 || bytes + j->bufs[b1].len <= limit))
            bytes += j->bufs[b1++].len;
        struct gpend p = {0};
        struct engine_job *one[1] = {j};
        int rc = gpu_build_range(&p, one, 1, b0, b1);
        struct vks_error err = {0};
        if (rc == 0)
            rc = gpu_batch_dispatch(w->gpu, &p.batch, &w->res, &err);
        if (rc == -E2BIG && b1 - b0 > 1) {
            gpu_unbuild(&p);
            limit /= 2; /* over the memory budget: smaller slices */
            continue;
        }
        if (rc == 0) {
            gpu_telemetry_add(tel, &w->res.tel);
            collect_into(&w->res, one, p.slots, &cs);
        }
        gpu_unbuild(&p);
        if (rc != 0) {
            if (rc == -ETIMEDOUT || rc == -ENODEV || rc == -EIO)
                w->reopen = true;
            log_warn("GPU engine %u: a scan of %u buffers over one batch's limits, in slices: "
                     "slice %u failed (%s): the scan re-runs on the CPU engine",
                     w->index, live, slices, rc == -ENOMEM ? "out of memory" : err.msg);
            j->n_hits = 0; /* the CPU engine scans it all again */
            j->hits_dropped = 0;
            return 1;
        }
        slices++;
        b0 = b1;
    }
    tel->slices += slices;
    return 0;
}

/* Dispatches the jobs j[0..n) as one GPU batch and waits for it (no other
 * batch of the worker is pending). Returns 0, or -E2BIG when the batch of
 * several jobs does not fit the device (nothing ran), or -ENOMEM. */
static int run_gpu(struct gworker *w, struct engine_job **jobs, size_t n, struct gpu_telemetry *tel)
{
    if (w->gpu == NULL) {
        for (size_t i = 0; i < n; i++)
            jobs[i]->cpu_retry = -ENODEV;
        return 0;
    }
    struct gpend p = {0};
    int rc = gpu_build(&p, jobs, n);
    if (rc < 0)
        return rc;
    struct vks_error err = {0};
    rc = gpu_batch_dispatch(w->gpu, &p.batch, &w->res, &err);
    if (rc == -E2BIG && n == 1 && run_gpu_slices(w, jobs[0], tel) == 0) {
        gpu_unbuild(&p);
        return 0;
    }
    rc = gpu_settle(w, &w->res, p.slots, jobs, n, rc, &err, tel);
    if (w->reopen) {
        w->reopen = false;
        gpu_reopen(w);
    }
    gpu_unbuild(&p);
    return rc;
}

/* Runs jobs[0..n) on the GPU, splitting the batch in halves while it does
 * not fit the device; a single job that does not fit goes to the CPU. */
static void run_gpu_split(struct gworker *w, struct engine_job **jobs, size_t n,
                          struct engine_telemetry *tel)
{
    if (n == 0)
        return;
    struct gpu_telemetry t = {0};
    int rc = run_gpu(w, jobs, n, &t);
    if (rc == -E2BIG) {
        run_gpu_split(w, jobs, n / 2, tel);
        run_gpu_split(w, jobs + n / 2, n - n / 2, tel);
        return;
    }
    if (rc != 0) {
        for (size_t i = 0; i < n; i++)
            engine_job_fail(jobs[i], -VKS_E_INTERNAL, "out of memory building the GPU batch");
        return;
    }
    if (t.total_ns == 0 && t.kernel_launches == 0)
        return; /* nothing ran (the jobs went to the CPU) */
    gpu_telemetry_add(&tel->gpu_tel, &t);
}

void engine_cpu_push(struct engine *e, struct engine_batch *b);

/* Publishes what the batch cost and hands it on: to the loop thread, or
 * to the CPU engine when jobs are to re-run there. */
static void gpu_done(struct gworker *w, struct engine_batch *b, uint64_t t1)
{
    struct engine *e = w->e;
    struct bstate *st = b->priv;
    uint32_t retries = 0;
    for (size_t i = 0; i < st->n_jobs; i++)
        retries += st->jobs[i]->status == 0 && st->jobs[i]->cpu_retry != 0;
    b->tel.cpu_retries = retries;
    b->tel.idle_ns = b->tel.gpu_tel.device_idle_ns;
    w->last_done_ns = engine_now_ns();
    b->tel.scan_ns = w->last_done_ns - t1;
    struct gpu_engine_stats gs = {0};
    if (w->gpu != NULL)
        gpu_engine_stats(w->gpu, &gs);
    pthread_mutex_lock(&e->mu);
    w->batches++;
    w->bytes += b->tel.bytes;
    /* busy: the device held at least one batch (batches overlap) */
    w->busy_ns = w->busy_base + gs.busy_ns;
    if (gs.max_inflight > w->max_inflight)
        w->max_inflight = gs.max_inflight;
    w->retries += retries;
    if (w->gpu != NULL) {
        w->resident = gpu_engine_resident_catalogs(w->gpu);
        if (b->tel.gpu_tel.resident_bytes != 0)
            w->device_used = b->tel.gpu_tel.resident_bytes;
    } else {
        w->resident = 0;
        w->device_used = 0;
    }
    b->tel.gpu_tel.resident_catalogs = w->resident;
    pthread_mutex_unlock(&e->mu);
    engine_batch_read_errors(b);
    if (retries > 0) {
        engine_batch_fetch(e, b); /* the CPU engine scans bytes in memory */
        engine_cpu_push(e, b);
    } else {
        engine_batch_post(e, b);
    }
}

/* Runs a loaded batch the synchronous way: splitting it while it does not
 * fit the device, after every batch submitted before it was collected. */
static void gpu_run_sync(struct gworker *w, struct engine_batch *b, uint64_t t1)
{
    struct bstate *st = b->priv;
    run_gpu_split(w, st->jobs, st->n_jobs, &b->tel);
    gpu_done(w, b, t1);
}

static void gpu_drain(struct gworker *w);

/* Collects the oldest pending batch, settles its jobs and hands it on.
 * Returns the batch when the hits of its several jobs passed a device
 * limit (it runs again the synchronous way: gpu_finish_oldest), with its
 * start time in *t1; else NULL. */
static struct engine_batch *gpu_collect_oldest(struct gworker *w, uint64_t *t1)
{
    struct gpend *p = &w->pend[w->pend_head];
    struct engine_batch *b = p->b;
    struct bstate *st = b->priv;
    struct gpu_result *res;
    struct vks_error err = {0};
    int rc = gpu_batch_collect(w->gpu, &res, &err);
    w->pend_head = (w->pend_head + 1) % GPU_MAX_INFLIGHT;
    w->n_pend--;
    rc = gpu_settle(w, res, p->slots, st->jobs, st->n_jobs, rc, &err, &b->tel.gpu_tel);
    gpu_unbuild(p);
    *t1 = p->t1;
    if (rc == -E2BIG)
        return b;
    gpu_done(w, b, p->t1);
    return NULL;
}

static void gpu_finish_oldest(struct gworker *w)
{
    uint64_t t1;
    struct engine_batch *b = gpu_collect_oldest(w, &t1);
    if (b != NULL) {
        gpu_drain(w);
        gpu_run_sync(w, b, t1);
    }
}

/* How the worker reads a batch's descriptor buffers (docs/daemon.md
 * "Descriptor buffers"): files and memfds go from the page cache straight
 * into staging, read by the upload threads, unless VKSCAND_FD_UPLOAD says
 * to map sealed memfds at load instead. */
static void gpu_load(struct gworker *w, struct engine_batch *b)
{
    struct bstate *st = b->priv;
    int how = w->e->fd_upload;
    st->defer = w->gpu != NULL;
    st->defer_sealed = how == FD_AUTO || how == FD_PREAD;
    st->populate = how == FD_POPULATE;
    engine_batch_load(w->e, b);
}

/*
 * Loads the batch queued next while the upload threads fill the begun
 * one: its descriptors are inspected (and, with VKSCAND_FD_UPLOAD=map, its
 * memfds mapped: 5 ms for five 64 MiB memfds on the H200, during which the
 * upload threads idled when it ran between two uploads). Only this worker takes from its queue, so
 * the batch stays where it is; gpu_start then finds it loaded.
 */
static void gpu_load_next(struct gworker *w)
{
    struct engine *e = w->e;
    pthread_mutex_lock(&e->mu);
    struct engine_batch *b = e->stop ? NULL : w->head;
    pthread_mutex_unlock(&e->mu);
    if (b != NULL && !((struct bstate *)b->priv)->loaded) {
        gpu_load(w, b);
        b->tel.loaded_ahead = true;
    }
}

/*
 * While a begun batch's upload runs on the upload threads, the worker
 * copies pieces of it too, and collects (reads back, settles, hands on)
 * each older batch the device has finished meanwhile, so that the
 * collect no longer waits behind the upload (docs/gpu.md "Batches in
 * flight"). A batch not finished when the upload has no piece left is
 * collected later, as before: waiting for it here would leave the device
 * without the begun batch. Returns a batch to re-run the synchronous way
 * once the begun one is submitted (gpu_collect_oldest), or NULL.
 */
static struct engine_batch *gpu_overlap(struct gworker *w, uint64_t *t1)
{
    struct engine_batch *resync = NULL;
    gpu_load_next(w);
    for (;;) {
        if (w->n_pend > 0 && resync == NULL && gpu_batch_oldest_done(w->gpu))
            resync = gpu_collect_oldest(w, t1);
        else if (!gpu_batch_upload_help(w->gpu))
            return resync;
    }
}

static void gpu_drain(struct gworker *w)
{
    while (w->n_pend > 0)
        gpu_finish_oldest(w);
}

/* Takes a batch off the queue: loads it and submits it to the device
 * without waiting (gpu_batch_begin, gpu_batch_end), so that its upload
 * overlaps the batches already there and the collect of those the device
 * has finished (gpu_overlap). A batch that needs the synchronous way
 * (several GPU batches, no engine) runs after the pending ones. */
static void gpu_start(struct gworker *w, struct engine_batch *b)
{
    struct bstate *st = b->priv;
    if (w->reopen) {
        gpu_drain(w);
        w->reopen = false;
        gpu_reopen(w);
    }
    b->tel.gpu = true;
    b->tel.engine = w->index;
    if (!st->loaded)
        gpu_load(w, b);
    else /* loaded ahead (gpu_load_next): its wall leaves out the wait since */
        st->start_ns = engine_now_ns() - b->tel.fd_read_ns;
    uint64_t t1 = engine_now_ns();
    struct gpend *p = &w->pend[(w->pend_head + w->n_pend) % GPU_MAX_INFLIGHT];
    p->b = b;
    p->t1 = t1;
    int rc = w->gpu != NULL ? gpu_build(p, st->jobs, st->n_jobs) : -ENODEV;
    if (rc < 0) { /* no engine, too many catalogs for one batch, or no memory */
        gpu_drain(w);
        gpu_run_sync(w, b, t1);
        return;
    }
    struct vks_error err = {0};
    struct engine_batch *resync = NULL;
    uint64_t resync_t1 = 0;
    rc = gpu_batch_begin(w->gpu, &p->batch, &p->res, &err);
    if (rc == 0) {
        /* collects move the ring's head and count together: p stays this
         * batch's slot */
        resync = gpu_overlap(w, &resync_t1);
        rc = gpu_batch_end(w->gpu, &err);
    }
    if (rc == 0) {
        w->n_pend++;
    } else if (rc == -E2BIG) { /* split it: into jobs, or one job into slices (run_gpu) */
        gpu_unbuild(p);
        gpu_drain(w);
        gpu_run_sync(w, b, t1);
    } else {
        rc = gpu_settle(w, &p->res, p->slots, st->jobs, st->n_jobs, rc, &err, &b->tel.gpu_tel);
        gpu_unbuild(p);
        gpu_done(w, b, t1);
    }
    if (resync != NULL) {
        gpu_drain(w);
        gpu_run_sync(w, resync, resync_t1);
    }
}

/* Batches the worker keeps on its device at once. */
static uint32_t gpu_window(const struct gworker *w)
{
    uint32_t n = w->gpu != NULL ? gpu_engine_max_inflight(w->gpu) : 1;
    return n < GPU_MAX_INFLIGHT ? n : GPU_MAX_INFLIGHT;
}

/* ---- the GPU workers -------------------------------------------------- */

/* The worker: keeps up to gpu_window batches on the device. It submits
 * the next batch while one runs (its upload overlaps the kernel), and
 * collects the oldest when the window is full or no batch is queued. */
void engine_gpu_main(void *arg)
{
    struct gworker *w = arg;
    struct engine *e = w->e;
    pthread_setname_np(pthread_self(), "vks-gpu");
    bool frames_cold = true; /* engine_gpu_warm_frames has not run */
    for (;;) {
        uint8_t forget[FORGET_MAX][CATALOG_FP_LEN];
        pthread_mutex_lock(&e->mu);
        uint64_t t0 = engine_now_ns();
        while (w->head == NULL && w->n_forget == 0 && !e->stop && w->n_pend == 0 &&
               engine_gpu_warm_for(e, w->index) == NULL && !frames_cold)
            pthread_cond_wait(&w->cond, &e->mu);
        w->waited_ns += engine_now_ns() - t0;
        uint32_t n_forget = w->n_forget;
        memcpy(forget, w->forget, (size_t)n_forget * CATALOG_FP_LEN);
        w->n_forget = 0;
        struct engine_batch *b = NULL;
        if (w->head != NULL && w->n_pend < gpu_window(w)) {
            b = w->head;
            w->head = b->next;
            if (w->head == NULL)
                w->tail = NULL;
        }
        /* Warm-ups only when idle: a batch goes first, and does the work
         * itself where it needs it. Catalogs before the frames (the first
         * scans' catalogs matter most), and before the forgets: a catalog
         * dropped meanwhile leaves the device again. */
        bool idle = b == NULL && w->n_pend == 0;
        struct engine_warm *warm = NULL;
        if (idle && (warm = engine_gpu_warm_for(e, w->index)) != NULL)
            warm->todo &= ~(1u << w->index);
        bool stopping = e->stop; /* then warm-ups are only handed back */
        pthread_mutex_unlock(&e->mu);
        if (warm != NULL && !stopping)
            engine_gpu_warm_catalog(w, warm->cat);
        if (warm != NULL)
            engine_gpu_warm_through(e, warm);
        for (uint32_t i = 0; i < n_forget && w->gpu != NULL; i++)
            gpu_engine_forget(w->gpu, forget[i]);
        if (n_forget != 0 && w->gpu != NULL) {
            uint32_t resident = gpu_engine_resident_catalogs(w->gpu);
            pthread_mutex_lock(&e->mu);
            w->resident = resident;
            pthread_mutex_unlock(&e->mu);
        }
        if (b != NULL) {
            b->tel.worker_wait_ns = w->waited_ns; /* how long it had nothing to take */
            w->waited_ns = 0;
            gpu_start(w, b);
        } else if (w->n_pend > 0) {
            gpu_finish_oldest(w);
        } else if (warm == NULL && frames_cold) {
            frames_cold = false;
            if (!stopping)
                engine_gpu_warm_frames(w);
        } else if (n_forget == 0 && warm == NULL) {
            break; /* stop, and nothing left */
        }
    }
    gpu_engine_destroy(w->gpu);
    w->gpu = NULL;
    gpu_result_finish(&w->res);
    for (uint32_t i = 0; i < GPU_MAX_INFLIGHT; i++)
        gpu_result_finish(&w->pend[i].res);
}
