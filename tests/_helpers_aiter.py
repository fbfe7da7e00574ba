"""Shared by the aiter_triton test modules."""
from __future__ import annotations

import pytest

B = "aiter_triton"


def ran(report):
    """The backend's outcome; a skip (with AITER's reason) when its tuned config does not fit
    this GPU (AITER's MI350X configs can need more shared memory than an NVIDIA GPU has) or
    the kernel does not compile for NVIDIA (refused with the reason: aiter_triton/attention)."""
    outcome = report.outcomes[B]
    reason = outcome.reason or ""
    if outcome.status == "unsupported" and ("does not fit this device" in reason
                                            or "does not compile on NVIDIA" in reason):
        pytest.skip(reason)
    assert outcome.status == "ok", report.describe()
    return outcome


def seeded_variant_is_caught(run, functions: dict, entry: str, wrap, case, monkeypatch):
    """AITER's ``entry`` passes ``case`` through ``run``; replaced in ``functions`` by
    ``wrap(entry)`` (a seeded bug) it still runs, fails against the reference, and the torch
    peer does not.  Returns the correct run's outcome."""
    good = run(case)
    outcome = ran(good)
    assert good.verdict == "pass", good.describe()
    monkeypatch.setitem(functions, entry, wrap(functions[entry]))
    report = run(case)
    assert report.outcomes[B].status == "ok", report.describe()
    bad = [c for c in report.failures if c.lhs == B and c.rhs == "reference"]
    assert bad, report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]
    return outcome


def mine_failed(report) -> bool:
    return any(B in (c.lhs, c.rhs) for c in report.failures)


def quant_case(recipe: dict, shape, dist, dtype="float32", seed=1) -> dict:
    """A rowwise quantize case of the quantize spec."""
    return {"recipe": recipe, "dtype": dtype, "shape": list(shape), "rowwise": True,
            "columnwise": False, "pad": False, "dist": dist, "seed": seed}


def aiter_fp8_recipe(fmt, gran) -> dict:
    """Float8CurrentScaling with AITER's amax/fmax rule, as a case's recipe JSON."""
    return {"kind": "current", "fmt": fmt, "granularity": gran, "force_pow2_scales": False,
            "amax_epsilon": 0.0, "saturation": "saturate", "scale_rule": "amax/fmax"}


def very_negative_logits(at):
    """fp16 (q, k, v, out, lse) of AITER's forward where every logit is very negative and
    seqlen_k (2) ends inside a key block: the input of AITER 0.1.7's non-causal NaN-dq bug
    (its dq loop masks K past seqlen_k but not p = exp(0 - lse), which overflows)."""
    import torch
    g = torch.Generator().manual_seed(2)
    k0 = torch.randn(1, 1, 1, 16, generator=g)
    k = torch.cat([k0, 0.5 * k0], dim=1)                 # seqlen_k = 2, below the key block
    q = (-8.0 * k0.expand(1, 4, 1, 16)).contiguous()     # every q . k <= -4 |k0|^2 << 0
    q, k, v = q.half(), k.half(), torch.randn(1, 2, 1, 16, generator=g).half()
    out, lse = at.flash_attn_func(q, k, v, return_lse=True)
    assert float(lse.max()) < -11  # the precondition: exp(-lse) overflows fp16
    return q, k, v, out, lse
