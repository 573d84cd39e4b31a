#!/usr/bin/env bash
# Runs the given pytest arguments while two busy loops hold the CPU (issue #14: the end-to-end gate
# rolled back good kernels whenever other work shared the cores; these tests must not depend on an
# idle machine). Usage: .ci/under_load.sh PYTEST_ARGS...
set -uo pipefail
cd "$(dirname "$0")/.."
hogs=()
for _ in 1 2; do
    python3 -c 'while True: pass' &
    hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
.venv/bin/python -m pytest -q -m "" "$@"  # slow-marked tests included: the caller selects
