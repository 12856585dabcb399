"""Sustained products beside cuBLAS with the GPU's SM clock and board power
sampled: does a kernel lose under load because it draws more power (and
so runs at lower clocks) for the same FLOP, rather than in its cycles?

Each (shape, dtype, library) runs back to back for `seconds` on fresh
standard-normal operands (no flush: a steady state, as a long training
step's products), while `nvidia-smi` samples clocks.sm, power.draw and the
throttle reasons every 50 ms. Printed per phase: the call's mean time from
CUDA events over the phase's second half, and the median SM clock and
power over the same half. Read only: nothing about the GPU is set.

usage: python -m tools.mm_clocks [seconds] [M,N,K ...] [--mainloops a,b]
  --mainloops: gemsops forced to each of these mainloops (gemsops.
  MAINLOOPS, data-parallel schedule) in phases of their own, beside the
  planner's choice: which of our tiles spends the least energy a call."""

import statistics
import subprocess
import sys
import time

import torch

import gemsops

FIELDS = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"


def sampler():
    return subprocess.Popen(
        [
            "nvidia-smi",
            f"--query-gpu={FIELDS}",
            "--format=csv,noheader,nounits",
            "-lms",
            "50",
            "-i",
            str(torch.cuda.current_device()),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def parse_samples(smi):
    """[(wall time, SM MHz, watts, throttle reasons)] from a finished
    sampler's output."""
    rows = []
    for line in smi.stdout.read().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            t = time.mktime(time.strptime(parts[0][:19], "%Y/%m/%d %H:%M:%S"))
            t += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0
            rows.append((t, float(parts[1]), float(parts[2]), parts[3]))
        except (IndexError, ValueError):
            continue
    return rows


def phase(fn, seconds):
    """(mean us a call over the second half, its [t0, t1] wall window)."""
    end = time.monotonic() + seconds
    half = time.monotonic() + seconds / 2
    while time.monotonic() < half:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    t0 = time.time()
    start, stop = (torch.cuda.Event(enable_timing=True) for _ in "ab")
    calls = 0
    start.record()
    while time.monotonic() < end:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    stop.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(stop) / calls, (t0, time.time())


def main():
    args = sys.argv[1:]
    forced = []
    if "--mainloops" in args:
        i = args.index("--mainloops")
        forced = args[i + 1].split(",")
        del args[i : i + 2]
    seconds = float(args[0]) if args else 4.0
    shapes = [tuple(map(int, s.split(","))) for s in args[1:]] or [
        (4096, 4096, 4096),
        (8192, 8192, 8192),
    ]
    smi = sampler()
    windows = []
    for m, n, k in shapes:
        for dtype in (torch.float16, torch.bfloat16):
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            sides = [("torch", "auto"), ("gemsops", "auto")] * 2
            sides += [("gemsops", name) for name in forced]
            for who, mainloop in sides:
                if mainloop != "auto":
                    gemsops.set_schedule("data-parallel", mainloop=mainloop)
                if who == "torch":
                    fn = lambda: a @ b  # noqa: E731
                else:
                    fn = lambda: gemsops.matmul(a, b)  # noqa: E731
                try:
                    us, win = phase(fn, seconds)
                finally:
                    gemsops.set_schedule()
                tag = who if mainloop == "auto" else mainloop
                windows.append(((m, n, k), str(dtype)[6:], tag, us, win))
                time.sleep(1.0)  # a gap between phases in the samples
    time.sleep(0.2)
    smi.terminate()
    rows = parse_samples(smi)
    print(f"# {torch.cuda.get_device_name()}, {seconds} s a phase")
    for (m, n, k), dt, who, us, (t0, t1) in windows:
        shape = f"{m}x{n}x{k}"
        s = [r for r in rows if t0 <= r[0] <= t1]
        if not s:
            print(f"{shape} {dt:9s} {who:16s} {us:8.1f} us (no samples)")
            continue
        clock = statistics.median(r[1] for r in s)
        watts = statistics.median(r[2] for r in s)
        reasons = sorted({r[3] for r in s})
        flops = 2 * m * n * k / (us * 1e-6) / 1e12
        print(
            f"{shape} {dt:9s} {who:16s} {us:8.1f} us {flops:6.0f} TFLOP/s "
            f"SM {clock:6.0f} MHz {watts:6.0f} W ({len(s)} samples, "
            f"throttle {' '.join(reasons)})"
        )


if __name__ == "__main__":
    main()
