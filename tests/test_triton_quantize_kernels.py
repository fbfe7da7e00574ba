"""Triton quantization kernels (MX, Float8BlockScaling, FP8 cast-transpose, dequantize) run
through the differential harness (``run_case``), through Triton's interpreter in CI.

* Seeded bugs: the real kernels launched with one deliberate mistake must be caught by the
  harness, and the same case must pass unseeded.
* Layouts and routing: every output field has the torch backend's shape and dtype, long rows
  take the tiled per-row path, empty inputs give empty outputs, and quantize then dequantize
  passes the quant_roundtrip smoke cases.
* Tile order of the cast-transpose launches (``_codecs._tile_ids``): every tile once in the
  grouped order, with the same output bits as row-major order.

The codecs these kernels share, unit-tested bit for bit: test_triton_quantize_codecs.py.
"""
from __future__ import annotations

import pytest
import torch

from tealite import recipes as R
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_triton_quantize import DEV, TRITON, needs_triton

pytestmark = needs_triton

triton = pytest.importorskip("triton")
tl = triton.language

from tealite.backends import triton as triton_backend  # noqa: E402
from tealite.backends.triton import INTERPRET  # noqa: E402
from tealite.backends.triton import _codecs as C  # noqa: E402
from tealite.backends.triton import dequantize as TDQ  # noqa: E402
from tealite.backends.triton import quantize as TQ  # noqa: E402
from tealite.backends.triton import quantize_block as TQB  # noqa: E402
from tealite.backends.triton import quantize_mx as TQMX  # noqa: E402


# ---- seeded bugs, caught through the harness ----------------------------------------------------

def _case(recipe, shape, *, dtype="bfloat16", rowwise=True, columnwise=True, pad=False,
          dist=None, seed=1):
    dist = dist or {"kind": "quant_edges", "fmt": recipe["fmt"], "block": 32}
    return {"recipe": recipe, "dtype": dtype, "shape": list(shape), "rowwise": rowwise,
            "columnwise": columnwise, "pad": pad, "dist": dist, "seed": seed}


def _mx(fmt, scale="rceil", elem="rne"):
    return {"kind": "mx", "fmt": fmt, "scale_rounding": scale, "element_rounding": elem}


_OUTLIERS = {"kind": "outliers", "scale": 1.0, "frac": 0.05, "factor": 1024.0}
_BLOCK_1X128 = {"kind": "block", "fmt": "e4m3", "block": [1, 128], "force_pow2_scales": False,
                "amax_epsilon": 0.0, "saturation": "saturate"}


@triton.jit
def _pack_nibbles_swapped(codes, R_: tl.constexpr, C_: tl.constexpr):
    even, odd = tl.split(tl.reshape(codes, (R_, C_ // 2, 2)))
    return odd | (even << 4)


def _floor_for_rceil(fmt_name, mode):
    consts = C._mx_scale_constants(fmt_name, mode)
    return dict(consts, MODE=0) if consts["MODE"] == 3 else consts


# name -> (case, {module attribute: seeded value}, outputs that must be caught)
SEEDED = {
    # _e8m0_scale run with FLOOR where the recipe says RCEIL.
    "floor-instead-of-rceil": (
        _case(_mx("e4m3"), (64, 96)), {(TQMX, "_mx_scale_constants"): _floor_for_rceil},
        {"scale_inv", "columnwise_scale_inv"}),
    # E2M1 packing with the even element in the high nibble.
    "swapped-fp4-nibbles": (
        _case(_mx("e2m1", "floor"), (64, 64)), {(TQMX, "_pack_nibbles"): _pack_nibbles_swapped},
        {"data", "columnwise_data"}),
    # Cast-transpose writes the columnwise (K, M/32) scales with the rowwise row stride.
    "columnwise-scale-stride": (
        _case(_mx("e4m3"), (128, 64), dtype="float32", dist=_OUTLIERS),
        {(TQMX, "_row_stride"): lambda t: 0 if t is None else 2},  # K/32 = 2, M/32 = 4
        {"columnwise_scale_inv"}),
    # RNE elements where the recipe says ties-away (MXFP8).
    "rne-instead-of-ties-away": (
        _case(_mx("e5m2", "floor", "ties_away"), (32, 64)), {(TQMX, "_ties_away"): lambda r: False},
        {"data", "columnwise_data"}),
    # Float8BlockScaling 1x128 run with a 256-wide tile: one amax per 256 elements.
    "1x128-block-256-wide": (
        _case(_BLOCK_1X128, (40, 300), rowwise=True, columnwise=False, dist=_OUTLIERS),
        {(TQB, "_TILES"): {**TQB._TILES, (1, True, False): (32, 256, 4)}},
        {"scale_inv", "data"}),
    # Per-tensor cast-transpose with OCP e4m3's bias on e4m3fnuz (the monkeypatch point that
    # test_triton_interpreter also uses), columnwise only.
    "fnuz-bias-columnwise-only": (
        _case({"kind": "current", "fmt": "e4m3fnuz", "granularity": "tensor",
               "force_pow2_scales": False, "amax_epsilon": 0.0, "saturation": "saturate"},
              (37, 70), rowwise=False),
        {(TQ, "_fmt_constants"): lambda fmt: dict(C._fmt_constants(fmt), BIAS=7)},
        {"columnwise_data"}),
    # The same wrong bias in the two-pass per-row cast-transpose (per-column scales for x.T).
    "fnuz-bias-per-row-cast-transpose": (
        _case({"kind": "current", "fmt": "e4m3fnuz", "granularity": "row",
               "force_pow2_scales": False, "amax_epsilon": 0.0, "saturation": "saturate"},
              (37, 70)),
        {(TQ, "_fmt_constants"): lambda fmt: dict(C._fmt_constants(fmt), BIAS=7)},
        {"data", "columnwise_data"}),
}
_NEEDS_INTERPRETER = {"swapped-fp4-nibbles"}  # patches a jit helper: compiled kernels cache it


def _seeded_backend(make_backend, monkeypatch, patches):
    b = make_backend("triton_seeded")
    impl = TRITON.impls["quantize"]

    def seeded_quantize(x, recipe, *, rowwise, columnwise, scale):
        with monkeypatch.context() as m:
            for (module, name), value in patches.items():
                m.setattr(module, name, value)
            return impl.fn(x, recipe, rowwise=rowwise, columnwise=columnwise, scale=scale)

    b.implements("quantize", devices=impl.support.devices)(seeded_quantize)
    return b.name


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_seeded_kernel_bug_is_caught(make_backend, monkeypatch, name):
    if name in _NEEDS_INTERPRETER and not INTERPRET:
        pytest.skip("patches a @triton.jit helper, which only the interpreter re-reads")
    case, patches, must_fail = SEEDED[name]
    wrong = _seeded_backend(make_backend, monkeypatch, patches)
    report = run_case(get_spec("quantize"), case, backends=["torch", wrong], device=DEV)
    assert report.outcomes[wrong].status == "ok", report.describe()
    bad = {c.output for c in report.failures if c.lhs == wrong and c.rhs == "reference"}
    assert must_fail <= bad, report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_unseeded_kernel_passes_the_seeded_cases(name):
    report = run_case(get_spec("quantize"), SEEDED[name][0], backends=["triton", "torch"],
                      device=DEV)
    assert report.verdict == "pass", report.describe()
    assert report.outcomes["triton"].status == "ok"


def test_seeded_dequantize_bias_is_caught(make_backend, monkeypatch):
    """dequantize decoding e4m3fnuz with OCP's bias 7 is caught; the real one passes."""
    case = _case({"kind": "current", "fmt": "e4m3fnuz", "granularity": "row",
                  "force_pow2_scales": False, "amax_epsilon": 0.0, "saturation": "saturate"},
                 (16, 40), rowwise=True, columnwise=False)
    good = TDQ._code_constants
    impl = TRITON.impls["dequantize"]
    b = make_backend("triton_seeded_dq")

    def seeded(q, *, out_dtype, columnwise):
        with monkeypatch.context() as m:
            m.setattr(TDQ, "_code_constants", lambda f: dict(good(f), BIAS=7))
            return impl.fn(q, out_dtype=out_dtype, columnwise=columnwise)

    b.implements("dequantize", devices=impl.support.devices)(seeded)
    spec = get_spec("dequantize")
    report = run_case(spec, case, backends=["torch", b.name, "triton"], device=DEV)
    bad = {(c.lhs, c.rhs) for c in report.failures}
    assert (b.name, "reference") in bad, report.describe()
    assert not {p for p in bad if b.name not in p}, report.describe()


# ---- layouts and routing ------------------------------------------------------------------------

@pytest.mark.parametrize("recipe,shape", [
    (R.MXFP8BlockScaling("e4m3"), (64, 96)),
    (R.MXFP4BlockScaling(), (33, 70)),
    (R.Float8BlockScaling("e4m3", (1, 128)), (130, 129)),
    (R.Float8BlockScaling("e5m2", (128, 128)), (129, 257)),
    (R.Float8CurrentScaling("e4m3"), (5, 7)),
], ids=["mxfp8", "mxfp4-pad", "block1x128", "block128x128", "current"])
def test_layout_matches_torch_backend(recipe, shape):
    """Every field present in the torch backend's QuantizedTensor has the same shape and
    dtype from the triton backend (both directions at once)."""
    import tealite
    x = torch.randn(shape, dtype=torch.bfloat16, device=DEV)
    kw = dict(rowwise=True, columnwise=True, pad=True)
    a = tealite.quantize(x, recipe, backend="triton", **kw)
    b = tealite.quantize(x.cpu(), recipe, backend="torch", **kw)
    for field in ("data", "scale_inv", "columnwise_data", "columnwise_scale_inv", "amax"):
        ta, tb = getattr(a, field), getattr(b, field)
        assert (ta is None) == (tb is None), field
        if ta is not None:
            assert (ta.shape, ta.dtype) == (tb.shape, tb.dtype), field


def test_long_rows_take_the_tiled_per_row_path(monkeypatch):
    """Per-row rows longer than the register limit go through the two tiled passes (here
    with the limit lowered so the interpreter stays fast) and still match the reference."""
    case = _case({"kind": "current", "fmt": "e5m2", "granularity": "row",
                  "force_pow2_scales": True, "amax_epsilon": 0.0, "saturation": "saturate"},
                 (9, 100), rowwise=True, columnwise=False, dist={"kind": "specials", "frac": 0.05})
    calls = []
    real = TQ._per_row_tiles
    monkeypatch.setattr(TQ, "_per_row_tiles", lambda *a: calls.append(1) or real(*a))
    with triton_backend.PLATFORM.override(max_row_in_registers=16):
        report = run_case(get_spec("quantize"), case, backends=["triton", "torch"], device=DEV)
    assert report.verdict == "pass" and calls, report.describe()


def test_empty_inputs_give_empty_outputs():
    import tealite
    for recipe in (R.MXFP8BlockScaling(), R.Float8BlockScaling(), R.Float8CurrentScaling()):
        q = tealite.quantize(torch.zeros((0, 64), device=DEV), recipe, rowwise=True,
                             columnwise=True, pad=True, backend="triton")
        assert q.data.shape == (0, 64) and q.columnwise_data.shape == (64, 0)
    q = tealite.quantize(torch.zeros((0, 64), device=DEV), R.DelayedScaling(), columnwise=True,
                         scale=torch.ones(1, device=DEV), backend="triton")
    assert q.amax.item() == 0.0 and q.columnwise_scale_inv.item() == 1.0


def test_quant_roundtrip_smoke_cases_pass():
    """dequantize(quantize(x)) on the triton backend, judged on values against x and the
    torch backend (the quant_roundtrip spec has no op of its own in the differential suite)."""
    spec = get_spec("quant_roundtrip")
    for case in spec.smoke_cases:
        report = run_case(spec, case, backends=["triton", "torch"], device=DEV)
        assert report.verdict == "pass" and report.outcomes["triton"].status == "ok", \
            report.describe()


# ---- tile order of the cast-transpose launches (_codecs._tile_ids) ------------------------------

@triton.jit
def _tile_ids_kernel(o_ptr, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    pid_m, pid_n = C._tile_ids(pid, tiles_m, tiles_n, GROUP_M)
    tl.store(o_ptr + 2 * pid, pid_m)
    tl.store(o_ptr + 2 * pid + 1, pid_n)


def _grouped_order(tiles_m: int, tiles_n: int, group: int) -> list[tuple[int, int]]:
    """Python model of the grouped order: groups of `group` tile rows, column by column."""
    order = []
    for first in range(0, max(tiles_m, 1), group):
        rows = max(1, min(tiles_m - first, group))
        order += [(first + r, c) for c in range(tiles_n) for r in range(rows)]
    return order


@pytest.mark.parametrize("tiles_m,tiles_n,group", [(5, 3, 1), (5, 3, 2), (5, 3, 4), (7, 2, 16),
                                                   (4, 4, 4), (1, 1, 8), (0, 1, 4)])
def test_tile_ids_visit_every_tile_once_in_grouped_order(tiles_m, tiles_n, group):
    grid = max(1, tiles_m) * tiles_n
    out = torch.full((grid, 2), -1, dtype=torch.int32, device=DEV)
    _tile_ids_kernel[(grid,)](out, tiles_m, tiles_n, GROUP_M=group)
    got = [tuple(p) for p in out.cpu().tolist()]
    assert got == _grouped_order(tiles_m, tiles_n, group)
    assert sorted(got) == [(m, n) for m in range(max(1, tiles_m)) for n in range(tiles_n)]


_ORDER_CASES = {
    # name: (recipe, shape, patched table, key, tile without / with grouping)
    "delayed": (R.DelayedScaling("e4m3"), (157, 97), TQ.CONFIGS, "cast_transpose",
                dict(BM=32, BN=32, num_warps=4, GROUP_M=1)),
    "current": (R.Float8CurrentScaling("e5m2"), (157, 97), TQ.CONFIGS, "cast_transpose",
                dict(BM=32, BN=32, num_warps=4, GROUP_M=1)),
    "per-row": (R.Float8CurrentScaling("e4m3", granularity="row"), (157, 97), TQ.CONFIGS,
                "per_row_tiles", dict(BM=32, BN=32, num_warps=4, GROUP_M=1)),
    "block1x128": (R.Float8BlockScaling("e4m3", (1, 128)), (389, 130), TQB._TILES,
                   (1, True, True), (128, 128, 4)),
    "mxfp8": (R.MXFP8BlockScaling("e4m3"), (160, 96), TQMX._TILES, (True, True), (32, 32, 4)),
    "mxfp4": (R.MXFP4BlockScaling(), (160, 96), TQMX._TILES, (True, True), (32, 32, 4)),
}


@pytest.mark.parametrize("name", sorted(_ORDER_CASES))
def test_grouped_tile_order_gives_the_same_bits(name, monkeypatch):
    """GROUP_M = 3 (a partial last group) writes every output bit as row-major order."""
    import tealite
    recipe, shape, table, key, tile = _ORDER_CASES[name]
    grouped = dict(tile, GROUP_M=3) if isinstance(tile, dict) else (*tile, 3)
    torch.manual_seed(0)
    x = torch.randn(shape, device=DEV).to(torch.bfloat16)
    scale = torch.full((1,), 3.0, device=DEV) if isinstance(recipe, R.DelayedScaling) else None
    outs = []
    for cfg in (grouped, tile):
        monkeypatch.setitem(table, key, cfg)
        q = tealite.quantize(x, recipe, rowwise=True, columnwise=True, scale=scale,
                             backend="triton")
        outs.append([None if t is None else t.contiguous().view(torch.uint8).clone() for t in
                     (q.data, q.scale_inv, q.columnwise_data, q.columnwise_scale_inv, q.amax)])
    for a, b in zip(*outs):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
