#!/usr/bin/env bash
# scripts/s5-final-a.sh OUTDIR -- session 5, final H200 check, part A (~290 s): every GPU test (xdist), the
# per-GEMM benchmark against cuBLAS (scripts/gemm-bench.py) and the per-stage timelines of the MLP steps and
# the examples slower than torch.compile (scripts/gemm-profile.py). Part B is scripts/s5-final-b.sh.
set -u
top=${1:?usage: scripts/s5-final-a.sh OUTDIR}
out="$top/w"
mkdir -p "$out"
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/gpu.txt" 2>&1
GPU_CHECK_TESTS_WORKERS=10 GPU_CHECK_TESTS_TIMEOUT=300 bash scripts/gpu-check "$out/check" env install tests > "$out/check.txt" 2>&1
tail -n 12 "$out/check.txt"
grep -E "^(FAILED|ERROR)" "$out/check/tests.log" | head -40
timeout 100 python scripts/gemm-bench.py --out "$out/gemm-bench.json" > "$out/gemm-bench.txt" 2>&1
echo "gemm-bench rc=$?" >> "$out/gemm-bench.txt"; cat "$out/gemm-bench.txt" | tail -n 25
timeout 100 python scripts/gemm-profile.py --examples small,medium,mixed_precision,tiny_online --out "$out/profile" > "$out/profile.txt" 2>&1
echo "profile rc=$?" >> "$out/profile.txt"; grep -v "^      g" "$out/profile.txt" | head -60
timeout 60 python scripts/epilogue-ab.py 1 16 --vector-regs=256 --examples medium --out "$out/epi256" > "$out/epi256.txt" 2>&1
echo "epi256 rc=$?" >> "$out/epi256.txt"; grep -E "step|rc=" "$out/epi256.txt" | head
timeout 60 python scripts/cluster-variants.py --out "$out/cluster-variants.json" > "$out/cluster-variants.txt" 2>&1
echo "cluster variants rc=$?" >> "$out/cluster-variants.txt"; tail -n 14 "$out/cluster-variants.txt"
tar czf "$top/all.tgz" -C "$out" . && ls -la "$top"
