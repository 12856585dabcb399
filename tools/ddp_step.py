"""A DDP training step of a small model built of gemsops layers, on 2 GPUs.

    torchrun --standalone --nproc_per_node=2 tools/ddp_step.py
    torchrun --standalone --nproc_per_node=2 tools/ddp_step.py --cpu

(--cpu: gloo on the CPU backend, to check the script itself without GPUs;
the CUDA-graph checks are skipped.)

NCCL backend, one process per GPU. The model: gemsops.nn.LayerNorm, a
Linear whose product is gemsops.matmul (3-D activations: matmul's
broadcast path), and a per-feature gate that is a gemsops.prod over dim 0
of a parameter (ones at start, so harmless; its backward runs in every
step). Checks, each printed PASS/FAIL (SKIP) per rank, with a summary on
rank 0; exit status 1 if any check failed on any rank:

1. ddp-grads: gradients after one DDP step on the global batch split over
   the ranks equal a single-process run on the full batch (rank 0, its own
   GPU), and are equal on every rank; the single-process run also agrees
   with a torch-ops twin of the model (same parameters).
2. ddp-steps: a few SGD steps keep the parameters equal on every rank.
3. use-gemsops: one DDP step of the torch-ops twin under
   gemsops.use_gemsops(), if this build has it (SKIP otherwise), equals 1.
4. graph[schedule, capture stream]: per rank, a CUDA-graph captured
   forward+backward (warm-up on a side stream, static inputs) replayed on
   fresh inputs gives the eager gradients; matmul schedule auto and
   stream-k, captured on torch's own capture stream and on the warm-up
   stream (where gemsops' kept per-stream buffers are reused). A capture
   that raises is reported with its exception.
5. device: the current device is still the rank's GPU.
"""

import copy
import datetime
import math
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gemsops

D, HIDDEN, CLASSES = 256, 512, 16
GLOBAL_BATCH, TOKENS = 16, 32
GRAD_RTOL = 1e-4  # fp32 gradients, summed in another order
TWIN_RTOL = 1e-3  # gemsops against torch's kernels
REPLAYS = 3


class Linear(nn.Module):
    """nn.Linear's parameters and initialisation; the product is mm(x, W^T)."""

    def __init__(self, fin, fout, mm=gemsops.matmul):
        super().__init__()
        self.mm = mm
        self.weight = nn.Parameter(torch.empty(fout, fin))
        self.bias = nn.Parameter(torch.empty(fout))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        nn.init.uniform_(self.bias, -1 / math.sqrt(fin), 1 / math.sqrt(fin))

    def forward(self, x):
        return self.mm(x, self.weight.t()) + self.bias


class Net(nn.Module):
    """gemsops layers, or (torch_ops=True) the same model on torch's ops,
    with the same parameter names."""

    def __init__(self, torch_ops=False):
        super().__init__()
        norm = nn.LayerNorm if torch_ops else gemsops.nn.LayerNorm
        mm = torch.matmul if torch_ops else gemsops.matmul
        self.prod = torch.prod if torch_ops else gemsops.prod
        self.norm1, self.fc1 = norm(D), Linear(D, HIDDEN, mm)
        self.norm2, self.fc2 = norm(HIDDEN), Linear(HIDDEN, CLASSES, mm)
        self.gate = nn.Parameter(torch.ones(2, HIDDEN))

    def forward(self, x):
        h = self.fc1(self.norm1(x)) * self.prod(self.gate, 0)
        return self.fc2(F.gelu(self.norm2(h)))


def wrap(model):
    dev = next(model.parameters()).device
    return DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)


def make_net(device, torch_ops=False):
    torch.manual_seed(1234)  # the same initial parameters on every rank
    return Net(torch_ops).to(device)


def loss_fn(logits, y):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def global_batch(step, device):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, TOKENS, D, generator=g)
    y = torch.randint(0, CLASSES, (GLOBAL_BATCH, TOKENS), generator=g)
    return x.to(device), y.to(device)


def local_batch(step, device, rank, world):
    x, y = global_batch(step, device)
    per = GLOBAL_BATCH // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def worst_error(got, ref):
    """max over parameters of max|got - ref| / max|ref|, and its name."""
    errs = {
        n: (
            (got[n] - ref[n]).abs().max() / ref[n].abs().max().clamp_min(1e-12)
        ).item()
        for n in ref
    }
    name = max(errs, key=errs.get)
    return errs[name], name


def flat(tensors):
    return torch.cat([t.detach().flatten() for t in tensors])


class Checks:
    def __init__(self, rank):
        self.rank, self.results = rank, []

    def run(self, name, fn, *args):
        try:
            ok, detail = fn(*args)
        except Exception as e:  # noqa: BLE001 - reported, then carried on
            traceback.print_exc()
            ok, detail = False, f"raised {type(e).__name__}: {e}"
        status = {True: "PASS", False: "FAIL", None: "SKIP"}[ok]
        self.results.append((name, status, detail))
        print(f"[rank {self.rank}] {status} {name}: {detail}", flush=True)


def check_ddp_grads(dev, rank, world):
    model = make_net(dev)
    single = copy.deepcopy(model)
    ddp = wrap(model)  # kept alive: its reducer all-reduces in backward
    x, y = local_batch(0, dev, rank, world)
    loss_fn(ddp(x), y).backward()
    got = grads(model)
    # every rank holds the same averaged gradients
    mine = flat(got.values())
    rank0 = mine.clone()
    dist.broadcast(rank0, 0)
    spread = (mine - rank0).abs().max().item()
    notes = [f"max |grad - rank 0's| {spread:.2e}"]
    ok = spread <= GRAD_RTOL * rank0.abs().max().item()
    if rank == 0:
        x, y = global_batch(0, dev)
        loss_fn(single(x), y).backward()
        ref = grads(single)
        err, name = worst_error(got, ref)
        notes.append(f"vs single process on the full batch {err:.2e} ({name})")
        twin = make_net(dev, torch_ops=True)
        twin.load_state_dict(single.state_dict())
        loss_fn(twin(x), y).backward()
        terr, tname = worst_error(ref, grads(twin))
        notes.append(f"single process vs torch ops {terr:.2e} ({tname})")
        ok = ok and err <= GRAD_RTOL and terr <= TWIN_RTOL
    return ok, "; ".join(notes)


def check_ddp_steps(dev, rank, world, steps=3):
    model = make_net(dev)
    start = flat(model.parameters())
    ddp = wrap(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = local_batch(step, dev, rank, world)
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        opt.step()
    mine = flat(model.parameters())
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    spread = max((t - mine).abs().max().item() for t in every)
    moved = (mine - start).abs().max().item()
    ok = spread <= 1e-6 * mine.abs().max().item() and moved > 0
    return ok, (
        f"{steps} SGD steps: max parameter difference across ranks "
        f"{spread:.2e}, moved {moved:.2e}"
    )


def check_use_gemsops(dev, rank, world):
    use = getattr(gemsops, "use_gemsops", None)
    if use is None:
        return None, "gemsops.use_gemsops is not in this build"
    x, y = local_batch(0, dev, rank, world)
    plain, twin = make_net(dev), make_net(dev, torch_ops=True)
    twin.load_state_dict(plain.state_dict())
    ddp_plain, ddp_twin = wrap(plain), wrap(twin)
    loss_fn(ddp_plain(x), y).backward()
    ctx = use()
    if not hasattr(ctx, "__enter__"):
        return False, (
            f"gemsops.use_gemsops() returned {type(ctx).__name__},"
            " not a context manager: don't know how to use it"
        )
    with ctx:
        loss_fn(ddp_twin(x), y).backward()
    err, name = worst_error(grads(twin), grads(plain))
    return err <= TWIN_RTOL, (
        f"torch-ops DDP step under use_gemsops() vs "
        f"gemsops layers: {err:.2e} ({name})"
    )


def check_graph(dev, rank, schedule, on_warmup_stream):
    """Capture forward+backward of a (non-DDP) replica on this rank's GPU;
    replay on fresh inputs; compare with eager gradients."""
    if dev.type != "cuda":
        return None, "no CUDA device (--cpu)"
    gemsops.set_schedule(schedule, ctas=7 if schedule == "stream-k" else 0)
    try:
        model = make_net(dev)
        params = list(model.parameters())
        sx, sy = global_batch(100, dev)  # static inputs
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                for p in params:
                    p.grad = None
                loss_fn(model(sx), sy).backward()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        eager = copy.deepcopy(model)
        for p in params:
            p.grad = None
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(
                graph, stream=side if on_warmup_stream else None
            ):
                loss_fn(model(sx), sy).backward()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            return False, f"capture raised {type(e).__name__}: {e}"
        static = {n: p.grad for n, p in model.named_parameters()}
        worst, where = 0.0, ""
        for i in range(REPLAYS):
            x, y = global_batch(101 + i, dev)
            sx.copy_(x)
            sy.copy_(y)
            graph.replay()
            for p in eager.parameters():
                p.grad = None
            loss_fn(eager(x), y).backward()
            torch.cuda.synchronize()
            err, name = worst_error(static, grads(eager))
            if err >= worst:
                worst, where = err, f"{name}, replay {i + 1}"
        return worst <= GRAD_RTOL, (
            f"{REPLAYS} replays vs eager: worst {worst:.2e} ({where})"
        )
    finally:
        gemsops.set_schedule("auto")


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    timeout = datetime.timedelta(minutes=3)
    if "--cpu" in sys.argv[1:]:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev, timeout=timeout)
    if rank == 0:
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
        print(
            f"torch {torch.__version__}, {world} ranks, {name}, gemsops "
            f"{gemsops.__version__} {gemsops.backends()}",
            flush=True,
        )
    checks = Checks(rank)
    checks.run("ddp-grads", check_ddp_grads, dev, rank, world)
    checks.run("ddp-steps", check_ddp_steps, dev, rank, world)
    checks.run("use-gemsops", check_use_gemsops, dev, rank, world)
    dist.barrier()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    for schedule in ("auto", "stream-k"):
        for on_warmup in (False, True):
            stream = "warm-up stream" if on_warmup else "own capture stream"
            checks.run(
                f"graph[{schedule}, {stream}]",
                check_graph,
                dev,
                rank,
                schedule,
                on_warmup,
            )
    if dev.type == "cuda":
        now = torch.cuda.current_device()
        checks.run(
            "device",
            lambda: (now == local, f"current {now}, expected {local}"),
        )
    every = [None] * world
    dist.all_gather_object(every, checks.results)
    failed = sum(s == "FAIL" for results in every for _, s, _ in results)
    if rank == 0:
        print("\n==== ddp_step summary ====")
        for r, results in enumerate(every):
            for name, status, detail in results:
                print(f"{status}  rank {r}  {name}: {detail}")
        print(
            f"==== {'FAIL' if failed else 'PASS'}: {failed} failed ====",
            flush=True,
        )
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
