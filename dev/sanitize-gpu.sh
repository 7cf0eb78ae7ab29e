#!/usr/bin/env bash
# Sanitizers on the GPU machine (issue 12), time-boxed: each run below has its own time limit and
# together they take at most about 4.5 minutes (builds not counted; they are reused when present).
#
#   dev/sanitize-gpu.sh                  # uses build-gpu/ (scripts/test-gpu.sh) or builds it
#   BUILD_DIR=build-x dev/sanitize-gpu.sh
#   OUT=/some/dir dev/sanitize-gpu.sh    # logs go to $OUT/ (default: $BUILD_DIR/sanitize/)
#
#  1. compute-sanitizer --tool memcheck  over a representative subset of flame_gpu_tests ($MEMCHECK_FILTER:
#     elementwise, reductions, norms, softmax, numerics, cross-entropy, indexing with out-of-range
#     indices, small attention and convolution, optimizers), --error-exitcode 1.
#  2. compute-sanitizer --tool racecheck over the kernels that use shared memory ($RACECHECK_FILTER:
#     reductions, softmax, norms, cross-entropy, small attention, grad-norm clipping), with
#     FLAME_DISABLE_CUDNN=1 so that the attention tests run FLAME's kernels rather than cuDNN's.
#     Not included anywhere: long cuBLASLt matmul tests (they hang under the sanitizers' initcheck
#     and take minutes), the >2^31-element reductions, DeviceFault.* (it faults on purpose, in a
#     child process) and Threads.* (host threads; ThreadSanitizer covers the host side in CI).
#  3. host-side leaks of a short GPU test run ($LEAK_FILTER): valgrind --leak-check=full when
#     valgrind is installed, else a LeakSanitizer (ASan) build of libflame and flame_gpu_tests in
#     $BUILD_DIR-asan. Leak (and valgrind memory-error) records whose stack has a FLAME frame
#     (libflame.so, flame::) count as errors; those inside the CUDA driver, NVRTC or cuBLASLt are
#     listed but not counted.
# Prints one summary line per tool and exits non-zero when a tool found an error or timed out.
# The kernel cache ($FLAME_KERNEL_CACHE_DIR, default $BUILD_DIR/kernel-cache) should be warm
# (scripts/test-gpu.sh fills it) so that the time goes to the sanitizers, not to NVRTC.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build-gpu}
[[ $BUILD_DIR = /* ]] || BUILD_DIR=$ROOT/$BUILD_DIR
LOG_DIR=${OUT:-$BUILD_DIR/sanitize}
mkdir -p "$LOG_DIR"
JOBS=$(nproc 2>/dev/null || echo 4)
export PATH="$PATH:/usr/local/cuda/bin"
export FLAME_REQUIRE_GPU=1
export FLAME_KERNEL_CACHE_DIR=${FLAME_KERNEL_CACHE_DIR:-$BUILD_DIR/kernel-cache}
mkdir -p "$FLAME_KERNEL_CACHE_DIR"

MEMCHECK_TIMEOUT=${MEMCHECK_TIMEOUT:-110}
RACECHECK_TIMEOUT=${RACECHECK_TIMEOUT:-80}
LEAK_TIMEOUT=${LEAK_TIMEOUT:-80}

MEMCHECK_FILTER=${MEMCHECK_FILTER:-'ElementwiseSpecial.NanAndInfinity:ElementwiseSpecial.RoundHalfToEven:ElementwiseSpecial.InputsAreNotModified:ElementwiseWhere.*:ElementwisePromotion.DocumentedExamples:Reductions.NanPropagates:Reductions.ArgmaxArgmin:Reductions.Cumsum:Reductions.EmptyInputs:Reductions.HalfPrecisionAccumulatesInF32:NnTest.SoftmaxRowsStayStableForLargeAndInfiniteInputs:NnTest.LayerNormForwardAndBackwardMatchHost:NnTest.RmsNormForwardAndBackwardMatchHost:Numerics.*:LossKernels.OutOfRangeIndicesAreReportedAtTheNextSync:LossKernels.AllIgnoredAndEmptyBatches:LossKernels.CrossEntropySpatialAndNonContiguous:IndexOps.OutOfRangeIndicesAreReportedAtTheNextSync:NnIndexOps.ScatterOutOfRangeIsReportedAtTheNextSync:Attention.NoKeysGiveZeros:Attention.LastDimNotContiguousIsCopied:ConvTest.Conv1dForwardAndGradientsMatchHost:ConvTest.EmptyBatchGivesEmptyResultAndZeroWeightGradient:Optim.StepsMatchTheHostFormulas:Optim.ClipGradNormAndValue'}
RACECHECK_FILTER=${RACECHECK_FILTER:-'Reductions.NanPropagates:Reductions.ArgmaxArgmin:Reductions.Cumsum:NnTest.SoftmaxRowsStayStableForLargeAndInfiniteInputs:NnTest.LayerNormForwardAndBackwardMatchHost:Numerics.SoftmaxPropagatesNanAndInfinityOnEveryKernel:LossKernels.AllIgnoredAndEmptyBatches:Attention.NoKeysGiveZeros:Attention.LastDimNotContiguousIsCopied:Optim.ClipGradNormAndValue'}
LEAK_FILTER=${LEAK_FILTER:-'Reductions.NanPropagates:ElementwiseSpecial.NanAndInfinity:NnTest.LayerNormForwardAndBackwardMatchHost:Optim.ClipGradNormAndValue:Threads.SharedContextMixedWork'}

summary=()
failed=0
line() { summary+=("$1"); echo "$1"; }

# ---- builds: reuse, or configure + build the needed targets ----
build_tests() {  # DIR EXTRA-CMAKE-ARGS...
  local dir=$1
  shift
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  if [[ ! -f $dir/CMakeCache.txt ]]; then
    cmake -S "$ROOT" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$LOG_DIR/configure-$(basename "$dir").log" 2>&1 ||
      return 1
  fi
  cmake --build "$dir" -j "$JOBS" --target flame flame_gpu_tests >"$LOG_DIR/build-$(basename "$dir").log" 2>&1
}
if ! build_tests "$BUILD_DIR"; then
  echo "sanitize-gpu: building $BUILD_DIR failed (see $LOG_DIR/build-*.log)" >&2
  exit 1
fi
GPU_TESTS=$BUILD_DIR/tests/gpu/flame_gpu_tests

# gtest summary of a log: "N tests, M passed" (empty when the run did not get that far)
gtest_counts() {
  local ran passed
  ran=$(grep -oE '^\[==========\] [0-9]+ tests? from' "$1" | tail -1 | grep -oE '[0-9]+' | head -1)
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$1" | tail -1 | grep -oE '[0-9]+$')
  [[ -n $ran ]] && echo "$ran tests, ${passed:-0} passed"
}

# ---- 1 and 2: compute-sanitizer ----
CS=$(command -v compute-sanitizer || true)
for c in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
  [[ -z $CS && -x $c ]] && CS=$c
done
run_cs() {  # TOOL TIMEOUT FILTER
  local tool=$1 limit=$2 filter=$3 log=$LOG_DIR/$1.log t=$SECONDS rc
  if [[ -z $CS ]]; then
    line "compute-sanitizer $tool: NOT RUN (compute-sanitizer not found)"
    failed=1
    return
  fi
  timeout --kill-after=10 "$limit" "$CS" --tool "$tool" --error-exitcode 1 --print-limit 50 \
    "$GPU_TESTS" --gtest_filter="$filter" >"$log" 2>&1
  rc=$?
  local errors
  errors=$(grep -oE '========= ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
  local what
  what="$(gtest_counts "$log"), sanitizer errors: ${errors:-?}"
  if ((rc == 124 || rc == 137)); then
    line "compute-sanitizer $tool: TIMEOUT after ${limit}s ($what; log $log)"
    failed=1
  elif ((rc != 0)); then
    line "compute-sanitizer $tool: FAILED exit $rc in $((SECONDS - t))s ($what; log $log)"
    failed=1
  else
    line "compute-sanitizer $tool: clean in $((SECONDS - t))s ($what)"
  fi
}
run_cs memcheck "$MEMCHECK_TIMEOUT" "$MEMCHECK_FILTER"
# racecheck is for FLAME's own shared-memory kernels: with cuDNN on, the attention tests run cuDNN's
# sm90 flash kernels (wgmma/TMA, synchronised through mbarriers), in which racecheck reports hazards
# (8 in cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_*, 2026-11-21) that are not ours to fix.
FLAME_DISABLE_CUDNN=1 run_cs racecheck "$RACECHECK_TIMEOUT" "$RACECHECK_FILTER"

# ---- 3: host-side leaks ----
# Counts the records in LOG (valgrind: "definitely lost" blocks and invalid reads, writes and frees;
# LSan: leak blocks) and those with a FLAME frame; prints "TOTAL FLAME". Valgrind's invalid reads
# inside glibc's dlopen of the CUDA libraries (strncmp over-reads) have no FLAME frame.
count_leaks() {  # LOG KIND(valgrind|lsan)
  awk -v kind="$2" '
    function flush() { if (inrec) { total++; if (ours) flame++ } inrec = 0; ours = 0 }
    kind == "valgrind" && /definitely lost in loss record|Invalid (read|write|free)|Mismatched free/ { flush(); inrec = 1; next }
    kind == "lsan" && /^(Direct|Indirect) leak of/ { flush(); inrec = 1; next }
    inrec && kind == "valgrind" && /^==[0-9]+== *$/ { flush(); next }
    inrec && kind == "lsan" && /^$/ { flush(); next }
    inrec && (/libflame\.so/ || /flame::/) { ours = 1 }
    END { flush(); printf "%d %d\n", total + 0, flame + 0 }' "$1"
}
leak_log=$LOG_DIR/leaks.log
t=$SECONDS
if command -v valgrind >/dev/null; then
  timeout --kill-after=10 "$LEAK_TIMEOUT" valgrind --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=none \
    --undef-value-errors=no --num-callers=30 "$GPU_TESTS" --gtest_filter="$LEAK_FILTER" >"$leak_log" 2>&1
  rc=$?
  read -r total ours < <(count_leaks "$leak_log" valgrind)
  tool="valgrind"
else
  ASAN_DIR=${BUILD_DIR}-asan
  # ASan+UBSan build (FLAME_SANITIZE); CUDA needs the shadow gap unprotected.
  if build_tests "$ASAN_DIR" -DFLAME_SANITIZE=ON -DFLAME_BUILD_EXAMPLES=OFF; then
    ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:exitcode=0:halt_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
      LSAN_OPTIONS=report_objects=0:max_leaks=200 \
      timeout --kill-after=10 "$LEAK_TIMEOUT" "$ASAN_DIR/tests/gpu/flame_gpu_tests" --gtest_filter="$LEAK_FILTER" >"$leak_log" 2>&1
    rc=$?
    read -r total ours < <(count_leaks "$leak_log" lsan)
    if grep -q "LeakSanitizer has encountered a fatal error" "$leak_log"; then rc=99; fi
    if grep -qE "ERROR: AddressSanitizer|runtime error:" "$leak_log"; then ours=$((ours + 1)); fi  # memory errors count too
  else
    rc=98
    total=0 ours=0
  fi
  tool="LeakSanitizer (ASan build $ASAN_DIR)"
fi
what="$(gtest_counts "$leak_log"); leak/error records: ${total:-0}, with a FLAME frame: ${ours:-0}"
if ((rc == 124 || rc == 137)); then
  line "host leaks, $tool: TIMEOUT after ${LEAK_TIMEOUT}s ($what; log $leak_log)"
  failed=1
elif ((rc == 98)); then
  line "host leaks, $tool: NOT RUN (the ASan build failed; see $LOG_DIR/build-*-asan.log)"
  failed=1
elif ((rc == 99)); then
  line "host leaks, $tool: NOT RUN (LeakSanitizer cannot run here, e.g. ptrace is not permitted; log $leak_log)"
  failed=1
elif ((rc != 0)); then
  line "host leaks, $tool: FAILED (tests exit $rc; $what; log $leak_log)"
  failed=1
elif ((ours > 0)); then
  line "host leaks, $tool: LEAKS in FLAME in $((SECONDS - t))s ($what; log $leak_log)"
  failed=1
else
  line "host leaks, $tool: clean in $((SECONDS - t))s ($what)"
fi

{
  echo
  echo "=== sanitize-gpu summary (logs in $LOG_DIR)"
  for s in "${summary[@]}"; do echo "  $s"; done
} | tee "$LOG_DIR/summary.txt"
exit $failed
