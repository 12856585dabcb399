// Host-side CUDA error handling: every runtime call and every launch is
// checked where it happens, and a failure becomes a gemsops_status naming
// the call, the file and line, and the CUDA error (DESIGN.md, Conventions
// 5). Plus the device guard every entry point takes before it touches a
// device.
#pragma once

#include <cuda_runtime.h>

#include "gemsops/status.h"

// Every CUDA runtime call goes through this: on failure it records the call
// text, file, line and the CUDA error name, and returns from the caller.
#define GEMSOPS_CUDA_CHECK(st, call)                                  \
    do {                                                              \
        cudaError_t gemsops_err_ = (call);                            \
        if (gemsops_err_ != cudaSuccess) {                            \
            return gemsops_fail((st), GEMSOPS_ERR_RUNTIME,            \
                                "%s failed at %s:%d: %s (%s)", #call, \
                                __FILE__, __LINE__,                   \
                                cudaGetErrorName(gemsops_err_),       \
                                cudaGetErrorString(gemsops_err_));    \
        }                                                             \
    } while (0)

// After each launch: configuration errors surface here, not at a later call.
#define GEMSOPS_CUDA_CHECK_LAUNCH(st, kernel_name)                       \
    do {                                                                 \
        cudaError_t gemsops_err_ = cudaGetLastError();                   \
        if (gemsops_err_ != cudaSuccess) {                               \
            return gemsops_fail((st), GEMSOPS_ERR_RUNTIME,               \
                                "launch of %s failed at %s:%d: %s (%s)", \
                                kernel_name, __FILE__, __LINE__,         \
                                cudaGetErrorName(gemsops_err_),          \
                                cudaGetErrorString(gemsops_err_));       \
        }                                                                \
    } while (0)

namespace gemsops {

// Makes `device` current for the scope and restores the previous one.
// cudaSetDevice runs even when `device` is already the current ordinal: a
// thread that never touched the runtime reports device 0 with no context
// current, and driver-API calls (the TMA encoder) need the primary context
// current, which cudaSetDevice makes it.
struct device_guard {
    int previous = -1;
    cudaError_t enter(int device)
    {
        cudaError_t e = cudaGetDevice(&previous);
        if (e != cudaSuccess) {
            return e;
        }
        return cudaSetDevice(device);
    }
    ~device_guard()
    {
        int now;
        if (previous >= 0 && cudaGetDevice(&now) == cudaSuccess &&
            now != previous) {
            cudaSetDevice(previous);
        }
    }
};

} // namespace gemsops
