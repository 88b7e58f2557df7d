#!/usr/bin/env bash
# Installs what a Debian/Ubuntu machine lacks to build and run moetrain:
# Open MPI (mpicc, mpirun), libyaml (static library), zlib headers, g++, SentencePiece (spm_train,
# spm_encode and the Python module for scripts/tokenize_data.py and its test; the moetrain binary does
# not link it), clang (fuzz targets), matplotlib for scripts/plot.py (the system python3's:
# Debian's python3-matplotlib).
# `deps.sh --check` only reports what building needs (exit 1 when something is missing);
# `deps.sh --plot` installs only what scripts/plot.py needs (`make run` draws the run).
set -u
missing=()
install() {
  [ ${#missing[@]} -eq 0 ] && exit 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "deps: installing ${missing[*]}"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { echo "deps: apt-get install ${missing[*]} failed; install them by hand" >&2; exit 1; }
  exit 0
}
has_matplotlib() { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1; }
if [ "${1:-}" = "--plot" ]; then
  has_matplotlib || missing+=(python3-matplotlib)
  install
fi
command -v mpicc >/dev/null 2>&1 || missing+=(libopenmpi-dev openmpi-bin)
compgen -G "/usr/lib/*/libyaml.a" >/dev/null || [ -f /usr/lib/libyaml.a ] || [ -f /usr/local/lib/libyaml.a ] || missing+=(libyaml-dev)
[ -f /usr/include/zlib.h ] || missing+=(zlib1g-dev)
command -v g++ >/dev/null 2>&1 || missing+=(g++)  # C++20: the tests that run CUDA kernels' source on the CPU
if [ "${1:-}" = "--check" ]; then  # what building needs (make runs this before compiling)
  [ ${#missing[@]} -eq 0 ] && exit 0
  echo "deps: missing packages: ${missing[*]}" >&2
  exit 1
fi
# SentencePiece: for scripts/tokenize_data.py and its test, not for building (GPU machines build without it)
command -v spm_train >/dev/null 2>&1 || missing+=(sentencepiece)
{ [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import sentencepiece' >/dev/null 2>&1; } || missing+=(python3-sentencepiece)
# matplotlib: for scripts/plot.py and its test
has_matplotlib || missing+=(python3-matplotlib)
if [ "${1:-}" = "--fuzz" ]; then
  command -v clang >/dev/null 2>&1 || missing+=(clang)
  compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer*.a" >/dev/null || missing+=(libclang-rt-14-dev)
fi
install
