"""A composite spec names the registry ops it drives (``OpSpec.drives``): a backend takes part in
its differential tests, pairs and fuzz campaigns exactly where it implements every one of them.
Before issue 14, ``quant_roundtrip`` (quantize then dequantize) matched no registry op, so
neither the fuzzer nor the differential suite ever selected it."""
from tealite import registry
from tealite.types import Op
from tealite_verify import suite
from tealite_verify.fuzz.worker import plan_targets
from tealite_verify.specs import get_spec


def test_a_spec_drives_its_own_op_by_default():
    spec = get_spec("quantize")
    assert spec.ops == ("quantize",)
    assert spec.implemented_by(registry.get_backend("torch"))
    assert not spec.implemented_by(registry.get_backend("scaled_mm"))


def test_a_composite_needs_every_op_it_drives(make_backend):
    spec = get_spec("quant_roundtrip")
    assert spec.ops == (Op.QUANTIZE, Op.DEQUANTIZE)
    half = make_backend("quantize_only")
    half.implements(Op.QUANTIZE, like="torch")(lambda *a, **k: None)
    assert not spec.implemented_by(half)
    half.implements(Op.DEQUANTIZE, devices=("cpu",))(lambda *a, **k: None)
    assert spec.implemented_by(half)
    assert spec.devices_of(half) == {"cpu"}  # both ops must run there
    assert spec.implemented_by(registry.get_backend("torch"))


def test_the_composite_is_run_paired_and_fuzzed(make_backend):
    spec = get_spec("quant_roundtrip")
    later = make_backend("zz_roundtrip")
    for op in spec.ops:
        later.implements(op, like="torch")(lambda *a, **k: None)
    assert "torch" in suite.peers(spec, later.name)
    targets, notes = plan_targets(["quant_roundtrip"], [], [], None, "cpu")
    assert [t["op"] for t in targets] == ["quant_roundtrip"], notes
    assert {"torch", later.name} <= set(targets[0]["backends"])
