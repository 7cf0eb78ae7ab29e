#!/usr/bin/env bash
# The lead's one-call device run: configure + build (Release, all cores), then the GPU gtest suite,
# the PyTorch parity suite and the examples, with FLAME_REQUIRE_GPU=1; logs under $OUT. Optional
# args: extra steps ("bench" runs bench/run.py with $BENCH_TIERS).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export FLAME_REQUIRE_GPU=1
(cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLAME_BUILD_TESTS=ON -DFLAME_TESTS_IN_ALL=ON > "$OUT/configure.log" 2>&1 &&
  cmake --build build -j16 > "$OUT/build.log" 2>&1) || { tail -30 "$OUT/build.log"; exit 1; }
export FLAME_LIBRARY=$PWD/build/libflame.so.1
timeout 420 ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} > "$OUT/gtest.log" 2>&1
echo "gtest rc=$?"; grep -E "^\[  (PASSED|FAILED)  \]|tests from .* ran" "$OUT/gtest.log" | head -40
grep -B2 -A12 "Failure$" "$OUT/gtest.log" | head -150 > "$OUT/gtest_failures.txt"
timeout 300 python3 tests/parity/run_parity.py ${PARITY_FILTER:+-k $PARITY_FILTER} > "$OUT/parity.log" 2>&1
echo "parity rc=$?"; grep -E "FAIL|passed" "$OUT/parity.log" | head -30
for ex in ${EXAMPLES:-}; do
  (cd build/examples && timeout 120 ./$ex > "$OUT/example_$ex.log" 2>&1); echo "example $ex rc=$?"; tail -4 "$OUT/example_$ex.log"
done
if [[ " $* " == *" bench "* ]]; then
  timeout 400 python3 bench/run.py --tiers "${BENCH_TIERS:-T0,T1,T2,T3}" --no-results-md --out "$OUT/bench" > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; grep "^T\|geometric" "$OUT/bench.log"
fi
