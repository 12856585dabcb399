"""Sector counts of three kernels that move the same bytes, for Nsight
Compute (`ncu --metrics ... python tools/l2_probe.py M N dtype`): torch's
add (read 2, write 1), the gemsops LayerNorm forward (read 1, write 1) and
backward (read 2, write 1). Each runs once after a warm-up; the warm-up
launches come first, so `--launch-skip` is not needed: compare the last
kernel of each name."""
import sys

import torch

import gemsops
from gemsops.ops.layer_norm import layer_norm_backward

m, n = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (16384, 4096)
dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.bfloat16
x = torch.randn(m, n, dtype=dtype, device="cuda")
dy = torch.randn_like(x)
out = torch.empty_like(x)
w = torch.randn(n, dtype=dtype, device="cuda")
b = torch.randn(n, dtype=dtype, device="cuda")
_, mean, rstd = gemsops.native_layer_norm(x, (n,), w, b)
for _ in range(2):
    torch.add(x, dy, out=out)
    gemsops.layer_norm(x, (n,), w, b)
    layer_norm_backward(dy, x, (n,), mean, rstd, w, b)
torch.cuda.synchronize()
