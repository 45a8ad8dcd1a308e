/*
 * The engine worker (engine.h): one thread owns the GPU engine (or runs the
 * CPU scanner), takes batches from a mutex-protected queue and hands them
 * back through a uv_async_t.
 */
#include "engine.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "rules.h"
#include "vkscan/errors.h"

#define MAX_DEVICES 16u

/* Dropped catalogs queued for the worker; past this, LRU eviction frees
 * the rest in time. */
#define FORGET_MAX 64

struct engine {
    uv_loop_t *loop;
    uv_async_t async;
    uv_thread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    struct engine_batch *queue_head, *queue_tail; /* loop -> worker */
    struct engine_batch *done_head, *done_tail;   /* worker -> loop */
    bool stop;
    uint8_t forget[FORGET_MAX][CATALOG_FP_LEN]; /* loop -> worker: dropped catalogs */
    uint32_t n_forget;
    uint32_t pending; /* loop thread: submitted, not handed back */
    uint64_t batches; /* worker: batches run */

    /* Set by the worker before it reports readiness; read-only afterwards. */
    enum config_engine want;
    uint64_t cpu_max_work; /* engine auto: small batches go to the CPU scanner */
    char device[sizeof(((struct daemon_config *)0)->device)];
    char cache_path[CONFIG_PATH_MAX + 32];
    uint64_t budget;
    struct gpu_engine *gpu;
    struct engine_info info;
    struct gpu_device_info devices[MAX_DEVICES];
    int open_status;
    struct vks_error open_err;
    bool open_done, open_reported;

    engine_ready_cb ready_cb;
    engine_done_cb done_cb;
    void *ctx;
    struct gpu_result res; /* worker: reused between batches */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- fd buffers ------------------------------------------------------- */

/* Memory a fd buffer was read into: a mapping or a heap copy. */
struct loaded {
    void *map;
    size_t map_len;
    void *heap;
};

static int bad_fd(struct engine_buf *b, const char *fmt, const char *what)
{
    b->status = -VKS_E_BAD_FD;
    snprintf(b->msg, sizeof(b->msg), fmt, what);
    return b->status;
}

static int load_fd(struct engine_buf *b, struct loaded *ld)
{
    struct stat sb;
    if (fstat(b->fd, &sb) != 0)
        return bad_fd(b, "the descriptor cannot be inspected (%s): pass an open file",
                      strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return bad_fd(b, "the descriptor is %s, not a regular file or memfd: pass a file",
                      S_ISFIFO(sb.st_mode)   ? "a pipe"
                      : S_ISSOCK(sb.st_mode) ? "a socket"
                                             : "special");
    uint64_t size = (uint64_t)sb.st_size;
    uint64_t len = b->has_length ? b->length : (b->offset <= size ? size - b->offset : 0);
    if (b->offset > size || len > size - b->offset)
        return bad_fd(b, "the range is outside the file (%s): check offset and length",
                      "it shrank or the request is wrong");
    b->bytes = len;
    if (len == 0) {
        b->data = (const uint8_t *)"";
        b->len = 0;
        return 0;
    }
    int seals = fcntl(b->fd, F_GET_SEALS);
    if (seals > 0 && (seals & F_SEAL_SHRINK)) {
        long page = sysconf(_SC_PAGESIZE);
        uint64_t base = b->offset - b->offset % (uint64_t)page;
        size_t map_len = (size_t)(len + (b->offset - base));
        void *p = mmap(NULL, map_len, PROT_READ, MAP_SHARED, b->fd, (off_t)base);
        if (p != MAP_FAILED) {
            ld->map = p;
            ld->map_len = map_len;
            b->data = (const uint8_t *)p + (b->offset - base);
            b->len = len;
            return 0;
        }
    }
    uint8_t *buf = malloc((size_t)len);
    if (buf == NULL)
        return bad_fd(b, "no memory for the file's %s bytes: send a smaller range", "");
    uint64_t got = 0;
    while (got < len) {
        ssize_t n = pread(b->fd, buf + got, (size_t)(len - got), (off_t)(b->offset + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            free(buf);
            return bad_fd(b, "the descriptor cannot be read (%s): open it for reading",
                          n < 0 ? strerror(errno) : "it shrank while being read");
        }
        got += (uint64_t)n;
    }
    ld->heap = buf;
    b->data = buf;
    b->len = len;
    return 0;
}

static void unload(struct loaded *ld)
{
    if (ld->map != NULL)
        munmap(ld->map, ld->map_len);
    free(ld->heap);
}

/* ---- running a batch -------------------------------------------------- */

static int push_hit(struct engine_job *j, size_t *cap, uint32_t buffer, uint32_t rule,
                    uint32_t count, uint64_t end)
{
    if (j->n_hits == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        struct engine_hit *v = realloc(j->hits, nc * sizeof(*v));
        if (v == NULL)
            return -ENOMEM;
        j->hits = v;
        *cap = nc;
    }
    j->hits[j->n_hits++] = (struct engine_hit){buffer, rule, count, end};
    return 0;
}

static void job_fail(struct engine_job *j, int code, const char *msg)
{
    free(j->hits);
    j->hits = NULL;
    j->n_hits = 0;
    j->status = code;
    vks_error_set(&j->err, code, "%s", msg);
}

static void run_cpu(struct engine_job *j)
{
    struct scan_hits h = {0};
    size_t cap = 0;
    for (uint32_t i = 0; i < j->n_bufs && j->status == 0; i++) {
        struct engine_buf *b = &j->bufs[i];
        if (b->status != 0)
            continue;
        h.n = 0;
        if (refscan_buffer(j->cat, b->data, (size_t)b->len, j->mode, &h) != 0) {
            job_fail(j, -VKS_E_INTERNAL,
                     "out of memory collecting hits: lower max_hits or "
                     "scan smaller buffers");
            break;
        }
        for (size_t k = 0; k < h.n; k++) {
            if (push_hit(j, &cap, i, h.v[k].rule, h.v[k].count, h.v[k].end) != 0) {
                job_fail(j, -VKS_E_INTERNAL, "out of memory collecting hits");
                break;
            }
        }
    }
    scan_hits_finish(&h);
}

/* A buffer of the GPU batch: where its hits go. */
struct slot {
    uint32_t job; /* index into the jobs array */
    uint32_t buf;
};

static void gpu_reopen(struct engine *e)
{
    struct gpu_options go = {
        .device = e->device, .memory_budget = e->budget, .pipeline_cache_path = e->cache_path};
    struct vks_error err;
    gpu_engine_destroy(e->gpu);
    e->gpu = NULL;
    if (gpu_engine_create(&go, &e->gpu, &err) != 0) {
        log_err("GPU engine could not be re-created after a device failure (%s): scanning on "
                "the CPU from now on; restart vkscand to use the GPU again",
                err.msg);
        e->gpu = NULL;
        e->info.gpu = false;
    }
}

/* Dispatches the jobs j[0..n) as one GPU batch. Returns 0, or -E2BIG when
 * the batch does not fit the device (nothing ran). */
static int run_gpu(struct engine *e, struct engine_job **jobs, size_t n, struct gpu_telemetry *tel)
{
    size_t nb = 0;
    for (size_t i = 0; i < n; i++)
        nb += jobs[i]->n_bufs;
    struct gpu_buffer *gb = calloc(nb ? nb : 1, sizeof(*gb));
    struct slot *slots = calloc(nb ? nb : 1, sizeof(*slots));
    const struct catalog *cats[GPU_MAX_BATCH_CATALOGS];
    uint32_t n_cats = 0, k = 0;
    int rc = 0;
    if (gb == NULL || slots == NULL) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        struct engine_job *j = jobs[i];
        uint32_t c = 0;
        while (c < n_cats && cats[c] != j->cat)
            c++;
        if (c == n_cats) {
            if (n_cats == GPU_MAX_BATCH_CATALOGS) {
                rc = -E2BIG;
                goto out;
            }
            cats[n_cats++] = j->cat;
        }
        for (uint32_t b = 0; b < j->n_bufs; b++) {
            if (j->bufs[b].status != 0)
                continue;
            gb[k] = (struct gpu_buffer){.data = j->bufs[b].data,
                                        .len = (size_t)j->bufs[b].len,
                                        .id = k,
                                        .mode = j->mode,
                                        .catalog = c};
            slots[k++] = (struct slot){(uint32_t)i, b};
        }
    }
    struct gpu_batch batch = {
        .catalogs = cats, .n_catalogs = n_cats, .buffers = gb, .n_buffers = k};
    struct vks_error err;
    rc = gpu_batch_dispatch(e->gpu, &batch, &e->res, &err);
    if (rc == -E2BIG && n > 1)
        goto out;
    if (rc != 0) {
        char msg[300];
        snprintf(msg, sizeof(msg), "the GPU failed the scan: %.250s", err.msg);
        for (size_t i = 0; i < n; i++)
            job_fail(jobs[i], -VKS_E_DEVICE, msg);
        if (rc == -ETIMEDOUT || rc == -ENODEV || rc == -EIO) {
            log_err("GPU batch failed (%s): re-creating the engine", err.msg);
            gpu_reopen(e);
        }
        rc = 0;
        goto out;
    }
    *tel = e->res.tel;
    size_t *caps = calloc(n, sizeof(*caps));
    for (size_t h = 0; h < e->res.n_hits; h++) {
        const struct gpu_hit *g = &e->res.hits[h];
        const struct slot *s = &slots[g->buffer];
        struct engine_job *j = jobs[s->job];
        if (j->status != 0)
            continue;
        if (caps == NULL || push_hit(j, &caps[s->job], s->buf, g->rule, g->count, g->end) != 0)
            job_fail(j, -VKS_E_INTERNAL, "out of memory collecting hits");
    }
    free(caps);
out:
    free(gb);
    free(slots);
    return rc;
}

/* Runs jobs[0..n) on the GPU, splitting the batch in halves while it does
 * not fit the device; a single job that does not fit fails alone. */
static void run_gpu_split(struct engine *e, struct engine_job **jobs, size_t n,
                          struct engine_telemetry *tel)
{
    struct gpu_telemetry t = {0};
    int rc = run_gpu(e, jobs, n, &t);
    if (rc == -E2BIG) {
        run_gpu_split(e, jobs, n / 2, tel);
        run_gpu_split(e, jobs + n / 2, n - n / 2, tel);
        return;
    }
    if (rc != 0) {
        for (size_t i = 0; i < n; i++)
            job_fail(jobs[i], -VKS_E_INTERNAL, "out of memory building the GPU batch");
        return;
    }
    /* Sum the counters of the parts; the last part's choices (sizes, writer) stay. */
    struct gpu_telemetry *s = &tel->gpu_tel;
    uint64_t up = s->bytes_uploaded, cat = s->catalog_bytes_uploaded,
             hay = s->haystack_bytes_uploaded, rb = s->bytes_read_back, kn = s->kernel_ns,
             tn = s->total_ns;
    uint32_t hits = s->catalog_cache_hits, launches = s->kernel_launches;
    *s = t;
    s->bytes_uploaded += up;
    s->catalog_bytes_uploaded += cat;
    s->haystack_bytes_uploaded += hay;
    s->bytes_read_back += rb;
    s->kernel_ns += kn;
    s->total_ns += tn;
    s->catalog_cache_hits += hits;
    s->kernel_launches += launches;
}

/*
 * The CPU scanner's share of a batch: buffer bytes times DFA groups (each
 * group is one walk over the bytes). A GPU launch costs a fixed few hundred
 * microseconds (0.6 ms measured on the H200), more than the CPU needs for a
 * few KiB against a few groups, so in `--engine auto` a batch at most
 * cpu-max-work runs on the CPU.
 */
static uint64_t batch_work(struct engine_job **jobs, size_t n)
{
    uint64_t work = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = 0;
        for (uint32_t b = 0; b < jobs[i]->n_bufs; b++)
            bytes += jobs[i]->bufs[b].status == 0 ? jobs[i]->bufs[b].bytes : 0;
        work += bytes * catalog_group_count(jobs[i]->cat);
    }
    return work;
}

static void run_batch(struct engine *e, struct engine_batch *batch)
{
    struct engine_telemetry *tel = &batch->tel;
    memset(tel, 0, sizeof(*tel));
    size_t n_jobs = 0, n_loaded = 0, n_fd = 0;
    for (struct engine_job *j = batch->jobs; j != NULL; j = j->next) {
        n_jobs++;
        for (uint32_t i = 0; i < j->n_bufs; i++)
            n_fd += j->bufs[i].fd >= 0;
    }
    struct engine_job **jobs = calloc(n_jobs ? n_jobs : 1, sizeof(*jobs));
    struct loaded *ld = calloc(n_fd ? n_fd : 1, sizeof(*ld));
    uint64_t t0 = now_ns();
    size_t k = 0;
    for (struct engine_job *j = batch->jobs; j != NULL; j = j->next) {
        j->status = 0;
        if (jobs == NULL || ld == NULL) {
            job_fail(j, -VKS_E_INTERNAL, "out of memory starting the scan");
            continue;
        }
        jobs[k++] = j;
        for (uint32_t i = 0; i < j->n_bufs; i++) {
            struct engine_buf *b = &j->bufs[i];
            tel->buffers++;
            if (b->status != 0)
                continue; /* refused when queued (bad descriptor) */
            if (b->fd >= 0)
                load_fd(b, &ld[n_loaded++]);
            else
                b->bytes = b->len;
            tel->bytes += b->status == 0 ? b->bytes : 0;
        }
    }
    uint64_t t1 = now_ns();
    tel->fd_read_ns = t1 - t0;
    tel->jobs = (uint32_t)k;
    tel->gpu = e->gpu != NULL && batch_work(jobs, k) > e->cpu_max_work;
    if (tel->gpu && k > 0) {
        run_gpu_split(e, jobs, k, tel);
    } else {
        for (size_t i = 0; i < k; i++)
            run_cpu(jobs[i]);
    }
    tel->scan_ns = now_ns() - t1;
    /* Unmapping 64 MiB takes milliseconds (page tables, TLB): the loop
     * thread hands that to the thread pool instead of the engine paying it
     * between batches (release_loaded). */
    batch->loaded = n_loaded ? ld : NULL;
    batch->n_loaded = n_loaded;
    if (n_loaded == 0)
        free(ld);
    free(jobs);
}

struct release_work {
    uv_work_t req;
    struct loaded *ld;
    size_t n;
};

static void release_run(uv_work_t *req)
{
    struct release_work *w = req->data;
    for (size_t i = 0; i < w->n; i++)
        unload(&w->ld[i]);
    free(w->ld);
}

static void release_done(uv_work_t *req, int status)
{
    (void)status;
    free(req->data);
}

/* Loop thread: releases a finished batch's descriptor buffers on the libuv
 * thread pool (inline when that cannot be arranged). */
static void release_loaded(struct engine *e, struct engine_batch *b)
{
    struct release_work *w = b->loaded != NULL ? malloc(sizeof(*w)) : NULL;
    if (w != NULL) {
        *w = (struct release_work){.ld = b->loaded, .n = b->n_loaded};
        w->req.data = w;
        if (uv_queue_work(e->loop, &w->req, release_run, release_done) == 0) {
            b->loaded = NULL;
            return;
        }
        free(w);
    }
    if (b->loaded != NULL) {
        struct release_work inline_work = {.ld = b->loaded, .n = b->n_loaded};
        inline_work.req.data = &inline_work;
        release_run(&inline_work.req);
        b->loaded = NULL;
    }
}

void engine_job_finish(struct engine_job *job)
{
    free(job->hits);
    job->hits = NULL;
    job->n_hits = 0;
}

/* ---- opening and warming ---------------------------------------------- */

static bool same_hits(const struct engine_job *a, const struct engine_job *b)
{
    for (size_t i = 0; i < a->n_hits; i++) {
        const struct engine_hit *x = &a->hits[i], *y = &b->hits[i];
        if (x->buffer != y->buffer || x->rule != y->rule || x->count != y->count ||
            x->end != y->end)
            return false;
    }
    return true;
}

/* Scans a small fixed catalog on the GPU in every report mode and checks the
 * hits against the CPU scanner: compiles the common pipelines and refuses a
 * device that gives wrong answers. */
static int warm_up(struct engine *e, struct vks_error *err)
{
    static const struct rule_src rules[] = {
        {.id = "warm-literal", .kind = RULE_LITERAL, .pattern = "vkscan", .len = 6},
        {.id = "warm-regex", .kind = RULE_REGEX, .pattern = "a[0-9]+b", .len = 8},
        {.id = "warm-hex", .kind = RULE_HEX, .pattern = "de ad ?? ef", .len = 11},
    };
    static const uint8_t text[] = "-- vkscan a12b a3b \xde\xad\x00\xef vkscan\n";
    struct rules_result rr = {0};
    struct rules_options ro = {0};
    int rc = rules_compile(rules, 3, &ro, &rr, err);
    if (rc != 0)
        return rc;
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT && rc == 0; mode++) {
        struct engine_buf b = {.data = text, .len = sizeof(text) - 1, .fd = -1};
        struct engine_job j = {
            .cat = rr.catalog, .mode = (enum scan_mode)mode, .bufs = &b, .n_bufs = 1};
        struct engine_job c = j;
        struct engine_job *jp = &j;
        struct engine_telemetry tel = {0};
        run_gpu_split(e, &jp, 1, &tel);
        run_cpu(&c);
        if (j.status != 0)
            rc = vks_error_set(err, j.status, "GPU self-test scan failed: %s", j.err.msg);
        else if (j.n_hits != c.n_hits || j.n_hits == 0 || !same_hits(&j, &c))
            rc = vks_error_set(err, -EIO,
                               "GPU self-test (mode %d) found %zu hits, the CPU "
                               "scanner %zu: the device or driver scans wrongly",
                               mode, j.n_hits, c.n_hits);
        engine_job_finish(&j);
        engine_job_finish(&c);
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

static int open_gpu(struct engine *e, struct vks_error *err)
{
    struct gpu_options go = {.device = e->device,
                             .memory_budget = e->budget,
                             .pipeline_cache_path = e->cache_path[0] ? e->cache_path : NULL};
    int rc = gpu_engine_create(&go, &e->gpu, err);
    if (rc != 0)
        return rc;
    pin_vulkan_modules();
    e->info.gpu = true;
    e->info.device = *gpu_engine_device(e->gpu);
    e->info.device_memory_budget = e->budget;
    for (uint32_t i = 0; e->budget == 0 && i < e->info.device.n_heaps; i++) {
        /* gpu.h: a zero budget means 90% of the device-local heap's budget. */
        const struct gpu_heap_info *h = &e->info.device.heaps[i];
        if (h->device_local && h->budget / 10 * 9 > e->info.device_memory_budget)
            e->info.device_memory_budget = h->budget / 10 * 9;
    }
    rc = warm_up(e, err);
    if (rc != 0) {
        gpu_engine_destroy(e->gpu);
        e->gpu = NULL;
        e->info.gpu = false;
    }
    return rc;
}

/* Lists the devices for hello; after the engine is open, so the driver is
 * not loaded and unloaded once more just for the list. */
static void list_devices(struct engine *e)
{
    struct vks_error lerr = {0};
    uint32_t n = 0;
    if (gpu_device_list(e->devices, MAX_DEVICES, &n, &lerr) == 0) {
        e->info.devices = e->devices;
        e->info.n_devices = n < MAX_DEVICES ? n : MAX_DEVICES;
    }
}

static void open_backend(struct engine *e)
{
    if (e->want == CONFIG_ENGINE_CPU) {
        log_notice("engine: CPU reference scanner (--engine cpu)");
        return;
    }
    struct vks_error err = {0};
    int rc = open_gpu(e, &err);
    list_devices(e);
    if (rc == 0) {
        log_notice("engine: GPU %s (%s), pipelines warm", e->info.device.name,
                   e->info.device.driver);
        return;
    }
    if (e->want == CONFIG_ENGINE_GPU) {
        e->open_status = rc;
        vks_error_set(&e->open_err, rc,
                      "the GPU engine did not start: %s (use --engine auto "
                      "to fall back to the CPU scanner)",
                      err.msg);
        return;
    }
    log_warn("engine: no usable GPU (%s): scanning with the CPU reference scanner", err.msg);
}

/* ---- the worker ------------------------------------------------------- */

static void worker_main(void *arg)
{
    struct engine *e = arg;
    open_backend(e);
    pthread_mutex_lock(&e->mu);
    e->open_done = true;
    pthread_mutex_unlock(&e->mu);
    uv_async_send(&e->async);
    for (;;) {
        uint8_t forget[FORGET_MAX][CATALOG_FP_LEN];
        pthread_mutex_lock(&e->mu);
        while (e->queue_head == NULL && e->n_forget == 0 && !e->stop)
            pthread_cond_wait(&e->cond, &e->mu);
        uint32_t n_forget = e->n_forget;
        memcpy(forget, e->forget, (size_t)n_forget * CATALOG_FP_LEN);
        e->n_forget = 0;
        struct engine_batch *b = e->queue_head;
        if (b != NULL) {
            e->queue_head = b->next;
            if (e->queue_head == NULL)
                e->queue_tail = NULL;
        }
        pthread_mutex_unlock(&e->mu);
        for (uint32_t i = 0; i < n_forget && e->gpu != NULL; i++)
            gpu_engine_forget(e->gpu, forget[i]);
        if (b == NULL && n_forget != 0)
            continue;
        if (b == NULL)
            break; /* stop, and nothing left */

        if (e->open_status == 0) {
            run_batch(e, b);
        } else {
            for (struct engine_job *j = b->jobs; j != NULL; j = j->next)
                job_fail(j, -VKS_E_DEVICE, e->open_err.msg);
        }
        b->tel.batch_id = ++e->batches;
        if (e->gpu != NULL)
            b->tel.gpu_tel.resident_catalogs = gpu_engine_resident_catalogs(e->gpu);

        pthread_mutex_lock(&e->mu);
        b->next = NULL;
        if (e->done_tail != NULL)
            e->done_tail->next = b;
        else
            e->done_head = b;
        e->done_tail = b;
        pthread_mutex_unlock(&e->mu);
        uv_async_send(&e->async);
    }
    gpu_engine_destroy(e->gpu);
    e->gpu = NULL;
    gpu_result_finish(&e->res);
}

static void on_async(uv_async_t *h)
{
    struct engine *e = h->data;
    pthread_mutex_lock(&e->mu);
    bool report = e->open_done && !e->open_reported;
    e->open_reported |= report;
    struct engine_batch *done = e->done_head;
    e->done_head = e->done_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    if (report) {
        if (e->gpu != NULL)
            e->info.resident_catalogs = gpu_engine_resident_catalogs(e->gpu);
        e->ready_cb(e, e->open_status, &e->open_err, e->ctx);
    }
    while (done != NULL) {
        struct engine_batch *next = done->next;
        e->pending--;
        e->info.resident_catalogs = done->tel.gpu_tel.resident_catalogs;
        if (done->tel.gpu)
            e->info.device_memory_used = done->tel.gpu_tel.resident_bytes;
        /* The mappings go after the replies: done_cb may still read them,
         * and may free the batch. */
        struct engine_batch mapped = {.loaded = done->loaded, .n_loaded = done->n_loaded};
        done->loaded = NULL;
        e->done_cb(e, done, e->ctx);
        release_loaded(e, &mapped);
        done = next;
    }
}

int engine_create(uv_loop_t *loop, const struct daemon_config *cfg, engine_ready_cb ready,
                  engine_done_cb done, void *ctx, struct engine **out, struct vks_error *err)
{
    struct engine *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory creating the engine");
    e->loop = loop;
    e->want = cfg->engine;
    e->cpu_max_work = cfg->engine == CONFIG_ENGINE_AUTO ? cfg->cpu_max_work : 0;
    e->budget = cfg->device_budget;
    snprintf(e->device, sizeof(e->device), "%s", cfg->device);
    if (cfg->state_dir[0] != '\0')
        snprintf(e->cache_path, sizeof(e->cache_path), "%s/pipeline.cache", cfg->state_dir);
    e->ready_cb = ready;
    e->done_cb = done;
    e->ctx = ctx;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cond, NULL);
    int rc = uv_async_init(loop, &e->async, on_async);
    if (rc != 0) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cond);
        free(e);
        return vks_error_set(err, rc, "cannot create the engine's async handle: %s",
                             uv_strerror(rc));
    }
    e->async.data = e;
    rc = uv_thread_create(&e->thread, worker_main, e);
    if (rc != 0) {
        e->thread_started = false;
        engine_close(e);
        return vks_error_set(err, rc, "cannot start the engine thread: %s", uv_strerror(rc));
    }
    e->thread_started = true;
    *out = e;
    return 0;
}

void engine_forget(struct engine *e, const uint8_t fp[CATALOG_FP_LEN])
{
    pthread_mutex_lock(&e->mu);
    if (e->n_forget < FORGET_MAX)
        memcpy(e->forget[e->n_forget++], fp, CATALOG_FP_LEN);
    pthread_cond_signal(&e->cond);
    pthread_mutex_unlock(&e->mu);
}

void engine_submit(struct engine *e, struct engine_batch *batch)
{
    batch->next = NULL;
    e->pending++;
    pthread_mutex_lock(&e->mu);
    if (e->queue_tail != NULL)
        e->queue_tail->next = batch;
    else
        e->queue_head = batch;
    e->queue_tail = batch;
    pthread_cond_signal(&e->cond);
    pthread_mutex_unlock(&e->mu);
}

uint32_t engine_pending(const struct engine *e)
{
    return e->pending;
}

bool engine_ready(const struct engine *e)
{
    return e->open_reported && e->open_status == 0;
}

const struct engine_info *engine_get_info(const struct engine *e)
{
    return &e->info;
}

static void free_engine(uv_handle_t *h)
{
    struct engine *e = h->data;
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cond);
    free(e);
}

void engine_close(struct engine *e)
{
    if (e == NULL)
        return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_signal(&e->cond);
        pthread_mutex_unlock(&e->mu);
        uv_thread_join(&e->thread);
        e->thread_started = false;
        on_async(&e->async); /* hand back what finished after the last wake-up */
    }
    uv_close((uv_handle_t *)&e->async, free_engine);
}
