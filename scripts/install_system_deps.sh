#!/usr/bin/env bash
# Installs the Debian packages the build, the tests and the demo use (gRPC C++ for
# the native module: the three packages cmake/grpc.cmake names; PostgreSQL
# server, Chromium for the dashboard tests, Redis for the PS benchmark baseline).
# Does nothing when they are all present; needs root (or sudo) otherwise.
set -euo pipefail

packages=(libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc postgresql chromium redis-server)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then sudo="sudo"; else
    echo "missing system packages: ${missing[*]} (install them as root: apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi
echo "installing system packages: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
