// Staged operands of the wgmma mainloop: a copy TMA can describe.
//
// TMA reads an operand through a tensor map, which needs a 16-byte aligned
// base and row (and batch) strides that are positive multiples of 16 bytes;
// the extents themselves may be anything, since the boxes are filled with
// zeros past the edges. A contiguous [m, k] matrix with k = 71, a view that
// starts at an odd element, or an operand with no unit stride has no such
// description. Rather than leave those to the mma.sync or FFMA mainloops,
// the launch copies the operand into its workspace once, with the rows
// padded to a multiple of 8 elements, and the tensor map describes the
// copy with the operand's true extents (the padding is never read).
//
// Bytes: the operand read and written once more, against a product that
// reads it tiles_n (A) or tiles_m (B) times: small beside the mainloop it
// makes possible, and the copy of both operands is one launch.
//
// The copy keeps the operand's unit-stride direction, so that reads and
// writes are both coalesced; an operand without one (a stride-0 broadcast,
// a strided slice) is staged K-contiguous. A batch the operand broadcasts
// (batch stride 0) is staged once. TF32 wgmma reads K-major operands only:
// an fp32 operand is staged K-contiguous whatever its layout, and one whose
// unit stride runs across the copy's lines is transposed through shared
// memory in 64 x 64 tiles (reads and writes coalesced again).
// Its cost: 8 bytes an element moved, where the product spends 2 x (the
// other extent) FLOP on each, so it weighs most when that extent is small.
#pragma once

#include <stdint.h>

namespace gemsops {

// One operand [batch][rows][cols] of 2- or 4-byte elements as given, and
// its staged copy: `lines` rows of `ld` elements (by_rows: a line is one of
// the operand's rows, else one of its columns), batch after batch.
struct staged_operand {
    const void *src;
    int64_t bs, rs, cs; // the source's strides (elements)
    int64_t batch, rows, cols; // batch is 1 for a broadcast operand
    int esize; // bytes an element: 2 or 4
    bool by_rows; // the copy is row-major (else column-major)
    bool transpose; // the source's unit stride runs across the lines
    int64_t ld; // the copy's line stride (elements), 16-byte multiple
    void *dst; // the copy, 16-byte aligned

    __host__ __device__ int64_t lines() const
    {
        return by_rows ? rows : cols;
    }
    __host__ __device__ int64_t line_len() const
    {
        return by_rows ? cols : rows;
    }
    // the copy's size, a multiple of 16 bytes
    int64_t bytes() const
    {
        return batch * lines() * ld * esize;
    }
    // the copy's strides over [batch][rows][cols] (elements)
    int64_t staged_bs() const
    {
        return batch == 1 ? 0 : lines() * ld;
    }
    int64_t staged_rs() const
    {
        return by_rows ? ld : 1;
    }
    int64_t staged_cs() const
    {
        return by_rows ? 1 : ld;
    }
};

// An operand seen as [batch][rows][cols] with strides (bs, rs, cs), to be
// staged; k_rows: the K extent runs along the rows (B), else along the
// columns (A): the direction an operand without a unit stride keeps, and
// every fp32 operand (k_major: TF32).
inline staged_operand stage_plan(const void *src, int esize, int64_t batch,
                                 int64_t bs, int64_t rows, int64_t rs,
                                 int64_t cols, int64_t cs, bool k_rows,
                                 bool k_major)
{
    staged_operand o{};
    o.src = src;
    o.esize = esize;
    o.bs = bs;
    o.rs = rs;
    o.cs = cs;
    o.batch = bs == 0 ? 1 : batch;
    o.rows = rows;
    o.cols = cols;
    if (k_major) {
        o.by_rows = !k_rows;
    }
    else if (cs == 1 && cols > 1) {
        o.by_rows = true;
    }
    else if (rs == 1 && rows > 1) {
        o.by_rows = false;
    }
    else {
        o.by_rows = !k_rows; // K-contiguous
    }
    const int64_t along = o.by_rows ? cs : rs, across = o.by_rows ? rs : cs;
    o.transpose = along != 1 && across == 1 && o.lines() > 1;
    const int64_t unit = 16 / esize;
    o.ld = (o.line_len() + unit - 1) / unit * unit;
    return o;
}

// Parameters of one staging launch: up to two operands, one per grid row.
struct stage_args {
    staged_operand op[2];
};

// Line copy: a block copies chunks of kStageChunk elements of one line,
// each thread kStageUnroll of them, all loads issued before the stores: a
// line of a few thousand elements is many chunks on many SMs, not one
// block waiting on one DRAM round trip after another. Consecutive threads
// touch consecutive elements of the source (when its unit stride runs
// along the line) and of the copy.
constexpr int kStageThreads = 256, kStageUnroll = 4;
constexpr int kStageChunk = kStageThreads * kStageUnroll;
// Transposing copy: tiles of 64 lines x 64 elements, 16 loads a thread in
// flight before the tile is written back; a warp reads 32 neighbouring
// lines (the source's unit stride) and writes 32 neighbouring elements of
// one line.
constexpr int kStageTile = 64;
template <typename E>
__device__ void stage_lines(const staged_operand &o)
{
    const int64_t lines = o.lines(), len = o.line_len();
    const int64_t chunks = (len + kStageChunk - 1) / kStageChunk;
    const int64_t along = o.by_rows ? o.cs : o.rs;
    const int64_t across = o.by_rows ? o.rs : o.cs;
    const E *src0 = static_cast<const E *>(o.src);
    E *dst0 = static_cast<E *>(o.dst);
    for (int64_t item = blockIdx.x; item < o.batch * lines * chunks;
         item += gridDim.x) {
        const int64_t l = item / chunks;
        const int64_t x0 = item % chunks * kStageChunk + threadIdx.x;
        const E *src = src0 + l / lines * o.bs + l % lines * across;
        E *dst = dst0 + l * o.ld;
        E v[kStageUnroll];
#pragma unroll
        for (int u = 0; u < kStageUnroll; u++) {
            const int64_t x = x0 + u * kStageThreads;
            v[u] = x < len ? __ldg(src + x * along) : E(0);
        }
#pragma unroll
        for (int u = 0; u < kStageUnroll; u++) {
            const int64_t x = x0 + u * kStageThreads;
            if (x < len) {
                dst[x] = v[u];
            }
        }
    }
}

template <typename E>
__device__ void stage_transposed(const staged_operand &o)
{
    constexpr int kRows = kStageThreads / 32; // warps
    constexpr int kPer = kStageTile * kStageTile / kStageThreads;
    __shared__ E tile[kStageTile][kStageTile + 1]; // [x][line]
    const int64_t lines = o.lines(), len = o.line_len();
    const int64_t tl = (lines + kStageTile - 1) / kStageTile;
    const int64_t tx = (len + kStageTile - 1) / kStageTile;
    const int64_t along = o.by_rows ? o.cs : o.rs; // across is 1
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const E *src0 = static_cast<const E *>(o.src);
    E *dst0 = static_cast<E *>(o.dst);
    for (int64_t item = blockIdx.x; item < o.batch * tl * tx;
         item += gridDim.x) {
        const int64_t bt = item / (tl * tx);
        const int64_t l0 = item / tx % tl * kStageTile;
        const int64_t x0 = item % tx * kStageTile;
        const E *src = src0 + bt * o.bs;
        E *dst = dst0 + bt * lines * o.ld;
        E v[kPer];
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            const int li = (j % 2) * 32 + lane, xi = warp + (j / 2) * kRows;
            const int64_t l = l0 + li, x = x0 + xi;
            v[j] = x < len && l < lines ? __ldg(src + l + x * along) : E(0);
        }
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            tile[warp + (j / 2) * kRows][(j % 2) * 32 + lane] = v[j];
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            const int li = warp + (j / 2) * kRows, xi = (j % 2) * 32 + lane;
            const int64_t l = l0 + li, x = x0 + xi;
            if (x < len && l < lines) {
                dst[l * o.ld + x] = tile[xi][li];
            }
        }
        __syncthreads(); // the tile is rewritten by the next item
    }
}

// Block y stages operand y (both of one element type).
template <typename E>
__global__ void __launch_bounds__(kStageThreads)
    matmul_stage_kernel(stage_args a)
{
    const staged_operand &o = a.op[blockIdx.y];
    if constexpr (sizeof(E) == 4) { // only TF32 operands are transposed
        if (o.transpose) {
            stage_transposed<E>(o);
            return;
        }
    }
    stage_lines<E>(o);
}

// The launch's work items (line chunks or tiles) of one operand.
inline int64_t stage_items(const staged_operand &o)
{
    if (o.transpose) {
        return o.batch * ((o.lines() + kStageTile - 1) / kStageTile) *
               ((o.line_len() + kStageTile - 1) / kStageTile);
    }
    return o.batch * o.lines() *
           ((o.line_len() + kStageChunk - 1) / kStageChunk);
}

} // namespace gemsops
