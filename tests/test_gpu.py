"""End to end on a CUDA GPU: every example compiled, verified, run, graph-captured and replayed.

Run with ``pytest -m gpu``; every test skips cleanly on a machine without CUDA. For each
example of :func:`tkx.examples.names` and each option set: the kernel compiles for the
device's own architecture, reports sane resources, verifies against eager and the reference
interpreter, captures in a CUDA graph without changing the user's state, and its replay
matches eager. Also: bad arguments raise one clear error, in-place updates land in the
user's tensors over three steps as eager's do, a kernel-reported error names its stage,
the second compile hits the cache, the torch-extension back end and the benchmark run.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

import tkx
import tkx.bench
import tkx.runtime
from tkx.examples import get, names
from tkx.options import Options
from tkx.runtime.extension import ExtensionUnavailableError

# eager conv2d (cnn_digits) in full fp32 like the kernel: cuDNN would otherwise use TF32 by default
torch.backends.cudnn.allow_tf32 = False

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"
OPTION_SETS = {
    "default": Options(),
    "block": Options(mode="block"),
    "grid": Options(mode="grid"),
    "no-fusion": Options(fuse_epilogues=False, fuse_pointwise=False),
}
_RUNNERS: dict[tuple[str, str], object] = {}


def runner_for(name: str, opt: str = "default"):
    key = (name, opt)
    if key not in _RUNNERS:
        ex = get(name)
        _RUNNERS[key] = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, DEV), OPTION_SETS[opt], name=name,
                                          loss=ex.loss_output)
    return _RUNNERS[key]


def clone_tree(tree):
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def assert_close(got, want, what: str, scale: float = 1.0, program=None):
    from tkx.runtime.inputs import dtype_name
    from tkx.runtime.verify import relative_error, tolerance_for

    tol = tolerance_for(dtype_name(want.dtype), program=program) * scale
    err = relative_error(got, want)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.1e}"


@pytest.mark.parametrize("opt", list(OPTION_SETS))
@pytest.mark.parametrize("name", names())
def test_compile_verify_and_replay(name, opt):
    ex = get(name)
    runner = runner_for(name, opt)
    res = runner.resources
    assert res.registers > 0 and res.occupancy >= 1 and res.block > 0 and res.sm_count > 0
    if res.mode == "block":
        assert res.grid == 1
    else:
        assert 1 <= res.grid <= res.occupancy * res.sm_count
    if opt in ("block", "grid"):
        assert res.mode == opt
    if res.backend == "nvrtc":
        assert res.registers == runner.kernel.binary.report.registers  # driver agrees with ptxas

    verification = runner.verify(seeds=(0, 1), make_inputs=ex.make_inputs)
    assert verification.passed, verification.summary()

    args = ex.make_inputs(2, DEV)
    flat = runner.flatten(args)
    before = [t.clone() for t in flat]
    graph = runner.capture_graph(*args, warmup=3)
    for spec, t, b in zip(runner.program.inputs, flat, before):
        assert torch.equal(t, b), f"capturing changed {spec.name}"

    eager_args = clone_tree(args)
    eager_out = tree_flatten(ex.step_fn(*eager_args))[0]
    out = tree_flatten(graph.replay())[0]
    torch.cuda.synchronize()
    graph.check_status()
    for spec, got, want in zip(runner.program.outputs, out, eager_out):
        assert_close(got, want, f"replayed {spec.name}", program=runner.program)
    eager_flat = runner.flatten(eager_args)
    for u in runner.program.updates:
        spec = runner.program.inputs[u.input_index]
        assert_close(flat[u.input_index], eager_flat[u.input_index], f"replayed update of {spec.name}",
                     program=runner.program)


def test_bad_arguments_raise_one_clear_error():
    ex = get("tiny_online")
    runner = runner_for("tiny_online")
    params, x, y = ex.make_inputs(0, DEV)
    cases = [
        ((dict(params, w1=torch.zeros(64, 7, device=DEV)), x, y), ["params['w1']", "shape (64, 7)"]),
        ((params, x.double(), y), ["input x", "dtype float64"]),
        ((params, x.cpu(), y), ["input x", "is on cpu"]),
        (({k: v for k, v in params.items() if k != "b2"}, x, y), ["missing params['b2']"]),
        ((params, x), ["takes 3 arguments"]),
    ]
    for args, fragments in cases:
        with pytest.raises(tkx.runtime.InputMismatchError) as info:
            runner(*args)
        for fragment in fragments:
            assert fragment in str(info.value), str(info.value)
        assert isinstance(info.value, tkx.TkxError)


@pytest.mark.parametrize("name", names())
def test_updates_land_in_user_tensors_over_three_steps(name):
    ex = get(name)
    runner = runner_for(name)
    args = ex.make_inputs(0, DEV)
    eager_args = clone_tree(args)
    updated = [u.input_index for u in runner.program.updates]
    for step in range(3):
        flat = runner.flatten(args)
        pointers = [t.data_ptr() for t in flat]
        before = [t.clone() for t in flat]
        out = runner(*args)
        eager = ex.step_fn(*eager_args)
        for spec, got, want in zip(runner.program.outputs, tree_flatten(out)[0], tree_flatten(eager)[0]):
            assert_close(got, want, f"step {step} {spec.name}", scale=4.0, program=runner.program)
        eager_flat = runner.flatten(eager_args)
        for i, spec in enumerate(runner.program.inputs):
            assert flat[i].data_ptr() == pointers[i]
            if i in updated:
                assert not torch.equal(flat[i], before[i]), f"step {step}: {spec.name} was not updated"
                assert_close(flat[i], eager_flat[i], f"step {step} update of {spec.name}", scale=4.0,
                             program=runner.program)
            else:
                assert torch.equal(flat[i], before[i]), f"step {step}: {spec.name} changed"
        if isinstance(out, tuple):  # functional step: feed new_params back, as examples.eager_losses does
            args = (out[1], *args[1:])
            eager_args = (eager[1], *eager_args[1:])


def test_out_and_deferred_status_check():
    ex = get("online")
    runner = runner_for("online")
    args = ex.make_inputs(0, DEV)
    outs = [torch.full_like(t, float("nan")) for t in runner.allocate_outputs()]
    result = runner(*args, out=outs, check=False)
    runner.check_status()
    flat = tree_flatten(result)[0]
    assert all(a is b for a, b in zip(flat, outs))
    assert all(torch.isfinite(t).all() for t in flat)


def test_kernel_reported_error_names_the_stage():
    ex = get("online")
    source = tkx.runtime.lower(ex.step_fn, ex.make_inputs(0), Options(mode="grid"), name="online")
    params = list(source.params)
    decls = ", ".join("int* status" if p.role == "status" else f"void* p{i}" for i, p in enumerate(params))
    text = (f'extern "C" __global__ void {source.kernel_name}({decls}) {{\n'
            "    if (blockIdx.x == 0 && threadIdx.x == 0) { status[0] = 1; status[1] = 2; status[2] = 0; }\n"
            "}\n")
    config = dataclasses.replace(source.launch.config, shared_bytes=0)
    fake = dataclasses.replace(source, text=text, launch=dataclasses.replace(source.launch, config=config))
    runner = tkx.runtime.CompiledRunner(fake)
    with pytest.raises(tkx.runtime.KernelError) as info:
        runner(*ex.make_inputs(0, DEV))
    err = info.value
    assert err.code == 1 and err.stage == 2 and "barrier before stage 2" in str(err)
    runner.check_status()  # the words were cleared


def test_second_compile_hits_the_cache():
    runner = runner_for("tiny_online")
    again = tkx.runtime.compile(runner.source, runner.device)
    assert again.resources.cache_hit and again.registers == runner.kernel.registers
    cold = tkx.runtime.compile_cubin(runner.source, runner.resources.arch, cache="refresh")
    hit = tkx.runtime.compile_cubin(runner.source, runner.resources.arch)
    assert not cold.cache_hit and hit.cache_hit and hit.cubin == cold.cubin
    print(f"\nNVRTC tiny_online: cold {cold.compile_seconds:.3f} s, cached {hit.seconds:.4f} s")


def test_torch_extension_backend():
    ex = get("tiny_online")
    try:
        runner = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, DEV), Options(backend="torch-extension"),
                                   name="tiny_online", loss=ex.loss_output)
    except ExtensionUnavailableError as exc:
        pytest.skip(str(exc))
    res = runner.resources
    assert res.backend == "torch-extension" and res.registers > 0 and res.occupancy >= 1
    verification = runner.verify(make_inputs=ex.make_inputs)
    assert verification.passed, verification.summary()
    graph = runner.capture_graph(*ex.make_inputs(1, DEV))
    graph.replay()
    graph.check_status()
    print(f"\ntorch-extension tiny_online: cold build {res.compile_seconds:.1f} s "
          f"(this call {res.seconds:.1f} s, cache hit {res.cache_hit})")


def test_bench_compare_runs_and_reports():
    ex = get("tiny_online")
    report = tkx.bench.compare(ex.step_fn, ex.make_inputs(0), make_inputs=ex.make_inputs, repeats=7,
                               name="tiny_online", loss=ex.loss_output,
                               baselines=("eager", "eager+cudagraph"))
    assert [r.name for r in report.rows] == ["eager", "eager+cudagraph", "tkx", "tkx graph of kernels"]
    assert report.verified and all(r.ok and len(r.samples) == 7 and r.median_us > 0 for r in report.rows)
    assert report.best_baseline in ("eager", "eager+cudagraph") and report.ratio_to_best > 0
    assert report.compile["nvrtc_cached_s"] >= 0 and report.compile["cache_hit"]
    print("\n" + str(report))
