"""Recipe objects, custom per-role recipes, and bad input to the quantization ops."""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.errors import TealiteArgumentError
from tealite.formats import fp8_formats_for_arch


def _factory(role: R.Role):
    """This layer's weights in MXFP8, everything else FP8 current scaling, outputs unquantized."""
    if role.tensor_type in ("output", "grad_input"):
        return None
    if role.tensor_type == "weight" and role.name == "layers.0.fc1":
        return R.MXFP8BlockScaling()
    return R.Float8CurrentScaling()


def test_custom_recipe_resolves_per_role():
    custom = R.CustomRecipe(_factory)
    assert R.resolve(custom, R.Role("Linear", "weight", "layers.0.fc1")) == R.MXFP8BlockScaling()
    assert R.resolve(custom, R.Role("Linear", "weight", "layers.0.fc2")) == \
        R.Float8CurrentScaling()
    assert R.resolve(custom, R.Role("Linear", "input", "layers.0.fc1")) == \
        R.Float8CurrentScaling()
    assert R.resolve(custom, R.Role("Linear", "output", "layers.0.fc1")) is None
    builtin = R.Float8BlockScaling()
    assert R.resolve(builtin, R.Role("Linear", "grad_output", "x")) is builtin


def test_custom_recipe_drives_a_quantized_linear():
    """Quantize per role and multiply: the weight of fc1 takes the MX path, fc2 the FP8 one."""
    custom = R.CustomRecipe(_factory)
    x = torch.randn(8, 64)
    for name, kind in (("layers.0.fc1", "mx"), ("layers.0.fc2", "fp8")):
        rw = R.resolve(custom, R.Role("Linear", "weight", name))
        rx = R.resolve(custom, R.Role("Linear", "input", name))
        if kind == "mx":  # both operands of an MX GEMM must be MX
            rx = rw
        w = torch.randn(16, 64)
        out = tealite.qgemm(tealite.quantize(w, rw), tealite.quantize(x, rx), layout="TN",
                            out_dtype=torch.float32).out
        rel = (out - x @ w.t()).norm() / (x @ w.t()).norm()
        assert rel < 0.1, (name, rel)


@pytest.mark.parametrize("bad, err", [
    (lambda r: None, ValueError),            # None for an input
    (lambda r: "e4m3", TypeError),           # not a recipe
    (lambda r: R.CustomRecipe(_factory), TypeError),
])
def test_custom_recipe_rejects_bad_factory_answers(bad, err):
    with pytest.raises(err, match="qfactory"):
        R.resolve(R.CustomRecipe(bad), R.Role("Linear", "input", "x"))


def test_role_rejects_unknown_tensor_type():
    with pytest.raises(ValueError, match="tensor_type"):
        R.Role("Linear", "activation", "x")


def test_recipe_constructors_validate():
    with pytest.raises(ValueError, match="FP8 format"):
        R.Float8CurrentScaling("e2m1")
    with pytest.raises(ValueError, match="granularity"):
        R.Float8CurrentScaling(granularity="column")
    with pytest.raises(ValueError, match="block"):
        R.Float8BlockScaling(block=(1, 64))
    with pytest.raises(ValueError, match="amax_compute_algo"):
        R.DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="unknown format"):
        R.MXBlockScaling("e3m4")


def test_fp8_formats_per_arch():
    assert fp8_formats_for_arch("gfx942") == ("e4m3fnuz", "e5m2fnuz")
    assert fp8_formats_for_arch("gfx950") == ("e4m3", "e5m2")
    assert fp8_formats_for_arch("sm_90") == ("e4m3", "e5m2")
    with pytest.raises(ValueError, match="gfx90a"):
        fp8_formats_for_arch("gfx90a")


@pytest.mark.parametrize("kwargs, match", [
    (dict(x=torch.randn(4, 40), recipe=R.MXFP4BlockScaling()), r"K \(x.shape\[1\]\).*multiple of 32"),
    (dict(x=torch.randn(40, 64), recipe=R.MXFP8BlockScaling(), columnwise=True),
     r"M \(x.shape\[0\]\).*multiple of 32"),
    (dict(x=torch.randn(4, 64), recipe=R.DelayedScaling()), "needs scale="),
    (dict(x=torch.randn(4, 64), recipe=R.Float8CurrentScaling(), scale=torch.ones(1)),
     "only for DelayedScaling"),
    (dict(x=torch.randn(4, 64), recipe=R.Float8CurrentScaling(), rowwise=False),
     "rowwise / columnwise"),
    (dict(x=torch.randn(2, 4, 64), recipe=R.Float8CurrentScaling()), "x must be 2-D"),
    (dict(x=torch.randn(4, 64).double(), recipe=R.Float8CurrentScaling()), "x dtype"),
    (dict(x=torch.randn(4, 64), recipe="e4m3"), "recipe must be one of"),
])
def test_quantize_bad_input(kwargs, match):
    x = kwargs.pop("x")
    with pytest.raises(TealiteArgumentError, match=match):
        tealite.quantize(x, **kwargs)


def test_mx_partial_block_needs_pad_and_then_works():
    x = torch.randn(3, 45)
    q = tealite.quantize(x, R.MXFP4BlockScaling(), pad=True)
    assert q.data.shape == (3, 23) and q.scale_inv.shape == (3, 2)


def test_qgemm_bad_input():
    a = tealite.quantize(torch.randn(16, 64), R.Float8CurrentScaling())
    b = tealite.quantize(torch.randn(8, 64), R.MXFP8BlockScaling())
    with pytest.raises(TealiteArgumentError, match="compatible recipes"):
        tealite.qgemm(a, b)
    b2 = tealite.quantize(torch.randn(8, 32), R.Float8CurrentScaling())
    with pytest.raises(TealiteArgumentError, match="contraction dims differ"):
        tealite.qgemm(a, b2)
    with pytest.raises(TealiteArgumentError, match="columnwise=True"):
        tealite.qgemm(a, tealite.quantize(torch.randn(64, 8), R.Float8CurrentScaling()),
                      layout="TT")


def test_delayed_scaling_update_bad_input():
    r = R.DelayedScaling(amax_history_len=4)
    with pytest.raises(TealiteArgumentError, match="amax_history"):
        tealite.delayed_scaling_update(torch.zeros(5), torch.ones(1), r)
    with pytest.raises(TealiteArgumentError, match="DelayedScaling"):
        tealite.delayed_scaling_update(torch.zeros(4), torch.ones(1), R.Float8CurrentScaling())
