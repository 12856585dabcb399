// What a launch's shape costs on its own: a kernel whose body only sets
// 24 mbarriers and passes one __syncthreads, timed by CUDA events right
// after a 256 MB fill kernel (as the benchmark's zero_() flush precedes
// each timed call), over dynamic shared memory sizes, block and grid
// sizes, with and without the programmatic-dependent launch attribute;
// then back to back without the fill (there the events also time the
// host's launch). The answer for the matmul's small launches is in
// docs/performance.md (matmul, What bounds it).
//
// nvcc -O3 -gencode=arch=compute_90a,code=sm_90a tools/launch_probe.cu \
//     -o /tmp/launch_probe && /tmp/launch_probe
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(call)                                                       \
    do {                                                                  \
        cudaError_t e_ = (call);                                          \
        if (e_ != cudaSuccess) {                                          \
            printf("%s:%d %s\n", __FILE__, __LINE__,                      \
                   cudaGetErrorString(e_));                               \
            return 1;                                                     \
        }                                                                 \
    } while (0)

__global__ void fill_zero(float4 *p, size_t n)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += step) {
        p[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// The matmul kernels' first steps and nothing after them.
__global__ void barriers_only(int barriers)
{
    extern __shared__ __align__(128) unsigned char smem[];
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0) {
        for (int i = 0; i < barriers; i++) {
            const unsigned a = (unsigned)__cvta_generic_to_shared(smem + 8 * i);
            asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(a));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

// Mean and best of `reps` event-timed launches, microseconds.
static int time_launch(cudaStream_t st, float4 *buf, size_t n, bool fill,
                       bool pdl, int grid, int block, int smem, int reps,
                       float *mean, float *best)
{
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    float sum = 0.f;
    *best = 1e9f;
    for (int r = -5; r < reps; r++) { // 5 warm-up launches
        if (fill) {
            fill_zero<<<132 * 8, 512, 0, st>>>(buf, n);
            CHECK(cudaGetLastError());
        }
        CHECK(cudaEventRecord(a, st));
        CHECK(cudaLaunchKernelEx(&cfg, barriers_only, 24));
        CHECK(cudaEventRecord(b, st));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 0) {
            sum += ms * 1e3f;
            *best = ms * 1e3f < *best ? ms * 1e3f : *best;
        }
    }
    *mean = sum / reps;
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return 0;
}

int main()
{
    const size_t bytes = 256u << 20;
    float4 *buf;
    CHECK(cudaMalloc(&buf, bytes));
    CHECK(cudaFuncSetAttribute(
        barriers_only, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    const int smems[] = {256, 65536, 131072, 196608, 232448};
    const int blocks[] = {128, 384};
    const int grids[] = {36, 132};
    for (int fill = 1; fill >= 0; fill--) {
        for (int pdl = 0; pdl < 2; pdl++) {
            for (int g : grids) {
                for (int t : blocks) {
                    for (int s : smems) {
                        float mean, best;
                        if (time_launch(st, buf, bytes / 16, fill, pdl, g, t,
                                        s, 40, &mean, &best)) {
                            return 1;
                        }
                        printf("%s pdl %d grid %3d threads %3d smem %6d: "
                               "mean %.2f us, best %.2f us\n",
                               fill ? "after fill  " : "back to back", pdl,
                               g, t, s, mean, best);
                    }
                }
            }
        }
    }
    CHECK(cudaFree(buf));
    return 0;
}
