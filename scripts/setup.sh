#!/usr/bin/env bash
# Installs what building and testing FLAME needs on Debian/Ubuntu, and checks for the CUDA toolkit.
# The README's first command runs it; .ci/run runs the same script (with the CI groups), so CI
# proves the README's path.
#
#   bash scripts/setup.sh                  # the build and test dependencies
#   bash scripts/setup.sh packaging        # + what .ci/run's package checks use
#   bash scripts/setup.sh sanitizers       # + clang and its sanitizer/libFuzzer runtimes
#   bash scripts/setup.sh --check [GROUP...]   # (or --dry-run) list what is missing, install nothing;
#                                              # exit status 1 when something is missing
#
# What it does: checks each requirement (tools by their command, libraries by dpkg's status), prints
# exactly what it will install, runs `apt-get update` and `apt-get install --no-install-recommends`
# for those packages as root or through sudo (a clear error without either), and does nothing when
# everything is present. It cannot install CUDA: without the toolkit it says what to do and exits 1.
# Not Debian/Ubuntu (no apt-get/dpkg-query): it lists the requirements it cannot verify and leaves
# it to CMake, whose error for each missing dependency names the package to install.
#
# Why install the header-only pieces (nlohmann-json, dlpack.h) rather than vendor them: both are
# packaged by Debian and Ubuntu, which keep them patched; a vendored copy is one more thing for us to
# update and for distributions to strip again (Debian's policy forbids embedded copies, lintian flags
# them); they are build-only (nothing of them is installed with FLAME); and this script installs
# them in the same first command as the compiler. GoogleTest is needed by the tests only and is
# packaged likewise. nccl.h (types only; libnccl is dlopen'ed) must match the NCCL a user runs, so it
# comes from NVIDIA's packages or the CUDA toolkit's directory, not from a copy kept here.
# libpng-dev, libjpeg-dev (libjpeg-turbo) and libwebp-dev: the image codecs of flame-train
# (tools/flame-train); without them CMake leaves the trainer out and builds the library as before.
# flame-train's tokenizers link SentencePiece (T5's spiece.model, through Google's own library so
# that ids match transformers) and utf8proc (Unicode tables for CLIP's text cleanup), both packaged.
set -euo pipefail

usage() {
  sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

CHECK_ONLY=0
GROUPS_WANTED=(build)
for arg in "$@"; do
  case $arg in
    --check | --dry-run) CHECK_ONLY=1 ;;
    -h | --help) usage; exit 0 ;;
    packaging | sanitizers) GROUPS_WANTED+=("$arg") ;;
    *) echo "setup.sh: unknown argument '$arg' (expected --check, --dry-run, packaging, sanitizers or --help)" >&2; exit 2 ;;
  esac
done

have_cmd() { command -v "$1" >/dev/null 2>&1; }
# dpkg's own view: "install ok installed" (a removed package with config files left is not installed).
have_pkg() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]; }

# Requirement table: GROUP PACKAGE KIND PROBE. KIND cmd: PROBE is a command on PATH; pkg: the
# package itself must be installed (headers, CMake packages, static runtimes).
REQUIREMENTS=(
  "build cmake cmd cmake"
  "build ninja-build cmd ninja"
  "build gcc cmd gcc"
  "build g++ cmd g++"
  "build pkg-config cmd pkg-config"
  "build binutils cmd readelf"
  "build libdlpack-dev pkg -"
  "build nlohmann-json3-dev pkg -"
  "build libgtest-dev pkg -"
  "build libpng-dev pkg -"
  "build libjpeg-dev pkg -"
  "build libwebp-dev pkg -"
  "build libsentencepiece-dev pkg -"
  "build libutf8proc-dev pkg -"
  "packaging dpkg-dev cmd dpkg-architecture"
  "packaging file cmd file"
  "packaging gzip cmd gzip"
  "packaging lintian cmd lintian"
  "packaging rpm cmd rpmbuild"
  "packaging abigail-tools cmd abidiff"
  "sanitizers clang cmd clang++"
  "sanitizers libclang-rt-dev pkg -"
)

wanted_group() {
  local g
  for g in "${GROUPS_WANTED[@]}"; do [[ $g == "$1" ]] && return 0; done
  return 1
}

DEBIAN=1
have_cmd dpkg-query && have_cmd apt-get || DEBIAN=0

missing=()
for row in "${REQUIREMENTS[@]}"; do
  read -r group pkg kind probe <<<"$row"
  wanted_group "$group" || continue
  if [[ $kind == cmd ]]; then
    have_cmd "$probe" && continue
  elif (( DEBIAN )); then
    have_pkg "$pkg" && continue
  else
    continue  # not verifiable without dpkg: CMake's error names the package
  fi
  missing+=("$pkg")
done

# CMake >= 3.22: an older one counts as missing (the distribution's may be new enough).
CMAKE_MIN=3.22
cmake_too_old=""
if have_cmd cmake; then
  v=$(cmake --version | head -1 | awk '{print $3}')
  if ! printf '%s\n%s\n' "$CMAKE_MIN" "$v" | sort -V -C; then
    cmake_too_old=$v
    missing+=(cmake)
  fi
fi

# ---- the CUDA toolkit (not installable here: NVIDIA's repository or runfile) ----
problems=()
cuda_root=""
for d in "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")")" \
         "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
  if [[ -n $d && -f $d/include/nvrtc.h ]]; then cuda_root=$d; break; fi
done
if [[ -z $cuda_root ]]; then
  problems+=("no CUDA toolkit: none on PATH (nvcc), in \$CUDA_HOME, \$CUDA_PATH or /usr/local/cuda.
    FLAME needs the CUDA 12 or 13 toolkit to build (the NVRTC and cuBLASLt headers and libraries).
    Install it from NVIDIA's repository (https://developer.nvidia.com/cuda-downloads, then
    apt-get install cuda-toolkit-13-0) or with NVIDIA's runfile, or point CUDA_HOME at it.
    No GPU and no driver are needed to build and to run the CPU tests.")
else
  for f in include/nvrtc.h include/cublasLt.h; do
    [[ -f $cuda_root/$f || -n $(find -L "$cuda_root/" -path "*/$f" -print -quit 2>/dev/null) ]] ||
      problems+=("the CUDA toolkit in $cuda_root lacks $f: install its cuBLAS/NVRTC development parts (cuda-libraries-dev-<major>-<minor>)")
  done
  # nccl.h: types and prototypes only (libnccl.so.2 is dlopen'ed); CMake looks next to the toolkit's
  # headers and in $NCCL_HOME/include.
  if [[ ! -f $cuda_root/include/nccl.h && ! -f ${NCCL_HOME:-/nonexistent}/include/nccl.h && ! -f /usr/include/nccl.h ]]; then
    if (( DEBIAN )) && [[ -n $(apt-cache policy libnccl-dev 2>/dev/null | sed -n 's/^ *Candidate: //p' | grep -v '(none)') ]]; then
      missing+=(libnccl-dev)
    else
      problems+=("no nccl.h (NCCL's header: FLAME needs it to build, not to run): install libnccl-dev from
    NVIDIA's CUDA repository, set NCCL_HOME to an NCCL tree, or configure with -DFLAME_NCCL_INCLUDE_DIR=<dir>")
    fi
  fi
fi

# ---- report ----
if [[ -n $cuda_root ]]; then
  echo "setup: CUDA toolkit: $cuda_root"
fi
if (( ! DEBIAN )); then
  echo "setup: not Debian/Ubuntu (no apt-get or dpkg-query): install the equivalents yourself if CMake asks;"
  echo "       the build needs CMake >= $CMAKE_MIN, Ninja, a C/C++17 compiler, pkg-config, dlpack.h,"
  echo "       nlohmann-json >= 3 and GoogleTest (for the tests); libpng, libjpeg and libwebp headers for flame-train."
fi
if (( ${#missing[@]} )); then
  if [[ -n $cmake_too_old ]]; then echo "setup: cmake $cmake_too_old is older than $CMAKE_MIN"; fi
  if (( ! DEBIAN )); then
    echo "setup: missing commands: ${missing[*]}" >&2
    for p in "${problems[@]}"; do echo "setup: $p" >&2; done
    exit 1
  fi
fi
if (( CHECK_ONLY )); then
  if (( ${#missing[@]} )); then
    echo "setup: missing (would install with apt-get): ${missing[*]}"
  else
    echo "setup: all packages present (groups: ${GROUPS_WANTED[*]})"
  fi
  for p in "${problems[@]}"; do echo "setup: $p"; done
  if (( ${#missing[@]} == 0 && ${#problems[@]} == 0 )); then exit 0; fi
  exit 1
fi

if (( ${#missing[@]} )); then
  SUDO=()
  if (( EUID != 0 )); then
    if have_cmd sudo; then
      SUDO=(sudo)
    else
      echo "setup: missing ${missing[*]}, and this is neither root nor has sudo to install them." >&2
      echo "       As root: apt-get update && apt-get install --no-install-recommends ${missing[*]}" >&2
      exit 1
    fi
  fi
  echo "setup: installing with ${SUDO[*]:+${SUDO[*]} }apt-get: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [[ -n $cmake_too_old ]]; then
    v=$(cmake --version | head -1 | awk '{print $3}')
    if ! printf '%s\n%s\n' "$CMAKE_MIN" "$v" | sort -V -C; then
      echo "setup: this distribution's CMake is $v, older than $CMAKE_MIN: install a newer one" \
           "(Kitware's apt repository, https://apt.kitware.com, or pip install cmake)" >&2
      exit 1
    fi
  fi
  echo "setup: installed ${missing[*]}"
else
  echo "setup: all packages present (groups: ${GROUPS_WANTED[*]}): nothing to install"
fi
if (( ${#problems[@]} )); then
  for p in "${problems[@]}"; do echo "setup: $p" >&2; done
  exit 1
fi
