#!/bin/sh
# CPU test of scripts/flame-run: the environment of every rank, the rank prefix on stdout and stderr,
# a failing rank stopping the others, a forwarded SIGTERM, and usage errors. No GPU, no FLAME library:
# the ranks are small shell scripts.
#   tests/cpu/check_flame_run.sh path/to/flame-run
set -u
run=$1
work=$(mktemp -d "${TMPDIR:-/tmp}/check-flame-run.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

cat >"$work/env.sh" <<'RANK'
#!/bin/sh
echo "env RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT args=$*"
echo "err $RANK" >&2
RANK
# Rank 1 fails after a moment; the others wait for SIGTERM and report it.
cat >"$work/fail.sh" <<'RANK'
#!/bin/sh
if [ "$RANK" = 1 ]; then sleep 1; exit 3; fi
trap 'echo "rank $RANK got TERM"; exit 7' TERM
while :; do sleep 0.1; done
RANK
cat >"$work/wait.sh" <<'RANK'
#!/bin/sh
trap 'echo "rank $RANK got TERM"; exit 0' TERM
while :; do sleep 0.1; done
RANK
chmod +x "$work"/*.sh

# 1. Three local ranks of node 1 of 2: RANK 3..5, WORLD_SIZE 6, every line prefixed.
"$run" --nproc 3 --nnodes 2 --node-rank 1 --master-addr 10.1.2.3 --master-port 4321 "$work/env.sh" a "b c" >"$work/out" 2>&1
status=$?
[ $status = 0 ] || fail "env run exited $status"
for r in 3 4 5; do
  l=$((r - 3))
  grep -qx "\[rank $r\] env RANK=$r LOCAL_RANK=$l WORLD_SIZE=6 MASTER_ADDR=10.1.2.3 MASTER_PORT=4321 args=a b c" "$work/out" ||
    fail "rank $r's environment line is missing"
  grep -qx "\[rank $r\] err $r" "$work/out" || fail "rank $r's stderr line is missing"
done
[ "$(wc -l <"$work/out")" -eq 6 ] || fail "expected 6 lines, got: $(cat "$work/out")"

# 2. A failing rank: flame-run exits with its status soon, after stopping the others.
start=$(date +%s)
"$run" --nproc 3 "$work/fail.sh" >"$work/out" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
[ $status = 3 ] || fail "failing rank: exit status $status, expected 3"
[ $elapsed -le 8 ] || fail "failing rank: flame-run took ${elapsed}s"
grep -q "rank 1 (local rank 1) exited with status 3" "$work/out" || fail "the failing rank is not named: $(cat "$work/out")"
for r in 0 2; do grep -q "rank $r got TERM" "$work/out" || fail "rank $r was not stopped: $(cat "$work/out")"; done

# 3. SIGTERM to flame-run reaches every rank; flame-run exits 143.
"$run" --nproc 2 "$work/wait.sh" >"$work/out" 2>&1 &
launcher=$!
sleep 1
kill -s TERM $launcher
wait $launcher
status=$?
[ $status = 143 ] || fail "SIGTERM: exit status $status, expected 143"
for r in 0 1; do grep -q "rank $r got TERM" "$work/out" || fail "SIGTERM was not forwarded to rank $r: $(cat "$work/out")"; done

# 4. Usage errors: exit 2 with a message naming the option.
"$run" --nproc 0 "$work/env.sh" 2>"$work/err"; [ $? = 2 ] && grep -q -- "--nproc" "$work/err" || fail "--nproc 0 accepted"
"$run" --nproc 2 --node-rank 2 --nnodes 2 "$work/env.sh" 2>"$work/err"; [ $? = 2 ] && grep -q -- "--node-rank" "$work/err" || fail "--node-rank 2 of 2 accepted"
"$run" --nproc 2 --master-port 70000 "$work/env.sh" 2>"$work/err"; [ $? = 2 ] && grep -q -- "--master-port" "$work/err" || fail "port 70000 accepted"
"$run" --nproc 2 2>"$work/err"; [ $? = 2 ] || fail "no program accepted"

[ $failures = 0 ] && echo "flame-run: all checks passed"
[ $failures = 0 ]
