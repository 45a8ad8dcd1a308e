/*
 * The engines (engine.h): GPU workers, each owning one gpu_engine on a
 * thread of its own, and the CPU pool, scanning threads that share batches
 * split into segment tasks (rules/cpuscan.h). Batches come from the loop
 * thread through mutex-protected queues and go back through one uv_async_t.
 *
 * Locking: one mutex (e->mu) guards every queue and every field a thread
 * publishes for the others (marked "mu" below). A worker's gpu_engine and
 * gpu_result are its own; the loop thread never calls into gpu/, it reads
 * what the workers published, under the mutex (refresh_info).
 */
#include "engine.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cpuscan.h"
#include "log.h"
#include "rules.h"
#include "stats.h"
#include "vkscan/errors.h"

#define MAX_DEVICES     16u
#define MAX_GPU_ENGINES 16u
#define CPU_ENGINE      MAX_GPU_ENGINES /* stats slot of the CPU engine */

/* Dropped catalogs queued for a worker; past this, LRU eviction frees
 * the rest in time. */
#define FORGET_MAX 64

/* A GPU result array past this many hits is freed after its batch (a hit
 * bomb must not pin its memory until the next one). */
#define RES_KEEP_HITS (1u << 20)

/* engine_batch.state */
enum { B_NEW = 0, B_PREPARING, B_PREPARED };

struct gworker {
    struct engine *e;
    uint32_t index;
    uv_thread_t thread;
    bool started;
    pthread_cond_t cond;
    struct engine_batch *head, *tail;           /* mu */
    uint8_t forget[FORGET_MAX][CATALOG_FP_LEN]; /* mu */
    uint32_t n_forget;                          /* mu */

    /* The worker's own (set by the setup thread before the worker starts). */
    char device[32];
    char cache_path[CONFIG_PATH_MAX + 32];
    struct gpu_engine *gpu;
    struct gpu_result res;
    uint64_t last_done_ns;

    /* Published, mu. */
    bool alive;
    struct gpu_device_info dev;
    uint64_t budget;
    uint32_t resident;
    uint64_t device_used;
    uint64_t batches, bytes, busy_ns, retries;

    /* Loop thread. */
    uint64_t inflight_bytes;
};

struct engine {
    uv_loop_t *loop;
    uv_async_t async;
    pthread_mutex_t mu;
    struct engine_batch *done_head, *done_tail; /* mu: workers -> loop */
    bool stop;                                  /* mu: GPU workers */
    bool pool_stop;                             /* mu: CPU pool */
    uint64_t batches;                           /* mu: batch ids */
    uint32_t pending;                           /* loop thread */
    uint64_t start_ns;

    /* Settings, read-only after create. */
    enum config_engine want;
    uint64_t cpu_max_work;
    uint64_t cpu_max_wait_ns;
    uint64_t seg_bytes;
    uint32_t timeout_ms;
    uint64_t budget;
    char device[sizeof(((struct daemon_config *)0)->device)];
    char devices[sizeof(((struct daemon_config *)0)->devices)];
    char state_dir[CONFIG_PATH_MAX];

    /* The setup thread opens the GPU engines and starts their workers. */
    uv_thread_t setup;
    bool setup_started;
    struct gworker gw[MAX_GPU_ENGINES];
    uint32_t n_gpu;                                  /* mu until open_done; fixed after */
    struct gpu_device_info devices_found[MAX_DEVICES]; /* setup thread, then read-only */
    uint32_t n_devices_found;
    int open_status;
    struct vks_error open_err;
    bool open_done, open_reported; /* mu */

    /* The CPU pool. */
    uv_thread_t *cpu;
    uint32_t n_cpu, n_cpu_started;
    pthread_cond_t cpu_cond;
    struct engine_batch *cpu_head, *cpu_tail; /* mu: batches with work to hand out */
    uint64_t cpu_batches, cpu_bytes, cpu_busy_ns, cpu_retries; /* mu */
    uint64_t cpu_inflight_bytes;                              /* loop thread */

    /* Loop thread. */
    uint32_t rr; /* where the next tie-break starts */
    struct engine_info info;
    char keys[MAX_GPU_ENGINES + 1][7][40]; /* engine.N.* stats keys */

    engine_ready_cb ready_cb;
    engine_done_cb done_cb;
    void *ctx;
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

/* ---- batches ---------------------------------------------------------- */

/* A CPU task: the end offsets (lo, hi] of one buffer of one job. */
struct ctask {
    uint32_t job, buf;
    uint64_t lo, hi;
    uint64_t limit; /* set when handed out */
    bool done;
    int rc;
    struct cpuscan_part part;
};

/* Per job, on the CPU engine. */
struct jstate {
    bool run;        /* scanned on the CPU */
    uint32_t t0, nt; /* its tasks, in (buffer, segment) order */
    uint32_t prefix; /* tasks done from t0 on without a gap */
    uint64_t plain;  /* their kept hits (SCAN_ALL, rules without single-match) */
    bool full;       /* the prefix holds max_hits: later tasks keep one hit (a marker) */
};

/* A batch's private state while it runs. */
struct bstate {
    struct engine_job **jobs;
    size_t n_jobs;
    struct loaded *ld;
    size_t n_loaded;
    bool loaded;
    uint64_t start_ns;
    struct ctask *tasks; /* CPU engine */
    uint32_t n_tasks, next_task, done_tasks;
    struct jstate *js;
};

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

static uint64_t job_budget(const struct engine_job *j)
{
    return j->max_hits != 0 ? j->max_hits : UINT64_MAX;
}

/* Reads the batch's descriptor buffers and fills the byte counts. Runs once
 * per batch, on the first engine that takes it. */
static void load_batch(struct engine_batch *b)
{
    struct bstate *st = b->priv;
    struct engine_telemetry *tel = &b->tel;
    size_t n_jobs = 0, n_fd = 0;
    for (struct engine_job *j = b->jobs; j != NULL; j = j->next) {
        n_jobs++;
        for (uint32_t i = 0; i < j->n_bufs; i++)
            n_fd += j->bufs[i].fd >= 0;
    }
    st->loaded = true;
    st->start_ns = now_ns();
    st->jobs = calloc(n_jobs ? n_jobs : 1, sizeof(*st->jobs));
    st->ld = calloc(n_fd ? n_fd : 1, sizeof(*st->ld));
    for (struct engine_job *j = b->jobs; j != NULL; j = j->next) {
        j->status = 0;
        j->cpu_retry = 0;
        j->hits_dropped = 0;
        if (st->jobs == NULL || st->ld == NULL) {
            job_fail(j, -VKS_E_INTERNAL, "out of memory starting the scan");
            continue;
        }
        st->jobs[st->n_jobs++] = j;
        for (uint32_t i = 0; i < j->n_bufs; i++) {
            struct engine_buf *eb = &j->bufs[i];
            tel->buffers++;
            if (eb->status != 0)
                continue; /* refused when queued (bad descriptor) */
            if (eb->fd >= 0)
                load_fd(eb, &st->ld[st->n_loaded++]);
            else
                eb->bytes = eb->len;
            tel->bytes += eb->status == 0 ? eb->bytes : 0;
        }
    }
    tel->jobs = (uint32_t)st->n_jobs;
    tel->fd_read_ns = now_ns() - st->start_ns;
}

/* Frees the batch's private state (descriptor buffers go to the loop
 * thread, which releases them off the engines) and queues it for `done`. */
static void post_done(struct engine *e, struct engine_batch *b)
{
    struct bstate *st = b->priv;
    if (st != NULL) {
        for (uint32_t i = 0; i < st->n_tasks; i++)
            cpuscan_part_finish(&st->tasks[i].part);
        b->tel.wall_ns = st->loaded ? now_ns() - st->start_ns : 0;
        /* Unmapping 64 MiB takes milliseconds (page tables, TLB): the loop
         * thread hands that to the thread pool (release_loaded). */
        b->loaded = st->n_loaded ? st->ld : NULL;
        b->n_loaded = st->n_loaded;
        if (st->n_loaded == 0)
            free(st->ld);
        free(st->jobs);
        free(st->tasks);
        free(st->js);
        free(st);
        b->priv = NULL;
    }
    pthread_mutex_lock(&e->mu);
    b->tel.batch_id = ++e->batches;
    b->next = NULL;
    if (e->done_tail != NULL)
        e->done_tail->next = b;
    else
        e->done_head = b;
    e->done_tail = b;
    pthread_mutex_unlock(&e->mu);
    uv_async_send(&e->async);
}

/* ---- the GPU engines -------------------------------------------------- */

/* A buffer of the GPU batch: where its hits go. */
struct slot {
    uint32_t job; /* index into the jobs array */
    uint32_t buf;
};

static int open_gpu(struct engine *e, struct gworker *w, struct vks_error *err);

/* The engine failed a batch in a way that leaves it unusable: open it
 * again, exactly as at start (warm-up self-test included). */
static void gpu_reopen(struct gworker *w)
{
    struct vks_error err = {0};
    gpu_engine_destroy(w->gpu);
    w->gpu = NULL;
    if (open_gpu(w->e, w, &err) != 0) {
        log_err("GPU engine %u could not be re-created after a device failure (%s): its batches "
                "go to the other engines from now on; restart vkscand to use it again",
                w->index, err.msg);
        pthread_mutex_lock(&w->e->mu);
        w->alive = false;
        pthread_mutex_unlock(&w->e->mu);
    }
}

/* Keeps at most max_hits hits of each job after readback, plus one marker
 * per buffer with more (engine_job.max_hits). */
static int gpu_collect(struct gworker *w, struct engine_job **jobs, size_t n,
                       const struct slot *slots)
{
    size_t *caps = calloc(n, sizeof(*caps));
    uint64_t *kept = calloc(n, sizeof(*kept));
    int64_t *marked = malloc(n * sizeof(*marked));
    if (caps == NULL || kept == NULL || marked == NULL) {
        free(caps);
        free(kept);
        free(marked);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        marked[i] = -1;
    for (size_t h = 0; h < w->res.n_hits; h++) {
        const struct gpu_hit *g = &w->res.hits[h];
        const struct slot *s = &slots[g->buffer];
        struct engine_job *j = jobs[s->job];
        if (j->status != 0)
            continue;
        if (kept[s->job] >= job_budget(j)) {
            j->hits_dropped++;
            if (marked[s->job] == (int64_t)s->buf)
                continue;
            marked[s->job] = s->buf;
        } else {
            kept[s->job]++;
        }
        if (push_hit(j, &caps[s->job], s->buf, g->rule, g->count, g->end) != 0)
            job_fail(j, -VKS_E_INTERNAL, "out of memory collecting hits");
    }
    free(caps);
    free(kept);
    free(marked);
    if (w->res.cap > RES_KEEP_HITS) {
        gpu_result_finish(&w->res);
        memset(&w->res, 0, sizeof(w->res));
    }
    return 0;
}

/* Dispatches the jobs j[0..n) as one GPU batch. Returns 0, or -E2BIG when
 * the batch of several jobs does not fit the device (nothing ran). A job
 * the device cannot run (one too large, a timeout, a lost device) is
 * marked for the CPU engine. */
static int run_gpu(struct gworker *w, struct engine_job **jobs, size_t n,
                   struct gpu_telemetry *tel)
{
    if (w->gpu == NULL) {
        for (size_t i = 0; i < n; i++)
            jobs[i]->cpu_retry = -ENODEV;
        return 0;
    }
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
    struct vks_error err = {0};
    rc = gpu_batch_dispatch(w->gpu, &batch, &w->res, &err);
    if (rc == -E2BIG && n > 1)
        goto out;
    if (rc == -E2BIG || rc == -ETIMEDOUT || rc == -ENODEV || rc == -EIO) {
        log_warn("GPU engine %u: %s: the batch's %zu scans re-run on the CPU engine", w->index,
                 err.msg, n);
        for (size_t i = 0; i < n; i++)
            jobs[i]->cpu_retry = rc;
        if (rc != -E2BIG)
            gpu_reopen(w);
        rc = 0;
        goto out;
    }
    if (rc != 0) {
        char msg[300];
        snprintf(msg, sizeof(msg), "the GPU failed the scan: %.250s", err.msg);
        for (size_t i = 0; i < n; i++)
            job_fail(jobs[i], -VKS_E_DEVICE, msg);
        rc = 0;
        goto out;
    }
    *tel = w->res.tel;
    if (gpu_collect(w, jobs, n, slots) != 0) {
        for (size_t i = 0; i < n; i++)
            job_fail(jobs[i], -VKS_E_INTERNAL, "out of memory collecting hits");
    }
out:
    free(gb);
    free(slots);
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
            job_fail(jobs[i], -VKS_E_INTERNAL, "out of memory building the GPU batch");
        return;
    }
    /* Sum the counters of the parts; the last part's choices (sizes, writer) stay. */
    struct gpu_telemetry *s = &tel->gpu_tel;
    uint64_t up = s->bytes_uploaded, cat = s->catalog_bytes_uploaded,
             hay = s->haystack_bytes_uploaded, rb = s->bytes_read_back, kn = s->kernel_ns,
             tn = s->total_ns;
    uint32_t hits = s->catalog_cache_hits, launches = s->kernel_launches,
             uploads = s->catalog_uploads;
    if (t.total_ns == 0 && t.kernel_launches == 0)
        return; /* nothing ran (the jobs went to the CPU) */
    *s = t;
    s->bytes_uploaded += up;
    s->catalog_bytes_uploaded += cat;
    s->haystack_bytes_uploaded += hay;
    s->bytes_read_back += rb;
    s->kernel_ns += kn;
    s->total_ns += tn;
    s->catalog_cache_hits += hits;
    s->catalog_uploads += uploads;
    s->kernel_launches += launches;
}

static void cpu_push(struct engine *e, struct engine_batch *b);

static void gpu_run_batch(struct gworker *w, struct engine_batch *b)
{
    struct engine *e = w->e;
    struct bstate *st = b->priv;
    uint64_t t0 = now_ns();
    b->tel.idle_ns = w->last_done_ns ? t0 - w->last_done_ns : 0;
    b->tel.gpu = true;
    b->tel.engine = w->index;
    load_batch(b);
    uint64_t t1 = now_ns();
    run_gpu_split(w, st->jobs, st->n_jobs, &b->tel);
    uint32_t retries = 0;
    for (size_t i = 0; i < st->n_jobs; i++)
        retries += st->jobs[i]->status == 0 && st->jobs[i]->cpu_retry != 0;
    b->tel.cpu_retries = retries;
    w->last_done_ns = now_ns();
    b->tel.scan_ns = w->last_done_ns - t1;
    pthread_mutex_lock(&e->mu);
    w->batches++;
    w->bytes += b->tel.bytes;
    w->busy_ns += w->last_done_ns - t0;
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
    if (retries > 0)
        cpu_push(e, b);
    else
        post_done(e, b);
}

/* ---- the CPU engine --------------------------------------------------- */

/* Splits the batch's CPU jobs into tasks: a buffer of a catalog whose
 * groups are all bounded is cut into segments of seg_bytes (at least four
 * lookbacks); anything else is one task per buffer. */
static void cpu_prepare(struct engine *e, struct engine_batch *b)
{
    struct bstate *st = b->priv;
    if (!st->loaded) {
        b->tel.engine = e->n_gpu; /* the CPU engine's stats index */
        load_batch(b);
    }
    st->js = calloc(st->n_jobs ? st->n_jobs : 1, sizeof(*st->js));
    uint64_t n_tasks = 0;
    for (size_t i = 0; st->js != NULL && i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        struct jstate *js = &st->js[i];
        js->run = j->status == 0 && (b->target == CPU_ENGINE || j->cpu_retry != 0);
        if (!js->run)
            continue;
        uint64_t lb = cpuscan_lookback(j->cat);
        uint64_t seg = e->seg_bytes;
        if (lb != CPUSCAN_UNSEGMENTABLE && seg < 4 * lb)
            seg = 4 * lb;
        for (uint32_t k = 0; k < j->n_bufs; k++) {
            const struct engine_buf *eb = &j->bufs[k];
            if (eb->status != 0)
                continue;
            n_tasks += lb == CPUSCAN_UNSEGMENTABLE || eb->len <= seg ? 1 : (eb->len + seg - 1) / seg;
        }
    }
    st->tasks = calloc(n_tasks ? n_tasks : 1, sizeof(*st->tasks));
    if (st->js == NULL || st->tasks == NULL) {
        for (size_t i = 0; i < st->n_jobs; i++) {
            if (st->jobs[i]->status == 0 && (st->js == NULL || st->js[i].run))
                job_fail(st->jobs[i], -VKS_E_INTERNAL, "out of memory splitting the scan");
        }
        free(st->tasks);
        st->tasks = NULL;
        return;
    }
    uint32_t t = 0;
    for (size_t i = 0; i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        struct jstate *js = &st->js[i];
        js->t0 = t;
        if (!js->run)
            continue;
        uint64_t lb = cpuscan_lookback(j->cat);
        uint64_t seg = e->seg_bytes;
        if (lb != CPUSCAN_UNSEGMENTABLE && seg < 4 * lb)
            seg = 4 * lb;
        for (uint32_t k = 0; k < j->n_bufs; k++) {
            const struct engine_buf *eb = &j->bufs[k];
            if (eb->status != 0)
                continue;
            if (lb == CPUSCAN_UNSEGMENTABLE || eb->len <= seg) {
                st->tasks[t++] = (struct ctask){.job = (uint32_t)i, .buf = k, .lo = 0, .hi = eb->len};
                continue;
            }
            for (uint64_t lo = 0; lo < eb->len; lo += seg)
                st->tasks[t++] = (struct ctask){.job = (uint32_t)i,
                                                .buf = k,
                                                .lo = lo,
                                                .hi = lo + seg < eb->len ? lo + seg : eb->len};
        }
        js->nt = t - js->t0;
    }
    st->n_tasks = t;
    b->tel.segments = t;
}

/* Merges each CPU job's parts into its hits: per buffer in order, at most
 * max_hits over the job plus one marker per buffer with more. */
static void cpu_finish(struct engine *e, struct engine_batch *b)
{
    struct bstate *st = b->priv;
    for (size_t i = 0; st->js != NULL && st->tasks != NULL && i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        struct jstate *js = &st->js[i];
        if (!js->run || j->status != 0)
            continue;
        free(j->hits);
        j->hits = NULL;
        j->n_hits = 0;
        uint64_t budget = job_budget(j), kept = 0;
        size_t cap = 0;
        struct scan_hits out = {0};
        int rc = 0;
        for (uint32_t t = js->t0; t < js->t0 + js->nt && rc == 0;) {
            uint32_t end = t;
            while (end < js->t0 + js->nt && st->tasks[end].buf == st->tasks[t].buf) {
                if (st->tasks[end].rc != 0)
                    rc = st->tasks[end].rc;
                end++;
            }
            /* parts of one buffer are contiguous; merge wants an array of them */
            struct cpuscan_part *parts = malloc((end - t) * sizeof(*parts));
            if (parts == NULL)
                rc = -ENOMEM;
            for (uint32_t k = t; rc == 0 && k < end; k++)
                parts[k - t] = st->tasks[k].part;
            out.n = 0;
            if (rc == 0)
                rc = cpuscan_merge(j->cat, j->mode, parts, end - t, budget - kept, true, &out,
                                   &j->hits_dropped);
            free(parts);
            for (size_t h = 0; rc == 0 && h < out.n; h++) {
                if (kept < budget)
                    kept++; /* past it: the marker, counted as dropped by the merge */
                rc = push_hit(j, &cap, st->tasks[t].buf, out.v[h].rule, out.v[h].count,
                              out.v[h].end);
            }
            t = end;
        }
        scan_hits_finish(&out);
        if (rc != 0)
            job_fail(j, -VKS_E_INTERNAL,
                     "out of memory collecting hits: lower max_hits or scan smaller buffers");
    }
    (void)e;
}

/* Finds work for a pool thread (mu held): a batch to prepare or a task. */
static bool cpu_take(struct engine *e, struct engine_batch **bp, struct ctask **tp)
{
    struct engine_batch *prev = NULL;
    for (struct engine_batch *b = e->cpu_head; b != NULL; prev = b, b = b->next) {
        struct bstate *st = b->priv;
        if (b->state == B_NEW) {
            b->state = B_PREPARING;
            *bp = b;
            *tp = NULL;
            return true;
        }
        if (b->state != B_PREPARED || st->next_task >= st->n_tasks)
            continue;
        struct ctask *t = &st->tasks[st->next_task++];
        struct engine_job *j = st->jobs[t->job];
        t->limit = st->js[t->job].full ? 1 : (j->max_hits ? j->max_hits : 0);
        if (st->next_task == st->n_tasks) { /* all handed out: off the queue */
            if (prev != NULL)
                prev->next = b->next;
            else
                e->cpu_head = b->next;
            if (e->cpu_tail == b)
                e->cpu_tail = prev;
        }
        *bp = b;
        *tp = t;
        return true;
    }
    return false;
}

static void cpu_unlink(struct engine *e, struct engine_batch *b)
{
    struct engine_batch *prev = NULL;
    for (struct engine_batch *x = e->cpu_head; x != NULL; prev = x, x = x->next) {
        if (x != b)
            continue;
        if (prev != NULL)
            prev->next = b->next;
        else
            e->cpu_head = b->next;
        if (e->cpu_tail == b)
            e->cpu_tail = prev;
        return;
    }
}

/* A task is done (mu held): advances its job's prefix. Returns whether the
 * batch is complete. */
static bool cpu_task_done(struct engine_batch *b, struct ctask *t)
{
    struct bstate *st = b->priv;
    struct jstate *js = &st->js[t->job];
    struct engine_job *j = st->jobs[t->job];
    t->done = true;
    while (js->prefix < js->nt && st->tasks[js->t0 + js->prefix].done) {
        js->plain += st->tasks[js->t0 + js->prefix].part.plain;
        js->prefix++;
    }
    if (j->mode == SCAN_ALL && j->max_hits != 0 && js->plain >= j->max_hits)
        js->full = true;
    return ++st->done_tasks == st->n_tasks;
}

static void cpu_complete(struct engine *e, struct engine_batch *b, uint64_t busy)
{
    cpu_finish(e, b);
    pthread_mutex_lock(&e->mu);
    e->cpu_busy_ns += busy;
    e->cpu_batches++;
    e->cpu_bytes += b->target == CPU_ENGINE ? b->tel.bytes : 0;
    e->cpu_retries += b->target != CPU_ENGINE;
    pthread_mutex_unlock(&e->mu);
    if (b->target == CPU_ENGINE)
        b->tel.scan_ns = now_ns() - ((struct bstate *)b->priv)->start_ns - b->tel.fd_read_ns;
    post_done(e, b);
}

static void cpu_main(void *arg)
{
    struct engine *e = arg;
    struct cpuscan_scratch *scr = NULL;
    int scr_rc = cpuscan_scratch_create(&scr);
    pthread_mutex_lock(&e->mu);
    for (;;) {
        struct engine_batch *b;
        struct ctask *t;
        if (!cpu_take(e, &b, &t)) {
            if (e->pool_stop && e->cpu_head == NULL)
                break;
            pthread_cond_wait(&e->cpu_cond, &e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        struct bstate *st = b->priv;
        uint64_t t0 = now_ns();
        if (t == NULL) {
            if (b->target == CPU_ENGINE) {
                b->tel.idle_ns = 0;
                b->tel.gpu = false;
            }
            cpu_prepare(e, b);
            pthread_mutex_lock(&e->mu);
            b->state = B_PREPARED;
            bool empty = st->n_tasks == 0;
            if (empty)
                cpu_unlink(e, b);
            pthread_cond_broadcast(&e->cpu_cond);
            pthread_mutex_unlock(&e->mu);
            if (empty)
                cpu_complete(e, b, now_ns() - t0);
            pthread_mutex_lock(&e->mu);
            if (!empty)
                e->cpu_busy_ns += now_ns() - t0;
            continue;
        }
        struct engine_job *j = st->jobs[t->job];
        const struct engine_buf *eb = &j->bufs[t->buf];
        t->rc = scr_rc != 0 ? scr_rc
                            : cpuscan_segment(j->cat, eb->data, (size_t)eb->len, t->lo, t->hi,
                                              j->mode, t->limit, scr, &t->part);
        uint64_t busy = now_ns() - t0;
        pthread_mutex_lock(&e->mu);
        bool last = cpu_task_done(b, t);
        if (!last)
            e->cpu_busy_ns += busy;
        pthread_mutex_unlock(&e->mu);
        if (last)
            cpu_complete(e, b, busy);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    cpuscan_scratch_destroy(scr);
}

/* Queues a batch for the CPU pool: placed there, or given back by a GPU
 * engine with jobs to re-run. */
static void cpu_push(struct engine *e, struct engine_batch *b)
{
    pthread_mutex_lock(&e->mu);
    b->state = B_NEW;
    b->next = NULL;
    if (e->cpu_tail != NULL)
        e->cpu_tail->next = b;
    else
        e->cpu_head = b;
    e->cpu_tail = b;
    pthread_cond_broadcast(&e->cpu_cond);
    pthread_mutex_unlock(&e->mu);
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

/* ---- opening and warming ---------------------------------------------- */

/* Scans a small fixed catalog on the GPU in every report mode and checks the
 * hits against the CPU scanner: compiles the common pipelines and refuses a
 * device that gives wrong answers. */
static int warm_up(struct gworker *w, struct vks_error *err)
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
        const struct catalog *cats[1] = {rr.catalog};
        struct gpu_buffer gb = {
            .data = text, .len = sizeof(text) - 1, .mode = (enum scan_mode)mode, .catalog = 0};
        struct gpu_batch batch = {.catalogs = cats, .n_catalogs = 1, .buffers = &gb, .n_buffers = 1};
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
                             .timeout_ms = timeout_ms};
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
    w->alive = true;
    w->resident = gpu_engine_resident_catalogs(w->gpu);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* ---- the GPU workers -------------------------------------------------- */

static void gpu_main(void *arg)
{
    struct gworker *w = arg;
    struct engine *e = w->e;
    for (;;) {
        uint8_t forget[FORGET_MAX][CATALOG_FP_LEN];
        pthread_mutex_lock(&e->mu);
        while (w->head == NULL && w->n_forget == 0 && !e->stop)
            pthread_cond_wait(&w->cond, &e->mu);
        uint32_t n_forget = w->n_forget;
        memcpy(forget, w->forget, (size_t)n_forget * CATALOG_FP_LEN);
        w->n_forget = 0;
        struct engine_batch *b = w->head;
        if (b != NULL) {
            w->head = b->next;
            if (w->head == NULL)
                w->tail = NULL;
        }
        pthread_mutex_unlock(&e->mu);
        for (uint32_t i = 0; i < n_forget && w->gpu != NULL; i++)
            gpu_engine_forget(w->gpu, forget[i]);
        if (n_forget != 0 && w->gpu != NULL) {
            uint32_t resident = gpu_engine_resident_catalogs(w->gpu);
            pthread_mutex_lock(&e->mu);
            w->resident = resident;
            pthread_mutex_unlock(&e->mu);
        }
        if (b == NULL && n_forget != 0)
            continue;
        if (b == NULL)
            break; /* stop, and nothing left */
        gpu_run_batch(w, b);
    }
    gpu_engine_destroy(w->gpu);
    w->gpu = NULL;
    gpu_result_finish(&w->res);
}

/* Parses `devices`: "all" or "N[,N...]" (duplicates allowed: two engines
 * on one device). Returns the count, or -EINVAL with `err` set. */
static int parse_devices(const char *s, uint32_t *idx, uint32_t cap, bool *all,
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

static void list_devices(struct engine *e)
{
    struct vks_error lerr = {0};
    uint32_t n = 0;
    if (gpu_device_list(e->devices_found, MAX_DEVICES, &n, &lerr) == 0)
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
        snprintf(w->cache_path, sizeof(w->cache_path), "%s/pipeline-%u.cache", e->state_dir,
                 index);
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
        n = parse_devices(e->devices, idx, MAX_GPU_ENGINES, &all, err);
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
    /* The first engine loads the driver (kept loaded: pin_vulkan_modules)
     * before the devices are listed. */
    int rc = create_gpu(e, w0, e->timeout_ms, err);
    list_devices(e);
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
        rc = open_gpu(e, w, err);
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

static void setup_main(void *arg)
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
    if (n_gpu == 0 && e->want != CONFIG_ENGINE_CPU && e->open_status == 0)
        log_notice("engine: CPU engine, %u threads", e->n_cpu);
    pthread_mutex_lock(&e->mu);
    e->open_done = true;
    pthread_mutex_unlock(&e->mu);
    uv_async_send(&e->async);
}

/* ---- the loop thread -------------------------------------------------- */

/* Copies what the workers published into the loop thread's info. */
static void refresh_info(struct engine *e)
{
    struct engine_info *in = &e->info;
    pthread_mutex_lock(&e->mu);
    in->gpu = false;
    in->gpu_engines = 0;
    in->resident_catalogs = 0;
    in->device_memory_used = 0;
    in->device_memory_budget = 0;
    for (uint32_t i = 0; i < e->n_gpu; i++) {
        const struct gworker *w = &e->gw[i];
        if (!w->alive)
            continue;
        if (!in->gpu)
            in->device = w->dev;
        in->gpu = true;
        in->gpu_engines++;
        in->resident_catalogs += w->resident;
        in->device_memory_used += w->device_used;
        in->device_memory_budget += w->budget;
    }
    pthread_mutex_unlock(&e->mu);
    in->devices = e->devices_found;
    in->n_devices = e->n_devices_found;
    in->cpu_threads = e->n_cpu;
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
    if (report || done != NULL)
        refresh_info(e);
    if (report)
        e->ready_cb(e, e->open_status, &e->open_err, e->ctx);
    while (done != NULL) {
        struct engine_batch *next = done->next;
        e->pending--;
        if (done->target < e->n_gpu)
            e->gw[done->target].inflight_bytes -= done->bytes_est;
        else
            e->cpu_inflight_bytes -= done->bytes_est;
        /* The mappings go after the replies: done_cb may still read them,
         * and may free the batch. */
        struct engine_batch mapped = {.loaded = done->loaded, .n_loaded = done->n_loaded};
        done->loaded = NULL;
        e->done_cb(e, done, e->ctx);
        release_loaded(e, &mapped);
        done = next;
    }
}

void engine_job_finish(struct engine_job *job)
{
    free(job->hits);
    job->hits = NULL;
    job->n_hits = 0;
}

/* Where a batch goes: the CPU engine for --engine cpu, when no GPU engine
 * runs, or (auto) for a small batch while the CPU queue is short; else the
 * GPU engine with the fewest bytes in flight. */
static uint32_t place(struct engine *e, uint64_t bytes, uint64_t work)
{
    if (e->want == CONFIG_ENGINE_CPU || e->n_gpu == 0)
        return CPU_ENGINE;
    uint64_t now = now_ns();
    pthread_mutex_lock(&e->mu);
    uint64_t wait = e->cpu_head != NULL && now > e->cpu_head->submit_ns
                        ? now - e->cpu_head->submit_ns
                        : 0;
    /* ties go round: two idle engines take turns */
    uint32_t best = CPU_ENGINE;
    for (uint32_t k = 0; k < e->n_gpu; k++) {
        uint32_t i = (e->rr + k) % e->n_gpu;
        if (e->gw[i].alive && (best == CPU_ENGINE ||
                               e->gw[i].inflight_bytes < e->gw[best].inflight_bytes))
            best = i;
    }
    pthread_mutex_unlock(&e->mu);
    if (best != CPU_ENGINE && e->want == CONFIG_ENGINE_AUTO && work <= e->cpu_max_work &&
        wait <= e->cpu_max_wait_ns)
        return CPU_ENGINE;
    (void)bytes;
    e->rr = best != CPU_ENGINE ? best + 1 : e->rr;
    return best;
}

void engine_submit(struct engine *e, struct engine_batch *batch)
{
    uint64_t bytes = 0, work = 0;
    for (struct engine_job *j = batch->jobs; j != NULL; j = j->next) {
        uint64_t jb = 0;
        for (uint32_t i = 0; i < j->n_bufs; i++) {
            const struct engine_buf *b = &j->bufs[i];
            jb += b->status != 0 ? 0 : b->fd >= 0 ? b->length : b->len;
        }
        bytes += jb;
        work += jb * catalog_group_count(j->cat);
    }
    memset(&batch->tel, 0, sizeof(batch->tel));
    batch->next = NULL;
    batch->state = B_NEW;
    batch->bytes_est = bytes;
    batch->submit_ns = now_ns();
    batch->priv = calloc(1, sizeof(struct bstate));
    e->pending++;
    if (batch->priv == NULL) {
        for (struct engine_job *j = batch->jobs; j != NULL; j = j->next)
            job_fail(j, -VKS_E_INTERNAL, "out of memory queueing the batch: retry");
        batch->target = CPU_ENGINE;
        e->cpu_inflight_bytes += bytes;
        post_done(e, batch); /* handed back through the async handle */
        return;
    }
    uint32_t t = place(e, bytes, work);
    batch->target = t;
    if (t == CPU_ENGINE) {
        e->cpu_inflight_bytes += bytes;
        cpu_push(e, batch);
        return;
    }
    struct gworker *w = &e->gw[t];
    w->inflight_bytes += bytes;
    pthread_mutex_lock(&e->mu);
    if (w->tail != NULL)
        w->tail->next = batch;
    else
        w->head = batch;
    w->tail = batch;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&e->mu);
}

void engine_forget(struct engine *e, const uint8_t fp[CATALOG_FP_LEN])
{
    pthread_mutex_lock(&e->mu);
    for (uint32_t i = 0; i < e->n_gpu; i++) {
        struct gworker *w = &e->gw[i];
        if (w->n_forget < FORGET_MAX)
            memcpy(w->forget[w->n_forget++], fp, CATALOG_FP_LEN);
        pthread_cond_signal(&w->cond);
    }
    pthread_mutex_unlock(&e->mu);
}

uint32_t engine_pending(const struct engine *e)
{
    return e->pending;
}

uint32_t engine_count(const struct engine *e)
{
    uint32_t n = e->info.gpu_engines;
    if (e->want != CONFIG_ENGINE_GPU || n == 0)
        n++;
    return n;
}

bool engine_ready(const struct engine *e)
{
    return e->open_reported && e->open_status == 0;
}

const struct engine_info *engine_get_info(const struct engine *e)
{
    return &e->info;
}

static const char *key(struct engine *e, uint32_t slot, int k, const char *name)
{
    char *s = e->keys[slot][k];
    snprintf(s, sizeof(e->keys[slot][k]), "engine.%u.%s", slot == CPU_ENGINE ? e->n_gpu : slot,
             name);
    return s;
}

static void add_engine(struct engine *e, struct stats_list *l, uint32_t slot, uint64_t kind,
                       uint64_t device, uint64_t batches, uint64_t bytes, uint64_t busy,
                       uint64_t span, uint64_t retries)
{
    stats_add_u(l, key(e, slot, 0, "kind"), kind);
    stats_add_u(l, key(e, slot, 1, "device"), device);
    stats_add_u(l, key(e, slot, 2, "batches"), batches);
    stats_add_u(l, key(e, slot, 3, "bytes"), bytes);
    stats_add_u(l, key(e, slot, 4, "busy_ns"), busy);
    stats_add_f(l, key(e, slot, 5, "busy_share"), span ? (double)busy / (double)span : 0.0);
    stats_add_u(l, key(e, slot, 6, "cpu_retries"), retries);
}

void engine_stats_add(struct engine *e, struct stats_list *l)
{
    uint64_t span = now_ns() - e->start_ns;
    pthread_mutex_lock(&e->mu);
    uint32_t n = e->n_gpu;
    struct {
        uint64_t device, batches, bytes, busy, retries;
    } g[MAX_GPU_ENGINES];
    for (uint32_t i = 0; i < n; i++)
        g[i].device = e->gw[i].dev.index, g[i].batches = e->gw[i].batches,
        g[i].bytes = e->gw[i].bytes, g[i].busy = e->gw[i].busy_ns, g[i].retries = e->gw[i].retries;
    uint64_t cb = e->cpu_batches, cy = e->cpu_bytes, cbusy = e->cpu_busy_ns, cr = e->cpu_retries;
    pthread_mutex_unlock(&e->mu);
    stats_add_u(l, "engines", n + 1);
    stats_add_u(l, "cpu_threads", e->n_cpu);
    for (uint32_t i = 0; i < n; i++)
        add_engine(e, l, i, 0, g[i].device, g[i].batches, g[i].bytes, g[i].busy, span,
                   g[i].retries);
    /* the CPU engine's busy share is over all its threads */
    add_engine(e, l, CPU_ENGINE, 1, e->n_cpu, cb, cy, cbusy, span * e->n_cpu, cr);
}

void engine_telemetry_add(struct stats_list *l, const struct engine_job *job,
                          const struct engine_telemetry *t)
{
    stats_add_u(l, "engine_index", t->engine);
    stats_add_u(l, "wall_ns", t->wall_ns);
    stats_add_u(l, "device_idle_ns", t->idle_ns);
    stats_add_u(l, "cpu_segments", t->segments);
    stats_add_u(l, "cpu_retry", job->cpu_retry < 0 ? (uint64_t)-job->cpu_retry : 0);
    stats_add_u(l, "hits_dropped", job->hits_dropped);
}

/* ---- create and close ------------------------------------------------- */

static uint32_t default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 2 ? (uint32_t)(n - 1) : 1;
}

int engine_create(uv_loop_t *loop, const struct daemon_config *cfg, engine_ready_cb ready,
                  engine_done_cb done, void *ctx, struct engine **out, struct vks_error *err)
{
    struct engine *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory creating the engine");
    e->loop = loop;
    e->start_ns = now_ns();
    e->want = cfg->engine;
    e->cpu_max_work = cfg->engine == CONFIG_ENGINE_AUTO ? cfg->cpu_max_work : 0;
    e->cpu_max_wait_ns = (uint64_t)cfg->cpu_max_wait_us * 1000u;
    e->seg_bytes = cfg->cpu_segment_bytes ? cfg->cpu_segment_bytes : 4u << 20;
    e->timeout_ms = cfg->gpu_timeout_ms;
    e->budget = cfg->device_budget;
    e->n_cpu = cfg->cpu_threads ? cfg->cpu_threads : default_threads();
    snprintf(e->device, sizeof(e->device), "%s", cfg->device);
    snprintf(e->devices, sizeof(e->devices), "%s", cfg->devices);
    snprintf(e->state_dir, sizeof(e->state_dir), "%s", cfg->state_dir);
    e->ready_cb = ready;
    e->done_cb = done;
    e->ctx = ctx;
    if (e->devices[0] != '\0') {
        uint32_t idx[MAX_GPU_ENGINES];
        bool all;
        int rc = parse_devices(e->devices, idx, MAX_GPU_ENGINES, &all, err);
        if (rc < 0) {
            free(e);
            return rc;
        }
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cpu_cond, NULL);
    int rc = uv_async_init(loop, &e->async, on_async);
    if (rc != 0) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cpu_cond);
        free(e);
        return vks_error_set(err, rc, "cannot create the engine's async handle: %s",
                             uv_strerror(rc));
    }
    e->async.data = e;
    e->cpu = calloc(e->n_cpu, sizeof(*e->cpu));
    if (e->cpu == NULL) {
        engine_close(e);
        return vks_error_set(err, -ENOMEM, "out of memory creating the CPU engine");
    }
    for (; e->n_cpu_started < e->n_cpu; e->n_cpu_started++) {
        rc = uv_thread_create(&e->cpu[e->n_cpu_started], cpu_main, e);
        if (rc != 0) {
            engine_close(e);
            return vks_error_set(err, rc, "cannot start a CPU engine thread: %s",
                                 uv_strerror(rc));
        }
    }
    rc = uv_thread_create(&e->setup, setup_main, e);
    if (rc != 0) {
        engine_close(e);
        return vks_error_set(err, rc, "cannot start the engine thread: %s", uv_strerror(rc));
    }
    e->setup_started = true;
    *out = e;
    return 0;
}

static void free_engine(uv_handle_t *h)
{
    struct engine *e = h->data;
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cpu_cond);
    free(e->cpu);
    free(e);
}

void engine_close(struct engine *e)
{
    if (e == NULL)
        return;
    if (e->setup_started) {
        uv_thread_join(&e->setup);
        e->setup_started = false;
    }
    /* GPU workers first: they may still hand batches to the CPU pool. */
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    for (uint32_t i = 0; i < e->n_gpu; i++)
        pthread_cond_signal(&e->gw[i].cond);
    pthread_mutex_unlock(&e->mu);
    for (uint32_t i = 0; i < e->n_gpu; i++) {
        if (e->gw[i].started) {
            uv_thread_join(&e->gw[i].thread);
            e->gw[i].started = false;
            pthread_cond_destroy(&e->gw[i].cond);
        }
    }
    pthread_mutex_lock(&e->mu);
    e->pool_stop = true;
    pthread_cond_broadcast(&e->cpu_cond);
    pthread_mutex_unlock(&e->mu);
    for (uint32_t i = 0; i < e->n_cpu_started; i++)
        uv_thread_join(&e->cpu[i]);
    e->n_cpu_started = 0;
    on_async(&e->async); /* hand back what finished after the last wake-up */
    uv_close((uv_handle_t *)&e->async, free_engine);
}
