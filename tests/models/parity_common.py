"""Pieces shared by the adapter parity scripts (check_dora_parity.py, check_lokr_parity.py).

compare_tensors checks FLAME's results against the reference's, tensor by tensor, with
max|flame - ref| / max|ref| (rel_err of check_model_parity.py) within a tolerance; main is the
scripts' command line (--tool, --tol, --keep) around their run(tool, directory, tol).
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_model_parity import rel_err  # noqa: E402


def compare_tensors(got, ref, tol, floor_of, report_above=None):
    """Every tensor of ref must be in got with its shape and rel_err(got, ref, floor_of(name)) <= tol.

    Prints a FAIL line for each one that is not; with report_above, also the error of each passing
    tensor above it. Returns (ok, (worst error, its name))."""
    ok, worst = True, (0.0, "")
    for k, v in ref.items():
        if k not in got:
            print(f"FAIL: {k} missing from FLAME's results")
            ok = False
            continue
        if tuple(got[k].shape) != tuple(v.shape):
            print(f"FAIL: {k}: shape {tuple(got[k].shape)} vs peft's {tuple(v.shape)}")
            ok = False
            continue
        e = rel_err(got[k], v, floor_of(k))
        worst = max(worst, (e, k))
        if e > tol:
            print(f"FAIL: {k}: rel err {e:.3e} > {tol:.0e}")
            ok = False
        elif report_above is not None and e > report_above:
            print(f"      {k}: rel err {e:.3e}")
    return ok, worst


def main(doc, run):
    """Parses --tool, --tol (1e-4), --keep DIR, calls run(tool, directory, tol) and exits 0 when it
    returns True, else 1."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="path of flame_model_run")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--keep", help="directory to keep the files in (default: a temporary one)")
    a = ap.parse_args()
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
        ok = run(a.tool, a.keep, a.tol)
    else:
        with tempfile.TemporaryDirectory() as d:
            ok = run(a.tool, d, a.tol)
    sys.exit(0 if ok else 1)
