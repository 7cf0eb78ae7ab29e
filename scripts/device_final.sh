#!/usr/bin/env bash
# A time-boxed full verification on a 2-GPU machine (nvidia-h200-x2), logs under $OUT:
#  1. build everything the GPU runs need;
#  2. side by side: the GPU gtest suite in 4 shards (2 per GPU, each seeing one GPU; the multi-GPU
#     suites excluded), the PyTorch parity suite and the optimizer parity (GPU 0), the examples and
#     the GPT-2 smoke test through CTest (GPU 1);
#  3. the multi-GPU suites (Dist*, Threads.*, DeviceFault.*) with both GPUs, FLAME_REQUIRE_GPUS=2;
#  4. side by side: bench/run.py $BENCH_TIERS alone on GPU 0 and scripts/sanitize-gpu.sh on GPU 1, and the
#     NCCL bandwidth bench (both GPUs) after them.
# Every log is folded into $OUT/all_logs.txt (the device returns a limited number of files).
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
for i in 0 1 2 3; do
  CUDA_VISIBLE_DEVICES=$((i % 2)) GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout ${GTEST_TIMEOUT:-300} \
    ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 --gtest_filter="-$MULTI" > "$OUT/gtest$i.log" 2>&1 &
done
(export CUDA_VISIBLE_DEVICES=0; timeout 300 python3 tests/parity/run_parity.py > "$OUT/parity.log" 2>&1;
 timeout 120 python3 tests/parity/test_optim_torch.py > "$OUT/optim_torch.log" 2>&1) &
(export CUDA_VISIBLE_DEVICES=1; timeout 300 ctest --test-dir build -L "examples|bench" --output-on-failure > "$OUT/ctest_examples.log" 2>&1) &
wait
echo "single-GPU stage done at $((SECONDS - T0)) s"
FLAME_REQUIRE_GPUS=2 timeout 200 ./build/tests/gpu/flame_gpu_tests --gtest_filter="$MULTI" > "$OUT/gtest_multi.log" 2>&1
echo "multi-GPU stage done at $((SECONDS - T0)) s"
for f in "$OUT"/gtest*.log; do echo "$(basename $f): $(grep -E '^\[  (PASSED|FAILED)  \]' $f | tr '\n' ' ')"; done
for f in "$OUT"/gtest*.log; do grep -B3 -A14 "Failure$" "$f"; done | head -100 > "$OUT/gtest_failures.txt"
grep -h "^\[  FAILED  \]" "$OUT"/gtest*.log | sort -u | head -30
grep -E "passed|FAIL" "$OUT/parity.log" | tail -6; tail -2 "$OUT/optim_torch.log"
grep -E "tests passed|tests failed|Failed|\*\*\*Failed|Passed" "$OUT/ctest_examples.log" | head -20
if (( SECONDS - T0 < ${BENCH_IF_BELOW:-400} )); then
  left=$(( ${TOTAL_BUDGET:-570} - (SECONDS - T0) ))
  (CUDA_VISIBLE_DEVICES=0 timeout $((left - 40)) python3 bench/run.py --tiers ${BENCH_TIERS:-T0,T1core,T1nn,T2,T3gpt2} --no-compile \
     --no-results-md --out "$OUT/bench" > "$OUT/bench.log" 2>&1; echo "bench rc=$?" >> "$OUT/bench.log") &
  (CUDA_VISIBLE_DEVICES=1 BUILD_DIR=build MEMCHECK_TIMEOUT=${MEMCHECK_TIMEOUT:-90} RACECHECK_TIMEOUT=${RACECHECK_TIMEOUT:-70} \
     LEAK_TIMEOUT=${LEAK_TIMEOUT:-60} OUT="$OUT/san" timeout $((left - 40)) bash scripts/sanitize-gpu.sh > "$OUT/sanitize.log" 2>&1) &
  wait
  grep -E "^T[0-5]|geometric|rc=" "$OUT/bench.log" | cut -c1-200 | tail -60
  tail -6 "$OUT/sanitize.log"
  for f in "$OUT"/san/*.log; do [[ -f $f ]] && mv "$f" "$OUT/san_$(basename $f)"; done
  if (( SECONDS - T0 < ${TOTAL_BUDGET:-570} - 45 )); then
    timeout 40 python3 bench/dist_bench.py > "$OUT/dist_bench.log" 2>&1; echo "dist bench rc=$?"; tail -12 "$OUT/dist_bench.log"
  fi
fi
echo "total $((SECONDS - T0)) s"
fold_logs "$OUT/gtest_failures.txt"
rm -rf "$OUT"/*.log "$OUT"/gtest_failures.txt "$OUT"/san
