# Sourced by tools/sanitize.sh and tools/fuzz.sh: configures BUILD_DIR with
# clang, AddressSanitizer + UBSan (every UB check fatal) and libFuzzer's
# coverage instrumentation, CUDA off. clang: $QUERN_CLANG (default clang-16).
configure_sanitized() {
  local b=$1 cc=${QUERN_CLANG:-clang-16}
  local san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQUERN_CUDA=OFF -DQUERN_FUZZ=ON \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="${cc/clang/clang++}" \
    -DCMAKE_CXX_FLAGS="$san -fsanitize=fuzzer-no-link -g1" -DCMAKE_C_FLAGS="$san -g1" \
    -DCMAKE_EXE_LINKER_FLAGS="$san" >/dev/null
}
