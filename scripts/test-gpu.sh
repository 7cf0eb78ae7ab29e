#!/usr/bin/env bash
# Builds FLAME in Release and runs the whole test suite on a GPU machine, where a missing GPU is a
# failure (FLAME_REQUIRE_GPU=1), not a skip.
#
#   scripts/test-gpu.sh                 # build dir: build-gpu/
#   BUILD_DIR=build-x scripts/test-gpu.sh
#   OUT=/some/dir scripts/test-gpu.sh   # logs go to $OUT/ (default: the build dir)
#
# GoogleTest: the installed one (libgtest-dev) when present; otherwise a GoogleTest source tree
# from $FLAME_GTEST_SOURCE, ./.gtest (git-ignored; e.g. a copy of Debian's /usr/src/googletest) or
# /usr/src/googletest is built and installed under the build dir first. This serves GPU machines
# that have CMake and the CUDA toolkit but no GoogleTest and no network (FLAME_GTEST_FROM_SOURCE=1
# forces this path).
#
# Steps: configure (Release) + build (targets all and test_programs) with all cores; ctest (every
# label: the `examples` rows that train the example programs and check their claims, and
# kernels-full, every NVRTC kernel instantiation, included) with a fresh, empty kernel cache
# (FLAME_KERNEL_CACHE_DIR under the build dir: every kernel compiled by NVRTC); ctest again on the
# now warm cache (the cache-hit path) unless FLAME_SKIP_WARM_RUN=1; then the PyTorch parity suite
# (tests/parity/run_parity.py) when it exists, the DLPack exchange with PyTorch
# (tests/parity/test_dlpack_torch.py) and the safetensors interop check with the Python package
# (tests/parity/test_safetensors_torch.py), optimizer parity (tests/parity/test_optim_torch.py) and
# the f8 conversions against PyTorch's float8 dtypes (tests/parity/test_f8_torch.py).
# Exits non-zero if any step fails; prints a summary.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build-gpu}
[[ $BUILD_DIR = /* ]] || BUILD_DIR=$ROOT/$BUILD_DIR
LOG_DIR=${OUT:-$BUILD_DIR}
mkdir -p "$LOG_DIR" "$BUILD_DIR"
JOBS=$(nproc 2>/dev/null || echo 4)
export PATH="$PATH:/usr/local/cuda/bin"

failures=()
summary=()
T0=$SECONDS

# run NAME LOGFILE CMD...: runs CMD, tees its output into LOGFILE, records the result.
run() {
  local name=$1 log=$2
  shift 2
  local t=$SECONDS
  echo
  echo "=== $name  (log: $log)"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local line="$name: $( ((rc == 0)) && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - t))s"
  summary+=("$line")
  ((rc == 0)) || failures+=("$name")
  return $rc
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -a)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (dirty)')"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  command -v nvcc >/dev/null && nvcc --version | tail -2
} 2>&1 | tee "$LOG_DIR/environment.txt"

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

EXTRA=()
have_gtest() {
  compgen -G "/usr/lib/*/cmake/GTest/GTestConfig.cmake" >/dev/null || compgen -G "/usr/lib*/cmake/GTest/GTestConfig.cmake" >/dev/null ||
    compgen -G "/usr/local/lib*/cmake/GTest/GTestConfig.cmake" >/dev/null || [[ -f /usr/include/gtest/gtest.h ]]
}
if [[ ${FLAME_GTEST_FROM_SOURCE:-0} == 1 ]] || ! have_gtest; then
  gtest_src=""
  for c in "${FLAME_GTEST_SOURCE:-}" "$ROOT/.gtest" /usr/src/googletest; do
    if [[ -n $c && -f $c/CMakeLists.txt ]]; then gtest_src=$c; break; fi
  done
  if [[ -z $gtest_src ]]; then
    echo "GoogleTest is not installed and no source tree was found (set FLAME_GTEST_SOURCE or copy /usr/src/googletest to .gtest/)" >&2
    exit 1
  fi
  GTEST_PREFIX=$BUILD_DIR/gtest-prefix
  if [[ ! -f $GTEST_PREFIX/.built ]]; then
    run "GoogleTest from $gtest_src" "$LOG_DIR/gtest.log" bash -c "
      cmake -S '$gtest_src' -B '$BUILD_DIR/gtest-build' ${GEN[*]} -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
            -DINSTALL_GTEST=ON -DCMAKE_INSTALL_PREFIX='$GTEST_PREFIX' -DCMAKE_POSITION_INDEPENDENT_CODE=ON &&
      cmake --build '$BUILD_DIR/gtest-build' -j $JOBS && cmake --install '$BUILD_DIR/gtest-build' && touch '$GTEST_PREFIX/.built'" ||
      exit 1
  fi
  EXTRA+=(-DCMAKE_PREFIX_PATH="$GTEST_PREFIX")
fi

if ! run "configure" "$LOG_DIR/configure.log" cmake -S "$ROOT" -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "${EXTRA[@]}"; then
  echo "configure failed" >&2
  exit 1
fi
# `all` is the library and the examples; test_programs adds every test and benchmark program.
if ! run "build" "$LOG_DIR/build.log" cmake --build "$BUILD_DIR" -j "$JOBS" --target all test_programs; then
  echo "build failed" >&2
  exit 1
fi

export FLAME_REQUIRE_GPU=1
export FLAME_KERNEL_CACHE_DIR=$BUILD_DIR/kernel-cache
rm -rf "$FLAME_KERNEL_CACHE_DIR"
mkdir -p "$FLAME_KERNEL_CACHE_DIR"

# ctest runs tests side by side (the CPU tests compile kernels with NVRTC); each GPU suite is one
# process. Set CTEST_PARALLEL_LEVEL=1 for one at a time.
export CTEST_PARALLEL_LEVEL=${CTEST_PARALLEL_LEVEL:-$JOBS}
run "ctest (cold kernel cache)" "$LOG_DIR/ctest-cold.log" \
  ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error ${CTEST_ARGS:-}
entries=$(find "$FLAME_KERNEL_CACHE_DIR" -type f | wc -l)
summary+=("kernel cache after the cold run: $entries files in $FLAME_KERNEL_CACHE_DIR")

if [[ ${FLAME_SKIP_WARM_RUN:-0} != 1 ]]; then
  run "ctest (warm kernel cache)" "$LOG_DIR/ctest-warm.log" \
    ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error ${CTEST_ARGS:-}
  entries_after=$(find "$FLAME_KERNEL_CACHE_DIR" -type f | wc -l)
  summary+=("kernel cache after the warm run: $entries_after files")
fi

if [[ -f $ROOT/tests/parity/run_parity.py ]]; then
  export FLAME_LIBRARY=$BUILD_DIR/libflame.so FLAME_BUILD_DIR=$BUILD_DIR
  run "PyTorch parity (tests/parity/run_parity.py)" "$LOG_DIR/parity.log" \
    python3 "$ROOT/tests/parity/run_parity.py"
else
  summary+=("PyTorch parity: tests/parity/run_parity.py not present, skipped")
fi

# DLPack exchange with PyTorch (zero copy both ways, deleters, memory freed on both sides).
if [[ -f $ROOT/tests/parity/test_dlpack_torch.py ]]; then
  export FLAME_LIBRARY=$BUILD_DIR/libflame.so
  run "DLPack with PyTorch (tests/parity/test_dlpack_torch.py)" "$LOG_DIR/dlpack-torch.log" \
    python3 "$ROOT/tests/parity/test_dlpack_torch.py"
fi
# safetensors files written by the Python package load in FLAME and FLAME's files load there (prints
# SKIPPED and passes when the `safetensors` package is not installed).
if [[ -f $ROOT/tests/parity/test_safetensors_torch.py ]]; then
  export FLAME_LIBRARY=$BUILD_DIR/libflame.so FLAME_BUILD_DIR=$BUILD_DIR
  run "safetensors interop (tests/parity/test_safetensors_torch.py)" "$LOG_DIR/safetensors-interop.log" \
    python3 "$ROOT/tests/parity/test_safetensors_torch.py"
fi
# Optimizers (10 steps) and clip_grad_norm against torch.optim / torch.nn.utils.
if [[ -f $ROOT/tests/parity/test_optim_torch.py ]]; then
  export FLAME_LIBRARY=$BUILD_DIR/libflame.so
  run "optimizer parity (tests/parity/test_optim_torch.py)" "$LOG_DIR/optim-torch.log" \
    python3 "$ROOT/tests/parity/test_optim_torch.py"
fi
# f8 conversions (f32/f64/f16/bf16 -> f8 -> f32) bit for bit against torch.float8_e4m3fn / e5m2.
if [[ -f $ROOT/tests/parity/test_f8_torch.py ]]; then
  export FLAME_LIBRARY=$BUILD_DIR/libflame.so
  run "f8 parity (tests/parity/test_f8_torch.py)" "$LOG_DIR/f8-torch.log" \
    python3 "$ROOT/tests/parity/test_f8_torch.py"
fi

# Quote-able summary: the ctest result lines and timings.
{
  echo
  echo "=== summary ($((SECONDS - T0))s, logs in $LOG_DIR)"
  for s in "${summary[@]}"; do echo "  $s"; done
  for f in "$LOG_DIR"/ctest-cold.log "$LOG_DIR"/ctest-warm.log; do
    [[ -f $f ]] || continue
    echo "  $(basename "$f"): $(grep -E '^[0-9]+% tests passed' "$f" || echo 'no ctest summary line')"
    grep -E 'Total Test time' "$f" | sed 's/^/    /'
    grep -E '\(Failed\)|\(SEGFAULT\)|\(Subprocess aborted\)|\(Timeout\)|Not Run' "$f" | sed 's/^/    /'
  done
  if ((${#failures[@]})); then
    echo "  FAILED: ${failures[*]}"
  else
    echo "  all steps passed"
  fi
} | tee "$LOG_DIR/summary.txt"

((${#failures[@]} == 0))
