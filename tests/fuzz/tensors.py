"""Random tensors for the fuzzer: values, layouts, NumPy producers, guarded
(poisoned) output buffers and snapshots of what a call must not change.

Everything random comes from the case's Ctx, so a case is a function of
(seed, index) alone. Values are drawn on the CPU in float64 with the
case's torch generator and then cast and moved, so a case makes the same
numbers on every device."""

import math
import random

import numpy as np
import torch

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
NP_DTYPES = {
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.bool: np.bool_,
}
POISON_BYTE = 0xA7  # guard bytes around outputs and workspaces

# sizes that find edge cases: 0, 1, odd, prime, powers of two and +-1
SMALL_SIZES = [
    0,
    1,
    1,
    2,
    3,
    5,
    7,
    8,
    13,
    16,
    17,
    31,
    32,
    33,
    37,
    63,
    64,
    65,
    97,
    127,
    128,
    129,
    255,
    256,
    257,
]
LARGE_SIZES = [509, 512, 1000, 1023, 1024, 1031, 2048, 4097, 8191]


class Ctx:
    """One case's random state and its log (what --replay prints)."""

    def __init__(self, seed, index, device):
        self.seed, self.index, self.device = seed, index, device
        self.rng = random.Random(f"gemsops-fuzz:{seed}:{index}")
        self.gen = torch.Generator().manual_seed(self.rng.getrandbits(63))
        self.lines = []
        self.numpy_ok = device == "cpu"

    def note(self, *parts):
        self.lines.append(" ".join(str(p) for p in parts))

    def chance(self, p):
        return self.rng.random() < p

    def choice(self, seq):
        return self.rng.choice(seq)

    def size(self, large=0.1, zero=0.05):
        """One dimension: mostly small, sometimes 0, sometimes large-ish."""
        if self.chance(zero):
            return 0
        if self.chance(large):
            return self.choice(LARGE_SIZES)
        return max(1, self.choice(SMALL_SIZES))

    def shape(self, ndim, budget=60000, **kw):
        """ndim sizes whose product stays under budget (shrinking the
        largest), occasionally ~1e6 when the case allows it. Zero sizes
        count as one: a reduction over the empty dim keeps the others."""
        s = [self.size(**kw) for _ in range(ndim)]
        while math.prod(max(v, 1) for v in s) > budget:
            i = max(range(ndim), key=lambda j: s[j])
            s[i] = max(1, s[i] // 2)
        return s

    # ----- values -----
    def values(self, shape, dtype, kind="normal", nonfinite=0.05):
        """float64/int64 CPU values for a tensor of `dtype`."""
        n = math.prod(shape)
        if dtype == torch.bool:
            return torch.rand(shape, generator=self.gen) < 0.9
        if not dtype.is_floating_point and not dtype.is_complex:
            lo, hi = (0, 4) if dtype == torch.uint8 else (-3, 4)
            return torch.randint(
                lo, hi, shape, generator=self.gen, dtype=torch.int64
            )
        if kind == "near_one":  # products that stay in range
            spread = 0.5 / math.sqrt(max(n, 1)) + 0.02
            v = (
                1
                + (
                    torch.rand(shape, generator=self.gen, dtype=torch.float64)
                    * 2
                    - 1
                )
                * spread
            )
            sign = torch.randint(0, 2, shape, generator=self.gen) * 2 - 1
            v = v * sign.double()
            if self.chance(0.1) and n:  # exact zeros: the zero-safe paths
                v.view(-1)[
                    torch.randint(0, n, (1 + n // 50,), generator=self.gen)
                ] = 0.0
        else:
            scale = self.choice([1.0, 1.0, 3.0, 1e-2, 50.0])
            shift = self.choice([0.0, 0.0, 0.5, -2.0, 100.0])
            v = (
                torch.randn(shape, generator=self.gen, dtype=torch.float64)
                * scale
                + shift
            )
        if n and self.chance(nonfinite):
            picks = torch.randint(
                0, n, (self.rng.randint(1, 3),), generator=self.gen
            )
            for p in picks.tolist():
                v.view(-1)[p] = self.choice([math.inf, -math.inf, math.nan])
        return v

    # ----- layouts -----
    def tensor(
        self,
        shape,
        dtype,
        kind="normal",
        layout=None,
        nonfinite=0.05,
        device=None,
        neg_ok=True,
    ):
        """A torch tensor of `shape` holding random values in a random
        layout (neg_ok=False: none with the negative bit); returns (tensor,
        layout name)."""
        device = device or self.device
        shape = list(shape)
        vals = self.values(shape, dtype, kind, nonfinite)
        if layout is None:
            opts = ["contig"] * 4 + ["transposed", "sliced", "offset"]
            if len(shape) >= 1 and any(s > 1 for s in shape):
                opts.append("expand")
            if len(shape) == 4:
                opts.append("channels_last")
            if dtype in (torch.float32, torch.float64) and neg_ok:
                opts += ["neg", "conj"]
            layout = self.choice(opts)
        t = place(self, vals, dtype, layout, device)
        return t, layout

    def describe(self, name, t):
        self.note(f"  {name} = {describe(t)}")


def place(ctx, vals, dtype, layout, device):
    """vals (CPU, float64/int64/bool) into a tensor of that layout whose
    values equal vals."""
    shape = list(vals.shape)
    nd = len(shape)
    if layout == "transposed" and nd >= 2:
        i, j = ctx.rng.sample(range(nd), 2)
        t = vals.transpose(i, j).contiguous().to(dtype).to(device)
        return t.transpose(i, j)
    if layout == "sliced" and nd >= 1:
        d = ctx.rng.randrange(nd)
        step = ctx.choice([2, 3])
        big = list(shape)
        big[d] = shape[d] * step + 1
        base = torch.zeros(big, dtype=dtype, device=device)
        idx = [slice(None)] * nd
        idx[d] = slice(1, None, step)
        view = base[tuple(idx)]
        view.copy_(vals.to(dtype).to(device))
        return view
    if layout == "offset":
        n = vals.numel()
        off = ctx.rng.randint(1, 9)
        base = torch.zeros(n + off + 3, dtype=dtype, device=device)
        view = base[off : off + n].view(shape)
        view.copy_(vals.to(dtype).to(device))
        return view
    if layout == "expand" and nd >= 1:
        dims = [i for i, s in enumerate(shape) if s > 1]
        if dims:
            d = ctx.choice(dims)
            one = vals.narrow(d, 0, 1).contiguous()
            return one.to(dtype).to(device).expand(shape)
    if layout == "channels_last" and nd == 4:
        return vals.to(dtype).to(device).to(memory_format=torch.channels_last)
    if layout == "neg" and dtype in (torch.float32, torch.float64):
        return torch._neg_view((-vals).to(dtype).to(device))
    if layout == "conj" and dtype in (torch.float32, torch.float64):
        cdt = torch.complex64 if dtype == torch.float32 else torch.complex128
        re = torch.zeros_like(vals)
        z = torch.complex(re, -vals).to(cdt).to(device)
        return z.conj().imag  # neg bit set; values == vals
    return vals.to(dtype).to(device).contiguous()


def describe(t):
    """One line: what a tensor / array / value is, for logs and replays."""
    if t is None:
        return "None"
    if isinstance(t, torch.Tensor):
        s = (
            f"tensor(shape={list(t.shape)}, stride={list(t.stride())}, "
            f"{str(t.dtype)[6:]}, offset={t.storage_offset()}"
        )
        if t.is_neg():
            s += ", neg-bit"
        if t.is_conj():
            s += ", conj-bit"
        if t.device.type != "cpu":
            s += f", {t.device}"
        if t.numel() and t.is_floating_point():
            nf = int((~torch.isfinite(t)).sum())
            if nf:
                s += f", {nf} non-finite"
        return s + ")"
    if isinstance(t, np.ndarray):
        flags = "" if t.flags.writeable else ", read-only"
        kind = type(t).__name__
        return (
            f"{kind}(shape={list(t.shape)}, strides={list(t.strides)}, "
            f"{t.dtype}{flags})"
        )
    return repr(t)


def to_numpy(ctx, t, writable=True, reversed_ok=True):
    """A NumPy producer holding t's values (CPU): plain, reversed strides
    (unless reversed_ok is False), read-only, frombuffer(bytes) or
    read-only memmap. Returns the array."""
    if t.dtype not in NP_DTYPES or t.is_neg():
        return t
    a = t.detach().resolve_neg().contiguous().numpy().copy()
    kinds = ["plain", "reversed"] if reversed_ok else ["plain"]
    if not writable:
        kinds += ["readonly", "frombuffer", "memmap"]
    kind = ctx.choice(kinds)
    if kind == "reversed" and a.ndim >= 1:
        b = np.ascontiguousarray(a[::-1])
        return b[::-1]
    if kind == "readonly":
        a.flags.writeable = False
        return a
    if kind == "frombuffer":
        return np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)
    if kind == "memmap" and a.size:
        return readonly_memmap(a)
    return a


_memmaps = []


def readonly_memmap(a):
    import tempfile

    f = tempfile.NamedTemporaryFile(prefix="gemsops-fuzz-", suffix=".bin")
    f.write(a.tobytes())
    f.flush()
    _memmaps.append(f)  # keep the file alive for the case
    return np.memmap(f.name, dtype=a.dtype, mode="r", shape=a.shape)


def as_torch(x):
    """A torch tensor with x's values (NumPy arrays copied)."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x).copy())
    return x


# ----- guarded outputs -----
class Guarded:
    """An output (or workspace) viewed inside a larger byte buffer whose
    every other byte holds POISON_BYTE; the view itself is poisoned with
    NaN (floats) or a sentinel (ints). check() names any byte outside the
    view that changed."""

    def __init__(
        self,
        ctx,
        shape,
        dtype,
        device=None,
        strided=False,
        numpy=False,
        misalign=False,
    ):
        device = device or ctx.device
        esize = torch.empty((), dtype=dtype).element_size()
        shape = list(shape)
        n = math.prod(shape)
        step = ctx.choice([2, 3]) if strided and shape else 1
        strides, acc = [0] * len(shape), step
        for d in range(len(shape) - 1, -1, -1):
            strides[d] = acc
            acc *= max(shape[d], 1)
        span = (
            1 + sum((s - 1) * st for s, st in zip(shape, strides)) if n else 0
        )
        before = ctx.rng.randint(1, 6) * 16 // esize * esize or esize
        after = ctx.rng.randint(1, 6) * 16
        nbytes = before + span * esize + after + (1 if misalign else 0)
        self.buf = torch.full(
            (nbytes,), POISON_BYTE, dtype=torch.uint8, device=device
        )
        start = before + (1 if misalign else 0)
        self.numpy = (
            (numpy or misalign) and device == "cpu" and dtype in NP_DTYPES
        )
        if self.numpy:
            nb = self.buf.numpy()  # shares memory with self.buf
            self.view = np.ndarray(
                shape,
                dtype=NP_DTYPES[dtype],
                buffer=nb,
                offset=start,
                strides=[s * esize for s in strides],
            )
        else:
            typed = self.buf[start : start + span * esize]
            if not misalign:
                typed = typed.view(dtype)
                self.view = typed.as_strided(shape, strides)
            else:  # torch cannot view misaligned bytes: leave it bytes
                self.view = typed  # (bf16 only; the case drops it)
        # which bytes belong to the view's elements
        # (marked through a byte view of the same strides: no index
        # tensors, so a large output costs one byte per byte)
        mask = torch.zeros(nbytes, dtype=torch.bool)
        if n:
            mask[start:].as_strided(
                shape + [esize], [st * esize for st in strides] + [1]
            ).fill_(True)
        self.inside = mask
        self.dtype, self.shape = dtype, shape
        self.poison_view()
        self.before = self.buf.cpu().clone()

    def poison_view(self):
        if (
            self.numpy
            or self.view.dtype == torch.uint8
            and self.dtype != torch.uint8
        ):
            return  # bytes already POISON_BYTE
        if self.dtype.is_floating_point:
            self.view.fill_(float("nan"))
        elif self.dtype == torch.bool:
            self.view.fill_(True)
        else:
            self.view.fill_(-0x5A5A if self.dtype != torch.uint8 else 0x5A)

    def result(self):
        """The view's values as a torch tensor on the case's device."""
        if self.numpy:
            return torch.from_numpy(np.array(self.view))
        return self.view

    def outside_changes(self):
        now = self.buf.cpu()
        changed = (now != self.before) & ~self.inside
        return int(changed.sum()), (changed.nonzero()[:1].tolist() or [[-1]])[
            0
        ][0]

    def any_change(self):
        return int((self.buf.cpu() != self.before).sum())


def snapshot(objs):
    """Bytes of the whole storage of every tensor / array in objs."""
    snap = []
    for o in objs:
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            raw = torch.empty(0, dtype=torch.uint8, device=o.device).set_(
                st, 0, (st.nbytes(),), (1,)
            )
            snap.append((o, raw, raw.cpu().clone()))
        elif isinstance(o, np.ndarray):
            base = o
            while isinstance(base.base, np.ndarray):
                base = base.base
            snap.append((o, None, np.array(base, copy=True)))
            snap[-1] = (o, base, snap[-1][2])
    return snap


def _bytes(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def changed_inputs(snap):
    """Names (descriptions) of snapshotted objects whose bytes changed."""
    bad = []
    for o, raw, old in snap:
        if isinstance(o, torch.Tensor):
            if not torch.equal(raw.cpu(), old):
                bad.append(describe(o))
        elif not np.array_equal(_bytes(raw), _bytes(old)):
            bad.append(describe(o))
    return bad
