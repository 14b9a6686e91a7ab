#!/usr/bin/env bash
# Debian packages the test suite needs beyond Python: the arm64 cross compiler and qemu-user
# for the NEON kernel tests (tests/native/test_neon.py), Chromium and its WebDriver for the chat
# page's tests (tests/webui/), ccache (tests/test_wheel.py builds the wheel again in a fresh
# isolated environment: from ccache's copy of the install's objects). Installs only what is missing.
set -euo pipefail
need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
command -v ccache >/dev/null || need+=(ccache)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
