/*
 * The GPU engines (engine.h): the setup thread opens one gpu_engine per
 * selected device, warms it with a self-test scan, and starts a worker
 * thread per engine; each worker runs its batches and hands jobs the device
 * cannot run (too big, too slow, device lost) to the CPU engine.
 */
#include "engine_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "log.h"
#include "rules.h"
#include "vkscan/errors.h"

/* ---- the GPU engines -------------------------------------------------- */

/* A buffer of the GPU batch: where its hits go. */
struct slot {
    uint32_t job; /* index into the jobs array */
    uint32_t buf;
};

static int open_gpu(struct engine *e, struct gworker *w, struct vks_error *err);

/* The engine failed a batch in a way that leaves it unusable: open it
 * again, exactly as at start (warm-up self-test included). No batch of it
 * may be pending. */
static void gpu_reopen(struct gworker *w)
{
    struct vks_error err = {0};
    if (w->gpu != NULL) {
        struct gpu_engine_stats gs;
        gpu_engine_stats(w->gpu, &gs);
        w->busy_base += gs.busy_ns;
    }
    gpu_engine_destroy(w->gpu);
    w->gpu = NULL;
    if (open_gpu(w->e, w, &err) != 0) {
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
 * "Descriptor buffers"): regular files go from the page cache straight
 * into staging, read by the upload threads; sealed memfds are mapped and
 * copied there, unless VKSCAND_FD_UPLOAD says otherwise. */
static void gpu_load(struct gworker *w, struct engine_batch *b)
{
    struct bstate *st = b->priv;
    int how = w->e->fd_upload;
    st->defer = w->gpu != NULL && (how == FD_AUTO || how == FD_PREAD);
    st->defer_sealed = how == FD_PREAD;
    st->populate = how == FD_POPULATE;
    engine_batch_load(w->e, b);
}

/*
 * Loads the batch queued next while the upload threads fill the begun
 * one: its descriptors are inspected and its memfds mapped (5 ms for five
 * 64 MiB memfds on the H200, during which the upload threads idled when
 * it ran between two uploads). Only this worker takes from its queue, so
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
    uint64_t t1 = engine_now_ns();
    if (!st->loaded)
        gpu_load(w, b);
    else /* loaded ahead (gpu_load_next): its wall leaves out the wait since */
        st->start_ns = t1 - b->tel.fd_read_ns;
    t1 = engine_now_ns();
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

/* ---- opening and warming ---------------------------------------------- */

/* The self-test's small fixed catalog (a literal, a regex, a hex string). */
static int selftest_catalog(struct rules_result *rr, struct vks_error *err)
{
    static const struct rule_src rules[] = {
        {.id = "warm-literal", .kind = RULE_LITERAL, .pattern = "vkscan", .len = 6},
        {.id = "warm-regex", .kind = RULE_REGEX, .pattern = "a[0-9]+b", .len = 8},
        {.id = "warm-hex", .kind = RULE_HEX, .pattern = "de ad ?? ef", .len = 11},
    };
    struct rules_options ro = {0};
    return rules_compile(rules, 3, &ro, rr, err);
}

/* Scans a small fixed catalog on the GPU in every report mode and checks the
 * hits against the CPU scanner: compiles the common pipelines and refuses a
 * device that gives wrong answers. */
static int warm_up(struct gworker *w, struct vks_error *err)
{
    static const uint8_t text[] = "-- vkscan a12b a3b \xde\xad\x00\xef vkscan\n";
    struct rules_result rr = {0};
    int rc = selftest_catalog(&rr, err);
    if (rc != 0)
        return rc;
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT && rc == 0; mode++) {
        const struct catalog *cats[1] = {rr.catalog};
        struct gpu_buffer gb = {
            .data = text, .len = sizeof(text) - 1, .mode = (enum scan_mode)mode, .catalog = 0};
        struct gpu_batch batch = {
            .catalogs = cats, .n_catalogs = 1, .buffers = &gb, .n_buffers = 1};
        struct vks_error derr = {0};
        struct scan_hits ref = {0};
        rc = gpu_batch_dispatch(w->gpu, &batch, &w->res, &derr);
        if (rc != 0) {
            vks_error_set(err, rc, "GPU self-test scan failed: %s", derr.msg);
            break;
        }
        rc = refscan_buffer(rr.catalog, text, sizeof(text) - 1, (enum scan_mode)mode, &ref);
        bool same = rc == 0 && ref.n == w->res.n_hits && ref.n > 0;
        for (size_t i = 0; same && i < ref.n; i++) {
            const struct gpu_hit *g = &w->res.hits[i];
            same = g->buffer == 0 && g->rule == ref.v[i].rule && g->end == ref.v[i].end &&
                   g->count == ref.v[i].count;
        }
        if (rc == 0 && !same)
            rc = vks_error_set(err, -EIO,
                               "GPU self-test (mode %d) found %zu hits, the CPU "
                               "scanner %zu: the device or driver scans wrongly",
                               mode, w->res.n_hits, ref.n);
        scan_hits_finish(&ref);
    }
    rules_result_finish(&rr);
    return rc;
}

static int pin_module(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size, (void)ctx;
    const char *name = info->dlpi_name;
    if (name != NULL && (strstr(name, "libvulkan_") != NULL || strstr(name, "VkLayer") != NULL ||
                         strstr(name, "nvidia") != NULL))
        dlopen(name, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    return 0;
}

/* Keeps the Vulkan driver modules loaded for the life of the process: the
 * loader would otherwise unload and reload them whenever an instance goes
 * (device listing, re-creating the engine after a device loss), and the
 * drivers keep per-load state that is lost, and reported as leaked, each
 * time. Loads nothing new (RTLD_NOLOAD). */
static void pin_vulkan_modules(void)
{
    dl_iterate_phdr(pin_module, NULL);
}

static int create_gpu(struct engine *e, struct gworker *w, uint32_t timeout_ms,
                      struct vks_error *err)
{
    struct gpu_options go = {.device = w->device,
                             .memory_budget = e->budget,
                             .pipeline_cache_path = w->cache_path[0] ? w->cache_path : NULL,
                             .timeout_ms = timeout_ms,
                             .inflight = e->inflight};
    /* for measurements (bench/h200_dataplane.sh): the upload threads, else
     * gpu/'s default (one per core, at most GPU_UPLOAD_THREADS_MAX) */
    const char *ut = getenv("VKSCAND_UPLOAD_THREADS");
    if (ut != NULL)
        go.upload_threads = (uint32_t)strtoul(ut, NULL, 10);
    int rc = gpu_engine_create(&go, &w->gpu, err);
    if (rc == 0)
        pin_vulkan_modules();
    return rc;
}

/* Opens the worker's device and warms it: the same steps at start and
 * after a device failure. The self-test runs under the default timeout (its
 * first dispatch may be slow); a shorter gpu-timeout-ms takes effect on the
 * engine opened again after it. Publishes what the loop thread shows. */
static int open_gpu(struct engine *e, struct gworker *w, struct vks_error *err)
{
    bool short_timeout = e->timeout_ms != 0 && e->timeout_ms < GPU_DEFAULT_TIMEOUT_MS;
    if (w->gpu != NULL && short_timeout) { /* opened by setup to list devices */
        gpu_engine_destroy(w->gpu);
        w->gpu = NULL;
    }
    int rc = w->gpu != NULL ? 0 : create_gpu(e, w, short_timeout ? 0 : e->timeout_ms, err);
    if (rc == 0)
        rc = warm_up(w, err);
    if (rc == 0 && short_timeout) {
        gpu_engine_destroy(w->gpu);
        w->gpu = NULL;
        rc = create_gpu(e, w, e->timeout_ms, err);
    }
    if (rc != 0) {
        gpu_engine_destroy(w->gpu);
        w->gpu = NULL;
        return rc;
    }
    const struct gpu_device_info *d = gpu_engine_device(w->gpu);
    uint64_t budget = e->budget;
    for (uint32_t i = 0; e->budget == 0 && i < d->n_heaps; i++) {
        /* gpu.h: a zero budget means 90% of the device-local heap's budget. */
        const struct gpu_heap_info *h = &d->heaps[i];
        if (h->device_local && h->budget / 10 * 9 > budget)
            budget = h->budget / 10 * 9;
    }
    pthread_mutex_lock(&e->mu);
    w->dev = *d;
    w->budget = budget;
    __atomic_store_n(&w->alive, true, __ATOMIC_RELAXED);
    w->resident = gpu_engine_resident_catalogs(w->gpu);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* ---- warming up ------------------------------------------------------- */

/* Catalog warm-ups scan this many zero bytes; a catalog with factor
 * groups, GPU_FACTOR_PASS_MIN, so that the factor pass's pipeline is
 * created too. */
#define WARM_CATALOG_BYTES 4096u

static bool has_factor_groups(const struct catalog *cat)
{
    for (uint32_t i = 0; i < catalog_group_count(cat); i++) {
        struct catalog_group g;
        catalog_group(cat, i, &g);
        if (g.flags & CAT_GF_FACTOR)
            return true;
    }
    return false;
}

/* Scans `n` buffers of `len` zero bytes (one mapping of the zero page: no
 * memory) against `cat`, each as a batch of its own, all in flight at once
 * (each in a frame of its own: that frame's buffers are made and touched).
 * Returns 0 or the first error; after a timeout or a lost device the
 * engine is re-created before the next batch (w->reopen). */
static int warm_scan(struct gworker *w, const struct catalog *cat, uint64_t len, uint32_t n,
                     struct gpu_telemetry *tel, struct vks_error *err)
{
    const struct catalog *cats[1] = {cat};
    void *zeros = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (zeros == MAP_FAILED)
        return vks_error_set(err, -ENOMEM, "cannot map %llu zero bytes", (unsigned long long)len);
    struct gpu_buffer gb = {.data = zeros, .len = len, .mode = SCAN_COUNT, .catalog = 0};
    struct gpu_batch batch = {.catalogs = cats, .n_catalogs = 1, .buffers = &gb, .n_buffers = 1};
    struct gpu_result res[GPU_MAX_INFLIGHT] = {0};
    int rc = 0;
    uint32_t sent = 0;
    while (sent < n && rc == 0 && (rc = gpu_batch_submit(w->gpu, &batch, &res[sent], err)) == 0)
        sent++;
    for (uint32_t i = 0; i < sent; i++) {
        struct gpu_result *r;
        struct vks_error cerr = {0};
        int c = gpu_batch_collect(w->gpu, &r, &cerr);
        if (c != 0 && rc == 0) {
            rc = c;
            *err = cerr;
        }
        if (c == 0)
            *tel = r->tel;
    }
    for (uint32_t i = 0; i < n; i++)
        gpu_result_finish(&res[i]);
    munmap(zeros, len);
    if (rc == -ETIMEDOUT || rc == -ENODEV || rc == -EIO)
        w->reopen = true;
    return rc;
}

/* Publishes the device's resident catalogs and memory after a warm-up. */
static void warm_publish(struct gworker *w, const struct gpu_telemetry *t)
{
    pthread_mutex_lock(&w->e->mu);
    w->resident = gpu_engine_resident_catalogs(w->gpu);
    if (t->resident_bytes != 0)
        w->device_used = t->resident_bytes;
    pthread_mutex_unlock(&w->e->mu);
}

/*
 * Scans warm-bytes of zeros in every frame (inflight-batches), so that the
 * batch buffers the first scans of up to that size need are allocated and
 * touched, and not made then (docs/daemon.md "Warm restart"). Once, when
 * the worker is first idle. Not on a CPU device (lavapipe), where the
 * engine is for tests: there it would only burn the cores they run on.
 */
static void warm_frames(struct gworker *w)
{
    uint64_t len = w->e->warm_bytes;
    if (len == 0 || w->gpu == NULL || w->reopen ||
        gpu_engine_device(w->gpu)->type == GPU_DEVICE_CPU)
        return;
    struct rules_result rr = {0};
    struct vks_error err = {0};
    struct gpu_telemetry tel = {0};
    uint64_t t0 = engine_now_ns();
    int rc = selftest_catalog(&rr, &err);
    uint32_t frames = gpu_engine_max_inflight(w->gpu);
    if (rc == 0)
        rc = warm_scan(w, rr.catalog, len, frames, &tel, &err);
    rules_result_finish(&rr);
    if (rc == 0)
        warm_publish(w, &tel);
    if (rc != 0)
        log_warn("GPU engine %u: setting up batch buffers for %llu bytes failed (%s): the first "
                 "scans do it",
                 w->index, (unsigned long long)len, err.msg);
    else
        log_info("GPU engine %u: batch buffers for %llu bytes x %u batches in flight set up in "
                 "%.1f ms",
                 w->index, (unsigned long long)len, frames, (double)(engine_now_ns() - t0) / 1e6);
}

/* Runs one engine_warm request on the worker's device (none in flight),
 * unless it has none. */
static void warm_catalog(struct gworker *w, const struct catalog *cat)
{
    if (w->gpu == NULL || w->reopen)
        return;
    bool cpu = gpu_engine_device(w->gpu)->type == GPU_DEVICE_CPU;
    uint64_t len = WARM_CATALOG_BYTES;
    if (!cpu && has_factor_groups(cat) && w->e->warm_bytes >= GPU_FACTOR_PASS_MIN)
        len = GPU_FACTOR_PASS_MIN;
    struct vks_error err = {0};
    struct gpu_telemetry tel = {0};
    uint64_t t0 = engine_now_ns();
    int rc = warm_scan(w, cat, len, 1, &tel, &err);
    char hex[2 * CATALOG_FP_LEN + 1];
    catalog_fingerprint_hex(catalog_fingerprint(cat), hex);
    if (rc != 0) {
        log_warn("GPU engine %u: warming catalog %.16s up failed (%s): its first scan sets it up",
                 w->index, hex, err.msg);
        return;
    }
    warm_publish(w, &tel);
    log_info("GPU engine %u: catalog %.16s resident, its pipelines created, in %.1f ms", w->index,
             hex, (double)(engine_now_ns() - t0) / 1e6);
}

/* The first warm-up GPU engine `i` has not taken, or NULL. mu held. */
static struct engine_warm *warm_for(const struct engine *e, uint32_t i)
{
    for (struct engine_warm *r = e->warm_head; r != NULL; r = r->next) {
        if (r->todo & (1u << i))
            return r;
    }
    return NULL;
}

/* The worker is through with `r`: the last one hands it to the loop. */
static void warm_through(struct engine *e, struct engine_warm *r)
{
    pthread_mutex_lock(&e->mu);
    bool last = --r->left == 0;
    if (last) {
        struct engine_warm **p = &e->warm_head;
        while (*p != r)
            p = &(*p)->next;
        *p = r->next;
        r->next = e->warm_done;
        e->warm_done = r;
    }
    pthread_mutex_unlock(&e->mu);
    if (last)
        uv_async_send(&e->async);
}

/* ---- the GPU workers -------------------------------------------------- */

/* The worker: keeps up to gpu_window batches on the device. It submits
 * the next batch while one runs (its upload overlaps the kernel), and
 * collects the oldest when the window is full or no batch is queued. */
static void gpu_main(void *arg)
{
    struct gworker *w = arg;
    struct engine *e = w->e;
    pthread_setname_np(pthread_self(), "vks-gpu");
    bool frames_cold = true; /* warm_frames has not run */
    for (;;) {
        uint8_t forget[FORGET_MAX][CATALOG_FP_LEN];
        pthread_mutex_lock(&e->mu);
        uint64_t t0 = engine_now_ns();
        while (w->head == NULL && w->n_forget == 0 && !e->stop && w->n_pend == 0 &&
               warm_for(e, w->index) == NULL && !frames_cold)
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
        if (idle && (warm = warm_for(e, w->index)) != NULL)
            warm->todo &= ~(1u << w->index);
        bool stopping = e->stop; /* then warm-ups are only handed back */
        pthread_mutex_unlock(&e->mu);
        if (warm != NULL && !stopping)
            warm_catalog(w, warm->cat);
        if (warm != NULL)
            warm_through(e, warm);
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
                warm_frames(w);
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

/* Parses `devices`: "all" or "N[,N...]" (duplicates allowed: two engines
 * on one device). Returns the count, or -EINVAL with `err` set. */
int engine_devices_parse(const char *s, uint32_t *idx, uint32_t cap, bool *all,
                         struct vks_error *err)
{
    *all = strcmp(s, "all") == 0;
    if (*all)
        return 0;
    uint32_t n = 0;
    const char *p = s;
    while (*p != '\0') {
        char *end;
        if (*p < '0' || *p > '9')
            return vks_error_set(err, -EINVAL,
                                 "devices '%s': '%s' is not a device index: use all or "
                                 "indexes such as 0,1 (vkscan status lists them)",
                                 s, p);
        unsigned long v = strtoul(p, &end, 10);
        if (v >= MAX_DEVICES || n == cap)
            return vks_error_set(err, -EINVAL,
                                 "devices '%s': at most %u engines on device indexes below %u", s,
                                 cap, MAX_DEVICES);
        idx[n++] = (uint32_t)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return vks_error_set(err, -EINVAL,
                                 "devices '%s': indexes are separated by commas, e.g. 0,1", s);
    }
    if (n == 0)
        return vks_error_set(err, -EINVAL, "devices is empty: use all or indexes such as 0,1");
    return (int)n;
}

/* Lists the devices through `gpu`'s instance when one opened, else with
 * an instance of its own. */
static void list_devices(struct engine *e, const struct gpu_engine *gpu)
{
    struct vks_error lerr = {0};
    uint32_t n = 0;
    int rc = gpu != NULL ? gpu_engine_list_devices(gpu, e->devices_found, MAX_DEVICES, &n, &lerr)
                         : gpu_device_list(e->devices_found, MAX_DEVICES, &n, &lerr);
    if (rc == 0)
        e->n_devices_found = n < MAX_DEVICES ? n : MAX_DEVICES;
}

static void worker_init(struct engine *e, struct gworker *w, uint32_t index, const char *device)
{
    w->e = e;
    w->index = index;
    snprintf(w->device, sizeof(w->device), "%s", device);
    if (e->state_dir[0] != '\0' && index == 0)
        snprintf(w->cache_path, sizeof(w->cache_path), "%s/pipeline.cache", e->state_dir);
    else if (e->state_dir[0] != '\0') /* one file per engine: each saves its own at exit */
        snprintf(w->cache_path, sizeof(w->cache_path), "%s/pipeline-%u.cache", e->state_dir, index);
}

/*
 * The setup thread: opens the GPU engines `devices` (or `device`) names,
 * warms each, starts a worker thread per engine, reports readiness.
 * `--engine auto` with neither set takes the best device, and scans on the
 * CPU engine when that is a CPU (lavapipe) or when none opens.
 */
static int setup_gpus(struct engine *e, struct vks_error *err)
{
    uint32_t idx[MAX_GPU_ENGINES];
    bool all = false;
    int n = 1;
    if (e->devices[0] != '\0') {
        n = engine_devices_parse(e->devices, idx, MAX_GPU_ENGINES, &all, err);
        if (n < 0)
            return n;
    }
    struct gworker *w0 = &e->gw[0];
    if (e->devices[0] == '\0') {
        worker_init(e, w0, 0, e->device);
    } else {
        char first[16];
        snprintf(first, sizeof(first), "%u", all ? 0u : idx[0]);
        worker_init(e, w0, 0, first);
    }
    /* The first engine loads the driver (kept loaded: pin_vulkan_modules);
     * its instance lists the devices. */
    uint64_t t0 = engine_now_ns();
    int rc = create_gpu(e, w0, e->timeout_ms, err);
    uint64_t t1 = engine_now_ns();
    list_devices(e, w0->gpu);
    e->t_open = t1 - t0;
    e->t_list = engine_now_ns() - t1;
    if (rc != 0)
        return rc;
    bool chosen = e->device[0] != '\0' || (e->devices[0] != '\0' && !all);
    if (e->want == CONFIG_ENGINE_AUTO && !chosen &&
        gpu_engine_device(w0->gpu)->type == GPU_DEVICE_CPU) {
        log_notice("engine: the best Vulkan device, %s, is a CPU: scanning on the CPU engine "
                   "(--engine gpu uses it)",
                   gpu_engine_device(w0->gpu)->name);
        gpu_engine_destroy(w0->gpu);
        w0->gpu = NULL;
        return 0;
    }
    if (all) {
        n = 0;
        for (uint32_t i = 0; i < e->n_devices_found && n < (int)MAX_GPU_ENGINES; i++) {
            if (e->want == CONFIG_ENGINE_AUTO && e->devices_found[i].type == GPU_DEVICE_CPU)
                continue;
            idx[n++] = e->devices_found[i].index;
        }
        if (n == 0 || idx[0] != 0) {
            /* engine 0 was opened on device 0 to list them: it is not wanted */
            gpu_engine_destroy(w0->gpu);
            w0->gpu = NULL;
            if (n == 0) {
                log_notice("engine: devices all: no GPU, scanning on the CPU engine");
                return 0;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        struct gworker *w = &e->gw[i];
        if (e->devices[0] != '\0') {
            char d[16];
            snprintf(d, sizeof(d), "%u", idx[i]);
            if (i > 0 || w->gpu == NULL)
                worker_init(e, w, (uint32_t)i, d);
        }
        t0 = engine_now_ns();
        rc = open_gpu(e, w, err);
        e->t_selftest += engine_now_ns() - t0;
        if (rc != 0) {
            char msg[sizeof(err->msg)];
            snprintf(msg, sizeof(msg), "%s", err->msg);
            vks_error_set(err, rc, "GPU engine %d (device %s): %s", i, w->device, msg);
            return rc;
        }
        pthread_cond_init(&w->cond, NULL);
        rc = uv_thread_create(&w->thread, gpu_main, w);
        if (rc != 0) {
            pthread_cond_destroy(&w->cond);
            gpu_engine_destroy(w->gpu);
            w->gpu = NULL;
            return vks_error_set(err, rc, "cannot start GPU engine thread %d: %s", i,
                                 uv_strerror(rc));
        }
        pthread_mutex_lock(&e->mu);
        w->started = true;
        e->n_gpu = (uint32_t)i + 1;
        pthread_mutex_unlock(&e->mu);
        log_notice("engine %d: GPU %s (%s), pipelines warm", i, w->dev.name, w->dev.driver);
    }
    return 0;
}

/* No GPU engine under --engine auto: the core left for its thread scans on
 * the CPU engine too (engine_internal.h, cpu_spare). */
static void add_spare_cpu_thread(struct engine *e)
{
    if (!e->cpu_spare)
        return;
    int rc = uv_thread_create(&e->cpu[e->n_cpu_started], engine_cpu_main, e);
    if (rc != 0) {
        log_warn("engine: cannot start a CPU engine thread on the GPU engine's core: %s",
                 uv_strerror(rc));
        return;
    }
    pthread_mutex_lock(&e->mu);
    e->n_cpu_started++;
    __atomic_store_n(&e->n_cpu, e->n_cpu + 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&e->mu);
}

void engine_gpu_setup(void *arg)
{
    struct engine *e = arg;
    int rc = 0;
    struct vks_error err = {0};
    if (e->want == CONFIG_ENGINE_CPU)
        log_notice("engine: CPU engine, %u threads (--engine cpu)", e->n_cpu);
    else
        rc = setup_gpus(e, &err);
    pthread_mutex_lock(&e->mu);
    uint32_t n_gpu = e->n_gpu;
    pthread_mutex_unlock(&e->mu);
    if (rc != 0 && e->want == CONFIG_ENGINE_GPU) {
        e->open_status = rc;
        vks_error_set(&e->open_err, rc,
                      "the GPU engine did not start: %s (use --engine auto "
                      "to fall back to the CPU engine)",
                      err.msg);
    } else if (rc != 0) {
        log_warn("engine: %s: scanning with %u GPU engines and the CPU engine", err.msg, n_gpu);
    } else if (e->want == CONFIG_ENGINE_GPU && n_gpu == 0) {
        e->open_status = -ENODEV;
        vks_error_set(&e->open_err, -ENODEV, "the GPU engine did not start: no device");
    }
    if (n_gpu == 0 && e->want != CONFIG_ENGINE_CPU && e->open_status == 0) {
        add_spare_cpu_thread(e);
        log_notice("engine: CPU engine, %u threads", e->n_cpu);
    }
    pthread_mutex_lock(&e->mu);
    e->open_done = true;
    pthread_mutex_unlock(&e->mu);
    uv_async_send(&e->async);
}
