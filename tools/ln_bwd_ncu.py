"""One LayerNorm backward case, run a few times, for Nsight Compute to
profile (the kernel `layer_norm_bwd_fused_atomic`); prints the median time
of the case as well (CUDA events after a read-only L2 flush).

usage: python -m tools.ln_bwd_ncu M N dtype [reps [grads]]
  dtype: float16, bfloat16, float32; grads: the gradients computed, some
  of x, w, b (default xwb)"""

import sys


def main(argv):
    import torch

    import gemsops
    from gemsops.ops.layer_norm import layer_norm_backward

    m, n = int(argv[0]), int(argv[1])
    dtype = getattr(torch, argv[2])
    reps = int(argv[3]) if len(argv) > 3 else 3
    grads = argv[4] if len(argv) > 4 else "xwb"
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
    print(
        f"{m}x{n} {argv[2]} {grads}: {t:.1f} us, "
        f"{3 * x.numel() * x.element_size() / t / 1e3:.0f} GB/s"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
