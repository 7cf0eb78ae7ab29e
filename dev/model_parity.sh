#!/usr/bin/env bash
# The model layer against diffusers / transformers on one GPU, in one device call: a Release build
# of libflame and flame_model_run (configured when build-gpu/ is missing), then
# tests/models/check_model_parity.py over CASES (default: all), without and with checkpointing.
#   CASES=clip_l,t5_gated_gelu CHECKPOINT="0 1" bash dev/model_parity.sh
# Needs .ref/diffusers (carry it) for the diffusers classes; logs under $OUT when set.
set -uo pipefail
export FLAME_REQUIRE_GPU=1
export PYTHONPATH="$PWD/.ref${PYTHONPATH:+:$PYTHONPATH}"
[ -f build-gpu/build.ninja ] || cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build-gpu --target flame_model_run -j"$(nproc)" 2>&1 | grep -E "error|FAILED" | head -20
log="${OUT:-/tmp}/model_parity.log"
rc=0
for cp in ${CHECKPOINT:-0 1}; do
  python3 tests/models/check_model_parity.py --tool build-gpu/tests/models/flame_model_run \
    ${CASES:+--cases "$CASES"} --checkpoint "$cp" >> "$log" 2>&1 || rc=1
done
grep -E "FAIL|PASS|runs pass|Error|error" "$log" | head -${LINES_SHOWN:-60}
exit $rc
