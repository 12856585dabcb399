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
// (batch stride 0) is staged once.
#pragma once

#include <stdint.h>

namespace gemsops {

// One operand [batch][rows][cols] of 2-byte elements as given, and its
// staged copy: `lines` rows of `ld` elements (by_rows: a line is one of
// the operand's rows, else one of its columns), batch after batch.
struct staged_operand {
    const uint16_t *src;
    int64_t bs, rs, cs; // the source's strides (elements)
    int64_t batch, rows, cols; // batch is 1 for a broadcast operand
    bool by_rows; // the copy is row-major (else column-major)
    int64_t ld; // the copy's line stride (elements), a multiple of 8
    uint16_t *dst; // the copy, 16-byte aligned

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
        return batch * lines() * ld * 2;
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
// columns (A): the direction an operand without a unit stride keeps.
inline staged_operand stage_plan(const void *src, int64_t batch, int64_t bs,
                                 int64_t rows, int64_t rs, int64_t cols,
                                 int64_t cs, bool k_rows)
{
    staged_operand o{};
    o.src = static_cast<const uint16_t *>(src);
    o.bs = bs;
    o.rs = rs;
    o.cs = cs;
    o.batch = bs == 0 ? 1 : batch;
    o.rows = rows;
    o.cols = cols;
    if (cs == 1 && cols > 1) {
        o.by_rows = true;
    }
    else if (rs == 1 && rows > 1) {
        o.by_rows = false;
    }
    else {
        o.by_rows = !k_rows; // K-contiguous
    }
    o.ld = (o.line_len() + 7) / 8 * 8;
    return o;
}

// Parameters of one staging launch: up to two operands, one per grid row.
struct stage_args {
    staged_operand op[2];
};

// A block copies chunks of kStageChunk elements of one line, each thread
// kStageUnroll of them, all loads issued before the stores: a line of a
// few thousand elements is many chunks on many SMs, not one block waiting
// on one DRAM round trip after another. Consecutive threads touch
// consecutive elements of the source (its unit stride runs along the
// line) and of the copy. Block y copies operand y.
constexpr int kStageThreads = 256, kStageUnroll = 4;
constexpr int kStageChunk = kStageThreads * kStageUnroll;

__global__ void __launch_bounds__(kStageThreads)
    matmul_stage_kernel(stage_args a)
{
    const staged_operand &o = a.op[blockIdx.y];
    const int64_t lines = o.lines(), len = o.line_len();
    const int64_t chunks = (len + kStageChunk - 1) / kStageChunk;
    const int64_t along = o.by_rows ? o.cs : o.rs;
    const int64_t across = o.by_rows ? o.rs : o.cs;
    for (int64_t item = blockIdx.x; item < o.batch * lines * chunks;
         item += gridDim.x) {
        const int64_t l = item / chunks;
        const int64_t x0 = item % chunks * kStageChunk + threadIdx.x;
        const uint16_t *src = o.src + l / lines * o.bs + l % lines * across;
        uint16_t *dst = o.dst + l * o.ld;
        uint16_t v[kStageUnroll];
#pragma unroll
        for (int u = 0; u < kStageUnroll; u++) {
            const int64_t x = x0 + u * kStageThreads;
            v[u] = x < len ? __ldg(src + x * along) : 0;
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

// The launch's work items (line chunks) of one operand.
inline int64_t stage_items(const staged_operand &o)
{
    return o.batch * o.lines() *
           ((o.line_len() + kStageChunk - 1) / kStageChunk);
}

} // namespace gemsops
