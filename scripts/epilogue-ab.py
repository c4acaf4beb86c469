#!/usr/bin/env python3
"""epilogue-ab.py VECTOR EARLY_REGS [--vector-regs=N] [gemm-profile.py arguments]

``scripts/gemm-profile.py`` with the wgmma tile epilogue's switches set first: VECTOR (0/1) is
``tkx.codegen.gemm.WGMMA_EPILOGUE_VECTOR`` (16-byte vector point reads and stores), EARLY_REGS is
``WGMMA_EPILOGUE_EARLY_REGS`` (0: no point reads before the k-loop), ``--vector-regs`` sets
``WGMMA_EPILOGUE_VECTOR_REGS`` (256: medium's 128x256 SGD tiles in one pass of 128 elements, 245
registers and no spills on NVRTC sm_90a; unmeasured). So one GPU run shows the per-stage item times of
the same steps before and after, e.g.
``python scripts/epilogue-ab.py 0 0 --examples small,medium --out $OUT/off``.
"""

from __future__ import annotations

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tkx.codegen import gemm as G  # noqa: E402

if len(sys.argv) < 3:
    sys.exit(__doc__)
G.WGMMA_EPILOGUE_VECTOR = sys.argv[1] == "1"
G.WGMMA_EPILOGUE_EARLY_REGS = int(sys.argv[2])
rest = sys.argv[3:]
if rest and rest[0].startswith("--vector-regs="):
    G.WGMMA_EPILOGUE_VECTOR_REGS = int(rest.pop(0).split("=", 1)[1])
print(f"WGMMA_EPILOGUE_VECTOR={G.WGMMA_EPILOGUE_VECTOR} WGMMA_EPILOGUE_EARLY_REGS={G.WGMMA_EPILOGUE_EARLY_REGS} "
      f"WGMMA_EPILOGUE_VECTOR_REGS={G.WGMMA_EPILOGUE_VECTOR_REGS}")
sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm-profile.py"), *rest]
runpy.run_path(sys.argv[0], run_name="__main__")
