"""``rmsnorm_fwd`` / ``layernorm_fwd`` on AITER's CK norms: registered so that every case is
rejected with the reason (never run on AMD hardware; see the package docstring).

AITER 0.1.7's CK norm entry points (``rmsnorm2d_fwd``, ``layernorm2d_fwd``) return y only:
their C++ (csrc/py_itfs_ck/rmsnorm_ck_kernels.cu, norm_kernels.cu) hard-codes ``SaveRms`` /
``SaveMeanVar = false`` and passes null ``p_invRms`` / ``p_mean`` / ``p_invStd``.  tealite's
norm forwards must also return the statistics (rsigma; mean and rsigma), and a backend may not
compute an output AITER does not produce.  So no case can run; the check says why, and the
contract records what the kernels do (the bf16 y conversion is ck_tile's default, truncation).
"""
from __future__ import annotations

import torch

from tealite.backends.aiter import BACKEND, rejecting
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.errors import UnsupportedCase
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
NO_STATS = {
    "rmsnorm2d_fwd": ("rmsnorm2d_fwd returns y only (SaveRms=false, p_invRms=nullptr in "
                      "csrc/py_itfs_ck/rmsnorm_ck_kernels.cu); tealite.rmsnorm_fwd must also "
                      "return rsigma"),
    "layernorm2d_fwd": ("layernorm2d_fwd returns y only (SaveMeanVar=false, p_mean/p_invStd="
                        "nullptr in csrc/py_itfs_ck/norm_kernels.cu); tealite.layernorm_fwd "
                        "must also return mean and rsigma"),
}


_rms_check, _rms_numerics = rejecting("rmsnorm2d_fwd", NO_STATS["rmsnorm2d_fwd"])
_ln_check, _ln_numerics = rejecting("layernorm2d_fwd", NO_STATS["layernorm2d_fwd"])


@BACKEND.implements(Op.RMSNORM_FWD, dtypes=_FLOATS, check=_rms_check, numerics=_rms_numerics)
def rmsnorm_fwd(x, gamma, *, eps, zero_centered_gamma):
    raise UnsupportedCase(NO_STATS["rmsnorm2d_fwd"])


@BACKEND.implements(Op.LAYERNORM_FWD, dtypes=_FLOATS, check=_ln_check, numerics=_ln_numerics)
def layernorm_fwd(x, gamma, beta, *, eps, zero_centered_gamma):
    raise UnsupportedCase(NO_STATS["layernorm2d_fwd"])


_NORM_NOTES = ("fp16/bf16 only; fp32 statistics; y converted by ck_tile type_convert (bf16: "
               "CK_TILE_FLOAT_TO_BFLOAT16_DEFAULT=truncate, module_rmsnorm/module_norm set no "
               "override); no statistics output, so every tealite case is rejected")
declare(Contract(backend="aiter", entry_point="rmsnorm2d_fwd", op=Op.RMSNORM_FWD,
                 element_rounding="bf16:rtz, fp16:rne",
                 layouts=("x:(M,N)", "weight:(N,)", "out:(M,N) x dtype"), notes=_NORM_NOTES))
declare(Contract(backend="aiter", entry_point="layernorm2d_fwd", op=Op.LAYERNORM_FWD,
                 element_rounding="bf16:rtz, fp16:rne",
                 layouts=("x:(M,N)", "weight:(N,)", "bias:(N,)", "out:(M,N) x dtype"),
                 notes=_NORM_NOTES))
