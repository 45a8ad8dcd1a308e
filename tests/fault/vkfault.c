/* vkfault: fails chosen Vulkan calls on command (see vkfault.h). */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <vulkan/vulkan.h>

#include "vkfault.h"

static atomic_int countdown[VKFAULT_N_OPS];
static atomic_int fired[VKFAULT_N_OPS];
static atomic_int calls[VKFAULT_N_OPS];
static atomic_int repeat[VKFAULT_N_OPS]; /* further calls to fail after the armed one */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

/* Arms what a spec "alloc=N,submit=N,wait=N,lost=N" names. */
static void parse_spec(const char *spec)
{
    static const char *const names[VKFAULT_N_OPS] = {"alloc", "submit", "wait", "lost", "pipeline"};
    for (int op = 0; op < VKFAULT_N_OPS; op++) {
        size_t n = strlen(names[op]);
        for (const char *p = spec; (p = strstr(p, names[op])) != NULL; p += n) {
            if ((p == spec || p[-1] == ',') && p[n] == '=') {
                atomic_store(&repeat[op], 0);
                atomic_store(&countdown[op], atoi(p + n + 1));
                break;
            }
        }
    }
}

static void read_env(void)
{
    const char *spec = getenv("VKFAULT");
    if (spec != NULL)
        parse_spec(spec);
}

/* A daemon test arms a running vkscand by writing a spec into the file
 * $VKFAULT_CTL (write a temporary file and rename it over, so the file is
 * whole): the next intercepted call reads it, removes it and arms. Only the
 * caller whose unlink succeeds applies it, so it is applied once. */
static void poll_ctl(void)
{
    const char *path = getenv("VKFAULT_CTL");
    if (path == NULL)
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[128];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0 || unlink(path) != 0)
        return;
    buf[n] = '\0';
    parse_spec(buf);
}

void vkfault_arm(enum vkfault_op op, int nth)
{
    vkfault_arm_n(op, nth, 1);
}

void vkfault_arm_n(enum vkfault_op op, int nth, int count)
{
    pthread_once(&env_once, read_env);
    atomic_store(&repeat[op], nth > 0 && count > 1 ? count - 1 : 0);
    atomic_store(&countdown[op], nth);
}

int vkfault_fired(enum vkfault_op op)
{
    return atomic_load(&fired[op]);
}

int vkfault_calls(enum vkfault_op op)
{
    return atomic_load(&calls[op]);
}

/* Counts the call; true when it is the one armed to fail. */
static bool should_fail(enum vkfault_op op)
{
    pthread_once(&env_once, read_env);
    poll_ctl();
    atomic_fetch_add(&calls[op], 1);
    int c = atomic_load(&countdown[op]);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&countdown[op], &c, c - 1)) {
            if (c != 1)
                return false;
            atomic_fetch_add(&fired[op], 1);
            if (atomic_load(&repeat[op]) > 0) {
                atomic_fetch_sub(&repeat[op], 1);
                atomic_store(&countdown[op], 1);
            }
            return true;
        }
    }
    return false;
}

/* The next definition of `name` (the loader's), through memcpy because ISO
 * C has no conversion from an object pointer to a function pointer. */
static void next_fn(const char *name, void *fnp, size_t size)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (f == NULL)
        abort(); /* the loader must be linked: a test setup bug */
    memcpy(fnp, &f, size);
}

VKAPI_ATTR VkResult VKAPI_CALL vkCreateInstance(const VkInstanceCreateInfo *info,
                                                const VkAllocationCallbacks *alloc, VkInstance *out)
{
    static PFN_vkCreateInstance next;
    if (next == NULL)
        next_fn("vkCreateInstance", &next, sizeof(next));
    const char *hold = getenv("VKFAULT_HOLD");
    while (hold != NULL && access(hold, F_OK) != 0)
        usleep(2000);
    return next(info, alloc, out);
}

VKAPI_ATTR VkResult VKAPI_CALL vkAllocateMemory(VkDevice device, const VkMemoryAllocateInfo *info,
                                                const VkAllocationCallbacks *alloc,
                                                VkDeviceMemory *mem)
{
    static PFN_vkAllocateMemory next;
    if (next == NULL)
        next_fn("vkAllocateMemory", &next, sizeof(next));
    if (should_fail(VKFAULT_ALLOC))
        return VK_ERROR_OUT_OF_DEVICE_MEMORY;
    return next(device, info, alloc, mem);
}

VKAPI_ATTR VkResult VKAPI_CALL vkQueueSubmit(VkQueue queue, uint32_t n, const VkSubmitInfo *submits,
                                             VkFence fence)
{
    static PFN_vkQueueSubmit next;
    if (next == NULL)
        next_fn("vkQueueSubmit", &next, sizeof(next));
    if (should_fail(VKFAULT_SUBMIT))
        return VK_ERROR_OUT_OF_DEVICE_MEMORY;
    return next(queue, n, submits, fence);
}

VKAPI_ATTR VkResult VKAPI_CALL vkCreateComputePipelines(VkDevice device, VkPipelineCache cache,
                                                        uint32_t n,
                                                        const VkComputePipelineCreateInfo *infos,
                                                        const VkAllocationCallbacks *alloc,
                                                        VkPipeline *out)
{
    static PFN_vkCreateComputePipelines next;
    if (next == NULL)
        next_fn("vkCreateComputePipelines", &next, sizeof(next));
    if (should_fail(VKFAULT_PIPELINE)) {
        for (uint32_t i = 0; i < n; i++)
            out[i] = VK_NULL_HANDLE;
        return VK_ERROR_UNKNOWN;
    }
    return next(device, cache, n, infos, alloc, out);
}

VKAPI_ATTR VkResult VKAPI_CALL vkWaitForFences(VkDevice device, uint32_t n, const VkFence *fences,
                                               VkBool32 all, uint64_t timeout)
{
    static PFN_vkWaitForFences next;
    if (next == NULL)
        next_fn("vkWaitForFences", &next, sizeof(next));
    /* The real wait runs first, so a failed wait leaves no work in flight. */
    VkResult r = next(device, n, fences, all, timeout);
    if (should_fail(VKFAULT_WAIT))
        return VK_TIMEOUT;
    if (should_fail(VKFAULT_LOST))
        return VK_ERROR_DEVICE_LOST;
    return r;
}
