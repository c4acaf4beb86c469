#!/bin/bash
# Device call 2 of the 2-CTA cluster work (issue 12, session 5). From the worktree root:
#   scripts/cluster-s5-device2.sh
# Writes under $OUT: cluster-s5-run2-{gpu,probe,pytest,bench,profile-off,profile-on}.{txt,json}.
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,driver_version --format=csv \
  > $OUT/cluster-s5-run2-gpu.txt 2>&1
# 1. the launch facts (cooperative + cluster, co-resident clusters, grid barrier, remote arrival, gridDim seen)
timeout 30 python3 scripts/cluster-probe.py --shared-kib 0,100,194,227 --out $OUT/cluster-s5-run2-probe.json \
  > $OUT/cluster-s5-run2-probe.txt 2>&1
echo "probe rc $?" >> $OUT/cluster-s5-run2-probe.txt
# 2. GPU tests: clusters on (verification, 200 replays) and the TMA path with the switch off
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cluster_gpu.py tests/test_tma_gpu.py \
  > $OUT/cluster-s5-run2-pytest.txt 2>&1
echo "pytest rc $?" >> $OUT/cluster-s5-run2-pytest.txt
# 3. per GEMM of small and medium and the steps, switch off and on in one process, against cuBLAS
timeout 60 python3 scripts/gemm-bench.py --examples small,medium --cluster both --out $OUT/cluster-s5-run2-bench.json \
  > $OUT/cluster-s5-run2-bench.txt 2>&1
echo "bench rc $?" >> $OUT/cluster-s5-run2-bench.txt
# 3b. ablations: cluster launch alone, release-to-refill slack 0/1/2
timeout 40 python3 scripts/cluster-variants.py --out $OUT/cluster-s5-run2-variants.json \
  > $OUT/cluster-s5-run2-variants.txt 2>&1
echo "variants rc $?" >> $OUT/cluster-s5-run2-variants.txt
# 4. medium's per-stage timeline, switch off and on
for on in off on; do
  timeout 25 python3 -c "
import sys, runpy, tkx.target as T
T.GEMM_CLUSTER = '$on' == 'on'
sys.argv = ['gemm-profile.py', '--examples', 'medium', '--out', '/tmp/prof-$on']
runpy.run_path('scripts/gemm-profile.py', run_name='__main__')
" > $OUT/cluster-s5-run2-profile-$on.txt 2>&1
  echo "profile rc $?" >> $OUT/cluster-s5-run2-profile-$on.txt
  cp /tmp/prof-$on/profile*.json $OUT/cluster-s5-run2-profile-$on.json 2>/dev/null
done
grep -E "occupancy|launch|rc" $OUT/cluster-s5-run2-probe.txt | cut -c1-330
tail -4 $OUT/cluster-s5-run2-pytest.txt
cut -c1-200 $OUT/cluster-s5-run2-bench.txt | grep -v "^ *$" | tail -26
cat $OUT/cluster-s5-run2-variants.txt
grep -E "makespan|stage|g0 |g1k|g5 " $OUT/cluster-s5-run2-profile-*.txt | cut -c1-160 | head -40
