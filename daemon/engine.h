/*
 * The engine layer: scan batches handed over from the loop thread run on
 * engines that own threads of their own, with results coming back on the
 * loop thread through uv_async_send.
 *
 * Engines: one GPU engine per selected Vulkan device (gpu/gpu.h; `devices`
 * may name several, or one device twice), each with its own thread, and one
 * CPU engine: a pool of scanning threads (rules/cpuscan.h) that splits large
 * buffers into segments scanned in parallel. Every engine returns exactly
 * the hits refscan_buffer gives. `--engine auto` scans on the CPU engine
 * when the best Vulkan device is a CPU (lavapipe) or there is none, and on a
 * GPU places small batches on the CPU pool while its queue is short. A
 * batch is placed on the engine with the fewest bytes in flight. A batch the
 * GPU refuses for size (-E2BIG) or time (-ETIMEDOUT) is re-run on the CPU
 * engine, never skipped.
 *
 * Workers also read buffers passed as file descriptors (a memfd or an open
 * file), so no disk read ever runs on the loop thread. A sealed memfd
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

/* What names the bytes of a descriptor buffer without reading them: the
 * file (st_dev, st_ino), its size and times, and the range. Two buffers with
 * equal identities hold the same bytes, unless the file is written while it
 * is read, which no scan can guard against. */
struct engine_fid {
    uint64_t dev, ino, size;
    int64_t mtime_sec, mtime_nsec, ctime_sec, ctime_nsec;
    uint64_t offset, length;
};

struct engine_hit;
struct engine_telemetry;

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
    /* The engine's, set by engine_batch_load (zero when queued). A buffer it
     * does not scan takes its hits from an earlier buffer of the batch with
     * the same bytes (src_job indexes the batch's jobs in order) or from the
     * result cache (`pre`), when the batch is handed back. */
    struct engine_fid id; /* descriptor buffers: the file as it was read */
    bool has_id;
    bool skip;   /* not scanned */
    bool cached; /* hits from the result cache */
    uint32_t src_job, src_buf;
    struct engine_hit *pre;
    size_t n_pre;
    /* A descriptor buffer a GPU engine reads itself, straight into its
     * upload memory (data stays NULL until something else needs the bytes),
     * and the first errno that read met (-1: the file ended early; atomic,
     * the upload threads write it). */
    bool deferred;
    int read_err;
};

/* Hits for one job: `buffer` indexes the job's buffers. Sorted by
 * (buffer, end, rule). */
struct engine_hit {
    uint32_t buffer;
    uint32_t rule;
    uint32_t count;
    uint64_t end;
    /* Set when the batch is handed back (rules with flag L, or the job's
     * `starts`); zero-initialised hits have none. */
    uint64_t start;
    bool has_start;
};

struct engine_job {
    struct engine_job *next;   /* the batch's jobs */
    const struct catalog *cat; /* borrowed until the batch comes back */
    enum scan_mode mode;
    uint32_t max_hits; /* hits the reply can carry; 0: no limit. The engine keeps
                        * these and, for each buffer with more, one more (the
                        * first past the limit) so the reply can mark it truncated */
    struct engine_buf *bufs;
    uint32_t n_bufs;
    /* Results, owned by the job (engine_job_finish). */
    struct engine_hit *hits;
    size_t n_hits;
    uint64_t hits_dropped; /* found past max_hits and not kept */
    int cpu_retry; /* 0, or why the GPU gave the job to the CPU (-E2BIG, -ETIMEDOUT, -ENODEV) */
    int status;    /* 0, or the batch's error for this job */
    struct vks_error err;
    /* Set by the session: the tenant (result cache entries are its own) and
     * whether the request bypasses the result cache. */
    uint32_t uid;
    bool no_cache;
    bool starts; /* a start on every hit, not only on those of flag L rules */
    /* Results: buffers not scanned because an earlier buffer of the batch
     * had the same bytes, or the result cache had their hits, and their
     * bytes. */
    uint32_t deduplicated, cache_hits;
    uint64_t bytes_not_scanned;
    /* The server's: called on the loop thread with the job's results when
     * its batch comes back; NULL: a scan request's (session_scan_done). */
    void (*done)(struct engine_job *job, const struct engine_telemetry *tel);
};

/* What one batch cost; copied into every scan reply of the batch. */
struct engine_telemetry {
    bool gpu;             /* placed on a GPU engine */
    uint32_t engine;      /* index of the engine that ran it (engine_stats_add) */
    uint64_t wall_ns;     /* first start on an engine to done, CPU re-runs included */
    uint64_t idle_ns;     /* how long the engine sat idle before this batch */
    uint32_t segments;    /* CPU engine: pieces scanned */
    uint32_t cpu_retries; /* jobs the GPU gave to the CPU engine */
    uint64_t batch_id;    /* sequence number: replies with equal ids shared a dispatch */
    uint32_t jobs;
    uint32_t buffers;
    uint64_t bytes;
    uint64_t fd_read_ns;          /* reading fd buffers on the worker */
    uint64_t fd_upload_bytes;     /* fd bytes a GPU engine's upload threads read (deferred) */
    uint64_t worker_wait_ns;      /* GPU engine: its thread waited for work before taking it */
    bool loaded_ahead;            /* GPU engine: loaded while the batch before it uploaded */
    uint64_t scan_ns;             /* the dispatch (GPU) or the CPU scan */
    struct gpu_telemetry gpu_tel; /* zero on the CPU path */
};

struct engine_batch {
    struct engine_job *jobs;
    struct engine_telemetry tel;
    void *user; /* the caller's */
    /* The caller's, optional: called with the results settled on the thread
     * that finished the batch (an engine's; the loop thread for a batch
     * failed at submit), right before it is queued back to the loop. It
     * may read the jobs and the telemetry, and must neither free nor
     * change them: the loop's `done` still follows. */
    void (*finished)(struct engine_batch *batch);
    struct engine_batch *next; /* engine queues */
    void *loaded;              /* engine: descriptor buffers to release off its thread */
    size_t n_loaded;
    void *priv;         /* engine: its own state while the batch runs */
    uint32_t target;    /* engine: where it was placed */
    uint64_t bytes_est; /* engine: bytes in flight it counts */
    uint64_t submit_ns; /* engine: when it was queued */
    int state;          /* engine: CPU pool preparation */
};

struct engine_info {
    bool gpu;                        /* some GPU engine runs */
    struct gpu_device_info device;   /* GPU path: the first engine's device */
    struct gpu_device_info *devices; /* every Vulkan device found (may be none) */
    uint32_t n_devices;
    uint32_t resident_catalogs;    /* summed over GPU engines */
    uint64_t device_memory_used;   /* resident device bytes after the last batches, summed */
    uint64_t device_memory_budget; /* the engines' budgets (configured or derived), summed */
    uint32_t gpu_engines;          /* GPU engines running */
    uint32_t active_devices;       /* bit i: device index i runs a GPU engine */
    uint32_t cpu_threads;          /* the CPU engine's threads */
    /* How the start went, in ns (0 where the step did not run): opening
     * the first GPU engine (Vulkan instance, device, pipeline cache file),
     * listing the devices, and the GPU engines' self-test scans (which
     * create the common pipelines; with several engines, opening the
     * others too); set when `ready` reports. */
    uint64_t start_open_ns, start_list_ns, start_selftest_ns;
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

/*
 * Makes `cat` resident on every GPU engine, with what its scans set up
 * there on first use (literal tables, pipelines), by a scan of zero bytes
 * that each engine runs when it has no batch to run. `done(ctx)` runs on
 * the loop thread once every GPU engine is through with it (also when none
 * runs, or when engine_close stops the engines first; a failed warm-up is
 * logged and only leaves the work to the first scan). `cat` is borrowed
 * until `done`. Loop thread, after `ready` reported 0.
 */
void engine_warm(struct engine *e, const struct catalog *cat, void (*done)(void *ctx), void *ctx);

/* Queues a batch for the worker. The batch and everything it points to are
 * borrowed until `done` hands it back. Loop thread. */
void engine_submit(struct engine *eng, struct engine_batch *batch);

/* Batches submitted and not yet handed back. */
uint32_t engine_pending(const struct engine *eng);

/* Engines batches are placed on (GPU engines, plus the CPU engine unless
 * --engine gpu): the server keeps inflight-batches per engine in flight. */
uint32_t engine_count(const struct engine *eng);

struct stats_list;

/* Appends the per-engine stats (`engines`, `engine.N.*`: kind, device,
 * batches, bytes, busy_ns, busy_share, cpu_retries). Loop thread. */
void engine_stats_add(struct engine *eng, struct stats_list *l);

/* Appends a scan reply's engine telemetry keys (engine_index, wall_ns,
 * device_idle_ns, cpu_segments, cpu_retry, hits_dropped,
 * buffers_deduplicated, cache_hits, bytes_not_scanned). */
void engine_telemetry_add(struct stats_list *l, const struct engine_job *job,
                          const struct engine_telemetry *tel);

/* Whether the worker has a usable back end (after `ready` reported 0). */
bool engine_ready(const struct engine *eng);

/* Whether batches may be submitted: after `ready` reported 0, and before
 * it under --engine auto and cpu, where the CPU engine scans every batch
 * until the GPU engines have started (docs/daemon.md "Warm restart"). */
bool engine_serving(const struct engine *eng);

/* Borrowed; valid until engine_close. Loop thread; before `ready` it
 * holds the CPU engine alone (no devices, no GPU engine). */
const struct engine_info *engine_get_info(const struct engine *eng);

/* Stops the worker after the batches already submitted (their `done`
 * callbacks still run, from within this call), joins it and frees the engine
 * once the loop has closed its handle. NULL is allowed. */
void engine_close(struct engine *eng);

/* CPU work that is not a scan batch (a stream write, daemon/stream.c). */
struct engine_task {
    struct engine_task *next;           /* the engine's */
    void (*run)(struct engine_task *t); /* on a CPU engine thread; owns `t` from then on */
};

/*
 * Queues `t` (borrowed until `run` is called) for the CPU engine's threads,
 * first in first out. A thread with both tasks and batch work waiting
 * takes them in turn, so neither starves the other. Tasks still queued when
 * engine_close runs are run before its threads exit. Any thread.
 */
void engine_cpu_task(struct engine *eng, struct engine_task *t);

/* engine_cpu_task for the `n` tasks linked from `first` through `next`,
 * under one lock and one wake-up: a loop that hands out many tasks at once
 * spares a futex call per task. */
void engine_cpu_tasks(struct engine *eng, struct engine_task *first, uint32_t n);

/* Frees a job's results. */
void engine_job_finish(struct engine_job *job);

#endif
