"""Runs cases: in-process (replay) or in worker subprocesses that may die
(crash) or stall (hang) without stopping the batch."""

import collections
import multiprocessing
import multiprocessing.connection
import re
import signal
import sys
import time
import traceback

FAMILIES = {  # name -> (module, function, weight)
    "layer_norm": ("cases", "case_layer_norm", 5),
    "norms": ("cases", "case_norms", 3),
    "prod": ("cases", "case_prod", 4),
    "matmul": ("cases", "case_matmul", 4),
    "linear": ("cases", "case_linear", 2),
    "c_layer_norm": ("raw", "case_c_layer_norm", 3),
    "c_prod": ("raw", "case_c_prod", 2),
    "c_matmul": ("raw", "case_c_matmul", 2),
    "c_misc": ("raw", "case_c_misc", 1),
}
ALIASES = {
    "raw": [f for f in FAMILIES if f.startswith("c_")],
    "public": ["layer_norm", "norms", "prod", "matmul", "linear"],
}


def parse_ops(text):
    if not text:
        return list(FAMILIES)
    out = []
    for name in text.split(","):
        name = name.strip()
        names = ALIASES.get(name, [name])
        for n in names:
            if n not in FAMILIES:
                raise SystemExit(
                    f"unknown op family {n!r}; known: "
                    f"{', '.join(list(FAMILIES) + list(ALIASES))}"
                )
            if n not in out:
                out.append(n)
    return out


def family_of(ctx, ops):
    """The first draw of a case's rng picks its family."""
    pool = [f for f in ops for _ in range(FAMILIES[f][2])]
    return ctx.choice(pool)


def run_case(seed, index, device, ops, verbose=False):
    """One case in this process; returns a result dict."""
    import importlib

    import torch

    from . import oracle
    from .tensors import Ctx

    ctx = Ctx(seed, index, device)
    fam = family_of(ctx, ops)
    mod, fn, _ = FAMILIES[fam]
    func = getattr(importlib.import_module(f"{__package__}.{mod}"), fn)
    t0 = time.perf_counter()
    tb = ""
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(index)
            func(ctx)
        kind, msg = "passed", ""
    except oracle.Outcome as o:
        kind, msg = o.kind, str(o)
    except Exception as e:  # noqa: BLE001 - a bug in the fuzzer or an
        # exception escaping outside the differential calls
        kind = oracle.HarnessError.kind
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        tb = traceback.format_exc()
    res = dict(
        seed=seed,
        index=index,
        device=device,
        family=fam,
        kind=kind,
        message=msg[:600],
        secs=round(time.perf_counter() - t0, 3),
    )
    if verbose:
        print(f"case seed={seed} index={index} device={device} family={fam}")
        for line in ctx.lines:
            print("  " + line)
        print(
            f"=> {kind}" + (f": {msg}" if msg else "") + f"  ({res['secs']} s)"
        )
        if tb:
            print(tb)
    return res


# A fresh worker's first case also pays for its start (spawn, importing
# torch) and, on CUDA, for the context and the first launches: it gets
# this much more time before it counts as a hang.
STARTUP_GRACE = {"cpu": 30.0, "cuda": 120.0}


def _worker(conn, device, ops):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(1)
    if device == "cuda":  # CUDA starts here, in the worker, never the parent
        torch.cuda.init()
        torch.empty(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    while True:
        job = conn.recv()
        if job is None:
            return
        seed, index = job
        res = run_case(seed, index, device, ops)
        if device == "cuda":
            # an asynchronous fault (illegal address, a trap) is sticky:
            # it is this case's, and the worker must not run another
            try:
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                res.update(
                    kind="crash",
                    restart=True,
                    message=(f"CUDA error after the case: {e}")[:600],
                )
        conn.send(res)
        if res.get("restart"):
            return


class _Slot:
    def __init__(self, mp, device, ops):
        self.conn, child = mp.Pipe()
        self.proc = mp.Process(
            target=_worker, args=(child, device, ops), daemon=True
        )
        self.proc.start()
        child.close()
        self.job = None
        self.started = 0.0
        self.first = True
        self.grace = STARTUP_GRACE.get(device, 30.0)

    def give(self, job):
        self.job, self.started = job, time.monotonic()
        self.conn.send(job)

    def limit(self, timeout):
        return timeout + (self.grace if self.first else 0.0)

    def stop(self):
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()


def _died(exitcode):
    if exitcode is not None and exitcode < 0:
        try:
            return f"worker killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"worker killed by signal {-exitcode}"
    return f"worker exited with status {exitcode}"


def run_batch(
    seed, indices, device, ops, workers=2, timeout=60.0, progress=None
):
    """Every index of `indices` in worker processes; returns results in
    index order. A dead worker is a crash, one past `timeout` a hang; both
    are replaced and the batch goes on."""
    from .tensors import Ctx

    mp = multiprocessing.get_context("spawn")
    todo = collections.deque(indices)
    results = {}
    slots = [
        _Slot(mp, device, ops) for _ in range(min(workers, len(todo)) or 1)
    ]
    try:
        while todo or any(s.job for s in slots):
            for s in slots:
                if s.job is None and todo:
                    s.give((seed, todo.popleft()))
            busy = [s for s in slots if s.job]
            deadline = min(s.started + s.limit(timeout) for s in busy)
            ready = multiprocessing.connection.wait(
                [s.conn for s in busy] + [s.proc.sentinel for s in busy],
                max(0.0, deadline - time.monotonic()),
            )
            for i, s in enumerate(slots):
                if s.job is None:
                    continue
                _, index = s.job
                kind = msg = None
                if s.conn in ready or s.conn.poll():
                    try:
                        res = s.conn.recv()
                        results[index] = res
                        s.job, s.first = None, False
                        if progress:
                            progress(res)
                        if res.pop("restart", False):
                            s.stop()
                            slots[i] = _Slot(mp, device, ops)
                        continue
                    except (EOFError, OSError):
                        pass
                if s.proc.sentinel in ready or not s.proc.is_alive():
                    s.proc.join(1)
                    kind, msg = "crash", _died(s.proc.exitcode)
                elif time.monotonic() - s.started > s.limit(timeout):
                    s.proc.kill()
                    s.proc.join(5)
                    kind, msg = (
                        "hang",
                        (f"no result after {s.limit(timeout):g} s"),
                    )
                if kind:
                    fam = family_of(Ctx(seed, index, device), ops)
                    res = dict(
                        seed=seed,
                        index=index,
                        device=device,
                        family=fam,
                        kind=kind,
                        message=msg,
                        secs=round(time.monotonic() - s.started, 3),
                    )
                    results[index] = res
                    if progress:
                        progress(res)
                    slots[i] = _Slot(mp, device, ops)
    finally:
        for s in slots:
            s.stop()
    return [results[i] for i in sorted(results)]


def failure_class(res):
    """A short key grouping failures of one kind: family, kind and the
    message with numbers and quoted values stripped."""
    msg = re.sub(r"-?\d[\d.e+-]*", "N", res["message"])
    msg = re.sub(r"'[^']*'", "'…'", msg)
    return f"{res['family']} {res['kind']}: {msg[:110]}"


def summary(results, ops, replay_base, out=sys.stdout):
    from .oracle import FAILURES, KINDS

    counts = collections.Counter(r["kind"] for r in results)
    print(
        f"\n{len(results)} cases: "
        + ", ".join(f"{k} {counts.get(k, 0)}" for k in KINDS),
        file=out,
    )
    fails = [r for r in results if r["kind"] in FAILURES]
    if not fails:
        print("no failures", file=out)
        return fails
    classes = collections.OrderedDict()
    for r in fails:
        classes.setdefault(failure_class(r), []).append(r)
    print(f"\n{len(fails)} failures in {len(classes)} classes:", file=out)
    for key, rs in classes.items():
        first = rs[0]
        print(
            f"  [{len(rs)}x] {key}\n        e.g. {replay_base} "
            f"--seed {first['seed']} --replay {first['index']}",
            file=out,
        )
    print("\nevery failure (seed, index, family, kind: message):", file=out)
    for r in fails:
        print(
            f"  {r['seed']} {r['index']} {r['family']} {r['kind']}: "
            f"{r['message'][:200]}",
            file=out,
        )
    return fails
