#!/usr/bin/env bash
# scripts/s5-final-b.sh OUTDIR -- session 5, final H200 check, part B (~260 s): the whole zoo against eager,
# CUDA-graphed eager and torch.compile (default and max-autotune) from one run (scripts/sync-bench).
set -u
top=${1:?usage: scripts/s5-final-b.sh OUTDIR}
out="$top/w"
mkdir -p "$out"
export PYTHONPATH=$PWD
timeout 330 python scripts/sync-bench --out "$out/sync" --variants barrier-grid,counters-grid,auto --workers 14 > "$out/sync.txt" 2>&1
echo "sync-bench rc=$?" >> "$out/sync.txt"; tail -n 30 "$out/sync.txt"
tar czf "$top/all.tgz" -C "$out" . && ls -la "$top"
