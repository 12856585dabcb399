/* Linked instead of the CUDA objects when the extension is built without
 * nvcc: every CUDA entry point reports that plainly. The boundary checks
 * gemsops_built_with_cuda() first, so these are a second line. */
#include "boundary.h"
#include "gemsops/layer_norm.h"
#include "gemsops/matmul.h"
#include "gemsops/prod.h"

int
gemsops_built_with_cuda(void)
{
    return 0;
}

int
gemsops_cuda_device_count(int *count)
{
    *count = 0;
    return 0;
}

int
gemsops_stream_capturing(void *stream)
{
    (void)stream;
    return 0;
}

#define GEMSOPS_NO_CUDA(st)                 \
    gemsops_fail((st), GEMSOPS_ERR_RUNTIME, \
                 "gemsops was built without CUDA (no nvcc at build time)")

int
gemsops_layer_norm_fwd_cuda(const struct gemsops_layer_norm_fwd_params *p,
                            gemsops_status *st)
{
    (void)p;
    return GEMSOPS_NO_CUDA(st);
}

int
gemsops_layer_norm_bwd_cuda(const struct gemsops_layer_norm_bwd_params *p,
                            int64_t *need, gemsops_status *st)
{
    (void)p;
    (void)need;
    return GEMSOPS_NO_CUDA(st);
}

int
gemsops_layer_norm_bwd_workspace_cuda(
    const struct gemsops_layer_norm_bwd_params *p, int64_t *bytes,
    gemsops_status *st)
{
    (void)p;
    *bytes = 0;
    return GEMSOPS_NO_CUDA(st);
}

int
gemsops_prod_cuda(const struct gemsops_prod_params *p, gemsops_status *st)
{
    (void)p;
    return GEMSOPS_NO_CUDA(st);
}

int
gemsops_prod_bwd_cuda(const struct gemsops_prod_bwd_params *p,
                      gemsops_status *st)
{
    (void)p;
    return GEMSOPS_NO_CUDA(st);
}

int
gemsops_prod_workspace_cuda(const struct gemsops_prod_params *p,
                            int64_t *bytes, gemsops_status *st)
{
    (void)p;
    *bytes = 0;
    return GEMSOPS_NO_CUDA(st);
}

int
gemsops_prod_bwd_workspace_cuda(const struct gemsops_prod_bwd_params *p,
                                int64_t *bytes, gemsops_status *st)
{
    (void)p;
    *bytes = 0;
    return GEMSOPS_NO_CUDA(st);
}

long long
gemsops_tma_refusals(void)
{
    return 0;
}

int
gemsops_matmul_cuda(const struct gemsops_matmul_params *p,
                    struct gemsops_matmul_need *need, gemsops_status *st)
{
    (void)p;
    need->workspace_bytes = need->flags = 0;
    return GEMSOPS_NO_CUDA(st);
}

int
gemsops_matmul_plan_cuda(const struct gemsops_matmul_params *p,
                         struct gemsops_sk_schedule *s,
                         gemsops_mainloop *mainloop, int *staged,
                         gemsops_status *st)
{
    (void)p;
    (void)s;
    (void)mainloop;
    (void)staged;
    return GEMSOPS_NO_CUDA(st);
}
