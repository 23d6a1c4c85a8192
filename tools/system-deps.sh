#!/usr/bin/env bash
# Install the system packages graphsurgeon needs when they are missing: graphviz (`dot`),
# Chromium with a font (browser test) and a C++ compiler (Inductor's CPU code: torch.compile and
# AOTInductor packages, tests/test_deploy.py and tutorial 10). Idempotent; needs root and apt-get to install.
set -euo pipefail

missing=()
command -v dot >/dev/null 2>&1 || missing+=(graphviz)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "graphsurgeon needs these system packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
