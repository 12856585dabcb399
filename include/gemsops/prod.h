/* Products of a strided tensor: over every element, or along one dim.
 *
 *   full:    out = prod_i x[i]
 *   per-dim: out[o] = prod_r x[o, r]   (o: the kept dims, row-major)
 *   backward: grad_x[o, r] = g[o] * prod_{j<r} x[o, j] * prod_{j>r} x[o, j]
 *             (exclusive prefix and suffix products: exact where x has
 *             zeros, no division, no host sync)
 *
 * The input arrives already in the compute dtype (the Python layer applies
 * dtype= first); integer and bool inputs multiply in int64 with two's
 * complement wrap-around, as torch does. Validated at the Python boundary
 * (csrc/py_prod.c). */
#pragma once

#include "gemsops/status.h"
#include "gemsops/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gemsops_prod_params {
    struct gemsops_tensor x; /* input view, any strides                  */
    int dim;                 /* reduced dim, or -1 for all elements       */
    void *out;               /* contiguous [kept dims], dtype out_dtype   */
    gemsops_dtype out_dtype; /* int64 for bool/int input, else x's dtype  */
};

struct gemsops_prod_bwd_params {
    struct gemsops_tensor x; /* forward input (float dtype), any strides  */
    int dim;                 /* as in the forward                         */
    const void *grad_out;    /* contiguous [kept dims], x's dtype         */
    void *grad_in;           /* contiguous, x's shape and dtype           */
};

int gemsops_prod_cpu(const struct gemsops_prod_params *p, gemsops_status *st);
int gemsops_prod_bwd_cpu(const struct gemsops_prod_bwd_params *p,
                         gemsops_status *st);

#ifdef __cplusplus
}
#endif
