"""Unpermuting a quantized tensor without merging probs (issue 16, "Permutation"): where no
token has two kept rows (top-1 routing) it is a move, so codes and their row scales come back
bit for bit, on the torch and triton backends, judged exactly against the float64 suite's
move reference; a token without a kept row (routed to nobody, or its row dropped) gets a zero
row (code 0, scale 1).  What would need a requantization -- a token's k > 1 rows summed, or
merging probs -- is refused naming the argument (TE's ``moe_unpermute`` forward refuses any
QuantizedTensor).  A wrong variant, each token's scales taken from the next token, is caught.
"""
from __future__ import annotations

import pytest
import torch

import tealite
import tealite.recipes as R
from tealite import registry
from tealite.backends.triton import DEVICES
from tealite.errors import TealiteArgumentError
from tealite.moe_types import MapType, RowIdMap
from tealite.types import QuantizedTensor
from tealite_verify.mutate import plugin
from tealite_verify.mutate.base import library
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs.permute import _UNPERMUTE_QUANT_SMOKE, unpermute_cases

SPEC = get_spec("moe_unpermute")
_TRITON_WHY = registry.get_backend("triton").unavailable_reason()
BACKENDS = ["torch"] + (["triton"] if _TRITON_WHY is None else [])
TRITON = pytest.param("triton", marks=pytest.mark.skipif(
    _TRITON_WHY is not None, reason=f"triton unavailable: {_TRITON_WHY}"))


def _cid(case) -> str:
    return f"{case['quant']}-{case['map_type']}"


@pytest.mark.skipif(_TRITON_WHY is not None, reason=f"triton unavailable: {_TRITON_WHY}")
@pytest.mark.parametrize("case", _UNPERMUTE_QUANT_SMOKE, ids=_cid)
def test_codes_and_scales_move_exactly(case, triton_device):
    report = run_case(SPEC, case, backends=BACKENDS, device=triton_device)
    assert report.verdict == "pass", report.describe()
    for b in BACKENDS:
        assert report.outcomes[b].status == "ok", report.describe()
    judged = {c.output for c in report.comparisons if c.rhs == "reference"}
    assert "data" in judged and ("scale_inv" in judged or case["quant"] == "tensor")


def _quantized(rows: int, hidden: int = 128, device="cpu") -> QuantizedTensor:
    codes = torch.arange(rows * hidden, dtype=torch.int64).remainder(120).to(torch.uint8) \
        .view(torch.float8_e4m3fn).reshape(rows, hidden).to(device)
    scales = torch.exp2(torch.arange(rows, dtype=torch.float32)).reshape(rows, 1).to(device)
    return QuantizedTensor(R.Float8BlockScaling(fmt="e4m3"), (rows, hidden), data=codes,
                           scale_inv=scales)


@pytest.mark.parametrize("backend", ["torch", TRITON])
def test_tokens_without_a_row_get_a_zero_row(backend):
    device = DEVICES[0] if backend == "triton" else "cpu"  # compiled kernels take GPU tensors
    rows = torch.tensor([[-1, 1], [0, -1], [-1, -1]], dtype=torch.int32, device=device)
    q = _quantized(2, device=device)  # a mask map, top-1
    out = tealite.moe_unpermute(q, RowIdMap(rows, MapType.MASK, 2, 2, (1, 1)), backend=backend)
    assert isinstance(out, QuantizedTensor) and out.shape == (3, 128) and out.amax is None
    bits, src = out.data.view(torch.uint8), q.data.view(torch.uint8)
    assert torch.equal(bits[0], src[1]) and torch.equal(bits[1], src[0])
    assert not bits[2].any() and out.scale_inv[:, 0].tolist() == [2.0, 1.0, 1.0]


def test_what_would_requantize_is_refused_naming_the_argument():
    q = _quantized(4)
    two = RowIdMap(torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), MapType.INDEX, 4, 4,
                   (1, 1, 1, 1))
    with pytest.raises(TealiteArgumentError, match="permuted is a QuantizedTensor.*2 rows"):
        tealite.moe_unpermute(q, two)
    one = RowIdMap(torch.tensor([[0], [1], [2], [3]], dtype=torch.int32), MapType.INDEX, 4, 4,
                   (1, 1, 1, 1))
    with pytest.raises(TealiteArgumentError, match="merging_probs must be None"):
        tealite.moe_unpermute(q, one, merging_probs=torch.ones(4, 1))
    with pytest.raises(TealiteArgumentError, match="row_id_map.num_out_tokens = 4"):
        tealite.moe_unpermute(_quantized(3), one)


def test_the_strategy_reaches_quantized_unpermute():
    from hypothesis import given, settings
    seen = set()

    @settings(max_examples=60, database=None, derandomize=True)
    @given(unpermute_cases())
    def draw(case):
        if case.get("quant") is not None:
            assert case["topk"] == 1 and not case["with_probs"]
            seen.add(case["quant"])
    draw()
    assert len(seen) >= 3, seen


def test_scales_of_the_next_token_are_caught():
    m = library()["moe_unpermute.scales_of_next_token"]
    case = _UNPERMUTE_QUANT_SMOKE[0]  # 1x128 blocks
    with plugin.registered(m):
        report = run_case(SPEC, case, backends=["torch", plugin.NAME], pairwise=False)
    bad = {c.output for c in report.failures if c.lhs == plugin.NAME and c.rhs == "reference"}
    assert bad == {"scale_inv"}, report.describe()
    assert not [c for c in report.failures if c.lhs == "torch"]


@pytest.mark.skipif(_TRITON_WHY is not None, reason=f"triton unavailable: {_TRITON_WHY}")
@pytest.mark.parametrize("hidden,scale_cols", [(128, 1), (8, 100)], ids=["fused", "split"])
def test_codes_and_scales_gathered_in_one_launch_or_two(hidden, scale_cols, monkeypatch):
    """The triton backend moves a quantized tensor's codes and row scales in one launch
    when a program's scale tile fits (the scale rows ride in column block 0), else in two;
    either way each output row is its source row's codes and scales, or the fills."""
    from tealite.backends.triton import permute as P
    launches = []
    kernel = P._gather_rows_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]
    monkeypatch.setattr(P, "_gather_rows_kernel", Counting())
    device = P.DEVICES[0]
    codes = torch.arange(40 * hidden).remainder(251).to(torch.uint8).reshape(40, hidden)
    scales = torch.arange(40 * scale_cols, dtype=torch.float32).reshape(40, scale_cols) + 2
    src = torch.tensor([[5], [-1], [39], [0], [-1], [17]], dtype=torch.int32)
    out, out_scales = P._gather_with_scales(codes.to(device), src.to(device),
                                            scales.to(device), scale_fill=1.0)
    assert len(launches) == (1 if scale_cols == 1 else 2)
    for i, s in enumerate(src[:, 0].tolist()):
        want_codes = codes[s] if s >= 0 else torch.zeros(hidden, dtype=torch.uint8)
        want_scales = scales[s] if s >= 0 else torch.ones(scale_cols)
        assert torch.equal(out[i].cpu(), want_codes) and torch.equal(out_scales[i].cpu(),
                                                                   want_scales)
