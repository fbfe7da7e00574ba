"""The Triton GEMM (tealite/backends/triton/gemm.py): under the CPU interpreter in CI, and on a
GPU when run there without TRITON_INTERPRET (the seeded kernels then use the interpreter's
small blocks so that the same shapes cover the same tails and groups).

The differential suite already runs it on drawn cases (tests/test_differential.py, "triton and
gemm").  Here: fixed edge cases that must pass, the host side (no transposed copies), and
seeded bugs -- the real kernel's source with one deliberate change, compiled from a temporary
file -- each of which the harness must report, while the unchanged kernel passes the same case.
"""
from __future__ import annotations

import importlib.util
import inspect
import itertools
import textwrap

import pytest
import torch
from tealite.numerics import Numerics

import tealite
from tealite import registry
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs.gemm import make_case

TRITON = registry.get_backend("triton")
pytestmark = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                reason=f"triton backend: {TRITON.unavailable_reason()}")

if TRITON.unavailable_reason() is None:
    from tealite.backends.triton import INTERPRET
    from tealite.backends.triton import gemm as tg
    DEVICE = "cpu" if INTERPRET else "cuda"

# Interpreter blocks are 16 x 32 x 32 with GROUP_M 2 (gemm._INTERPRETER): M = 37 gives three
# row blocks (one partial GROUP_M group, an M tail), N = 45 two column blocks (an N tail),
# K = 71 a K tail.  Nothing is square, so a swapped dim or stride cannot hide.
M, N, K = 37, 45, 71
LAYOUTS = ("TN", "NN", "NT", "TT")


def _check(case, backends=("torch", "triton")):
    report = run_case(get_spec("gemm"), case, backends=list(backends), device=DEVICE)
    assert report.verdict == "pass", report.describe()
    return report


def _assert_caught(case, wrong):
    """torch passes; ``wrong`` runs and fails against the reference (and pairwise vs torch on
    the CPU)."""
    report = run_case(get_spec("gemm"), case, backends=["torch", wrong], device=DEVICE)
    info = report.describe()
    assert all(o.status == "ok" for o in report.outcomes.values()), info
    failed = {(c.lhs, c.rhs) for c in report.failures}
    assert ("torch", "reference") not in failed, info
    assert (wrong, "reference") in failed, "not caught against the reference:\n" + info
    if DEVICE == "cpu":
        # On CUDA torch declares cuBLAS's reduced-precision split-K sums, so the pairwise
        # bound (the sum of both bounds) is wider than some seeded errors (measured on an
        # H100: the fp16-accumulator bug at 0.13 of it); the reference comparison still fails.
        assert ("torch", wrong) in failed, "not caught pairwise against torch:\n" + info


# ---- the correct kernel -------------------------------------------------------------------------

@pytest.mark.parametrize("layout,dtype", list(itertools.product(LAYOUTS, ("bfloat16", "float16",
                                                                         "float32"))))
def test_every_layout_with_the_full_epilogue(layout, dtype):
    _check(make_case(layout, dtype, M, N, K, bias=True, gelu=True, alpha=0.5, beta=-0.5,
                     out_dtype="float32" if dtype != "float32" else "bfloat16"))


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (0, 5, 3), (48, 64, 64), (16, 32, 1), (3, 97, 257)],
                         ids=["1x1x1", "empty-m", "even-k", "k1", "wide-n"])
def test_edge_shapes(m, n, k):
    _check(make_case("NT", "bfloat16", m, n, k, bias=True, beta=1.0))


def test_bf16_subnormal_inputs_and_rne_output_are_exact():
    """bf16 operands travel as int16 bits in the interpreter (its own bf16 loads mangle
    subnormals) and the output is rounded to nearest even (its own bf16 store truncates)."""
    sub = torch.tensor([[7.62234618111327e-39]]).bfloat16().to(DEVICE)
    one = torch.ones(1, 1, dtype=torch.bfloat16, device=DEVICE)
    r = tealite.gemm(one, sub, layout="TN", backend="triton")
    assert torch.equal(r.out.view(torch.int16), sub.view(torch.int16))
    # 1 + 2^-8 + 2^-16 is above the bf16 tie 1 + 2^-8: RNE gives 1 + 2^-7, truncation 1.
    a = torch.tensor([[1.0, 2.0**-8, 2.0**-16]]).bfloat16().to(DEVICE)
    r = tealite.gemm(a, torch.ones(1, 3, dtype=torch.bfloat16, device=DEVICE), layout="TN",
                     backend="triton")
    assert r.out.item() == 1.0 + 2.0**-7


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_products_exact_and_accumulated_in_fp32(dtype, layout):
    """What the declared numerics claim, checked bit-exactly with an fp32 output: with K = 1
    the result is the product rounded once (exact for 16-bit inputs, also for bf16 widened to
    fp32 in the interpreter; TF32 inputs would fail for fp32), and integer inputs whose sums
    stay below 2^24 come out exact (no rounding to the input dtype on the way)."""
    g = torch.Generator().manual_seed(5)
    for k, make in ((1, lambda s: torch.randn(s, generator=g)),
                    (K, lambda s: torch.randint(-15, 16, s, generator=g).double())):
        a = make((N, k) if layout[0] == "T" else (k, N)).to(dtype)
        b = make((M, k) if layout[1] == "N" else (k, M)).to(dtype)
        op_a = a.double().t() if layout[0] == "T" else a.double()
        op_b = b.double().t() if layout[1] == "T" else b.double()
        want = (op_b @ op_a).float()
        got = tealite.gemm(a.to(DEVICE), b.to(DEVICE), layout=layout, out_dtype=torch.float32,
                           backend="triton").out
        assert torch.equal(got.cpu(), want), (k, (got.cpu() - want).abs().max())


def test_operands_are_never_copied_to_transpose():
    """Every layout reads the stored tensors in place (a .t() view, never a transposed copy);
    only an operand with no unit stride at all is made contiguous."""
    a, b = torch.randn(6, 4), torch.randn(5, 4)
    for layout in LAYOUTS:
        a_l = a if layout[0] == "T" else a.t().contiguous()
        b_l = b if layout[1] == "N" else b.t().contiguous()
        x, _, _ = tg.x_operand(b_l, layout)
        y, _, _ = tg.y_operand(a_l, layout)
        assert x.data_ptr() == b_l.data_ptr() and y.data_ptr() == a_l.data_ptr()
    strided = torch.randn(5, 8)[:, ::2]
    x, k_contig, stride = tg.x_operand(strided, "TN")
    assert x.is_contiguous() and k_contig and stride == 4


def test_out_views_are_written_in_place():
    """out with a row stride > N is written in place; out with a non-unit column stride
    (a transposed view) goes through a temporary and is still accumulated into.  Both give
    the bits of a contiguous out (same kernel, same blocks: same summation order)."""
    def prior():
        return torch.arange(M * N, dtype=torch.float32).reshape(M, N).half().to(DEVICE)

    a, b = torch.randn(N, K).half().to(DEVICE), torch.randn(M, K).half().to(DEVICE)
    want = tealite.gemm(a, b, out=prior(), beta=-0.5, backend="triton").out
    padded = torch.zeros(M, N + 3, dtype=torch.float16, device=DEVICE)[:, :N]
    padded.copy_(prior())
    got = tealite.gemm(a, b, out=padded, beta=-0.5, backend="triton").out
    transposed = torch.zeros(N, M, dtype=torch.float16, device=DEVICE).t()
    transposed.copy_(prior())
    got_t = tealite.gemm(a, b, out=transposed, beta=-0.5, backend="triton").out
    assert got.data_ptr() == padded.data_ptr() and got_t.data_ptr() == transposed.data_ptr()
    assert torch.equal(got, want) and torch.equal(got_t, want)


def test_declared_numerics():
    impl = TRITON.impls["gemm"]
    params = dict(m=8, n=8, k=8, layout="TN", dtype=torch.float32, out_dtype=torch.float32,
                  bias=True, gelu=True, alpha=2.0, beta=1.0, device=DEVICE)
    # fp32 uses input_precision="ieee" (no TF32), the accumulator is never rounded before the
    # epilogue: the gemm tier's base model, nothing extra.
    assert impl.numerics(params) == Numerics(compute_dtype=torch.float32)
    assert impl.support.why_not(dict(params, m=2**23)) is not None


# ---- seeded bugs --------------------------------------------------------------------------------

_JIT_FUNCS = ("grouped_pid", "gelu_erf_f32", "epilogue_store", "tile_pointers", "tile_k_loop",
              "_gemm_kernel", "_tma_tile", "_gemm_tma_kernel")
_HEADER = ("import triton\nimport triton.language as tl\n"
           "from tealite.backends.triton._io import load_f32, store_f32\n\n\n")
_counter = itertools.count()


def _mutant_kernel(tmp_path, edits, kernel="_gemm_kernel"):
    """The kernel with ``edits`` [(jit function, old text, new text)] applied, from a file (the
    jit needs real source).  Each old text must occur exactly once, so a refactored kernel
    breaks this test loudly instead of silently testing nothing."""
    srcs = {f: textwrap.dedent(inspect.getsource(getattr(tg, f).fn)) for f in _JIT_FUNCS}
    for func, old, new in edits:
        assert srcs[func].count(old) == 1, f"{old!r} not found once in {func}"
        srcs[func] = srcs[func].replace(old, new)
    name = f"tealite_gemm_mutant_{next(_counter)}"
    path = tmp_path / f"{name}.py"
    path.write_text(_HEADER + "\n\n".join(srcs.values()))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, kernel)


def _seeded_backend(make_backend, monkeypatch, **patches):
    """A backend running tealite's triton gemm with module attributes replaced, always with
    the interpreter's small blocks (also on a GPU)."""
    b = make_backend("triton_gemm_seeded")
    patches.setdefault("pick_config", lambda *args: tg._INTERPRETER)

    def gemm(a, bm, **kw):
        with monkeypatch.context() as m:
            for attr, value in patches.items():
                m.setattr(tg, attr, value)
            return tg.gemm(a, bm, **kw)

    impl = TRITON.impls["gemm"]
    b.implements("gemm", devices=impl.support.devices, numerics=impl.numerics)(gemm)
    return b.name


_BIAS_LINE = "        pre += load_f32(bias_ptr, rn, mask_n, BIAS_BF16)[None, :]\n"
_GELU_STORE = "store_f32(d_ptr, offs, gelu_erf_f32(pre), mask, OUT_BF16)"
_WIDEN = ("            x = (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)\n"
          "            y = (y.to(tl.int32) << 16).to(tl.float32, bitcast=True)\n")
SEEDED = {
    # GELU applied to alpha*acc + beta*C, the bias added afterwards.
    "bias-after-gelu": ([
        ("epilogue_store", _BIAS_LINE,
         "        if not GELU:\n    " + _BIAS_LINE),
        ("epilogue_store", _GELU_STORE,
         "store_f32(d_ptr, offs, gelu_erf_f32(pre) + load_f32(bias_ptr, rn, mask_n, "
         "BIAS_BF16)[None, :], mask, OUT_BF16)")],
        make_case("NN", "bfloat16", M, N, K, bias=True, gelu=True, out_dtype="float32")),
    # The accumulator kept in fp16 (rounded after every K block).
    "fp16-accumulator": ([
        ("tile_k_loop", "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
         "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)"),
        ("tile_k_loop", "out_dtype=tl.float32)", "out_dtype=tl.float16)")],
        make_case("TN", "float16", M, N, 256, out_dtype="float32")),
    # The last, partial K block is never loaded.
    "k-tail-dropped": ([
        ("tile_k_loop", "range(0, tl.cdiv(K, BLOCK_K))", "range(0, K // BLOCK_K)")],
        make_case("TT", "float32", M, N, K)),
    # beta * D_prior never added.
    "beta-ignored": ([
        ("epilogue_store", "pre += beta * load_f32(d_ptr, offs, mask, OUT_BF16)", "pass")],
        make_case("NT", "float16", M, N, K, beta=1.0)),
    # The last GROUP_M group assumed full: its programs map to rows past M and leave one
    # output tile unwritten.  beta != 0 makes that tile hold the prior out (deterministic: an
    # empty output could happen to hold a previous run's right answer).
    "partial-group": ([
        ("grouped_pid", "% group_size_m)", "% GROUP_M)"),
        ("grouped_pid", "// group_size_m", "// GROUP_M")],
        make_case("TN", "bfloat16", M, N, K, beta=1.0)),
    # The interpreter workaround removed: bf16 bits reinterpreted as bf16 and fed to tl.dot,
    # which the triton 3.9 interpreter multiplies as raw integers.
    "interpreter-bf16-dot": ([
        ("tile_k_loop", _WIDEN,
         "            x = x.to(tl.bfloat16, bitcast=True)\n"
         "            y = y.to(tl.bfloat16, bitcast=True)\n")],
        make_case("TN", "bfloat16", M, N, K)),
}


@pytest.mark.parametrize("bug", sorted(SEEDED))
def test_seeded_kernel_bug_is_caught(bug, tmp_path, make_backend, monkeypatch):
    if bug == "interpreter-bf16-dot" and not INTERPRET:
        pytest.skip("the bf16 widening runs only under the interpreter")
    edits, case = SEEDED[bug]
    _check(case)  # the unchanged kernel passes this very case: no false alarm
    name = _seeded_backend(make_backend, monkeypatch,
                           _gemm_kernel=_mutant_kernel(tmp_path, edits))
    _assert_caught(case, name)


def test_seeded_mutation_that_changes_nothing_passes(tmp_path, make_backend, monkeypatch):
    """Control for the mutation machinery: a kernel recompiled from its own source with a
    no-op edit is not flagged."""
    name = _seeded_backend(make_backend, monkeypatch, _gemm_kernel=_mutant_kernel(
        tmp_path, [("tile_k_loop", "acc = tl.zeros(", "acc = 0.0 + tl.zeros(")]))
    _check(make_case("NT", "bfloat16", M, N, K, bias=True, gelu=True, beta=1.0),
           backends=("torch", name))


def test_k_tail_bug_hides_when_k_is_a_block_multiple(tmp_path, make_backend, monkeypatch):
    """Why the strategies draw K off block multiples: with K % BLOCK_K == 0 the dropped tail
    is empty and the same wrong kernel is right."""
    edits, _ = SEEDED["k-tail-dropped"]
    name = _seeded_backend(make_backend, monkeypatch,
                           _gemm_kernel=_mutant_kernel(tmp_path, edits))
    _check(make_case("TT", "float32", M, N, 64), backends=("torch", name))


def _stride_bug(good):
    def x_operand(b, layout):
        view, k_contig, stride = good(b, layout)
        if layout == "NT":  # B stored (K, M): uses K (as if stored (M, K)) for the step over M
            stride = view.shape[1]
        return view, k_contig, stride
    return x_operand


def test_wrong_stride_for_one_layout_is_caught_on_non_square_shapes(make_backend,
                                                                   monkeypatch):
    name = _seeded_backend(make_backend, monkeypatch, x_operand=_stride_bug(tg.x_operand))
    # K < M keeps the wrong addresses inside B (the interpreter reads host memory unchecked).
    _assert_caught(make_case("NT", "bfloat16", 47, N, 37), name)
    # The same bug is invisible when M == K, and in the other layouts.
    _check(make_case("NT", "bfloat16", 40, N, 40), backends=("torch", name))
    for layout in ("TN", "NN", "TT"):
        _check(make_case(layout, "bfloat16", M, N, K), backends=("torch", name))


# ---- the TMA variant (opt-in per config; the interpreter emulates TMA descriptors) --------------

# Interpreter-sized TMA configs: one program per tile, and a persistent grid (4 programs in the
# interpreter) with the skewed K walk.  16-byte aligned strides need M, N, K multiples of 8.
_TMA_CONFIGS = {"tma": tg.GemmConfig(16, 32, 32, 2, 4, 1, tma=True),
                "persistent-skew": tg.GemmConfig(16, 32, 32, 2, 4, 1, tma=True, persistent=True,
                                                 skew_k=True)} if TRITON.unavailable_reason() \
    is None else {}
TMA_M, TMA_N, TMA_K = 40, 48, 72  # 3 x 2 tiles with M and N tails, 3 K blocks with a K tail


def _tma_backend(make_backend, monkeypatch, cfg, launches, **patches):
    real = patches.pop("_launch_tma", tg._launch_tma)

    def counted(*args):
        launches.append(args[0].name())
        return real(*args)
    return _seeded_backend(make_backend, monkeypatch, pick_config=lambda *args: cfg,
                           _launch_tma=counted, **patches)


@pytest.mark.parametrize("variant", sorted(_TMA_CONFIGS))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_tma_variant_every_layout(variant, layout, make_backend, monkeypatch):
    if not INTERPRET and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90+")
    launches = []
    name = _tma_backend(make_backend, monkeypatch, _TMA_CONFIGS[variant], launches)
    _check(make_case(layout, "bfloat16", TMA_M, TMA_N, TMA_K, bias=True, gelu=True, beta=-0.5,
                     out_dtype="float32"), backends=("torch", name))
    _check(make_case(layout, "float16", TMA_M, TMA_N, TMA_K), backends=("torch", name))
    assert len(launches) == 2, launches  # both ran the TMA kernel, not the fallback


def test_tma_falls_back_for_unaligned_strides(make_backend, monkeypatch):
    """K = 71 gives 142-byte rows, which TMA cannot describe: the pointer kernel runs."""
    launches = []
    name = _tma_backend(make_backend, monkeypatch, _TMA_CONFIGS["tma"], launches)
    _check(make_case("TN", "bfloat16", M, N, K), backends=("torch", name))
    assert launches == []


SEEDED_TMA = {
    # The skewed K walk without the wrap: tiles with a nonzero rotation read zeros past K and
    # never visit their first K blocks.
    "skew-without-wrap": ("persistent-skew",
                          [("_tma_tile", "((kb + rot) % k_blocks if", "((kb + rot) if")],
                          make_case("TN", "bfloat16", TMA_M, TMA_N, TMA_K)),
    # The M-contiguous X tile addressed (M, K) instead of (K, M).
    "x-coordinates-swapped": ("tma",
                              [("_tma_tile", "x_desc.load([off_k, off_m])",
                                "x_desc.load([off_m, off_k])")],
                              make_case("TT", "float16", TMA_M, TMA_N, TMA_K)),
}


@pytest.mark.parametrize("bug", sorted(SEEDED_TMA))
def test_seeded_tma_bug_is_caught(bug, tmp_path, make_backend, monkeypatch):
    if not INTERPRET and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90+")
    variant, edits, case = SEEDED_TMA[bug]
    launches = []
    good = _tma_backend(make_backend, monkeypatch, _TMA_CONFIGS[variant], launches)
    _check(case, backends=("torch", good))  # the unchanged TMA kernel passes this very case
    bad = _tma_backend(make_backend, monkeypatch, _TMA_CONFIGS[variant], launches,
                       _gemm_tma_kernel=_mutant_kernel(tmp_path, edits, "_gemm_tma_kernel"))
    _assert_caught(case, bad)
    assert len(launches) == 2, launches
