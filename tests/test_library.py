"""The ops as torch sees them: torch.library registrations (opcheck),
torch.compile with fullgraph (no graph break, results as eager), dynamic
shapes, torch.export, and the one workspace helper."""

import pytest
import torch

import gemsops
from gemsops import _workspace

ops = torch.ops.gemsops


def _on(device, args):
    """args with every tensor moved to device (requires_grad kept)."""
    return tuple(
        a.detach().to(device).requires_grad_(a.requires_grad)
        if isinstance(a, torch.Tensor)
        else a
        for a in args
    )


def _ln_samples():
    torch.manual_seed(0)
    x = torch.randn(5, 8)
    w, b = torch.randn(8), torch.randn(8)
    yield (x, [8], w, b, 1e-5)
    yield (x, [8], None, None, 1e-5)
    yield (torch.randn(2, 3, 4, 6), [4, 6], torch.randn(4, 6), None, 1e-3)
    yield (x.t().contiguous().t(), [8], w, b, 1e-5)  # strided rows
    yield (
        x.clone().requires_grad_(),
        [8],
        w.clone().requires_grad_(),
        b.clone().requires_grad_(),
        1e-5,
    )
    yield (x.bfloat16(), [8], w, b, 1e-5)  # mixed precision


@pytest.mark.parametrize(
    "args", list(_ln_samples()), ids=lambda a: "x".join(map(str, a[0].shape))
)
def test_opcheck_layer_norm(args, device):
    torch.library.opcheck(ops.layer_norm.default, _on(device, args))


@pytest.mark.parametrize(
    "mask", [[True, True, True], [True, False, False], [False, True, True]]
)
def test_opcheck_layer_norm_backward(mask, device):
    torch.manual_seed(1)
    x, w, b, g = _on(
        device,
        (
            torch.randn(6, 10),
            torch.randn(10),
            torch.randn(10),
            torch.randn(6, 10),
        ),
    )
    _, mean, rstd = ops.layer_norm(x, [10], w, b, 1e-5)
    torch.library.opcheck(
        ops.layer_norm_backward.default,
        (g, x, [10], mean, rstd, w, b, mask, None),
    )
    torch.library.opcheck(
        ops.layer_norm_backward.default,
        (
            g.double().requires_grad_(),
            x.double().requires_grad_(),
            [10],
            mean.double(),
            rstd.double(),
            w.double().requires_grad_(),
            None,
            mask,
            None,
        ),
    )


def test_op_without_grad_under_a_dispatch_mode(device):
    """A no-grad call of an op goes straight to its kernel only for plain
    tensors: a dispatch mode still sees the op, and the answers agree."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(4)
    a = torch.randn(6, 5, device=device, requires_grad=True)
    b = torch.randn(5, 3, device=device)
    want = a.detach().double() @ b.double()
    with torch.no_grad():
        plain = ops.mm(a, b)
        with Seen() as seen:
            moded = ops.mm(a, b)
    assert "gemsops.mm.default" in seen.ops
    assert not plain.requires_grad and not moded.requires_grad
    for got in (plain, moded):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    neg = torch._neg_view(-a.detach())  # a key below autograd: redispatched
    with torch.no_grad():
        torch.testing.assert_close(
            ops.mm(neg, b).double(), want, rtol=1e-5, atol=1e-5
        )


def test_op_default_left_out_with_grad(device):
    """A call that leaves out a trailing default (the dispatcher passes the
    kernels fewer arguments) still records the op for autograd: second
    order through layer_norm_backward against torch's, in float64."""
    torch.manual_seed(3)
    kw = dict(dtype=torch.float64, device=device)
    x, g = (torch.randn(6, 10, **kw, requires_grad=True) for _ in range(2))
    w, b = (torch.randn(10, **kw, requires_grad=True) for _ in range(2))
    _, mean, rstd = ops.layer_norm(x.detach(), [10], w.detach(), None, 1e-5)
    dx, dw, _ = ops.layer_norm_backward(
        g, x, [10], mean, rstd, w, b, [True, True, True]
    )
    y = torch.nn.functional.layer_norm(x, (10,), w, b, 1e-5)
    rdx, rdw = torch.autograd.grad(y, (x, w), g, create_graph=True)
    v, u = torch.randn_like(dx), torch.randn_like(dw)
    got = torch.autograd.grad((dx * v).sum() + (dw * u).sum(), (x, w, g))
    want = torch.autograd.grad((rdx * v).sum() + (rdw * u).sum(), (x, w, g))
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize(
    "x, dim",
    [
        (torch.randn(3, 4), 1),
        (torch.randn(3, 4), None),
        (torch.randn(2, 3, 5).requires_grad_(), 1),
        (torch.randn(7).requires_grad_(), None),
        (torch.randint(-3, 4, (3, 4)), 0),
        (torch.randn(3, 4).bfloat16(), 0),
    ],
)
def test_opcheck_prod(x, dim, device):
    (x,) = _on(device, (x,))
    torch.library.opcheck(ops.prod.default, (x, dim))
    if x.is_floating_point():
        g = torch.randn(ops.prod(x, dim).shape, dtype=x.dtype, device=device)
        torch.library.opcheck(ops.prod_backward.default, (x.detach(), dim, g))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_mm_bmm(dtype, device):
    torch.manual_seed(2)
    kw = dict(dtype=dtype, device=device)
    a = torch.randn(5, 7, **kw, requires_grad=True)
    b = torch.randn(7, 3, **kw, requires_grad=True)
    torch.library.opcheck(ops.mm.default, (a, b))
    torch.library.opcheck(ops.mm.default, (a.detach().t(), a.detach()))
    torch.library.opcheck(
        ops.bmm.default,
        (torch.randn(2, 5, 7, **kw), torch.randn(2, 7, 3, **kw)),
    )


def _recording_backend():
    """(targets, backend): a torch.compile backend that runs the graph as
    traced and lists the targets of its calls."""
    seen = []

    def backend(gm, example_inputs):
        seen.extend(
            str(n.target) for n in gm.graph.nodes if n.op == "call_function"
        )
        return gm.forward

    return seen, backend


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_addmm(dtype, device):
    torch.manual_seed(3)
    kw = dict(dtype=dtype, device=device)
    a = torch.randn(5, 7, **kw, requires_grad=True)
    b = torch.randn(7, 3, **kw, requires_grad=True)
    for bias in (torch.randn(3, **kw), torch.randn(5, 1, **kw)):
        for beta, alpha in ((1.0, 1.0), (0.5, -2.0), (0.0, 1.0)):
            torch.library.opcheck(
                ops.addmm.default,
                (bias.requires_grad_(), a, b, beta, alpha),
            )


def test_addmm_op_refuses_batched_mats(device):
    """The kernel would fold a batched mat1's rows; the fake kernel's shape
    is 2-D: the op takes 2-D mats only, real and fake alike."""
    a, b = (
        torch.randn(2, 4, 5, device=device),
        torch.randn(5, 3, device=device),
    )
    with pytest.raises(RuntimeError, match="2-D"):
        ops.addmm(torch.randn(3, device=device), a, b, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="2-D"):
        ops.addmm(*(t.to("meta") for t in (b[0], a, b)), 1.0, 1.0)


def test_compiled_linear_bias_in_the_epilogue(device):
    """Compiled nn.Linear with a bias runs gemsops::addmm (one rounding),
    giving eager's bits, not a product rounded and then the bias added."""
    torch.manual_seed(5)
    lin = gemsops.nn.Linear(256, 64).to(device, torch.bfloat16)
    x = torch.randn(64, 256, device=device, dtype=torch.bfloat16)
    seen, backend = _recording_backend()
    torch._dynamo.reset()
    got = torch.compile(lin, backend=backend, fullgraph=True)(x)
    assert "gemsops.addmm" in " ".join(seen)
    assert torch.equal(got, lin(x))
    torch._dynamo.reset()
    assert torch.equal(torch.compile(lin, fullgraph=True)(x), lin(x))


class Block(torch.nn.Module):
    """LayerNorm, a matmul family product of each kind, and prod."""

    def __init__(self, d=16):
        super().__init__()
        self.ln = gemsops.nn.LayerNorm(d)
        self.lin = gemsops.nn.Linear(d, d)
        self.rms = gemsops.nn.RMSNorm(d)
        self.w = torch.nn.Parameter(torch.randn(d, d) / d**0.5)
        self.v = torch.nn.Parameter(torch.randn(d) / d**0.5)

    def forward(self, x):
        h = self.ln(x)
        h = self.rms(self.lin(h) + h)
        h = gemsops.fused_add_layer_norm(h, x, (h.shape[-1],))[0]
        h = gemsops.matmul(h, self.w)  # batched (bmm)
        h2 = gemsops.mm(h.reshape(-1, h.shape[-1]), self.w.t())
        att = gemsops.bmm(h, h.transpose(1, 2))
        s = gemsops.matmul(h2, self.v)  # matrix x vector
        p = gemsops.prod(torch.tanh(h) * 0.1 + 1, -1)
        out, mean, rstd = gemsops.native_layer_norm(att, (att.shape[-1],))
        return (
            s.sum()
            + p.sum()
            + out.square().sum()
            + rstd.sum() * 0
            + gemsops.prod(torch.sigmoid(self.v) + 0.5)
        )


def _run(model, x):
    model.zero_grad()
    xg = x.clone().requires_grad_()
    out = model(xg)
    out.backward()
    return out.detach(), xg.grad, [p.grad.clone() for p in model.parameters()]


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def _graph_breaks(fn, *args):
    explain = torch._dynamo.explain(fn)(*args)
    return explain.graph_break_count, explain.graph_count


def _inductor_works():
    try:
        torch._dynamo.reset()
        f = torch.compile(lambda t: t * 2 + 1, backend="inductor")
        return bool((f(torch.ones(3)) == 3).all())
    except Exception:
        return False


BACKENDS = [
    "aot_eager",
    pytest.param(
        "inductor",
        marks=pytest.mark.skipif(
            not _inductor_works(), reason="inductor cannot compile here"
        ),
    ),
]


def test_no_graph_breaks(device):
    torch._dynamo.reset()
    model, x = Block().to(device), torch.randn(2, 5, 16, device=device)
    breaks, graphs = _graph_breaks(model, x)
    assert breaks == 0 and graphs == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_matches_eager(backend, dynamic, device):
    torch.manual_seed(3)
    model = Block().to(device)
    torch._dynamo.reset()
    compiled = torch.compile(
        model, fullgraph=True, backend=backend, dynamic=dynamic
    )
    x = torch.randn(2, 5, 16, device=device)
    want = _run(model, x)
    got = _run(compiled, x)
    _close(got[0], want[0])
    _close(got[1], want[1])
    for g, w in zip(got[2], want[2]):
        _close(g, w)
    if dynamic:  # a second shape, no recompile needed for it to be right
        x = torch.randn(3, 9, 16, device=device)
        want, got = _run(model, x), _run(compiled, x)
        _close(got[0], want[0])


def test_compiled_ops_are_in_the_graph():
    """The FX graph holds gemsops ops, not a Python call."""
    seen, backend = _recording_backend()
    torch._dynamo.reset()
    f = torch.compile(
        lambda x, w: gemsops.mm(
            gemsops.layer_norm(x, (8,), w), w.expand(8, 8)
        ).prod(),
        backend=backend,
        fullgraph=True,
    )
    f(torch.randn(4, 8), torch.randn(8))
    g = torch.compile(
        lambda x: gemsops.prod(x, 1), backend=backend, fullgraph=True
    )
    g(torch.randn(4, 8))
    text = " ".join(seen)
    assert "gemsops.layer_norm" in text and "gemsops.mm" in text
    assert "gemsops.prod" in text


def test_export(device):
    torch.manual_seed(4)
    model = Block().to(device)
    x = torch.randn(2, 5, 16, device=device)
    ep = torch.export.export(model, (x,))
    targets = {str(n.target) for n in ep.graph.nodes}
    for name in (
        "gemsops.layer_norm.default",
        "gemsops.bmm.default",
        "gemsops.mm.default",
        "gemsops.prod.default",
    ):
        assert name in targets
    _close(ep.module()(x), model(x))


def test_export_dynamic_batch():
    model = Block()
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(
        model, (torch.randn(2, 5, 16),), dynamic_shapes=({0: batch},)
    )
    x = torch.randn(7, 5, 16)
    _close(ep.module()(x), model(x))


def test_compiled_norms_take_each_eps():
    # eps is an argument of the compiled function, changed call to call
    torch._dynamo.reset()
    F = torch.nn.functional

    def f(x, eps):
        return gemsops.layer_norm(x, (8,), eps=eps) + gemsops.rms_norm(
            x, (8,), eps=eps
        )

    g = torch.compile(f, backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 8)
    for eps in (1e-5, 1e-2, 0.5, 2):
        want = F.layer_norm(x, (8,), eps=eps) + F.rms_norm(x, (8,), eps=eps)
        torch.testing.assert_close(g(x, eps), want)


def test_compiled_addmm_takes_a_tensor_alpha_as_torch(device):
    # a 0-d tensor alpha compiles as it does in torch.addmm: gemsops hands
    # it to torch's addmm, where Dynamo cannot branch on its value (torch
    # 2.13 compiles it on the CPU; torch 2.11 refuses it on CUDA)
    alpha = torch.tensor(0.75, device=device)
    bias, a, b = (
        torch.randn(s, device=device) for s in ((3,), (2, 4), (4, 3))
    )
    outcomes = []
    for addmm in (gemsops.addmm, torch.addmm):
        torch._dynamo.reset()
        g = torch.compile(
            lambda bias, a, b, addmm=addmm: addmm(bias, a, b, alpha=alpha),
            backend="aot_eager",
            fullgraph=True,
        )
        try:
            outcomes.append(g(bias, a, b))
        except Exception as e:  # torch's own outcome decides
            outcomes.append(type(e))
    ours, torchs = outcomes
    if isinstance(torchs, type):
        assert ours is torchs
    else:
        torch.testing.assert_close(ours, torchs)


def test_eager_errors_unchanged_in_compiled_code():
    """Argument checks run before the op, so compiled code raises what
    eager raises."""
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: gemsops.mm(a, b), backend="aot_eager")
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        f(torch.randn(2, 3), torch.randn(4, 5))


def test_workspace_helper_is_bounded_and_capture_aware():
    _workspace.clear()
    for i in range(_workspace._MAX_PLANS + 50):
        assert _workspace.planned(("t", i), lambda n: n * 2, i) == 2 * i
    assert len(_workspace._plans) == _workspace._MAX_PLANS
    assert not _workspace.in_graph_pool(torch.device("cpu"))
    assert _workspace.scratch(0, torch.device("cpu")) is None
    assert _workspace.scratch(5, torch.device("cpu"), zero=True).sum() == 0
    _workspace.clear()


def test_one_workspace_home():
    """No op module keeps a cache of its own."""
    import gemsops.ops.layer_norm as ln
    import gemsops.ops.matmul as mm
    import gemsops.ops.prod as pr

    for mod, names in (
        (ln, ("_fwd_ws", "_bwd_last", "_bwd_kept")),
        (pr, ("_fwd_ws", "_bwd_ws")),
        (mm, ("_streams", "_errors")),
    ):
        for name in names:
            assert not hasattr(mod, name)


@pytest.mark.cuda
def test_cuda_graph_capture_and_compile():
    torch.manual_seed(5)
    model = Block().cuda()
    x = torch.randn(2, 5, 16, device="cuda")
    want = model(x)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        model(x)  # warm up on the side stream
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        got = model(x)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        _close(got, want)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    _close(compiled(x), want)


@pytest.mark.cuda
def test_cuda_reduce_overhead_training_step_matches_eager():
    """mode="reduce-overhead": the compiled forward and backward replay as
    CUDA graphs (the ops' workspaces taken under capture); four SGD steps
    track the eager model's losses and weights."""
    import copy

    torch.manual_seed(6)
    eager = Block().cuda()
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, model)]
    for _ in range(4):
        x = torch.randn(2, 5, 16, device="cuda")
        losses = []
        for fn, opt in ((eager, opts[0]), (compiled, opts[1])):
            opt.zero_grad(set_to_none=True)
            loss = fn(x)
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        _close(losses[1], losses[0])
        for p, q in zip(model.parameters(), eager.parameters()):
            _close(p.detach(), q.detach())


def _subclass_cases(wrap):
    """(name, torch's call, gemsops' call) over tensors that wrap(t) makes:
    each op with the wrapped tensor as input, and as a parameter beside a
    plain input."""
    torch.manual_seed(1)
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    r, W, c = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6)
    F = torch.nn.functional
    tx, tw, tW, tc = wrap(x), wrap(w), wrap(W), wrap(c)
    tWt, tx3 = wrap(W.t()), wrap(x[None])  # a tensor-like has no methods
    return [
        (
            "layer_norm",
            lambda: F.layer_norm(tx, (8,), w, b),
            lambda: gemsops.layer_norm(tx, (8,), w, b),
        ),
        (
            "layer_norm weight",
            lambda: F.layer_norm(x, (8,), tw, b),
            lambda: gemsops.layer_norm(x, (8,), tw, b),
        ),
        (
            "rms_norm",
            lambda: F.rms_norm(tx, (8,), w),
            lambda: gemsops.rms_norm(tx, (8,), w),
        ),
        (
            "rms_norm weight",
            lambda: F.rms_norm(x, (8,), tw),
            lambda: gemsops.rms_norm(x, (8,), tw),
        ),
        (
            "fused_add_layer_norm",
            lambda: F.layer_norm(tx + r, (8,), w, b),
            lambda: gemsops.fused_add_layer_norm(tx, r, (8,), w, b)[0],
        ),
        (
            "fused_add_rms_norm",
            lambda: F.rms_norm(tx + r, (8,), w),
            lambda: gemsops.fused_add_rms_norm(tx, r, (8,), w)[0],
        ),
        ("prod", lambda: torch.prod(tx, 1), lambda: gemsops.prod(tx, 1)),
        ("mm", lambda: torch.mm(tx, W.t()), lambda: gemsops.mm(tx, W.t())),
        (
            "mm weight",
            lambda: torch.mm(x, tWt),
            lambda: gemsops.mm(x, tWt),
        ),
        (
            "bmm",
            lambda: torch.bmm(tx3, W.t()[None]),
            lambda: gemsops.bmm(tx3, W.t()[None]),
        ),
        (
            "matmul",
            lambda: torch.matmul(tx, W.t()),
            lambda: gemsops.matmul(tx, W.t()),
        ),
        (
            "addmm bias",
            lambda: torch.addmm(tc, x, W.t()),
            lambda: gemsops.addmm(tc, x, W.t()),
        ),
        (
            "linear",
            lambda: F.linear(tx, W, c),
            lambda: gemsops.linear(tx, W, c),
        ),
        (
            "linear weight",
            lambda: F.linear(x, tW, c),
            lambda: gemsops.linear(x, tW, c),
        ),
    ]


def test_storageless_subclass_takes_the_op():
    # a __torch_dispatch__ wrapper (no storage of its own, its
    # __torch_function__ disabled: DTensor, TwoTensor, FakeTensor) must
    # not reach C; through the op it computes each inner tensor, as
    # torch's functions do
    from torch.testing._internal.two_tensor import TwoTensor

    for name, theirs, ours in _subclass_cases(lambda t: TwoTensor(t, 2 * t)):
        want, got = theirs(), ours()
        assert type(got) is TwoTensor, name
        for half in ("a", "b"):
            torch.testing.assert_close(
                getattr(got, half), getattr(want, half), msg=name
            )


class _TensorLike:
    """Not a tensor, but torch's __torch_function__ protocol: unwraps its
    arguments and calls the function."""

    def __init__(self, t):
        self.t = t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def un(a):
            return a.t if isinstance(a, _TensorLike) else a

        kwargs = {k: un(v) for k, v in (kwargs or {}).items()}
        return func(*map(un, args), **kwargs)


def test_tensor_likes_are_handed_their_call():
    for name, theirs, ours in _subclass_cases(_TensorLike):
        torch.testing.assert_close(ours(), theirs(), msg=name)
    with pytest.raises(TypeError, match="must be a Tensor"):
        gemsops.layer_norm(object(), (8,))


class _Logged(torch.Tensor):
    """A subclass overriding __torch_function__ that records each function
    it is handed, then computes as the default does (results of its type)."""

    calls = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(func)
        return super().__torch_function__(func, types, args, kwargs)


def test_subclasses_and_modes_are_handed_the_public_function():
    # torch's F.layer_norm hands such a subclass one call, of itself; the
    # public functions do the same (not the tensor methods their Python
    # layer calls, nor the custom op beneath), and so for a function mode
    def public(name):
        return getattr(gemsops, name.split()[0])

    for name, theirs, ours in _subclass_cases(
        lambda t: t.as_subclass(_Logged)
    ):
        want = theirs()
        _Logged.calls.clear()
        got = ours()
        assert _Logged.calls == [public(name)], name
        assert type(got) is _Logged, name
        torch.testing.assert_close(got, want, msg=name)

    # layer_norm_backward (torch's counterpart: the aten op) likewise
    x, g = torch.randn(4, 8), torch.randn(4, 8)
    _, mean, rstd = torch.native_layer_norm(x, (8,), None, None, 1e-5)
    want = torch.ops.aten.native_layer_norm_backward(
        g, x, (8,), mean, rstd, None, None, (True, False, False)
    )[0]
    for wrap in (lambda t: t.as_subclass(_Logged), _TensorLike):
        _Logged.calls.clear()
        got = gemsops.layer_norm_backward(
            wrap(g), x, (8,), mean, rstd, output_mask=(True, False, False)
        )[0]
        if wrap is not _TensorLike:
            assert _Logged.calls == [gemsops.layer_norm_backward]
        torch.testing.assert_close(torch.as_tensor(got), want)

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    seen = []
    x = torch.randn(4, 8)
    with Mode():
        y = gemsops.layer_norm(x, (8,))
    assert seen == [gemsops.layer_norm]
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (8,)))


def test_layer_norm_backward_meta_beside_real_tensors_refused():
    # a meta grad_out reaches the op's fake kernel with the CPU tensors
    # beside it: refused there, as torch refuses it, not unfilled CPU
    # outputs
    x, mean, rstd = torch.randn(4, 8), torch.zeros(4, 1), torch.ones(4, 1)
    g = torch.empty(4, 8, device="meta")
    with pytest.raises(RuntimeError):
        torch.ops.aten.native_layer_norm_backward(
            g, x, (8,), mean, rstd, None, None, [True, False, False]
        )
    with pytest.raises(RuntimeError, match="same device"):
        gemsops.layer_norm_backward(
            g, x, (8,), mean, rstd, output_mask=(True, False, False)
        )
