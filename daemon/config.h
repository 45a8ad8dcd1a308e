/*
 * vkscand's configuration: one struct with every setting and its default,
 * filled from (lowest to highest precedence) built-in defaults, an optional
 * config file (`--config FILE`, `key value` lines) and command-line flags.
 * Every key is both a flag (`--key value` or `--key=value`) and a config
 * file line (`key value`); docs/daemon.md lists them with their defaults.
 *
 * Limits are explicit so that hello and stats can report them and a client
 * can size its requests before it sends them.
 */
#ifndef VKS_DAEMON_CONFIG_H
#define VKS_DAEMON_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"

#define CONFIG_PATH_MAX 4096
#define CONFIG_MAX_IDS  64 /* entries of allow-uids / allow-gids */

/* A parsed allow-uids or allow-gids value: the text as written (for logs
 * and reload comparison) and the ids it names, user and group names
 * resolved when the file is read. */
struct config_ids {
    char text[1024];
    uint32_t n;
    uint32_t id[CONFIG_MAX_IDS];
};

enum config_engine {
    CONFIG_ENGINE_AUTO = 0, /* GPU engine if a Vulkan device opens, else the CPU scanner */
    CONFIG_ENGINE_GPU = 1,  /* GPU engine or fail at start */
    CONFIG_ENGINE_CPU = 2,  /* CPU reference scanner only (tests, hosts without Vulkan) */
};

struct daemon_config {
    /* Where and how to listen; not changed by a reload. */
    char socket_path[108]; /* sizeof(sun_path) */
    uint32_t socket_mode;  /* chmod of a socket we bind ourselves */
    char socket_group[64]; /* chown group of a socket we bind ourselves; "" = ours */
    char state_dir[CONFIG_PATH_MAX];
    char config_file[CONFIG_PATH_MAX]; /* "" when none */
    char device[128];                  /* "" = automatic choice, else index or name */
    enum config_engine engine;

    /* Request limits (reloadable). */
    uint64_t max_frame;       /* bytes of one frame, length prefix excluded */
    uint32_t max_rules;       /* rules in one catalog.load */
    uint32_t max_buffers;     /* buffers (inline plus fds) in one scan */
    uint64_t max_scan_bytes;  /* total buffer bytes of one scan */
    uint32_t max_hits;        /* hits in one scan reply (a request may ask for fewer) */
    uint32_t max_connections; /* open connections; more are accepted and closed */
    uint32_t scan_timeout_ms; /* default queue + run deadline when a scan names none */

    /* Per-tenant quotas (reloadable). */
    uint32_t tenant_max_requests; /* queued scans before its sockets stop being read */
    uint64_t tenant_max_bytes;    /* queued scan bytes before its sockets stop being read */
    uint32_t tenant_max_catalogs; /* catalogs a tenant may hold */

    /* Scheduler and engine (reloadable except inflight). */
    uint64_t quantum;            /* DRR quantum in bytes */
    uint64_t batch_max_bytes;    /* bytes in one engine batch */
    uint32_t batch_max_buffers;  /* buffers in one engine batch */
    uint32_t inflight_batches;   /* batches on each GPU device (handed to the CPU engine)
                                  * at once; not reloadable */
    uint64_t cpu_max_work;       /* engine auto: batches of at most this many buffer bytes
                                  * times DFA groups run on the CPU scanner; not reloadable */
    uint32_t cpu_threads;        /* CPU engine scanning threads; 0: cores minus one (at least 1) */
    uint32_t cpu_spin_us;        /* an idle CPU engine thread spins this long for work first */
    bool engine_replies;         /* CPU engine threads write the scan replies of their
                                  * batches (else the loop); not reloadable */
    uint64_t cpu_segment_bytes;  /* CPU engine: a larger buffer splits into segments this size */
    uint32_t cpu_max_wait_us;    /* engine auto on a GPU: past this CPU queue wait, small batches
                                  * go to the GPU too */
    uint32_t gpu_timeout_ms;     /* GPU batch fence wait; 0: the engine's default (30 s) */
    char devices[128];           /* "" (one engine on `device`), "all", or "N[,N...]" */
    uint64_t result_cache_bytes; /* hits of unchanged files kept for rescans (daemon/rcache.h);
                                  * 0: off; not reloadable */
    uint32_t preload_catalogs;   /* catalogs used last, read at start and made resident on
                                  * every GPU engine; 0: none; not reloadable */
    uint32_t recent_save_ms;     /* the catalogs used last are written this often when they
                                  * changed; 0: only at a clean stop; not reloadable */
    uint64_t warm_bytes;         /* bytes each GPU engine's batch buffers hold from the start
                                  * (on a GPU, not lavapipe); 0: none; not reloadable */

    /* Memory (reloadable). */
    uint64_t device_budget;       /* device bytes for resident catalogs; 0 = the engine's choice */
    uint64_t host_catalog_budget; /* host bytes of unreferenced catalogs kept in memory */

    /* Who may connect, checked with SO_PEERCRED at accept (reloadable): a
     * peer whose uid is in allow_uids, or whose primary or supplementary
     * group is in allow_gids. Both empty: anyone who can open the socket. */
    struct config_ids allow_uids;
    struct config_ids allow_gids;

    /* Hostile tenants (reloadable except compile_threads). Every
     * per-connection and service-wide buffer has a cap; docs/daemon.md,
     * "Memory bound", adds them up. */
    uint64_t max_unsent_bytes;       /* unsent reply bytes of one connection: past it, closed */
    uint64_t frame_budget;           /* bytes of partly received frames over all connections */
    uint32_t frame_timeout_ms;       /* a started frame must be complete within this; 0 = none */
    uint64_t read_ahead;             /* bytes one read may take past a frame, for clients
                                      * whose hello allows it (session.c); 0 = never */
    uint32_t idle_timeout_ms;        /* a connection with nothing in flight is closed; 0 = none */
    uint32_t tenant_max_connections; /* open connections of one uid */
    uint32_t stream_max_per_tenant;  /* open streams of one uid, all connections */
    uint64_t stream_max_state_bytes; /* state of one stream (streamscan_size) */
    uint32_t stream_idle_timeout_ms; /* a stream without requests is closed; 0 = never */
    uint64_t stream_gpu_min_bytes; /* writes with a middle this long go to GPU batches; 0 = never */
    uint32_t compile_threads;      /* threads of the compile pool; not reloadable */
    uint32_t tenant_max_compiles;  /* compiles of one uid running at once */
    uint32_t max_states;           /* ceiling of a catalog.load's max_states */
    uint32_t compile_timeout_ms;   /* longest compile; 0 = none */
    uint32_t batch_max_ms;         /* estimated run time of one engine batch */
    struct config_ids admin_gids;  /* groups whose members see service-wide stats */

    /* Prometheus endpoint (daemon/metrics_http.c): "" = off, else
     * HOST:PORT (an IPv4 or IPv6 literal) serving GET /metrics; not
     * reloadable. Per-tenant series only with metrics_tenants (reloadable). */
    char metrics_listen[64];
    bool metrics_tenants;

    uint32_t drain_timeout_ms; /* SIGTERM: longest wait for in-flight work */
    int log_level;             /* enum log_level */
};

/* Fills `cfg` with the built-in defaults. */
void config_defaults(struct daemon_config *cfg);

/* The config file read when --config is not given (VKSCAND_DEFAULT_CONFIG,
 * <sysconfdir>/vkscand/vkscand.conf: /etc/vkscand/vkscand.conf for a /usr
 * install). */
extern const char config_default_file[];

/*
 * Builds the configuration from defaults, a config file and the flags in
 * argv[1..argc). The file is the one --config names (an error when it
 * cannot be read; `--config ""` reads none), else `default_file` when it
 * exists (a missing default file is not an error; NULL: none). Returns 0; 1
 * when --help or --version was handled (the text went to `out`) and the
 * caller should exit 0; or a negative code with `err` naming the bad flag,
 * or the file and line of the bad key, and what is accepted there. Main
 * (loop) thread only: user and group names are resolved with getpwnam(3).
 */
int config_load_from(struct daemon_config *cfg, int argc, char **argv, const char *default_file,
                     FILE *out, struct vks_error *err);

/* config_load_from with config_default_file. */
int config_load(struct daemon_config *cfg, int argc, char **argv, FILE *out, struct vks_error *err);

/* Whether a peer with uid `uid`, primary group `gid` and the supplementary
 * groups `groups[0..n_groups)` may connect under `cfg`'s allow lists. */
bool config_peer_allowed(const struct daemon_config *cfg, uint32_t uid, uint32_t gid,
                         const uint32_t *groups, size_t n_groups);

/*
 * Copies the reloadable settings of `next` into `cur` (SIGHUP) and logs each
 * change; settings that need a restart keep their value and their change is
 * logged as ignored. Loop thread.
 */
void config_apply_reload(struct daemon_config *cur, const struct daemon_config *next);

/* Prints every key with its effective value, one `key value` line each in
 * the config file's syntax (vkscand --check-config). */
void config_print(const struct daemon_config *cfg, FILE *out);

/* Parses a size such as "4096", "64K", "64M" or "2G" (powers of 1024). */
int config_parse_size(const char *s, uint64_t *out);

#endif
