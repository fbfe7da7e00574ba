"""``Numerics``: what a backend declares about how one implementation rounds.

tealite_verify's tolerance tiers read these declarations to build each backend's bound: a
backend that rounds more gets a wider bound, and one that rounds more than it declares is
reported.  Every field is documented here, once.  A field left at ``None`` (or ``False``) is
not declared, and the tiers assume the default written after it; :meth:`Numerics.to_json`
serializes the declared fields only.

A declaration is given to ``Backend.implements(numerics=...)`` as a :class:`Numerics`, a
mapping of these field names (validated at registration: an unknown name is an error that
lists the valid ones, since a misspelled key would otherwise make the harness judge the
kernel by rules its author did not declare), or a function of the case's params returning
either (validated when it is evaluated).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from tealite.moe_types import MoEMerge, TieRule

# The alignment_floor value for FP8 GEMMs whose tensor cores align products at the FP8
# codes' exponents, before their scales (Hopper's FP8 WGMMA; docs/false-alarms.md).
FP8_CODE_ALIGNMENT = "fp8_codes"


@dataclass(frozen=True)
class Numerics:
    # --- every op ---------------------------------------------------------------------
    # dtype the kernel computes in (default float32).
    compute_dtype: torch.dtype | None = None
    # the kernel that ran (AITER backends): informational, shown in reports and by the gate.
    entry_point: str | None = None
    # the weight layout the kernel reads, "plain" or "preshuffled" (AITER's bpreshuffle
    # entry points; informational: the layout itself is checked by the shuffle tier).
    weight_layout: str | None = None
    # why the call cannot be captured in a CUDA graph (a host synchronization in the entry
    # point, e.g. sizes read with ``.item()``); the harness's graph-replay check then reports
    # the reason instead of capturing.  None: capturable (the check captures and replays it).
    not_capturable: str | None = None
    # a note on how interpreter runs feed the kernel (informational).
    interpreter_input: str | None = None
    # how the kernel computes 1/sqrt: "exact", or an approximate instruction such as
    # "tl.rsqrt (approximate)" (informational: recorded for the gate; the norm tiers' bound
    # covers it through compute_dtype).
    rsqrt: str | None = None
    # --- gemm / qgemm ------------------------------------------------------------------
    # unit roundoff of the accumulator (default 2^-24: fp32 round to nearest); e.g. 2^-13
    # for Hopper's FP8 MMA, which cuts products to a 13-bit window.
    accumulator_unit_roundoff: float | None = None
    # the accumulator is rounded to this dtype before an unfused epilogue.
    accumulator_rounded_to: torch.dtype | None = None
    # "tf32": matmul inputs are rounded to TF32 first.
    matmul_input_rounding: str | None = None
    # split-K partial sums are rounded to this dtype.
    partial_sums_rounded_to: torch.dtype | None = None
    # quantized operands were dequantized to this dtype (one rounding) before the matmul.
    operands_dequantized_to: torch.dtype | None = None
    # the accumulator aligns products at the operands' exponents, subnormal operands counted
    # at this dtype's smallest normal exponent; for qgemm FP8_CODE_ALIGNMENT (the codes').
    alignment_floor: torch.dtype | str | None = None
    # with alignment_floor: the MMA's accumulation restarts every this many K (a fresh dot
    # per scale block, partials added in fp32: block-scaled FP8 kernels); the accumulator
    # unit roundoff is then declared per restart block, and the harness takes the aligned
    # (lifted) magnitudes per block and sums them.  None: one accumulation over all of K.
    mma_restart_k: int | None = None
    # the bias / beta*C seeds the accumulator and is summed with every product (AITER's
    # gemm_a16w16), instead of being added once at the end.
    epilogue_in_accumulator: bool = False
    # "may_flush": subnormal operands may be treated as zero (oneDNN's bf16 matmul on
    # AVX512-BF16 / AMX CPUs); probed by the backend, never assumed.
    subnormal_inputs: str | None = None
    # --- grouped ops (grouped_gemm / grouped_qgemm; tealite/moe_types.py) -----------------
    # the grouped path computes every group with exactly the arithmetic of the same backend's
    # single op (gemm / qgemm) on that group, so the two agree bit for bit; the harness's
    # parity oracle (tealite_verify/tiers/parity.py) then demands equality, and otherwise
    # (default False: a different tiling or accumulation order) holds them to the GEMM bound.
    grouped_matches_split: bool = False
    # --- quantizers and fused quantizing ops -------------------------------------------
    # ulps of error in an fp32 division (the scale or its inverse; default 0: exact IEEE).
    fp32_div_ulps: int | None = None
    # "hardware": FP4 ties may round either way (one code step at exact ties).
    fp4_tie_rounding: str | None = None
    # MX blocks with NaN/Inf: "ignore-nan" (AITER Triton's amax skips NaN); default
    # "nan-scale" (the OCP rule: the block's scale is NaN).
    mx_nonfinite: str | None = None
    # a zero-amax row gets scale_inv 1 instead of 0 (AITER's fused-norm variant).
    scale_inv_zero_as_one: bool = False
    # a given scale is used as scale_inv (AITER's fused kernels' convention).
    given_scale_as_scale_inv: bool = False
    # the amax is floored at this value before the scale is computed (default 0).
    amax_floor: float | None = None

    # --- softmax / attention ---------------------------------------------------------
    # ulps of fp32 error in the kernel's exp (default 1; an exp2-based approximation such as
    # Triton's tl.exp2 with a pre-multiplied log2(e) declares more).
    exp_ulps: int | None = None
    # P (the softmax probabilities) is rounded to this dtype before the P @ V product
    # (flash kernels feed the tensor cores in the input dtype); in backward also before dV.
    attention_p_rounded_to: torch.dtype | None = None
    # dS is rounded to this dtype before the dQ / dK products (flash backward kernels).
    attention_ds_rounded_to: torch.dtype | None = None
    # P and dS are multiplied by a dynamic per-block scale fmax / max(|block|, amax_floor)
    # before their rounding to attention_p_rounded_to / attention_ds_rounded_to (an FP8
    # dtype), the product descaled after (AITER's FP8 backward): the rounding's relative
    # error is the format's, its absolute (subnormal) error scales with the block's amax.
    attention_dynamic_block_scale: bool = False
    # the forward softmax is computed online over key blocks of this size (running max and
    # sum, the partial output rescaled per block: FlashAttention); None: one pass per row.
    attention_kv_block: int | None = None

    # --- rope -------------------------------------------------------------------------
    # absolute error of the kernel's fp32 cos / sin of an fp32 argument, in units of 2^-24
    # (half an ulp of 1; default 2: libm quality, measured <= 1.2 for numpy's and torch's CPU
    # cos / sin up to |f| = 3e7).  Hardware approximations (sin.approx.f32) declare more.
    trig_ulps: float | None = None

    # --- router (top-k) ----------------------------------------------------------------
    # which expert the top-k picks among equal scores: TieRule.LOWEST_INDEX, checked exactly
    # by the router tier; None: unspecified (any of the tied experts is accepted).  The
    # scores' own rounding comes from compute_dtype and exp_ulps.
    topk_ties: TieRule | None = None

    # --- expert FFN (moe_ffn_fwd; tealite/ops/moe_ffn.py) ---------------------------------
    # how a token's k weighted rows are merged (MoEMerge); None: products and sum in fp32,
    # one rounding (the harness's bound: tealite_verify/tiers/moe_layer.py).
    moe_merge: MoEMerge | None = None

    # --- add_rmsnorm_pad (tealite/ops/norms.py) -----------------------------------------
    # the padded output columns of a row holding a NaN are NaN: the kernel computes them as
    # 0 * rsigma * 0 with rsigma NaN (AITER's fused_add_rmsnorm_pad); default False: every
    # padded column is exactly 0.
    pad_nan_rows: bool = False

    def __post_init__(self):
        if self.mma_restart_k is not None and (not isinstance(self.mma_restart_k, int)
                                               or self.mma_restart_k < 1):
            raise ValueError(f"mma_restart_k must be a positive int (K elements per MMA "
                             f"restart) or None, got {self.mma_restart_k!r}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def of(cls, declared: "Numerics | Mapping[str, Any] | None", *, where: str = "numerics"
           ) -> "Numerics":
        """``declared`` as a Numerics; a mapping with an unknown key is a ValueError naming
        the key and the valid ones."""
        if declared is None:
            return cls()
        if isinstance(declared, cls):
            return declared
        if not isinstance(declared, Mapping):
            raise TypeError(f"{where} must be a tealite.numerics.Numerics or a mapping of its "
                            f"fields, got {type(declared).__name__}")
        unknown = sorted(set(declared) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; the valid keys are "
                             f"{list(cls.field_names())} (tealite/numerics.py documents each)")
        return cls(**declared)

    def declared(self) -> dict[str, Any]:
        """The declared fields (those not at their undeclared default)."""
        blank = Numerics()
        return {f: getattr(self, f) for f in self.field_names()
                if getattr(self, f) != getattr(blank, f)}

    def to_json(self) -> dict[str, str]:
        """The declared fields as text (dtypes as ``torch.float32``): for reports and findings."""
        return {k: str(v) for k, v in self.declared().items()}

    def with_(self, **changes) -> "Numerics":
        """A copy with ``changes`` (validated like a mapping)."""
        return Numerics.of({**self.declared(), **changes})
