"""The code generator's building blocks compile with NVRTC for sm_80 and sm_90, without spills.

No GPU is needed: NVRTC runs on the CPU. These tests skip only when NVRTC cannot be loaded.
"""

from __future__ import annotations

import pytest

from tkx.codegen import cuda_prelude as P
from tkx.codegen import gemm as G
from tkx.codegen import nvrtc as nv
from tkx.codegen import ops as O
from tkx.codegen import reduce as R
from tkx.codegen import testing as T
from tkx.ir import OPS, POINTWISE, Op, TensorSpec

AVAILABLE, WHY = nv.nvrtc_available()
needs_nvrtc = pytest.mark.skipif(not AVAILABLE, reason=f"NVRTC cannot be loaded: {WHY}")
needs_headers = pytest.mark.skipif(
    not nv.include_dirs(), reason=f"CUDA headers for WMMA not found: {nv.headers_hint()}")


def compile_ok(source: str, arch: str, **kw) -> nv.CompileReport:
    report = nv.compile_cuda(source, arch, **kw)
    assert report.registers > 0, report.log
    assert report.spill_bytes == 0, report.summary()
    assert report.arch == arch
    assert report.cubin[:4] == b"\x7fELF"
    return report


# --------------------------------------------------------------------------------------
# ptxas report parsing (a real log, captured from NVRTC 13.5 for sm_90)
# --------------------------------------------------------------------------------------
REAL_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compile time = 1.185 ms
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 34 registers, used 1 barriers, 256 bytes cumulative stack size, 1024 bytes smem
ptxas info    : Compile time = 6.258 ms
ptxas info    : Function properties for _Z6helperPfi
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""

SPILL_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm' for 'sm_80'
ptxas info    : Function properties for gemm
ptxas         .     128 bytes stack frame, 272 bytes spill stores, 236 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 128 bytes cumulative stack size, 17408 bytes smem, \
360 bytes cmem[0], 8 bytes cmem[2]
"""


def test_parse_real_ptxas_log():
    kernels = {k.name: k for k in nv.parse_ptxas_log(REAL_LOG)}
    assert set(kernels) == {"k", "k2"}  # the device function is not an entry
    expected = nv.KernelResources("k", registers=34, shared_bytes=1024, stack_bytes=256, barriers=1)
    assert kernels["k"] == expected
    assert kernels["k2"].registers == 8 and kernels["k2"].shared_bytes == 0


def test_parse_spills_and_cmem():
    (k,) = nv.parse_ptxas_log(SPILL_LOG)
    assert (k.registers, k.spill_store_bytes, k.spill_load_bytes) == (80, 272, 236)
    assert (k.shared_bytes, k.stack_bytes, k.cmem_bytes, k.spill_bytes) == (17408, 128, 360, 508)


def test_report_repr_hides_cubin():
    r = nv.CompileReport("sm_90", 8, 0, 0, 0, 0, 0, 0.1, log="x" * 100, cubin=b"\x7fELF" * 100)
    assert "ELF" not in repr(r) and "xxxx" not in repr(r)
    assert r.summary().startswith("sm_90: 8 regs")


# --------------------------------------------------------------------------------------
# NVRTC itself
# --------------------------------------------------------------------------------------
SMALL = 'extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {\n' \
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = a * x[i] + y[i];\n}\n"


@needs_nvrtc
@pytest.mark.parametrize("arch", nv.ARCHES)
@pytest.mark.parametrize("backend", ["core", "bindings"])
def test_compile_small_kernel(arch, backend):
    pytest.importorskip("cuda.core") if backend == "core" else None
    r = compile_ok(SMALL, arch, backend=backend)
    assert r.backend == backend
    assert r.kernel("axpy").registers == r.registers
    assert r.compile_seconds < 30


@needs_nvrtc
def test_exact_mode_flag():
    r = nv.compile_cuda(SMALL, "sm_90", exact=True)
    assert "--fmad=false" in r.options
    assert not any("O3" in o for o in r.options)


@needs_nvrtc
def test_compile_error_quotes_source():
    bad = 'extern "C" __global__ void k(float* x) {\n    float y = 1.0f;\n    x[0] = undefined_fn(y);\n}\n'
    with pytest.raises(nv.CudaCompileError) as info:
        nv.compile_cuda(bad, "sm_80")
    text = str(info.value)
    assert "undefined_fn" in text and ">    3 |     x[0] = undefined_fn(y);" in text
    assert info.value.arch == "sm_80" and "error" in info.value.log


@needs_nvrtc
@needs_headers
def test_headers_resolve():
    src = "#include <mma.h>\n#include <cuda_bf16.h>\n" \
          'extern "C" __global__ void k(__nv_bfloat16* x) { x[0] = __float2bfloat16_rn(1.0f); }\n'
    compile_ok(src, "sm_80")


# --------------------------------------------------------------------------------------
# the op table
# --------------------------------------------------------------------------------------
def x_spec(dtype="float32"):
    return TensorSpec.dense("x", (4,), dtype)


def make_op(kind, dtype="float32"):
    """An op of ``kind`` on tensor operands (pow: scalar exponent 3.5, clamp: both bounds)."""
    arity = OPS[kind].arity
    inputs = [x_spec(), TensorSpec.dense("y", (4,), "float32"), TensorSpec.dense("z", (4,), "float32")]
    inputs = inputs[:arity]
    attrs = {}
    if kind == "pow":
        inputs[1] = 3.5
    if kind == "clamp":
        attrs = {"min": -1.0, "max": 2.0}
    return Op(kind, kind, tuple(inputs), TensorSpec.dense(kind, (4,), dtype), attrs)


def test_every_pointwise_kind_has_an_expression():
    assert O.missing_kinds() == []


@pytest.mark.parametrize(("x", "text"), [
    (1, "1.0f"), (True, "1.0f"), (10, "10.0f"), (-0.0, "-0.0f"), (1e20, "1e+20f"),
    (0.1, "0.1f"), (1e-5, "1e-05f"), (-2.5, "-2.5f"), (1 / 3, "0.33333334f"),
    (float("inf"), "TKX_INF"), (float("-inf"), "-TKX_INF"), (float("nan"), "TKX_NAN"), (1e39, "TKX_INF"),
])
def test_literals(x, text):
    assert O.literal(x) == text


def test_literals_round_trip_float32():
    import random
    rng = random.Random(0)
    for _ in range(2000):
        v = O.f32(rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30))
        assert O.f32(float(O.literal(v)[:-1])) == v


@pytest.mark.parametrize(("exponent", "text"), [
    (2, "x * x"), (2.0, "x * x"), (0.5, "sqrtf(x)"), (-1, "1.0f / x"), (3, "x * x * x"),
    (-0.5, "1.0f / sqrtf(x)"),
    (0, "1.0f"), (1.5, "powf(x, 1.5f)"), (7, "powf(x, 7.0f)"),
])
def test_pow_special_cases(exponent, text):
    op = Op("p", "pow", (x_spec(), exponent), TensorSpec.dense("p", (4,), "float32"))
    assert O.expr(op, ["x", exponent]) == text


def test_expressions_read_well():
    assert O.expr(make_op("add"), ["a", "b"]) == "a + b"
    assert O.expr(make_op("add"), ["a", "b"], exact=True) == "__fadd_rn(a, b)"
    assert O.expr(make_op("neg"), ["-a"]) == "-(-a)"
    assert O.expr(make_op("mul"), ["a + b", "c"]) == "(a + b) * c"
    assert O.expr(make_op("clamp"), ["v"]) == "tkx_min(tkx_max(v, -1.0f), 2.0f)"
    assert O.expr(make_op("where"), ["c", "a", "b"]) == "(c != 0.0f ? a : b)"
    assert O.value(make_op("exp", "bfloat16"), ["x"]) == "tkx_round_bf16(expf(x))"
    assert O.value(make_op("cast", "int64"), ["x"]) == "(long long)(x)"  # float -> int64 truncates


def test_expr_rejects_non_pointwise():
    op = Op("s", "sum", (x_spec(),), TensorSpec.dense("s", (), "float32"), {"dims": (0,)})
    with pytest.raises(KeyError):
        O.expr(op, ["x"])


@needs_nvrtc
@pytest.mark.parametrize("arch", nv.ARCHES)
@pytest.mark.parametrize("exact", [False, True])
def test_every_pointwise_op_compiles(arch, exact):
    from tkx.ops import OPS
    ops = [make_op(k) for k in sorted(POINTWISE) if OPS[k].c is not None] + [make_op("cast", d) for d in P.C_TYPES]
    k = T.pointwise_kernel(ops, exact=exact)
    compile_ok(k.source, arch, exact=exact)


# --------------------------------------------------------------------------------------
# prelude: dtypes, barriers, reductions
# --------------------------------------------------------------------------------------
@needs_nvrtc
@pytest.mark.parametrize("arch", nv.ARCHES)
def test_dtype_helpers_compile(arch):
    lines = []
    for i, dtype in enumerate(P.C_TYPES):
        lines.append(f"{{ {P.c_type(dtype)}* p = ({P.c_type(dtype)}*)(bufs[{i}]); "
                     f"float v = {P.load(dtype, 'p', 'threadIdx.x')}; v = {P.round_to(dtype, 'v * 3.0f')}; "
                     f"{P.store(dtype, 'p', 'threadIdx.x + 1', 'v')} }}")
    src = P.prelude() + '\nextern "C" __global__ void dt(void** bufs) {\n' + "\n".join(lines) + "\n}\n"
    compile_ok(src, arch)


@needs_nvrtc
@pytest.mark.parametrize("arch", nv.ARCHES)
@pytest.mark.parametrize("mode", ["grid", "block", "grid-generation"])
def test_barrier_kernel_compiles(arch, mode):
    choice = "generation" if mode == "grid-generation" else "auto"
    k = T.barrier_kernel(mode.split("-")[0], grid_barrier=choice)
    r = compile_ok(k.source, arch)
    assert r.stack_bytes == 0


def test_shared_workspace_declaration():
    assert P.shared_workspace(1000) == \
        "__shared__ __align__(128) unsigned char tkx_smem[1008];  // shared workspace, all groups"
    assert P.shared_workspace(100_000).startswith("extern __shared__")


def test_grid_barrier_calls_of_each_kind():
    expected = "if (!tkx_grid_barrier_generation(sync, tkx_gen++, status, 3, spin_limit)) return;"
    assert P.barrier("grid", 3, choice="generation").startswith(expected)
    assert "tkx_barrier_init(sync)" in P.barrier_setup("grid", choice="generation")
    expected = "if (!tkx_grid_barrier(sync, tkx_gen += gridDim.x, status, 3, spin_limit)) return;"
    assert P.barrier("grid", 3, choice="counter").startswith(expected)
    assert P.barrier_setup("grid", choice="counter").startswith("unsigned long long tkx_gen = tkx_arrivals_base(sync);")
    # block mode is the same in both
    for choice in P.GRID_BARRIERS:
        assert P.barrier("block", 2, choice=choice).startswith(
            "if (!tkx_block_barrier(sync, tkx_gen++, status, 2, spin_limit))")
    with pytest.raises(ValueError, match="grid_barrier"):
        P.barrier("grid", 1, choice="fast")


def test_auto_grid_barrier_by_grid_size():
    most = P.COUNTER_BARRIER_MAX_BLOCKS
    assert [P.grid_barrier_kind(b) for b in (None, 1, 132, most, most + 1, 1056)] == \
        ["counter"] * 4 + ["generation"] * 2
    assert "tkx_grid_barrier(sync, tkx_gen += gridDim.x" in P.barrier("grid", 1, blocks=132)
    assert "tkx_grid_barrier_generation(sync, tkx_gen++" in P.barrier("grid", 1, blocks=1056)
    assert "tkx_barrier_init" in P.barrier_setup("grid", 1056) and "tkx_arrivals_base" in P.barrier_setup("grid", 8)


def test_counter_barrier_arrives_without_a_returned_value():
    """The counter barrier's arrival is a release reduction (no value back) and its waiters poll
    with acquires; the generation barrier's arrival is an acquire-release atomic."""
    text = P.BARRIERS
    body = text[text.index("bool tkx_grid_barrier(unsigned int* sync, unsigned long long target"):]
    body = body[:body.index("// Block mode")]
    assert "tkx_red_add_release_u64(arrivals, 1ull)" in body and "tkx_atom_add" not in body
    assert "while (tkx_ld_acquire_u64(arrivals) < target)" in body
    assert "tkx_fail(status, TKX_ERR_BARRIER_TIMEOUT, stage)" in body
    assert "red.release.gpu.global.add.u64" in text and "ld.acquire.gpu.global.u64" in text
    assert "return v - v % gridDim.x;" in text


# --------------------------------------------------------------------------------------
# GEMM emitters
# --------------------------------------------------------------------------------------
def strides(p: G.GemmProblem):
    """(batch, row, col) strides of A and B laid out as the problem's contiguity flags say."""
    a = (p.m * p.k, p.k, 1) if p.a_k_contiguous else (p.m * p.k, 1, p.m)
    b = (p.k * p.n, p.n, 1) if p.b_n_contiguous else (p.k * p.n, 1, p.k)
    return a, b


GEMM_CASES = [
    ("simt", G.GemmProblem(256, 1024, 512)),
    ("simt", G.GemmProblem(100, 70, 33, a_k_contiguous=False, b_n_contiguous=False)),
    ("simt", G.GemmProblem(64, 96, 80, batch=3)),
    ("wmma_bf16", G.GemmProblem(256, 1024, 512, dtype="bfloat16")),
    ("wmma_bf16", G.GemmProblem(100, 70, 40, dtype="bfloat16", a_k_contiguous=False, b_n_contiguous=False)),
    ("wmma_f16", G.GemmProblem(128, 64, 64, batch=2, dtype="float16", b_n_contiguous=False)),
    ("wmma_tf32", G.GemmProblem(256, 1024, 512)),
    ("wmma_tf32", G.GemmProblem(50, 60, 70, a_k_contiguous=False)),
    ("gemv", G.GemmProblem(1, 128, 64)),
    ("gemv", G.GemmProblem(4, 300, 100, b_n_contiguous=False)),
    ("gemv", G.GemmProblem(256, 1, 1024)),
    ("gemv", G.GemmProblem(256, 3, 1000, a_k_contiguous=False, batch=2)),
]


@needs_nvrtc
@pytest.mark.parametrize("arch", nv.ARCHES)
@pytest.mark.parametrize(("variant", "problem"), GEMM_CASES, ids=lambda x: str(x) if isinstance(x, str) else
                         f"{x.batch}x{x.m}x{x.n}x{x.k}-{x.dtype}-{'k' if x.a_k_contiguous else 'm'}"
                         f"{'n' if x.b_n_contiguous else 'k'}")
def test_gemm_compiles(arch, variant, problem):
    if variant.startswith("wmma") and not nv.include_dirs():
        pytest.skip(f"CUDA headers for WMMA not found: {nv.headers_hint()}")
    a, b = strides(problem)
    k = T.gemm_kernel(variant, problem, a_strides=a, b_strides=b)
    r = compile_ok(k.source, arch)
    assert r.shared_bytes == (0 if k.shared_bytes == 0 else max(16, k.shared_bytes))
    assert r.registers <= 255


@needs_nvrtc
@needs_headers
@pytest.mark.parametrize("variant", ["simt", "wmma_bf16", "wmma_tf32"])
def test_gemm_64x64x32_resources(variant):
    """The tile the schedule uses by default: 256 threads, no spills, registers that allow 2 blocks/SM."""
    p = G.GemmProblem(256, 1024, 4096, dtype="bfloat16" if variant == "wmma_bf16" else "float32")
    a, b = strides(p)
    k = T.gemm_kernel(variant, p, a_strides=a, b_strides=b)
    for arch in nv.ARCHES:
        r = compile_ok(k.source, arch)
        assert r.registers <= 128, r.summary()


def test_gemm_code_reads_well():
    p = G.GemmProblem(64, 64, 64)
    code = G.emit_gemm("simt", p, lambda b, r, k: f"A[{r} * 64 + {k}]", lambda b, k, c: f"B[{k} * 64 + {c}]",
                       lambda b, r, c, acc: f"C[{r} * 64 + {c}] = {acc};")
    assert code.code.startswith("{\n    // SIMT fp32 GEMM")
    assert "A[row * 64 + k]" in code.code and "C[row * 64 + col] = acc;" in code.code
    assert "row < M" not in code.code  # 64 divides every size: no bounds checks
    assert all(not line.endswith(" ") for line in code.code.splitlines())
    assert code.work_items == 1
    assert code.shared_bytes == 32 * 65 * 4 + 32 * 64 * 4  # As[TK][TM + 1], Bs[TK][TN]


def test_choose_variant():
    assert G.choose_variant(G.GemmProblem(1, 128, 64))[0] == "gemv"
    assert G.choose_variant(G.GemmProblem(64, 2, 64))[0] == "gemv"
    assert G.choose_variant(G.GemmProblem(64, 64, 64, dtype="bfloat16"))[0] == "wmma_bf16"
    assert G.choose_variant(G.GemmProblem(64, 64, 64), fp32_math="tf32")[0] == "wmma_tf32"
    variant, reason = G.choose_variant(G.GemmProblem(64, 64, 64))
    assert variant == "simt" and "exact" in reason


def test_problem_from_views():
    a = TensorSpec.dense("a", (8, 16), "float32")
    w = TensorSpec.dense("w", (32, 16), "float32")
    wt = TensorSpec((16, 32), "float32", (1, 16), "w")  # w.t()
    p = G.GemmProblem.from_views(a, wt)
    assert (p.m, p.n, p.k, p.a_k_contiguous, p.b_n_contiguous) == (8, 32, 16, True, False)
    at = TensorSpec((16, 8), "float32", (1, 16), "a")  # a.t()
    p = G.GemmProblem.from_views(at, TensorSpec.dense("b", (8, 4), "float32"))
    assert (p.m, p.n, p.k, p.a_k_contiguous, p.b_n_contiguous) == (16, 4, 8, False, True)
    assert G.GemmProblem.from_views(w.__class__.dense("x", (2, 8, 16), "bfloat16"),
                                    TensorSpec.dense("y", (2, 16, 4), "bfloat16")).batch == 2


def test_bad_tiles_are_explained():
    with pytest.raises(ValueError, match="threads"):
        G.emit_gemm("simt", G.GemmProblem(64, 64, 64), *(lambda *a: "0.0f",) * 2, lambda *a: "", threads=100)
    with pytest.raises(ValueError, match="16x16"):
        G.emit_gemm("wmma_bf16", G.GemmProblem(64, 64, 64), *(lambda *a: "0.0f",) * 2, lambda *a: "", tile=(40, 64, 32))


# --------------------------------------------------------------------------------------
# reduction emitters
# --------------------------------------------------------------------------------------
REDUCE_CASES = [
    ("thread", 1000, 20, 20, 1), ("thread", 1024, 256, 1, 1024),  # row sums / a column reduction
    ("warp", 300, 500, 500, 1), ("block", 8, 5000, 5000, 1),
    ("partial", 4, 100_000, 100_000, 1), ("partial", 100, 4096, 1, 100),
    ("columns", 4096, 256, 1, 4096),
]


@needs_nvrtc
@pytest.mark.parametrize("arch", nv.ARCHES)
@pytest.mark.parametrize("kind", R.KINDS)
@pytest.mark.parametrize(("strategy", "rows", "size", "row_stride", "r_stride"), REDUCE_CASES)
def test_reduction_compiles(arch, kind, strategy, rows, size, row_stride, r_stride):
    k = T.reduce_kernel(strategy, kind, rows, size, row_stride=row_stride, r_stride=r_stride,
                        dtype="bfloat16")
    compile_ok(k.source, arch)


def test_choose_strategy():
    assert R.choose_strategy(1000, 16)[0] == "thread"
    assert R.choose_strategy(8192, 256, rows_contiguous=True)[0] == "thread"
    assert R.choose_strategy(512, 4096, rows_contiguous=True)[0] == "partial"
    assert R.choose_strategy(256, 1000)[0] == "warp"
    assert R.choose_strategy(200, 100_000)[0] == "block"
    assert R.choose_strategy(2, 100_000)[0] == "partial"
    # a few rows of at most 2048 (a batch-1 RMSNorm's statistics): a block per row, not one warp alone
    assert R.choose_strategy(1, 2048)[0] == "block" and R.choose_strategy(4, 1024)[0] == "block"
    assert R.choose_strategy(1, 256)[0] == "warp" and R.choose_strategy(132, 2048)[0] == "warp"
    # rows adjacent in memory, enough of them that 32 per work item fills half the grid: one phase
    assert R.choose_strategy(4096, 256, rows_contiguous=True)[0] == "columns"
    assert R.choose_strategy(1024, 256, rows_contiguous=True)[0] == "partial"  # 32 items: two phases
    from tkx.target import ReductionProblem, choose_reduction
    assert choose_reduction(ReductionProblem(4096, 256, True, integer=True), 256).strategy == "thread"


def test_columns_strategy_one_phase_in_order():
    code = R.columns_per_item("sum", 4096, 256, lambda r, i: f"x[{i} * 4096 + {r}]", lambda r, v: f"out[{r}] = {v};")
    assert code.work_items == 128 and code.shared_bytes == 256 * 4 and "scratch" not in code.code
    assert "for (int w = 0; w < 8; ++w)" in code.code and "out[row] = value;" in code.code
    with pytest.raises(ValueError, match="integer"):
        R.columns_per_item("sum", 64, 64, lambda r, i: "0", lambda r, v: "", ctype="long long")


def test_final_phase_folds_few_partials_in_one_thread_per_row():
    """<= THREAD_FINAL_CHUNKS partials per row: one thread per row, chunk order, ``threads`` rows per work item
    (medium's bias gradient: 4096 rows of 3 partials in 16 items instead of 512); more: a warp per row."""
    from tkx.target import THREAD_FINAL_CHUNKS, ReductionPlan, reduction_emitter
    fin = lambda r, v: f"out[{r}] = {v};"  # noqa: E731
    few = R.final_reduce("sum", 4096, 256, 3, fin, scratch="s", threads=256)
    assert few.work_items == 16 and "one thread per row" in few.code and "tkx_warp_sum" not in few.code
    assert "for (int chunk = 0; chunk < 3; ++chunk)" in few.code
    many = R.final_reduce("sum", 4096, 256, THREAD_FINAL_CHUNKS + 1, fin, scratch="s", threads=256)  # warp per row
    assert many.work_items == 512 and "chunk += 32" in many.code
    cost = reduction_emitter("partial").cost
    assert cost(ReductionPlan("partial", "", 4096, 256, True, 3), 256).items == few.work_items
    assert cost(ReductionPlan("partial", "", 4096, 256, True, THREAD_FINAL_CHUNKS + 1), 256).items == many.work_items


def test_mean_divides_by_size():
    code = R.warp_per_row("mean", 4, 10, lambda r, i: f"x[{r} * 10 + {i}]", lambda r, v: f"out[{r}] = {v};")
    assert "const float value = acc / 10.0f;" in code.code
    assert code.work_items == 1


@needs_nvrtc
def test_measure_compile_time(capsys):
    """Not a limit: prints NVRTC's time for a small kernel and a GEMM with tensor-core headers."""
    small = nv.compile_cuda(SMALL, "sm_90")
    p = G.GemmProblem(256, 1024, 512)
    a, b = strides(p)
    simt = nv.compile_cuda(T.gemm_kernel("simt", p, a_strides=a, b_strides=b).source, "sm_90")
    with capsys.disabled():
        print(f"\nNVRTC: small kernel {small.compile_seconds:.3f} s, "
              f"SIMT GEMM kernel {simt.compile_seconds:.3f} s")
    assert small.compile_seconds < 30


def test_a_compile_served_without_a_ptxas_report_is_compiled_again(monkeypatch):
    """cuda-core 1.2.0 (the H200 machine's) answers a repeated compile of one program from its own
    cache with a log that has no ptxas report: the report (registers, spills) must still be there."""
    if nv._backend("auto") != "core":
        pytest.skip("needs cuda-core")
    real = nv._compile_core

    def cached(*args, **kwargs):
        cubin, _log, flags = real(*args, **kwargs)
        return cubin, "", flags  # what the cached answer looks like

    monkeypatch.setattr(nv, "_compile_core", cached)
    report = nv.compile_cuda(SMALL, "sm_90")
    assert report.kernels and report.registers > 0
    assert report.backend == "bindings"


def test_a_cache_below_cuda_core_is_answered_with_a_new_program_text(monkeypatch):
    """On the H200 machine the NVRTC bindings gave the same report-less answer for the same text (and for
    a text that differed by a comment): the second compile sends a program with a new __device__
    variable, whose text and PTX are new."""
    real = nv._compile_bindings
    seen: dict[str, int] = {}

    def caching(source, *args, **kwargs):
        cubin, log, flags = real(source, *args, **kwargs)
        seen[source] = seen.get(source, 0) + 1
        return cubin, ("" if seen[source] > 1 or source == SMALL else log), flags

    monkeypatch.setattr(nv, "_compile_bindings", caching)
    report = nv.compile_cuda(SMALL, "sm_90", backend="bindings")
    assert report.kernels and report.registers > 0 and report.backend == "bindings"
    assert len(seen) == 2 and all(n == 1 for n in seen.values())  # two different texts, each compiled once
    assert any("__device__ int tkx_report_nonce_" in text for text in seen)

