/*
 * What the files of the vkscan CLI share: vkscan.c (main, rules dispatch),
 * vkscan_scan.c (scan) and vkscan_status.c (status). Not installed; main
 * thread only unless a function says otherwise.
 */
#ifndef VKS_CLIENT_VKSCAN_CLI_H
#define VKS_CLIENT_VKSCAN_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vkscan/vkscan.h"

#define CLI_DEFAULT_SOCKET "/run/vkscand/vkscand.sock"

/* --socket when given (borrowed from argv), else NULL. */
extern const char *cli_socket_path;

/* The socket to use: --socket, else $VKSCAN_SOCKET, else the default. */
const char *cli_daemon_socket(void);

/* Connects (io timeout `io_ms`, 0: the library's default); on failure prints
 * what to do (unless `quiet`) and returns the exit status 2. On success *out
 * is the caller's (vks_client_close). Any thread. */
int cli_daemon_connect(uint32_t io_ms, bool quiet, struct vks_client **out);

/* Writes `s` as a JSON string; bytes that are not UTF-8 become U+FFFD, and
 * *lossy (may be NULL) says so (the caller then adds the exact bytes in
 * base64). */
void cli_json_str(FILE *f, const char *s, bool *lossy);

/* "512 B", "1.5 MiB", ... into buf[0..cap). */
void cli_fmt_bytes(uint64_t v, char *buf, size_t cap);

/* Reads the whole file `path` ("-": standard input) into *data (not
 * NUL-terminated; the caller's to free) and *len. Returns 0 or -errno. */
int cli_read_file(const char *path, char **data, size_t *len);

/* Prints a rejected rule on stderr as FILE:LINE: rule 'ID' rejected at
 * column N: reason. */
void cli_print_reject(const char *file, uint32_t line, uint32_t pos, const char *id,
                      const char *msg);

/* `vkscan rules check FILE` and `vkscan rules scan RULES PATH...`, argv
 * after the subcommand; return the exit status. */
int cli_rules_check(int argc, char **argv);
int cli_rules_scan(int argc, char **argv);

/* `vkscan scan [OPTIONS] PATH...` with argv[0] = "scan" (vkscan_scan.c);
 * returns the exit status. */
int cli_scan(int argc, char **argv);

/* `vkscan status [--json | --prometheus] [--socket PATH]` with argv[0] =
 * "status"; returns the exit status. */
int cli_status(int argc, char **argv);

#endif
