"""Specs for dot-product attention forward and backward (tealite/attention_types.py).

Cases (strategies/attention.py) cover every layout x mask pair the contract allows, windows,
bias / ALiBi, GQA / MQA, d_qk != d_v, empty and one-token sequences.  The reference is
references/attention.py and the tier tiers/attention.py (its bounds derived from the
backend's declared numerics).  The backward's ``out`` / ``lse`` inputs are the reference
forward's, rounded to q's dtype and to fp32, as a backend's forward would hand them over.
Beside the bound, ``same_precision`` is the FlashAttention-style second signal: the same
computation through plain torch in the input dtype (matmuls and softmax in bf16 / fp16),
shown as err/err(torch) by ``repro`` / ``fuzz`` / ``run`` with ``--probabilistic``.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np
import torch

import tealite
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import _device as reference_device
from tealite_verify.references import attention as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.attention import BIASES, LAYOUTS, MASKS, cases
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import attention as tier
from tealite_verify.tiers import probabilistic
from tealite_verify.tiers.metrics import Tier

F32 = torch.float32


# ---- the case's structure ------------------------------------------------------------------

def _cumsum(xs) -> list[int]:
    return [0] + list(itertools.accumulate(xs))


def _slots(case, side: str) -> list[int]:
    lens, pad = case[f"lens_{side}"], case[f"pad_{side}"]
    return [n + p for n, p in zip(lens, pad)] if pad is not None else list(lens)


def scale_of(case) -> float:
    return case["scale"] if case["scale"] is not None else 1.0 / float(np.sqrt(case["d_qk"]))


def window_of(case) -> tuple[int, int]:
    """The case's window as the front-end takes it (a causal mask's right side is 0)."""
    left, right = case["window"]
    return (left, min(right, 0)) if "causal" in case["mask"] else (left, right)


def structure(case) -> ref.Structure:
    thd, padded = case["layout"] == "thd", case["mask"].startswith("padding")
    lens_q = tuple(case["lens_q"]) if thd or padded else None
    lens_kv = tuple(case["lens_kv"]) if thd or padded else None
    offs = (tuple(_cumsum(_slots(case, "q"))[:-1]), tuple(_cumsum(_slots(case, "kv"))[:-1])) \
        if thd else (None, None)
    return ref.Structure(case["layout"], case["mask"], scale_of(case), window_of(case),
                         lens_q, lens_kv, *offs)


def _shape(case, side: str, heads: int, d: int) -> tuple[int, ...]:
    if case["layout"] == "thd":
        return (sum(_slots(case, side)), heads, d)
    s = case["sq"] if side == "q" else case["sk"]
    return (case["batch"], s, heads, d) if case["layout"] == "bshd" else (s, case["batch"],
                                                                            heads, d)


def _int32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


# ---- inputs --------------------------------------------------------------------------------

def _bias(case, device, seed):
    b = case["batch"] if case["bias_batch"] else 1
    h = case["heads_q"] if case["bias_heads"] else 1
    bias = generate({"kind": "normal", "scale": 2.0}, (b, h, case["sq"], case["sk"]),
                    torch.float64, seed)
    if case["bias"] == "post_scale_inf":
        hide = generate({"kind": "uniform", "lo": 0.0, "hi": 1.0}, bias.shape, torch.float64,
                        seed + 1) < 0.25
        bias = bias.masked_fill(hide, float("-inf"))
        if case["sq"] > 0:
            bias[..., case["sq"] // 2, :] = float("-inf")    # a fully hidden row
    return bias.to(dtype_of(case["bias_dtype"])).to(device)


def _alibi(case, device):
    """ALiBi's geometric slopes 2^(-8 i / h) (Press et al.), per head; per batch row too
    when bias_batch."""
    h = case["heads_q"]
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], dtype=F32)
    if case["bias_batch"]:
        slopes = torch.stack([slopes * (1 + i) for i in range(case["batch"])])
    return slopes.to(device)


def _forward_inputs(case, device):
    dt, s = dtype_of(case["dtype"]), case["seed"]
    hq, hk = case["heads_q"], case["heads_kv"]
    x = {"q": generate(case["dist_q"], _shape(case, "q", hq, case["d_qk"]), dt, s, device),
         "k": generate(case["dist_k"], _shape(case, "kv", hk, case["d_qk"]), dt, s + 1, device),
         "v": generate(case["dist_v"], _shape(case, "kv", hk, case["d_v"]), dt, s + 2, device)}
    if case["bias"] in ("post_scale", "post_scale_inf"):
        x["bias"] = _bias(case, device, s + 3)
    elif case["bias"] == "alibi":
        x["alibi_slopes"] = _alibi(case, device)
    if case["layout"] == "thd":
        x["cu_seqlens_q"] = _int32(_cumsum(case["lens_q"]), device)
        x["cu_seqlens_kv"] = _int32(_cumsum(case["lens_kv"]), device)
        if case["pad_q"] is not None:
            x["cu_seqlens_q_padded"] = _int32(_cumsum(_slots(case, "q")), device)
            x["cu_seqlens_kv_padded"] = _int32(_cumsum(_slots(case, "kv")), device)
    elif case["mask"].startswith("padding"):
        x["seqlens_q"] = _int32(case["lens_q"], device)
        x["seqlens_kv"] = _int32(case["lens_kv"], device)
    return x


def _f64(t):
    return t.detach().to("cpu", torch.float64).numpy() if t is not None else None


def _backward_inputs(case, device, operands=None):
    """dout, plus out / lse of the reference forward rounded as a backend would return them;
    ``operands`` maps the float64 q, k, v first (the FP8 recipe: their dequantized values,
    which that recipe's forward would have attended over)."""
    x = _forward_inputs(case, device)
    q, k, v = (_f64(x[n]) for n in ("q", "k", "v"))
    if operands is not None:
        q, k, v = (operands(t) for t in (q, k, v))
    # On a GPU case the float64 forward runs there (references._device): numpy in and out.
    with reference_device.reference_device(reference_device.for_case(device)):
        out, lse = ref.attention_fwd(q, k, v, structure(case),
                                     bias=_f64(x.get("bias")),
                                     alibi=_f64(x.get("alibi_slopes")))
    dt = dtype_of(case["dtype"])
    x["out"] = torch.from_numpy(out).to(dt).to(device)
    x["lse"] = torch.from_numpy(lse).to(F32).to(device)
    x["dout"] = generate(case["dist_dout"], tuple(out.shape), dt, case["seed"] + 4, device)
    return x


# ---- calls ---------------------------------------------------------------------------------

_KEYWORDS = ("bias", "alibi_slopes", "seqlens_q", "seqlens_kv", "cu_seqlens_q",
             "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")


def _keywords(inputs, case, backend):
    kw = {k: inputs[k] for k in _KEYWORDS if k in inputs}
    return dict(kw, layout=case["layout"], mask=case["mask"], window=window_of(case),
                softmax_scale=case["scale"], backend=backend)


def fwd_call(inputs, case, backend):
    return tealite.attention_fwd(inputs["q"], inputs["k"], inputs["v"],
                                 **_keywords(inputs, case, backend))._asdict()


def bwd_call(inputs, case, backend):
    return tealite.attention_bwd(inputs["dout"], inputs["q"], inputs["k"], inputs["v"],
                                 inputs["out"], inputs["lse"],
                                 **_keywords(inputs, case, backend))._asdict()


# ---- references ----------------------------------------------------------------------------

def _slopes(x):
    return x.get("alibi_slopes")


def _prob_gamma(p_case: float, events: int):
    """Higham-Mary's gamma~ for ``events`` bounded reductions at false-alarm ``p_case``."""
    lam = probabilistic.lambda_for(p_case, max(events, 1), 2.0 ** -24)
    return probabilistic.accumulation_gamma(lam)


def _events(x, case) -> int:
    return int(np.prod(x["q"].shape)) * (max(case["sk"], case["sq"], 1) + 1)


def fwd_reference(x, case, code_floors=None):
    """``code_floors`` (tiers.attention.CodeFloors): x's q, k, v are dequantized FP8 codes."""
    st = structure(case)
    out, lse = ref.attention_fwd(x["q"], x["k"], x["v"], st, bias=x.get("bias"),
                                 alibi=_slopes(x))
    dt = dtype_of(case["dtype"])

    @functools.cache
    def bounds(numerics, p_case=None):
        acc = tier.gamma if p_case is None else _prob_gamma(p_case, _events(x, case))
        return tier.forward_tolerances(x["q"], x["k"], x["v"], st, numerics, dt,
                                       bias=x.get("bias"), alibi=_slopes(x),
                                       accumulation_gamma=acc, code_floors=code_floors)

    baseline = functools.cache(lambda: same_precision_fwd(x, case))
    return {name: Expected(value, out_dt, Tier.ATTENTION, lambda n, i=i: bounds(n)[i],
                           prob_bound=lambda n, p, i=i: bounds(n, p)[i],
                           same_precision=lambda i=i: baseline()[i])
            for i, (name, value, out_dt) in enumerate((("out", out, dt), ("lse", lse, F32)))}


def bwd_reference(x, case, code_floors=None):
    """``code_floors`` (tiers.attention.CodeFloors): x's dout, q, k, v are dequantized FP8
    codes (tiers/attention.py, "FP8")."""
    st = structure(case)
    kw = dict(bias=x.get("bias"), alibi=_slopes(x))
    grads = ref.attention_bwd(x["dout"], x["q"], x["k"], x["v"], st, **kw)
    dt = dtype_of(case["dtype"])

    @functools.cache
    def bounds(numerics, p_case=None):
        acc = tier.gamma if p_case is None else _prob_gamma(p_case, _events(x, case))
        return tier.backward_tolerances(x["dout"], x["q"], x["k"], x["v"], x["out"], x["lse"],
                                        st, numerics, grads, dt, accumulation_gamma=acc,
                                        code_floors=code_floors, **kw)

    baseline = functools.cache(lambda: same_precision_bwd(x, case))
    return {name: Expected(value, dt, Tier.ATTENTION, lambda n, i=i: bounds(n)[i],
                           prob_bound=lambda n, p, i=i: bounds(n, p)[i],
                           same_precision=lambda i=i: baseline()[i])
            for i, (name, value) in enumerate(zip(("dq", "dk", "dv"), grads))}


# ---- the same computation in the input precision (FlashAttention's test baseline) ----------

def _torch_inputs(x, case):
    device = reference_device.current() or "cpu"
    dt = dtype_of(case["dtype"])

    def t(name, d=dt):
        v = x.get(name)
        if v is None:
            return None
        return (v if isinstance(v, torch.Tensor) else torch.from_numpy(v)).to(device, d)

    bias = t("bias", dtype_of(case["bias_dtype"])) if "bias" in x else None
    return t, bias, t("alibi_slopes", torch.float64) if "alibi_slopes" in x else None


def _low_precision(q, k, v, st, bias, alibi):
    """(out, lse) through plain torch in q's dtype, per sequence (masks from the reference's
    key intervals): matmuls, softmax and logsumexp in the input dtype."""
    out = torch.zeros(tuple(q.shape[:-1]) + (v.shape[-1],), dtype=q.dtype, device=q.device)
    lse_parts, ov = [], ref.bshd_view(out, st.layout)
    qv, kv, vv = (ref.bshd_view(a, st.layout) for a in (q, k, v))
    group = q.shape[-2] // max(k.shape[-2], 1)
    for span in ref.spans(st, q.shape, k.shape):
        qh = qv[span.q_rows(0, span.lq)].transpose(0, 1)
        kh = kv[span.kv_rows()].transpose(0, 1).repeat_interleave(group, 0)
        vh = vv[span.kv_rows()].transpose(0, 1).repeat_interleave(group, 0)
        s = torch.matmul(qh, kh.transpose(-1, -2)) * st.scale
        lo, hi = ref.key_interval(st, span.lq, span.lk, 0, span.lq)
        cols = np.arange(span.lk)[None, :]
        hidden = torch.as_tensor(~((cols >= lo[:, None]) & (cols <= hi[:, None])),
                                 device=q.device)
        extra = ref.bias_block(ref.ops_of(qh.double()), bias, alibi, span, 0, span.lq)
        if extra is not None:
            s = s + extra.to(q.dtype)
        s = s.masked_fill(hidden, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        ov[span.q_rows(0, span.lq)] = torch.matmul(p, vh).transpose(0, 1)
        lse_parts.append((span, torch.logsumexp(s, dim=-1)))
    return out, lse_parts


def same_precision_fwd(x, case):
    """(out, lse) of the same computation through plain torch in the input dtype (float64)."""
    t, bias, alibi = _torch_inputs(x, case)
    st = structure(case)
    out, parts = _low_precision(t("q"), t("k"), t("v"), st, bias, alibi)
    lse = np.full(ref.lse_shape(tuple(out.shape), st.layout), -np.inf)
    for span, part in parts:
        lse[span.lse_rows(0, span.lq)] = part.double().cpu().numpy()
    return out.double().cpu().numpy(), lse


def same_precision_bwd(x, case):
    """(dq, dk, dv) by autograd through the same low-precision torch computation."""
    t, bias, alibi = _torch_inputs(x, case)
    q, k, v = (t(n).requires_grad_() for n in ("q", "k", "v"))
    out, _ = _low_precision(q, k, v, structure(case), bias, alibi)
    if out.numel():
        out.backward(t("dout"))
    return tuple((g.grad if g.grad is not None else torch.zeros_like(g)).double().cpu().numpy()
                 for g in (q, k, v))


# ---- registration --------------------------------------------------------------------------

def make_case(layout="bshd", mask="none", dtype="bfloat16", **kw):
    """An attention case with normal inputs; keyword arguments override any field."""
    case = {"layout": layout, "mask": mask, "dtype": dtype, "window": [-1, -1], "batch": 2,
            "sq": 13, "sk": 13, "lens_q": [13, 5], "lens_kv": [13, 0], "pad_q": None,
            "pad_kv": None, "heads_q": 4, "heads_kv": 2, "d_qk": 24, "d_v": 24, "scale": None,
            "bias": "none", "bias_batch": False, "bias_heads": True, "bias_dtype": "float32",
            "dist_q": {"kind": "normal", "scale": 1.0}, "dist_k": {"kind": "normal", "scale": 1.0},
            "dist_v": {"kind": "normal", "scale": 1.0},
            "dist_dout": {"kind": "normal", "scale": 1.0}, "seed": 11}
    case.update(kw)
    return case


_SMOKE = (
    make_case(),
    make_case("sbhd", "causal_bottom_right", "float16", sq=7, sk=19, heads_kv=1, d_v=16,
              window=[3, 0]),
    make_case("thd", "padding_causal", "float32", lens_q=[5, 0, 1], lens_kv=[7, 3, 1],
              pad_q=[2, 0, 1], pad_kv=[0, 1, 2], batch=3, d_qk=20, d_v=12),
    make_case("bshd", "padding", "bfloat16", sq=9, sk=17, lens_q=[9, 4], lens_kv=[0, 17],
              bias="post_scale_inf", scale=16.0),
    make_case("bshd", "causal", "bfloat16", sq=0, sk=5, lens_q=[0, 0], lens_kv=[5, 5],
              bias="alibi"),
    # Key blocks every query row sees whole, with no bias: the flash kernels' unmasked
    # interior path (at the interpreter's 16-key blocks, keys 0-31 here), which the cases
    # above never reach.  A per-score scale off by 0.1 % there passed the suite before.
    make_case("bshd", "none", "float32", sq=20, sk=37, lens_q=[20, 20], lens_kv=[37, 37],
              heads_q=2, heads_kv=1, d_qk=16, d_v=16),
    make_case("sbhd", "causal_bottom_right", "bfloat16", sq=18, sk=50, lens_q=[18, 18],
              lens_kv=[50, 50], d_qk=32, d_v=32),
)

_PAIRS = tuple((layout, mask) for layout in LAYOUTS for mask in MASKS
               if layout != "thd" or mask.startswith("padding"))
COVERAGE = (tuple(c for c in cov.product_cells(cov.layout_cells("layout", LAYOUTS),
                                               cov.layout_cells("mask", MASKS))
                  if tuple(c.label.split("+")) in _PAIRS)
            + cov.layout_cells("bias", BIASES))

for _name, _bwd, _make, _call, _ref in (
        (Op.ATTENTION_FWD, False, _forward_inputs, fwd_call, fwd_reference),
        (Op.ATTENTION_BWD, True, _backward_inputs, bwd_call, bwd_reference)):
    register(OpSpec(
        name=_name, family="attention", make_inputs=_make, call=_call, reference=_ref,
        cases=lambda dtype=None, size="ci", _bwd=_bwd: cases(dtype, size, bwd=_bwd),
        smoke_cases=_SMOKE, device_reference=True, coverage=COVERAGE))
