#!/usr/bin/env python3
"""epilogue-ab.py VECTOR EARLY_REGS [gemm-profile.py arguments]

``scripts/gemm-profile.py`` with the wgmma tile epilogue's switches set first: VECTOR (0/1) is
``tkx.codegen.gemm.WGMMA_EPILOGUE_VECTOR`` (16-byte vector point reads and stores), EARLY_REGS is
``WGMMA_EPILOGUE_EARLY_REGS`` (0: no point reads before the k-loop). So one GPU run shows the per-stage
item times of the same steps before and after, e.g.
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
print(f"WGMMA_EPILOGUE_VECTOR={G.WGMMA_EPILOGUE_VECTOR} WGMMA_EPILOGUE_EARLY_REGS={G.WGMMA_EPILOGUE_EARLY_REGS}")
sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm-profile.py"), *sys.argv[3:]]
runpy.run_path(sys.argv[0], run_name="__main__")
