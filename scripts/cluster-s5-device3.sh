#!/bin/bash
# For the lead's final check (issue 12, session 5): the 2-CTA cluster GEMM's open question in one run
# (~90 s wall). From the repository root:  scripts/cluster-s5-device3.sh
# Writes under $OUT (4 files): cluster-s5-run3-{variants.txt,variants.json,pytest.txt,gpu.txt}.
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/cluster-s5-run3-gpu.txt 2>&1
# does the cta-scope stage handshake close the gap? and the no-multicast ablation
timeout 60 python3 scripts/cluster-variants.py --out $OUT/cluster-s5-run3-variants.json \
  > $OUT/cluster-s5-run3-variants.txt 2>&1
echo "variants rc $?" >> $OUT/cluster-s5-run3-variants.txt
# verification of both handshakes (scope cluster and cta): medium, medium with every GEMM paired, small (200 replays each)
timeout 75 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cluster_gpu.py > $OUT/cluster-s5-run3-pytest.txt 2>&1
echo "pytest rc $?" >> $OUT/cluster-s5-run3-pytest.txt
cat $OUT/cluster-s5-run3-variants.txt; tail -3 $OUT/cluster-s5-run3-pytest.txt
