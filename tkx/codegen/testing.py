"""Stand-alone kernels around single emitters, for tests, benchmarks and notebooks.

Each builder returns the CUDA source of one small ``extern "C"`` kernel that exercises one
building block on plain arrays, so the block can be compiled (CI, no GPU) and checked against
PyTorch (on a GPU) without a schedule. They show, in miniature, how the code generator puts
the pieces together: prelude, one shared workspace, grid-stride loops over work items,
barriers between stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..ir import Op, TensorSpec
from . import cuda_prelude as P
from . import gemm as G
from . import reduce as R
from .ops import value
from .text import block, indent

#: The kernel parameters every multi-stage test kernel takes last (see :func:`cuda_prelude.barrier`).
BARRIER_PARAMS = "unsigned int* sync, int* status, unsigned long long spin_limit"


@dataclass(frozen=True)
class TestKernel:
    """A stand-alone kernel: its source, its ``extern "C"`` name and what its launch needs."""

    name: str
    source: str
    threads: int
    shared_bytes: int
    work_items: int
    params: dict


def _view(name: str, dtype: str, strides: Sequence[int]) -> callable:
    """Callback: element (b, i, j) of a 3-D strided view of buffer ``name``."""
    sb, si, sj = strides

    def load(b: str, i: str, j: str) -> str:
        parts = [f"(long long){b} * {sb}" if sb else None, f"{i} * {si}" if si != 1 else i,
                 f"{j} * {sj}" if sj != 1 else j]
        return P.load(dtype, name, " + ".join(p for p in parts if p))
    return load


def gemm_kernel(variant: str, p: G.GemmProblem, *, a_strides: Sequence[int], b_strides: Sequence[int],
                tile_m: int = 64, tile_n: int = 64, tile_k: int = 32, threads: int = 256,
                bias: bool = True, relu: bool = True, name: str = "tkx_gemm_test") -> TestKernel:
    """``C[b, m, n] = act(A @ B + bias[n])`` with A, B read through (batch, row, col) strides.

    Parameters: ``(const T* A, const T* B, const float* bias, float* C)``; C is contiguous fp32.
    """
    def epilogue(b: str, row: str, col: str, acc: str) -> str:
        v = acc
        if bias:
            v = f"{v} + {P.load('float32', 'bias', col)}"
        if relu:
            v = f"tkx_max({v}, 0.0f)"
        index = f"((long long){b} * {p.m} + {row}) * {p.n} + {col}"
        return P.store("float32", "C", index, v)

    def pointer(name: str, strides: Sequence[int]):
        sb, si, sj = strides

        def at(b: str, i: str, j: str) -> str:
            return f"({name} + (long long)({b}) * {sb} + (long long)({i}) * {si} + (long long)({j}) * {sj})"
        return at

    vector = p.dtype in ("bfloat16", "float16")
    code = G.emit_gemm(variant, p, _view("A", p.dtype, a_strides), _view("B", p.dtype, b_strides), epilogue,
                       tile=(tile_m, tile_n, tile_k), threads=threads,
                       ptr_a=pointer("A", a_strides) if vector else None,
                       ptr_b=pointer("B", b_strides) if vector else None)
    t = P.c_type(p.dtype)
    source = block(
        P.prelude(tensor_cores=code.tensor_cores),
        "",
        f'extern "C" __global__ void __launch_bounds__({threads})',
        f"{name}(const {t}* A, const {t}* B, const float* bias, float* C) {{",
        indent(P.shared_workspace(code.shared_bytes)),
        indent(G.work_loop(code.code, code.work_items, note=f"{variant}: {code.work_items} work items")),
        "}",
    )
    return TestKernel(name, source, threads, code.shared_bytes, code.work_items, dict(code.params))


def reduce_kernel(strategy: str, kind: str, rows: int, size: int, *, row_stride: int, r_stride: int,
                  chunks: int = 8, threads: int = 256, dtype: str = "float32", mode: str = "grid",
                  name: str = "tkx_reduce_test") -> TestKernel:
    """``out[row] = kind_r x[row * row_stride + r * r_stride]``, ``out`` fp32.

    Parameters: ``(const T* x, float* out, float* scratch, sync, status, spin_limit)``; a
    ``partial`` strategy runs both phases with a ``mode`` barrier between them.
    """
    def element(row: str, r: str) -> str:
        return P.load(dtype, "x", f"(long long){row} * {row_stride} + (long long){r} * {r_stride}")

    def finish(row: str, v: str) -> str:
        return P.store("float32", "out", row, v)

    if strategy == "partial":
        first = R.partial_reduce(kind, rows, size, chunks, element, scratch="scratch", threads=threads,
                                 rows_contiguous=row_stride == 1 and r_stride != 1)
        second = R.final_reduce(kind, rows, size, chunks, finish, scratch="scratch", threads=threads)
        body = block(
            P.barrier_setup(mode),
            "// stage 0",
            G.work_loop(first.code, first.work_items),
            P.barrier(mode, 1),
            "// stage 1",
            G.work_loop(second.code, second.work_items),
        )
        shared, params = first.shared_bytes, dict(first.params)
        items = max(first.work_items, second.work_items)
    else:
        code = R.emit_reduction(strategy, kind, rows, size, element, finish, threads=threads)
        body = G.work_loop(code.code, code.work_items)
        shared, items, params = code.shared_bytes, code.work_items, dict(code.params)
    t = P.c_type(dtype)
    source = block(
        P.prelude(),
        "",
        f'extern "C" __global__ void __launch_bounds__({threads})',
        f"{name}(const {t}* x, float* out, float* scratch, {BARRIER_PARAMS}) {{",
        indent(P.shared_workspace(shared)),
        indent(body),
        "}",
    )
    return TestKernel(name, source, threads, shared, items, params)


def pointwise_kernel(ops: Sequence[Op], *, exact: bool = False, threads: int = 256,
                     name: str = "tkx_pointwise_test") -> TestKernel:
    """``out[j * n + i] = op_j(x[i], y[i], z[i])`` for each op (tensor operands take x, y, z in order).

    Parameters: ``(const float* x, const float* y, const float* z, float* out, int n)``.
    Each result is rounded to its op's output dtype, as the code generator does.
    """
    lines = []
    for j, op in enumerate(ops):
        names = iter(["x[i]", "y[i]", "z[i]"])
        operands = [next(names) if isinstance(x, TensorSpec) else x for x in op.inputs]
        lines.append(f"out[{j} * n + i] = {value(op, operands, exact=exact)};  // {op.kind}")
    source = block(
        P.prelude(),
        "",
        f'extern "C" __global__ void {name}(const float* x, const float* y, const float* z,',
        "                                   float* out, int n) {",
        "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {",
        indent("\n".join(lines), 2),
        "    }",
        "}",
    )
    return TestKernel(name, source, threads, 0, 0, {"ops": len(ops)})


def barrier_kernel(mode: str = "grid", *, threads: int = 256, name: str = "tkx_barrier_test",
                   grid_barrier: str = "auto") -> TestKernel:
    """``rounds`` stages; in stage s every block writes ``s + blockIdx.x`` to ``slots[s % 2][blockIdx.x]``,
    and after the barrier block 0 checks the whole row of the previous stage (``errors`` counts
    mismatches). Blocks with ``blockIdx.x >= active`` return at once (to provoke a timeout).

    With ``check == 0`` nothing is checked (to time the barrier alone). ``grid_barrier``: which grid
    barrier (``Options.grid_barrier``).

    Parameters: ``(int* slots, int* errors, int rounds, int active, int check, sync, status, spin_limit)``.
    """
    source = block(
        P.prelude(),
        "",
        f'extern "C" __global__ void __launch_bounds__({threads})',
        f"{name}(int* slots, int* errors, int rounds, int active, int check, {BARRIER_PARAMS}) {{",
        "    " + P.barrier_setup(mode, choice=grid_barrier),
        "    if (blockIdx.x >= active) return;  // a block that never arrives",
        "    const int blocks = gridDim.x;",
        "    for (int s = 0; s < rounds; ++s) {",
        "        int* row = slots + (s % 2) * blocks;",
        "        if (threadIdx.x == 0) row[blockIdx.x] = s + blockIdx.x;",
        "        " + P.barrier(mode, "s + 1", choice=grid_barrier),
        "        if (check && blockIdx.x == (s % blocks)) {  // one block checks what every block wrote",
        "            for (int b = threadIdx.x; b < blocks; b += blockDim.x)",
        "                if (row[b] != s + b) atomicAdd(errors, 1);",
        "        }",
        "    }",
        "}",
    )
    return TestKernel(name, source, threads, 0, 0, {"mode": mode})
