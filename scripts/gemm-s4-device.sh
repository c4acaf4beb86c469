#!/bin/bash
# One device call of issue 12 (session 4): the variant probe, ncu on one GEMM kernel, its SASS, GPU tests.
# Usage (from the worktree root on the device machine): scripts/gemm-s4-device.sh PROBE_S NCU_S TEST_S [pytest args]
# Writes at most 6 files under $OUT (gemm-s4-*.txt/json).
export PYTHONPATH=$PWD
probe_s=${1:-140}; ncu_s=${2:-45}; test_s=${3:-70}; shift 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/gemm-s4-gpu.txt 2>&1
if [ "$probe_s" -gt 0 ]; then
  timeout $((probe_s + 30)) python3 scripts/gemm-s4-probe.py --out $OUT/gemm-s4-probe.json --budget-s $probe_s \
    --steps --ablations run1 > $OUT/gemm-s4-probe.txt 2>&1
  echo "probe rc $?" >> $OUT/gemm-s4-probe.txt
fi
if [ "$ncu_s" -gt 0 ]; then
  mkdir -p /tmp/one
  timeout $ncu_s ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis -k regex:tkx_step \
    python3 scripts/gemm-s4-probe.py --one L0-tma,L1-tma,L1-cp.async --launches 1 --out /tmp/one/one.json \
    > $OUT/gemm-s4-ncu.txt 2>&1
  echo "ncu rc $?" >> $OUT/gemm-s4-ncu.txt
  for f in /tmp/one/*.cubin; do
    echo "=== $f"; cuobjdump -sass "$f" | grep -n -E "HGMMA|WARPGROUP|BAR|SYNCS|UTMA|DEPBAR|LDGSTS|WARPSYNC|UBLKCP" | head -150
  done > $OUT/gemm-s4-sass.txt 2>&1
fi
if [ "$test_s" -gt 0 ]; then
  timeout $test_s python3 -m pytest -q -m gpu -p no:cacheprovider "$@" > $OUT/gemm-s4-pytest.txt 2>&1
  echo "pytest rc $?" >> $OUT/gemm-s4-pytest.txt
fi
tail -5 $OUT/gemm-s4-pytest.txt 2>/dev/null
grep -E "^(gemm|step|ablation|ERROR|done)" $OUT/gemm-s4-probe.txt 2>/dev/null | cut -c1-160
