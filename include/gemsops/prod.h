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
    int dim; /* reduced dim, or -1 for all elements       */
    void *out; /* contiguous [kept dims], dtype out_dtype   */
    gemsops_dtype out_dtype; /* int64 for bool/int input, else x's dtype  */
    void *workspace; /* CUDA: >= the queried bytes, or NULL if 0  */
    int64_t workspace_bytes; /* size the caller passed                    */
    void *stream; /* CUDA: cudaStream_t to launch on           */
};

struct gemsops_prod_bwd_params {
    struct gemsops_tensor x; /* forward input (float dtype), any strides  */
    int dim; /* as in the forward                         */
    const void *grad_out; /* contiguous [kept dims], x's dtype         */
    void *grad_in; /* contiguous, x's shape and dtype           */
    void *workspace; /* CUDA: >= the queried bytes, or NULL if 0  */
    int64_t workspace_bytes; /* size the caller passed                    */
    void *stream; /* CUDA: cudaStream_t to launch on           */
};

/* CUDA: bytes of scratch (uninitialised is fine) the launch will need; 0
 * means pass NULL. The plan depends on the device's SM count. The CUDA
 * backward wants a contiguous x. */
int gemsops_prod_workspace_cuda(const struct gemsops_prod_params *p,
                                int64_t *bytes, gemsops_status *st);
int gemsops_prod_bwd_workspace_cuda(const struct gemsops_prod_bwd_params *p,
                                    int64_t *bytes, gemsops_status *st);
int gemsops_prod_cuda(const struct gemsops_prod_params *p, gemsops_status *st);
int gemsops_prod_bwd_cuda(const struct gemsops_prod_bwd_params *p,
                          gemsops_status *st);

int gemsops_prod_cpu(const struct gemsops_prod_params *p, gemsops_status *st);
int gemsops_prod_bwd_cpu(const struct gemsops_prod_bwd_params *p,
                         gemsops_status *st);

#ifdef __cplusplus
}
#endif
