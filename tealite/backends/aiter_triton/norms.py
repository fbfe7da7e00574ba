"""AITER's Triton RMSNorm / LayerNorm (``aiter/ops/triton/rmsnorm.py``, ``norm.py``) as
tealite's ``rmsnorm_fwd`` / ``rmsnorm_bwd`` / ``layernorm_fwd`` / ``layernorm_bwd``.

Entry points: the helpers behind AITER's autograd Functions, ``_rmsnorm_forward``,
``_rmsnorm_backward``, ``_layernorm_forward``, ``_layernorm_backward``.  The public
``rms_norm`` / ``layer_norm`` return y only (the statistics stay in the autograd context), and
the backward kernels are reachable only through these helpers.  Their semantics are tealite's:
rsigma = rsqrt(mean(x^2) + eps) (RMSNorm), mean and rstd = rsqrt(biased var + eps)
(LayerNorm), all float32 of shape (rows,); dx = rsigma (g dy - xhat mean(g dy xhat) [-
mean(g dy)]) with dgamma = sum(dy xhat) (and dbeta = sum(dy)) over rows.

Adapter steps (nothing of the result is computed here):

* x, dy (..., H) are passed as contiguous 2-D (rows, H) views (AITER's kernels take (M, N));
  the statistics are reshaped from (rows,) to x.shape[:-1] and back;
* outputs are allocated as AITER's own autograd Functions allocate them: LayerNorm y like x,
  mean / rstd float32 (rows,); backward dx like dy, dgamma / dbeta in gamma's dtype.

Rejected with the reason (``check``):

* ``zero_centered_gamma``: AITER's kernels have no such option (they use gamma as given);
  passing 1 + gamma would compute part of the op here, with its own rounding;
* the entry point missing from the installed AITER (:func:`why_missing`);
* bfloat16 under Triton's interpreter: AITER converts fp32 -> bf16 with ``.to()`` / an
  implicit store cast, which the interpreter truncates instead of rounding to nearest even
  (and its bf16 loads of subnormals are wrong); tests/test_aiter_norms.py proves the cause
  and keeps the mismatch as a strict expected failure;
* RMSNorm backward with H == 1 and other than one row: AITER 0.1.7's ``_rmsnorm_backward``
  skips its dgamma reduction when N == 1 and every program writes its partial sum at
  dgamma[program] (past the end of a 1-element dgamma; with no rows dgamma is never
  written): the result is wrong (a finding, pinned by a strict expected failure in
  tests/test_aiter_norms.py);
* LayerNorm backward with no rows: ``_layernorm_backward`` sizes a reduction tile as
  next_power_of_2(M) = 0, which Triton rejects.

``add_rmsnorm_pad`` runs AITER's public ``fused_add_rmsnorm_pad(x, weight, epsilon, res,
x_pad_to_multiple)`` (fp32 r = x + res, y = r * rsqrt(sum(r^2)/N + eps) * w in x's dtype over
(M, N_out), res_out = r in res's dtype; the same semantics as tealite's).  Its padded columns
are computed, not written as 0: 0 (x's masked load) * rsigma * 0 (w's masked load), so a row
holding a NaN gets NaN there (declared: ``pad_nan_rows``).  Without a residual AITER passes
res strides 0 and its kernel hints ``tl.assume(res_stride_m > 0)``: false, but the residual
pointer is then never read (HAS_RES is a constexpr), so compiled code is unaffected and under
the interpreter the loader leaves AITER's assumes unchecked (aiter_common/_loader_launch.py);
the no-residual case runs.  Rejected like RMSNorm forward: bf16 under the interpreter (x's
dtype, which a bf16 residual implies).

Numerics: fp32 compute (the plain norm spec's bound).  AITER computes rsigma with
``tl.rsqrt`` and divides with ``/``: exact in the interpreter, approximate on CUDA
(``rsqrt.approx``: ~2 ulp, ``div.full``: <= 2 ulp); on AMD ``v_rsq_f32`` (1 ulp).  The norm
spec's bounds (rsigma at least 4 fp32 ulp plus the reduction's gamma_H term; LayerNorm's mean
2 (gamma_H + u)) have the room for them except at the smallest H, where a GPU run may need the
spec to read the declared ``fp32_div_ulps`` / ``rsqrt`` (it reads only ``compute_dtype``).
"""
from __future__ import annotations

import torch

from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends import aiter_triton
from tealite.backends.aiter_triton import (BACKEND, DEVICES, INTERPRET, NAME, REJECTIONS,
                                           why_missing)
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NOTES = ("fp32 math; rsigma = tl.rsqrt(sum/N + eps) (approximate rsqrt and division on "
          "CUDA); no zero-centered gamma")

ENTRY_POINTS = {
    Op.RMSNORM_FWD: "_rmsnorm_forward",
    Op.RMSNORM_BWD: "_rmsnorm_backward",
    Op.LAYERNORM_FWD: "_layernorm_forward",
    Op.LAYERNORM_BWD: "_layernorm_backward",
}

for _op, _entry in ENTRY_POINTS.items():
    declare(Contract(backend=NAME, entry_point=_entry, op=_op, layouts=("x:(M,N) contiguous",),
                     notes=_NOTES, extra={"zero_centered_gamma": "unsupported",
                                          "stats": "float32 (M,)"}))


def interpreter_bf16_reason(dtype) -> str | None:
    """Why an AITER kernel with bf16 outputs cannot be judged under the interpreter (None
    also where the rejection is lifted: ``lift_platform_rejections(bf16_in_interpreter=True)``)."""
    if INTERPRET and dtype == torch.bfloat16 and REJECTIONS.get().bf16_in_interpreter:
        return ("bfloat16 under Triton's interpreter: its fp32 -> bf16 conversion (AITER's "
                "`.to()` and store casts) truncates instead of rounding to nearest even, and its "
                "bf16 loads of subnormals are wrong (tests/test_aiter_norms.py proves it)")
    return None


def _check_for(op: str):
    entry = ENTRY_POINTS[op]

    def check(params) -> str | None:
        if params.get("zero_centered_gamma"):
            return f"AITER's {entry} has no zero-centered gamma (it uses gamma as given)"
        why = interpreter_bf16_reason(params["dtype"])
        if why is not None:
            return why
        if op == Op.LAYERNORM_BWD and params["rows"] == 0:
            return ("AITER's _layernorm_backward cannot run with no rows (its dgamma/dbeta "
                    "reduction tile is next_power_of_2(0) = 0 rows: Triton rejects the shape)")
        if op == Op.RMSNORM_BWD and params["hidden"] == 1 and params["rows"] != 1:
            return ("AITER 0.1.7 bug: _rmsnorm_backward with N == 1 skips its dgamma reduction "
                    "(each program writes its partial at dgamma[program], past the 1-element "
                    "dgamma; with no rows dgamma is never written)")
        return why_missing(entry)

    return check




def _numerics(op: str) -> dict:
    # fp32_div_ulps / rsqrt record AITER's approximate operations for the gate and a spec that
    # models them; specs/norms.py reads only compute_dtype (see the module docstring).
    return {"compute_dtype": torch.float32, "entry_point": ENTRY_POINTS[op],
            "fp32_div_ulps": aiter_triton.fp32_div_ulps(),
            "rsqrt": "exact" if INTERPRET else "tl.rsqrt (approximate)"}


def rows_2d(t: torch.Tensor) -> torch.Tensor:
    """(..., H) as the contiguous (rows, H) matrix AITER's row kernels take."""
    return t.contiguous().reshape(-1, t.shape[-1])


def _kernels():
    from tealite.backends.aiter_triton import kernels
    return kernels()


@BACKEND.implements(Op.RMSNORM_FWD, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(Op.RMSNORM_FWD), numerics=_numerics(Op.RMSNORM_FWD))
def rmsnorm_fwd(x, gamma, *, eps, zero_centered_gamma):
    y, rsigma = _kernels()._rmsnorm_forward(rows_2d(x), gamma.contiguous(), eps)
    return y.reshape(x.shape), rsigma.reshape(x.shape[:-1])


@BACKEND.implements(Op.RMSNORM_BWD, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(Op.RMSNORM_BWD), numerics=_numerics(Op.RMSNORM_BWD))
def rmsnorm_bwd(dy, x, rsigma, gamma, *, zero_centered_gamma):
    dx, dgamma = _kernels()._rmsnorm_backward(rows_2d(dy), rows_2d(x), gamma.contiguous(),
                                             rsigma.contiguous().reshape(-1))
    return dx.reshape(x.shape), dgamma


@BACKEND.implements(Op.LAYERNORM_FWD, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(Op.LAYERNORM_FWD), numerics=_numerics(Op.LAYERNORM_FWD))
def layernorm_fwd(x, gamma, beta, *, eps, zero_centered_gamma):
    x2 = rows_2d(x)
    y = torch.empty_like(x2)
    mean = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    _kernels()._layernorm_forward(y, x2, gamma.contiguous(), beta.contiguous(), mean, rstd, eps)
    stats = x.shape[:-1]
    return y.reshape(x.shape), mean.reshape(stats), rstd.reshape(stats)


@BACKEND.implements(Op.LAYERNORM_BWD, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(Op.LAYERNORM_BWD), numerics=_numerics(Op.LAYERNORM_BWD))
def layernorm_bwd(dy, x, mean, rsigma, gamma, *, zero_centered_gamma):
    dy2 = rows_2d(dy)
    dx = torch.empty_like(dy2)
    n = gamma.shape[0]
    dgamma = torch.empty(n, dtype=gamma.dtype, device=gamma.device)
    dbeta = torch.empty(n, dtype=gamma.dtype, device=gamma.device)
    _kernels()._layernorm_backward(dy2, dx, dgamma, dbeta, rows_2d(x), gamma.contiguous(),
                                   mean.contiguous().reshape(-1),
                                   rsigma.contiguous().reshape(-1))
    return dx.reshape(x.shape), dgamma, dbeta


# ---- fused add + RMSNorm + pad ---------------------------------------------------------------

ADD_RMS_PAD_ENTRY = "fused_add_rmsnorm_pad"
declare(Contract(backend=NAME, entry_point=ADD_RMS_PAD_ENTRY, op=Op.ADD_RMSNORM_PAD,
                 layouts=("x:(M,N) contiguous", "res:(M,N) contiguous", "out:(M,N_out)"),
                 notes="fp32 r = x + res; y = r * tl.rsqrt(sum(r^2)/N + eps) * w (approximate "
                       "rsqrt and division on CUDA); padded columns 0 * rsigma * 0",
                 extra={"padding": "NaN in a row holding a NaN", "res_out": "r in res's dtype",
                        "no_residual": "res strides 0 against tl.assume(res_stride_m > 0)"}))


def _add_rms_pad_check(params) -> str | None:
    return interpreter_bf16_reason(params["dtype"]) or why_missing(ADD_RMS_PAD_ENTRY)


def _add_rms_pad_numerics(params) -> dict:
    return {"compute_dtype": torch.float32, "entry_point": ADD_RMS_PAD_ENTRY,
            "fp32_div_ulps": aiter_triton.fp32_div_ulps(),
            "rsqrt": "exact" if INTERPRET else "tl.rsqrt (approximate)", "pad_nan_rows": True}


@BACKEND.implements(Op.ADD_RMSNORM_PAD, dtypes=_FLOATS, devices=DEVICES,
                    check=_add_rms_pad_check, numerics=_add_rms_pad_numerics)
def add_rmsnorm_pad(x, weight, *, eps, residual, pad_to_multiple, hidden_out):
    res = None if residual is None else rows_2d(residual)
    got = _kernels().fused_add_rmsnorm_pad(rows_2d(x), weight.contiguous(), eps, res,
                                           pad_to_multiple)
    y, res_out = got if res is not None else (got, None)
    y = y.reshape(*x.shape[:-1], hidden_out)
    return y, None if res_out is None else res_out.reshape(x.shape)
