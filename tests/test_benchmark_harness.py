"""The benchmark harness's rounds (benchmark/performance_utils.py): every
provider of a case timed ROUNDS times, every other round reversed, its
fastest median kept; a peer's failure is data, torch's or gemsops' is not.
The timing itself needs a GPU; the bookkeeping does not."""

import random

import pytest

from benchmark import performance_utils as pu


def bench_with(timer, rounds, monkeypatch):
    monkeypatch.setattr(pu, "ROUNDS", rounds)
    bench = pu.Benchmark("harness", None, None, None, [], [])
    bench._timed = timer
    return bench


@pytest.mark.parametrize("rounds", [1, 2, 3, 4])
def test_rounds_alternate_order_and_keep_the_fastest(rounds, monkeypatch):
    rng = random.Random(rounds)
    calls, drawn = [], {}

    def timer(op, args):
        t = rng.uniform(1.0, 2.0)
        calls.append(op)
        drawn.setdefault(op, []).append(t)
        return t, True

    names = ["torch", "gems", "p1", "p2", "p3"]
    bench = bench_with(timer, rounds, monkeypatch)
    got = bench._timed_rounds({n: n for n in names}, None)
    want_calls = []
    for r in range(rounds):
        want_calls += names if r % 2 == 0 else names[::-1]
    assert calls == want_calls
    assert list(got) == names
    for n in names:
        assert got[n] == (min(drawn[n]), True)


def test_a_failing_peer_is_recorded_and_not_timed_again(monkeypatch):
    calls = []

    def timer(op, args):
        calls.append(op)
        if op == "bad":
            raise ValueError("refused")
        return 1.0, False

    bench = bench_with(timer, 2, monkeypatch)
    got = bench._timed_rounds({"torch": "t", "gems": "g", "p": "bad"}, None)
    assert isinstance(got["p"], ValueError)
    assert calls.count("bad") == 1
    assert got["torch"] == (1.0, False) and got["gems"] == (1.0, False)


@pytest.mark.parametrize("who", ["torch", "gems"])
def test_torch_or_gemsops_failing_raises(who, monkeypatch):
    def timer(op, args):
        if op == who:
            raise RuntimeError(who)
        return 1.0, True

    bench = bench_with(timer, 2, monkeypatch)
    with pytest.raises(RuntimeError, match=who):
        bench._timed_rounds({"torch": "torch", "gems": "gems"}, None)
