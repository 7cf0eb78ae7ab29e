"""Sums hostprof.c's samples per function: python3 report.py SAMPLES [top]. Self = the sample's
innermost frame in that function; inclusive = the function anywhere on the stack (counted once)."""
import collections, subprocess, sys

def strip(fr):  # the profiler's signal handler and the kernel's signal trampoline below it
    while fr and "hostprof" in fr[0]:
        fr = fr[1:]
    return fr[1:]


lines = [strip(l.split()) for l in open(sys.argv[1]) if l.strip()]
lines = [l for l in lines if l]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
addrs = collections.defaultdict(set)
for fr in lines:
    for f in fr:
        obj, off = f.rsplit("+", 1)
        addrs[obj].add(off)
name = {}
for obj, offs in addrs.items():
    offs = sorted(offs)
    if obj == "?":
        for o in offs:
            name[(obj, o)] = "?"
        continue
    try:
        out = subprocess.run(["addr2line", "-f", "-C", "-e", obj] + offs, capture_output=True, text=True).stdout.split("\n")
    except OSError:
        out = []
    short = obj.rsplit("/", 1)[-1]
    for i, o in enumerate(offs):
        fn = out[2 * i] if 2 * i < len(out) else "??"
        if fn == "??":
            fn = f"{short}+{o}"
        name[(obj, o)] = fn[:150] + f"  [{short}]"
self_c, incl = collections.Counter(), collections.Counter()
for fr in lines:
    names = [name[tuple(f.rsplit("+", 1))] for f in fr]
    self_c[names[0]] += 1
    for n in set(names):
        incl[n] += 1
n = len(lines)
print(f"{n} samples")
print("---- self")
for k, v in self_c.most_common(top):
    print(f"{100 * v / n:6.1f}%  {k}")
print("---- inclusive")
for k, v in incl.most_common(top):
    print(f"{100 * v / n:6.1f}%  {k}")
