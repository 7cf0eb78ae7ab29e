#!/usr/bin/env bash
# A focused device run: build, profile a GPT-2 step (FLAME vs PyTorch kernels), then side by side
# a gtest filter ($FILTER) and the examples given in $EXAMPLES (train_diffusion, lora). Logs are
# folded into $OUT/all_logs.txt (the device returns a limited number of files).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export FLAME_REQUIRE_GPU=1
T0=$SECONDS
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLAME_BUILD_TESTS=ON -DFLAME_TESTS_IN_ALL=ON > "$OUT/configure.log" 2>&1
cmake --build build -j16 --target flame flame_gpu_tests flame_gpt2_bench train_gpt train_diffusion lora_finetune > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "built in $((SECONDS - T0)) s"
export FLAME_LIBRARY=$PWD/build/libflame.so.1
if [[ ${PROFILE:-1} == 1 ]]; then
  timeout 150 python3 bench/profile_gpt2.py --steps 3 --top ${TOP:-22} > "$OUT/profile.log" 2>&1; echo "profile rc=$?"
  grep -v "^\s*$" "$OUT/profile.log" | grep -v Warning | cut -c1-170
fi
timeout ${GTEST_TIMEOUT:-240} ./build/tests/gpu/flame_gpu_tests --gtest_brief=1 --gtest_filter="${FILTER:-*}" > "$OUT/gtest.log" 2>&1 &
(cd build/examples && for ex in ${EXAMPLES:-}; do case $ex in
   diffusion) timeout 150 ./train_diffusion --out "$OUT/diffusion" > "$OUT/ex_diffusion.log" 2>&1; echo "rc=$?" >> "$OUT/ex_diffusion.log";;
   lora) timeout 100 ./train_gpt --steps 600 --save "$OUT/base.safetensors" > "$OUT/ex_lora_base.log" 2>&1; echo "rc=$?" >> "$OUT/ex_lora_base.log"
         timeout 100 ./lora_finetune --base "$OUT/base.safetensors" --out "$OUT/adapters.safetensors" > "$OUT/ex_lora.log" 2>&1; echo "rc=$?" >> "$OUT/ex_lora.log"
         rm -f "$OUT"/*.safetensors*;;
 esac; done) &
wait
echo "done at $((SECONDS - T0)) s"
grep -E "^\[  (PASSED|FAILED)  \]|tests from .* ran" "$OUT/gtest.log"
grep -B3 -A14 "Failure$" "$OUT/gtest.log" | head -80
for f in "$OUT"/ex_*.log; do [[ -f $f ]] && { echo "== $f"; tail -6 "$f" | cut -c1-300; }; done
ls "$OUT"/diffusion* 2>/dev/null
for f in "$OUT"/*.log; do echo "=================== $f"; cat "$f"; done > "$OUT/all_logs.txt" 2>/dev/null
rm -f "$OUT"/*.log
