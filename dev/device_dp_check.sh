#!/usr/bin/env bash
# A focused two-GPU check of the data-parallel path and the racecheck of FLAME kernels (session 5): racecheck
# beside train_gpt (f32 and --autocast), then the Dist/Hooks suites and the 2-GPU CTests, then bench T3dp.
source dev/device_common.sh
(cd "$OUT" && CUDA_VISIBLE_DEVICES=1 FLAME_DISABLE_CUDNN=1 timeout 120 compute-sanitizer --tool racecheck --error-exitcode 1 $OLDPWD/build/tests/gpu/flame_gpu_tests --gtest_brief=1 --gtest_filter='Reductions.NanPropagates:Reductions.ArgmaxArgmin:Reductions.Cumsum:NnTest.SoftmaxRowsStayStableForLargeAndInfiniteInputs:NnTest.LayerNormForwardAndBackwardMatchHost:Numerics.SoftmaxPropagatesNanAndInfinityOnEveryKernel:LossKernels.AllIgnoredAndEmptyBatches:Attention.NoKeysGiveZeros:Attention.LastDimNotContiguousIsCopied:Optim.ClipGradNormAndValue' > racecheck.log 2>&1; echo "racecheck rc=$?" >> racecheck.log) &
(CUDA_VISIBLE_DEVICES=0 timeout 150 ctest --test-dir build -R "example_train_gpt$|example_train_gpt_autocast" --output-on-failure > "$OUT/ctest_gpt.log" 2>&1) &
wait
export FLAME_REQUIRE_GPUS=2
timeout 100 ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 --gtest_filter='Dist*:Hooks.*' > "$OUT/gtest_dist.log" 2>&1
timeout 120 ctest --test-dir build -R "dp2|mlp_dp" --output-on-failure > "$OUT/ctest_2gpu.log" 2>&1
echo "tests done at $((SECONDS - T0)) s"
grep -E "RACECHECK SUMMARY|rc=|PASSED|FAILED" "$OUT/racecheck.log"; grep -hE "tests passed|Failed|Passed" "$OUT"/ctest_*.log
grep -E "^\[  (PASSED|FAILED)" "$OUT/gtest_dist.log"; grep -E "autocast|step   600|below" "$OUT/ctest_gpt.log" | head -8
timeout 200 python3 bench/run.py --tiers T3dp --no-results-md --out "$OUT/bench_dp" > "$OUT/bench_dp.log" 2>&1; echo "bench dp rc=$?"
grep -E "^T3dp|^  FLAME|^  torch" "$OUT/bench_dp.log" | cut -c1-230
fold_logs; rm -f "$OUT"/*.log; echo "total $((SECONDS - T0)) s"
