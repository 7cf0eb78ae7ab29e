#!/usr/bin/env bash
# The full verification on a 2-GPU machine (nvidia-h200-x2), in two calls that each fit the device
# tool's 10-minute limit; logs under $OUT, folded into $OUT/all_logs.txt.
#   PART=tests  1. the GPU gtest suite in 4 shards (2 per GPU side by side, each seeing one GPU; the
#                  multi-GPU suites excluded), then the PyTorch parity suite and the optimizer parity
#                  on GPU 0 and the single-GPU examples and smoke tests through CTest on GPU 1;
#               2. with both GPUs and FLAME_REQUIRE_GPUS=2: the multi-GPU suites and the CTest
#                  entries that need 2 GPUs (train_mlp_dp, train_gpt --gpus 2, the DP bench smoke).
#   PART=bench  3. side by side: bench/run.py $BENCH_TIERS alone on GPU 0, dev/sanitize-gpu.sh
#                  on GPU 1 (memcheck, racecheck, host leaks); $FILTER (if set) re-run on GPU 1 after it;
#               4. the 2-GPU benches: GPT-2 data-parallel scaling (T3dp) and the NCCL all_reduce bench.
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
PART=${PART:-tests}

if [[ $PART == tests ]]; then
  for i in 0 1 2 3; do
    CUDA_VISIBLE_DEVICES=$((i % 2)) GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout ${GTEST_TIMEOUT:-240} \
      ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 --gtest_filter="-$MULTI" > "$OUT/gtest$i.log" 2>&1 &
    (( i == 3 )) && wait
  done
  echo "gtest shards done at $((SECONDS - T0)) s"
  (export CUDA_VISIBLE_DEVICES=0; timeout 200 python3 tests/parity/run_parity.py > "$OUT/parity.log" 2>&1;
   timeout 100 python3 tests/parity/test_optim_torch.py > "$OUT/optim_torch.log" 2>&1) &
  (export CUDA_VISIBLE_DEVICES=1; timeout 240 ctest --test-dir build -L "examples|bench" -E "dp2|mlp_dp" \
     --output-on-failure > "$OUT/ctest_examples.log" 2>&1) &
  wait
  echo "single-GPU stage done at $((SECONDS - T0)) s"
  export FLAME_REQUIRE_GPUS=2
  timeout 120 ./build/tests/gpu/flame_gpu_tests --gtest_filter="$MULTI" > "$OUT/gtest_multi.log" 2>&1
  timeout 150 ctest --test-dir build -R "dp2|mlp_dp" --output-on-failure > "$OUT/ctest_2gpu.log" 2>&1
  echo "multi-GPU stage done at $((SECONDS - T0)) s"
  for f in "$OUT"/gtest*.log; do echo "$(basename $f): $(grep -E '^\[  (PASSED|FAILED)  \]|^\[Arg|^\[OutOfMemory' $f | tr '\n' ' ')"; done
  for f in "$OUT"/gtest*.log; do grep -B3 -A14 "Failure$" "$f"; done | head -150 > "$OUT/gtest_failures.txt"
  grep -h "^\[  FAILED  \]" "$OUT"/gtest*.log | sort -u | head -30
  grep -E "passed|FAIL" "$OUT/parity.log" | tail -8; tail -2 "$OUT/optim_torch.log"
  grep -hE "tests passed|tests failed|\*\*\*Failed|Passed|Not Run|Skipped" "$OUT"/ctest_*.log | head -30
  fold_logs "$OUT/gtest_failures.txt"
else
  left=$(( ${TOTAL_BUDGET:-560} - (SECONDS - T0) ))
  (CUDA_VISIBLE_DEVICES=0 timeout $((left - 200)) python3 bench/run.py --tiers ${BENCH_TIERS:-T1nn,T1fused,T2,T3gpt2} \
     --no-compile --no-results-md --out "$OUT/bench" > "$OUT/bench.log" 2>&1; echo "bench rc=$?" >> "$OUT/bench.log") &
  (export CUDA_VISIBLE_DEVICES=1
   BUILD_DIR=build MEMCHECK_TIMEOUT=${MEMCHECK_TIMEOUT:-90} RACECHECK_TIMEOUT=${RACECHECK_TIMEOUT:-60} \
     LEAK_TIMEOUT=${LEAK_TIMEOUT:-60} OUT="$OUT/san" timeout 260 bash dev/sanitize-gpu.sh > "$OUT/sanitize.log" 2>&1
   if [[ -n ${FILTER:-} ]]; then
     timeout 120 ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 --gtest_filter="$FILTER" > "$OUT/gtest_filter.log" 2>&1
   fi) &
  wait
  echo "bench and sanitizers done at $((SECONDS - T0)) s"
  grep -E "^T[0-5]|geometric|rc=" "$OUT/bench.log" | cut -c1-200 | tail -70
  tail -5 "$OUT/sanitize.log"
  [[ -f $OUT/gtest_filter.log ]] && grep -E "^\[  (PASSED|FAILED)  \]" "$OUT/gtest_filter.log"
  for f in "$OUT"/san/*.log; do [[ -f $f ]] && mv "$f" "$OUT/san_$(basename $f)"; done
  left=$(( ${TOTAL_BUDGET:-560} - (SECONDS - T0) ))
  if (( left > 60 )); then
    FLAME_REQUIRE_GPUS=2 timeout $((left - 40)) python3 bench/run.py --tiers T3dp --no-results-md --out "$OUT/bench_dp" \
      > "$OUT/bench_dp.log" 2>&1; echo "bench dp rc=$?" >> "$OUT/bench_dp.log"
    grep -E "^T3dp|^  |rc=" "$OUT/bench_dp.log" | cut -c1-220
  fi
  left=$(( ${TOTAL_BUDGET:-560} - (SECONDS - T0) ))
  if (( left > 35 )); then
    timeout $((left - 5)) python3 bench/dist_bench.py --min-mib 8 --max-mib ${DIST_MAX_MIB:-4096} > "$OUT/dist_bench.log" 2>&1
    echo "dist bench rc=$?"; tail -12 "$OUT/dist_bench.log"
  fi
  fold_logs
fi
echo "total $((SECONDS - T0)) s"
rm -rf "$OUT"/*.log "$OUT"/gtest_failures.txt "$OUT"/san
