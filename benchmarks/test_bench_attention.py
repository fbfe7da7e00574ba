"""Flash attention forward and backward, bf16: tealite's Triton kernels against every torch
SDPA backend that runs here (flash, memory-efficient, cuDNN, each forced through
``torch.nn.attention.sdpa_kernel``) and AITER's Triton ``mha`` where a backend registers it
(``tealite.attention_fwd(..., backend="aiter_triton")``), in TFLOP/s.

Issue-15 targets: forward >= 100 % and backward >= 80 % of the fastest SDPA backend of the
same run, at (b, s, h, d) = (8, 4096, 32, 128) and a GQA shape (8 query heads per K/V head),
causal and not.  FLOPs follow FlashAttention's convention: forward 4 b h s_q s_kv d (the
two products), halved for causal masks; backward 2.5x the forward (five products).

Each row checks its output against the torch SDPA math backend in fp32 on the same inputs,
batch 0 only (the math backend materializes the fp32 scores: 2 GiB per batch row at the large
size) (relative Frobenius error in extra_info; a tealite row above :data:`REL_ERR_MAX` fails on a
GPU: a fast wrong kernel must not look like a result).  The backward of an SDPA backend is
timed as ``torch.autograd.grad`` of its forward's output (its own backward kernels only).
"""
from __future__ import annotations

import pytest
import torch

import tealite

BF16 = torch.bfloat16
FWD_TARGET, BWD_TARGET = 100.0, 80.0
REL_ERR_MAX = 2e-2
# (batch, seq, query heads, K/V heads, head dim) per size; tiny is the CPU smoke run.
SHAPES = {
    "large": {"mha": (8, 4096, 32, 32, 128), "gqa": (8, 4096, 32, 4, 128)},
    "tiny": {"mha": (1, 32, 2, 2, 16), "gqa": (1, 32, 4, 1, 16)},
}
SDPA = ("flash", "efficient", "cudnn")


def _flops(shape, causal: bool, backward: bool) -> int:
    b, s, h, _, d = shape
    f = 4 * b * h * s * s * d // (2 if causal else 1)
    return f * 5 // 2 if backward else f


class Inputs:
    """q, k, v, dout (bshd, bf16) of one shape, the fp32 math reference, SDPA views."""

    def __init__(self, shape, device):
        b, s, h, hk, d = shape
        g = torch.Generator(device=device).manual_seed(7)
        self.shape = shape
        self.q, self.k, self.v, self.dout = (
            torch.randn(sz, generator=g, device=device).to(BF16)
            for sz in ((b, s, h, d), (b, s, hk, d), (b, s, hk, d), (b, s, h, d)))
        self._ref = {}

    def ref(self, causal: bool):
        """(out, dq, dk, dv) of fp32 math SDPA (bshd) for batch 0, computed once per mask."""
        if causal not in self._ref:
            q, k, v = (t[:1].float().transpose(1, 2).requires_grad_()
                       for t in (self.q, self.k, self.v))
            with _sdpa_kernel("math"):
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
            grads = torch.autograd.grad(out, (q, k, v), self.dout[:1].float().transpose(1, 2))
            self._ref[causal] = tuple(t.detach().transpose(1, 2) for t in (out, *grads))
        return self._ref[causal]


def _sdpa_kernel(name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION}[name])


def _sdpa_fwd(inp: Inputs, name: str, causal: bool):
    q, k, v = (t.transpose(1, 2) for t in (inp.q, inp.k, inp.v))
    gqa = k.shape[1] != q.shape[1]

    def fn():
        with _sdpa_kernel(name):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, enable_gqa=gqa).transpose(1, 2)
    return fn


def _sdpa_bwd(inp: Inputs, name: str, causal: bool):
    q, k, v = (t.detach().transpose(1, 2).requires_grad_() for t in (inp.q, inp.k, inp.v))
    with _sdpa_kernel(name):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    dout = inp.dout.transpose(1, 2)

    def fn():
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return fn


def _tealite_fwd(inp: Inputs, backend: str, causal: bool):
    mask = "causal" if causal else "none"
    return lambda: tealite.attention_fwd(inp.q, inp.k, inp.v, mask=mask, backend=backend).out


def _tealite_bwd(inp: Inputs, backend: str, causal: bool):
    mask = "causal" if causal else "none"
    out, lse = tealite.attention_fwd(inp.q, inp.k, inp.v, mask=mask, backend=backend)
    return lambda: tealite.attention_bwd(inp.dout, inp.q, inp.k, inp.v, out, lse, mask=mask,
                                         backend=backend)


def _rel_err(got, want) -> float:
    """Relative error of ``got``'s batch 0 (``want`` holds batch 0 only)."""
    got = got[:1].float()
    return ((got - want).norm() / want.norm()).item()


def _check(inp: Inputs, causal: bool, backward: bool, strict: bool, gpu: bool):
    def check(result):
        ref = inp.ref(causal)
        if backward:
            errs = [_rel_err(g if g.shape[1:] == r.shape[1:] else g.transpose(1, 2), r)
                    for g, r in zip(result, ref[1:])]
            err = max(errs)
        else:
            err = _rel_err(result, ref[0])
        if strict and gpu:
            assert err <= REL_ERR_MAX, f"relative error {err:.3g} > {REL_ERR_MAX}"
        return {"rel_err": err}
    return check


@pytest.fixture(scope="module")
def inputs(bench_config):
    return {name: Inputs(shape, bench_config.device)
            for name, shape in SHAPES[bench_config.size].items()}


def _fastest_sdpa(baselines, inp: Inputs, causal: bool, backward: bool, gpu: bool) -> dict:
    """The fastest SDPA backend of this run for the case (each measured once)."""
    flops = _flops(inp.shape, causal, backward)
    found = []
    for name in SDPA if gpu else ():
        make = _sdpa_bwd if backward else _sdpa_fwd
        try:
            fn = make(inp, name, causal)
        except RuntimeError as exc:  # e.g. no kernel for this case
            found.append({"name": f"sdpa {name}", "error": str(exc)[:200]})
            continue
        found.append(baselines.get(f"sdpa {name} {'bwd' if backward else 'fwd'} "
                                   f"{inp.shape} causal={causal}", fn, flops))
    ran = [r for r in found if "tflops" in r]
    if not ran:
        return {"name": "fastest torch SDPA", "error": "no SDPA backend ran here"}
    best = max(ran, key=lambda r: r["tflops"])
    return dict(best, name=f"fastest torch SDPA ({best['name'].split(' ')[1]})")


CASES = [pytest.param(shape, causal, id=f"{shape}-{'causal' if causal else 'nomask'}")
         for shape in ("mha", "gqa") for causal in (False, True)]


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("shape,causal", CASES)
@pytest.mark.parametrize("backend", ["triton", "aiter_triton"])
def test_attention_tealite(bench, bench_config, baselines, inputs, backend, shape, causal,
                           backward):
    inp = inputs[shape]
    make = _tealite_bwd if backward else _tealite_fwd
    try:
        fn = make(inp, backend, causal)
    except (tealite.UnsupportedCase, tealite.BackendUnavailable) as exc:
        pytest.skip(f"{type(exc).__name__}: {exc}")
    ours = backend == "triton"
    bench.run(fn, group="attention_bwd" if backward else "attention_fwd",
              kernel=f"attention {'bwd' if backward else 'fwd'} {shape}"
                     f"{' causal' if causal else ''}",
              backend=backend, shape=inp.shape, dtype=BF16,
              flops=_flops(inp.shape, causal, backward),
              reference=_fastest_sdpa(baselines, inp, causal, backward, bench_config.gpu),
              target_pct=(BWD_TARGET if backward else FWD_TARGET) if ours else None,
              check=_check(inp, causal, backward, ours, bench_config.gpu), foreign=not ours)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("shape,causal", CASES)
@pytest.mark.parametrize("name", SDPA)
def test_attention_sdpa(bench, bench_config, baselines, inputs, name, shape, causal, backward):
    if not bench_config.gpu:
        pytest.skip("torch SDPA's flash / efficient / cuDNN kernels need a GPU")
    inp = inputs[shape]
    try:
        fn = (_sdpa_bwd if backward else _sdpa_fwd)(inp, name, causal)
        fn()
    except RuntimeError as exc:
        pytest.skip(f"sdpa {name} does not run this case: {str(exc)[:200]}")
    bench.run(fn, group="attention_bwd" if backward else "attention_fwd",
              kernel=f"attention {'bwd' if backward else 'fwd'} {shape}"
                     f"{' causal' if causal else ''}",
              backend=f"torch sdpa {name}", shape=inp.shape, dtype=BF16,
              flops=_flops(inp.shape, causal, backward),
              reference=_fastest_sdpa(baselines, inp, causal, backward, True),
              check=_check(inp, causal, backward, False, True))
