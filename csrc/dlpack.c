/* DLPack consumer: any producer's tensor becomes a struct gemsops_tensor.
 *
 * Fast path: the DLPack C exchange API (`type(t).__dlpack_c_exchange_api__`,
 * DLPack 1.2, torch >= 2.10): one C call fills a DLTensor without creating
 * Python objects, and gives the producer's current stream. The capsule is
 * looked up once per type and cached.
 * Fallback: `obj.__dlpack__(max_version=(1, 0))` (or plain `__dlpack__()`
 * for older producers), either capsule name, byte_offset honoured, NULL
 * strides read as contiguous. Tensors that require grad are exported through
 * `detach()`, which shares storage. */
#include "boundary.h" /* Python.h first: it sets feature macros */
#include "dlpack_abi.h"

#include <string.h>

#define GEMSOPS_TYPE_CACHE_SIZE 8

struct type_facts {
    PyTypeObject *type; /* strong reference */
    const gemsops_dl_exchange_api *api; /* NULL: type has none */
    int has_is_neg; /* torch: negation may be a lazy bit, see lazy_negation */
};
static struct type_facts type_cache[GEMSOPS_TYPE_CACHE_SIZE];
static int type_cache_next;

static const struct type_facts *
facts_of(PyTypeObject *type)
{
    for (int i = 0; i < GEMSOPS_TYPE_CACHE_SIZE; i++) {
        if (type_cache[i].type == type) {
            return &type_cache[i];
        }
    }
    const gemsops_dl_exchange_api *api = NULL;
    PyObject *cap =
        PyObject_GetAttrString((PyObject *)type, "__dlpack_c_exchange_api__");
    if (cap == NULL) {
        PyErr_Clear();
    }
    else {
        if (PyCapsule_IsValid(cap, "dlpack_exchange_api")) {
            const gemsops_dl_exchange_api *a =
                PyCapsule_GetPointer(cap, "dlpack_exchange_api");
            /* the table must outlive the process (spec); we keep the type */
            if (a != NULL && a->header.version.major == 1 &&
                a->dltensor_from_py_object_no_sync != NULL) {
                api = a;
            }
        }
        Py_DECREF(cap);
        PyErr_Clear();
    }
    int has_is_neg = PyObject_HasAttrString((PyObject *)type, "is_neg");
    int slot = type_cache_next++ % GEMSOPS_TYPE_CACHE_SIZE;
    Py_XDECREF(type_cache[slot].type);
    Py_INCREF(type);
    type_cache[slot].type = type;
    type_cache[slot].api = api;
    type_cache[slot].has_is_neg = has_is_neg;
    return &type_cache[slot];
}

static PyObject *
is_neg_name(void)
{
    static PyObject *name; /* interned once, kept for the process */
    if (name == NULL) {
        name = PyUnicode_InternFromString("is_neg");
    }
    return name;
}

/* torch keeps a negation (torch._neg_view, the imaginary part of a
 * conjugate) as a bit on the tensor; DLPack has no such bit and exports
 * the memory, which holds the un-negated values. Real dtypes never carry
 * the conjugate bit, and gemsops takes real dtypes only. */
static int
refuse_lazy_negation(PyObject *obj, const char *fn, const char *arg)
{
    PyObject *r = PyObject_CallMethodObjArgs(obj, is_neg_name(), NULL);
    if (r == NULL) {
        return -1;
    }
    const int neg = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (neg > 0) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): argument '%s' has the negative bit set (a lazy "
                     "negation, e.g. from torch._neg_view or z.conj().imag); "
                     "call .resolve_neg() first",
                     fn, arg);
    }
    return neg != 0 ? -1 : 0;
}

static PyObject *
detach_name(void)
{
    static PyObject *name; /* interned once, kept for the process */
    if (name == NULL) {
        name = PyUnicode_InternFromString("detach");
    }
    return name;
}

static gemsops_dtype
dtype_from_dl(gemsops_dl_dtype d)
{
    if (d.lanes != 1) {
        return GEMSOPS_DTYPE_UNSUPPORTED;
    }
    switch (d.code) {
    case GEMSOPS_DL_FLOAT:
        return d.bits == 32   ? GEMSOPS_FLOAT32
               : d.bits == 64 ? GEMSOPS_FLOAT64
               : d.bits == 16 ? GEMSOPS_FLOAT16
                              : GEMSOPS_DTYPE_UNSUPPORTED;
    case GEMSOPS_DL_BFLOAT:
        return d.bits == 16 ? GEMSOPS_BFLOAT16 : GEMSOPS_DTYPE_UNSUPPORTED;
    case GEMSOPS_DL_BOOL:
        return d.bits == 8 ? GEMSOPS_BOOL : GEMSOPS_DTYPE_UNSUPPORTED;
    case GEMSOPS_DL_UINT:
        return d.bits == 8    ? GEMSOPS_UINT8
               : d.bits == 16 ? GEMSOPS_UINT16
               : d.bits == 32 ? GEMSOPS_UINT32
               : d.bits == 64 ? GEMSOPS_UINT64
                              : GEMSOPS_DTYPE_UNSUPPORTED;
    case GEMSOPS_DL_COMPLEX:
        return d.bits == 32    ? GEMSOPS_COMPLEX32
               : d.bits == 64  ? GEMSOPS_COMPLEX64
               : d.bits == 128 ? GEMSOPS_COMPLEX128
                               : GEMSOPS_DTYPE_UNSUPPORTED;
    case GEMSOPS_DL_INT:
        return d.bits == 8    ? GEMSOPS_INT8
               : d.bits == 16 ? GEMSOPS_INT16
               : d.bits == 32 ? GEMSOPS_INT32
               : d.bits == 64 ? GEMSOPS_INT64
                              : GEMSOPS_DTYPE_UNSUPPORTED;
    default: return GEMSOPS_DTYPE_UNSUPPORTED;
    }
}

static int
fill_view(const gemsops_dl_tensor *dl, const char *fn, const char *arg,
          struct gemsops_tensor *t)
{
    if (dl->ndim < 0 || dl->ndim > GEMSOPS_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError,
                     "%s(): argument '%s' has %d dimensions; at most %d are "
                     "supported",
                     fn, arg, (int)dl->ndim, GEMSOPS_MAX_DIMS);
        return -1;
    }
    /* Every row view and extent below assumes strides >= 0 (torch never
     * makes others; NumPy's reversed views do). */
    for (int i = 0; dl->strides && i < dl->ndim; i++) {
        if (dl->strides[i] < 0 && dl->shape[i] > 1) {
            PyErr_Format(PyExc_ValueError,
                         "%s(): argument '%s' has a negative stride (%lld in "
                         "dim %d); gemsops takes strides >= 0: pass a copy",
                         fn, arg, (long long)dl->strides[i], i);
            return -1;
        }
    }
    /* Every count and extent below (numel, row views, overlap tests) is an
     * int64 product: a shape whose element count or byte extent does not
     * fit would wrap (to 0: "empty", hence contiguous) and let a launch
     * past its checks. No producer of real memory makes one. */
    int64_t count = 1, extent = 0, extent_bytes;
    int wraps = 0, extent_wraps = 0;
    for (int i = 0; i < dl->ndim; i++) {
        const int64_t size = dl->shape[i];
        int64_t span;
        if (size < 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s(): argument '%s' has a negative size (%lld in "
                         "dim %d)",
                         fn, arg, (long long)size, i);
            return -1;
        }
        wraps |= __builtin_mul_overflow(count, size, &count);
        if (dl->strides && size > 1) { /* strides >= 0 here (above) */
            extent_wraps |=
                __builtin_mul_overflow(size - 1, dl->strides[i], &span) ||
                __builtin_add_overflow(extent, span, &extent);
        }
    }
    if (!dl->strides && count > 0) {
        extent = count - 1;
    }
    const int64_t item = (dl->dtype.bits * (int64_t)dl->dtype.lanes + 7) / 8;
    extent_wraps |=
        __builtin_mul_overflow(extent + 1, item > 0 ? item : 1, &extent_bytes);
    if (wraps || (count > 0 && extent_wraps)) {
        PyErr_Format(PyExc_ValueError,
                     "%s(): argument '%s' spans more elements or bytes than "
                     "a 64-bit count holds",
                     fn, arg);
        return -1;
    }
    t->data = (char *)dl->data + dl->byte_offset;
    t->dtype = dtype_from_dl(dl->dtype);
    t->device_type = dl->device.device_type;
    t->device_id = dl->device.device_id;
    t->ndim = dl->ndim;
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->sizes[i] = dl->shape[i];
        t->strides[i] = dl->strides ? dl->strides[i] : expected;
        expected *= dl->shape[i];
    }
    if (t->device_type == GEMSOPS_DL_CUDA_HOST) {
        t->device_type = GEMSOPS_CPU; /* pinned host memory is host memory */
    }
    return 0;
}

/* Calls obj.__dlpack__ asking for a versioned capsule, then the old way. */
static PyObject *
call_dunder_dlpack(PyObject *obj)
{
    PyObject *meth = PyObject_GetAttrString(obj, "__dlpack__");
    if (meth == NULL) {
        return NULL;
    }
    PyObject *args = PyTuple_New(0);
    PyObject *kwargs = Py_BuildValue("{s:(ii)}", "max_version", 1, 0);
    PyObject *cap = NULL;
    if (args && kwargs) {
        cap = PyObject_Call(meth, args, kwargs);
        if (cap == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear(); /* producer predates max_version */
            cap = PyObject_CallNoArgs(meth);
        }
    }
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_DECREF(meth);
    return cap;
}

static int
from_capsule_protocol(PyObject *obj, const char *fn, const char *arg,
                      struct gemsops_tensor *t, int *read_only)
{
    PyObject *cap = call_dunder_dlpack(obj);
    if (cap == NULL && PyErr_ExceptionMatches(PyExc_BufferError)) {
        /* torch refuses tensors that require grad; a detached alias
         * shares the storage and is fine for reading and writing. The
         * attribute probe clears errors: the producer's is kept across it
         * for a producer without detach. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (!PyObject_HasAttrString(obj, "detach")) {
            PyErr_Restore(type, value, tb);
            return -1;
        }
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        PyObject *det = PyObject_CallMethod(obj, "detach", NULL);
        if (det == NULL) {
            return -1;
        }
        cap = call_dunder_dlpack(det);
        Py_DECREF(det);
    }
    if (cap == NULL) {
        return -1;
    }
    int rc = -1;
    /* The capsule stays unconsumed: dropping it runs the producer's
     * deleter. We only borrow the view while `obj` keeps the data alive. */
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        gemsops_dl_managed_versioned *m =
            PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m->version.major != 1) {
            PyErr_Format(PyExc_TypeError,
                         "%s(): argument '%s' uses DLPack %u.%u; only 1.x is "
                         "understood",
                         fn, arg, m->version.major, m->version.minor);
        }
        else {
            rc = fill_view(&m->dl_tensor, fn, arg, t);
            *read_only = (m->flags & GEMSOPS_DL_FLAG_READ_ONLY) != 0;
        }
    }
    else if (PyCapsule_IsValid(cap, "dltensor")) {
        gemsops_dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
        rc = fill_view(&m->dl_tensor, fn, arg, t);
    }
    else {
        PyErr_Format(PyExc_TypeError,
                     "%s(): argument '%s': __dlpack__ returned %R, not a "
                     "DLPack capsule",
                     fn, arg, cap);
    }
    Py_DECREF(cap);
    return rc;
}

/* The fast path: 0 on success; -1 with no exception set when the caller
 * should try the capsule protocol; -1 with an exception on a hard error. */
static int
from_exchange_api(const gemsops_dl_exchange_api *api, PyObject *obj,
                  const char *fn, const char *arg, struct gemsops_tensor *t)
{
    gemsops_dl_tensor dl;
    if (api->dltensor_from_py_object_no_sync(obj, &dl) == 0) {
        return fill_view(&dl, fn, arg, t);
    }
    if (!PyErr_ExceptionMatches(PyExc_BufferError)) {
        PyErr_Clear();
        return -1;
    }
    /* torch refuses tensors that require grad: a detached alias shares the
     * storage. Its shape/strides die with it, so copy them first; `obj`
     * keeps the storage alive afterwards. */
    PyErr_Clear();
    PyObject *det = PyObject_CallMethodObjArgs(obj, detach_name(), NULL);
    int rc = -1;
    if (det != NULL && Py_TYPE(det) == Py_TYPE(obj) &&
        api->dltensor_from_py_object_no_sync(det, &dl) == 0) {
        rc = fill_view(&dl, fn, arg, t);
    }
    Py_XDECREF(det);
    if (rc != 0 && !PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
    }
    return rc;
}

/* The exception for a tensor its producer would not export: torch's own
 * for such an operand. A layout other than strided (sparse, jagged) is an
 * op with no kernel for it (NotImplementedError, as torch's dispatcher
 * says); a strided tensor on a device DLPack cannot name (meta) is a
 * device mismatch (RuntimeError). A producer whose layout cannot be read
 * (not torch's) refused for its own reasons: TypeError. Only reached on
 * the error path. */
static PyObject *
unexportable_error(PyObject *obj)
{
    PyObject *layout = PyObject_GetAttrString(obj, "layout");
    if (layout == NULL) {
        PyErr_Clear();
        return PyExc_TypeError;
    }
    PyObject *name = PyObject_Str(layout);
    Py_DECREF(layout);
    if (name == NULL) {
        PyErr_Clear();
        return PyExc_TypeError;
    }
    const int strided =
        PyUnicode_CompareWithASCIIString(name, "torch.strided") == 0;
    Py_DECREF(name);
    return strided ? PyExc_RuntimeError : PyExc_NotImplementedError;
}

/* The view of obj, and whether the producer marked it read-only (only
 * versioned capsules can say so; torch tensors are always writable). */
static int
import_tensor(PyObject *obj, const char *fn, const char *arg,
              struct gemsops_tensor *t, void **stream, int *read_only)
{
    const struct type_facts *facts = facts_of(Py_TYPE(obj));
    *read_only = 0;
    if (facts->has_is_neg && refuse_lazy_negation(obj, fn, arg)) {
        return -1;
    }
    if (facts->api != NULL) {
        const gemsops_dl_exchange_api *api = facts->api;
        if (from_exchange_api(api, obj, fn, arg, t) == 0) {
            if (stream != NULL && t->device_type == GEMSOPS_CUDA &&
                api->current_work_stream != NULL &&
                api->current_work_stream(GEMSOPS_DL_CUDA, t->device_id,
                                         stream) != 0) {
                return -1;
            }
            return 0;
        }
        if (PyErr_Occurred()) {
            return -1; /* e.g. too many dimensions */
        }
    }
    if (!PyObject_HasAttrString(obj, "__dlpack__")) {
        PyObject *tn = gemsops_type_name(obj);
        if (tn != NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s(): argument '%s' must be a tensor (an object "
                         "with __dlpack__), not %U",
                         fn, arg, tn);
            Py_DECREF(tn);
        }
        return -1;
    }
    if (from_capsule_protocol(obj, fn, arg, t, read_only) != 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_Format(unexportable_error(obj),
                         "%s(): argument '%s' cannot be exported through "
                         "DLPack: %S",
                         fn, arg, value ? value : Py_None);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
        return -1;
    }
    if (stream != NULL) {
        *stream = NULL; /* legacy default stream: the producer named none */
    }
    return 0;
}

int
gemsops_tensor_from_object(PyObject *obj, const char *fn, const char *arg,
                           struct gemsops_tensor *t, void **stream)
{
    int read_only;
    return import_tensor(obj, fn, arg, t, stream, &read_only);
}

int
gemsops_output_from_object(PyObject *obj, const char *fn, const char *arg,
                           struct gemsops_tensor *t)
{
    int read_only;
    if (import_tensor(obj, fn, arg, t, NULL, &read_only)) {
        return -1;
    }
    if (read_only) {
        PyErr_Format(PyExc_ValueError,
                     "%s(): argument '%s' is read-only (its producer marked "
                     "the memory so); outputs must be writable",
                     fn, arg);
        return -1;
    }
    return 0;
}

int
gemsops_optional_tensor(PyObject *obj, const char *fn, const char *arg,
                        struct gemsops_tensor *t, int *present)
{
    *present = obj != Py_None;
    if (!*present) {
        memset(t, 0, sizeof *t);
        return 0;
    }
    return gemsops_tensor_from_object(obj, fn, arg, t, NULL);
}

int
gemsops_optional_output(PyObject *obj, const char *fn, const char *arg,
                        struct gemsops_tensor *t, int *present)
{
    *present = obj != Py_None;
    if (!*present) {
        memset(t, 0, sizeof *t);
        return 0;
    }
    return gemsops_output_from_object(obj, fn, arg, t);
}

void
gemsops_tensor_extent(const struct gemsops_tensor *t, char **lo, char **hi)
{
    size_t es = gemsops_dtype_size(t->dtype);
    int64_t low = 0, high = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->sizes[i] == 0) {
            *lo = *hi = t->data;
            return;
        }
        int64_t span = (t->sizes[i] - 1) * t->strides[i];
        if (span < 0) {
            low += span;
        }
        else {
            high += span;
        }
    }
    *lo = (char *)t->data + low * (int64_t)es;
    *hi = (char *)t->data + (high + 1) * (int64_t)es;
}

int
gemsops_tensors_overlap(const struct gemsops_tensor *a,
                        const struct gemsops_tensor *b)
{
    if (a->device_type != b->device_type || a->device_id != b->device_id) {
        return 0;
    }
    char *alo, *ahi, *blo, *bhi;
    gemsops_tensor_extent(a, &alo, &ahi);
    gemsops_tensor_extent(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}
