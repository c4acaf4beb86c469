#!/usr/bin/env bash
# scripts/s5-call1.sh OUTDIR -- session 5, first H200 call (~6 min): every GPU test (xdist), the cheap
# dequant arithmetic on and off (its GPU tests, then decode int8/int4 timed), and the per-stage timeline
# of small and medium with the committed defaults (the baseline of this session's GEMM work).
set -u
top=${1:?usage: scripts/s5-call1.sh OUTDIR}
out="$top/w"
mkdir -p "$out"
export PYTHONPATH=$PWD
GPU_CHECK_TESTS_WORKERS=10 GPU_CHECK_TESTS_TIMEOUT=330 bash scripts/gpu-check "$out/check" env install tests > "$out/check.txt" 2>&1
tail -n 30 "$out/check.txt"
TKX_CHEAP_DEQUANT=1 timeout 150 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_dequant_codegen.py tests/test_decode.py > "$out/dq-tests.txt" 2>&1
echo "dq tests rc=$?" >> "$out/dq-tests.txt"; tail -n 5 "$out/dq-tests.txt"
timeout 120 python scripts/decode-tkx-time.py --out "$out/dq-off.json" --quants int8,int4 > "$out/dq-off.txt" 2>&1
echo "rc=$?" >> "$out/dq-off.txt"; tail -n 6 "$out/dq-off.txt"
TKX_CHEAP_DEQUANT=1 timeout 120 python scripts/decode-tkx-time.py --out "$out/dq-on.json" --quants int8,int4 > "$out/dq-on.txt" 2>&1
echo "rc=$?" >> "$out/dq-on.txt"; tail -n 6 "$out/dq-on.txt"
timeout 90 python scripts/gemm-profile.py --examples small,medium --out "$out/profile" > "$out/profile.txt" 2>&1
echo "profile rc=$?" >> "$out/profile.txt"; cat "$out/profile.txt"
tar czf "$top/all.tgz" -C "$out" . && ls -la "$top"
