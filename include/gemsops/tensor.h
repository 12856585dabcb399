/* A plain-C view of a strided tensor, filled from DLPack at the Python
 * boundary. Kernels and CPU loops below the boundary see only this. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GEMSOPS_MAX_DIMS 16

typedef enum gemsops_dtype {
    GEMSOPS_FLOAT32 = 0,
    GEMSOPS_FLOAT64,
    GEMSOPS_FLOAT16,
    GEMSOPS_BFLOAT16,
    GEMSOPS_BOOL,
    GEMSOPS_UINT8,
    GEMSOPS_INT8,
    GEMSOPS_INT16,
    GEMSOPS_INT32,
    GEMSOPS_INT64,
    /* Anything DLPack can describe that gemsops does not compute: this
     * value and the ones after it, which name the type for messages. */
    GEMSOPS_DTYPE_UNSUPPORTED,
    GEMSOPS_UINT16,
    GEMSOPS_UINT32,
    GEMSOPS_UINT64,
    GEMSOPS_COMPLEX32,
    GEMSOPS_COMPLEX64,
    GEMSOPS_COMPLEX128,
} gemsops_dtype;

typedef enum gemsops_device_type {
    GEMSOPS_CPU = 1, /* same values as DLPack's kDLCPU / kDLCUDA */
    GEMSOPS_CUDA = 2,
} gemsops_device_type;

struct gemsops_tensor {
    void *data; /* first element (DLPack data + byte_offset) */
    gemsops_dtype dtype; /* element type */
    int device_type; /* gemsops_device_type, or another DLPack code */
    int device_id; /* CUDA ordinal; 0 on the CPU */
    int ndim; /* number of dimensions, 0 for a scalar */
    int64_t sizes[GEMSOPS_MAX_DIMS]; /* extent of each dimension */
    int64_t strides[GEMSOPS_MAX_DIMS]; /* in elements, never NULL here */
};

size_t gemsops_dtype_size(gemsops_dtype dtype);
const char *gemsops_dtype_name(gemsops_dtype dtype);
int64_t gemsops_tensor_numel(const struct gemsops_tensor *t);
/* Row-major contiguous (size-1 dimensions may carry any stride; an empty
 * tensor always is). */
int gemsops_tensor_is_contiguous(const struct gemsops_tensor *t);

#ifdef __cplusplus
}
#endif
