#!/usr/bin/env bash
# GPU smoke test of both bindings on a machine without Rust or Mono toolchains.
#   bash bindings/gpu_smoke.sh pack LIB   (on the build machine) -> bindings/rust/target/gpu/
#   bash bindings/gpu_smoke.sh run        (on the GPU machine, same checkout + that folder)
# pack: release test binaries, the Rust examples, LIB, the C# build, and a tarball of the Mono runtime
# files (mono-runtime and the few class libraries the tests use) to unpack on the GPU machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
G="$ROOT/bindings/rust/target/gpu"
case "${1:-}" in
pack)
  LIB="$(readlink -f "$2")"
  cd "$ROOT/bindings/rust"
  rm -rf "$G" && mkdir -p "$G"
  FLAME_LIBRARY="$LIB" cargo test --release --no-run --message-format=short 2>&1 | grep -o 'target/release/deps/[a-z_]*-[0-9a-f]*' | while read -r b; do
    n=$(basename "$b"); cp "$b" "$G/${n%-*}"; done
  cargo build --release --examples -q
  for ex in train_mlp train_cnn lora_finetune; do cp "target/release/examples/$ex" "$G/"; done
  # in lib/, not beside the C# programs: Mono would find it there and the load-failure probe needs it not to
  mkdir -p "$G/lib" && cp -L "$LIB" "$G/lib/libflame.so.1"
  bash "$ROOT/bindings/ci.sh" "$LIB" >/dev/null   # builds bindings/csharp/out
  cp "$ROOT"/bindings/csharp/out/{Flame.dll,Flame.dll.config,Tests.exe,TrainMlp.exe,TrainCnn.exe,LoraFinetune.exe} "$G/"
  for p in mono-runtime mono-runtime-sgen mono-runtime-common libmono-corlib4.5-dll libmono-corlib4.5-cil libmono-system4.0-cil libmono-system4.5-cil \
           libmono-system-core4.5-cil libmono-system-configuration4.5-cil libmono-system-xml4.5-cil libmono-security4.0-cil; do
    dpkg -L "$p" 2>/dev/null || true; done | while read -r f; do if [ -f "$f" ]; then echo "$f"; fi; done |
    grep -v '/usr/share/\(doc\|man\)' > "$G/mono.files"
  tar czhf "$G/mono.tgz" -T "$G/mono.files" 2>/dev/null
  du -sh "$G";;
run)
  cd "$G"
  export FLAME_LIBRARY="$G/lib/libflame.so.1" FLAME_REQUIRE_GPU=1
  export LD_LIBRARY_PATH="$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  ./cpu && ./gpu --test-threads=1 && ./gpu_toolkit --test-threads=1 && ./gpu_model --test-threads=1 && ./train_mlp && ./train_cnn && ./lora_finetune
  # unpack unless a complete Mono is there (System.dll included: the safetensors test needs it)
  { command -v mono >/dev/null && [ -f /usr/lib/mono/4.5/System.dll ]; } || tar xzf mono.tgz -C /
  mono Tests.exe && mono TrainMlp.exe && mono TrainCnn.exe && mono LoraFinetune.exe;;
*) echo "usage: $0 pack LIB | run" >&2; exit 2;;
esac
