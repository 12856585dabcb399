"""Markdown tables from benchmark/results/*.json (the Benchmark class's
output).

usage:
  python -m tools.results_table FILE.json ...
      one table per file: a row per case, torch, gemsops and peers as GB/s
      and gemsops as a fraction of the copy bandwidth of the same run
  python -m tools.results_table --summary
      the README's summary tables (one per op) on stdout
  python -m tools.results_table --write-readme [--check]
      rewrites the summary between <!-- results:begin --> and
      <!-- results:end --> in README.md
  python -m tools.results_table --write-docs [--check]
      rewrites the per-case tables between <!-- cases:begin --> and
      <!-- cases:end --> in docs/performance.md
  --check writes nothing and exits 1 when the file differs from what it
  would write.

Which runs a table shows: for each op and pass, the newest JSON (by its
`date`) measured with the default L2 flush (`flush` absent or "zero"),
and the newest measured under the read-only flush where that one is newer
(the bandwidth bars are read under it: docs/performance.md, Method);
older runs stay in benchmark/results/ as data."""

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmark" / "results"
README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "performance.md"

# (op as the JSON names it, pass) in table order
BANDWIDTH_OPS = {
    "LayerNorm": [("layer_norm", "fwd"), ("layer_norm_backward", "bwd")],
    "RMSNorm": [("rms_norm", "fwd"), ("rms_norm_backward", "bwd")],
    "fused add + LayerNorm": [
        ("fused_add_layer_norm", "fwd"),
        ("fused_add_layer_norm_backward", "bwd"),
        ("fused_add_layer_norm_backward_dh", "bwd"),
    ],
    "fused add + RMSNorm": [
        ("fused_add_rms_norm", "fwd"),
        ("fused_add_rms_norm_backward", "bwd"),
        ("fused_add_rms_norm_backward_dh", "bwd"),
    ],
    "prod": [("prod", "fwd"), ("prod_backward", "bwd")],
}
SCHEDULES = ["data-parallel", "auto", "hybrid"]
# matmul shapes (batch, M, N, K) shown one by one: FlagGems' core shapes
# and the shapes tests/test_matmul.py runs on CUDA; the rest of the 211
# only count in the geomeans
NAMED_MM = [
    (1, 384, 384, 384),
    (1, 1024, 1024, 1024),
    (1, 2048, 2048, 2048),
    (1, 4096, 4096, 4096),
    (8, 1024, 1024, 1024),
    (1, 1536, 1792, 6016),
    (1, 512, 1024, 4096),
    (1, 16, 2560, 8192),
    (1, 8, 8192, 8192),
    (1, 2304, 5632, 3328),
    (1, 495, 5333, 71),
]


def load(path):
    with open(path) as f:
        doc = json.load(f)
    doc["path"] = Path(path)
    return doc


def flush_of(doc):
    return doc.get("flush") or "zero"


def newest(op, pass_, docs, flush="zero"):
    """The newest run under `flush` that holds rows of op/pass_ (over the
    benchmark's cases: sweeps, in their own files, are not summarised;
    runs that did not finish, written as far as they got, neither)."""
    found = [
        d
        for d in docs
        if flush_of(d) == flush
        and d.get("complete", True)  # a run cut short: not the table
        and "_sweep" not in d["path"].name
        and d["rows"]
        and d["rows"][0]["op"] == op
        and d["rows"][0]["pass_"] == pass_
    ]
    return max(found, key=lambda d: d["date"]) if found else None


def shown(op, pass_, docs):
    """The runs a table shows for op/pass_: the newest default-flush run,
    and the newest read-flush run where it is newer."""
    zero = newest(op, pass_, docs)
    read = newest(op, pass_, docs, "read")
    runs = [zero] if zero else []
    if read and (zero is None or read["date"] > zero["date"]):
        runs.append(read)
    return runs


def all_docs():
    """The kernel-time runs (host-cost runs are read by host_docs)."""
    docs = [load(p) for p in sorted(RESULTS.glob("*.json"))]
    return [d for d in docs if d.get("kind") != "host_cost"]


def host_docs():
    docs = [load(p) for p in sorted(RESULTS.glob("host_cost_*.json"))]
    return [d for d in docs if d.get("kind") == "host_cost"]


def host_summary(docs):
    """Per op: µs a call for torch, gemsops' eager path and its dispatcher
    op (torch.ops.gemsops; '-' where the call has none), from the newest
    host-cost run."""
    if not docs:
        return []
    doc = max(docs, key=lambda d: d["date"])
    by = {(r["call"], r["provider"]): r for r in doc["rows"]}
    calls = list(dict.fromkeys(r["call"] for r in doc["rows"]))
    out = [
        f"**Host cost** (µs a call, {doc['dtype']}; torch / gemsops / "
        f"gemsops through the dispatcher; {gpu_name(doc)} host, "
        f"{doc['commit']})",
        "",
        "| call | forward | forward, input requires grad | backward |",
        "|---|---|---|---|",
    ]
    for call in calls:
        cells = [
            " / ".join(
                f"{by[(call, p)][key]:.0f}" if (call, p) in by else "-"
                for p in ("torch", "gemsops", "gemsops op")
            )
            for key in ("forward_us", "forward_grad_us", "backward_us")
        ]
        out.append(f"| {call} | " + " | ".join(cells) + " |")
    return out


def gpu_name(doc):
    return doc.get("gpu", doc.get("device", "")).removeprefix("NVIDIA ")


def timing(doc):
    t = "graph replays" if doc.get("graph") else "eager"
    t += ", read flush" if flush_of(doc) == "read" else ""
    # files without "rounds" were timed once, in the order torch, gemsops,
    # the peers (docs/performance.md, Method)
    rounds = doc.get("rounds", 1)
    return t + (f", best of {rounds} rounds" if rounds > 1 else "")


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def peers_of(rows):
    return sorted(
        {
            k[:-3]
            for r in rows
            for k in r
            if k.endswith("_ms") and k[:-3] not in ("torch", "gems")
        }
    )


def case_name(shape):
    return "×".join(map(str, shape))


def case_table(doc):
    """A row per case (the benchmark's own columns)."""
    rows = doc["rows"]
    peers = peers_of(rows)
    out = [
        f"{rows[0]['op']} ({rows[0]['pass_']}) on {doc['gpu']}, commit "
        f"{doc['commit']}, {doc['date'][:10]}, {timing(doc)}, copy "
        f"{doc['copy_gbps']:.0f} GB/s, torch {doc['torch']}",
        "",
    ]
    head = (
        "| dtype | case | torch GB/s | gemsops GB/s | speedup | gemsops/copy |"
    )
    sep = "|---|---|---|---|---|---|"
    for p in peers:
        head += f" {p} GB/s |"
        sep += "---|"
    out += [head, sep]
    for r in rows:
        line = (
            f"| {r['dtype']} | {case_name(r['shape'])} | "
            f"{r['torch_gbps']:.0f} | {r['gems_gbps']:.0f} | "
            f"{r['speedup']:.2f} | {r['gems_copy_fraction']:.0%} |"
        )
        for p in peers:
            v = r.get(f"{p}_gbps")
            line += f" {v:.0f} |" if v is not None else " – |"
        out.append(line)
    return out


def bandwidth_summary(title, docs):
    """One row per pass, run shown and dtype: speedup over torch (geomean
    and range), gemsops' fraction of the copy bandwidth (median and best)
    and the speedup over the fastest peer measured on each case."""
    out = [
        f"**{title}**",
        "",
        "| pass | dtype | cases | × torch, geomean (range) "
        "| of copy, median (best) | × best peer, geomean (ahead) "
        "| GPU, commit, timing |",
        "|---|---|---|---|---|---|---|",
    ]
    for op, pass_ in BANDWIDTH_OPS[title]:
        for doc in shown(op, pass_, docs):
            out += bandwidth_rows(pass_, doc)
    return out


def bandwidth_rows(pass_, doc):
    """bandwidth_summary's rows of one run, a row per dtype."""
    out = []
    peers = peers_of(doc["rows"])
    for dtype in dict.fromkeys(r["dtype"] for r in doc["rows"]):
        rows = [r for r in doc["rows"] if r["dtype"] == dtype]
        sp = [r["speedup"] for r in rows]
        frac = [r["gems_copy_fraction"] for r in rows]
        vs_peer = []
        for r in rows:
            times = [r[f"{p}_ms"] for p in peers if r.get(f"{p}_ms")]
            if times:
                vs_peer.append(min(times) / r["gems_ms"])
        peer = (
            f"{geomean(vs_peer):.2f} "
            f"({sum(v > 1 for v in vs_peer)}/{len(vs_peer)})"
            if vs_peer
            else "–"
        )
        out.append(
            f"| {pass_} | {dtype} | {len(rows)} | {geomean(sp):.2f} "
            f"({min(sp):.2f}–{max(sp):.2f}) | "
            f"{statistics.median(frac):.0%} ({max(frac):.0%}) | {peer} | "
            f"{gpu_name(doc)}, {doc['commit']}, {timing(doc)} |"
        )
    return out


def mm_docs(docs):
    """The newest run of each schedule on the GPU and at the commit of the
    newest auto run (a ratio between schedules means one GPU and one
    build's kernels)."""
    auto = newest("mm_auto", "fwd", docs)
    if auto is None:
        return {s: None for s in SCHEDULES}
    same = [
        d
        for d in docs
        if (d["gpu"], d.get("commit")) == (auto["gpu"], auto.get("commit"))
    ]
    return {s: newest(f"mm_{s}", "fwd", same) for s in SCHEDULES}


def gflop(shape):
    b, m, n, k = shape
    return 2 * b * m * n * k / 1e9


def ratio(v, digits=3):
    """A ratio for a table cell, "–" where the run is missing."""
    return "–" if v is None else f"{v:.{digits}f}"


def speedup(rows, shape):
    row = rows.get(shape)
    return ratio(row["speedup"] if row else None, 2)


def matmul_summary(docs):
    """Geomean speedup over torch.matmul (cuBLAS) per dtype and schedule,
    over all shapes and over the large and the small ones."""
    runs = mm_docs(docs)
    if runs["auto"] is None:
        return []
    ref = runs["auto"]
    out = [
        "**matmul** (each schedule forced for the whole run, the "
        "mainloop chosen per shape)",
        "",
        "| dtype | shapes | × cuBLAS, data-parallel | auto | hybrid "
        "Stream-K | hybrid / data-parallel | GPU, commit, timing |",
        "|---|---|---|---|---|---|---|",
    ]
    subsets = [
        ("all", lambda s: True),
        ("≥ 20 GFLOP", lambda s: gflop(s) >= 20),
        ("< 2 GFLOP", lambda s: gflop(s) < 2),
    ]
    # the runs' commits, each once (a schedule's run may predate another's)
    commits = " / ".join(
        dict.fromkeys(d["commit"] for d in runs.values() if d)
    )
    for dtype in dict.fromkeys(r["dtype"] for r in ref["rows"]):
        for label, keep in subsets:
            g = {}
            for s, doc in runs.items():
                sp = [
                    r["speedup"]
                    for r in (doc["rows"] if doc else [])
                    if r["dtype"] == dtype and keep(r["shape"])
                ]
                g[s] = geomean(sp) if sp else None
            n = sum(
                1
                for r in ref["rows"]
                if r["dtype"] == dtype and keep(r["shape"])
            )
            dp, hy = g["data-parallel"], g["hybrid"]
            out.append(
                f"| {dtype} | {label} ({n}) | {ratio(dp)} | "
                f"{g['auto']:.3f} | {ratio(hy)} | "
                f"{ratio(hy / dp if dp and hy else None)} | "
                f"{gpu_name(ref)}, {commits}, {timing(ref)} |"
            )
    return out


def matmul_named(docs):
    """The named shapes one by one, fp16 (bf16 is within a few percent)."""
    runs = mm_docs(docs)
    if runs["auto"] is None:
        return []
    ref = runs["auto"]
    by = {
        s: {
            tuple(r["shape"]): r
            for r in (doc["rows"] if doc else [])
            if r["dtype"] == "float16"
        }
        for s, doc in runs.items()
    }
    out = [
        f"matmul, float16, on {ref['gpu']}, commit {ref['commit']}, "
        f"{ref['date'][:10]}, {timing(ref)}, torch {ref['torch']}",
        "",
        "| (batch ×) M × N × K | torch µs | gemsops µs (auto) | × torch "
        "| TFLOP/s | × torch, data-parallel | × torch, hybrid |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape in NAMED_MM:
        if shape not in by["auto"]:
            continue
        r = by["auto"][shape]
        name = case_name(shape[1:]) if shape[0] == 1 else case_name(shape)
        out.append(
            f"| {name} | {r['torch_ms'] * 1e3:.1f} | "
            f"{r['gems_ms'] * 1e3:.1f} | {r['speedup']:.2f} | "
            f"{r['gems_tflops']:.0f} | "
            f"{speedup(by['data-parallel'], shape)} | "
            f"{speedup(by['hybrid'], shape)} |"
        )
    return out


# the README's summary: the norms beyond LayerNorm have their tables in
# docs/performance.md alone, so that the README stays short
README_OPS = ["LayerNorm", "prod"]


def summary(docs):
    out = []
    for title in README_OPS:
        out += bandwidth_summary(title, docs) + [""]
    out += matmul_summary(docs)
    host = host_summary(host_docs())
    return out + ([""] + host if host else [])


def cases(docs):
    out = []
    for passes in BANDWIDTH_OPS.values():
        for op, pass_ in passes:
            for doc in shown(op, pass_, docs):
                out += case_table(doc) + [""]
    out += matmul_named(docs)
    return out


def replace_block(text, name, lines, tool_flag):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"results_table: expected one {begin} and one {end}")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    note = (
        f"<!-- generated by `python -m tools.results_table {tool_flag}` "
        "from benchmark/results/; edit the tool, not this block -->"
    )
    body = "\n".join([note] + lines).rstrip("\n")
    return f"{head}{begin}\n{body}\n{end}{tail}"


def write(path, name, lines, flag, check):
    old = path.read_text()
    new = replace_block(old, name, lines, flag)
    if check:
        if new != old:
            print(
                f"{path.relative_to(ROOT)}: the {name} block is stale; "
                f"run python -m tools.results_table {flag}"
            )
            return 1
        return 0
    if new != old:
        path.write_text(new)
    return 0


def main(argv):
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if args == ["--summary"]:
        print("\n".join(summary(all_docs())))
        return 0
    if args == ["--write-readme"]:
        return write(
            README, "results", summary(all_docs()), "--write-readme", check
        )
    if args == ["--write-docs"]:
        return write(
            PERFORMANCE, "cases", cases(all_docs()), "--write-docs", check
        )
    if not args or any(a.startswith("--") for a in args):
        print(__doc__)
        return 2
    for path in args:
        print("\n" + "\n".join(case_table(load(path))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
