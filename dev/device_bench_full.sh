#!/usr/bin/env bash
# The whole benchmark suite on a 2-GPU machine in one call: T0, T1 and T2 on GPU 0 beside T3 (with
# torch.compile), T4 and T5 on GPU 1, then a kernel profile of the GPT-2 step on GPU 1 (bench/
# profile_gpt2.py). Results: $OUT/bench_a/bench.json, $OUT/bench_b/bench.json, logs in all_logs.txt.
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
(CUDA_VISIBLE_DEVICES=0 timeout ${LIMIT_A:-430} python3 bench/run.py --tiers T0,T1,T2 --no-results-md --out "$OUT/bench_a" \
   > "$OUT/bench_a.log" 2>&1; echo "bench T0-T2 rc=$?" >> "$OUT/bench_a.log") &
(export CUDA_VISIBLE_DEVICES=1
 timeout ${LIMIT_B:-300} python3 bench/run.py --tiers T3,T4,T5 --no-results-md --out "$OUT/bench_b" > "$OUT/bench_b.log" 2>&1
 echo "bench T3-T5 rc=$?" >> "$OUT/bench_b.log"
 timeout 120 python3 bench/profile_gpt2.py --steps 3 --top 25 > "$OUT/profile.log" 2>&1; echo "profile rc=$?" >> "$OUT/profile.log") &
wait
grep -hE "^T[0-5]|geometric|rc=" "$OUT"/bench_a.log "$OUT"/bench_b.log | cut -c1-150
grep -v "^\s*$" "$OUT/profile.log" | grep -v Warning | cut -c1-160 | tail -45
fold_logs; rm -f "$OUT"/*.log; echo "total $((SECONDS - T0)) s"
