/*
 * Device choice, engine lifetime and device memory: the Vulkan setup half of
 * gpu/. The batch half is batch.c, pipelines are pipeline.c.
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "lit.h"

int gpu_vk_error(VkResult r, const char *what, struct vks_error *err)
{
    switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
        return vks_error_set(err, -ENOMEM,
                             "%s: out of %s memory (VkResult %d): free memory, or lower the "
                             "batch size or the memory budget",
                             what, r == VK_ERROR_OUT_OF_HOST_MEMORY ? "host" : "device", (int)r);
    case VK_ERROR_DEVICE_LOST:
        return vks_error_set(
            err, -ENODEV, "%s: the Vulkan device was lost: destroy and re-create the engine", what);
    case VK_TIMEOUT:
        return vks_error_set(err, -ETIMEDOUT,
                             "%s: the batch did not finish within the timeout: destroy and "
                             "re-create the engine, or raise the timeout",
                             what);
    case VK_ERROR_INITIALIZATION_FAILED:
    case VK_ERROR_INCOMPATIBLE_DRIVER:
        return vks_error_set(err, -ENODEV,
                             "%s: no usable Vulkan driver (VkResult %d): install a Vulkan ICD "
                             "(mesa-vulkan-drivers gives the CPU device lavapipe)",
                             what, (int)r);
    default:
        return vks_error_set(err, -EIO, "%s failed with VkResult %d", what, (int)r);
    }
}

static int create_instance(VkInstance *out, struct vks_error *err)
{
    VkApplicationInfo app = {
        .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
        .pApplicationName = "vkscan",
        .pEngineName = "vkscan",
        .apiVersion = VK_API_VERSION_1_2,
    };
    VkInstanceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
        .pApplicationInfo = &app,
    };
    VkResult r = vkCreateInstance(&ci, NULL, out);
    if (r != VK_SUCCESS) {
        *out = VK_NULL_HANDLE;
        return gpu_vk_error(r, "vkCreateInstance", err);
    }
    return 0;
}

static bool has_extension(VkPhysicalDevice pd, const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0)
        return false;
    VkExtensionProperties *ext = calloc(n, sizeof(*ext));
    if (ext == NULL)
        return false;
    bool found = false;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, ext) == VK_SUCCESS) {
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(ext[i].extensionName, name) == 0;
    }
    free(ext);
    return found;
}

static enum gpu_device_type map_type(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
        return GPU_DEVICE_INTEGRATED;
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
        return GPU_DEVICE_DISCRETE;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
        return GPU_DEVICE_VIRTUAL;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
        return GPU_DEVICE_CPU;
    default:
        return GPU_DEVICE_OTHER;
    }
}

static void fill_heaps(VkPhysicalDevice pd, struct gpu_device_info *info)
{
    VkPhysicalDeviceMemoryBudgetPropertiesEXT mb = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT,
    };
    VkPhysicalDeviceMemoryProperties2 mp = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
        .pNext = info->memory_budget ? &mb : NULL,
    };
    vkGetPhysicalDeviceMemoryProperties2(pd, &mp);
    info->n_heaps = mp.memoryProperties.memoryHeapCount;
    if (info->n_heaps > GPU_MAX_HEAPS)
        info->n_heaps = GPU_MAX_HEAPS;
    for (uint32_t i = 0; i < info->n_heaps; i++) {
        const VkMemoryHeap *h = &mp.memoryProperties.memoryHeaps[i];
        info->heaps[i].size = h->size;
        info->heaps[i].device_local = (h->flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
        info->heaps[i].budget = info->memory_budget ? mb.heapBudget[i] : h->size;
        info->heaps[i].usage = info->memory_budget ? mb.heapUsage[i] : 0;
    }
}

static void describe(VkPhysicalDevice pd, uint32_t index, struct gpu_device_info *info)
{
    memset(info, 0, sizeof(*info));
    info->index = index;
    bool sm = has_extension(pd, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME);
    VkPhysicalDeviceShaderSMBuiltinsPropertiesNV smp = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV,
    };
    VkPhysicalDeviceDriverProperties drv = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES,
        .pNext = sm ? &smp : NULL,
    };
    VkPhysicalDeviceSubgroupProperties sg = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
        .pNext = &drv,
    };
    VkPhysicalDeviceProperties2 p2 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
        .pNext = &sg,
    };
    vkGetPhysicalDeviceProperties2(pd, &p2);
    const VkPhysicalDeviceProperties *p = &p2.properties;
    snprintf(info->name, sizeof(info->name), "%s", p->deviceName);
    /* driverName and driverInfo are 256 bytes each: keep what fits. */
    size_t dn = strnlen(drv.driverName, sizeof(drv.driverName));
    if (dn > sizeof(info->driver) - 2)
        dn = sizeof(info->driver) - 2;
    memcpy(info->driver, drv.driverName, dn);
    info->driver[dn] = ' ';
    size_t di = strnlen(drv.driverInfo, sizeof(drv.driverInfo));
    if (di > sizeof(info->driver) - dn - 2)
        di = sizeof(info->driver) - dn - 2;
    memcpy(info->driver + dn + 1, drv.driverInfo, di);
    info->driver[dn + 1 + di] = '\0';
    info->type = map_type(p->deviceType);
    info->vendor_id = p->vendorID;
    info->device_id = p->deviceID;
    info->api_version = p->apiVersion;
    info->subgroup_size = sg.subgroupSize;
    if (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT)
        info->subgroup_ops = sg.supportedOperations;
    uint32_t need = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_BALLOT_BIT |
                    VK_SUBGROUP_FEATURE_ARITHMETIC_BIT | VK_SUBGROUP_FEATURE_VOTE_BIT;
    info->subgroup_hits = (info->subgroup_ops & need) == need;
    info->max_workgroup_size = p->limits.maxComputeWorkGroupSize[0];
    if (info->max_workgroup_size > p->limits.maxComputeWorkGroupInvocations)
        info->max_workgroup_size = p->limits.maxComputeWorkGroupInvocations;
    info->max_shared_bytes = p->limits.maxComputeSharedMemorySize;
    info->max_storage_range = p->limits.maxStorageBufferRange;
    if (sm) {
        info->sm_count = smp.shaderSMCount;
        info->warps_per_sm = smp.shaderWarpsPerSM;
    }
    /* lavapipe cuts loops past 65535 iterations per invocation (GPU.md). */
    info->loop_budget =
        drv.driverID == VK_DRIVER_ID_MESA_LLVMPIPE ? LAVAPIPE_LOOP_LIMIT : 0xffffffffu;
    info->memory_budget = has_extension(pd, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
    fill_heaps(pd, info);

    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    VkQueueFamilyProperties qf[16];
    if (nq > 16)
        nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qf);
    for (uint32_t i = 0; i < nq; i++) {
        if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && qf[i].timestampValidBits > 0)
            info->timestamps = true;
    }
}

static int list_physical(VkInstance inst, VkPhysicalDevice **out, uint32_t *n,
                         struct vks_error *err)
{
    *out = NULL;
    *n = 0;
    VkResult r = vkEnumeratePhysicalDevices(inst, n, NULL);
    if (r != VK_SUCCESS)
        return gpu_vk_error(r, "vkEnumeratePhysicalDevices", err);
    if (*n == 0)
        return vks_error_set(err, -ENODEV,
                             "Vulkan found no device: install a GPU driver, or "
                             "mesa-vulkan-drivers for the CPU device lavapipe");
    *out = calloc(*n, sizeof(**out));
    if (*out == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory listing Vulkan devices");
    r = vkEnumeratePhysicalDevices(inst, n, *out);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        free(*out);
        *out = NULL;
        return gpu_vk_error(r, "vkEnumeratePhysicalDevices", err);
    }
    return 0;
}

int gpu_device_list(struct gpu_device_info *out, uint32_t cap, uint32_t *n, struct vks_error *err)
{
    VkInstance inst;
    *n = 0;
    int rc = create_instance(&inst, err);
    if (rc < 0)
        return rc;
    VkPhysicalDevice *pds;
    uint32_t np;
    rc = list_physical(inst, &pds, &np, err);
    if (rc == 0) {
        for (uint32_t i = 0; i < np && i < cap; i++)
            describe(pds[i], i, &out[i]);
        *n = np;
        free(pds);
    }
    vkDestroyInstance(inst, NULL);
    return rc;
}

int gpu_engine_list_devices(const struct gpu_engine *eng, struct gpu_device_info *out, uint32_t cap,
                            uint32_t *n, struct vks_error *err)
{
    VkPhysicalDevice *pds;
    uint32_t np;
    *n = 0;
    int rc = list_physical(eng->inst, &pds, &np, err);
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < np && i < cap; i++)
        describe(pds[i], i, &out[i]);
    *n = np;
    free(pds);
    return 0;
}

static int type_rank(enum gpu_device_type t)
{
    static const int rank[] = {
        [GPU_DEVICE_DISCRETE] = 5, [GPU_DEVICE_INTEGRATED] = 4, [GPU_DEVICE_VIRTUAL] = 3,
        [GPU_DEVICE_CPU] = 2,      [GPU_DEVICE_OTHER] = 1,
    };
    return rank[t];
}

static bool name_matches(const char *name, const char *want)
{
    size_t nl = strlen(name), wl = strlen(want);
    for (size_t i = 0; i + wl <= nl; i++) {
        size_t k = 0;
        while (k < wl && tolower((unsigned char)name[i + k]) == tolower((unsigned char)want[k]))
            k++;
        if (k == wl)
            return true;
    }
    return false;
}

static int choose_device(struct gpu_engine *eng, const char *want, struct vks_error *err)
{
    VkPhysicalDevice *pds;
    uint32_t np;
    int rc = list_physical(eng->inst, &pds, &np, err);
    if (rc < 0)
        return rc;
    bool by_index = want != NULL && want[0] != '\0' && strspn(want, "0123456789") == strlen(want);
    int best = -1, best_rank = 0;
    struct gpu_device_info info;
    for (uint32_t i = 0; i < np; i++) {
        describe(pds[i], i, &info);
        int rank = type_rank(info.type);
        if (by_index)
            rank = (uint32_t)strtoul(want, NULL, 10) == i ? 1 : 0;
        else if (want != NULL && want[0] != '\0' && !name_matches(info.name, want))
            rank = 0;
        if (rank > best_rank) {
            best = (int)i;
            best_rank = rank;
            eng->info = info;
        }
    }
    if (best >= 0)
        eng->phys = pds[best];
    free(pds);
    if (best < 0)
        return vks_error_set(err, -ENODEV,
                             "no Vulkan device matches \"%s\" among %u: name one by index or by "
                             "part of its name (vkscan devices lists them)",
                             want, np);
    return 0;
}

static int create_device(struct gpu_engine *eng, struct vks_error *err)
{
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(eng->phys, &nq, NULL);
    VkQueueFamilyProperties qf[16];
    if (nq > 16)
        nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(eng->phys, &nq, qf);
    eng->qfam = UINT32_MAX;
    for (uint32_t i = 0; i < nq && eng->qfam == UINT32_MAX; i++) {
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT)
            eng->qfam = i;
    }
    if (eng->qfam == UINT32_MAX)
        return vks_error_set(err, -ENODEV, "device %s has no compute queue: choose another",
                             eng->info.name);
    eng->ts_valid_bits = qf[eng->qfam].timestampValidBits;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
        .queueFamilyIndex = eng->qfam,
        .queueCount = 1,
        .pQueuePriorities = &prio,
    };
    const char *ext[1];
    uint32_t n_ext = 0;
    if (eng->info.memory_budget)
        ext[n_ext++] = VK_EXT_MEMORY_BUDGET_EXTENSION_NAME;
    VkDeviceCreateInfo dci = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
        .queueCreateInfoCount = 1,
        .pQueueCreateInfos = &qci,
        .enabledExtensionCount = n_ext,
        .ppEnabledExtensionNames = ext,
    };
    VkResult r = vkCreateDevice(eng->phys, &dci, NULL, &eng->dev);
    if (r != VK_SUCCESS) {
        eng->dev = VK_NULL_HANDLE;
        return gpu_vk_error(r, "vkCreateDevice", err);
    }
    vkGetDeviceQueue(eng->dev, eng->qfam, 0, &eng->queue);
    vkGetPhysicalDeviceMemoryProperties(eng->phys, &eng->mem);
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(eng->phys, &p);
    eng->ts_period = p.limits.timestampPeriod;
    return 0;
}

static int find_type(const struct gpu_engine *eng, uint32_t bits, VkMemoryPropertyFlags want,
                     VkMemoryPropertyFlags avoid)
{
    for (uint32_t i = 0; i < eng->mem.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = eng->mem.memoryTypes[i].propertyFlags;
        if ((bits & (1u << i)) && (f & want) == want && (f & avoid) == 0)
            return (int)i;
    }
    return -1;
}

static int pick_type(const struct gpu_engine *eng, uint32_t bits, enum gbuf_kind kind)
{
    const VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
    const VkMemoryPropertyFlags hc = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    const VkMemoryPropertyFlags dl = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    const VkMemoryPropertyFlags cached = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
    int t = -1;
    switch (kind) {
    case GBUF_DEVICE:
        if (eng->direct)
            t = find_type(eng, bits, dl | hv | hc, 0);
        if (t < 0)
            t = find_type(eng, bits, dl, hv);
        if (t < 0)
            t = find_type(eng, bits, dl, 0);
        break;
    case GBUF_STAGING:
        t = find_type(eng, bits, hv | hc, dl);
        break;
    case GBUF_READBACK:
        t = find_type(eng, bits, hv | hc | cached, dl);
        if (t < 0)
            t = find_type(eng, bits, hv | cached, dl);
        if (t < 0)
            t = find_type(eng, bits, hv | hc, dl);
        break;
    }
    if (t < 0 && kind != GBUF_DEVICE)
        t = find_type(eng, bits, hv, 0);
    if (t < 0)
        t = find_type(eng, bits, 0, 0);
    return t;
}

VkDeviceSize gbuf_grow_size(VkDeviceSize have, VkDeviceSize size)
{
    if (size <= have)
        return have;
    /* Round up so that batches of similar size reuse the allocation. */
    const VkDeviceSize step = size > (1u << 20) ? (1u << 20) : 4096;
    return (size + step - 1) & ~(step - 1);
}

int gbuf_create(struct gpu_engine *eng, struct gbuf *b, VkDeviceSize size, VkBufferUsageFlags usage,
                enum gbuf_kind kind, struct vks_error *err)
{
    memset(b, 0, sizeof(*b));
    if (size < 16)
        size = 16;
    VkBufferCreateInfo bci = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = size,
        .usage = usage,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    VkResult r = vkCreateBuffer(eng->dev, &bci, NULL, &b->buf);
    if (r != VK_SUCCESS) {
        b->buf = VK_NULL_HANDLE;
        return gpu_vk_error(r, "vkCreateBuffer", err);
    }
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(eng->dev, b->buf, &req);
    int t = pick_type(eng, req.memoryTypeBits, kind);
    if (t < 0) {
        gbuf_destroy(eng, b);
        return vks_error_set(err, -EIO, "device %s has no memory type for a %s buffer",
                             eng->info.name, kind == GBUF_DEVICE ? "device" : "host");
    }
    VkMemoryAllocateInfo mai = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = req.size,
        .memoryTypeIndex = (uint32_t)t,
    };
    r = vkAllocateMemory(eng->dev, &mai, NULL, &b->mem);
    if (r != VK_SUCCESS) {
        b->mem = VK_NULL_HANDLE;
        gbuf_destroy(eng, b);
        return gpu_vk_error(r, "vkAllocateMemory", err);
    }
    b->size = size;
    b->alloc = req.size;
    VkMemoryPropertyFlags f = eng->mem.memoryTypes[t].propertyFlags;
    b->device =
        kind == GBUF_DEVICE || (eng->mem.memoryHeaps[eng->mem.memoryTypes[t].heapIndex].flags &
                                VK_MEMORY_HEAP_DEVICE_LOCAL_BIT);
    b->coherent = (f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
    eng->n_allocs++;
    eng->alloc_bytes += req.size;
    eng->made_bytes += req.size;
    if (b->device)
        eng->device_bytes += req.size;
    r = vkBindBufferMemory(eng->dev, b->buf, b->mem, 0);
    /* staged_upload (tests) leaves device buffers unmapped, so that every
     * byte reaches them through staging and a recorded copy, as on a
     * discrete GPU without host-visible device memory. */
    bool map = (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
               !(kind == GBUF_DEVICE && eng->opt.staged_upload);
    if (r == VK_SUCCESS && map)
        r = vkMapMemory(eng->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map);
    if (r != VK_SUCCESS) {
        gbuf_destroy(eng, b);
        return gpu_vk_error(r, "binding or mapping buffer memory", err);
    }
    return 0;
}

void gbuf_destroy(struct gpu_engine *eng, struct gbuf *b)
{
    if (b->buf != VK_NULL_HANDLE)
        vkDestroyBuffer(eng->dev, b->buf, NULL);
    if (b->mem != VK_NULL_HANDLE) {
        vkFreeMemory(eng->dev, b->mem, NULL);
        eng->n_allocs--;
        eng->alloc_bytes -= b->alloc;
        if (b->device)
            eng->device_bytes -= b->alloc;
    }
    memset(b, 0, sizeof(*b));
}

int gbuf_reserve(struct gpu_engine *eng, struct gbuf *b, VkDeviceSize size,
                 VkBufferUsageFlags usage, enum gbuf_kind kind, struct vks_error *err)
{
    if (b->buf != VK_NULL_HANDLE && b->size >= size)
        return 0;
    VkDeviceSize want = gbuf_grow_size(b->size, size);
    /* Create before destroying: a failed grow keeps the old buffer, which
     * stays bound in the descriptor sets. Only when both do not fit at once
     * is the old one freed first, and then re-created if the new one still
     * fails, so the engine never holds a null buffer. */
    struct gbuf grown;
    int rc = gbuf_create(eng, &grown, want, usage, kind, err);
    if (rc == 0) {
        gbuf_destroy(eng, b);
        *b = grown;
        return 0;
    }
    if (b->buf == VK_NULL_HANDLE)
        return rc;
    VkDeviceSize had = b->size;
    gbuf_destroy(eng, b);
    rc = gbuf_create(eng, b, want, usage, kind, err);
    if (rc < 0) {
        struct vks_error ignored;
        (void)gbuf_create(eng, b, had, usage, kind, &ignored);
    }
    return rc;
}

static uint64_t default_budget(const struct gpu_engine *eng)
{
    uint64_t best = 0;
    for (uint32_t i = 0; i < eng->info.n_heaps; i++) {
        const struct gpu_heap_info *h = &eng->info.heaps[i];
        uint64_t avail = h->budget > h->usage ? h->budget - h->usage : 0;
        if (h->device_local && avail > best)
            best = avail;
    }
    return best / 10 * 9;
}

static int create_pools(struct gpu_engine *eng, struct vks_error *err)
{
    VkCommandPoolCreateInfo pci = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
        .queueFamilyIndex = eng->qfam,
    };
    VkResult r = vkCreateCommandPool(eng->dev, &pci, NULL, &eng->cpool);
    if (r != VK_SUCCESS) {
        eng->cpool = VK_NULL_HANDLE;
        return gpu_vk_error(r, "vkCreateCommandPool", err);
    }
    if (eng->n_frames < 2)
        return 0;
    /* Frame 0 uses the sets gpu_pipeline_init allocated; the others these. */
    uint32_t sets = (eng->n_frames - 1) * GPU_MAX_BATCH_CATALOGS;
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, sets * 7};
    VkDescriptorPoolCreateInfo dpi = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
        .maxSets = sets,
        .poolSizeCount = 1,
        .pPoolSizes = &ps,
    };
    r = vkCreateDescriptorPool(eng->dev, &dpi, NULL, &eng->fpool);
    if (r != VK_SUCCESS) {
        eng->fpool = VK_NULL_HANDLE;
        return gpu_vk_error(r, "vkCreateDescriptorPool", err);
    }
    return 0;
}

/* The command buffers, fence and query pool of the frame being built. */
static int create_commands(struct gpu_engine *eng, struct vks_error *err)
{
    VkCommandBufferAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = eng->cpool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = 1,
    };
    VkResult r = vkAllocateCommandBuffers(eng->dev, &ai, &eng->cmd);
    if (r == VK_SUCCESS) {
        ai.commandBufferCount = MAX_UPLOAD_CHUNKS;
        r = vkAllocateCommandBuffers(eng->dev, &ai, eng->upcmd);
    }
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (r == VK_SUCCESS)
        r = vkCreateFence(eng->dev, &fci, NULL, &eng->fence);
    if (r == VK_SUCCESS && eng->ts_valid_bits > 0) {
        VkQueryPoolCreateInfo qci = {
            .sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
            .queryType = VK_QUERY_TYPE_TIMESTAMP,
            .queryCount = eng->opt.profile ? 2 + GPU_PROF_RANGES : 2,
        };
        r = vkCreateQueryPool(eng->dev, &qci, NULL, &eng->qpool);
    }
    if (r != VK_SUCCESS)
        return gpu_vk_error(r, "creating command buffers, fence and query pool", err);
    return 0;
}

/* Descriptor sets of a frame past the first. */
static int create_sets(struct gpu_engine *eng, struct vks_error *err)
{
    VkDescriptorSetLayout layouts[GPU_MAX_BATCH_CATALOGS];
    for (uint32_t i = 0; i < GPU_MAX_BATCH_CATALOGS; i++)
        layouts[i] = eng->dsl;
    VkDescriptorSetAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
        .descriptorPool = eng->fpool,
        .descriptorSetCount = GPU_MAX_BATCH_CATALOGS,
        .pSetLayouts = layouts,
    };
    VkResult r = vkAllocateDescriptorSets(eng->dev, &ai, eng->sets);
    if (r != VK_SUCCESS)
        return gpu_vk_error(r, "vkAllocateDescriptorSets", err);
    return 0;
}

static int create_buffers(struct gpu_engine *eng, struct vks_error *err)
{
    const VkBufferUsageFlags st = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    const VkBufferUsageFlags dst = VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    const VkBufferUsageFlags src = VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
    uint32_t cap = eng->opt.hit_capacity ? eng->opt.hit_capacity : 65536;
    int rc = gbuf_create(eng, &eng->qs, 4096, st | dst | src, GBUF_DEVICE, err);
    if (rc == 0)
        rc = gbuf_create(eng, &eng->qs_host, 4096, dst, GBUF_READBACK, err);
    if (rc == 0)
        rc = gbuf_create(eng, &eng->hits, (VkDeviceSize)cap * 16, st | src,
                         eng->direct ? GBUF_READBACK : GBUF_DEVICE, err);
    if (rc == 0)
        rc = gbuf_create(eng, &eng->carry, 4096, st | dst, GBUF_DEVICE, err);
    return rc;
}

static int engine_setup(struct gpu_engine *eng, const struct gpu_options *opt,
                        struct vks_error *err)
{
    int rc = create_instance(&eng->inst, err);
    if (rc == 0)
        rc = choose_device(eng, opt->device, err);
    if (rc == 0)
        rc = create_device(eng, err);
    if (rc < 0)
        return rc;
    eng->direct = (eng->info.type == GPU_DEVICE_CPU || eng->info.type == GPU_DEVICE_INTEGRATED) &&
                  !opt->staged_upload;
    eng->budget = opt->memory_budget ? opt->memory_budget : default_budget(eng);
    eng->timeout_ns =
        opt->timeout_us
            ? (uint64_t)opt->timeout_us * 1000u
            : (uint64_t)(opt->timeout_ms ? opt->timeout_ms : GPU_DEFAULT_TIMEOUT_MS) * 1000000u;
    eng->writer = opt->hit_writer;
    if (eng->writer == GPU_HITS_AUTO)
        eng->writer = eng->info.subgroup_hits ? GPU_HITS_SUBGROUP : GPU_HITS_SCALAR;
    if (eng->writer == GPU_HITS_SUBGROUP && !eng->info.subgroup_hits)
        return vks_error_set(err, -EINVAL,
                             "device %s lacks subgroup ballot and arithmetic in compute "
                             "shaders: use the scalar hit writer",
                             eng->info.name);
    if (eng->writer != GPU_HITS_SCALAR && eng->writer != GPU_HITS_SUBGROUP)
        return vks_error_set(err, -EINVAL, "unknown hit writer %d", (int)opt->hit_writer);
    uint32_t threads = opt->upload_threads;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n < 1 ? 1 : (n > GPU_UPLOAD_THREADS_MAX ? GPU_UPLOAD_THREADS_MAX : (uint32_t)n);
    }
    if (upload_pool_create(threads, &eng->pool) < 0)
        return vks_error_set(err, -ENOMEM, "out of memory starting upload threads");
    eng->n_frames = opt->inflight ? opt->inflight : GPU_DEFAULT_INFLIGHT;
    if (eng->n_frames > GPU_MAX_INFLIGHT)
        eng->n_frames = GPU_MAX_INFLIGHT;
    rc = create_pools(eng, err);
    if (rc == 0)
        rc = gpu_pipeline_init(eng, err);
    for (uint32_t i = 0; rc == 0 && i < eng->n_frames; i++) {
        /* Built in the engine's fields, then moved into the frame. */
        rc = i > 0 ? create_sets(eng, err) : 0;
        if (rc == 0)
            rc = create_commands(eng, err);
        if (rc == 0 && i == 0) /* the others' buffers are made at their first batch */
            rc = create_buffers(eng, err);
        gpu_frame_swap(eng, &eng->frames[i]);
    }
    return rc;
}

static void swap_mem(void *a, void *b, size_t n)
{
    unsigned char *p = a, *q = b;
    for (size_t i = 0; i < n; i++) {
        unsigned char t = p[i];
        p[i] = q[i];
        q[i] = t;
    }
}

void gpu_frame_swap(struct gpu_engine *eng, struct gpu_frame *fr)
{
    swap_mem(&eng->hay, &fr->hay, sizeof(eng->hay));
    swap_mem(&eng->staging, &fr->staging, sizeof(eng->staging));
    swap_mem(&eng->meta, &fr->meta, sizeof(eng->meta));
    swap_mem(&eng->qs, &fr->qs, sizeof(eng->qs));
    swap_mem(&eng->qs_host, &fr->qs_host, sizeof(eng->qs_host));
    swap_mem(&eng->hits, &fr->hits, sizeof(eng->hits));
    swap_mem(&eng->hits_host, &fr->hits_host, sizeof(eng->hits_host));
    swap_mem(&eng->carry, &fr->carry, sizeof(eng->carry));
    swap_mem(&eng->cmd, &fr->cmd, sizeof(eng->cmd));
    swap_mem(eng->upcmd, fr->upcmd, sizeof(eng->upcmd));
    swap_mem(&eng->fence, &fr->fence, sizeof(eng->fence));
    swap_mem(&eng->qpool, &fr->qpool, sizeof(eng->qpool));
    swap_mem(eng->sets, fr->sets, sizeof(eng->sets));
    swap_mem(&eng->scratch, &fr->scratch, sizeof(eng->scratch));
}

/* Frees the frame's resources (swapped into the engine's fields). */
static void destroy_frame(struct gpu_engine *eng)
{
    struct gbuf *bufs[] = {&eng->hay,     &eng->staging, &eng->meta,  &eng->qs,
                           &eng->qs_host, &eng->hits,    &eng->carry, &eng->hits_host};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        gbuf_destroy(eng, bufs[i]);
    if (eng->qpool != VK_NULL_HANDLE)
        vkDestroyQueryPool(eng->dev, eng->qpool, NULL);
    if (eng->fence != VK_NULL_HANDLE)
        vkDestroyFence(eng->dev, eng->fence, NULL);
    eng->qpool = VK_NULL_HANDLE;
    eng->fence = VK_NULL_HANDLE;
    gpu_batch_scratch_finish(&eng->scratch);
}

int gpu_engine_create(const struct gpu_options *opt, struct gpu_engine **out, struct vks_error *err)
{
    static const struct gpu_options defaults = {0};
    if (opt == NULL)
        opt = &defaults;
    struct gpu_engine *eng = calloc(1, sizeof(*eng));
    if (eng == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory creating the GPU engine");
    eng->opt = *opt;
    eng->opt.device = NULL;
    eng->opt.pipeline_cache_path = NULL;
    if (opt->pipeline_cache_path != NULL) {
        eng->cache_path = strdup(opt->pipeline_cache_path);
        if (eng->cache_path == NULL) {
            free(eng);
            return vks_error_set(err, -ENOMEM, "out of memory creating the GPU engine");
        }
    }
    int rc = engine_setup(eng, opt, err);
    if (rc < 0) {
        gpu_engine_destroy(eng);
        return rc;
    }
    *out = eng;
    return 0;
}

void gpu_engine_destroy(struct gpu_engine *eng)
{
    if (eng == NULL)
        return;
    if (eng->dev != VK_NULL_HANDLE) {
        /* Also batches submitted and never collected are done after this. */
        vkDeviceWaitIdle(eng->dev);
        for (uint32_t i = 0; i < GPU_MAX_RESIDENT_CATALOGS; i++) {
            gbuf_destroy(eng, &eng->cats[i].buf);
            gbuf_destroy(eng, &eng->cats[i].lit);
        }
        destroy_frame(eng); /* a frame left in the engine's fields by a failed create */
        for (uint32_t i = 0; i < GPU_MAX_INFLIGHT; i++) {
            gpu_frame_swap(eng, &eng->frames[i]);
            destroy_frame(eng);
        }
        gpu_pipeline_finish(eng);
        if (eng->fpool != VK_NULL_HANDLE)
            vkDestroyDescriptorPool(eng->dev, eng->fpool, NULL);
        if (eng->cpool != VK_NULL_HANDLE)
            vkDestroyCommandPool(eng->dev, eng->cpool, NULL);
        vkDestroyDevice(eng->dev, NULL);
    }
    if (eng->inst != VK_NULL_HANDLE)
        vkDestroyInstance(eng->inst, NULL);
    upload_pool_destroy(eng->pool);
    gpu_batch_scratch_finish(&eng->scratch);
    gpu_lit_cache_finish(eng);
    free(eng->cache_path);
    free(eng);
}

const struct gpu_device_info *gpu_engine_device(const struct gpu_engine *eng)
{
    return &eng->info;
}

uint32_t gpu_engine_resident_catalogs(const struct gpu_engine *eng)
{
    return eng->n_cats;
}
