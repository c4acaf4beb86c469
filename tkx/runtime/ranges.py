"""Named ranges around the runner's launches and graph replays, for profilers.

Nsight Systems shows one opaque kernel per launch; with these ranges its NVTX row says which tkx step
ran and under which options (``"tkx digits_step launch [mode=grid sync=counters]"``), and a
``torch.profiler`` trace gets the same name as a CPU-side range (``record_function``) around the launch.

A range is emitted only while a tool listens, so the cost when nobody profiles is one test of a bool:

* NVTX (``torch.cuda.nvtx``): when a tool injected itself into NVTX (Nsight Systems and Nsight Compute set
  ``NVTX_INJECTION64_PATH`` for the process they start), or ``TKX_NVTX=1``; ``TKX_NVTX=0`` turns it off.
  Read once, when this module is imported (a tool attaches at process start);
* ``torch.profiler``: while it records (``torch.autograd.profiler._is_profiler_enabled``), unless ``TKX_NVTX=0``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch.autograd.profiler as _profiler

__all__ = ["range_name", "nvtx_listening", "listening", "annotate", "set_nvtx"]


def _nvtx_from_env(env: Mapping[str, str]) -> bool:
    flag = env.get("TKX_NVTX", "").strip().lower()
    if flag in ("0", "false", "off", "no"):
        return False
    return flag in ("1", "true", "on", "yes") or bool(env.get("NVTX_INJECTION64_PATH") or
                                                    env.get("NVTX_INJECTION32_PATH"))


_NVTX = _nvtx_from_env(os.environ)
_OFF = os.environ.get("TKX_NVTX", "").strip().lower() in ("0", "false", "off", "no")


def set_nvtx(on: bool) -> bool:
    """Turn the NVTX ranges on or off for this process (e.g. before ``cudaProfilerStart`` when a tool
    attached some other way); returns the previous setting."""
    global _NVTX
    was, _NVTX = _NVTX, bool(on)
    return was


def nvtx_listening() -> bool:
    """Whether launches emit NVTX ranges (see the module text)."""
    return _NVTX


def _torch_profiling() -> bool:
    return bool(getattr(_profiler, "_is_profiler_enabled", False)) and not _OFF


def listening() -> bool:
    """Whether a launch now emits a range: NVTX is on or ``torch.profiler`` records (two flag tests)."""
    return _NVTX or (getattr(_profiler, "_is_profiler_enabled", False) and not _OFF)


def range_name(step: str, what: str, options: Any = None) -> str:
    """``"tkx <step> <what> [k=v ...]"``: the step's name, what runs (``"launch"``, ``"graph replay"``) and
    the options that differ from the defaults (:meth:`tkx.Options.changed`; none: no brackets)."""
    changed = options.changed() if hasattr(options, "changed") else {}
    opts = " ".join(f"{k}={v}" for k, v in changed.items())
    return f"tkx {step} {what}" + (f" [{opts}]" if opts else "")


@contextlib.contextmanager
def annotate(name: str, *, nvtx: Any = None) -> Iterator[None]:
    """A range named ``name``: NVTX push/pop when NVTX listens (``nvtx``: the module with ``range_push`` and
    ``range_pop``, default ``torch.cuda.nvtx``), and a ``torch.profiler.record_function`` while torch's
    profiler records. Nothing when neither does."""
    with contextlib.ExitStack() as stack:
        if _NVTX:
            if nvtx is None:
                import torch.cuda.nvtx as nvtx
            nvtx.range_push(name)
            stack.callback(nvtx.range_pop)
        if _torch_profiling():
            import torch.profiler

            stack.enter_context(torch.profiler.record_function(name))
        yield
