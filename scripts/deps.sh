#!/usr/bin/env bash
# Installs what the build and the tests need, with apt-get, only when something is missing.
# Idempotent: on a machine that has everything it does nothing.
set -euo pipefail
pkgs=(cmake g++ make libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
      python3 python3-numpy python3-pytest clang-format
      python3-venv python3-pip python3-setuptools python3-wheel  # pip install . (setup.py)
      pkg-config  # cpp-httplib's flags; tests/install's pkg-config build
      libopenblas-dev  # the CPU model's GEMMs
      libpcre2-dev  # the tokenizer's pre-tokenizer regexes
      libicu-dev  # the tokenizer's Unicode normalizers (NFC, NFKC, Lowercase, ...)
      libboost-dev  # the HTTP server's transport: Boost.Asio + Boost.Beast (header-only)
      libcpp-httplib-dev curl  # the HTTP client of the server's tests; its raw SSE test
      clang libclang-rt-14-dev)  # the fuzzers: libFuzzer, ASan, UBSan
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
