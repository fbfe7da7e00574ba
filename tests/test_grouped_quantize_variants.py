"""The grouped quantize kernels' "aligned" variant (``grouped_quantize.VARIANTS["ct"]``) gives
the plain kernels' bits, in Triton's interpreter in CI and cross-compiled for the GPUs.

* ``split_alignment``: the largest power of two <= 16 dividing every split (what the
  variant may promise the compiler).
* Same codes, scales, amaxes and dbias bits as "plain" on hostile inputs (NaN / Inf /
  subnormals, empty groups, groups not a multiple of the tile, prime splits, which give
  ALIGN 1: the plain code), for per-tensor current and delayed scaling and 1x128 / 128x128
  blocks, rowwise and columnwise, with dbias; the variant really passes its ALIGN.
* A bug only the aligned path has is caught by the same comparison.
* Cross-compiled for sm_90a the aligned kernels store x.T's codes as 16-byte vectors where the
  plain ones store single bytes (what the variant is for), and both compile for gfx942.
* The switch: TEALITE_GROUPED_QUANTIZE_CT at import, an unknown value refused by name, the
  default "aligned" (measured faster on an H100, fifth session).
On a GPU this file runs compiled (the seeded-bug test aside), and
benchmarks/grouped_quantize_sweep.py compares the bench shapes.
"""
from __future__ import annotations

import os

import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.recipes import Granularity

from _helpers_cross_compile import compiled_json
from _helpers_triton_quantize import DEV, needs_triton

pytestmark = needs_triton

triton = pytest.importorskip("triton")
tl = triton.language

from benchmarks.grouped_quantize_sweep import output_bits, same_bits  # noqa: E402
from tealite.backends.triton import grouped_quantize as G  # noqa: E402


@pytest.mark.parametrize("splits, align", [
    ([1024] * 8, 16), ([4096, 0, 1024, 1024, 0, 1024, 512, 512], 16), ([48, 32], 16),
    ([36, 0, 20, 8], 4), ([2, 0, 6], 2), ([13, 0, 7], 1), ([0, 0], 16), ([7], 1)])
def test_split_alignment(splits, align):
    assert G.split_alignment(splits) == align


def _hostile(m: int, k: int, seed: int = 0) -> torch.Tensor:
    """bf16 (m, k): normals over many binades by row, 3 % raw bit patterns (NaN payloads,
    subnormals, Inf) and the specials in row 1 (a row of the first non-empty group)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(
        torch.randint(-20, 20, (m, 1), generator=g).float())
    x = x.to(torch.bfloat16)
    raw = torch.randint(0, 1 << 16, (m, k), generator=g, dtype=torch.int32).to(torch.int16)
    x = torch.where(torch.rand(m, k, generator=g) < 0.03, raw.view(torch.bfloat16), x)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40,
                             -1e-40, 448.0])
    if m > 1:
        x[1, :min(k, 8)] = specials[:min(k, 8)].to(torch.bfloat16)
    return x


def _finite(x):
    return torch.nan_to_num(x.float(), nan=0.0, posinf=1.0, neginf=-1.0).to(x.dtype)


class _Spy:
    """Records the ALIGN of every launch of a jit kernel and runs it."""

    def __init__(self, kernel):
        self.kernel, self.aligns = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.aligns.append(kwargs.get("ALIGN"))
            return self.kernel[grid](*args, **kwargs)
        return launch


_RECIPES = {"current": R.Float8CurrentScaling(), "delayed": R.DelayedScaling(),
            "block1x128": R.Float8BlockScaling(), "block128": R.Float8BlockScaling(block=(128, 128))}
# Splits: ALIGN 16 / 4 with groups not a multiple of any tile, empty groups; primes (ALIGN
# 1); every group empty.  Widths: a partial column tile (40) and a whole one.
_SPLITS = [[16, 0, 48, 32], [36, 0, 20, 8, 4], [13, 0, 7, 3], [0, 0]]


def _run(x, splits, recipe, rowwise, columnwise, dbias):
    scale = (torch.full((len(splits),), 3.0, device=DEV) if recipe.scale_given else None)
    return output_bits(tealite.grouped_quantize(x, splits, recipe, rowwise=rowwise,
                                          columnwise=columnwise, dbias=dbias, scale=scale,
                                          backend="triton"))


def _kernel_name(recipe) -> str:
    block = recipe.scale_granularity is Granularity.BLOCK
    return "_grouped_block_cast_kernel" if block else "_grouped_tensor_cast_kernel"


@pytest.mark.parametrize("name", sorted(_RECIPES))
def test_aligned_gives_the_plain_bits(name, monkeypatch):
    recipe = _RECIPES[name]
    spy = _Spy(getattr(G, _kernel_name(recipe)))
    monkeypatch.setattr(G, _kernel_name(recipe), spy)
    cases = [(s, k, row, col) for s in _SPLITS for k, row, col in
             [(40, True, True), (128, False, True)]] + [(_SPLITS[0], 40, True, False)]
    for i, (splits, k, rowwise, columnwise) in enumerate(cases):
        x = _hostile(sum(splits), k, seed=i).to(DEV)
        if name == "delayed" and i % 2:
            x = _finite(x)  # a given scale: NaN-free groups too
        monkeypatch.setitem(G.VARIANTS, "ct", "plain")
        want = _run(x, splits, recipe, rowwise, columnwise, True)
        monkeypatch.setitem(G.VARIANTS, "ct", "aligned")
        spy.aligns.clear()
        assert same_bits(_run(x, splits, recipe, rowwise, columnwise, True), want), (splits, k)
        assert spy.aligns == [G.split_alignment(splits)], spy.aligns


@triton.jit
def _tile_off_by_one_row(pid, tiles_n, tile_group, tile_row, group_off, BM: tl.constexpr,
                         BN: tl.constexpr, ALIGN: tl.constexpr = 1):
    g, off, mg, r0, rows, cols, t, pid_n = G._plain_tile(pid, tiles_n, tile_group, tile_row,
                                                         group_off, BM, BN, ALIGN)
    if ALIGN > 1:  # a bug of the aligned path only: each group's last row is dropped
        mg = mg - 1
    return g, off, mg, r0, rows, cols, t, pid_n


@pytest.mark.skipif(DEV != "cpu", reason="patches a jit helper: only the interpreter re-reads it")
def test_an_aligned_only_bug_is_caught(monkeypatch):
    splits, recipe = [16, 0, 32], _RECIPES["block1x128"]
    x = _hostile(48, 40).to(DEV)
    monkeypatch.setitem(G.VARIANTS, "ct", "plain")
    want = _run(x, splits, recipe, True, True, True)
    monkeypatch.setattr(G, "_plain_tile", G._tile, raising=False)
    monkeypatch.setattr(G, "_tile", _tile_off_by_one_row)
    assert same_bits(_run(x, splits, recipe, True, True, True), want)  # ALIGN 1: unaffected
    monkeypatch.setitem(G.VARIANTS, "ct", "aligned")
    assert not same_bits(_run(x, splits, recipe, True, True, True), want)


# ---- compiled for the GPUs (CI has none: cross-compiled) ----------------------------------------

_COMPILE = """
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tealite.backends.triton import grouped_quantize as G
from tealite.backends.triton._codecs import _fmt_constants, _overflow_constants
from tealite.formats import get_format

def build(kernel, extra, target, warps, bm):
    fmt = get_format("e4m3")
    consts = dict(_fmt_constants(fmt), **_overflow_constants(fmt), ROW=True, COL=True,
                  POW2=False, DBIAS=True, SATURATE=True, X_BF16=True, HW_FP8=False, BM=bm,
                  BN=128, **extra)
    ptrs = dict(x_ptr="*i16", q_ptr="*u8", qt_ptr="*u8", amax_bits_ptr="*i32",
                tile_group="*i32", tile_row="*i32", group_off="*i64", s_off="*i64",
                st_off="*i64")
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "*fp32" if n.endswith("_ptr")
           else "fp32" if n in ("fmax", "eps") else "i32") for n in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if sig[n] not in ("constexpr", "fp32")}
    k = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget(*target),
                       options=dict(num_warps=warps))
    if target[0] != "cuda":
        return dict(bytes=len(k.asm["hsaco"]))
    stores = re.findall(r"st\\.global(?:\\.\\w+)*?(?:\\.v(\\d))?\\.(b8|b16|b32)", k.asm["ptx"])
    return dict(bytes=len(k.asm["cubin"]), st_b8=sum(w == "b8" for _, w in stores),
                st_v4_b32=sum(v == "4" and w == "b32" for v, w in stores))

tensor, block = G._grouped_tensor_cast_kernel, G._grouped_block_cast_kernel
out = {}
for align in (1, 16):
    out[f"tensor-{align}-90"] = build(tensor, dict(GIVEN=False, ALIGN=align), ("cuda", 90, 32), 4, 32)
    out[f"block-{align}-90"] = build(block, dict(SQUARE=False, ALIGN=align), ("cuda", 90, 32), 8, 128)
out["tensor-16-gfx942"] = build(tensor, dict(GIVEN=False, ALIGN=16), ("hip", "gfx942", 64), 4, 32)
out["block-16-gfx942"] = build(block, dict(SQUARE=False, ALIGN=16), ("hip", "gfx942", 64), 8, 128)
json.dump(out, sys.stdout)
"""


def test_aligned_stores_vectors_and_compiles_for_sm90_and_gfx942():
    out = compiled_json(_COMPILE)
    assert all(v["bytes"] for v in out.values()), out
    for kind in ("tensor", "block"):
        plain, aligned = out[f"{kind}-1-90"], out[f"{kind}-16-90"]
        # Plain: x.T's codes one byte at a time (32 / 64 per thread); aligned: none.
        assert plain["st_b8"] >= 32 and aligned["st_b8"] == 0, out
        assert aligned["st_v4_b32"] > plain["st_v4_b32"], out


def test_an_unknown_variant_is_refused_naming_the_switch(monkeypatch):
    monkeypatch.setitem(G.VARIANTS, "ct", "packed")
    with pytest.raises(ValueError, match=r"TEALITE_GROUPED_QUANTIZE_CT.*plain, aligned.*'packed'"):
        tealite.grouped_quantize(_hostile(16, 40).to(DEV), [16], _RECIPES["current"],
                                 columnwise=True, backend="triton")


def test_the_environment_sets_the_variant_at_import_and_the_default_is_measured(monkeypatch):
    script = ("import json, sys\nfrom tealite.backends.triton import grouped_quantize as G\n"
              "json.dump(G.VARIANTS, sys.stdout)")
    if "TEALITE_GROUPED_QUANTIZE_CT" not in os.environ:
        assert G.VARIANTS == {"ct": "aligned"}  # measured faster on an H100, same bits
    monkeypatch.setenv("TEALITE_GROUPED_QUANTIZE_CT", "plain")
    assert compiled_json(script) == {"ct": "plain"}
