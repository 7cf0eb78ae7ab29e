#!/usr/bin/env bash
# Tests scripts/setup.sh's detection and what it would install, without installing anything: a fake
# dpkg-query (on PATH first) reports the packages named in FAKE_MISSING as not installed and all
# others as installed; a fake apt-get records its arguments instead of installing.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FAKE=$(mktemp -d)
trap 'rm -rf "$FAKE"' EXIT
cat >"$FAKE/dpkg-query" <<'SH'
#!/bin/sh
pkg=$(eval echo "\${$#}")
for m in $FAKE_MISSING; do
  if [ "$m" = "$pkg" ]; then echo "dpkg-query: no packages found matching $pkg" >&2; exit 1; fi
done
printf 'install ok installed'
SH
cat >"$FAKE/apt-get" <<'SH'
#!/bin/sh
echo "apt-get $*" >>"$FAKE_LOG"
SH
chmod +x "$FAKE/dpkg-query" "$FAKE/apt-get"
export PATH="$FAKE:$PATH" FAKE_LOG="$FAKE/apt.log"
fails=0
check() {  # check NAME EXPECTED_RC EXPECTED_OUTPUT_REGEX CMD...
  local name=$1 want_rc=$2 want=$3; shift 3
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if [[ $rc != "$want_rc" ]] || ! grep -Eq -- "$want" <<<"$out"; then
    echo "FAIL $name: exit $rc (want $want_rc), output:"; sed 's/^/    /' <<<"$out"; fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}
# The tool probes (cmake, ninja, g++, ...) see the real machine; the build's own tests run where they are present.
FAKE_MISSING="" check "all present" 0 "all packages present" bash "$ROOT/scripts/setup.sh" --check
FAKE_MISSING="libgtest-dev nlohmann-json3-dev" check "two missing" 1 \
  "^setup: missing \(would install with apt-get\): nlohmann-json3-dev libgtest-dev$" bash "$ROOT/scripts/setup.sh" --dry-run
FAKE_MISSING="libclang-rt-dev libdlpack-dev" check "group sanitizers" 1 \
  "missing \(would install with apt-get\): libdlpack-dev( [a-z-]+)* libclang-rt-dev$" bash "$ROOT/scripts/setup.sh" --check sanitizers
FAKE_MISSING="libclang-rt-dev" check "group not asked for" 0 "all packages present" bash "$ROOT/scripts/setup.sh" --check
check "unknown argument" 2 "unknown argument 'bogus'" bash "$ROOT/scripts/setup.sh" bogus
if (( EUID == 0 )); then
  rm -f "$FAKE_LOG"
  FAKE_MISSING="libdlpack-dev" check "installs as root" 0 "installing with apt-get: libdlpack-dev" bash "$ROOT/scripts/setup.sh"
  grep -qx "apt-get install -y -qq --no-install-recommends libdlpack-dev" "$FAKE_LOG" ||
    { echo "FAIL apt-get was not called as expected: $(cat "$FAKE_LOG" 2>/dev/null)"; fails=$((fails + 1)); }
  rm -f "$FAKE_LOG"
  FAKE_MISSING="" check "nothing to install" 0 "nothing to install" bash "$ROOT/scripts/setup.sh"
  [[ ! -f $FAKE_LOG ]] || { echo "FAIL apt-get ran with nothing missing"; fails=$((fails + 1)); }
else
  echo "skip the install checks (not root)"
fi
(( fails == 0 )) && echo "setup.sh: all checks passed"
(( fails == 0 ))
