"""AITER's fused attention backward (``flash_attn_fused_backward``, the ``aiter_triton``
backward selected by ``attention_fused_bwd.BWD_KERNEL``) on test_bench_attention.py's shapes,
bf16, beside that file's rows (the one-kernel backward is its ``aiter_triton`` bwd row):
TFLOP/s against the fastest torch SDPA backward of the run, no target (AITER's kernel, not
ours).  On the CPU it skips (bf16 is refused in the interpreter)."""
from __future__ import annotations

import pytest

import tealite
from benchmarks.test_bench_attention import (BF16, CASES, _check, _fastest_sdpa, _flops,
                                             inputs)  # noqa: F401  (inputs: a fixture)


def _fused_bwd(inp, causal: bool):
    from tealite.backends.aiter_triton import attention_fused_bwd as fb
    mask = "causal" if causal else "none"
    out, lse = tealite.attention_fwd(inp.q, inp.k, inp.v, mask=mask, backend="aiter_triton")

    def fn():
        with fb.BWD_KERNEL.override(kernel=fb.BwdKernel.FUSED):
            return tealite.attention_bwd(inp.dout, inp.q, inp.k, inp.v, out, lse, mask=mask,
                                         backend="aiter_triton")
    fn()  # a refusal surfaces here, before timing
    return fn


@pytest.mark.parametrize("shape,causal", CASES)
def test_attention_aiter_fused_bwd(bench, bench_config, baselines, inputs, shape, causal):
    inp = inputs[shape]
    try:
        fn = _fused_bwd(inp, causal)
    except (tealite.UnsupportedCase, tealite.BackendUnavailable) as exc:
        pytest.skip(f"{type(exc).__name__}: {exc}")
    bench.run(fn, group="attention_bwd",
              kernel=f"attention bwd {shape}{' causal' if causal else ''}",
              backend="aiter_triton fused bwd", shape=inp.shape, dtype=BF16,
              flops=_flops(inp.shape, causal, True),
              reference=_fastest_sdpa(baselines, inp, causal, True, bench_config.gpu),
              check=_check(inp, causal, True, False, bench_config.gpu), foreign=True)
