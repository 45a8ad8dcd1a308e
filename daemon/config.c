/*
 * Configuration: one table of keys drives defaults, flags, the config file,
 * --help and reloads, so a new setting is one line here.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#ifndef VKSCAND_DEFAULT_CONFIG
#define VKSCAND_DEFAULT_CONFIG "/etc/vkscand/vkscand.conf"
#endif

const char config_default_file[] = VKSCAND_DEFAULT_CONFIG;

enum opt_type {
    OPT_STR,
    OPT_U32,
    OPT_SIZE,
    OPT_MODE,
    OPT_ENGINE,
    OPT_LOGLEVEL,
    OPT_GROUP, /* a group name or gid, stored as written */
    OPT_UIDS,  /* struct config_ids of users */
    OPT_GIDS,  /* struct config_ids of groups */
    OPT_BOOL,  /* yes/no, true/false, on/off, 1/0 */
};

struct opt {
    const char *name;
    enum opt_type type;
    size_t off;
    size_t size;       /* OPT_STR: buffer size */
    uint64_t min, max; /* numbers: accepted range */
    bool reloadable;
    const char *help;
};

#define OFF(f)      offsetof(struct daemon_config, f)
#define STR(f)      OPT_STR, OFF(f), sizeof(((struct daemon_config *)0)->f)
#define NUM(t, f)   t, OFF(f), 0
#define SIZED(t, f) t, OFF(f), sizeof(((struct daemon_config *)0)->f)
#define KIB         1024ull
#define MIB         (1024ull * 1024)
#define GIB         (1024ull * 1024 * 1024)

static const struct opt opts[] = {
    {"socket", STR(socket_path), 0, 0, false, "Unix socket to listen on"},
    {"socket-mode", NUM(OPT_MODE, socket_mode), 0, 0777, false, "octal mode of the socket"},
    {"socket-group", SIZED(OPT_GROUP, socket_group), 0, 0, false,
     "group of a socket vkscand binds itself (default: its own)"},
    {"allow-uids", SIZED(OPT_UIDS, allow_uids), 0, 0, true,
     "users (names or uids, comma-separated) allowed to connect"},
    {"allow-gids", SIZED(OPT_GIDS, allow_gids), 0, 0, true,
     "groups (names or gids, comma-separated) allowed to connect"},
    {"state-dir", STR(state_dir), 0, 0, false, "directory for the catalog cache"},
    {"config", STR(config_file), 0, 0, false, "config file of `key value` lines"},
    {"device", STR(device), 0, 0, false, "Vulkan device index or name (default: best)"},
    {"engine", NUM(OPT_ENGINE, engine), 0, 0, false, "auto, gpu or cpu"},
    {"max-frame", NUM(OPT_SIZE, max_frame), 64, 1 * GIB, true, "largest frame in bytes"},
    {"max-rules", NUM(OPT_U32, max_rules), 1, 1000000, true, "rules in one catalog.load"},
    {"max-buffers", NUM(OPT_U32, max_buffers), 1, 1u << 20, true, "buffers in one scan"},
    {"max-scan-bytes", NUM(OPT_SIZE, max_scan_bytes), 1, 64 * GIB, true,
     "buffer bytes in one scan"},
    {"max-hits", NUM(OPT_U32, max_hits), 1, 1u << 26, true, "hits in one scan reply"},
    {"max-connections", NUM(OPT_U32, max_connections), 1, 1u << 20, true, "open connections"},
    {"scan-timeout-ms", NUM(OPT_U32, scan_timeout_ms), 1, 3600u * 1000, true,
     "scan deadline when the request names none"},
    {"tenant-max-requests", NUM(OPT_U32, tenant_max_requests), 1, 1u << 20, true,
     "queued scans per tenant before backpressure"},
    {"tenant-max-bytes", NUM(OPT_SIZE, tenant_max_bytes), 1, 1024 * GIB, true,
     "queued scan bytes per tenant before backpressure"},
    {"tenant-max-catalogs", NUM(OPT_U32, tenant_max_catalogs), 1, 1u << 20, true,
     "catalogs one tenant may hold"},
    {"quantum", NUM(OPT_SIZE, quantum), 1, 1 * GIB, true, "fair-queueing quantum in bytes"},
    {"batch-max-bytes", NUM(OPT_SIZE, batch_max_bytes), 1, 64 * GIB, true,
     "bytes in one engine batch"},
    {"batch-max-buffers", NUM(OPT_U32, batch_max_buffers), 1, 1u << 24, true,
     "buffers in one engine batch"},
    {"inflight-batches", NUM(OPT_U32, inflight_batches), 1, 16, false,
     "batches on each GPU device at once (each with its own buffers; one more is queued to "
     "upload while they run), and handed to the CPU engine at once"},
    {"cpu-max-work", NUM(OPT_SIZE, cpu_max_work), 0, 1 * GIB, false,
     "engine auto: batches up to this many bytes x DFA groups scan on the CPU (0: never)"},
    {"cpu-threads", NUM(OPT_U32, cpu_threads), 0, 1024, false,
     "CPU engine scanning threads (0: every core without a GPU engine, else cores minus one)"},
    {"cpu-spin-us", NUM(OPT_U32, cpu_spin_us), 0, 1000000, false,
     "CPU engine: one thread that runs out of work waits this long for more before it sleeps"},
    {"engine-replies", NUM(OPT_BOOL, engine_replies), 0, 0, false,
     "CPU engine: a thread that finished a batch writes its scan replies (no: the loop does)"},
    {"cpu-segment-bytes", NUM(OPT_SIZE, cpu_segment_bytes), 256, 1 * GIB, false,
     "CPU engine: larger buffers are scanned in segments of this size in parallel"},
    {"cpu-max-wait-us", NUM(OPT_U32, cpu_max_wait_us), 0, 60u * 1000 * 1000, false,
     "engine auto on a GPU: past this CPU queue wait, small batches go to the GPU"},
    {"result-cache-bytes", NUM(OPT_SIZE, result_cache_bytes), 0, 64 * GIB, false,
     "memory for the hits of unchanged files, kept so rescans skip them (0: off)"},
    {"recent-save-ms", NUM(OPT_U32, recent_save_ms), 0, 3600u * 1000, false,
     "the catalogs used last are written this often when they changed (0: at a clean stop)"},
    {"preload-catalogs", NUM(OPT_U32, preload_catalogs), 0, 64, false,
     "catalogs used last before the stop, read and made resident at start (0: none)"},
    {"warm-bytes", NUM(OPT_SIZE, warm_bytes), 0, 1 * GIB, false,
     "bytes of batch buffers each GPU engine sets up at start, per batch in flight (0: none)"},
    {"gpu-timeout-ms", NUM(OPT_U32, gpu_timeout_ms), 0, 3600u * 1000, false,
     "GPU batch timeout; a batch past it is re-run on the CPU (0: 30000)"},
    {"devices", STR(devices), 0, 0, false,
     "GPU engines: all, or device indexes N[,N...] (default: one, on `device`)"},
    {"device-budget", NUM(OPT_SIZE, device_budget), 0, 1024 * GIB, true,
     "device bytes for resident catalogs (0: engine default)"},
    {"host-catalog-budget", NUM(OPT_SIZE, host_catalog_budget), 0, 1024 * GIB, true,
     "host bytes of idle catalogs kept in memory"},
    {"max-unsent-bytes", NUM(OPT_SIZE, max_unsent_bytes), 64 * KIB, 16 * GIB, true,
     "unsent reply bytes of one connection before it is closed"},
    {"frame-budget", NUM(OPT_SIZE, frame_budget), 64 * KIB, 1024 * GIB, true,
     "bytes of partly received frames over all connections"},
    {"read-ahead", NUM(OPT_SIZE, read_ahead), 0, 1 * MIB, true,
     "bytes a read may take past a frame, for clients whose hello allows it (0: never)"},
    {"frame-timeout-ms", NUM(OPT_U32, frame_timeout_ms), 0, 3600u * 1000, true,
     "a started frame must arrive whole within this (0: none)"},
    {"idle-timeout-ms", NUM(OPT_U32, idle_timeout_ms), 0, 7 * 24 * 3600u * 1000, true,
     "close connections idle this long (0: never)"},
    {"tenant-max-connections", NUM(OPT_U32, tenant_max_connections), 1, 1u << 20, true,
     "open connections of one uid"},
    {"stream-max-per-tenant", NUM(OPT_U32, stream_max_per_tenant), 1, 1u << 20, true,
     "open streams of one uid"},
    {"stream-max-state-bytes", NUM(OPT_SIZE, stream_max_state_bytes), 256, 1 * GIB, true,
     "bytes of state of one stream"},
    {"stream-idle-timeout-ms", NUM(OPT_U32, stream_idle_timeout_ms), 0, 7 * 24 * 3600u * 1000, true,
     "close streams idle this long (0: never)"},
    {"stream-gpu-min-bytes", NUM(OPT_SIZE, stream_gpu_min_bytes), 0, 1 * GIB, true,
     "a stream write whose middle is longer runs it in a GPU batch (0: never)"},
    {"compile-threads", NUM(OPT_U32, compile_threads), 1, 64, false, "threads compiling rule sets"},
    {"tenant-max-compiles", NUM(OPT_U32, tenant_max_compiles), 1, 64, true,
     "compiles of one uid running at once"},
    {"max-states", NUM(OPT_U32, max_states), 256, 1u << 24, true,
     "largest max_states a catalog.load may ask for"},
    {"compile-timeout-ms", NUM(OPT_U32, compile_timeout_ms), 0, 3600u * 1000, true,
     "longest compile of one rule set (0: none)"},
    {"batch-max-ms", NUM(OPT_U32, batch_max_ms), 1, 60u * 1000, true,
     "estimated run time of one engine batch"},
    {"admin-gids", SIZED(OPT_GIDS, admin_gids), 0, 0, true,
     "groups (names or gids) whose members see every tenant's stats"},
    {"drain-timeout-ms", NUM(OPT_U32, drain_timeout_ms), 0, 3600u * 1000, true,
     "SIGTERM: longest wait for in-flight work"},
    {"log-level", NUM(OPT_LOGLEVEL, log_level), 0, 0, true, "err, warning, notice, info, debug"},
    {"metrics-listen", STR(metrics_listen), 0, 0, false,
     "HOST:PORT serving GET /metrics (Prometheus); empty: off"},
    {"metrics-tenants", NUM(OPT_BOOL, metrics_tenants), 0, 0, true,
     "yes: per-tenant series on the metrics endpoint"},
};
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

void config_defaults(struct daemon_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->socket_path, sizeof(cfg->socket_path), "/run/vkscand/vkscand.sock");
    cfg->socket_mode = 0660;
    snprintf(cfg->state_dir, sizeof(cfg->state_dir), "/var/lib/vkscand");
    cfg->engine = CONFIG_ENGINE_AUTO;
    cfg->max_frame = 64 * MIB;
    cfg->max_rules = 100000;
    cfg->max_buffers = 4096;
    cfg->max_scan_bytes = 1 * GIB;
    cfg->max_hits = 1u << 20;
    cfg->max_connections = 1024;
    cfg->scan_timeout_ms = 60 * 1000;
    cfg->tenant_max_requests = 256;
    cfg->tenant_max_bytes = 2 * GIB;
    cfg->tenant_max_catalogs = 64;
    cfg->quantum = 1 * MIB;
    cfg->batch_max_bytes = 1 * GIB;
    cfg->batch_max_buffers = 65536;
    cfg->inflight_batches = 2;
    cfg->cpu_max_work = 256 * 1024;
    cfg->cpu_spin_us = 50;
    cfg->engine_replies = true;
    cfg->cpu_segment_bytes = 4 * MIB;
    cfg->cpu_max_wait_us = 2000;
    cfg->result_cache_bytes = 64 * MIB;
    cfg->preload_catalogs = 8;
    cfg->recent_save_ms = 10 * 1000;
    cfg->warm_bytes = 0; /* off: on the H200 the set-up delayed the first scans (daemon.md) */
    cfg->device_budget = 0;
    cfg->host_catalog_budget = 1 * GIB;
    cfg->max_unsent_bytes = 64 * MIB;
    cfg->frame_budget = 256 * MIB;
    cfg->frame_timeout_ms = 30 * 1000;
    cfg->read_ahead = 16 * KIB;
    cfg->idle_timeout_ms = 600 * 1000;
    cfg->tenant_max_connections = 256;
    cfg->stream_max_per_tenant = 1024;
    cfg->stream_max_state_bytes = 1 * MIB;
    cfg->stream_idle_timeout_ms = 600 * 1000;
    cfg->stream_gpu_min_bytes = 64 * KIB;
    cfg->compile_threads = 2;
    cfg->tenant_max_compiles = 1;
    cfg->max_states = 1u << 20;
    cfg->compile_timeout_ms = 60 * 1000;
    cfg->batch_max_ms = 50;
    cfg->drain_timeout_ms = 30 * 1000;
    cfg->log_level = LOG_LVL_INFO;
}

int config_parse_size(const char *s, uint64_t *out)
{
    if (s == NULL || !isdigit((unsigned char)s[0]))
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return -EINVAL;
    uint64_t mul = 1;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        mul = KIB;
        end++;
        break;
    case 'm':
    case 'M':
        mul = MIB;
        end++;
        break;
    case 'g':
    case 'G':
        mul = GIB;
        end++;
        break;
    default:
        return -EINVAL;
    }
    if (*end == 'i' || *end == 'B')
        end += (end[0] == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end != '\0' || v > UINT64_MAX / mul)
        return -EINVAL;
    *out = v * mul;
    return 0;
}

static const struct opt *opt_find(const char *name, size_t len)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        if (strlen(opts[i].name) == len && memcmp(opts[i].name, name, len) == 0)
            return &opts[i];
    }
    return NULL;
}

static int parse_number(const struct opt *o, const char *v, uint64_t *out)
{
    if (o->type == OPT_SIZE)
        return config_parse_size(v, out);
    if (!isdigit((unsigned char)v[0]))
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long n = strtoull(v, &end, o->type == OPT_MODE ? 8 : 10);
    if (errno != 0 || *end != '\0')
        return -EINVAL;
    *out = n;
    return 0;
}

/* A user or group named by number or by name; names must exist here. */
static int parse_id(const char *v, bool group, uint32_t *out)
{
    if (isdigit((unsigned char)v[0])) {
        errno = 0;
        char *end;
        unsigned long n = strtoul(v, &end, 10);
        if (errno != 0 || *end != '\0' || n >= UINT32_MAX)
            return -EINVAL;
        *out = (uint32_t)n;
        return 0;
    }
    if (group) {
        const struct group *g = getgrnam(v);
        if (g == NULL)
            return -ENOENT;
        *out = (uint32_t)g->gr_gid;
    } else {
        const struct passwd *pw = getpwnam(v);
        if (pw == NULL)
            return -ENOENT;
        *out = (uint32_t)pw->pw_uid;
    }
    return 0;
}

/* Parses "a,b, 3" into `ids`; an empty value is an empty list. */
static int parse_ids(const struct opt *o, const char *v, struct config_ids *ids, const char *where,
                     struct vks_error *err)
{
    bool group = o->type == OPT_GIDS;
    memset(ids, 0, sizeof(*ids));
    if (strlen(v) >= sizeof(ids->text))
        return vks_error_set(err, -EINVAL, "%s: %s is %zu bytes, the limit is %zu: use ids", where,
                             o->name, strlen(v), sizeof(ids->text) - 1);
    memcpy(ids->text, v, strlen(v) + 1);
    const char *p = v;
    while (*p != '\0') {
        while (*p == ',' || isspace((unsigned char)*p))
            p++;
        size_t n = strcspn(p, ", \t");
        if (n == 0)
            break;
        char name[256];
        if (n >= sizeof(name) || ids->n == CONFIG_MAX_IDS)
            return vks_error_set(err, -EINVAL,
                                 "%s: %s lists more than %u entries or a name over 255 bytes: "
                                 "use a group instead",
                                 where, o->name, CONFIG_MAX_IDS);
        memcpy(name, p, n);
        name[n] = '\0';
        int rc = parse_id(name, group, &ids->id[ids->n]);
        if (rc != 0)
            return vks_error_set(err, -EINVAL, "%s: %s: '%s' is %s: use a %s or the name of one",
                                 where, o->name, name,
                                 rc == -ENOENT
                                     ? (group ? "no group on this host" : "no user on this host")
                                     : "not a valid number",
                                 group ? "gid" : "uid");
        ids->n++;
        p += n;
    }
    return 0;
}

/* Sets one key; `where` names the flag or file line for the message. */
static int opt_set(struct daemon_config *cfg, const struct opt *o, const char *v, const char *where,
                   struct vks_error *err)
{
    char *field = (char *)cfg + o->off;
    uint64_t n = 0;
    enum log_level lvl;
    switch (o->type) {
    case OPT_STR:
        if (strlen(v) >= o->size)
            return vks_error_set(err, -EINVAL,
                                 "%s: %s is %zu bytes, the limit is %zu: use a "
                                 "shorter value",
                                 where, o->name, strlen(v), o->size - 1);
        memcpy(field, v, strlen(v) + 1);
        return 0;
    case OPT_ENGINE:
        if (strcmp(v, "auto") == 0)
            cfg->engine = CONFIG_ENGINE_AUTO;
        else if (strcmp(v, "gpu") == 0)
            cfg->engine = CONFIG_ENGINE_GPU;
        else if (strcmp(v, "cpu") == 0)
            cfg->engine = CONFIG_ENGINE_CPU;
        else
            return vks_error_set(err, -EINVAL, "%s: engine '%s' is unknown: use auto, gpu or cpu",
                                 where, v);
        return 0;
    case OPT_LOGLEVEL:
        if (log_level_parse(v, &lvl) != 0)
            return vks_error_set(err, -EINVAL,
                                 "%s: log level '%s' is unknown: use err, "
                                 "warning, notice, info or debug",
                                 where, v);
        cfg->log_level = (int)lvl;
        return 0;
    case OPT_GROUP: {
        uint32_t gid;
        if (strlen(v) >= o->size)
            return vks_error_set(err, -EINVAL, "%s: %s is %zu bytes, the limit is %zu", where,
                                 o->name, strlen(v), o->size - 1);
        if (v[0] != '\0' && parse_id(v, true, &gid) != 0)
            return vks_error_set(err, -EINVAL,
                                 "%s: %s '%s' is no group on this host: use a gid or the "
                                 "name of an existing group (getent group)",
                                 where, o->name, v);
        memcpy(field, v, strlen(v) + 1);
        return 0;
    }
    case OPT_UIDS:
    case OPT_GIDS:
        return parse_ids(o, v, (struct config_ids *)(void *)field, where, err);
    case OPT_BOOL:
        if (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0 || strcmp(v, "on") == 0 ||
            strcmp(v, "1") == 0)
            *(bool *)(void *)field = true;
        else if (strcmp(v, "no") == 0 || strcmp(v, "false") == 0 || strcmp(v, "off") == 0 ||
                 strcmp(v, "0") == 0)
            *(bool *)(void *)field = false;
        else
            return vks_error_set(err, -EINVAL, "%s: %s '%s' is not yes or no", where, o->name, v);
        return 0;
    case OPT_U32:
    case OPT_SIZE:
    case OPT_MODE:
        break;
    }
    if (parse_number(o, v, &n) != 0 || n < o->min || n > o->max)
        return vks_error_set(err, -EINVAL, "%s: %s '%s' is not a %s between %llu and %llu", where,
                             o->name, v, o->type == OPT_MODE ? "octal mode" : "number",
                             (unsigned long long)o->min, (unsigned long long)o->max);
    if (o->type == OPT_U32 || o->type == OPT_MODE)
        *(uint32_t *)(void *)field = (uint32_t)n;
    else
        *(uint64_t *)(void *)field = n;
    return 0;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* Reads `path`; with `optional` set, a missing file reads as empty and
 * cfg->config_file is cleared. */
static int load_file(struct daemon_config *cfg, const char *path, bool optional,
                     struct vks_error *err)
{
    FILE *f = fopen(path, "re");
    if (f == NULL && optional && errno == ENOENT) {
        cfg->config_file[0] = '\0';
        return 0;
    }
    if (f == NULL)
        return vks_error_set(err, -errno, "cannot open config file %s: %s: check %s", path,
                             strerror(errno), optional ? "its permissions" : "--config");
    char line[CONFIG_PATH_MAX + 128];
    unsigned lineno = 0;
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        char *s = trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        size_t klen = strcspn(s, " \t=");
        char *v = trim(s + klen + (s[klen] != '\0'));
        if (*v == '=')
            v = trim(v + 1);
        char where[CONFIG_PATH_MAX + 32];
        snprintf(where, sizeof(where), "%s:%u", path, lineno);
        const struct opt *o = opt_find(s, klen);
        if (o == NULL || strcmp(o->name, "config") == 0)
            rc = vks_error_set(err, -EINVAL, "%s: unknown key '%.*s': see vkscand --help", where,
                               (int)klen, s);
        else
            rc = opt_set(cfg, o, v, where, err);
    }
    fclose(f);
    return rc;
}

static void print_help(FILE *out)
{
    fprintf(out, "usage: vkscand [--key value]...\n\nEvery key may also be a `key value` "
                 "line in the --config file; flags win.\n\n");
    struct daemon_config d;
    config_defaults(&d);
    for (size_t i = 0; i < N_OPTS; i++)
        fprintf(out, "  --%-22s %s\n", opts[i].name, opts[i].help);
    fprintf(out,
            "  --help / --version / --check-config [FILE] (print the effective configuration)"
            "\n\nDefaults: --socket %s --state-dir %s; without --config, "
            "%s is read when it exists (--config \"\" reads no file).\n",
            d.socket_path, d.state_dir, config_default_file);
}

/* Walks argv; with `only_config` set, stops after picking up --config. */
static int parse_args(struct daemon_config *cfg, int argc, char **argv, bool only_config, FILE *out,
                      struct vks_error *err)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_help(out);
            return 1;
        }
        if (strcmp(a, "--version") == 0) {
            fprintf(out, "vkscand %s\n", VKS_VERSION);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0)
            return vks_error_set(err, -EINVAL,
                                 "unexpected argument '%s': flags are --key value "
                                 "(see --help)",
                                 a);
        const char *eq = strchr(a + 2, '=');
        size_t klen = eq != NULL ? (size_t)(eq - a - 2) : strlen(a + 2);
        const struct opt *o = opt_find(a + 2, klen);
        if (o == NULL)
            return vks_error_set(err, -EINVAL, "unknown flag '%s': see vkscand --help", a);
        const char *v = eq != NULL ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (v == NULL)
            return vks_error_set(err, -EINVAL, "flag --%s needs a value", o->name);
        if (only_config && strcmp(o->name, "config") != 0)
            continue;
        char where[64];
        snprintf(where, sizeof(where), "flag --%s", o->name);
        int rc = opt_set(cfg, o, v, where, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Whether argv names --config (also as --config=FILE). */
static bool config_flag_given(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0)
            return true;
    }
    return false;
}

int config_load_from(struct daemon_config *cfg, int argc, char **argv, const char *default_file,
                     FILE *out, struct vks_error *err)
{
    config_defaults(cfg);
    bool given = config_flag_given(argc, argv);
    if (!given && default_file != NULL)
        snprintf(cfg->config_file, sizeof(cfg->config_file), "%s", default_file);
    int rc = parse_args(cfg, argc, argv, true, out, err);
    if (rc != 0)
        return rc;
    if (cfg->config_file[0] != '\0') {
        rc = load_file(cfg, cfg->config_file, !given, err);
        if (rc != 0)
            return rc;
    }
    rc = parse_args(cfg, argc, argv, false, out, err);
    if (rc != 0)
        return rc;
    if (cfg->socket_path[0] == '\0')
        return vks_error_set(err, -EINVAL, "the socket path is empty: set --socket");
    if (cfg->quantum > cfg->batch_max_bytes)
        cfg->quantum = cfg->batch_max_bytes;
    return 0;
}

int config_load(struct daemon_config *cfg, int argc, char **argv, FILE *out, struct vks_error *err)
{
    return config_load_from(cfg, argc, argv, config_default_file, out, err);
}

static bool ids_have(const struct config_ids *ids, uint32_t id)
{
    for (uint32_t i = 0; i < ids->n; i++) {
        if (ids->id[i] == id)
            return true;
    }
    return false;
}

bool config_peer_allowed(const struct daemon_config *cfg, uint32_t uid, uint32_t gid,
                         const uint32_t *groups, size_t n_groups)
{
    if (cfg->allow_uids.n == 0 && cfg->allow_gids.n == 0)
        return true;
    if (ids_have(&cfg->allow_uids, uid) || ids_have(&cfg->allow_gids, gid))
        return true;
    for (size_t i = 0; i < n_groups; i++) {
        if (ids_have(&cfg->allow_gids, groups[i]))
            return true;
    }
    return false;
}

/* Bytes of the field behind `o`. */
static size_t opt_size(const struct opt *o)
{
    switch (o->type) {
    case OPT_STR:
    case OPT_GROUP:
    case OPT_UIDS:
    case OPT_GIDS:
        return o->size;
    case OPT_SIZE:
        return sizeof(uint64_t);
    case OPT_ENGINE:
        return sizeof(enum config_engine);
    case OPT_LOGLEVEL:
        return sizeof(int);
    case OPT_BOOL:
        return sizeof(bool);
    case OPT_U32:
    case OPT_MODE:
        break;
    }
    return sizeof(uint32_t);
}

static bool opt_equal(const struct opt *o, const struct daemon_config *a,
                      const struct daemon_config *b)
{
    if (o->type == OPT_UIDS || o->type == OPT_GIDS) {
        const struct config_ids *x = (const void *)((const char *)a + o->off);
        const struct config_ids *y = (const void *)((const char *)b + o->off);
        return x->n == y->n && memcmp(x->id, y->id, x->n * sizeof(x->id[0])) == 0 &&
               strcmp(x->text, y->text) == 0;
    }
    return memcmp((const char *)a + o->off, (const char *)b + o->off, opt_size(o)) == 0;
}

void config_apply_reload(struct daemon_config *cur, const struct daemon_config *next)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        if (opt_equal(o, cur, next))
            continue;
        if (!o->reloadable) {
            log_warn("reload: %s changed but needs a restart: keeping the running value", o->name);
            continue;
        }
        memcpy((char *)cur + o->off, (const char *)next + o->off, opt_size(o));
        log_info("reload: %s changed", o->name);
    }
    log_set_level((enum log_level)cur->log_level);
}

void config_print(const struct daemon_config *cfg, FILE *out)
{
    static const char *const engines[] = {"auto", "gpu", "cpu"};
    static const char *const levels[] = {"err", "warning", "notice", "info", "debug"};
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        const char *field = (const char *)cfg + o->off;
        if (strcmp(o->name, "config") == 0)
            continue;
        fprintf(out, "%s ", o->name);
        switch (o->type) {
        case OPT_STR:
        case OPT_GROUP:
            fprintf(out, "%s\n", field);
            break;
        case OPT_UIDS:
        case OPT_GIDS:
            fprintf(out, "%s\n", ((const struct config_ids *)(const void *)field)->text);
            break;
        case OPT_MODE:
            fprintf(out, "%04o\n", *(const uint32_t *)(const void *)field);
            break;
        case OPT_U32:
            fprintf(out, "%u\n", *(const uint32_t *)(const void *)field);
            break;
        case OPT_SIZE:
            fprintf(out, "%llu\n", (unsigned long long)*(const uint64_t *)(const void *)field);
            break;
        case OPT_ENGINE:
            fprintf(out, "%s\n", (unsigned)cfg->engine < 3 ? engines[cfg->engine] : "?");
            break;
        case OPT_LOGLEVEL:
            fprintf(out, "%s\n",
                    cfg->log_level >= LOG_LVL_ERR && cfg->log_level <= LOG_LVL_DEBUG
                        ? levels[cfg->log_level - LOG_LVL_ERR]
                        : "?");
            break;
        case OPT_BOOL:
            fprintf(out, "%s\n", *(const bool *)(const void *)field ? "yes" : "no");
            break;
        }
    }
}
