/*
 * The engine layer: a worker thread that owns the scan device and runs
 * batches handed over from the loop thread, with results coming back on the
 * loop thread through uv_async_send.
 *
 * Two back ends behind one interface: the GPU engine (gpu/gpu.h, Vulkan
 * compute; what vkscand is for) and the CPU reference scanner
 * (rules/refscan.h) for hosts where no Vulkan device opens (--engine cpu, or
 * auto when the GPU engine fails to start). Both return exactly the same hits.
 *
 * The worker also reads buffers passed as file descriptors (a memfd or an
 * open file), so no disk read ever runs on the loop thread. A sealed memfd
 * (F_SEAL_SHRINK) is mapped instead of copied; anything else is read with
 * pread into memory, so a client that truncates its file cannot crash the
 * daemon with SIGBUS.
 */
#ifndef VKS_DAEMON_ENGINE_H
#define VKS_DAEMON_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "catalog.h"
#include "config.h"
#include "error.h"
#include "gpu.h"
#include "refscan.h"

/* One input buffer of a job. Inline buffers point into the request frame;
 * fd buffers name a descriptor the request owns (borrowed by the engine
 * until the batch comes back). */
struct engine_buf {
    const uint8_t *data;
    uint64_t len;
    int fd; /* -1 for inline */
    uint64_t offset;
    uint64_t length; /* with has_length; else to the end of the file */
    bool has_length;
    /* Results. */
    int status; /* 0 or -VKS_E_BAD_FD (this buffer alone failed) */
    char msg[160];
    uint64_t bytes; /* bytes scanned */
};

/* Hits for one job: `buffer` indexes the job's buffers. Sorted by
 * (buffer, end, rule). */
struct engine_hit {
    uint32_t buffer;
    uint32_t rule;
    uint32_t count;
    uint64_t end;
};

struct engine_job {
    struct engine_job *next;   /* the batch's jobs */
    const struct catalog *cat; /* borrowed until the batch comes back */
    enum scan_mode mode;
    struct engine_buf *bufs;
    uint32_t n_bufs;
    /* Results, owned by the job (engine_job_finish). */
    struct engine_hit *hits;
    size_t n_hits;
    int status; /* 0, or the batch's error for this job */
    struct vks_error err;
};

/* What one batch cost; copied into every scan reply of the batch. */
struct engine_telemetry {
    bool gpu;
    uint64_t batch_id; /* sequence number: replies with equal ids shared a dispatch */
    uint32_t jobs;
    uint32_t buffers;
    uint64_t bytes;
    uint64_t fd_read_ns;          /* reading fd buffers on the worker */
    uint64_t scan_ns;             /* the dispatch (GPU) or the CPU scan */
    struct gpu_telemetry gpu_tel; /* zero on the CPU path */
};

struct engine_batch {
    struct engine_job *jobs;
    struct engine_telemetry tel;
    void *user;                /* the caller's */
    struct engine_batch *next; /* engine queues */
    void *loaded;              /* engine: descriptor buffers to release off its thread */
    size_t n_loaded;
};

struct engine_info {
    bool gpu;                        /* which back end runs */
    struct gpu_device_info device;   /* GPU path: the device in use */
    struct gpu_device_info *devices; /* every Vulkan device found (may be none) */
    uint32_t n_devices;
    uint32_t resident_catalogs;
    uint64_t device_memory_used;   /* resident device bytes after the last batch */
    uint64_t device_memory_budget; /* the engine's budget (configured or derived) */
};

struct engine;

/* Called on the loop thread for each finished batch, in completion order. */
typedef void (*engine_done_cb)(struct engine *eng, struct engine_batch *batch, void *ctx);

/* Called once on the loop thread when the worker has opened the device and
 * warmed the pipelines (status 0), or failed to (status < 0, `err` says why;
 * the engine then only accepts engine_close). */
typedef void (*engine_ready_cb)(struct engine *eng, int status, const struct vks_error *err,
                                void *ctx);

/*
 * Starts the worker thread, which opens the back end `cfg` asks for
 * (engine, device, device_budget) and warms it with a self-test scan whose
 * hits must equal the CPU scanner's. `ready` reports the outcome. Returns 0
 * or -ENOMEM / -errno (thread or async handle could not be created).
 */
int engine_create(uv_loop_t *loop, const struct daemon_config *cfg, engine_ready_cb ready,
                  engine_done_cb done, void *ctx, struct engine **out, struct vks_error *err);

/*
 * The store dropped the catalog with fingerprint `fp` for good (its last
 * tenant let it go): the worker frees its device copy before the next
 * batch. Loop thread only.
 */
void engine_forget(struct engine *e, const uint8_t fp[CATALOG_FP_LEN]);

/* Queues a batch for the worker. The batch and everything it points to are
 * borrowed until `done` hands it back. Loop thread. */
void engine_submit(struct engine *eng, struct engine_batch *batch);

/* Batches submitted and not yet handed back. */
uint32_t engine_pending(const struct engine *eng);

/* Whether the worker has a usable back end (after `ready` reported 0). */
bool engine_ready(const struct engine *eng);

/* Borrowed; valid until engine_close. Loop thread, after `ready`. */
const struct engine_info *engine_get_info(const struct engine *eng);

/* Stops the worker after the batches already submitted (their `done`
 * callbacks still run, from within this call), joins it and frees the engine
 * once the loop has closed its handle. NULL is allowed. */
void engine_close(struct engine *eng);

/* Frees a job's results. */
void engine_job_finish(struct engine_job *job);

#endif
