/*
 * The GPU engines' start (engine.h): the setup thread opens one gpu_engine
 * per selected device, warms it with a self-test scan and starts a worker
 * thread per engine (engine_gpu.c); the workers warm catalogs and batch
 * buffers when idle.
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
                             .inflight = e->inflight,
                             .batch_bytes_hint = e->batch_bytes};
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
int engine_gpu_open(struct engine *e, struct gworker *w, struct vks_error *err)
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
void engine_gpu_warm_frames(struct gworker *w)
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
void engine_gpu_warm_catalog(struct gworker *w, const struct catalog *cat)
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
struct engine_warm *engine_gpu_warm_for(const struct engine *e, uint32_t i)
{
    for (struct engine_warm *r = e->warm_head; r != NULL; r = r->next) {
        if (r->todo & (1u << i))
            return r;
    }
    return NULL;
}

/* The worker is through with `r`: the last one hands it to the loop. */
void engine_gpu_warm_through(struct engine *e, struct engine_warm *r)
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
        rc = engine_gpu_open(e, w, err);
        e->t_selftest += engine_now_ns() - t0;
        if (rc != 0) {
            char msg[sizeof(err->msg)];
            snprintf(msg, sizeof(msg), "%s", err->msg);
            vks_error_set(err, rc, "GPU engine %d (device %s): %s", i, w->device, msg);
            return rc;
        }
        pthread_cond_init(&w->cond, NULL);
        rc = uv_thread_create(&w->thread, engine_gpu_main, w);
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
