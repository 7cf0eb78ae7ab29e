"""bench/RESULTS.md: the dated, device- and commit-stamped table of a bench run.

run.py appends each run it makes. A run whose JSON came back from another machine (run with
--no-results-md) is appended here, without PyTorch:
    python3 bench/results_md.py OUT/bench.json [--commit HASH] [--title "T1 only"]
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def geomeans(rows):
    """Geometric-mean ratio per tier over the timed rows (info rows: parity, start times, memory, left out)."""
    tiers = {}
    for r in rows:
        if not r.get("info") and r["ratio"] > 0 and math.isfinite(r["ratio"]):
            tiers.setdefault(r["tier"], []).append(r["ratio"])
    return {t: math.exp(sum(math.log(x) for x in v) / len(v)) for t, v in tiers.items()}


def append(meta, rows, geo, quick=False, title="", path=os.path.join(HERE, "RESULTS.md")):
    lines = [f"\n## {meta['date']} · {meta['device']} · commit {meta['commit']} · torch {meta['torch']}"
             f"{' · quick' if quick else ''}{' · ' + title if title else ''}\n",
             f"Limits measured in this run: copy {meta['copy_TBps']:.3f} TB/s; bf16 GEMM (PyTorch, 8192^3) "
             f"{meta['bf16_gemm_TFLOPs']:.1f} TFLOP/s. Ratio = FLAME time / PyTorch time (< 1: FLAME faster).\n",
             "| tier | op | shape | dtype | FLAME ms | PyTorch ms | ratio | FLAME rate | FLAME frac of limit | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("info"):
            other = f"{r['torch']:.4f} {r['unit']}" if r["torch"] is not None else "-"
            ratio = f"{r['ratio']:.3f}" if math.isfinite(r["ratio"]) else "-"
            lines.append(f"| {r['tier']} | {r['op']} | {r['shape']} | {r['dtype']} | {r['flame']:.4f} {r['unit']} | {other} | "
                         f"{ratio} |  |  | {r['note'].replace('|', '/')} |")
            continue
        rate = (f"{r['flame_GBps']:.0f} GB/s" if "flame_GBps" in r else
                f"{r['flame_TFLOPs']:.1f} TFLOP/s" if "flame_TFLOPs" in r else "")
        frac = f"{r['flame_frac']:.2f}" if "flame_frac" in r else ""
        lines.append(f"| {r['tier']} | {r['op']} | {r['shape']} | {r['dtype']} | {r['flame_ms']:.4f} | {r['torch_ms']:.4f} | "
                     f"{r['ratio']:.3f} | {rate} | {frac} | {r['note']} |")
    lines.append("")
    if geo:
        lines.append("Geometric-mean ratio per tier: " + ", ".join(f"{t} {g:.3f}" for t, g in sorted(geo.items())) + "\n")
    with open(path, "a") as f:
        f.write("\n".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="bench.json written by run.py")
    ap.add_argument("--commit", default=None, help="the commit measured (when the JSON's is wrong or unknown)")
    ap.add_argument("--title", default="", help="a note for the heading (e.g. which tiers ran)")
    args = ap.parse_args(argv)
    with open(args.json) as f:
        d = json.load(f)
    meta = dict(d["meta"])
    if args.commit:
        meta["commit"] = args.commit
    append(meta, d["rows"], geomeans(d["rows"]), title=args.title)
    print(f"appended {len(d['rows'])} rows to {os.path.join(HERE, 'RESULTS.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
