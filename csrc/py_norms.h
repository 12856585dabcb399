/* The LayerNorm boundary's bodies, which RMSNorm and the fused adds enter
 * too (py_norm_variants.c), each with its arguments in LayerNorm's order.
 * Each returns what the Python function returns, or NULL with an
 * exception set. */
#pragma once

#include "boundary.h"

/* layer_norm_fwd's 8 arguments (bias None for RMSNorm); rms: RMSNorm's
 * statistic; fused: NULL, or {residual, h} of the fused add. */
PyObject *gemsops_norm_fwd_call(PyObject *const *args, int rms,
                                PyObject *const *fused);
/* layer_norm_bwd's 11 or 12 arguments (for RMSNorm: rstd in mean's place,
 * which the launch does not read, and grad_bias None); dh: NULL, or the
 * fused add's gradient of h, added into grad_input. */
PyObject *gemsops_norm_bwd_call(PyObject *const *args, Py_ssize_t nargs,
                                int rms, PyObject *dh);
/* layer_norm_bwd_workspace's 7 arguments. */
PyObject *gemsops_norm_bwd_workspace(PyObject *const *args);
