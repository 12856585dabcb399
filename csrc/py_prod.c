/* Python boundary of prod: parse, validate, dispatch. The Python layer
 * (gemsops/ops/prod.py) applies dtype=, picks the output dtype and shape,
 * and allocates; everything it passes is checked again here. */
#include "boundary.h" /* Python.h first: it sets feature macros */
#include "checks.h"
#include "gemsops/prod.h"

#include <string.h>

static int
parse_dim(PyObject *obj, const struct gemsops_tensor *x, const char *fn,
          int *dim)
{
    if (obj == Py_None) {
        *dim = -1;
        return 0;
    }
    long d = PyLong_AsLong(obj);
    if (d == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Format(PyExc_IndexError,
                         "%s(): dim=%R is out of range "
                         "for a tensor of %d dimensions",
                         fn, obj, x->ndim);
        }
        return -1;
    }
    if (d < 0 || d >= x->ndim) {
        PyErr_Format(PyExc_IndexError,
                     "%s(): dim=%ld is out of range for a tensor of %d "
                     "dimensions (the Python layer normalises negative dims)",
                     fn, d, x->ndim);
        return -1;
    }
    *dim = (int)d;
    return 0;
}

static int
is_float(gemsops_dtype d)
{
    return d == GEMSOPS_FLOAT32 || d == GEMSOPS_FLOAT64 ||
           d == GEMSOPS_FLOAT16 || d == GEMSOPS_BFLOAT16;
}

static int
check_input(const struct gemsops_tensor *x, const char *fn)
{
    if (x->dtype >= GEMSOPS_DTYPE_UNSUPPORTED) {
        PyErr_Format(PyExc_NotImplementedError,
                     "%s(): argument 'input' has a dtype gemsops does not "
                     "support (%s; complex and 8-bit floats are not)",
                     fn, gemsops_dtype_name(x->dtype));
        return -1;
    }
    return gemsops_check_backend(x, fn, "input") ||
           gemsops_check_aligned(x, fn, "input");
}

/* Only floating point inputs have gradients (torch: RuntimeError). */
static int
check_has_grad(const struct gemsops_tensor *x, const char *fn)
{
    if (is_float(x->dtype)) {
        return 0;
    }
    PyErr_Format(PyExc_RuntimeError,
                 "%s(): only floating point inputs "
                 "have gradients, got %s",
                 fn, gemsops_dtype_name(x->dtype));
    return -1;
}

/* numel of the output: the kept dims' product (1 for the full product) */
static int64_t
kept_numel(const struct gemsops_tensor *x, int dim)
{
    int64_t n = 1;
    for (int d = 0; dim >= 0 && d < x->ndim; d++) {
        n *= d == dim ? 1 : x->sizes[d];
    }
    return n;
}

static int
check_kept(const struct gemsops_tensor *t, const struct gemsops_tensor *x,
           int dim, gemsops_dtype want, const char *fn, const char *arg)
{
    if (gemsops_check_dtype(t, want, fn, arg)) {
        return -1;
    }
    if (gemsops_tensor_numel(t) != kept_numel(x, dim)) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): argument '%s' has %lld "
                     "elements; expected %lld",
                     fn, arg, (long long)gemsops_tensor_numel(t),
                     (long long)kept_numel(x, dim));
        return -1;
    }
    return gemsops_check_dense_beside(t, x, fn, arg);
}

/* grad_in: input's dtype, contiguous, same device (shape checked apart) */
static int
check_like_input(const struct gemsops_tensor *t,
                 const struct gemsops_tensor *x, const char *fn,
                 const char *arg)
{
    return gemsops_check_dtype(t, x->dtype, fn, arg) ||
           gemsops_check_dense_beside(t, x, fn, arg);
}

/* The optional workspace: None, or a uint8 tensor on the input's device. */
static int
parse_workspace(PyObject *obj, const struct gemsops_tensor *x, const char *fn,
                struct gemsops_tensor *ws, void **data, int64_t *bytes)
{
    int has = 0;
    if (gemsops_optional_output(obj, fn, "workspace", ws, &has) ||
        (has && gemsops_check_workspace(ws, x, fn))) {
        return -1;
    }
    *data = has ? ws->data : NULL;
    *bytes = has ? gemsops_tensor_numel(ws) : 0;
    return 0;
}

PyDoc_STRVAR(
    prod_doc,
    "prod(input, dim, out, workspace) -> None\n\n"
    "Product of `input` over all elements (dim=None) or along `dim` (in\n"
    "[0, ndim)) into the contiguous `out` (the kept dims; int64 for bool and\n"
    "integer input, else input's dtype). Any strides. `workspace`: None or a\n"
    "uint8 tensor of at least prod_workspace() bytes (CUDA).");

static PyObject *
prod(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    const char *fn = "prod";
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "prod() takes 4 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    struct gemsops_prod_params p;
    struct gemsops_tensor out, ws;
    memset(&p, 0, sizeof p);
    if (gemsops_tensor_from_object(args[0], fn, "input", &p.x, &p.stream) ||
        check_input(&p.x, fn) || parse_dim(args[1], &p.x, fn, &p.dim) ||
        gemsops_output_from_object(args[2], fn, "out", &out) ||
        parse_workspace(args[3], &p.x, fn, &ws, &p.workspace,
                        &p.workspace_bytes)) {
        return NULL;
    }
    p.out_dtype = is_float(p.x.dtype) ? p.x.dtype : GEMSOPS_INT64;
    const struct gemsops_tensor *w[] = {&out, &ws};
    const struct gemsops_tensor *r[] = {&p.x};
    const char *wn[] = {"out", "workspace"}, *rn[] = {"input"};
    if (check_kept(&out, &p.x, p.dim, p.out_dtype, fn, "out") ||
        gemsops_check_no_overlap(w, wn, p.workspace ? 2 : 1, r, rn, 1, fn)) {
        return NULL;
    }
    p.out = out.data;
    const int cuda = p.x.device_type == GEMSOPS_CUDA;
    gemsops_status st = {GEMSOPS_OK, ""};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cuda ? gemsops_prod_cuda(&p, &st) : gemsops_prod_cpu(&p, &st);
    Py_END_ALLOW_THREADS
    if (rc != GEMSOPS_OK) {
        return gemsops_raise(&st);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(
    prod_bwd_doc,
    "prod_bwd(input, dim, grad_out, grad_in, workspace) -> None\n\n"
    "grad_in = grad_out * (product of the other elements of each line), by\n"
    "exclusive prefix and suffix products: exact with zeros, no division.\n"
    "input: float dtype (contiguous on CUDA); grad_out: contiguous kept "
    "dims;\n"
    "grad_in: contiguous, input's shape and dtype; workspace: None or uint8 "
    "of\n"
    "at least prod_bwd_workspace() bytes (CUDA).");

static PyObject *
prod_bwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    const char *fn = "prod_backward";
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError,
                     "prod_bwd() takes 5 arguments (%zd "
                     "given)",
                     nargs);
        return NULL;
    }
    struct gemsops_prod_bwd_params p;
    struct gemsops_tensor g, gi, ws;
    memset(&p, 0, sizeof p);
    if (gemsops_tensor_from_object(args[0], fn, "input", &p.x, &p.stream) ||
        check_input(&p.x, fn) || check_has_grad(&p.x, fn) ||
        parse_dim(args[1], &p.x, fn, &p.dim) ||
        gemsops_tensor_from_object(args[2], fn, "grad_out", &g, NULL) ||
        gemsops_output_from_object(args[3], fn, "grad_in", &gi) ||
        parse_workspace(args[4], &p.x, fn, &ws, &p.workspace,
                        &p.workspace_bytes)) {
        return NULL;
    }
    const struct gemsops_tensor *w[] = {&gi, &ws};
    const struct gemsops_tensor *r[] = {&p.x, &g};
    const char *wn[] = {"grad_in", "workspace"}, *rn[] = {"input", "grad_out"};
    const int cuda = p.x.device_type == GEMSOPS_CUDA;
    if (check_kept(&g, &p.x, p.dim, p.x.dtype, fn, "grad_out") ||
        gemsops_check_same_shape(&gi, &p.x, fn, "grad_in", "input") ||
        check_like_input(&gi, &p.x, fn, "grad_in") ||
        (cuda && gemsops_check_contiguous(&p.x, fn, "input")) ||
        gemsops_check_no_overlap(w, wn, p.workspace ? 2 : 1, r, rn, 2, fn)) {
        return NULL;
    }
    p.grad_out = g.data;
    p.grad_in = gi.data;
    gemsops_status st = {GEMSOPS_OK, ""};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cuda ? gemsops_prod_bwd_cuda(&p, &st) : gemsops_prod_bwd_cpu(&p, &st);
    Py_END_ALLOW_THREADS
    if (rc != GEMSOPS_OK) {
        return gemsops_raise(&st);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(
    prod_workspace_doc,
    "prod_workspace(input, dim) -> int\n\n"
    "Bytes of workspace prod(input, dim, ...) needs (0: pass None; always 0\n"
    "on the CPU).");

PyDoc_STRVAR(prod_bwd_workspace_doc,
             "prod_bwd_workspace(input, dim) -> int\n\n"
             "Bytes of workspace prod_bwd(input, dim, ...) needs (0: pass "
             "None; always\n"
             "0 on the CPU).");

/* Both queries: parse (input, dim), ask the CUDA planner. */
static PyObject *
workspace_query(PyObject *const *args, Py_ssize_t nargs, int backward)
{
    const char *fn = backward ? "prod_bwd_workspace" : "prod_workspace";
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes 2 arguments (%zd given)", fn,
                     nargs);
        return NULL;
    }
    struct gemsops_tensor x;
    int dim;
    if (gemsops_tensor_from_object(args[0], fn, "input", &x, NULL) ||
        check_input(&x, fn) || parse_dim(args[1], &x, fn, &dim) ||
        (backward && check_has_grad(&x, fn))) {
        return NULL;
    }
    if (x.device_type != GEMSOPS_CUDA) {
        return PyLong_FromLong(0);
    }
    gemsops_status st = {GEMSOPS_OK, ""};
    int64_t bytes = 0;
    int rc;
    if (backward) {
        struct gemsops_prod_bwd_params p;
        memset(&p, 0, sizeof p);
        p.x = x;
        p.dim = dim;
        rc = gemsops_prod_bwd_workspace_cuda(&p, &bytes, &st);
    }
    else {
        struct gemsops_prod_params p;
        memset(&p, 0, sizeof p);
        p.x = x;
        p.dim = dim;
        rc = gemsops_prod_workspace_cuda(&p, &bytes, &st);
    }
    if (rc != GEMSOPS_OK) {
        return gemsops_raise(&st);
    }
    return PyLong_FromLongLong(bytes);
}

static PyObject *
prod_workspace(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return workspace_query(args, nargs, 0);
}

static PyObject *
prod_bwd_workspace(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return workspace_query(args, nargs, 1);
}

PyMethodDef gemsops_prod_methods[] = {
    {"prod", (PyCFunction)(void (*)(void))prod, METH_FASTCALL, prod_doc},
    {"prod_bwd", (PyCFunction)(void (*)(void))prod_bwd, METH_FASTCALL,
     prod_bwd_doc},
    {"prod_workspace", (PyCFunction)(void (*)(void))prod_workspace,
     METH_FASTCALL, prod_workspace_doc},
    {"prod_bwd_workspace", (PyCFunction)(void (*)(void))prod_bwd_workspace,
     METH_FASTCALL, prod_bwd_workspace_doc},
    {NULL, NULL, 0, NULL},
};
