// A's row sums beside a product (matmul_row_sums.cu), for the launches
// whose kernel does not make them (matmul_streamk.cu).
#pragma once

#include "gemsops/matmul.h"
#include "gemsops/status.h"

namespace gemsops {

// p->row_sums[i] = sum over k of A[i, k] (batch 1, p->dtype), on p's
// stream; an error status for a dtype the kernels do not take.
int matmul_row_sums(const gemsops_matmul_params *p, gemsops_status *st);

} // namespace gemsops
