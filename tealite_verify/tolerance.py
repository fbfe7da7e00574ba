"""Tolerance tiers: how far a backend's output may be from the float64 reference.

No tier is a blanket ``atol``/``rtol``.  Each tier derives a per-element bound from what the
computation does, and every comparison returns a :class:`Metrics` record (max abs error,
max error/tolerance ratio, mismatch count, the worst element and the values there).

Tiers
-----
``exact``
    Bitwise equality of the stored bit patterns (NaN-aware: any NaN matches any NaN unless
    ``nan_payload=True``).  For quantization codes and scales.

``ulp`` (elementwise ops, norms)
    ``tol = roundings * 0.5 * ulp_out(|ref| + e_c) + e_c`` with the compute error
    ``e_c = (ops * u_c + gamma_n(u_c)) * magnitude``.  ``ulp_out`` is the spacing of the
    output dtype (subnormal spacing below the normal range), ``u_c`` the unit roundoff of the
    backend's declared compute dtype, ``gamma_n = n u / (1 - n u)`` Higham's bound for a
    reduction of length ``n``, and ``magnitude`` the op's condition magnitude: the same
    formula evaluated on absolute values (so cancellation is accounted for and tiny outputs
    of large intermediates are not judged by their own ulp).  With a low-precision output the
    output rounding dominates and a one-ULP error in the result is caught; in fp32 the
    bound is the compute error.

``gemm`` (K-aware, Higham)
    ``|fl(A.B) - A.B| <= gamma_K(u_acc) |A||B|`` (tensor cores: exact products and fp32
    accumulation, so u_acc = 2^-24), plus the backend's declared extra roundings (inputs
    rounded to TF32, split-K partial sums in the input dtype, the accumulator rounded to the
    input dtype before an unfused epilogue), the fp32 epilogue, GELU's Lipschitz constant
    (max |gelu'| = 1.1289) and the final rounding to the output dtype.  It is the
    deterministic bound, never exceeded by a correct kernel whatever its summation order.

Pairwise backend-vs-backend comparison uses the sum of the two backends' bounds.

Declared numerics (``Backend.implements(numerics=...)``, the fields of
:class:`tealite.numerics.Numerics`, documented there) read here: ``compute_dtype``, and for the
``gemm`` tier ``accumulator_unit_roundoff``, ``accumulator_rounded_to``,
``matmul_input_rounding``, ``partial_sums_rounded_to``, ``operands_dequantized_to``,
``alignment_floor`` (``FP8_CODE_ALIGNMENT`` for Hopper's FP8 tensor cores: the accumulation
error then scales with :func:`aligned_magnitude` of the codes), ``epilogue_in_accumulator``
and ``subnormal_inputs``.  Every
operation also gets an absolute
underflow term (Higham's eta, widened to the smallest normal: see ``underflow_error``).

Overflow: where the reference lies beyond the output dtype's overflow threshold by more than the
tolerance, the output must be the signed infinity; where the tolerance band straddles the
threshold, either a finite value within tolerance or the infinity is accepted.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import ml_dtypes
import numpy as np
import torch

from tealite import numerics as numerics_fields
from tealite.numerics import Numerics

from tealite_verify.references._device import namespace

# (explicit mantissa bits, minimum normal exponent) per floating dtype.
_FORMATS = {
    torch.float64: (52, -1022),
    torch.float32: (23, -126),
    torch.bfloat16: (7, -126),
    torch.float16: (10, -14),
    "tf32": (10, -126),
}
GELU_LIPSCHITZ = 1.1289  # max over x of |d/dx x*Phi(x)|, at x ~ 1.41 (rounded up)


def _fmt(dtype):
    try:
        return _FORMATS[dtype]
    except KeyError:
        raise ValueError(f"no float format known for {dtype!r}") from None


def unit_roundoff(dtype) -> float:
    """u = 2^-(p) for a format with p-1 explicit mantissa bits (round to nearest)."""
    mant, _ = _fmt(dtype)
    return 2.0 ** -(mant + 1)


def gamma(n, u: float):
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of an n-term reduction."""
    nu = np.asarray(n, dtype=np.float64) * u
    # n*u >= 1: the a-priori bound is vacuous (a bf16 sum of 256+ terms can lose every bit).
    with np.errstate(divide="ignore"):
        g = np.where(nu < 1, nu / np.where(nu < 1, 1 - nu, 1.0), np.inf)
    # A scalar n gives a Python float: a 0-d numpy array times a torch tensor (a bound on the
    # reference device) would try to turn the tensor into numpy.
    return float(g) if g.ndim == 0 else g


def ulp(dtype, value) -> np.ndarray:
    """Spacing of ``dtype``'s representable numbers at magnitude |value| (elementwise).

    Zero and values below ``dtype``'s normal range get the subnormal spacing 2^(emin-mant);
    +-Inf gets 2^(-1-mant) and NaN the subnormal spacing (what frexp's exponent 0 gave).
    A torch tensor (a bound computed on the reference device) gets the same values as a
    float64 tensor on its device.
    """
    mant, emin = _fmt(dtype)
    if isinstance(value, torch.Tensor):
        return _ulp_torch(mant, emin, value)
    v = np.abs(np.asarray(value, dtype=np.float64))
    # floor(log2 v) is the biased exponent field minus 1023 for normal float64 v; zero and
    # float64 subnormals read -1023 and are lifted to emin below.  Read off the bits: this
    # runs on every compared element, and frexp + ldexp cost twice as much.
    field = v.view(np.int64) >> 52
    e = np.maximum(field - 1023, emin)
    if field.size and field.max() == 2047:  # Inf / NaN
        e = np.where(field == 2047, np.where(np.isnan(v), emin, -1), e)
    if emin - mant >= -1022:  # 2^(e - mant) is a normal float64: build it from its bits
        return ((e - mant + 1023) << 52).view(np.float64)
    return np.ldexp(1.0, (e - mant).astype(np.int64))


def _ulp_torch(mant: int, emin: int, value: torch.Tensor) -> torch.Tensor:
    v = value.detach().to(torch.float64).abs()
    field = v.view(torch.int64) >> 52
    e = torch.clamp_min(field - 1023, emin)
    e = torch.where(field == 2047, torch.where(torch.isnan(v), emin, -1), e)
    if emin - mant >= -1022:
        return ((e - mant + 1023) << 52).view(torch.float64)
    return torch.ldexp(torch.ones_like(v), e - mant)


def overflow_threshold(dtype) -> float:
    """Smallest magnitude that round-to-nearest sends to infinity in ``dtype``."""
    fmax = torch.finfo(dtype).max
    return float(fmax) + 0.5 * float(ulp(dtype, fmax))


@dataclass(frozen=True)
class Metrics:
    tier: str
    numel: int
    mismatches: int
    max_abs_err: float
    max_ratio: float
    worst_index: tuple | None = None
    worst_actual: float | None = None
    worst_expected: float | None = None
    worst_tol: float | None = None
    nonfinite_mismatches: int = 0
    shape_error: str | None = None
    excused: int = 0  # elements a tier's documented exception accepted (reported, not hidden)
    note: str | None = None  # what the tier saw but does not judge (e.g. padding contents)
    # exact tier: the largest distance between mismatched bit patterns (as integers); there
    # max_abs_err is the value error |got - want| of the mismatched elements.
    max_bit_distance: int | None = None
    # Opt-in probabilistic check (tolerance_prob.py): max err / the Higham-Mary bound, and the
    # FlashAttention-style cross-check max|err| / max|same-precision torch - ref|; None when
    # not computed.  Informational: ``passed`` stays the deterministic verdict.
    prob_ratio: float | None = None
    fa_ratio: float | None = None

    @property
    def suspicious(self) -> bool:
        """Within the deterministic bound but beyond the probabilistic one."""
        return self.passed and self.prob_ratio is not None and self.prob_ratio > 1.0

    @property
    def passed(self) -> bool:
        return self.shape_error is None and self.mismatches == 0

    def summary(self) -> str:
        if self.shape_error:
            return f"[{self.tier}] {self.shape_error}"
        s = (f"[{self.tier}] {self.mismatches}/{self.numel} mismatched, max|err|="
             f"{self.max_abs_err:.4g}, max err/tol={self.max_ratio:.4g}")
        if self.max_bit_distance is not None:
            s += f", max bit distance={self.max_bit_distance}"
        if self.worst_index is not None:
            s += (f", worst at {self.worst_index}: got {self.worst_actual!r}, "
                  f"want {self.worst_expected!r} +- {self.worst_tol:.4g}")
        if self.nonfinite_mismatches:
            s += f", {self.nonfinite_mismatches} NaN/Inf mismatches"
        if self.excused:
            s += f", {self.excused} excused by the tier's rule"
        if self.note:
            s += f" ({self.note})"
        if self.prob_ratio is not None:
            s += f", prob err/bound={self.prob_ratio:.4g}" + (" SUSPICIOUS" if self.suspicious
                                                               else "")
        if self.fa_ratio is not None:
            s += f", err/err(torch same precision)={self.fa_ratio:.4g}"
        return s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        d["suspicious"] = self.suspicious
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return d


def _to_f64(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def _shape_mismatch(tier, actual_shape, expected_shape) -> Metrics | None:
    if tuple(actual_shape) == tuple(expected_shape):
        return None
    return Metrics(tier, 0, 0, math.inf, math.inf,
                   shape_error=f"shape {tuple(actual_shape)} != expected {tuple(expected_shape)}")


def _finish(tier, ok, err, tol, a, e, nonfinite) -> Metrics:
    numel = int(ok.size)
    if numel == 0:
        return Metrics(tier, 0, 0, 0.0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(tol > 0, err / np.where(tol > 0, tol, 1.0), np.where(err > 0, np.inf, 0.0))
    # A rejected element whose plain ratio is <= 1 (a NaN, a missing overflow) counts as inf.
    ratio = np.where(ok, np.minimum(ratio, 1.0), np.where(ratio > 1, ratio, np.inf))
    flat = int(np.argmax(ratio))
    idx = tuple(int(i) for i in np.unravel_index(flat, ok.shape))
    finite_err = err[np.isfinite(err)]
    return Metrics(
        tier=tier, numel=numel, mismatches=int((~ok).sum()),
        max_abs_err=float(finite_err.max()) if finite_err.size else (math.inf if err.size else 0.0),
        max_ratio=float(ratio.reshape(-1)[flat]),
        worst_index=idx, worst_actual=float(a[idx]), worst_expected=float(e[idx]),
        worst_tol=float(tol[idx]) if np.ndim(tol) else float(tol),
        nonfinite_mismatches=int(nonfinite),
    )


def compare_bounded(actual, expected, tol, out_dtype, *, tier: str = "bounded") -> Metrics:
    """|actual - expected| <= tol elementwise, NaN/Inf- and overflow-aware.

    ``expected`` (and ``tol``) may be torch tensors on the reference device: the usual case,
    every element finite and within, is then decided there; anything else is judged on the
    host by the same code as numpy inputs.
    """
    thr = overflow_threshold(out_dtype) if out_dtype in (torch.float16, torch.bfloat16,
                                                          torch.float32) else math.inf
    if isinstance(expected, torch.Tensor):
        bad = _shape_mismatch(tier, tuple(actual.shape), tuple(expected.shape))
        if bad:
            return bad
        fast = _all_finite_within_torch(tier, actual, expected, tol, thr)
        if fast is not None:
            return fast
    if isinstance(tol, torch.Tensor):
        tol = tol.detach().cpu().numpy()
    e = _to_f64(expected)
    bad = _shape_mismatch(tier, tuple(actual.shape), e.shape)
    if bad:
        return bad
    a = _to_f64(actual)
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), e.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - e)
    fast = _all_finite_within(tier, err, tol, a, e, thr)
    return fast if fast is not None else _bounded_general(tier, err, tol, a, e, thr)


def _bounded_general(tier, err, tol, a, e, thr) -> Metrics:
    """compare_bounded's verdict with every rule: NaN, Inf, overflow."""
    with np.errstate(invalid="ignore", over="ignore"):
        within = np.isfinite(a) & np.isfinite(e) & (err <= tol)
        both_nan = np.isnan(a) & np.isnan(e)
        same_inf = np.isinf(a) & (a == e)
        # Reference finite but past (or straddling) overflow: the signed infinity is right.
        overflow_ok = np.isinf(a) & np.isfinite(e) & (np.sign(a) == np.sign(e)) & (
            np.abs(e) + tol >= thr)
        must_overflow = np.isfinite(e) & (np.abs(e) - tol >= thr) & ~np.isinf(a)
    ok = (within | both_nan | same_inf | overflow_ok) & ~must_overflow
    nonfinite = int(((~np.isfinite(a)) | (~np.isfinite(e)))[~ok].sum())
    err = np.where(np.isfinite(err), err, np.inf)
    err = np.where(ok & ~np.isfinite(err), 0.0, err)
    return _finish(tier, ok, err, tol, a, e, nonfinite)


def _all_finite_within(tier, err, tol, a, e, thr) -> Metrics | None:
    """``_bounded_general``'s Metrics when every element is finite and within ``tol`` (the
    common case, in a third of its array passes), else None.

    A finite ``err`` means ``a`` and ``e`` are finite, so only the must-overflow rule could
    still reject an element, and it cannot while |a| < thr (|e| - tol <= |a|): every element
    is accepted and the ratio is err / tol (0 where tol is 0 or inf), as in ``_finish``.
    """
    if err.size == 0:
        return None
    with np.errstate(invalid="ignore"):
        if not (np.isfinite(err).all() and (err <= tol).all()):
            return None
    if math.isfinite(thr) and not np.abs(a).max() < thr:
        return None
    ratio = np.zeros(err.shape)
    np.divide(err, tol, out=ratio, where=tol > 0)
    flat = int(np.argmax(ratio))
    idx = tuple(int(i) for i in np.unravel_index(flat, err.shape))
    return Metrics(tier=tier, numel=int(err.size), mismatches=0,
                   max_abs_err=float(err.max()), max_ratio=float(ratio.reshape(-1)[flat]),
                   worst_index=idx, worst_actual=float(a[idx]), worst_expected=float(e[idx]),
                   worst_tol=float(tol[idx]), nonfinite_mismatches=0)


def _all_finite_within_torch(tier, actual, e, tol, thr) -> Metrics | None:
    """``_all_finite_within`` computed on ``e``'s device with torch: the same IEEE operations
    (|a - e|, comparisons, err / tol), argmax's first maximum, one host transfer at the end.
    (Host arrays keep the numpy version: routed through torch on the CPU, this short path and
    ``ulp`` made the comparisons of ``ci`` / ``local`` cases about 2x slower, measured.)"""
    if e.numel() == 0:
        return None
    a = actual.detach().to(e.device, torch.float64)
    tol = torch.as_tensor(tol, dtype=torch.float64, device=e.device).broadcast_to(e.shape)
    err = (a - e).abs()
    ok = torch.isfinite(err).all() & (err <= tol).all()
    if math.isfinite(thr):
        ok = ok & (a.abs().max() < thr)
    if not bool(ok):
        return None
    ratio = torch.where(tol > 0, err / torch.where(tol > 0, tol, 1.0), 0.0)
    flat = torch.argmax(ratio.reshape(-1))
    picked = torch.stack([err.max(), ratio.reshape(-1)[flat], a.reshape(-1)[flat],
                          e.reshape(-1)[flat], tol.reshape(-1)[flat],
                          flat.to(torch.float64)]).tolist()
    idx = tuple(int(i) for i in np.unravel_index(int(picked[5]), tuple(e.shape)))
    return Metrics(tier=tier, numel=int(e.numel()), mismatches=0, max_abs_err=picked[0],
                   max_ratio=picked[1], worst_index=idx, worst_actual=picked[2],
                   worst_expected=picked[3], worst_tol=picked[4], nonfinite_mismatches=0)


def _bits(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().contiguous()
        width = t.element_size()
        int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
        return t.view(int_dtype).numpy().astype(np.int64)
    arr = np.ascontiguousarray(t)
    return arr.view(f"u{arr.dtype.itemsize}").astype(np.int64)


def compare_exact(actual, expected, *, nan_payload: bool = False) -> Metrics:
    """Bitwise equality; ``actual`` and ``expected`` must have the same element type."""
    bad = _shape_mismatch("exact", tuple(actual.shape), tuple(expected.shape))
    if bad:
        return bad
    if _elem_type(actual) != _elem_type(expected):
        return Metrics("exact", 0, 0, math.inf, math.inf, shape_error=(
            f"element type {_elem_type(actual)} != expected {_elem_type(expected)}"))
    a_bits, e_bits = _bits(actual), _bits(expected)
    ok = a_bits == e_bits
    a_val = _to_f64(actual) if _is_float(actual) else a_bits.astype(np.float64)
    e_val = _to_f64(expected) if _is_float(expected) else e_bits.astype(np.float64)
    if not nan_payload and _is_float(actual):
        ok |= np.isnan(a_val) & np.isnan(e_val)
    bit_dist = np.where(ok, 0, np.abs(a_bits - e_bits))
    nonfinite = int(((~np.isfinite(a_val)) | (~np.isfinite(e_val)))[~ok].sum())
    m = _finish("exact", ok, bit_dist.astype(np.float64), np.zeros(ok.shape), a_val, e_val,
                nonfinite)
    # Report the value error and the bit distance apart: a distance between bit patterns
    # printed as "max|err|" read as a value (got 0.0 vs want 0.0103 showed 1.009e+09).
    with np.errstate(invalid="ignore"):
        value_err = np.abs(a_val - e_val)[~ok]
    finite = value_err[np.isfinite(value_err)]
    return replace(m, max_abs_err=float(finite.max()) if finite.size else
                   (math.inf if value_err.size else 0.0),
                   max_bit_distance=int(bit_dist.max()) if bit_dist.size else 0)


def _is_float(t) -> bool:
    if isinstance(t, torch.Tensor):
        return t.dtype.is_floating_point
    dt = np.asarray(t).dtype
    if dt.kind == "f":
        return True
    try:  # ml_dtypes' bfloat16 / float8 types have kind 'V'
        ml_dtypes.finfo(dt)
        return True
    except (ValueError, TypeError):
        return False


def _elem_type(t) -> str:
    if isinstance(t, torch.Tensor):
        return str(t.dtype).removeprefix("torch.")
    return np.asarray(t).dtype.name


def compute_dtype(numerics: Numerics):
    return numerics.compute_dtype or torch.float32


def _accumulator_u(numerics: Numerics) -> float:
    """The accumulator's unit roundoff: declared, else fp32's round to nearest."""
    u = numerics.accumulator_unit_roundoff
    return unit_roundoff(torch.float32) if u is None else u


def underflow_error(dtype) -> float:
    """Absolute error one operation can make near zero: the smallest normal of its format.

    Not half a subnormal step: flush-to-zero hardware (AMD GPUs' default fp32 denormal mode
    in many kernels) and exp overflow inside 1/(1+exp(-x)) both turn a subnormal
    intermediate into 0.  Values below the compute format's normal range are judged at that
    absolute resolution, scaled by what the intermediate is multiplied by afterwards
    (``underflow_scale``).
    """
    return float(torch.finfo(dtype).tiny)


def with_output_rounding(ref, compute_err, out_dtype, *, roundings: int = 1) -> np.ndarray:
    """Add ``roundings`` round-to-nearest steps into ``out_dtype`` to a compute-error bound."""
    xp = namespace(ref, compute_err)
    e = xp.asarray(compute_err)
    return roundings * 0.5 * ulp(out_dtype, xp.abs(xp.asarray(ref)) + e) + e


def elementwise_tolerance(ref, magnitude, out_dtype, numerics: Numerics, *,
                          ops: float = 4.0, reduction: int = 0, roundings: int = 1,
                          underflow_scale=1.0) -> np.ndarray:
    """The ``ulp`` tier's bound (see module docstring)."""
    c_dt = compute_dtype(numerics)
    u_c = unit_roundoff(c_dt)
    coef = ops * u_c + (gamma(reduction, u_c) if reduction > 0 else 0.0)
    xp = namespace(ref, magnitude, underflow_scale)
    e_c = coef * xp.abs(xp.asarray(magnitude))
    e_c = e_c + (ops + reduction) * underflow_error(c_dt) * xp.asarray(underflow_scale)
    return with_output_rounding(ref, e_c, out_dtype, roundings=roundings)


def aligned_magnitude(x, dtype) -> np.ndarray:
    """|x| with nonzero subnormals of ``dtype`` raised to twice its smallest normal.

    Measured on an H100 (triton 3.6 fp16 ``tl.dot``): an fp16 subnormal operand's product is
    aligned as if the operand had the smallest normal exponent, so the truncated low bits of a
    sum are relative to 2^emin, not to the product's true size (exact 2.2357557e-07 came out
    2.2357472e-07, 30 fp32 ulps).  Twice the smallest normal bounds 2^emin times any
    significand below 2."""
    xp = namespace(x)
    ax = xp.abs(xp.asarray(x))
    floor = 2.0 * float(torch.finfo(dtype).tiny)
    return xp.where(ax != 0, xp.maximum(ax, floor), ax)


# qgemm's ``alignment_floor`` value for an FP8 MMA: subnormal *codes* are aligned at their
# format's smallest normal exponent (measured on an H200; tests/test_fp8_mma_accumulator.py).
FP8_CODE_ALIGNMENT = numerics_fields.FP8_CODE_ALIGNMENT


def normal_magnitude(x, dtype) -> np.ndarray:
    """|x| with the subnormals of ``dtype`` set to zero: what a kernel that treats subnormal
    inputs as zero (declared ``subnormal_inputs: "may_flush"``) multiplies."""
    xp = namespace(x)
    ax = xp.abs(xp.asarray(x))
    return xp.where(ax < float(torch.finfo(dtype).tiny), 0.0 * ax, ax)


def gemm_error(p_abs, p, k: int, numerics: Numerics, *,
               accumulation_gamma=gamma, flushed_abs=None) -> np.ndarray:
    """Bound on |computed P - P| for P = op(B) @ op(A) before the epilogue.

    ``p_abs`` = |op(B)| @ |op(A)| and ``p`` = the exact product, both float64.
    ``accumulation_gamma(k, u_acc)``: the K-term accumulation's relative bound (Higham's
    gamma_K; tolerance_prob.py passes the probabilistic one).  ``flushed_abs``: products a
    ``subnormal_inputs: "may_flush"`` kernel may drop whole (see gemm_tolerances).
    """
    u_acc = _accumulator_u(numerics)
    coef = accumulation_gamma(k, u_acc) if k > 0 else 0.0
    if numerics.operands_dequantized_to is not None:
        # Each operand was rounded once (code x scale) before an exact product.
        coef = coef + 2 * unit_roundoff(numerics.operands_dequantized_to)
    # Products that underflow (or are flushed) lose up to the smallest normal each.
    eta = k * underflow_error(torch.float32)
    if numerics.matmul_input_rounding == "tf32":
        coef = coef + 2 * unit_roundoff("tf32")
    partial = numerics.partial_sums_rounded_to
    if partial is not None and k > 1:
        # Split-K in cuBLAS (an assumption, not documented by NVIDIA): at most ~log2(K)
        # levels of partial sums kept in `partial`, and at most ceil(K/64) partial sums, each
        # of which may lose half a subnormal step of `partial` near zero (measured on an H100:
        # fp16 sums of subnormal products were off by 5 fp16 subnormal steps at K=1481).
        coef = coef + gamma(math.ceil(math.log2(k)) + 1, unit_roundoff(partial))
        eta = eta + math.ceil(k / 64) * 0.5 * float(ulp(partial, 0.0))
    err = coef * p_abs + eta
    if flushed_abs is not None and numerics.subnormal_inputs == "may_flush":
        # Before the accumulator's rounding: the flushed sum may sit in a higher binade than
        # the exact one, with a coarser ulp (a local-size fuzz false alarm on this CPU: bf16
        # 4.807e-35 exact, 4.834e-35 flushed, rounded to the bf16 4.852e-35).
        err = err + flushed_abs
    rounded_to = numerics.accumulator_rounded_to
    if rounded_to is not None:
        err = err + 0.5 * ulp(rounded_to, namespace(p).abs(p) + err)
    return err


def gemm_tolerances(p_abs, p, pre, k: int, out_dtype, numerics, *, alpha: float,
                    epilogue_abs, gelu_out=None, flushed_abs=None,
                    accumulation_gamma=gamma) -> dict[str, np.ndarray]:
    """Bounds for the ``gemm`` tier: {"pre": ..., "out": ...}.

    ``epilogue_abs`` = |beta C| + |bias| (broadcast), ``pre`` the exact pre-activation and
    ``gelu_out`` the exact GELU output (None without GELU).  ``flushed_abs``: the part of
    ``p_abs`` made of products with a subnormal operand, for a backend that declares
    ``subnormal_inputs: "may_flush"``: it may drop each of them whole (the computed product
    is then the rounding of the product of the normal operands, within e_p of it).
    """
    xp = namespace(p_abs, p, pre)  # numpy, or torch on the reference device
    u_c = unit_roundoff(compute_dtype(numerics))
    e_p = gemm_error(p_abs, p, k, numerics, accumulation_gamma=accumulation_gamma,
                     flushed_abs=flushed_abs)
    if numerics.epilogue_in_accumulator and k > 0:
        # The epilogue term rides through all K accumulations (Higham: gamma_K of it).
        u_acc = _accumulator_u(numerics)
        e_p = e_p + accumulation_gamma(k, u_acc) * epilogue_abs
    e_pre = abs(alpha) * e_p + 3 * u_c * (abs(alpha) * (xp.abs(p) + e_p) + epilogue_abs)
    tol = {"pre": e_pre + 0.5 * ulp(out_dtype, xp.abs(pre) + e_pre)}
    if gelu_out is None:
        tol["out"] = tol["pre"]
    else:
        e_y = GELU_LIPSCHITZ * e_pre + 8 * u_c * (xp.abs(pre) + e_pre)
        tol["out"] = e_y + 0.5 * ulp(out_dtype, xp.abs(gelu_out) + e_y)
    return tol
