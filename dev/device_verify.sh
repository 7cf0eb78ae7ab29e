#!/usr/bin/env bash
# A focused re-verification on a 2-GPU machine (nvidia-h200-x2), logs under $OUT:
#  1. build everything the GPU runs need;
#  2. side by side: gtest shard $SHARD of 4 (the multi-GPU suites excluded) and $FILTER on GPU 0,
#     the examples and the GPT-2 smoke test through CTest on GPU 1;
#  3. the multi-GPU suites (Dist*, Threads.*, DeviceFault.*) and example_train_mlp_dp on both GPUs
#     with FLAME_REQUIRE_GPUS=2;
#  4. side by side: bench/run.py $BENCH_TIERS alone on GPU 0, compute-sanitizer memcheck on GPU 1;
#  5. the NCCL all_reduce bench on both GPUs.
# Every log is folded into $OUT/all_logs.txt (the device returns a limited number of files).
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=${SHARD:-0} timeout 200 ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 \
   --gtest_filter="-$MULTI" > "$OUT/gtest_shard.log" 2>&1; echo "shard rc=$?" >> "$OUT/gtest_shard.log"
 timeout 100 ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 --gtest_filter="${FILTER:-Linear.*:Numerics.*}" \
   > "$OUT/gtest_filter.log" 2>&1; echo "filter rc=$?" >> "$OUT/gtest_filter.log") &
(export CUDA_VISIBLE_DEVICES=1; timeout 300 ctest --test-dir build -L "examples|bench" --output-on-failure > "$OUT/ctest_examples.log" 2>&1) &
wait
echo "single-GPU stage done at $((SECONDS - T0)) s"
FLAME_REQUIRE_GPUS=2 timeout 150 ./build/tests/gpu/flame_gpu_tests --gtest_filter="$MULTI" > "$OUT/gtest_multi.log" 2>&1
echo "multi rc=$?" >> "$OUT/gtest_multi.log"
(cd build/examples && timeout 60 ./train_mlp_dp > "$OUT/ex_mlp_dp_2gpu.log" 2>&1; echo "rc=$?" >> "$OUT/ex_mlp_dp_2gpu.log")
echo "multi-GPU stage done at $((SECONDS - T0)) s"
for f in "$OUT"/gtest*.log; do echo "$(basename $f): $(grep -E '^\[  (PASSED|FAILED)  \]|rc=' $f | tr '\n' ' ')"; done
grep -h "^\[  FAILED  \]" "$OUT"/gtest*.log | sort -u | head -30
grep -E "tests passed|tests failed|\*\*\*Failed" "$OUT/ctest_examples.log" | head -20
tail -4 "$OUT/ex_mlp_dp_2gpu.log"
left=$(( ${TOTAL_BUDGET:-560} - (SECONDS - T0) ))
(CUDA_VISIBLE_DEVICES=0 timeout $((left - 50)) python3 bench/run.py --tiers ${BENCH_TIERS:-T1nn,T3gpt2} --no-compile \
   --no-results-md --out "$OUT/bench" > "$OUT/bench.log" 2>&1; echo "bench rc=$?" >> "$OUT/bench.log") &
(mkdir -p "$OUT/san"; cd "$OUT/san" && CUDA_VISIBLE_DEVICES=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 \
   "$OLDPWD/build/tests/gpu/flame_gpu_tests" --gtest_brief=1 --gtest_filter="${MEMCHECK_FILTER:-Numerics.*:Optim.*:Linear.*}" \
   > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?" >> "$OUT/memcheck.log") &
wait
grep -E "^T[0-5]|geometric|rc=" "$OUT/bench.log" | cut -c1-220 | tail -40
grep -E "ERROR SUMMARY|PASSED|FAILED|rc=" "$OUT/memcheck.log" | head
if (( SECONDS - T0 < ${TOTAL_BUDGET:-560} - 45 )); then
  timeout 40 python3 bench/dist_bench.py --max-mib ${DIST_MAX_MIB:-1024} > "$OUT/dist_bench.log" 2>&1; echo "dist bench rc=$?"; tail -12 "$OUT/dist_bench.log"
fi
echo "total $((SECONDS - T0)) s"
fold_logs
rm -rf "$OUT"/*.log "$OUT"/san
