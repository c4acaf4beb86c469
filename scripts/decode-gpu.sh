#!/usr/bin/env bash
# decode-gpu.sh OUT - the decode step on a CUDA GPU, in one run of about 4 minutes:
#   1. warm the caches in parallel: the tkx kernels (NVRTC disk cache) and torch.compile (Inductor's caches),
#      two processes per weight format (bf16, int8, int4);                            -> OUT/prepare.log
#   2. scripts/decode-bench.py: 20 greedy tokens equal to eager for every format, then µs per step and
#      tokens/s for tkx, eager, eager+CUDA graph, torch.compile default / max-autotune, and the speed of
#      light;                                                                          -> OUT/decode-bench.{json,md,log}
#   3. the GPU tests of tests/test_decode.py (cache hits by then).                     -> OUT/pytest-gpu.log
# Environment: PYTHON (default python), DECODE_QUANTS (default bf16,int8,int4), DECODE_TESTS=0 skips step 3.
set -u -o pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
OUT="${1:-decode-gpu-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
QUANTS="${DECODE_QUANTS:-bf16,int8,int4}"
export TKX_CACHE_DIR="${TKX_CACHE_DIR:-/tmp/tkx-decode-cache}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-decode-cache}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOGS="$(mktemp -d)"  # the warm-up logs, gathered into OUT/prepare.log (few files come back from a device run)
t0=$(date +%s)
for q in ${QUANTS//,/ }; do
    syncs=barrier
    [ "$q" = bf16 ] && syncs=barrier,counters,counters+timeline
    for what in tkx torch; do
        "$PY" scripts/decode-bench.py --prepare "$q" --what $what --syncs "$syncs" > "$LOGS/prepare-$q-$what.log" 2>&1 &
    done
done
wait
for f in "$LOGS"/prepare-*.log; do echo "== $(basename "$f")"; cat "$f"; done > "$OUT/prepare.log"
echo "[decode-gpu] caches warm after $(( $(date +%s) - t0 )) s"; grep -h "built in\|torch.compile" "$OUT/prepare.log"
"$PY" scripts/decode-bench.py --out "$OUT" --quants "$QUANTS" --syncs barrier,counters --sync-quants bf16 --timeline \
    2>&1 | tee "$OUT/decode-bench.log"
echo "[decode-gpu] benchmark done after $(( $(date +%s) - t0 )) s"
if [ "${DECODE_TESTS:-1}" != 0 ]; then
    "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_decode.py 2>&1 | tail -n 15 | tee "$OUT/pytest-gpu.log"
fi
echo "[decode-gpu] all done after $(( $(date +%s) - t0 )) s"
