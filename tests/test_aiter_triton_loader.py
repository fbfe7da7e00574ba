"""tealite.backends.aiter_common.loader: AITER's Triton kernels load without ROCm and compute
the right thing (on the CPU under TRITON_INTERPRET=1, or on a GPU).

The kernel tests need an AITER source: ``$TEALITE_AITER_PATH`` (wheel, unpacked wheel or
source dir) or an installed ``aiter``; without one they are skipped with the loader's reason.
The loader's own plumbing (launch-option filter, error reporting, wheel unpacking) is tested
without AITER.
"""
from __future__ import annotations

import os
import sys
import tempfile
import zipfile

import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.backends.aiter_common import loader as L

REASON = L.why_unavailable()
needs_aiter = pytest.mark.skipif(REASON is not None, reason=f"AITER not available: {REASON}")


@pytest.fixture(scope="module")
def at():
    if REASON is not None:
        pytest.skip(f"AITER not available: {REASON}")
    return L.load()


@pytest.fixture(scope="module")
def device(triton_device):
    return triton_device


def _randn(shape, device, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(device=device, dtype=dtype)


# ---- without AITER -------------------------------------------------------------------------

class _FakeKernel:
    def run(self, *args, **kwargs):
        self.seen = (args, kwargs)
        return "launched"


def test_amd_only_launch_options_are_dropped():
    k = _FakeKernel()
    assert L._wrap_launch(k, L.AMD_ONLY_LAUNCH_OPTIONS, unchecked_assume=False)
    assert not L._wrap_launch(k, L.AMD_ONLY_LAUNCH_OPTIONS, unchecked_assume=False)  # once
    out = k.run(1, 2, grid=(4,), warmup=False, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1,
                num_warps=8, BLOCK_SIZE_M=64)
    assert out == "launched"
    assert k.seen == ((1, 2), {"grid": (4,), "warmup": False, "num_warps": 8,
                               "BLOCK_SIZE_M": 64})


def test_on_rocm_launch_options_pass_through():
    k = _FakeKernel()
    L._wrap_launch(k, (), unchecked_assume=False)
    k.run(grid=(1,), warmup=False, waves_per_eu=2)
    assert k.seen[1]["waves_per_eu"] == 2


def test_a_kernel_parameter_of_the_same_name_is_kept():
    k = _FakeKernel()
    k.arg_names = ["x_ptr", "kpack"]
    L._wrap_launch(k, L.AMD_ONLY_LAUNCH_OPTIONS, unchecked_assume=False)
    k.run(grid=(1,), warmup=False, kpack=2, waves_per_eu=1)
    assert k.seen[1] == {"grid": (1,), "warmup": False, "kpack": 2}


def test_interpreted_launch_grids_become_tuples():
    """AITER writes some grids as lists (``lambda meta: [n]``); the interpreter needs tuples."""
    k = _FakeKernel()
    L._wrap_launch(k, (), unchecked_assume=False, interpreted=True)
    k.run(grid=lambda meta: [3], warmup=False)
    assert k.seen[1]["grid"]({}) == (3,)
    k.run(grid=[2, 1], warmup=False)
    assert k.seen[1]["grid"] == (2, 1)
    compiled = _FakeKernel()
    L._wrap_launch(compiled, (), unchecked_assume=False)
    compiled.run(grid=[2], warmup=False)
    assert compiled.seen[1]["grid"] == [2]  # the GPU launcher indexes lists: left alone


def test_hard_coded_cuda_allocations_land_on_the_cpu_without_a_gpu():
    t = L._TorchAllocatingOnCpu(torch)
    assert t.empty(2, 3, device="cuda", dtype=torch.float32).device.type == "cpu"
    assert t.empty(1).device.type == "cpu" and t.float32 is torch.float32


def test_missing_sources_are_reported(tmp_path, monkeypatch):
    with pytest.raises(L.AiterNotFound, match="aiter/ops/triton"):
        L.find_source(tmp_path)
    monkeypatch.setenv(L.ENV_PATH, str(tmp_path / "nowhere"))
    assert "nowhere" in L.why_unavailable()
    with pytest.raises(ValueError, match="gfx9"):
        L._choose_arch("sm_90", rocm=False)


def test_missing_entry_points_raise_with_their_reason():
    at = L.AiterTriton(root="/r", found_via="test", version="0", arch="gfx950",
                       arch_pinned=True, dropped_launch_options=(),
                       functions={"rms_norm": len}, missing={"gemm_afp4wfp4": "ImportError: x"})
    assert at.rms_norm is len and at.has("rms_norm") and not at.has("gemm_afp4wfp4")
    with pytest.raises(AttributeError, match="ImportError: x"):
        at.gemm_afp4wfp4
    with pytest.raises(AttributeError, match="rms_norm"):
        at.no_such_kernel


def test_a_wheel_is_unpacked_once(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    wheel = tmp_path / "amd_aiter-9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("aiter/ops/triton/__init__.py", "")
        zf.writestr("aiter_meta/csrc/big.cu", "not unpacked")
        zf.writestr("amd_aiter-9.9.dist-info/METADATA", "Name: amd-aiter\nVersion: 9.9\n")
    root, how = L.find_source(wheel)
    assert how == "path argument" and (root / "aiter" / "ops" / "triton").is_dir()
    assert not (root / "aiter_meta").exists() and L._version(root) == "9.9"
    assert L.find_source(wheel)[0] == root


def test_dtypes_stand_in_follows_aiters_fp8_rule():
    """aiter.dtypes is built, not imported (AITER's dtypes.py imports HIP modules from
    v0.1.9.post1 on): fp8 is FNUZ on gfx942, OCP on gfx950, uint8 on an arch AITER does not
    know; the other names the Triton modules read are torch's."""
    from tealite.backends.aiter_common import _loader_stubs as S
    assert S.dtypes_module("gfx942", "d").fp8 is torch.float8_e4m3fnuz
    d = S.dtypes_module("gfx950", "d")
    assert d.fp8 is torch.float8_e4m3fn and d.get_dtype_fp8() is d.fp8
    assert (d.bf16, d.fp16, d.fp32, d.fp8_e8m0) == (torch.bfloat16, torch.float16,
                                                     torch.float32, torch.float8_e8m0fnu)
    assert d.d_dtypes["fp4x2"] is d.fp4x2
    assert S.dtypes_module("gfx000", "d").fp8 is torch.uint8


def test_torch_guard_stand_in_registers_no_custom_op():
    """AITER's torch_compile_guard defines ops named aiter::aiter::name, which make torch's
    exit-time cleanup raise; the stand-in returns the function itself."""
    from tealite.backends.aiter_common import _loader_stubs as S
    guard = S.torch_guard_module("g").torch_compile_guard
    assert guard(gen_fake=None)(len) is len and guard()(max) is max


def test_the_driver_answers_the_pinned_arch_only_while_aiter_imports():
    pytest.importorskip("triton")
    from triton.runtime import driver
    from tealite.backends.aiter_common import _loader_stubs as S
    saved = driver.__dict__.get("_active")
    with S.pinned_driver("gfx942"):
        assert driver.active.get_current_target().arch == "gfx942"
        assert driver.active.get_current_target().backend == "hip"
        with pytest.raises(RuntimeError, match="not queried"):
            driver.active.get_current_device()
    assert driver.__dict__.get("_active") is saved


def test_a_dry_run_records_launches_instead_of_running_them():
    k = _FakeKernel()
    L._wrap_launch(k, L.AMD_ONLY_LAUNCH_OPTIONS, unchecked_assume=False)
    with L.dry_run() as launches:
        assert k.run(1, grid=(2,), BLOCK_SIZE_K=64, kpack=1) is None
    assert not hasattr(k, "seen") and launches[0].kwargs == {"grid": (2,), "BLOCK_SIZE_K": 64}
    assert k.run(grid=(1,)) == "launched"  # outside the block it runs again


# ---- with AITER ----------------------------------------------------------------------------

@needs_aiter
def test_load_accounts_for_every_entry_point(at):
    assert set(at.functions) | set(at.missing) == set(L.ENTRY_POINTS)
    assert not set(at.functions) & set(at.missing)
    for name in ("gemm_a16w16", "gemm_a8w8", "dynamic_mxfp4_quant", "rms_norm", "layer_norm",
                 "dynamic_per_token_quant_fp8_i8",
                 # these read aiter.dtypes at import (bound by the loader)
                 "fused_rms_fp8_per_tensor_static_quant", "act_mul_and_mxfp4_quant",
                 "act_mul_and_fp8_group_quant"):
        assert at.has(name), at.missing.get(name)
    if torch.version.hip is None:
        info = sys.modules[f"{L.OPS}.{L._ARCH_INFO}"]
        assert at.arch_pinned and info.get_arch() == at.arch == "gfx950"
        assert info.get_device() == "MI350X"
        assert at.dropped_launch_options == L.AMD_ONLY_LAUNCH_OPTIONS
    assert at.version and at.version[0].isdigit()
    assert L.load() is at  # cached


@needs_aiter
def test_every_loaded_entry_point_says_where_it_was_found(at):
    assert set(at.locations) == set(at.signatures) == set(at.functions)
    for name, where in at.locations.items():
        module, attr = where.rsplit(":", 1)
        assert attr == name and getattr(sys.modules[module], name) is at.functions[name]
        assert at.module_of(name) is sys.modules[module]
    assert at.signatures["gemm_a16w16"].startswith("(x, w")
    assert set(at.missing_kind) == set(at.missing) and not at.load_errors
    assert set(at.missing_kind.values()) <= set(L.MISSING_KINDS)


@needs_aiter
def test_aiter_dtypes_is_bound_with_the_arch_aiter_sees(at):
    """``aiter.dtypes`` (aiter/utility/dtypes.py, normally bound by aiter/__init__.py) picks
    the FP8 dtype from get_gfx(): the loader's stand-in answers with the arch AITER's Triton
    code sees, so dtypes.fp8 is the pinned arch's (OCP on gfx950, FNUZ on gfx942)."""
    dtypes = sys.modules["aiter"].dtypes
    assert dtypes is sys.modules["aiter.utility.dtypes"] and dtypes.fp8 == at.fp8_dtype
    if not at.arch_pinned:
        return
    import subprocess
    other = "gfx942" if at.arch == "gfx950" else "gfx950"
    env = dict(os.environ, **{L.ENV_ARCH: other})
    readers = ("fused_rms_fp8_per_tensor_static_quant", "act_mul_and_fp8_group_quant")
    code = ("from tealite.backends.aiter_common import loader as L; import sys; at = L.load(); "
            "print(at.arch, sys.modules['aiter'].dtypes.fp8, at.fp8_dtype, "
            f"[n for n in {readers!r} if not at.has(n)])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    want = {"gfx942": "torch.float8_e4m3fnuz", "gfx950": "torch.float8_e4m3fn"}[other]
    assert out.stdout.split() == [other, want, want, "[]"], out.stdout


@needs_aiter
def test_every_loaded_kernel_launch_is_wrapped(at):
    from triton.runtime.jit import KernelInterface
    kernels = [L._innermost_kernel(v) for m in L._aiter_modules() for v in vars(m).values()
               if isinstance(v, KernelInterface)]
    assert kernels and all(getattr(k, "_tealite_launch_wrapped", False) for k in kernels)


def test_rms_norm_and_layer_norm(at, device):
    x, w, b = _randn((16, 96), device, 1), _randn((96,), device, 2), _randn((96,), device, 3)
    x64, w64, b64 = x.double(), w.double(), b.double()
    y = at.rms_norm(x, w, 1e-6)
    want = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    y = at.layer_norm(x, w, b, 1e-5)
    want = torch.nn.functional.layer_norm(x64, (96,), w64, b64, 1e-5)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)


def test_gemm_a16w16_fp16(at, device):
    """fp16 operands: the interpreter's bf16 tl.dot is broken (NUMERICS.md)."""
    x, w = _randn((32, 64), device, 4, torch.float16), _randn((48, 64), device, 5, torch.float16)
    y = at.gemm_a16w16(x, w, dtype=torch.float16)
    want = x.double() @ w.double().t()
    assert y.shape == (32, 48) and y.dtype == torch.float16
    assert ((y.double() - want).norm() / want.norm()).item() < 2e-3


def _ties_block(device) -> torch.Tensor:
    """bf16 rows whose 32-blocks hold exact E2M1 ties (amax 6: scale 1 under every rule)."""
    ties = torch.tensor([0.25, 1.25, 2.5, 5.0, -0.75, -1.75, 3.5, 6.0] * 4)
    x = _randn((32, 128), "cpu", 6, scale=3.0)
    x[::2, :32] = ties
    return x.to(device=device, dtype=torch.bfloat16)


def test_dynamic_mxfp4_quant_matches_the_even_ties_away_recipe(at, device):
    """AITER's Triton MXFP4 convention (EVEN scales, ties-away elements) is one of tealite's
    recipes: codes and E8M0 scales agree bit for bit with the torch backend."""
    x = _ties_block(device)
    codes, scales = at.dynamic_mxfp4_quant(x)
    q = tealite.quantize(x.cpu(), R.MXFP4BlockScaling("even", "ties_away"), backend="torch")
    assert torch.equal(codes.cpu(), q.data.view(torch.uint8))
    assert torch.equal(scales.cpu().contiguous(), q.scale_inv.view(torch.uint8))


def test_mxfp4_comparison_detects_another_rounding(at, device):
    """The comparison above can fail: RNE elements differ from AITER's on the ties."""
    x = _ties_block(device)
    codes, _ = at.dynamic_mxfp4_quant(x)
    q = tealite.quantize(x.cpu(), R.MXFP4BlockScaling("even", "rne"), backend="torch")
    assert not torch.equal(codes.cpu(), q.data.view(torch.uint8))


def test_dynamic_per_token_fp8_quant(at, device):
    x = _randn((64, 128), device, 7, torch.bfloat16, scale=2.0)
    qx = torch.empty(64, 128, dtype=at.fp8_dtype, device=device)
    scale = torch.empty(64, dtype=torch.float32, device=device)
    at.dynamic_per_token_quant_fp8_i8(qx, x, scale)
    fmax = torch.finfo(at.fp8_dtype).max
    want_scale = x.float().abs().amax(dim=1) / fmax
    # The interpreter divides exactly; Triton's '/' on CUDA is approximate (within 2 ulp).
    torch.testing.assert_close(scale, want_scale, rtol=0 if device == "cpu" else 2.4e-7, atol=0)
    want = (x.float() * (1.0 / want_scale)[:, None]).to(at.fp8_dtype)
    same = (qx.view(torch.uint8) == want.view(torch.uint8)).float().mean().item()
    # The interpreter's fp32->fp8 cast misrounds some values (NUMERICS.md); on a GPU only
    # codes at a rounding boundary may move with the approximate reciprocal.
    assert same >= (0.9 if device == "cpu" else 0.99), same
