/*
 * vkscand: the vkscan scanning service. docs/daemon.md is the operator's
 * guide; ARCHITECTURE.md the design.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "metrics_http.h"
#include "server.h"

/*
 * vkscand --check-config [FILE] [--key value]...: reads the configuration as
 * a start would (FILE stands for --config FILE; without it the default
 * file), prints every effective `key value` on stdout, or the error with its
 * file and line on stderr, and exits 0 or 1. Nothing is opened or bound.
 */
static int check_config(int argc, char **argv)
{
    char **args = calloc((size_t)argc + 2, sizeof(*args));
    if (args == NULL)
        return EXIT_FAILURE;
    int n = 0;
    args[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--check-config") != 0) {
            args[n++] = argv[i];
        } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
            args[n++] = "--config";
            args[n++] = argv[++i];
        }
    }
    struct daemon_config cfg;
    struct vks_error err = {0};
    int rc = config_load(&cfg, n, args, stdout, &err);
    free(args);
    if (rc == 1)
        return EXIT_SUCCESS;
    if (rc != 0) {
        fprintf(stderr, "vkscand: configuration error: %s\n", err.msg);
        return EXIT_FAILURE;
    }
    struct sockaddr_storage sa;
    if (cfg.metrics_listen[0] != '\0' &&
        metrics_http_parse_addr(cfg.metrics_listen, &sa, &err) != 0) {
        fprintf(stderr, "vkscand: configuration error: %s\n", err.msg);
        return EXIT_FAILURE;
    }
    printf("# vkscand %s: effective configuration (config file: %s)\n", VKS_VERSION,
           cfg.config_file[0] != '\0' ? cfg.config_file : "none");
    config_print(&cfg, stdout);
    return EXIT_SUCCESS;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--check-config") == 0)
            return check_config(argc, argv);
    }
    uint64_t main_ns = uv_hrtime();
    struct daemon_config cfg;
    struct vks_error err = {0};
    int rc = config_load(&cfg, argc, argv, stdout, &err);
    if (rc == 1)
        return EXIT_SUCCESS;
    if (rc != 0) {
        log_err("vkscand: %s", err.msg);
        return 2;
    }
    log_set_level((enum log_level)cfg.log_level);
    signal(SIGPIPE, SIG_IGN);
    struct server *srv;
    rc = server_create(&cfg, argc, argv, main_ns, &srv, &err);
    if (rc != 0) {
        log_err("vkscand cannot start: %s", err.msg);
        return EXIT_FAILURE;
    }
    struct metrics_http *metrics = NULL;
    if (cfg.metrics_listen[0] != '\0' &&
        metrics_http_create(srv, cfg.metrics_listen, &metrics, &err) != 0) {
        log_err("vkscand cannot start: %s", err.msg);
        server_destroy(srv);
        return EXIT_FAILURE;
    }
    int status = server_run(srv);
    metrics_http_destroy(metrics);
    server_destroy(srv);
    return status;
}
