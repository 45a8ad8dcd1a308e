/*
 * vkscan._vkscan: the CPython binding of libvkscan (vkscan/vkscan.h). It
 * speaks no protocol itself: every call is one libvkscan call, made with the
 * GIL released. The Pythonic layer (Catalog, Match, file objects, the
 * exception classes) is vkscan/__init__.py; this module raises the class
 * that layer registers for each code (_set_error_factory).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <string.h>

#include "vkscan/vkscan.h"

/* error_factory(code, message) -> exception instance; set by __init__.py. */
static PyObject *error_factory;

static PyObject *raise_code(int code, const char *msg)
{
    if (error_factory == NULL) {
        PyErr_Format(PyExc_RuntimeError, "vkscan error %d: %s", code, msg);
        return NULL;
    }
    PyObject *exc = PyObject_CallFunction(error_factory, "is", code, msg);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static PyObject *raise_err(int rc, const struct vks_error *err)
{
    return raise_code(rc, err->msg[0] != '\0' ? err->msg : vks_strerror(rc));
}

static PyObject *set_error_factory(PyObject *self, PyObject *fn)
{
    (void)self;
    Py_XINCREF(fn);
    Py_XSETREF(error_factory, fn);
    Py_RETURN_NONE;
}

static PyObject *py_strerror(PyObject *self, PyObject *arg)
{
    (void)self;
    int code = (int)PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(vks_strerror(code));
}

/* ---- Client ------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD struct vks_client *c;
    PyThread_type_lock lock; /* one call at a time: libvkscan clients are not shared */
} Client;

static int client_init(Client *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"socket",  "connect_timeout_ms", "io_timeout_ms",
                             "retries", "client_name",        "memfd_threshold",
                             NULL};
    const char *path;
    const char *name = "python-vkscan";
    unsigned int connect_ms = 0, io_ms = 0, retries = 3;
    unsigned long long memfd_threshold = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|IIIsK", kwlist, &path, &connect_ms, &io_ms,
                                     &retries, &name, &memfd_threshold))
        return -1;
    if (self->c != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "client is already connected");
        return -1;
    }
    if (self->lock == NULL && (self->lock = PyThread_allocate_lock()) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    struct vks_client_options o;
    vks_client_options_init(&o);
    if (connect_ms)
        o.connect_timeout_ms = connect_ms;
    if (io_ms)
        o.io_timeout_ms = io_ms;
    o.retries = retries;
    o.client_name = name;
    o.memfd_threshold = memfd_threshold;
    struct vks_error err = {0};
    struct vks_client *c = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_client_connect(path, &o, &c, &err);
    Py_END_ALLOW_THREADS if (rc != 0)
    {
        raise_err(rc, &err);
        return -1;
    }
    self->c = c;
    return 0;
}

static void client_dealloc(Client *self)
{
    vks_client_close(self->c);
    if (self->lock != NULL)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Takes the client for one call (GIL released while waiting). */
static int client_enter(Client *self)
{
    if (self->c == NULL) {
        raise_code(-VKS_E_CLOSED, "the client is closed: open a new vkscan.Client");
        return -1;
    }
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
    if (self->c == NULL) {
        PyThread_release_lock(self->lock);
        raise_code(-VKS_E_CLOSED, "the client is closed: open a new vkscan.Client");
        return -1;
    }
    return 0;
}

static PyObject *client_close(Client *self, PyObject *unused)
{
    (void)unused;
    if (self->c != NULL && self->lock != NULL) {
        Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS vks_client_close(self->c);
        self->c = NULL;
        PyThread_release_lock(self->lock);
    }
    Py_RETURN_NONE;
}

static PyObject *client_closed(Client *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->c == NULL);
}

static PyObject *client_ping(Client *self, PyObject *unused)
{
    (void)unused;
    if (client_enter(self) < 0)
        return NULL;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_client_ping(self->c, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->lock);
    if (rc != 0)
        return raise_err(rc, &err);
    Py_RETURN_NONE;
}

static PyObject *info_dict(const struct vks_server_info *in)
{
    PyObject *devs = PyList_New(0);
    if (devs == NULL)
        return NULL;
    for (uint32_t i = 0; i < in->n_devices; i++) {
        const struct vks_device *d = &in->devices[i];
        PyObject *o = Py_BuildValue("{s:I,s:s,s:s,s:K,s:O}", "index", d->index, "name", d->name,
                                    "type", d->type, "memory", (unsigned long long)d->memory,
                                    "active", d->active ? Py_True : Py_False);
        if (o == NULL || PyList_Append(devs, o) < 0) {
            Py_XDECREF(o);
            Py_DECREF(devs);
            return NULL;
        }
        Py_DECREF(o);
    }
    return Py_BuildValue("{s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:N}", "protocol", in->protocol, "server",
                         in->server, "max_frame", in->max_frame, "max_buffers", in->max_buffers,
                         "max_rules", in->max_rules, "max_fds", in->max_fds, "max_hits",
                         in->max_hits, "devices", devs);
}

static PyObject *client_info(Client *self, PyObject *unused)
{
    (void)unused;
    if (client_enter(self) < 0)
        return NULL;
    struct vks_server_info info;
    vks_client_info(self->c, &info);
    PyThread_release_lock(self->lock);
    return info_dict(&info);
}

static PyObject *client_hello(Client *self, PyObject *unused)
{
    (void)unused;
    if (client_enter(self) < 0)
        return NULL;
    struct vks_server_info info;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_client_hello(self->c, &info, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->lock);
    if (rc != 0)
        return raise_err(rc, &err);
    return info_dict(&info);
}

static PyObject *stat_dict(const struct vks_stat *v, size_t n)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d != NULL && i < n; i++) {
        PyObject *x =
            v[i].is_float ? PyFloat_FromDouble(v[i].f) : PyLong_FromUnsignedLongLong(v[i].u);
        if (x == NULL || PyDict_SetItemString(d, v[i].key, x) < 0) {
            Py_XDECREF(x);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(x);
    }
    return d;
}

static PyObject *client_stats(Client *self, PyObject *unused)
{
    (void)unused;
    if (client_enter(self) < 0)
        return NULL;
    struct vks_stats st;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_client_stats(self->c, &st, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->lock);
    if (rc != 0)
        return raise_err(rc, &err);
    PyObject *d = stat_dict(st.stats, st.n_stats);
    vks_stats_finish(&st);
    return d;
}

static PyObject *bytes_fp(const uint8_t *fp)
{
    return PyBytes_FromStringAndSize((const char *)fp, VKS_FP_LEN);
}

/* A loaded catalog as a dict (the Python Catalog's fields). */
static PyObject *catalog_dict(const struct vks_catalog *cat)
{
    size_t n = vks_catalog_rule_count(cat), nr = vks_catalog_reject_count(cat);
    PyObject *rules = PyList_New((Py_ssize_t)n);
    PyObject *rejects = PyList_New((Py_ssize_t)nr);
    if (rules == NULL || rejects == NULL)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        PyObject *s =
            PyUnicode_DecodeUTF8(vks_catalog_rule_id(cat, i),
                                 (Py_ssize_t)strlen(vks_catalog_rule_id(cat, i)), "replace");
        if (s == NULL)
            goto fail;
        PyList_SET_ITEM(rules, (Py_ssize_t)i, s);
    }
    for (size_t i = 0; i < nr; i++) {
        struct vks_reject r;
        vks_catalog_reject(cat, i, &r);
        PyObject *t = Py_BuildValue("(IIIss)", r.index, r.line, r.pos, r.id ? r.id : "",
                                    r.message ? r.message : "");
        if (t == NULL)
            goto fail;
        PyList_SET_ITEM(rejects, (Py_ssize_t)i, t);
    }
    return Py_BuildValue(
        "{s:N,s:N,s:O,s:O,s:N,s:N}", "fingerprint", bytes_fp(vks_catalog_fingerprint(cat)),
        "source", bytes_fp(vks_catalog_source(cat)), "rules_sent",
        vks_catalog_rules_sent(cat) ? Py_True : Py_False, "cached",
        vks_catalog_cached(cat) ? Py_True : Py_False, "rules", rules, "rejects", rejects);
fail:
    Py_XDECREF(rules);
    Py_XDECREF(rejects);
    return NULL;
}

static PyObject *client_load_text(Client *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"text", "max_states", "always_send", NULL};
    Py_buffer text;
    unsigned int max_states = 0;
    int always_send = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|Ip", kwlist, &text, &max_states, &always_send))
        return NULL;
    if (client_enter(self) < 0) {
        PyBuffer_Release(&text);
        return NULL;
    }
    struct vks_load_options lo;
    vks_load_options_init(&lo);
    lo.max_states = max_states;
    lo.always_send = always_send != 0;
    lo.ids_only = true; /* Catalog.rules holds the ids only: the smaller reply */
    struct vks_catalog *cat = NULL;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc =
        vks_client_catalog_load_text(self->c, text.buf, (size_t)text.len, &lo, &cat, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->lock);
    PyBuffer_Release(&text);
    if (rc != 0)
        return raise_err(rc, &err);
    PyObject *d = catalog_dict(cat);
    vks_catalog_destroy(cat);
    return d;
}

/* load_rules([(id, kind, pattern, flags), ...], max_states=0, always_send=False):
 * kind 0 literal, 1 hex, 2 regex; pattern bytes; flags str. */
static PyObject *client_load_rules(Client *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"rules", "max_states", "always_send", NULL};
    PyObject *list;
    unsigned int max_states = 0;
    int always_send = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Ip", kwlist, &list, &max_states, &always_send))
        return NULL;
    PyObject *seq = PySequence_Fast(list, "rules must be a sequence of tuples");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    struct vks_rule *rules = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*rules));
    PyObject *result = NULL;
    if (rules == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *id, *pattern, *flags;
        Py_ssize_t plen;
        int kind;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "siy#s", &id, &kind, &pattern,
                              &plen, &flags))
            goto out;
        if (plen == 0) {
            PyErr_Format(PyExc_ValueError, "rule %s has an empty pattern", id);
            goto out;
        }
        rules[i] = (struct vks_rule){.id = id,
                                     .kind = (enum vks_rule_kind)kind,
                                     .pattern = pattern,
                                     .pattern_len = (size_t)plen,
                                     .flags = flags};
    }
    if (client_enter(self) < 0)
        goto out;
    struct vks_load_options lo;
    vks_load_options_init(&lo);
    lo.max_states = max_states;
    lo.always_send = always_send != 0;
    lo.ids_only = true; /* Catalog.rules holds the ids only: the smaller reply */
    struct vks_catalog *cat = NULL;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_client_catalog_load(self->c, rules, (size_t)n, &lo, &cat, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->lock);
    if (rc != 0) {
        raise_err(rc, &err);
        goto out;
    }
    result = catalog_dict(cat);
    vks_catalog_destroy(cat);
out:
    PyMem_Free(rules);
    Py_DECREF(seq); /* the tuples (and the strings `rules` points into) live in `list` */
    return result;
}

static int get_fp(PyObject *o, uint8_t fp[VKS_FP_LEN])
{
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(o, &p, &n) < 0)
        return -1;
    if (n != VKS_FP_LEN) {
        PyErr_Format(PyExc_ValueError, "a fingerprint is %u bytes, got %zd", VKS_FP_LEN, n);
        return -1;
    }
    memcpy(fp, p, VKS_FP_LEN);
    return 0;
}

static PyObject *client_has_drop(Client *self, PyObject *arg, bool drop)
{
    uint8_t fp[VKS_FP_LEN];
    if (get_fp(arg, fp) < 0 || client_enter(self) < 0)
        return NULL;
    bool yes = false;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = drop ? vks_client_catalog_drop(self->c, fp, &yes, &err)
                                     : vks_client_catalog_has(self->c, fp, &yes, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->lock);
    if (rc != 0)
        return raise_err(rc, &err);
    return PyBool_FromLong(yes);
}

static PyObject *client_has(Client *self, PyObject *arg)
{
    return client_has_drop(self, arg, false);
}

static PyObject *client_drop(Client *self, PyObject *arg)
{
    return client_has_drop(self, arg, true);
}

/*
 * scan(fingerprint, buffers, mode=0, max_hits=0, timeout_ms=0, starts=False)
 * where each buffer is a bytes-like object (inline) or a tuple (fd, offset,
 * length). Returns (hits, buffers, telemetry): hits as (buffer, rule, end,
 * count, start) tuples, start None when the hit has none (a rule without
 * flag L, unless `starts`), buffers as (code, message, bytes, hits,
 * truncated).
 */
static PyObject *client_scan(Client *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"fingerprint", "buffers", "mode", "max_hits",
                             "timeout_ms",  "starts",  NULL};
    PyObject *fpo, *seq_in;
    unsigned int mode = 0, max_hits = 0, timeout_ms = 0;
    int starts = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|IIIp", kwlist, &fpo, &seq_in, &mode, &max_hits,
                                     &timeout_ms, &starts))
        return NULL;
    uint8_t fp[VKS_FP_LEN];
    if (get_fp(fpo, fp) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(seq_in, "buffers must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    struct vks_buffer *bufs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*bufs));
    Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*views));
    Py_ssize_t n_views = 0;
    PyObject *result = NULL;
    if (bufs == NULL || views == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (PyTuple_Check(it)) {
            int fd;
            unsigned long long off = 0, len = 0;
            if (!PyArg_ParseTuple(it, "i|KK", &fd, &off, &len))
                goto out;
            bufs[i] =
                (struct vks_buffer){.kind = VKS_BUFFER_FD, .fd = fd, .offset = off, .length = len};
            continue;
        }
        if (PyObject_GetBuffer(it, &views[n_views], PyBUF_SIMPLE) < 0)
            goto out;
        bufs[i] = (struct vks_buffer){.kind = VKS_BUFFER_INLINE,
                                      .data = views[n_views].buf,
                                      .len = (size_t)views[n_views].len};
        n_views++;
    }
    if (client_enter(self) < 0)
        goto out;
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.mode = (enum vks_report)mode;
    so.max_hits = max_hits;
    so.timeout_ms = timeout_ms;
    so.rule_ids = false;
    so.starts = starts != 0;
    struct vks_scan_result res;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_client_scan(self->c, fp, bufs, (size_t)n, &so, &res, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->lock);
    if (rc != 0) {
        raise_err(rc, &err);
        goto out;
    }
    PyObject *hits = PyList_New((Py_ssize_t)res.n_hits);
    PyObject *bres = PyList_New((Py_ssize_t)res.n_buffers);
    PyObject *tel = stat_dict(res.telemetry, res.n_telemetry);
    bool ok = hits != NULL && bres != NULL && tel != NULL;
    for (size_t i = 0; ok && i < res.n_hits; i++) {
        const struct vks_hit *h = &res.hits[i];
        PyObject *start = h->start == VKS_NO_START
                              ? (Py_INCREF(Py_None), Py_None)
                              : PyLong_FromUnsignedLongLong((unsigned long long)h->start);
        PyObject *t = start == NULL ? NULL
                                    : Py_BuildValue("(IIKIN)", h->buffer, h->rule,
                                                    (unsigned long long)h->end, h->count, start);
        ok = t != NULL;
        if (ok)
            PyList_SET_ITEM(hits, (Py_ssize_t)i, t);
    }
    for (size_t i = 0; ok && i < res.n_buffers; i++) {
        const struct vks_buffer_result *b = &res.buffers[i];
        PyObject *t = Py_BuildValue("(izKIO)", b->code, b->message, (unsigned long long)b->bytes,
                                    b->hits, b->truncated ? Py_True : Py_False);
        ok = t != NULL;
        if (ok)
            PyList_SET_ITEM(bres, (Py_ssize_t)i, t);
    }
    vks_scan_result_finish(&res);
    if (ok) {
        result = PyTuple_Pack(3, hits, bres, tel);
    }
    Py_XDECREF(hits);
    Py_XDECREF(bres);
    Py_XDECREF(tel);
out:
    for (Py_ssize_t i = 0; i < n_views; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(bufs);
    Py_DECREF(seq);
    return result;
}

/* ---- streams ------------------------------------------------------------------ */

/* One libvkscan stream; it uses its client's connection (and lock). */
typedef struct {
    PyObject_HEAD Client *client; /* strong reference */
    struct vks_stream *st;
} Stream;

static PyTypeObject StreamType;

/* [(rule, end)] of a stream write or close. */
static PyObject *stream_hits(const struct vks_scan_result *res)
{
    PyObject *l = PyList_New((Py_ssize_t)res->n_hits);
    for (size_t i = 0; l != NULL && i < res->n_hits; i++) {
        PyObject *t = Py_BuildValue("(IKI)", res->hits[i].rule,
                                    (unsigned long long)res->hits[i].end, res->hits[i].count);
        if (t == NULL) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    return l;
}

static PyObject *client_stream_open(Client *self, PyObject *args)
{
    uint8_t fp[VKS_FP_LEN];
    PyObject *fpo;
    int mode = VKS_REPORT_ALL;
    if (!PyArg_ParseTuple(args, "O|i", &fpo, &mode) || get_fp(fpo, fp) < 0 ||
        client_enter(self) < 0)
        return NULL;
    struct vks_stream_options so;
    vks_stream_options_init(&so);
    so.mode = (enum vks_report)mode;
    struct vks_stream *st = NULL;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_stream_open(self->c, fp, &so, &st, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->lock);
    if (rc != 0)
        return raise_err(rc, &err);
    Stream *s = PyObject_New(Stream, &StreamType);
    if (s == NULL) {
        vks_stream_close(st, NULL, NULL);
        return NULL;
    }
    Py_INCREF(self);
    s->client = self;
    s->st = st;
    return Py_BuildValue("(NK)", (PyObject *)s, (unsigned long long)vks_stream_state_bytes(st));
}

static PyObject *stream_write(Stream *self, PyObject *arg)
{
    if (self->st == NULL)
        return raise_code(-VKS_E_BAD_VALUE, "the stream is closed: open a new one");
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (client_enter(self->client) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    struct vks_scan_result res;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_stream_write(self->st, view.buf, (size_t)view.len, &res, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->client->lock);
    PyBuffer_Release(&view);
    if (rc != 0)
        return raise_err(rc, &err);
    PyObject *l = stream_hits(&res);
    vks_scan_result_finish(&res);
    return l;
}

/* stream.write without waiting for the reply (vks_stream_write_send). */
static PyObject *stream_send(Stream *self, PyObject *arg)
{
    if (self->st == NULL)
        return raise_code(-VKS_E_BAD_VALUE, "the stream is closed: open a new one");
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (client_enter(self->client) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_stream_write_send(self->st, view.buf, (size_t)view.len, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->client->lock);
    PyBuffer_Release(&view);
    if (rc != 0)
        return raise_err(rc, &err);
    Py_RETURN_NONE;
}

/* The reply of the oldest write sent (vks_stream_write_recv). */
static PyObject *stream_recv(Stream *self, PyObject *unused)
{
    (void)unused;
    if (self->st == NULL)
        return raise_code(-VKS_E_BAD_VALUE, "the stream is closed: open a new one");
    if (client_enter(self->client) < 0)
        return NULL;
    struct vks_scan_result res;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_stream_write_recv(self->st, &res, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->client->lock);
    if (rc != 0)
        return raise_err(rc, &err);
    PyObject *l = stream_hits(&res);
    vks_scan_result_finish(&res);
    return l;
}

static PyObject *stream_inflight(Stream *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLong(self->st != NULL ? vks_stream_inflight(self->st) : 0);
}

/* Ends the stream; with its client closed there is no connection to tell,
 * and the handle (a few bytes, borrowing the freed client) is left. With
 * writes in flight it raises (EBUSY) and the stream stays open. */
static PyObject *stream_close(Stream *self, PyObject *unused)
{
    (void)unused;
    if (self->st == NULL)
        return PyList_New(0);
    if (self->client->c == NULL) {
        self->st = NULL;
        return PyList_New(0);
    }
    if (client_enter(self->client) < 0)
        return NULL;
    struct vks_scan_result res;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_stream_close(self->st, &res, &err);
    Py_END_ALLOW_THREADS if (rc != -EBUSY) self->st = NULL;
    PyThread_release_lock(self->client->lock);
    if (rc != 0)
        return raise_err(rc, &err);
    PyObject *l = stream_hits(&res);
    vks_scan_result_finish(&res);
    return l;
}

/* (hits [(index, rule, end)], statuses [(code, message, bytes)]) of a
 * stream.writes or a stream.close of many streams. */
static PyObject *many_result(const struct vks_scan_result *res)
{
    PyObject *hits = PyList_New((Py_ssize_t)res->n_hits);
    PyObject *st = PyList_New((Py_ssize_t)res->n_buffers);
    bool ok = hits != NULL && st != NULL;
    for (size_t i = 0; ok && i < res->n_hits; i++) {
        const struct vks_hit *h = &res->hits[i];
        PyObject *t =
            Py_BuildValue("(IIKI)", h->buffer, h->rule, (unsigned long long)h->end, h->count);
        ok = t != NULL;
        if (ok)
            PyList_SET_ITEM(hits, (Py_ssize_t)i, t);
    }
    for (size_t i = 0; ok && i < res->n_buffers; i++) {
        const struct vks_buffer_result *b = &res->buffers[i];
        PyObject *t = Py_BuildValue("(izK)", b->code, b->message, (unsigned long long)b->bytes);
        ok = t != NULL;
        if (ok)
            PyList_SET_ITEM(st, (Py_ssize_t)i, t);
    }
    PyObject *r = ok ? Py_BuildValue("(OO)", hits, st) : NULL;
    Py_XDECREF(hits);
    Py_XDECREF(st);
    return r;
}

/* The RawStreams of `seq` (all of `client`, open), into a new array. */
static struct vks_stream **streams_of(Client *client, PyObject *seq, Py_ssize_t n)
{
    struct vks_stream **v = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*v));
    if (v == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyObject_TypeCheck(o, &StreamType) || ((Stream *)o)->client != client ||
            ((Stream *)o)->st == NULL) {
            PyMem_Free(v);
            raise_code(-VKS_E_BAD_VALUE, "expected open streams of this client");
            return NULL;
        }
        v[i] = ((Stream *)o)->st;
    }
    return v;
}

/* stream.writes: [(RawStream, bytes-like)] in one request. */
static PyObject *client_stream_write_many(Client *self, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "writes must be a sequence of (stream, data)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *streams = PyList_New(n), *result = NULL;
    struct vks_buffer *bufs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*bufs));
    Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*views));
    struct vks_stream **v = NULL;
    Py_ssize_t n_views = 0;
    if (streams == NULL || bufs == NULL || views == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i), *st, *data;
        if (!PyArg_ParseTuple(it, "OO", &st, &data) ||
            PyObject_GetBuffer(data, &views[n_views], PyBUF_SIMPLE) < 0)
            goto out;
        Py_INCREF(st);
        PyList_SET_ITEM(streams, i, st);
        bufs[i] = (struct vks_buffer){.kind = VKS_BUFFER_INLINE,
                                      .data = views[n_views].buf,
                                      .len = (size_t)views[n_views].len};
        n_views++;
    }
    PyObject *sf = PySequence_Fast(streams, "");
    if (sf == NULL)
        goto out;
    v = streams_of(self, sf, n);
    Py_DECREF(sf);
    if (v == NULL || client_enter(self) < 0)
        goto out;
    struct vks_scan_result res;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_stream_write_many(v, bufs, (size_t)n, &res, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->lock);
    if (rc != 0) {
        raise_err(rc, &err);
        goto out;
    }
    result = many_result(&res);
    vks_scan_result_finish(&res);
out:
    for (Py_ssize_t i = 0; i < n_views; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(bufs);
    PyMem_Free(v);
    Py_XDECREF(streams);
    Py_DECREF(seq);
    return result;
}

/* stream.close of many RawStreams in one request; each is closed after. */
static PyObject *client_stream_close_many(Client *self, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "streams must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = NULL;
    struct vks_stream **v = streams_of(self, seq, n);
    if (v == NULL || client_enter(self) < 0)
        goto out;
    struct vks_scan_result res;
    struct vks_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = vks_stream_close_many(v, (size_t)n, &res, &err);
    Py_END_ALLOW_THREADS PyThread_release_lock(self->lock);
    if (rc != -EBUSY)
        for (Py_ssize_t i = 0; i < n; i++) /* freed by the call */
            ((Stream *)PySequence_Fast_GET_ITEM(seq, i))->st = NULL;
    if (rc != 0) {
        raise_err(rc, &err);
        goto out;
    }
    result = many_result(&res);
    vks_scan_result_finish(&res);
out:
    PyMem_Free(v);
    Py_DECREF(seq);
    return result;
}

static PyObject *stream_offset(Stream *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(self->st != NULL ? vks_stream_offset(self->st) : 0);
}

static void stream_dealloc(Stream *self)
{
    /* a stream dropped with writes in flight: their replies are taken
     * (and dropped with it) so that the close can free the daemon's state */
    while (self->st != NULL && self->client->c != NULL && vks_stream_inflight(self->st) > 0) {
        PyObject *r = stream_recv(self, NULL);
        if (r == NULL) {
            PyErr_Clear();
            break;
        }
        Py_DECREF(r);
    }
    if (self->st != NULL) {
        PyObject *r = stream_close(self, NULL);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    Py_XDECREF(self->client);
    PyObject_Free(self);
}

static PyMethodDef stream_methods[] = {
    {"write", (PyCFunction)stream_write, METH_O, "stream.write: [(rule, end)]."},
    {"close", (PyCFunction)stream_close, METH_NOARGS, "stream.close: [(rule, end)]."},
    {"send", (PyCFunction)stream_send, METH_O, "stream.write, pipelined: no reply yet."},
    {"recv", (PyCFunction)stream_recv, METH_NOARGS, "the oldest sent write's [(rule, end)]."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef stream_getset[] = {
    {"offset", (getter)stream_offset, NULL, "Bytes written so far.", NULL},
    {"inflight", (getter)stream_inflight, NULL, "Writes sent, replies not taken.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vkscan._vkscan.RawStream",
    .tp_basicsize = sizeof(Stream),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One libvkscan stream (use vkscan.Stream).",
    .tp_dealloc = (destructor)stream_dealloc,
    .tp_methods = stream_methods,
    .tp_getset = stream_getset,
};

static PyMethodDef client_methods[] = {
    {"close", (PyCFunction)client_close, METH_NOARGS, "Close the connection."},
    {"ping", (PyCFunction)client_ping, METH_NOARGS, "A round trip that does no work."},
    {"info", (PyCFunction)client_info, METH_NOARGS, "The hello reply of this connection."},
    {"hello", (PyCFunction)client_hello, METH_NOARGS, "Send hello again; the reply."},
    {"stats", (PyCFunction)client_stats, METH_NOARGS, "The daemon's stats map."},
    {"load_text", (PyCFunction)(void (*)(void))client_load_text, METH_VARARGS | METH_KEYWORDS,
     "catalog.has / catalog.load of a pattern file's text."},
    {"load_rules", (PyCFunction)(void (*)(void))client_load_rules, METH_VARARGS | METH_KEYWORDS,
     "catalog.has / catalog.load of (id, kind, pattern, flags) tuples."},
    {"has", (PyCFunction)client_has, METH_O, "catalog.has by fingerprint."},
    {"drop", (PyCFunction)client_drop, METH_O, "catalog.drop by fingerprint."},
    {"stream_open", (PyCFunction)client_stream_open, METH_VARARGS,
     "stream.open by fingerprint: (RawStream, state_bytes)."},
    {"stream_write_many", (PyCFunction)client_stream_write_many, METH_O,
     "stream.writes of [(RawStream, data)]: (hits, statuses)."},
    {"stream_close_many", (PyCFunction)client_stream_close_many, METH_O,
     "stream.close of [RawStream]: (hits, statuses)."},
    {"scan", (PyCFunction)(void (*)(void))client_scan, METH_VARARGS | METH_KEYWORDS,
     "Scan buffers (bytes-like, or (fd, offset, length) tuples)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
    {"closed", (getter)client_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vkscan._vkscan.RawClient",
    .tp_basicsize = sizeof(Client),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "One libvkscan connection (use vkscan.Client).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)client_init,
    .tp_dealloc = (destructor)client_dealloc,
    .tp_methods = client_methods,
    .tp_getset = client_getset,
};

static PyObject *py_version(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(vks_version());
}

static PyMethodDef module_methods[] = {
    {"_set_error_factory", set_error_factory, METH_O, "Register error_factory(code, message)."},
    {"strerror", py_strerror, METH_O, "The short name of a libvkscan code."},
    {"library_version", py_version, METH_NOARGS, "libvkscan's version."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_vkscan",
    "libvkscan binding (see the vkscan package)",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__vkscan(void)
{
    if (PyType_Ready(&ClientType) < 0 || PyType_Ready(&StreamType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ClientType);
    if (PyModule_AddObject(m, "RawClient", (PyObject *)&ClientType) < 0) {
        Py_DECREF(&ClientType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "FP_LEN", VKS_FP_LEN);
    PyModule_AddIntConstant(m, "MEMFD_THRESHOLD_DEFAULT", VKS_MEMFD_THRESHOLD_DEFAULT);
#define CODE(name) PyModule_AddIntConstant(m, "E_" #name, VKS_E_##name)
    CODE(FRAME_TOO_LARGE);
    CODE(BAD_FRAME);
    CODE(BAD_TYPE);
    CODE(MISSING_FIELD);
    CODE(BAD_VALUE);
    CODE(DEPTH);
    CODE(LIMIT);
    CODE(UNKNOWN_OP);
    CODE(VERSION);
    CODE(UNKNOWN_CATALOG);
    CODE(BAD_FD);
    CODE(TOO_MANY_BUFFERS);
    CODE(TOO_MANY_RULES);
    CODE(TOO_MANY_FDS);
    CODE(RULES);
    CODE(BUSY);
    CODE(TIMEOUT);
    CODE(DEVICE);
    CODE(SHUTDOWN);
    CODE(INTERNAL);
    CODE(PROTOCOL);
    CODE(CLOSED);
    CODE(DENIED);
    CODE(MAX_CODE);
#undef CODE
    return m;
}
