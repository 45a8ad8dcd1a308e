/*
 * import_bench: how fast can 1 GiB that starts in a file (page cache) or a
 * memfd reach device memory? Issue 10 asks to measure the two ways of one
 * pass over host memory, the cost of pinning included, before choosing:
 *
 *   pread   16 threads pread the file into persistently mapped staging
 *           (allocated once), a copy submitted per chunk as it fills (what
 *           vkscand does today: gpu/batch.c upload_haystack);
 *   import  the file's mapping imported with VK_EXT_external_memory_host
 *           (the driver pins its pages) and copied by the device's DMA; in
 *           chunks, so pinning chunk k+1 overlaps the copy of chunk k. The
 *           file and a sealed memfd of it mapped shared read-only, the memfd
 *           mapped privately with write permission, and the bytes in
 *           anonymous memory (as a buffer already in a process is),
 *           imported and pinned anew each iteration.
 *
 *   import_bench [--file PATH] [--size BYTES] [--chunk BYTES] [--iters N]
 *                [--threads N] [--populate] [--device N]
 *
 * Prints, per method, the median over iterations of the wall time from the
 * first byte touched to the last copy done, and its parts (import: map,
 * import, copy wait, release). No rules, no kernel: only the bytes' way.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <vulkan/vulkan.h>

#define MIB        (1024ull * 1024)
#define MAX_CHUNKS 1024
#define MAX_ITERS  64

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, VkResult r)
{
    fprintf(stderr, "import_bench: %s failed (VkResult %d)\n", what, (int)r);
    exit(2);
}

struct gpu {
    VkInstance inst;
    VkPhysicalDevice pd;
    VkDevice dev;
    VkQueue queue;
    uint32_t family;
    VkCommandPool pool;
    VkPhysicalDeviceMemoryProperties mem;
    VkDeviceSize align; /* minImportedHostPointerAlignment */
    bool has_import;
    PFN_vkGetMemoryHostPointerPropertiesEXT host_props;
};

static uint32_t pick_type(const struct gpu *g, uint32_t bits, VkMemoryPropertyFlags want)
{
    for (uint32_t i = 0; i < g->mem.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (g->mem.memoryTypes[i].propertyFlags & want) == want)
            return i;
    return UINT32_MAX;
}

static bool has_type(const struct gpu *g, VkMemoryPropertyFlags want)
{
    return pick_type(g, UINT32_MAX, want) != UINT32_MAX;
}

static void gpu_open(struct gpu *g, uint32_t index)
{
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .pApplicationName = "import_bench",
                             .apiVersion = VK_API_VERSION_1_2};
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                .pApplicationInfo = &app};
    VkResult r = vkCreateInstance(&ici, NULL, &g->inst);
    if (r != VK_SUCCESS)
        die("vkCreateInstance", r);
    uint32_t n = 16;
    VkPhysicalDevice pds[16];
    r = vkEnumeratePhysicalDevices(g->inst, &n, pds);
    if ((r != VK_SUCCESS && r != VK_INCOMPLETE) || index >= n)
        die("finding the device", r);
    g->pd = pds[index];
    VkPhysicalDeviceProperties pp;
    vkGetPhysicalDeviceProperties(g->pd, &pp);
    vkGetPhysicalDeviceMemoryProperties(g->pd, &g->mem);
    uint32_t ne = 0;
    vkEnumerateDeviceExtensionProperties(g->pd, NULL, &ne, NULL);
    VkExtensionProperties *ext = calloc(ne, sizeof(*ext));
    vkEnumerateDeviceExtensionProperties(g->pd, NULL, &ne, ext);
    for (uint32_t i = 0; i < ne; i++)
        g->has_import |=
            strcmp(ext[i].extensionName, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME) == 0;
    free(ext);
    if (g->has_import) {
        VkPhysicalDeviceExternalMemoryHostPropertiesEXT hp = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
        VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                          .pNext = &hp};
        vkGetPhysicalDeviceProperties2(g->pd, &p2);
        g->align = hp.minImportedHostPointerAlignment;
    }
    uint32_t nq = 16;
    VkQueueFamilyProperties qf[16];
    vkGetPhysicalDeviceQueueFamilyProperties(g->pd, &nq, qf);
    g->family = UINT32_MAX;
    for (uint32_t i = 0; i < nq && g->family == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT)
            g->family = i;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                   .queueFamilyIndex = g->family,
                                   .queueCount = 1,
                                   .pQueuePriorities = &prio};
    const char *names[] = {VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME};
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                              .queueCreateInfoCount = 1,
                              .pQueueCreateInfos = &qci,
                              .enabledExtensionCount = g->has_import ? 1 : 0,
                              .ppEnabledExtensionNames = names};
    r = vkCreateDevice(g->pd, &dci, NULL, &g->dev);
    if (r != VK_SUCCESS)
        die("vkCreateDevice", r);
    vkGetDeviceQueue(g->dev, g->family, 0, &g->queue);
    VkCommandPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = g->family};
    vkCreateCommandPool(g->dev, &cpi, NULL, &g->pool);
    if (g->has_import)
        g->host_props = (PFN_vkGetMemoryHostPointerPropertiesEXT)vkGetDeviceProcAddr(
            g->dev, "vkGetMemoryHostPointerPropertiesEXT");
    printf("device %s, import %s, alignment %llu\n", pp.deviceName, g->has_import ? "yes" : "no",
           (unsigned long long)g->align);
}

struct gbuf {
    VkBuffer buf;
    VkDeviceMemory mem;
    void *map;
};

static void gbuf_make(struct gpu *g, struct gbuf *b, VkDeviceSize size, VkBufferUsageFlags use,
                      VkMemoryPropertyFlags want)
{
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                              .size = size,
                              .usage = use,
                              .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = vkCreateBuffer(g->dev, &bci, NULL, &b->buf);
    if (r != VK_SUCCESS)
        die("vkCreateBuffer", r);
    VkMemoryRequirements mr;
    vkGetBufferMemoryRequirements(g->dev, b->buf, &mr);
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                .allocationSize = mr.size,
                                .memoryTypeIndex = pick_type(g, mr.memoryTypeBits, want)};
    r = vkAllocateMemory(g->dev, &mai, NULL, &b->mem);
    if (r != VK_SUCCESS)
        die("vkAllocateMemory", r);
    vkBindBufferMemory(g->dev, b->buf, b->mem, 0);
    b->map = NULL;
    if (want & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
        r = vkMapMemory(g->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map);
        if (r != VK_SUCCESS)
            die("vkMapMemory", r);
    }
}

/* Why the last import was refused, for the report. */
static char g_refusal[96];

/* Imports [p, p + size) (aligned) as a transfer source; false when refused
 * (g_refusal says at which step). */
static bool import_range(struct gpu *g, void *p, VkDeviceSize size,
                         VkExternalMemoryHandleTypeFlagBits type, struct gbuf *b)
{
    VkMemoryHostPointerPropertiesEXT hp = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
    VkResult r = g->host_props(g->dev, type, p, &hp);
    if (r != VK_SUCCESS || hp.memoryTypeBits == 0) {
        snprintf(g_refusal, sizeof(g_refusal), "host pointer properties: VkResult %d, types 0x%x",
                 (int)r, hp.memoryTypeBits);
        return false;
    }
    VkExternalMemoryBufferCreateInfo ext = {
        .sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO, .handleTypes = type};
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                              .pNext = &ext,
                              .size = size,
                              .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                              .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    if (vkCreateBuffer(g->dev, &bci, NULL, &b->buf) != VK_SUCCESS) {
        snprintf(g_refusal, sizeof(g_refusal), "vkCreateBuffer");
        return false;
    }
    VkImportMemoryHostPointerInfoEXT imp = {
        .sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT,
        .handleType = type,
        .pHostPointer = p};
    uint32_t ti = pick_type(g, hp.memoryTypeBits, 0);
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                .pNext = &imp,
                                .allocationSize = size,
                                .memoryTypeIndex = ti};
    r = vkAllocateMemory(g->dev, &mai, NULL, &b->mem);
    if (r != VK_SUCCESS) {
        snprintf(g_refusal, sizeof(g_refusal), "vkAllocateMemory: VkResult %d", (int)r);
        vkDestroyBuffer(g->dev, b->buf, NULL);
        return false;
    }
    vkBindBufferMemory(g->dev, b->buf, b->mem, 0);
    return true;
}

static void gbuf_free(struct gpu *g, struct gbuf *b)
{
    vkDestroyBuffer(g->dev, b->buf, NULL);
    vkFreeMemory(g->dev, b->mem, NULL);
}

static VkCommandBuffer copy_cmd(struct gpu *g, VkBuffer src, VkDeviceSize src_off, VkBuffer dst,
                                VkDeviceSize dst_off, VkDeviceSize len)
{
    VkCommandBuffer cb;
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = g->pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    vkAllocateCommandBuffers(g->dev, &ai, &cb);
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    vkBeginCommandBuffer(cb, &bi);
    VkBufferCopy region = {.srcOffset = src_off, .dstOffset = dst_off, .size = len};
    vkCmdCopyBuffer(cb, src, dst, 1, &region);
    vkEndCommandBuffer(cb);
    return cb;
}

static void submit(struct gpu *g, VkCommandBuffer cb, VkFence fence)
{
    VkSubmitInfo si = {
        .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    VkResult r = vkQueueSubmit(g->queue, 1, &si, fence);
    if (r != VK_SUCCESS)
        die("vkQueueSubmit", r);
}

/* ---- pread into staging ------------------------------------------------ */

struct pread_job {
    struct gpu *g;
    int fd;
    uint8_t *dst;
    uint64_t size, chunk, piece;
    uint32_t pieces_per_chunk, n_tasks;
    bool dma; /* false: fill only, no copies */
    _Atomic uint32_t next;
    _Atomic uint32_t left[MAX_CHUNKS];
    VkCommandBuffer cmd[MAX_CHUNKS];
    pthread_mutex_t queue;
};

static void *pread_worker(void *arg)
{
    struct pread_job *j = arg;
    for (;;) {
        uint32_t t = j->next++;
        if (t >= j->n_tasks)
            return NULL;
        uint32_t k = t / j->pieces_per_chunk, p = t % j->pieces_per_chunk;
        uint64_t lo = k * j->chunk, hi = lo + j->chunk < j->size ? lo + j->chunk : j->size;
        uint64_t a = lo + (hi - lo) * p / j->pieces_per_chunk;
        uint64_t z = lo + (hi - lo) * (p + 1) / j->pieces_per_chunk;
        while (a < z) {
            ssize_t got = pread(j->fd, j->dst + a, z - a, (off_t)a);
            if (got <= 0) {
                memset(j->dst + a, 0, z - a);
                break;
            }
            a += (uint64_t)got;
        }
        if (--j->left[k] == 0 && j->dma) {
            pthread_mutex_lock(&j->queue);
            submit(j->g, j->cmd[k], VK_NULL_HANDLE);
            pthread_mutex_unlock(&j->queue);
        }
    }
}

static double run_pread(struct gpu *g, int fd, uint64_t size, uint64_t chunk, uint32_t threads,
                        struct gbuf *staging, struct gbuf *hay, VkFence fence, bool dma)
{
    struct pread_job j = {
        .g = g, .fd = fd, .dst = staging->map, .size = size, .chunk = chunk, .dma = dma};
    uint32_t n = (uint32_t)((size + chunk - 1) / chunk);
    j.pieces_per_chunk = threads;
    j.n_tasks = n * threads;
    for (uint32_t k = 0; k < n; k++) {
        uint64_t lo = k * chunk, len = lo + chunk < size ? chunk : size - lo;
        j.cmd[k] = copy_cmd(g, staging->buf, lo, hay->buf, lo, len);
        j.left[k] = threads;
    }
    pthread_mutex_init(&j.queue, NULL);
    double t0 = now_s();
    pthread_t th[64];
    for (uint32_t i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, pread_worker, &j);
    for (uint32_t i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    VkCommandBuffer none = VK_NULL_HANDLE;
    (void)none;
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
    vkQueueSubmit(g->queue, 1, &si, fence); /* after every chunk in queue order */
    vkWaitForFences(g->dev, 1, &fence, VK_TRUE, UINT64_MAX);
    double t = now_s() - t0;
    vkResetFences(g->dev, 1, &fence);
    vkFreeCommandBuffers(g->dev, g->pool, n, j.cmd);
    pthread_mutex_destroy(&j.queue);
    return t;
}

/* Every chunk's copy from staging (already filled), submitted at once: the
 * copy engine's rate alone. */
static double run_copies(struct gpu *g, uint64_t size, uint64_t chunk, struct gbuf *staging,
                         struct gbuf *hay, VkFence fence)
{
    uint32_t n = (uint32_t)((size + chunk - 1) / chunk);
    VkCommandBuffer cmd[MAX_CHUNKS];
    for (uint32_t k = 0; k < n; k++) {
        uint64_t lo = k * chunk, len = lo + chunk < size ? chunk : size - lo;
        cmd[k] = copy_cmd(g, staging->buf, lo, hay->buf, lo, len);
    }
    double t0 = now_s();
    VkSubmitInfo si = {
        .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = n, .pCommandBuffers = cmd};
    vkQueueSubmit(g->queue, 1, &si, fence);
    vkWaitForFences(g->dev, 1, &fence, VK_TRUE, UINT64_MAX);
    double t = now_s() - t0;
    vkResetFences(g->dev, 1, &fence);
    vkFreeCommandBuffers(g->dev, g->pool, n, cmd);
    return t;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return v[n / 2];
}

/* pread into `staging` with the copies, the fill alone, and the copies
 * alone (staging filled): medians of `iters`, after a warm-up. */
static void time_staging(struct gpu *g, int fd, uint64_t size, uint64_t chunk, uint32_t threads,
                         int iters, struct gbuf *staging, struct gbuf *hay, VkFence fence,
                         const char *what)
{
    double v[MAX_ITERS], m;
    run_pread(g, fd, size, chunk, threads, staging, hay, fence, true); /* warm-up */
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < iters; i++)
            v[i] = pass == 2
                       ? run_copies(g, size, chunk, staging, hay, fence)
                       : run_pread(g, fd, size, chunk, threads, staging, hay, fence, pass == 0);
        m = median(v, iters);
        static const char *const name[] = {"total", "fill only (no copies)",
                                           "copies only (staging filled)"};
        printf("pread file   %s%-28s %8.2f ms  %6.2f GB/s\n", what, name[pass], m * 1e3,
               (double)size / m / 1e9);
    }
}

/* ---- import --------------------------------------------------------------- */

struct import_times {
    double map, import, wait, release, total;
    bool refused;
};

/* Maps the file, imports it chunk by chunk (each chunk's copy submitted as
 * soon as it is imported), waits, releases. */
/* How the bytes are mapped for the import: the file's or memfd's pages
 * shared read-only (a sealed memfd allows no more), privately with write
 * permission (pages stay the page cache's until written), or anonymous
 * memory that already holds them (a client's buffer in process, or a
 * frame the daemon received): mapped once, imported and pinned anew every
 * time, as a batch would. */
enum map_kind { MK_SHARED_RO, MK_PRIVATE_RW, MK_ANON };

static struct import_times run_import(struct gpu *g, int fd, uint64_t size, uint64_t chunk,
                                      bool populate, VkExternalMemoryHandleTypeFlagBits type,
                                      struct gbuf *hay, VkFence fence, enum map_kind kind,
                                      uint8_t *anon)
{
    struct import_times t = {0};
    uint32_t n = (uint32_t)((size + chunk - 1) / chunk);
    struct gbuf *src = calloc(n, sizeof(*src));
    VkCommandBuffer *cmd = calloc(n, sizeof(*cmd));
    double t0 = now_s();
    uint64_t mapped = (size + g->align - 1) / g->align * g->align;
    void *p = anon;
    if (kind != MK_ANON)
        p = mmap(NULL, mapped, kind == MK_PRIVATE_RW ? PROT_READ | PROT_WRITE : PROT_READ,
                 (kind == MK_PRIVATE_RW ? MAP_PRIVATE : MAP_SHARED) | (populate ? MAP_POPULATE : 0),
                 fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    double t1 = now_s();
    t.map = t1 - t0;
    uint32_t made = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint64_t lo = k * chunk, len = lo + chunk < mapped ? chunk : mapped - lo;
        if (!import_range(g, (uint8_t *)p + lo, len, type, &src[k])) {
            t.refused = true;
            break;
        }
        made++;
        uint64_t copy = lo + len <= size ? len : size - lo;
        cmd[k] = copy_cmd(g, src[k].buf, 0, hay->buf, lo, copy);
        submit(g, cmd[k], k + 1 == n ? fence : VK_NULL_HANDLE);
    }
    double t2 = now_s();
    t.import = t2 - t1;
    if (!t.refused)
        vkWaitForFences(g->dev, 1, &fence, VK_TRUE, UINT64_MAX);
    else
        vkQueueWaitIdle(g->queue);
    double t3 = now_s();
    t.wait = t3 - t2;
    t.total = t3 - t0;
    vkResetFences(g->dev, 1, &fence);
    for (uint32_t k = 0; k < made; k++) {
        vkFreeCommandBuffers(g->dev, g->pool, 1, &cmd[k]);
        gbuf_free(g, &src[k]);
    }
    if (kind != MK_ANON)
        munmap(p, mapped);
    t.release = now_s() - t3;
    free(src);
    free(cmd);
    return t;
}

static int make_memfd(int from, uint64_t size)
{
    int m = memfd_create("import_bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (m < 0 || ftruncate(m, (off_t)size) != 0)
        return -1;
    uint8_t *buf = malloc(16 * MIB);
    for (uint64_t at = 0; at < size;) {
        ssize_t got = pread(from, buf, 16 * MIB, (off_t)at);
        if (got <= 0)
            break;
        if (pwrite(m, buf, (size_t)got, (off_t)at) != got)
            break;
        at += (uint64_t)got;
    }
    free(buf);
    fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
    return m;
}

int main(int argc, char **argv)
{
    const char *file = "/tmp/s15/default.big";
    uint64_t size = 0, chunk = 64 * MIB;
    int iters = 5;
    uint32_t threads = 16, device = 0;
    bool populate = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--file") == 0 && i + 1 < argc)
            file = argv[++i];
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
            size = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--chunk") == 0 && i + 1 < argc)
            chunk = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = (uint32_t)atoi(argv[++i]);
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = (uint32_t)atoi(argv[++i]);
        else if (strcmp(argv[i], "--populate") == 0)
            populate = true;
        else {
            fprintf(stderr, "usage: import_bench [--file PATH] [--size BYTES] [--chunk BYTES] "
                            "[--iters N] [--threads N] [--populate] [--device N]\n");
            return 2;
        }
    }
    iters = iters < 1 ? 1 : iters > MAX_ITERS ? MAX_ITERS : iters;
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    int fd = open(file, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "import_bench: cannot open %s: %s\n", file, strerror(errno));
        return 2;
    }
    if (size == 0 || size > (uint64_t)st.st_size)
        size = (uint64_t)st.st_size;
    if ((size + chunk - 1) / chunk > MAX_CHUNKS)
        chunk = (size + MAX_CHUNKS - 1) / MAX_CHUNKS;
    struct gpu g = {0};
    gpu_open(&g, device);
    if (g.has_import)
        chunk = (chunk + g.align - 1) / g.align * g.align;
    struct gbuf hay, staging;
    gbuf_make(&g, &hay, size, VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
              VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    gbuf_make(&g, &staging, size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
              VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    memset(staging.map, 0,
           size); /* touched once, as the daemon's staging is after its first batch */
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence;
    vkCreateFence(g.dev, &fci, NULL, &fence);
    printf("%s: %llu bytes, chunk %llu, %u threads, %d iterations%s\n", file,
           (unsigned long long)size, (unsigned long long)chunk, threads, iters,
           populate ? ", MAP_POPULATE" : "");

    double v[MAX_ITERS];
    time_staging(&g, fd, size, chunk, threads, iters, &staging, &hay, fence, "");
    double m;
    /* staging in host-cached memory: the fill writes cached lines, the
     * copy engine reads them over PCIe (snooped) */
    const VkMemoryPropertyFlags cached = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                         VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                         VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
    if (has_type(&g, cached)) {
        struct gbuf cst;
        gbuf_make(&g, &cst, size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, cached);
        memset(cst.map, 0, size);
        time_staging(&g, fd, size, chunk, threads, iters, &cst, &hay, fence, "cached staging ");
    } else {
        printf("no host-cached coherent memory type\n");
    }

    int mfd = make_memfd(fd, size);
    if (mfd >= 0) {
        for (int i = 0; i < iters; i++)
            v[i] = run_pread(&g, mfd, size, chunk, threads, &staging, &hay, fence, true);
        m = median(v, iters);
        printf("pread memfd  total %8.2f ms  %6.2f GB/s\n", m * 1e3, (double)size / m / 1e9);
    }
    if (!g.has_import) {
        printf("import: VK_EXT_external_memory_host not offered\n");
        return 0;
    }
    static const struct {
        const char *name;
        VkExternalMemoryHandleTypeFlagBits type;
    } types[] = {
        {"host_alloc", VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT},
        {"host_mapped", VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_MAPPED_FOREIGN_MEMORY_BIT_EXT},
    };
    /* the bytes in anonymous memory (2 MiB aligned: transparent huge pages
     * where the kernel gives them), filled once */
    uint64_t amapped = (size + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
    uint8_t *anon =
        mmap(NULL, amapped + 2 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon == MAP_FAILED) {
        perror("mmap anonymous");
        return 2;
    }
    anon = (uint8_t *)(((uintptr_t)anon + 2 * MIB - 1) & ~(uintptr_t)(2 * MIB - 1));
    madvise(anon, amapped, MADV_HUGEPAGE);
    for (uint64_t at = 0; at < size;) {
        ssize_t got = pread(fd, anon + at, size - at, (off_t)at);
        if (got <= 0)
            break;
        at += (uint64_t)got;
    }
    int sources[4] = {fd, mfd, mfd, -1};
    const enum map_kind kinds[4] = {MK_SHARED_RO, MK_SHARED_RO, MK_PRIVATE_RW, MK_ANON};
    const char *source_names[4] = {"file", "memfd", "memfd-private-rw", "anonymous"};
    uint64_t chunks[3] = {chunk, 16 * MIB, size};
    for (int s = 0; s < 4; s++) {
        if (sources[s] < 0 && kinds[s] != MK_ANON)
            continue;
        for (size_t ty = 0; ty < 2; ty++) {
            for (int c = 0; c < 3; c++) {
                uint64_t ch = (chunks[c] + g.align - 1) / g.align * g.align;
                if (c > 0 && ch == chunk)
                    continue;
                if ((size + ch - 1) / ch > MAX_CHUNKS)
                    continue;
                double tot[MAX_ITERS], imp[MAX_ITERS], wt[MAX_ITERS], rel[MAX_ITERS], mp[MAX_ITERS];
                bool refused = false;
                for (int i = 0; i < iters && !refused; i++) {
                    struct import_times t = run_import(&g, sources[s], size, ch, populate,
                                                       types[ty].type, &hay, fence, kinds[s], anon);
                    refused = t.refused;
                    tot[i] = t.total;
                    imp[i] = t.import;
                    wt[i] = t.wait;
                    rel[i] = t.release;
                    mp[i] = t.map;
                }
                if (refused) {
                    printf("import %-16s %-11s chunk %5llu MiB: refused (%s)\n", source_names[s],
                           types[ty].name, (unsigned long long)(ch / MIB), g_refusal);
                    continue;
                }
                double mt = median(tot, iters);
                printf("import %-16s %-11s chunk %5llu MiB: total %8.2f ms  %6.2f GB/s  (map %.2f, "
                       "import+submit %.2f, wait %.2f, release %.2f ms)\n",
                       source_names[s], types[ty].name, (unsigned long long)(ch / MIB), mt * 1e3,
                       (double)size / mt / 1e9, median(mp, iters) * 1e3, median(imp, iters) * 1e3,
                       median(wt, iters) * 1e3, median(rel, iters) * 1e3);
            }
        }
    }
    return 0;
}
