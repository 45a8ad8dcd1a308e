/*
 * The vkscan CLI end to end: the binary meson built ($VKSCAN) runs against a
 * real vkscand ($VKSCAND) started on a temporary socket, over a small tree of
 * files with known matches. Checked: the text, --json, --count, --first and
 * -l outputs and grep's exit codes (match, no match, unreadable entry, rule
 * rejected), standard input, batching of many files, the message for a
 * missing daemon, `status` and its Prometheus text, `rules check`, and that
 * the example configuration documents every daemon key and loads; `scan -z`
 * over archives and compressed files written here with libarchive; `status`
 * of a CPU-engine daemon (memory, tenant counters across idle periods) and
 * the exact numbers of common/prom.c.
 *
 * One daemon serves the scan cases (an unchecked fixture: it starts once, in
 * the runner, before the forked tests). Data stays tiny: CI scans on lavapipe.
 */
#include <archive.h>
#include <archive_entry.h>
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prom.h"

/* A NULL-terminated argument list. */
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- fixture: a tree of files and a daemon ------------------------------ */

static char base[64];    /* temporary directory; the CLI runs with it as cwd */
static char sock[128];   /* the daemon's socket */
static pid_t daemon_pid; /* 0 when none runs */
static int notify_fd = -1;

static const char rules_txt[] = "# test rules\n"
                                "lit:\"needle\"\n"
                                "mz:{4d 5a 90 00}\n"
                                "re:/ab[0-9]+c/\n";

static void write_file(const char *rel, const void *data, size_t len)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", base, rel);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ck_assert_msg(fd >= 0, "create %s: %s", path, strerror(errno));
    ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
    close(fd);
}

static void make_dir(const char *rel)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", base, rel);
    ck_assert_int_eq(mkdir(path, 0755), 0);
}

/*
 * tree/a.txt      "needle" twice (ends 9 and 22), "ab12c" (ends 15)
 * tree/empty      no bytes
 * tree/sub/b.bin  MZ header (ends 6)
 * tree/sub/c.txt  nothing to find
 * bad/            like tree/, plus a dangling symbolic link
 * clean/          a file without matches
 * many/           150 files, one match each
 */
static void make_tree(void)
{
    write_file("rules.txt", rules_txt, strlen(rules_txt));
    make_dir("tree");
    make_dir("tree/sub");
    write_file("tree/a.txt", "xx needle ab12c needle\n", 23);
    write_file("tree/empty", "", 0);
    write_file("tree/sub/b.bin", "\x01\x02MZ\x90\x00\x03", 7);
    write_file("tree/sub/c.txt", "nothing here\n", 13);
    make_dir("bad");
    write_file("bad/a.txt", "needle\n", 7);
    char link[256];
    snprintf(link, sizeof(link), "%s/bad/dangling", base);
    ck_assert_int_eq(symlink("/nonexistent/vkscan-test-target", link), 0);
    make_dir("clean");
    write_file("clean/x.txt", "no matches in this file\n", 24);
    make_dir("many");
    for (int i = 0; i < 150; i++) {
        char rel[64], data[32];
        snprintf(rel, sizeof(rel), "many/f%03d.txt", i);
        int n = snprintf(data, sizeof(data), "%03d needle\n", i);
        write_file(rel, data, (size_t)n);
    }
}

static bool wait_ready(int timeout_ms)
{
    struct pollfd p = {.fd = notify_fd, .events = POLLIN};
    for (int waited = 0; waited < timeout_ms; waited += 100) {
        if (poll(&p, 1, 100) == 1) {
            char buf[512] = {0};
            ssize_t n = recv(notify_fd, buf, sizeof(buf) - 1, 0);
            if (n > 0 && strstr(buf, "READY=1") != NULL)
                return true;
        }
        int st;
        if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid) {
            daemon_pid = 0;
            return false;
        }
    }
    return false;
}

/* Starts vkscand on `sock` with extra flags (NULL-terminated, may be NULL)
 * and waits for READY=1 on a notify socket of our own. */
static void daemon_start(const char *const *extra)
{
    char notify[128], state[128];
    snprintf(sock, sizeof(sock), "%s/vkscand.sock", base);
    snprintf(state, sizeof(state), "%s/state", base);
    snprintf(notify, sizeof(notify), "%s/notify", base);
    unlink(notify);
    notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ck_assert_int_lt(strlen(notify), sizeof(sa.sun_path));
    memcpy(sa.sun_path, notify, strlen(notify) + 1);
    ck_assert_int_eq(bind(notify_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    const char *bin = getenv("VKSCAND");
    ck_assert_msg(bin != NULL, "VKSCAND is not set: run through meson test");
    daemon_pid = fork();
    ck_assert_int_ge(daemon_pid, 0);
    if (daemon_pid == 0) {
        const char *argv[24] = {bin,   "--socket",    sock,     "--state-dir",
                                state, "--log-level", "warning"};
        int n = 7;
        for (int i = 0; extra != NULL && extra[i] != NULL && n < 23; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;
        setenv("NOTIFY_SOCKET", notify, 1);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    ck_assert_msg(wait_ready(120000), "vkscand did not become ready");
}

static void daemon_stop(void)
{
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGTERM);
        int st;
        for (int i = 0; i < 300 && waitpid(daemon_pid, &st, WNOHANG) != daemon_pid; i++)
            usleep(100000);
        kill(daemon_pid, SIGKILL);
        waitpid(daemon_pid, &st, 0);
        daemon_pid = 0;
    }
    if (notify_fd >= 0)
        close(notify_fd);
    notify_fd = -1;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void base_create(void)
{
    snprintf(base, sizeof(base), "/tmp/vkcli-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(base));
}

static void base_remove(void)
{
    if (base[0] != '\0')
        nftw(base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void setup_daemon(void)
{
    base_create();
    make_tree();
    /* max-scan-bytes is small so that reading past it is quick to test */
    daemon_start(ARGS("--engine", "gpu", "--max-scan-bytes", "1048576"));
}

static void teardown_daemon(void)
{
    daemon_stop();
    base_remove();
}

/* ---- running the CLI ----------------------------------------------------- */

struct run {
    int status;
    char out[65536];
    char err[16384];
};

static void slurp(int fd, char *buf, size_t cap)
{
    lseek(fd, 0, SEEK_SET);
    size_t n = 0;
    ssize_t got;
    while (n + 1 < cap && (got = read(fd, buf + n, cap - 1 - n)) > 0)
        n += (size_t)got;
    buf[n] = '\0';
    close(fd);
}

static int temp_fd(const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", base, name);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(fd, 0);
    unlink(path);
    return fd;
}

/*
 * Runs $VKSCAN with `args` (NULL-terminated) in `base`. Standard input is
 * `in` written through a pipe (NULL: /dev/null); VKSCAN_SOCKET is `env_sock`
 * (NULL: unset). Fills r->status with the exit status.
 */
static void run_cli(struct run *r, const char *in, const char *env_sock, const char *const *args)
{
    const char *bin = getenv("VKSCAN");
    ck_assert_msg(bin != NULL, "VKSCAN is not set: run through meson test");
    int out = temp_fd("out"), err = temp_fd("err");
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        const char *argv[64] = {bin};
        int n = 1;
        for (int i = 0; args[i] != NULL && n < 63; i++)
            argv[n++] = args[i];
        argv[n] = NULL;
        if (in == NULL) {
            int dn = open("/dev/null", O_RDONLY);
            dup2(dn, 0);
        } else {
            dup2(p[0], 0);
        }
        dup2(out, 1);
        dup2(err, 2);
        close(p[1]);
        if (env_sock != NULL)
            setenv("VKSCAN_SOCKET", env_sock, 1);
        else
            unsetenv("VKSCAN_SOCKET");
        if (chdir(base) != 0)
            _exit(126);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(p[0]);
    if (in != NULL)
        ck_assert_int_eq(write(p[1], in, strlen(in)), (ssize_t)strlen(in));
    close(p[1]);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st), "vkscan died with signal %d", WTERMSIG(st));
    r->status = WEXITSTATUS(st);
    slurp(out, r->out, sizeof(r->out));
    slurp(err, r->err, sizeof(r->err));
}

/* `vkscan --socket SOCK scan -r rules.txt ARGS...` */
static void scan(struct run *r, const char *in, const char *const *args)
{
    const char *argv[48] = {"--socket", sock, "scan", "-r", "rules.txt"};
    int n = 5;
    for (int i = 0; args[i] != NULL && n < 47; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    run_cli(r, in, NULL, argv);
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s != '\0'; s++)
        n += *s == '\n';
    return n;
}

/* ---- a small JSON reader: validates a line and keeps its top-level fields */

struct jfield {
    char key[32];
    char val[256]; /* strings decoded (ASCII only here), numbers and literals as text */
    bool is_str;
};

struct jobj {
    struct jfield f[16];
    int n;
};

struct jp {
    const char *s;
    bool ok;
};

static void jws(struct jp *p)
{
    while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')
        p->s++;
}

/* A JSON string; decoded into out (cap bytes) when out is not NULL. */
static void jstring(struct jp *p, char *out, size_t cap)
{
    size_t n = 0;
    if (*p->s++ != '"') {
        p->ok = false;
        return;
    }
    while (p->ok && *p->s != '"') {
        unsigned char c = (unsigned char)*p->s++;
        if (c < 0x20 || c == '\0') {
            p->ok = false;
        } else if (c == '\\') {
            char e = *p->s++;
            if (e == 'u') {
                for (int i = 0; i < 4; i++)
                    p->ok &= isxdigit((unsigned char)*p->s++) != 0;
                c = '?';
            } else if (strchr("\"\\/bfnrt", e) != NULL && e != '\0') {
                c = e == 'n' ? '\n' : e == 't' ? '\t' : (unsigned char)e;
            } else {
                p->ok = false;
            }
        }
        if (out != NULL && n + 1 < cap)
            out[n++] = (char)c;
    }
    if (out != NULL)
        out[n] = '\0';
    if (p->ok)
        p->s++;
}

static void jvalue(struct jp *p, char *out, size_t cap, bool *is_str, int depth);

static void jcontainer(struct jp *p, char close, int depth)
{
    p->s++;
    jws(p);
    if (*p->s == close) {
        p->s++;
        return;
    }
    while (p->ok) {
        jws(p);
        if (close == '}') {
            jstring(p, NULL, 0);
            jws(p);
            if (*p->s++ != ':')
                p->ok = false;
        }
        jvalue(p, NULL, 0, NULL, depth + 1);
        jws(p);
        if (*p->s == ',') {
            p->s++;
            continue;
        }
        if (*p->s++ != close)
            p->ok = false;
        return;
    }
}

static void jvalue(struct jp *p, char *out, size_t cap, bool *is_str, int depth)
{
    jws(p);
    const char *start = p->s;
    if (depth > 16) {
        p->ok = false;
    } else if (*p->s == '"') {
        jstring(p, out, cap);
        if (is_str != NULL)
            *is_str = true;
        return;
    } else if (*p->s == '{' || *p->s == '[') {
        jcontainer(p, *p->s == '{' ? '}' : ']', depth);
    } else if (strncmp(p->s, "true", 4) == 0 || strncmp(p->s, "null", 4) == 0) {
        p->s += 4;
    } else if (strncmp(p->s, "false", 5) == 0) {
        p->s += 5;
    } else {
        char *end;
        strtod(p->s, &end);
        p->ok &= end != p->s && (*p->s == '-' || isdigit((unsigned char)*p->s));
        p->s = end;
    }
    if (out != NULL && p->ok)
        snprintf(out, cap, "%.*s", (int)(p->s - start), start);
}

/* Parses one line that must be exactly one JSON object. */
static bool json_object(const char *line, size_t len, struct jobj *o)
{
    static char buf[16384];
    if (len >= sizeof(buf))
        return false;
    memcpy(buf, line, len);
    buf[len] = '\0';
    struct jp p = {.s = buf, .ok = true};
    o->n = 0;
    jws(&p);
    if (*p.s++ != '{')
        return false;
    jws(&p);
    while (p.ok && *p.s != '}') {
        struct jfield *f = &o->f[o->n < 15 ? o->n++ : 15];
        jws(&p);
        jstring(&p, f->key, sizeof(f->key));
        jws(&p);
        p.ok &= *p.s++ == ':';
        f->is_str = false;
        jvalue(&p, f->val, sizeof(f->val), &f->is_str, 1);
        jws(&p);
        if (*p.s == ',')
            p.s++;
        else if (*p.s != '}')
            p.ok = false;
    }
    if (p.ok)
        p.s++;
    jws(&p);
    return p.ok && *p.s == '\0';
}

static const struct jfield *jget(const struct jobj *o, const char *key)
{
    for (int i = 0; i < o->n; i++) {
        if (strcmp(o->f[i].key, key) == 0)
            return &o->f[i];
    }
    return NULL;
}

/* ---- scan: text output and exit codes ------------------------------------ */

static const char tree_hits[] = "tree/a.txt:9:lit\n"
                                "tree/a.txt:15:re\n"
                                "tree/a.txt:22:lit\n"
                                "tree/sub/b.bin:6:mz\n";

START_TEST(scan_text_matches)
{
    struct run r;
    scan(&r, NULL, ARGS("tree"));
    ck_assert_msg(r.status == 0, "exit %d, stderr: %s", r.status, r.err);
    ck_assert_str_eq(r.out, tree_hits);
    ck_assert_str_eq(r.err, "");
    /* A trailing slash and files named one by one give the same lines. */
    scan(&r, NULL, ARGS("tree/a.txt", "tree/sub/b.bin", "tree/sub/c.txt"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, tree_hits);
}
END_TEST

START_TEST(scan_no_match_exit_1)
{
    struct run r;
    scan(&r, NULL, ARGS("clean"));
    ck_assert_int_eq(r.status, 1);
    ck_assert_str_eq(r.out, "");
    ck_assert_str_eq(r.err, "");
    scan(&r, NULL, ARGS("tree/empty", "tree/sub/c.txt"));
    ck_assert_int_eq(r.status, 1);
    ck_assert_str_eq(r.out, "");
}
END_TEST

START_TEST(scan_unreadable_exit_2_dangling_warns)
{
    struct run r;
    /* A dangling link is a warning, not an error: the exit status follows
     * the matches. */
    scan(&r, NULL, ARGS("bad"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "bad/a.txt:6:lit\n");
    ck_assert_str_eq(r.err, "vkscan: bad/dangling: dangling symbolic link (skipped)\n");
    scan(&r, NULL, ARGS("bad/dangling"));
    ck_assert_int_eq(r.status, 1);
    ck_assert_str_eq(r.err, "vkscan: bad/dangling: dangling symbolic link (skipped)\n");
    /* A file that cannot be scanned is exit status 2, as in grep, also
     * when another file matched. */
    scan(&r, NULL, ARGS("bad", "no-such-file"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_str_eq(r.out, "bad/a.txt:6:lit\n");
    scan(&r, NULL, ARGS("clean", "no-such-file"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "vkscan: no-such-file: No such file or directory"));
}
END_TEST

START_TEST(scan_first_count_list)
{
    struct run r;
    scan(&r, NULL, ARGS("--first", "tree"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "tree/a.txt:9:lit\ntree/a.txt:15:re\ntree/sub/b.bin:6:mz\n");
    scan(&r, NULL, ARGS("--count", "tree"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "tree/a.txt:lit:2\ntree/a.txt:re:1\ntree/sub/b.bin:mz:1\n");
    scan(&r, NULL, ARGS("-l", "tree", "clean"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "tree/a.txt\ntree/sub/b.bin\n");
    scan(&r, NULL, ARGS("-l", "clean"));
    ck_assert_int_eq(r.status, 1);
    ck_assert_str_eq(r.out, "");
}
END_TEST

START_TEST(scan_stdin)
{
    struct run r;
    scan(&r, "--needle--ab7c\n", ARGS("-"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "(standard input):8:lit\n(standard input):14:re\n");
    scan(&r, "nothing\n", ARGS("-"));
    ck_assert_int_eq(r.status, 1);
    ck_assert_str_eq(r.out, "");
}
END_TEST

/* 150 files are more than one request carries (64 descriptors): several
 * requests, several in flight, and still the files' order on output. */
START_TEST(scan_many_files_in_order)
{
    char expect[150 * 32], *e = expect;
    for (int i = 0; i < 150; i++)
        e += sprintf(e, "many/f%03d.txt:10:lit\n", i);
    struct run r;
    scan(&r, NULL, ARGS("-j", "4", "many"));
    ck_assert_msg(r.status == 0, "exit %d, stderr: %s", r.status, r.err);
    ck_assert_str_eq(r.out, expect);
    scan(&r, NULL, ARGS("-j", "1", "many"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, expect);
}
END_TEST

static size_t count_str(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

/* A rejected rule is a warning, printed once; the exit status follows the
 * matches, unless --strict makes it 2. */
START_TEST(scan_rejected_rule_warns_strict_fails)
{
    static const char bad_rules[] = "lit:\"needle\"\n"
                                    "\n"
                                    "broken:/fo+(/\n";
    write_file("bad-rules.txt", bad_rules, strlen(bad_rules));
    struct run r;
    run_cli(&r, NULL, NULL,
            ARGS("--socket", sock, "scan", "-j", "2", "-r", "bad-rules.txt", "tree/a.txt", "many"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_int_eq(count_lines(r.out), 152);
    ck_assert_msg(strstr(r.err, "bad-rules.txt:3: rule 'broken' rejected") != NULL, "stderr: %s",
                  r.err);
    ck_assert_int_eq(count_str(r.err, "rejected"), 1);
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "scan", "-r", "bad-rules.txt", "clean"));
    ck_assert_int_eq(r.status, 1);
    ck_assert_int_eq(count_str(r.err, "rejected"), 1);
    run_cli(&r, NULL, NULL,
            ARGS("--socket", sock, "scan", "--strict", "-r", "bad-rules.txt", "tree/a.txt"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_str_eq(r.out, "tree/a.txt:9:lit\ntree/a.txt:22:lit\n");
}
END_TEST

/* ---- scan --json ---------------------------------------------------------- */

/* Each line parses as one JSON object; returns the objects' count. */
static int parse_lines(const char *out, struct jobj *objs, int cap)
{
    int n = 0;
    for (const char *line = out; *line != '\0';) {
        const char *nl = strchr(line, '\n');
        ck_assert_ptr_nonnull(nl);
        ck_assert_int_lt(n, cap);
        ck_assert_msg(json_object(line, (size_t)(nl - line), &objs[n]), "not JSON: %.*s",
                      (int)(nl - line), line);
        n++;
        line = nl + 1;
    }
    return n;
}

START_TEST(scan_json_matches_text)
{
    struct run r, t;
    scan(&r, NULL, ARGS("--json", "tree"));
    scan(&t, NULL, ARGS("tree"));
    ck_assert_int_eq(r.status, 0);
    struct jobj o[8];
    int n = parse_lines(r.out, o, 8) - 1; /* the last record is the summary */
    ck_assert_int_eq(n, (int)count_lines(t.out));
    ck_assert_str_eq(jget(&o[n], "type")->val, "summary");
    ck_assert_str_eq(jget(&o[n], "matches")->val, "4");
    ck_assert_str_eq(jget(&o[n], "files")->val, "4");
    /* Rebuild the text form from the JSON fields: it must be identical. */
    char rebuilt[1024] = "", *w = rebuilt;
    static const char *const order[] = {"lit", "mz", "re"}; /* the rule file's order */
    for (int i = 0; i < n; i++) {
        const struct jfield *path = jget(&o[i], "path"), *off = jget(&o[i], "offset");
        const struct jfield *rule = jget(&o[i], "rule"), *idx = jget(&o[i], "rule_index");
        ck_assert_msg(path && off && rule && idx, "fields missing in line %d", i);
        ck_assert_str_eq(jget(&o[i], "type")->val, "match");
        ck_assert(path->is_str && rule->is_str && !off->is_str && !idx->is_str);
        ck_assert_ptr_null(jget(&o[i], "count"));
        ck_assert_str_eq(order[atoi(idx->val)], rule->val);
        w += sprintf(w, "%s:%s:%s\n", path->val, off->val, rule->val);
    }
    ck_assert_str_eq(rebuilt, t.out);

    scan(&r, NULL, ARGS("--json", "--count", "tree/a.txt"));
    n = parse_lines(r.out, o, 8);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(jget(&o[0], "rule")->val, "lit");
    ck_assert_str_eq(jget(&o[0], "count")->val, "2");
    ck_assert_str_eq(jget(&o[0], "offset")->val, "9");
    ck_assert_str_eq(jget(&o[1], "rule")->val, "re");
    ck_assert_str_eq(jget(&o[1], "count")->val, "1");

    scan(&r, NULL, ARGS("--json", "-l", "tree"));
    n = parse_lines(r.out, o, 8);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(jget(&o[0], "path")->val, "tree/a.txt");
    ck_assert_str_eq(jget(&o[0], "rules_matched")->val, "2");
    ck_assert_str_eq(jget(&o[1], "path")->val, "tree/sub/b.bin");
}
END_TEST

/* A file name that is not UTF-8 still gives valid JSON, and its exact bytes. */
START_TEST(scan_json_odd_names)
{
    make_dir("odd");
    write_file("odd/q\"uote\x01\xff.txt", "needle", 6);
    struct run r;
    scan(&r, NULL, ARGS("--json", "odd"));
    ck_assert_int_eq(r.status, 0);
    struct jobj o[2];
    ck_assert_int_eq(parse_lines(r.out, o, 2), 2);
    ck_assert_ptr_nonnull(jget(&o[0], "path"));
    const struct jfield *b64 = jget(&o[0], "path_base64");
    ck_assert_ptr_nonnull(b64);
    /* base64("odd/q\"uote\x01\xff.txt") */
    ck_assert_str_eq(b64->val, "b2RkL3EidW90ZQH/LnR4dA==");
}
END_TEST

/* ---- inputs: procfs, sysfs, devices; several rule files; -e -------------- */

/* procfs files say size 0 and sysfs files a page: both are read as streams,
 * and a device named by the user is read up to the daemon's max-scan-bytes
 * (1 MiB here), with an error past it. */
START_TEST(scan_proc_sys_and_devices)
{
    struct run r;
    run_cli(&r, NULL, NULL,
            ARGS("--socket", sock, "scan", "-e", "name:/Name:\\s+vkscan/", "/proc/self/status"));
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_msg(strncmp(r.out, "/proc/self/status:", 18) == 0 && strstr(r.out, ":name\n"),
                  "out: %s", r.out);
    ck_assert_str_eq(r.err, "");
    /* A sysfs attribute: st_size is a page, the text one line. */
    static const char *const sysfs[] = {"/sys/devices/system/cpu/online",
                                        "/sys/kernel/mm/transparent_hugepage/enabled",
                                        "/sys/power/state"};
    for (size_t i = 0; i < sizeof(sysfs) / sizeof(sysfs[0]); i++) {
        if (access(sysfs[i], R_OK) != 0)
            continue;
        char want[128];
        snprintf(want, sizeof(want), "%s:e1:1\n", sysfs[i]);
        run_cli(&r, NULL, NULL, ARGS("--socket", sock, "scan", "-c", "-e", "\\n", sysfs[i]));
        ck_assert_msg(r.status == 0, "%s: exit %d: %s", sysfs[i], r.status, r.err);
        ck_assert_str_eq(r.out, want);
        break;
    }
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "scan", "-e", "x", "/dev/zero", "tree"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "vkscan: /dev/zero: more than vkscand scans in one request "
                                "(1.0 MiB)") != NULL,
                  "stderr: %s", r.err);
}
END_TEST

START_TEST(scan_several_rule_files_and_e)
{
    write_file("r-lit.txt", "lit:\"needle\"\n", 13);
    write_file("r-re.txt", "# regexes\nre:/ab[0-9]+c/\n", 25);
    write_file("r-dup.txt", "x:\"q\"\nlit:/nee+dle/\n", 20);
    write_file("r-bad.txt", "ok:\"xx\"\nbroken:/fo+(/\n", 22);
    struct run r;
    run_cli(&r, NULL, NULL,
            ARGS("--socket", sock, "scan", "-r", "r-lit.txt", "-r", "r-re.txt", "tree/a.txt"));
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_str_eq(r.out, "tree/a.txt:9:lit\ntree/a.txt:15:re\ntree/a.txt:22:lit\n");
    /* The same id in two files: an error naming both places. */
    run_cli(&r, NULL, NULL,
            ARGS("--socket", sock, "scan", "-r", "r-lit.txt", "-r", "r-dup.txt", "tree/a.txt"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_str_eq(r.out, "");
    ck_assert_msg(strstr(r.err, "rule id 'lit' is defined twice: r-lit.txt:1 and r-dup.txt:2") !=
                      NULL,
                  "stderr: %s", r.err);
    /* Within one file an id may repeat (rules sharing an id report as one
     * rule, as gitleaks' keyword list needs): no error, one id reported. */
    write_file("r-shared.txt", "kw:\"needle\"\nkw:/ab[0-9]+c/\n", 27);
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "scan", "-r", "r-shared.txt", "tree/a.txt"));
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_str_eq(r.out, "tree/a.txt:9:kw\ntree/a.txt:15:kw\ntree/a.txt:22:kw\n");
    /* A rejected rule is reported at its own file and line. */
    run_cli(&r, NULL, NULL,
            ARGS("--socket", sock, "scan", "-r", "r-re.txt", "-r", "r-bad.txt", "tree/a.txt"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_msg(strstr(r.err, "r-bad.txt:2: rule 'broken' rejected") != NULL, "stderr: %s",
                  r.err);
    /* -e: a regex named eN, or a whole rule line; with -r as well. */
    run_cli(&r, NULL, NULL,
            ARGS("--socket", sock, "scan", "-e", "ne+dle", "-e", "id7:\"ab12c\"", "tree/a.txt"));
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_str_eq(r.out, "tree/a.txt:9:e1\ntree/a.txt:15:id7\ntree/a.txt:22:e1\n");
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "scan", "-r", "r-re.txt", "-e", "MZ", "tree"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "tree/a.txt:15:re\ntree/sub/b.bin:4:e1\n");
}
END_TEST

/* ---- output: -n, -q, --color, -c, --stats, --json records ------------------ */

START_TEST(scan_output_forms)
{
    static const char lines[] = "one\nneedle two\n\nx needle\nab1c";
    write_file("lines.txt", lines, strlen(lines));
    struct run r;
    scan(&r, NULL, ARGS("-n", "lines.txt"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "lines.txt:2:10:lit\nlines.txt:4:24:lit\nlines.txt:5:29:re\n");
    scan(&r, NULL, ARGS("-n", "-"));
    scan(&r, "a\nb\nneedle\n", ARGS("-n", "-"));
    ck_assert_str_eq(r.out, "(standard input):3:10:lit\n");
    scan(&r, NULL, ARGS("-q", "tree"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "");
    scan(&r, NULL, ARGS("-q", "clean"));
    ck_assert_int_eq(r.status, 1);
    ck_assert_str_eq(r.out, "");
    /* -q: a match is exit 0 even when another file could not be scanned */
    scan(&r, NULL, ARGS("-q", "tree", "no-such-file"));
    ck_assert_int_eq(r.status, 0);
    /* -q stops once a match is known: 150 files are three requests, and the
     * first is printed before the third is sent, so the walk ends early and
     * the missing file is never looked at. */
    scan(&r, NULL, ARGS("-q", "-j", "1", "many", "no-such-file"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.err, "");
    scan(&r, NULL, ARGS("--color=always", "tree/a.txt"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(count_lines(r.out) == 3 ? "" : r.out, "");
    ck_assert_msg(strstr(r.out, "\033[35mtree/a.txt\033[0m:9:\033[1;31mlit\033[0m\n") != NULL,
                  "out: %s", r.out);
    scan(&r, NULL, ARGS("--color", "never", "tree/a.txt"));
    ck_assert_ptr_null(strchr(r.out, '\033'));
    scan(&r, NULL, ARGS("--color", "auto", "tree/a.txt")); /* not a terminal */
    ck_assert_ptr_null(strchr(r.out, '\033'));
    scan(&r, NULL, ARGS("--color", "sometimes", "tree/a.txt"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--color takes auto, always or never, not 'sometimes'"));
    scan(&r, NULL, ARGS("--stats", "tree"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_msg(strncmp(r.out, tree_hits, strlen(tree_hits)) == 0, "out: %s", r.out);
    ck_assert_msg(strstr(r.out, "\n4 matches\n4 files scanned\n43 bytes scanned\n"
                                "0 rules rejected\n0 errors\n") != NULL,
                  "out: %s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, " GB/s\n"));
}
END_TEST

START_TEST(scan_json_records)
{
    write_file("jrules.txt", "lit:\"needle\"\nbroken:/fo+(/\n", 27);
    struct run r;
    run_cli(&r, NULL, NULL,
            ARGS("--socket", sock, "scan", "--json", "-n", "-r", "jrules.txt", "tree/a.txt",
                 "no-such-file", "bad/dangling"));
    ck_assert_int_eq(r.status, 2);
    struct jobj o[8];
    int n = parse_lines(r.out, o, 8);
    ck_assert_int_eq(n, 6);
    ck_assert_str_eq(jget(&o[0], "type")->val, "reject");
    ck_assert_str_eq(jget(&o[0], "file")->val, "jrules.txt");
    ck_assert_str_eq(jget(&o[0], "line")->val, "2");
    ck_assert_str_eq(jget(&o[0], "rule")->val, "broken");
    ck_assert_str_eq(jget(&o[1], "type")->val, "match");
    ck_assert_str_eq(jget(&o[1], "line_number")->val, "1");
    ck_assert_str_eq(jget(&o[2], "offset")->val, "22");
    ck_assert_str_eq(jget(&o[3], "type")->val, "error");
    ck_assert_str_eq(jget(&o[3], "path")->val, "no-such-file");
    ck_assert_ptr_nonnull(jget(&o[3], "message"));
    ck_assert_str_eq(jget(&o[4], "type")->val, "warning");
    ck_assert_str_eq(jget(&o[5], "type")->val, "summary");
    ck_assert_str_eq(jget(&o[5], "rejected_rules")->val, "1");
    ck_assert_str_eq(jget(&o[5], "errors")->val, "1");
    ck_assert_str_eq(jget(&o[5], "matches")->val, "2");
}
END_TEST

/* -o prints each match's bytes from its leftmost start (every rule: the
 * scan asks for starts), escaped when binary; --json carries `start` for
 * rules with flag L, and `text` with -o; pipes are then read whole; an
 * input over max-scan-bytes is a stream, which has no starts. */
START_TEST(scan_only_matching_and_starts)
{
    static const char orules[] = "lit:\"needle\"\nre:/ab+c/L\nbin:/\\x00\\xff+/\n";
    write_file("orules.txt", orules, strlen(orules));
    static const char data[] = "xx needle abbbc\n\0\xff\xff";
    write_file("o.bin", data, sizeof(data) - 1);
    struct run r;
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "scan", "-o", "-r", "orules.txt", "o.bin"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "o.bin:3-9:lit:needle\n"
                            "o.bin:10-15:re:abbbc\n"
                            "o.bin:16-18:bin:\\x00\\xff\n"
                            "o.bin:16-19:bin:\\x00\\xff\\xff\n");
    /* --json: the L rule has its start, the others none */
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "scan", "--json", "-r", "orules.txt", "o.bin"));
    ck_assert_int_eq(r.status, 0);
    struct jobj o[8];
    ck_assert_int_eq(parse_lines(r.out, o, 8), 5);
    ck_assert_str_eq(jget(&o[0], "rule")->val, "lit");
    ck_assert_ptr_null(jget(&o[0], "start"));
    ck_assert_str_eq(jget(&o[1], "rule")->val, "re");
    ck_assert_str_eq(jget(&o[1], "start")->val, "10");
    ck_assert_str_eq(jget(&o[1], "offset")->val, "15");
    ck_assert_ptr_null(jget(&o[1], "text"));
    /* --json -o: every match has start and text */
    run_cli(&r, NULL, NULL,
            ARGS("--socket", sock, "scan", "--json", "-o", "-r", "orules.txt", "o.bin"));
    ck_assert_int_eq(parse_lines(r.out, o, 8), 5);
    ck_assert_str_eq(jget(&o[0], "start")->val, "3");
    ck_assert_str_eq(jget(&o[0], "text")->val, "needle");
    ck_assert_str_eq(jget(&o[1], "text")->val, "abbbc");
    ck_assert_ptr_nonnull(strstr(r.out, "\"start\":16,\"text\":\"\\u0000\\u00ff\\u00ff\"}"));
    /* a pipe is read whole when starts are wanted (-o, or an L rule) */
    run_cli(&r, "a needle", NULL, ARGS("--socket", sock, "scan", "-o", "-r", "rules.txt", "-"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "(standard input):2-8:lit:needle\n");
    ck_assert_str_eq(r.err, "");
    run_cli(&r, "abc", NULL, ARGS("--socket", sock, "scan", "--json", "-r", "orules.txt", "-"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_int_eq(parse_lines(r.out, o, 8), 2);
    ck_assert_str_eq(jget(&o[0], "start")->val, "0");
    /* a file over max-scan-bytes (1 MiB) is a stream: no starts, so -o
     * warns and prints plain matches, and a catalog with L rules is refused */
    static char big[3 << 19];
    memset(big, 'x', sizeof(big));
    memcpy(big + sizeof(big) - 7, "needle", 6);
    write_file("big.bin", big, sizeof(big));
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "scan", "-o", "-r", "rules.txt", "big.bin"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_eq(r.out, "big.bin:1572863:lit\n");
    ck_assert_ptr_nonnull(strstr(r.err, "-o prints its matches without their bytes"));
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "scan", "-r", "orules.txt", "big.bin"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "flag L"));
}
END_TEST

/* ---- -z: archives and compressed files ------------------------------------- */

struct member {
    const char *name; /* a trailing '/' makes a directory entry */
    const char *data;
    size_t len;
};

/* Writes `rel` with libarchive: `format` ARCHIVE_FORMAT_TAR_PAX_RESTRICTED,
 * ARCHIVE_FORMAT_ZIP or ARCHIVE_FORMAT_RAW (one member), compressed by
 * `filter` (ARCHIVE_FILTER_NONE, _GZIP, _XZ, _ZSTD...). */
static void write_archive(const char *rel, int format, int filter, const struct member *m, size_t n)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", base, rel);
    struct archive *a = archive_write_new();
    ck_assert_ptr_nonnull(a);
    ck_assert_int_eq(archive_write_add_filter(a, filter), ARCHIVE_OK);
    int rc = format == ARCHIVE_FORMAT_ZIP   ? archive_write_set_format_zip(a)
             : format == ARCHIVE_FORMAT_RAW ? archive_write_set_format_raw(a)
                                            : archive_write_set_format_pax_restricted(a);
    ck_assert_int_eq(rc, ARCHIVE_OK);
    ck_assert_msg(archive_write_open_filename(a, path) == ARCHIVE_OK, "%s",
                  archive_error_string(a));
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        bool dir = m[i].name[strlen(m[i].name) - 1] == '/';
        archive_entry_set_pathname(e, m[i].name);
        archive_entry_set_filetype(e, dir ? AE_IFDIR : AE_IFREG);
        archive_entry_set_perm(e, dir ? 0755 : 0644);
        archive_entry_set_size(e, dir ? 0 : (la_int64_t)m[i].len);
        ck_assert_msg(archive_write_header(a, e) == ARCHIVE_OK, "%s", archive_error_string(a));
        if (!dir && m[i].len > 0)
            ck_assert_int_eq(archive_write_data(a, m[i].data, m[i].len), (la_ssize_t)m[i].len);
        archive_entry_free(e);
    }
    ck_assert_int_eq(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
}

/* Reads `rel` whole into a malloc'd buffer. */
static char *read_whole(const char *rel, size_t *len)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", base, rel);
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    char *buf = malloc(1 << 20);
    ck_assert_ptr_nonnull(buf);
    *len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

/*
 * arc/t.tar.gz  docs/a.txt (the tree's a.txt), a directory, sub/b.bin (MZ)
 * arc/z.zip     in/z.txt ("ab12c" ends at 7)
 * arc/n.txt.xz  "xx needle\n" (an xz stream, no tar)
 * arc/m.bin.zst the MZ header at 4..8 (a zstd stream, no tar)
 * arc/nest.zip  inner.tar.gz (holding deep.txt, needle ends 6), plain.txt
 * arc/many.txt.gz  200 lines "needle\n"
 */
static void make_archives(void)
{
    static const char a_txt[] = "xx needle ab12c needle\n";
    static const char mz[] = "\x01\x02MZ\x90\x00\x03";
    make_dir("arc");
    const struct member t[] = {{"docs/", NULL, 0},
                               {"docs/a.txt", a_txt, sizeof(a_txt) - 1},
                               {"sub/b.bin", mz, sizeof(mz) - 1}};
    write_archive("arc/t.tar.gz", ARCHIVE_FORMAT_TAR_PAX_RESTRICTED, ARCHIVE_FILTER_GZIP, t, 3);
    const struct member z[] = {{"in/z.txt", "..ab12c..", 9}};
    write_archive("arc/z.zip", ARCHIVE_FORMAT_ZIP, ARCHIVE_FILTER_NONE, z, 1);
    const struct member x[] = {{"n.txt", "xx needle\n", 10}};
    write_archive("arc/n.txt.xz", ARCHIVE_FORMAT_RAW, ARCHIVE_FILTER_XZ, x, 1);
    const struct member zs[] = {{"m.bin",
                                 "\xff\xfe"
                                 "abMZ\x90\x00",
                                 8}};
    write_archive("arc/m.bin.zst", ARCHIVE_FORMAT_RAW, ARCHIVE_FILTER_ZSTD, zs, 1);
    const struct member deep[] = {{"deep.txt", "needle", 6}};
    write_archive("inner.tar.gz", ARCHIVE_FORMAT_TAR_PAX_RESTRICTED, ARCHIVE_FILTER_GZIP, deep, 1);
    size_t inner_len;
    char *inner = read_whole("inner.tar.gz", &inner_len);
    const struct member nest[] = {{"inner.tar.gz", inner, inner_len}, {"plain.txt", "a needle", 8}};
    write_archive("arc/nest.zip", ARCHIVE_FORMAT_ZIP, ARCHIVE_FILTER_NONE, nest, 2);
    free(inner);
    static char lines[200 * 7];
    for (int i = 0; i < 200; i++)
        memcpy(lines + 7 * i, "needle\n", 7);
    const struct member many[] = {{"many.txt", lines, sizeof(lines)}};
    write_archive("arc/many.txt.gz", ARCHIVE_FORMAT_RAW, ARCHIVE_FILTER_GZIP, many, 1);
}

START_TEST(scan_archives_members)
{
    make_archives();
    struct run r;
    scan(&r, NULL,
         ARGS("-z", "arc/t.tar.gz", "arc/z.zip", "arc/n.txt.xz", "arc/m.bin.zst", "arc/nest.zip",
              "tree/sub/b.bin"));
    ck_assert_msg(r.status == 0, "exit %d, stderr: %s", r.status, r.err);
    ck_assert_str_eq(r.out, "arc/t.tar.gz!docs/a.txt:9:lit\n"
                            "arc/t.tar.gz!docs/a.txt:15:re\n"
                            "arc/t.tar.gz!docs/a.txt:22:lit\n"
                            "arc/t.tar.gz!sub/b.bin:6:mz\n"
                            "arc/z.zip!in/z.txt:7:re\n"
                            "arc/n.txt.xz!n.txt:9:lit\n"
                            "arc/m.bin.zst!m.bin:8:mz\n"
                            "arc/nest.zip!inner.tar.gz!deep.txt:6:lit\n"
                            "arc/nest.zip!plain.txt:8:lit\n"
                            "tree/sub/b.bin:6:mz\n");
    ck_assert_str_eq(r.err, "");
    /* A directory walk opens them too; -c, -l and -n work per member. */
    scan(&r, NULL, ARGS("-z", "-c", "arc"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "arc/many.txt.gz!many.txt:lit:200\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "arc/t.tar.gz!docs/a.txt:lit:2\n"
                                        "arc/t.tar.gz!docs/a.txt:re:1\n"
                                        "arc/t.tar.gz!sub/b.bin:mz:1\n"));
    scan(&r, NULL, ARGS("-z", "-l", "arc/t.tar.gz", "arc/z.zip"));
    ck_assert_str_eq(r.out,
                     "arc/t.tar.gz!docs/a.txt\narc/t.tar.gz!sub/b.bin\narc/z.zip!in/z.txt\n");
    scan(&r, NULL, ARGS("-z", "-n", "arc/many.txt.gz"));
    ck_assert_int_eq(count_lines(r.out), 200);
    ck_assert_ptr_nonnull(strstr(r.out, "arc/many.txt.gz!many.txt:200:1399:lit\n"));
    /* --json: the path is ARCHIVE!MEMBER, with the two parts as fields */
    scan(&r, NULL, ARGS("-z", "--json", "arc/nest.zip"));
    struct jobj o[4];
    ck_assert_int_eq(parse_lines(r.out, o, 4), 3);
    ck_assert_str_eq(jget(&o[0], "path")->val, "arc/nest.zip!inner.tar.gz!deep.txt");
    ck_assert_str_eq(jget(&o[0], "archive")->val, "arc/nest.zip");
    ck_assert_str_eq(jget(&o[0], "member")->val, "inner.tar.gz!deep.txt");
    ck_assert_str_eq(jget(&o[0], "offset")->val, "6");
    ck_assert_str_eq(jget(&o[2], "files")->val, "2");
    /* Without -z a compressed file is its own bytes: 200 needles do not
     * survive gzip, and no member is named. */
    scan(&r, NULL, ARGS("-c", "arc/many.txt.gz", "arc/t.tar.gz"));
    ck_assert_ptr_null(strchr(r.out, '!'));
    ck_assert_ptr_null(strstr(r.out, ":lit:200\n"));
}
END_TEST

/* A truncated tar.gz and a zip whose header is garbage are errors that name
 * the archive (exit status 2); the members before the damage and the other
 * files are scanned. */
START_TEST(scan_archive_corrupt)
{
    static char noise[200000]; /* past libarchive's read-ahead when cut in half */
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof(noise); i++) {
        x = x * 1103515245u + 12345u;
        noise[i] = (char)(x >> 23);
    }
    make_dir("broken");
    const struct member m[] = {{"first.txt", "needle", 6}, {"noise.bin", noise, sizeof(noise)}};
    write_archive("broken/cut.tar.gz", ARCHIVE_FORMAT_TAR_PAX_RESTRICTED, ARCHIVE_FILTER_GZIP, m,
                  2);
    char path[256];
    snprintf(path, sizeof(path), "%s/broken/cut.tar.gz", base);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_gt(st.st_size, 150000);
    ck_assert_int_eq(truncate(path, st.st_size / 2), 0);
    static const char bad_zip[] = "PK\x03\x04garbage, not a zip header at all";
    write_file("broken/bad.zip", bad_zip, sizeof(bad_zip) - 1);
    struct run r;
    scan(&r, NULL, ARGS("-z", "broken/cut.tar.gz", "broken/bad.zip", "tree/a.txt"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_str_eq(r.out, "broken/cut.tar.gz!first.txt:6:lit\n"
                            "tree/a.txt:9:lit\ntree/a.txt:15:re\ntree/a.txt:22:lit\n");
    ck_assert_msg(strstr(r.err, "vkscan: broken/cut.tar.gz: corrupt archive at 'noise.bin': ") !=
                      NULL,
                  "%s", r.err);
    ck_assert_msg(strstr(r.err, "vkscan: broken/bad.zip: corrupt or unsupported archive: ") != NULL,
                  "%s", r.err);
    ck_assert_int_eq(count_lines(r.err), 2);
}
END_TEST

/* --max-archive-bytes stops a decompression bomb; a member over the
 * daemon's max-scan-bytes (1 MiB here) is skipped on its own. */
START_TEST(scan_archive_bomb_caps)
{
    static char zeros[40006], big[2 << 20];
    memcpy(zeros + 40000, "needle", 6);
    const struct member m[] = {{"z1", zeros, sizeof(zeros)},
                               {"big", big, sizeof(big)},
                               {"z2", zeros, sizeof(zeros)},
                               {"z3", zeros, sizeof(zeros)}};
    write_archive("bomb.tar.gz", ARCHIVE_FORMAT_TAR_PAX_RESTRICTED, ARCHIVE_FILTER_GZIP, m, 4);
    struct run r;
    scan(&r, NULL, ARGS("-z", "bomb.tar.gz"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_str_eq(r.out, "bomb.tar.gz!z1:40006:lit\nbomb.tar.gz!z2:40006:lit\n"
                            "bomb.tar.gz!z3:40006:lit\n");
    ck_assert_str_eq(r.err, "vkscan: bomb.tar.gz!big: more than vkscand scans in one request "
                            "(1.0 MiB) once decompressed: raise max-scan-bytes (skipped)\n");
    /* 100 KiB: z1, then big passes the cap; nothing after it is read */
    scan(&r, NULL, ARGS("-z", "--max-archive-bytes", "100K", "bomb.tar.gz", "tree/sub/b.bin"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_str_eq(r.out, "bomb.tar.gz!z1:40006:lit\ntree/sub/b.bin:6:mz\n");
    ck_assert_str_eq(r.err, "vkscan: bomb.tar.gz: more than --max-archive-bytes (100.0 KiB) "
                            "decompressed (a decompression bomb?): the rest of the archive is "
                            "skipped; raise --max-archive-bytes to read it all\n");
    scan(&r, NULL, ARGS("-z", "--max-archive-bytes", "lots", "bomb.tar.gz"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--max-archive-bytes takes a size"));
}
END_TEST

/* ---- walks: ignore files, hidden files, globs, links, sizes ----------------- */

static void make_link(const char *target, const char *rel)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", base, rel);
    ck_assert_int_eq(symlink(target, path), 0);
}

/*
 * walk/.gitignore    *.log, !keep.log, /build/, sub/deep.txt, doc/(two stars)/gen.txt
 * walk/sub/.ignore   ok2.txt
 * Every file below holds "needle"; `-l` prints the ones scanned.
 */
static void make_walk_tree(void)
{
    static const char gi[] = "# build output\n*.log\n!keep.log\n/build/\nsub/deep.txt\n"
                             "doc/**/gen.txt\n\\#hash.txt\n";
    static const char *const files[] = {
        "walk/a.txt",           "walk/x.log",        "walk/keep.log",        "walk/build/b.txt",
        "walk/src/build/c.txt", "walk/sub/deep.txt", "walk/sub/ok.txt",      "walk/sub/ok2.txt",
        "walk/.hidden.txt",     "walk/.git/config",  "walk/doc/a/b/gen.txt", "walk/doc/gen.txt",
        "walk/#hash.txt",       "linked/l.txt"};
    static const char *const dirs[] = {"walk",         "walk/build", "walk/src", "walk/src/build",
                                       "walk/sub",     "walk/.git",  "walk/doc", "walk/doc/a",
                                       "walk/doc/a/b", "linked"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        make_dir(dirs[i]);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
        write_file(files[i], "needle\n", 7);
    char big[2048];
    memset(big, 'x', sizeof(big));
    memcpy(big, "needle", 6);
    write_file("walk/big.txt", big, sizeof(big));
    write_file("walk/.gitignore", gi, strlen(gi));
    write_file("walk/sub/.ignore", "ok2.txt\n", 8);
    make_link("a.txt", "walk/link-a.txt");
    make_link("../linked", "walk/zlink");
    make_link("sub", "walk/zz-sub");
}

START_TEST(scan_walk_ignore_hidden_globs_links)
{
    make_walk_tree();
    static const char deflt[] = "walk/a.txt\nwalk/big.txt\nwalk/keep.log\nwalk/src/build/c.txt\n"
                                "walk/sub/ok.txt\n";
    struct run r;
    scan(&r, NULL, ARGS("-l", "walk"));
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_str_eq(r.out, deflt);
    ck_assert_str_eq(r.err, "");
    scan(&r, NULL, ARGS("-l", "--no-ignore", "walk"));
    ck_assert_str_eq(r.out, "walk/#hash.txt\nwalk/a.txt\nwalk/big.txt\nwalk/build/b.txt\n"
                            "walk/doc/a/b/gen.txt\nwalk/doc/gen.txt\nwalk/keep.log\n"
                            "walk/src/build/c.txt\nwalk/sub/deep.txt\nwalk/sub/ok.txt\n"
                            "walk/sub/ok2.txt\nwalk/x.log\n");
    scan(&r, NULL, ARGS("-l", "--hidden", "walk"));
    ck_assert_str_eq(r.out, "walk/.hidden.txt\nwalk/a.txt\nwalk/big.txt\nwalk/keep.log\n"
                            "walk/src/build/c.txt\nwalk/sub/ok.txt\n");
    scan(&r, NULL, ARGS("-l", "-g", "*.log", "walk"));
    ck_assert_str_eq(r.out, "walk/keep.log\n");
    scan(&r, NULL, ARGS("-l", "--glob", "!*.txt", "walk"));
    ck_assert_str_eq(r.out, "walk/keep.log\n");
    scan(&r, NULL, ARGS("-l", "--exclude", "sub", "--exclude", "src/**", "walk"));
    ck_assert_str_eq(r.out, "walk/a.txt\nwalk/big.txt\nwalk/keep.log\n");
    scan(&r, NULL, ARGS("-l", "--max-filesize", "1K", "walk"));
    ck_assert_str_eq(r.out, "walk/a.txt\nwalk/keep.log\nwalk/src/build/c.txt\nwalk/sub/ok.txt\n");
    scan(&r, NULL, ARGS("-l", "--max-filesize", "lots", "walk"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--max-filesize takes a size"));
    /* -L follows links to directories; a directory two links reach (zz-sub
     * and sub) and a file two names reach (link-a.txt) are scanned once. */
    scan(&r, NULL, ARGS("-l", "-L", "walk"));
    ck_assert_str_eq(r.out, "walk/a.txt\nwalk/big.txt\nwalk/keep.log\nwalk/src/build/c.txt\n"
                            "walk/sub/ok.txt\nwalk/zlink/l.txt\n");
    /* Classes, '?', trailing spaces trimmed, a directory-only pattern that
     * leaves a file of the same name alone. */
    make_dir("walk2");
    make_dir("walk2/out");
    write_file("walk2/.ignore", "[xy]?.bak  \nout/\n", 17);
    static const char *const w2[] = {"walk2/x1.bak", "walk2/xy1.bak", "walk2/z1.bak",
                                     "walk2/out/o.txt", "walk2/y.bak"};
    for (size_t i = 0; i < sizeof(w2) / sizeof(w2[0]); i++)
        write_file(w2[i], "needle", 6);
    make_dir("walk2/sub");
    write_file("walk2/sub/out", "needle", 6);
    scan(&r, NULL, ARGS("-l", "walk2"));
    ck_assert_str_eq(r.out, "walk2/sub/out\nwalk2/xy1.bak\nwalk2/y.bak\nwalk2/z1.bak\n");
    /* A named file is scanned whatever the ignore files say. */
    scan(&r, NULL, ARGS("-l", "walk/x.log"));
    ck_assert_str_eq(r.out, "walk/x.log\n");
}
END_TEST

/* ---- usage errors, --help everywhere, the socket path ------------------------ */

START_TEST(usage_messages_and_help)
{
    base_create();
    struct run r;
    static const char *const helps[][5] = {
        {"scan", "--help", NULL},           {"status", "--help", NULL},
        {"rules", "check", "--help", NULL}, {"rules", "scan", "--help", NULL},
        {"rules", "--help", NULL},          {"--help", NULL}};
    for (size_t i = 0; i < sizeof(helps) / sizeof(helps[0]); i++) {
        run_cli(&r, NULL, NULL, helps[i]);
        ck_assert_msg(r.status == 0, "%s %s: exit %d: %s", helps[i][0], helps[i][1], r.status,
                      r.err);
        ck_assert_msg(strncmp(r.out, "usage: vkscan", 13) == 0, "%s: %s", helps[i][0], r.out);
        ck_assert_str_eq(r.err, "");
    }
    static const struct {
        const char *args[8];
        const char *msg;
    } bad[] = {
        {{"frobnicate", NULL}, "vkscan: unknown command 'frobnicate'\n"},
        {{"--bogus", "scan", NULL}, "vkscan: unknown option '--bogus' before the command\n"},
        {{NULL}, "vkscan: no command given\n"},
        {{"rules", "lint", NULL}, "vkscan rules: unknown subcommand 'lint'"},
        {{"rules", NULL}, "vkscan rules: no subcommand given"},
        {{"status", "now", NULL}, "vkscan: status takes no arguments, not 'now'"},
        {{"rules", "check", NULL}, "vkscan rules check: no FILE given"},
        {{"rules", "check", "a", "b", NULL}, "vkscan rules check: more than one FILE given"},
        {{"rules", "scan", "r.txt", NULL}, "vkscan rules scan: no PATH to scan given"},
        {{"scan", "tree", NULL}, "vkscan scan: no rules: give a pattern file with -r FILE"},
        {{"scan", "-e", "x", NULL}, "vkscan scan: no PATH to scan"},
        {{"scan", "--frob", "-e", "x", ".", NULL}, "vkscan scan: unknown option '--frob'"},
        {{"scan", "-e", "x", ".", "-r", NULL}, "vkscan scan: option '-r' needs a value"},
        {{"scan", "-j", "99", "-e", "x", ".", NULL}, "vkscan scan: --jobs takes 1..16, not '99'"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        run_cli(&r, NULL, NULL, bad[i].args[0] != NULL ? bad[i].args : ARGS("--socket=x"));
        ck_assert_int_eq(r.status, 2);
        ck_assert_msg(strstr(r.err, bad[i].msg) != NULL, "want %s, stderr: %s", bad[i].msg, r.err);
    }
    /* --socket at a directory or a regular file says what the path is. */
    write_file("plain", "x", 1);
    run_cli(&r, NULL, NULL, ARGS("--socket", base, "status"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, " is a directory, not a socket: point --socket") != NULL,
                  "stderr: %s", r.err);
    run_cli(&r, NULL, NULL, ARGS("--socket", "plain", "scan", "-e", "x", "plain"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "vkscan: plain is a regular file, not a socket") != NULL,
                  "stderr: %s", r.err);
    base_remove();
}
END_TEST

/* vkscand writes "<N>" syslog prefixes only for journald (JOURNAL_STREAM):
 * a failing start logs one error either way. */
static void daemon_log(const char *journal, char *out, size_t cap)
{
    int fd = temp_fd("daemon-log");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fd, 2);
        if (journal != NULL)
            setenv("JOURNAL_STREAM", journal, 1);
        else
            unsetenv("JOURNAL_STREAM");
        unsetenv("NOTIFY_SOCKET");
        execl(getenv("VKSCAND"), "vkscand", "--socket", "/nonexistent-dir/x.sock", "--engine",
              "cpu", "--state-dir", base, (char *)NULL);
        _exit(127);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 127);
    slurp(fd, out, cap);
}

START_TEST(daemon_log_prefix_only_for_journald)
{
    base_create();
    char plain[4096], journal[4096];
    daemon_log(NULL, plain, sizeof(plain));
    daemon_log("8:1234", journal, sizeof(journal));
    ck_assert_msg(strstr(plain, "/nonexistent-dir/x.sock") != NULL, "log: %s", plain);
    ck_assert_msg(strchr(plain, '<') == NULL, "log: %s", plain);
    ck_assert_msg(journal[0] == '<' && isdigit((unsigned char)journal[1]) && journal[2] == '>',
                  "log: %s", journal);
    base_remove();
}
END_TEST

/* ---- the daemon is not there ------------------------------------------------ */

START_TEST(missing_daemon)
{
    base_create();
    char path[128], expect[256];
    snprintf(path, sizeof(path), "%s/none.sock", base);
    write_file("rules.txt", rules_txt, strlen(rules_txt));
    snprintf(expect, sizeof(expect),
             "vkscan: vkscand is not running at %s: start it with systemctl start vkscand\n", path);
    struct run r;
    run_cli(&r, NULL, NULL, ARGS("--socket", path, "scan", "-r", "rules.txt", "."));
    ck_assert_int_eq(r.status, 2);
    ck_assert_str_eq(r.err, expect);
    ck_assert_str_eq(r.out, "");
    /* VKSCAN_SOCKET chooses the socket when --socket is absent. */
    run_cli(&r, NULL, path, ARGS("status"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_str_eq(r.err, expect);
    /* A socket file nobody listens on reads the same. */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ck_assert_int_lt(strlen(path), sizeof(sa.sun_path));
    memcpy(sa.sun_path, path, strlen(path) + 1);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd);
    run_cli(&r, NULL, NULL, ARGS("--socket", path, "status"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_str_eq(r.err, expect);
    base_remove();
}
END_TEST

/* ---- rules check --------------------------------------------------------------- */

START_TEST(rules_check_good_and_bad)
{
    base_create();
    write_file("rules.txt", rules_txt, strlen(rules_txt));
    struct run r;
    run_cli(&r, NULL, NULL, ARGS("rules", "check", "rules.txt"));
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "rules.txt: 3 rules compiled, 0 rejected"));
    ck_assert_ptr_nonnull(strstr(r.out, "\nfingerprint "));
    ck_assert_ptr_nonnull(strstr(r.out, "\ngroup 0: "));
    ck_assert_str_eq(r.err, "");

    static const char bad[] = "ok:\"fine\"\n"
                              "# a comment\n"
                              "paren:/fo+(/\n"
                              "hex:{4d zz}\n";
    write_file("bad.txt", bad, strlen(bad));
    run_cli(&r, NULL, NULL, ARGS("rules", "check", "bad.txt"));
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "bad.txt:3: rule 'paren' rejected at column ") != NULL, "%s",
                  r.err);
    ck_assert_msg(strstr(r.err, "bad.txt:4: rule 'hex' rejected at column ") != NULL, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "bad.txt: 1 rules compiled, 2 rejected"));

    run_cli(&r, NULL, NULL, ARGS("rules", "check", "missing.txt"));
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "cannot read missing.txt"));

    /* -v: each rule's engine and size, and the passes over the data; a
     * counted repeat of a class goes to the bit-NFA engine. */
    static const char mixed[] = "lit:\"needle\"\n"
                                "gap:/key[a-z0-9]{120}x/\n";
    write_file("mixed.txt", mixed, strlen(mixed));
    run_cli(&r, NULL, NULL, ARGS("rules", "check", "-v", "mixed.txt"));
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_msg(strstr(r.out, "\nrule lit: dfa group 0 (") != NULL, "%s", r.out);
    ck_assert_msg(strstr(r.out, "\nrule gap: nfa group ") != NULL, "%s", r.out);
    ck_assert_msg(strstr(r.out, " (124 bits") != NULL, "%s", r.out);
    ck_assert_msg(strstr(r.out, "\npasses: ") != NULL, "%s", r.out);
    ck_assert_msg(strstr(r.out, " 1 bit-NFA groups)") != NULL, "%s", r.out);
    base_remove();
}
END_TEST

/* ---- the manual pages ------------------------------------------------------------ */

/* Appends the text of `path` to buf. */
static void read_text(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* Every --flag that `cmd` prints in its help is in the roff page, spelled
 * \-\-flag (roff's minus signs). Returns how many flags were checked. */
static int flags_in_page(const char *cmd, const char *page)
{
    static char text[65536];
    read_text(page, text, sizeof(text));
    FILE *help = popen(cmd, "r");
    ck_assert_ptr_nonnull(help);
    char line[256];
    int n = 0;
    while (fgets(line, sizeof(line), help) != NULL) {
        for (char *p = strstr(line, "--"); p != NULL; p = strstr(p + 2, "--")) {
            char flag[64], roff[160] = "\\-\\-", *w = roff + 4;
            if (sscanf(p + 2, "%63[a-z-]", flag) != 1 || strcmp(flag, "key") == 0)
                continue; /* "--key value" is vkscand's usage line */
            for (const char *c = flag; *c != '\0'; c++) {
                if (*c == '-')
                    *w++ = '\\';
                *w++ = *c;
            }
            *w = '\0';
            ck_assert_msg(strstr(text, roff) != NULL, "%s: %s is not documented (%s)", page, roff,
                          cmd);
            n++;
        }
    }
    pclose(help);
    return n;
}

START_TEST(man_pages_document_every_flag)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --help", getenv("VKSCAND"));
    ck_assert_int_ge(flags_in_page(cmd, VKS_SOURCE_ROOT "/docs/vkscand.8"), 20);
    snprintf(cmd, sizeof(cmd), "%s scan --help", getenv("VKSCAN"));
    ck_assert_int_ge(flags_in_page(cmd, VKS_SOURCE_ROOT "/docs/vkscan.1"), 7);
    snprintf(cmd, sizeof(cmd), "%s status --help", getenv("VKSCAN"));
    ck_assert_int_ge(flags_in_page(cmd, VKS_SOURCE_ROOT "/docs/vkscan.1"), 3);
}
END_TEST

/* ---- status ------------------------------------------------------------------- */

START_TEST(status_text_and_json)
{
    struct run r;
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status"));
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_msg(strncmp(r.out, "vkscand ", 8) == 0, "%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, sock));
    ck_assert_ptr_nonnull(strstr(r.out, "\nuptime:"));
    ck_assert_ptr_nonnull(strstr(r.out, "\ncatalogs:"));
    ck_assert_ptr_nonnull(strstr(r.out, "\nqueues:"));
    ck_assert_ptr_null(strstr(r.out, "missing values"));
    /* the GPU engine (lavapipe): host and device memory */
    ck_assert_msg(strstr(r.out, "\nmemory:     host ") != NULL &&
                      strstr(r.out, ", device ") != NULL,
                  "%s", r.out);

    run_cli(&r, NULL, NULL, ARGS("status", "--json", "--socket", sock));
    ck_assert_int_eq(r.status, 0);
    struct jobj o;
    ck_assert_int_eq(count_lines(r.out), 1);
    ck_assert_msg(json_object(r.out, strlen(r.out) - 1, &o), "not JSON: %s", r.out);
    ck_assert_ptr_nonnull(jget(&o, "devices"));
    ck_assert_ptr_nonnull(jget(&o, "stats"));
    ck_assert(strncmp(jget(&o, "server")->val, "vkscand ", 8) == 0);
}
END_TEST

/* One parsed Prometheus sample line. */
struct psample {
    char name[128];
    char labels[256];
    double value;
};

/*
 * Checks the text exposition format (0.0.4): `# HELP name text`, `# TYPE
 * name counter|gauge|histogram|summary|untyped` before the family's samples
 * and once, samples `name{label="value",...} number`, families contiguous.
 * Returns the samples.
 */
static int parse_prometheus(const char *text, struct psample *out, int cap)
{
    char typed[256][128];
    int n_typed = 0, n = 0;
    char family[128] = "";
    for (const char *line = text; *line != '\0';) {
        const char *nl = strchr(line, '\n');
        ck_assert_ptr_nonnull(nl);
        char buf[512];
        ck_assert_int_lt(nl - line, (long)sizeof(buf));
        snprintf(buf, sizeof(buf), "%.*s", (int)(nl - line), line);
        line = nl + 1;
        char name[128], kind[32];
        if (strncmp(buf, "# HELP ", 7) == 0)
            continue;
        if (sscanf(buf, "# TYPE %127s %31s", name, kind) == 2) {
            ck_assert_msg(strstr(" counter gauge histogram summary untyped ", kind) != NULL,
                          "bad type: %s", buf);
            for (int i = 0; i < n_typed; i++)
                ck_assert_msg(strcmp(typed[i], name) != 0, "TYPE twice: %s", name);
            ck_assert_int_lt(n_typed, 256);
            snprintf(typed[n_typed++], sizeof(typed[0]), "%s", name);
            snprintf(family, sizeof(family), "%s", name);
            continue;
        }
        ck_assert_msg(buf[0] != '#', "unknown comment: %s", buf);
        ck_assert_int_lt(n, cap);
        struct psample *s = &out[n++];
        size_t k = 0;
        const char *p = buf;
        ck_assert_msg(isalpha((unsigned char)*p) || *p == '_' || *p == ':', "name: %s", buf);
        while (isalnum((unsigned char)*p) || *p == '_' || *p == ':')
            s->name[k++] = *p++;
        s->name[k] = '\0';
        ck_assert_msg(strncmp(s->name, family, strlen(family)) == 0,
                      "sample %s outside its family %s", s->name, family);
        s->labels[0] = '\0';
        if (*p == '{') {
            const char *end = strchr(p, '}');
            ck_assert_ptr_nonnull(end);
            snprintf(s->labels, sizeof(s->labels), "%.*s", (int)(end - p - 1), p + 1);
            /* label="value" pairs, comma separated */
            for (const char *q = p + 1; q < end;) {
                ck_assert_msg(isalpha((unsigned char)*q) || *q == '_', "label: %s", buf);
                while (isalnum((unsigned char)*q) || *q == '_')
                    q++;
                ck_assert_msg(q[0] == '=' && q[1] == '"', "label value: %s", buf);
                q += 2;
                while (*q != '"' && q < end)
                    q += *q == '\\' ? 2 : 1;
                ck_assert_msg(*q == '"', "label end: %s", buf);
                q++;
                if (*q == ',')
                    q++;
            }
            p = end + 1;
        }
        ck_assert_msg(*p == ' ', "no value: %s", buf);
        char *vend;
        s->value = strtod(p + 1, &vend);
        ck_assert_msg(vend != p + 1 && *vend == '\0', "value: %s", buf);
    }
    return n;
}

static double psample_get(const struct psample *s, int n, const char *name, const char *labels)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(s[i].name, name) == 0 && strcmp(s[i].labels, labels) == 0)
            return s[i].value;
    }
    ck_abort_msg("no sample %s{%s}", name, labels);
    return NAN;
}

START_TEST(status_prometheus_counts_scans)
{
    static struct run r;
    static struct psample before[512], after[512];
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status", "--prometheus"));
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    int nb = parse_prometheus(r.out, before, 512);
    ck_assert_int_gt(nb, 10);
    ck_assert_double_eq(psample_get(before, nb, "vkscand_info",
                                    "server=\"vkscand 0.1.0\",protocol=\"1\",engine=\"gpu\""),
                        1);
    /* One file: one scan request of 23 bytes with 3 hits. */
    struct run s;
    scan(&s, NULL, ARGS("tree/a.txt"));
    ck_assert_int_eq(s.status, 0);
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status", "--prometheus"));
    int na = parse_prometheus(r.out, after, 512);
    /* The one scan is one 23-byte request in one engine batch: each
     * histogram counts it once, scan_bytes in its 4 KiB bucket. */
    static const struct {
        const char *name, *labels;
        double delta;
    } moved[] = {
        {"vkscand_scans_total", "", 1},
        {"vkscand_scanned_bytes_total", "", 23},
        {"vkscand_hits_total", "", 3},
        {"vkscand_requests_total", "op=\"scan\",result=\"ok\"", 1},
        {"vkscand_requests_total", "op=\"scan\",result=\"error\"", 0},
        {"vkscand_requests_received_total", "op=\"scan\"", 1},
        {"vkscand_errors_total", "", 0},
        {"vkscand_scan_bytes_count", "", 1},
        {"vkscand_scan_bytes_sum", "", 23},
        {"vkscand_scan_bytes_bucket", "le=\"4096\"", 1},
        {"vkscand_scan_bytes_bucket", "le=\"65536\"", 1},
        {"vkscand_scan_bytes_bucket", "le=\"+Inf\"", 1},
        {"vkscand_queue_wait_seconds_count", "", 1},
        {"vkscand_queue_wait_seconds_bucket", "le=\"+Inf\"", 1},
        {"vkscand_scan_total_seconds_count", "", 1},
        {"vkscand_scan_total_seconds_bucket", "le=\"10\"", 1},
        {"vkscand_gpu_seconds_count", "", 1},
        {"vkscand_gpu_seconds_bucket", "le=\"+Inf\"", 1},
    };
    for (size_t i = 0; i < sizeof(moved) / sizeof(moved[0]); i++) {
        double d = psample_get(after, na, moved[i].name, moved[i].labels) -
                   psample_get(before, nb, moved[i].name, moved[i].labels);
        ck_assert_msg(d == moved[i].delta, "%s{%s} moved by %g, not %g", moved[i].name,
                      moved[i].labels, d, moved[i].delta);
    }
    ck_assert_double_gt(psample_get(after, na, "vkscand_uptime_seconds", ""), 0);
    /* the 4 GiB bound is an integer, not 4.2949673e+09 */
    ck_assert_ptr_nonnull(strstr(r.out, "\nvkscand_scan_bytes_bucket{le=\"4294967296\"} "));
    ck_assert_ptr_null(strstr(r.out, "e+"));
    /* Each histogram is well formed: TYPE histogram, buckets cumulative in
     * ascending le, the +Inf bucket equal to _count, a _sum. */
    static const char *const hists[] = {"vkscand_queue_wait_seconds", "vkscand_gpu_seconds",
                                        "vkscand_scan_total_seconds", "vkscand_scan_bytes"};
    for (size_t h = 0; h < sizeof(hists) / sizeof(hists[0]); h++) {
        char type[160], bucket[160], name[160];
        snprintf(type, sizeof(type), "# TYPE %s histogram\n", hists[h]);
        ck_assert_msg(strstr(r.out, type) != NULL, "no %s", type);
        snprintf(bucket, sizeof(bucket), "%s_bucket", hists[h]);
        double prev_le = -1, prev = 0;
        int n_buckets = 0;
        for (int i = 0; i < na; i++) {
            if (strcmp(after[i].name, bucket) != 0)
                continue;
            const char *le = strstr(after[i].labels, "le=\"");
            ck_assert_ptr_nonnull(le);
            double bound = strncmp(le + 4, "+Inf", 4) == 0 ? INFINITY : strtod(le + 4, NULL);
            ck_assert_msg(bound > prev_le, "%s: le %g after %g", bucket, bound, prev_le);
            ck_assert_msg(after[i].value >= prev, "%s: not cumulative at le %g", bucket, bound);
            prev_le = bound;
            prev = after[i].value;
            n_buckets++;
        }
        ck_assert_int_eq(n_buckets, 7);
        ck_assert(isinf(prev_le));
        snprintf(name, sizeof(name), "%s_count", hists[h]);
        ck_assert_double_eq(prev, psample_get(after, na, name, ""));
        ck_assert_double_ge(prev, 1);
        snprintf(name, sizeof(name), "%s_sum", hists[h]);
        ck_assert_double_gt(psample_get(after, na, name, ""), 0);
    }
}
END_TEST

/* Prometheus numbers print exactly: integers as integers over all 64 bits
 * (never 1.23e+06 or a rounded double), nanoseconds as exact decimal
 * seconds, histogram bounds as their integers. */
START_TEST(prometheus_numbers_exact)
{
    const struct prom_stat st[] = {
        {.key = "scans", .u = UINT64_MAX},
        {.key = "bytes_scanned", .u = 1230000},
        {.key = "scan_hits", .u = (1ull << 53) + 1},
        {.key = "uptime_ns", .u = 1500000000},
        {.key = "catalog_compile_ns", .u = 123456789},
        {.key = "scan_bytes.bucket.4294967296", .u = 3},
        {.key = "scan_bytes.bucket.inf", .u = 4},
        {.key = "scan_bytes.sum", .u = 10000000000000000001ull},
        {.key = "scan_bytes.count", .u = 4},
        {.key = "gpu_ns.bucket.10000000000", .u = 1},
        {.key = "gpu_ns.bucket.inf", .u = 1},
        {.key = "gpu_ns.sum", .u = 2000000001},
        {.key = "gpu_ns.count", .u = 1},
        {.key = "engine.0.busy_share", .is_float = true, .f = 0.25},
    };
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(prom_write(f, "vkscand test", 1, st, sizeof(st) / sizeof(st[0])), 0);
    fclose(f);
    static const char *const want[] = {
        "\nvkscand_scans_total 18446744073709551615\n",
        "\nvkscand_scanned_bytes_total 1230000\n",
        "\nvkscand_hits_total 9007199254740993\n",
        "\nvkscand_uptime_seconds 1.5\n",
        "\nvkscand_catalog_compile_seconds_total 0.123456789\n",
        "\nvkscand_scan_bytes_bucket{le=\"4294967296\"} 3\n",
        "\nvkscand_scan_bytes_sum 10000000000000000001\n",
        "\nvkscand_gpu_seconds_bucket{le=\"10\"} 1\n",
        "\nvkscand_gpu_seconds_sum 2.000000001\n",
        "\nvkscand_engine_0_busy_share 0.25\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        ck_assert_msg(strstr(text, want[i]) != NULL, "no %s in:\n%s", want[i] + 1, text);
    ck_assert_ptr_null(strstr(text, "e+"));
    free(text);
}
END_TEST

/* ---- status of a CPU-engine daemon ------------------------------------------- */

static void setup_cpu_daemon(void)
{
    base_create();
    make_tree();
    daemon_start(ARGS("--engine", "cpu"));
}

/* tenant.served_* from `status --json` (0 when absent). */
static uint64_t served(const char *json, const char *what)
{
    char key[64];
    snprintf(key, sizeof(key), "\"tenant.served_%s\":", what);
    const char *at = strstr(json, key);
    return at != NULL ? strtoull(at + strlen(key), NULL, 10) : 0;
}

/* A tenant's served counters outlive its connections: the scan's client
 * has left when `status` asks, and the tenant was idle in between. */
START_TEST(status_tenant_counters_survive_idle)
{
    struct run r, s;
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status", "--json"));
    ck_assert_int_eq(r.status, 0);
    uint64_t scans = served(r.out, "scans"), bytes = served(r.out, "bytes");
    scan(&s, NULL, ARGS("tree/a.txt"));
    ck_assert_int_eq(s.status, 0);
    scan(&s, NULL, ARGS("tree/sub/b.bin"));
    ck_assert_int_eq(s.status, 0);
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status", "--json"));
    ck_assert_uint_eq(served(r.out, "scans"), scans + 2);
    ck_assert_uint_eq(served(r.out, "bytes"), bytes + 23 + 7);
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status"));
    char want[64];
    snprintf(want, sizeof(want), ", %llu served (", (unsigned long long)scans + 2);
    ck_assert_msg(strstr(r.out, want) != NULL, "%s", r.out);
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status", "--prometheus"));
    snprintf(want, sizeof(want), "\nvkscand_tenant_served_scans_total{uid=\"%u\"} %llu\n",
             (unsigned)getuid(), (unsigned long long)scans + 2);
    ck_assert_msg(strstr(r.out, want) != NULL, "%s", r.out);
}
END_TEST

/* The CPU engine scans catalogs in host memory: status shows that memory
 * and no device figures as if a GPU held them. */
START_TEST(status_cpu_engine_memory)
{
    struct run r;
    scan(&r, NULL, ARGS("tree/a.txt"));
    ck_assert_int_eq(r.status, 0);
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status", "--json"));
    const char *at = strstr(r.out, "\"catalog_host_bytes\":");
    ck_assert_ptr_nonnull(at);
    unsigned long long host = strtoull(at + 21, NULL, 10);
    ck_assert_uint_gt(host, 0);
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "\nengine:     cpu\n"));
    ck_assert_ptr_null(strstr(r.out, "device"));
    ck_assert_ptr_nonnull(strstr(r.out, " in host memory\n"));
    char want[160];
    snprintf(want, sizeof(want),
             "\nmemory:     host %llu B of 1.0 GiB (catalogs, scanned there "
             "by the CPU engine)\n",
             host);
    if (host >= 1024)
        snprintf(want, sizeof(want),
                 "\nmemory:     host %.1f KiB of 1.0 GiB (catalogs, scanned "
                 "there by the CPU engine)\n",
                 (double)host / 1024);
    ck_assert_msg(strstr(r.out, want) != NULL, "no %s in %s", want, r.out);
}
END_TEST

/* ---- large files on the default engine ------------------------------------- */

/* The default engine (auto: the CPU engine on a machine without a GPU),
 * with max-scan-bytes and the batch limit lowered so that small files stand
 * for the 200 MB file, 1 GiB file and six 60 MB files together. */
static void setup_default_daemon(void)
{
    base_create();
    make_tree();
    daemon_start(ARGS("--max-scan-bytes", "1M", "--batch-max-bytes", "2M"));
}

/* Six files of 1.5 MiB and one of 5 MiB in one command, each over
 * max-scan-bytes and together over a batch: every file is scanned (its
 * needles at the start, around each MiB boundary and at the end all
 * counted), none is skipped, and the exit status says so. */
START_TEST(scan_large_files_none_skipped)
{
    static const size_t sizes[7] = {3u << 19, 3u << 19, 3u << 19, 3u << 19,
                                    3u << 19, 3u << 19, 5u << 20};
    size_t max = sizes[6];
    char *data = malloc(max);
    ck_assert_ptr_nonnull(data);
    char expect[7 * 48], *e = expect;
    const char *argv[16] = {"-c"};
    int n = 1;
    char names[7][32];
    for (int i = 0; i < 7; i++) {
        memset(data, 'x', sizes[i]);
        size_t count = 0;
        memcpy(data, "needle", 6), count++;
        for (size_t at = 1u << 20; at + 3 < sizes[i]; at += 1u << 20)
            memcpy(data + at - 3, "needle", 6), count++; /* across each MiB boundary */
        memcpy(data + sizes[i] - 6, "needle", 6), count++;
        snprintf(names[i], sizeof(names[i]), "large%d.bin", i);
        write_file(names[i], data, sizes[i]);
        argv[n++] = names[i];
        e += sprintf(e, "%s:lit:%zu\n", names[i], count);
    }
    argv[n] = NULL;
    free(data);
    struct run r;
    scan(&r, NULL, argv);
    ck_assert_msg(r.status == 0, "exit %d, stderr: %s", r.status, r.err);
    ck_assert_str_eq(r.out, expect);
    ck_assert_msg(strstr(r.err, "skipped") == NULL, "%s", r.err);
}
END_TEST

/* ---- the example configuration ------------------------------------------------ */

/* A user runs `vkscan scan` with more rule files than tenant-max-catalogs:
 * each load past the limit releases the tenant's least recently used idle
 * catalog instead of failing with BUSY, and a file whose catalog was
 * released loads and scans again. Every scan goes through the GPU engine. */
START_TEST(scan_more_rule_files_than_catalog_limit)
{
    base_create();
    make_tree();
    daemon_start(ARGS("--engine", "gpu", "--tenant-max-catalogs", "2"));
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 5; i++) {
            char rel[32], rule[64], want[128];
            snprintf(rel, sizeof(rel), "r%d.txt", i);
            int n = snprintf(rule, sizeof(rule), "k%d:/ne{1,2}dle/\nk%d:\"ab%d\"\n", i, i, i);
            write_file(rel, rule, (size_t)n);
            struct run r;
            run_cli(&r, NULL, NULL, ARGS("--socket", sock, "scan", "-r", rel, "tree/a.txt"));
            ck_assert_msg(r.status == 0, "round %d file %d: exit %d: %s", round, i, r.status,
                          r.err);
            snprintf(want, sizeof(want), "tree/a.txt:9:k%d\n%stree/a.txt:22:k%d\n", i,
                     i == 1 ? "tree/a.txt:13:k1\n" : "", i);
            ck_assert_str_eq(r.out, want);
        }
    }
    struct run r;
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status", "--json"));
    ck_assert_int_eq(r.status, 0);
    /* 10 loads of 5 rule sets with room for 2: every load after the
     * second released one. */
    ck_assert_msg(strstr(r.out, "\"catalog_tenant_evictions\":8") != NULL, "%s", r.out);
    daemon_stop();
    base_remove();
}
END_TEST

/* Every key vkscand --help lists appears (commented, with its default) in
 * systemd/vkscand.conf.example, and the file with every line uncommented
 * starts a daemon: each documented default is a value vkscand accepts. */
START_TEST(example_config_complete_and_loads)
{
    base_create();
    const char *bin = getenv("VKSCAND");
    ck_assert_ptr_nonnull(bin);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --help", bin);
    FILE *help = popen(cmd, "r");
    ck_assert_ptr_nonnull(help);
    static char example[16384];
    FILE *ex = fopen(VKS_SOURCE_ROOT "/systemd/vkscand.conf.example", "r");
    ck_assert_ptr_nonnull(ex);
    size_t len = fread(example, 1, sizeof(example) - 1, ex);
    example[len] = '\0';
    fclose(ex);
    char line[256];
    int keys = 0;
    while (fgets(line, sizeof(line), help) != NULL) {
        char key[64], want[80];
        if (sscanf(line, " --%63[a-z-]", key) != 1 || strcmp(key, "help") == 0 ||
            strcmp(key, "config") == 0)
            continue;
        snprintf(want, sizeof(want), "\n#%s", key);
        const char *at = strstr(example, want);
        ck_assert_msg(at != NULL, "key %s is not in vkscand.conf.example", key);
        char c = at[strlen(want)];
        ck_assert_msg(c == ' ' || c == '\n', "key %s is not followed by its default", key);
        keys++;
    }
    pclose(help);
    ck_assert_int_ge(keys, 20);
    /* Uncomment `#key value` lines (not the prose, which has a space after #). */
    char conf[256];
    snprintf(conf, sizeof(conf), "%s/vkscand.conf", base);
    FILE *out = fopen(conf, "w");
    ck_assert_ptr_nonnull(out);
    for (char *l = strtok(example, "\n"); l != NULL; l = strtok(NULL, "\n")) {
        if (l[0] == '#' && islower((unsigned char)l[1]))
            fprintf(out, "%s\n", l + 1);
    }
    fclose(out);
    /* Flags win over the file: the socket and state directory stay ours. */
    daemon_start(ARGS("--config", conf, "--engine", "cpu"));
    struct run r;
    run_cli(&r, NULL, NULL, ARGS("--socket", sock, "status", "--json"));
    ck_assert_int_eq(r.status, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "\"limit.max_hits\":1048576"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"limit.tenant_max_catalogs\":64"));
    daemon_stop();
    base_remove();
}
END_TEST

Suite *cli_suite(void)
{
    Suite *s = suite_create("cli");
    TCase *local = tcase_create("local");
    tcase_add_test(local, missing_daemon);
    tcase_add_test(local, rules_check_good_and_bad);
    tcase_add_test(local, man_pages_document_every_flag);
    tcase_add_test(local, usage_messages_and_help);
    tcase_add_test(local, daemon_log_prefix_only_for_journald);
    tcase_add_test(local, prometheus_numbers_exact);
    tcase_set_timeout(local, 60);
    suite_add_tcase(s, local);

    TCase *d = tcase_create("daemon");
    tcase_add_unchecked_fixture(d, setup_daemon, teardown_daemon);
    tcase_add_test(d, scan_text_matches);
    tcase_add_test(d, scan_no_match_exit_1);
    tcase_add_test(d, scan_unreadable_exit_2_dangling_warns);
    tcase_add_test(d, scan_first_count_list);
    tcase_add_test(d, scan_stdin);
    tcase_add_test(d, scan_many_files_in_order);
    tcase_add_test(d, scan_rejected_rule_warns_strict_fails);
    tcase_add_test(d, scan_json_matches_text);
    tcase_add_test(d, scan_json_odd_names);
    tcase_add_test(d, scan_proc_sys_and_devices);
    tcase_add_test(d, scan_several_rule_files_and_e);
    tcase_add_test(d, scan_output_forms);
    tcase_add_test(d, scan_json_records);
    tcase_add_test(d, scan_only_matching_and_starts);
    tcase_add_test(d, scan_walk_ignore_hidden_globs_links);
    tcase_add_test(d, scan_archives_members);
    tcase_add_test(d, scan_archive_corrupt);
    tcase_add_test(d, scan_archive_bomb_caps);
    tcase_add_test(d, status_text_and_json);
    tcase_add_test(d, status_prometheus_counts_scans);
    tcase_set_timeout(d, 300);
    suite_add_tcase(s, d);

    TCase *dflt = tcase_create("default");
    tcase_add_unchecked_fixture(dflt, setup_default_daemon, teardown_daemon);
    tcase_set_timeout(dflt, 120);
    tcase_add_test(dflt, scan_large_files_none_skipped);
    suite_add_tcase(s, dflt);
    TCase *cpu = tcase_create("cpu");
    tcase_add_unchecked_fixture(cpu, setup_cpu_daemon, teardown_daemon);
    tcase_add_test(cpu, status_tenant_counters_survive_idle);
    tcase_add_test(cpu, status_cpu_engine_memory);
    tcase_set_timeout(cpu, 300);
    suite_add_tcase(s, cpu);

    TCase *cfg = tcase_create("config");
    tcase_add_test(cfg, example_config_complete_and_loads);
    tcase_add_test(cfg, scan_more_rule_files_than_catalog_limit);
    tcase_set_timeout(cfg, 300);
    suite_add_tcase(s, cfg);
    return s;
}
