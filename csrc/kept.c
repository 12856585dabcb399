/* Buffers a caller keeps across launches whose contents a launch relies
 * on: the LayerNorm backward's dW/dB accumulators (all zero between
 * launches) and the Stream-K flags (no slot holds an epoch not yet used).
 *
 * C cannot read device memory to check such a precondition, so it vouches
 * only for a buffer it prepared itself: one recorded here after a launch
 * that left it in the known state, passed again as the same object (the
 * record holds a strong reference, so its memory cannot be freed and
 * handed to another tensor meanwhile), with the same data pointer and
 * size, on the same stream, and not written through torch since (torch's
 * version counter, shared by every view of the storage). Any other buffer
 * is prepared again by the launch (a memset on the stream). Objects with
 * no version counter are never vouched for. The GIL guards the table. */
#include "boundary.h" /* Python.h first: it sets feature macros */

#define GEMSOPS_KEPT_SLOTS 16

struct kept_record {
    PyObject *obj; /* strong reference; NULL: free slot */
    void *data;
    int64_t bytes;
    int device_type, device_id;
    void *stream;
    long long version;
    unsigned long long tag;
    unsigned long long last_use;
};

static struct kept_record records[GEMSOPS_KEPT_SLOTS];
static unsigned long long use_clock;

static PyObject *
version_name(void)
{
    static PyObject *name; /* interned once, kept for the process */
    if (name == NULL) {
        name = PyUnicode_InternFromString("_version");
    }
    return name;
}

/* torch's version counter of obj; 0 with *has = 0 when it has none. */
static int
version_of(PyObject *obj, long long *v, int *has)
{
    *v = 0;
    *has = 0;
    PyObject *o = PyObject_GetAttr(obj, version_name());
    if (o == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    *v = PyLong_AsLongLong(o);
    Py_DECREF(o);
    if (*v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *has = 1;
    return 0;
}

static int64_t
bytes_of(const struct gemsops_tensor *t)
{
    return gemsops_tensor_numel(t) * (int64_t)gemsops_dtype_size(t->dtype);
}

static struct kept_record *
find(const struct gemsops_tensor *t, void *stream)
{
    for (int i = 0; i < GEMSOPS_KEPT_SLOTS; i++) {
        struct kept_record *r = &records[i];
        if (r->obj != NULL && r->data == t->data &&
            r->device_type == t->device_type && r->device_id == t->device_id &&
            r->stream == stream) {
            return r;
        }
    }
    return NULL;
}

int
gemsops_kept_lookup(PyObject *obj, const struct gemsops_tensor *t,
                    void *stream, unsigned long long *tag)
{
    struct kept_record *r = find(t, stream);
    if (r == NULL || r->obj != obj || r->bytes != bytes_of(t)) {
        return 0;
    }
    long long v;
    int has;
    if (version_of(obj, &v, &has)) {
        return -1;
    }
    if (!has || v != r->version) {
        return 0;
    }
    r->last_use = ++use_clock;
    *tag = r->tag;
    return 1;
}

int
gemsops_kept_store(PyObject *obj, const struct gemsops_tensor *t, void *stream,
                   unsigned long long tag)
{
    long long v;
    int has;
    if (version_of(obj, &v, &has)) {
        return -1;
    }
    struct kept_record *r = find(t, stream);
    if (r == NULL) {
        r = &records[0];
        for (int i = 1; i < GEMSOPS_KEPT_SLOTS; i++) {
            if (records[i].obj == NULL ||
                (r->obj != NULL && records[i].last_use < r->last_use)) {
                r = &records[i];
            }
        }
    }
    PyObject *old = r->obj;
    r->obj = NULL;
    if (has) {
        Py_INCREF(obj);
        r->obj = obj;
        r->data = t->data;
        r->bytes = bytes_of(t);
        r->device_type = t->device_type;
        r->device_id = t->device_id;
        r->stream = stream;
        r->version = v;
        r->tag = tag;
        r->last_use = ++use_clock;
    }
    Py_XDECREF(old); /* last: a finalizer may run */
    return 0;
}

void
gemsops_kept_forget(const struct gemsops_tensor *t, void *stream)
{
    struct kept_record *r = find(t, stream);
    if (r != NULL) {
        PyObject *old = r->obj;
        r->obj = NULL;
        Py_DECREF(old);
    }
}

void
gemsops_kept_overwritten(const struct gemsops_tensor *t)
{
    const char *lo = (const char *)t->data;
    const char *hi = lo + bytes_of(t);
    for (int i = 0; i < GEMSOPS_KEPT_SLOTS; i++) {
        struct kept_record *r = &records[i];
        const char *rlo = (const char *)r->data;
        if (r->obj != NULL && r->device_type == t->device_type &&
            r->device_id == t->device_id && rlo < hi && lo < rlo + r->bytes) {
            PyObject *old = r->obj;
            r->obj = NULL;
            Py_DECREF(old);
        }
    }
}
