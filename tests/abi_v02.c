/*
 * abi_v02 SOCKET: a libvkscan client written against the 0.2 option layout.
 *
 * It does not include vkscan/vkscan.h: it declares the 0.2 structs and the
 * calls it uses itself, as a program compiled against the 0.2 header would
 * have them, and links against the current libvkscan.so.0. Its option
 * struct ends where 0.2's did; the bytes after it are garbage (0xab), so a
 * library that read past struct_size would take a nonsense memfd threshold
 * and socket buffer size. The daemon (tests/test_libvkscan.c) has a 256 KiB
 * frame limit: the 1 MiB scan below succeeds only through the memfd path the
 * newer library adds by default. Exit 0 when everything checks out.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct vks_error {
    int code;
    char msg[256];
};

struct vks_client;
struct vks_catalog;

/* The 0.2 layout of struct vks_client_options. */
struct v02_client_options {
    size_t struct_size;
    uint32_t connect_timeout_ms;
    uint32_t io_timeout_ms;
    uint32_t retries;
    uint32_t backoff_ms;
    uint32_t max_frame;
    const char *client_name;
};

/* The 0.2 layout of struct vks_scan_options. */
struct v02_scan_options {
    size_t struct_size;
    int mode;
    uint32_t max_hits;
    uint32_t timeout_ms;
    bool rule_ids;
};

struct v02_buffer {
    int kind;
    const void *data;
    size_t len;
    int fd;
    uint64_t offset;
    uint64_t length;
};

struct v02_hit {
    uint32_t buffer;
    uint32_t rule;
    uint64_t end;
    uint32_t count;
    const char *rule_id;
};

struct v02_scan_result {
    struct v02_hit *hits;
    size_t n_hits;
    void *buffers;
    size_t n_buffers;
    void *telemetry;
    size_t n_telemetry;
    void *priv;
};

int vks_client_connect(const char *socket_path, const struct v02_client_options *opt,
                       struct vks_client **out, struct vks_error *err);
void vks_client_close(struct vks_client *c);
int vks_client_ping(struct vks_client *c, struct vks_error *err);
int vks_client_catalog_load_text(struct vks_client *c, const char *text, size_t len,
                                 const void *opt, struct vks_catalog **out, struct vks_error *err);
const uint8_t *vks_catalog_fingerprint(const struct vks_catalog *cat);
void vks_catalog_destroy(struct vks_catalog *cat);
int vks_client_scan(struct vks_client *c, const uint8_t catalog[32], const struct v02_buffer *b,
                    size_t n, const struct v02_scan_options *opt, struct v02_scan_result *res,
                    struct vks_error *err);
void vks_scan_result_finish(struct v02_scan_result *res);

/* A program linked before struct vks_hit gained `start` bound the VKSCAN_0
 * version of vks_client_scan: bind it the same way, so the hits below must
 * come back at the old stride. */
__asm__(".symver vks_client_scan,vks_client_scan@VKSCAN_0");

/* The stream calls that return hits, bound the same way. */
struct vks_stream;
int vks_stream_open(struct vks_client *c, const uint8_t catalog[32], const void *opt,
                    struct vks_stream **out, struct vks_error *err);
int vks_stream_write(struct vks_stream *s, const void *data, size_t len,
                     struct v02_scan_result *res, struct vks_error *err);
int vks_stream_write_fd(struct vks_stream *s, int fd, uint64_t offset, uint64_t length,
                        struct v02_scan_result *res, struct vks_error *err);
int vks_stream_close(struct vks_stream *s, struct v02_scan_result *res, struct vks_error *err);
__asm__(".symver vks_stream_write,vks_stream_write@VKSCAN_0");
__asm__(".symver vks_stream_write_fd,vks_stream_write_fd@VKSCAN_0");
__asm__(".symver vks_stream_close,vks_stream_close@VKSCAN_0");

/* Two hits at `a` and `b` in the 0.2 layout, or FAIL naming `what`. */
static void two_hits(const struct v02_scan_result *res, uint64_t a, uint64_t b, const char *what);

#define FAIL(...) (fprintf(stderr, "abi_v02: " __VA_ARGS__), fputc('\n', stderr), exit(1))

static void two_hits(const struct v02_scan_result *res, uint64_t a, uint64_t b, const char *what)
{
    if (res->n_hits != 2 || res->hits[0].end != a || res->hits[1].end != b ||
        res->hits[1].count != 1 || res->hits[1].rule_id != NULL)
        FAIL("%s: %zu hits, ends %llu, %llu; want 2 hits at %llu and %llu in the 0.2 layout", what,
             res->n_hits, res->n_hits ? (unsigned long long)res->hits[0].end : 0ull,
             res->n_hits > 1 ? (unsigned long long)res->hits[1].end : 0ull, (unsigned long long)a,
             (unsigned long long)b);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        FAIL("usage: abi_v02 SOCKET");
    /* The 0.2 struct, followed by bytes it does not own. */
    union {
        struct v02_client_options o;
        unsigned char raw[256];
    } u;
    memset(&u, 0xab, sizeof(u));
    u.o = (struct v02_client_options){.struct_size = sizeof(struct v02_client_options),
                                      .connect_timeout_ms = 5000,
                                      .io_timeout_ms = 60000,
                                      .retries = 1,
                                      .backoff_ms = 10,
                                      .max_frame = 1u << 20,
                                      .client_name = "abi-v0.2"};
    memset(u.raw + sizeof(u.o), 0xab, sizeof(u.raw) - sizeof(u.o));
    struct vks_client *c;
    struct vks_error err = {0};
    if (vks_client_connect(argv[1], &u.o, &c, &err) != 0)
        FAIL("connect: %s", err.msg);
    if (vks_client_ping(c, &err) != 0)
        FAIL("ping: %s", err.msg);
    struct vks_catalog *cat;
    const char text[] = "needle:/needle/\n";
    if (vks_client_catalog_load_text(c, text, strlen(text), NULL, &cat, &err) != 0)
        FAIL("load: %s", err.msg);
    size_t len = 1u << 20;
    char *b = malloc(len);
    if (b == NULL)
        FAIL("out of memory");
    memset(b, '-', len);
    memcpy(b + 4096 - 6, "needle", 6);
    memcpy(b + 8192 - 6, "needle", 6);
    union {
        struct v02_scan_options o;
        unsigned char raw[128];
    } so;
    memset(&so, 0xab, sizeof(so));
    so.o = (struct v02_scan_options){.struct_size = sizeof(struct v02_scan_options)};
    struct v02_buffer buf = {.kind = 0, .data = b, .len = len};
    struct v02_scan_result res;
    if (vks_client_scan(c, vks_catalog_fingerprint(cat), &buf, 1, &so.o, &res, &err) != 0)
        FAIL("scan of 1 MiB: %s", err.msg);
    if (res.n_hits != 2 || res.hits[0].end != 4096 || res.hits[1].end != 8192 ||
        res.hits[1].count != 1 || res.hits[1].rule_id != NULL)
        FAIL("scan: %zu hits, ends %llu, %llu; want 2 hits at 4096 and 8192 in the 0.2 layout",
             res.n_hits, res.n_hits ? (unsigned long long)res.hits[0].end : 0ull,
             res.n_hits > 1 ? (unsigned long long)res.hits[1].end : 0ull);
    vks_scan_result_finish(&res);

    struct vks_stream *st;
    if (vks_stream_open(c, vks_catalog_fingerprint(cat), NULL, &st, &err) != 0)
        FAIL("stream open: %s", err.msg);
    if (vks_stream_write(st, "needle needle ", 14, &res, &err) != 0)
        FAIL("stream write: %s", err.msg);
    two_hits(&res, 6, 13, "stream write");
    vks_scan_result_finish(&res);
    int fd = memfd_create("abi", 0);
    if (fd < 0 || write(fd, "needle needle", 13) != 13)
        FAIL("memfd");
    if (vks_stream_write_fd(st, fd, 0, 13, &res, &err) != 0)
        FAIL("stream write_fd: %s", err.msg);
    two_hits(&res, 20, 27, "stream write_fd");
    vks_scan_result_finish(&res);
    close(fd);
    if (vks_stream_close(st, &res, &err) != 0 || res.n_hits != 0)
        FAIL("stream close: %s", err.msg);
    vks_scan_result_finish(&res);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    free(b);
    printf("abi_v02: the 0.2 layout works against this libvkscan\n");
    return 0;
}
