#!/usr/bin/env bash
# scripts/gemm-s4-lastk.sh OUTDIR  -- on the H200, from the repository root, about 85 s.
#
# Issue 12, session 4 (gemm2 helper): the whole small and medium steps (verified, then CUDA-graph replay,
# median of 9) with the split-K final in the last slice of each tile (target.SPLIT_K_LAST_SLICE) and the
# wgmma epilogue batch (gemm.WGMMA_EPILOGUE_BATCH) / L2 prefetch (gemm.WGMMA_EPILOGUE_PREFETCH) on and
# off, then the GPU tests of the last-slice final (bits equal to the separate final stage's, tile
# counters left at 0 after launches and graph replays). Writes OUTDIR/{gpu.txt, probe.json, probe.txt,
# pytest.txt}. Variants (scripts/gemm-s4-probe.py): "L1-tma" = the committed defaults (last slice on,
# epilogue batch 16, no prefetch); "+lastk=0" the separate final stage; "+epi=N" the batch; "+pf=1" the
# prefetch. "L1-tma+lastk=0+epi=8" is the code before this change.
set -u
out=${1:?usage: scripts/gemm-s4-lastk.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/gpu.txt" 2>&1
timeout 58 python scripts/gemm-s4-probe.py --steps --no-gemms --budget-s 50 \
    --variants "L1-tma+lastk=0+epi=8,L1-tma,L1-tma+epi=8" \
    --step-variants "L1-tma+lastk=0,L1-tma+epi=32,L1-tma+pf=1" \
    --out "$out/probe.json" > "$out/probe.txt" 2>&1
echo "probe rc=$?" >> "$out/probe.txt"
timeout 28 python -m pytest -q -x -p no:cacheprovider tests/test_wgmma_gpu.py -k last_slice > "$out/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$out/pytest.txt"
tail -n 12 "$out/probe.txt" "$out/pytest.txt"
