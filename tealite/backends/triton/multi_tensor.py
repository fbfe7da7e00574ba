"""Multi-tensor apply in Triton: ONE launch per list for scale, the L2 norms and Adam
(semantics: tealite/ops/multi_tensor.py).

Like TE's ``multi_tensor_apply``, the host cuts every tensor into chunks of
``MTA_CHUNK_ELEMENTS`` (65536) and hands the kernel a device table: per chunk its tensor and its
first element, per tensor its element count and, per list, its address.  One program per chunk
reads its tensor's addresses from the table (an int64 turned into a typed pointer, the
grouped-GEMM idiom) and walks the chunk in tiles of ``BLOCK``.  Empty tensors have no chunk.

* scale: ``out = x * scale`` in fp32, one rounding into the output dtype; a program that saw a
  NaN / Inf (``x - x != 0``) stores 1 into the flag (racing stores of the same value).
* L2 norm: each program writes its chunk's fp32 sum of squares (and the flag when it is not
  finite, TE's L2NormFunctor); the per-tensor sums of the
  chunk partials (``index_add_``), their total and the square roots run as torch ops on the
  device, TE's "cleanup" step.  Any summation order: tiers/multi_tensor.py's gamma_n covers it.
* Adam: TE's element-wise update in fp32 with correctly rounded division and square root
  (``div_rn`` / ``sqrt_rn``; Triton's plain ``/`` is an approximate division on NVIDIA GPUs),
  so the declared numerics are plain fp32; the compiler may contract products and sums into
  FMAs, which the running error bound covers.

* SGD: apex / TE's element-wise step in fp32, one launch for grads, params, momenta and the
  optional low-precision model copy; a set flag is read by every program, which then skips.

* compute-scale: TE's rule per amax element with correctly rounded divisions (bit-exact):
  ``amax < epsilon`` lifts it (NaN stays NaN, as in TE's compare), ``fmax / amax`` then
  ``/ 2^margin``, an Inf quotient becomes FLT_MAX, amax 0 / NaN / Inf gives 1, force_pow2 clears
  the mantissa; scale_inv = 1 / scale.

bf16 tensors travel as int16 bit patterns through ``_io`` (the interpreter's bf16 conversions
are wrong).
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from tealite.backends._host_tables import device_table, device_table_of_array
from tealite.backends.triton import BACKEND, DEVICES, INTERPRET
from tealite.backends.triton._io import load_f32, store_f32
from tealite.formats import get_format
from tealite.training_types import MTA_CHUNK_ELEMENTS
from tealite.types import Op

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32}
# Elements per tile: a GPU program's registers; in the interpreter fewer, larger numpy steps.
BLOCK = 4096 if INTERPRET else 1024
_ELT = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.int16}


def _numels(tensors) -> np.ndarray:
    return np.fromiter(map(torch.Tensor.numel, tensors), dtype=np.int64, count=len(tensors))


def chunk_table(tensors, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chunk -> tensor index int32, chunk -> first element int64, tensor -> numel int64),
    a function of the element counts alone: cached on them (an optimizer's list has the same
    counts step after step), so a repeated list costs one pass over ``numel``."""
    numels = _numels(tensors)
    return _chunk_tables(numels.tobytes(), str(torch.device(device)))


@functools.lru_cache(maxsize=256)
def _chunk_tables(raw_numels: bytes, device: str):
    numels = np.frombuffer(raw_numels, dtype=np.int64)
    per = -(-numels // MTA_CHUNK_ELEMENTS)  # chunks per tensor; an empty tensor has none
    owner = np.repeat(np.arange(numels.size, dtype=np.int64), per)
    before = np.repeat(np.cumsum(per) - per, per)  # chunks of the tensors before the owner
    start = (np.arange(owner.size, dtype=np.int64) - before) * MTA_CHUNK_ELEMENTS
    return (device_table_of_array(owner, torch.int32, device),
            device_table_of_array(start, torch.int64, device),
            device_table_of_array(numels, torch.int64, device))


def _params(values, device) -> torch.Tensor:
    """A kernel's scalar parameters as a cached fp32 device vector (each rounded to fp32 once,
    as a float kernel argument would be)."""
    return device_table(values, torch.float32, device)


def address_tables(lists, device) -> tuple[tuple[torch.Tensor, ...], bool]:
    """Each list's address table (the tensors' data addresses: contiguous storage is required,
    see _contiguous), and whether every address is a multiple of 16 bytes (fresh
    allocations are; a view into the middle of a storage may not be): the kernels'
    vector-access hint ``ALIGNED`` is then true.  One C-level pass over ``data_ptr`` per list
    into an int64 array; the alignment is one OR over all of them."""
    ptrs = [np.fromiter(map(torch.Tensor.data_ptr, lst), dtype=np.int64, count=len(lst))
            for lst in lists]
    aligned = not any(int(np.bitwise_or.reduce(p)) & 15 for p in ptrs if p.size)
    return tuple(device_table_of_array(p, torch.int64, device) for p in ptrs), aligned


def _contiguous(tensors) -> None:
    if all(map(torch.Tensor.is_contiguous, tensors)):
        return
    bad = [i for i, t in enumerate(tensors) if not t.is_contiguous()]
    raise ValueError(f"the Triton multi-tensor kernels address tensors as flat storage: "
                     f"tensor {bad[0]} is not contiguous")


@triton.jit
def _chunk(chunk_owner, chunk_first, numels, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """The program's tensor, its chunk [first, end) and ``full``, where the chunk's whole
    BLOCKs end.  Chunk starts are multiples of CHUNK (chunk_table), which the compiler is told:
    with that and unmasked full blocks, loads and stores vectorise (a mask against a loaded
    bound has no known alignment and would keep every access scalar: 10 % of copy bandwidth
    on an H100 before this split)."""
    c = tl.program_id(0)
    t = tl.load(chunk_owner + c)
    first = tl.multiple_of(tl.load(chunk_first + c), CHUNK)
    end = tl.minimum(first + CHUNK, tl.load(numels + t))
    full = first + (end - first) // BLOCK * BLOCK
    return t, first, full, end


@triton.jit
def _ptr(addr_table, t, T: tl.constexpr, ALIGNED: tl.constexpr):
    """Tensor t's typed pointer from a list's address table; ALIGNED (every address of the
    call a multiple of 16 bytes, checked on the host) lets the accesses use 16-byte vectors."""
    ptr = tl.load(addr_table + t).to(tl.pointer_type(T))
    if ALIGNED:
        ptr = tl.multiple_of(ptr, 16)
    return ptr


@triton.jit
def _all(BLOCK: tl.constexpr):
    return tl.full((BLOCK,), 1, tl.int1)


@triton.jit
def _scale_block(x_ptr, y_ptr, o, mask, scale, X_BF16: tl.constexpr, Y_BF16: tl.constexpr):
    x = load_f32(x_ptr, o, mask, X_BF16)
    store_f32(y_ptr, o, x * scale, mask, Y_BF16)
    return ((x - x) != 0).to(tl.int32)  # NaN for NaN and +-Inf, 0 otherwise


@triton.jit
def _scale_kernel(chunk_owner, chunk_first, numels, x_addr, y_addr, flag_ptr, scale_ptr,
                  X_T: tl.constexpr, X_BF16: tl.constexpr, Y_T: tl.constexpr,
                  Y_BF16: tl.constexpr, ALIGNED: tl.constexpr, CHUNK: tl.constexpr,
                  BLOCK: tl.constexpr):
    t, first, full, end = _chunk(chunk_owner, chunk_first, numels, CHUNK, BLOCK)
    x_ptr = _ptr(x_addr, t, X_T, ALIGNED)
    y_ptr = _ptr(y_addr, t, Y_T, ALIGNED)
    scale = tl.load(scale_ptr)  # fp32 on every target (see _adam_kernel)
    bad = tl.zeros((BLOCK,), tl.int32)
    for off in range(first, full, BLOCK):
        bad += _scale_block(x_ptr, y_ptr, off + tl.arange(0, BLOCK), _all(BLOCK), scale,
                            X_BF16, Y_BF16)
    for off in range(full, end, BLOCK):
        o = off + tl.arange(0, BLOCK)
        bad += _scale_block(x_ptr, y_ptr, o, o < end, scale, X_BF16, Y_BF16)
    if tl.sum(bad, axis=0) > 0:
        tl.store(flag_ptr, 1)


@triton.jit
def _sq_block(x_ptr, o, mask, inv_scale_ptr, X_BF16: tl.constexpr, UNSCALE: tl.constexpr):
    x = load_f32(x_ptr, o, mask, X_BF16)
    if UNSCALE:
        x = x * tl.load(inv_scale_ptr)
    return x * x


@triton.jit
def _sumsq_kernel(chunk_owner, chunk_first, numels, x_addr, inv_scale_ptr, partial_ptr, flag_ptr,
                  X_T: tl.constexpr, X_BF16: tl.constexpr, UNSCALE: tl.constexpr,
                  ALIGNED: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    t, first, full, end = _chunk(chunk_owner, chunk_first, numels, CHUNK, BLOCK)
    x_ptr = _ptr(x_addr, t, X_T, ALIGNED)
    acc = tl.zeros((BLOCK,), tl.float32)
    for off in range(first, full, BLOCK):
        acc += _sq_block(x_ptr, off + tl.arange(0, BLOCK), _all(BLOCK), inv_scale_ptr, X_BF16,
                         UNSCALE)
    for off in range(full, end, BLOCK):
        o = off + tl.arange(0, BLOCK)
        acc += _sq_block(x_ptr, o, o < end, inv_scale_ptr, X_BF16, UNSCALE)
    total = tl.sum(acc, axis=0)
    tl.store(partial_ptr + tl.program_id(0), total)
    if (total - total) != 0:  # NaN / Inf chunk: TE's blind racing write of the flag
        tl.store(flag_ptr, 1)


@triton.jit
def _adam_block(g_ptr, p_ptr, m_ptr, v_ptr, w_ptr, o, mask, lr, beta1, beta2, eps, wd, bc1, bc2,
                G_BF16: tl.constexpr, P_BF16: tl.constexpr, HAS_MASTER: tl.constexpr,
                ADAM_W: tl.constexpr):
    g = load_f32(g_ptr, o, mask, G_BF16)
    if HAS_MASTER:
        p = tl.load(w_ptr + o, mask=mask, other=0.0)
    else:
        p = load_f32(p_ptr, o, mask, P_BF16)
    m = tl.load(m_ptr + o, mask=mask, other=0.0)
    v = tl.load(v_ptr + o, mask=mask, other=0.0)
    if ADAM_W == 0:
        g = g + wd * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * (g * g)
    denom = tl.sqrt_rn(tl.div_rn(v, bc2)) + eps
    update = tl.div_rn(tl.div_rn(m, bc1), denom)
    if ADAM_W == 1:
        update = update + wd * p
    p = p - lr * update
    tl.store(m_ptr + o, m, mask=mask)
    tl.store(v_ptr + o, v, mask=mask)
    if HAS_MASTER:
        tl.store(w_ptr + o, p, mask=mask)
    store_f32(p_ptr, o, p, mask, P_BF16)


@triton.jit
def _adam_kernel(chunk_owner, chunk_first, numels, g_addr, p_addr, m_addr, v_addr, w_addr,
                 hp_ptr,
                 G_T: tl.constexpr, G_BF16: tl.constexpr, P_T: tl.constexpr,
                 P_BF16: tl.constexpr, HAS_MASTER: tl.constexpr, ADAM_W: tl.constexpr,
                 ALIGNED: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    t, first, full, end = _chunk(chunk_owner, chunk_first, numels, CHUNK, BLOCK)
    # The fp32 hyper-parameters from a device table (lr, beta1, beta2, eps, wd, bc1, bc2):
    # fp32 on every target (the interpreter would hand float arguments over as Python floats,
    # computed in float64), and no recompilation per value.
    lr, beta1, beta2 = tl.load(hp_ptr), tl.load(hp_ptr + 1), tl.load(hp_ptr + 2)
    eps, wd = tl.load(hp_ptr + 3), tl.load(hp_ptr + 4)
    bc1, bc2 = tl.load(hp_ptr + 5), tl.load(hp_ptr + 6)
    g_ptr = _ptr(g_addr, t, G_T, ALIGNED)
    p_ptr = _ptr(p_addr, t, P_T, ALIGNED)
    m_ptr = _ptr(m_addr, t, tl.float32, ALIGNED)
    v_ptr = _ptr(v_addr, t, tl.float32, ALIGNED)
    w_ptr = _ptr(w_addr, t, tl.float32, ALIGNED)
    for off in range(first, full, BLOCK):
        _adam_block(g_ptr, p_ptr, m_ptr, v_ptr, w_ptr, off + tl.arange(0, BLOCK), _all(BLOCK),
                    lr, beta1, beta2, eps, wd, bc1, bc2, G_BF16, P_BF16, HAS_MASTER, ADAM_W)
    for off in range(full, end, BLOCK):
        o = off + tl.arange(0, BLOCK)
        _adam_block(g_ptr, p_ptr, m_ptr, v_ptr, w_ptr, o, o < end,
                    lr, beta1, beta2, eps, wd, bc1, bc2, G_BF16, P_BF16, HAS_MASTER, ADAM_W)


def _device(tensors):
    return tensors[0].device if tensors else torch.device("cpu")


@BACKEND.implements(Op.MULTI_TENSOR_SCALE, dtypes=FLOATS, devices=DEVICES, numerics=_NUMERICS)
def multi_tensor_scale(tensors, scale, *, out_dtype, noop_flag):
    outs = tuple(torch.empty(t.shape, dtype=out_dtype, device=t.device) for t in tensors)
    _contiguous(tensors)
    owner, first, numels = chunk_table(tensors, _device(tensors))
    if owner.numel():
        dev = _device(tensors)
        (x_addr, y_addr), aligned = address_tables((tensors, outs), dev)
        _scale_kernel[(owner.numel(),)](
            owner, first, numels, x_addr, y_addr,
            noop_flag, _params([scale], dev), X_T=_ELT[tensors[0].dtype],
            X_BF16=tensors[0].dtype == torch.bfloat16, Y_T=_ELT[out_dtype],
            Y_BF16=out_dtype == torch.bfloat16, ALIGNED=aligned,
            CHUNK=MTA_CHUNK_ELEMENTS, BLOCK=BLOCK)
    return outs


def _l2norm(tensors, *, per_tensor, inv_scale, noop_flag):
    dev = _device(tensors)
    _contiguous(tensors)
    owner, first, numels = chunk_table(tensors, dev)
    partial = torch.zeros(owner.numel(), dtype=torch.float32, device=dev)
    if owner.numel():
        (x_addr,), aligned = address_tables((tensors,), dev)
        _sumsq_kernel[(owner.numel(),)](
            owner, first, numels, x_addr,
            inv_scale if inv_scale is not None else partial, partial, noop_flag,
            X_T=_ELT[tensors[0].dtype], X_BF16=tensors[0].dtype == torch.bfloat16,
            UNSCALE=inv_scale is not None, ALIGNED=aligned,
            CHUNK=MTA_CHUNK_ELEMENTS, BLOCK=BLOCK)
    sums = torch.zeros(len(tensors), dtype=torch.float32, device=dev)
    sums.index_add_(0, owner.long(), partial)
    total = torch.sqrt(sums.sum(dtype=torch.float32)).reshape(1)
    return total, (torch.sqrt(sums) if per_tensor else None)


BACKEND.implements(Op.MULTI_TENSOR_L2NORM, dtypes=FLOATS, devices=DEVICES,
                   numerics=_NUMERICS)(_l2norm)
BACKEND.implements(Op.MULTI_TENSOR_UNSCALE_L2NORM, dtypes=FLOATS, devices=DEVICES,
                   numerics=_NUMERICS)(_l2norm)


def _bias_corrections(o) -> tuple[float, float]:
    """TE forms them on the host in double from the float32 betas."""
    if not o.bias_correction:
        return 1.0, 1.0
    b1 = float(torch.tensor(o.beta1, dtype=torch.float32))
    b2 = float(torch.tensor(o.beta2, dtype=torch.float32))
    return 1.0 - b1 ** o.step, 1.0 - b2 ** o.step


def _adam_why_not(params) -> str | None:
    if params["state_dtype"] != torch.float32:
        return (f"exp_avgs / exp_avg_sqs in {params['state_dtype']}: the fused Adam kernel keeps "
                f"m and v in float32 (TE's default); low-precision states run on torch")
    return None


@BACKEND.implements(Op.MULTI_TENSOR_ADAM, dtypes=FLOATS, devices=DEVICES, numerics=_NUMERICS,
                    check=_adam_why_not)
def multi_tensor_adam(grads, params, exp_avgs, exp_avg_sqs, options, *, master_params):
    dev = _device(params)
    lists = (grads, params, exp_avgs, exp_avg_sqs) + ((master_params,) if master_params is not None else ())
    for lst in lists:
        _contiguous(lst)
    owner, first, numels = chunk_table(params, dev)
    if not owner.numel():
        return
    bc1, bc2 = _bias_corrections(options)
    tables, aligned = address_tables(lists, dev)
    g_addr, p_addr, m_addr, v_addr = tables[:4]
    w_addr = tables[4] if master_params is not None else p_addr
    _adam_kernel[(owner.numel(),)](
        owner, first, numels, g_addr, p_addr, m_addr, v_addr, w_addr,
        _params([options.lr, options.beta1, options.beta2, options.eps, options.weight_decay,
                 bc1, bc2], dev),
        G_T=_ELT[grads[0].dtype], G_BF16=grads[0].dtype == torch.bfloat16,
        P_T=_ELT[params[0].dtype], P_BF16=params[0].dtype == torch.bfloat16,
        HAS_MASTER=master_params is not None, ADAM_W=int(options.adam_w_mode),
        ALIGNED=aligned, CHUNK=MTA_CHUNK_ELEMENTS, BLOCK=BLOCK)


@triton.jit
def _sgd_block(g_ptr, w_ptr, mom_ptr, c_ptr, o, mask, lr, mu, damp, wd, scale,
               G_BF16: tl.constexpr, W_BF16: tl.constexpr, C_BF16: tl.constexpr,
               HAS_COPY: tl.constexpr, HAS_WD: tl.constexpr, HAS_MOMENTUM: tl.constexpr,
               WD_AFTER: tl.constexpr, NESTEROV: tl.constexpr, FIRST_RUN: tl.constexpr):
    g = load_f32(g_ptr, o, mask, G_BF16) * scale
    w = load_f32(w_ptr, o, mask, W_BF16)
    if HAS_WD:
        if WD_AFTER == 0:
            g = g + wd * w
    if HAS_MOMENTUM:
        if FIRST_RUN:
            mom = g
        else:
            mom = mu * load_f32(mom_ptr, o, mask, W_BF16) + (1.0 - damp) * g
        store_f32(mom_ptr, o, mom, mask, W_BF16)
        if NESTEROV:
            g = g + mu * mom
        else:
            g = mom
    if HAS_WD:
        if WD_AFTER == 1:
            g = g + wd * w
    w = w - lr * g
    store_f32(w_ptr, o, w, mask, W_BF16)
    if HAS_COPY:
        store_f32(c_ptr, o, w, mask, C_BF16)


@triton.jit
def _sgd_kernel(chunk_owner, chunk_first, numels, g_addr, w_addr, mom_addr, copy_addr, hp_ptr,
                flag_ptr, G_T: tl.constexpr, G_BF16: tl.constexpr, W_T: tl.constexpr,
                W_BF16: tl.constexpr, C_T: tl.constexpr, C_BF16: tl.constexpr,
                HAS_COPY: tl.constexpr, HAS_WD: tl.constexpr, HAS_MOMENTUM: tl.constexpr,
                WD_AFTER: tl.constexpr, NESTEROV: tl.constexpr, FIRST_RUN: tl.constexpr,
                ALIGNED: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    t, first, full, end = _chunk(chunk_owner, chunk_first, numels, CHUNK, BLOCK)
    # fp32 hyper-parameters from a device table (see _adam_kernel): lr, momentum, dampening,
    # weight decay, gradient scale.
    lr, mu, damp = tl.load(hp_ptr), tl.load(hp_ptr + 1), tl.load(hp_ptr + 2)
    wd, scale = tl.load(hp_ptr + 3), tl.load(hp_ptr + 4)
    g_ptr = _ptr(g_addr, t, G_T, ALIGNED)
    w_ptr = _ptr(w_addr, t, W_T, ALIGNED)
    mom_ptr = _ptr(mom_addr, t, W_T, ALIGNED)
    c_ptr = _ptr(copy_addr, t, C_T, ALIGNED)
    if tl.load(flag_ptr) == 0:  # a set flag (an overflow upstream) skips the step
        for off in range(first, full, BLOCK):
            _sgd_block(g_ptr, w_ptr, mom_ptr, c_ptr, off + tl.arange(0, BLOCK), _all(BLOCK),
                       lr, mu, damp, wd, scale, G_BF16, W_BF16, C_BF16, HAS_COPY, HAS_WD,
                       HAS_MOMENTUM, WD_AFTER, NESTEROV, FIRST_RUN)
        for off in range(full, end, BLOCK):
            o = off + tl.arange(0, BLOCK)
            _sgd_block(g_ptr, w_ptr, mom_ptr, c_ptr, o, o < end,
                       lr, mu, damp, wd, scale, G_BF16, W_BF16, C_BF16, HAS_COPY, HAS_WD,
                       HAS_MOMENTUM, WD_AFTER, NESTEROV, FIRST_RUN)


@BACKEND.implements(Op.MULTI_TENSOR_SGD, dtypes=FLOATS, devices=DEVICES, numerics=_NUMERICS)
def multi_tensor_sgd(grads, params, momenta, options, *, model_params, noop_flag):
    dev = _device(params)
    lists = (grads, params, momenta) + ((model_params,) if model_params is not None else ())
    for lst in lists:
        _contiguous(lst)
    owner, first, numels = chunk_table(params, dev)
    if not owner.numel():
        return
    o = options
    copies = model_params if model_params is not None else params
    (g_addr, w_addr, mom_addr, c_addr), aligned = address_tables(
        (grads, params, momenta, copies), dev)
    _sgd_kernel[(owner.numel(),)](
        owner, first, numels, g_addr, w_addr, mom_addr, c_addr,
        _params([o.lr, o.momentum, o.dampening, o.weight_decay, o.scale], dev), noop_flag,
        G_T=_ELT[grads[0].dtype], G_BF16=grads[0].dtype == torch.bfloat16,
        W_T=_ELT[params[0].dtype], W_BF16=params[0].dtype == torch.bfloat16,
        C_T=_ELT[copies[0].dtype], C_BF16=copies[0].dtype == torch.bfloat16,
        HAS_COPY=model_params is not None, HAS_WD=o.weight_decay != 0,
        HAS_MOMENTUM=o.momentum != 0, WD_AFTER=int(o.wd_after_momentum),
        NESTEROV=bool(o.nesterov), FIRST_RUN=bool(o.first_run), ALIGNED=aligned,
        CHUNK=MTA_CHUNK_ELEMENTS, BLOCK=BLOCK)


@triton.jit
def _compute_scale_kernel(chunk_owner, chunk_first, numels, amax_addr, scale_addr, inv_addr,
                          hp_ptr, FORCE_POW2: tl.constexpr, CHUNK: tl.constexpr,
                          BLOCK: tl.constexpr):
    t, first, _, end = _chunk(chunk_owner, chunk_first, numels, CHUNK, BLOCK)
    fmax, pow2_margin, eps = tl.load(hp_ptr), tl.load(hp_ptr + 1), tl.load(hp_ptr + 2)
    a_ptr = tl.load(amax_addr + t).to(tl.pointer_type(tl.float32))
    s_ptr = tl.load(scale_addr + t).to(tl.pointer_type(tl.float32))
    i_ptr = tl.load(inv_addr + t).to(tl.pointer_type(tl.float32))
    for off in range(first, end, BLOCK):
        o = off + tl.arange(0, BLOCK)
        mask = o < end
        a = tl.load(a_ptr + o, mask=mask, other=1.0)
        a = tl.where(a < eps, eps, a)
        s = tl.div_rn(tl.div_rn(fmax, a), pow2_margin)
        s = tl.where(s == float("inf"), 3.4028234663852886e38, s)
        s = tl.where((a == 0) | ((a - a) != 0), 1.0, s)
        if FORCE_POW2:
            s = (s.to(tl.int32, bitcast=True) & -8388608).to(tl.float32, bitcast=True)
        tl.store(s_ptr + o, s, mask=mask)
        tl.store(i_ptr + o, tl.div_rn(tl.full(s.shape, 1.0, tl.float32), s), mask=mask)


@BACKEND.implements(Op.MULTI_TENSOR_COMPUTE_SCALE, dtypes=(torch.float32,), devices=DEVICES,
                    numerics=_NUMERICS)
def multi_tensor_compute_scale(amaxes, fmt, *, margin, force_pow2, epsilon):
    dev = _device(amaxes)
    _contiguous(amaxes)
    scales = tuple(torch.empty_like(a) for a in amaxes)
    invs = tuple(torch.empty_like(a) for a in amaxes)
    owner, first, numels = chunk_table(amaxes, dev)
    if owner.numel():
        _compute_scale_kernel[(owner.numel(),)](
            owner, first, numels, *address_tables((amaxes, scales, invs), dev)[0],
            _params([get_format(fmt).max, 2.0 ** margin, epsilon], dev),
            FORCE_POW2=bool(force_pow2), CHUNK=MTA_CHUNK_ELEMENTS, BLOCK=BLOCK)
    return scales, invs
