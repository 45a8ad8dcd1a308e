/*
 * vkscand: the vkscan scanning service. docs/daemon.md is the operator's
 * guide; ARCHITECTURE.md the design.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "log.h"
#include "server.h"

int main(int argc, char **argv)
{
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
    rc = server_create(&cfg, argc, argv, &srv, &err);
    if (rc != 0) {
        log_err("vkscand cannot start: %s", err.msg);
        return EXIT_FAILURE;
    }
    int status = server_run(srv);
    server_destroy(srv);
    return status;
}
