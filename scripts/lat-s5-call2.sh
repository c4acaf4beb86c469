#!/usr/bin/env bash
# scripts/lat-s5-call2.sh OUTDIR -- session 5, the lat helper's second H200 call: the barrier alone over
# 132..1056 blocks (COUNTER_BARRIER_MAX_BLOCKS), then small and medium before (generation barrier, split
# rule of 4 steps per slice) and with the new defaults (timelines), a few zoo examples before / after, and
# the tensor-map prefetch and split rule alone.
set -u
out=${1:?usage: scripts/lat-s5-call2.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH=$PWD
B="bar=generation,pf=0,msteps=4"
N="bar=auto,pf=0,msteps=2"
V="small:$B:t;small:$N:t;medium:$B;medium:$N:t"
for ex in cnn_digits gpt_block llama_block mixed_precision tiny_online online; do V="$V;$ex:$B;$ex:$N"; done
V="$V;small:bar=auto,pf=1,msteps=2;small:bar=auto,pf=0,msteps=4;medium:bar=auto,pf=1,msteps=2;small:bar=generation,pf=0,msteps=2"
timeout 80 python scripts/lat-probe.py --out "$out" --budget-s 60 --barrier-blocks 132,264,396,528,1056 \
    --examples small,medium --variants "$V" > "$out/probe.txt" 2>&1
echo "probe rc=$?" >> "$out/probe.txt"
cat "$out/probe.txt"
