/*
 * Pipelines: the scan kernel's SPIR-V builds (one per hit writer, and per
 * hit writer and count of groups for fused DFA groups),
 * compiled per shape (workgroup size, shared-table size, loop budget) into
 * a bounded LRU, backed by a VkPipelineCache kept in a file between runs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const uint32_t scan_scalar_spv[] =
#include "scan_scalar.spv.inc"
    ;
static const uint32_t scan_subgroup_spv[] =
#include "scan_subgroup.spv.inc"
    ;
static const uint32_t scan_fused2_scalar_spv[] =
#include "scan_fused2_scalar.spv.inc"
    ;
static const uint32_t scan_fused2_subgroup_spv[] =
#include "scan_fused2_subgroup.spv.inc"
    ;
static const uint32_t scan_fused3_scalar_spv[] =
#include "scan_fused3_scalar.spv.inc"
    ;
static const uint32_t scan_fused3_subgroup_spv[] =
#include "scan_fused3_subgroup.spv.inc"
    ;
static const uint32_t scan_fused4_scalar_spv[] =
#include "scan_fused4_scalar.spv.inc"
    ;
static const uint32_t scan_fused4_subgroup_spv[] =
#include "scan_fused4_subgroup.spv.inc"
    ;
/* [NG - 2][writer - GPU_HITS_SCALAR] */
static const struct {
    const uint32_t *code;
    size_t size;
} fused_spv[GPU_FUSE_MAX - 1][2] = {
    {{scan_fused2_scalar_spv, sizeof(scan_fused2_scalar_spv)},
     {scan_fused2_subgroup_spv, sizeof(scan_fused2_subgroup_spv)}},
    {{scan_fused3_scalar_spv, sizeof(scan_fused3_scalar_spv)},
     {scan_fused3_subgroup_spv, sizeof(scan_fused3_subgroup_spv)}},
    {{scan_fused4_scalar_spv, sizeof(scan_fused4_scalar_spv)},
     {scan_fused4_subgroup_spv, sizeof(scan_fused4_subgroup_spv)}},
};
static const uint32_t scan_nfa_spv[] =
#include "scan_nfa.spv.inc"
    ;
static const uint32_t scan_lit_spv[] =
#include "scan_lit.spv.inc"
    ;

/* hay, catalog, meta, queue, hits, carry, literal tables (scan_lit.comp) */
#define N_BINDINGS 7u

/* Reads the whole cache file; a missing or unreadable one means a cold
 * start, not an error. Returns a malloc'd buffer or NULL. */
static void *read_cache_file(const char *path, size_t *len)
{
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    void *data = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && n < (64L << 20) && fseek(f, 0, SEEK_SET) == 0) {
            data = malloc((size_t)n);
            if (data != NULL && fread(data, 1, (size_t)n, f) == (size_t)n) {
                *len = (size_t)n;
            } else {
                free(data);
                data = NULL;
            }
        }
    }
    fclose(f);
    return data;
}

/* Writes the cache to path.tmp and renames it over path, so a crash never
 * leaves a torn file. Failures are ignored: the cache is an optimisation. */
static void save_cache_file(struct gpu_engine *eng)
{
    size_t len = 0;
    if (vkGetPipelineCacheData(eng->dev, eng->pcache, &len, NULL) != VK_SUCCESS || len == 0)
        return;
    void *data = malloc(len);
    if (data == NULL)
        return;
    size_t plen = strlen(eng->cache_path);
    char *tmp = malloc(plen + 5);
    if (tmp != NULL && vkGetPipelineCacheData(eng->dev, eng->pcache, &len, data) == VK_SUCCESS) {
        memcpy(tmp, eng->cache_path, plen);
        memcpy(tmp + plen, ".tmp", 5);
        FILE *f = fopen(tmp, "wb");
        if (f != NULL) {
            bool ok = fwrite(data, 1, len, f) == len;
            ok = fclose(f) == 0 && ok;
            if (!ok || rename(tmp, eng->cache_path) != 0)
                remove(tmp);
        }
    }
    free(tmp);
    free(data);
}

static int create_module(struct gpu_engine *eng, const uint32_t *code, size_t size,
                         VkShaderModule *out, struct vks_error *err)
{
    VkShaderModuleCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
        .codeSize = size,
        .pCode = code,
    };
    VkResult r = vkCreateShaderModule(eng->dev, &ci, NULL, out);
    if (r != VK_SUCCESS) {
        *out = VK_NULL_HANDLE;
        return gpu_vk_error(r, "vkCreateShaderModule", err);
    }
    return 0;
}

static int create_layouts(struct gpu_engine *eng, struct vks_error *err)
{
    VkDescriptorSetLayoutBinding b[N_BINDINGS];
    for (uint32_t i = 0; i < N_BINDINGS; i++) {
        b[i] = (VkDescriptorSetLayoutBinding){
            .binding = i,
            .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            .descriptorCount = 1,
            .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
        };
    }
    VkDescriptorSetLayoutCreateInfo dci = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
        .bindingCount = N_BINDINGS,
        .pBindings = b,
    };
    VkResult r = vkCreateDescriptorSetLayout(eng->dev, &dci, NULL, &eng->dsl);
    if (r != VK_SUCCESS) {
        eng->dsl = VK_NULL_HANDLE;
        return gpu_vk_error(r, "vkCreateDescriptorSetLayout", err);
    }
    VkPushConstantRange pcr = {
        .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
        .size = sizeof(struct scan_push),
    };
    VkPipelineLayoutCreateInfo pci = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
        .setLayoutCount = 1,
        .pSetLayouts = &eng->dsl,
        .pushConstantRangeCount = 1,
        .pPushConstantRanges = &pcr,
    };
    r = vkCreatePipelineLayout(eng->dev, &pci, NULL, &eng->layout);
    if (r != VK_SUCCESS) {
        eng->layout = VK_NULL_HANDLE;
        return gpu_vk_error(r, "vkCreatePipelineLayout", err);
    }
    VkDescriptorPoolSize ps = {
        .type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
        .descriptorCount = N_BINDINGS * GPU_MAX_BATCH_CATALOGS,
    };
    VkDescriptorPoolCreateInfo dpi = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
        .maxSets = GPU_MAX_BATCH_CATALOGS,
        .poolSizeCount = 1,
        .pPoolSizes = &ps,
    };
    r = vkCreateDescriptorPool(eng->dev, &dpi, NULL, &eng->dpool);
    if (r != VK_SUCCESS) {
        eng->dpool = VK_NULL_HANDLE;
        return gpu_vk_error(r, "vkCreateDescriptorPool", err);
    }
    VkDescriptorSetLayout layouts[GPU_MAX_BATCH_CATALOGS];
    for (uint32_t i = 0; i < GPU_MAX_BATCH_CATALOGS; i++)
        layouts[i] = eng->dsl;
    VkDescriptorSetAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
        .descriptorPool = eng->dpool,
        .descriptorSetCount = GPU_MAX_BATCH_CATALOGS,
        .pSetLayouts = layouts,
    };
    r = vkAllocateDescriptorSets(eng->dev, &ai, eng->sets);
    if (r != VK_SUCCESS)
        return gpu_vk_error(r, "vkAllocateDescriptorSets", err);
    return 0;
}

int gpu_pipeline_init(struct gpu_engine *eng, struct vks_error *err)
{
    int rc = create_layouts(eng, err);
    if (rc == 0)
        rc = create_module(eng, scan_scalar_spv, sizeof(scan_scalar_spv),
                           &eng->modules[GPU_HITS_SCALAR], err);
    if (rc == 0 && eng->info.subgroup_hits)
        rc = create_module(eng, scan_subgroup_spv, sizeof(scan_subgroup_spv),
                           &eng->modules[GPU_HITS_SUBGROUP], err);
    for (uint32_t n = 0; n + 1 < GPU_FUSE_MAX && rc == 0; n++) {
        rc = create_module(eng, fused_spv[n][0].code, fused_spv[n][0].size,
                           &eng->fused_modules[n][GPU_HITS_SCALAR], err);
        if (rc == 0 && eng->info.subgroup_hits)
            rc = create_module(eng, fused_spv[n][1].code, fused_spv[n][1].size,
                               &eng->fused_modules[n][GPU_HITS_SUBGROUP], err);
    }
    if (rc == 0)
        rc = create_module(eng, scan_nfa_spv, sizeof(scan_nfa_spv), &eng->nfa_module, err);
    if (rc == 0)
        rc = create_module(eng, scan_lit_spv, sizeof(scan_lit_spv), &eng->lit_module, err);
    if (rc < 0)
        return rc;
    size_t len = 0;
    void *data = eng->cache_path ? read_cache_file(eng->cache_path, &len) : NULL;
    VkPipelineCacheCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
        .initialDataSize = len,
        .pInitialData = data,
    };
    VkResult r = vkCreatePipelineCache(eng->dev, &ci, NULL, &eng->pcache);
    if (r != VK_SUCCESS && data != NULL) {
        /* A cache from another driver or a damaged file: start cold. */
        ci.initialDataSize = 0;
        ci.pInitialData = NULL;
        r = vkCreatePipelineCache(eng->dev, &ci, NULL, &eng->pcache);
    }
    free(data);
    if (r != VK_SUCCESS) {
        eng->pcache = VK_NULL_HANDLE;
        return gpu_vk_error(r, "vkCreatePipelineCache", err);
    }
    return 0;
}

void gpu_pipeline_finish(struct gpu_engine *eng)
{
    if (eng->pcache != VK_NULL_HANDLE && eng->cache_path != NULL)
        save_cache_file(eng);
    for (uint32_t i = 0; i < eng->n_pipes; i++)
        vkDestroyPipeline(eng->dev, eng->pipes[i].pipe, NULL);
    eng->n_pipes = 0;
    if (eng->pcache != VK_NULL_HANDLE)
        vkDestroyPipelineCache(eng->dev, eng->pcache, NULL);
    for (uint32_t i = 0; i < 3; i++) {
        if (eng->modules[i] != VK_NULL_HANDLE)
            vkDestroyShaderModule(eng->dev, eng->modules[i], NULL);
        for (uint32_t n = 0; n + 1 < GPU_FUSE_MAX; n++) {
            if (eng->fused_modules[n][i] != VK_NULL_HANDLE)
                vkDestroyShaderModule(eng->dev, eng->fused_modules[n][i], NULL);
        }
    }
    if (eng->nfa_module != VK_NULL_HANDLE)
        vkDestroyShaderModule(eng->dev, eng->nfa_module, NULL);
    if (eng->lit_module != VK_NULL_HANDLE)
        vkDestroyShaderModule(eng->dev, eng->lit_module, NULL);
    if (eng->dpool != VK_NULL_HANDLE)
        vkDestroyDescriptorPool(eng->dev, eng->dpool, NULL);
    if (eng->layout != VK_NULL_HANDLE)
        vkDestroyPipelineLayout(eng->dev, eng->layout, NULL);
    if (eng->dsl != VK_NULL_HANDLE)
        vkDestroyDescriptorSetLayout(eng->dev, eng->dsl, NULL);
}

/* Names the kernel of `key` for messages. */
static void describe(const struct pipe_key *key, char *out, size_t cap)
{
    char words[32] = "";
    if (key->nfa_words)
        snprintf(words, sizeof(words), ", MAX_WORDS %u", key->nfa_words);
    snprintf(out, cap, "%s scan kernel (%u threads%s)",
             key->lit         ? "literal"
             : key->nfa_words ? "bit-NFA"
                              : "DFA",
             key->wg, words);
}

static int compile(struct gpu_engine *eng, const struct pipe_key *key, VkPipeline *out,
                   struct vks_error *err)
{
    const uint32_t spec[4] = {key->wg, key->smem_words, key->step_budget, key->nfa_words};
    const VkSpecializationMapEntry map[4] = {
        {.constantID = 0, .offset = 0, .size = 4},
        {.constantID = 1, .offset = 4, .size = 4},
        {.constantID = 2, .offset = 8, .size = 4},
        {.constantID = 3, .offset = 12, .size = 4},
    };
    VkSpecializationInfo si = {
        .mapEntryCount = key->nfa_words ? 4 : 3,
        .pMapEntries = map,
        .dataSize = sizeof(spec),
        .pData = spec,
    };
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage =
            {
                .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                .module = key->lit         ? eng->lit_module
                          : key->nfa_words ? eng->nfa_module
                          : key->fuse      ? eng->fused_modules[key->fuse - 2][key->writer]
                                           : eng->modules[key->writer],
                .pName = "main",
                .pSpecializationInfo = &si,
            },
        .layout = eng->layout,
    };
    VkResult r = vkCreateComputePipelines(eng->dev, eng->pcache, 1, &ci, NULL, out);
    if (r == VK_SUCCESS)
        return 0;
    *out = VK_NULL_HANDLE;
    char what[96];
    describe(key, what, sizeof(what));
    if (r == VK_ERROR_DEVICE_LOST)
        return gpu_vk_error(r, what, err);
    if (r != VK_ERROR_OUT_OF_HOST_MEMORY && r != VK_ERROR_OUT_OF_DEVICE_MEMORY) {
        uint32_t slot = eng->n_refused++ % GPU_REFUSED_MAX;
        eng->refused[slot] = *key;
        eng->refused_r[slot] = r;
    }
    return vks_error_set(err, -ENOTSUP, "the driver could not build the %s (VkResult %d)", what,
                         (int)r);
}

int gpu_pipeline_get(struct gpu_engine *eng, const struct pipe_key *key, VkPipeline *out, bool *hit,
                     struct vks_error *err)
{
    eng->tick++;
    for (uint32_t i = 0; i < eng->n_pipes; i++) {
        if (memcmp(&eng->pipes[i].key, key, sizeof(*key)) == 0) {
            eng->pipes[i].last_use = eng->tick;
            *out = eng->pipes[i].pipe;
            *hit = true;
            return 0;
        }
    }
    *hit = false;
    uint32_t n_refused = eng->n_refused < GPU_REFUSED_MAX ? eng->n_refused : GPU_REFUSED_MAX;
    for (uint32_t i = 0; i < n_refused; i++) {
        if (memcmp(&eng->refused[i], key, sizeof(*key)) == 0) {
            char what[96];
            describe(key, what, sizeof(what));
            return vks_error_set(err, -ENOTSUP,
                                 "the driver could not build the %s before (VkResult %d)", what,
                                 (int)eng->refused_r[i]);
        }
    }
    VkPipeline p;
    int rc = compile(eng, key, &p, err);
    if (rc < 0)
        return rc;
    uint32_t slot = eng->n_pipes;
    if (slot == GPU_PIPELINE_LRU) {
        /* Evict the least recently used. No batch is in flight here: the
         * engine waits for every batch before it returns. */
        slot = 0;
        for (uint32_t i = 1; i < eng->n_pipes; i++) {
            if (eng->pipes[i].last_use < eng->pipes[slot].last_use)
                slot = i;
        }
        vkDestroyPipeline(eng->dev, eng->pipes[slot].pipe, NULL);
    } else {
        eng->n_pipes++;
    }
    eng->pipes[slot] = (struct pipe_entry){.key = *key, .pipe = p, .last_use = eng->tick};
    *out = p;
    return 0;
}
