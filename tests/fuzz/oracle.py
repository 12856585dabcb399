"""The oracle: torch's answer (float64 on upcast inputs for values, torch
itself for dtypes, shapes, non-finite positions and exceptions) against
gemsops', with the tolerances of gemsops/testing.py.

A case ends by raising one Outcome subclass (or returning: passed)."""

import math

import torch

from gemsops.testing import assert_close, rel_error

from .tensors import changed_inputs, describe, snapshot


class Outcome(Exception):
    kind = "passed"
    failure = False


class WrongAnswer(Outcome):
    kind, failure = "wrong-answer", True


class WriteOutside(Outcome):
    kind, failure = "write-outside-output", True


class ExceptionMismatch(Outcome):
    kind, failure = "exception-mismatch", True


class BothRaised(Outcome):
    kind = "both-raised"


class ExpectedRefusal(Outcome):
    kind = "expected-refusal"


class HarnessError(Outcome):
    """The fuzzer itself broke (a bug here, not in gemsops)."""

    kind, failure = "harness-error", True


# Kinds the runner adds for workers: "crash" (died), "hang" (timed out).
KINDS = [
    "passed",
    "wrong-answer",
    "crash",
    "hang",
    "write-outside-output",
    "exception-mismatch",
    "both-raised",
    "expected-refusal",
    "harness-error",
]
FAILURES = {
    "wrong-answer",
    "crash",
    "hang",
    "write-outside-output",
    "exception-mismatch",
    "harness-error",
}

# Where gemsops may differ from torch on purpose. Each entry: (name, why,
# predicate(case_tags) -> bool). Only these turn a difference into an
# expected refusal; keep the list short and every entry documented in
# docs/design.md, "Deliberate differences from torch" (README: the API's
# mixed precision).
DOCUMENTED = [
    (
        "torch-ln-bias-grad",
        "torch's CUDA LayerNorm backward returns an empty gradient for an "
        "expanded (stride-0) bias when the weight's is not asked, and its "
        "autograd then raises; gemsops returns the gradient (design.md, "
        "deliberate differences)",
        lambda tags: "ln-expanded-bias-grad" in tags,
    ),
    (
        "matmul-dtypes",
        "matmul takes fp16/bf16/fp32 only; fp64 and integer matrices raise "
        "NotImplementedError (design.md, deliberate differences)",
        lambda tags: "matmul-unsupported-dtype" in tags,
    ),
    (
        "prod-complex",
        "prod refuses complex input with NotImplementedError (design.md, "
        "deliberate differences)",
        lambda tags: "prod-complex" in tags,
    ),
    (
        "ln-mixed",
        "layer_norm takes fp32 weight/bias with fp16/bf16 input (README, API: "
        "mixed precision); torch refuses some of those combinations",
        lambda tags: "ln-mixed" in tags,
    ),
    (
        "ln-bwd-unpaired",
        "layer_norm_backward refuses the parameter dtypes layer_norm refuses "
        "(RuntimeError), where torch's backward alone takes them: torch's own "
        "forward refuses them, so no forward of either made such a call "
        "(design.md, deliberate differences)",
        lambda tags: "ln-fwd-refused" in tags,
    ),
    (
        "linear-bias-dtype",
        "linear/addmm refuse a bias of another dtype (RuntimeError); torch's "
        "linear casts it on the layouts it sends through matmul and an "
        "in-place add (design.md, deliberate differences)",
        lambda tags: "linear-bias-dtype" in tags,
    ),
    (
        "ln-half-stats",
        "native_layer_norm returns fp32 statistics for fp16/bf16 input (as "
        "torch on CUDA; torch's CPU kernel returns the input's dtype)",
        lambda tags: "ln-half-stats" in tags,
    ),
]


def documented(tags):
    for name, _, pred in DOCUMENTED:
        if pred(tags):
            return name
    return None


def _exc(e):
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg[:160]}"


def differential(ctx, theirs, ours, check, inputs, tags=()):
    """Run torch (theirs) and gemsops (ours); inputs must come back
    unchanged; exceptions must agree in type; results go to check(ours,
    theirs). tags name documented differences that may apply."""
    t_res = t_exc = g_res = g_exc = None
    try:
        t_res = theirs()
    except Exception as e:  # noqa: BLE001 - any torch error is data
        t_exc = e
    snap = snapshot(inputs)
    try:
        g_res = ours()
        sync()
    except Exception as e:  # noqa: BLE001
        g_exc = e
    bad = changed_inputs(snap)
    if bad:
        raise WriteOutside(f"gemsops changed input(s) {bad}")
    ctx.note(f"  torch:   {_exc(t_exc) if t_exc else 'returned'}")
    ctx.note(f"  gemsops: {_exc(g_exc) if g_exc else 'returned'}")
    if t_exc is not None and g_exc is not None:
        if isinstance(g_exc, type(t_exc)):
            raise BothRaised(f"{type(t_exc).__name__}")
        why = documented(tags)
        if why and isinstance(g_exc, NotImplementedError):
            raise ExpectedRefusal(why)
        raise ExceptionMismatch(
            f"torch raised {_exc(t_exc)}; gemsops raised {_exc(g_exc)}"
        )
    if t_exc is not None:
        why = documented(tags)
        if why:
            raise ExpectedRefusal(f"{why} (torch refused, gemsops did not)")
        raise ExceptionMismatch(
            f"torch raised {_exc(t_exc)}; gemsops "
            f"returned {describe(_first(g_res))}"
        )
    if g_exc is not None:
        if _empty_dtype_check(inputs, g_exc):
            raise ExpectedRefusal(
                "empty-dtype: gemsops checks dtypes on tensors of no "
                "elements too, where torch's bmm/matmul/layer_norm_backward "
                "skip the check (design.md, deliberate differences)"
            )
        why = documented(tags)
        if why and (
            isinstance(g_exc, NotImplementedError)
            or ("ln-fwd-refused" in tags or "linear-bias-dtype" in tags)
            and isinstance(g_exc, RuntimeError)
        ):
            raise ExpectedRefusal(why)
        raise ExceptionMismatch(
            f"torch returned; gemsops raised {_exc(g_exc)}"
        )
    check(g_res, t_res)


def _empty_dtype_check(inputs, exc):
    """gemsops refused a dtype that torch let through because some input
    has no elements."""
    empty = any(
        getattr(t, "numel", lambda: 1)() == 0
        if isinstance(t, torch.Tensor)
        else getattr(t, "size", 1) == 0
        for t in inputs
    )
    return (
        empty
        and isinstance(exc, (RuntimeError, NotImplementedError))
        and ("dtype" in str(exc) or "floating point" in str(exc))
    )


def _first(r):
    return r[0] if isinstance(r, (tuple, list)) and r else r


# ----- the raw boundary's refusals -----
# What a raw gemsops._C call raises for each kind of bad argument: torch's
# convention (docs/design.md, "The C boundary"; tests/test_errors.py and
# tests/test_boundary.py pin the same rules). One table, used by every raw
# case: kind -> (exact exception type, words the message must hold or None).
# Types are exact: a NotImplementedError where a RuntimeError is due (or
# the reverse) is a mismatch, as is a TypeError for a bad shape.
RAW_REFUSALS = {
    # wrong shape / dtype / device / rank, a bad normalized_ndim, an
    # argument combination the function cannot take (dW without W)
    "shape": (RuntimeError, None),
    "dtype": (RuntimeError, None),
    "device": (RuntimeError, None),
    "ndim": (RuntimeError, None),
    "combination": (RuntimeError, None),
    # non-contiguous where contiguity is required, rows that cannot be
    # viewed with one stride
    "layout": (RuntimeError, None),
    "overlap": (RuntimeError, "overlap"),
    # a lazily negated torch tensor, anywhere (tensor_info included)
    "neg-bit": (RuntimeError, "negative bit"),
    # an input dtype gemsops does not implement
    "unsupported-dtype": (NotImplementedError, None),
    # wrong Python type, a non-tensor for a tensor, a wrong argument count
    "arg-type": (TypeError, None),
    "not-tensor": (TypeError, "must be a tensor"),
    "arg-count": (TypeError, "takes"),
    # dim out of range
    "dim-range": (IndexError, None),
    # a backward (or its workspace query) of integer or bool input
    "no-grad": (RuntimeError, "only floating point"),
    # gemsops' own refusals, no torch analogue
    "neg-stride": (ValueError, "negative stride"),
    "read-only": (ValueError, "read-only"),
    "misaligned": (ValueError, "misaligned"),
    "int-range": (ValueError, "out of range"),
    # an int that fits no C integer (torch: ValueError "Overflow when
    # unpacking long long")
    "int-overflow": (ValueError, None),
    "small-workspace": (ValueError, None),
}

# The raw cases' mutations (raw.py), each one bad argument: its kind.
# "<arg>-<suffix>" mutations of an output go by their suffix.
MUTATION_KINDS = {
    "out-overlaps-input": "overlap",
    "mean-overlaps-rstd": "overlap",
    "gi-overlaps-g": "overlap",
    "nd-0": "ndim",
    "nd-big": "ndim",
    "nd-float": "arg-type",
    "eps-str": "arg-type",
    "weight-dtype": "dtype",
    "weight-shape": "shape",
    "ws-dtype": "dtype",
    "input-int": "unsupported-dtype",
    "complex": "unsupported-dtype",
    "stats-half": "dtype",
    "not-tensor": "not-tensor",
    "mean-size": "shape",
    "dw-without-w": "combination",
    "dim-neg": "dim-range",
    "dim-big": "dim-range",
    "dim-float": "arg-type",
    "sched-bad": "int-range",
    "ctas-neg": "int-range",
    "epoch-neg": "int-range",
    "int-huge": "int-overflow",
    "dim-huge": ("dim-range", "int-overflow"),
    "k-mismatch": "shape",
    "rank-4": "ndim",
    "arg-count": "arg-count",
}
SUFFIX_KINDS = {
    "dtype": "dtype",
    "shape": "shape",
    "strided": "layout",
    "readonly": "read-only",
    "misaligned": "misaligned",
    "negbit": "neg-bit",
    "reversed": "neg-stride",
}


def mutation_kind(mut):
    """The refusal kind of a raw case's mutation (KeyError: a mutation
    missing from the table, a bug in the fuzzer)."""
    mut = mut.split(": ", 1)[-1]  # "plan: out-shape"
    if mut in MUTATION_KINDS:
        return MUTATION_KINDS[mut]
    return SUFFIX_KINDS[mut.rsplit("-", 1)[1]]


def _refusal_matches(e, kind):
    typ, words = RAW_REFUSALS[kind]
    return type(e) is typ and (words is None or words in str(e))


def _want(kinds):
    return " or ".join(f"{RAW_REFUSALS[k][0].__name__} ({k})" for k in kinds)


def sync():
    """Waits for the device: a CUDA launch's writes (and errors) are in
    before anything is compared."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def expect_refusal(ctx, call, guards, inputs, what, kinds=None):
    """A raw _C call with a bad argument: it must raise the exception of
    its kind (RAW_REFUSALS; kinds: one kind or a tuple of the kinds that
    may come first; default: what's mutation kind), write nothing, not
    crash."""
    if kinds is None:
        kinds = mutation_kind(what)
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    snap = snapshot(inputs)
    try:
        call()
    except Exception as e:  # noqa: BLE001
        sync()
        if not any(_refusal_matches(e, k) for k in kinds):
            raise ExceptionMismatch(
                f"{what}: expected {_want(kinds)}, got {_exc(e)}"
            ) from None
        ctx.note(f"  gemsops: {_exc(e)}")
        _no_writes(guards, snap, refused=True)
        raise ExpectedRefusal(f"{what}: {type(e).__name__}") from None
    sync()
    _no_writes(guards, snap, refused=False)
    raise ExceptionMismatch(
        f"{what}: gemsops accepted it (no exception; expected {_want(kinds)})"
    )


def may_refuse(ctx, call, guards, inputs, what, kinds=("layout",)):
    """A raw call in a layout the raw API may refuse (the Python layer
    copies such tensors first): a refusal of one of `kinds` is fine,
    acceptance goes on to the value checks."""
    snap = snapshot(inputs)
    try:
        call()
    except Exception as e:  # noqa: BLE001
        sync()
        if not any(_refusal_matches(e, k) for k in kinds):
            raise ExceptionMismatch(
                f"{what}: expected acceptance or {_want(kinds)}, got {_exc(e)}"
            ) from None
        ctx.note(f"  gemsops: {_exc(e)}")
        _no_writes(guards, snap, refused=True)
        raise ExpectedRefusal(f"{what}: {type(e).__name__}") from None
    sync()
    _no_writes(guards, snap, refused=False)
    return True


def run_raw(ctx, call, guards, inputs):
    """A valid raw _C call: must not raise; nothing outside the outputs
    may change. Returns the call's result."""
    snap = snapshot(inputs)
    try:
        res = call()
    except Exception as e:  # noqa: BLE001
        sync()
        _no_writes(guards, snap, refused=True)
        raise ExceptionMismatch(f"valid raw call raised {_exc(e)}") from None
    sync()
    _no_writes(guards, snap, refused=False)
    return res


def _no_writes(guards, snap, refused):
    bad = changed_inputs(snap)
    if bad:
        raise WriteOutside(f"inputs changed: {bad}")
    for name, g in guards.items():
        if g is None:
            continue
        n, first = g.outside_changes()
        if n:
            raise WriteOutside(
                f"{n} bytes changed outside '{name}' "
                f"(first at buffer byte {first})"
            )
        if refused and g.any_change():
            raise WriteOutside(f"'{name}' written by a call that raised")


# ----- value comparisons -----
def same_meta(name, ours, theirs):
    if not isinstance(ours, torch.Tensor):
        raise WrongAnswer(f"{name}: got {type(ours).__name__}, not a Tensor")
    if ours.dtype != theirs.dtype:
        raise WrongAnswer(f"{name}: dtype {ours.dtype}, torch {theirs.dtype}")
    if tuple(ours.shape) != tuple(theirs.shape):
        raise WrongAnswer(
            f"{name}: shape {list(ours.shape)}, torch {list(theirs.shape)}"
        )
    if ours.device != theirs.device:
        raise WrongAnswer(
            f"{name}: device {ours.device}, torch {theirs.device}"
        )


def nonfinite_match(name, ours, theirs, loose=False, ref=None, skip=None):
    """NaN / +inf / -inf where torch has them, and only there. loose:
    only finite vs non-finite (statistics of rows holding inf, where
    torch's Welford update makes NaN of what is +inf)."""
    o, t = ours.detach().cpu(), theirs.detach().cpu()
    if not o.is_floating_point():
        return torch.ones(o.shape, dtype=torch.bool)
    tests = (
        ("NaN", torch.isnan),
        ("+inf", torch.isposinf),
        ("-inf", torch.isneginf),
    )
    if loose:
        tests = (("non-finite", lambda v: ~torch.isfinite(v)),)
    for label, f in tests:
        fo, ft = f(o), f(t)
        diff = fo != ft
        if ref is not None:  # torch's own overflow: ours agrees with ref
            # (rounded to the output's dtype, where it may overflow)
            diff &= fo != f(ref.detach().cpu().to(o.dtype))
        if skip is not None:
            diff &= ~skip
        if diff.any():
            ft = torch.where(diff, ft, fo)
            i = diff.nonzero()[0].tolist()
            raise WrongAnswer(
                f"{name}: {label} positions differ from torch's "
                f"({int(fo.sum())} vs {int(ft.sum())}); first at {i}: gemsops "
                f"{o[tuple(i)].item()!r}, torch {t[tuple(i)].item()!r}"
            )
    return torch.isfinite(o)


# float64 results are compared with a float64 reference, itself rounded:
# where the input is ill-conditioned (a large mean, a small spread) the
# two differ by more than testing.py's 1e-12; this relative L2 bound is
# what two correct float64 implementations agree to.
F64_REL = 1e-9


def ln_dx_bound(g, x, w, mean, rstd, nd, dtype, stored=False):
    """Elementwise bound on a LayerNorm dx's rounding error, from the
    size of the terms it cancels: dx = rstd (w dy - mean(w dy) - xhat
    mean(w dy xhat)); each term carries a few ulps of the accumulation
    type (fp32 for halves), the sums sqrt(N) of them, and the output one
    rounding to its dtype. stored: the backward reads statistics its own
    forward rounded to their dtype (fp32 for all but fp64), so xhat is off
    by ulps of mean * rstd as well (a row of mean 100 and spread 1 loses
    ~7 bits; which of two roundings lands nearer is chance). None when
    the statistics have no rows."""
    if (
        not g.numel()
        or not rstd.numel()
        or g.shape != x.shape
        or x.is_complex()
        or g.is_complex()
        or (w is not None and tuple(w.shape) != tuple(x.shape[x.dim() - nd :]))
    ):
        return None  # a case whose call is refused
    n = math.prod(x.shape[x.dim() - nd :])
    if mean.numel() * n != x.numel() or rstd.numel() != mean.numel():
        return None
    sh = tuple(x.shape[: x.dim() - nd]) + (1,) * nd

    def cpu(t):
        return torch.as_tensor(t).detach().cpu().double()

    xd, gd = cpu(x), cpu(g)
    m, r = cpu(mean).reshape(sh), cpu(rstd).reshape(sh)
    wdy = gd * (cpu(w) if w is not None else 1.0)
    xh = (xd - m) * r
    dims = tuple(range(x.dim() - nd, x.dim()))
    terms = r.abs() * (
        wdy.abs()
        + xh.abs() * (wdy * xh).abs().mean(dims, keepdim=True)
        + wdy.abs().mean(dims, keepdim=True)
    )
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    out = 16 * torch.finfo(acc).eps * math.sqrt(n) * terms
    if stored:
        dxh = _stats_rounding(m, r, xh, acc)
        out = out + 2 * r.abs() * (
            dxh * (wdy * xh).abs().mean(dims, keepdim=True)
            + xh.abs() * (wdy.abs() * dxh).mean(dims, keepdim=True)
        )
    return out.cpu()


def _stats_rounding(m, r, xh, acc):
    """|error| of xhat = (x - mean) * rstd from mean and rstd stored
    rounded to acc: half an ulp of mean, times rstd, and of rstd."""
    return torch.finfo(acc).eps * (m.abs() * r.abs() + xh.abs())


def ln_dw_bound(g, x, mean, rstd, nd, dtype, stored=True):
    """Bound on a LayerNorm dW's error (dW = sum over rows of dy xhat) when
    each side's backward reads the statistics its own forward stored
    (stored): the storage rounding of each row's xhat (ln_dx_bound's
    stored term); always sqrt(rows) ulps of the accumulation type on the
    sum of |dy xhat|.
    None for shapes whose call is refused."""
    if not g.numel() or g.shape != x.shape or x.is_complex():
        return None
    n = math.prod(x.shape[x.dim() - nd :])
    if not n or mean.numel() * n != x.numel() or rstd.numel() != mean.numel():
        return None
    sh = tuple(x.shape[: x.dim() - nd]) + (1,) * nd
    xd, gd = x.detach().cpu().double(), g.detach().cpu().double()
    m = mean.detach().cpu().double().reshape(sh)
    r = rstd.detach().cpu().double().reshape(sh)
    xh = (xd - m) * r
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    lead = tuple(range(x.dim() - nd))
    rows = max(1, mean.numel())
    err = 2 * gd.abs() * _stats_rounding(m, r, xh, acc) if stored else 0
    err = err + 16 * torch.finfo(acc).eps * math.sqrt(rows) * (gd * xh).abs()
    return err.sum(lead) if lead else err  # sum(()) would sum every dim


def ln_db_bound(g, nd, dtype):
    """Bound on a LayerNorm dB's error (dB = sum over rows of dy): twice
    a pairwise sum's worst-case rounding, 2 log2(rows) ulps of the
    accumulation type on the sum of |dy|; one row's dy lost or doubled
    lies far outside it. Torch's own error on one column's sum can be
    near zero by chance, so twice torch's error alone fails sums as exact
    as their order allows (seed 58 case 190: one column over 16384 fp32
    rows, 3.4x torch's error, 1.5 ulps of the sum of |dy|).
    None where there is nothing to bound."""
    if not g.numel() or g.is_complex() or g.dim() < nd:
        return None
    lead = tuple(range(g.dim() - nd))
    rows = math.prod(g.shape[: g.dim() - nd])
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    ulps = 2 * math.log2(max(rows, 2)) * torch.finfo(acc).eps
    err = ulps * g.detach().cpu().double().abs()
    return err.sum(lead) if lead else err


def close(
    name,
    ours,
    ref,
    theirs,
    dtype,
    *,
    reduce_len=1,
    chain_len=1,
    torch_slack=None,
    loose=False,
    skip=None,
    f64_atol=None,
    bound=None,
):
    """ours vs the float64 ref on the finite positions with testing.py's
    tolerance; if that fails, still pass when torch's own result
    (theirs) is at least 1/torch_slack as far from ref (same bar as
    tests/test_prod.py's assert_close_or_torch). f64_atol: for float64,
    the rounding of the largest term the result cancels from (a float64
    reference is no finer than that: a result that cancels to zero is
    exact in ours and a few ulps of those terms in the reference).
    bound: an elementwise bound on the rounding error (ln_dx_bound) that
    also passes a result, plus one rounding of the output."""
    fin = (
        nonfinite_match(name, ours, theirs, loose, ref, skip)
        if theirs is not None
        else torch.isfinite(ours.detach().cpu())
    )
    fin = fin & torch.isfinite(ref.detach().cpu())
    if skip is not None:
        fin &= ~skip
    o = ours.detach().cpu()[fin]
    r = ref.detach().cpu().double()[fin]
    t = theirs.detach().cpu()[fin] if theirs is not None else None
    if t is not None and t.is_floating_point() and not torch.isfinite(t).all():
        t = None  # torch overflowed where the reference did not
    if dtype not in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    ):
        if not torch.equal(o.to(torch.int64), r.to(torch.int64)):
            raise WrongAnswer(f"{name}: integer result differs from torch")
        return
    try:
        assert_close(
            o,
            r,
            dtype,
            reduce_len=reduce_len,
            chain_len=chain_len,
            torch_out=t,
            name=name,
        )
    except AssertionError as e:
        if dtype == torch.float64 and rel_error(o, r) <= F64_REL:
            return
        if (
            dtype == torch.float64
            and f64_atol is not None
            and float((o - r).abs().max()) <= f64_atol
        ):
            return
        if bound is not None and r.numel():
            tol = bound.detach().cpu()[fin] + torch.finfo(dtype).eps * r.abs()
            if bool(((o.double() - r).abs() <= tol).all()):
                return
        if t is not None and torch_slack and r.numel():
            ours_err, their_err = rel_error(o, r), rel_error(t, r)
            if ours_err <= torch_slack * their_err:
                return
            raise WrongAnswer(
                f"{e} (rel err {ours_err:.3g}, torch's {their_err:.3g})"
            ) from None
        raise WrongAnswer(str(e)) from None


def row_centred(t, nd):
    """A float64 leaf t less its rows' means (rows of the last nd dims;
    a row whose mean is not finite or is huge keeps its values), as a new
    leaf. LayerNorm's output and gradients do not change under a shift of
    a row, and torch's float64 formula then no longer cancels the rows'
    mean against itself (seed 4309 case 17608: one row of mean 100 and
    spread 0.01 with dy of mean 100; torch's float64 dx 7.3e-7 from the
    centred one, gemsops' 5.6e-9; seed 4404 case 9300: float64 rows of 2
    around 100 with a spread of 0.003, torch's float64 rstd 1.3e-12 from
    the exact one, gemsops' 7e-17)."""
    d = t.detach()
    if not d.numel() or nd < 1 or nd > d.dim():
        return t
    m = d.mean(tuple(range(d.dim() - nd, d.dim())), keepdim=True)
    m = torch.where(torch.isfinite(m) & (m.abs() < 1e300), m, 0.0)
    return (d - m).requires_grad_(t.requires_grad)


def ln_reference(x, pshape, w, b, eps):
    """torch.native_layer_norm in float64 of x (its last len(pshape) dims
    the rows), out and rstd taken on the rows less their means (row_centred:
    the same values, without torch's formula cancelling a row's mean far
    above its spread), mean on x itself."""
    xd = x.detach().double()
    wd = None if w is None else w.detach().double()
    bd = None if b is None else b.detach().double()
    centred = row_centred(xd, len(pshape))
    out, _, rstd = torch.native_layer_norm(centred, pshape, wd, bd, eps)
    mean = torch.native_layer_norm(xd, pshape, None, None, eps)[1]
    return out, mean, rstd


def sum_rounding(n, acc_dtype):
    """Relative rounding of a tree of n sums in acc_dtype around a shift
    within the values' range: ~2 log2(n) + 2 unit roundoffs (the bound of
    the norms' statistics: rstd_bound, ln_singular_rows, mean_bound)."""
    return (2 * math.log2(max(n, 2)) + 2) * torch.finfo(acc_dtype).eps / 2


def rstd_bound(rstd_ref, eps, n, acc_dtype):
    """|error| of rstd = (var + eps)^-1/2 from a variance rounded to
    acc_dtype over n elements (a relative ~2 log2(n) + 2 ulps): a negative
    eps cancels against the variance and multiplies that error by
    var / |var + eps|. None where eps >= 0 (no cancellation; close's
    tolerance holds)."""
    if eps >= 0 or not rstd_ref.numel():
        return None
    r = rstd_ref.detach().double().abs()
    var_eps = 1.0 / (r * r)
    var = (var_eps - eps).abs()
    rel_var = sum_rounding(n, acc_dtype)
    return 0.5 * r * rel_var * var / var_eps


def ln_out_bound(x, nd, w, eps, acc_dtype):
    """|error| of LayerNorm's output (x - mean) * rstd * w where a negative
    eps cancels against the variance: rstd's error (rstd_bound) times
    |x - mean| * |w|, plus the mean's (mean_bound) times rstd * |w|. None
    where eps >= 0 (close's tolerance holds)."""
    n = math.prod(x.shape[x.dim() - nd :])
    if eps >= 0 or not x.numel() or n == 0:
        return None
    rows = x.detach().double().cpu().reshape(-1, n)
    mean = rows.mean(1, keepdim=True)
    rstd = (rows.var(1, unbiased=False, keepdim=True) + eps).rsqrt()
    mean_err = mean_bound(x.detach().cpu(), nd, acc_dtype).reshape(-1, 1)
    err = (rows - mean).abs() * rstd_bound(rstd, eps, n, acc_dtype)
    err = err + mean_err * rstd
    if w is not None:
        err = err * w.detach().double().cpu().abs().reshape(1, n)
    return err.reshape(x.shape)


def ln_singular_rows(x, nd, eps, acc_dtype):
    """Where a negative eps meets the variance within its rounding in
    acc_dtype (the bound mean_bound takes, on the row's mean square): there
    rstd is finite or NaN by that rounding alone, in torch's kernel as in
    ours (seed 4308 case 26762: eps -1, a row of 63 whose var + eps lies
    under it; torch NaN, ours 5.8e7). A bool mask of x's shape, None where
    eps >= 0 or no row is so near."""
    n = math.prod(x.shape[x.dim() - nd :])
    if not eps < 0 or not x.numel() or n == 0:
        return None
    rows = x.detach().double().cpu().reshape(-1, n)
    var = rows.var(1, unbiased=False)
    mean_square = rows.square().mean(1)
    near = (var + eps).abs() <= sum_rounding(n, acc_dtype) * mean_square
    if not bool(near.any()):
        return None
    lead = tuple(x.shape[: x.dim() - nd])
    return near.reshape(lead + (1,) * nd).expand(x.shape)


def mean_bound(x, nd, acc_dtype):
    """|error| of a row mean summed in acc_dtype over the last nd dims of
    x (n elements): ~2 log2(n) + 2 roundings of the row's root mean
    square (spread and mean together), the bound of a tree of sums taken
    around a shift within the row's range, as a one-pass LayerNorm takes
    them. Where the mean cancels far below the spread, that is far above
    testing's relative tolerance of the mean alone."""
    n = math.prod(x.shape[x.dim() - nd :])
    if not x.numel() or n == 0:
        return None
    rows = x.detach().double().reshape(-1, n)
    rms = rows.square().mean(1).sqrt()
    bound = sum_rounding(n, acc_dtype) * rms
    return bound.reshape(x.shape[: x.dim() - nd] + (1,) * nd)


def f64_ln_terms(g, x, w, mean, rstd, rows):
    """The rounding of the largest term a float64 LayerNorm gradient sums
    or cancels (close's f64_atol), None for other dtypes."""
    if x.dtype != torch.float64 or not g.numel() or not rstd.numel():
        return None

    def amax(t):
        return float(torch.as_tensor(t).detach().double().abs().max())

    xs = amax(x) + amax(mean)
    ws = amax(w) if w is not None and w.numel() else 1.0
    big = amax(g) * ws * amax(rstd) * max(xs * amax(rstd), 1.0)
    return float(64 * torch.finfo(torch.float64).eps * big * max(rows, 1))


# one rounding of a matmul's output to its dtype (fp32 accumulation)
MM_RTOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1.3e-6}


def within(name, ours, ref, tol, fin):
    """|ours - ref| <= tol elementwise on the finite positions `fin`."""
    ref, tol = ref.detach().cpu().double(), tol.detach().cpu()
    err = (ours.detach().cpu().double() - ref).abs()
    bad = (err > tol) & fin & torch.isfinite(ref)
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise WrongAnswer(
            f"{name}: {int(bad.sum())} of {ours.numel()} out of tolerance; "
            f"first at {i}: got {ours.detach().cpu()[tuple(i)].item()!r}, "
            f"expected {ref[tuple(i)].item()!r}"
        )


def overflow_edge(ref, err, dtype):
    """Where |ref| lies within err (the error of the value rounded to
    dtype, before that rounding) of dtype's overflow threshold (its largest
    value plus half an ulp there): the value rounds to the largest finite
    one or to inf by its error alone (seed 4333 case 14426: fp16 linear,
    exact -65519.996, the fp32 sum -65520.016 and so -inf; torch's
    -65504). A bool mask, None where there is none."""
    if not dtype.is_floating_point or dtype == torch.float64:
        return None
    fi = torch.finfo(dtype)
    thr = fi.max + fi.eps * 2.0 ** math.floor(math.log2(fi.max)) / 2
    r = ref.detach().cpu().double()
    e = err.detach().cpu().double() if torch.is_tensor(err) else err
    edge = ((r.abs() - thr).abs() <= e) & torch.isfinite(r)
    return edge if bool(edge.any()) else None


def mm_close(name, ours, a, b, theirs, tf32=False):
    """matmul: one rounding of the output plus 4 sqrt(k) fp32 ulps of
    |A||B| (tests/test_matmul.py's bound), on the finite positions; tf32
    (fp32 that may have run as TF32): plus 2^-9 of |A||B|."""
    ad, bd = a.detach().cpu().double(), b.detach().cpu().double()
    ref = torch.matmul(ad, bd)
    bound = torch.matmul(ad.abs(), bd.abs())
    k = a.shape[-1] if a.dim() else 1
    rtol = MM_RTOL.get(ours.dtype, 1e-12)
    # + the spacing of the output's subnormals: results below its normal
    # range round to multiples of it
    fi = torch.finfo(ours.dtype) if ours.is_floating_point() else None
    sub = fi.tiny * fi.eps if fi else 0.0
    acc = 4 * math.sqrt(max(k, 1)) * 2**-24 * bound
    if tf32:
        acc = acc + 2**-9 * bound
    tol = rtol * ref.abs() + acc + sub
    skip = overflow_edge(ref, acc, ours.dtype)
    fin = nonfinite_match(name, ours, theirs, skip=skip)
    within(name, ours, ref, tol, fin)


def grad_close(name, ours, ref, bound, theirs):
    """A gradient of a matmul: as mm_close, |ref| and the bound being
    those of the gradient (the bound: the same gradient of |A| |B| with
    |grad|); rounding to the dtype may happen once per broadcast batch
    summed, so rtol applies to the bound too. Non-finite positions may
    follow the reference instead of torch: torch rounds per batch where
    gemsops folds the batch into one product (inf - inf against a finite
    sum)."""
    rtol = MM_RTOL.get(ours.dtype, 1e-12)
    fi = torch.finfo(ours.dtype)
    tol = rtol * (ref.abs() + bound) + 2**-20 * bound + fi.tiny * fi.eps
    skip = overflow_edge(ref, (rtol + 2**-20) * bound, ours.dtype)
    fin = nonfinite_match(name, ours, theirs, ref=ref, skip=skip)
    within(name, ours, ref, tol, fin)


def exact(name, ours, theirs):
    """Bitwise equality (integer products, wrap-around included)."""
    same_meta(name, ours, theirs)
    if not torch.equal(ours.cpu(), theirs.cpu()):
        d = (ours.cpu() != theirs.cpu()).nonzero()[0].tolist()
        raise WrongAnswer(
            f"{name}: differs from torch at {d}: "
            f"{ours.cpu()[tuple(d)].item()} vs "
            f"{theirs.cpu()[tuple(d)].item()}"
        )
