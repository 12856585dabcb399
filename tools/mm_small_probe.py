import torch, gemsops, triton, time
from triton.testing import do_bench
for sched in ["data-parallel", "hybrid"]:
    for (m,n,k) in [(384,384,384),(256,256,768),(512,2304,512),(2048,512,256),(4096,4096,4096)]:
        for dt in [torch.bfloat16]:
            gemsops.set_schedule(sched)
            a=torch.randn(m,k,device="cuda",dtype=dt); b=torch.randn(k,n,device="cuda",dtype=dt)
            f=lambda: gemsops.mm(a,b)
            f(); torch.cuda.synchronize()
            plan=gemsops._C.matmul_plan(a[None],b[None],torch.empty(1,m,n,device="cuda",dtype=dt),gemsops.ops.matmul.SCHEDULES[sched],0,0,0)
            t_fl=[do_bench(f, warmup=10, rep=50) for _ in range(3)]
            t_nofl=do_bench(f, warmup=10, rep=50, grad_to_none=None) 
            tt=do_bench(lambda: torch.mm(a,b), warmup=10, rep=50)
            # host cost
            torch.cuda.synchronize(); t0=time.perf_counter()
            for _ in range(200): f()
            torch.cuda.synchronize(); host=(time.perf_counter()-t0)/200*1e6
            print(sched, m,n,k, plan["mainloop"], "ctas",plan["ctas"],"sk",plan["sk_tiles"],"skc",plan.get("sk_ctas"), "gems ms", ["%.4f"%x for x in t_fl], "torch %.4f"%tt, "loop us/call %.1f"%host)
