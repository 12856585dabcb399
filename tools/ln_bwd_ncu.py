"""One LayerNorm backward case, run a few times, for Nsight Compute to
profile (the kernel `layer_norm_bwd_fused_atomic`). usage:
python tools/ln_bwd_ncu.py M N dtype [reps [grads]]  (dtype: float16,
bfloat16, float32; grads: the gradients computed, some of x, w, b, default
xwb). Prints the median time of the case as well."""
import sys

import torch

import gemsops
from gemsops.ops.layer_norm import layer_norm_backward

m, n = int(sys.argv[1]), int(sys.argv[2])
dtype = getattr(torch, sys.argv[3])
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
grads = sys.argv[5] if len(sys.argv) > 5 else "xwb"
mask = tuple(g in grads for g in "xwb")
x = torch.randn(m, n, dtype=dtype, device="cuda")
w = torch.randn(n, dtype=dtype, device="cuda")
b = torch.randn(n, dtype=dtype, device="cuda")
dy = torch.randn(m, n, dtype=dtype, device="cuda")
_, mean, rstd = gemsops.native_layer_norm(x, (n,), w, b)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
times = []
for _ in range(reps):
    flush.sum(dtype=torch.int32)  # read-only L2 flush
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    layer_norm_backward(dy, x, (n,), mean, rstd, w, b, output_mask=mask)
    e.record()
    torch.cuda.synchronize()
    times.append(s.elapsed_time(e) * 1e3)
t = sorted(times)[len(times) // 2]
print(f"{m}x{n} {sys.argv[3]} {grads}: {t:.1f} us, "
      f"{3 * x.numel() * x.element_size() / t / 1e3:.0f} GB/s")
