// How a prod launch sees its input: host-side planning shared by
// prod_fwd.cu and prod_bwd.cu.
//
// Every per-dim product is one of three layouts after the kept dims are
// coalesced (size-1 dims dropped, neighbours whose strides chain merged):
//
//   rows:    out[o]    = prod_r x[o * outer_stride + r]            (step 1)
//   cols:    out[o, i] = prod_r x[o * outer_stride + r * step + i] (i unit)
//   generic: anything else: one thread per output walks its line.
//
// A full product of a dense tensor (any permutation of a contiguous block)
// is one row over the storage: the product does not care about order. A
// full product of a non-dense tensor multiplies its lines along its
// smallest nonzero stride into a workspace, then multiplies those.
#pragma once

#include "common.cuh"
#include "gemsops/prod.h"

namespace gemsops {

constexpr int kProdBlock = 256;

enum class prod_kind { rows, cols, generic };

struct prod_layout {
    prod_kind kind;
    int64_t outer, outer_stride; // O lines (rows) or column groups (cols)
    int64_t len, step; // R: the reduced extent, and its stride
    int64_t inner; // I: unit-stride columns (cols), else 1
    int kept_ndim; // generic: the kept dims, coalesced
    int64_t kept_sizes[GEMSOPS_MAX_DIMS], kept_strides[GEMSOPS_MAX_DIMS];
    bool full_lines; // generic full product: lines -> combine
};

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

inline int64_t pow2_ceil(int64_t v)
{
    int64_t p = 1;
    while (p < v) {
        p *= 2;
    }
    return p;
}

// A permutation of one contiguous block: strides sorted ascending chain
// from 1 (size-1 dims ignored). Zero strides (expanded dims) are not.
inline bool prod_is_dense(const gemsops_tensor *x)
{
    int64_t size[GEMSOPS_MAX_DIMS], stride[GEMSOPS_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (x->sizes[d] != 1) {
            size[n] = x->sizes[d];
            stride[n++] = x->strides[d];
        }
    }
    for (int a = 1; a < n; a++) { // insertion sort by stride
        for (int b = a; b > 0 && stride[b] < stride[b - 1]; b--) {
            int64_t t = stride[b];
            stride[b] = stride[b - 1];
            stride[b - 1] = t;
            t = size[b];
            size[b] = size[b - 1];
            size[b - 1] = t;
        }
    }
    int64_t want = 1;
    for (int k = 0; k < n; k++) {
        if (stride[k] != want) {
            return false;
        }
        want *= size[k];
    }
    return true;
}

// The lines of a non-dense full product run along the dim of smallest
// nonzero stride (memory order, as torch walks it), never along an
// expanded dim: a line of one repeated factor is that factor to the power
// of the line's length, and multiplying such powers together overflows
// fp32 long before the product itself does.
inline int prod_line_dim(const gemsops_tensor *x)
{
    int best = x->ndim - 1;
    int64_t best_stride = INT64_MAX;
    for (int d = 0; d < x->ndim; d++) {
        const int64_t s = x->strides[d] < 0 ? -x->strides[d] : x->strides[d];
        if (x->sizes[d] > 1 && s != 0 && s < best_stride) {
            best = d;
            best_stride = s;
        }
    }
    return best;
}

inline prod_layout prod_layout_of(const gemsops_tensor *x, int dim)
{
    prod_layout l{};
    l.outer = 1;
    l.inner = 1;
    const int64_t numel = gemsops_tensor_numel(x);
    if (dim < 0 && (numel == 0 || prod_is_dense(x))) {
        l.kind = numel == 0 ? prod_kind::generic : prod_kind::rows;
        l.len = numel;
        l.step = 1;
        return l;
    }
    if (dim < 0) { // not dense: lines, then combine
        dim = prod_line_dim(x);
        l.full_lines = true;
    }
    l.len = x->sizes[dim];
    l.step = x->strides[dim];
    for (int d = 0; d < x->ndim; d++) {
        if (d == dim || x->sizes[d] == 1) {
            continue;
        }
        const int k = l.kept_ndim;
        if (k > 0 && l.kept_strides[k - 1] == x->strides[d] * x->sizes[d]) {
            l.kept_sizes[k - 1] *= x->sizes[d]; // chains with the previous
            l.kept_strides[k - 1] = x->strides[d];
            continue;
        }
        l.kept_sizes[k] = x->sizes[d];
        l.kept_strides[k] = x->strides[d];
        l.kept_ndim++;
    }
    const int n = l.kept_ndim;
    l.kind = prod_kind::generic;
    if (l.full_lines || l.len <= 1 || numel == 0) {
        return l; // generic: copies, ones for an empty dim, no outputs
    }
    if (n >= 1 && n <= 2 && l.kept_strides[n - 1] == 1) {
        l.kind = prod_kind::cols;
        l.inner = l.kept_sizes[n - 1];
        l.outer = n == 2 ? l.kept_sizes[0] : 1;
        l.outer_stride = n == 2 ? l.kept_strides[0] : 0;
    }
    else if (n <= 1 && l.step == 1) {
        l.kind = prod_kind::rows;
        l.outer = n == 1 ? l.kept_sizes[0] : 1;
        l.outer_stride = n == 1 ? l.kept_strides[0] : 0;
    }
    return l;
}

// Lines of the generic layout (the output count, or the line count that a
// full product then combines).
inline int64_t prod_generic_lines(const prod_layout &l)
{
    int64_t n = 1;
    for (int k = 0; k < l.kept_ndim; k++) {
        n *= l.kept_sizes[k];
    }
    return n;
}

// Rows: G threads per row (a power of two up to the CTA), 256/G rows per
// CTA; a row longer than the CTA can stream alone splits over `splits`
// CTAs of `seg` vectors each.
struct prod_rows_shape {
    int G;
    int64_t splits, seg;
};

// Cols: TX threads across a row's vectors of columns, 256/TX down the
// reduced dim; `splits` CTAs share a column block, `rchunk` rows each.
struct prod_cols_shape {
    int tx;
    int64_t ivecs, iblocks, splits, rchunk;
};

inline prod_cols_shape prod_cols_base(const prod_layout &l, int V)
{
    prod_cols_shape c{};
    c.ivecs = ceil_div(l.inner, V);
    c.tx = (int)(pow2_ceil(c.ivecs) < 32 ? pow2_ceil(c.ivecs) : 32);
    c.iblocks = ceil_div(c.ivecs, c.tx);
    return c;
}

} // namespace gemsops
