#!/bin/bash
# Device call 2 of issue 12 (session 4): the committed defaults measured and verified. From the worktree root:
#   scripts/gemm-s4-device2.sh
# Writes 8 files under $OUT: gemm-s4-{gpu,bench,pytest,probe,profile}.{txt,json}.
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/gemm-s4-gpu.txt 2>&1
# 1. per GEMM of small and medium vs cuBLAS, and the steps, with the default options
timeout 70 python3 scripts/gemm-bench.py --out $OUT/gemm-s4-bench.json > $OUT/gemm-s4-bench.txt 2>&1
echo "bench rc $?" >> $OUT/gemm-s4-bench.txt
# 2. verification: the wgmma/TMA GPU tests and the zoo with default options (TMA is the default now)
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_wgmma_gpu.py tests/test_tma_gpu.py \
  tests/test_gpu.py -k "(not compile_verify_and_replay or default) and not torch_extension and not bench_compare" > $OUT/gemm-s4-pytest.txt 2>&1
echo "pytest rc $?" >> $OUT/gemm-s4-pytest.txt
# 3. the variants in one process: per GEMM and whole steps (the previous default: L0-cp.async+tiles=old)
timeout 95 python3 scripts/gemm-s4-probe.py --out $OUT/gemm-s4-probe.json --budget-s 80 --steps \
  --ablations splitk \
  --variants L1-tma,L0-tma,L1-cp.async,L0-cp.async+tiles=old --step-variants L1-tma+split_k=off \
  > $OUT/gemm-s4-probe.txt 2>&1
echo "probe rc $?" >> $OUT/gemm-s4-probe.txt
# 4. where the default steps' time goes (per-stage timeline)
timeout 40 python3 scripts/gemm-profile.py --examples medium,small --out /tmp/prof > $OUT/gemm-s4-profile.txt 2>&1
echo "profile rc $?" >> $OUT/gemm-s4-profile.txt
cp /tmp/prof/profile-auto.json $OUT/gemm-s4-profile.json 2>/dev/null
tail -4 $OUT/gemm-s4-pytest.txt
grep -E "step|GEMMs" $OUT/gemm-s4-bench.txt | cut -c1-150
grep -E "^(step|ERROR|done)" $OUT/gemm-s4-probe.txt | cut -c1-120
grep -E "stage|items" $OUT/gemm-s4-profile.txt | cut -c1-130 | head -40
