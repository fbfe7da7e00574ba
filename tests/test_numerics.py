"""``tealite.numerics.Numerics``: a declaration is typed and validated, so a misspelled key is
an error naming the valid keys, never a silent fall-back to IEEE defaults (issue 14)."""
import pytest
import torch

import tealite
from tealite import registry
from tealite.numerics import Numerics


def test_a_misspelled_key_is_an_error_at_registration(make_backend):
    b = make_backend("typo")
    with pytest.raises(ValueError) as err:
        b.implements("gemm", numerics={"accumulator_unit_rounoff": 2.0 ** -13})
    text = str(err.value)
    assert "accumulator_unit_rounoff" in text and "accumulator_unit_roundoff" in text
    assert f"{b.name}.implements('gemm'" in text


def test_a_declaration_function_is_validated_when_evaluated(make_backend):
    b = make_backend("typo_fn")
    b.implements("act_fwd", numerics=lambda p: {"compute_dtyp": torch.float16})(
        lambda x, kind: x.clone())
    with registry.trace(), pytest.raises(ValueError, match="compute_dtyp"):
        tealite.act_fwd(torch.ones(4), "relu", backend=b.name)


def test_a_declaration_must_be_numerics_or_a_mapping():
    with pytest.raises(TypeError, match="Numerics or a mapping"):
        Numerics.of(["compute_dtype"])


def test_mappings_and_numerics_declare_the_same():
    n = Numerics.of({"compute_dtype": torch.float32, "fp32_div_ulps": 2})
    assert n == Numerics(compute_dtype=torch.float32, fp32_div_ulps=2)
    assert n.declared() == {"compute_dtype": torch.float32, "fp32_div_ulps": 2}
    assert n.to_json() == {"compute_dtype": "torch.float32", "fp32_div_ulps": "2"}
    assert Numerics().declared() == {}
    assert n.with_(fp32_div_ulps=None) == Numerics(compute_dtype=torch.float32)
    with pytest.raises(ValueError, match="fp32_div_ulp"):
        n.with_(fp32_div_ulp=1)


def test_a_dispatch_records_a_validated_numerics():
    """What the tiers read: the torch backend's declaration for a real case, as a Numerics."""
    a, b = torch.ones(3, 8, dtype=torch.bfloat16), torch.ones(2, 8, dtype=torch.bfloat16)
    with registry.trace() as records:
        tealite.gemm(a, b, layout="TN", backend="torch")
    assert isinstance(records[-1].numerics, Numerics)
    assert records[-1].numerics.compute_dtype == torch.float32
