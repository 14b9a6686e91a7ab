#!/usr/bin/env bash
# Build bubo's wheel into DIST (default: dist/) and check it in a fresh virtual environment.
#
# One x86-64 wheel runs on every x86-64 CPU: the library is compiled for the baseline ISA and
# the AVX2 / AVX-512 kernels are chosen at run time from cpuid; on arm64 NEON is the baseline.
# CUDA is off unless BUBO_CUDA=ON is set in the environment.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
dist="${1:-$root/dist}"
mkdir -p "$dist"
python -m pip wheel --no-deps -w "$dist" "$root"
wheel="$(ls -t "$dist"/bubo-*.whl | head -1)"
echo "built $wheel"
if [ "${SKIP_SMOKE:-0}" != 1 ]; then
  bash "$here/smoke.sh" "$wheel"
fi
