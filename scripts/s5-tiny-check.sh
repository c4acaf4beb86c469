#!/usr/bin/env bash
# scripts/s5-tiny-check.sh OUTDIR -- session 5: tiny GEMMs on wmma (tkx.target.WGMMA_MIN_MACS) on the H200 (~80 s):
# the GPU tests of the examples whose GEMMs changed (mixed_precision, gpt_block, llama_block: compile, verify,
# replay; TMA/wgmma with the threshold at 0) and their step times with the new default.
set -u
out=${1:?usage: scripts/s5-tiny-check.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH=$PWD
pip install -q --no-deps --no-index wheels/*.whl > /dev/null 2>&1
timeout 150 python -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_gpu.py tests/test_tma_gpu.py tests/test_wgmma_gpu.py \
    -k "mixed_precision or gpt_block or llama_block or transformer" > "$out/tests.txt" 2>&1
echo "tests rc=$?" >> "$out/tests.txt"; tail -n 6 "$out/tests.txt"
timeout 90 python scripts/s5-arch-probe.py --out "$out/arch-probe.json" mixed_precision,gpt_block,llama_block > "$out/probe.txt" 2>&1
echo "probe rc=$?" >> "$out/probe.txt"; cat "$out/probe.txt"
