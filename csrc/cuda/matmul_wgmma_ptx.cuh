// The sm_90a instructions of the wgmma mainloop (matmul_wgmma.cuh), one
// inline function each: warpgroup MMA and its shared-memory descriptors,
// TMA loads and stores of tensor-map boxes, bulk async-groups, thread
// block clusters and distributed shared memory, setmaxnreg, mbarrier
// waits, and the named barriers the consumer warpgroups meet at.
// GEMSOPS_HAS_WGMMA: this compilation pass targets sm_90a. The
// instructions only sm_90a has are defined under it, and their callers
// are guarded alike (the sm_80 pass compiles the driver without them).
#pragma once

#include <cuda.h> // CUtensorMap (a type: nothing links the driver)
#include <stdint.h>

namespace gemsops {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GEMSOPS_HAS_WGMMA 1
#endif

// 64-bit shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t wgmma_desc(unsigned addr, unsigned lbo,
                                               unsigned sbo)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 |
           (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}

#ifdef GEMSOPS_HAS_WGMMA
__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// One TMA box of a 3-D tensor map at (x, y, z) into shared memory; its bytes
// count toward `bar`'s transaction.
__device__ __forceinline__ void tma_load_3d(unsigned dst,
                                            const CUtensorMap *map, int x,
                                            int y, int z, unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile"
                 ".mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
                 "[%5];" ::"r"(dst),
                 "l"(map), "r"(x), "r"(y), "r"(z), "r"(bar)
                 : "memory");
}

// One TMA box of shared memory at `src` to a 3-D tensor map at (x, y, z),
// as a bulk async-group of this thread; the map's bounds clip the box.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap *map,
                                             unsigned src, int x, int y, int z)
{
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group"
                 " [%0, {%1, %2, %3}], [%4];" ::"l"(map),
                 "r"(x), "r"(y), "r"(z), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit()
{
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Until at most N of this thread's bulk groups still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// This thread's shared-memory writes, visible to the async proxy (TMA).
__device__ __forceinline__ void fence_proxy_async_shared()
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Thread block clusters (a split-k launch's pieces of one tile): this CTA's
// rank in its cluster and the cluster's index in the grid (1-D grids).
__device__ __forceinline__ unsigned cluster_rank()
{
    unsigned r;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned cluster_index()
{
    unsigned r;
    asm("mov.u32 %0, %%clusterid.x;" : "=r"(r));
    return r;
}
// Every thread of the cluster that has not exited meets here; the writes
// before the arrive are visible to every thread after the wait.
__device__ __forceinline__ void cluster_arrive()
{
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait()
{
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
// The same shared-memory offset in the CTA of rank `rank`, and a 16-byte
// load from such an address (distributed shared memory).
__device__ __forceinline__ unsigned cluster_addr(unsigned a, unsigned rank)
{
    unsigned r;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ float4 ld_cluster_v4(unsigned a)
{
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(a)
                 : "memory");
    return v;
}

// Registers of this warpgroup from here on (the kernel starts with a cap:
// __launch_bounds__(384, 1)); the roles' counts sum to at most 64K.
template <int R>
__device__ __forceinline__ void regs_shrink()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_grow()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity)
{
    unsigned done;
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done != 0;
}

#define GEMSOPS_OPS_0_31                                             \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17," \
    "%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define GEMSOPS_OPS_0_63                                             \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17," \
    "%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,"   \
    "%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"   \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define GEMSOPS_OPS_64_127                                         \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78," \
    "%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93," \
    "%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,"  \
    "%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118," \
    "%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define GEMSOPS_OPS_64_95                                          \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78," \
    "%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93," \
    "%94,%95"
#define GEMSOPS_OPS_32_39 "%32,%33,%34,%35,%36,%37,%38,%39"
#define GEMSOPS_OPS_40_47 "%40,%41,%42,%43,%44,%45,%46,%47"
#define GEMSOPS_OPS_64_79                                          \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78," \
    "%79"
#define GEMSOPS_ACC8(i)                                         \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
        "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define GEMSOPS_ACC32(i)                                        \
    GEMSOPS_ACC8(i), GEMSOPS_ACC8(i + 8), GEMSOPS_ACC8(i + 16), \
        GEMSOPS_ACC8(i + 24)
#define GEMSOPS_ACC64(i)                                                  \
    GEMSOPS_ACC8(i), GEMSOPS_ACC8(i + 8), GEMSOPS_ACC8(i + 16),           \
        GEMSOPS_ACC8(i + 24), GEMSOPS_ACC8(i + 32), GEMSOPS_ACC8(i + 40), \
        GEMSOPS_ACC8(i + 48), GEMSOPS_ACC8(i + 56)
#define GEMSOPS_WGMMA_N64(TYPE)                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                 \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE  \
                 " {" GEMSOPS_OPS_0_31 "}, %32, %33, p, 1, 1, %35, %36;\n}\n" \
                 : GEMSOPS_ACC32(0)                                           \
                 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))
#define GEMSOPS_WGMMA_TF32_N64                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"          \
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32" \
                 " {" GEMSOPS_OPS_0_31 "}, %32, %33, p, 1, 1;\n}\n"    \
                 : GEMSOPS_ACC32(0)                                    \
                 : "l"(da), "l"(db), "r"(1))
#define GEMSOPS_WGMMA_N128(TYPE)                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                 \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE \
                 " {" GEMSOPS_OPS_0_63 "}, %64, %65, p, 1, 1, %67, %68;\n}\n" \
                 : GEMSOPS_ACC64(0)                                           \
                 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))
#define GEMSOPS_WGMMA_TF32_N128                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"           \
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32" \
                 " {" GEMSOPS_OPS_0_63 "}, %64, %65, p, 1, 1;\n}\n"     \
                 : GEMSOPS_ACC64(0)                                     \
                 : "l"(da), "l"(db), "r"(1))
#define GEMSOPS_WGMMA_TF32_N192                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"           \
                 "wgmma.mma_async.sync.aligned.m64n192k8.f32.tf32.tf32" \
                 " {" GEMSOPS_OPS_0_63 "," GEMSOPS_OPS_64_95            \
                 "}, %96, %97, p, 1, 1;\n}\n"                           \
                 : GEMSOPS_ACC64(0), GEMSOPS_ACC32(64)                  \
                 : "l"(da), "l"(db), "r"(1))
#define GEMSOPS_WGMMA_N192(TYPE)                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"                 \
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32." TYPE "." TYPE \
                 " {" GEMSOPS_OPS_0_63 "," GEMSOPS_OPS_64_95                  \
                 "}, %96, %97, p, 1, 1, %99, %100;\n}\n"                      \
                 : GEMSOPS_ACC64(0), GEMSOPS_ACC32(64)                        \
                 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))
// The widths of the swapped product's tiles (halves alone): 80, 96, 160
#define GEMSOPS_WGMMA_N80(TYPE)                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"                \
                 "wgmma.mma_async.sync.aligned.m64n80k16.f32." TYPE "." TYPE \
                 " {" GEMSOPS_OPS_0_31 "," GEMSOPS_OPS_32_39                 \
                 "}, %40, %41, p, 1, 1, %43, %44;\n}\n"                      \
                 : GEMSOPS_ACC32(0), GEMSOPS_ACC8(32)                        \
                 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))
#define GEMSOPS_WGMMA_N96(TYPE)                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"                 \
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32." TYPE "." TYPE  \
                 " {" GEMSOPS_OPS_0_31 "," GEMSOPS_OPS_32_39                  \
                 "," GEMSOPS_OPS_40_47 "}, %48, %49, p, 1, 1, %51, %52;\n}\n" \
                 : GEMSOPS_ACC32(0), GEMSOPS_ACC8(32), GEMSOPS_ACC8(40)       \
                 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))
#define GEMSOPS_WGMMA_N160(TYPE)                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"                 \
                 "wgmma.mma_async.sync.aligned.m64n160k16.f32." TYPE "." TYPE \
                 " {" GEMSOPS_OPS_0_63 "," GEMSOPS_OPS_64_79                  \
                 "}, %80, %81, p, 1, 1, %83, %84;\n}\n"                       \
                 : GEMSOPS_ACC64(0), GEMSOPS_ACC8(64), GEMSOPS_ACC8(72)       \
                 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))
#define GEMSOPS_WGMMA_TF32_N256                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"          \
                 "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32" \
                 " {" GEMSOPS_OPS_0_63 "," GEMSOPS_OPS_64_127           \
                 "}, %128, %129, p, 1, 1;\n}\n"                         \
                 : GEMSOPS_ACC64(0), GEMSOPS_ACC64(64)                  \
                 : "l"(da), "l"(db), "r"(1))
#define GEMSOPS_WGMMA_N256(TYPE)                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE \
                 " {" GEMSOPS_OPS_0_63 "," GEMSOPS_OPS_64_127                 \
                 "}, %128, %129, p, 1, 1, %131, %132;\n}\n"                   \
                 : GEMSOPS_ACC64(0), GEMSOPS_ACC64(64)                        \
                 : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))

// d (64 x N per warpgroup, fp32) += A (64 x k) * B (k x N) for the k of
// 32 bytes (16 halves, 8 fp32 read as TF32); TA / TB: the operand is
// MN-major in shared memory (halves only).
template <typename T, int N, int TA, int TB>
__device__ __forceinline__ void wgmma_m64k32bytes(float *d, uint64_t da,
                                                  uint64_t db)
{
    constexpr bool f16 = std::is_same_v<T, __half>;
    if constexpr (std::is_same_v<T, float>) {
        static_assert(TA == 0 && TB == 0, "TF32 operands are K-major");
        static_assert(N % 64 == 0, "TF32: widths of 64, 128, 192, 256");
        if constexpr (N == 64) {
            GEMSOPS_WGMMA_TF32_N64;
        }
        else if constexpr (N == 128) {
            GEMSOPS_WGMMA_TF32_N128;
        }
        else if constexpr (N == 192) {
            GEMSOPS_WGMMA_TF32_N192;
        }
        else {
            GEMSOPS_WGMMA_TF32_N256;
        }
    }
    else if constexpr (N == 80 && f16) {
        GEMSOPS_WGMMA_N80("f16");
    }
    else if constexpr (N == 80) {
        GEMSOPS_WGMMA_N80("bf16");
    }
    else if constexpr (N == 96 && f16) {
        GEMSOPS_WGMMA_N96("f16");
    }
    else if constexpr (N == 96) {
        GEMSOPS_WGMMA_N96("bf16");
    }
    else if constexpr (N == 160 && f16) {
        GEMSOPS_WGMMA_N160("f16");
    }
    else if constexpr (N == 160) {
        GEMSOPS_WGMMA_N160("bf16");
    }
    else if constexpr (N == 64 && f16) {
        GEMSOPS_WGMMA_N64("f16");
    }
    else if constexpr (N == 64) {
        GEMSOPS_WGMMA_N64("bf16");
    }
    else if constexpr (N == 128 && f16) {
        GEMSOPS_WGMMA_N128("f16");
    }
    else if constexpr (N == 128) {
        GEMSOPS_WGMMA_N128("bf16");
    }
    else if constexpr (N == 192 && f16) {
        GEMSOPS_WGMMA_N192("f16");
    }
    else if constexpr (N == 192) {
        GEMSOPS_WGMMA_N192("bf16");
    }
    else if constexpr (f16) {
        GEMSOPS_WGMMA_N256("f16");
    }
    else {
        GEMSOPS_WGMMA_N256("bf16");
    }
}
#undef GEMSOPS_WGMMA_N256
#undef GEMSOPS_WGMMA_N160
#undef GEMSOPS_WGMMA_N96
#undef GEMSOPS_WGMMA_N80
#undef GEMSOPS_WGMMA_N192
#undef GEMSOPS_WGMMA_N128
#undef GEMSOPS_WGMMA_TF32_N256
#undef GEMSOPS_WGMMA_TF32_N192
#undef GEMSOPS_WGMMA_TF32_N128
#undef GEMSOPS_WGMMA_TF32_N64
#undef GEMSOPS_WGMMA_N64
#undef GEMSOPS_ACC32
#undef GEMSOPS_OPS_0_31
#undef GEMSOPS_ACC64
#undef GEMSOPS_ACC8
#undef GEMSOPS_OPS_64_127
#undef GEMSOPS_OPS_64_95
#undef GEMSOPS_OPS_64_79
#undef GEMSOPS_OPS_40_47
#undef GEMSOPS_OPS_32_39
#undef GEMSOPS_OPS_0_63
#endif

// The consumers' own barrier (named barrier 1) over their N threads: the
// producer warpgroup never joins it.
template <int N>
__device__ __forceinline__ void consumers_sync()
{
    asm volatile("bar.sync 1, %0;" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ bool consumers_sync_or(bool v)
{
    unsigned r;
    asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\n"
                 "bar.red.or.pred q, 1, %2, p;\nselp.u32 %0, 1, 0, q;\n}\n"
                 : "=r"(r)
                 : "r"((unsigned)v), "n"(N)
                 : "memory");
    return r != 0;
}

// Pingpong's turns (two consumer warpgroups, 256 threads a barrier):
// warpgroup g waits at named barrier 4 + g until the other has arrived
// there.
__device__ __forceinline__ void team_turn_wait(unsigned g)
{
    asm volatile("bar.sync %0, 256;" ::"r"(4 + g) : "memory");
}
__device__ __forceinline__ void team_turn_pass(unsigned g)
{
    asm volatile("bar.arrive %0, 256;" ::"r"(4 + (g ^ 1)) : "memory");
}

// A load from a shared-memory address (the epilogue's slices).
template <typename B> // uint16_t or uint32_t
__device__ __forceinline__ B ld_shared_bits(unsigned a)
{
    if constexpr (sizeof(B) == 2) {
        unsigned short v;
        asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a) : "memory");
        return v;
    }
    else {
        unsigned v;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
        return v;
    }
}

} // namespace gemsops
