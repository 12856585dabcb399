"""The one home of the scratch and kept buffers CUDA launches need.

Two kinds of buffer:

* scratch: a fresh uint8 tensor from torch's caching allocator, for one
  launch (LayerNorm forward split rows, prod partials). Nothing is kept.
* kept: one buffer per (kind, device, stream) that launches on that stream
  share: the LayerNorm backward's dW/dB accumulators and the Stream-K flags
  and workspace. C vouches for a kept buffer only when it saw the last
  launch leave it in the known state (csrc/kept.c); any other buffer is
  prepared by the launch, so a buffer here is never trusted blindly.

Under CUDA-graph capture nothing is kept: a captured launch never runs at
capture time, so a buffer it "left zero" is not zero. Captured launches get
fresh buffers that the launch itself prepares (a memset node in the graph,
replayed with it), and they are not recorded here. The same holds while
torch.compile's CUDA graph trees (mode="reduce-overhead") warm a graph up:
those runs allocate from the graph's private pool, where a buffer kept
past the call is a leak the trees refuse.

Plans C computes (workspace bytes for a shape) are cached in a bounded LRU,
so a program that sees ever new shapes does not grow memory here."""

import sys
from collections import OrderedDict

import torch

_MAX_KEPT = 64  # (kind, device, stream) entries; the oldest goes first
_MAX_PLANS = 512  # cached plan sizes

_kept = OrderedDict()  # (kind, device index, stream handle) -> _Slot
_plans = OrderedDict()  # key -> int


class _Slot:
    """A kept buffer and the counter a kind may keep with it (the Stream-K
    epoch of the flags)."""

    __slots__ = ("buf", "epoch")

    def __init__(self, buf):
        self.buf = buf
        self.epoch = 0


def in_graph_pool(device):
    """True while what `device`'s current CUDA stream allocates goes to a
    CUDA graph's private memory pool: a capture, or a CUDA graph trees
    warm-up, which runs on the tree manager's own stream (False on the
    CPU)."""
    if device.type != "cuda":
        return False
    if torch.cuda.is_current_stream_capturing():
        return True
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:  # never imported: no tree exists
        return False
    index = device.index if device.index is not None else 0
    manager = trees.get_manager(index, create_if_none_exists=False)
    return (
        manager is not None
        and torch.cuda.current_stream(index) == manager.stream
    )


def scratch(nbytes, device, zero=False):
    """A fresh uint8 buffer of nbytes for one launch, or None for 0."""
    if not nbytes:
        return None
    make = torch.zeros if zero else torch.empty
    return make(nbytes, dtype=torch.uint8, device=device)


def kept(kind, device, stream, numel, dtype=torch.uint8, minimum=0, zero=True):
    """The buffer kept for `kind` on (device index, stream handle), with at
    least numel elements; made (zeros when `zero`) on first use or when too
    small. Returns its _Slot."""
    key = (kind, device, stream)
    slot = _kept.get(key)
    if slot is not None:
        _kept.move_to_end(key)  # evicted last: the one in use
    if slot is None or slot.buf.numel() < numel:
        make = torch.zeros if zero else torch.empty
        slot = _Slot(
            make(
                max(numel, minimum),
                dtype=dtype,
                device=torch.device("cuda", device),
            )
        )
        _kept[key] = slot
        if len(_kept) > _MAX_KEPT:
            _kept.popitem(last=False)
    return slot


def lookup(kind, device, stream):
    """The _Slot kept for `kind` on (device, stream), or None."""
    return _kept.get((kind, device, stream))


def forget(kind, device):
    """Drop every buffer of `kind` on `device` (after a failed launch,
    which may leave one in an unknown state)."""
    for key in [k for k in _kept if k[0] == kind and k[1] == device]:
        del _kept[key]


def kept_keys(kind):
    """(device, stream) of the buffers kept for `kind` (for tests)."""
    return [k[1:] for k in _kept if k[0] == kind]


def planned(key, query, *args):
    """query(*args), cached under key in a bounded LRU."""
    n = _plans.get(key)
    if n is None:
        n = _plans[key] = query(*args)
        if len(_plans) > _MAX_PLANS:
            _plans.popitem(last=False)
    return n


def clear():
    """Forget every kept buffer and plan."""
    _kept.clear()
    _plans.clear()
