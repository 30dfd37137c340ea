#!/usr/bin/env bash
# Installs every Debian package that building and testing TensorFold needs. Idempotent; run as root
# (or with sudo available) on Debian 12.
set -euo pipefail
pkgs=(
  cmake ninja-build g++ git pkg-config
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-format
  libpcre2-dev libicu-dev python3-jinja2
  libcpp-httplib-dev
  libopenmpi-dev openmpi-bin
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Node.js and npm run the server tests with the official openai client (any Node >= 18).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
echo "setup: all ${#pkgs[@]} packages present"
