// Copies into shared memory that run beside the threads: cp.async (sm_80;
// per thread, ordered by wait_group) and the copy engine's bulk copies
// (sm_90; ordered by an mbarrier's transaction count).
#pragma once

#include <stdint.h>

namespace gemsops {

// cp.async: global -> shared copies that bypass registers, so a thread can
// keep several rows or tiles in flight while it computes. 16-byte copies
// skip L1 (.cg); `valid` false zero-fills the destination. The "memory"
// clobbers keep ordinary shared-memory reads of a landed stage after the
// wait and before the copy that refills it.
__device__ __forceinline__ void cp_async16(unsigned smem, const void *gmem,
                                           bool valid = true)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem),
                 "l"(gmem), "r"(valid ? 16 : 0)
                 : "memory");
}

// The same 16 bytes through L1 (.ca). Where a warp's 32 copies cover 512
// contiguous bytes, .cg sends each thread's 16 bytes to L2 on its own, so
// L2 serves every 32-byte sector twice (ncu: twice the read sectors the
// data has, and L2 as busy as DRAM). Through L1 the copies of a warp are
// coalesced into whole sectors (docs/performance.md).
__device__ __forceinline__ void cp_async16_ca(unsigned smem, const void *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(smem),
                 "l"(gmem)
                 : "memory");
}

// 4- or 8-byte copy through L1 (.ca: the only mode for small sizes).
template <int BYTES>
__device__ __forceinline__ void cp_async_small(unsigned smem, const void *gmem)
{
    static_assert(BYTES == 4 || BYTES == 8, "cp.async.ca takes 4 or 8 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem),
                 "l"(gmem), "n"(BYTES)
                 : "memory");
}

// 4, 8 or 16 bytes through L1 of which the first `src_bytes` are read and
// the rest zero-filled (nothing read when 0: gmem need only be a valid
// address then).
template <int BYTES>
__device__ __forceinline__ void cp_async_zfill(unsigned smem, const void *gmem,
                                               unsigned src_bytes)
{
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "4, 8 or 16");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(smem),
                 "l"(gmem), "n"(BYTES), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

// mbarriers (sm_90): a shared-memory barrier whose phase completes once
// `count` threads have arrived and the bytes a transaction expects have
// landed. Used with the copy engine (TMA, bulk copies), whose writes to
// shared memory are visible to a thread once its wait on the phase returns.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar),
                 "r"(count)
                 : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA).
__device__ __forceinline__ void mbar_init_fence()
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::
                     "r"(bar),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    asm volatile("{\n.reg .pred done;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
// Arrive on `bar` (release: this thread's shared-memory reads before it
// are done before the phase completes, so a producer may then overwrite).
__device__ __forceinline__ void mbar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar)
                 : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global
// to shared memory by the copy engine, counted toward `bar`'s transaction;
// `policy` is an L2 cache policy (createpolicy; l2_policy.cuh).
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src,
                                          unsigned bytes, unsigned bar,
                                          uint64_t policy)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx"
                 "::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar), "l"(policy)
                 : "memory");
}

} // namespace gemsops
