// Products of at most 16 rows against an N-contiguous B (matmul_skinny.cu):
// the planner's answer for C = A . B when the output has too few rows for
// a 128-row tensor-core tile to do more than read B. The Stream-K launcher
// (matmul_streamk.cu) asks plan_skinny first and hands such products over.
#pragma once

#include "device.cuh"
#include "gemsops/matmul.h"

namespace gemsops {

struct skinny_plan {
    int rows; // the kernel's rows: 4, 8 or 16 (>= m)
    int cols; // columns a CTA: its strip of C
    int k_chunk; // k of A a CTA stages at a time
    int64_t strips; // strips of C a batch: ceil(n / cols)
    int64_t splits; // k cut into this many ranges, one a CTA (1: none)
    int64_t ctas; // batch * strips * splits; 0: the kernel does not apply
    int64_t workspace_bytes; // splits > 1: the partials [batch][splits][m][n]
    int64_t flags; // splits > 1: two a strip (one 8-byte count)
};

// Whether the skinny kernel takes p (sp->ctas > 0) and how: p asks for
// the automatic choice (mainloop, schedule, grid), m <= 16, B's columns
// unit-stride in whole aligned vectors, no row sums.
int plan_skinny(const gemsops_matmul_params *p, const device_facts &f,
                skinny_plan *sp, gemsops_status *st);

// Launches a plan of plan_skinny, or sets *need when it splits k and the
// caller's workspace or flags fall short (the Stream-K launch's protocol).
int launch_skinny(const gemsops_matmul_params *p, const device_facts &f,
                  const skinny_plan &sp, gemsops_matmul_need *need,
                  gemsops_status *st);

// The plan as a schedule for matmul_plan: a tile is a strip (bm = rows, bn
// = cols, bk = k_chunk), split = splits when k is cut.
void skinny_schedule(const gemsops_matmul_params *p, const skinny_plan &sp,
                     gemsops_sk_schedule *s);

} // namespace gemsops
