#!/usr/bin/env bash
# CI for the language bindings. Usage: bash bindings/ci.sh [path/to/libflame.so.1]
#   1. regenerates the low-level layers from include/flame.h and fails if they differ from git;
#   2. checks that every exported flame_* symbol of the library is declared in both layers;
#   3. cargo test of the Rust crate (bindings/rust), examples compiled, docs without warnings;
#      installs Debian's rustc+cargo when cargo is missing; builds with /usr/bin/cargo (Rust 1.63)
#      too when another cargo comes first on PATH;
#   4. builds the C# library (XML docs complete), tests and examples with Mono's mcs, runs the
#      tests and the examples (examples exit 2 without a GPU: skipped unless FLAME_REQUIRE_GPU=1).
# Without a GPU the tests cover loading, version, status strings and error paths; GPU tests are
# skipped unless a context can be created. FLAME_REQUIRE_GPU=1 makes them mandatory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
T0=$SECONDS
step() { echo; echo "=== bindings/ci.sh: $* ($((SECONDS - T0))s)"; }
die() { echo "bindings/ci.sh: error: $*" >&2; exit 1; }

# ---- the library ----
LIB="${1:-}"
if [ -z "$LIB" ]; then
  for c in build/libflame.so.1 build/libflame.so build/libflame.so.*; do
    if [ -e "$c" ]; then LIB="$c"; break; fi
  done
fi
[ -n "$LIB" ] && [ -e "$LIB" ] || die "no library: pass its path or build it into build/ (cmake -S . -B build -G Ninja && cmake --build build)"
LIB="$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")"
echo "library: $LIB"

# ---- 1. generated layers are up to date ----
step "regenerating bindings from include/flame.h"
GENERATED=(bindings/rust/src/sys.rs bindings/rust/src/ops.rs bindings/csharp/Native.g.cs bindings/csharp/Ops.g.cs)
python3 scripts/gen_bindings.py
for f in "${GENERATED[@]}"; do
  git ls-files --error-unmatch "$f" >/dev/null 2>&1 || die "$f is not checked in"
done
if ! git diff --exit-code --stat -- "${GENERATED[@]}"; then
  git --no-pager diff -- "${GENERATED[@]}" | head -60
  die "generated bindings are stale: run python3 scripts/gen_bindings.py and commit the result"
fi

# ---- 2. every exported symbol is declared in both layers ----
step "checking exported symbols"
if command -v nm >/dev/null 2>&1; then
  SYMS=$(nm -D --defined-only "$LIB" | awk '$2 ~ /^[TtWiu]$/ {print $3}' | sed 's/@.*//' | grep '^flame_' | sort -u)
else
  SYMS=$(python3 - "$LIB" <<'EOF'
import struct, sys
d = open(sys.argv[1], 'rb').read()
assert d[:4] == b'\x7fELF' and d[4] == 2, 'need a 64-bit ELF'
shoff, = struct.unpack_from('<Q', d, 0x28); shentsize, shnum = struct.unpack_from('<HH', d, 0x3A)
secs = [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i * shentsize) for i in range(shnum)]
for s in secs:
    if s[1] == 11:  # SHT_DYNSYM
        strtab = secs[s[6]]
        for i in range(s[5] // 24):
            name, info, other, shndx, value, size = struct.unpack_from('<IBBHQQ', d, s[4] + 24 * i)
            if shndx == 0 or (info & 0xf) != 2: continue
            n = d[strtab[4] + name:d.index(b'\0', strtab[4] + name)].decode()
            if n.startswith('flame_'): print(n)
EOF
  )
  SYMS=$(echo "$SYMS" | sort -u)
fi
[ -n "$SYMS" ] || die "no flame_* symbols exported by $LIB"
missing=0
for s in $SYMS; do
  grep -q "^    \"$s\",\$" bindings/rust/src/sys.rs || { echo "not declared in bindings/rust/src/sys.rs: $s"; missing=1; }
  grep -q "EntryPoint = \"$s\"" bindings/csharp/Native.g.cs || { echo "not declared in bindings/csharp/Native.g.cs: $s"; missing=1; }
done
[ $missing = 0 ] || die "exported symbols missing from the bindings (is include/flame.h missing declarations?)"
echo "$(echo "$SYMS" | wc -l) exported symbols, all declared in both layers"

export FLAME_LIBRARY="$LIB"
export LD_LIBRARY_PATH="$(dirname "$LIB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- 3. Rust ----
step "cargo test (bindings/rust)"
# The crate is std only (no registry access) and declares rust-version 1.63, Debian 12's rustc.
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: installing Debian's rustc and cargo (apt-get install rustc cargo)"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq rustc cargo >/dev/null
fi
echo "cargo: $(command -v cargo) ($(cargo --version), $(rustc --version))"
CARGO_NET_OFFLINE=true cargo test --manifest-path bindings/rust/Cargo.toml --all-targets
CARGO_NET_OFFLINE=true cargo test --manifest-path bindings/rust/Cargo.toml --doc
RUSTDOCFLAGS=-Dwarnings CARGO_NET_OFFLINE=true cargo doc --manifest-path bindings/rust/Cargo.toml --no-deps
# The examples need a GPU: exit 2 without one (not a failure here), non-zero when their claim fails.
for ex in train_mlp train_cnn lora_finetune; do
  rc=0; CARGO_NET_OFFLINE=true cargo run -q --release --manifest-path bindings/rust/Cargo.toml --example "$ex" || rc=$?
  if [ $rc = 2 ] && [ "${FLAME_REQUIRE_GPU:-0}" != 1 ]; then echo "$ex: skipped (no GPU)"; continue; fi
  [ $rc = 0 ] || die "Rust example $ex failed (exit $rc)"
done
# A newer toolchain on PATH (rustup) shadows Debian's: prove rust-version 1.63 with Debian's too,
# in its own target directory (rustc versions do not share artifacts).
if [ -x /usr/bin/cargo ] && [ "$(command -v cargo)" != /usr/bin/cargo ]; then
  step "Debian toolchain: /usr/bin/cargo build --all-targets ($(/usr/bin/rustc --version))"
  RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc CARGO_TARGET_DIR=bindings/rust/target/debian CARGO_NET_OFFLINE=true \
    /usr/bin/cargo build --manifest-path bindings/rust/Cargo.toml --all-targets
fi

# ---- 4. C# ----
step "C# (Mono) build and tests"
# Debian 12: mono-mcs (mcs 6.8, C# 7.x: no nullable reference types), mono-runtime, and
# libmono-system-core4.0-cil (System.Core: LINQ in the tests; mono-mcs pulls it in already).
if ! command -v mcs >/dev/null 2>&1 || ! command -v mono >/dev/null 2>&1 || \
   ! ls /usr/lib/mono/4.5/System.Core.dll >/dev/null 2>&1; then
  echo "installing Mono (mono-mcs, mono-runtime, libmono-system-core4.0-cil)"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mono-mcs mono-runtime libmono-system-core4.0-cil >/dev/null
fi
CS=bindings/csharp
OUT="$CS/out"
mkdir -p "$OUT"
# -warn:4 with -doc reports CS1591 (a public member without an XML comment); -warnaserror+ makes
# it, and every other warning, an error.
mcs -nologo -unsafe -warn:4 -warnaserror+ -target:library -doc:"$OUT/Flame.xml" -out:"$OUT/Flame.dll" \
  "$CS/Native.g.cs" "$CS/Ops.g.cs" "$CS/Flame.cs" "$CS/Toolkit.cs"
cp "$CS/Flame.dll.config" "$OUT/"
mcs -nologo -unsafe -warnaserror+ -out:"$OUT/Tests.exe" -r:"$OUT/Flame.dll" "$CS/Tests.cs"
for ex in TrainMlp TrainCnn LoraFinetune; do
  mcs -nologo -unsafe -warnaserror+ -out:"$OUT/$ex.exe" -r:"$OUT/Flame.dll" "$CS/$ex.cs"
done
mono --debug "$OUT/Tests.exe"
# The examples need a GPU: exit 2 without one (not a failure here), non-zero when their claim fails.
for ex in TrainMlp TrainCnn LoraFinetune; do
  rc=0; mono --debug "$OUT/$ex.exe" || rc=$?
  if [ $rc = 2 ] && [ "${FLAME_REQUIRE_GPU:-0}" != 1 ]; then echo "$ex: skipped (no GPU)"; continue; fi
  [ $rc = 0 ] || die "C# example $ex failed (exit $rc)"
done

step "done"
