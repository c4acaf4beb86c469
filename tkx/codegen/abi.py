"""The kernel's calling convention, shared by the code generator and the runtime.

Every generated kernel is ``extern "C" __global__ void tkx_step(...)`` with parameters,
in this order:

1. one pointer per program input, in ``program.inputs`` order: ``const T* __restrict__
   in{i}``, or ``T* in{i}`` when the step updates that input in place;
2. one pointer per program output, in ``program.outputs`` order: ``T* out{k}`` (dense
   tensors of the output's shape and dtype, allocated by the runtime);
3. ``unsigned char* arena``: the workspace, :attr:`ArenaPlan.size_bytes` bytes (at least
   1), 256-byte aligned, contents undefined at launch;
4. ``unsigned int* sync``: two words for the grid barrier (arrival count, generation),
   zeroed once when the runtime creates them and never again - the barrier leaves the
   count at zero after every use;
5. ``int* status``: four words, zeroed once by the runtime. The kernel writes them only on
   error: ``status[0]`` an error code (:data:`ERRORS`), ``status[1]`` the stage whose barrier
   failed (for an index out of range: the op's position in ``program.ops``), ``status[2]``
   the block that saw it. The runtime reads and clears them.

Tensor addresses are arguments, never constants in the source, so one binary serves any
buffers of the compiled shapes, dtypes and strides (CUDA graphs re-launch it as is).
Grid size is chosen at launch time: one block in ``block`` mode, up to the number of
co-resident blocks (from the occupancy of the compiled kernel) in ``grid`` mode; the code
is correct for any grid size >= 1 (all loops are grid-stride loops over work items).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Program

KERNEL_NAME = "tkx_step"

C_TYPES = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half",
           "int64": "long long", "int32": "int", "bool": "bool"}

#: status[0] error codes written by the kernel.
ERRORS = {1: "grid barrier timed out (spin limit reached)",
          3: "an index out of range (a label or index outside its table; status[1] holds the op's position)"}


@dataclass(frozen=True)
class Param:
    """One kernel parameter: C name, C type, role (input/output/arena/sync/status), index."""

    name: str
    ctype: str
    role: str
    index: int = -1

    def declaration(self) -> str:
        return f"{self.ctype} {self.name}"


def kernel_params(program: Program) -> list[Param]:
    """The parameters of the kernel generated for ``program``, in order."""
    params = []
    for i, inp in enumerate(program.inputs):
        t = C_TYPES[inp.value.dtype]
        ctype = f"{t}* __restrict__" if inp.mutated else f"const {t}* __restrict__"
        params.append(Param(f"in{i}", ctype, "input", i))
    for k, out in enumerate(program.outputs):
        params.append(Param(f"out{k}", f"{C_TYPES[out.value.dtype]}* __restrict__", "output", k))
    params.append(Param("arena", "unsigned char* __restrict__", "arena"))
    params.append(Param("sync", "unsigned int*", "sync"))
    params.append(Param("status", "int*", "status"))
    return params
