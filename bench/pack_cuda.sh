#!/bin/bash
# Bundles built binaries for a GPU machine that has a CUDA driver but not this
# machine's toolchain or packages: the binaries (stripped) and a lib/ folder
# with the shared libraries they link that such a machine may lack (libfmt,
# libpcre2-8, libcpp-httplib, brotli, libcudart) — the BIN_DIR layout the
# bench/run_*_cuda.sh scripts expect. cuBLASLt is left out (hundreds of MB):
# the GPU machine's CUDA or PyTorch install provides it.
#   bench/pack_cuda.sh OUT.tar.xz BINARY...
# Example:
#   bench/pack_cuda.sh /tmp/quern-cuda.tar.xz build/quern build/tests/cuda/test_session_cuda
#   (on the GPU machine) mkdir b && tar -C b -xJf quern-cuda.tar.xz && bench/run_decode_cuda.sh b out
set -euo pipefail
usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
[ $# -ge 2 ] || { usage >&2; exit 2; }
out=$1
shift
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
for b in "$@"; do
  [ -f "$b" ] || { echo "pack_cuda: no such binary: $b (build it first: bash tools/build.sh)" >&2; exit 1; }
  cp "$b" "$stage/"
  strip "$stage/$(basename "$b")"
  # The libraries of the list above that this binary links, as resolved here.
  ldd "$b" | awk '$2 == "=>" && $1 ~ /^lib(fmt|pcre2-8|cpp-httplib|brotli(dec|enc|common)|cudart)\.so/ {print $3}' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
done
# One xz stream with a window larger than a binary: the CUDA kernels every
# binary carries are stored once (quern + three test binaries: ~25 MiB).
tar -C "$stage" -cf - . | xz -T1 --lzma2=preset=6,dict=400MiB >"$out"
[ -t 1 ] && echo "pack_cuda: $(du -h "$out" | cut -f1) in $out: $(cd "$stage" && ls | grep -v '^lib$' | tr '\n' ' ')lib/($(ls "$stage/lib" | wc -l) libraries)"
exit 0
