"""Cases for the public API: layer_norm, native_layer_norm,
layer_norm_backward, nn.LayerNorm, prod, mm, bmm, matmul, forward and
backward (torch.autograd.grad), good and bad arguments, against torch.

A case function takes a Ctx, logs what it calls (ctx.note) and ends by
raising an oracle Outcome or returning (passed)."""

import math

import numpy as np
import torch
import torch.nn.functional as F

import gemsops
from gemsops.ops import matmul as gmm

from . import oracle
from .oracle import close, differential, mm_close, same_meta
from .tensors import FLOATS, INTS, describe

HALF = (torch.float16, torch.bfloat16)


def _leaves(ts, dtype=None):
    """Fresh autograd leaves with the same values (and layout) as ts."""
    out = []
    for t in ts:
        if t is None:
            out.append(None)
            continue
        d = t.detach()
        d = (
            d.double()
            if dtype == torch.float64
            else d.clone()
            if d.is_neg()
            else d
        )
        out.append(d.requires_grad_())
    return out


def _zero_deviation_times_inf(h, w, nd, centered):
    """LayerNorm's y where the weight is infinite and the element equals
    its row's mean exactly: 0 * inf, NaN in the float64 reference, while
    a mean off by its last bit (any fp32 sum of N values can be) gives
    +-inf; torch's CPU kernel gives inf there, its CUDA kernel NaN (seed
    32 case 156). Those positions are left out of the comparison."""
    if not centered or w is None or torch.isfinite(w).all():
        return None
    dims = tuple(range(h.dim() - nd, h.dim()))
    m = h.double().mean(dims, keepdim=True)
    return ((h.double() - m) == 0) & ~torch.isfinite(w.double())


def _grads(out, leaves, g):
    want = [t for t in leaves if t is not None]
    got = iter(torch.autograd.grad(out, want, g, allow_unused=True))
    return [next(got) if t is not None else None for t in leaves]


# ---------------------------------------------------------------- LayerNorm
def _ln_shape_arg(ctx, pshape, lead=None):
    """normalized_shape in a random (valid or invalid) form; returns
    (value, label). lead: the input's dim before pshape (None when pshape
    is the whole shape), which a too-long shape must not repeat, or it
    names the input's trailing dims and is valid (seed 4305 case 30071)."""
    forms = ["list", "tuple", "size"] + (["int"] if len(pshape) == 1 else [])
    if ctx.chance(0.12):
        forms = ["ndarray", "tensor", "float", "wrong", "empty", "too-long"]
    f = ctx.choice(forms)
    if f == "int":
        return pshape[0], f
    if f == "list":
        return list(pshape), f
    if f == "tuple":
        return tuple(pshape), f
    if f == "size":
        return torch.Size(pshape), f
    if f == "ndarray":
        return np.array(pshape, dtype=np.int64), f
    if f == "tensor":
        return torch.tensor(pshape), f
    if f == "float":
        return float(pshape[-1]), f
    if f == "wrong":
        return list(pshape[:-1]) + [pshape[-1] + 1], f
    if f == "empty":
        return [], f
    return [2 if lead is None else lead + 1] + list(pshape), f


def _eps(ctx):
    if ctx.chance(0.15):
        return ctx.choice([-1.0, -1e-5, float("nan"), float("inf"), 0.0])
    return ctx.choice([1e-5, 1e-5, 1e-6, 1e-3, 0.1])


def case_layer_norm(ctx):
    dtype = ctx.choice(FLOATS)
    if ctx.chance(0.05):
        dtype = ctx.choice([torch.int64, torch.int32, torch.complex64])
    ndim = ctx.rng.randint(1, 4)
    nd = ctx.rng.randint(1, ndim)
    shape = ctx.shape(ndim, budget=ctx.choice([4000, 30000, 30000, 300000]))
    if dtype.is_complex:
        x = torch.complex(
            ctx.values(shape, torch.float32), ctx.values(shape, torch.float32)
        ).to(dtype)
        x = x.to(ctx.device)
    else:
        x, _ = ctx.tensor(shape, dtype)
    pshape = shape[ndim - nd :]
    pdtype = dtype
    if dtype in HALF and ctx.chance(0.3):
        pdtype = torch.float32  # mixed precision
    if ctx.chance(0.04):
        pdtype = ctx.choice(FLOATS)  # maybe a mismatch
    affine = ctx.choice(["none", "weight", "both", "both", "bias"])
    w = b = None
    if affine in ("weight", "both") and pdtype.is_floating_point:
        w, _ = ctx.tensor(pshape, pdtype, nonfinite=0.01)
    if affine in ("bias", "both") and pdtype.is_floating_point:
        b, _ = ctx.tensor(pshape, pdtype, nonfinite=0.01)
    if ctx.chance(0.03) and w is not None:
        w = w.reshape(-1)[: max(w.numel() - 1, 0)]  # wrong weight shape
    ns, ns_form = _ln_shape_arg(
        ctx, pshape, shape[ndim - nd - 1] if ndim > nd else None
    )
    eps = _eps(ctx)
    variant = ctx.choice(
        ["F", "F", "native", "module", "grad", "grad", "backward"]
    )
    ctx.note(
        f"layer_norm variant={variant} normalized_shape={ns!r} "
        f"({ns_form}) eps={eps!r}"
    )
    for name, t in (("input", x), ("weight", w), ("bias", b)):
        ctx.describe(name, t)
    tags = {"ln-mixed"} if pdtype != dtype and dtype in HALF else set()
    inputs = [t for t in (x, w, b) if t is not None]
    rows = math.prod(shape[: ndim - nd])

    sd = torch.float64 if dtype == torch.float64 else torch.float32

    def out_bound(weight):
        # a negative eps cancels against the variance (seed 53 case 364:
        # eps -1, torch's own output 1.2e-5 off in float32)
        return oracle.ln_out_bound(x, nd, weight, eps, sd)

    # rows whose var + eps is 0 within rounding: finite or NaN by chance
    singular = oracle.ln_singular_rows(x, nd, eps, sd)
    singular_rows = None if singular is None else singular[(...,) + (0,) * nd]
    # and an infinite weight times an element equal to its row's mean: NaN
    # or +-inf by the mean's last bit (seed 4407 case 18796, as the fused
    # add's)
    zero_inf = (
        _zero_deviation_times_inf(x, w, nd, True)
        if w is not None and tuple(w.shape) == tuple(pshape)
        else None
    )
    out_skip = (
        singular
        if zero_inf is None
        else zero_inf
        if singular is None
        else singular | zero_inf
    )

    def ref_fwd():
        return oracle.ln_reference(x, pshape, w, b, eps)[0]

    if variant == "F":

        def check(ours, theirs):
            same_meta("out", ours, theirs)
            close(
                "out",
                ours,
                ref_fwd(),
                theirs,
                dtype,
                torch_slack=2.0,
                bound=out_bound(w),
                skip=out_skip,
            )

        differential(
            ctx,
            lambda: F.layer_norm(x, ns, w, b, eps),
            lambda: gemsops.layer_norm(x, ns, w, b, eps),
            check,
            inputs,
            tags,
        )
    elif variant == "native":
        if dtype in HALF:
            tags.add("ln-half-stats")

        def check(ours, theirs):
            same_meta("out", ours[0], theirs[0])
            rout, rmean, rrstd = oracle.ln_reference(x, pshape, w, b, eps)
            close(
                "out",
                ours[0],
                rout,
                theirs[0],
                dtype,
                torch_slack=2.0,
                bound=out_bound(w),
                skip=out_skip,
            )
            for name, o, r, t in (
                ("mean", ours[1], rmean, theirs[1]),
                ("rstd", ours[2], rrstd, theirs[2]),
            ):
                if dtype in HALF and o.dtype == sd:
                    t = t.to(sd)  # documented: fp32 statistics
                same_meta(name, o, t)
                # a negative eps cancels against the variance (seed 43
                # case 12: eps -1, var 1.017, rstd 8.8e-6 from float64)
                bound = (
                    oracle.rstd_bound(r, eps, math.prod(pshape), sd)
                    if name == "rstd"
                    else oracle.mean_bound(x, len(pshape), sd)
                )
                close(
                    name,
                    o,
                    r,
                    t.to(o.dtype),
                    sd,
                    torch_slack=2.0,
                    loose=True,
                    bound=bound,
                    skip=None
                    if singular_rows is None
                    else singular_rows.reshape(o.shape),
                )

        differential(
            ctx,
            lambda: torch.native_layer_norm(x, ns, w, b, eps),
            lambda: gemsops.native_layer_norm(x, ns, w, b, eps),
            check,
            inputs,
            tags,
        )
    elif variant == "module":
        _ln_module(ctx, x, pshape, ns, pdtype, affine, eps, dtype, tags)
    elif variant == "grad":
        g, _ = ctx.tensor(shape, x.dtype, nonfinite=0.01)
        ctx.describe("grad_out", g)
        inputs.append(g)
        mask = [
            True,
            w is not None and ctx.chance(0.8),
            b is not None and ctx.chance(0.8),
        ]
        if not any(mask[1:]) or ctx.chance(0.8):
            mask[0] = True
        else:
            mask[0] = ctx.chance(0.3)
        if not any(mask):
            mask[0] = True
        ctx.note(f"  autograd.grad wrt (x, w, b) = {mask}")
        if mask[2] and not mask[1] and 0 in b.stride():
            tags.add("ln-expanded-bias-grad")

        def run(fn, dt=None):
            lv = _leaves((x, w, b), dt)
            if dt is not None:  # the float64 reference
                lv[0] = oracle.row_centred(lv[0], len(pshape))
            for i, m in enumerate(mask):
                if lv[i] is not None and not m:
                    lv[i].requires_grad_(False)
            sel = [
                t if (t is not None and m) else None for t, m in zip(lv, mask)
            ]
            out = fn(lv[0], ns if dt is None else pshape, lv[1], lv[2], eps)
            return out, _grads(out, sel, g if dt is None else g.double())

        def check(ours, theirs):
            same_meta("out", ours[0], theirs[0])
            ref = run(F.layer_norm, torch.float64)
            _, m, r = torch.native_layer_norm(
                x.detach().double(), pshape, None, None, eps
            )
            f64_atol = (
                oracle.f64_ln_terms(g, x, w, m, r, rows)
                if dtype == torch.float64
                else None
            )
            bound = (
                oracle.ln_dx_bound(g, x, w, m, r, len(pshape), dtype, True)
                if rows
                else None
            )
            dw_bound = (
                oracle.ln_dw_bound(g, x, m, r, len(pshape), dtype)
                if rows
                else None
            )
            db_bound = (
                oracle.ln_db_bound(g, len(pshape), dtype) if rows else None
            )
            close(
                "out",
                ours[0],
                ref[0],
                theirs[0],
                dtype,
                torch_slack=2.0,
                bound=out_bound(w),
                skip=out_skip,
            )
            for name, o, r, t in zip(
                ("dx", "dw", "db"), ours[1], ref[1], theirs[1]
            ):
                if t is None:
                    if o is not None:
                        raise oracle.WrongAnswer(f"{name}: not asked for")
                    continue
                same_meta(name, o, t)
                # an infinite weight: see _ln_backward
                close(
                    name,
                    o,
                    r,
                    t,
                    t.dtype,
                    torch_slack=2.0,
                    reduce_len=rows if name != "dx" else 1,
                    loose=name == "dx"
                    and (_nonfinite(w, g) or _singular(eps)),
                    f64_atol=f64_atol if name != "db" else None,
                    bound={"dx": bound, "dw": dw_bound, "db": db_bound}.get(
                        name
                    ),
                    # a singular row's xhat, finite or NaN by rounding,
                    # reaches its dx and every column of dw
                    skip=None
                    if singular is None or name == "db"
                    else singular
                    if name == "dx"
                    else torch.ones(o.shape, dtype=torch.bool),
                )

        differential(
            ctx,
            lambda: run(F.layer_norm),
            lambda: run(gemsops.layer_norm),
            check,
            inputs,
            tags,
        )
    else:
        _ln_backward(ctx, x, pshape, ns, w, b, eps, dtype, rows, inputs, tags)


def _ln_module(ctx, x, pshape, ns, pdtype, affine, eps, dtype, tags):
    kw = dict(
        eps=eps,
        elementwise_affine=affine != "none",
        bias=affine in ("both", "bias"),
        dtype=pdtype,
    )
    ctx.note(f"  nn.LayerNorm({ns!r}, **{kw})")

    def make(cls):
        torch.manual_seed(ctx.index)
        m = cls(ns, **kw)
        if m.weight is not None:
            with torch.no_grad():
                m.weight.copy_(ctx_vals[0])
                if m.bias is not None:
                    m.bias.copy_(ctx_vals[1])
        return m.to(ctx.device)

    ctx_vals = (
        ctx.values(pshape, torch.float64, nonfinite=0),
        ctx.values(pshape, torch.float64, nonfinite=0),
    )

    def check(ours, theirs):
        same_meta("out", ours, theirs)
        tm = make(torch.nn.LayerNorm).double()
        ref = tm(x.double())
        sd = torch.float64 if dtype == torch.float64 else torch.float32
        bound = oracle.ln_out_bound(x, len(pshape), tm.weight, eps, sd)
        close(
            "out",
            ours,
            ref,
            theirs,
            dtype,
            torch_slack=2.0,
            bound=bound,
            skip=oracle.ln_singular_rows(x, len(pshape), eps, sd),
        )

    differential(
        ctx,
        lambda: make(torch.nn.LayerNorm)(x).detach(),
        lambda: make(gemsops.nn.LayerNorm)(x).detach(),
        check,
        [x],
        tags,
    )


def _ln_backward(ctx, x, pshape, ns, w, b, eps, dtype, rows, inputs, tags):
    mask = [ctx.chance(0.8), ctx.chance(0.8), ctx.chance(0.8)]
    g, _ = ctx.tensor(list(x.shape), x.dtype, nonfinite=0.01)
    ctx.describe("grad_out", g)
    try:  # torch's statistics (the input's dtype on the CPU for halves)
        _, mean, rstd = torch.native_layer_norm(
            x, pshape, w, b, max(eps, 0.0) if eps == eps else 1e-5
        )
    except RuntimeError as e:
        mean = rstd = torch.zeros(1, device=x.device)
        ctx.note(f"  (torch.native_layer_norm refused: {e})")
        if "mixed dtype" in str(e):
            tags = tuple(tags) + ("ln-fwd-refused",)
    ctx.note(
        f"  layer_norm_backward output_mask={mask}, mean/rstd {describe(mean)}"
    )
    inputs = inputs + [g, mean, rstd]
    # torch's CPU backward cannot take the half statistics its forward
    # returns: it gets them widened, gemsops as they are (it widens them)
    tmean, trstd = (
        (s.float() if s.dtype in HALF else s) for s in (mean, rstd)
    )
    # torch's op fails ("tensor does not have a device") when asked for
    # dW without a weight; gemsops returns None there, as torch would
    mask = [mask[0], mask[1] and w is not None, mask[2] and b is not None]

    def theirs():
        return _bias_grad_shaped(torch_backward(), g, x, ns, tmean, trstd, b)

    def torch_backward():
        if dtype not in HALF:
            return torch.ops.aten.native_layer_norm_backward(
                g, x, ns, tmean, trstd, w, b, mask
            )
        # torch's CPU half backward fails on its own statistics ("tensor
        # does not have a device", "expected scalar type Half"): validate
        # the arguments with the half call's float32 twin, cast back
        f = [None if t is None else t.float() for t in (g, x, w, b)]
        out = torch.ops.aten.native_layer_norm_backward(
            f[0], f[1], ns, tmean, trstd, f[2], f[3], mask
        )
        return [
            None if o is None else o.to(t.dtype)
            for o, t in zip(
                out, (x, w if w is not None else x, b if b is not None else x)
            )
        ]

    def ours():
        return gemsops.layer_norm_backward(g, x, ns, mean, rstd, w, b, mask)

    # dx = rstd (w dy - mean(w dy) - xhat mean(w dy xhat)): with an
    # infinite weight or dy the means are infinite and which of inf and NaN
    # comes out of inf - inf depends on the order of the terms, which
    # torch's and gemsops' kernels choose differently; only finite vs
    # non-finite is compared there (README: deliberate differences)
    w_nonfinite = _nonfinite(w, g)
    bound = (
        oracle.ln_dx_bound(g, x, w, mean, rstd, len(pshape), dtype)
        if rows and mean.numel() == rows
        else None
    )
    f64_atol = None
    if dtype == torch.float64 and g.numel():
        wdy = g.abs().max() * (
            w.abs().max() if w is not None and w.numel() else 1.0
        )
        f64_atol = (
            float(
                64
                * torch.finfo(torch.float64).eps
                * wdy
                * rstd.double().abs().max()
            )
            if rstd.numel()
            else None
        )

    def check(o, t):
        d64 = [
            None if v is None else v.double() for v in (g, x, mean, rstd, b)
        ]
        ref = torch.ops.aten.native_layer_norm_backward(
            d64[0],
            d64[1],
            pshape,
            d64[2],
            d64[3],
            None if w is None else w.double(),
            d64[4],
            mask,
        )
        ref = _bias_grad_shaped(ref, *d64[:2], pshape, *d64[2:])
        if rows and mean.numel() == rows and g.shape == x.shape:
            # dx and dW from xhat = (x - mean) * rstd as written: torch's
            # float64 op folds rstd into x * rstd - mean * rstd, whose
            # rounding is not the answer's where |mean| * rstd is large
            # (1e-9 over 255 rows of x = mean, seed 11 case 1953; 1e-7 in
            # dx at mean 100, rstd 195, seed 33 case 3403)
            ref = list(ref)
            nd = len(pshape)
            lead = tuple(range(x.dim() - nd))
            dims = tuple(range(x.dim() - nd, x.dim()))
            sh = tuple(x.shape[: len(lead)]) + (1,) * nd
            r = rstd.double().reshape(sh)
            xhat = (x.double() - mean.double().reshape(sh)) * r
            gd = g.double()
            if ref[0] is not None:
                wdy = gd * (w.double() if w is not None else 1.0)
                ref[0] = r * (
                    wdy
                    - wdy.mean(dims, keepdim=True)
                    - xhat * (wdy * xhat).mean(dims, keepdim=True)
                )
            if ref[1] is not None:
                ref[1] = (gd * xhat).sum(lead) if lead else gd * xhat
        bounds = {"dx": bound}
        if rows and g.shape == x.shape:
            bounds["db"] = oracle.ln_db_bound(g, len(pshape), dtype)
            if mean.numel() == rows:
                # both sides read the same statistics: no stored term
                bounds["dw"] = oracle.ln_dw_bound(
                    g, x, mean, rstd, len(pshape), dtype, stored=False
                )
        for name, oo, rr, tt in zip(("dx", "dw", "db"), o, ref, t):
            if tt is None:
                if oo is not None:
                    raise oracle.WrongAnswer(f"{name}: not asked for, got one")
                continue
            same_meta(name, oo, tt)
            close(
                name,
                oo,
                rr,
                tt,
                tt.dtype,
                torch_slack=2.0,
                reduce_len=rows if name != "dx" else 1,
                loose=name == "dx" and (w_nonfinite or _singular(eps)),
                f64_atol=f64_atol if name == "dx" else None,
                bound=bounds.get(name),
            )

    differential(ctx, theirs, ours, check, inputs, tags)


def _bias_grad_shaped(out, g, x, ns, mean, rstd, b):
    """torch's backward outputs, db taken from its CPU op where its CUDA
    op, which allocates db like the weight, returned an empty db for a
    bias without a weight (its CPU op returns the bias's shape, as
    gemsops does on both devices)."""
    out = list(out)
    if b is None or out[2] is None or out[2].shape == b.shape:
        return out
    cpu = [
        t.cpu().float() if t.dtype in HALF else t.cpu()
        for t in (g, x, mean, rstd, b)
    ]
    db = torch.ops.aten.native_layer_norm_backward(
        cpu[0], cpu[1], ns, cpu[2], cpu[3], None, cpu[4], [False, False, True]
    )[2]
    out[2] = db.to(device=b.device, dtype=b.dtype)
    return out


# ------------------------------------------- RMSNorm and the fused adds
def case_norms(ctx):
    """gemsops.rms_norm, fused_add_layer_norm and fused_add_rms_norm
    against torch's expression (the add, then the norm), forward and
    gradients."""
    dtype = ctx.choice(FLOATS)
    if ctx.chance(0.04):
        dtype = ctx.choice([torch.int64, torch.int32])
    ndim = ctx.rng.randint(1, 3)
    nd = ctx.rng.randint(1, ndim)
    shape = ctx.shape(ndim, budget=ctx.choice([4000, 30000, 300000]))
    x, _ = ctx.tensor(shape, dtype)
    pshape = shape[ndim - nd :]
    pdtype = dtype
    if dtype in HALF and ctx.chance(0.3):
        pdtype = torch.float32
    op = ctx.choice(["rms", "rms", "add_ln", "add_rms"])
    w = b = None
    if pdtype.is_floating_point and ctx.chance(0.8):
        w, _ = ctx.tensor(pshape, pdtype, nonfinite=0.01)
    if op == "add_ln" and pdtype.is_floating_point and ctx.chance(0.7):
        b, _ = ctx.tensor(pshape, pdtype, nonfinite=0.01)
    res = None
    if op != "rms":
        res, _ = ctx.tensor(shape, dtype)
    # (eps < 0, NaN: the layer_norm family's; an ill-posed row is not this
    # family's subject)
    eps = ctx.choice([1e-6, 1e-5, 1e-3] + ([None] if op != "add_ln" else []))
    grad = ctx.chance(0.5) and dtype.is_floating_point
    ctx.note(f"norms op={op} eps={eps!r} grad={grad} pshape={pshape}")
    for name, t in (
        ("input", x),
        ("residual", res),
        ("weight", w),
        ("bias", b),
    ):
        ctx.describe(name, t)
    inputs = [t for t in (x, res, w, b) if t is not None]
    tags = {"ln-mixed"} if pdtype != dtype and dtype in HALF else set()
    teps = eps
    if eps is None and dtype.is_floating_point:
        # torch's default: the eps of the type it computes in
        teps = torch.finfo(torch.float32 if dtype in HALF else dtype).eps
    gs = []
    if grad:
        for i in range(1 if op == "rms" else 2):
            g, _ = ctx.tensor(shape, dtype, nonfinite=0.01)
            ctx.describe(f"grad_out{i}", g)
            gs.append(g)
            inputs.append(g)

    def torch_fn(x, res, w, b):
        if op == "rms":
            return (F.rms_norm(x, pshape, w, eps),)
        h = x + res
        if op == "add_rms":
            return F.rms_norm(h, pshape, w, eps), h
        return F.layer_norm(h, pshape, w, b, eps), h

    def gems_fn(x, res, w, b):
        if op == "rms":
            return (gemsops.rms_norm(x, pshape, w, eps),)
        if op == "add_rms":
            return gemsops.fused_add_rms_norm(x, res, pshape, w, eps)
        return gemsops.fused_add_layer_norm(x, res, pshape, w, b, eps)

    def run(fn):
        lv = _leaves((x, res, w, b))
        out = list(fn(*lv))
        return out, (_grads(out, lv, gs) if grad else None)

    def check(ours, theirs):
        # the float64 reference at torch's h (the sum rounded to the
        # dtype, as both compute it), not at the exact sum; on the CPU,
        # where torch's rms_norm is the plain formula (a row holding inf
        # is 0 at its finite elements: x / inf), as gemsops on any device.
        # torch's CUDA kernels differ among themselves there: some give
        # NaN across such a row (misaligned operands, seed 11 case 25)
        h = (x if op == "rms" else theirs[0][1]).detach().cpu()
        wc, bc = (None if t is None else t.detach().cpu() for t in (w, b))
        gs_ = [g.cpu() for g in gs]
        hl = _leaves((h, wc, bc), torch.float64)
        h_ref = hl[0].detach()
        if op == "add_ln":
            hl[0] = oracle.row_centred(hl[0], nd)  # ln_reference's reason
            y = F.layer_norm(hl[0], pshape, hl[1], hl[2], teps)
        else:
            y = F.rms_norm(hl[0], pshape, hl[1], teps)
        rows = math.prod(shape[: ndim - nd])
        refs = [y] + ([h_ref] if op != "rms" else [])
        skips = [_zero_deviation_times_inf(h_ref, wc, nd, op == "add_ln")]
        for i, (o, r, t) in enumerate(zip(ours[0], refs, theirs[0])):
            same_meta(f"out{i}", o, t)
            close(
                f"out{i}",
                o,
                r.detach(),
                t,
                dtype,
                torch_slack=2.0,
                skip=skips[i] if i < len(skips) else None,
            )
        if not grad:
            return
        dh, dw, db = _grads([y], hl, [gs_[0].double()])
        if op != "rms" and dh is not None:
            dh = dh + gs_[1].double()
        dims = tuple(range(ndim - nd, ndim))
        hd = h.detach().double()
        if op == "add_ln":
            m = hd.mean(dims)
            r = torch.rsqrt(
                (hd - m.reshape(m.shape + (1,) * nd)).square().mean(dims)
                + teps
            )
        else:
            m = torch.zeros(hd.shape[: ndim - nd], dtype=torch.float64)
            r = torch.rsqrt(hd.square().mean(dims) + teps)
        bound = oracle.ln_dx_bound(gs_[0], h, wc, m, r, nd, dtype, True)
        dw_bound = oracle.ln_dw_bound(gs_[0], h, m, r, nd, dtype)
        f64_atol = (
            oracle.f64_ln_terms(gs_[0], h, wc, m, r, rows)
            if dtype == torch.float64
            else None
        )
        refs = [dh, dh if op != "rms" else None, dw, db]
        for name, o, rr, t in zip(
            ("dx", "dres", "dw", "db"), ours[1], refs, theirs[1]
        ):
            if t is None or rr is None:
                continue
            same_meta(name, o, t)
            close(
                name,
                o,
                rr,
                t,
                t.dtype,
                torch_slack=2.0,
                reduce_len=rows if name in ("dw", "db") else 1,
                bound={
                    "dx": bound,
                    "dres": bound,
                    "dw": dw_bound,
                    "db": oracle.ln_db_bound(gs_[0], nd, dtype),
                }.get(name),
                f64_atol=f64_atol if name != "db" else None,
                loose=_nonfinite(w, *gs),
            )

    differential(
        ctx,
        lambda: run(torch_fn),
        lambda: run(gems_fn),
        check,
        inputs,
        tags,
    )


def _nonfinite(*ts):
    """Any of the (float) tensors holds inf or NaN: a LayerNorm dx is then
    inf - inf in some order, inf or NaN by that order (docs/design.md)."""
    return any(
        t is not None
        and t.is_floating_point()
        and not bool(torch.isfinite(t).all())
        for t in ts
    )


def _singular(eps):
    """eps not above 0 (negative, 0 or NaN): a row whose variance plus eps
    is 0 has an infinite rstd, and its dx is inf - inf as above (seed 4304
    case 10287: eps -1, a bf16 row [156, 154])."""
    return not eps > 0


# --------------------------------------------------------------------- prod
def _dim_arg(ctx, ndim):
    n = max(ndim, 1)
    f = ctx.choice(
        ["int", "int", "neg", "np", "bool", "range", "float"]
        if ctx.chance(0.15)
        else ["int", "int", "neg"]
    )
    d = ctx.rng.randrange(n)
    if f == "neg":
        return d - n, f
    if f == "np":
        return ctx.choice([np.int64, np.int32, np.int8])(d), f
    if f == "bool":
        return ctx.choice([True, False]), f
    if f == "range":
        return ctx.choice([n, -n - 1, n + 5, 2**40]), f
    if f == "float":
        return float(d), f
    return d, f


def case_prod(ctx):
    dtype = ctx.choice(FLOATS * 3 + INTS + (torch.bool,))
    ndim = ctx.choice([0, 1, 1, 2, 2, 3, 4])
    shape = ctx.shape(ndim, budget=ctx.choice([2000, 20000, 200000]))
    kind = "near_one"
    x, _ = ctx.tensor(shape, dtype, kind=kind)
    tags = set()
    if ctx.chance(0.02):
        x = (
            torch.complex(x.double(), x.double()).to(torch.complex64)
            if dtype.is_floating_point
            else x
        )
        tags.add("prod-complex")
    full = ctx.chance(0.3)
    dim, dform = _dim_arg(ctx, ndim)
    kd_form = ctx.choice(
        ["omit", "pos", "kw"] + (["none", "int"] if ctx.chance(0.1) else [])
    )
    keepdim = {"none": None, "int": 1}.get(kd_form, ctx.chance(0.5))
    dt = None
    if ctx.chance(0.25):
        dt = ctx.choice(
            list(FLOATS) + [torch.int16, torch.int32, torch.int64, torch.bool]
        )
    grad = x.is_floating_point() and ctx.chance(0.3)
    args, kw = [x], {}
    if not full:
        args.append(dim)
        if kd_form == "pos":
            args.append(keepdim)
        elif kd_form != "omit":
            kw["keepdim"] = keepdim
    if dt is not None:
        kw["dtype"] = dt
    ctx.note(
        f"prod args=(input, {', '.join(repr(a) for a in args[1:])}) "
        f"kwargs={kw} dim-form={'full' if full else dform} grad={grad}"
    )
    ctx.describe("input", x)
    if x.is_complex():
        differential(
            ctx,
            lambda: torch.prod(*args, **kw),
            lambda: gemsops.prod(*args, **kw),
            lambda o, t: None,
            [x],
            tags,
        )
        return
    g = None

    def run(fn, double=False):
        if not grad:
            return fn(*args, **kw), None
        leaf = _leaves([x], torch.float64 if double else None)[0]
        out = fn(leaf, *args[1:], **kw)
        gg = g.to(out.dtype) if not double else g.double()
        return out, torch.autograd.grad(out, leaf, gg)[0]

    if grad:
        try:
            shp = torch.prod(*args, **kw).shape
            g, _ = ctx.tensor(
                list(shp),
                x.dtype if dt is None or not dt.is_floating_point else dt,
                kind="near_one",
                nonfinite=0.0,
            )
            ctx.describe("grad_out", g)
        except Exception:  # noqa: BLE001 - torch refuses: no gradient
            grad = False

    chain = (
        x.numel()
        if full or not shape
        else shape[int(dim) % ndim]
        if isinstance(dim, (int, np.integer))
        and not isinstance(dim, bool)
        and -ndim <= int(dim) < ndim
        else 1
    )

    def chain_bound(ref, dtype):
        """A factor repeated through a zero stride makes the chain's
        roundings correlate (seed 53 case 287: 509 copies of each of 7
        values, torch's own product 2.05e-5 off against a random walk's
        3e-5): then the worst case, a rounding a factor, bounds the error.
        None for other inputs."""
        if chain <= 1 or not dtype.is_floating_point:
            return None
        if full or not shape:
            reduced = range(x.dim())
        else:
            reduced = [int(dim) % ndim]
        if not any(x.shape[d] > 1 and x.stride(d) == 0 for d in reduced):
            return None
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        u = torch.finfo(acc).eps / 2
        return chain * u * ref.detach().double().abs()

    def check(ours, theirs):
        o, t = ours[0], theirs[0]
        same_meta("out", o, t)
        xr = x if dt is None else x.to(dt)
        whole = full or not shape  # one product of every element
        xc = xr.detach().cpu()
        if not t.is_floating_point():
            oracle.exact("out", o, t)
        elif (
            whole
            and bool((xc == 0).any())
            and bool(xc.isfinite().all())
            and o.detach().cpu().item() == 0
        ):
            # finite factors and a zero: the product is exactly +-0, which
            # gemsops gives (CUDA) where torch's and float64's partial
            # products overflow to inf before they meet the zero (inf * 0:
            # NaN); NaN, torch's answer, is checked as torch's below
            pass
        else:
            ref = torch.prod(
                *([xr.double()] + args[1:]),
                **{k: v for k, v in kw.items() if k != "dtype"},
            )
            close(
                "out",
                o,
                ref,
                t,
                t.dtype,
                chain_len=chain,
                torch_slack=1.5,
                bound=chain_bound(ref, t.dtype),
            )
        if grad:  # in dtype= when given, then cast back to x's dtype
            leaf = x.detach().double().requires_grad_()
            xx = leaf if dt is None else leaf.to(dt).double()
            r = torch.prod(
                *([xx] + args[1:]),
                **{k: v for k, v in kw.items() if k != "dtype"},
            )
            ref_g = torch.autograd.grad(r, leaf, g.double())[0]
            gdt = dt if dt is not None and dt.is_floating_point else x.dtype
            if gdt in HALF or x.dtype in HALF:
                gdt = gdt if gdt in HALF else x.dtype
            same_meta("grad", ours[1], theirs[1])
            # where x itself is inf/NaN torch's g * prod / x is NaN; the
            # zero-safe backward gives the product of the others
            skip = ~torch.isfinite(x.detach().cpu())
            if whole and skip.any() and int((xc == 0).sum()) > 1:
                # torch's full-product backward returns zeros outright when
                # two or more factors are 0; gemsops' product of the others
                # holds the inf or NaN (README: NaNs can differ)
                skip = torch.ones_like(skip)
            close(
                "grad",
                ours[1],
                ref_g,
                theirs[1],
                gdt,
                chain_len=chain,
                torch_slack=1.5,
                skip=skip,
                bound=chain_bound(ref_g, gdt),
            )

    differential(
        ctx,
        lambda: run(torch.prod),
        lambda: run(gemsops.prod),
        check,
        [x],
        tags,
    )


# ------------------------------------------------------------------- matmul
SCHEDULES = ["auto", "data-parallel", "stream-k", "hybrid"]


def _mm_shapes(ctx, fn):
    budget = ctx.choice([20000, 200000, 2000000])
    m, k, n = ctx.shape(3, budget=budget, zero=0.04)
    if fn == "mm":
        return [m, k], [k, n]
    if fn == "bmm":
        bsz = ctx.choice([0, 1, 2, 3, 5]) if ctx.chance(0.9) else 1
        return [bsz, m, k], [bsz, k, n]
    ra, rb = ctx.rng.randint(1, 4), ctx.rng.randint(1, 4)
    batch = [ctx.choice([1, 2, 3]) for _ in range(max(ra, rb) - 2)]

    def side(r, tail):
        if r == 1:
            return [tail[0] if tail is a_tail else tail[1]]
        b = batch[len(batch) - (r - 2) :] if r > 2 else []
        b = [s if ctx.chance(0.7) else 1 for s in b]
        return b + tail

    a_tail, b_tail = [m, k], [k, n]
    sa = [k] if ra == 1 else side(ra, a_tail)
    sb = [k] if rb == 1 else side(rb, b_tail)
    return sa, sb


def case_matmul(ctx):
    fn = ctx.choice(["mm", "bmm", "matmul", "matmul"])
    dtype = ctx.choice(
        [torch.float16, torch.bfloat16, torch.float32] * 3
        + [torch.float64, torch.int64]
    )
    sa, sb = _mm_shapes(ctx, fn)
    bad = ""
    if ctx.chance(0.08):
        bad = ctx.choice(["k", "dtype", "rank", "scalar"])
        if bad == "k" and sb:
            sb[-2 if len(sb) > 1 else 0] += 1
        elif bad == "rank":
            sa = sa[1:] if len(sa) > 1 else sa + [1]
        elif bad == "scalar":
            sa = []
    a, _ = ctx.tensor(sa, dtype, nonfinite=0.02)
    b, _ = ctx.tensor(
        sb,
        dtype
        if bad != "dtype"
        else torch.float32
        if dtype != torch.float32
        else torch.float16,
        nonfinite=0.02,
    )
    tags = set()
    if dtype not in gmm.SUPPORTED:
        tags.add("matmul-unsupported-dtype")
    sched = ctx.choice(SCHEDULES)
    kw = dict(two_tiles=ctx.chance(0.3), ctas=ctx.choice([0, 0, 1, 2, 3, 7]))
    grad = a.is_floating_point() and ctx.chance(0.3)
    ctx.note(f"{fn}(a, b) schedule={sched} {kw} grad={grad} bad={bad or '-'}")
    ctx.describe("a", a)
    ctx.describe("b", b)
    tfn, gfn = getattr(torch, fn), getattr(gemsops, fn)
    g = None
    if grad:
        try:
            g, _ = ctx.tensor(
                list(torch.matmul(a, b).shape), dtype, nonfinite=0.0
            )
            ctx.describe("grad_out", g)
        except Exception:  # noqa: BLE001
            grad = False

    def run(f, double=False):
        if not grad:
            return f(a, b), None
        la, lb = _leaves([a, b], torch.float64 if double else None)
        out = f(la, lb)
        return out, torch.autograd.grad(
            out, [la, lb], g.double() if double else g
        )

    def check(ours, theirs):
        same_meta("out", ours[0], theirs[0])
        if not theirs[0].is_floating_point():
            oracle.exact("out", ours[0], theirs[0])
            return
        mm_close("out", ours[0], a, b, theirs[0])
        if grad:
            ref = run(tfn, double=True)[1]
            la, lb = [
                t.detach().double().abs().requires_grad_() for t in (a, b)
            ]
            bound = torch.autograd.grad(
                tfn(la, lb), [la, lb], g.double().abs()
            )
            for i, name in enumerate(("da", "db")):
                same_meta(name, ours[1][i], theirs[1][i])
                oracle.grad_close(
                    name, ours[1][i], ref[i], bound[i], theirs[1][i]
                )

    old = gmm.get_schedule()
    gemsops.set_schedule(sched, **kw)
    try:
        differential(
            ctx, lambda: run(tfn), lambda: run(gfn), check, [a, b], tags
        )
    finally:
        gemsops.set_schedule(
            old["schedule"],
            two_tiles=old["two_tiles"],
            ctas=old["ctas"],
            spin_limit=old["spin_limit"],
            mainloop=old["mainloop"],
        )


# ------------------------------------------------------- linear / addmm
def _f64(t):
    return None if t is None else t.detach().double()


def _affine_close(name, ours, ref, bound, theirs, k):
    """A product plus a bias: one rounding of the product and one of the
    sum to the output dtype, plus 4 sqrt(k) fp32 ulps of |A||B|."""
    rtol = oracle.MM_RTOL.get(ours.dtype, 1e-12)
    fi = torch.finfo(ours.dtype)
    acc = 4 * math.sqrt(max(k, 1)) * 2**-24 * bound
    tol = 2 * rtol * (ref.abs() + bound) + acc + fi.tiny * fi.eps
    # the product may be rounded to the dtype before the bias is added
    skip = oracle.overflow_edge(ref, rtol * bound + acc, ours.dtype)
    fin = oracle.nonfinite_match(name, ours, theirs, ref=ref, skip=skip)
    oracle.within(name, ours, ref, tol, fin)


def case_linear(ctx):
    fn = ctx.choice(["linear", "linear", "addmm"])
    dtype = ctx.choice(
        [torch.float16, torch.bfloat16, torch.float32] * 3 + [torch.float64]
    )
    m, k, n = ctx.shape(3, budget=ctx.choice([20000, 200000]), zero=0.04)
    bad = ctx.choice(["", "k", "bias-dtype"]) if ctx.chance(0.1) else ""
    if fn == "linear":
        lead = [ctx.choice([1, 2, 3]) for _ in range(ctx.rng.randint(0, 2))]
        sx = [k] if ctx.chance(0.15) else lead + [m, k]
        x, _ = ctx.tensor(sx, dtype, nonfinite=0.02)
        w, _ = ctx.tensor([n, k + (bad == "k")], dtype, nonfinite=0.02)
        b = None
        if ctx.chance(0.7):
            bdt = torch.float64 if bad == "bias-dtype" else dtype
            b, _ = ctx.tensor([n], bdt, nonfinite=0.02)
        ops = [x, w, b]
        kw = {}
        ctx.note(f"linear(x, w, b) bad={bad or '-'}")
    else:
        inp_shape = ctx.choice([[n], [1, n], [m, n], []])
        idt = torch.float64 if bad == "bias-dtype" else dtype
        inp, _ = ctx.tensor(inp_shape, idt, nonfinite=0.02)
        a, _ = ctx.tensor([m, k], dtype, nonfinite=0.02)
        b2, _ = ctx.tensor([k + (bad == "k"), n], dtype, nonfinite=0.02)
        ops = [inp, a, b2]
        kw = dict(
            beta=ctx.choice([1, 1, 0.5, 0]), alpha=ctx.choice([1, 1, 2.0])
        )
        ctx.note(f"addmm(input, a, b, **{kw}) bad={bad or '-'}")
    for name, t in zip(
        ("x", "w", "b") if fn == "linear" else ("input", "a", "b"), ops
    ):
        if t is not None:
            ctx.describe(name, t)
    tags = set()
    if dtype not in gmm.SUPPORTED:
        tags.add("matmul-unsupported-dtype")
    if bad == "bias-dtype":
        tags.add("linear-bias-dtype")
    grad = dtype != torch.float64 and ctx.chance(0.3)
    tfn = F.linear if fn == "linear" else torch.addmm
    gfn = gemsops.linear if fn == "linear" else gemsops.addmm

    def run(f, double=False):
        if not grad:
            if double:  # the reference: float64 operands, always
                return f(*[_f64(t) for t in ops], **kw), None
            return f(*ops, **kw), None
        lv = _leaves(ops, torch.float64 if double else None)
        out = f(*lv, **kw)
        g = torch.ones_like(out)  # a sum's gradient: bounded, exact
        want = [t for t in lv if t is not None]
        return out, torch.autograd.grad(out, want, g, allow_unused=True)

    def check(ours, theirs):
        same_meta("out", ours[0], theirs[0])
        ref = run(tfn, double=True)
        absd = [None if t is None else t.detach().double().abs() for t in ops]
        akw = {k_: abs(v) for k_, v in kw.items()}
        bound = tfn(*absd, **akw)
        _affine_close("out", ours[0], ref[0].detach(), bound, theirs[0], k)
        if grad:
            # the same gradients of |A| |B| (+ |bias|): what they sum
            la = [None if t is None else t.requires_grad_() for t in absd]
            out = tfn(*la, **akw)
            gb = torch.autograd.grad(
                out,
                [t for t in la if t is not None],
                torch.ones_like(out),
                allow_unused=True,
            )
            for i, (o, r, t, bd) in enumerate(
                zip(ours[1], ref[1], theirs[1], gb)
            ):
                if t is None:
                    continue
                same_meta(f"grad{i}", o, t)
                bd = torch.zeros_like(r) if bd is None else bd
                # a gradient sums over up to all of the output's elements
                _affine_close(f"grad{i}", o, r, bd, t, ours[0].numel())

    differential(
        ctx,
        lambda: run(tfn),
        lambda: run(gfn),
        check,
        [t for t in ops if t is not None],
        tags,
    )
