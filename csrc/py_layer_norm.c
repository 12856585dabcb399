/* Python boundary of LayerNorm: parse, validate every tensor, build the
 * params struct, dispatch to the CUDA or CPU backend. Nothing is launched
 * on a pointer that was not checked here. RMSNorm and the fused adds enter
 * through py_norm_variants.c, which calls the bodies below (py_norms.h). */
#include "boundary.h" /* Python.h first: it sets feature macros */

#include <string.h>
#include "checks.h"
#include "gemsops/layer_norm.h"
#include "py_norms.h"

/* x viewed as [rows, cols]: the last `nd` dims contiguous, the leading
 * dims collapsible into one row stride. */
static int
row_view(const struct gemsops_tensor *t, int nd, const char *fn,
         const char *arg, int64_t *rows, int64_t *cols, int64_t *stride)
{
    int64_t n = 1, m = 1;
    for (int i = t->ndim - nd; i < t->ndim; i++) {
        n *= t->sizes[i];
    }
    for (int i = 0; i < t->ndim - nd; i++) {
        m *= t->sizes[i];
    }
    *rows = m;
    *cols = n;
    *stride = n;
    if (m * n == 0) {
        return 0;
    }
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= t->ndim - nd; i--) {
        if (t->sizes[i] != 1 && t->strides[i] != expect) {
            PyErr_Format(PyExc_RuntimeError,
                         "%s(): argument '%s' must be contiguous over the "
                         "normalized dimensions (dim %d has stride %lld, "
                         "expected %lld)",
                         fn, arg, i, (long long)t->strides[i],
                         (long long)expect);
            return -1;
        }
        expect *= t->sizes[i];
    }
    /* leading dims: one stride for the outermost non-unit dim, the rest
     * nested inside it */
    int64_t row_stride = -1, inner = 1;
    for (int i = t->ndim - nd - 1; i >= 0; i--) {
        if (t->sizes[i] == 1) {
            continue;
        }
        if (row_stride < 0) {
            row_stride = t->strides[i];
            inner = t->sizes[i] * t->strides[i];
        }
        else if (t->strides[i] != inner) {
            PyErr_Format(PyExc_RuntimeError,
                         "%s(): argument '%s' has leading dimensions that "
                         "cannot be viewed as rows of one stride (dim %d "
                         "stride %lld); pass a contiguous tensor",
                         fn, arg, i, (long long)t->strides[i]);
            return -1;
        }
        else {
            inner *= t->sizes[i];
        }
    }
    if (row_stride >= 0 && row_stride < n && m > 1) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): argument '%s' has rows that overlap (row stride "
                     "%lld < %lld elements per row)",
                     fn, arg, (long long)row_stride, (long long)n);
        return -1;
    }
    *stride = row_stride >= 0 ? row_stride : n;
    return 0;
}

static int
is_half(gemsops_dtype d)
{
    return d == GEMSOPS_FLOAT16 || d == GEMSOPS_BFLOAT16;
}

/* weight / bias: shape = normalized shape, contiguous, dtype = x's or fp32
 * for half x, same device as x. */
static int
check_param(const struct gemsops_tensor *p, const struct gemsops_tensor *x,
            int nd, const char *fn, const char *arg)
{
    int shape_ok = p->ndim == nd;
    for (int i = 0; shape_ok && i < nd; i++) {
        shape_ok = p->sizes[i] == x->sizes[x->ndim - nd + i];
    }
    if (!shape_ok) {
        char got[256], want[256];
        gemsops_format_shape(p->sizes, p->ndim, got, sizeof got);
        gemsops_format_shape(x->sizes + x->ndim - nd, nd, want, sizeof want);
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): Expected %s to be of same shape as "
                     "normalized_shape, but got %s of shape %s and "
                     "normalized_shape = %s",
                     fn, arg, arg, got, want);
        return -1;
    }
    if (p->dtype != x->dtype &&
        !(p->dtype == GEMSOPS_FLOAT32 && is_half(x->dtype))) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): argument '%s' has dtype %s; expected %s%s", fn,
                     arg, gemsops_dtype_name(p->dtype),
                     gemsops_dtype_name(x->dtype),
                     is_half(x->dtype) ? " or float32" : "");
        return -1;
    }
    return gemsops_check_dense_beside(p, x, fn, arg);
}

static int
check_stats(const struct gemsops_tensor *s, const struct gemsops_tensor *x,
            int64_t rows, const char *fn, const char *arg)
{
    if (gemsops_check_dtype(s, gemsops_layer_norm_stats_dtype(x->dtype), fn,
                            arg)) {
        return -1;
    }
    if (gemsops_tensor_numel(s) != rows) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): argument '%s' has %lld "
                     "elements; expected one per row (%lld)",
                     fn, arg, (long long)gemsops_tensor_numel(s),
                     (long long)rows);
        return -1;
    }
    return gemsops_check_dense_beside(s, x, fn, arg);
}

/* A [rows, cols] tensor shaped like x (outputs, dy). */
static int
check_like_x(const struct gemsops_tensor *t, const struct gemsops_tensor *x,
             int nd, const char *fn, const char *arg, int64_t *stride)
{
    if (t->dtype != x->dtype) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): argument '%s' has dtype %s; "
                     "expected %s (the input's)",
                     fn, arg, gemsops_dtype_name(t->dtype),
                     gemsops_dtype_name(x->dtype));
        return -1;
    }
    if (gemsops_check_same_shape(t, x, fn, arg, "input") ||
        gemsops_check_device(t, x, fn, arg, "input") ||
        gemsops_check_aligned(t, fn, arg)) {
        return -1;
    }
    int64_t r, c;
    return row_view(t, nd, fn, arg, &r, &c, stride);
}

static int
parse_nd(PyObject *obj, const struct gemsops_tensor *x, const char *fn,
         int *nd)
{
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Format(PyExc_RuntimeError,
                         "%s(): normalized_ndim=%R must "
                         "be in [1, %d]",
                         fn, obj, x->ndim);
        }
        return -1;
    }
    if (v < 1 || v > x->ndim) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): normalized_ndim=%ld must be in [1, %d] (the "
                     "input's number of dimensions)",
                     fn, v, x->ndim);
        return -1;
    }
    *nd = (int)v;
    return 0;
}

static int
check_input(const struct gemsops_tensor *x, const char *fn, const char *arg)
{
    if (x->dtype != GEMSOPS_FLOAT32 && x->dtype != GEMSOPS_FLOAT64 &&
        !is_half(x->dtype)) {
        PyErr_Format(PyExc_NotImplementedError,
                     "%s(): argument '%s' must be a floating point tensor "
                     "(float16, bfloat16, float32 or float64), got %s",
                     fn, arg, gemsops_dtype_name(x->dtype));
        return -1;
    }
    return gemsops_check_backend(x, fn, arg) ||
           gemsops_check_aligned(x, fn, arg);
}

/* ---- forward ---------------------------------------------------------- */

/* fused: NULL, or {residual, h} of the fused add (h = x + residual). */
static int
parse_fwd(PyObject *const *args, int rms, PyObject *const *fused,
          struct gemsops_layer_norm_fwd_params *p,
          struct gemsops_tensor *x_out)
{
    const char *fn =
        fused ? (rms ? "fused_add_rms_norm" : "fused_add_layer_norm")
              : (rms ? "rms_norm" : "layer_norm");
    struct gemsops_tensor x, w, b, y, mean, rstd, res, h;
    int has_w, has_b, has_mean = 0, has_rstd = 0, nd;
    void *stream = NULL;
    memset(p, 0, sizeof *p);
    if (gemsops_tensor_from_object(args[0], fn, "input", &x, &stream) ||
        check_input(&x, fn, "input") || parse_nd(args[3], &x, fn, &nd) ||
        gemsops_optional_tensor(args[1], fn, "weight", &w, &has_w) ||
        gemsops_optional_tensor(args[2], fn, "bias", &b, &has_b) ||
        (has_w && check_param(&w, &x, nd, fn, "weight")) ||
        (has_b && check_param(&b, &x, nd, fn, "bias")) ||
        row_view(&x, nd, fn, "input", &p->rows, &p->cols, &p->x_row_stride)) {
        return -1;
    }
    if (rms && has_b) {
        PyErr_Format(PyExc_RuntimeError, "%s(): RMSNorm takes no bias", fn);
        return -1;
    }
    if (has_w && has_b && w.dtype != b.dtype) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): weight (%s) and bias (%s) must have one dtype", fn,
                     gemsops_dtype_name(w.dtype), gemsops_dtype_name(b.dtype));
        return -1;
    }
    p->x = x.data;
    p->weight = has_w ? w.data : NULL;
    p->bias = has_b ? b.data : NULL;
    p->dtype = x.dtype;
    p->param_dtype = has_w ? w.dtype : has_b ? b.dtype : x.dtype;
    p->device_id = x.device_id;
    p->stream = stream;
    *x_out = x;
    double eps = PyFloat_AsDouble(args[4]);
    if (eps == -1.0 && PyErr_Occurred()) {
        PyObject *tn;
        if (PyErr_ExceptionMatches(PyExc_TypeError) &&
            (tn = gemsops_type_name(args[4])) != NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s(): argument 'eps' must be float, not %U", fn, tn);
            Py_DECREF(tn);
        }
        return -1;
    }
    /* any value, as torch: a negative or NaN eps gives NaN rows */
    p->eps = eps;
    p->rms = rms;
    if (gemsops_output_from_object(args[5], fn, "out", &y) ||
        check_like_x(&y, &x, nd, fn, "out", &p->y_row_stride) ||
        gemsops_optional_output(args[6], fn, "mean", &mean, &has_mean) ||
        (has_mean && check_stats(&mean, &x, p->rows, fn, "mean")) ||
        gemsops_optional_output(args[7], fn, "rstd", &rstd, &has_rstd) ||
        (has_rstd && check_stats(&rstd, &x, p->rows, fn, "rstd"))) {
        return -1;
    }
    if (!rms && has_mean != has_rstd) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): mean and rstd must both be tensors or both None",
                     fn);
        return -1;
    }
    if (fused &&
        (gemsops_tensor_from_object(fused[0], fn, "residual", &res, NULL) ||
         check_like_x(&res, &x, nd, fn, "residual", &p->residual_row_stride) ||
         gemsops_output_from_object(fused[1], fn, "h", &h) ||
         check_like_x(&h, &x, nd, fn, "h", &p->h_row_stride))) {
        return -1;
    }
    const struct gemsops_tensor *written[] = {&y, has_mean ? &mean : NULL,
                                              has_rstd ? &rstd : NULL,
                                              fused ? &h : NULL};
    const char *wnames[] = {"out", "mean", "rstd", "h"};
    const struct gemsops_tensor *read[] = {&x, has_w ? &w : NULL,
                                           has_b ? &b : NULL,
                                           fused ? &res : NULL};
    const char *rnames[] = {"input", "weight", "bias", "residual"};
    if (gemsops_check_no_overlap(written, wnames, 4, read, rnames, 4, fn)) {
        return -1;
    }
    p->residual = fused ? res.data : NULL;
    p->h = fused ? h.data : NULL;
    p->y = y.data;
    p->mean = has_mean ? mean.data : NULL;
    p->rstd = has_rstd ? rstd.data : NULL;
    return 0;
}

PyDoc_STRVAR(
    layer_norm_fwd_doc,
    "layer_norm_fwd(input, weight, bias, normalized_ndim, eps, out, mean, "
    "rstd)\n"
    "    -> None\n\n"
    "LayerNorm of `input` over its last `normalized_ndim` dimensions into "
    "the\n"
    "caller-allocated `out` (input's shape and dtype), `mean` and `rstd` "
    "(one\n"
    "per row; float32, or float64 for float64 input; both may be None when "
    "the\n"
    "statistics are not wanted). weight/bias may be None;\n"
    "for float16/bfloat16 input they may be float32. Runs on the current "
    "CUDA\n"
    "stream, or on the CPU.");

static PyObject *
layer_norm_fwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError,
                     "layer_norm_fwd() takes 8 arguments "
                     "(%zd given)",
                     nargs);
        return NULL;
    }
    return gemsops_norm_fwd_call(args, 0, NULL);
}

PyObject *
gemsops_norm_fwd_call(PyObject *const *args, int rms, PyObject *const *fused)
{
    struct gemsops_layer_norm_fwd_params p;
    struct gemsops_tensor x;
    if (parse_fwd(args, rms, fused, &p, &x)) {
        return NULL;
    }
    if (p.rows == 0 || (p.cols == 0 && p.rstd == NULL)) {
        Py_RETURN_NONE;
    }
    gemsops_status st = {GEMSOPS_OK, ""};
    int rc;
    if (x.device_type == GEMSOPS_CUDA) {
        rc = gemsops_layer_norm_fwd_cuda(&p, &st);
    }
    else {
        Py_BEGIN_ALLOW_THREADS
        rc = gemsops_layer_norm_fwd_cpu(&p, &st);
        Py_END_ALLOW_THREADS
    }
    if (rc != GEMSOPS_OK) {
        return gemsops_raise(&st);
    }
    Py_RETURN_NONE;
}

/* ---- backward --------------------------------------------------------- */

/* dh_obj: NULL, or the fused add's dh (added into dx). */
static int
parse_bwd(PyObject *const *args, int with_outputs, int rms, PyObject *dh_obj,
          struct gemsops_layer_norm_bwd_params *p,
          struct gemsops_tensor *x_out)
{
    const char *fn = rms ? "rms_norm_backward" : "layer_norm_backward";
    struct gemsops_tensor dy, x, w, mean, rstd, dx, dw, db, ws, dh;
    int has_w, has_dx, has_dw, has_db, has_ws = 0, nd;
    void *stream = NULL;
    memset(p, 0, sizeof *p);
    if (gemsops_tensor_from_object(args[1], fn, "input", &x, &stream) ||
        check_input(&x, fn, "input") || parse_nd(args[3], &x, fn, &nd) ||
        gemsops_optional_tensor(args[2], fn, "weight", &w, &has_w) ||
        (has_w && check_param(&w, &x, nd, fn, "weight")) ||
        row_view(&x, nd, fn, "input", &p->rows, &p->cols, &p->x_row_stride)) {
        return -1;
    }
    int det = PyObject_IsTrue(args[4]);
    if (det < 0) {
        return -1;
    }
    p->deterministic = det;
    p->rms = rms;
    p->x = x.data;
    p->weight = has_w ? w.data : NULL;
    p->dtype = x.dtype;
    p->param_dtype = has_w ? w.dtype : x.dtype;
    p->device_id = x.device_id;
    p->stream = stream;
    *x_out = x;
    if (!with_outputs) {
        /* planning only: args[5..7] say which outputs will be wanted */
        int want[3];
        for (int i = 0; i < 3; i++) {
            if ((want[i] = PyObject_IsTrue(args[5 + i])) < 0) {
                return -1;
            }
        }
        static char marker; /* any non-NULL pointer: "wanted" */
        p->dx = want[0] ? &marker : NULL;
        p->dweight = want[1] ? &marker : NULL;
        p->dbias = want[2] ? &marker : NULL;
        if (want[1] && !has_w) {
            PyErr_Format(PyExc_RuntimeError,
                         "%s(): a weight gradient needs "
                         "the weight",
                         fn);
            return -1;
        }
        return 0;
    }
    if (gemsops_tensor_from_object(args[0], fn, "grad_out", &dy, NULL) ||
        check_like_x(&dy, &x, nd, fn, "grad_out", &p->dy_row_stride) ||
        gemsops_tensor_from_object(args[5], fn, "mean", &mean, NULL) ||
        check_stats(&mean, &x, p->rows, fn, "mean") ||
        gemsops_tensor_from_object(args[6], fn, "rstd", &rstd, NULL) ||
        check_stats(&rstd, &x, p->rows, fn, "rstd") ||
        gemsops_optional_output(args[7], fn, "grad_input", &dx, &has_dx) ||
        (has_dx &&
         check_like_x(&dx, &x, nd, fn, "grad_input", &p->dx_row_stride)) ||
        gemsops_optional_output(args[8], fn, "grad_weight", &dw, &has_dw) ||
        gemsops_optional_output(args[9], fn, "grad_bias", &db, &has_db) ||
        gemsops_optional_output(args[10], fn, "workspace", &ws, &has_ws) ||
        (has_ws && gemsops_check_workspace(&ws, &x, fn))) {
        return -1;
    }
    if (has_dw && !has_w) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): grad_weight was given but weight is None", fn);
        return -1;
    }
    /* dW/dB come out in the parameters' dtype */
    if ((has_dw && check_param(&dw, &x, nd, fn, "grad_weight")) ||
        (has_db && check_param(&db, &x, nd, fn, "grad_bias"))) {
        return -1;
    }
    if ((has_dw && dw.dtype != p->param_dtype) ||
        (has_db && db.dtype != p->param_dtype)) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): grad_weight and grad_bias must have dtype %s (the "
                     "weight's)",
                     fn, gemsops_dtype_name(p->param_dtype));
        return -1;
    }
    if (dh_obj &&
        (gemsops_tensor_from_object(dh_obj, fn, "grad_h", &dh, NULL) ||
         check_like_x(&dh, &x, nd, fn, "grad_h", &p->dh_row_stride))) {
        return -1;
    }
    const struct gemsops_tensor *written[] = {has_dx ? &dx : NULL,
                                              has_dw ? &dw : NULL,
                                              has_db ? &db : NULL};
    const char *wnames[] = {"grad_input", "grad_weight", "grad_bias"};
    const struct gemsops_tensor *read[] = {&dy,
                                           &x,
                                           has_w ? &w : NULL,
                                           &mean,
                                           &rstd,
                                           has_ws ? &ws : NULL,
                                           dh_obj ? &dh : NULL};
    const char *rnames[] = {"grad_out", "input",     "weight", "mean",
                            "rstd",     "workspace", "grad_h"};
    if (gemsops_check_no_overlap(written, wnames, 3, read, rnames, 7, fn)) {
        return -1;
    }
    p->dh = dh_obj ? dh.data : NULL;
    p->dy = dy.data;
    p->mean = mean.data;
    p->rstd = rstd.data;
    p->dx = has_dx ? dx.data : NULL;
    p->dweight = has_dw ? dw.data : NULL;
    p->dbias = has_db ? db.data : NULL;
    p->workspace = has_ws ? ws.data : NULL;
    p->workspace_bytes = has_ws ? gemsops_tensor_numel(&ws) : 0; /* uint8 */
    return 0;
}

PyDoc_STRVAR(
    layer_norm_bwd_doc,
    "layer_norm_bwd(grad_out, input, weight, normalized_ndim, deterministic,\n"
    "               mean, rstd, grad_input, grad_weight, grad_bias, "
    "workspace,\n"
    "               workspace_stream=None) -> None | (int, int)\n\n"
    "Fused LayerNorm backward: grad_input (or None) and "
    "grad_weight/grad_bias\n"
    "(or None) in one kernel that accumulates dW/dB with atomics; with\n"
    "deterministic=True dW/dB are summed in a fixed order instead.\n\n"
    "workspace_stream=None: `workspace` is a uint8 tensor of at least\n"
    "layer_norm_bwd_workspace() bytes (None when that is 0); the launch "
    "zeroes\n"
    "what it needs.\n"
    "workspace_stream=S, an int (the stream handle the workspace is kept "
    "for,\n"
    "-1 for none yet): the caller keeps one workspace per stream; the first\n"
    "launch that gets it zeroes it and every launch leaves its accumulators\n"
    "zero again, so later launches on S memset nothing (the same object, not\n"
    "written through torch since). When the workspace is None or too small, "
    "or S is not the\n"
    "current stream, nothing launches and the call returns (bytes needed,\n"
    "current stream handle); a launch that needs no workspace just runs.");

/* The workspace as a flat uint8 view (the key of csrc/kept.c's records). */
static struct gemsops_tensor
workspace_view(const struct gemsops_layer_norm_bwd_params *p)
{
    struct gemsops_tensor t;
    memset(&t, 0, sizeof t);
    t.data = p->workspace;
    t.dtype = GEMSOPS_UINT8;
    t.device_type = GEMSOPS_CUDA;
    t.device_id = p->device_id;
    t.ndim = 1;
    t.sizes[0] = p->workspace_bytes;
    t.strides[0] = 1;
    return t;
}

static PyObject *
layer_norm_bwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 11 && nargs != 12) {
        PyErr_Format(PyExc_TypeError,
                     "layer_norm_bwd() takes 11 or 12 "
                     "arguments (%zd given)",
                     nargs);
        return NULL;
    }
    return gemsops_norm_bwd_call(args, nargs, 0, NULL);
}

PyObject *
gemsops_norm_bwd_call(PyObject *const *args, Py_ssize_t nargs, int rms,
                      PyObject *dh)
{
    struct gemsops_layer_norm_bwd_params p;
    struct gemsops_tensor x;
    if (parse_bwd(args, 1, rms, dh, &p, &x)) {
        return NULL;
    }
    /* a kept workspace: for which stream (-1: none yet) */
    int kept = nargs == 12 && args[11] != Py_None;
    long long ws_stream = -1;
    if (kept) {
        ws_stream = PyLong_AsLongLong(args[11]);
        if (ws_stream == -1 && PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError,
                         "layer_norm_backward(): "
                         "workspace_stream must be a stream handle (int) or "
                         "None");
            return NULL;
        }
    }
    /* nothing to write: the arguments were checked, that is all */
    if ((p.rows * p.cols == 0 || !p.dx) && !p.dweight && !p.dbias) {
        Py_RETURN_NONE;
    }
    gemsops_status st = {GEMSOPS_OK, ""};
    int rc;
    if (x.device_type == GEMSOPS_CUDA) {
        int64_t need = 0;
        p.kept_zero = kept;
        if (kept && (long long)(uintptr_t)p.stream != ws_stream) {
            p.workspace = NULL; /* kept for another stream: ask again */
            p.workspace_bytes = 0;
        }
        /* the accumulators are zero only if this boundary saw the last
         * launch leave them so (csrc/kept.c); else the launch zeroes them */
        struct gemsops_tensor ws = workspace_view(&p);
        unsigned long long tag;
        if (kept && p.workspace != NULL) {
            const int known =
                gemsops_kept_lookup(args[10], &ws, p.stream, &tag);
            if (known < 0) {
                return NULL;
            }
            p.known_zero = known;
        }
        rc = gemsops_layer_norm_bwd_cuda(&p, p.kept_zero ? &need : NULL, &st);
        if (rc == GEMSOPS_OK && need > 0) {
            return Py_BuildValue("(LL)", (long long)need,
                                 (long long)(uintptr_t)p.stream);
        }
        if (kept && p.workspace != NULL) {
            if (rc != GEMSOPS_OK) {
                gemsops_kept_forget(&ws, p.stream);
            }
            else if (gemsops_kept_store(args[10], &ws, p.stream, 0) < 0) {
                return NULL;
            }
        }
        else if (p.workspace != NULL) {
            /* a scratch launch leaves its exchange slots dirty */
            gemsops_kept_overwritten(&ws);
        }
    }
    else {
        Py_BEGIN_ALLOW_THREADS
        rc = gemsops_layer_norm_bwd_cpu(&p, &st);
        Py_END_ALLOW_THREADS
    }
    if (rc != GEMSOPS_OK) {
        return gemsops_raise(&st);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(
    layer_norm_bwd_workspace_doc,
    "layer_norm_bwd_workspace(input, weight, normalized_ndim, deterministic,\n"
    "                         want_grad_input, want_grad_weight, "
    "want_grad_bias)\n"
    "    -> int\n\n"
    "Bytes of workspace layer_norm_bwd needs (0: pass None).");

static PyObject *
layer_norm_bwd_workspace(PyObject *module, PyObject *const *args,
                         Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError,
                     "layer_norm_bwd_workspace() takes 7 "
                     "arguments (%zd given)",
                     nargs);
        return NULL;
    }
    return gemsops_norm_bwd_workspace(args);
}

PyObject *
gemsops_norm_bwd_workspace(PyObject *const *args)
{
    /* parse_bwd reads input at [1], weight [2], nd [3], det [4], wants
     * [5..7]: shift the argument vector by one */
    PyObject *shifted[8] = {Py_None, args[0], args[1], args[2],
                            args[3], args[4], args[5], args[6]};
    struct gemsops_layer_norm_bwd_params p;
    struct gemsops_tensor x;
    if (parse_bwd(shifted, 0, 0, NULL, &p, &x)) {
        return NULL;
    }
    int64_t bytes = 0;
    gemsops_status st = {GEMSOPS_OK, ""};
    if (x.device_type == GEMSOPS_CUDA && p.rows * p.cols > 0 &&
        gemsops_layer_norm_bwd_workspace_cuda(&p, &bytes, &st) != GEMSOPS_OK) {
        return gemsops_raise(&st);
    }
    return PyLong_FromLongLong(bytes);
}

PyMethodDef gemsops_layer_norm_methods[] = {
    {"layer_norm_fwd", (PyCFunction)(void (*)(void))layer_norm_fwd,
     METH_FASTCALL, layer_norm_fwd_doc},
    {"layer_norm_bwd", (PyCFunction)(void (*)(void))layer_norm_bwd,
     METH_FASTCALL, layer_norm_bwd_doc},
    {"layer_norm_bwd_workspace",
     (PyCFunction)(void (*)(void))layer_norm_bwd_workspace, METH_FASTCALL,
     layer_norm_bwd_workspace_doc},
    {NULL, NULL, 0, NULL},
};
