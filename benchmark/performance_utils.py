"""A FlagGems-style benchmark harness: a Benchmark names an op, the torch
reference, the gemsops version (and optional peers), an input generator,
dtypes and shapes; run() times every provider on every case, prints one row
per case and appends the rows to a JSON file under benchmark/results/.

Kernel time: triton.testing.do_bench median (L2 flushed between reps) when
Triton imports, CUDA events around repeated calls otherwise;
GEMSOPS_BENCH_FLUSH=read flushes L2 by reading instead (see _read_flush),
GEMSOPS_BENCH_FLUSH=clean by writing one buffer and reading another (see
_clean_flush).
GEMSOPS_BENCH_GRAPH=1 captures each provider's call (the forward, or the
autograd.grad of the backward) in a CUDA graph once and times its replays:
the host's Python and dispatch cost then stays out of the timed window
(see _graph_replay). GB/s counts the fewest bytes the op must move; the
copy bandwidth of this GPU is measured once per run and every GB/s is also
given as a fraction of it.

GEMSOPS_BENCH_ROUNDS=n (default 2) times a case's providers n times,
every other round in reverse order, and keeps each provider's fastest
median: the provider timed first in a case can run slower than it does
later in the same case (see _timed_rounds).

GEMSOPS_BENCH_RESUME=1 carries on a result file of an earlier call at the
same commit, GPU and method: its cases are kept and not timed again (each
row keeps its own call's copy fraction; `calls` counts the calls that
wrote the file), so a complete file's run times nothing.

The benchmark files' own switches: GEMSOPS_BENCH_NO_PEERS=1 times torch
and gemsops alone (no FlagGems, Liger or compiled torch);
GEMSOPS_BENCH_QUICK=1 a few cases of LayerNorm and prod;
GEMSOPS_BENCH_SWEEP=1 the LayerNorm forward's N x M sweep instead of its
cases; test_blas_perf.py's GEMSOPS_BENCH_CORPUS, _TF32_CORPUS (shape
counts), _SCHEDULES and _MAINLOOPS (comma lists: what gemsops runs).
"""

import contextlib
import datetime
import json
import os
import subprocess
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
_copy_gbps = None
_rows = []


FLUSH = os.environ.get("GEMSOPS_BENCH_FLUSH", "zero")
GRAPH = os.environ.get("GEMSOPS_BENCH_GRAPH", "0") == "1"
RESUME = os.environ.get("GEMSOPS_BENCH_RESUME", "0") == "1"
ROUNDS = max(1, int(os.environ.get("GEMSOPS_BENCH_ROUNDS", "2")))
_flush_buf = None


def _read_flush():
    """Evicts L2 by READING a 256 MB buffer: L2 ends full of clean lines.
    triton's flush (cache.zero_()) leaves tens of MB of dirty lines that
    the timed kernel then writes back inside every timed window, the same
    for every provider (docs/performance.md, Method)."""
    global _flush_buf
    if _flush_buf is None:
        _flush_buf = (
            torch.empty(1 << 26, dtype=torch.float32, device="cuda").fill_(
                1.0
            ),
            torch.empty((), device="cuda"),
        )
    torch.sum(_flush_buf[0], dim=0, out=_flush_buf[1])


_clean_buf = None


def _clean_flush():
    """Evicts L2 by WRITING a 256 MB buffer, then reads another as
    _read_flush does: the writes replace every line (a read-only flush
    may leave lines of the previous call's inputs in L2, its own lines
    replacing each other first), the reads write the dirty ones back
    before the timed call, so L2 ends full of clean lines of neither."""
    global _clean_buf
    if _clean_buf is None:
        _clean_buf = torch.empty(1 << 26, dtype=torch.float32, device="cuda")
    _clean_buf.zero_()
    _read_flush()


def _events_median(fn, flush, warmup_ms, rep_ms):
    """triton.testing.do_bench's method with another flush: estimate the
    call's time, warm up, then time each call between events after a
    flush; median."""
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(5):
        flush()
        fn()
    e.record()
    torch.cuda.synchronize()
    est = s.elapsed_time(e) / 5
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    n = max(1, int(rep_ms / est))
    starts = [torch.cuda.Event(True) for _ in range(n)]
    ends = [torch.cuda.Event(True) for _ in range(n)]
    for i in range(n):
        flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(starts, ends))
    return times[len(times) // 2]


def do_bench(fn, warmup_ms=25, rep_ms=100):
    """Median milliseconds of fn() on the current stream, L2 flushed before
    each call: triton.testing.do_bench (GEMSOPS_BENCH_FLUSH=zero, the
    default, as FlagGems measures) or the same method with a read-only
    flush (GEMSOPS_BENCH_FLUSH=read, see _read_flush); CUDA events without
    a flush when Triton is absent."""
    if FLUSH in ("read", "clean"):
        flush = _read_flush if FLUSH == "read" else _clean_flush
        return _events_median(fn, flush, warmup_ms, rep_ms)
    try:
        import triton.testing

        return triton.testing.do_bench(
            fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"
        )
    except ImportError:
        pass
    return _events_median(fn, lambda: None, warmup_ms, rep_ms)


def _graph_replay(fn, stream):
    """fn captured once in a CUDA graph on `stream` (where the tensors it
    uses were made, so that a backward's kernels land on it too), after
    warm-up calls there that make any lazy allocation or compilation;
    returns the graph's replay, or None when fn cannot be captured.

    Why: do_bench's window opens when the flush is queued; a call whose
    host part (Python, autograd, dispatch) outlasts the flush leaves the
    GPU idle inside the window. A graph's replay costs one launch."""
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
        # a call that synchronizes (torch's prod backward looks for zeros)
        # cannot be captured, and a failed capture leaves torch's CUDA
        # generator unusable: find out before trying
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
        except RuntimeError:
            return None
        finally:
            torch.cuda.set_sync_debug_mode(mode)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            fn()
    except Exception:  # a provider that cannot be captured runs eagerly
        torch.cuda.synchronize()
        return None
    torch.cuda.synchronize()
    return graph.replay


def copy_bandwidth_gbps():
    """Device-to-device copy of 1 GiB, bytes read + written, GB/s."""
    global _copy_gbps
    if _copy_gbps is None:
        src = torch.empty(
            1 << 28, dtype=torch.float32, device="cuda"
        ).normal_()
        dst = torch.empty_like(src)
        # eager even with GEMSOPS_BENCH_GRAPH: a captured copy_ becomes a
        # graph memcpy node, slower than the kernel copy (docs/performance.md,
        # Method), and its host cost is nothing beside a 1 GiB copy
        ms = do_bench(lambda: dst.copy_(src))
        _copy_gbps = 2 * src.numel() * 4 / ms / 1e6
        del src, dst
    return _copy_gbps


def commit():
    env = os.environ.get("GEMSOPS_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except OSError:
        return "unknown"


def dtype_name(d):
    return str(d).replace("torch.", "")


_PEER_NAMES = {"flaggems": "FlagGems", "liger": "Liger"}


def optional_peer(found, name, make):
    """found[name] = make() where the peer imports (FlagGems and Liger
    are never dependencies), else the reason it is not timed, printed;
    nothing under GEMSOPS_BENCH_NO_PEERS."""
    if os.environ.get("GEMSOPS_BENCH_NO_PEERS"):
        return
    try:
        found[name] = make()
    except Exception as e:
        print(f"{_PEER_NAMES[name]} not timed: {type(e).__name__}: {e}")


def row_bytes(passes):
    """bytes_func of a [M, N] op that moves the rows `passes` times (reads
    and writes of M x N elements; parameters and statistics left out)."""
    return lambda dtype, shape: passes * shape[0] * shape[1] * dtype.itemsize


class Benchmark:
    """op_name: row label; torch_op / gems_op: callables taking the
    generator's args; arg_func(dtype, shape) -> tuple of args; bytes_func(
    dtype, shape) -> bytes the op must move; flops_func likewise (optional);
    is_backward: time the backward (autograd.grad of the outputs, each
    with its own random gradient) instead of the forward; peers: {name:
    callable or (callable, context factory)} timed beside torch where they
    import (the context, e.g. FlagGems' use_gems, wraps both the forward
    and the timed backward)."""

    def __init__(
        self,
        op_name,
        torch_op,
        gems_op,
        arg_func,
        dtypes,
        shapes,
        bytes_func=None,
        flops_func=None,
        is_backward=False,
        peers=None,
        result_file=None,
    ):
        self.op_name = op_name
        self.torch_op = torch_op
        self.gems_op = gems_op
        self.arg_func = arg_func
        self.dtypes = dtypes
        self.shapes = shapes
        self.bytes_func = bytes_func
        self.flops_func = flops_func
        self.is_backward = is_backward
        self.peers = peers or {}
        self.result_file = result_file or op_name

    def _timed(self, op, args):
        """(median ms, whether a graph replay was timed)."""
        ctx = contextlib.nullcontext
        if isinstance(op, tuple):
            op, ctx = op
        stream = torch.cuda.Stream() if GRAPH else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
        with ctx():
            # a backward's kernels run on its forward's stream
            with (
                torch.cuda.stream(stream)
                if stream
                else contextlib.nullcontext()
            ):
                if not self.is_backward:
                    fn = lambda: op(*args)  # noqa: E731
                else:
                    inputs = [
                        a
                        for a in args
                        if isinstance(a, torch.Tensor) and a.requires_grad
                    ]
                    # an op of several outputs gets a gradient for each,
                    # drawn apart (one tensor handed to two outputs would
                    # let the second read hit L2)
                    out = op(*args)
                    outs = out if isinstance(out, tuple) else (out,)
                    grads = tuple(torch.randn_like(o) for o in outs)
                    fn = lambda: torch.autograd.grad(  # noqa: E731
                        outs, inputs, grads, retain_graph=True
                    )
            if stream is not None:
                torch.cuda.synchronize()
                replay = _graph_replay(fn, stream)
                if replay is not None:
                    return do_bench(replay), True
                # eager on the stream its forward ran on, so that the
                # events and the flush share the backward's stream
                with torch.cuda.stream(stream):
                    return do_bench(fn), False
            return do_bench(fn), False

    def _timed_rounds(self, ops, args):
        """{name: (median ms, graph timed) or the peer's exception}, each
        the fastest of ROUNDS rounds over the case's providers, every
        other round in reverse order. Why: on an H100 the provider timed
        first in a case ran its kernels up to 9% slower than the same
        call timed again after the others (docs/performance.md, LayerNorm
        forward); rounds in both orders give every provider a turn late
        in the case. torch and gemsops errors propagate."""
        best = {}
        names = list(ops)
        for r in range(ROUNDS):
            for name in names if r % 2 == 0 else names[::-1]:
                if isinstance(best.get(name), Exception):
                    continue
                try:
                    got = self._timed(ops[name], args)
                except Exception as e:
                    if name in ("torch", "gems"):
                        raise
                    best[name] = e
                    continue
                if name not in best or got[0] < best[name][0]:
                    best[name] = got
        return {name: best[name] for name in names}

    def run(self):
        copy = copy_bandwidth_gbps()
        gpu = torch.cuda.get_device_name()
        pass_name = "bwd" if self.is_backward else "fwd"
        print(
            f"\n{self.op_name} {pass_name} on {gpu}; copy bandwidth "
            f"{copy:.0f} GB/s; commit {commit()}"
        )
        head = (
            f"{'dtype':>9} {'shape':>18} {'torch ms':>9} {'gems ms':>9} "
            f"{'speedup':>7} {'torch GB/s':>10} {'gems GB/s':>9} "
            f"{'gems/copy':>9}"
        )
        for peer in self.peers:
            head += f" {peer + ' GB/s':>12}"
        if self.flops_func:
            head += f" {'gems TFLOP/s':>12}"
        print(head)
        done = self._resume(gpu)
        n_before = len(_rows)
        for dtype in self.dtypes:
            for shape in self.shapes:
                if (dtype_name(dtype), list(shape)) in done:
                    continue
                args = self.arg_func(dtype, shape)
                ops = {"torch": self.torch_op, "gems": self.gems_op}
                ops.update(self.peers)
                timed = self._timed_rounds(ops, args)
                t_torch, g_torch = timed.pop("torch")
                t_gems, g_gems = timed.pop("gems")
                nbytes = (
                    self.bytes_func(dtype, shape) if self.bytes_func else 0
                )
                row = dict(
                    op=self.op_name,
                    pass_=pass_name,
                    dtype=dtype_name(dtype),
                    shape=list(shape),
                    torch_ms=t_torch,
                    gems_ms=t_gems,
                    speedup=t_torch / t_gems,
                    torch_gbps=nbytes / t_torch / 1e6,
                    gems_gbps=nbytes / t_gems / 1e6,
                )
                if GRAPH:
                    row.update(torch_graph=g_torch, gems_graph=g_gems)
                row["gems_copy_fraction"] = row["gems_gbps"] / copy
                row["torch_copy_fraction"] = row["torch_gbps"] / copy
                line = (
                    f"{row['dtype']:>9} {'x'.join(map(str, shape)):>18} "
                    f"{t_torch:9.4f} {t_gems:9.4f} {row['speedup']:7.2f} "
                    f"{row['torch_gbps']:10.0f} {row['gems_gbps']:9.0f} "
                    f"{row['gems_copy_fraction']:9.1%}"
                )
                for peer, got in timed.items():
                    if isinstance(got, Exception):
                        # a peer refusing a case is data
                        row[f"{peer}_error"] = f"{type(got).__name__}: {got}"[
                            :200
                        ]
                        line += f" {'-':>12}"
                        continue
                    t, g = got
                    row[f"{peer}_ms"] = t
                    if GRAPH:
                        row[f"{peer}_graph"] = g
                    row[f"{peer}_gbps"] = nbytes / t / 1e6
                    line += f" {row[f'{peer}_gbps']:12.0f}"
                if self.flops_func:
                    row["gems_tflops"] = (
                        self.flops_func(dtype, shape) / t_gems / 1e9
                    )
                    line += f" {row['gems_tflops']:12.1f}"
                eager = [
                    k[:-6]
                    for k, v in row.items()
                    if k.endswith("_graph") and not v
                ]
                if eager:  # timed without a graph: host time included
                    line += f"  (eager: {', '.join(eager)})"
                print(line, flush=True)
                _rows.append(row)
                # written after every case, so that a run cut short by a
                # time limit keeps the cases it finished
                self._save(gpu, copy, complete=False)
                del args
                torch.cuda.empty_cache()
        # a resumed complete file with nothing new stays as it was
        if len(_rows) > n_before or not self._was_complete:
            self._save(gpu, copy, complete=True)

    def _path(self, gpu):
        tag = gpu.replace(" ", "_").replace("/", "_")
        flush = "" if FLUSH == "zero" else f"_{FLUSH}flush"
        flush += "_graph" if GRAPH else ""
        return RESULTS / f"{self.result_file}{flush}_{tag}.json"

    def _resume(self, gpu):
        """The (dtype, shape) cases a file of this commit, GPU and method
        already holds (GEMSOPS_BENCH_RESUME=1), its rows taken into this
        run's; none otherwise. A complete file then has nothing to time."""
        self._calls = 1
        self._was_complete = False
        path = self._path(gpu)
        if not RESUME or not path.exists():
            return []
        doc = json.loads(path.read_text())
        same = (doc.get("commit"), doc.get("gpu"), doc.get("flush")) == (
            commit(),
            gpu,
            FLUSH,
        ) and (doc.get("graph"), doc.get("rounds", 1)) == (GRAPH, ROUNDS)
        if not same:
            return []
        self._was_complete = bool(doc.get("complete"))
        rows = [r for r in doc["rows"] if r["op"] == self.op_name]
        _rows.extend(rows)
        self._calls = doc.get("calls", 1) + 1
        print(f"resumed: {len(rows)} cases from {path.name}")
        return [(r["dtype"], r["shape"]) for r in rows]

    def _save(self, gpu, copy, complete):
        RESULTS.mkdir(exist_ok=True)
        path = self._path(gpu)
        doc = dict(
            gpu=gpu,
            copy_gbps=copy,
            flush=FLUSH,
            graph=GRAPH,
            rounds=ROUNDS,
            torch=torch.__version__,
            cuda=torch.version.cuda,
            commit=commit(),
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"
            ),
            complete=complete,
            calls=self._calls,
            rows=[r for r in _rows if r["op"] == self.op_name],
        )
        path.write_text(json.dumps(doc, indent=1))
