import time, statistics, cProfile, pstats, io, sys
import torch, gemsops
import triton.testing, inspect
src = inspect.getsource(triton.testing.do_bench)
print(src[src.find("n_repeat"):][:1500])
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
for sched in ("data-parallel", "hybrid"):
    gemsops.set_schedule(sched)
    for m, n, k in [(384, 384, 384), (768, 768, 768), (2048, 512, 256)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        print(sched, m, n, k, gemsops._C.matmul_plan(a[None], b[None], torch.empty(1, m, n, device="cuda", dtype=a.dtype), gemsops.ops.matmul.SCHEDULES[sched], 0, 0, 0))
        for fn_name, fn in (("gemsops", lambda: gemsops.matmul(a, b)), ("torch", lambda: torch.matmul(a, b))):
            hs, hb = [], []
            for i in range(50):
                flush.zero_()
                t0 = time.perf_counter(); fn(); t1 = time.perf_counter()
                hs.append((t1 - t0) * 1e6)
            torch.cuda.synchronize()
            for i in range(50):
                t0 = time.perf_counter(); fn(); t1 = time.perf_counter()
                hb.append((t1 - t0) * 1e6)
            torch.cuda.synchronize()
            print(f"  {fn_name}: host us per call after a flush {statistics.median(hs):.1f}, back-to-back {statistics.median(hb):.1f}")
        torch.cuda.set_sync_debug_mode(1)
        for i in range(3):
            flush.zero_(); gemsops.matmul(a, b)
        torch.cuda.set_sync_debug_mode(0)
        if sched == "hybrid" and m == 384:
            pr = cProfile.Profile()
            pr.enable()
            for i in range(30):
                flush.zero_(); gemsops.matmul(a, b)
            pr.disable()
            s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12); print(s.getvalue())
