"""python -m tests.fuzz --seed S --cases N [--device cpu|cuda|all]
[--replay INDEX] [--timeout SEC] [--workers W] [--ops a,b] [--json PATH]"""

import argparse
import json
import sys
import time

from . import runner


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m tests.fuzz", description=__doc__
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", type=int, default=200)
    p.add_argument(
        "--start", type=int, default=0, help="first case index (default 0)"
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "all"])
    p.add_argument(
        "--replay",
        type=int,
        default=None,
        metavar="INDEX",
        help="run case INDEX alone, in this process, verbosely",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds per case before it counts as a hang",
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--ops",
        default="",
        help="families: "
        + ", ".join(list(runner.FAMILIES) + list(runner.ALIASES)),
    )
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("-q", "--quiet", action="store_true")
    a = p.parse_args(argv)
    ops = runner.parse_ops(a.ops)
    devices = ["cpu", "cuda"] if a.device == "all" else [a.device]
    if "cuda" in devices:
        import torch

        import gemsops

        if not (torch.cuda.is_available() and gemsops.cuda_available()):
            if a.device == "cuda":
                sys.exit("--device cuda: no GPU or no CUDA build")
            devices = ["cpu"]
    base = "python -m tests.fuzz" + (f" --ops {a.ops}" if a.ops else "")
    if a.replay is not None:
        failed = False
        for dev in devices:
            res = runner.run_case(a.seed, a.replay, dev, ops, verbose=True)
            failed |= res["kind"] in runner_failures()
        return 1 if failed else 0
    allres = []
    t0 = time.time()
    for dev in devices:
        done = [0]

        def progress(res, dev=dev):
            done[0] += 1
            if res["kind"] in runner_failures() and not a.quiet:
                print(
                    f"[{dev}] {res['index']} {res['family']} {res['kind']}: "
                    f"{res['message'][:160]}",
                    flush=True,
                )
            elif not a.quiet and done[0] % 250 == 0:
                print(
                    f"[{dev}] {done[0]}/{a.cases} cases, "
                    f"{time.time() - t0:.0f} s",
                    flush=True,
                )

        allres += runner.run_batch(
            a.seed,
            range(a.start, a.start + a.cases),
            dev,
            ops,
            a.workers,
            a.timeout,
            progress,
        )
    dt = time.time() - t0
    fails = runner.summary(
        allres,
        ops,
        base + (f" --device {devices[0]}" if devices != ["cpu"] else ""),
    )
    print(
        f"seed {a.seed}, {len(allres)} cases on {', '.join(devices)} in "
        f"{dt:.1f} s"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                dict(
                    seed=a.seed,
                    ops=ops,
                    devices=devices,
                    seconds=dt,
                    results=allres,
                ),
                f,
                indent=1,
            )
    return 1 if fails else 0


def runner_failures():
    from .oracle import FAILURES

    return FAILURES


if __name__ == "__main__":
    sys.exit(main())
