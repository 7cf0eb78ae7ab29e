"""bench/RESULTS.md (the current status page) and bench/history/ (every run) from a bench run.

A run goes to bench/history/<date>_<commit>[_<title>].md whole (heading with date, device, commit and
torch version, the limits measured, every row, geometric means), and each tier it ran replaces that
tier's section of RESULTS.md (between `<!-- tier T1 begin -->` and `<!-- tier T1 end -->`; a tier
without a section is added before the multi-GPU note at the end). The hand-written parts of
RESULTS.md (targets and gaps) are left as they are: update them when a run changes a status. A run
of part of a tier (run.py's named sub-tiers such as T1nn) replaces that tier's whole table: for the
status page run whole tiers, or record part-runs with --history-only.

run.py calls append() after each run. A run whose JSON came back from another machine (run with
--no-results-md) is recorded the same way:
    python3 bench/results_md.py OUT/bench.json [--commit HASH] [--title "T1 only"] [--history-only]
"""
import argparse
import json
import math
import re
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


HEADER = ("| tier | op | shape | dtype | FLAME ms | PyTorch ms | ratio | FLAME rate | FLAME frac of limit | note |",
          "|---|---|---|---|---|---|---|---|---|---|")
TIER_TITLES = {"T0": "T0: host overhead per call",
               "T1": "T1: bandwidth (elementwise, reductions, nn rows, fused expressions, optimizer)",
               "T2": "T2: compute (GEMM, convolution, attention)", "T3": "T3: training steps (MLP, GPT-2 124M)",
               "T4": "T4: start-up (context to first finished step)", "T5": "T5: memory"}


def row_line(r):
    """One table row of a bench row (info rows carry their own unit and no rate)."""
    if r.get("info"):
        other = f"{r['torch']:.4f} {r['unit']}" if r["torch"] is not None else "-"
        ratio = f"{r['ratio']:.3f}" if math.isfinite(r["ratio"]) else "-"
        return (f"| {r['tier']} | {r['op']} | {r['shape']} | {r['dtype']} | {r['flame']:.4f} {r['unit']} | {other} | "
                f"{ratio} |  |  | {r['note'].replace('|', '/')} |")
    rate = (f"{r['flame_GBps']:.0f} GB/s" if "flame_GBps" in r else
            f"{r['flame_TFLOPs']:.1f} TFLOP/s" if "flame_TFLOPs" in r else "")
    frac = f"{r['flame_frac']:.2f}" if "flame_frac" in r else ""
    return (f"| {r['tier']} | {r['op']} | {r['shape']} | {r['dtype']} | {r['flame_ms']:.4f} | {r['torch_ms']:.4f} | "
            f"{r['ratio']:.3f} | {rate} | {frac} | {r['note']} |")


def run_heading(meta, quick=False, title=""):
    return (f"{meta['date']} · {meta['device']} · commit {meta['commit']} · torch {meta['torch']}"
            f"{' · quick' if quick else ''}{' · ' + title if title else ''}")


def limits_line(meta):
    return (f"Limits measured in this run: copy {meta['copy_TBps']:.3f} TB/s; bf16 GEMM (PyTorch, 8192^3) "
            f"{meta['bf16_gemm_TFLOPs']:.1f} TFLOP/s. Ratio = FLAME time / PyTorch time (< 1: FLAME faster).")


def history_path(meta, title="", hist_dir=os.path.join(HERE, "history")):
    slug = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-")[:40]
    name = f"{meta['date']}_{meta['commit']}" + (f"_{slug}" if slug else "")
    path = os.path.join(hist_dir, name + ".md")
    n = 2
    while os.path.exists(path):  # several runs of one commit on one day
        path = os.path.join(hist_dir, f"{name}_{n}.md")
        n += 1
    return path


def write_history(meta, rows, geo, quick=False, title="", hist_dir=os.path.join(HERE, "history")):
    """The whole run as one file in bench/history/; returns its path."""
    os.makedirs(hist_dir, exist_ok=True)
    lines = [f"# {run_heading(meta, quick, title)}", "", limits_line(meta), "", *HEADER]
    lines += [row_line(r) for r in rows]
    if geo:
        lines += ["", "Geometric-mean ratio per tier: " + ", ".join(f"{t} {g:.3f}" for t, g in sorted(geo.items()))]
    path = history_path(meta, title, hist_dir)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def tier_section(tier, meta, rows, quick=False, title=""):
    lines = [f"<!-- tier {tier} begin -->", f"## {TIER_TITLES.get(tier, tier)}", "",
             run_heading(meta, quick, title), "", limits_line(meta), "", *HEADER]
    lines += [row_line(r) for r in rows if r["tier"] == tier]
    lines.append(f"<!-- tier {tier} end -->")
    return "\n".join(lines)


def replace_tiers(text, meta, rows, quick=False, title=""):
    """RESULTS.md's text with the sections of the tiers in rows replaced (or added)."""
    for tier in dict.fromkeys(r["tier"] for r in rows):
        section = tier_section(tier, meta, rows, quick, title)
        pattern = re.compile(rf"<!-- tier {re.escape(tier)} begin -->.*?<!-- tier {re.escape(tier)} end -->", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _: section, text, count=1)
        else:
            ends = [m.end() for m in re.finditer(r"<!-- tier \S+ end -->", text)]
            at = ends[-1] if ends else len(text)
            text = text[:at] + "\n\n" + section + text[at:]
    return text


def append(meta, rows, geo, quick=False, title="", path=os.path.join(HERE, "RESULTS.md"),
           hist_dir=os.path.join(HERE, "history"), history_only=False):
    """Records a run: the whole of it in bench/history/, its tiers in RESULTS.md (unless history_only,
    or a quick run: quick runs only go to the history)."""
    hist = write_history(meta, rows, geo, quick, title, hist_dir)
    if not (history_only or quick):
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(replace_tiers(text, meta, rows, quick, title))
    return hist


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="bench.json written by run.py")
    ap.add_argument("--commit", default=None, help="the commit measured (when the JSON's is wrong or unknown)")
    ap.add_argument("--title", default="", help="a note for the heading (e.g. which tiers ran)")
    ap.add_argument("--history-only", action="store_true", help="write bench/history/ only, leave RESULTS.md")
    args = ap.parse_args(argv)
    with open(args.json) as f:
        d = json.load(f)
    meta = dict(d["meta"])
    if args.commit:
        meta["commit"] = args.commit
    hist = append(meta, d["rows"], geomeans(d["rows"]), title=args.title, history_only=args.history_only)
    tiers = ", ".join(dict.fromkeys(r["tier"] for r in d["rows"]))
    print(f"{len(d['rows'])} rows written to {hist}" +
          ("" if args.history_only else f"; tiers {tiers} replaced in {os.path.join(HERE, 'RESULTS.md')}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
