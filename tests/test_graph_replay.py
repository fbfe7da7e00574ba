"""The CUDA-graph replay check (tealite_verify/graph_replay.py, issue 16 part 6).

The capture engine is injectable: on the CPU the static-buffer emulation (and a recording fake
here) stand in for ``torch.cuda.CUDAGraph``.  A grouped backward whose last expert's wgrad is a
view of a module-level workspace that the next call reuses (the TE PR 3171 class: dgrad and
wgrad sharing one cuBLAS workspace) is caught, naming the replay and the tensor; the correct
op is not.  The real CUDA path runs only where CUDA is."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tealite.types import Op
from tealite_verify import graph_replay as gr
from tealite_verify.cli import main
from tealite_verify.fuzz.findings import replay
from tealite_verify.fuzz.worker import classify
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

_WORKSPACE: dict = {}  # the buggy op's module-level workspace, shared by dgrad and wgrad


def _grouped_bwd(inputs: dict, *, shared_workspace: bool) -> dict:
    """dgrad and wgrad of a grouped linear layer: dy (M, N) split into groups, w (G, N, K),
    x (M, K).  With ``shared_workspace`` the last expert's wgrad is computed in a module-level
    workspace and returned as a view of it, and the next call's dgrad staging reuses it."""
    dy, x, w, splits = inputs["dy"], inputs["x"], inputs["w"], inputs["splits"]
    offsets = gr_offsets(splits.tolist())
    g_count = w.shape[0]
    dgrad = torch.empty_like(x)
    wgrad = torch.empty_like(w)
    if shared_workspace:
        ws = _WORKSPACE.setdefault((w.shape[1], w.shape[2], x.device.type),
                                   torch.empty(w.shape[1], w.shape[2], device=x.device))
    for g in range(g_count):
        rows = slice(offsets[g], offsets[g + 1])
        if shared_workspace:
            ws.zero_()  # dgrad staging in the shared workspace: clobbers the last wgrad
        dgrad[rows] = dy[rows] @ w[g]
        if shared_workspace and g == g_count - 1:
            torch.matmul(dy[rows].T, x[rows], out=ws)
        else:
            wgrad[g] = dy[rows].T @ x[rows]
    if shared_workspace:
        return {"dgrad": dgrad, "wgrad": [wgrad[:-1], ws]}  # stitched below
    return {"dgrad": dgrad, "wgrad": wgrad}


def gr_offsets(splits):
    out = [0]
    for s in splits:
        out.append(out[-1] + s)
    return out


def correct_op(inputs):
    return _grouped_bwd(inputs, shared_workspace=False)


def buggy_op(inputs):
    out = _grouped_bwd(inputs, shared_workspace=True)
    head, ws = out["wgrad"]
    # The bug: the caller gets the first experts' wgrad and, for the last, the workspace
    # itself (one output per expert, as TE's grouped wgrad hands back a list).
    return {"dgrad": out["dgrad"], "wgrad_head": head, "wgrad_last": ws}


def correct_split_op(inputs):
    out = correct_op(inputs)
    return {"dgrad": out["dgrad"], "wgrad_head": out["wgrad"][:-1],
            "wgrad_last": out["wgrad"][-1]}


def _inputs(device="cpu"):
    g = torch.Generator().manual_seed(3)
    splits = torch.tensor([3, 0, 5, 4])
    m, n, k = int(splits.sum()), 8, 6
    return {"dy": torch.randn(m, n, generator=g).to(device),
            "x": torch.randn(m, k, generator=g).to(device),
            "w": torch.randn(4, n, k, generator=g).to(device), "splits": splits}


class RecordingEngine:
    """A fake engine: records the call at capture, replays it into the captured buffers."""

    name = "recording fake"

    def __init__(self):
        self.captures = 0
        self.replays = 0

    def unavailable_reason(self, device):
        return None

    def capture(self, fn):
        self.captures += 1
        inner = gr.StaticBufferEngine().capture(fn)
        engine = self

        class Captured:
            outputs = inner.outputs

            def replay(self):
                engine.replays += 1
                inner.replay()
        return Captured()


def test_a_correct_grouped_backward_passes():
    engine = RecordingEngine()
    assert gr.check(correct_split_op, _inputs(), backend="good", engine=engine, replays=3) == []
    assert (engine.captures, engine.replays) == (1, 3)


def test_a_wgrad_in_a_shared_workspace_is_caught_naming_the_replay_and_tensor():
    failures = gr.check(buggy_op, _inputs(), backend="bad", engine=RecordingEngine(),
                        replays=3)
    replay = [f for f in failures if f.stage == "replay"]
    assert replay and {f.tensor for f in replay} == {"wgrad_last"}
    assert replay[0].replay == 0 and "differ from eager" in replay[0].detail
    eager = [f for f in failures if f.stage == "eager"]
    assert [f.tensor for f in eager] == ["wgrad_last"]
    assert "replay 0, tensor 'wgrad_last'" in replay[0].summary()


def test_a_capture_failure_is_its_own_stage():
    class Refusing(RecordingEngine):
        def capture(self, fn):
            raise RuntimeError("operation not permitted when stream is capturing")

    [f] = gr.check(correct_split_op, _inputs(), backend="b", engine=Refusing())
    assert (f.stage, f.tensor) == ("capture", None) and "capturing" in f.detail


def test_differs_compares_bit_patterns():
    nan = torch.tensor([float("nan"), 0.0, 1.0])
    assert gr.differs(nan.clone(), nan) is None
    assert "1 of 3" in gr.differs(torch.tensor([float("nan"), -0.0, 1.0]), nan)
    assert "eager gave" in gr.differs(nan[:2], nan)


def test_bad_replay_counts_are_refused():
    with pytest.raises(ValueError, match="graph_replay must be a positive integer"):
        gr.check_replays(0, "graph_replay")
    with pytest.raises(ValueError, match=gr.ENV_VAR):
        gr.replays_from_env({gr.ENV_VAR: "x"})
    assert gr.replays_from_env({}) is None
    with pytest.raises(ValueError, match="needs the reason"):
        gr.GraphReplayPolicy(capturable=False)


def _aliasing_gemm_call(spec):
    """The gemm spec's call, returning a view of a module-level buffer it reuses."""
    def call(inputs, case, backend):
        out = spec.call(inputs, case, backend)
        y = out["out"]
        ws = _WORKSPACE.setdefault(("gemm", tuple(y.shape), y.dtype), torch.empty_like(y))
        ws.copy_(y)
        return {**out, "out": ws}
    return call


def test_the_runner_reports_replay_failures_as_their_own_findings():
    spec = get_spec("gemm")
    case = spec.smoke_cases[0]
    good = run_case(spec, case, backends=["torch"], graph_replay=2)
    assert good.verdict == "pass" and good.replay_failures == []
    assert any("emulated" in n for n in good.replay_notes)
    bad_spec = dataclasses.replace(spec, call=_aliasing_gemm_call(spec))
    bad = run_case(bad_spec, case, backends=["torch"], graph_replay=2)
    assert bad.verdict == "fail" and bad.failures == []  # the values themselves are right
    assert {(f.stage, f.tensor) for f in bad.replay_failures} >= {("replay", "out")}
    assert "FAIL graph-replay torch: replay 0, tensor 'out'" in bad.describe()
    assert bad.repro().startswith(f"{gr.ENV_VAR}=2 ")
    found = [f for f in classify(bad, "cpu", {}, 0) if f.kind == "graph-replay"]
    assert [f.output for f in found][:1] == ["out"] and found[0].metrics["graph_replay"] == 2
    # Replaying the finding (against the real spec, which is correct) runs the check again.
    again = replay(found[0])
    assert again.graph_replay == 2 and again.verdict == "pass"
    assert json.loads(json.dumps(bad.to_dict()))["replay_failures"]


def test_a_spec_declared_not_capturable_is_noted_not_run():
    spec = dataclasses.replace(get_spec("gemm"), call=_aliasing_gemm_call(get_spec("gemm")),
                               graph_replay=gr.GraphReplayPolicy(False, "host sync"))
    rep = run_case(spec, spec.smoke_cases[0], backends=["torch"], graph_replay=2)
    assert rep.verdict == "pass" and "not capturable (host sync)" in rep.replay_notes[0]


def test_a_backend_declared_not_capturable_is_noted_and_the_others_still_run():
    """AITER's gmm syncs with the host (seen on an H100): its adapter declares
    ``not_capturable`` with the reason; the check notes it for that backend only."""
    from tealite import registry
    from tealite.backends.torch.gemm import gemm as torch_gemm
    name = "_t_host_sync"
    backend = registry.Backend(name=name)
    backend.implements(Op.GEMM, numerics={"not_capturable": "reads sizes with .item()"})(
        torch_gemm)
    registry.register_backend(backend)
    try:
        spec = dataclasses.replace(get_spec("gemm"),
                                   call=_aliasing_gemm_call(get_spec("gemm")))
        rep = run_case(spec, spec.smoke_cases[0], backends=[name, "torch"], graph_replay=2)
    finally:
        registry.unregister_backend(name)
    assert f"graph replay not run for {name}: reads sizes with .item()" in rep.replay_notes
    assert {f.backend for f in rep.replay_failures} == {"torch"}  # the other is still judged


def test_the_cli_takes_graph_replay(capsys):
    case = json.dumps(get_spec("gemm").smoke_cases[0])
    assert main(["repro", "--op", "gemm", "--case", case, "--backend", "torch",
                 "--graph-replay", "2"]) == 0
    assert "graph replay emulated" in capsys.readouterr().out
    assert main(["repro", "--op", "gemm", "--case", case, "--graph-replay", "0"]) == 2
    assert main(["fuzz", "--op", "gemm", "--seconds", "1", "--graph-replay", "x"]) == 2
    assert "--graph-replay must be a positive integer" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="the torch.cuda.CUDAGraph engine needs a CUDA device (CPU-only "
                           "machine: the emulation above stands in)")
def test_real_cuda_graphs_catch_the_shared_workspace():
    engine = gr.CudaGraphEngine()
    inputs = _inputs("cuda")
    assert gr.check(correct_split_op, inputs, backend="good", device="cuda",
                    engine=engine) == []
    failures = gr.check(buggy_op, inputs, backend="bad", device="cuda", engine=engine)
    assert any(f.stage in ("replay", "capture") for f in failures)


def test_the_grouped_gemm_replays_by_default_on_gpus_and_passes_here():
    """Issue 16 part 6: the grouped GEMM's fprop / dgrad / wgrad (accumulating into ``out``
    too: the static inputs are refilled before each replay) replay bit-identically."""
    spec = get_spec("grouped_gemm")
    assert spec.graph_replay.by_default
    for case in spec.smoke_cases:
        rep = run_case(spec, case, backends=["torch"], graph_replay=2)
        assert rep.verdict == "pass" and rep.replay_failures == [], rep.describe()
