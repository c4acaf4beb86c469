"""2-CTA thread-block clusters with TMA multicast (``Options.gemm_cluster``) on a Hopper GPU: the
examples verified with the switch on, the launch in whole clusters no larger than the co-resident
maximum, and many CUDA-graph replays (no grid-barrier timeout, still correct afterwards).

Run with ``pytest -m gpu``; skipped without a compute-capability 9.0 GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):  # pragma: no cover
    pytest.skip("needs an sm_90 (Hopper) GPU", allow_module_level=True)

from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

import tkx  # noqa: E402
import tkx.runtime  # noqa: E402
from tkx.examples import get  # noqa: E402
from tkx.options import Options  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
#: (example, Options.gemm_cluster): "on" pairs medium's 256-row GEMMs (K deep enough); "all" pairs every GEMM
#: whose items pair up (small's and medium's K = 64 / 256 weight gradients too: one k-tile, no refill).
CASES = [("medium", "on"), ("medium", "all"), ("small", "all")]
#: The stage handshake's memory semantics (``Options.cluster_scope``): both are verified.
SCOPES = ("cluster", "cta")
_RUNNERS: dict = {}


def _runner(name: str, cluster: str, scope: str):
    key = (name, cluster, scope)
    if key not in _RUNNERS:
        ex = get(name)
        _RUNNERS[key] = tkx.runtime.build(ex.step_fn, ex.make_inputs(0, DEV),
                                          Options(gemm_cluster=cluster, cluster_scope=scope), name=name,
                                          loss=ex.loss_output)
    return _RUNNERS[key]


def _paired(runner) -> list[str]:
    return [gid for gid, n in runner.source.notes.items() if n.get("cluster") == 2]


def _assert_close(got, want, what, program):
    from tkx.runtime.inputs import dtype_name
    from tkx.runtime.verify import relative_error, tolerance_for

    tol = tolerance_for(dtype_name(want.dtype), program=program)
    err = relative_error(got, want)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.1e}"


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("name,cluster", CASES)
def test_cluster_launch_verifies(name, cluster, scope):
    runner = _runner(name, cluster, scope)
    paired = _paired(runner)
    assert paired, f"{name}: no GEMM paired its items"
    res = runner.resources
    assert res.cluster == 2 and res.grid % 2 == 0, res.summary()
    assert 2 <= res.grid <= 2 * runner.kernel.max_clusters, (res.grid, runner.kernel.max_clusters)
    assert "clusters of 2" in res.summary()
    ex = get(name)
    v = runner.verify(seeds=(0, 1), make_inputs=ex.make_inputs)
    assert v.passed, v.summary()


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("name,cluster", CASES)
def test_cluster_graph_replays(name, cluster, scope):
    """200 replays of the captured step, then one more checked against an eager step from the same state."""
    runner = _runner(name, cluster, scope)
    ex = get(name)
    args = ex.make_inputs(2, DEV)
    graph = runner.capture_graph(*args, warmup=3)
    for _ in range(200):
        graph.replay()
    torch.cuda.synchronize()
    graph.check_status()
    eager_args = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, args)
    eager_out = tree_flatten(ex.step_fn(*eager_args))[0]
    out = tree_flatten(graph.replay())[0]
    torch.cuda.synchronize()
    graph.check_status()
    for spec, got, want in zip(runner.program.outputs, out, eager_out):
        _assert_close(got, want, f"replay 201: {spec.name}", runner.program)
    flat, eager_flat = runner.flatten(args), runner.flatten(eager_args)
    for u in runner.program.updates:
        _assert_close(flat[u.input_index], eager_flat[u.input_index],
                      f"replay 201: update of {runner.program.inputs[u.input_index].name}", runner.program)
