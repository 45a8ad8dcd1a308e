/*
 * vkscan: the command-line tool (docs/vkscan.1 is its manual).
 *
 *   vkscan scan -r RULES PATH...   scan files through vkscand (libvkscan)
 *   vkscan status                  what the daemon runs and holds
 *                                  (vkscan_status.c)
 *   vkscan rules check FILE        compile a pattern file locally and report
 *   vkscan rules scan FILE PATH..  scan files locally with the CPU reference
 *                                  scanner (no daemon), grep -b style output
 *
 * Exit codes follow grep: 0 a match (or success), 1 no match, 2 an error
 * (for `rules check`: 1 when some rule was rejected).
 *
 * This file: main, the dispatch to the commands (`scan` is vkscan_scan.c)
 * and what they share (vkscan_cli.h).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "vkscan/vkscan.h"
#include "vkscan_cli.h"

/* ---- files ---------------------------------------------------------------- */

int cli_read_file(const char *path, char **data, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (f == NULL)
        return -errno;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int rc = buf == NULL ? -ENOMEM : ferror(f) ? -EIO : 0;
    if (f != stdin)
        fclose(f);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    *data = buf;
    *len = n;
    return 0;
}

void cli_print_reject(const char *file, uint32_t line, uint32_t pos, const char *id,
                      const char *msg)
{
    fprintf(stderr, "%s:%u: rule '%s' rejected at column %u: %s\n", file, line, id, pos + 1, msg);
}

/* ---- talking to vkscand ------------------------------------------------- */

const char *cli_socket_path = NULL;

const char *cli_daemon_socket(void)
{
    if (cli_socket_path != NULL)
        return cli_socket_path;
    const char *env = getenv("VKSCAN_SOCKET");
    return env != NULL && env[0] != '\0' ? env : CLI_DEFAULT_SOCKET;
}

/* "a directory", "a regular file", ... for messages. */
static const char *file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "a directory"
           : S_ISREG(m)  ? "a regular file"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
                         : "a file of another kind";
}

int cli_daemon_connect(uint32_t io_ms, bool quiet, struct vks_client **out)
{
    struct vks_client_options opt;
    vks_client_options_init(&opt);
    opt.client_name = "vkscan";
    if (io_ms != 0)
        opt.io_timeout_ms = io_ms;
    struct vks_error err = {0};
    const char *path = cli_daemon_socket();
    int rc = vks_client_connect(path, &opt, out, &err);
    if (rc == 0 || quiet)
        return rc == 0 ? 0 : 2;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
        fprintf(stderr,
                "vkscan: %s is %s, not a socket: point --socket or $VKSCAN_SOCKET at "
                "vkscand's socket (its --socket; default %s)\n",
                path, file_kind(st.st_mode), CLI_DEFAULT_SOCKET);
    else if (rc == -ENOENT || rc == -ECONNREFUSED || rc == -ENOTDIR)
        fprintf(stderr,
                "vkscan: vkscand is not running at %s: start it with systemctl start "
                "vkscand\n",
                path);
    else if (rc == -EACCES || rc == -EPERM)
        fprintf(stderr,
                "vkscan: may not open vkscand's socket %s: %s: join the vkscan group "
                "(usermod -aG vkscan $USER) and log in again\n",
                path, strerror(-rc));
    else
        fprintf(stderr, "vkscan: %s\n", err.msg);
    return 2;
}

/* ---- output helpers ----------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 when invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c < 0x80             ? 1
                 : (c & 0xe0) == 0xc0 ? 2
                 : (c & 0xf0) == 0xe0 ? 3
                 : (c & 0xf8) == 0xf0 ? 4
                                      : 0;
    if (len == 0 || len > n || (len == 2 && c < 0xc2) || (len == 4 && c > 0xf4))
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    }
    if ((len == 3 && c == 0xe0 && s[1] < 0xa0) || (len == 3 && c == 0xed && s[1] >= 0xa0) ||
        (len == 4 && c == 0xf0 && s[1] < 0x90) || (len == 4 && c == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

void cli_json_str(FILE *f, const char *s, bool *lossy)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        size_t len = utf8_len(p + i, n - i);
        if (len == 0) {
            fputs("\\ufffd", f);
            if (lossy != NULL)
                *lossy = true;
            i++;
        } else if (p[i] == '"' || p[i] == '\\') {
            fprintf(f, "\\%c", p[i++]);
        } else if (p[i] < 0x20) {
            fprintf(f, "\\u%04x", p[i++]);
        } else {
            fwrite(p + i, 1, len, f);
            i += len;
        }
    }
    fputc('"', f);
}

void cli_fmt_bytes(uint64_t v, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double d = (double)v;
    unsigned u = 0;
    while (d >= 1024 && u < 4) {
        d /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%llu B", (unsigned long long)v);
    else
        snprintf(buf, cap, "%.1f %s", d, units[u]);
}

/* ---- main ----------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vkscan [--socket PATH] COMMAND [ARGS]\n"
            "  scan -r RULES [options] PATH...\n"
            "                          scan files and directories through vkscand\n"
            "  status [--json | --prometheus]\n"
            "                          the daemon's version, devices, catalogs, queues\n"
            "  rules check FILE        compile a pattern file here and report\n"
            "  rules scan RULES PATH.. scan files here with the CPU reference scanner\n"
            "Every command takes --help. The socket is --socket, else $VKSCAN_SOCKET, else\n"
            "%s. See vkscan(1).\n",
            CLI_DEFAULT_SOCKET);
}

static int usage_error(const char *fmt, const char *what)
{
    fputs("vkscan: ", stderr);
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    usage(stderr);
    return 2;
}

/* Whether argv[0..argc) asks for help (before a "--"). */
static bool wants_help(int argc, char **argv)
{
    for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
    }
    return false;
}

/* `vkscan rules ...`: argv[0] is "rules". */
static int cmd_rules(int argc, char **argv)
{
    static const char check[] = "usage: vkscan rules check [-v] FILE\n"
                                "Compiles the pattern file here (no daemon) and prints its "
                                "groups, states,\nfingerprint and every rejected rule; -v adds "
                                "each rule's engine, size and the\nnumber of passes. Exit "
                                "status: 0 all rules compiled, 1 a rule\nrejected, 2 an error.\n";
    static const char scan[] = "usage: vkscan rules scan RULES PATH...\n"
                               "Scans files here with the CPU reference scanner (no daemon); "
                               "prints\npath:end offset:rule id. Exit status: 0 a match, 1 none, "
                               "2 an error.\n";
    const char *sub = argc > 1 ? argv[1] : NULL;
    if (sub != NULL && strcmp(sub, "check") == 0) {
        if (wants_help(argc - 2, argv + 2)) {
            fputs(check, stdout);
            return 0;
        }
        bool verbose = argc > 2 && strcmp(argv[2], "-v") == 0;
        if (argc != 3 + verbose) {
            fprintf(stderr, "vkscan rules check: %s\n%s",
                    argc < 3 + verbose ? "no FILE given" : "more than one FILE given", check);
            return 2;
        }
        return cli_rules_check(argc - 2, argv + 2);
    }
    if (sub != NULL && strcmp(sub, "scan") == 0) {
        if (wants_help(argc - 2, argv + 2)) {
            fputs(scan, stdout);
            return 0;
        }
        if (argc < 4) {
            fprintf(stderr, "vkscan rules scan: %s\n%s",
                    argc < 3 ? "no RULES file given" : "no PATH to scan given", scan);
            return 2;
        }
        return cli_rules_scan(argc - 2, argv + 2);
    }
    if (sub != NULL && (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0)) {
        printf("%s%s", check, scan);
        return 0;
    }
    fprintf(stderr, "vkscan rules: %s%s%s: use rules check FILE or rules scan RULES PATH...\n",
            sub != NULL ? "unknown subcommand '" : "no subcommand given", sub != NULL ? sub : "",
            sub != NULL ? "'" : "");
    return 2;
}

int main(int argc, char **argv)
{
    int i = 1;
    while (i < argc && argv[i][0] == '-') {
        if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
            cli_socket_path = argv[i + 1];
            i += 2;
        } else if (strcmp(argv[i], "--socket") == 0) {
            return usage_error("%s", "--socket needs a path");
        } else if (strncmp(argv[i], "--socket=", 9) == 0) {
            cli_socket_path = argv[i++] + 9;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("vkscan %s (libvkscan %s)\n", VKS_VERSION, vks_version());
            return 0;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            return usage_error("unknown option '%s' before the command", argv[i]);
        }
    }
    if (i >= argc)
        return usage_error("%s", "no command given");
    if (strcmp(argv[i], "scan") == 0)
        return cli_scan(argc - i, argv + i);
    if (strcmp(argv[i], "status") == 0) {
        /* status takes no operands: say so before its usage line does */
        for (int k = i + 1; k < argc && strcmp(argv[k], "--") != 0; k++) {
            if (strcmp(argv[k], "--socket") == 0)
                k++;
            else if (argv[k][0] != '-')
                return usage_error("status takes no arguments, not '%s'", argv[k]);
        }
        return cli_status(argc - i, argv + i);
    }
    if (strcmp(argv[i], "rules") == 0)
        return cmd_rules(argc - i, argv + i);
    if (strcmp(argv[i], "help") == 0) {
        usage(stdout);
        return 0;
    }
    return usage_error("unknown command '%s'", argv[i]);
}
