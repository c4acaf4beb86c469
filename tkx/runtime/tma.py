"""TMA tensor maps for a kernel's bulk tensor copies (``Options(gemm_copy="tma")``, and ``"auto"``,
the default, wherever a wgmma GEMM's operands allow them).

The generated kernel lists the tensor maps it reads (:class:`tkx.codegen.abi.TensorMapSpec`: which
buffer, the view's extents and stride, the box, the swizzle) in its launch contract and finds map
``i`` at byte ``128 * i`` of its ``tensormaps`` parameter, a device buffer. A map holds a global
address, so the maps depend on where the step's inputs, outputs and arena are: :class:`TensorMaps`
encodes them with the driver (``cuTensorMapEncodeTiled`` through ``cuda-bindings``) once per set
of base addresses and keeps the device copy, so repeated calls on the same tensors and CUDA-graph
replays (whose addresses are fixed at capture) cost nothing.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import TkxError

#: Distinct address sets whose maps are kept (a graph keeps its own buffer alive besides).
CACHE_ENTRIES = 64
MAP_BYTES = 128


class TensorMapError(TkxError):
    """A tensor map cannot be encoded for the tensors given (alignment, driver error)."""


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def encode(spec: Any, base: int) -> bytes:
    """The 128 bytes of the tensor map of ``spec`` for a buffer at device address ``base``.

    Raises :class:`TensorMapError` if the address is not 16-byte aligned or the driver refuses."""
    cu = _driver()
    addr = int(base) + int(spec.offset_bytes)
    if addr % 16:
        raise TensorMapError(
            f"the bulk tensor copy engine needs 16-byte aligned operands, but the {spec.role} "
            f"{'' if spec.index < 0 else spec.index} operand of a GEMM starts at 0x{addr:x}; pass a "
            "tensor whose storage starts on 16 bytes (e.g. .contiguous()) or compile with "
            "Options(gemm_copy='cp.async')")
    dtypes = {"bfloat16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
              "float16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16}
    swizzles = {128: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                64: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
                32: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
                0: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE}
    err, tmap = cu.cuTensorMapEncodeTiled(
        dtypes[spec.dtype], 2, addr,
        [cu.cuuint64_t(int(d)) for d in spec.dims],
        [cu.cuuint64_t(int(spec.stride_bytes))],
        [cu.cuuint32_t(int(b)) for b in spec.box],
        [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzles[int(spec.swizzle)],
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if int(err) != 0:
        raise TensorMapError(f"cuTensorMapEncodeTiled refused the map {spec} at 0x{addr:x}: {err}")
    words = [int(w) for w in tmap.opaque]
    return struct.pack(f"<{len(words)}Q", *words)


def base_addresses(specs: Sequence[Any], inputs: Sequence[int], outputs: Sequence[int], arena: int) -> tuple:
    """The base device address of each spec's buffer (``input``/``output`` by index, ``arena``)."""
    out = []
    for s in specs:
        if s.role == "input":
            out.append(int(inputs[s.index]))
        elif s.role == "output":
            out.append(int(outputs[s.index]))
        elif s.role == "arena":
            out.append(int(arena))
        else:
            raise TkxError(f"tensor map with unknown buffer role {s.role!r}")
    return tuple(out)


class TensorMaps:
    """The encoded maps of one kernel, per set of base addresses (see the module docstring)."""

    def __init__(self, specs: Sequence[Any], device: torch.device) -> None:
        self.specs = tuple(specs)
        self.device = device
        self._cache: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.encodes = 0

    def buffer(self, inputs: Sequence[int], outputs: Sequence[int], arena: int) -> torch.Tensor:
        """The device buffer of the maps for these addresses (encoded and copied on first use,
        on the current stream; also while a CUDA graph is being captured)."""
        key = base_addresses(self.specs, inputs, outputs, arena)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit[1]
        blob = b"".join(encode(s, b) for s, b in zip(self.specs, key))
        self.encodes += 1
        try:
            host = torch.frombuffer(bytearray(blob), dtype=torch.uint8).pin_memory()
        except RuntimeError as e:  # e.g. pinning refused during a graph capture
            raise TensorMapError(
                f"cannot stage the kernel's {len(self.specs)} tensor maps ({e}); capture CUDA graphs "
                "with runner.capture_graph(...), which warms up on the same tensors first") from e
        dev = torch.empty(len(blob), dtype=torch.uint8, device=self.device)
        dev.copy_(host, non_blocking=True)
        self._cache[key] = (host, dev)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return dev
