#!/usr/bin/env bash
# Installs what quern needs to build and test: Debian packages (compiler
# toolchain, libraries) and the PyPI packages the tests use. Safe to re-run.
set -euo pipefail
# install_debs [APT OPTIONS] -- PACKAGES: apt-get installs those not installed yet.
install_debs() {
  local opts=() missing=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  local SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "quern: installing Debian packages: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
}
install_debs -- build-essential cmake ninja-build ccache pkg-config \
  libfmt-dev libpcre2-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev libboost1.81-dev libspdlog-dev \
  libgtest-dev libgmock-dev libbenchmark-dev python3-pip libedit-dev
# The sanitizer job and the fuzz harnesses (tools/sanitize.sh, tools/fuzz.sh):
# clang with its sanitizer and libFuzzer runtimes.
install_debs -- clang-16 libclang-rt-16-dev
# The web chat: marked and highlight.js are embedded in the binary at build
# time; Chromium and its WebDriver run its test (tests/python/webui_e2e.py).
# Without recommends: Chromium's would pull in a desktop's worth of packages.
install_debs --no-install-recommends -- libjs-marked libjs-highlight.js chromium chromium-driver
PY=(numpy gguf tokenizers==0.23.3 jinja2==3.1.6 openai==3.57.0 anthropic==2.17.0 safetensors==0.8.0 llguidance==1.9.1 "jsonschema[format-nongpl]==4.26.0" selenium==4.51.0)  # tokenizers: the reference of tests/python/tok_diff.py (its Unicode tables are pinned in src/tokenizer); jinja2: of the chat-template tests; openai, anthropic: the clients of the server tests; safetensors: of the safetensors interop tests; llguidance: the reference of the token-mask test (tests/python/mask_diff.py); jsonschema with its format checkers: the validator of tests/python/schema_e2e.py; selenium: drives Chromium in tests/python/webui_e2e.py
if ! python3 -c "import numpy, gguf, tokenizers, jinja2, openai, anthropic, safetensors, llguidance, jsonschema, selenium, rfc3339_validator, rfc3986_validator, fqdn" >/dev/null 2>&1; then
  echo "quern: installing Python packages: ${PY[*]}" >&2
  python3 -m pip install -q --disable-pip-version-check "${PY[@]}" 2>&1 | grep -v "WARNING: Running pip as" || true
fi
