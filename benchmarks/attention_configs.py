"""Time the triton flash attention's block configs on a GPU (picks ``_GPU`` in
tealite/backends/triton/attention.py).

    python benchmarks/attention_configs.py [--shape 8,4096,32,32,128] [--causal]

Forward configs are timed alone; backward dK/dV configs with the dQ config of the table and
dQ configs with the table's dK/dV config.  TFLOP/s in FlashAttention's convention.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tealite  # noqa: E402
from benchmarks import _timing as T  # noqa: E402
from tealite.backends.triton import attention as A  # noqa: E402

FWD = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 4),
       (128, 128, 8, 2), (64, 128, 4, 3), (128, 64, 8, 4), (128, 128, 8, 4), (128, 64, 4, 4)]
DKDV = [(32, 128, 4, 3), (32, 128, 8, 3), (64, 128, 8, 2), (64, 64, 4, 3), (32, 64, 4, 3),
        (64, 128, 8, 3), (32, 128, 4, 5), (64, 128, 8, 4), (32, 128, 8, 4)]
DQ = [(128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 3),
      (128, 64, 8, 2), (128, 32, 4, 5), (128, 64, 8, 4), (128, 32, 8, 4)]


def _sdpa_ms(q, k, v, do, causal: bool) -> dict:
    """The fastest torch SDPA kernels on the same (bshd) tensors: cuDNN and flash, forward
    and forward + backward minus forward (the rows the issue's targets compare against)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt, dot = (t.transpose(1, 2).detach() for t in (q, k, v, do))
    gqa = qt.shape[1] != kt.shape[1]
    out = {}
    for name, kind in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                       ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(kind):
                qr, kr, vr = (t.clone().requires_grad_() for t in (qt, kt, vt))
                fwd = _time(lambda: F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal,
                                                                   enable_gqa=gqa))
                o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, enable_gqa=gqa)
                both = _time(lambda: torch.autograd.grad(
                    F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal,
                                                   enable_gqa=gqa), (qr, kr, vr), dot))
                del o
                out[name] = (fwd, both - fwd)
        except Exception as exc:  # no kernel for this shape / build
            print(f"sdpa {name}: failed {type(exc).__name__}: {str(exc)[:100]}", flush=True)
    return out


def _time(fn, reps=10):
    return T.measure(fn, torch.device("cuda"), reps=reps, warmup=2).median_ms


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8,4096,32,32,128")
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args(argv)
    b, s, h, hk, d = (int(x) for x in args.shape.split(","))
    mask = "causal" if args.causal else "none"
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(sz, generator=g, device="cuda").to(torch.bfloat16)
                   for sz in ((b, s, h, d), (b, s, hk, d), (b, s, hk, d), (b, s, h, d)))
    flops = 4 * b * h * s * s * d / (2 if args.causal else 1)
    base = A.pick_blocks(d, d, torch.bfloat16)
    out, lse = tealite.attention_fwd(q, k, v, mask=mask, backend="triton")
    print(f"shape {args.shape} mask {mask}; table: {base}")
    for name, (fwd, bwd) in _sdpa_ms(q, k, v, do, args.causal).items():
        print(f"sdpa {name}: fwd {fwd:.3f} ms {flops / fwd / 1e9:.1f} TFLOP/s, "
              f"bwd {bwd:.3f} ms {2.5 * flops / bwd / 1e9:.1f} TFLOP/s", flush=True)
    for name, cands, make in (
            ("fwd", FWD, lambda c: A.AttentionBlocks(A.Blocks(*c), base.dkdv, base.dq)),
            ("dkdv", DKDV, lambda c: A.AttentionBlocks(base.fwd, A.Blocks(*c), base.dq)),
            ("dq", DQ, lambda c: A.AttentionBlocks(base.fwd, base.dkdv, A.Blocks(*c)))):
        for c in cands:
            with A.BLOCKS.override(forced=make(c)):
                try:
                    if name == "fwd":
                        ms = _time(lambda: tealite.attention_fwd(q, k, v, mask=mask,
                                                                 backend="triton"))
                        tf = flops / ms / 1e9
                    else:
                        ms = _time(lambda: tealite.attention_bwd(do, q, k, v, out, lse,
                                                                 mask=mask, backend="triton"))
                        tf = 2.5 * flops / ms / 1e9
                    print(f"{name} {c}: {ms:.3f} ms {tf:.1f} TFLOP/s", flush=True)
                except Exception as exc:  # out of shared memory, registers
                    print(f"{name} {c}: failed {type(exc).__name__}: {str(exc)[:120]}",
                          flush=True)


if __name__ == "__main__":
    main()
