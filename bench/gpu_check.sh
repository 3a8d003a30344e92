#!/usr/bin/env bash
# The GPU run on a bare CUDA machine (torch, triton and cupy there; no ignis, no network).
#
# Installs the wheels carried in the checkout's ignored .whl/ folder (pyzmq,
# orjson and anything else that machine lacks; docs/gpu.md says how to make
# them) into a private directory, then runs bench/gpu_check.py with the given
# arguments. The table lands in bench/out/gpu_check.txt and in $OUT when set.
#
#   bash bench/gpu_check.sh [gpu_check.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.."
site="${IGNIS_WHEEL_SITE:-/tmp/ignis-site}"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        || { echo "gpu_check.sh: installing the carried wheels failed" >&2; exit 3; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader 2>/dev/null || true
export PYTHONUNBUFFERED=1
exec python3 bench/gpu_check.py "$@"
