/*
 * The GPU engine: scans batches of buffers against packed catalogs
 * (rules/catalog.h) with one Vulkan compute megakernel (shaders/scan.comp).
 *
 * This header is the whole interface of gpu/: nothing outside gpu/ includes
 * vulkan.h. docs/gpu.md describes the design (batch layout, segments, the hit
 * ring, telemetry, limits).
 *
 * Threads: an engine is used by one thread at a time (the daemon's GPU
 * worker). Different engines are independent. gpu_device_list may be called
 * from any thread.
 *
 * Results are exact: for every buffer, the hits equal what refscan_buffer
 * returns for the same catalog, buffer and report mode.
 */
#ifndef VKS_GPU_GPU_H
#define VKS_GPU_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "error.h"
#include "refscan.h"

enum gpu_device_type {
    GPU_DEVICE_OTHER = 0,
    GPU_DEVICE_INTEGRATED = 1,
    GPU_DEVICE_DISCRETE = 2,
    GPU_DEVICE_VIRTUAL = 3,
    GPU_DEVICE_CPU = 4,
};

enum gpu_hit_writer {
    GPU_HITS_AUTO = 0,     /* subgroup when the device has ballot + arithmetic */
    GPU_HITS_SCALAR = 1,   /* one atomic per hit */
    GPU_HITS_SUBGROUP = 2, /* one atomic per subgroup and accepting step */
};

#define GPU_MAX_HEAPS             16u
#define GPU_MAX_BATCH_CATALOGS    8u
#define GPU_PIPELINE_LRU          32u
#define GPU_DEFAULT_TIMEOUT_MS    30000u
#define GPU_SPEC_LOOKBACK         1024u
#define GPU_CONFIRM_CAP           65536u
#define GPU_MAX_RESIDENT_CATALOGS 64u
#define GPU_MAX_INFLIGHT          16u
/* Bounded DFA groups of a catalog one pass steps together (scan.comp FUSED) */
#define GPU_FUSE_MAX 4u
/* The default upload threads' cap: on the H200 host (16 cores) 16 threads
 * filled 1 GiB of staging from the page cache in 30 ms against 41 ms for 8
 * (docs/PERFORMANCE.md, session 12). */
#define GPU_UPLOAD_THREADS_MAX 16u
#define GPU_DEFAULT_INFLIGHT   2u

struct gpu_heap_info {
    uint64_t size;
    uint64_t budget; /* VK_EXT_memory_budget, or size when the device lacks it */
    uint64_t usage;  /* likewise, 0 without the extension */
    bool device_local;
};

struct gpu_device_info {
    uint32_t index; /* in Vulkan's enumeration order */
    char name[256];
    enum gpu_device_type type;
    char driver[256]; /* driver name and info, e.g. "llvmpipe Mesa 22.3.6" */
    uint32_t vendor_id;
    uint32_t device_id;
    uint32_t api_version;
    uint32_t subgroup_size;
    uint32_t subgroup_ops; /* VkSubgroupFeatureFlags in the compute stage */
    bool subgroup_hits;    /* ballot + arithmetic: the subgroup hit writer works */
    bool memory_budget;    /* VK_EXT_memory_budget present */
    bool timestamps;       /* compute queue has timestamps */
    uint32_t n_heaps;
    struct gpu_heap_info heaps[GPU_MAX_HEAPS];
    uint32_t max_workgroup_size;
    uint32_t max_shared_bytes;
    uint64_t max_storage_range;
    uint32_t sm_count;     /* VK_NV_shader_sm_builtins, else 0 */
    uint32_t warps_per_sm; /* likewise */
    uint32_t loop_budget;  /* loop iterations per invocation the driver runs; ~0u if unbounded */
};

/*
 * Lists the Vulkan devices of this host into `out` (at most `cap`) and sets
 * `*n` to how many exist. Returns 0, -ENODEV when Vulkan has no device (or
 * no loader/driver), -ENOMEM; fills `err`.
 */
int gpu_device_list(struct gpu_device_info *out, uint32_t cap, uint32_t *n, struct vks_error *err);

struct gpu_options {
    /* NULL or "": the best device (discrete > integrated > virtual > CPU).
     * Decimal digits: that index. Otherwise a case-insensitive substring of
     * the device name. */
    const char *device;
    /* Device-memory budget in bytes; 0: 90% of the device-local heap's
     * budget. Everything the engine allocates on the device counts. */
    uint64_t memory_budget;
    /* VkPipelineCache file: loaded at create, saved at destroy. NULL: none. */
    const char *pipeline_cache_path;
    uint32_t timeout_ms; /* per-batch fence wait; 0: GPU_DEFAULT_TIMEOUT_MS */
    uint32_t timeout_us; /* when non-zero, overrides timeout_ms (tests) */
    enum gpu_hit_writer hit_writer;
    uint32_t hit_capacity;  /* initial hit ring size in hits; 0: 65536 */
    uint32_t segment_bytes; /* 0: chosen per batch by the launch policy */
    uint32_t chain_bytes;   /* bytes of an unbounded walk per round; 0: the device's */
    /* Unbounded DFA groups are walked in segments that each guess their
     * start state from this many bytes before them (docs/gpu.md,
     * "Unbounded groups in parallel"); 0: GPU_SPEC_LOOKBACK; UINT32_MAX:
     * never, each buffer is walked whole in chained rounds. */
    uint32_t spec_lookback;
    /* Bytes a forward confirmation (CAT_GF_CONFIRM) item walks past its
     * starts on the device before the host finishes a walk still alive
     * there (docs/engine.md); 0: GPU_CONFIRM_CAP. */
    uint32_t confirm_cap;
    /* Bounded gated bit-NFA groups are walked in windows of ends around
     * their factors even when the catalog gives their lead (measurements:
     * by default they are confirmed forward, docs/engine.md). */
    bool gate_windows;
    uint32_t workgroup_size; /* 0: chosen by the launch policy */
    uint32_t max_workgroups; /* per launch; 0: chosen by the launch policy */
    /* Host threads copying into staging (and finishing hits); 0: one per
     * core, at most GPU_UPLOAD_THREADS_MAX. */
    uint32_t upload_threads;
    /* Raw hits (or factor ends of the factor pass) at which a batch's hits
     * (its ends) are sorted on those threads (gpu/hits.c) instead of the
     * collecting one; 0: 65536. */
    uint32_t hits_parallel_min;
    /* Wrong speculative guesses re-walked by one task of those threads at
     * the least (gpu/repair.c); 0: 16. */
    uint32_t spec_slice_jobs;
    /* Batches whose buffers all report per rule (modes count and first)
     * and whose device hits cannot repeat a (rule, end) (only literal and
     * bounded DFA ranges, and no rule id shared where that could repeat
     * one: gpu/plan.c hits_unique) are finished by counting per (buffer,
     * rule) on those threads, without the sort (gpu/hits.c); 0 so, -1:
     * always the sort. */
    int32_t count_direct;
    /* Buffers in modes count and first are counted per (buffer, rule) on
     * the device by the ranges that cannot repeat a (rule, end), those
     * hits never written to the ring (docs/gpu.md "Counting on the
     * device"): 0 when the batch's such buffers hold GPU_COUNT_DEVICE_MIN
     * bytes or more (and only buffers of 16 bytes a table word), 1
     * always, -1 never. */
    int32_t count_device;
    uint32_t upload_chunk; /* staging bytes per copy submit; 0: max(16 MiB, size / 64) */
    /* The largest haystack the caller forms batches of (vkscand:
     * batch-max-bytes); 0: none. A frame's haystack and staging that must
     * grow for a batch of a quarter of it or more grow to it at once
     * (docs/gpu.md "Batch buffers"), instead of once per larger batch;
     * not on a CPU device, unless staged_upload. */
    uint64_t batch_bytes_hint;
    /* Where the factor ends of gated bit-NFA groups are found (docs/gpu.md,
     * "The factor pass"): 0 on the device for a catalog whose buffers in
     * the batch hold GPU_FACTOR_PASS_MIN bytes or more (or whose bytes
     * are read by callback), else on the host; 1 always on the device; -1
     * always on the host (then buffers of such catalogs need their data). */
    int32_t factor_pass;
    bool staged_upload; /* tests: go through staging also where device memory is mapped */
    /* Benchmarks: a barrier and a timestamp after each of a pass's first
     * GPU_PROF_RANGES dispatches, so that gpu_telemetry.prof_ns says which
     * kind of dispatch the device time went to. Serialises dispatches that
     * would overlap: slower, for finding where time goes only. */
    bool profile;
    /* Benchmarks: barriers between the dispatches of one round, which are
     * independent: 0 none (they may overlap), 1 after every dispatch, 2
     * where the kind changes (DFA, factor, gated NFA, other NFA, literal).
     * On a warm H200 (docs/PERFORMANCE.md, session 17) 2 changed nothing
     * for gitleaks-regex and cost regex-500-secrets 3%; 1 cost regex-500
     * two thirds and gitleaks-regex a fifth. */
    uint32_t serialize;
    /* The literal kernel (docs/gpu.md) for DFA groups of plain strings:
     * 0 where it saves passes or memory traffic (a catalog with 2 or more
     * such groups, or one with over 8 MiB of DFA rows), 1 for every such
     * group, -1 never (each keeps its DFA pass). */
    int32_t lit_kernel;
    /* Batches on the device at once (gpu_batch_submit); each has its own
     * buffers. 0: GPU_DEFAULT_INFLIGHT; at most GPU_MAX_INFLIGHT. */
    uint32_t inflight;
    /* Bounded DFA groups of one catalog stepped together in one pass over
     * their shared items, each byte read once for all of them (docs/gpu.md,
     * "Fused DFA groups"): 0 up to GPU_FUSE_MAX, 1 each group its own pass,
     * else at most that many (capped at GPU_FUSE_MAX). */
    uint32_t fuse_groups;
};

/*
 * Reads bytes [off, off + len) of a buffer whose bytes are not in memory
 * into `dst` (staging or mapped device memory). Called on the upload
 * threads, several at once for disjoint ranges of one buffer, between
 * gpu_batch_submit's start and its return. Returns 0, or a negative errno:
 * the range is then zero-filled and the batch runs on; the callback keeps
 * its own record of the failure, and the caller discards that buffer's hits.
 */
typedef int (*gpu_read_fn)(void *ctx, uint8_t *dst, uint64_t off, size_t len);

/* One buffer of a batch. `data` is borrowed for the call. A buffer with
 * `read` set and `data` NULL is read by `read(read_ctx, ...)` straight into
 * the upload memory (one pass from the page cache, docs/gpu.md "Upload");
 * its catalog must have no CAT_GF_FACTOR group, whose factor ends the plan
 * finds by walking the bytes on the host. */
struct gpu_buffer {
    const uint8_t *data;
    size_t len;
    uint64_t id;         /* the caller's, echoed in no result: results index buffers */
    enum scan_mode mode; /* SCAN_ALL, SCAN_FIRST or SCAN_COUNT */
    uint32_t catalog;    /* index into gpu_batch.catalogs */
    gpu_read_fn read;    /* NULL: the bytes are `data` */
    void *read_ctx;      /* borrowed for the call */
};

struct gpu_batch {
    const struct catalog *const *catalogs; /* borrowed, at most GPU_MAX_BATCH_CATALOGS */
    uint32_t n_catalogs;
    const struct gpu_buffer *buffers; /* borrowed */
    uint32_t n_buffers;
};

/* A final hit: as refscan's struct scan_hit, plus the buffer's batch index. */
struct gpu_hit {
    uint32_t buffer;
    uint32_t rule;
    uint32_t count;
    uint64_t end;
};

#define GPU_FACTOR_PASS_MIN  (4u << 20)
#define GPU_COUNT_DEVICE_MIN (1u << 20)

/* Kinds of dispatch gpu_options.profile times: DFA groups (plain and
 * speculative), the factor pass, gated bit-NFA windows and forward
 * confirmations, other bit-NFA groups, the literal kernel. */
enum { GPU_PROF_DFA, GPU_PROF_FACTOR, GPU_PROF_GATED, GPU_PROF_NFA, GPU_PROF_LIT, GPU_PROF_KINDS };
#define GPU_PROF_RANGES 510u

struct gpu_telemetry {
    uint64_t bytes_uploaded;          /* everything host -> device */
    uint64_t haystack_bytes_uploaded; /* buffer bytes (with alignment padding) */
    uint64_t catalog_bytes_uploaded;
    uint64_t meta_bytes_uploaded;  /* buffer table + work items */
    uint64_t bytes_read_back;      /* queue state + the used prefix of the hit ring */
    uint64_t bytes_moved;          /* uploaded + read back */
    uint32_t resident_allocations; /* live memory allocations after the call */
    uint64_t resident_bytes;       /* their size, host-visible staging included */
    uint64_t device_bytes;         /* of which device-local: what the budget limits */
    uint32_t resident_catalogs;
    uint32_t kernel_launches;
    uint32_t lit_groups; /* DFA groups the literal kernel scanned instead, all catalogs */
    /* DFA groups stepped in the pass of another (gpu_options.fuse_groups):
     * passes over the data saved, all catalogs */
    uint32_t fused_groups;
    uint32_t submits;
    uint32_t sync_points;         /* host waits on the device */
    uint32_t pipeline_cache_hits; /* pipelines found in the LRU */
    uint32_t pipeline_compiles;
    uint32_t catalog_cache_hits; /* batch catalogs already resident */
    uint32_t catalog_uploads;
    uint32_t catalog_evictions;
    bool plan_cache_hit;
    enum gpu_hit_writer hit_writer;
    uint32_t workgroup_size;
    uint32_t workgroups;    /* per launch, largest */
    uint32_t segment_bytes; /* chosen segment size */
    uint32_t rounds;        /* chained rounds for unbounded groups */
    uint64_t items_total;
    uint64_t items_processed;
    uint64_t items_remaining; /* after the first pass; re-launched until 0 */
    double occupancy;         /* workers that claimed an item / workers launched */
    uint64_t hits_raw;        /* raw matches found (hit head) */
    uint64_t hit_capacity;    /* ring size of the final pass */
    uint32_t hit_reruns;      /* passes re-run because the ring overflowed */
    /* discrete devices: passes whose hits were more than their command
     * buffer copied back (a guess from the last pass's rate), copied by a
     * submit and wait of their own */
    uint32_t hit_copy_submits;
    /* Batches vkscand ran one scan in because its buffers together were over
     * one batch's limits (daemon/engine_gpu.c run_gpu_slices); 0: one batch.
     * Set by the daemon, summed by gpu_telemetry_add. */
    uint32_t slices;
    uint32_t cut_reruns;      /* batches re-planned smaller because the driver cut a loop */
    uint64_t spec_items;      /* speculative segments of unbounded DFA groups */
    uint64_t spec_fixes;      /* of which the guessed start state was wrong: re-walked */
    uint64_t spec_fix_bytes;  /* bytes the host re-walked for them */
    uint64_t spec_fix_ns;     /* wall time of those walks (part of readback_ns) */
    uint64_t confirm_host;    /* confirmation items alive at their cap: finished on the host */
    uint64_t confirm_host_ns; /* wall time of those host walks (part of readback_ns) */
    uint64_t plan_ns;         /* checks, launch policy, work items, pipelines */
    /* its parts: the gated groups' items made on the upload threads
     * (gpu/plan.c plan_pre), the pipelines picked, and the run starts of
     * buffers read at upload read back from their files (plan_runs) */
    uint64_t plan_pre_ns, plan_pick_ns, plan_runs_ns;
    uint64_t buffers_made_ns;    /* batch buffers made (or grown) for this batch: wall time */
    uint64_t buffers_made_bytes; /* and their bytes */
    uint64_t upload_ns;          /* host side: staging filled and every chunk submitted */
    uint64_t kernel_ns;    /* GPU timestamps around the dispatches, after the copies, all passes */
    uint64_t device_ns;    /* host wall time from the last submit to its fence, all passes */
    uint64_t readback_ns;  /* queue state and the hit prefix read, host repairs */
    uint64_t finalize_ns;  /* hits sorted by buffer, copies dropped, report modes applied */
    uint64_t hits_counted; /* raw hits finished by counting per rule (no sort), else 0 */
    uint64_t hits_device_counted; /* hits counted on the device, never in the ring */
    /* passes run again because a speculative range that counted on the
     * device guessed a segment's state wrong (docs/gpu.md) */
    uint32_t spec_count_reruns;
    /* The factor pass (gated catalogs' factor ends found on the device, before
     * the pass that runs their gated groups): its wall time from plan to
     * sorted ends, and the ends it found. Its kernel and device time are in
     * kernel_ns and device_ns as well. */
    uint64_t factor_ns;
    uint64_t factor_ends;
    /* its parts: the plan, limits and residency to the upload's start; the
     * haystack's upload and the submit; the wait for the pass (a re-run
     * after a full ring counts in it); the ends' readback (copied to host
     * memory where the pass's own copy did not hold them all); their sort
     * into the gate lists */
    uint64_t factor_plan_ns, factor_upload_ns, factor_wait_ns, factor_read_ns, factor_sort_ns;
    uint64_t total_ns; /* host time in the submit and collect calls */
    uint64_t wall_ns;  /* from the submit call's start to the collect call's end */
    /* How long the device had none of this engine's work before this
     * batch's pass was submitted (0 when another batch was still on it);
     * as the host sees it: a fence is seen signalled when it is waited for. */
    uint64_t device_idle_ns;
    uint32_t inflight; /* batches on the device right after this one's submit, itself included */
    /* 1 when the batch before it was collected while this one's upload ran
     * on the upload threads (gpu_batch_begin .. gpu_batch_end); summed by
     * gpu_telemetry_add: batches so overlapped */
    uint32_t collect_overlapped;
    /* gpu_options.profile: device time and dispatches by kind, all passes */
    uint64_t prof_ns[GPU_PROF_KINDS];
    uint32_t prof_dispatches[GPU_PROF_KINDS];
};

struct gpu_result {
    struct gpu_hit *hits; /* sorted by (buffer, end, rule) */
    size_t n_hits;
    size_t cap;
    struct gpu_telemetry tel;
};

struct gpu_engine;

/* An engine's counters since it was created. */
struct gpu_engine_stats {
    uint64_t batches;      /* collected */
    uint32_t max_inflight; /* most batches on the device at once */
    uint64_t busy_ns;      /* time with at least one pass on the device */
    uint64_t idle_ns;      /* time between passes with none (before the first: not counted) */
    uint64_t collects_overlapped; /* collects run while a begun batch's upload ran */
};

/*
 * Opens the device `opt` names (NULL: defaults), creates the pipeline cache
 * and the buffers every batch reuses. Returns 0, -ENODEV (no such device),
 * -ENOMEM, -EIO (a Vulkan call failed); fills `err`. On success `*out` is
 * owned by the caller (gpu_engine_destroy).
 */
int gpu_engine_create(const struct gpu_options *opt, struct gpu_engine **out,
                      struct vks_error *err);

/* Waits for the device, saves the pipeline cache, frees everything. NULL and
 * engines whose last batch failed (timeout, device lost) are allowed. */
void gpu_engine_destroy(struct gpu_engine *eng);

/* The engine's device (borrowed, valid until destroy). */
const struct gpu_device_info *gpu_engine_device(const struct gpu_engine *eng);

/* gpu_device_list through the engine's Vulkan instance: the same list
 * without a second instance (vkscand's start: 50-70 ms less on lavapipe).
 * Same thread rules as gpu_batch_dispatch. */
int gpu_engine_list_devices(const struct gpu_engine *eng, struct gpu_device_info *out, uint32_t cap,
                            uint32_t *n, struct vks_error *err);

/*
 * Scans `batch` and fills `res` (its hits array is reused and grown; zero it
 * before the first call, gpu_result_finish frees it). Catalogs are borrowed
 * for the call and kept resident on the device by fingerprint afterwards.
 * Checks every limit (device-memory budget, buffer sizes, u32 ranges) before
 * any device work. Errors: -EINVAL (bad batch), -E2BIG (batch over a device
 * limit or the memory budget; the message has requested and available
 * bytes), -ENOMEM, -ETIMEDOUT (the fence wait passed the timeout),
 * -ENODEV (device lost), -EIO (other Vulkan failures, or a shader loop cut
 * short by the driver), -EBUSY (batches of gpu_batch_submit are in flight:
 * collect them first). After -ETIMEDOUT or -ENODEV the engine only accepts
 * gpu_engine_destroy.
 */
int gpu_batch_dispatch(struct gpu_engine *eng, const struct gpu_batch *batch,
                       struct gpu_result *res, struct vks_error *err);

/*
 * The pipelined form of gpu_batch_dispatch. gpu_batch_submit checks, plans,
 * uploads and submits `batch` and returns without waiting for the device;
 * gpu_batch_collect waits for the oldest batch submitted and not yet
 * collected, reads its hits back into the gpu_result given at its submit
 * and sets `*res` to that result. While one batch runs on the device, the
 * caller submits the next (its upload overlaps the kernel) and collects
 * the one before (its readback overlaps too). Batches run in submission
 * order on one queue.
 *
 * gpu_batch_submit: `batch`, everything it points to (catalogs, buffer
 * data) and `res` are borrowed until the batch is collected (or the engine
 * destroyed). Errors as gpu_batch_dispatch, and -EBUSY when opt.inflight
 * batches are already submitted (collect one first). On an error nothing of
 * the batch is on the device and it is not collected.
 *
 * gpu_batch_collect: returns the batch's status (errors as
 * gpu_batch_dispatch; its `res` has no hits on error), or -ENOENT when no
 * batch is in flight. After a timeout or a lost device the batches still in
 * flight are collected with -ENODEV, and the engine then only accepts
 * gpu_engine_destroy (which waits for the device, also with batches never
 * collected).
 */
int gpu_batch_submit(struct gpu_engine *eng, const struct gpu_batch *batch, struct gpu_result *res,
                     struct vks_error *err);
int gpu_batch_collect(struct gpu_engine *eng, struct gpu_result **res, struct vks_error *err);

/*
 * gpu_batch_submit in two halves, so that the caller can collect (and use)
 * an older batch while this one's bytes are copied to the device
 * (docs/gpu.md "Batches in flight"). gpu_batch_begin checks and plans
 * `batch`, makes its catalogs resident and starts its upload on the upload
 * threads, and returns without waiting for it; gpu_batch_end takes part in
 * what is left of the upload, records the pass and submits it. In between
 * the caller may call gpu_batch_collect (`collect_overlapped` in the begun
 * batch's telemetry), gpu_batch_upload_help and gpu_batch_oldest_done, and
 * nothing else of the engine. A factor pass (docs/gpu.md) runs whole in
 * gpu_batch_begin: such a batch has nothing left to overlap.
 *
 * gpu_batch_begin: borrows as gpu_batch_submit; errors as
 * gpu_batch_submit, and -EBUSY when a batch is begun already. On an error
 * nothing is begun and `res` holds the telemetry. gpu_batch_end: returns
 * gpu_batch_submit's status for the begun batch (-ENOENT when none); on an
 * error nothing of it is on the device, it is not collected, and its `res`
 * holds the telemetry. Every begun batch must be ended before the next
 * begin, submit, dispatch or gpu_engine_destroy. Engine thread only.
 */
int gpu_batch_begin(struct gpu_engine *eng, const struct gpu_batch *batch, struct gpu_result *res,
                    struct vks_error *err);
int gpu_batch_end(struct gpu_engine *eng, struct vks_error *err);

/* Copies one piece of the begun batch's upload on the calling thread;
 * false when no piece was left to hand out (or no batch is begun). */
bool gpu_batch_upload_help(struct gpu_engine *eng);

/* Whether the oldest batch in flight has finished on the device, so that
 * collecting it waits for no device work of its own (a pass re-run for a
 * full hit ring excepted). False when none is in flight. */
bool gpu_batch_oldest_done(const struct gpu_engine *eng);

/* Batches submitted and not yet collected. */
uint32_t gpu_engine_inflight(const struct gpu_engine *eng);

/* Batches the engine holds on the device at once (its opt.inflight). */
uint32_t gpu_engine_max_inflight(const struct gpu_engine *eng);

/* Copies the engine's counters into `out`. */
void gpu_engine_stats(const struct gpu_engine *eng, struct gpu_engine_stats *out);

void gpu_result_finish(struct gpu_result *res);

/* Adds the telemetry of one more dispatch of the same batch (a batch split
 * because it did not fit the device) to `sum`: counters and times add up,
 * workgroups, hit_capacity and inflight take the larger, and what describes
 * the engine's state or choices (resident memory, writer, sizes, occupancy)
 * is `part`'s, the later one's. */
void gpu_telemetry_add(struct gpu_telemetry *sum, const struct gpu_telemetry *part);

/* Number of catalogs resident on the device now. */
uint32_t gpu_engine_resident_catalogs(const struct gpu_engine *eng);

/*
 * Frees the device copy of the catalog with fingerprint `fp` when it is
 * resident (its last user dropped it), instead of leaving it until LRU
 * eviction. Returns true when one was freed, or will be when the batches
 * in flight that scan it are collected. Same thread rules as
 * gpu_batch_dispatch; allowed between a submit and its collect.
 */
bool gpu_engine_forget(struct gpu_engine *eng, const uint8_t fp[CATALOG_FP_LEN]);

#endif
