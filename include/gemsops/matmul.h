/* Stream-K matrix multiply: C[b] = A[b] . B[b] for every batch b, or with
 * the epilogue C[b] = alpha * A[b] . B[b] + beta * bias[b] (addmm's:
 * the fp32 accumulator scaled and the addend added before the one
 * rounding, as cuBLAS does it).
 *
 * A is [batch, m, k], B [batch, k, n], C [batch, m, n] (contiguous rows,
 * written whole); A and B take any strides (a zero batch stride broadcasts)
 * and are read in place. Accumulation in fp32; C rounded once. The schedule
 * (which CTA computes what) is include/gemsops/streamk.h; the fix-up of
 * tiles split across CTAs is deterministic (see there). Validated at the
 * Python boundary (csrc/py_matmul.c). */
#pragma once

#include "gemsops/status.h"
#include "gemsops/streamk.h"
#include "gemsops/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which CUDA mainloop computes a tile: AUTO picks the fastest the device
 * and the operands allow; the others cap the choice (tests and benchmarks):
 * a mainloop that cannot take the operands (alignment, layout, dtype, GPU)
 * falls back to the next one down, FFMA taking everything. fp32 takes
 * FFMA (exact) or, with allow_tf32, wgmma as TF32. */
typedef enum gemsops_mainloop {
    GEMSOPS_MAINLOOP_AUTO = 0,
    GEMSOPS_MAINLOOP_FFMA = 1, /* exact fp32 FMA, any layout          */
    GEMSOPS_MAINLOOP_MMA = 2, /* mma.sync, sm_80+, fp16/bf16         */
    GEMSOPS_MAINLOOP_WGMMA_128 = 3, /* wgmma 128 x 128 tiles, sm_90a       */
    GEMSOPS_MAINLOOP_WGMMA_256 = 4, /* wgmma 128 x 256 tiles, sm_90a       */
    GEMSOPS_MAINLOOP_WGMMA_64 = 5, /* wgmma 128 x 64 tiles, sm_90a        */
    GEMSOPS_MAINLOOP_WGMMA_192 = 6, /* wgmma 128 x 192 tiles, sm_90a       */
    /* (every value from WGMMA_128 up, SKINNY aside, is a wgmma width)   */
    GEMSOPS_MAINLOOP_SKINNY = 7, /* m <= 16 rows against an N-contiguous */
    /* B (matmul_skinny.cu) whatever their size; AUTO takes it for fp32  */
    /* and for halves with a large B, FFMA for fp32 (exact too); else    */
    /* it means AUTO. Schedule and grid must be left automatic.          */
    GEMSOPS_MAINLOOP_WGMMA_64X64 = 8, /* wgmma 64 x 64 tiles, sm_90a:    */
    /* one consumer warpgroup                                           */
    GEMSOPS_MAINLOOP_WGMMA_192X192 = 9, /* wgmma 192 x 192 tiles, sm_90a: */
    /* three consumer warpgroups                                        */
    GEMSOPS_MAINLOOP_WGMMA_PINGPONG = 10, /* wgmma 128 x 128 tiles whole, */
    /* sm_90a, halves: each consumer warpgroup a tile of its own, one's  */
    /* epilogue under the other's mainloop; fp32 and A's row sums take   */
    /* WGMMA_128                                                        */
    /* Tiles of 80, 96 or 160 rows x 128 columns of C, or 80 or 96 rows x */
    /* 64 columns, computed as the swapped product C^T = B^T A^T         */
    /* (sm_90a): halves, A K-contiguous, B N-contiguous, C's rows        */
    /* 16-byte aligned, no bias, alpha 1, no row sums; other products    */
    /* take WGMMA_128. Their schedule (bm, bn, the tiles) is of C^T: bm  */
    /* 128 or 64, bn 80, 96 or 160.                                      */
    GEMSOPS_MAINLOOP_WGMMA_80X128 = 11,
    GEMSOPS_MAINLOOP_WGMMA_96X128 = 12,
    GEMSOPS_MAINLOOP_WGMMA_160X128 = 13,
    GEMSOPS_MAINLOOP_WGMMA_80X64 = 14,
    GEMSOPS_MAINLOOP_WGMMA_96X64 = 15
} gemsops_mainloop;

struct gemsops_matmul_params {
    const void *a, *b; /* inputs, dtype `dtype`                      */
    void *c; /* output [batch, m, n], contiguous           */
    int64_t batch, m, n, k;
    int64_t a_bs, a_rs, a_cs; /* A strides: batch, row (m), column (k)     */
    int64_t b_bs, b_rs, b_cs; /* B strides: batch, row (k), column (n)     */
    gemsops_dtype dtype; /* fp16, bf16 or fp32                         */
    int allow_tf32; /* fp32 may run as TF32 (wgmma, sm_90a); the  */
    /* boundary sets it from the mainloop cap     */
    gemsops_sk_mode mode; /* schedule: auto, or forced for tests        */
    gemsops_mainloop mainloop; /* CUDA: the most capable mainloop allowed  */
    int two_tiles; /* hybrid: one more wave joins Stream-K       */
    int64_t ctas_override; /* >0: use this many CTAs (tests), else device */
    void *workspace; /* CUDA: staged operands, fp32 partial tiles */
    int64_t workspace_bytes;
    unsigned *flags; /* CUDA: one per CTA, persistent; see epoch   */
    int64_t flag_count;
    unsigned epoch; /* this launch's flag value: the flags never  */
    /* need resetting (no memset launch); != 0    */
    int flags_known; /* no flag holds `epoch` (the boundary vouches:*/
    /* csrc/kept.c); 0: the launch zeroes them    */
    int64_t spin_limit; /* >0: a wait longer than this many polls     */
    /* fails (debug) instead of hanging           */
    int *error; /* CUDA: set to 1 when spin_limit tripped     */
    const void *bias; /* NULL, or the addend, dtype `dtype`          */
    int64_t bias_bs, bias_rs, bias_cs; /* its strides over [batch, m, n]: 0
                                 broadcasts (a bias vector: 0, 0, 1)      */
    float alpha, beta; /* the epilogue's scales (alpha also without   */
    /* a bias); the boundary sets 1, 1 by default */
    void *row_sums; /* NULL, or [m] of `dtype` (batch 1): the sums  */
    /* over k of A's rows, fp32 rounded once      */
    int device_id;
    void *stream;
};

/* What a launch takes beyond the operands when it splits tiles (Stream-K)
 * or stages operands: the caller's workspace (bytes) and flags (count),
 * kept per stream by the caller. */
struct gemsops_matmul_need {
    int64_t workspace_bytes;
    int64_t flags;
};

/* The schedule the launch will use (tile shape, grid, regions), the
 * mainloop it runs (*mainloop) and the operands it first copies into its
 * workspace for TMA (*staged: 1 for A, 2 for B; csrc/cuda/matmul_stage.cuh). */
int gemsops_matmul_plan_cuda(const struct gemsops_matmul_params *p,
                             struct gemsops_sk_schedule *s,
                             gemsops_mainloop *mainloop, int *staged,
                             gemsops_status *st);
/* Launches C = A.B. A schedule that splits tiles (Stream-K) needs a
 * workspace and flags (so does one staging an operand): when p->flags is
 * NULL it launches nothing and sets *need (zeros otherwise), so a caller
 * allocates them only when used. */
/* Launches whose operands TMA was asked to describe and the driver
 * refused (CUDA_ERROR_INVALID_VALUE): they ran the mma mainloop instead. */
long long gemsops_tma_refusals(void);
int gemsops_matmul_cuda(const struct gemsops_matmul_params *p,
                        struct gemsops_matmul_need *need, gemsops_status *st);
int gemsops_matmul_cpu(const struct gemsops_matmul_params *p,
                       gemsops_status *st);
int gemsops_matmul_plan_cpu(const struct gemsops_matmul_params *p,
                            struct gemsops_sk_schedule *s, gemsops_status *st);

/* Checks a schedule: every (tile, k-iteration) computed exactly once, the
 * grouped tile order a bijection, one owner per Stream-K tile (the CTA
 * holding its last k-iteration) whose peers precede it in CTA order, each
 * CTA a peer of at most one tile. Returns 0,
 * or fails with a message naming the first violation. */
int gemsops_sk_check(const struct gemsops_sk_schedule *s, gemsops_status *st);

#ifdef __cplusplus
}
#endif
