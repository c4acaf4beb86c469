#!/bin/bash
# Device call 1 of the 2-CTA cluster work (issue 12, session 5). From the worktree root:
#   scripts/cluster-s5-device1.sh
# Writes under $OUT: cluster-s5-run1-{gpu,probe,pytest,bench}.{txt,json}.
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,driver_version --format=csv \
  > $OUT/cluster-s5-run1-gpu.txt 2>&1
# 1. the launch facts: cooperative + cluster, co-resident clusters, grid barrier, remote mbarrier arrival
timeout 35 python3 scripts/cluster-probe.py --shared-kib 0,100,194,227 --out $OUT/cluster-s5-run1-probe.json \
  > $OUT/cluster-s5-run1-probe.txt 2>&1
echo "probe rc $?" >> $OUT/cluster-s5-run1-probe.txt
MODE=$(python3 - <<'PY'
import json
try:
    r = json.load(open(__import__("os").environ["OUT"] + "/cluster-s5-run1-probe.json"))
    ok = [c for c in r["cases"] if c.get("cluster") == 2 and c.get("cooperative") and c.get("all_ran")
          and not c.get("barrier_timeouts") and not c.get("barrier_bad") and c.get("remote_arrive_ok")]
    print("cooperative" if ok else "plain")
except Exception:
    print("cooperative")
PY
)
echo "launch mode for the GEMMs: $MODE" | tee -a $OUT/cluster-s5-run1-probe.txt
# 2. the GPU tests with the switch on (verification, 200 graph replays)
timeout 70 python3 -c "
import sys, pytest, tkx.runtime.kernel as k
k.CLUSTER_LAUNCH = '$MODE'
sys.exit(pytest.main(['-q', '-x', '-m', 'gpu', '-p', 'no:cacheprovider', 'tests/test_cluster_gpu.py']))
" > $OUT/cluster-s5-run1-pytest.txt 2>&1
echo "pytest rc $?" >> $OUT/cluster-s5-run1-pytest.txt
# 3. medium's GEMMs and step with the switch off and on in one process
timeout 40 python3 -c "
import sys, runpy, tkx.runtime.kernel as k
k.CLUSTER_LAUNCH = '$MODE'
sys.argv = ['gemm-bench.py', '--examples', 'medium', '--cluster', 'both', '--out', '$OUT/cluster-s5-run1-bench.json']
runpy.run_path('scripts/gemm-bench.py', run_name='__main__')
" > $OUT/cluster-s5-run1-bench.txt 2>&1
echo "bench rc $?" >> $OUT/cluster-s5-run1-bench.txt
grep -E "occupancy|launch|rc" $OUT/cluster-s5-run1-probe.txt | cut -c1-400
tail -15 $OUT/cluster-s5-run1-pytest.txt
cut -c1-220 $OUT/cluster-s5-run1-bench.txt | tail -20
