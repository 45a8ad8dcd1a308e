/*
 * The engines (engine.h): what the loop thread does (placement, hand-back,
 * stats, create and close) and the batch helpers every engine uses. The GPU
 * workers are engine_gpu.c (their start and warm-ups engine_gpu_open.c),
 * the CPU pool engine_cpu.c; engine_internal.h holds what they share.
 */
#include "engine_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "som.h"
#include "stats.h"
#include "vkscan/errors.h"

uint64_t engine_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- fd buffers ------------------------------------------------------- */

static int bad_fd(struct engine_buf *b, const char *fmt, const char *what)
{
    b->status = -VKS_E_BAD_FD;
    snprintf(b->msg, sizeof(b->msg), fmt, what);
    return b->status;
}

/* One thread's share of a descriptor read. */
struct read_part {
    int fd;
    uint8_t *dst;
    uint64_t off, len;
    int err; /* 0, an errno, or -1: end of file before len */
};

static void *read_part_run(void *arg)
{
    struct read_part *p = arg;
    uint64_t got = 0;
    while (got < p->len) {
        ssize_t n = pread(p->fd, p->dst + got, (size_t)(p->len - got), (off_t)(p->off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            p->err = n < 0 ? errno : -1;
            return NULL;
        }
        got += (uint64_t)n;
    }
    return NULL;
}

/* Parts of at least this many bytes; at most READ_THREADS_MAX threads. */
#define READ_PART_MIN    (32ull << 20)
#define READ_THREADS_MAX 16u

/* Reads [off, off + len) of `fd` into `dst`. A large read is split over
 * threads: the copy out of the page cache and the first touch of `dst`'s
 * fresh pages are what it costs (one thread read 1 GiB in 0.56 s on the
 * H200 host), and both scale with cores. Returns 0, an errno, or -1 when
 * the file ended early. */
static int read_parallel(int fd, uint8_t *dst, uint64_t off, uint64_t len)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t n = len / READ_PART_MIN;
    if (n > (uint64_t)(cores > 0 ? cores : 1))
        n = (uint64_t)(cores > 0 ? cores : 1);
    if (n > READ_THREADS_MAX)
        n = READ_THREADS_MAX;
    if (n < 2) {
        struct read_part p = {fd, dst, off, len, 0};
        read_part_run(&p);
        return p.err;
    }
    struct read_part parts[READ_THREADS_MAX];
    pthread_t tid[READ_THREADS_MAX];
    bool started[READ_THREADS_MAX] = {false};
    uint64_t step = (len / n + 4095) & ~4095ull;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t lo = i * step < len ? i * step : len;
        uint64_t hi = i + 1 == n || lo + step > len ? len : lo + step;
        parts[i] = (struct read_part){fd, dst + lo, off + lo, hi - lo, 0};
        started[i] = i > 0 && pthread_create(&tid[i], NULL, read_part_run, &parts[i]) == 0;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (!started[i])
            read_part_run(&parts[i]); /* part 0, or a thread that did not start */
    }
    int err = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        if (err == 0)
            err = parts[i].err;
    }
    return err;
}

/* The last descriptor a batch's load inspected, with what was learnt of
 * it: the buffers of one request are ranges of one descriptor (libvkscan
 * packs a request's inline buffers into one memfd), and a batch of a flow
 * reassembler's writes made three system calls for each of 177 of them on
 * the GPU worker (docs/PERFORMANCE.md "Session 32"). A descriptor number
 * names one open file for the whole load: its request holds it open. */
struct fd_seen {
    int fd; /* -1: none yet */
    struct stat sb;
    int fl;    /* F_GETFL, or -1 */
    int seals; /* F_GET_SEALS, or -2: not asked yet */
};

/* Inspects a descriptor buffer without reading it: a regular file whose
 * range fits. Fills `b->bytes` and the identity the batch's duplicates and
 * the result cache are found by. */
static int identify_fd(struct engine_buf *b, struct fd_seen *seen)
{
    if (seen->fd != b->fd) {
        struct stat st;
        if (fstat(b->fd, &st) != 0)
            return bad_fd(b, "the descriptor cannot be inspected (%s): pass an open file",
                          strerror(errno));
        *seen = (struct fd_seen){.fd = b->fd, .sb = st, .fl = fcntl(b->fd, F_GETFL), .seals = -2};
    }
    const struct stat sb = seen->sb;
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
    b->id = (struct engine_fid){.dev = (uint64_t)sb.st_dev,
                                .ino = (uint64_t)sb.st_ino,
                                .size = size,
                                .mtime_sec = (int64_t)sb.st_mtim.tv_sec,
                                .mtime_nsec = (int64_t)sb.st_mtim.tv_nsec,
                                .ctime_sec = (int64_t)sb.st_ctim.tv_sec,
                                .ctime_nsec = (int64_t)sb.st_ctim.tv_nsec,
                                .offset = b->offset,
                                .length = len};
    b->has_id = true;
    return 0;
}

/* Seals (F_GET_SEALS) of a memfd sealed against shrinking: load_fd maps
 * it (a truncation that could fault a mapping is impossible). */
static bool sealed(int seals)
{
    return seals > 0 && (seals & F_SEAL_SHRINK);
}

/* Sealed memfds below this are read, not mapped: copying a few KiB costs
 * less than the mapping's faults and the unmap's TLB shootdown across the
 * daemon's threads (4 KiB memfd scans under load, issue 10). */
#define MAP_MIN (64u << 10)

/* Reads of at least this much go to memory asked for in huge pages: a
 * fresh 4 KiB page faulted in per 4 KiB read was a quarter of the CPU
 * engine's time over a 64 MiB file (docs/PERFORMANCE.md "Session 48"). */
#define HUGE_READ_MIN (4u << 20)
#define HUGE_PAGE     (2u << 20)

/* Anonymous memory for `len` bytes aligned to HUGE_PAGE with huge pages
 * asked for (MADV_HUGEPAGE; the kernel may give small ones), kept in
 * ld->map for unload; NULL without memory. */
static uint8_t *huge_alloc(uint64_t len, struct loaded *ld)
{
    size_t want = ((size_t)len + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
    size_t map_len = want + HUGE_PAGE;
    uint8_t *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uintptr_t at = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    /* the unaligned head and tail back to the kernel */
    if (at > (uintptr_t)p)
        munmap(p, at - (uintptr_t)p);
    size_t tail = (size_t)((uintptr_t)p + map_len - (at + want));
    if (tail > 0)
        munmap((uint8_t *)at + want, tail);
#ifdef MADV_HUGEPAGE
    madvise((void *)at, want, MADV_HUGEPAGE);
#endif
    ld->map = (void *)at;
    ld->map_len = want;
    return (uint8_t *)at;
}

/* Reads (or maps) the range identify_fd checked; a mapping is populated
 * ahead with `populate`. */
static int load_fd(struct engine_buf *b, struct loaded *ld, bool populate)
{
    uint64_t len = b->bytes;
    if (len == 0) {
        b->data = (const uint8_t *)"";
        b->len = 0;
        return 0;
    }
    if (len >= MAP_MIN && sealed(fcntl(b->fd, F_GET_SEALS))) {
        long page = sysconf(_SC_PAGESIZE);
        uint64_t base = b->offset - b->offset % (uint64_t)page;
        size_t map_len = (size_t)(len + (b->offset - base));
        void *p = mmap(NULL, map_len, PROT_READ, MAP_SHARED | (populate ? MAP_POPULATE : 0), b->fd,
                       (off_t)base);
        if (p != MAP_FAILED) {
            ld->map = p;
            ld->map_len = map_len;
            b->data = (const uint8_t *)p + (b->offset - base);
            b->len = len;
            return 0;
        }
    }
    uint8_t *buf = len >= HUGE_READ_MIN ? huge_alloc(len, ld) : malloc((size_t)len);
    if (buf == NULL)
        return bad_fd(b, "no memory for the file's %s bytes: send a smaller range", "");
    int err = read_parallel(b->fd, buf, b->offset, len);
    if (err != 0) {
        if (ld->map != NULL)
            munmap(ld->map, ld->map_len);
        else
            free(buf);
        ld->map = NULL;
        return bad_fd(b, "the descriptor cannot be read (%s): open it for reading",
                      err > 0 ? strerror(err) : "it shrank while being read");
    }
    if (ld->map == NULL)
        ld->heap = buf;
    b->data = buf;
    b->len = len;
    return 0;
}

int engine_buf_read(void *ctx, uint8_t *dst, uint64_t off, size_t len)
{
    struct engine_buf *b = ctx;
    struct read_part p = {b->fd, dst, b->offset + off, len, 0};
    read_part_run(&p);
    if (p.err == 0)
        return 0;
    int none = 0;
    __atomic_compare_exchange_n(&b->read_err, &none, p.err, false, __ATOMIC_RELAXED,
                                __ATOMIC_RELAXED);
    return p.err > 0 ? -p.err : -EIO;
}

/* Fails a deferred buffer whose read met `err` (an errno, or -1: the file
 * ended early). */
static void read_failed(struct engine_buf *b, int err)
{
    bad_fd(b, "the descriptor cannot be read (%s): check the file and scan it again",
           err > 0 ? strerror(err) : "it shrank while being read");
}

static void unload(struct loaded *ld)
{
    if (ld->map != NULL)
        munmap(ld->map, ld->map_len);
    free(ld->heap);
}

/* ---- batches ---------------------------------------------------------- */

int engine_job_push_hit(struct engine_job *j, size_t *cap, uint32_t buffer, uint32_t rule,
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
    j->hits[j->n_hits++] =
        (struct engine_hit){.buffer = buffer, .rule = rule, .count = count, .end = end};
    return 0;
}

void engine_job_fail(struct engine_job *j, int code, const char *msg)
{
    free(j->hits);
    j->hits = NULL;
    j->n_hits = 0;
    j->status = code;
    vks_error_set(&j->err, code, "%s", msg);
}

uint64_t engine_job_budget(const struct engine_job *j)
{
    return j->max_hits != 0 ? j->max_hits : UINT64_MAX;
}

/* ---- duplicates within a batch ----------------------------------------- */

/* The descriptor buffers of a batch read so far, by identity: an open
 * addressing table of (job index, buffer index). */
struct dedup {
    struct bstate *st;
    uint32_t (*slot)[2]; /* job + 1 (0: empty), buffer */
    size_t mask;
    struct fd_seen seen; /* the load's last descriptor (identify_fd) */
};

static void dedup_init(struct dedup *d, struct bstate *st, size_t n_fd)
{
    size_t n = 16;
    while (n < 2 * n_fd)
        n *= 2;
    d->st = st;
    d->slot = n_fd > 1 ? calloc(n, sizeof(*d->slot)) : NULL; /* NULL: no duplicates sought */
    d->mask = n - 1;
    d->seen = (struct fd_seen){.fd = -1, .fl = -1, .seals = -2};
}

static size_t fid_hash(const struct engine_fid *f)
{
    uint64_t h = f->ino * 0x9e3779b97f4a7c15ull ^ f->dev;
    h = (h ^ f->offset) * 0xff51afd7ed558ccdull;
    h = (h ^ f->length) * 0xc4ceb9fe1a85ec53ull;
    return (size_t)(h ^ (h >> 29));
}

static bool fid_equal(const struct engine_fid *a, const struct engine_fid *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_sec == b->mtime_sec && a->mtime_nsec == b->mtime_nsec &&
           a->ctime_sec == b->ctime_sec && a->ctime_nsec == b->ctime_nsec &&
           a->offset == b->offset && a->length == b->length;
}

/* Finds an earlier buffer with the same bytes, catalog and mode as buffer
 * `k` of the batch's job `ji`; when there is none, records this one (which
 * is then read). Returns whether `eb` is a duplicate (src_* set). */
static bool dedup_find(struct dedup *d, uint32_t ji, uint32_t k)
{
    if (d->slot == NULL)
        return false;
    const struct engine_job *j = d->st->jobs[ji];
    struct engine_buf *eb = &j->bufs[k];
    for (size_t i = fid_hash(&eb->id) & d->mask;; i = (i + 1) & d->mask) {
        if (d->slot[i][0] == 0) {
            d->slot[i][0] = ji + 1;
            d->slot[i][1] = k;
            return false;
        }
        const struct engine_job *pj = d->st->jobs[d->slot[i][0] - 1];
        const struct engine_buf *pb = &pj->bufs[d->slot[i][1]];
        if (pj->cat == j->cat && pj->mode == j->mode && fid_equal(&pb->id, &eb->id)) {
            eb->src_job = d->slot[i][0] - 1;
            eb->src_buf = d->slot[i][1];
            return true;
        }
    }
}

/* The slot of a buffer that turned out unreadable: later duplicates must
 * read the file themselves. */
static void dedup_drop(struct dedup *d, uint32_t ji, uint32_t k)
{
    if (d->slot == NULL)
        return;
    for (size_t i = 0; i <= d->mask; i++) {
        if (d->slot[i][0] == ji + 1 && d->slot[i][1] == k)
            d->slot[i][0] = UINT32_MAX; /* a tombstone matching nothing */
    }
}

/* ---- the result cache (rcache.h) ---------------------------------------- */

/* Whether the job's hits get starts (flag L rules, or the scan's `starts`
 * option): such a job reads its files, since cached hits carry no starts. */
static bool wants_starts(const struct engine_job *j)
{
    return j->starts || (catalog_rule_flags_any(j->cat) & RULE_F_SOMLEFT);
}

static void cache_key(const struct engine_job *j, const struct engine_buf *eb, struct rcache_key *k)
{
    memset(k, 0, sizeof(*k));
    k->uid = j->uid;
    k->mode = (uint32_t)j->mode;
    memcpy(k->fp, catalog_fingerprint(j->cat), CATALOG_FP_LEN);
    k->id = eb->id;
}

/* Takes a descriptor buffer's hits from the result cache when the tenant
 * scanned the unchanged file before. */
static bool cache_lookup(struct engine *e, struct engine_job *j, struct engine_buf *eb, uint32_t k)
{
    if (e->rc == NULL || j->no_cache || wants_starts(j))
        return false;
    struct rcache_key key;
    cache_key(j, eb, &key);
    if (rcache_get(e->rc, &key, k, &eb->pre, &eb->n_pre) != 0)
        return false;
    eb->skip = eb->cached = true;
    eb->data = (const uint8_t *)"";
    eb->len = 0;
    j->cache_hits++;
    j->bytes_not_scanned += eb->bytes;
    return true;
}

/* Whether a file's result may be cached: not changed within a second of
 * the scan's start (a change in the same timestamp tick would keep its key:
 * git's racily clean entries), and not changed since it was read. */
static bool cacheable(const struct engine_buf *eb, int64_t start_real_ns)
{
    const struct engine_fid *f = &eb->id;
    int64_t m = f->mtime_sec * 1000000000ll + f->mtime_nsec;
    int64_t c = f->ctime_sec * 1000000000ll + f->ctime_nsec;
    if (m > start_real_ns - 1000000000ll || c > start_real_ns - 1000000000ll)
        return false;
    struct stat sb;
    return fstat(eb->fd, &sb) == 0 && (uint64_t)sb.st_dev == f->dev &&
           (uint64_t)sb.st_ino == f->ino && (uint64_t)sb.st_size == f->size &&
           sb.st_mtim.tv_sec == f->mtime_sec && sb.st_mtim.tv_nsec == f->mtime_nsec &&
           sb.st_ctim.tv_sec == f->ctime_sec && sb.st_ctim.tv_nsec == f->ctime_nsec;
}

/* Whether the descriptor itself can be read: an O_PATH or write-only
 * descriptor names a file without the right to its bytes, so it must not
 * get hits from the cache or from another buffer of the batch (its read
 * fails with BAD_FD, as it would without them). */
static bool readable(int fl)
{
    return fl >= 0 && !(fl & O_PATH) && (fl & O_ACCMODE) != O_WRONLY;
}

/* Whether a GPU engine may read the job's descriptor buffers itself, at
 * upload: nothing on the host walks their bytes first (starts are found on
 * the host). Gated catalogs qualify: for a buffer read at upload the GPU
 * engine finds the factor ends on the device (gpu_options.factor_pass, the
 * daemon leaves it at 0), and the host repairs read the upload's copy. */
static bool can_defer(const struct engine_job *j)
{
    return !wants_starts(j);
}

/* Loads buffer `k` of job `ji`: inline ones are there already; a
 * descriptor buffer is identified, then read unless the result cache has
 * its hits or it repeats an earlier one of the batch, or left for the GPU
 * engine's upload threads to read (st->defer). */
static void load_buf(struct engine *e, struct bstate *st, struct dedup *dd, uint32_t ji, uint32_t k)
{
    struct engine_job *j = st->jobs[ji];
    struct engine_buf *eb = &j->bufs[k];
    eb->has_id = eb->skip = eb->cached = eb->deferred = false;
    eb->read_err = 0;
    eb->pre = NULL;
    eb->n_pre = 0;
    if (eb->fd < 0) {
        eb->bytes = eb->len;
        return;
    }
    if (identify_fd(eb, &dd->seen) != 0)
        return;
    if (!readable(dd->seen.fl)) {
        eb->has_id = false; /* nor stored in the cache */
        load_fd(eb, &st->ld[st->n_loaded++], false);
        return;
    }
    if (cache_lookup(e, j, eb, k))
        return;
    if (dedup_find(dd, ji, k)) {
        const struct engine_buf *pb = &st->jobs[eb->src_job]->bufs[eb->src_buf];
        eb->skip = true;
        eb->data = pb->data; /* a rescan's input when the first's hits fall short */
        eb->len = pb->len;
        j->deduplicated++;
        j->bytes_not_scanned += eb->bytes;
        return;
    }
    bool defer = st->defer && eb->bytes > 0 && can_defer(j);
    if (defer && !st->defer_sealed) {
        if (dd->seen.seals == -2)
            dd->seen.seals = fcntl(eb->fd, F_GET_SEALS);
        defer = !sealed(dd->seen.seals);
    }
    if (defer) {
        eb->deferred = true;
        eb->data = NULL;
        eb->len = eb->bytes;
        return;
    }
    if (load_fd(eb, &st->ld[st->n_loaded++], st->populate) != 0)
        dedup_drop(dd, ji, k);
}

/* Reads a deferred (or duplicate) buffer's bytes into memory for a scan on
 * this thread; fails the buffer alone when it cannot be read. */
static int fetch_buf(struct bstate *st, struct engine_buf *eb)
{
    if (eb->data != NULL || eb->len == 0)
        return 0;
    eb->deferred = false;
    eb->read_err = 0;
    return load_fd(eb, &st->ld[st->n_loaded++], false);
}

void engine_batch_fetch(struct engine *e, struct engine_batch *b)
{
    (void)e;
    struct bstate *st = b->priv;
    for (size_t i = 0; st != NULL && i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        for (uint32_t k = 0; j->status == 0 && j->cpu_retry != 0 && k < j->n_bufs; k++) {
            struct engine_buf *eb = &j->bufs[k];
            if (eb->status == 0 && eb->deferred && !eb->skip)
                fetch_buf(st, eb);
        }
    }
}

void engine_batch_read_errors(struct engine_batch *b)
{
    struct bstate *st = b->priv;
    for (size_t i = 0; st != NULL && i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        for (uint32_t k = 0; j->cpu_retry == 0 && k < j->n_bufs; k++) {
            struct engine_buf *eb = &j->bufs[k];
            int err = __atomic_load_n(&eb->read_err, __ATOMIC_RELAXED);
            if (eb->status == 0 && eb->deferred && err != 0)
                read_failed(eb, err);
        }
    }
}

/* Reads the batch's descriptor buffers and fills the byte counts. Runs once
 * per batch, on the first engine that takes it. */
void engine_batch_load(struct engine *e, struct engine_batch *b)
{
    struct bstate *st = b->priv;
    struct engine_telemetry *tel = &b->tel;
    size_t n_jobs = 0, n_fd = 0;
    for (struct engine_job *j = b->jobs; j != NULL; j = j->next) {
        n_jobs++;
        for (uint32_t i = 0; i < j->n_bufs; i++)
            n_fd += j->bufs[i].fd >= 0;
    }
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    st->start_real_ns = (int64_t)rt.tv_sec * 1000000000ll + rt.tv_nsec;
    st->loaded = true;
    st->start_ns = engine_now_ns();
    st->jobs = calloc(n_jobs ? n_jobs : 1, sizeof(*st->jobs));
    st->ld = calloc(n_fd ? n_fd : 1, sizeof(*st->ld));
    struct dedup dd;
    dedup_init(&dd, st, n_fd);
    uint64_t dups = 0, dup_bytes = 0;
    for (struct engine_job *j = b->jobs; j != NULL; j = j->next) {
        j->status = 0;
        j->cpu_retry = 0;
        j->hits_dropped = 0;
        j->deduplicated = j->cache_hits = 0;
        j->bytes_not_scanned = 0;
        if (st->jobs == NULL || st->ld == NULL) {
            engine_job_fail(j, -VKS_E_INTERNAL, "out of memory starting the scan");
            continue;
        }
        uint32_t ji = (uint32_t)st->n_jobs;
        st->jobs[st->n_jobs++] = j;
        for (uint32_t i = 0; i < j->n_bufs; i++) {
            struct engine_buf *eb = &j->bufs[i];
            tel->buffers++;
            if (eb->status != 0)
                continue; /* refused when queued (bad descriptor) */
            load_buf(e, st, &dd, ji, i);
            tel->bytes += eb->status == 0 && !eb->skip ? eb->bytes : 0;
            tel->fd_upload_bytes += eb->deferred ? eb->bytes : 0;
        }
        dups += j->deduplicated;
    }
    for (size_t i = 0; i < st->n_jobs; i++) {
        const struct engine_job *j = st->jobs[i];
        for (uint32_t k = 0; k < j->n_bufs; k++)
            dup_bytes += j->bufs[k].skip && !j->bufs[k].cached ? j->bufs[k].bytes : 0;
    }
    free(dd.slot);
    tel->jobs = (uint32_t)st->n_jobs;
    tel->fd_read_ns = engine_now_ns() - st->start_ns;
    pthread_mutex_lock(&e->mu);
    e->dedup_buffers += dups;
    e->dedup_bytes += dup_bytes;
    pthread_mutex_unlock(&e->mu);
}

/* ---- handing hits to buffers that were not scanned ---------------------- */

/* The hits of buffer `buf` in a job's list (sorted by buffer): [*lo, *hi). */
static void buf_range(const struct engine_hit *h, size_t n, uint32_t buf, size_t *lo, size_t *hi)
{
    size_t a = 0, b = n;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (h[m].buffer < buf)
            a = m + 1;
        else
            b = m;
    }
    *lo = a;
    for (b = a; b < n && h[b].buffer == buf; b++) {
    }
    *hi = b;
}

/* Scans a duplicate on this thread when the first buffer's hits cannot
 * stand in for it (its job failed, or max_hits cut it short). */
static int rescan(const struct engine_job *j, const struct engine_buf *eb, struct scan_hits *out)
{
    struct cpuscan_scratch *scr = NULL;
    struct cpuscan_part part = {0};
    uint64_t dropped = 0;
    int rc = cpuscan_scratch_create(&scr);
    if (rc == 0)
        rc = cpuscan_segment(j->cat, eb->data, (size_t)eb->len, 0, eb->len, j->mode,
                             j->max_hits ? (uint64_t)j->max_hits + 1 : 0, NULL, NULL, scr, &part);
    if (rc == 0)
        rc = cpuscan_merge(j->cat, j->mode, &part, 1, UINT64_MAX, false, out, &dropped);
    cpuscan_part_finish(&part);
    cpuscan_scratch_destroy(scr);
    return rc;
}

/* A job's hits as the engine left them (before settle replaced any). */
struct own {
    struct engine_hit *v;
    size_t n;
};

/* Appends `n` hits of one buffer to a job's new list under its max_hits:
 * past it, one marker, the rest counted as dropped. */
static int push_buf(struct engine_job *j, size_t *cap, uint64_t *kept, uint32_t k,
                    const struct engine_hit *h, size_t n, bool own)
{
    bool marked = false;
    for (size_t i = 0; i < n; i++) {
        if (*kept < engine_job_budget(j))
            ++*kept;
        else if (marked) {
            j->hits_dropped += !own; /* the engine counted its own */
            continue;
        } else {
            marked = true;
            j->hits_dropped += !own;
        }
        if (engine_job_push_hit(j, cap, k, h[i].rule, h[i].count, h[i].end) != 0)
            return -ENOMEM;
    }
    return 0;
}

/* Where the hits of a buffer that was not scanned come from: the first of
 * its duplicates when that one's were complete, else a rescan into `tmp`. */
static int source(struct bstate *st, const struct own *own, const struct engine_job *j,
                  struct engine_buf *eb, struct scan_hits *tmp, const struct engine_hit **h,
                  size_t *n, struct engine_hit **conv)
{
    if (eb->cached) {
        *h = eb->pre;
        *n = eb->n_pre;
        return 0;
    }
    const struct engine_job *pj = st->jobs[eb->src_job];
    size_t lo, hi;
    buf_range(own[eb->src_job].v, own[eb->src_job].n, eb->src_buf, &lo, &hi);
    if (pj->status == 0 && pj->bufs[eb->src_buf].status == 0 && hi <= engine_job_budget(pj)) {
        *h = own[eb->src_job].v + lo;
        *n = hi - lo;
        return 0;
    }
    /* The first one's bytes were read by the GPU engine, or not at all
     * (its read failed): this one reads its own, and fails alone. */
    if (fetch_buf(st, eb) != 0) {
        *h = NULL;
        *n = 0;
        return 0;
    }
    int rc = rescan(j, eb, tmp);
    *conv = rc == 0 ? malloc((tmp->n ? tmp->n : 1) * sizeof(**conv)) : NULL;
    if (*conv == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < tmp->n; i++)
        (*conv)[i] = (struct engine_hit){
            .rule = tmp->v[i].rule, .count = tmp->v[i].count, .end = tmp->v[i].end};
    *h = *conv;
    *n = tmp->n;
    return 0;
}

/* Rebuilds the hits of job `ji`, which has buffers that were not scanned,
 * in buffer order under its max_hits. */
static int rebuild(struct bstate *st, const struct own *own, uint32_t ji)
{
    struct engine_job *j = st->jobs[ji];
    j->hits = NULL;
    j->n_hits = 0;
    size_t cap = 0;
    uint64_t kept = 0;
    int rc = 0;
    for (uint32_t k = 0; k < j->n_bufs && rc == 0; k++) {
        struct engine_buf *eb = &j->bufs[k];
        if (eb->status != 0)
            continue;
        const struct engine_hit *h;
        size_t n, lo, hi;
        struct scan_hits tmp = {0};
        struct engine_hit *conv = NULL;
        if (!eb->skip) {
            buf_range(own[ji].v, own[ji].n, k, &lo, &hi);
            h = own[ji].v + lo;
            n = hi - lo;
        } else {
            rc = source(st, own, j, eb, &tmp, &h, &n, &conv);
        }
        if (rc == 0)
            rc = push_buf(j, &cap, &kept, k, h, n, !eb->skip);
        scan_hits_finish(&tmp);
        free(conv);
    }
    return rc;
}

static bool has_skipped(const struct engine_job *j)
{
    for (uint32_t k = 0; k < j->n_bufs; k++) {
        if (j->bufs[k].status == 0 && j->bufs[k].skip)
            return true;
    }
    return false;
}

/* Stores the complete hits of the job's scanned descriptor buffers whose
 * files are cacheable. */
static void cache_store(struct engine *e, const struct bstate *st, const struct engine_job *j)
{
    if (e->rc == NULL || j->no_cache || j->status != 0)
        return;
    for (uint32_t k = 0; k < j->n_bufs; k++) {
        const struct engine_buf *eb = &j->bufs[k];
        if (eb->status != 0 || !eb->has_id || eb->skip || !cacheable(eb, st->start_real_ns))
            continue;
        size_t lo, hi;
        buf_range(j->hits, j->n_hits, k, &lo, &hi);
        if (hi > engine_job_budget(j))
            continue; /* cut short by max_hits */
        struct rcache_key key;
        cache_key(j, eb, &key);
        rcache_put(e->rc, &key, j->hits + lo, hi - lo);
    }
}

/* Gives the buffers that were not scanned their hits, once every engine
 * that ran the batch is done with it, and fills the result cache. */
static void settle(struct engine *e, struct engine_batch *b)
{
    struct bstate *st = b->priv;
    if (st == NULL || !st->loaded || st->n_jobs == 0)
        return;
    struct own *own = calloc(st->n_jobs, sizeof(*own));
    uint64_t saved = 0;
    for (size_t i = 0; i < st->n_jobs; i++) {
        if (own != NULL)
            own[i] = (struct own){st->jobs[i]->hits, st->jobs[i]->n_hits};
        cache_store(e, st, st->jobs[i]);
        for (uint32_t k = 0; k < st->jobs[i]->n_bufs; k++) {
            const struct engine_buf *eb = &st->jobs[i]->bufs[k];
            saved += eb->status == 0 && eb->cached ? eb->bytes : 0;
        }
    }
    pthread_mutex_lock(&e->mu);
    e->cache_bytes_saved += saved;
    pthread_mutex_unlock(&e->mu);
    for (size_t i = 0; i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        if (j->status != 0 || !has_skipped(j))
            continue;
        /* engine_job_fail frees the new list (the old one goes below), or
         * the old one when there is no snapshot */
        if (own == NULL || rebuild(st, own, (uint32_t)i) != 0)
            engine_job_fail(j, -VKS_E_INTERNAL,
                            "out of memory collecting hits: lower max_hits or retry");
    }
    for (size_t i = 0; own != NULL && i < st->n_jobs; i++) {
        if (st->jobs[i]->hits != own[i].v)
            free(own[i].v);
    }
    for (size_t i = 0; i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        for (uint32_t k = 0; k < j->n_bufs; k++) {
            free(j->bufs[k].pre);
            j->bufs[k].pre = NULL;
            j->bufs[k].n_pre = 0;
        }
    }
    free(own);
}

/* ---- start of match (som.h, docs/engine.md) ----------------------------- */

/* Gives the hits [lo, hi) of one buffer their starts. */
static int buf_starts(struct engine_job *j, const struct engine_buf *eb, size_t lo, size_t hi,
                      struct vks_error *err)
{
    struct som_set *set = catalog_som(j->cat);
    struct som_hit *sh = malloc((hi - lo) * sizeof(*sh));
    if (set == NULL || sh == NULL) {
        free(sh);
        return vks_error_set(err, -ENOMEM, "out of memory computing match starts");
    }
    for (size_t i = lo; i < hi; i++)
        sh[i - lo] = (struct som_hit){.rule = j->hits[i].rule, .end = j->hits[i].end};
    int rc = som_fill(set, eb->data, (size_t)eb->len, sh, hi - lo, j->starts, err);
    for (size_t i = lo; rc == 0 && i < hi; i++) {
        j->hits[i].has_start = sh[i - lo].start != SOM_NONE;
        j->hits[i].start = j->hits[i].has_start ? sh[i - lo].start : 0;
    }
    free(sh);
    return rc;
}

/* Computes the starts of every settled job that wants them, on the
 * engine's thread, while the buffers are still loaded. */
static void fill_starts(struct bstate *st)
{
    for (size_t i = 0; st != NULL && st->loaded && i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        if (j->status != 0 || j->n_hits == 0 || !wants_starts(j))
            continue;
        struct vks_error err = {0};
        int rc = 0;
        for (size_t lo = 0, hi; lo < j->n_hits && rc == 0; lo = hi) {
            for (hi = lo + 1; hi < j->n_hits && j->hits[hi].buffer == j->hits[lo].buffer; hi++) {
            }
            struct engine_buf *eb = &j->bufs[j->hits[lo].buffer];
            /* a duplicate of a buffer a GPU engine read itself has no bytes here */
            if (eb->status == 0 && !eb->cached && fetch_buf(st, eb) == 0)
                rc = buf_starts(j, eb, lo, hi, &err);
        }
        if (rc != 0)
            engine_job_fail(j, -VKS_E_INTERNAL, err.msg);
    }
}

/* Frees the batch's private state (descriptor buffers go to the loop
 * thread, which releases them off the engines) and queues it for `done`. */
void engine_batch_post(struct engine *e, struct engine_batch *b)
{
    struct bstate *st = b->priv;
    settle(e, b);
    fill_starts(st);
    if (st != NULL) {
        for (uint32_t i = 0; i < st->n_tasks; i++)
            cpuscan_part_finish(&st->tasks[i].part);
        b->tel.wall_ns = st->loaded ? engine_now_ns() - st->start_ns : 0;
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
    if (b->finished != NULL) { /* before the loop can see (and free) it */
        pthread_mutex_unlock(&e->mu);
        b->finished(b);
        pthread_mutex_lock(&e->mu);
    }
    b->next = NULL;
    if (e->done_tail != NULL)
        e->done_tail->next = b;
    else
        e->done_head = b;
    e->done_tail = b;
    pthread_mutex_unlock(&e->mu);
    uv_async_send(&e->async);
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
    in->active_devices = 0;
    for (uint32_t i = 0; i < e->n_gpu; i++) {
        const struct gworker *w = &e->gw[i];
        if (!w->alive)
            continue;
        if (!in->gpu)
            in->device = w->dev;
        in->gpu = true;
        in->gpu_engines++;
        if (w->dev.index < 32)
            in->active_devices |= 1u << w->dev.index;
        in->resident_catalogs += w->resident;
        in->device_memory_used += w->device_used;
        in->device_memory_budget += w->budget;
    }
    pthread_mutex_unlock(&e->mu);
    /* the setup thread lists the devices; they are its until it reported */
    in->devices = e->devices_found;
    in->n_devices = e->open_reported ? e->n_devices_found : 0;
    in->cpu_threads = __atomic_load_n(&e->n_cpu, __ATOMIC_RELAXED);
}

static void on_async(uv_async_t *h)
{
    struct engine *e = h->data;
    pthread_mutex_lock(&e->mu);
    bool report = e->open_done && !e->open_reported;
    e->open_reported |= report;
    struct engine_batch *done = e->done_head;
    e->done_head = e->done_tail = NULL;
    struct engine_warm *warmed = e->warm_done;
    e->warm_done = NULL;
    pthread_mutex_unlock(&e->mu);
    if (report || done != NULL)
        refresh_info(e);
    if (report) {
        e->info.start_open_ns = e->t_open;
        e->info.start_list_ns = e->t_list;
        e->info.start_selftest_ns = e->t_selftest;
        e->ready_cb(e, e->open_status, &e->open_err, e->ctx);
    }
    if (warmed != NULL)
        refresh_info(e); /* resident catalogs and device memory */
    while (warmed != NULL) {
        struct engine_warm *next = warmed->next;
        warmed->done(warmed->ctx);
        free(warmed);
        warmed = next;
    }
    while (done != NULL) {
        struct engine_batch *next = done->next;
        e->pending--;
        if (done->target != CPU_ENGINE)
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
 * runs (or, under auto, none has started yet), or (auto) for a small batch
 * while the CPU queue is short; else the GPU engine with the fewest bytes
 * in flight. */
static uint32_t place(struct engine *e, uint64_t bytes, uint64_t work)
{
    /* n_gpu only once the start is reported: the setup thread sets it */
    if (e->want == CONFIG_ENGINE_CPU || !e->open_reported || e->n_gpu == 0)
        return CPU_ENGINE;
    /* without mu: the loop hands over every batch, and at 64 clients of
     * 4 KiB scans its waits for mu here were most of its futex time (the
     * CPU pool takes mu for every claim; docs/PERFORMANCE.md session 25) */
    uint64_t now = engine_now_ns(), oldest = __atomic_load_n(&e->cpu_oldest_ns, __ATOMIC_RELAXED);
    uint64_t wait = oldest != 0 && now > oldest ? now - oldest : 0;
    /* ties go round: two idle engines take turns */
    uint32_t best = CPU_ENGINE;
    for (uint32_t k = 0; k < e->n_gpu; k++) {
        uint32_t i = (e->rr + k) % e->n_gpu;
        if (__atomic_load_n(&e->gw[i].alive, __ATOMIC_RELAXED) &&
            (best == CPU_ENGINE || e->gw[i].inflight_bytes < e->gw[best].inflight_bytes))
            best = i;
    }
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
        work += jb * catalog_cpu_weight(j->cat);
    }
    memset(&batch->tel, 0, sizeof(batch->tel));
    batch->next = NULL;
    batch->state = B_NEW;
    batch->bytes_est = bytes;
    batch->submit_ns = engine_now_ns();
    batch->priv = calloc(1, sizeof(struct bstate));
    e->pending++;
    if (batch->priv == NULL) {
        for (struct engine_job *j = batch->jobs; j != NULL; j = j->next)
            engine_job_fail(j, -VKS_E_INTERNAL, "out of memory queueing the batch: retry");
        batch->target = CPU_ENGINE;
        e->cpu_inflight_bytes += bytes;
        engine_batch_post(e, batch); /* handed back through the async handle */
        return;
    }
    uint32_t t = place(e, bytes, work);
    batch->target = t;
    if (t == CPU_ENGINE) {
        e->cpu_inflight_bytes += bytes;
        engine_cpu_push(e, batch);
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

void engine_warm(struct engine *e, const struct catalog *cat, void (*done)(void *ctx), void *ctx)
{
    struct engine_warm *r = calloc(1, sizeof(*r));
    if (r == NULL) { /* a warm-up is a head start only: go without */
        done(ctx);
        return;
    }
    r->cat = cat;
    r->done = done;
    r->ctx = ctx;
    pthread_mutex_lock(&e->mu);
    for (uint32_t i = 0; i < e->n_gpu; i++) {
        if (e->gw[i].started) {
            r->todo |= 1u << i;
            r->left++;
            pthread_cond_signal(&e->gw[i].cond);
        }
    }
    bool none = r->left == 0;
    struct engine_warm **at = none ? &e->warm_done : &e->warm_head;
    while (*at != NULL) /* in order: the catalog used last first */
        at = &(*at)->next;
    *at = r;
    pthread_mutex_unlock(&e->mu);
    if (none)
        uv_async_send(&e->async); /* `done` runs from the loop, not in this call */
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

bool engine_serving(const struct engine *e)
{
    return e->open_reported ? e->open_status == 0 : e->want != CONFIG_ENGINE_GPU;
}

const struct engine_info *engine_get_info(const struct engine *e)
{
    return &e->info;
}

/* The stats key `name` of engine `slot`: the CPU engine counts after the
 * `n_gpu` GPU engines. */
static const char *key(struct engine *e, uint32_t n_gpu, uint32_t slot, int k, const char *name)
{
    char *s = e->keys[slot][k];
    snprintf(s, sizeof(e->keys[slot][k]), "engine.%u.%s", slot == CPU_ENGINE ? n_gpu : slot, name);
    return s;
}

static void add_engine(struct engine *e, struct stats_list *l, uint32_t n_gpu, uint32_t slot,
                       uint64_t kind, uint64_t device, uint64_t batches, uint64_t bytes,
                       uint64_t busy, uint64_t span, uint64_t retries)
{
    stats_add_u(l, key(e, n_gpu, slot, 0, "kind"), kind);
    stats_add_u(l, key(e, n_gpu, slot, 1, "device"), device);
    stats_add_u(l, key(e, n_gpu, slot, 2, "batches"), batches);
    stats_add_u(l, key(e, n_gpu, slot, 3, "bytes"), bytes);
    stats_add_u(l, key(e, n_gpu, slot, 4, "busy_ns"), busy);
    stats_add_f(l, key(e, n_gpu, slot, 5, "busy_share"), span ? (double)busy / (double)span : 0.0);
    stats_add_u(l, key(e, n_gpu, slot, 6, "cpu_retries"), retries);
}

void engine_stats_add(struct engine *e, struct stats_list *l)
{
    uint64_t span = engine_now_ns() - e->start_ns;
    pthread_mutex_lock(&e->mu);
    uint32_t n = e->n_gpu;
    struct {
        uint64_t device, batches, bytes, busy, retries, max_inflight;
    } g[MAX_GPU_ENGINES];
    for (uint32_t i = 0; i < n; i++)
        g[i].device = e->gw[i].dev.index, g[i].batches = e->gw[i].batches,
        g[i].bytes = e->gw[i].bytes, g[i].busy = e->gw[i].busy_ns, g[i].retries = e->gw[i].retries,
        g[i].max_inflight = e->gw[i].max_inflight;
    uint64_t cb = e->cpu_batches, cy = e->cpu_bytes, cbusy = e->cpu_busy_ns, cr = e->cpu_retries;
    uint64_t dups = e->dedup_buffers, dup_bytes = e->dedup_bytes, saved = e->cache_bytes_saved;
    uint64_t spin_hits = e->cpu_spin_hits;
    pthread_mutex_unlock(&e->mu);
    stats_add_u(l, "cpu.spin_hits", spin_hits);
    struct cpuscan_counters cc;
    cpuscan_counters(&cc);
    stats_add_u(l, "cpu.unbounded_pieces", cc.pieces);
    stats_add_u(l, "cpu.piece_fixes", cc.fixes);
    stats_add_u(l, "cpu.piece_joins_whole", cc.whole);
    stats_add_u(l, "dedup.buffers", dups);
    stats_add_u(l, "dedup.bytes_not_scanned", dup_bytes);
    struct rcache_stats rs = {0};
    if (e->rc != NULL)
        rcache_get_stats(e->rc, &rs);
    stats_add_u(l, "result_cache.limit", rs.limit);
    stats_add_u(l, "result_cache.bytes", rs.bytes);
    stats_add_u(l, "result_cache.entries", rs.entries);
    stats_add_u(l, "result_cache.hits", rs.hits);
    stats_add_u(l, "result_cache.misses", rs.misses);
    stats_add_u(l, "result_cache.inserts", rs.inserts);
    stats_add_u(l, "result_cache.evictions", rs.evictions);
    stats_add_u(l, "result_cache.bytes_not_scanned", saved);
    stats_add_u(l, "engines", n + 1);
    uint32_t n_cpu = __atomic_load_n(&e->n_cpu, __ATOMIC_RELAXED);
    stats_add_u(l, "cpu_threads", n_cpu);
    for (uint32_t i = 0; i < n; i++) {
        add_engine(e, l, n, i, 0, g[i].device, g[i].batches, g[i].bytes, g[i].busy, span,
                   g[i].retries);
        /* GPU engines: busy is device time with a batch on it; batches overlap */
        stats_add_u(l, key(e, n, i, 7, "max_inflight"), g[i].max_inflight);
        stats_add_u(l, key(e, n, i, 8, "reopens"),
                    __atomic_load_n(&e->gw[i].reopens, __ATOMIC_RELAXED));
    }
    /* the CPU engine's busy share is over all its threads */
    add_engine(e, l, n, CPU_ENGINE, 1, n_cpu, cb, cy, cbusy, span * n_cpu, cr);
    stats_add_u(l, "engine_starting", !e->open_reported);
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
    stats_add_u(l, "buffers_deduplicated", job->deduplicated);
    stats_add_u(l, "cache_hits", job->cache_hits);
    stats_add_u(l, "bytes_not_scanned", job->bytes_not_scanned);
    stats_add_u(l, "fd_upload_bytes", t->fd_upload_bytes);
    stats_add_u(l, "worker_wait_ns", t->worker_wait_ns);
    stats_add_u(l, "loaded_ahead", t->loaded_ahead);
}

/* ---- create and close ------------------------------------------------- */

/* With --engine cpu nothing else scans: every core. Otherwise one core is
 * left to the loop thread and the GPU engines' submissions. */
static uint32_t default_threads(enum config_engine want)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (want == CONFIG_ENGINE_CPU)
        return n > 1 ? (uint32_t)n : 1;
    return n > 2 ? (uint32_t)(n - 1) : 1;
}

int engine_create(uv_loop_t *loop, const struct daemon_config *cfg, engine_ready_cb ready,
                  engine_done_cb done, void *ctx, struct engine **out, struct vks_error *err)
{
    struct engine *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory creating the engine");
    e->loop = loop;
    e->start_ns = engine_now_ns();
    e->want = cfg->engine;
    e->cpu_max_work = cfg->engine == CONFIG_ENGINE_AUTO ? cfg->cpu_max_work : 0;
    e->cpu_max_wait_ns = (uint64_t)cfg->cpu_max_wait_us * 1000u;
    e->seg_bytes = cfg->cpu_segment_bytes ? cfg->cpu_segment_bytes : 4u << 20;
    e->timeout_ms = cfg->gpu_timeout_ms;
    e->inflight = cfg->inflight_batches;
    e->warm_bytes = cfg->warm_bytes;
    e->batch_bytes = cfg->batch_max_bytes;
    e->budget = cfg->device_budget;
    e->n_cpu = cfg->cpu_threads ? cfg->cpu_threads : default_threads(cfg->engine);
    e->cpu_spin_ns = (uint64_t)cfg->cpu_spin_us * 1000;
    e->cpu_spare = cfg->cpu_threads == 0 && cfg->engine == CONFIG_ENGINE_AUTO &&
                   e->n_cpu < default_threads(CONFIG_ENGINE_CPU);
    snprintf(e->device, sizeof(e->device), "%s", cfg->device);
    snprintf(e->devices, sizeof(e->devices), "%s", cfg->devices);
    snprintf(e->state_dir, sizeof(e->state_dir), "%s", cfg->state_dir);
    e->ready_cb = ready;
    e->done_cb = done;
    e->ctx = ctx;
    if (e->devices[0] != '\0') {
        uint32_t idx[MAX_GPU_ENGINES];
        bool all;
        int rc = engine_devices_parse(e->devices, idx, MAX_GPU_ENGINES, &all, err);
        if (rc < 0) {
            free(e);
            return rc;
        }
    }
    const char *fu = getenv("VKSCAND_FD_UPLOAD");
    e->fd_upload = fu == NULL                    ? FD_AUTO
                   : strcmp(fu, "pread") == 0    ? FD_PREAD
                   : strcmp(fu, "map") == 0      ? FD_MAP
                   : strcmp(fu, "populate") == 0 ? FD_POPULATE
                                                 : FD_AUTO;
    int rc = rcache_create(cfg->result_cache_bytes, &e->rc);
    if (rc != 0) {
        free(e);
        return vks_error_set(err, rc,
                             "out of memory creating the result cache: lower "
                             "result-cache-bytes");
    }
    /* adaptive: the pool's threads and the loop hold mu for a few hundred
     * ns at a time, thousands of times a second; a waiter spins briefly
     * before it sleeps in futex (at 64 clients of 4 KiB scans the loop's
     * futex sleeps and wake-ups for mu were most of its waiting) */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&e->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_cond_init(&e->cpu_cond, NULL);
    rc = uv_async_init(loop, &e->async, on_async);
    if (rc != 0) {
        rcache_destroy(e->rc);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cpu_cond);
        free(e);
        return vks_error_set(err, rc, "cannot create the engine's async handle: %s",
                             uv_strerror(rc));
    }
    e->async.data = e;
    e->cpu = calloc(e->n_cpu + 1, sizeof(*e->cpu));
    if (e->cpu == NULL) {
        engine_close(e);
        return vks_error_set(err, -ENOMEM, "out of memory creating the CPU engine");
    }
    for (; e->n_cpu_started < e->n_cpu; e->n_cpu_started++) {
        rc = uv_thread_create(&e->cpu[e->n_cpu_started], engine_cpu_main, e);
        if (rc != 0) {
            engine_close(e);
            return vks_error_set(err, rc, "cannot start a CPU engine thread: %s", uv_strerror(rc));
        }
    }
    refresh_info(e); /* the CPU engine's threads: it serves before the setup reports (auto) */
    rc = uv_thread_create(&e->setup, engine_gpu_setup, e);
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
    rcache_destroy(e->rc);
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
    __atomic_add_fetch(&e->cpu_gen, 1, __ATOMIC_RELEASE); /* ends a spin (engine_cpu.c) */
    pthread_cond_broadcast(&e->cpu_cond);
    pthread_mutex_unlock(&e->mu);
    for (uint32_t i = 0; i < e->n_cpu_started; i++)
        uv_thread_join(&e->cpu[i]);
    e->n_cpu_started = 0;
    on_async(&e->async); /* hand back what finished after the last wake-up */
    uv_close((uv_handle_t *)&e->async, free_engine);
}
