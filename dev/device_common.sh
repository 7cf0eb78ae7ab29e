# Sourced by dev/device_final.sh and device_verify.sh (the two-GPU device runs): strict mode,
# $OUT for logs, FLAME_REQUIRE_GPU=1, a Release build of everything in build/ (-j32), the library and
# kernel cache for the Python drivers, and the gtest filter of the suites that need both GPUs.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export FLAME_REQUIRE_GPU=1
T0=$SECONDS
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLAME_BUILD_TESTS=ON -DFLAME_TESTS_IN_ALL=ON > "$OUT/configure.log" 2>&1
cmake --build build -j32 > "$OUT/build.log" 2>&1 || { grep -B5 -A20 "FAILED\|error:" "$OUT/build.log" | head -60; exit 1; }
echo "built in $((SECONDS - T0)) s"
export FLAME_LIBRARY=$PWD/build/libflame.so.1 FLAME_KERNEL_CACHE_DIR=$PWD/build/kernel-cache
MULTI='Dist*:Threads.*:DeviceFault.*'
# Folds every log into $OUT/all_logs.txt (the device returns a limited number of files).
fold_logs() {
  for f in "$OUT"/*.log "$@"; do [[ -f $f ]] && { echo "=================== $f"; cat "$f"; }; done > "$OUT/all_logs.txt"
}
