"""Exactness probe for the prod kernels: ones with powers of two at random
places (products exact in fp32), so a lost or repeated element shows as a
wrong power of two. usage: prod_exact.py"""
import torch

import gemsops

g = torch.Generator(device="cuda").manual_seed(0)
bad = 0
for n in (1 << 20, 1 << 22, 3 << 20, 1000003, 1 << 25):
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.ones(n, device="cuda", dtype=dt)
        idx = torch.randint(0, n, (64,), device="cuda", generator=g).unique()
        x[idx[: len(idx) // 2]] = 2.0
        x[idx[len(idx) // 2:]] = 0.5
        want = 2.0 ** (len(idx) // 2 - (len(idx) - len(idx) // 2))
        got = gemsops.prod(x.float()).item() if dt == torch.float32 else gemsops.prod(x).float().item()
        ok = got == want
        bad += not ok
        print(f"n={n} {dt}: got {got} want {want} {'ok' if ok else 'WRONG'}")
for shape, dim in (((4096, 4096), 1), ((1024, 65536), 1), ((4096, 4096), 0)):
    x = torch.ones(shape, device="cuda")
    x.view(-1)[torch.randint(0, x.numel(), (4096,), device="cuda", generator=g)] = 2.0
    want = torch.prod(x.double(), dim)
    got = gemsops.prod(x, dim).double()
    ok = torch.equal(got, want)
    bad += not ok
    print(shape, dim, "ok" if ok else f"WRONG {(got != want).sum().item()} outputs")
print("bad", bad)
