// Tensor maps for the wgmma mainloop's TMA loads and stores: an operand
// (or C) described to cuTensorMapEncodeTiled, which cudart's driver entry
// point hands out (nothing links libcuda). Host code alone: the maps are
// encoded per launch and travel in the kernel's parameters
// (matmul_streamk.cu).
#include <atomic>
#include <mutex>

#include "cuda_check.cuh"
#include "gemsops/matmul.h"
#include "matmul_tensor_maps.cuh"

namespace gemsops {

encode_tiled_fn tensor_map_encoder()
{
    static std::once_flag once;
    static encode_tiled_fn fn = nullptr;
    std::call_once(once, [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f,
                                             12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess) {
            fn = (encode_tiled_fn)f;
        }
        else {
            cudaGetLastError(); // not sticky; NULL from now on: no wgmma
        }
    });
    return fn;
}

namespace {

// Layouts that pass tma_describes but that the driver still refuses with
// CUDA_ERROR_INVALID_VALUE are counted (gemsops._C.fallback_counts()): a
// refused operand takes the mma mainloop, a refused C the element stores;
// any other failure is an error.
std::atomic<long long> g_tma_refusals{0};

} // namespace

bool tma_describes(const tma_operand &o)
{
    constexpr int64_t lim = (int64_t)1 << 40, dim_lim = (int64_t)1 << 32;
    auto stride_ok = [](int64_t b) { return b > 0 && b % 16 == 0 && b < lim; };
    return o.x > 0 && o.y > 0 && o.batch > 0 && o.x < dim_lim &&
           o.y < dim_lim && o.batch < dim_lim && (uintptr_t)o.base % 16 == 0 &&
           stride_ok(o.y_bytes()) && stride_ok(o.z_bytes());
}

// Boxes of box_x() x box_y, 128-byte swizzle where a box's row is 128 bytes
// (else none), zero fill past the edges. The
// caller checked tma_describes and made the device's context current.
// *refused: the driver refused this layout (counted, not an error).
int encode_operand(CUtensorMap *map, gemsops_dtype dt, const tma_operand &o,
                   bool *refused, gemsops_status *st)
{
    const encode_tiled_fn fn = tensor_map_encoder();
    const cuuint64_t dims[3] = {(cuuint64_t)o.x, (cuuint64_t)o.y,
                                (cuuint64_t)(o.one() ? 1 : o.batch)};
    const cuuint64_t strides[2] = {(cuuint64_t)o.y_bytes(),
                                   (cuuint64_t)o.z_bytes()};
    const cuuint32_t box[3] = {(cuuint32_t)o.box_x(), (cuuint32_t)o.box_y, 1};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUtensorMapDataType type =
        dt == GEMSOPS_FLOAT16    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        : dt == GEMSOPS_BFLOAT16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    const CUresult r = fn(map, type, 3, (void *)o.base, dims, strides, box,
                          elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                          o.swizzled() ? CU_TENSOR_MAP_SWIZZLE_128B
                                       : CU_TENSOR_MAP_SWIZZLE_NONE,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    *refused = r == CUDA_ERROR_INVALID_VALUE;
    if (*refused) {
        g_tma_refusals.fetch_add(1, std::memory_order_relaxed);
        return GEMSOPS_OK;
    }
    if (r != CUDA_SUCCESS) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "matmul: cuTensorMapEncodeTiled failed (CUresult "
                            "%d) for an operand of %lld x %lld, strides %lld "
                            "and %lld bytes",
                            (int)r, (long long)o.x, (long long)o.y,
                            (long long)o.y_bytes(), (long long)o.z_bytes());
    }
    return GEMSOPS_OK;
}

} // namespace gemsops

extern "C" long long gemsops_tma_refusals(void)
{
    return gemsops::g_tma_refusals.load(std::memory_order_relaxed);
}
