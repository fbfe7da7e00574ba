"""The Triton router's variants (tealite/backends/triton/router.py ``VARIANTS``: the same work
done another way, swept by benchmarks/router_configs.py) give the default's bits, and the
backward's routing-map check, run in its kernel, refuses what the front end's check refuses
with the same error."""
from __future__ import annotations

import re

import pytest
import torch

import tealite
from tealite.backends.triton import router as R
from tealite.ops.router import router_config
from tealite.router_checks import COUNTS_THE_MAP


def _inputs(device, tokens=19, experts=32, dtype=torch.bfloat16, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, experts, generator=g).to(dtype).to(device)
    grad = torch.randn(tokens, experts, generator=g).to(dtype).to(device)
    return x, grad


@pytest.mark.parametrize("in_kernel", [True, False], ids=["in-kernel", "before-launch"])
@pytest.mark.parametrize("row,marks", [(0, 3), (18, 5), (9, 0)])
def test_a_map_with_a_wrong_count_names_the_argument_and_row(triton_device, in_kernel, row,
                                                             marks):
    """Both ways of checking give check_map_counts' message for the first bad row (the last
    row sits alone in its program at 8 tokens per program, a tail block)."""
    x, grad = _inputs(triton_device)
    _, routing_map = tealite.router_fwd(x, 4, backend="triton")
    bad = routing_map.cpu().clone()
    bad[row] = False
    bad[row, :marks] = True
    message = f"routing_map must mark exactly topk = 4 experts per token; row {row} marks {marks}"
    with R.VARIANTS.override(map_check_in_kernel=in_kernel):
        tealite.router_bwd(grad, x, routing_map, 4, backend="triton")  # the good map passes
        with pytest.raises(tealite.TealiteArgumentError, match=re.escape(message)):
            tealite.router_bwd(grad, x, bad.to(triton_device), 4, backend="triton")


def test_the_triton_backward_is_the_one_that_counts_the_map():
    """The front end leaves the count to the Triton backward (its three reduction kernels and
    read are what kept the op at 6 % of copy on an H100) and keeps it for the others."""
    from tealite.backends.torch import router as T
    assert R.router_bwd in COUNTS_THE_MAP
    assert T.router_bwd not in COUNTS_THE_MAP


@pytest.mark.parametrize("score_function", ["softmax", "sigmoid"])
def test_the_map_check_variants_give_the_same_bits(triton_device, score_function):
    x, grad = _inputs(triton_device, tokens=21, experts=24, dtype=torch.float16)
    _, routing_map = tealite.router_fwd(x, 6, backend="torch", score_function=score_function)
    routing_map = routing_map.to(triton_device)
    run = lambda: tealite.router_bwd(grad, x, routing_map, 6, backend="triton",  # noqa: E731
                                     score_function=score_function, scaling_factor=1.5)
    want = run()
    with R.VARIANTS.override(map_check_in_kernel=False):
        got = run()
    assert torch.equal(got, want)


def _awkward(tokens, experts, dtype, seed):
    """Random logits, rows 1 and 17 of small integers (ties), -0 beside +0, NaN, -inf, +inf:
    at 8 tokens per program, blocks 0 and 2 have ties, block 1 and the tail block 3 not
    (fp32: 16-bit logits may tie anywhere)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, experts, generator=g)
    x[1::16] = torch.randint(-2, 2, (len(range(1, tokens, 16)), experts), generator=g).float()
    if tokens > 6:
        x[2, 3], x[5, :4], x[6, 1] = float("nan"), float("-inf"), float("inf")
        x[1, 0] = -0.0
    return x.to(dtype)


# (score options, dtype): the float-score paths distinct_first changes (the packed keys of
# 16-bit logits with the softmax after the top-k are not among them), grouped with a power-of-
# two group size, padded groups, and the aux scores.
FWD = [(dict(score_function="sigmoid", num_groups=8, group_topk=4), torch.bfloat16),
       (dict(score_function="sigmoid", num_groups=5, group_topk=2), torch.float32),
       (dict(score_function="sigmoid"), torch.float16),
       (dict(score_function="softmax"), torch.float32),
       (dict(score_function="softmax", use_pre_softmax=True, scaling_factor=2.0),
        torch.bfloat16)]


@pytest.mark.parametrize("kw,dtype", FWD, ids=lambda v: str(v))
@pytest.mark.parametrize("seed", [0, 1])
def test_distinct_first_gives_the_default_bits(triton_device, kw, dtype, seed):
    """Blocks of rows without ties take the new passes, blocks with ties the fallback: bits
    equal both ways, also with an expert bias and for the aux scores."""
    experts = 40 if kw.get("num_groups") == 5 else 64
    x = _awkward(27, experts, dtype, seed).to(triton_device)
    calls = [lambda: tealite.router_fwd(x, 8, backend="triton", **kw)]
    if kw["score_function"] == "sigmoid":
        bias = (torch.randn(experts, generator=torch.Generator().manual_seed(seed)) * 0.1)
        calls.append(lambda: tealite.router_fwd(x, 8, backend="triton", expert_bias=bias.to(
            triton_device), **kw))
    calls.append(lambda: tealite.router_aux_scores_fwd(x, 8, backend="triton",
                                                       score_function=kw["score_function"]))
    for call in calls:
        with R.VARIANTS.override(distinct_first=False):
            want = call()
        with R.VARIANTS.override(distinct_first=True):
            got = call()
        for a, b in zip(got, want):
            assert torch.equal(a.view(torch.uint8) if a.dtype != torch.bool else a,
                               b.view(torch.uint8) if b.dtype != torch.bool else b)


def _fast_case(seed, hazard):
    """27 tokens x 64 experts (8 per program: blocks 0-2 full, block 3 the tail) for
    _sigmoid_choice_fast, one hazard planted in block 1 (rows 8-15); blocks 0 and 2 stay
    clean so that both the fast path and its fallback give bits here."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(27, 64, generator=g)
    bias = torch.randn(64, generator=g) * 0.1
    if hazard == "below-safe-x":  # a sigmoid whose division FCHK would divert
        x[9, 5] = -70.0
    elif hazard == "nan":
        x[12, 40] = float("nan")
    elif hazard == "-inf":
        x[8, :3] = float("-inf")
    elif hazard == "expert-tie":  # equal scores among a row's best
        x[10, 7] = x[10, 9] = 6.0
        bias[7] = bias[9] = 0.0
    elif hazard == "negative-scores":  # not a hazard: every s + bias < 0 (the keys' sign)
        bias -= 2.0
    elif hazard == "group-tie":  # 8 groups of 8: groups 3 and 4 tie for the 4th best
        # group scores (their two best, exact in fp32): groups 0-2 about 1.99, 3 and 4 both
        # 0.75 + 0.25 = 0.625 + 0.375 = 1, the rest below 0.1; lowest index first keeps
        # group 3, whose 0.25 is the 8th expert; taking group 4 too would make it 0.625
        bias *= 0.01
        x[11] = -5.0
        x[11, [0, 1, 8, 9, 16, 17]] = torch.tensor([6.0, 6.5, 7.0, 7.5, 8.0, 8.5])
        bias[[0, 1, 8, 9, 16, 17]] = 0.0
        x[11, [24, 25, 32, 33]] = 0.0  # sigmoid(0) = 0.5 exactly
        bias[[24, 25, 32, 33]] = torch.tensor([0.25, -0.25, 0.125, -0.125])
    return x, bias


@pytest.mark.parametrize("hazard", ["none", "negative-scores", "below-safe-x", "nan", "-inf",
                                    "expert-tie", "group-tie", "nan-bias", "inf-bias"])
@pytest.mark.parametrize("groups", [None, 8], ids=["plain", "8-groups"])
def test_fast_sigmoid_gives_the_exact_paths_bits(triton_device, hazard, groups):
    """VARIANTS.fast_sigmoid (_sigmoid_choice_fast, its unsure rows sending the block to the
    exact path) against the exact path alone: the same probs and map, with every hazard the
    fast path must flag planted in one block (on a GPU it also checks the inline-PTX
    division; in the interpreter the control flow and the flags)."""
    x, bias = _fast_case(0, hazard)
    if hazard == "nan-bias":
        bias[33] = float("nan")
    elif hazard == "inf-bias":
        bias[20] = float("inf")
    kw = dict(score_function="sigmoid", expert_bias=bias.to(triton_device))
    if groups:
        kw.update(num_groups=groups, group_topk=4)
    config = router_config(8, 64, score_function="sigmoid", num_groups=groups,
                             group_topk=4 if groups else None)
    assert R._fwd_options(64, config, False, True, x.dtype, R.Tile(), R.VARIANTS.get(),
                          False)[1]["FAST"]
    for dtype in (torch.float32, torch.bfloat16):
        call = lambda: tealite.router_fwd(x.to(dtype).to(triton_device), 8,  # noqa: E731
                                          backend="triton", **kw)
        with R.VARIANTS.override(fast_sigmoid=False):
            want = call()
        got = call()
        assert torch.equal(got[1], want[1])
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))


def test_the_variant_sweep_runs_every_variant(triton_device, monkeypatch, capsys):
    """benchmarks/router_configs.py --section variants, on a tiny shape (graph timing
    replaced: no GPU here): a row per variant and direction, each with the default's bits."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import router_configs as sweep
    from benchmarks._timing import L2Flusher
    monkeypatch.setattr(sweep, "_graph_ms", lambda fn, flush: (fn(), 1.0)[1])
    monkeypatch.setattr(sweep, "OP_REPS", 1)
    profile = sweep.kernel_profile
    monkeypatch.setattr(sweep, "warm_up", lambda fn, device, calls: fn())
    monkeypatch.setattr(sweep, "kernel_profile", lambda fn, device: profile(fn, device, 1))
    cases, ops = sweep._cases(9, 64, triton_device)
    sweep._variants(cases, ops, L2Flusher(torch.device(triton_device)), 1.0, 9, 64,
                    torch.device(triton_device))
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 12 and all(r.endswith("same bits: True") for r in rows), rows
    assert {r.split(":")[0].split()[-1] for r in rows} == {
        "distinct_first=False", "distinct_first=True", "fast_sigmoid=True",
        "fast_sigmoid=False", "map_check_in_kernel=True", "map_check_in_kernel=False"}


def _reads_and_fills(fn, monkeypatch) -> tuple[int, int]:
    """(reads back to the host, zero fills) among the torch operators ``fn`` runs (CPU
    profiler), the Triton kernel not run (the interpreter's own operators would count)."""
    from torch.profiler import ProfilerActivity, profile
    from benchmarks.host_cost_router import _NoLaunch
    with monkeypatch.context() as patch:
        patch.setattr(R, "_router_bwd_kernel", _NoLaunch())
        for _ in range(2):  # a process's first profiling session runs operators of its own
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
    names = [e.name for e in prof.events()]
    return (names.count("aten::_local_scalar_dense"),
            names.count("aten::zeros"))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_check_values_false_takes_the_map_as_given(triton_device, backend, monkeypatch):
    """TE's convention (as moe_permute's check_values): no count check, no read back; the
    gradient is the formula's at the map given, so a map with a wrong count gets no error
    and the same gradient as the other backend.  The default reads once (triton: after its
    kernel) and refuses that map."""
    x, grad = _inputs(triton_device)
    _, routing_map = tealite.router_fwd(x, 4, backend="torch")
    odd = routing_map.clone()
    odd[3, :] = False
    odd[3, :6] = True  # 6 marks where topk is 4
    run = lambda m, **kw: tealite.router_bwd(grad, x, m, 4, backend=backend, **kw)  # noqa: E731
    unchecked = _reads_and_fills(lambda: run(routing_map, check_values=False), monkeypatch)
    checked = _reads_and_fills(lambda: run(routing_map), monkeypatch)
    assert unchecked[0] == 0 and checked[0] == 1
    if backend == "triton":  # the flag: one 4-byte fill, only when checking
        assert (unchecked[1], checked[1]) == (0, 1)
    got = run(odd, check_values=False)
    other = "torch" if backend == "triton" else "triton"
    want = tealite.router_bwd(grad, x, odd, 4, backend=other, check_values=False)
    torch.testing.assert_close(got.cpu(), want.cpu())  # the formula at that map, both
    assert torch.equal(run(routing_map, check_values=False), run(routing_map))
    with pytest.raises(tealite.TealiteArgumentError, match="row 3 marks 6"):
        run(odd)
    with pytest.raises(tealite.TealiteArgumentError, match="check_values must be a bool"):
        run(routing_map, check_values=0)
