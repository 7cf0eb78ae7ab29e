#!/usr/bin/env bash
# Regenerates packaging/abi/libflame.abi.xml from a fresh build of libflame.so.
#
# Usage: packaging/abi/update-baseline.sh [path/to/libflame.so]
#   Without an argument it configures and builds build-abi/ (RelWithDebInfo: abidw needs DWARF).
# Run it (1) while the API is still being written, to follow the header, and (2) for an intended
# ABI change, together with the FLAME_ABI_VERSION / SOVERSION bump (see packaging/ABI.md).
# Commit the XML with the change that caused it.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
command -v abidw >/dev/null || { echo "abidw not found (apt-get install abigail-tools)" >&2; exit 2; }

if [[ $# -ge 1 ]]; then
  lib=$(readlink -f "$1")
else
  export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S "$root" -B "$root/build-abi" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DFLAME_BUILD_TESTS=OFF -DFLAME_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$root/build-abi" --target flame
  lib=$(readlink -f "$root/build-abi/libflame.so")
fi

# Locations must stay in the XML (--short-locs: file names only): abidiff's --headers-dir filter
# treats a type without a location as private and would hide changes to public structs.
abidw --no-corpus-path --no-comp-dir-path --short-locs --exported-interfaces-only \
      --headers-dir "$root/include" --drop-private-types \
      --out-file "$here/libflame.abi.xml" "$lib"
n=$(grep -c '<elf-symbol name=.flame_' "$here/libflame.abi.xml" || true)
echo "wrote packaging/abi/libflame.abi.xml from $lib ($n flame_* functions)"
"$here/check.sh" "$lib"
