// LayerNorm forward, the looped kernel's launch: its block and grid (the
// kernel, its math and its bytes: layer_norm_fwd_looped.cuh; which rows
// come here: layer_norm_fwd.cu, which plans the forward). A translation
// unit of its own because NVVM weighs inlining over a whole module: beside
// grown register-kernel instantiations, the looped kernels' reciprocal
// slow path was left a call and they spilled (docs/performance.md).
#include "cuda_check.cuh"
#include "device.cuh"
#include "layer_norm_fwd_looped.cuh"

namespace gemsops {
namespace {

template <typename T, typename P, bool RMS, int VEC, int BLOCK>
void launch_looped(const gemsops_layer_norm_fwd_params *p)
{
    cudaStream_t stream = (cudaStream_t)p->stream;
    if (p->residual) {
        layer_norm_fwd_looped<T, P, VEC, BLOCK, RMS, true>
            <<<fwd_grid(p->rows), BLOCK, 0, stream>>>(make_args<T, P>(p));
    }
    else {
        layer_norm_fwd_looped<T, P, VEC, BLOCK, RMS, false>
            <<<fwd_grid(p->rows), BLOCK, 0, stream>>>(make_args<T, P>(p));
    }
}

template <typename T, typename P, bool RMS, int VEC>
int run_looped(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    device_facts f;
    if (get_device_facts(p->device_id, &f, st) != GEMSOPS_OK) {
        return st->code;
    }
    if constexpr (sizeof(T) < 8) { // fp64: 512 (looped_min_ctas)
        if (looped_block_for<T>(p->cols, f) == 1024) {
            launch_looped<T, P, RMS, VEC, 1024>(p);
            GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_fwd_looped");
            return GEMSOPS_OK;
        }
    }
    launch_looped<T, P, RMS, VEC, 512>(p);
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_fwd_looped");
    return GEMSOPS_OK;
}

} // namespace

template <typename T, typename P, bool RMS>
int layer_norm_fwd_looped_launch(const gemsops_layer_norm_fwd_params *p,
                                 bool vec, gemsops_status *st)
{
    constexpr int V = 16 / sizeof(T);
    return vec ? run_looped<T, P, RMS, V>(p, st)
               : run_looped<T, P, RMS, 1>(p, st);
}

template int layer_norm_fwd_looped_launch<float, float, false>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<float, float, true>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<double, double, false>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<double, double, true>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<__half, __half, false>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<__half, __half, true>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<__half, float, false>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<__half, float, true>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<__nv_bfloat16, __nv_bfloat16, false>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<__nv_bfloat16, __nv_bfloat16, true>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<__nv_bfloat16, float, false>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);
template int layer_norm_fwd_looped_launch<__nv_bfloat16, float, true>(
    const gemsops_layer_norm_fwd_params *, bool, gemsops_status *);

} // namespace gemsops
