"""Multi-tensor ops (issue 17): references against independent expectations, the tiers failing
a wrong implementation and passing a legitimately different one, bad input, and the Triton
kernels' one launch per list."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import tealite
from tealite import registry
from tealite.errors import TealiteArgumentError
from tealite.registry import Backend, register_backend, unregister_backend
from tealite.training_types import MTA_CHUNK_ELEMENTS, AdamOptions, SGDOptions
from tealite_verify.references import multi_tensor as ref
from tealite_verify.references.quantize import te_scale_from_amax
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from _helpers_cross_compile import compiled_json

# Hyper-parameters exact in fp32 (and bias corrections exact at steps 1-2), so the float64
# references and torch.optim in float64 compute the same real numbers.
B1, B2, LR, EPS, WD = 0.875, 1 - 2.0 ** -10, 2.0 ** -10, 2.0 ** -20, 2.0 ** -6


def _state(n=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64),
            torch.randn(n, generator=g, dtype=torch.float64),
            torch.randn(n, generator=g, dtype=torch.float64) * 0.1,
            torch.randn(n, generator=g, dtype=torch.float64).square() * 0.01)


# ---- references against torch.optim / torch.linalg (TE's own tests' expectations) ---------

@pytest.mark.parametrize("adam_w", [True, False])
@pytest.mark.parametrize("step", [1, 2])
def test_adam_reference_matches_torch_optim(adam_w, step):
    grad, p0, m0, v0 = _state()
    p = torch.nn.Parameter(p0.clone())
    p.grad = grad.clone()
    cls = torch.optim.AdamW if adam_w else torch.optim.Adam
    opt = cls([p], lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD, foreach=False)
    opt.state[p] = {"step": torch.tensor(float(step - 1)), "exp_avg": m0.clone(),
                    "exp_avg_sq": v0.clone()}
    opt.step()
    c = ref.AdamConstants.of(LR, B1, B2, EPS, step, WD, adam_w, True)
    want_p, want_m, want_v = ref.adam_update(grad.numpy(), p0.numpy(), m0.numpy(), v0.numpy(), c)
    np.testing.assert_allclose(want_m, opt.state[p]["exp_avg"].numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(want_v, opt.state[p]["exp_avg_sq"].numpy(), rtol=1e-12,
                               atol=1e-15)
    np.testing.assert_allclose(want_p, p.detach().numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("nesterov,dampening", [(False, 0.0), (True, 0.0), (False, 0.25)])
@pytest.mark.parametrize("first_run", [True, False])
def test_sgd_reference_matches_torch_optim(nesterov, dampening, first_run):
    grad, w0, mom0, _ = _state(seed=1)
    w = torch.nn.Parameter(w0.clone())
    w.grad = grad.clone()
    opt = torch.optim.SGD([w], lr=LR, momentum=0.5, dampening=dampening, nesterov=nesterov,
                          weight_decay=WD, foreach=False)
    if not first_run:
        opt.state[w] = {"momentum_buffer": mom0.clone()}
    opt.step()
    c = ref.SGDConstants.of(LR, 0.5, dampening, nesterov, WD, first_run, False, 1.0)
    want_w, want_mom = ref.sgd_update(grad.numpy(), w0.numpy(), mom0.numpy(), c)
    np.testing.assert_allclose(want_w, w.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(want_mom, opt.state[w]["momentum_buffer"].numpy(), rtol=1e-12)


def test_l2norm_and_compute_scale_references():
    xs = [torch.randn(n, dtype=torch.float64) for n in (555, 0, 17)]
    total, per = ref.l2norms([x.numpy() for x in xs])
    np.testing.assert_allclose(per, [torch.linalg.vector_norm(x).item() for x in xs])
    np.testing.assert_allclose(total, torch.linalg.vector_norm(torch.cat(xs)).item())
    amax = np.array([0.0, np.inf, np.nan, 1e-40, 2.0, 300.0], np.float32)
    s, inv = ref.compute_scale(amax, "e4m3", 0, False, 0.0)
    assert s[:4].tolist() == [1.0, 1.0, 1.0, float(np.finfo(np.float32).max)]
    assert s[4] == 224.0 and (inv == np.float32(1) / s).all()
    # margin 0 is the verified per-tensor rule of the quantize references, pow2 included
    for pow2 in (False, True):
        np.testing.assert_array_equal(ref.compute_scale(amax, "e5m2", 0, pow2, 0.0)[0],
                                      te_scale_from_amax(amax, "e5m2", force_pow2=pow2))
    assert ref.compute_scale(np.float32([2.0]), "e4m3", 3, False, 0.0)[0][0] == 28.0


# ---- the tiers catch a wrong implementation and pass a legitimately different one ---------

@contextlib.contextmanager
def _backend(name, op, fn):
    b = Backend(name=name, auto_dispatch=False, description="tests/test_multi_tensor")
    b.implements(op, numerics={"compute_dtype": torch.float32})(fn)
    register_backend(b)
    try:
        yield name
    finally:
        unregister_backend(name)


def _adam_via(direction):
    def impl(grads, params, exp_avgs, exp_avg_sqs, o, *, master_params):
        for i, g in enumerate(grads):
            src = master_params[i] if master_params is not None else params[i]
            p, m, v = direction(g.double(), src.double(), exp_avgs[i].double(),
                                exp_avg_sqs[i].double(), o)
            exp_avgs[i].copy_(m.float())
            exp_avg_sqs[i].copy_(v.float())
            if master_params is not None:
                master_params[i].copy_(p.float())
            params[i].copy_(p.float().to(params[i].dtype))
    return impl


def _fused(g, p, m, v, o, bias_outside_sqrt=False):
    """Adam with every fp32 rounding but the stores' skipped (a fully fused, FMA-everywhere
    kernel: legitimately more accurate); ``bias_outside_sqrt``: sqrt(v) / bc2 (a bug)."""
    c = ref.AdamConstants.of(o.lr, o.beta1, o.beta2, o.eps, o.step, o.weight_decay,
                             o.adam_w_mode, o.bias_correction)
    if not bias_outside_sqrt:
        return ref.adam_update(g, p, m, v, c, sqrt=torch.sqrt)
    m = m * c.beta1 + g * c.one_minus_beta1
    v = v * c.beta2 + g * g * c.one_minus_beta2
    update = (m / c.bc1) / (torch.sqrt(v) / c.bc2 + c.eps) + p * c.weight_decay
    return p - update * c.lr, m, v


ADAM_CASE = {"dtype": "bfloat16", "sizes": [555, 0, 17], "algo": "adamw", "master": True,
             "values": "plain", "dist": {"kind": "normal", "scale": 1.0,
                                         "sample_dtype": "float32"}, "seed": 7,
             "options": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "step": 3,
                         "weight_decay": 0.01, "bias_correction": True}}


def _verdict(name, case):
    report = run_case(get_spec("multi_tensor_adam"), case, backends=[name], pairwise=False)
    assert report.outcomes[name].status == "ok", report.outcomes[name]
    return {c.output: c.metrics.passed for c in report.comparisons}


def test_adam_tier_passes_fused_rounding_and_catches_bias_outside_sqrt():
    with _backend("mta_fused", "multi_tensor_adam", _adam_via(_fused)) as name:
        assert all(_verdict(name, ADAM_CASE).values())
    wrong = _adam_via(lambda *a: _fused(*a, bias_outside_sqrt=True))
    with _backend("mta_wrong", "multi_tensor_adam", wrong) as name:
        verdict = _verdict(name, ADAM_CASE)
    assert not verdict["master_params"] and verdict["exp_avgs"], verdict


def test_adam_tier_catches_bf16_second_moment():
    """v kept in bf16 between steps (a storage bug): off by far more than fp32 roundings."""
    def direction(g, p, m, v, o):
        p, m, v = _fused(g, p, m, v, o)
        return p, m, v.to(torch.bfloat16).double()
    with _backend("mta_bf16_v", "multi_tensor_adam", _adam_via(direction)) as name:
        assert not _verdict(name, dict(ADAM_CASE, dtype="float32", master=False))["exp_avg_sqs"]


# ---- bad input -----------------------------------------------------------------------------

def test_bad_input_names_the_argument():
    g, p, m, v = ([torch.zeros(3)] for _ in range(4))
    with pytest.raises(TealiteArgumentError, match="params must have 1 tensors"):
        tealite.multi_tensor_adam(g, p + p, m, v, AdamOptions(lr=0.1))
    with pytest.raises(TealiteArgumentError, match=r"tensors\[1\] is on meta"):
        tealite.multi_tensor_scale([torch.zeros(2), torch.zeros(2, device="meta")], 2.0)
    with pytest.raises(TealiteArgumentError, match=r"exp_avg_sqs\[0\] dtype"):
        tealite.multi_tensor_adam(g, p, m, [torch.zeros(3, dtype=torch.bfloat16)],
                                  AdamOptions(lr=0.1))
    with pytest.raises(TealiteArgumentError, match="options.beta1"):
        tealite.multi_tensor_adam(g, p, m, v, AdamOptions(lr=0.1, beta1=1.0))
    with pytest.raises(TealiteArgumentError, match=r"momenta\[0\] shape"):
        tealite.multi_tensor_sgd(g, p, [torch.zeros(4)], SGDOptions(lr=0.1))
    with pytest.raises(TealiteArgumentError, match="noop_flag"):
        tealite.multi_tensor_scale(g, 2.0, noop_flag=torch.zeros(1))
    with pytest.raises(TealiteArgumentError, match="fmt"):
        tealite.multi_tensor_compute_scale([torch.ones(1)], "e3m4")


def test_sgd_skips_the_step_when_the_flag_is_set():
    w = [torch.ones(3)]
    tealite.multi_tensor_sgd([torch.ones(3)], w, [torch.zeros(3)], SGDOptions(lr=0.5),
                             noop_flag=torch.ones(1, dtype=torch.int32), backend="torch")
    assert w[0].tolist() == [1.0, 1.0, 1.0]


# ---- Triton: one launch per list, chunked like TE ------------------------------------------

def test_chunk_table_cuts_at_te_chunks():
    from tealite.backends.triton.multi_tensor import chunk_table
    owner, first, numels = chunk_table([torch.empty(MTA_CHUNK_ELEMENTS + 1), torch.empty(0),
                                        torch.empty(3)], "cpu")
    assert owner.tolist() == [0, 0, 2] and first.tolist() == [0, MTA_CHUNK_ELEMENTS, 0]
    assert numels.tolist() == [MTA_CHUNK_ELEMENTS + 1, 0, 3]


class _Counting:
    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def _triton_or_skip():
    reason = registry.get_backend("triton").unavailable_reason()
    if reason:
        pytest.skip(f"triton backend unavailable: {reason}")


def test_triton_one_launch_per_list_across_chunk_edges(monkeypatch):
    _triton_or_skip()
    from tealite.backends.triton import multi_tensor as tmt
    counters = {k: _Counting(getattr(tmt, k)) for k in ("_scale_kernel", "_sumsq_kernel",
                                                        "_adam_kernel", "_sgd_kernel")}
    for k, c in counters.items():
        monkeypatch.setattr(tmt, k, c)
    from tealite.backends.triton import INTERPRET
    with torch.device("cpu" if INTERPRET else "cuda"):  # compiled kernels need GPU tensors
        _one_launch_per_list(counters)


def _one_launch_per_list(counters):
    xs = [torch.randn(MTA_CHUNK_ELEMENTS + 1), torch.randn(0), torch.randn(555)]
    xs[0][MTA_CHUNK_ELEMENTS] = float("inf")  # the first element of the second chunk
    r = tealite.multi_tensor_scale(xs, 0.5, out_dtype=torch.bfloat16, backend="triton")
    assert r.noop_flag.item() == 1
    for x, y in zip(xs, r.outputs):
        assert torch.equal(y, (x * 0.5).to(torch.bfloat16))
    xs[0][MTA_CHUNK_ELEMENTS] = 1.0
    norms = tealite.multi_tensor_l2norm(xs, backend="triton")
    want = torch.stack([torch.linalg.vector_norm(x.double()) for x in xs]).float()
    torch.testing.assert_close(norms.per_tensor, want, rtol=1e-6, atol=0)
    small = [torch.randn(40), torch.randn(7)]
    tealite.multi_tensor_adam(small, [t.clone() for t in small], [torch.zeros(40), torch.zeros(7)],
                              [torch.zeros(40), torch.zeros(7)], AdamOptions(lr=0.1),
                              backend="triton")
    w = [torch.ones(40), torch.ones(7)]
    tealite.multi_tensor_sgd(small, w, [torch.zeros(40), torch.zeros(7)],
                             SGDOptions(lr=0.5), noop_flag=torch.ones(1, dtype=torch.int32),
                             backend="triton")
    assert all(bool((t == 1).all()) for t in w)  # a set flag skips the step
    assert {k: c.launches for k, c in counters.items()} == {
        "_scale_kernel": 1, "_sumsq_kernel": 1, "_adam_kernel": 1, "_sgd_kernel": 1}


# ---- the Adam kernel as compiled for an H100 (CI has none: cross-compiled) -----------------

_ADAM_PTX = """
import json, re, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tealite.backends.triton import multi_tensor as MT
sig = {n: "*i64" for n in ("chunk_first", "numels", "g_addr", "p_addr", "m_addr", "v_addr",
                           "w_addr")}
sig.update(chunk_owner="*i32", hp_ptr="*fp32")
out = {}
for aligned in (True, False):
    const = dict(G_T=tl.int16, G_BF16=True, P_T=tl.int16, P_BF16=True, HAS_MASTER=False,
                 ADAM_W=1, ALIGNED=aligned, CHUNK=65536, BLOCK=1024)
    k = triton.compile(ASTSource(MT._adam_kernel, {**sig, **{c: "constexpr" for c in const}},
                                 const), target=GPUTarget("cuda", 90, 32))
    out[str(aligned)] = len(re.findall(r"(ld|st)\\.global\\.v4\\.", k.asm["ptx"]))
json.dump(out, sys.stdout)
"""


def test_adam_full_blocks_use_16_byte_vectors_on_sm90():
    """The chunk's whole blocks run unmasked at a start the compiler knows is a multiple of
    the chunk, through pointers hinted 16-byte aligned (checked on the host): vector loads and
    stores.  Measured on an H100 before: a mask against a loaded bound kept every access
    scalar, 10 % of copy bandwidth.  An unaligned call must not get the hint."""
    vectors = compiled_json(_ADAM_PTX)
    assert vectors["True"] >= 6 and vectors["False"] == 0, vectors


def test_the_vector_hint_needs_every_address_aligned():
    from tealite.backends.triton.multi_tensor import address_tables
    x = torch.zeros(64)
    assert address_tables(([x], [x[4:]]), "cpu")[1]
    assert not address_tables(([x], [x[1:]]), "cpu")[1]
