/*
 * The engine layer's inside (engine.h is its interface): the state the
 * loop thread, the GPU workers (engine_gpu.c, engine_gpu_open.c) and the CPU pool
 * (engine_cpu.c) share, and the batch helpers all of them use (engine.c).
 *
 * Locking: one mutex (engine.mu) guards every queue and every field a thread
 * publishes for the others (marked "mu" below). A worker's gpu_engine and
 * gpu_result are its own; the loop thread never calls into gpu/, it reads
 * what the workers published, under the mutex.
 */
#ifndef VKS_DAEMON_ENGINE_INTERNAL_H
#define VKS_DAEMON_ENGINE_INTERNAL_H

#include <pthread.h>

#include "cpuscan.h"
#include "engine.h"
#include "rcache.h"

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

struct slot;

/* An engine_warm request, shared by the GPU engines. */
struct engine_warm {
    struct engine_warm *next; /* mu: engine.warm_head, then engine.warm_done */
    const struct catalog *cat;
    uint32_t todo; /* mu: bit i: GPU engine i has not taken it */
    uint32_t left; /* mu: GPU engines not through with it */
    void (*done)(void *ctx);
    void *ctx;
};

/* A batch a GPU worker submitted (gpu_batch_submit) and has not collected:
 * its gpu_batch, which the device reads until the collect, and where each
 * buffer's hits go. */
struct gpend {
    struct engine_batch *b;
    struct gpu_buffer *gb;
    struct slot *slots;
    const struct catalog *cats[GPU_MAX_BATCH_CATALOGS];
    struct gpu_batch batch;
    struct gpu_result res; /* kept between uses: its hit array is reused */
    uint64_t t1;           /* when it was loaded */
};

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
    char device[sizeof(((struct daemon_config *)0)->device)]; /* as configured, whole */
    char cache_path[CONFIG_PATH_MAX + 32];
    struct gpu_engine *gpu;
    struct gpu_result res;
    uint64_t last_done_ns;
    /* Batches on the device, oldest at pend_head (a ring); at most
     * inflight (inflight-batches) of them. */
    struct gpend pend[GPU_MAX_INFLIGHT];
    uint32_t pend_head, n_pend;
    bool reopen;        /* a batch failed the engine: re-create it once none is pending */
    uint64_t waited_ns; /* waiting for work since the last batch was taken */
    uint64_t busy_base; /* device busy time of the engines re-created since */

    /* Published, mu. */
    bool alive; /* written under mu, read by place() without it (atomic) */
    struct gpu_device_info dev;
    uint64_t budget;
    uint32_t resident;
    uint64_t device_used;
    uint64_t batches, bytes, busy_ns, retries;
    uint64_t reopens;      /* re-created after a device failure (__atomic) */
    uint64_t refusals;     /* batches whose kernel the driver refused (worker thread) */
    uint32_t max_inflight; /* most batches on the device at once */

    /* Loop thread. */
    uint64_t inflight_bytes;
};

struct engine {
    uv_loop_t *loop;
    uv_async_t async;
    pthread_mutex_t mu;
    struct engine_batch *done_head, *done_tail; /* mu: workers -> loop */
    struct engine_warm *warm_head, *warm_done;  /* mu: engine_warm's, to the workers and back */
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
    uint32_t inflight;    /* inflight-batches: batches on each GPU device at once */
    uint64_t warm_bytes;  /* warm-bytes: each GPU engine's batch buffers set up at its start */
    uint64_t batch_bytes; /* batch-max-bytes: the GPU engines' batch_bytes_hint */
    uint64_t budget;
    char device[sizeof(((struct daemon_config *)0)->device)];
    char devices[sizeof(((struct daemon_config *)0)->devices)];
    char state_dir[CONFIG_PATH_MAX];

    /* The setup thread opens the GPU engines and starts their workers. */
    uv_thread_t setup;
    bool setup_started;
    struct gworker gw[MAX_GPU_ENGINES];
    uint32_t n_gpu;                                    /* mu until open_done; fixed after */
    struct gpu_device_info devices_found[MAX_DEVICES]; /* setup thread, then read-only */
    uint32_t n_devices_found;
    int open_status;
    struct vks_error open_err;
    uint64_t t_open, t_list, t_selftest; /* setup thread until open_done (engine_info) */
    bool open_done, open_reported;       /* mu */

    /* The CPU pool. */
    uv_thread_t *cpu; /* room for n_cpu + 1 when cpu_spare */
    /* Threads scanning. The setup thread may add one (cpu_spare), so n_cpu
     * is read with __atomic_load_n outside the setup thread. */
    uint32_t n_cpu, n_cpu_started;
    /* --engine auto without cpu-threads leaves a core to the GPU engine's
     * thread; when no GPU engine starts, the setup thread starts a thread
     * on that core too, so the CPU engine has every core. */
    bool cpu_spare;
    pthread_cond_t cpu_cond;
    /* Spinning (engine_cpu.c cpu_spin): one thread that runs out of work
     * watches cpu_gen, bumped by every push (atomic), for cpu_spin_ns
     * before it sleeps; while it does (cpu_spinning, mu) the first single
     * push signals no one and clears it. cpu_spin_hits (mu): spins that
     * found work. */
    uint64_t cpu_gen, cpu_spin_ns, cpu_spin_hits;
    bool cpu_spinning;
    struct engine_batch *cpu_head, *cpu_tail; /* mu: batches with work to hand out */
    uint64_t cpu_oldest_ns; /* atomic, written under mu: cpu_head's submit_ns, 0 when
                             * empty (the loop's place() reads it without mu) */
    /* mu: threads on a task of a large batch; with two threads or more, one
     * is kept for small batches (engine_cpu.c, cpu_take) */
    uint32_t cpu_large_running;
    struct engine_task *task_head, *task_tail;                 /* mu: engine_cpu_task's queue */
    uint64_t cpu_batches, cpu_bytes, cpu_busy_ns, cpu_retries; /* mu */
    uint64_t cpu_inflight_bytes;                               /* loop thread */
    uint64_t dedup_buffers, dedup_bytes;                       /* mu */
    uint64_t cache_bytes_saved;                                /* mu */
    struct rcache *rc; /* the result cache (NULL: off); its own lock */
    /* How GPU engines take descriptor buffers (read-only after create;
     * $VKSCAND_FD_UPLOAD, docs/daemon.md): FD_AUTO (the default) and
     * FD_PREAD have the upload threads pread every descriptor straight
     * into upload memory; FD_MAP maps memfds sealed against shrinking at
     * load and copies them at upload (the default before session 28),
     * FD_POPULATE the same with MAP_POPULATE, for comparison. */
    int fd_upload;

    /* Loop thread. */
    uint32_t rr; /* where the next tie-break starts */
    struct engine_info info;
    char keys[MAX_GPU_ENGINES + 1][9][40]; /* engine.N.* stats keys */

    engine_ready_cb ready_cb;
    engine_done_cb done_cb;
    void *ctx;
};

enum { FD_AUTO = 0, FD_PREAD, FD_MAP, FD_POPULATE };

/* Memory a fd buffer was read into: a mapping or a heap copy. */
struct loaded {
    void *map; /* a sealed memfd's mapping, or a large read's huge-page memory */
    size_t map_len;
    void *heap;
};

/* A CPU task: the end offsets (lo, hi] of one buffer of one job. */
struct ctask {
    uint32_t job, buf;
    uint64_t lo, hi;
    enum cpuscan_groups groups; /* CPUSCAN_UNBOUNDED: a split buffer's whole-buffer task */
    bool piece;                 /* ... or one of its pieces (cpuscan_unbounded_piece) */
    uint64_t limit;             /* set when handed out */
    uint64_t published;         /* atomic: plain hits it will keep at least (cpuscan_enough_fn) */
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
    int64_t start_real_ns; /* CLOCK_REALTIME at load: the racy-clean test */
    /* Set by a GPU engine before the load: descriptor buffers that need no
     * host pass (engine_buf.deferred) are read by its upload threads. */
    bool defer;
    bool defer_sealed;   /* sealed memfds too (else they are mapped) */
    bool populate;       /* mapped sealed memfds are populated ahead (MAP_POPULATE) */
    struct ctask *tasks; /* CPU engine */
    uint32_t n_tasks, next_task, done_tasks;
    struct jstate *js;
};

/* Monotonic clock in ns. */
uint64_t engine_now_ns(void);

/* Reads the batch's descriptor buffers and fills the byte counts. Runs once
 * per batch, on the first engine that takes it. A descriptor buffer with
 * the same identity (engine_fid), catalog and mode as an earlier one of the
 * batch is not read or scanned (engine_buf.skip): engine_batch_post gives
 * it the earlier one's hits. Engines scan only buffers with status 0 and
 * skip unset. */
void engine_batch_load(struct engine *e, struct engine_batch *b);

/* gpu_read_fn of a deferred buffer (`ctx` is its engine_buf): pread of
 * [off, off + len) of its range. A failure is kept in read_err (the first
 * one wins) and returned as a negative errno. Upload threads. */
int engine_buf_read(void *ctx, uint8_t *dst, uint64_t off, size_t len);

/* Reads the deferred buffers of the batch's jobs that are to re-run on the
 * CPU engine (cpu_retry set), which scans bytes in memory; a buffer that
 * cannot be read fails alone (BAD_FD). */
void engine_batch_fetch(struct engine *e, struct engine_batch *b);

/* Fails the deferred buffers whose read failed (BAD_FD, with the reason)
 * after their batch ran: their hits were dropped when collected. */
void engine_batch_read_errors(struct engine_batch *b);

/* Frees the batch's private state and queues it for the loop thread. */
void engine_batch_post(struct engine *e, struct engine_batch *b);

/* Fails a job: drops its hits, sets status and message. */
void engine_job_fail(struct engine_job *j, int code, const char *msg);

/* Appends a hit to the job (`*cap` is its array's size); 0 or -ENOMEM. */
int engine_job_push_hit(struct engine_job *j, size_t *cap, uint32_t buffer, uint32_t rule,
                        uint32_t count, uint64_t end);

/* The job's max_hits, UINT64_MAX for none. */
uint64_t engine_job_budget(const struct engine_job *j);

/* engine_cpu.c: queues a batch for the CPU pool (placed there, or given back
 * by a GPU engine with jobs to re-run); the pool threads' main. */
void engine_cpu_push(struct engine *e, struct engine_batch *b);
void engine_cpu_main(void *arg);

/* engine_gpu_open.c: the setup thread's main (opens the GPU engines,
 * starts their workers, reports readiness), and the `devices` parser: the
 * count, or -EINVAL with `err` set. */
void engine_gpu_setup(void *arg);
int engine_devices_parse(const char *s, uint32_t *idx, uint32_t cap, bool *all,
                         struct vks_error *err);

/* engine_gpu_open.c: opens (or re-opens) worker w's gpu_engine, warm-up
 * self-test included; and the warm-ups an idle worker runs: the oldest
 * catalog warm-up still to do on engine i (NULL: none), a catalog made
 * resident with its pipelines, a warm-up handed on once every engine did
 * it, and the batch buffers of `warm-bytes`. */
int engine_gpu_open(struct engine *e, struct gworker *w, struct vks_error *err);
struct engine_warm *engine_gpu_warm_for(const struct engine *e, uint32_t i);
void engine_gpu_warm_catalog(struct gworker *w, const struct catalog *cat);
void engine_gpu_warm_through(struct engine *e, struct engine_warm *r);
void engine_gpu_warm_frames(struct gworker *w);

/* engine_gpu.c: a GPU worker thread's main (arg: its struct gworker). */
void engine_gpu_main(void *arg);

#endif
