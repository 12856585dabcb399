"""One call of each provider's norm forward under Nsight Compute, with the
L2 left as a flush of the benchmark's left it (run under `ncu
--cache-control none`): each call sits in an NVTX range named for its
provider, after the flush, so that ncu's NVTX filter profiles the timed
kernels alone. For reading what a peer's kernel does with the same L2
state as in the benchmark: DRAM bytes read and written inside the kernel,
SM cycles active against elapsed (the idle tail).

usage: ncu --cache-control none --nvtx --nvtx-include "regex:ncu_.*/"
         --metrics ... python -m tools.norm_ncu case ...
  case = op,M,N,dtype as tools/norm_launch_shapes' (ln, rms, addln, addrms)
  NORM_NCU_FLUSH=zero|read|clean (default zero: triton's cache.zero_())"""

import os
import sys


def flush_named(how):
    """The benchmark's flush: zero (triton's cache.zero_() of 256 MB), read
    or clean (benchmark/performance_utils.py)."""
    import torch

    from benchmark import performance_utils as pu

    if how == "zero":
        return torch.empty(256 * 2**20, dtype=torch.int8, device="cuda").zero_
    return {"read": pu._read_flush, "clean": pu._clean_flush}[how]


def provider_calls(op):
    """(name, call) of each provider of op (tools/norm_launch_shapes'), a
    provider's context (FlagGems' use_gems) entered around each call."""
    from tools.norm_launch_shapes import providers

    for name, fn in providers(op).items():
        if isinstance(fn, tuple):
            fn = _within(*fn)
        yield name, fn


def _within(fn, context):
    def call(*args):
        with context():
            return fn(*args)

    return call


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    import torch

    from tools.norm_launch_shapes import case_args

    flush = flush_named(os.environ.get("NORM_NCU_FLUSH", "zero"))
    for spec in argv:
        op, m, n, dt = spec.split(",")
        args = case_args(op, int(m), int(n), getattr(torch, dt))
        for name, fn in provider_calls(op):
            if name == "torch":
                continue
            for _ in range(3):  # compile and autotune outside the ranges
                fn(*args)
            torch.cuda.synchronize()
            flush()
            torch.cuda.nvtx.range_push(f"ncu_{name}_{spec}")
            fn(*args)
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
