"""A fixed-seed fuzz batch (tests/fuzz): every case must pass, or be a
refusal torch makes too (or one listed in oracle.DOCUMENTED).
GEMSOPS_FUZZ_CASES scales the batch (default 4000 on the CPU, about half a
minutes on two cores); GEMSOPS_FUZZ_SEED picks another seed. The failure
list printed on failure has one replay command per failure class."""

import io
import os

import pytest

from tests.fuzz import runner

SEED = int(os.environ.get("GEMSOPS_FUZZ_SEED", "20261124"))
CASES = int(os.environ.get("GEMSOPS_FUZZ_CASES", "4000"))
WORKERS = int(os.environ.get("GEMSOPS_FUZZ_WORKERS", "2"))

# Failure classes still open (each is a known gap, not a pass): the batch
# fails on any failure that matches none of them. Remove an entry when its
# class is fixed; `python -m tests.fuzz` always reports them.
KNOWN_OPEN = [
    # half-type backward error a little above torch's on rare long rows of
    # the CUDA kernels (the CPU's backward has not shown it: over 190,000
    # cases of seeds 4301-4306 and this batch's, none out of tolerance)
    ("cuda", "layer_norm", "out of tolerance"),
]


def _known_open(r, device):
    return any(
        device == dev and r["family"] == fam and words in r["message"]
        for dev, fam, words in KNOWN_OPEN
    )


def _batch(device):
    ops = runner.parse_ops("")
    results = runner.run_batch(
        SEED, range(CASES), device, ops, WORKERS, timeout=120.0
    )
    report = io.StringIO()
    fails = runner.summary(
        results,
        ops,
        "python -m tests.fuzz"
        + (" --device cuda" if device == "cuda" else ""),
        out=report,
    )
    assert len(results) == CASES
    assert all(_known_open(r, device) for r in fails), report.getvalue()


def test_fuzz_cpu():
    _batch("cpu")


@pytest.mark.cuda
def test_fuzz_cuda():
    _batch("cuda")
