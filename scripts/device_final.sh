#!/usr/bin/env bash
# A time-boxed full verification on one GPU: build the library, GPU tests and examples, then run
# concurrently the GPU gtest suite (3 shards), the PyTorch parity suite, the optimizer parity and
# the examples (train_gpt with a save + resume); finally bench T2 if time is left. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export FLAME_REQUIRE_GPU=1
T0=$SECONDS
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLAME_BUILD_TESTS=ON > "$OUT/configure.log" 2>&1
cmake --build build -j16 --target flame flame_gpu_tests hello_autograd train_mlp train_cnn train_gpt > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "built in $((SECONDS - T0)) s"
export FLAME_LIBRARY=$PWD/build/libflame.so.1
for i in 0 1 2; do
  GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i timeout 280 ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 > "$OUT/gtest$i.log" 2>&1 &
done
timeout 280 python3 tests/parity/run_parity.py > "$OUT/parity.log" 2>&1 &
timeout 280 python3 tests/parity/test_optim_torch.py > "$OUT/optim_torch.log" 2>&1 &
(cd build/examples && for ex in hello_autograd train_mlp train_cnn; do timeout 150 ./$ex > "$OUT/ex_$ex.log" 2>&1; echo "rc=$?" >> "$OUT/ex_$ex.log"; done) &
(cd build/examples && timeout 150 ./train_gpt --steps 600 --save "$OUT/gpt.safetensors" > "$OUT/ex_gpt_a.log" 2>&1; echo "rc=$?" >> "$OUT/ex_gpt_a.log";
 timeout 100 ./train_gpt --steps 900 --resume "$OUT/gpt.safetensors" > "$OUT/ex_gpt_b.log" 2>&1; echo "rc=$?" >> "$OUT/ex_gpt_b.log"; rm -f "$OUT"/gpt.safetensors*) &
wait
echo "tests done at $((SECONDS - T0)) s"
for i in 0 1 2; do grep -E "^\[  (PASSED|FAILED)  \]|tests from .* ran" "$OUT/gtest$i.log"; done
for i in 0 1 2; do grep -B3 -A14 "Failure$" "$OUT/gtest$i.log"; done | head -120 > "$OUT/gtest_failures.txt"
grep -E "passed|FAIL" "$OUT/parity.log" | tail -8; tail -3 "$OUT/optim_torch.log"
for f in "$OUT"/ex_*.log; do echo "== $f"; tail -3 "$f"; done
if (( SECONDS - T0 < ${BENCH_IF_BELOW:-250} )); then
  timeout ${BENCH_TIMEOUT:-110} python3 bench/run.py --tiers T2 --no-results-md --out "$OUT/bench" > "$OUT/bench.log" 2>&1
  grep "^T\|geometric" "$OUT/bench.log" | tail -14
fi
echo "total $((SECONDS - T0)) s"
# The device tool returns a limited number of files: fold the logs into one.
for f in "$OUT"/*.log "$OUT"/gtest_failures.txt; do echo "=================== $f"; cat "$f"; done > "$OUT/all_logs.txt" 2>/dev/null
rm -f "$OUT"/*.log "$OUT"/gtest_failures.txt
