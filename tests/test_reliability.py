"""Issue 17: no wrong number without an error, no poisoned session, errors that point at the
user's line. One regression test per finding (the GPU ones are marked ``gpu``)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from torch.func import grad_and_value, hessian, vmap

import tkx

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _line_of(fn, needle: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if needle in text)


def step_functional(w, x):
    g, v = grad_and_value(lambda w: (x @ w).pow(2).mean())(w)
    return v, w - 0.1 * g


def _wx():
    return torch.randn(3, 3), torch.randn(2, 3)


# -- item 2: in-place update of an input whose elements share memory ----------------------------

def step_update_in_place(w, x):
    g, v = grad_and_value(lambda w: (x @ w).pow(2).mean())(w)
    w.sub_(0.1 * g)  # MARK
    return v


def _overlap_refused(device: str) -> None:
    w = torch.randn(1, 3, device=device).expand(3, 3)
    x = torch.randn(2, 3, device=device)
    with pytest.raises(RuntimeError, match="more than one element"):  # eager refuses it
        step_update_in_place(w, x)
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step_update_in_place, (w, x))
    err = info.value
    assert err.kind == "overlapping-write"
    assert "more than one element of w refers to a single memory location" in str(err)
    assert err.source is not None and err.source.line == _line_of(step_update_in_place, "# MARK")
    assert "clone()" in err.hint
    # the same step with a tensor of its own memory compiles
    tkx.capture(step_update_in_place, (w.clone(), x))


def test_in_place_update_of_overlapping_input_refused():
    _overlap_refused("cpu")


def test_overlapping_input_only_read_is_fine():
    w = torch.randn(1, 3).expand(3, 3)
    tkx.capture(step_functional, (w, torch.randn(2, 3)))


@pytest.mark.gpu
@gpu
def test_in_place_update_of_overlapping_input_refused_on_cuda():
    _overlap_refused("cuda")


# -- item 7: a failed capture leaves torch's state as it found it ------------------------------

def test_failed_functorch_capture_does_not_poison_the_session():
    def f(x):
        return x.sin().sum()

    def step(x):
        return vmap(hessian(f))(x).sum()

    before = torch._C._dispatch_tls_local_exclude_set()
    try:
        tkx.capture(step, (torch.randn(3, 4),))
    except tkx.UnsupportedError:
        pass  # torch may or may not trace vmap(hessian(...)); either way the state must survive
    assert str(torch._C._dispatch_tls_local_exclude_set()) == str(before)
    assert torch._C._functorch.peek_interpreter_stack() is None
    assert torch.is_grad_enabled()
    c = tkx.capture(step_functional, _wx())
    assert c.program.ops


def test_guard_undoes_leaked_functorch_state():
    from tkx.capture.trace import TorchStateGuard
    guard = TorchStateGuard().__enter__()
    torch._C._dispatch_tls_set_dispatch_key_excluded(torch._C.DispatchKey.Functionalize, True)
    torch.set_grad_enabled(False)
    undone = guard.restored()
    assert "dispatch keys" in undone and "grad mode" in undone
    assert not torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Functionalize)
    assert torch.is_grad_enabled()
    assert guard.restored(final=True) == []


# -- item 11: imperative training inside the step -----------------------------------------------

def step_backward(w, x):
    loss = (x @ w).pow(2).mean()
    loss.backward()  # MARK
    return loss


def step_requires_grad(w, x):
    w = w.requires_grad_()  # MARK
    return (x @ w).pow(2).mean()


def step_optimizer(w, x):
    g, v = grad_and_value(lambda w: (x @ w).pow(2).mean())(w)
    w.grad = g
    torch.optim.SGD([w], lr=0.1).step()  # MARK
    return v


@pytest.mark.parametrize("fn", [step_backward, step_requires_grad, step_optimizer],
                         ids=["backward", "requires_grad_", "optim.step"])
def test_imperative_training_says_the_step_must_be_functional(fn):
    w, x = _wx()
    if fn is step_backward:
        w.requires_grad_()
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(fn, (w, x))
    err = info.value
    assert err.kind == "not-functional", str(err)
    assert "grad_and_value" in err.hint and "p - lr * grads[k]" in err.hint
    assert err.source is not None and err.source.line == _line_of(fn, "# MARK"), str(err)


# -- item 12: API errors ------------------------------------------------------------------------

def test_step_fn_none_is_a_bad_call():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(None, _wx())
    assert info.value.kind == "bad-call" and "not a function" in str(info.value)
    assert "TypeError" not in str(info.value)


def test_zero_row_batch_refused_at_capture():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step_functional, (torch.randn(3, 3), torch.randn(0, 3)))
    assert info.value.kind == "bad-input" and "input x has shape (0, 3)" in str(info.value)
    assert info.value.source is not None and info.value.source.file == __file__


def test_meta_inputs_are_not_told_they_share_memory():
    w, x = torch.randn(3, 3, device="meta"), torch.randn(2, 3, device="meta")
    c = tkx.capture(step_functional, (w, x))
    assert [i.name for i in c.program.inputs] == ["w", "x"]


def step_raises(w, x):
    raise ValueError("my own problem")  # MARK


def test_users_own_exception_is_not_unsupported_op():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step_raises, _wx())
    err = info.value
    assert err.kind == "step-raised" and "ValueError: my own problem" in str(err)
    assert err.source.line == _line_of(step_raises, "# MARK")
    assert isinstance(err.__cause__, ValueError)


def test_options_as_a_dict():
    exp = tkx.explore(step_functional, _wx(), options={"fuse_pointwise": False})
    assert exp.options.fuse_pointwise is False
    with pytest.raises(tkx.OptionsError, match="tile_mm"):
        tkx.explore(step_functional, _wx(), options={"tile_mm": 32})
    with pytest.raises(tkx.OptionsError, match="not list"):
        tkx.explore(step_functional, _wx(), options=[1])


def test_loss_pointing_at_a_non_scalar_refused():
    with pytest.raises(tkx.UnsupportedError) as info:
        tkx.capture(step_functional, _wx(), loss=1)
    assert "not a 0-d floating-point tensor" in str(info.value) and "(3, 3)" in str(info.value)
    assert tkx.capture(step_functional, _wx(), loss=0).loss_index == 0


# -- item 4: cross-entropy with every target ignored --------------------------------------------

def step_cross_entropy(w, x, y):
    g, v = grad_and_value(lambda w: torch.nn.functional.cross_entropy(x @ w, y))(w)
    return v, w - 0.1 * g


@pytest.mark.parametrize("targets", [[-100, -100], [2, -100]], ids=["all-ignored", "one-ignored"])
def test_cross_entropy_ignored_targets_give_eager_gradients(targets):
    from tkx.schedule import interpreter
    torch.manual_seed(0)
    inputs = (torch.randn(3, 4), torch.randn(2, 3), torch.tensor(targets))
    want_loss, want_w = step_cross_entropy(*inputs)
    exp = tkx.explore(step_cross_entropy, inputs)
    for run in (tkx.reference.run(exp.program, inputs), interpreter.run(exp.schedule, exp.arena, inputs)):
        loss, w = run.outputs
        assert torch.isfinite(w).all(), w
        torch.testing.assert_close(w, want_w)
        assert torch.isnan(loss) == torch.isnan(want_loss)


# -- item 5: the schedule interpreter reads a view of an arena slot at its own offset ------------

def step_sum_of_sums(a, b):
    s = (a * a).sum() + (b * b).sum()
    return s + (s * s).sum()


def step_tiny_clipped_mlp(w1, b1, w2, b2, x, y):
    def loss_fn(p):
        w1, b1, w2, b2 = p
        h = torch.relu(x @ w1 + b1)
        return ((h @ w2 + b2 - y) ** 2).mean()
    g, v = grad_and_value(loss_fn)((w1, b1, w2, b2))
    norm = torch.sqrt(sum((gi * gi).sum() for gi in g))
    scale = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
    return v, w1 - 0.1 * scale * g[0], b1 - 0.1 * scale * g[1], w2 - 0.1 * scale * g[2], b2 - 0.1 * scale * g[3]


@pytest.mark.parametrize("case", ["sum_of_sums", "tiny_clipped_mlp"])
@pytest.mark.parametrize("opts", [dict(fuse_pointwise=False), dict(fuse_pointwise=False, fuse_epilogues=False), {}],
                         ids=["no-pointwise", "no-pointwise-no-epilogue", "default"])
def test_schedule_interpreter_agrees_with_reference_on_views(case, opts):
    from tkx.schedule import interpreter
    from tkx.schedule.check import check_hazards
    torch.manual_seed(0)
    if case == "sum_of_sums":
        fn, inputs = step_sum_of_sums, (torch.randn(3), torch.randn(4))
    else:
        fn = step_tiny_clipped_mlp
        inputs = (torch.randn(1, 1), torch.randn(()), torch.randn(1, 1), torch.randn(()),
                  torch.randn(4, 1), torch.randn(4, 1))
    exp = tkx.explore(fn, inputs, **opts)
    want = fn(*inputs)
    want = list(want) if isinstance(want, tuple) else [want]
    ref = tkx.reference.run(exp.program, inputs).outputs
    got = interpreter.run(exp.schedule, exp.arena, inputs).outputs
    for w, r, g in zip(want, ref, got):
        torch.testing.assert_close(r, w)
        torch.testing.assert_close(g, w)
    assert check_hazards(exp.schedule, exp.arena) == []


def test_check_hazards_sees_a_view_outside_its_buffer_and_a_short_slot():
    import dataclasses

    from tkx.schedule.check import check_hazards
    exp = tkx.explore(step_sum_of_sums, (torch.randn(3), torch.randn(4)), fuse_pointwise=False)
    sched, arena = exp.schedule, exp.arena
    ops = list(sched.program.ops)
    k = next(i for i, op in enumerate(ops) if op.id == "sum_3")
    bad_in = dataclasses.replace(ops[k].inputs[0], offset=2)
    ops[k] = ops[k].replace(inputs=(bad_in,))
    bad_sched = dataclasses.replace(sched, program=sched.program.replace(ops=tuple(ops)))
    problems = check_hazards(bad_sched, arena)
    assert any("sum_3 reads mul_2 through a view (offset 2" in p for p in problems), problems
    slots = dict(arena.slots)
    slots["mul"] = dataclasses.replace(slots["mul"], nbytes=8)
    problems = check_hazards(sched, dataclasses.replace(arena, slots=slots))
    assert any("arena slot of mul holds 8 B but the value needs 12 B" in p for p in problems), problems


# -- item 6: verify draws integer inputs from the range the step accepts ------------------------

def readme_step(params, x, y):
    def loss_fn(p):
        return torch.nn.functional.cross_entropy(torch.tanh(x @ p["w1"]) @ p["w2"], y)
    grads, loss = grad_and_value(loss_fn)(params)
    return loss, {k: p - 0.1 * grads[k] for k, p in params.items()}


def readme_inputs(device="cpu"):
    params = {"w1": torch.randn(16, 32, device=device) * 0.25, "w2": torch.randn(32, 4, device=device) * 0.2}
    return (params, torch.randn(8, 16, device=device), torch.randint(0, 4, (8,), device=device))


def test_integer_inputs_drawn_from_the_classes_they_index():
    from tkx.runtime import verify as V
    exp = tkx.explore(readme_step, readme_inputs())
    program = exp.optimized
    ranges = V.integer_ranges(program)
    (i, r), = ranges.items()
    assert program.inputs[i].name == "y" and (r.low, r.high) == (0, 4) and r.also == (-100,)
    assert "4 class indices" in r.why or "checked by" in r.why
    for seed in range(20):
        y = V.random_inputs(program, seed, torch.device("cpu"), ranges=ranges)[2]
        assert 0 <= int(y.min()) and int(y.max()) < 4
    # int_high may not widen a range the step's own shapes fix
    assert V.integer_ranges(program, int_high=10)[i].high == 4


def test_integer_range_falls_back_to_the_example_inputs():
    from tkx.runtime import verify as V

    def step(w, k):
        return (w * k).sum()
    exp = tkx.explore(step, (torch.randn(5), torch.randint(3, 7, (5,))))
    r = V.integer_ranges(exp.optimized, [None, torch.tensor([3, 6, 4])])[1]
    assert (r.low, r.high) == (3, 7) and "example" in r.why
    assert (V.integer_ranges(exp.optimized, int_high=2)[1].high) == 2


def test_out_of_range_integer_inputs_refused_before_running():
    from tkx.runtime import verify as V

    class NeverRun:
        def __init__(self):
            self.program = tkx.explore(readme_step, readme_inputs()).optimized
            self.options = tkx.Options()
            self.device = torch.device("cpu")
            self.step_fn = readme_step

        def flatten(self, args):
            from tkx.runtime.inputs import flatten_args
            return flatten_args(self.program, args)

        def __getattr__(self, name):
            if name == "example_integers":
                raise AttributeError(name)
            raise AssertionError(f"verify ran {name} on inputs it should have refused")

    def bad_inputs(seed):
        params, x, y = readme_inputs()
        return params, x, torch.full((8,), 7)

    runner = NeverRun()
    runner.step_fn = lambda *a: (_ for _ in ()).throw(AssertionError("eager ran"))
    with pytest.raises(V.InputRangeError, match=r"input y of seed 0 holds values in \[7, 7\].*\[0, 4\)"):
        V.verify(runner, seeds=(0,), make_inputs=bad_inputs)


@pytest.mark.gpu
@gpu
def test_verify_of_the_readme_example_does_not_break_the_cuda_context():
    from tkx.runtime import verify as V
    torch.manual_seed(0)
    inputs = readme_inputs("cuda")
    runner = tkx.runtime.build(readme_step, inputs)
    result = runner.verify(seeds=(0, 1, 2, 3))
    assert result.passed, result.summary()

    def bad_inputs(seed, device=None):
        params, x, y = readme_inputs("cuda")
        return params, x, torch.full((8,), 9, device="cuda")
    with pytest.raises(V.InputRangeError):
        runner.verify(seeds=(0,), make_inputs=bad_inputs)
    # the context still works: a cuBLAS call and the kernel
    a = torch.randn(64, 64, device="cuda")
    torch.testing.assert_close((a @ a).cpu(), a.cpu() @ a.cpu(), rtol=1e-3, atol=1e-3)
    runner(*inputs)
    torch.cuda.synchronize()


# -- item 8: float64 arbitration -----------------------------------------------------------------

def step_inverse_layer_norm(x, w):
    y = torch.nn.functional.layer_norm(x * w, (x.shape[-1],))
    return (1 / (y.abs() + 1e-6)).mean(), w * 1.0


class Fp64Runner:
    """A 'kernel' that computes in float64 and rounds once: the most accurate one possible
    (``scale`` != 1 makes it wrong)."""

    def __init__(self, fn, inputs, scale=1.0):
        from tkx.runtime.inputs import allocate_outputs, flatten_args
        self.program = tkx.explore(fn, inputs).optimized
        self.options = tkx.Options()
        self.device = torch.device("cpu")
        self.step_fn = fn
        self.scale = scale
        self._alloc, self._flat = allocate_outputs, flatten_args

    def flatten(self, args):
        return self._flat(self.program, args)

    def allocate_outputs(self):
        return self._alloc(self.program, self.device)

    def new_arena(self):
        return torch.empty(16, dtype=torch.uint8)

    def run_flat(self, flat, *, out=None, arena=None, check=True):
        from tkx.runtime.verify import reference_fp64
        exact = reference_fp64(self.program, flat)
        for o, v in zip(out, exact):
            o.copy_(v * self.scale)
        return out


def test_fp64_arbitration_passes_a_kernel_more_accurate_than_eager():
    from tkx.runtime import verify as V
    torch.manual_seed(0)

    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(64, 257, generator=g), torch.randn(257, generator=g)
    runner = Fp64Runner(step_inverse_layer_norm, make(0))
    plain = V.verify(runner, seeds=(0, 1, 2), make_inputs=make, fp64=False)
    assert not plain.passed, "eager is within 1e-5 of float64 here: the case no longer shows the problem"
    result = V.verify(runner, seeds=(0, 1, 2), make_inputs=make)
    assert result.passed, result.summary()
    c = max((c for c in result.comparisons if c.name == "out[0]"), key=lambda c: c.vs_eager)
    assert c.arbitrated and c.closer == "kernel" and c.vs_fp64 < c.eager_vs_fp64
    assert c.ulps is not None and c.ulps <= 1.0
    assert "float64 arbitration passes it" in result.summary() and "kernel is closer" in result.summary()
    wrong = V.verify(Fp64Runner(step_inverse_layer_norm, make(0), scale=1.001), seeds=(0,), make_inputs=make)
    assert not wrong.passed and "eager is closer" in wrong.summary()


def test_reference_fp64_is_float64_math_and_rounds_only_explicit_casts():
    from tkx.runtime.verify import reference_fp64, ulp_distance

    def step(x):
        return (x * 3.0).sum(), (x.to(torch.bfloat16) * 1.0).float().sum()
    x = torch.rand(1000) + 1.0
    exp = tkx.explore(step, (x,))
    s64, sbf = reference_fp64(exp.optimized, [x])[:2]
    assert s64.dtype == torch.float64
    assert abs(float(s64) - float((x.double() * 3).sum())) < 1e-9
    assert abs(float(sbf) - float(x.to(torch.bfloat16).double().sum())) < 1e-9
    assert ulp_distance(torch.tensor([1.0 + 2 ** -23]), torch.tensor([1.0], dtype=torch.float64), "float32") == 1.0


# -- item 9: an oversubscribed cooperative launch is a tkx error ---------------------------------

def test_cooperative_oversubscription_message_names_the_limit():
    from tkx.runtime.kernel import KernelLoadError, cooperative_limit_error, occupancy_limits
    assert cooperative_limit_error(132, 1, 132, 128, 0, 49152, 512) is None
    limits = occupancy_limits(128, 1024, 49152, 512)
    assert limits["registers"] == 1 and limits["shared memory"] == 4 and limits["threads"] == 4
    err = cooperative_limit_error(133, 1, 132, 128, 1024, 49152, 512, limits)
    assert isinstance(err, KernelLoadError) and isinstance(err, tkx.TkxError)
    text = str(err)
    assert "cooperative launch of 133 blocks" in text and "at most 132" in text
    assert "set by registers" in text and "128 registers/thread x 512 threads" in text
    assert "1024 B static + 49152 B dynamic shared memory" in text
    err = cooperative_limit_error(300, 2, 132, 32, 0, 100_000, 256, occupancy_limits(32, 0, 100_000, 256))
    assert "set by shared memory" in str(err)


def _tiny_runner():
    def step(w, x):
        g, v = grad_and_value(lambda w: (x @ w).pow(2).mean())(w)
        return v, w - 0.1 * g
    inputs = (torch.randn(64, 64, device="cuda"), torch.randn(128, 64, device="cuda"))
    return tkx.runtime.build(step, inputs, tkx.Options(mode="grid")), inputs


@pytest.mark.gpu
@gpu
def test_oversubscribed_cooperative_launch_is_a_tkx_error():
    from tkx.runtime.kernel import KernelLoadError
    runner, inputs = _tiny_runner()
    k = runner.kernel
    most = k.occupancy * k.sm_count
    k.grid = most + 1
    k._config = k._core.LaunchConfig(grid=k.grid, block=k.block, shmem_size=k.dynamic_shared_bytes,
                                     is_cooperative=True)
    with pytest.raises(KernelLoadError, match=rf"cooperative launch of {most + 1} blocks.*at most {most}"):
        runner(*inputs)
    # cuda-core's own check (the occupancy tkx believes is too high): still the tkx error
    k.occupancy += 1
    with pytest.raises(KernelLoadError, match=r"registers/thread"):
        runner(*inputs)


# -- item 10: NVRTC headers -----------------------------------------------------------------------

def _nvrtc_or_skip():
    from tkx.codegen.nvrtc import nvrtc_available
    ok, why = nvrtc_available()
    if not ok:
        pytest.skip(why)


def _fake_headers(folder, version: int, body: str = "") -> str:
    folder.mkdir(parents=True)
    (folder / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION  {version}\n")
    (folder / "cuda_bf16.h").write_text(f"// bf16 {body}\n")
    return str(folder)


def test_header_version_and_the_choice_of_headers_matching_nvrtc(tmp_path):
    from tkx.codegen.nvrtc import HeaderSet, choose_headers, header_version
    a = _fake_headers(tmp_path / "a", 13000)
    b = _fake_headers(tmp_path / "b", 13050)
    c = _fake_headers(tmp_path / "c", 12080)
    assert header_version(a) == (13, 0) and header_version(b) == (13, 5) and header_version(str(tmp_path)) is None
    cands = [(a, (13, 0)), (c, (12, 8)), (b, (13, 5))]
    assert choose_headers(cands, (13, 5))[0] == b       # the exact match, wherever it is listed
    assert choose_headers(cands, (13, 2))[0] == a       # else the newest same-major not newer
    assert choose_headers(cands, (12, 9))[0] == c
    assert choose_headers(cands, None)[0] == a
    text = HeaderSet((a,), (13, 0), (13, 5)).describe()
    assert "NVRTC 13.5" in text and a in text and "CUDA 13.0" in text and "do not match" in text
    assert "do not match" not in HeaderSet((b,), (13, 5), (13, 5)).describe()


def test_header_error_names_versions_and_quotes_the_header_line():
    _nvrtc_or_skip()
    from tkx.codegen import nvrtc as N
    if not N.include_dirs():
        pytest.skip("no CUDA headers")
    src = "#define __half int\n#include <cuda_fp16.h>\n__global__ void k(float* x) { x[0] = 1.0f; }\n"
    with pytest.raises(N.CudaCompileError) as info:
        N.compile_cuda(src, "sm_90")
    text = str(info.value)
    major, minor = N.nvrtc_version()
    assert f"NVRTC {major}.{minor}" in text and N.include_dirs()[0] in text
    first = next(line for line in text.splitlines() if "error" in line and "cuda_fp16.h(" in line)
    lineno = int(first.split("cuda_fp16.h(")[1].split(")")[0])
    header_path = first.split("(")[0]
    want = open(header_path).read().splitlines()[lineno - 1]
    assert f">{lineno:5d} | {want}" in text, text[:2000]
    assert "#define __half int" not in text.split(first, 1)[1].splitlines()[1]


def test_kernel_errors_still_quote_the_kernel():
    from tkx.codegen.nvrtc import quote_errors
    log = "tkx_kernel.cu(2): error: identifier \"y\" is undefined\n"
    text = quote_errors(log, "int a;\nint b = y;\nint c;\n")
    assert ">    2 | int b = y;" in text, text


# -- item 14: the compile cache --------------------------------------------------------------------

TINY = r"""
extern "C" __global__ void tkx_step(const float* in0, float* out0, unsigned char* arena, unsigned int* sync,
                                    int* status) {
    int i = threadIdx.x;
    if (i < 16) out0[i] = 2.0f * in0[i] + 1.0f;
}
"""


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TKX_CACHE_DIR", str(tmp_path / "tkx-cache"))
    return tmp_path / "tkx-cache"


@pytest.mark.parametrize("field,value", [("compile_seconds", "fast"), ("compile_seconds", None),
                                         ("registers", "many"), ("spill_store_bytes", -4),
                                         ("kernels", "x"), ("arch", 90)])
def test_damaged_cache_entry_is_recompiled_not_served(cache_home, field, value):
    _nvrtc_or_skip()
    import json

    from tkx.runtime import cache as C
    from tkx.runtime import kernel as K
    first = K.compile_cubin(TINY, "sm_90")
    meta_path = cache_home / "nvrtc" / f"{first.key}.json"
    meta = json.loads(meta_path.read_text())
    if field == "compile_seconds":
        meta["compile_seconds"] = value
    else:
        meta["report"][field] = value
    meta_path.write_text(json.dumps(meta))
    again = K.compile_cubin(TINY, "sm_90")
    assert not again.cache_hit and again.report.registers == first.report.registers
    assert isinstance(again.compile_seconds, float)
    assert K.compile_cubin(TINY, "sm_90").cache_hit  # the entry was rewritten whole
    assert C.load_entry(first.key) is not None


def test_a_compile_without_a_ptxas_report_is_never_cached(cache_home, monkeypatch):
    """An entry whose report has no kernel (no registers, no spill figures) is neither stored nor served."""
    _nvrtc_or_skip()
    import dataclasses
    import json

    from tkx.codegen import nvrtc as N
    from tkx.runtime import cache as C
    from tkx.runtime import kernel as K
    real = N.compile_cuda
    monkeypatch.setattr(N, "compile_cuda", lambda *a, **k: dataclasses.replace(real(*a, **k), kernels=(), registers=0))
    blind = K.compile_cubin(TINY, "sm_90")
    assert C.load_entry(blind.key) is None  # not stored
    monkeypatch.setattr(N, "compile_cuda", real)
    good = K.compile_cubin(TINY, "sm_90")
    assert not good.cache_hit and good.report.registers > 0
    meta_path = cache_home / "nvrtc" / f"{good.key}.json"
    meta = json.loads(meta_path.read_text())
    meta["report"]["kernels"] = []  # an entry left by an older tkx without the report
    meta_path.write_text(json.dumps(meta))
    again = K.compile_cubin(TINY, "sm_90")
    assert not again.cache_hit and again.report.kernels


def test_cache_key_follows_header_contents_not_their_folder(tmp_path, monkeypatch):
    _nvrtc_or_skip()
    from tkx.codegen import nvrtc as N
    from tkx.runtime import kernel as K
    one = _fake_headers(tmp_path / "one", 13000, "same")
    two = _fake_headers(tmp_path / "two", 13000, "same")
    monkeypatch.setattr(N, "include_dirs", lambda: (one,))
    key_one, flags_one = K.nvrtc_cache_key(TINY, "sm_90")
    assert f"-I{one}" in flags_one
    monkeypatch.setattr(N, "include_dirs", lambda: (two,))
    key_two, _ = K.nvrtc_cache_key(TINY, "sm_90")
    assert key_one == key_two  # same headers elsewhere: shared entry
    (tmp_path / "two" / "cuda_bf16.h").write_text("// bf16 replaced\n")
    key_replaced, _ = K.nvrtc_cache_key(TINY, "sm_90")
    assert key_replaced != key_two  # replaced headers: a new entry


def test_refresh_never_deletes_the_shared_extension_folder(cache_home, monkeypatch):
    import torch.utils.cpp_extension as cpp_extension

    from tkx.runtime import extension as E
    from tkx.runtime.cache import cache_dir
    built = []
    monkeypatch.setattr(E, "check_toolchain", lambda: None)
    monkeypatch.setattr(E, "kernel_arch", lambda device: "sm_90")
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: built.append(kw) or object())
    monkeypatch.setattr(E.ExtensionKernel, "__init__", lambda self, *a, **kw: None)

    source = tkx.explore(step_functional, _wx()).cuda  # a real CudaSource (its launch contract is read)
    E.ExtensionKernel.build(source, torch.device("cpu"), cache=True)
    shared = Path(built[0]["build_directory"])
    (shared / "in-use-by-another-process").write_text("x")
    E.ExtensionKernel.build(source, torch.device("cpu"), cache="refresh")
    cold = Path(built[1]["build_directory"])
    assert cold != shared and cold.parent == cache_dir() / "torch-extension"
    assert built[1]["name"] != built[0]["name"]
    assert (shared / "in-use-by-another-process").exists()
    assert not cold.exists()  # the private cold-build folder is removed after loading


# -- item 13: a user pass or fusion rule with an infinite loop -------------------------------------

@pytest.fixture
def short_limit(monkeypatch):
    import tkx.watchdog as W
    monkeypatch.setattr(W, "TIME_LIMIT_SECONDS", 0.3)
    return W


def test_looping_pass_is_stopped_and_named(short_limit):
    import time

    def spin_forever(program):
        while True:
            pass
    start = time.monotonic()
    with pytest.raises(short_limit.UserCodeTimeout, match=r"pass 'spin_forever' ran for more than 0.3 s"):
        tkx.passes.run_passes(tkx.capture(step_functional, _wx()).program, [spin_forever])
    assert time.monotonic() - start < 10
    # the session goes on: the next run works and no stray exception is pending
    tkx.passes.run_passes(tkx.capture(step_functional, _wx()).program)
    time.sleep(0.7)


def test_looping_fusion_rule_that_catches_exceptions_is_stopped(short_limit):
    @tkx.fusion_rule("spin-rule", kinds=("inline", "loop", "epilogue"))
    def spin(c):
        while True:
            try:
                while True:
                    pass
            except Exception:  # catches the rule's own errors, not the time limit
                pass
    try:
        with pytest.raises(short_limit.UserCodeTimeout, match="fusion rule 'spin-rule'"):
            _ = tkx.explore(step_functional, _wx()).schedule
    finally:
        tkx.schedule.remove_fusion_rule("spin-rule")
    assert tkx.explore(step_functional, _wx()).schedule.groups


def test_fast_user_code_is_untouched(short_limit):
    import time
    with short_limit.user_code("quick"):
        time.sleep(0.05)
    time.sleep(0.5)  # nothing fires after the block ended


# -- items 15, 16: graphviz escaping, dot's own errors, graphs that display without dot ------------

def step_continued(a, b):
    return (a * \
            b).sum()  # the source line of the mul ends in a line-continuation backslash


def _dot_or_skip():
    from tkx.render import dot_available
    if not dot_available():
        pytest.skip("Graphviz's dot is not installed")


def test_labels_with_backslashes_and_angle_brackets_render():
    _dot_or_skip()
    from tkx.render import run_dot
    inputs = (torch.randn(3), torch.randn(3))
    exp = tkx.explore(step_continued, inputs)
    assert any(op.source and op.source.code.endswith("\\") for op in exp.program.ops)
    for graph in (exp.program.graph(), exp.captured.graph(), exp.schedule.graph()):
        svg, why = run_dot(graph)
        assert svg is not None, why

    def odd(program):
        return program
    odd.__name__ = "<lambda> <map>"

    def slash(program):
        return program
    slash.__name__ = "a\\"
    trace = tkx.passes.run_passes(exp.program, [odd, slash])
    svg, why = run_dot(trace.graph())
    assert svg is not None, why
    assert "&lt;lambda&gt; &lt;map&gt;" in svg and "a\\" in svg


def test_dot_failure_shows_dots_own_error():
    _dot_or_skip()
    from tkx.render import graph_html, run_dot, safe_digraph
    g = safe_digraph(name="broken")
    g.body.append("\tthis is { not dot ]\n")
    svg, why = run_dot(g)
    assert svg is None and why.startswith("Graphviz's dot failed:") and "syntax error" in why
    assert "syntax error" in graph_html(g) and "DOT source" in graph_html(g)
    bundle = g._repr_mimebundle_()
    assert "syntax error" in bundle["text/plain"]


def test_program_graph_displays_without_dot(monkeypatch):
    import tkx.render as R
    import tkx.render.base as B
    monkeypatch.setattr(R, "dot_available", lambda: False)
    monkeypatch.setattr(B, "dot_available", lambda: False)
    g = tkx.explore(step_functional, _wx()).program.graph()
    bundle = g._repr_mimebundle_()  # what Jupyter calls: no ExecutableNotFound
    assert "not installed" in bundle["text/plain"] and "apt-get install graphviz" in bundle["text/plain"]
    assert "digraph" in bundle["text/plain"] and "DOT source" in bundle["text/html"]
    assert "image/svg+xml" not in bundle


# -- item 3: fp16 sums over huge tensors -------------------------------------------------------------

def step_sum_mean(x):
    return x.sum(), x.mean()


HUGE = 2**31 - 2


def test_huge_fp16_reduction_loops_use_64_bit_indices():
    # capture and codegen need only shapes: meta tensors stand in for 4 GB of halves
    exp = tkx.explore(step_sum_mean, (torch.empty(HUGE, dtype=torch.float16, device="meta"),))
    text = exp.cuda.text
    loops = [line.strip() for line in text.splitlines() if line.strip().startswith("for (") and " r " in line]
    wide = [line for line in loops if "r_begin" in line or str(HUGE) in line]  # loops that could wrap at 2**31
    assert wide and all(line.startswith("for (long long r") for line in wide), loops
    assert "int r_begin" not in text and "long long r_begin" in text
    assert "float acc" in text  # partials accumulate in fp32, rounded to fp16 once at the end
    # small reductions keep their 32-bit loops (and their stored CUDA text)
    small = tkx.explore(step_sum_mean, (torch.randn(1000).half(),)).cuda.text
    assert "for (long long r" not in small
    from tkx.codegen.nvrtc import nvrtc_available
    if nvrtc_available():
        assert exp.cuda.check("sm_90").spill_bytes == 0


def step_reshaped(x):
    y = x.reshape(2, -1) * 2.0  # MARK
    return y.sum()


def test_too_large_tensor_refusal_names_the_tensor_and_the_line():
    with pytest.raises(tkx.UnsupportedError) as info:
        _ = tkx.explore(step_reshaped, (torch.empty(2**31, dtype=torch.float16, device="meta"),)).cuda
    err = info.value
    assert "input x has 2147483648 elements" in str(err)
    assert err.source is not None and err.source.line == _line_of(step_reshaped, "# MARK")


def test_fp16_sums_accumulate_in_fp32_in_both_interpreters():
    from tkx.schedule import interpreter
    x = torch.ones(10_000, dtype=torch.float16)  # a float16 accumulator would stop at 2048
    for opts in ({}, {"mode": "grid"}):
        exp = tkx.explore(step_sum_mean, (x,), **opts)
        for run in (tkx.reference.run(exp.program, (x,)), interpreter.run(exp.schedule, exp.arena, (x,))):
            s, m = run.outputs
            assert float(s) == 10_000.0 and float(m) == 1.0


@pytest.mark.gpu
@gpu
def test_huge_fp16_sum_on_the_gpu():
    if torch.cuda.get_device_properties(0).total_memory < 16 * 2**30:
        pytest.skip("needs 16 GB of GPU memory")
    x = torch.ones(HUGE, dtype=torch.float16, device="cuda")
    x[1::2] = -1.0
    runner = tkx.runtime.build(step_sum_mean, (x,))
    s, m = runner(x)
    torch.cuda.synchronize()
    assert float(s) == 0.0 and float(m) == 0.0, (float(s), float(m))
    y = torch.ones(1_000_000, dtype=torch.float16, device="cuda") * 0.01
    s, m = tkx.runtime.build(step_sum_mean, (y,))(y)
    torch.testing.assert_close(float(s), float(y.float().sum()), rtol=1e-3, atol=0)


# -- item 17: the CUDA view of a long kernel -------------------------------------------------------

def test_long_kernel_view_is_paged_and_never_compiles_to_render(monkeypatch):
    import tkx.codegen.nvrtc as N
    import tkx.render.cuda as SV
    monkeypatch.setenv("TKX_CACHE_DIR", str(Path(__file__).parent / ".no-such-cache-dir"))
    cuda = tkx.explore(readme_step, readme_inputs()).cuda
    monkeypatch.setattr(SV, "CUDA_VIEW_LINES", 60)
    monkeypatch.setattr(tkx.codegen.source, "CUDA_VIEW_LINES", 60)
    assert cuda.num_lines > 3 * 60
    calls = []
    real = N.compile_cuda
    monkeypatch.setattr(N, "compile_cuda", lambda *a, **kw: calls.append(a[1]) or real(*a, **kw))
    html = cuda._repr_mimebundle_()["text/html"]
    assert calls == []  # a long kernel is not compiled just to be shown
    assert "not compiled for the view" in html and "cuda.page(2)" in html
    assert "showing lines" in html and html.count('class="tkx-ln"') <= 60 + 400  # prelude + one page
    assert "every line at once: the Explorer's linked views tab" in html.replace("&#x27;", "'")
    page2 = cuda.page(2)
    text = str(page2)
    assert len(text.splitlines()) == 60 and text.splitlines()[0] in cuda.text
    assert "cuda.page(3)" in page2._repr_mimebundle_()["text/html"]
    if N.nvrtc_available():
        cuda.check("sm_90")
        assert calls == ["sm_90"]
        html = cuda._repr_mimebundle_()["text/html"]
        assert calls == ["sm_90"] and "registers" in html  # the report, without a second compile


def test_short_kernel_view_is_unchanged():
    cuda = tkx.explore(step_functional, _wx()).cuda
    html = cuda.html(check=False)
    assert "showing lines" not in html
    assert html.count('class="tkx-ln"') == len(cuda.text.split("\n"))
