"""Cases for the raw gemsops._C entry points: every output and workspace
a view inside a poisoned buffer (tensors.Guarded), inputs from torch or
NumPy producers, valid calls checked against torch and invalid ones
(one mutation each) required to raise without writing anything."""

import math

import numpy as np
import torch
import torch.nn.functional as F

from gemsops import _C

from . import oracle
from .oracle import close, expect_refusal, may_refuse, mm_close, run_raw
from .tensors import (
    FLOATS,
    INTS,
    NP_DTYPES,
    Guarded,
    as_torch,
    describe,
    to_numpy,
)

HALF = (torch.float16, torch.bfloat16)
# layouts the raw calls take as they are (others may be refused, which is
# then an expected refusal: the Python layer copies them first)
ROW_LAYOUTS = ("contig", "offset")


def _maybe_numpy(ctx, t, readonly_ok=True, reversed_ok=True):
    if ctx.numpy_ok and ctx.chance(0.3) and not t.is_neg():
        return to_numpy(
            ctx, t, writable=not readonly_ok, reversed_ok=reversed_ok
        )
    return t


def input_refusal(obj):
    """The refusal a raw call owes an argument as it is, whatever the
    others: a torch tensor with the negative bit, an array with a negative
    stride over a dim of size > 1."""
    if isinstance(obj, torch.Tensor) and obj.is_neg():
        return "neg-bit"
    if isinstance(obj, np.ndarray) and any(
        st < 0 and n > 1 for st, n in zip(obj.strides, obj.shape)
    ):
        return "neg-stride"
    return None


def first_refusal(ordered):
    """ordered: (argument, whether its layout is one the call takes as
    it is) in the order the C function reads them. None when no argument
    must be refused; else the refusal kinds that may come first (a layout
    read before it may be refused first)."""
    maybe = ()
    for obj, layout_ok in ordered:
        k = input_refusal(obj)
        if k:
            return maybe + (k,)
        if not layout_ok:
            maybe = ("layout",)
    return None


def _query(fn):
    """A workspace size for a call that may itself be refused (then the
    call's own refusal is what the case checks)."""
    try:
        return fn()
    except (RuntimeError, ValueError, TypeError, IndexError):
        return 0


def _out(ctx, guards, name, shape, dtype, mutation=None):
    """A guarded output; the mutation may make it strided, NumPy
    read-only, misaligned or of another dtype/shape."""
    strided = mutation == f"{name}-strided"
    rev = mutation == f"{name}-reversed"
    negbit = mutation == f"{name}-negbit"
    numpy = (
        ctx.numpy_ok
        and (
            ctx.chance(0.2)
            or mutation in (f"{name}-readonly", f"{name}-reversed")
        )
        and not negbit
    )
    mis = mutation == f"{name}-misaligned"
    if mutation == f"{name}-dtype":
        dtype = ctx.choice([d for d in FLOATS + (torch.int64,) if d != dtype])
    if mutation == f"{name}-shape":
        shape = (
            list(shape) + [2]
            if ctx.chance(0.5) or not shape
            else list(shape[:-1]) + [shape[-1] + 1]
        )
    if mutation in (
        f"{name}-readonly",
        f"{name}-misaligned",
        f"{name}-reversed",
    ) and (not ctx.numpy_ok or dtype not in NP_DTYPES):
        ctx.dropped = True  # NumPy producers only: on the CPU, not bf16
        mis = rev = False
    if (
        strided
        and math.prod(shape) <= 1
        or rev
        and (not shape or shape[0] <= 1)
    ):
        ctx.dropped = True  # nothing to step over: a valid output
        strided = rev = False
    g = Guarded(
        ctx, shape, dtype, strided=strided, numpy=numpy or mis, misalign=mis
    )
    if mutation == f"{name}-readonly" and g.numpy:
        g.view.flags.writeable = False
    if rev and g.numpy:
        g.view = g.view[::-1]  # the same bytes, a negative stride
    if negbit and not g.numpy:
        g.view = torch._neg_view(g.view)
    guards[name] = g
    ctx.note(f"  {name} = {describe(g.view)} (guarded)")
    return g.view


def _pick(ctx, names, numel=1, p=0.45):
    """Maybe one mutation; on empty tensors strides and overlaps mean
    nothing, so those are not picked there."""
    if not numel:
        names = [n for n in names if "strided" not in n and "overlap" not in n]
    return ctx.choice(names) if ctx.chance(p) else None


# ------------------------------------------------------------ layer_norm
def case_c_layer_norm(ctx):
    if ctx.chance(0.5):
        return _c_ln_fwd(ctx)
    return _c_ln_bwd(ctx)


def _ln_setup(ctx):
    dtype = ctx.choice(FLOATS)
    ndim = ctx.rng.randint(1, 4)
    nd = ctx.rng.randint(1, ndim)
    shape = ctx.shape(ndim, budget=ctx.choice([3000, 30000, 200000]))
    # a mutated call gets row layouts: its refusal must be the mutation's
    ctx.row_only = ctx.chance(0.45)
    x, lay = ctx.tensor(
        shape, dtype, layout=ctx.choice(ROW_LAYOUTS) if ctx.row_only else None
    )
    pshape = shape[ndim - nd :]
    pdtype = torch.float32 if dtype in HALF and ctx.chance(0.3) else dtype
    w = (
        ctx.tensor(pshape, pdtype, layout="contig", nonfinite=0)[0]
        if ctx.chance(0.7)
        else None
    )
    b = (
        ctx.tensor(pshape, pdtype, layout="contig", nonfinite=0)[0]
        if ctx.chance(0.7)
        else None
    )
    rows = math.prod(shape[: ndim - nd])
    sd = torch.float64 if dtype == torch.float64 else torch.float32
    return dtype, shape, nd, pshape, x, lay, w, b, rows, sd


def _c_ln_fwd(ctx):
    dtype, shape, nd, pshape, x, lay, w, b, rows, sd = _ln_setup(ctx)
    # any eps computes as torch's (negative or NaN: NaN rows)
    eps = ctx.choice([1e-5, 1e-3, 0.0] * 3 + [-1e-3, float("nan")])
    mut = _pick(
        ctx,
        [
            "out-dtype",
            "out-shape",
            "out-strided",
            "out-readonly",
            "out-misaligned",
            "out-reversed",
            "out-negbit",
            "mean-dtype",
            "mean-shape",
            "out-overlaps-input",
            "mean-overlaps-rstd",
            "nd-0",
            "nd-big",
            "nd-float",
            "eps-str",
            "weight-dtype",
            "weight-shape",
            "input-int",
            "stats-half",
            "not-tensor",
            "arg-count",
        ],
        x.numel(),
        p=ctx.row_only,
    )
    if mut == "out-strided" and math.prod(pshape) <= 1:
        mut = None  # one element per row: any row stride is a layout
    xp = _maybe_numpy(ctx, x, reversed_ok=not mut)
    guards = {}
    out = _out(ctx, guards, "out", shape, dtype, mut)
    want_stats = ctx.chance(0.8) or mut in (
        "mean-dtype",
        "mean-shape",
        "mean-overlaps-rstd",
    )
    mean = _out(ctx, guards, "mean", [rows], sd, mut) if want_stats else None
    rstd = _out(ctx, guards, "rstd", [rows], sd, mut) if want_stats else None
    a = dict(x=xp, w=w, b=b, nd=nd, eps=eps, out=out, mean=mean, rstd=rstd)
    if mut == "out-overlaps-input" and isinstance(xp, torch.Tensor):
        a["out"] = xp
    elif mut == "mean-overlaps-rstd" and want_stats:
        a["rstd"] = a["mean"]
    elif mut == "nd-0":
        a["nd"] = 0
    elif mut == "nd-big":
        a["nd"] = len(shape) + 1
    elif mut == "nd-float":
        a["nd"] = float(nd)
    elif mut == "eps-str":
        a["eps"] = str(eps)
    elif mut == "weight-dtype" and w is not None:
        a["w"] = w.to(
            torch.float64 if w.dtype != torch.float64 else torch.float32
        )
    elif mut == "weight-shape" and w is not None:
        # one element more, also when the weight has none
        a["w"] = torch.cat([w.reshape(-1), w.new_ones(1)])
    elif mut == "input-int":
        a["x"] = torch.ones(shape, dtype=torch.int32, device=x.device)
    elif mut == "stats-half" and want_stats:
        a["mean"] = torch.empty(rows, dtype=torch.float16, device=x.device)
    elif mut == "not-tensor":
        a["x"] = [1.0, 2.0]
    elif mut == "arg-count":
        pass
    elif mut and (
        not mut.startswith(("out-", "mean-"))
        or mut in ("out-overlaps-input", "mean-overlaps-rstd")
    ):
        mut = None  # the mutation does not apply to this case
    if (
        mut == "mean-shape"
        and rows == 0
        and math.prod(np.shape(a["mean"])) == 0
        or getattr(ctx, "dropped", False)
    ):
        mut = None  # a reshaped mean of no elements is still one per row
    if isinstance(xp, np.ndarray) and any(s < 0 for s in xp.strides):
        lay = "numpy-reversed"
    ctx.note(
        f"_C.layer_norm_fwd(x, w, b, nd={a['nd']}, eps={a['eps']!r}, "
        f"out, mean, rstd) mutation={mut or '-'}"
    )
    for k in ("x", "w", "b"):
        ctx.describe(k, a[k])

    def call():
        args = [
            a["x"],
            a["w"],
            a["b"],
            a["nd"],
            a["eps"],
            a["out"],
            a["mean"],
            a["rstd"],
        ]
        return _C.layer_norm_fwd(*args[:-1] if mut == "arg-count" else args)

    inputs = [t for t in (xp, w, b) if t is not None]
    row_ok = lay in ROW_LAYOUTS or isinstance(xp, np.ndarray)
    if mut:
        expect_refusal(ctx, call, guards, inputs, mut)
    pre = first_refusal([(xp, row_ok)])
    if pre:
        expect_refusal(ctx, call, guards, inputs, f"input layout {lay}", pre)
    if not row_ok:
        may_refuse(ctx, call, guards, inputs, f"input layout {lay}")
    run_raw(ctx, call, guards, inputs)
    ref = oracle.ln_reference(x, pshape, w, b, eps)
    theirs = _torch_or_none(lambda: F.layer_norm(x, pshape, w, b, eps))
    close(
        "out",
        as_torch(guards["out"].result()).to(x.device),
        ref[0],
        theirs,
        dtype,
        torch_slack=2.0,
    )
    if want_stats:
        n = math.prod(pshape)
        for name, r in (("mean", ref[1]), ("rstd", ref[2])):
            o = as_torch(guards[name].result()).reshape(-1)
            r = r.reshape(-1)
            _written(name, o, r)
            # a negative eps cancels against the variance (seed 4302 case
            # 6054: eps -1e-3, rows of 2, rstd 292.5): the public op's
            # bounds (cases.py)
            bound = (
                oracle.rstd_bound(r, eps, n, sd)
                if name == "rstd"
                else oracle.mean_bound(x.cpu(), nd, sd)
            )
            if bound is not None:
                bound = bound.reshape(-1)
            close(name, o, r, None, sd, bound=bound)


def _written(name, ours, ref):
    """Outputs start as NaN (the poison): a NaN where the float64
    reference is finite is an element left unwritten (or a wrong one)."""
    o, r = ours.detach().cpu(), ref.detach().cpu()
    if not o.is_floating_point():
        return
    if o.numel() == r.numel():
        o, r = o.reshape(-1), r.reshape(-1)
    bad = torch.isnan(o) & torch.isfinite(r)
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise oracle.WrongAnswer(
            f"{name}: NaN where the reference is finite ({int(bad.sum())} "
            f"of {o.numel()}); first at {i}: reference {r[tuple(i)].item()!r}"
        )


def _torch_or_none(fn):
    try:
        return fn()
    except RuntimeError:
        return None


def _c_ln_bwd(ctx):
    dtype, shape, nd, pshape, x, lay, w, b, rows, sd = _ln_setup(ctx)
    eps = 1e-5
    _, mean, rstd = torch.native_layer_norm(
        x.double(), pshape, None, None, eps
    )
    mean, rstd = mean.reshape(-1).to(sd), rstd.reshape(-1).to(sd)
    g, glay = ctx.tensor(
        shape,
        dtype,
        nonfinite=0.01,
        layout=ctx.choice(ROW_LAYOUTS) if ctx.row_only else None,
    )
    det = ctx.chance(0.3)
    want = [
        ctx.chance(0.8),
        w is not None and ctx.chance(0.8),
        w is not None and b is not None and ctx.chance(0.8),
    ]
    mut = _pick(
        ctx,
        [
            "grad_input-dtype",
            "grad_input-shape",
            "grad_input-strided",
            "grad_input-readonly",
            "grad_input-reversed",
            "grad_input-negbit",
            "grad_weight-dtype",
            "grad_weight-shape",
            "gi-overlaps-g",
            "mean-size",
            "dw-without-w",
            "nd-0",
            "nd-float",
            "arg-count",
        ],
        x.numel(),
        p=ctx.row_only,
    )
    if mut == "grad_input-strided" and math.prod(pshape) <= 1:
        mut = None  # one element per row: any row stride is a layout
    guards = {}
    pdt = w.dtype if w is not None else dtype
    gi = (
        _out(ctx, guards, "grad_input", shape, dtype, mut)
        if want[0] or mut and mut.startswith("grad_input")
        else None
    )
    gw = (
        _out(ctx, guards, "grad_weight", pshape, pdt, mut)
        if want[1] or mut and mut.startswith("grad_weight")
        else None
    )
    gb = _out(ctx, guards, "grad_bias", pshape, pdt, mut) if want[2] else None
    if mut and mut.startswith("grad_weight") and w is None:
        mut = "dw-without-w"
    ws = None
    if x.is_cuda:
        need = _query(
            lambda: _C.layer_norm_bwd_workspace(
                x, w, nd, det, gi is not None, gw is not None, gb is not None
            )
        )
        if need:
            gg = Guarded(ctx, [need], torch.uint8)
            guards["workspace"], ws = gg, gg.view
    a = dict(
        g=_maybe_numpy(ctx, g, reversed_ok=not mut),
        x=_maybe_numpy(ctx, x, reversed_ok=not mut),
        w=w,
        nd=nd,
        det=det,
        mean=mean,
        rstd=rstd,
        gi=gi,
        gw=gw,
        gb=gb,
        ws=ws,
    )
    if (
        mut == "gi-overlaps-g"
        and isinstance(a["g"], torch.Tensor)
        and gi is not None
    ):
        a["gi"] = a["g"]
    elif mut == "mean-size":
        a["mean"] = (
            mean[:-1] if rows else torch.zeros(1, dtype=sd, device=x.device)
        )
    elif mut == "dw-without-w" and gw is not None:
        a["w"] = None
    elif mut == "nd-0":
        a["nd"] = 0
    elif mut == "nd-float":
        a["nd"] = float(nd)
    elif mut in ("gi-overlaps-g", "dw-without-w", "mean-size") or (
        mut and mut.startswith("grad_input") and gi is None
    ):
        mut = None
    if getattr(ctx, "dropped", False):
        mut = None
    ctx.note(
        f"_C.layer_norm_bwd(g, x, w, nd={a['nd']}, det={det}, mean, "
        f"rstd, gi, gw, gb, ws) mutation={mut or '-'}"
    )
    for k in ("g", "x", "w", "mean", "rstd"):
        ctx.describe(k, a[k])

    def call():
        args = [
            a["g"],
            a["x"],
            a["w"],
            a["nd"],
            a["det"],
            a["mean"],
            a["rstd"],
            a["gi"],
            a["gw"],
            a["gb"],
            a["ws"],
        ]
        if mut == "arg-count":
            args = args[:3]
        return _C.layer_norm_bwd(*args)

    inputs = [t for t in (a["g"], a["x"], w, mean, rstd) if t is not None]
    x_ok = lay in ROW_LAYOUTS or isinstance(a["x"], np.ndarray)
    g_ok = glay in ROW_LAYOUTS or isinstance(a["g"], np.ndarray)
    what = f"layouts x={lay} g={glay}"
    if mut:
        expect_refusal(ctx, call, guards, inputs, mut)
    # C reads input (and weight) before grad_out
    pre = first_refusal([(a["x"], x_ok), (a["g"], g_ok)])
    if pre:
        expect_refusal(ctx, call, guards, inputs, what, pre)
    if not (x_ok and g_ok):
        may_refuse(ctx, call, guards, inputs, what)
    run_raw(ctx, call, guards, inputs)
    ref = torch.ops.aten.native_layer_norm_backward(
        g.double(),
        x.double(),
        pshape,
        mean.double().view(-1, *[1] * nd) if rows else mean.double(),
        rstd.double().view(-1, *[1] * nd) if rows else rstd.double(),
        None if w is None else w.double(),
        None if b is None else b.double(),
        [True, w is not None, b is not None],
    )
    for name, r in zip(("grad_input", "grad_weight", "grad_bias"), ref):
        if name in guards and r is not None:
            o = as_torch(guards[name].result())
            if (
                not rows
                and name != "grad_input"
                and not torch.equal(o.cpu(), torch.zeros_like(o.cpu()))
            ):
                raise oracle.WrongAnswer(f"{name}: not zeros over no rows")
            _written(name, o, r)
            close(
                name,
                o.to(r.device),
                r,
                None,
                o.dtype,
                reduce_len=rows if name != "grad_input" else 1,
                f64_atol=oracle.f64_ln_terms(g, x, w, mean, rstd, rows),
                bound=(
                    oracle.ln_dx_bound(g, x, w, mean, rstd, nd, dtype)
                    if name == "grad_input"
                    else oracle.ln_dw_bound(g, x, mean, rstd, nd, dtype, False)
                    if name == "grad_weight"
                    else oracle.ln_db_bound(g, nd, dtype)
                )
                if rows
                else None,
            )


# ------------------------------------------------------------------ prod
def case_c_prod(ctx):
    dtype = ctx.choice(FLOATS * 2 + INTS + (torch.bool,))
    ndim = ctx.rng.randint(1, 4)
    shape = ctx.shape(ndim, budget=ctx.choice([2000, 20000, 200000]))
    dim = None if ctx.chance(0.3) else ctx.rng.randrange(ndim)
    bwd = dtype.is_floating_point and ctx.chance(0.4)
    kept = [] if dim is None else shape[:dim] + shape[dim + 1 :]
    odt = dtype if dtype.is_floating_point else torch.int64
    mut = _pick(
        ctx,
        [
            "out-dtype",
            "out-shape",
            "out-strided",
            "out-readonly",
            "out-misaligned",
            "out-reversed",
            "out-negbit",
            "dim-neg",
            "dim-big",
            "dim-huge",
            "dim-float",
            "ws-dtype",
            "out-overlaps-input",
            "complex",
            "arg-count",
        ],
        math.prod(shape),
    )
    # a mutated call's other arguments are ones it takes as they are
    cuda_bwd = bwd and ctx.device != "cpu"
    x, lay = ctx.tensor(
        shape,
        dtype,
        kind="near_one",
        neg_ok=not mut,
        layout=ctx.choice(["contig", "offset"]) if mut and cuda_bwd else None,
    )
    xp = _maybe_numpy(ctx, x, reversed_ok=not mut)
    guards = {}
    if bwd:
        g, _ = ctx.tensor(
            kept, dtype, kind="near_one", layout="contig", nonfinite=0
        )
        out = _out(ctx, guards, "out", shape, dtype, mut)  # grad_in
    else:
        out = _out(ctx, guards, "out", kept, odt, mut)
    a = dict(x=xp, dim=dim, out=out, ws=None)
    if x.is_cuda:
        q = _C.prod_bwd_workspace if bwd else _C.prod_workspace
        need = _query(lambda: q(x, dim))
        if need:
            gg = Guarded(ctx, [need], torch.uint8)
            guards["workspace"], a["ws"] = gg, gg.view
    if mut == "dim-neg":
        a["dim"] = -1
    elif mut == "dim-big":
        a["dim"] = ndim + ctx.choice([0, 3, 2**40])
    elif mut == "dim-huge":
        a["dim"] = 2**64
    elif mut == "dim-float":
        a["dim"] = 0.0
    elif mut == "arg-count":
        pass
    elif mut == "ws-dtype":
        a["ws"] = torch.zeros(8, dtype=torch.int32, device=x.device)
    elif (
        mut == "out-overlaps-input"
        and isinstance(xp, torch.Tensor)
        and (bwd and lay == "contig")
    ):
        a["out"] = xp
    elif mut == "complex":
        a["x"] = torch.zeros(shape, dtype=torch.complex64, device=x.device)
    elif mut and not mut.startswith("out-") or mut == "out-overlaps-input":
        mut = None
    if (
        mut == "out-shape"
        and math.prod(guards["out"].shape) == math.prod(shape if bwd else kept)
        and not bwd
    ):
        mut = None  # same element count: C only checks numel
    if getattr(ctx, "dropped", False):
        mut = None
    fn = "prod_bwd" if bwd else "prod"
    ctx.note(f"_C.{fn}(x, dim={a['dim']!r}, ...) mutation={mut or '-'}")
    ctx.describe("x", a["x"])
    inputs = [xp] + ([g] if bwd else [])

    def call():
        if bwd:
            args = [a["x"], a["dim"], g, a["out"], a["ws"]]
            return _C.prod_bwd(*args[:-1] if mut == "arg-count" else args)
        args = [a["x"], a["dim"], a["out"], a["ws"]]
        return _C.prod(*args[:-1] if mut == "arg-count" else args)

    if bwd:
        ctx.describe("grad_out", g)
    # CUDA prod_bwd takes a contiguous input only
    x_ok = not (x.is_cuda and bwd and not x.is_contiguous())
    if mut:
        expect_refusal(ctx, call, guards, inputs, mut)
    pre = first_refusal([(xp, x_ok)])
    if pre:
        expect_refusal(ctx, call, guards, inputs, f"input layout {lay}", pre)
    if not x_ok:
        may_refuse(ctx, call, guards, inputs, "CUDA prod_bwd layout")
    run_raw(ctx, call, guards, inputs)
    o = as_torch(guards["out"].result()).to(x.device)
    chain = x.numel() if dim is None else shape[dim]
    if bwd:
        xl = x.detach().double().requires_grad_()
        r = xl.prod() if dim is None else xl.prod(dim)
        ref = torch.autograd.grad(r, xl, g.double().reshape(r.shape))[0]
        close("grad_in", o, ref, None, dtype, chain_len=chain)
        return
    theirs = torch.prod(x) if dim is None else torch.prod(x, dim)
    if not dtype.is_floating_point:
        oracle.exact("out", o.reshape(theirs.shape), theirs)
    else:
        ref = x.double().prod() if dim is None else x.double().prod(dim)
        close(
            "out",
            o.reshape(theirs.shape),
            ref,
            theirs,
            dtype,
            chain_len=chain,
            torch_slack=1.5,
        )


# ---------------------------------------------------------------- matmul
def case_c_matmul(ctx):
    dtype = ctx.choice([torch.float16, torch.bfloat16, torch.float32])
    m, k, n = ctx.shape(3, budget=ctx.choice([20000, 300000]), zero=0.04)
    batched = ctx.chance(0.4)
    bsz = ctx.choice([1, 2, 3]) if batched else None
    sa = ([bsz] if batched else []) + [m, k]
    sb = ([bsz] if batched else []) + [k, n]
    a, _ = ctx.tensor(
        sa,
        dtype,
        layout=ctx.choice(
            ["contig", "transposed", "sliced", "offset", "expand"]
        ),
        nonfinite=0.02,
    )
    b, _ = ctx.tensor(
        sb,
        dtype,
        layout=ctx.choice(
            ["contig", "transposed", "sliced", "offset", "expand"]
        ),
        nonfinite=0.02,
    )
    sched = ctx.choice([0, 1, 2, 3, 4])  # auto, dp, stream-k, hybrid, split-k
    two, ctas, loop = (
        ctx.chance(0.3),
        ctx.choice([0, 1, 2, 5]),
        # auto, ffma, mma, wgmma widths, wgmma-pingpong
        ctx.choice([0, 1, 2, 3, 4, 5, 6, 10]),
    )
    mut = _pick(
        ctx,
        [
            "out-dtype",
            "out-shape",
            "out-strided",
            "out-readonly",
            "out-misaligned",
            "out-reversed",
            "out-negbit",
            "sched-bad",
            "ctas-neg",
            "k-mismatch",
            "int-huge",
            "epoch-neg",
            "out-overlaps-input",
            "rank-4",
            "arg-count",
        ],
        m * n,
        p=0.35,
    )
    guards = {}
    out = _out(ctx, guards, "out", sa[:-1] + [n], dtype, mut)
    ap = _maybe_numpy(ctx, a, reversed_ok=not mut)
    bp = _maybe_numpy(ctx, b, reversed_ok=not mut)
    args = dict(
        a=ap,
        b=bp,
        out=out,
        sched=sched,
        two=two,
        ctas=ctas,
        loop=loop,
        epoch=0,
    )
    if mut == "sched-bad":
        args["sched"] = ctx.choice([5, -1, 99])
    elif mut == "ctas-neg":
        args["ctas"] = -3
    elif mut == "k-mismatch":
        args["b"] = torch.zeros(
            sb[:-2] + [k + 1, n], dtype=dtype, device=a.device
        )
    elif mut == "epoch-neg":
        args["epoch"] = -1
    elif mut == "int-huge":
        args[ctx.choice(["sched", "ctas", "loop"])] = 2**64
    elif mut == "arg-count":
        pass
    elif (
        mut == "out-overlaps-input"
        and isinstance(ap, torch.Tensor)
        and ap.is_contiguous()
        and m == k == n
    ):
        args["out"] = ap
    elif mut == "rank-4" and batched:
        args["a"] = a.reshape([1] + sa)
    elif mut and not mut.startswith("out-") or mut == "out-overlaps-input":
        mut = None
    if getattr(ctx, "dropped", False):
        mut = None
    ctx.note(
        f"_C.matmul(a, b, out, schedule={args['sched']}, two_tiles={two}, "
        f"ctas={args['ctas']}, mainloop={loop}, ...) "
        f"mutation={mut or '-'}"
    )
    ctx.describe("a", args["a"])
    ctx.describe("b", args["b"])
    inputs = [ap, bp]

    def call():
        c = [
            args["a"],
            args["b"],
            args["out"],
            args["sched"],
            args["two"],
            args["ctas"],
            args["loop"],
            None,
            None,
            args["epoch"],
            0,
            None,
        ]
        return _C.matmul(*c[:-1] if mut == "arg-count" else c)

    def plan():
        c = [
            args["a"],
            args["b"],
            args["out"],
            args["sched"],
            args["two"],
            args["ctas"],
            args["loop"],
        ]
        return _C.matmul_plan(*c[:-1] if mut == "arg-count" else c)

    if mut:
        if ctx.chance(0.3) and mut != "epoch-neg":  # plan takes no epoch
            expect_refusal(ctx, plan, guards, inputs, "plan: " + mut)
        expect_refusal(ctx, call, guards, inputs, mut)
    pre = first_refusal([(ap, True), (bp, True)])  # any strides >= 0
    if pre:
        if ctx.chance(0.3):
            expect_refusal(ctx, plan, guards, inputs, "plan: operands", pre)
        expect_refusal(ctx, call, guards, inputs, "operands", pre)
    p = run_raw(ctx, plan, guards, inputs)
    if not isinstance(p, dict):
        raise oracle.WrongAnswer(f"matmul_plan returned {type(p).__name__}")
    need = run_raw(ctx, call, guards, inputs)
    if need is not None:  # CUDA Stream-K: give it buffers, call again
        nbytes, count, stream = need
        wg = Guarded(ctx, [max(nbytes, 1)], torch.uint8)
        fg = Guarded(ctx, [max(count, 1)], torch.int32)
        fg.view.zero_()
        fg.before = fg.buf.cpu().clone()
        guards.update(workspace=wg, flags=fg)
        run_raw(
            ctx,
            lambda: _C.matmul(
                ap,
                bp,
                out,
                sched,
                two,
                ctas,
                loop,
                wg.view,
                fg.view,
                1,
                0,
                None,
            ),
            guards,
            inputs,
        )
    o = as_torch(guards["out"].result()).to(a.device)
    # _C's auto and wgmma-* caps run fp32 as TF32 where the GPU has wgmma
    tf32 = a.is_cuda and dtype == torch.float32 and loop not in (1, 2)
    mm_close("out", o, a, b, torch.matmul(a, b), tf32=tf32)


# ------------------------------------------------------------------ misc
def case_c_misc(ctx):
    """tensor_info against what torch / NumPy say of the same object, and
    the workspace queries (0 on the CPU, refusals for bad arguments)."""
    dtype = ctx.choice(FLOATS + INTS + (torch.bool,))
    shape = ctx.shape(ctx.rng.randint(0, 4), budget=5000)
    t, lay = ctx.tensor(shape, dtype)
    obj = _maybe_numpy(ctx, t) if ctx.chance(0.6) else t
    ctx.note(f"_C.tensor_info(obj) layout={lay}")
    ctx.describe("obj", obj)
    pre = first_refusal([(obj, True)])
    if pre:  # the negative bit, negative strides: refused everywhere
        expect_refusal(
            ctx, lambda: _C.tensor_info(obj), {}, [obj], "tensor_info", pre
        )
    info = run_raw(ctx, lambda: _C.tensor_info(obj), {}, [obj])
    if isinstance(obj, np.ndarray):
        want_shape = tuple(obj.shape)
        want_strides = tuple(s // obj.itemsize for s in obj.strides)
        addr = obj.__array_interface__["data"][0]
    else:
        want_shape, want_strides = tuple(obj.shape), tuple(obj.stride())
        addr = obj.data_ptr()
    got = (tuple(info[3]), tuple(info[4]), info[5])
    if math.prod(want_shape) > 1:
        want_strides = tuple(
            s if n != 1 else got[1][i]
            for i, (s, n) in enumerate(zip(want_strides, want_shape))
        )
    else:
        want_strides = got[1]
    if got != (want_shape, want_strides, addr):
        raise oracle.WrongAnswer(
            f"tensor_info: {got} != {(want_shape, want_strides, addr)}"
        )
    q = ctx.choice(["ln_bwd", "prod", "prod_bwd"])
    nd = ctx.choice([1, len(shape), len(shape) + 1, 0])
    d = None
    if q == "ln_bwd":
        call = lambda: _C.layer_norm_bwd_workspace(  # noqa: E731
            obj, None, nd, False, True, False, False
        )
    else:
        d = ctx.choice([None, 0, len(shape) - 1, len(shape), -1])
        f = _C.prod_workspace if q == "prod" else _C.prod_bwd_workspace
        call = lambda: f(obj, d)  # noqa: E731
    ctx.note(f"  workspace query {q} nd={nd} dim={d}")
    # the query checks what the call would: the table's refusals
    if q.startswith("ln"):
        if not dtype.is_floating_point:
            expect_refusal(
                ctx,
                call,
                {},
                [obj],
                f"{q} workspace: {dtype}",
                "unsupported-dtype",
            )
        if not 1 <= nd <= len(shape):
            expect_refusal(
                ctx, call, {}, [obj], f"{q} workspace: nd={nd}", "ndim"
            )
        if lay not in ROW_LAYOUTS and not isinstance(obj, np.ndarray):
            may_refuse(ctx, call, {}, [obj], f"{q} workspace: layout {lay}")
    elif d is not None and not 0 <= d < len(shape):
        expect_refusal(
            ctx, call, {}, [obj], f"{q} workspace: dim={d}", "dim-range"
        )
    elif q == "prod_bwd" and not (dtype.is_floating_point or dtype.is_complex):
        expect_refusal(
            ctx, call, {}, [obj], f"{q} workspace: {dtype}", "no-grad"
        )
    r = run_raw(ctx, call, {}, [obj])
    if not isinstance(r, int) or r < 0 or (t.device.type == "cpu" and r):
        raise oracle.WrongAnswer(f"workspace query {q} returned {r!r}")
