"""Diagnose cnn_digits on a GPU: verify it under a few option sets and say which pass (prints one line each)."""
import sys

import torch

import tkx
from tkx.options import Options

torch.backends.cudnn.allow_tf32 = False
ex = tkx.examples.get("cnn_digits")
for label, opts in [("default", Options()), ("exact", Options(exact=True)), ("block", Options(mode="block")),
                    ("no-fusion", Options(fuse_pointwise=False, fuse_epilogues=False, fuse_reductions=False)),
                    ("sm_90", Options(arch="sm_90"))]:
    try:
        r = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, device="cuda"), opts)
        v = r.verify(make_inputs=ex.make_inputs)
        print(label, "passed" if v.passed else f"MISMATCH {v}", flush=True)
    except Exception as e:  # noqa: BLE001 - a diagnostic prints whatever happened
        print(label, type(e).__name__, str(e).splitlines()[0][:300], flush=True)
sys.exit(0)
