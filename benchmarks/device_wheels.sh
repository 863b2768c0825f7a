#!/usr/bin/env bash
# The wheels a device machine lacks, into .whl (git-ignored), before any device call: the device image has torch,
# cupy and triton but not stevedore (the backend registry), and nothing can be installed there from a registry.
# device_install.sh installs what .whl holds; the device tool carries it: run(..., carry=[".whl"]).
# (2026-12-07: a call without it failed at `import stevedore`, every step rc=1.)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps -d .whl stevedore pbr rich markdown-it-py mdurl pygments
# house_check.sh runs the GPU tests in parallel workers: pytest-xdist and execnet (the image has pytest)
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl pytest-xdist execnet
ls .whl
