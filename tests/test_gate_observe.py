"""The gate's per-field contract probes (tealite_verify/gate/observe.py and probes_*.py).

* Every MX scale rounding x element rounding, and every FP8 scale rule, is observed as
  exactly itself (torch backend configured each way; reference quantizers for the rules no
  tealite backend follows).
* Each field's probe blocks separate that field's conventions: a quantizer changed in one
  convention (ties-away vs RNE, NaN as +-6, ...) is a change of that field in
  diff_observations, with a witness block whose two outputs differ; identical runs differ in
  nothing.
* The fused constructions give their intermediates exactly (float64 references; torch's fused
  ops observe what its plain quantizer does).
* End to end on AITER (subprocesses, one AITER copy each): the installed v0.1.7.post2 rounds
  E2M1 ties away with EVEN scales; a copy with RNE tie-breaking, and the real v0.1.9.post1 tree
  made interpreter-safe, are observed as rne.
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tealite.backends.aiter_common.contracts import Contract
from tealite.formats import ElementRounding, ScaleRounding
from tealite_verify.gate import observe
from tealite_verify.gate import probes_common as pc
from tealite_verify.gate import probes_fp8 as p8
from tealite_verify.gate import probes_fused as pf
from tealite_verify.gate import probes_mx as pmx
from tealite_verify.references import activations as ref_acts
from tealite_verify.references import norms as ref_norms
from tealite_verify.references import quantize as qref

F32 = np.float32
REPO = Path(__file__).resolve().parents[1]


def _mx_contract(sr: str, er: str, op: str = "quantize", fmt: str = "e2m1") -> Contract:
    return Contract(backend="torch", entry_point="probe", op=op,
                    family="mxfp4" if fmt == "e2m1" else "mxfp8", scale_rule=f"e8m0-{sr}",
                    element_rounding=er.replace("_", "-"), extra={"fmt": fmt})


def _fp8_contract(rule: str, granularity: str, op: str = "quantize") -> Contract:
    return Contract(backend="torch", entry_point="probe", op=op, family="fp8-current",
                    scale_rule=rule, extra={"granularity": granularity, "fmt": "e4m3"})


# ---- every convention is observed as itself -----------------------------------------------------

@pytest.mark.parametrize("fmt", ["e2m1", "e4m3"])
@pytest.mark.parametrize("sr,er", list(itertools.product(ScaleRounding, ElementRounding)),
                         ids=lambda v: v.value)
def test_mx_probes_observe_exactly_the_conventions_followed(sr, er, fmt):
    obs = observe.observe_contract(_mx_contract(sr.value, er.value, fmt=fmt), "cpu")
    assert obs["fields"]["scale_rule"] == [sr.value], obs["fields"]
    assert obs["fields"]["element_rounding"] == er.value, obs["fields"]
    assert not obs["unprobed"] and "error" not in obs
    json.dumps(obs, allow_nan=False)  # JSON-safe


FP8_ROUTES = [("quantize", "tensor"), ("quantize", "row"), ("rmsnorm_fwd_quantize", "row"),
              ("layernorm_fwd_quantize", "row"), ("act_fwd_quantize", "row")]


@pytest.mark.parametrize("op,granularity", FP8_ROUTES, ids=lambda v: v)
@pytest.mark.parametrize("rule", ["fmax/amax", "amax/fmax"])
def test_fp8_probes_tell_the_scale_rules_apart(rule, op, granularity):
    obs = observe.observe_contract(_fp8_contract(rule, granularity, op), "cpu")
    assert obs["fields"]["scale_rule"] == [rule], obs["fields"]
    assert obs["fields"]["element_rounding"] == "rne"  # torch casts RNE
    assert obs["fields"]["subnormal_rounding"] == "rne"
    assert set(obs["unprobed"]) == {"saturation"}


def _fp8_reference(rows, rule: str, fmt: str, given=None, per_row=True, nan_ignoring=False):
    """(scale_inv (R, 1), fp32 values cast) under ``rule``, written from the references and
    numpy here, not from probes_fp8 (which these tests judge)."""
    x = np.asarray(rows, F32)
    fmax = F32(qref.fmt_max(fmt))
    if given is not None:
        si = qref.reciprocal(np.array([[given]], F32))
        mult = {"x * scale": lambda: x * F32(given), "x / scale_inv": lambda: x / si,
                "x * fl32(1/scale_inv)": lambda: x * qref.reciprocal(si)}[rule]
        return si, mult().astype(F32)
    if nan_ignoring:
        a = qref.aiter_amax(x, per_row=per_row).reshape(-1, 1)
    else:
        a = qref.amax(x, axis=1).reshape(-1, 1) if per_row else qref.amax(x).reshape(1, 1)
    if rule == "fmax/amax":
        s = qref.te_scale_from_amax(a, fmt)
        return qref.reciprocal(s), (x * s).astype(F32)
    si = (a * qref.reciprocal(fmax)).astype(F32) if rule == "amax*rcp(fmax)" else \
        qref.aiter_scale_inv(a, fmt)
    v = x / si if rule == "amax/fmax, codes y/scale" else qref.aiter_scaled(x, si)
    return si, np.asarray(v, F32)


def _round_reference(v, fmt, rounding):
    """Code bits under ``rounding``; ties_to_zero / rtz from the float64 grid here."""
    if rounding in ("rne", "ties_away"):
        return qref.codes_to_bits(qref.round_elements(v, fmt, rounding=rounding))
    grid = np.unique(np.abs(qref.codes_table(fmt)))
    a = np.abs(v.astype(np.float64))
    lo = grid[np.searchsorted(grid, a, side="right") - 1]
    hi = grid[np.minimum(np.searchsorted(grid, a, side="right"), len(grid) - 1)]
    mag = lo if rounding == "rtz" else np.where(a - lo <= hi - a, lo, hi)
    return qref.codes_to_bits(np.copysign(mag, v).astype(F32).astype(qref.ML_DTYPES[fmt]))


@pytest.mark.parametrize("fmt", ["e4m3", "e4m3fnuz", "e5m2"])
@pytest.mark.parametrize("given", [False, True], ids=["dynamic", "given-scale"])
def test_fp8_scale_rule_row_names_each_rule_under_each_element_rounding(fmt, given):
    spec = p8.Fp8Spec(fmt, "row", given)
    rows, s = p8.scale_rule_rows(spec)
    for rule in (p8.GIVEN_RULES if given else p8.DYNAMIC_RULES):
        si, v = _fp8_reference(rows, rule, fmt, given=s)
        for rounding in pc.ELEMENT_RULES:
            codes = _round_reference(v, fmt, rounding)
            assert p8.read_scale_rule(rows, codes, list(si.reshape(-1)), spec, s) == [rule], \
                (rule, rounding)


def test_round_codes_agrees_with_the_references():
    v = np.linspace(-470, 470, 20001).astype(F32)
    for fmt, rule in itertools.product(["e4m3", "e2m1", "e5m2"], pc.ELEMENT_RULES):
        assert np.array_equal(pc.round_codes(v / (80 if fmt == "e2m1" else 1), fmt, rule),
                              _round_reference(v / (80 if fmt == "e2m1" else 1), fmt, rule))


# ---- each field's blocks separate its conventions (deliberately wrong quantizers) -------------

def _mx_runner(sr="even", er="ties_away", nan_code=0x7, pre=None, post=None, fmt="e2m1"):
    """The reference MX quantizer with AITER Triton's NaN handling by default (NaN left out of
    the block amax, coded +-``nan_code``), optionally changed before / after."""
    def run(y, given):
        y = np.asarray(y, F32) if pre is None else pre(np.asarray(y, F32))
        nan = np.isnan(y)
        bits, scales = qref.mx_quantize(np.where(nan, F32(0), y), fmt, sr, er)
        bits = np.where(nan, nan_code | (np.signbit(y) << 3), bits).astype(np.uint8)
        if post is not None:
            bits, scales = post(y, bits, scales)
        return pc.RunOutput(bits, scales)
    return run


def _observe_mx(run, fmt="e2m1") -> dict:
    return pc.observation("test", pmx.observe_mx(run, fmt))


def _blocks_where(y, pred):
    """Mask (1, nb) of the blocks of row y holding an element for which pred is true."""
    return pred(y.reshape(1, -1, pmx.BLOCK)).any(axis=-1)


def _zero_block_byte_92(y, bits, scales):  # AITER HIP: the amax starts at 1e-10
    return bits, np.where(~_blocks_where(y, lambda b: b != 0), 92, scales).astype(np.uint8)


def _flush_subnormals(y):
    return np.where(np.abs(y) < np.finfo(F32).tiny, np.copysign(F32(0), y), y).astype(F32)


def _inf_block_byte_0xfe(y, bits, scales):  # AITER Triton: Inf amax clamps to 2^127
    return bits, np.where(_blocks_where(y, np.isinf), 0xFE, scales).astype(np.uint8)


def _pow2_scale_one_up(y, bits, scales):
    amax = np.abs(y.reshape(1, -1, pmx.BLOCK)).max(axis=-1)
    pow2 = np.isfinite(amax) & (amax > 0) & (np.frexp(amax)[0] == 0.5)
    return bits, np.where(pow2, scales + 1, scales).astype(np.uint8)


MX_CHANGES = [
    ("rne elements", dict(er="rne"), {"element_rounding"}),
    ("floor scales", dict(sr="floor"), {"scale_rule"}),
    ("rceil scales", dict(sr="rceil"), {"scale_rule"}),
    ("NaN +-6 -> +-1.5", dict(nan_code=0x3), {"nan"}),
    ("zero block byte 92", dict(post=_zero_block_byte_92), {"zero_block"}),
    ("subnormals flushed", dict(pre=_flush_subnormals), {"subnormal_block"}),
    ("Inf block byte 0xFE", dict(post=_inf_block_byte_0xfe), {"inf"}),
]


@pytest.mark.parametrize("name,change,fields", MX_CHANGES, ids=[c[0] for c in MX_CHANGES])
def test_a_changed_mx_convention_is_a_change_of_its_field_only(name, change, fields):
    old, new = _observe_mx(_mx_runner()), _observe_mx(_mx_runner(**change))
    changes = observe.diff_observations(old, new)
    assert {ch.field for ch in changes} == fields, [ch.describe() for ch in changes]
    for ch in changes:  # the witness: one probe block, and two different outputs of it
        assert len(ch.witness_input) == pmx.BLOCK and ch.old_output != ch.new_output


def test_element_rounding_change_reads_ties_away_to_rne_with_its_witness():
    old, new = _observe_mx(_mx_runner()), _observe_mx(_mx_runner(er="rne"))
    [ch] = observe.diff_observations(old, new)
    assert (ch.field, ch.old, ch.new) == ("element_rounding", "ties_away", "rne")
    assert "element_rounding: ties_away -> rne; input [" in ch.describe()
    assert ch.old_output["scale"] == ch.new_output["scale"]  # same scale, other codes


def test_a_changed_amax_pow2_rule_is_seen_by_the_amax_pow2_field():
    changes = observe.diff_observations(_observe_mx(_mx_runner()),
                                        _observe_mx(_mx_runner(post=_pow2_scale_one_up)))
    assert "amax_pow2" in {ch.field for ch in changes}


def test_identical_runs_give_identical_observations_and_no_change():
    a, b = _observe_mx(_mx_runner()), _observe_mx(_mx_runner())
    assert a == b and observe.diff_observations(a, b) == []
    assert observe.diff_observations({"x:y": a}, {"x:y": b}) == []


def _fp8_runner(rule="amax/fmax", rounding="rne", granularity="row", fmt="e4m3", tweak=None):
    """Reference FP8 quantizer under ``rule`` (AITER's rules leave NaN out of the amax)."""
    def run(y, given):
        y = np.asarray(y, F32)
        if given is not None:
            si, v = _fp8_reference(y, rule, fmt, given=given)
        else:
            si, v = _fp8_reference(y, rule, fmt, per_row=granularity == "row",
                                   nan_ignoring=rule != "fmax/amax")
        codes = qref.codes_to_bits(qref.round_elements(v, fmt, rounding=rounding))
        if tweak is not None:
            codes, si = tweak(y, v, codes, si)
        return pc.RunOutput(codes, np.asarray(si, F32).reshape(-1))
    return run


def _nan_saturates(y, v, codes, si):
    return np.where(np.isnan(y), np.where(np.signbit(y), 0xFE, 0x7E), codes).astype(np.uint8), si


def _zero_row_scale_one(y, v, codes, si):
    zero = ~np.any(y != 0, axis=1, keepdims=True)
    return np.where(zero, 0, codes).astype(np.uint8), np.where(zero, F32(1), si)


def _overflow_to_nan(y, v, codes, si):
    return np.where(np.abs(v) > 448, 0x7F | (np.signbit(v) << 7), codes).astype(np.uint8), si


FP8_CHANGES = [
    ("ties away", dict(rounding="ties_away"), {"element_rounding", "subnormal_rounding"}),
    ("NaN saturates", dict(tweak=_nan_saturates), {"nan"}),
    ("zero row scale 1", dict(tweak=_zero_row_scale_one), {"zero_row"}),
    ("hip rule", dict(rule="amax*rcp(fmax)"), {"scale_rule"}),
]


@pytest.mark.parametrize("granularity", ["row", "tensor"])
@pytest.mark.parametrize("name,change,fields", FP8_CHANGES, ids=[c[0] for c in FP8_CHANGES])
def test_a_changed_fp8_convention_is_a_change_of_its_field_only(name, change, fields,
                                                                granularity):
    spec = p8.Fp8Spec("e4m3", granularity, False)
    old = pc.observation("t", p8.observe_fp8(_fp8_runner(granularity=granularity), spec))
    new = pc.observation("t", p8.observe_fp8(
        _fp8_runner(**dict(dict(granularity=granularity), **change)), spec))
    assert {ch.field for ch in observe.diff_observations(old, new)} == fields


@pytest.mark.parametrize("change,fields", [
    (dict(rule="x * scale"), {"scale_rule"}),
    (dict(tweak=_overflow_to_nan), {"saturation", "inf"}),  # Inf is above max too
    (dict(rounding="ties_away"), {"element_rounding", "subnormal_rounding"}),
])
def test_a_changed_given_scale_convention_is_a_change_of_its_field_only(change, fields):
    spec = p8.Fp8Spec("e4m3", "tensor", True)
    base = dict(rule="x * fl32(1/scale_inv)")
    old = pc.observation("t", p8.observe_fp8(_fp8_runner(**base), spec))
    new = pc.observation("t", p8.observe_fp8(_fp8_runner(**dict(base, **change)), spec))
    assert old["fields"]["saturation"] == "clamp to +-448"
    assert {ch.field for ch in observe.diff_observations(old, new)} == fields


# ---- fused constructions are exact --------------------------------------------------------------

def _all_probe_rows():
    rows = [pytest.param(build("e2m1").reshape(1, -1), id=f"mx-{name}")
            for name, (build, _) in pmx.FIELDS.items()]
    for given in (False, True):
        rows += [pytest.param(build(p8.Fp8Spec("e4m3", "row", given))[0],
                              id=f"fp8-{name}{'-given' if given else ''}")
                 for name, (build, _) in p8.FIELDS.items()]
    return rows


def _same(got, want) -> bool:
    """float64 ``got`` rounds to float32 ``want`` bit for bit (NaN where it is NaN)."""
    got, want = np.asarray(got, np.float64).astype(F32), np.asarray(want, F32)
    nan = np.isnan(want)
    return np.array_equal(np.isnan(got), nan) and \
        np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("y", _all_probe_rows())
def test_fused_constructions_give_the_probe_values_exactly(y):
    """Against the float64 references: the exact intermediate rounds to y in fp32 (a kernel
    computing in fp32 gets y itself: the constructions check that in numpy fp32 too)."""
    x, g = pf.rmsnorm_inputs(y)
    assert _same(ref_norms.rmsnorm_fwd(x.astype(np.float64), g.astype(np.float64),
                                       eps=pf.EPS)[0], y)
    x = pf.act_inputs(y)
    assert _same(ref_acts.act_fwd(x.astype(np.float64), pf.ACT_KIND), y)
    if not np.any((y == 0) & np.signbit(y)):  # beta = +0 turns -0 into +0
        x, g, b = pf.layernorm_inputs(y)
        assert _same(ref_norms.layernorm_fwd(x.astype(np.float64), g.astype(np.float64),
                                             b.astype(np.float64), eps=pf.EPS)[0], y)


def test_a_value_a_construction_cannot_give_is_unprobed_not_guessed():
    with pytest.raises(pc.NotConstructible):
        pf.rmsnorm_inputs(np.array([[1, 2], [1, 3]], F32))  # rows must share |gamma|
    with pytest.raises(pc.NotConstructible):
        pf.act_inputs(np.array([[2.0 ** -149, 1]], F32))  # y / 32 underflows


@pytest.mark.parametrize("op", ["rmsnorm_fwd_quantize", "act_fwd_quantize"])
def test_torch_fused_mx_observes_what_its_plain_quantizer_does(op):
    plain = observe.observe_contract(_mx_contract("floor", "rne"), "cpu")
    fused = observe.observe_contract(_mx_contract("floor", "rne", op=op), "cpu")
    assert fused["fields"] == plain["fields"] and fused["witness"] == plain["witness"]


# ---- the observation format ---------------------------------------------------------------------

def test_unroutable_and_unprobeable_contracts():
    assert observe.observe_contract(Contract(backend="torch", entry_point="p", op="gemm"),
                                    "cpu") is None
    obs = observe.observe_contract(Contract(
        backend="aiter", entry_point="per_1x32_f4_quant_hip", op="quantize", family="mxfp4",
        scale_rule="e8m0-nearest-pow2(ties up)/4", element_rounding="rne"), "cpu")
    assert not obs["fields"] and set(obs["unprobed"]) == set(pmx.FIELDS)
    assert "no tealite MX recipe" in obs["unprobed"]["scale_rule"]


def test_a_crashing_field_is_its_value_and_diffs_name_it():
    def crash_on_nan(y, given):
        if np.isnan(y).any():
            raise RuntimeError("kernel fault")
        return _mx_runner()(y, given)
    obs = _observe_mx(crash_on_nan)
    assert obs["fields"]["nan"] == "error: RuntimeError: kernel fault"
    assert obs["witness"]["nan"]["output"] is None
    assert observe.exercised_fields(obs) == set(pmx.FIELDS)
    [ch] = observe.diff_observations(_observe_mx(_mx_runner()), obs)
    assert ch.field == "nan" and ch.new_output is None


def test_diff_of_maps_names_entry_points_seen_on_one_side():
    a = _observe_mx(_mx_runner())
    changes = observe.diff_observations({"b:one": a}, {"b:two": a})
    assert [(c.where, c.field, c.old, c.new) for c in changes] == [
        ("b:one", "(observation)", "observed", "absent"),
        ("b:two", "(observation)", "absent", "observed")]
    err = {"probe": "p", "fields": {}, "witness": {}, "unprobed": {}, "error": "boom"}
    assert {c.field for c in observe.diff_observations({"b:one": a}, {"b:one": err})} == \
        {"error"} | set(pmx.FIELDS)


# ---- end to end on AITER (one AITER copy per process) ------------------------------------------

AITER_KERNEL = Path("aiter/ops/triton/_triton_kernels/quant.py")
TIES_AWAY_LINE = "e2m1_tmp = tl.minimum((((e << 2) | (m >> 21)) + 1) >> 1, 0x7)"
# The same line rounding half to even: add 1 at the half bit only when the kept LSB or any
# lower (sticky) bit is set.
RNE_LINE = ("e2m1_tmp = tl.minimum((((e << 2) | (m >> 21)) + (((m >> 22) & 1) | "
            "((m & 0x1FFFFF) != 0).to(tl.uint32))) >> 1, 0x7)")
# v0.1.7.post3+ apply Python `not` to tensors in _mxfp4_quant_op: elementwise when compiled,
# the truth value of the whole array in the interpreter (NUMERICS.md).  `~` is its
# elementwise equivalent on these boolean masks.
INTERPRETER_SAFE = {"(not saturate_mask)": "(~saturate_mask)",
                    "not (saturate_mask | denormal_mask)": "~(saturate_mask | denormal_mask)"}
OBSERVE_MX = """
import json
from tealite import registry
from tealite.backends.aiter_common import contracts as C
from tealite_verify.gate import observe
registry.backends()
runs = [{c.entry_point: observe.observe_contract(c, "cpu")
         for c in C.contracts("aiter_triton") if c.family == "mxfp4"} for _ in range(2)]
assert runs[0] == runs[1], "the same AITER must give the identical observation"
from tealite.backends.aiter_common import loader as L
print(json.dumps({"version": L.load().version, "observed": runs[0]}))
"""


def _observe_in_subprocess(aiter_path: Path | None) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("TEALITE_AITER_PATH", None)
    if aiter_path is not None:
        env["TEALITE_AITER_PATH"] = str(aiter_path)
    r = subprocess.run([sys.executable, "-c", OBSERVE_MX], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])  # {"version", "observed"}


def _installed_root() -> Path:
    from tealite.backends.aiter_common import loader as L
    if L.why_unavailable() is not None or os.environ.get("TEALITE_AITER_PATH"):
        pytest.skip("needs the installed AITER (TEALITE_AITER_PATH unset)")
    return Path(L.find_source()[0])


INSTALLED_VERSION = "0.1.7.post2"  # pyproject's amd-aiter pin


@pytest.fixture(scope="module")
def installed():
    _installed_root()
    out = _observe_in_subprocess(None)
    if not str(out["version"]).startswith(INSTALLED_VERSION):
        pytest.skip(f"these checks describe amd-aiter {INSTALLED_VERSION}, installed is "
                    f"{out['version']}")
    return out["observed"]


def test_installed_aiter_mxfp4_fields(installed):
    for ep in ("dynamic_mxfp4_quant", "fused_rms_mxfp4_quant", "act_mul_and_mxfp4_quant"):
        f = installed[ep]["fields"]
        assert f["element_rounding"] == "ties_away" and "even" in f["scale_rule"], (ep, f)
        assert f["nan"].startswith("NaN: scale 0x7F, NaN -> 0x7(+6)"), f["nan"]
        # the fused kernels share _mxfp4_quant_op: the constructions reached it exactly
        assert installed[ep]["witness"] == installed["dynamic_mxfp4_quant"]["witness"]


def _patched_copy(src: Path, dest: Path, edits: dict[str, str]) -> Path:
    shutil.copytree(src / "aiter", dest / "aiter", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("AITER_SOURCE",):
        if (src / f).exists():
            shutil.copy(src / f, dest / f)
    kernel = dest / AITER_KERNEL
    text = kernel.read_text()
    for old, new in edits.items():
        assert old in text, f"{old!r} not in {kernel}: the kernel line this test edits moved"
        text = text.replace(old, new)
    kernel.write_text(text)
    return dest


def test_a_copy_with_rne_tie_breaking_is_observed_as_rne(installed, tmp_path):
    copy = _patched_copy(_installed_root(), tmp_path, {TIES_AWAY_LINE: RNE_LINE})
    new = _observe_in_subprocess(copy)["observed"]
    changes = observe.diff_observations(installed["dynamic_mxfp4_quant"],
                                        new["dynamic_mxfp4_quant"])
    assert [(c.field, c.old, c.new) for c in changes] == [
        ("element_rounding", "ties_away", "rne")]


CACHE = Path(os.environ.get("AITER_CACHE", "/work/aiter-cache"))


def test_real_v0_1_9_post1_made_interpreter_safe_is_observed_as_rne(installed, tmp_path):
    tree = CACHE / "v0.1.9.post1"
    if not (tree / AITER_KERNEL).exists():
        pytest.skip(f"no exported AITER v0.1.9.post1 tree at {tree}")
    copy = _patched_copy(tree, tmp_path, INTERPRETER_SAFE)
    env = dict(os.environ, TRITON_INTERPRET="1", TEALITE_AITER_PATH=str(copy))
    probe = subprocess.run([sys.executable, "-c", "from tealite.backends.aiter_common "
                            "import loader as L; L.load()"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"this loader cannot load v0.1.9.post1: {probe.stderr[-300:]}")
    new = _observe_in_subprocess(copy)["observed"]
    for ep in ("dynamic_mxfp4_quant", "fused_rms_mxfp4_quant", "act_mul_and_mxfp4_quant"):
        changes = {c.field: c for c in observe.diff_observations(installed[ep], new[ep])}
        assert (changes["element_rounding"].old, changes["element_rounding"].new) == \
            ("ties_away", "rne"), ep
        assert "nan" in changes and "NaN -> 0x7(+6)" not in changes["nan"].new  # no longer +-6
        assert "even" in new[ep]["fields"]["scale_rule"]
