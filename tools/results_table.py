"""Markdown table from benchmark/results/*.json (the Benchmark class's
output): one row per case with torch, gemsops and peers as GB/s and as a
fraction of the copy bandwidth measured in the same run.
usage: python tools/results_table.py benchmark/results/layer_norm_fwd_*.json ..."""
import json
import sys


def main(paths):
    for path in paths:
        doc = json.load(open(path))
        peers = sorted({k[:-5] for r in doc["rows"] for k in r
                        if k.endswith("_gbps") and k[:-5] not in ("torch", "gems")})
        print(f"\n{doc['rows'][0]['op']} ({doc['rows'][0]['pass_']}) on "
              f"{doc['gpu']}, commit {doc['commit']}, {doc['date'][:10]}, "
              f"copy {doc['copy_gbps']:.0f} GB/s, torch {doc['torch']}\n")
        head = "| dtype | M×N | torch GB/s | gemsops GB/s | speedup | gemsops/copy |"
        sep = "|---|---|---|---|---|---|"
        for p in peers:
            head += f" {p} GB/s |"
            sep += "---|"
        print(head)
        print(sep)
        for r in doc["rows"]:
            line = (f"| {r['dtype']} | {'×'.join(map(str, r['shape']))} | "
                    f"{r['torch_gbps']:.0f} | {r['gems_gbps']:.0f} | "
                    f"{r['speedup']:.2f} | {r['gems_copy_fraction']:.0%} |")
            for p in peers:
                v = r.get(f"{p}_gbps")
                line += f" {v:.0f} |" if v is not None else " – |"
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
