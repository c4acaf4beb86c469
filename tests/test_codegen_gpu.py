"""The code generator's building blocks give eager PyTorch's numbers on a GPU.

Each test compiles a stand-alone kernel from :mod:`tkx.codegen.testing` with NVRTC for the
GPU present, launches it through ``cuda.bindings`` on PyTorch's current stream, and compares
with PyTorch (:func:`tkx.reference.evaluate` is the oracle for pointwise ops). Skipped on
machines without a CUDA GPU.
"""

from __future__ import annotations

import ctypes
import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
driver = pytest.importorskip("cuda.bindings.driver")

from tkx.codegen import cuda_prelude as P  # noqa: E402
from tkx.codegen import gemm as G  # noqa: E402
from tkx.codegen import nvrtc as nv  # noqa: E402
from tkx.codegen import reduce as R  # noqa: E402
from tkx.codegen import testing as T  # noqa: E402
from tkx.ir import OPS, POINTWISE, Op, TensorSpec  # noqa: E402
from tkx.reference import evaluate  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def _check(result, what):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


class Kernel:
    """A compiled stand-alone kernel, launched on torch's current stream."""

    def __init__(self, k: T.TestKernel, exact: bool = False):
        torch.cuda.init()
        torch.zeros(1, device=DEV)  # make torch's primary context current
        major, minor = torch.cuda.get_device_capability()
        self.k = k
        self.report = nv.compile_cuda(k.source, f"sm_{major}{minor}", exact=exact)
        self.module = _check(driver.cuModuleLoadData(self.report.cubin), "cuModuleLoadData")
        self.fn = _check(driver.cuModuleGetFunction(self.module, k.name.encode()), "cuModuleGetFunction")

    def max_blocks(self, threads: int, smem: int = 0) -> int:
        per_sm = _check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.fn, threads, smem),
                        "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return per_sm * torch.cuda.get_device_properties(0).multi_processor_count

    def __call__(self, grid: int, *args, cooperative: bool = False, threads: int | None = None) -> None:
        values, types = [], []
        for a in args:
            if isinstance(a, torch.Tensor):
                values.append(a.data_ptr())
                types.append(ctypes.c_void_p)
            else:
                values.append(a[0])
                types.append(a[1])
        threads = threads or self.k.threads
        stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
        params = (tuple(values), tuple(types))
        if cooperative:
            _check(driver.cuLaunchCooperativeKernel(self.fn, grid, 1, 1, threads, 1, 1, 0, stream, params),
                   "cuLaunchCooperativeKernel")
        else:
            _check(driver.cuLaunchKernel(self.fn, grid, 1, 1, threads, 1, 1, 0, stream, params, 0),
                   "cuLaunchKernel")


def i32(v):
    return (v, ctypes.c_int)


def u64(v):
    return (v, ctypes.c_ulonglong)


# --------------------------------------------------------------------------------------
# pointwise ops against torch
# --------------------------------------------------------------------------------------
SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0,
           1e-30, -1e-30, 1e30, -1e30, 88.0, -88.0, 100.0, -100.0, 1e-3, 7.5, -7.5]


def inputs(n=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = []
    for i in range(3):
        v = torch.randn(n, generator=g) * 3
        v[: len(SPECIAL)] = torch.tensor(SPECIAL).roll(i * 5)
        v[len(SPECIAL): 2 * len(SPECIAL)] = torch.tensor(SPECIAL)
        xs.append(v.to(DEV))
    return xs


def make_op(kind, dtype):
    arity = OPS[kind].arity
    ins = [TensorSpec.dense(n, (4096,), dtype) for n in "xyz"][:arity]
    attrs = {}
    if kind == "pow":
        ins[1] = 2.0
    if kind == "clamp":
        attrs = {"min": -1.5, "max": 2.0}
    out_dtype = "bool" if kind in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
                                   "logical_not") else dtype
    return Op(kind, kind, tuple(ins), TensorSpec.dense(kind, (4096,), out_dtype), attrs)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("exact", [False, True])
def test_pointwise_ops_match_torch(dtype, exact):
    # rows emitted as statements of their own (index ops, index_check) have no C expression: the op-table
    # probes (tests/test_op_table.py) run them through whole kernels instead
    ops = [make_op(k, dtype) for k in sorted(POINTWISE) if not OPS[k].statements]
    x_spec, p_spec = TensorSpec.dense("x", (4096,), dtype), TensorSpec.dense("p", (4096,), dtype)
    ops += [Op(f"pow{e}", "pow", (x_spec, e), p_spec) for e in (0.5, 3, -1, -2, 1.7, 0)]
    kern = Kernel(T.pointwise_kernel(ops, exact=exact), exact=exact)
    x, y, z = inputs()
    tdt = getattr(torch, dtype)
    x, y, z = (t.to(tdt) for t in (x, y, z))  # values representable in the dtype
    out = torch.empty(len(ops) * 4096, device=DEV)
    kern(64, x.float(), y.float(), z.float(), out, i32(4096))
    torch.cuda.synchronize()
    out = out.view(len(ops), 4096)
    env = {"x": x, "y": y, "z": z}
    bad = []
    for j, op in enumerate(ops):
        args = [env[a.buffer] if isinstance(a, TensorSpec) else a for a in op.inputs]
        ref = evaluate(op, args, DEV).float()
        got = out[j]
        if dtype == "float32":
            ok = torch.isclose(got, ref, rtol=1e-5, atol=1e-6, equal_nan=True)
        else:  # same fp32 math, then one rounding to bf16: equal or one bf16 step apart at a tie
            ok = torch.isclose(got, ref, rtol=8e-3, atol=1e-30, equal_nan=True)
        if not bool(ok.all()):
            i = int((~ok).nonzero()[0])
            bad.append(f"{op.kind}{op.inputs[1:] if op.kind == 'pow' else ''}: at {i} x={x[i].item()} "
                       f"y={y[i].item()} got {got[i].item()} torch {ref[i].item()} ({int((~ok).sum())} bad)")
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------------------------------
# GEMM emitters against torch
# --------------------------------------------------------------------------------------
GEMMS = [
    ("simt", G.GemmProblem(256, 512, 300)),
    ("simt", G.GemmProblem(100, 70, 33, a_k_contiguous=False, b_n_contiguous=False)),
    ("simt", G.GemmProblem(64, 96, 80, batch=3, b_n_contiguous=False)),
    ("wmma_bf16", G.GemmProblem(256, 512, 320, dtype="bfloat16")),
    ("wmma_bf16", G.GemmProblem(100, 70, 40, dtype="bfloat16", a_k_contiguous=False, b_n_contiguous=False)),
    ("wmma_f16", G.GemmProblem(128, 64, 64, batch=2, dtype="float16", b_n_contiguous=False)),
    ("wmma_tf32", G.GemmProblem(256, 512, 320)),
    ("wmma_tf32", G.GemmProblem(50, 60, 70, a_k_contiguous=False)),
    ("gemv", G.GemmProblem(1, 128, 64)),
    ("gemv", G.GemmProblem(4, 300, 100, b_n_contiguous=False)),
    ("gemv", G.GemmProblem(256, 1, 1024)),
    ("gemv", G.GemmProblem(256, 3, 1000, a_k_contiguous=False, batch=2)),
]


def operands(p: G.GemmProblem, seed=0):
    """A, B as torch tensors laid out as the problem says, and their (batch, row, col) strides."""
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, p.dtype)
    a = torch.randn(p.batch, p.m, p.k, generator=g).to(dt)
    b = torch.randn(p.batch, p.k, p.n, generator=g).to(dt)
    a_mem = a.contiguous() if p.a_k_contiguous else a.transpose(1, 2).contiguous()
    b_mem = b.contiguous() if p.b_n_contiguous else b.transpose(1, 2).contiguous()
    a_str = (p.m * p.k, p.k, 1) if p.a_k_contiguous else (p.m * p.k, 1, p.m)
    b_str = (p.k * p.n, p.n, 1) if p.b_n_contiguous else (p.k * p.n, 1, p.k)
    return a, b, a_mem.to(DEV), b_mem.to(DEV), a_str, b_str


@pytest.mark.parametrize(("variant", "p"), GEMMS, ids=lambda x: x if isinstance(x, str) else
                         f"{x.batch}x{x.m}x{x.n}x{x.k}{'' if x.a_k_contiguous else 'At'}"
                         f"{'' if x.b_n_contiguous else 'Bt'}")
def test_gemm_matches_torch(variant, p):
    a, b, a_dev, b_dev, a_str, b_str = operands(p)
    kern = Kernel(T.gemm_kernel(variant, p, a_strides=a_str, b_strides=b_str))
    bias = torch.randn(p.n).to(DEV)
    out = torch.full((p.batch, p.m, p.n), float("nan"), device=DEV)
    grid = min(kern.k.work_items, kern.max_blocks(kern.k.threads))
    kern(grid, a_dev, b_dev, bias, out)
    torch.cuda.synchronize()
    if variant == "wmma_tf32":  # the inputs rounded to tf32 (10-bit mantissa), products exact
        a, b = (t.view(torch.int32).add(0x1000).bitwise_and(~0x1FFF).view(torch.float32) for t in (a, b))
    ref = torch.relu(a.double() @ b.double() + bias.cpu().double()).float()
    scale = float((a.double().abs() @ b.double().abs()).max())
    err = float((out.cpu() - ref).abs().max())
    tol = 2e-3 if variant == "wmma_tf32" else 1e-5
    assert err <= tol * scale, f"{variant}: max error {err:.3g} vs scale {scale:.3g}"


# --------------------------------------------------------------------------------------
# reductions against torch
# --------------------------------------------------------------------------------------
REDUCTIONS = [
    ("thread", 1000, 20, False), ("thread", 1024, 256, True), ("warp", 300, 500, False),
    ("block", 8, 5000, False), ("partial", 4, 100_000, False), ("partial", 100, 4096, True),
    ("columns", 4096, 256, True), ("columns", 1000, 77, True),
]


@pytest.mark.parametrize("kind", R.KINDS)
@pytest.mark.parametrize(("strategy", "rows", "size", "rows_contiguous", "chunks"),
                         [(*c, 24) for c in REDUCTIONS]
                         + [("partial", 100, 4096, True, 3), ("partial", 300, 900, False, 16)])
def test_reduction_matches_torch(kind, strategy, rows, size, rows_contiguous, chunks):
    """Every strategy against torch; partial with 24 chunks folds them with a warp per row, with 3 or 16 with a
    thread per row (``tkx.target.THREAD_FINAL_CHUNKS``)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, size, generator=g)
    x[rows // 2, size // 3] = float("nan")  # amax/amin/sum all propagate NaN
    mem = x.t().contiguous() if rows_contiguous else x.contiguous()
    row_stride, r_stride = (1, rows) if rows_contiguous else (size, 1)
    k = T.reduce_kernel(strategy, kind, rows, size, row_stride=row_stride, r_stride=r_stride, chunks=chunks)
    kern = Kernel(k)
    out = torch.full((rows,), -123.0, device=DEV)
    scratch = torch.zeros(rows * chunks, device=DEV)
    sync = torch.zeros(2, dtype=torch.int32, device=DEV)
    status = torch.zeros(4, dtype=torch.int32, device=DEV)
    grid = min(k.work_items, kern.max_blocks(k.threads))
    kern(grid, mem.to(DEV), out, scratch, sync, status, u64(1 << 30), cooperative=True)
    torch.cuda.synchronize()
    assert status.tolist() == [0, 0, 0, 0]
    reduce = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin}[kind]
    ref = reduce(x.double(), dim=1)
    got = out.cpu().double()
    assert torch.isnan(got[rows // 2]) and torch.isnan(ref[rows // 2])
    mask = ~torch.isnan(ref)
    if kind in ("amax", "amin"):
        assert torch.equal(got[mask], ref[mask])
    else:
        scale = x.double().abs().sum(1)[mask] / (size if kind == "mean" else 1)
        assert float(((got[mask] - ref[mask]).abs() / scale).max()) < 1e-6


# --------------------------------------------------------------------------------------
# barriers
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", P.GRID_BARRIERS)
@pytest.mark.parametrize("per_sm", [1, None])
def test_grid_barrier_orders_memory_and_is_reusable(per_sm, kind, capsys):
    kern = Kernel(T.barrier_kernel("grid", grid_barrier=kind))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = sms * per_sm if per_sm else kern.max_blocks(256)
    slots = torch.full((2, grid), -1, dtype=torch.int32, device=DEV)
    errors = torch.zeros(1, dtype=torch.int32, device=DEV)
    sync = torch.zeros(2, dtype=torch.int32, device=DEV)
    status = torch.zeros(4, dtype=torch.int32, device=DEV)
    times = {}
    passed = 0
    for rounds, check in ((0, 1), (2000, 1), (2000, 1), (0, 0), (4000, 0), (4000, 0)):  # sync never re-zeroed
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        kern(grid, slots, errors, i32(rounds), i32(grid), i32(check), sync, status, u64(1 << 30),
             cooperative=True)
        end.record()
        torch.cuda.synchronize()
        times.setdefault((rounds, check), []).append(start.elapsed_time(end) * 1000)
        assert status.tolist() == [0, 0, 0, 0] and errors.item() == 0
        passed += rounds
        if kind == "generation":
            assert sync[0].item() == 0 and sync[1].item() == passed % 2**32  # re-armed; one generation each
        else:  # the 64-bit arrival count: every block once per barrier
            assert sync.view(torch.int64).item() == passed * grid
    alone = (min(times[4000, 0]) - min(times[0, 0])) / 4000
    checked = (min(times[2000, 1]) - min(times[0, 1])) / 2000
    with capsys.disabled():
        print(f"\n{kind} grid barrier over {grid} blocks: {alone:.2f} us per barrier "
              f"({checked:.2f} us per round with one block checking every slot)")


@pytest.mark.parametrize("kind", P.GRID_BARRIERS)
def test_grid_barrier_times_out_instead_of_hanging(kind):
    kern = Kernel(T.barrier_kernel("grid", grid_barrier=kind))
    grid = min(8, kern.max_blocks(256))
    slots = torch.zeros(2, grid, dtype=torch.int32, device=DEV)
    errors = torch.zeros(1, dtype=torch.int32, device=DEV)
    sync = torch.zeros(2, dtype=torch.int32, device=DEV)
    status = torch.zeros(4, dtype=torch.int32, device=DEV)
    kern(grid, slots, errors, i32(10), i32(grid - 1), i32(1), sync, status, u64(200_000), cooperative=True)
    torch.cuda.synchronize()
    assert status[:2].tolist() == [1, 1]  # barrier timeout before stage 1
    assert 0 <= status[2].item() < grid - 1  # a block that waited
    # the runtime's recovery: zero the words (tkx.runtime.status.read_and_clear), then a full launch works
    sync.zero_()
    status.zero_()
    kern(grid, slots, errors, i32(10), i32(grid), i32(1), sync, status, u64(1 << 30), cooperative=True)
    torch.cuda.synchronize()
    assert status.tolist() == [0, 0, 0, 0] and errors.item() == 0


def test_block_barrier_single_block():
    kern = Kernel(T.barrier_kernel("block"))
    slots = torch.zeros(2, 1, dtype=torch.int32, device=DEV)
    errors = torch.zeros(1, dtype=torch.int32, device=DEV)
    sync = torch.zeros(2, dtype=torch.int32, device=DEV)
    status = torch.zeros(4, dtype=torch.int32, device=DEV)
    kern(1, slots, errors, i32(1000), i32(1), i32(1), sync, status, u64(1))
    torch.cuda.synchronize()
    assert status.tolist() == [0, 0, 0, 0] and errors.item() == 0


# --------------------------------------------------------------------------------------
# speed (reported, not asserted)
# --------------------------------------------------------------------------------------
def _time(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps


SPEED = [("simt", "float32", 64, 64, 32), ("simt", "float32", 128, 64, 16), ("simt", "float32", 128, 128, 16),
         ("wmma_tf32", "float32", 64, 64, 32), ("wmma_tf32", "float32", 128, 128, 32),
         ("wmma_bf16", "bfloat16", 64, 64, 32), ("wmma_bf16", "bfloat16", 128, 128, 32),
         ("wmma_bf16", "bfloat16", 128, 64, 64)]


@pytest.mark.parametrize(("variant", "dtype", "tm", "tn", "tk"), SPEED)
def test_gemm_speed_report(variant, dtype, tm, tn, tk, capsys):
    """x[256, 1024] @ w[1024, 4096] (the medium MLP's first layer) with bias+relu."""
    p = G.GemmProblem(256, 4096, 1024, dtype=dtype)
    a, b, a_dev, b_dev, a_str, b_str = operands(p)
    k = T.gemm_kernel(variant, p, a_strides=a_str, b_strides=b_str, tile_m=tm, tile_n=tn, tile_k=tk)
    kern = Kernel(k)
    bias = torch.randn(p.n, device=DEV)
    out = torch.empty(p.m, p.n, device=DEV)
    grid = min(kern.k.work_items, kern.max_blocks(kern.k.threads))
    ours = _time(lambda: kern(grid, a_dev, b_dev, bias, out))
    torch.backends.cuda.matmul.allow_tf32 = variant == "wmma_tf32"
    ad, bd = a_dev[0], b_dev[0]
    theirs = _time(lambda: torch.relu(torch.addmm(bias.to(ad.dtype), ad, bd)))
    torch.backends.cuda.matmul.allow_tf32 = False
    flops = 2 * p.m * p.n * p.k
    with capsys.disabled():
        print(f"\n{variant} {tm}x{tn}x{tk}: {ours:.1f} us ({flops / ours / 1e6:.1f} TFLOP/s), grid {grid}, "
              f"{kern.report.registers} regs, {kern.k.shared_bytes} B smem; torch addmm+relu {theirs:.1f} us")
    assert math.isfinite(ours)
