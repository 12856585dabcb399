#include "checks.h" /* Python.h first: it sets feature macros */

#include <stdio.h>

void
gemsops_format_shape(const int64_t *sizes, int ndim, char *buf, size_t len)
{
    size_t at = 0;
    at += snprintf(buf + at, len - at, "[");
    for (int i = 0; i < ndim && at < len; i++) {
        at += snprintf(buf + at, len - at, i ? ", %lld" : "%lld",
                       (long long)sizes[i]);
    }
    if (at < len) {
        snprintf(buf + at, len - at, "]");
    }
}

static const char *
device_name(const struct gemsops_tensor *t, char *buf, size_t len)
{
    if (t->device_type == GEMSOPS_CPU) {
        return "cpu";
    }
    if (t->device_type == GEMSOPS_CUDA) {
        snprintf(buf, len, "cuda:%d", t->device_id);
        return buf;
    }
    snprintf(buf, len, "DLPack device type %d", t->device_type);
    return buf;
}

int
gemsops_check_backend(const struct gemsops_tensor *t, const char *fn,
                      const char *arg)
{
    char name[48];
    if (t->device_type == GEMSOPS_CPU) {
        return 0;
    }
    if (t->device_type != GEMSOPS_CUDA) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): argument '%s' lives on %s; gemsops runs on cpu "
                     "and cuda",
                     fn, arg, device_name(t, name, sizeof name));
        return -1;
    }
    if (!gemsops_built_with_cuda()) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): argument '%s' is on %s but this gemsops was built "
                     "without CUDA (no nvcc at build time)",
                     fn, arg, device_name(t, name, sizeof name));
        return -1;
    }
    return 0;
}

int
gemsops_check_device(const struct gemsops_tensor *t,
                     const struct gemsops_tensor *ref, const char *fn,
                     const char *arg, const char *ref_arg)
{
    if (t->device_type == ref->device_type &&
        (t->device_type == GEMSOPS_CPU || t->device_id == ref->device_id)) {
        return 0;
    }
    char a[48], b[48];
    PyErr_Format(PyExc_RuntimeError,
                 "%s(): Expected all tensors to be on the same device, but "
                 "'%s' is on %s and '%s' is on %s",
                 fn, arg, device_name(t, a, sizeof a), ref_arg,
                 device_name(ref, b, sizeof b));
    return -1;
}

int
gemsops_check_contiguous(const struct gemsops_tensor *t, const char *fn,
                         const char *arg)
{
    if (gemsops_tensor_is_contiguous(t)) {
        return 0;
    }
    char s[256];
    gemsops_format_shape(t->strides, t->ndim, s, sizeof s);
    PyErr_Format(PyExc_RuntimeError,
                 "%s(): argument '%s' must be contiguous, got strides %s", fn,
                 arg, s);
    return -1;
}

int
gemsops_check_dtype(const struct gemsops_tensor *t, gemsops_dtype want,
                    const char *fn, const char *arg)
{
    if (t->dtype == want) {
        return 0;
    }
    PyErr_Format(PyExc_RuntimeError,
                 "%s(): argument '%s' has dtype %s; expected %s", fn, arg,
                 gemsops_dtype_name(t->dtype), gemsops_dtype_name(want));
    return -1;
}

int
gemsops_check_dense_beside(const struct gemsops_tensor *t,
                           const struct gemsops_tensor *ref, const char *fn,
                           const char *arg)
{
    return gemsops_check_device(t, ref, fn, arg, "input") ||
           gemsops_check_contiguous(t, fn, arg) ||
           gemsops_check_aligned(t, fn, arg);
}

int
gemsops_check_aligned(const struct gemsops_tensor *t, const char *fn,
                      const char *arg)
{
    size_t es = gemsops_dtype_size(t->dtype);
    if (es == 0 || (uintptr_t)t->data % es == 0) {
        return 0;
    }
    PyErr_Format(PyExc_ValueError,
                 "%s(): argument '%s' is misaligned: address %p is not a "
                 "multiple of its element size %zu",
                 fn, arg, t->data, es);
    return -1;
}

int
gemsops_check_same_shape(const struct gemsops_tensor *t,
                         const struct gemsops_tensor *ref, const char *fn,
                         const char *arg, const char *ref_arg)
{
    int same = t->ndim == ref->ndim;
    for (int i = 0; same && i < t->ndim; i++) {
        same = t->sizes[i] == ref->sizes[i];
    }
    if (same) {
        return 0;
    }
    char a[256], b[256];
    gemsops_format_shape(t->sizes, t->ndim, a, sizeof a);
    gemsops_format_shape(ref->sizes, ref->ndim, b, sizeof b);
    PyErr_Format(PyExc_RuntimeError,
                 "%s(): argument '%s' has shape %s; expected %s (the shape of "
                 "'%s')",
                 fn, arg, a, b, ref_arg);
    return -1;
}

int
gemsops_check_workspace(const struct gemsops_tensor *ws,
                        const struct gemsops_tensor *ref, const char *fn)
{
    if (ws->dtype != GEMSOPS_UINT8) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): argument 'workspace' must be uint8, got %s", fn,
                     gemsops_dtype_name(ws->dtype));
        return -1;
    }
    if ((uintptr_t)ws->data % 16 != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s(): argument 'workspace' is misaligned: address %p "
                     "is not 16-byte aligned",
                     fn, ws->data);
        return -1;
    }
    return gemsops_check_device(ws, ref, fn, "workspace", "input") ||
           gemsops_check_contiguous(ws, fn, "workspace");
}

int
gemsops_check_no_overlap(const struct gemsops_tensor *const *written,
                         const char *const *wnames, int nw,
                         const struct gemsops_tensor *const *read,
                         const char *const *rnames, int nr, const char *fn)
{
    for (int i = 0; i < nw; i++) {
        if (written[i] == NULL) {
            continue;
        }
        for (int j = i + 1; j < nw; j++) {
            if (written[j] &&
                gemsops_tensors_overlap(written[i], written[j])) {
                PyErr_Format(PyExc_RuntimeError,
                             "%s(): outputs '%s' and '%s' overlap in memory",
                             fn, wnames[i], wnames[j]);
                return -1;
            }
        }
        for (int j = 0; j < nr; j++) {
            if (read[j] && read[j] != written[i] &&
                gemsops_tensors_overlap(written[i], read[j])) {
                PyErr_Format(PyExc_RuntimeError,
                             "%s(): output '%s' overlaps input '%s' in memory",
                             fn, wnames[i], rnames[j]);
                return -1;
            }
        }
    }
    return 0;
}
