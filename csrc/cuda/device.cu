// Per-device facts and kernel occupancy, read once and cached: the SM
// count, shared memory and resident CTAs size the persistent grids and the
// shared-memory rings (device.cuh).
#include <mutex>

#include "cuda_check.cuh"
#include "device.cuh"

namespace gemsops {

namespace {
device_facts g_facts[kMaxDevices];
bool g_known[kMaxDevices];
std::mutex g_lock;
} // namespace

int get_device_facts(int device, device_facts *out, gemsops_status *st)
{
    if (device < 0 || device >= kMaxDevices) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "CUDA device %d is out of range", device);
    }
    std::lock_guard<std::mutex> hold(g_lock);
    if (!g_known[device]) {
        device_facts f;
        GEMSOPS_CUDA_CHECK(st, cudaDeviceGetAttribute(
                                   &f.sm_count, cudaDevAttrMultiProcessorCount,
                                   device));
        GEMSOPS_CUDA_CHECK(st, cudaDeviceGetAttribute(
                                   &f.cc_major,
                                   cudaDevAttrComputeCapabilityMajor, device));
        GEMSOPS_CUDA_CHECK(st, cudaDeviceGetAttribute(
                                   &f.cc_minor,
                                   cudaDevAttrComputeCapabilityMinor, device));
        GEMSOPS_CUDA_CHECK(
            st, cudaDeviceGetAttribute(&f.smem_per_block_optin,
                                       cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                       device));
        GEMSOPS_CUDA_CHECK(st, cudaDeviceGetAttribute(
                                   &f.smem_per_sm,
                                   cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                   device));
        GEMSOPS_CUDA_CHECK(st, cudaDeviceGetAttribute(&f.l2_bytes,
                                                      cudaDevAttrL2CacheSize,
                                                      device));
        g_facts[device] = f;
        g_known[device] = true;
    }
    *out = g_facts[device];
    return GEMSOPS_OK;
}

namespace {
struct resident_entry {
    const void *kernel;
    int device, block, smem, cluster, count;
};
constexpr int kMaxResident = 256;
resident_entry g_resident[kMaxResident];
int g_resident_count;

// What the occupancy calculator says of `kernel` with `cluster` CTAs a
// cluster (0: none): CTAs on the whole device, or clusters at once.
int ask_occupancy(const void *kernel, int device, int block, int smem,
                  int cluster, int *out, gemsops_status *st)
{
    if (smem > 0) { // static + dynamic above 48 KB needs it; harmless below
        GEMSOPS_CUDA_CHECK(st, cudaFuncSetAttribute(
                                   kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   smem));
    }
    if (cluster > 0) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)cluster);
        cfg.blockDim = dim3((unsigned)block);
        cfg.dynamicSmemBytes = (size_t)smem;
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = (unsigned)cluster;
        attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        GEMSOPS_CUDA_CHECK(st, cudaOccupancyMaxActiveClusters(&clusters,
                                                              kernel, &cfg));
        *out = clusters;
        return GEMSOPS_OK;
    }
    int per_sm = 0, sms = 0;
    GEMSOPS_CUDA_CHECK(st, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                               &per_sm, kernel, block, (size_t)smem));
    GEMSOPS_CUDA_CHECK(st,
                       cudaDeviceGetAttribute(&sms,
                                              cudaDevAttrMultiProcessorCount,
                                              device));
    *out = per_sm * sms > 0 ? per_sm * sms : 1;
    return GEMSOPS_OK;
}

int cached_occupancy(const void *kernel, int device, int block, int smem,
                     int cluster, int *out, gemsops_status *st)
{
    std::lock_guard<std::mutex> hold(g_lock);
    for (int k = 0; k < g_resident_count; k++) {
        const resident_entry &e = g_resident[k];
        if (e.kernel == kernel && e.device == device && e.block == block &&
            e.smem == smem && e.cluster == cluster) {
            *out = e.count;
            return GEMSOPS_OK;
        }
    }
    if (ask_occupancy(kernel, device, block, smem, cluster, out, st) !=
        GEMSOPS_OK) {
        return st->code;
    }
    if (g_resident_count < kMaxResident) { // else: asked again next time
        g_resident[g_resident_count++] = {kernel, device,  block,
                                          smem,   cluster, *out};
    }
    return GEMSOPS_OK;
}
} // namespace

int resident_ctas(const void *kernel, int device, int block, int smem,
                  int *out, gemsops_status *st)
{
    return cached_occupancy(kernel, device, block, smem, 0, out, st);
}

int resident_clusters(const void *kernel, int device, int block, int smem,
                      int cluster, int *out, gemsops_status *st)
{
    return cached_occupancy(kernel, device, block, smem, cluster, out, st);
}

} // namespace gemsops

extern "C" int gemsops_cuda_device_count(int *count)
{
    cudaError_t e = cudaGetDeviceCount(count);
    if (e != cudaSuccess) {
        *count = 0;
        cudaGetLastError(); // no driver / no device is not sticky
    }
    return 0;
}

extern "C" int gemsops_built_with_cuda(void)
{
    return 1;
}

extern "C" int gemsops_stream_capturing(void *stream)
{
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaError_t e =
        cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
    if (e != cudaSuccess) {
        cudaGetLastError(); // the launch that follows reports the stream
        return 1; // unknown: keep nothing on its account
    }
    return status != cudaStreamCaptureStatusNone;
}
