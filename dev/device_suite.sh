#!/usr/bin/env bash
# The lead's verification on one GPU in as few device calls as fit the 10-minute limit; logs under
# $OUT (each part writes <part>.log; summary lines on stdout). Run from the repository root:
#
#   PARTS="build gtest examples models" bash dev/device_suite.sh
#   PARTS="build parity bindings" bash dev/device_suite.sh
#
# Parts (in this order when named):
#   build     Release build of everything the parts need (library, examples, test programs, bench),
#             -j$(nproc); reused when build/ is already there (a warm machine keeps it)
#   gtest     the single-GPU gtest suite in $SHARDS (4) parallel shards, FLAME_REQUIRE_GPU=1
#   examples  ctest -L examples (each example's claim), then every example with --help;
#             model_train_step in bf16 with checkpointing and --save
#   models    tests/models/check_model_keys.py against diffusers (needs .ref/diffusers, carried;
#             ../shared/reference/README.md); writes the reference lists to $OUT/models/
#   parity    tests/parity/run_parity.py, optimizer parity
#   bindings  the Rust crate's and the C# tests and examples against the build (cargo and Mono
#             must be on the machine: bindings/gpu_smoke.sh packs them where they are not)
# Environment: GTEST_FILTER (gtest part), SHARDS, PARITY_FILTER.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export FLAME_REQUIRE_GPU=1
export FLAME_LIBRARY=$PWD/build/libflame.so.1 FLAME_KERNEL_CACHE_DIR=$PWD/build/kernel-cache
PARTS=${PARTS:-build gtest}
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*"; }

has_part() { [[ " $PARTS " == *" $1 "* ]]; }

if has_part build; then
  (cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLAME_BUILD_TESTS=ON -DFLAME_TESTS_IN_ALL=ON \
     > "$OUT/configure.log" 2>&1 && cmake --build build -j"$(nproc)" > "$OUT/build.log" 2>&1)
  rc=$?
  say "build rc=$rc"
  if (( rc != 0 )); then grep -B3 -A12 "error\|FAILED" "$OUT/build.log" | head -60; exit 1; fi
fi

if has_part gtest; then
  SHARDS=${SHARDS:-4}
  for ((i = 0; i < SHARDS; ++i)); do
    GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i timeout 500 ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 \
      ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} > "$OUT/gtest_$i.log" 2>&1 &
  done
  wait
  for ((i = 0; i < SHARDS; ++i)); do
    say "gtest shard $i: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|tests? from .* ran' "$OUT/gtest_$i.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \]" "$OUT/gtest_$i.log" | head -20
  done
  cat "$OUT"/gtest_*.log | grep -B2 -A14 "Failure$" | head -150 > "$OUT/gtest_failures.txt"
fi

if has_part examples; then
  timeout 400 ctest --test-dir build -L examples -j4 --output-on-failure > "$OUT/examples.log" 2>&1
  say "ctest -L examples rc=$? $(grep -E 'tests passed|tests failed' "$OUT/examples.log")"
  grep -E "Failed|\*\*\*" "$OUT/examples.log" | head -20
  # model_train_step's claim in its other configuration (ctest runs the f32 default): the tiny
  # models in bf16 with checkpointing of every block and --save; every loss finite, trained
  # parameters moved, frozen ones not (exit 0)
  timeout 120 build/examples/model_train_step --steps 3 --dtype bf16 --checkpoint 1 \
    --save build/model_train_step_unet.safetensors > "$OUT/model_train_step.log" 2>&1
  say "model_train_step bf16 checkpointed rc=$? ($(grep -c ' step [0-9]*/3: loss' "$OUT/model_train_step.log") of 6 steps logged)"
  grep -E " step |CLAIM|failed|changed" "$OUT/model_train_step.log" | head -12
fi

if has_part models; then
  export PYTHONPATH=$PWD/.ref${PYTHONPATH:+:$PYTHONPATH}
  timeout 300 python3 tests/models/check_model_keys.py --tool build/tests/models/flame_model_keys \
    --write "$OUT/models" > "$OUT/models.log" 2>&1
  say "check_model_keys rc=$?"
  cat "$OUT/models.log" | head -40
fi

if has_part parity; then
  timeout 400 python3 tests/parity/run_parity.py ${PARITY_FILTER:+-k $PARITY_FILTER} > "$OUT/parity.log" 2>&1
  say "parity rc=$? $(grep -E 'passed|FAIL' "$OUT/parity.log" | tail -3 | tr '\n' ' ')"
  [[ -f tests/parity/test_optim_torch.py ]] && {
    timeout 200 python3 tests/parity/test_optim_torch.py > "$OUT/parity_optim.log" 2>&1
    say "optimizer parity rc=$? $(tail -2 "$OUT/parity_optim.log" | tr '\n' ' ')"
  }
fi

if has_part bindings; then
  # the packed folder (bindings/gpu_smoke.sh pack, carried) runs against this build's library
  mkdir -p bindings/rust/target/gpu/lib && cp -L build/libflame.so.1 bindings/rust/target/gpu/lib/libflame.so.1
  (timeout 300 bash bindings/gpu_smoke.sh run > "$OUT/bindings.log" 2>&1)
  say "bindings gpu_smoke rc=$?"
  tail -30 "$OUT/bindings.log"
fi
say "done"
