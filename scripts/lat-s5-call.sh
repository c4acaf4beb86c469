#!/usr/bin/env bash
# scripts/lat-s5-call.sh OUTDIR [PROBE_BUDGET_S] [PROBE_ARGS...] -- session 5, the lat helper's H200 call: the
# GPU tests of the grid barriers and tensor-map prefetch, then scripts/lat-probe.py (barrier alone, small and
# medium per variant, timelines).
set -u
out=${1:?usage: scripts/lat-s5-call.sh OUTDIR [PROBE_BUDGET_S] [PROBE_ARGS...]}
budget=${2:-105}
shift 2 || shift $#
mkdir -p "$out"
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
timeout 55 python -m pytest -q -m gpu -p no:cacheprovider tests/test_latency.py tests/test_codegen_gpu.py -k "barrier or arrives" > "$out/tests.txt" 2>&1
echo "tests rc=$?" >> "$out/tests.txt"
tail -n 8 "$out/tests.txt"
timeout $((budget + 25)) python scripts/lat-probe.py --out "$out" --budget-s "$budget" "$@" > "$out/probe.txt" 2>&1
echo "probe rc=$?" >> "$out/probe.txt"
cat "$out/probe.txt"
