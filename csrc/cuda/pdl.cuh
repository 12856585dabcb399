// Programmatic dependent launch (sm_90): a small kernel that consumes a
// larger one's output is launched while the larger one's tail still runs,
// so its launch latency hides behind that tail instead of following it.
#pragma once

#include <cuda_runtime.h>

namespace gemsops {

// A grid launched after this one with programmatic stream serialization
// may start once every CTA here has called pdl_launch_dependents() or
// exited; it calls pdl_wait_primary() before touching what this grid
// writes, which returns once this grid has completed and its memory
// operations are visible. Both are no-ops before sm_90, and the wait
// returns at once for a grid launched normally.
__device__ __forceinline__ void pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait_primary()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launches `kernel` as a programmatic dependent of the grid before it on
// `stream` where `pdl` (sm_90 and later): it may be scheduled once that
// grid's CTAs have called pdl_launch_dependents() or exited, so its launch
// overlaps their tail; it must call pdl_wait_primary() before reading what
// they wrote. Without `pdl`, a plain launch. smem: dynamic shared memory.
//
// A build whose newest target is older than sm_90 runs on sm_90 and later
// from JIT-compiled PTX in which both calls above are compiled out: its
// launches stay plain (setup.py defines GEMSOPS_HAVE_PDL otherwise).
#ifdef GEMSOPS_HAVE_PDL
constexpr bool kPdlBuilt = true;
#else
constexpr bool kPdlBuilt = false;
#endif
// cluster > 0: in thread block clusters of `cluster` CTAs along x (sm_90;
// grid.x a multiple of it).
template <typename... Params, typename... Args>
cudaError_t launch_dependent_cluster(void (*kernel)(Params...), dim3 grid,
                                     dim3 block, size_t smem,
                                     cudaStream_t stream, bool pdl,
                                     unsigned cluster, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attrs[2];
    unsigned n = 0;
    if (pdl && kPdlBuilt) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    if (cluster > 0) {
        attrs[n].id = cudaLaunchAttributeClusterDimension;
        attrs[n].val.clusterDim.x = cluster;
        attrs[n].val.clusterDim.y = 1;
        attrs[n].val.clusterDim.z = 1;
        n++;
    }
    cfg.attrs = attrs;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <typename... Params, typename... Args>
cudaError_t launch_dependent_smem(void (*kernel)(Params...), dim3 grid,
                                  dim3 block, size_t smem, cudaStream_t stream,
                                  bool pdl, Args... args)
{
    return launch_dependent_cluster(kernel, grid, block, smem, stream, pdl, 0,
                                    args...);
}

template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block,
                             cudaStream_t stream, bool pdl, Args... args)
{
    return launch_dependent_smem(kernel, grid, block, 0, stream, pdl, args...);
}

} // namespace gemsops
