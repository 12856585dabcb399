/* The DLPack ABI (v1.x), declared here from the published specification:
 * only the structs and codes this consumer reads. Layouts must match the
 * spec exactly; names carry a gemsops_ prefix to avoid clashing with a
 * real dlpack.h that some other header might pull in. */
#pragma once

#include <stdint.h>

enum {
    GEMSOPS_DL_CPU = 1,
    GEMSOPS_DL_CUDA = 2,
    GEMSOPS_DL_CUDA_HOST = 3,
    GEMSOPS_DL_CUDA_MANAGED = 13,
};

enum {
    GEMSOPS_DL_INT = 0,
    GEMSOPS_DL_UINT = 1,
    GEMSOPS_DL_FLOAT = 2,
    GEMSOPS_DL_BFLOAT = 4,
    GEMSOPS_DL_COMPLEX = 5,
    GEMSOPS_DL_BOOL = 6,
};

typedef struct {
    uint32_t major, minor;
} gemsops_dl_version;

typedef struct {
    int32_t device_type;
    int32_t device_id;
} gemsops_dl_device;

typedef struct {
    uint8_t code, bits;
    uint16_t lanes;
} gemsops_dl_dtype;

typedef struct {
    void *data;
    gemsops_dl_device device;
    int32_t ndim;
    gemsops_dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* NULL means row-major contiguous (before v1.2) */
    uint64_t byte_offset;
} gemsops_dl_tensor;

typedef struct gemsops_dl_managed {
    gemsops_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct gemsops_dl_managed *self);
} gemsops_dl_managed;

typedef struct gemsops_dl_managed_versioned {
    gemsops_dl_version version;
    void *manager_ctx;
    void (*deleter)(struct gemsops_dl_managed_versioned *self);
    uint64_t flags; /* GEMSOPS_DL_FLAG_* */
    gemsops_dl_tensor dl_tensor;
} gemsops_dl_managed_versioned;

/* DLPACK_FLAG_BITMASK_READ_ONLY: the consumer must not write the memory */
#define GEMSOPS_DL_FLAG_READ_ONLY ((uint64_t)1)

/* `type(t).__dlpack_c_exchange_api__`: a capsule named
 * "dlpack_exchange_api" holding this table (DLPack 1.2+). */
typedef struct gemsops_dl_exchange_api_header {
    gemsops_dl_version version;
    struct gemsops_dl_exchange_api_header *prev_api;
} gemsops_dl_exchange_api_header;

typedef struct {
    gemsops_dl_exchange_api_header header;
    void *managed_tensor_allocator;
    void *managed_tensor_from_py_object_no_sync;
    void *managed_tensor_to_py_object_no_sync;
    /* fills *out without allocating; views stay valid until we return to
     * Python; 0 on success, -1 with a Python exception set */
    int (*dltensor_from_py_object_no_sync)(void *py_object,
                                           gemsops_dl_tensor *out);
    /* the producer's current stream for a device (torch: current_stream) */
    int (*current_work_stream)(int32_t device_type, int32_t device_id,
                               void **out_stream);
} gemsops_dl_exchange_api;
