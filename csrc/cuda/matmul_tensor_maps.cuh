// Tensor maps of the wgmma mainloop's operands and of C
// (matmul_tensor_maps.cu): what TMA can describe, and its encoding.
#pragma once

#include <cuda.h> // CUtensorMap (a type: nothing links the driver)
#include <stdint.h>

#include "gemsops/status.h"
#include "gemsops/tensor.h"

namespace gemsops {

// cuTensorMapEncodeTiled through cudart's driver entry point (no -lcuda).
// NULL when the driver has none (older than CUDA 12).
using encode_tiled_fn = CUresult (*)(CUtensorMap *, CUtensorMapDataType,
                                     cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const cuuint32_t *,
                                     const cuuint32_t *, CUtensorMapInterleave,
                                     CUtensorMapSwizzle,
                                     CUtensorMapL2promotion,
                                     CUtensorMapFloatOOBfill);

encode_tiled_fn tensor_map_encoder();

// An operand seen as [z][y][x] (x contiguous, esize-byte elements). TMA
// can describe it when the base is 16-byte aligned and the y and z strides
// are positive multiples of 16 bytes below 2^40 (cuTensorMapEncodeTiled's
// documented limits). Operands it cannot describe (odd or zero strides,
// misaligned views) take the mma mainloop: a rule on the layout, decided
// before any driver call, not a fallback from a failed one.
struct tma_operand {
    const void *base;
    int64_t x, y, y_stride, batch, z_stride;
    int box_y, esize;
    // elements of x a box: 0 means 128 bytes, a line of the 128-byte
    // swizzle; any other count is unswizzled (the transposed C's boxes)
    int box_x_elems = 0;
    bool one() const
    {
        return z_stride == 0 || batch == 1;
    }
    int64_t y_bytes() const
    {
        return y_stride * esize;
    }
    int64_t z_bytes() const
    {
        return (one() ? y_stride * y : z_stride) * esize;
    }
    int box_x() const
    {
        return box_x_elems > 0 ? box_x_elems : 128 / esize;
    }
    bool swizzled() const
    {
        return box_x_elems == 0;
    }
};

bool tma_describes(const tma_operand &o);

// Boxes of box_x() x box_y, 128-byte swizzle where a box's row is 128 bytes
// (else none), zero fill past the edges. The
// caller checked tma_describes and made the device's context current.
// *refused: the driver refused this layout (counted, not an error).
int encode_operand(CUtensorMap *map, gemsops_dtype dt, const tma_operand &o,
                   bool *refused, gemsops_status *st);

} // namespace gemsops
