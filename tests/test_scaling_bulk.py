"""Bulk delayed-scaling update (issue 17 part 2): the front-end's argument checks, bit equality
with the per-tensor ``delayed_scaling_update`` on torch and Triton (interpreted, one launch),
and the spec's oracles (exact reference + parity) catching wrong bulk implementations while
passing a correct one that is organised differently.

Wrong and differently organised implementations are plug-in backends (``make_backend``).
"""
from __future__ import annotations

import pytest
import torch

import tealite
import tealite.recipes as R
from tealite import registry
from tealite.backends.torch import scaling as T
from tealite.errors import TealiteArgumentError
from tealite.training_types import BulkScalingUpdate
from tealite_verify.mutate.operators_scaling_bulk import _last_tensor_skipped
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from _helpers_cross_compile import compiled_json

SPEC = get_spec("delayed_scaling_update_bulk")
TRITON = registry.get_backend("triton").unavailable_reason() is None
needs_triton = pytest.mark.skipif(not TRITON, reason="triton backend unavailable (set "
                                                     "TRITON_INTERPRET=1 or run on a GPU)")


def _lists(n=3, h=4):
    return [torch.rand(h) for _ in range(n)], [torch.ones(1) for _ in range(n)]


# ---- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("mutate, match", [
    (lambda hs, ss, r: (hs, ss[:2], r), r"scales must have one tensor per amax history \(3\), "
                                        "got 2"),
    (lambda hs, ss, r: (hs, ss, [r, r]), r"recipes must have one recipe per tensor \(3\), got 2"),
    (lambda hs, ss, r: (hs, ss, [r, r, R.Float8CurrentScaling()]),
     "recipes.2. must be DelayedScaling, got Float8CurrentScaling"),
    (lambda hs, ss, r: (hs[:2] + [torch.zeros(0)], ss, r),
     r"amax_histories\[2\] must hold at least one amax \(history length 0\)"),
    (lambda hs, ss, r: (hs[:1] + [torch.zeros(5)] + hs[2:], ss, r),
     r"amax_histories\[1\] must have shape \(4,\) \(recipes\[1\].amax_history_len\)"),
    (lambda hs, ss, r: (hs, ss[:2] + [torch.ones(2)], r), r"scales\[2\] must have shape \(1,\)"),
    (lambda hs, ss, r: (hs, ss[:2] + [torch.ones(1, dtype=torch.float64)], r),
     r"scales\[2\] dtype must be one of \(float32\)"),
    (lambda hs, ss, r: (hs, ss[:1] + [torch.ones(1, device="meta")] + ss[2:], r),
     r"all tensors must be on one device: .* scales\[1\] on meta"),
    (lambda hs, ss, r: (hs[0], ss, r), "amax_histories and scales must be sequences"),
])
def test_bad_input_names_the_argument(mutate, match):
    hs, ss = _lists()
    args = mutate(hs, ss, R.DelayedScaling(amax_history_len=4))
    with pytest.raises(TealiteArgumentError, match=match):
        tealite.delayed_scaling_update_bulk(*args)


def test_empty_list_is_an_empty_result():
    assert tealite.delayed_scaling_update_bulk([], [], R.DelayedScaling()) == \
        BulkScalingUpdate([], [])


# ---- bit equality with the per-tensor op ---------------------------------------------------

def _mixed(n, device="cpu", seed=0):
    """n tensors cycling through formats, margins, algorithms and history lengths 1..1024,
    with a zero, a NaN and an Inf newest amax among them."""
    g = torch.Generator().manual_seed(seed)
    fmts, lens = ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz"), (1, 2, 3, 16, 37, 1024)
    recipes = [R.DelayedScaling(fmts[i % 4], margin=i % 3, amax_history_len=lens[i % 6],
                                amax_compute_algo=("max", "most_recent")[(i // 2) % 2])
               for i in range(n)]
    hs = [torch.rand(r.amax_history_len, generator=g) * 2.0 ** (i % 20 - 10)
          for i, r in enumerate(recipes)]
    for i, v in ((1, 0.0), (2, float("nan")), (3, float("inf"))):
        if i < n:
            hs[i][0] = v
    ss = [torch.rand(1, generator=g) + 0.5 for _ in recipes]
    return [h.to(device) for h in hs], [s.to(device) for s in ss], recipes


def _assert_bitwise(out, hs, ss, recipes):
    assert len(out.amax_histories) == len(out.scales) == len(hs)
    for i, (h, s, r) in enumerate(zip(hs, ss, recipes)):
        eh, es = tealite.delayed_scaling_update(h.cpu(), s.cpu(), r, backend="torch")
        assert torch.equal(out.amax_histories[i].cpu().view(torch.int32), eh.view(torch.int32)), i
        assert torch.equal(out.scales[i].cpu().view(torch.int32), es.view(torch.int32)), i


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_bulk_equals_the_per_tensor_op_bitwise(backend, triton_device):
    device = triton_device if backend == "triton" else "cpu"
    hs, ss, recipes = _mixed(40, device)
    before = [h.clone() for h in hs]
    out = tealite.delayed_scaling_update_bulk(hs, ss, recipes, backend=backend)
    _assert_bitwise(out, hs, ss, recipes)
    assert all(torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(hs, before)), \
        "the inputs are not modified"


@needs_triton
def test_triton_is_one_launch(monkeypatch, triton_device):
    from tealite.backends.triton import scaling as TS
    launches = []
    kernel = TS._bulk_update_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(TS, "_bulk_update_kernel", Counting())
    hs, ss, recipes = _mixed(25, triton_device)
    out = tealite.delayed_scaling_update_bulk(hs, ss, recipes, backend="triton")
    assert launches == [(25,)]
    _assert_bitwise(out, hs, ss, recipes)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_histories_as_columns_of_one_buffer(backend, triton_device):
    """TE keeps a module's histories as the columns of one (H, N) buffer: strided views, read
    in place (one launch on Triton, no per-tensor copy)."""
    device = triton_device if backend == "triton" else "cpu"
    buf = torch.rand(16, 5, device=device) * 50
    buf[0, 1], buf[3, 2] = 0.0, float("nan")
    hs = [buf[:, j] for j in range(5)]
    scales = torch.rand(5, device=device) + 0.5
    ss = [scales[j:j + 1] for j in range(5)]
    recipes = [R.DelayedScaling(("e4m3", "e5m2")[j % 2], margin=j % 3, amax_history_len=16,
                                amax_compute_algo=("max", "most_recent")[j // 3])
               for j in range(5)]
    out = tealite.delayed_scaling_update_bulk(hs, ss, recipes, backend=backend)
    _assert_bitwise(out, [h.contiguous() for h in hs], ss, recipes)


def test_triton_refuses_a_history_longer_than_one_program_holds():
    r = R.DelayedScaling(amax_history_len=2048)
    impl = registry.get_backend("triton").impls.get(tealite.types.Op.DELAYED_SCALING_UPDATE_BULK)
    if impl is None:
        pytest.skip("triton is not installed")
    reason = impl.support.check({"max_history_len": r.amax_history_len})
    assert "at most 1024 entries, got 2048" in reason


# ---- the spec's oracles ----------------------------------------------------------------------

def _verdict(make_backend, name, fn, case):
    b = make_backend(name)
    b.implements("delayed_scaling_update_bulk", like="torch")(fn)
    report = run_case(SPEC, case, backends=[b.name], pairwise=False)
    return {c.output: c.metrics.passed for c in report.comparisons}


MIXED_CASE = SPEC.smoke_cases[0]  # four tensors, four formats, per-tensor recipes


def test_a_correct_reorganised_bulk_passes(make_backend):
    def reversed_order(histories, scales, recipes):  # the tensors done last to first
        out = T.delayed_scaling_update_bulk(histories[::-1], scales[::-1], recipes[::-1])
        return BulkScalingUpdate(out.amax_histories[::-1], out.scales[::-1])

    assert all(_verdict(make_backend, "bulk_reversed", reversed_order, MIXED_CASE).values())


def test_a_tensor_mixup_fails_reference_and_parity(make_backend):
    def swapped(histories, scales, recipes):  # tensors 0 and 1 get each other's results
        out = T.delayed_scaling_update_bulk(histories, scales, recipes)
        hs, ss = list(out.amax_histories), list(out.scales)
        hs[0], hs[1], ss[0], ss[1] = hs[1], hs[0], ss[1], ss[0]
        return BulkScalingUpdate(hs, ss)

    v = _verdict(make_backend, "bulk_swapped", swapped, MIXED_CASE)
    assert not v["parity"] and not v["h0"] and not v["s1"]
    assert v["h2"] and v["s3"]


def test_a_short_grid_fails_only_the_last_tensor(make_backend):
    v = _verdict(make_backend, "bulk_short", _last_tensor_skipped(T.delayed_scaling_update_bulk),
                 MIXED_CASE)
    assert not v["parity"] and not v["h3"]
    assert v["h0"] and v["s0"] and v["h2"]


def _reciprocal_scale(h, s, r):
    """fmax * (1/amax) / 2^margin, the old scale kept as the op says."""
    amax = h[:1] if r.amax_compute_algo == "most_recent" else h.max().reshape(1)
    fmax = torch.tensor([tealite.formats.get_format(r.fmt).max])
    new = fmax * torch.reciprocal(amax) / 2.0 ** r.margin
    return torch.where((amax > 0) & torch.isfinite(amax), new, s)


def test_approximate_division_is_caught(make_backend):
    """fmax * (1/amax) instead of fmax / amax: one ulp off for some amax, which the bit-exact
    contract does not allow."""
    def reciprocal(histories, scales, recipes):
        out = T.delayed_scaling_update_bulk(histories, scales, recipes)
        return BulkScalingUpdate(out.amax_histories, [_reciprocal_scale(h, s, r) for h, s, r
                                                      in zip(histories, scales, recipes)])

    case = dict(MIXED_CASE, dist={"kind": "uniform", "lo": 0.5, "hi": 300.0}, seed=5)
    inputs = SPEC.make_inputs(case, "cpu")
    from tealite_verify.specs.scaling_bulk import entries, recipe_of
    differs = [i for i, e in enumerate(entries(case))
               if not torch.equal(_reciprocal_scale(inputs[f"h{i}"], inputs[f"s{i}"],
                                                    recipe_of(e)), tealite.delayed_scaling_update(
                   inputs[f"h{i}"], inputs[f"s{i}"], recipe_of(e), backend="torch")[1])]
    assert differs, "the case must hold an amax where the two divisions differ"
    v = _verdict(make_backend, "bulk_recip", reciprocal, case)
    assert not v["parity"] and not any(v[f"s{i}"] for i in differs)


# ---- the kernel as compiled for the GPUs (CI has none: cross-compiled) ---------------------------

_COMPILE = """
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tealite.backends.triton import scaling as TS
sig = {"h_in_tab": "*i64", "s_in_tab": "*i64", "h_out_off": "*i64", "meta_tab": "*i64",
       "consts_tab": "*fp32", "h_out": "*fp32", "s_out": "*fp32", "BLOCK": "constexpr"}
out = {}
for target, asm in ((("cuda", 90, 32), "ptx"), (("hip", "gfx942", 64), "amdgcn")):
    k = triton.compile(ASTSource(TS._bulk_update_kernel, sig, {"BLOCK": 1024}),
                       target=GPUTarget(*target))
    out[target[0]] = sorted(set(re.findall(r"div\\.[a-z0-9.]+|v_div_fixup_f32", k.asm[asm])))
json.dump(out, sys.stdout)
"""


def test_kernel_compiles_with_ieee_division():
    """Cross-compiled for sm_90 and gfx942 in a fresh process without TRITON_INTERPRET (the
    interpreter forgave a non-constexpr global here that the compiler refuses); the scale's two
    divisions must be IEEE ones (Triton's "/" is approximate on CUDA): PTX ``div.rn.f32``,
    AMD's correctly rounded ``v_div_fixup_f32`` sequence."""
    pytest.importorskip("triton")
    divides = compiled_json(_COMPILE)
    assert divides == {"cuda": ["div.rn.f32"], "hip": ["v_div_fixup_f32"]}, divides
