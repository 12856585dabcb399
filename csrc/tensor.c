#include "gemsops/tensor.h"

size_t
gemsops_dtype_size(gemsops_dtype dtype)
{
    switch (dtype) {
    case GEMSOPS_FLOAT64:
    case GEMSOPS_INT64: return 8;
    case GEMSOPS_FLOAT32:
    case GEMSOPS_INT32: return 4;
    case GEMSOPS_FLOAT16:
    case GEMSOPS_BFLOAT16:
    case GEMSOPS_INT16: return 2;
    case GEMSOPS_BOOL:
    case GEMSOPS_UINT8:
    case GEMSOPS_INT8: return 1;
    default: return 0;
    }
}

const char *
gemsops_dtype_name(gemsops_dtype dtype)
{
    static const char *names[] = {"float32",   "float64",     "float16",
                                  "bfloat16",  "bool",        "uint8",
                                  "int8",      "int16",       "int32",
                                  "int64",     "unsupported", "uint16",
                                  "uint32",    "uint64",      "complex32",
                                  "complex64", "complex128"};
    if ((int)dtype >= 0 && dtype <= GEMSOPS_COMPLEX128) {
        return names[dtype];
    }
    return "unsupported";
}

int64_t
gemsops_tensor_numel(const struct gemsops_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        n *= t->sizes[i];
    }
    return n;
}

int
gemsops_tensor_is_contiguous(const struct gemsops_tensor *t)
{
    if (gemsops_tensor_numel(t) == 0) {
        return 1; /* no element to misplace: torch gives such views any strides */
    }
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->sizes[i] != 1 && t->strides[i] != expected) {
            return 0;
        }
        expected *= t->sizes[i];
    }
    return 1;
}
