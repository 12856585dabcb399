"""The ops under torch's other ways of running a function: forward-mode AD
(dual tensors, torch.func.jvp and jacfwd), the other torch.func transforms
(grad, vjp, jacrev, vmap), the JIT tracer, and meta tensors. Each result
is compared with the same function written in torch's ops."""

import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

import gemsops


def _layer_norm_ref(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def _fused_ref(x, r, w, b):
    h = x + r
    return F.layer_norm(h, (x.shape[-1],), w, b, 1e-5), h


# (name, gemsops function, torch function, argument shapes, dtype): every
# argument a tensor, each differentiated
CASES = [
    ("mm", gemsops.mm, torch.mm, [(5, 7), (7, 3)], torch.float32),
    ("bmm", gemsops.bmm, torch.bmm, [(2, 5, 7), (2, 7, 3)], torch.float32),
    (
        "matmul",
        gemsops.matmul,
        torch.matmul,
        [(2, 1, 5, 7), (3, 7, 4)],
        torch.float32,
    ),
    (
        "linear",
        gemsops.linear,
        F.linear,
        [(2, 5, 7), (3, 7), (3,)],
        torch.float32,
    ),
    (
        "addmm",
        gemsops.addmm,
        torch.addmm,
        [(3,), (5, 7), (7, 3)],
        torch.float32,
    ),
    (
        "layer_norm",
        lambda x, w, b: gemsops.layer_norm(x, (x.shape[-1],), w, b),
        _layer_norm_ref,
        [(4, 9), (9,), (9,)],
        torch.float64,
    ),
    (
        "native_layer_norm",
        lambda x, w, b: gemsops.native_layer_norm(x, (9,), w, b)[0],
        lambda x, w, b: torch.native_layer_norm(x, (9,), w, b, 1e-5)[0],
        [(4, 9), (9,), (9,)],
        torch.float64,
    ),
    (
        "rms_norm",
        lambda x, w: gemsops.rms_norm(x, (x.shape[-1],), w),
        lambda x, w: F.rms_norm(x, (x.shape[-1],), w),
        [(4, 9), (9,)],
        torch.float64,
    ),
    (
        "fused_add_layer_norm",
        lambda x, r, w, b: gemsops.fused_add_layer_norm(
            x, r, (x.shape[-1],), w, b
        ),
        _fused_ref,
        [(4, 9), (4, 9), (9,), (9,)],
        torch.float64,
    ),
    (
        "fused_add_rms_norm",
        lambda x, r, w: gemsops.fused_add_rms_norm(x, r, (x.shape[-1],), w),
        lambda x, r, w: (F.rms_norm(x + r, (x.shape[-1],), w), x + r),
        [(4, 9), (4, 9), (9,)],
        torch.float64,
    ),
    (
        "prod",
        lambda x: gemsops.prod(x, 1),
        lambda x: torch.prod(x, 1),
        [(3, 6)],
        torch.float64,
    ),
    ("prod_all", gemsops.prod, torch.prod, [(3, 4)], torch.float64),
]
IDS = [c[0] for c in CASES]


def _args(shapes, dtype, device):
    return tuple(
        torch.randn(s, dtype=dtype, device=device) + 0.5 for s in shapes
    )


def _tol(dtype):
    return (
        dict(rtol=1e-9, atol=1e-9)
        if dtype == torch.float64
        else dict(rtol=2e-4, atol=2e-4)
    )


def _close(got, want, dtype):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            _close(g, w, dtype)
        return
    assert got is not None, "a tangent came back None"
    torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.fixture(autouse=True)
def _exact_fp32():
    """fp32 products exact on both sides (TF32 is a tolerance of its own)."""
    if not torch.cuda.is_available():
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_dual_tensor_tangent(case, device):
    """A dual tensor's tangent is carried, not dropped (None)."""
    _, ours, theirs, shapes, dtype = case
    args = _args(shapes, dtype, device)
    tangents = _args(shapes, dtype, device)
    with fwAD.dual_level():
        duals = [fwAD.make_dual(a, t) for a, t in zip(args, tangents)]
        got, want = ours(*duals), theirs(*duals)
        unpack = lambda o: fwAD.unpack_dual(o)  # noqa: E731
        if isinstance(want, tuple):
            got_p = tuple(unpack(o).primal for o in got)
            got_t = tuple(unpack(o).tangent for o in got)
            want_p = tuple(unpack(o).primal for o in want)
            want_t = tuple(unpack(o).tangent for o in want)
        else:
            got_p, got_t = unpack(got).primal, unpack(got).tangent
            want_p, want_t = unpack(want).primal, unpack(want).tangent
    _close(got_p, want_p, dtype)
    _close(got_t, want_t, dtype)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_func_jvp(case, device):
    """torch.func.jvp's tangent is the function's (it was zeros)."""
    _, ours, theirs, shapes, dtype = case
    args = _args(shapes, dtype, device)
    tangents = _args(shapes, dtype, device)
    got = torch.func.jvp(ours, args, tangents)
    want = torch.func.jvp(theirs, args, tangents)
    _close(got[0], want[0], dtype)
    _close(got[1], want[1], dtype)


def _summed(fn):
    def total(*args):
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        return sum((o * o).sum() for o in outs)

    return total


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_func_grad_and_jacobians(case, device):
    """torch.func.grad, jacrev and jacfwd run (grad and jacrev refused
    the custom op's autograd Function) and agree with torch's."""
    _, ours, theirs, shapes, dtype = case
    args = _args(shapes, dtype, device)
    argnums = tuple(range(len(args)))
    got = torch.func.grad(_summed(ours), argnums)(*args)
    want = torch.func.grad(_summed(theirs), argnums)(*args)
    _close(got, want, dtype)
    first = lambda f: lambda x: f(x, *args[1:])  # noqa: E731
    for jac in (torch.func.jacrev, torch.func.jacfwd):
        _close(jac(first(ours))(args[0]), jac(first(theirs))(args[0]), dtype)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_func_vmap(case, device):
    _, ours, theirs, shapes, dtype = case
    batched = _args([(3,) + tuple(s) for s in shapes], dtype, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a batching rule's fallback
        got = torch.func.vmap(ours)(*batched)
    _close(got, torch.func.vmap(theirs)(*batched), dtype)


@pytest.mark.parametrize("name", ["mm", "matmul", "addmm", "linear"])
def test_transforms_refuse_the_dtypes_eager_refuses(name):
    """Under vmap and jvp the products run torch's ops, but on the dtypes
    eager takes: float64 raises as it does eagerly (vmap of addmm
    computed it)."""
    a, b = torch.randn(2, 3, 4).double(), torch.randn(2, 4, 5).double()
    c = torch.randn(2, 3, 5).double()
    call = {
        "mm": lambda c, a, b: gemsops.mm(a, b),
        "matmul": lambda c, a, b: gemsops.matmul(a, b),
        "addmm": gemsops.addmm,
        "linear": lambda c, a, b: gemsops.linear(a, b.mT, c[0]),
    }[name]
    with pytest.raises(NotImplementedError) as eager:
        call(c[0], a[0], b[0])
    with pytest.raises(NotImplementedError) as batched:
        torch.func.vmap(call)(c, a, b)
    assert str(batched.value) == str(eager.value)
    with pytest.raises(NotImplementedError):
        torch.func.jvp(call, (c[0], a[0], b[0]), (c[0], a[0], b[0]))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jit_trace_records_the_op(case, device):
    """A traced function computes on new inputs (a direct call into C was
    invisible to the tracer: the trace kept only the output's allocation,
    and replayed uninitialised memory)."""
    _, ours, theirs, shapes, dtype = case
    args = _args(shapes, dtype, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings
        traced = torch.jit.trace(ours, args, check_trace=False)
    fresh = tuple(a * 2 - 0.25 for a in args)
    _close(traced(*fresh), theirs(*fresh), dtype)


def test_jit_trace_linear_module_with_grad(device):
    m = gemsops.nn.Linear(7, 3, device=device)
    x = torch.randn(4, 7, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(m, (x,))
    x2 = torch.randn(6, 7, device=device, requires_grad=True)
    y = traced(x2)
    torch.testing.assert_close(y, F.linear(x2, m.weight, m.bias))
    y.sum().backward()
    torch.testing.assert_close(
        x2.grad, m.weight.sum(0).expand(6, 7), rtol=1e-5, atol=1e-5
    )


def test_jit_trace_of_n_d_products_runs_at_other_leading_sizes(device):
    # matmul and linear fold an N-D input's leading dims with its sizes as
    # numbers, which the tracer keeps: a trace at (2, 4, 8) gave (2, 4, 3)
    # at (4, 2, 8) and raised at (3, 5, 8). Traced, they record torch's
    w, b = torch.randn(3, 8, device=device), torch.randn(3, device=device)
    fns = {
        "matmul": (lambda x: gemsops.matmul(x, w.mT), lambda x: x @ w.mT),
        "linear": (
            lambda x: gemsops.linear(x, w, b),
            lambda x: F.linear(x, w, b),
        ),
        "linear no bias": (
            lambda x: gemsops.linear(x, w),
            lambda x: F.linear(x, w),
        ),
    }
    # and a trace at one rank runs at another, as torch's (matmul and
    # linear of a 2-D input recorded mm's and addmm's 2-D nodes)
    for name, (ours, theirs) in fns.items():
        for at in ((2, 4, 8), (5, 8), (8,)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TracerWarnings
                traced = torch.jit.trace(ours, torch.randn(at, device=device))
            for shape in ((4, 2, 8), (3, 5, 8), (2, 6, 1, 8), (7, 8), (8,)):
                x = torch.randn(shape, device=device)
                torch.testing.assert_close(
                    traced(x), theirs(x), rtol=1e-5, atol=1e-5, msg=name
                )


def _script_modules(device):
    """(gemsops module, its torch equivalent, input count) pairs sharing
    parameters: torch.nn's modules script; ours compile to torch's
    functions."""
    ln, rn = gemsops.nn.LayerNorm(8), gemsops.nn.RMSNorm(8, eps=1e-3)
    lin, lin0 = gemsops.nn.Linear(8, 3), gemsops.nn.Linear(8, 3, bias=False)
    fl, fr = gemsops.nn.FusedAddLayerNorm(8), gemsops.nn.FusedAddRMSNorm(8)
    with torch.no_grad():
        for m in (ln, rn, fl, fr):
            m.weight.normal_()
        for m in (ln, fl):
            m.bias.normal_()

    def fused(norm):
        def run(x, r):
            h = x + r
            return norm(h), h

        return run

    pairs = [
        (ln, lambda x: F.layer_norm(x, (8,), ln.weight, ln.bias), 1),
        (rn, lambda x: F.rms_norm(x, (8,), rn.weight, 1e-3), 1),
        (lin, lambda x: F.linear(x, lin.weight, lin.bias), 1),
        (lin0, lambda x: F.linear(x, lin0.weight), 1),
        (fl, fused(lambda h: F.layer_norm(h, (8,), fl.weight, fl.bias)), 2),
        (fr, fused(lambda h: F.rms_norm(h, (8,), fr.weight)), 2),
    ]
    return [(m.to(device), ref, n) for m, ref, n in pairs]


def test_jit_script_of_the_modules(device, tmp_path):
    """torch.jit.script compiles the nn modules (torch's own script), to
    torch's functions: the scripted module, and one saved and loaded,
    give torch's values and gradients at any rank."""
    for i, (m, ref, n) in enumerate(_script_modules(device)):
        scripted = torch.jit.script(m)
        torch.jit.save(scripted, tmp_path / f"m{i}.pt")
        loaded = torch.jit.load(tmp_path / f"m{i}.pt", map_location=device)
        for shape in ((5, 8), (2, 3, 8), (8,)):
            args = [
                torch.randn(shape, device=device, requires_grad=True)
                for _ in range(n)
            ]
            want = ref(*args)
            out = want if isinstance(want, tuple) else (want,)
            refs = torch.autograd.grad(sum(o.sum() for o in out), args)
            for run in (scripted, loaded):
                got = run(*args)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
                out = got if isinstance(got, tuple) else (got,)
                grads = torch.autograd.grad(sum(o.sum() for o in out), args)
                torch.testing.assert_close(grads, refs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_meta_tensors(case):
    """Meta inputs give meta outputs of torch's shapes and dtypes (C has
    no bytes to read; it refused them through DLPack)."""
    _, ours, theirs, shapes, dtype = case
    args = tuple(torch.empty(s, dtype=dtype, device="meta") for s in shapes)
    got, want = ours(*args), theirs(*args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        assert g.device.type == "meta"
        assert (g.shape, g.dtype) == (w.shape, w.dtype)


def test_meta_modules():
    x = torch.empty(2, 5, 8, device="meta")
    for m in (
        gemsops.nn.Linear(8, 3, device="meta"),
        gemsops.nn.LayerNorm(8, device="meta"),
        gemsops.nn.RMSNorm(8, device="meta"),
    ):
        y = m(x)
        assert y.device.type == "meta" and y.shape[:2] == (2, 5)


def _meta(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_meta_out_arguments():
    """out= on meta tensors gives torch's meta results (meta tensors have
    no autocast state to ask)."""
    cases = [
        (gemsops.mm, torch.mm, (_meta(2, 4), _meta(4, 3)), (2, 3)),
        (gemsops.bmm, torch.bmm, (_meta(2, 2, 4), _meta(2, 4, 3)), (2, 2, 3)),
        (gemsops.matmul, torch.matmul, (_meta(5, 4), _meta(4)), (5,)),
        (
            gemsops.addmm,
            torch.addmm,
            (_meta(3), _meta(2, 4), _meta(4, 3)),
            (2, 3),
        ),
    ]
    for ours, theirs, args, shape in cases:
        got = ours(*args, out=_meta(*shape))
        want = theirs(*args, out=_meta(*shape))
        assert got.device.type == "meta"
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    got = gemsops.prod(_meta(3, 4), 1, out=_meta(3, dtype=torch.float64))
    assert (got.device.type, got.shape, got.dtype) == (
        "meta",
        (3,),
        torch.float64,
    )


def test_meta_operands_of_two_dtypes_are_refused_by_name():
    half, single = _meta(2, 4, dtype=torch.float16), _meta(4, 3)
    for call in (
        lambda: gemsops.mm(half, single),
        lambda: gemsops.matmul(half, single),
        lambda: gemsops.nn.Linear(4, 3, device="meta")(half),
    ):
        with pytest.raises(RuntimeError, match="same dtype"):
            call()


def test_layer_norm_backward_under_forward_ad(device):
    """gemsops.layer_norm_backward with dual inputs, and under torch.func's
    jvp and vjp: aten's formula at the given statistics, differentiated as
    torch differentiates native_layer_norm_backward (and as gemsops' own
    autograd does): mean and rstd are the input's, so the tangent is that
    of the backward at statistics recomputed from the moved input (they
    were held fixed)."""
    x, g = (
        torch.randn(4, 9, dtype=torch.float64, device=device) for _ in "ab"
    )
    w, b = (torch.randn(9, dtype=torch.float64, device=device) for _ in "ab")
    _, mean, rstd = torch.native_layer_norm(x, (9,), w, b, 1e-5)
    tx, tg, tw = torch.randn_like(x), torch.randn_like(g), torch.randn_like(w)

    def ours(g, x, w):
        return gemsops.layer_norm_backward(g, x, (9,), mean, rstd, w, b)

    def theirs(g, x, w, stats=(mean, rstd)):
        return torch.ops.aten.native_layer_norm_backward(
            g, x, (9,), *stats, w, b, [True, True, True]
        )

    got = torch.func.jvp(ours, (g, x, w), (tg, tx, tw))
    _close(got[0], tuple(theirs(g, x, w)), torch.float64)
    # the tangent, by central differences, the statistics of each point
    h = 1e-6

    def moved(sign):
        xs = x + sign * h * tx
        stats = torch.native_layer_norm(xs, (9,), None, None, 1e-5)[1:]
        return theirs(g + sign * h * tg, xs, w + sign * h * tw, stats)

    for t, p, m in zip(got[1], moved(1), moved(-1)):
        torch.testing.assert_close(t, (p - m) / (2 * h), rtol=1e-5, atol=1e-6)
    want = torch.func.jvp(theirs, (g, x, w), (tg, tx, tw))
    _close(got[1], tuple(want[1]), torch.float64)
    cot = (torch.randn_like(x), torch.randn_like(w), torch.randn_like(b))
    got = torch.func.vjp(ours, g, x, w)[1](cot)
    want = torch.func.vjp(theirs, g, x, w)[1](cot)
    _close(got, want, torch.float64)
    # and as gemsops' own reverse mode
    leaves = tuple(t.clone().requires_grad_() for t in (g, x, w))
    outs = ours(*leaves)
    own = torch.autograd.grad(outs, leaves, cot)
    _close(got, own, torch.float64)


@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_forward_over_forward_is_the_second_derivative(affine):
    """jacfwd(jacfwd(gemsops.layer_norm)) is layer_norm's second
    derivative (jacrev(jacrev) of torch's). torch's own forward-over-
    forward rule for native_layer_norm gives another value (torch 2.11 to
    2.13): design.md, deliberate differences."""
    x = torch.randn(2, 5, dtype=torch.float64)
    w, b = (torch.randn(5, dtype=torch.float64) for _ in "ab")
    w, b = (w, b) if affine else (None, None)
    fwd2 = torch.func.jacfwd(
        torch.func.jacfwd(lambda x: gemsops.layer_norm(x, (5,), w, b))
    )(x)
    rev2 = torch.func.jacrev(
        torch.func.jacrev(lambda x: F.layer_norm(x, (5,), w, b))
    )(x)
    torch.testing.assert_close(fwd2, rev2)


def test_meta_beside_cpu_is_a_device_error():
    a, b = torch.randn(3, 4), torch.empty(4, 2, device="meta")
    for fn in (gemsops.mm, gemsops.matmul):
        with pytest.raises(RuntimeError, match="device"):
            fn(a, b)
        with pytest.raises(RuntimeError, match="device"):
            fn(b.mT, a.mT)


def test_meta_parameter_beside_cpu_input_is_a_device_error():
    # as torch: RuntimeError, not the DLPack refusal's TypeError
    x, w = torch.randn(2, 8), torch.empty(8, device="meta")
    for fn in (gemsops.layer_norm, gemsops.rms_norm):
        with pytest.raises(RuntimeError, match="'weight'.*meta"):
            fn(x, (8,), w)


@pytest.mark.parametrize("to_sparse", ["to_sparse", "to_sparse_csr"])
def test_sparse_operands_are_not_implemented(to_sparse):
    # the error names the function called and the argument, by torch's
    # names (the C boundary's, for what DLPack refuses, name its own)
    d, v = torch.randn(4, 4), torch.randn(4)
    s = getattr(d, to_sparse)()
    sv = v.to_sparse()
    calls = [
        ("prod", "input", lambda: gemsops.prod(s)),
        ("prod", "input", lambda: gemsops.prod(s, 1)),
        ("mm", "input", lambda: gemsops.mm(s, d)),
        ("mm", "mat2", lambda: gemsops.mm(d, s)),
        ("bmm", "mat2", lambda: gemsops.bmm(d[None], s[None])),
        ("matmul", "other", lambda: gemsops.matmul(d, s)),
        ("addmm", "input", lambda: gemsops.addmm(sv, d, d)),
        ("addmm", "mat1", lambda: gemsops.addmm(v, s, d)),
        ("addmm", "mat2", lambda: gemsops.addmm(v, d, s)),
    ]
    for fn, arg, call in calls:
        if fn == "bmm" and to_sparse == "to_sparse_csr":
            continue  # a 3-D CSR tensor cannot be indexed as s[None]
        with pytest.raises(NotImplementedError, match=f"^{fn}\\(.*'{arg}'"):
            call()


def test_prod_dtype_under_autocast_and_jvp():
    # the dtype= given stays, as torch's autocast policy for prod keeps it
    x, t = torch.rand(3, 5) + 0.5, torch.randn(3, 5)
    pairs = [
        (
            lambda v: gemsops.prod(v, 1, dtype=torch.bfloat16),
            lambda v: torch.prod(v, 1, dtype=torch.bfloat16),
        ),
        (
            lambda v: gemsops.prod(v, dtype=torch.bfloat16),
            lambda v: torch.prod(v, dtype=torch.bfloat16),
        ),
    ]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for ours, theirs in pairs:
            got = torch.func.jvp(ours, (x,), (t,))
            want = torch.func.jvp(theirs, (x,), (t,))
            assert [g.dtype for g in got] == [w.dtype for w in want]
            torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-2)


def test_torch_ops_path_refuses_what_the_kernels_refuse():
    x, t = torch.randn(3, 8), torch.randn(3, 8)
    for w, b in (
        (torch.randn(8).bfloat16(), None),
        (None, torch.randn(8).double()),
    ):
        with pytest.raises(RuntimeError, match="dtype"):
            gemsops.layer_norm(x, (8,), w, b)  # eager: the kernel refuses
        with pytest.raises(RuntimeError, match="dtype"):
            torch.func.jvp(
                lambda v: gemsops.layer_norm(v, (8,), w, b), (x,), (t,)
            )


def test_rows_of_nothing_under_forward_ad():
    x, t = torch.randn(3, 0), torch.randn(3, 0)
    want = torch.native_layer_norm(x, (0,), None, None, 1e-5)
    with fwAD.dual_level():
        got = gemsops.native_layer_norm(fwAD.make_dual(x, t), (0,))
        got = [fwAD.unpack_dual(o).primal for o in got]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_native_layer_norm_statistics_not_differentiable_under_transforms():
    # as torch's native_layer_norm: under torch.func and forward-mode AD
    # mean and rstd carry no gradient and no tangent
    x, t = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6)
    for i in (1, 2):
        for fn in (
            lambda v: gemsops.native_layer_norm(v, (6,))[i],
            lambda v: torch.native_layer_norm(v, (6,), None, None, 1e-5)[i],
        ):
            g = torch.func.grad(lambda v: fn(v).sum())(x)
            assert torch.equal(g, torch.zeros_like(x))
            _, tangent = torch.func.jvp(fn, (x,), (t.double(),))
            assert torch.equal(tangent, torch.zeros_like(tangent))


def _direct_ops():
    """Each forward op called as torch.ops.gemsops.*, beside the same
    computation in torch's ops; float64 inputs."""
    ops = torch.ops.gemsops
    d = dict(dtype=torch.float64)
    x, w, b = torch.randn(3, 6, **d), torch.randn(6, **d), torch.randn(6, **d)
    m1, m2 = torch.randn(3, 4, **d), torch.randn(4, 5, **d)
    bt = torch.randn(2, 3, 4, **d), torch.randn(2, 4, 5, **d)
    return [
        (
            lambda v: ops.layer_norm(v, [6], w, b, 1e-5)[0],
            lambda v: F.layer_norm(v, (6,), w, b, 1e-5),
            x,
        ),
        (
            lambda v: ops.rms_norm(v, [6], w, 1e-6)[0],
            lambda v: F.rms_norm(v, (6,), w, 1e-6),
            x,
        ),
        (lambda v: ops.prod(v, 1), lambda v: torch.prod(v, 1), x),
        (lambda v: ops.prod(v, None), lambda v: torch.prod(v), x),
        (lambda v: ops.mm(v, m2), lambda v: torch.mm(v, m2), m1),
        (lambda v: ops.bmm(v, bt[1]), lambda v: torch.bmm(v, bt[1]), bt[0]),
        (
            lambda v: ops.addmm(b[:5], v, m2, 0.5, 2.0),
            lambda v: torch.addmm(b[:5], v, m2, beta=0.5, alpha=2.0),
            m1,
        ),
    ]


@pytest.mark.parametrize("case", range(7))
def test_direct_ops_under_forward_ad_and_func_grad(case):
    # the ops themselves, not only the public functions, give tangents
    # and gradients (their composites in torch's ops)
    ours, theirs, v = _direct_ops()[case]
    t = torch.randn_like(v)
    got, want = (
        torch.func.jvp(ours, (v,), (t,)),
        torch.func.jvp(theirs, (v,), (t,)),
    )
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert want[1].abs().sum() > 0
    torch.testing.assert_close(
        torch.func.grad(lambda u: ours(u).sum())(v),
        torch.func.grad(lambda u: theirs(u).sum())(v),
    )


def _batched_grad_cases():
    """(ours, theirs, args): each eager backward, float64 where gemsops
    takes it (the products are fp32 only)."""
    d = dict(dtype=torch.float64, requires_grad=True)
    x, r = torch.randn(4, 6, **d), torch.randn(4, 6, **d)
    w, b = torch.randn(6, **d), torch.randn(6, **d)
    a, m = torch.randn(4, 5, requires_grad=True), torch.randn(5, 3)
    m.requires_grad_()
    a3 = torch.randn(2, 4, 5, requires_grad=True)
    lw, lb = torch.randn(3, 5, requires_grad=True), torch.randn(3)
    lb.requires_grad_()
    return [
        (
            lambda x, w, b: gemsops.layer_norm(x, (6,), w, b),
            lambda x, w, b: F.layer_norm(x, (6,), w, b),
            (x, w, b),
        ),
        (
            lambda x, w: gemsops.rms_norm(x, (6,), w, 1e-6),
            lambda x, w: F.rms_norm(x, (6,), w, 1e-6),
            (x, w),
        ),
        (lambda x: gemsops.prod(x, 1), lambda x: torch.prod(x, 1), (x,)),
        (
            lambda x, r, w, b: gemsops.fused_add_layer_norm(x, r, (6,), w, b)[
                0
            ],
            lambda x, r, w, b: F.layer_norm(x + r, (6,), w, b),
            (x, r, w, b),
        ),
        (
            lambda x, r, w: gemsops.fused_add_rms_norm(x, r, (6,), w, 1e-6)[0],
            lambda x, r, w: F.rms_norm(x + r, (6,), w, 1e-6),
            (x, r, w),
        ),
        (gemsops.mm, torch.mm, (a, m)),
        (gemsops.addmm, torch.addmm, (lb, a, m.mT.contiguous().mT)),
        (gemsops.linear, F.linear, (a3, lw, lb)),
        (gemsops.matmul, torch.matmul, (a3, m)),
    ]


@pytest.mark.parametrize("case", range(9))
def test_batched_output_gradients_as_torch(case, device):
    # torch.autograd.grad(is_grads_batched=True): the backward runs under
    # vmap, whose batched gradients have no storage for the kernels
    ours, theirs, args = _batched_grad_cases()[case]
    args = tuple(t.detach().to(device).requires_grad_() for t in args)
    y = ours(*args)
    gs = torch.randn(3, *y.shape, dtype=y.dtype, device=device)
    got = torch.autograd.grad(y, args, gs, is_grads_batched=True)
    want = torch.autograd.grad(theirs(*args), args, gs, is_grads_batched=True)
    for g, t in zip(got, want):
        torch.testing.assert_close(g, t)


def _checkpointed_norms():
    """(name, gemsops function, torch function, argument shapes)."""
    return [
        (
            "layer_norm",
            lambda x, w, b: gemsops.layer_norm(x, (8,), w, b),
            _layer_norm_ref,
            [(2, 3, 8), (8,), (8,)],
        ),
        (
            "rms_norm",
            lambda x, w: gemsops.rms_norm(x, (8,), w),
            lambda x, w: F.rms_norm(x, (8,), w),
            [(2, 3, 8), (8,)],
        ),
        (
            "fused_add_layer_norm",
            lambda x, r, w: gemsops.fused_add_layer_norm(x, r, (8,), w),
            lambda x, r, w: _fused_ref(x, r, w, None),
            [(2, 3, 8), (2, 3, 8), (8,)],
        ),
        (
            "fused_add_rms_norm",
            lambda x, r, w: gemsops.fused_add_rms_norm(x, r, (8,), w),
            lambda x, r, w: (F.rms_norm(x + r, (8,), w), x + r),
            [(2, 3, 8), (2, 3, 8), (8,)],
        ),
    ]


def _checkpointed_grads(fn, inputs):
    # a mode open in the forward alone: the forward runs the op, the
    # checkpoint's recomputation (in the backward) the eager Function
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        out = checkpoint(fn, *inputs, use_reentrant=False)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum(o.pow(2).sum() * (i + 1) for i, o in enumerate(outs))
    return torch.autograd.grad(loss, inputs)


def test_checkpoint_recomputing_on_the_other_path():
    # a non-reentrant checkpoint hands the node made in the forward the
    # tensors its recomputation saved, matched by order. The norms' two
    # paths save the same tensors: torch's gradients (they raised
    # CheckpointError), as mm's and addmm's. linear's do not (its weight,
    # or the op's transpose of it): refused, where a square weight's
    # gradient came out wrong
    torch.manual_seed(5)
    for name, ours, theirs, shapes in _checkpointed_norms():
        args = [torch.randn(s, dtype=torch.float64) for s in shapes]
        got, want = (
            _checkpointed_grads(fn, [a.float().requires_grad_() for a in args])
            for fn in (ours, theirs)
        )
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=name)
    x, w, b = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    for ours, theirs, args in (
        (gemsops.mm, torch.mm, (x, w)),
        (
            lambda x, w, b: gemsops.addmm(b, x, w.mT),
            lambda x, w, b: torch.addmm(b, x, w.mT),
            (x, w, b),
        ),
    ):
        got, want = (
            _checkpointed_grads(fn, [a.clone().requires_grad_() for a in args])
            for fn in (ours, theirs)
        )
        for g, t in zip(got, want):
            torch.testing.assert_close(g, t, rtol=1e-4, atol=1e-4)
    for args in ((x, w, b), (x, w)):
        inputs = [a.clone().requires_grad_() for a in args]
        with pytest.raises(RuntimeError, match="came back transposed"):
            _checkpointed_grads(gemsops.linear, inputs)
