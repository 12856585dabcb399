/* Element access for the CPU backend: one element, or a whole row out of
 * a double buffer, whatever the storage dtype. */
#pragma once

#include <string.h>

#include "gemsops/half.h"
#include "gemsops/tensor.h"

static inline double
gemsops_load_f64(const void *base, gemsops_dtype dt, int64_t i)
{
    switch (dt) {
    case GEMSOPS_FLOAT32: return ((const float *)base)[i];
    case GEMSOPS_FLOAT64: return ((const double *)base)[i];
    case GEMSOPS_FLOAT16:
        return gemsops_half_to_float(((const uint16_t *)base)[i]);
    case GEMSOPS_BFLOAT16:
        return gemsops_bf16_to_float(((const uint16_t *)base)[i]);
    case GEMSOPS_BOOL: return ((const uint8_t *)base)[i] != 0;
    case GEMSOPS_UINT8: return ((const uint8_t *)base)[i];
    case GEMSOPS_INT8: return ((const int8_t *)base)[i];
    case GEMSOPS_INT16: return ((const int16_t *)base)[i];
    case GEMSOPS_INT32: return ((const int32_t *)base)[i];
    case GEMSOPS_INT64: return (double)((const int64_t *)base)[i];
    default: return 0;
    }
}

/* Float types only (the result of a float op). Half types round once from
 * float, as the CUDA kernels do. */
static inline void
gemsops_store_f64(void *base, gemsops_dtype dt, int64_t i, double v)
{
    switch (dt) {
    case GEMSOPS_FLOAT32: ((float *)base)[i] = (float)v; break;
    case GEMSOPS_FLOAT64: ((double *)base)[i] = v; break;
    case GEMSOPS_FLOAT16:
        ((uint16_t *)base)[i] = gemsops_float_to_half((float)v);
        break;
    case GEMSOPS_BFLOAT16:
        ((uint16_t *)base)[i] = gemsops_float_to_bf16((float)v);
        break;
    default: break;
    }
}

/* A whole row: one dtype switch, then a plain loop the compiler can
 * vectorize (a switch per element kept every row loop scalar). */
static inline void
gemsops_store_row(const double *src, gemsops_dtype dt, int64_t n, void *dst)
{
    switch (dt) {
    case GEMSOPS_FLOAT32: {
        float *d = dst;
        for (int64_t i = 0; i < n; i++) {
            d[i] = (float)src[i];
        }
        break;
    }
    case GEMSOPS_FLOAT64: memcpy(dst, src, (size_t)n * sizeof *src); break;
    case GEMSOPS_BFLOAT16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) {
            d[i] = gemsops_float_to_bf16((float)src[i]);
        }
        break;
    }
    case GEMSOPS_FLOAT16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) {
            d[i] = gemsops_float_to_half((float)src[i]);
        }
        break;
    }
    default: break; /* float types only */
    }
}
