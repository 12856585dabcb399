/* Python boundary of RMSNorm and of the fused residual add: each entry
 * point puts its arguments in LayerNorm's order and calls LayerNorm's
 * body (py_norms.h), which parses and checks them as LayerNorm's, the
 * statistic or the add named by its flags. */
#include "boundary.h" /* Python.h first: it sets feature macros */

#include "py_norms.h"

/* ---- RMSNorm: the same entry points, the statistic without centring -- */

PyDoc_STRVAR(
    rms_norm_fwd_doc,
    "rms_norm_fwd(input, weight, normalized_ndim, eps, out, rstd) -> None\n\n"
    "RMSNorm of `input` over its last `normalized_ndim` dimensions into "
    "`out`:\n"
    "y = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps) per row (into "
    "`rstd`\n"
    "when it is not None). Otherwise as layer_norm_fwd.");

static PyObject *
rms_norm_fwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError,
                     "rms_norm_fwd() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *ln[8] = {args[0], args[1], Py_None, args[2],
                       args[3], args[4], Py_None, args[5]};
    return gemsops_norm_fwd_call(ln, 1, NULL);
}

PyDoc_STRVAR(
    rms_norm_bwd_doc,
    "rms_norm_bwd(grad_out, input, weight, normalized_ndim, deterministic,\n"
    "             rstd, grad_input, grad_weight, workspace,\n"
    "             workspace_stream=None) -> None | (int, int)\n\n"
    "RMSNorm backward in one kernel: dx = rstd * (g - xhat * c1 / N), "
    "g = w * dy,\n"
    "xhat = x * rstd, c1 = sum g * xhat; dW accumulated as in "
    "layer_norm_bwd,\n"
    "whose workspace protocol it shares (rms_norm_bwd_workspace sizes it).");

static PyObject *
rms_norm_bwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 9 && nargs != 10) {
        PyErr_Format(PyExc_TypeError,
                     "rms_norm_bwd() takes 9 or 10 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *ln[12] = {args[0], args[1], args[2],
                        args[3], args[4], args[5],
                        args[5], args[6], args[7],
                        Py_None, args[8], nargs == 10 ? args[9] : Py_None};
    return gemsops_norm_bwd_call(ln, nargs + 2, 1, NULL);
}

PyDoc_STRVAR(rms_norm_bwd_workspace_doc,
             "rms_norm_bwd_workspace(input, weight, normalized_ndim, "
             "deterministic,\n"
             "                       want_grad_input, want_grad_weight) -> "
             "int\n\n"
             "Bytes of workspace rms_norm_bwd needs (0: pass None).");

static PyObject *
rms_norm_bwd_workspace(PyObject *module, PyObject *const *args,
                       Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError,
                     "rms_norm_bwd_workspace() takes 6 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *ln[7] = {args[0], args[1], args[2], args[3],
                       args[4], args[5], Py_False};
    return gemsops_norm_bwd_workspace(ln);
}

/* ---- the fused residual add: h = x + residual, then the norm of h ----- */

PyDoc_STRVAR(
    add_norm_fwd_doc,
    "add_norm_fwd(input, residual, weight, bias, normalized_ndim, eps, rms,\n"
    "             out, h, mean, rstd) -> None\n\n"
    "h = input + residual (rounded to the input's dtype, into `h`), then "
    "LayerNorm\n"
    "(rms False) or RMSNorm (rms True, bias None, mean None) of h into "
    "`out`,\n"
    "reading input and residual once. Otherwise as layer_norm_fwd.");

static PyObject *
add_norm_fwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError,
                     "add_norm_fwd() takes 11 arguments (%zd given)", nargs);
        return NULL;
    }
    const int rms = PyObject_IsTrue(args[6]);
    if (rms < 0) {
        return NULL;
    }
    PyObject *ln[8] = {args[0], args[2], args[3], args[4],
                       args[5], args[7], args[9], args[10]};
    PyObject *fused[2] = {args[1], args[8]};
    return gemsops_norm_fwd_call(ln, rms, fused);
}

PyDoc_STRVAR(
    add_norm_bwd_doc,
    "add_norm_bwd(grad_out, grad_h, h, weight, normalized_ndim, "
    "deterministic,\n"
    "             rms, mean, rstd, grad_input, grad_weight, grad_bias, "
    "workspace,\n"
    "             workspace_stream=None) -> None | (int, int)\n\n"
    "The backward of add_norm_fwd: the norm's backward at h with grad_h "
    "(or\n"
    "None: nothing) added into grad_input (the gradient of input and of\n"
    "residual alike); mean is None for RMSNorm. Otherwise as "
    "layer_norm_bwd.");

static PyObject *
add_norm_bwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 13 && nargs != 14) {
        PyErr_Format(PyExc_TypeError,
                     "add_norm_bwd() takes 13 or 14 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    const int rms = PyObject_IsTrue(args[6]);
    if (rms < 0) {
        return NULL;
    }
    /* RMSNorm reads no mean: rstd stands in its place */
    PyObject *mean = rms && args[7] == Py_None ? args[8] : args[7];
    PyObject *ln[12] = {args[0],  args[2],  args[3],
                        args[4],  args[5],  mean,
                        args[8],  args[9],  args[10],
                        args[11], args[12], nargs == 14 ? args[13] : Py_None};
    /* bwd_call counts layer_norm_bwd's arguments: 11, or 12 with a stream */
    return gemsops_norm_bwd_call(ln, nargs - 2, rms,
                                 args[1] == Py_None ? NULL : args[1]);
}

PyMethodDef gemsops_norm_variant_methods[] = {
    {"rms_norm_fwd", (PyCFunction)(void (*)(void))rms_norm_fwd, METH_FASTCALL,
     rms_norm_fwd_doc},
    {"rms_norm_bwd", (PyCFunction)(void (*)(void))rms_norm_bwd, METH_FASTCALL,
     rms_norm_bwd_doc},
    {"rms_norm_bwd_workspace",
     (PyCFunction)(void (*)(void))rms_norm_bwd_workspace, METH_FASTCALL,
     rms_norm_bwd_workspace_doc},
    {"add_norm_fwd", (PyCFunction)(void (*)(void))add_norm_fwd, METH_FASTCALL,
     add_norm_fwd_doc},
    {"add_norm_bwd", (PyCFunction)(void (*)(void))add_norm_bwd, METH_FASTCALL,
     add_norm_bwd_doc},
    {NULL, NULL, 0, NULL},
};
