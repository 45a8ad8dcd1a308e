/*
 * libFuzzer target for the frame accumulator and the request and reply
 * decoders. The first input byte picks the chunk size the stream is fed in,
 * so frame boundaries fall everywhere; the rest is the byte stream. Every
 * complete frame is decoded as a request and, separately, as a reply. Seeds:
 * tests/fuzz/seeds-proto/ (valid frames of every op).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

static void decode_both(struct proto_frame *f, const struct proto_limits *lim)
{
    struct proto_frame copy = {.len = f->len, .data = malloc(f->len ? f->len : 1)};
    struct proto_request *req = NULL;
    struct proto_reply *rep = NULL;
    struct proto_head head;
    struct vks_error err;
    if (copy.data == NULL) {
        proto_frame_finish(f);
        return;
    }
    memcpy(copy.data, f->data, f->len);
    if (proto_request_decode(f, lim, &req, &head, &err) == 0) {
        struct proto_buf b;
        proto_buf_init(&b);
        /* A decoded request must re-encode (all its fields are in range). */
        if (req->op != PROTO_OP_SCAN && proto_request_encode(&b, req, &err) != 0)
            abort();
        proto_buf_finish(&b);
    }
    proto_request_destroy(req);
    if (proto_reply_decode(&copy, lim, &rep, &err) == 0) {
        struct proto_buf b;
        proto_buf_init(&b);
        proto_reply_encode(&b, rep, &err);
        proto_buf_finish(&b);
    }
    proto_reply_destroy(rep);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct proto_limits lim = {.max_frame = 1u << 20,
                               .max_depth = 8,
                               .max_str = 4096,
                               .max_array = 1024,
                               .max_buffers = 64,
                               .max_rules = 256};
    struct proto_reader *r;
    struct vks_error err;
    if (size < 1 || proto_reader_create(&lim, &r) < 0)
        return 0;
    size_t chunk = (size_t)data[0] % 17 + 1;
    size_t off = 1;
    while (off < size) {
        size_t used, n = size - off < chunk ? size - off : chunk;
        int rc = proto_reader_feed(r, data + off, n, &used, &err);
        off += used;
        if (rc < 0)
            break;
        if (rc == 1) {
            struct proto_frame f;
            proto_reader_take(r, &f);
            decode_both(&f, &lim);
        }
    }
    proto_reader_destroy(r);
    return 0;
}
