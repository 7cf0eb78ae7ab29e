#!/usr/bin/env bash
# One development round on a single GPU: optional patch applied for a first check ($PRE_PATCH with
# $PRE_FILTER), then the working tree's build, a gtest filter ($FILTER), parity rows ($PARITY, a
# list of -k substrings), and bench parts ($BENCH: run.py tiers, $PROFILE: profile_ops.py methods).
# Logs under $OUT, folded into all_logs.txt.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export FLAME_REQUIRE_GPU=1
T0=$SECONDS
build() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLAME_BUILD_TESTS=ON -DFLAME_TESTS_IN_ALL=ON > "$OUT/configure.log" 2>&1
  cmake --build build -j16 > "$OUT/build.log" 2>&1 || { grep -B5 -A20 "FAILED\|error:" "$OUT/build.log" | head -60; exit 1; }
  echo "built at $((SECONDS - T0)) s"
}
export FLAME_LIBRARY=$PWD/build/libflame.so.1 FLAME_KERNEL_CACHE_DIR=$PWD/build/kernel-cache
if [[ -n ${PRE_PATCH:-} ]]; then
  git apply "$PRE_PATCH" && build
  timeout 200 ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 --gtest_filter="$PRE_FILTER" > "$OUT/pre.log" 2>&1
  echo "pre ($PRE_PATCH): $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/pre.log" | tr '\n' ' ')"
  git apply -R "$PRE_PATCH"
fi
build
if [[ -n ${FILTER:-} ]]; then
  timeout ${GTEST_TIMEOUT:-300} ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 --gtest_filter="$FILTER" > "$OUT/gtest.log" 2>&1
  echo "gtest: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gtest.log" | tr '\n' ' ')"; grep "^\[  FAILED  \]" "$OUT/gtest.log" | head -20
fi
for k in ${PARITY:-}; do
  timeout 200 python3 tests/parity/run_parity.py -k "$k" > "$OUT/parity_$k.log" 2>&1; echo "parity $k: $(grep -E 'passed|FAIL' "$OUT/parity_$k.log" | tail -3 | tr '\n' ' ')"
done
if [[ -n ${BENCH:-} ]]; then
  timeout ${BENCH_TIMEOUT:-300} python3 bench/run.py --tiers "$BENCH" --no-results-md --out "$OUT/bench" > "$OUT/bench.log" 2>&1
  grep -E "^T[0-5]|geometric|limits" "$OUT/bench.log" | cut -c1-200
fi
if [[ -n ${PROFILE:-} ]]; then
  timeout ${PROFILE_TIMEOUT:-200} python3 bench/profile_ops.py $PROFILE --top ${TOP:-8} > "$OUT/profile.txt" 2>&1
  echo "profile rc=$?"
fi
echo "total $((SECONDS - T0)) s"
for f in "$OUT"/*.log; do [[ -f $f ]] && { echo "=================== $f"; cat "$f"; }; done > "$OUT/all_logs.txt"
rm -f "$OUT"/*.log
