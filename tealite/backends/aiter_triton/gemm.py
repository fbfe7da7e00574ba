"""``tealite.gemm`` on AITER's ``gemm_a16w16`` (``Y = X @ W^T``, X (M, K), W (N, K)).

TE's ``D = op_B(B) @ op_A(A)`` (tealite.ops.gemm) is AITER's product with X = op_B(B) and
W = op_A(A)^T seen as (N, K): for every layout these are *views* of the stored operands (B or
B.T, A or A.T).  ``gemm_a16w16`` hands the kernel each operand's two strides (it reads
``w.T``'s strides for its (K, N) walk), so a transposed view is read in place, exactly the
product the layout names; AITER's own tests cover the four layouts the same way.  A view with
a zero stride (an expanded tensor) is copied first: the kernel tells the compiler that every
stride is positive (``tl.assume``).

What AITER computes (amd-aiter 0.1.7, ``_gemm_a16_w16_kernel``): fp32 ``tl.dot`` accumulation
(``input_precision="ieee"``).  Without split-K the bias *seeds* the accumulator (it is loaded
into it before the first product), so every K step's addition may round a partial sum that
includes it (declared as ``epilogue_in_accumulator``); with split-K (``NUM_KSPLIT > 1`` in a
tuned config) fp32 partials are summed by a reduce kernel that adds the bias last.  One
rounding to the output dtype.  Epilogue: an optional activation applied to the sum, with no
pre-activation output, no alpha and no beta.  So this backend accepts ``alpha == 1``,
``beta == 0`` (``out=`` is passed as AITER's ``y``) and ``gelu=False``; tealite's GELU returns
the pre-activation as well, which AITER does not produce.  ``K == 0`` is rejected: the kernel
skips every program whose K range is empty and stores nothing, so the output would be
uninitialized memory rather than zeros.

Configs: AITER's own tuned choice (``_get_config``, MI350X tables under the default gfx950
pin).  Under Triton's interpreter the block sizes are capped (``INTERPRETER_CAPS``) so CI's
small shapes span several programs and K steps (AITER's MI350X configs put any M <= 64 in one
64 x 128 x 256 tile), which exercises AITER's tile-edge code; the kernels are block-size
generic and the numerics do not depend on the tile size.

Interpreter: bf16 ``tl.dot`` operands are multiplied as raw uint16 bits (garbage) and
fp32 -> bf16 stores truncate (NUMERICS.md, tests/test_aiter_gemm.py proves both on this
kernel), so bf16 inputs and bf16 outputs are rejected there; fp16 inputs run.
"""
from __future__ import annotations

import inspect

import torch

from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends.aiter_triton import (BACKEND, DEVICES, INTERPRET, PLATFORM, kernels,
                                           why_missing)
from tealite.errors import UnsupportedCase
from tealite.types import Op

ENTRY = "gemm_a16w16"
_INPUTS = (torch.bfloat16, torch.float16)  # a16w16: 16-bit inputs (fp32 rejected by dtypes=)
_OUTPUTS = (torch.bfloat16, torch.float16, torch.float32)
# NVIDIA tensor cores add aligned products with truncation (u = 2^-23, measured on an H100:
# tealite.backends.triton.gemm._TENSOR_CORE_U); AMD MFMA and the interpreter's numpy dots
# round to nearest in fp32.
TENSOR_CORE_U = 2.0 ** -23
# Interpreter block caps: CI shapes (M, N <= 48, K <= 256) then span several programs and K
# steps.  Keys are AITER's config keys.
INTERPRETER_CAPS = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64}

INTERPRETER_BF16 = ("Triton's interpreter multiplies bf16 tl.dot operands as raw uint16 bits "
                    "(garbage; AITER's kernel dots its bf16 loads directly)")
INTERPRETER_BF16_STORE = ("Triton's interpreter truncates fp32 -> bf16 conversions (AITER's "
                          "kernel rounds its fp32 result with .to(bfloat16))")


# ---- shared with qgemm.py: AITER's modules, configs, targets ---------------------------------

def aiter_module(entry: str):
    """The AITER module the loader found ``entry`` in (``kernels().locations``)."""
    at = kernels()
    try:
        return at.module_of(entry)
    except KeyError:
        raise LookupError(f"adapter: {entry} is not loaded "
                          f"({at.missing.get(entry, 'not in the loader table')})") from None


def accepts(fn, parameter: str) -> bool:
    """``fn`` (an AITER wrapper) takes ``parameter`` (AITER adds and drops keyword options
    between versions: dispatch on the signature, not on the version)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return parameter in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def config_function(module):
    """AITER's private ``_get_config`` as ``module`` binds it.  Found by the function's own
    name, not the module attribute: from v0.1.16 gemm_a16w16 imports it as
    ``_get_triton_config``."""
    fn = getattr(module, "_get_config", None)
    if callable(fn):
        return fn
    found = {id(v): v for v in vars(module).values()
             if callable(v) and getattr(v, "__name__", None) == "_get_config"}
    if len(found) != 1:
        raise LookupError(f"adapter: {module.__name__} binds {len(found)} functions named "
                          "_get_config (expected one)")
    return next(iter(found.values()))


def config_dict(result) -> dict:
    """The config out of ``_get_config``'s result: the dict itself up to v0.1.9, a
    ``(config, is_tuned)`` pair from v0.1.9.post1 on (told apart by the value's type)."""
    if isinstance(result, dict):
        return result
    if isinstance(result, tuple) and result and isinstance(result[0], dict):
        return result[0]
    raise TypeError(f"adapter: _get_config returned {type(result).__name__}, expected a dict "
                    "or (dict, is_tuned)")


def aiter_config(entry: str, *args, caps: dict | None = None) -> dict:
    """A private copy of the config AITER's ``entry`` would pick (its ``_get_config``), with
    the interpreter's block caps applied (``caps``: key -> maximum).

    Always a copy: several AITER wrappers (gemm_a8w8_per_token_scale, gemm_a8w8_blockscale,
    gemm_afp4wfp4*) write their adjustments (BLOCK_SIZE_K, SPLITK_BLOCK_SIZE, NUM_KSPLIT) into
    the dict that ``_get_config``'s lru_cache returns, so a later call would see an earlier
    call's shrunken BLOCK_SIZE_K (e.g. blockscale's GROUP_K == BLOCK_SIZE_K assert then fails
    depending on call history).  Passing each call its own copy keeps AITER's choice per
    shape.
    """
    cfg = dict(config_dict(config_function(aiter_module(entry))(*args)))
    if INTERPRET and caps:
        for key, cap in caps.items():
            if key in cfg and cfg[key] > cap:
                cfg[key] = cap
    return cfg


def config_or_reason(entry: str, *args, caps: dict | None = None):
    """(config, None) or (None, why AITER's config cannot be resolved in this version)."""
    try:
        return aiter_config(entry, *args, caps=caps), None
    except Exception as exc:  # a version whose private config API moved: reject, say why
        why = str(exc) if str(exc).startswith("adapter:") else f"{type(exc).__name__}: {exc}"
        return None, f"adapter: cannot resolve AITER's kernel config for {entry} ({why})"


def nvidia(params) -> bool:
    """Compiled for an NVIDIA GPU (not the interpreter, not ROCm)."""
    return params["device"] == "cuda" and PLATFORM.get().nvidia


def positive_strides(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or a contiguous copy when a stride is 0 (an expanded view): AITER's
    kernels assume (``tl.assume``) every stride is positive."""
    if t.numel() and any(s <= 0 for s in t.stride()):
        return t.contiguous()
    return t


def run_or_unsupported(fn, *args, **kwargs):
    """Call AITER; a config that does not fit this device becomes an unsupported case with
    the reason (AITER's MI350X configs can need more shared memory than an NVIDIA GPU has)."""
    from triton.runtime.errors import OutOfResources
    try:
        return fn(*args, **kwargs)
    except OutOfResources as exc:
        raise UnsupportedCase(f"AITER's tuned config does not fit this device: {exc}") from exc


# ---- gemm_a16w16 ------------------------------------------------------------------------------

def _config(m: int, n: int, k: int) -> dict:
    return aiter_config(ENTRY, m, n, k, caps=INTERPRETER_CAPS)


def _why_not(params) -> str | None:
    why = why_missing(ENTRY)
    if why is not None:
        return why
    if params["out_dtype"] not in _OUTPUTS:
        return f"{ENTRY} stores bf16 / fp16 / fp32, got {params['out_dtype']}"
    if INTERPRET and params["dtype"] == torch.bfloat16:
        return f"bf16 inputs under the interpreter: {INTERPRETER_BF16}"
    if INTERPRET and params["out_dtype"] == torch.bfloat16:
        return f"bf16 output under the interpreter: {INTERPRETER_BF16_STORE}"
    if params["gelu"]:
        return (f"GELU epilogue: {ENTRY}'s activation returns only gelu(pre); tealite's "
                "gelu=True also returns the pre-activation, which AITER does not produce")
    if params["alpha"] != 1.0:
        return f"alpha={params['alpha']}: {ENTRY} has no alpha scaling"
    if params["beta"] != 0.0:
        return f"beta={params['beta']}: {ENTRY} overwrites y, it cannot accumulate into out"
    if params["k"] == 0:
        return (f"K == 0: {ENTRY}'s kernel stores nothing for an empty K range (the output "
                "would be uninitialized memory, not zeros)")
    _, why = config_or_reason(ENTRY, params["m"], params["n"], params["k"],
                              caps=INTERPRETER_CAPS)
    return why


def _numerics(params) -> dict:
    num = {"entry_point": ENTRY, "compute_dtype": torch.float32}
    if params["bias"] and _config(params["m"], params["n"], params["k"])["NUM_KSPLIT"] == 1:
        # The bias seeds the fp32 accumulator: each of the K additions rounds a partial sum
        # that includes it (gemm tier: the epilogue terms join the accumulation bound).
        num["epilogue_in_accumulator"] = True
    if nvidia(params):
        # bf16 / fp16 tensor-core dots: truncating fp32 accumulation; fp16 subnormal operands
        # aligned at the smallest normal exponent (as tealite's own triton gemm declares).
        num["accumulator_unit_roundoff"] = TENSOR_CORE_U
        num["alignment_floor"] = params["dtype"]
    return num


CONTRACT = declare(Contract(
    backend=BACKEND.name, entry_point=ENTRY, op=Op.GEMM,
    layouts=("x:(M,K) = op_B(B) as a strided view (B, or B.T for layout ?T)",
             "w:(N,K) = op_A(A) transposed, a strided view (A for T?, A.T for N?)",
             "y:(M,N) row-major or out=", "bias:(N,) contiguous, input dtype"),
    notes=("fp32 accumulation; the bias seeds the accumulator (no split-K) or is added by the "
           "split-K reduce; one rounding to the output dtype; no alpha, no beta accumulate, no "
           "pre-activation output (GELU rejected); K == 0 leaves y unwritten (rejected)"),
    extra={"accumulate": "fp32", "bias": "accumulator seed", "split_k_partials": "fp32"}))


@BACKEND.implements(Op.GEMM, dtypes=_INPUTS, devices=DEVICES, layouts=("TN", "NN", "NT", "TT"),
                    check=_why_not, numerics=_numerics)
def gemm(a, b, *, layout, out_dtype, bias, gelu, out, alpha, beta):
    del gelu, alpha, beta  # rejected by _why_not unless neutral
    x = positive_strides(b if layout[1] == "N" else b.t())  # op_B(B): (M, K)
    w = positive_strides(a if layout[0] == "T" else a.t())  # op_A(A)^T: (N, K)
    m, n, k = x.shape[0], w.shape[0], x.shape[1]
    fn = kernels().functions[ENTRY]
    y = run_or_unsupported(fn, x, w, bias=bias.contiguous() if bias is not None else None,
                           dtype=out_dtype, y=out, config=_config(m, n, k))
    return y, None
