#!/usr/bin/env bash
# Compares a built libflame.so with the stored ABI baseline (libabigail) and fails on any change
# that is not a pure addition: removed or re-versioned functions, changed signatures, changed
# layouts of public structs or enums. Added flame_* functions are reported and accepted.
#
# Usage: packaging/abi/check.sh [path/to/libflame.so]      (default: build/libflame.so)
# Needs abidiff (Debian: abigail-tools). Types defined only inside the library (the structs behind
# the opaque handles) are private: only what include/flame.h exposes is compared.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
lib=$(readlink -f "${1:-$root/build/libflame.so}")
baseline=$here/libflame.abi.xml

command -v abidiff >/dev/null || { echo "abi check: abidiff not found (apt-get install abigail-tools)" >&2; exit 2; }
[[ -f $lib ]] || { echo "abi check: no library at $lib (build first)" >&2; exit 2; }
[[ -f $baseline ]] || { echo "abi check: no baseline at $baseline (run packaging/abi/update-baseline.sh)" >&2; exit 2; }

opts=(--headers-dir2 "$root/include" --drop-private-types --exported-interfaces-only)
full=$(mktemp) report=$(mktemp)
trap 'rm -f "$full" "$report"' EXIT

# The full report, additions included, for the log.
set +e
abidiff "${opts[@]}" "$baseline" "$lib" > "$full" 2>&1
full_rc=$?
abidiff "${opts[@]}" --no-added-syms "$baseline" "$lib" > "$report" 2>&1
rc=$?
set -e

if (( rc == 0 )); then
  if (( full_rc == 0 )); then
    echo "abi check: $(basename "$lib") matches the baseline exactly"
  else
    echo "abi check: compatible; additions since the baseline:"
    grep -E "^\s*\[A\]|Added function|summary" "$full" | sed 's/^/  /' || true
  fi
  exit 0
fi

echo "abi check: FAILED for $lib against packaging/abi/libflame.abi.xml (abidiff status $rc:" \
     "$( ((rc & 1)) && echo -n 'error ')$( ((rc & 2)) && echo -n 'usage-error ')$( ((rc & 4)) && echo -n 'abi-change ')$( ((rc & 8)) && echo -n 'incompatible-change')" ")" >&2
cat "$report" >&2
cat >&2 <<'MSG'

If this change is intended, it is an ABI break: bump FLAME_ABI_VERSION in include/flame.h and in
CMakeLists.txt (the SOVERSION) and regenerate the baseline in the same commit:
  packaging/abi/update-baseline.sh
See packaging/ABI.md. Otherwise restore the old signatures/layouts and append instead.
MSG
exit 1
