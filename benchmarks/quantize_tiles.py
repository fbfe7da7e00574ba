"""Sweep the launch parameters of the Triton quantize kernels on a CUDA GPU (standalone, no
pytest): ``python benchmarks/quantize_tiles.py [--m 16384 --k 8192] [--only mxfp4]``.

For each variant (FP8 per-tensor / per-row current scaling, Float8BlockScaling 1x128, MXFP8,
MXFP4; rowwise and cast-transpose; the amax pass alone) it times a few tile / warps choices
with ``triton.testing.do_bench`` (median) on a bf16 (M, K) input and prints the effective
bandwidth as a percentage of a measured device copy moving the same number of bytes
(``torch`` ``copy_``: read + write of half of them each).  Bytes = x read once + codes + scales
written.  Each config's outputs are checked bit for bit against the module's default config
(the first row of each variant, marked ``*``); a config that fails to compile or run, or
gives other bits, is reported and skipped.  Cast-transpose variants also sweep GROUP_M, the
tile order (``_codecs._tile_ids``: a 4th tuple entry or a ``GROUP_M`` key).
Defaults live in ``quantize.CONFIGS``,
``quantize_block._TILES`` and ``quantize_mx._TILES``: set them from the fastest correct rows.

``--variant`` (comma-separated, default ``default``) adds kernel variants (the modules'
``VARIANTS``), each a '+'-joined set of atoms: ``packed`` (cast-transpose codes moved as
32-bit words), ``arith`` (arithmetic E2M1 encoder), ``finite`` (MX encoders without the NaN
fix-ups no NaN can reach), ``pairs`` (MXFP4 rowwise and cast-transpose from 32-bit words of
two bf16, own tiles), ``cols`` (MX cast-transposes: whole columns per thread, own tiles);
a row takes the variants whose atoms it has, over their own tiles,
printed as ``NAME/VARIANT`` and checked bit for bit against the default kernel's outputs.
``--tiles N`` times only the first N tiles of each list.  The command of the cast-transpose
comparison is in docs/benchmarks.md.  ``fp8-delayed-ct`` is the per-tensor cast-transpose
with a given scale: the kernel alone, without current scaling's amax pass.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback

import torch


def _setup():
    if not torch.cuda.is_available():
        sys.exit("quantize_tiles.py needs a CUDA GPU")
    from tealite.backends.triton import _codecs, quantize as TQ, quantize_block as TQB
    from tealite.backends.triton import quantize_mx as TQMX
    return TQ, TQB, TQMX, _codecs


@contextlib.contextmanager
def _settings(table, settings):
    """Temporarily ``table.update(settings)`` (a module's kernel ``VARIANTS``; None: none)."""
    old = dict(table or {})
    if table is not None:
        table.update(settings)
    try:
        yield
    finally:
        if table is not None:
            table.clear()
            table.update(old)


@contextlib.contextmanager
def _override(table, key, value):
    """Temporarily set ``table[key] = value`` (a launch-parameter entry)."""
    old = table[key]
    table[key] = value
    try:
        yield
    finally:
        table[key] = old


# A kernel variant is a '+'-joined set of these atoms: {VARIANTS key: value} of the module
# ("pairs" names the bf16-pair MXFP4 kernels of both directions sets).
_ATOMS = {"packed": {"ct": "packed"}, "arith": {"e2m1": "arith"}, "finite": {"nan": "skip"},
          "pairs": {"row": "pairs", "ct": "pairs"}, "cols": {"row": "pairs", "ct": "cols"}}


def _kernel_variants(TQ, TQB, TQMX):
    """row name -> (the module's VARIANTS, the atoms it takes, own tiles, other tiles to try
    with the default table); own tiles: (table, key, [tiles]) of the "packed" kernel, or
    {atom: (table, key, [tiles])} of the atoms with a kernel of their own; first tile = the
    current entry."""
    mx_packed = (TQMX._PACKED_TILES, (True, True),
                 [(64, 64, 2), (32, 64, 2), (32, 128, 2), (64, 128, 4), (128, 64, 4),
                  (64, 64, 4), (32, 64, 1), (64, 64, 2, 8)])
    tensor_packed = (TQ.CONFIGS, "cast_transpose_packed", [
        dict(BM=bm, BN=bn, num_warps=w, GROUP_M=g) for bm, bn, w, g in
        [(64, 128, 4, 1), (128, 128, 8, 1), (64, 64, 2, 1), (128, 64, 4, 1), (32, 128, 2, 1),
         (64, 128, 4, 8)]])
    mx_ct = [(32, 128, 2), (64, 64, 2)]
    return {
        "fp8-tensor-ct": (TQ.VARIANTS, {"packed"}, tensor_packed, []),
        "fp8-delayed-ct": (TQ.VARIANTS, {"packed"}, tensor_packed, []),
        "block1x128-ct": (TQB.VARIANTS, {"packed"},
                          (TQB._PACKED_TILES, (1, True, True), TQB.PACKED_SWEEP), []),
        "mxfp8-ct": (TQMX.VARIANTS, {"packed", "finite", "cols"},
                     {"packed": mx_packed,
                      "cols": (TQMX._COLS_TILES, (True, True, False),
                               [(32, 128, 4), (32, 256, 4), (32, 128, 2), (32, 256, 8),
                                (32, 512, 8), (32, 128, 4, 8)])}, mx_ct),
        "mxfp4-ct": (TQMX.VARIANTS, {"packed", "arith", "finite", "pairs", "cols"},
                     {"packed": mx_packed,
                      "pairs": (TQMX._PAIRS_TILES, (True, True),
                                [(64, 64, 2), (128, 64, 4), (64, 128, 4), (32, 64, 2),
                                 (128, 128, 8), (64, 64, 2, 8)]),
                      "cols": (TQMX._COLS_TILES, (True, True, True),
                               [(32, 256, 4), (32, 256, 2), (32, 128, 4), (32, 512, 8),
                                (32, 256, 8), (32, 256, 4, 8)])}, mx_ct),
        "mxfp8-row": (TQMX.VARIANTS, {"finite"}, None, [(64, 128, 4), (32, 256, 8)]),
        "mxfp4-row": (TQMX.VARIANTS, {"arith", "finite", "pairs"},
                      {"pairs": (TQMX._PAIRS_TILES, (True, False),
                                 [(32, 128, 4), (64, 128, 8), (32, 256, 8), (16, 256, 4),
                                  (64, 128, 4), (32, 128, 4, 8), (32, 256, 4), (64, 256, 8),
                                  (16, 512, 4), (32, 512, 8), (128, 128, 8), (16, 128, 2),
                                  (8, 256, 2)])},
                      [(64, 128, 4), (32, 256, 8)]),
    }


def _variant_runs(name, wanted, kernel_variants, table, key, configs):
    """(label, VARIANTS table, settings, tile table, key, [tiles]) of the runs of row ``name``:
    the default kernel, then every wanted variant whose atoms the row takes."""
    runs = [(name, None, {}, table, key, configs)] if "default" in wanted else []
    if name not in kernel_variants:
        return runs
    vtable, takes, packed, others = kernel_variants[name]
    for v in wanted:
        atoms = set(v.split("+"))
        if v == "default" or not atoms <= takes:
            continue
        settings = {key: val for a in atoms for key, val in _ATOMS[a].items()}
        own = [packed[a] for a in sorted(atoms) if isinstance(packed, dict) and a in packed] \
            or ([packed] if "packed" in atoms else [])
        if own:
            runs.append((f"{name}/{v}", vtable, settings, *own[0]))
        else:
            runs.append((f"{name}/{v}", vtable, settings, table, key, [table[key]] + others))
    return runs


def _variants(TQ, TQB, TQMX):
    """name -> (recipe, rowwise, columnwise, table, key, [configs], bytes(m, k))."""
    from tealite import recipes as R

    def codes(m, k, dirs, per=1.0):
        return int(m * k * per) * dirs

    c = TQ.CONFIGS
    ct = [dict(BM=bm, BN=bn, num_warps=w, GROUP_M=1) for bm, bn, w in
          [(128, 128, 8), (64, 64, 4), (64, 128, 4), (128, 64, 4), (128, 64, 8), (128, 128, 16),
           (64, 128, 8)]]
    # Tile order (GROUP_M tile rows per group, _codecs._tile_ids) on the best tiles.
    ct += [dict(BM=bm, BN=bn, num_warps=w, GROUP_M=g) for bm, bn, w in
           [(64, 128, 4), (128, 64, 4)] for g in (4, 16, 64)]
    ct += [dict(BM=bm, BN=bn, num_warps=w, GROUP_M=1) for bm, bn, w in
           [(32, 64, 1), (32, 128, 1), (64, 64, 2), (32, 128, 2), (64, 128, 2)]]
    mx_row = [(32, 128, 4), (64, 128, 8), (32, 256, 8), (16, 256, 4), (64, 64, 4), (128, 128, 8)]
    mx_ct = [(128, 64, 8), (64, 64, 4), (64, 128, 8), (128, 128, 8), (128, 128, 16),
             (128, 64, 4), (128, 32, 4)]
    # A 4th entry is GROUP_M (tile order); only the cast-transpose sweeps it.
    mx_ct += [(bm, bn, w, g) for bm, bn, w in [(64, 64, 4), (128, 32, 4)] for g in (4, 16, 64)]
    # One- and two-warp tiles: a 32-row block's column amax then needs no cross-warp
    # reduction (no shared-memory round trip and barrier per tile); many small CTAs per SM.
    mx_ct += [(32, 64, 1), (32, 128, 1), (32, 64, 2), (32, 128, 2), (64, 64, 2), (64, 64, 1),
              (32, 256, 2)]
    cur = R.Float8CurrentScaling("e4m3")
    row = R.Float8CurrentScaling("e4m3", granularity="row")
    blk = R.Float8BlockScaling("e4m3", (1, 128))
    v = {
        "amax": (None, True, False, c, "amax",
                 [dict(BLOCK=b, num_warps=w) for b, w in
                  [(8192, 8), (1024, 4), (4096, 4), (4096, 8), (16384, 8), (16384, 16)]],
                 lambda m, k: 2 * m * k + 4),
        "fp8-tensor-row": (cur, True, False, c, "cast",
                           [dict(BLOCK=b, num_warps=w) for b, w in
                            [(4096, 8), (1024, 4), (2048, 4), (4096, 4), (8192, 8), (8192, 16)]],
                           lambda m, k: 2 * m * k + codes(m, k, 1) + 4),
        "fp8-tensor-ct": (cur, True, True, c, "cast_transpose", ct,
                          lambda m, k: 2 * m * k + codes(m, k, 2) + 8),
        # A given scale: the cast-transpose kernel alone (+ the reported amax).
        "fp8-delayed-ct": (R.DelayedScaling("e4m3"), True, True, c, "cast_transpose", ct[:3],
                           lambda m, k: 2 * m * k + codes(m, k, 2) + 12),
        "fp8-row-row": (row, True, False, c, "row",
                        [dict(elems_per_thread=e, max_warps=w) for e, w in
                         [(16, 16), (8, 16), (32, 16), (16, 32), (8, 32)]],
                        lambda m, k: 2 * m * k + codes(m, k, 1) + 8 * m),
        "fp8-row-ct": (row, True, True, c, "per_row_tiles", ct,
                       lambda m, k: 2 * m * k + codes(m, k, 2) + 4 * (m + k)),
        "block1x128-row": (blk, True, False, TQB._TILES, (1, True, False),
                           [(64, 128, 8), (32, 128, 4), (16, 128, 4), (128, 128, 8),
                            (64, 128, 4)],
                           lambda m, k: 2 * m * k + codes(m, k, 1) + 4 * m * k // 128),
        "block1x128-ct": (blk, True, True, TQB._TILES, (1, True, True),
                          [(128, 128, 8), (128, 128, 4), (128, 128, 16), (128, 128, 4, 4),
                           (128, 128, 4, 16), (128, 128, 4, 64), (128, 128, 2), (128, 128, 1)],
                          lambda m, k: 2 * m * k + codes(m, k, 2) + 8 * m * k // 128),
    }
    for name, recipe, per in (("mxfp8", R.MXFP8BlockScaling("e4m3"), 1.0),
                              ("mxfp4", R.MXFP4BlockScaling(), 0.5)):
        v[f"{name}-row"] = (recipe, True, False, TQMX._TILES, (True, False), mx_row,
                            lambda m, k, per=per: 2 * m * k + codes(m, k, 1, per) + m * k // 32)
        # MXFP8 (e4m3) has its own cast-transpose entry (quantize_mx._tile).
        ct_key = (True, True, "e4m3") if name == "mxfp8" else (True, True)
        v[f"{name}-ct"] = (recipe, True, True, TQMX._TILES, ct_key, mx_ct,
                           lambda m, k, per=per: 2 * m * k + codes(m, k, 2, per)
                           + 2 * m * k // 32)
    return v


def _outputs(q):
    """The bits of every output field of a QuantizedTensor (or the amax tensor)."""
    if isinstance(q, torch.Tensor):
        return [q.view(torch.uint8)]
    return [None if t is None else t.contiguous().view(torch.uint8)
            for t in (q.data, q.scale_inv, q.columnwise_data, q.columnwise_scale_inv, q.amax)]


def _same(a, b) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None and
                                             torch.equal(x, y)) for x, y in zip(a, b))


def _sweep(label, fn, vtable, settings, table, key, configs, ref_bits, nbytes, copy_ms, args):
    """Time ``fn`` over ``configs`` of ``table[key]`` (the current entry first, marked *) with
    the kernel-variant ``settings`` applied to ``vtable``; print one row each."""
    import triton.testing as tt
    default = table[key]
    configs = [default] + [c for c in configs if c != default]
    if args.tiles:
        configs = configs[:args.tiles]
    for i, cfg in enumerate(configs):
        tag = "*" if i == 0 else " "
        try:
            with _override(table, key, cfg), _settings(vtable, settings):
                bits = _outputs(fn())
                torch.cuda.synchronize()
                if not _same(bits, ref_bits):
                    print(f"  {label:30s}{tag} {cfg}: OUTPUT BITS DIFFER from the default")
                    continue
                ms = tt.do_bench(fn, rep=args.rep, return_mode="median")
            print(f"  {label:30s}{tag} {str(cfg):44s} {ms * 1e3:8.1f} us "
                  f"{nbytes / ms / 1e6:7.0f} GB/s {100 * copy_ms / ms:5.1f}% of copy")
        except Exception as e:  # a config that does not compile / run: report, go on
            msg = traceback.format_exception_only(type(e), e)[-1].strip()
            print(f"  {label:30s}{tag} {cfg}: FAILED {msg[:200]}")
            if i == 0:
                break


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--only", default="",
                    help="run the rows whose name contains this (comma-separated: any of them)")
    ap.add_argument("--rep", type=int, default=60, help="do_bench rep (ms)")
    ap.add_argument("--variant", default="default",
                    help="comma-separated: default, or '+'-joined atoms of packed, arith, "
                         "finite, pairs (e.g. packed+arith+finite)")
    ap.add_argument("--tiles", type=int, default=0,
                    help="time only the first N tiles of each list (0: all)")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # interpreter smoke
    args = ap.parse_args()
    TQ, TQB, TQMX, codecs = _setup()
    import triton.testing as tt
    import tealite
    from tealite import recipes as R

    t_start = time.time()
    m, k = args.m, args.k
    dev = torch.device(args.device)
    torch.manual_seed(0)
    x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
    x[0, :64] = torch.tensor([-0.0, 1e-30] * 32)  # signed zero, bf16 subnormal
    # A NaN and an Inf block: the GPU bit check then covers the MX blocks whose scale is NaN
    # (the "finite" variants rely on their codes never reaching an encoder as NaN).
    x[1, 0], x[1, 40] = float("nan"), float("inf")
    print(f"device {torch.cuda.get_device_name(dev)}, x bf16 {m}x{k}, "
          f"hw_fp8={codecs.hw_fp8(dev)}")
    copy_cache = {}

    def copy_ms(nbytes):
        n = nbytes // 2
        if n not in copy_cache:
            src = torch.empty(n, dtype=torch.uint8, device=dev)
            dst = torch.empty_like(src)
            copy_cache[n] = tt.do_bench(lambda: dst.copy_(src), rep=args.rep,
                                        return_mode="median")
        return copy_cache[n]

    kernel_variants = _kernel_variants(TQ, TQB, TQMX)
    wanted = [v for v in args.variant.split(",") if v]
    unknown = {v for v in wanted if v != "default" and not set(v.split("+")) <= set(_ATOMS)}
    unknown |= {v for v in wanted  # each sets VARIANTS["ct"]: one at a time
                if len({"packed", "pairs", "cols"} & set(v.split("+"))) > 1}
    if unknown:
        sys.exit(f"--variant: unknown {sorted(unknown)}; give 'default' or '+'-joined atoms "
                 f"of {sorted(_ATOMS)} (one of packed, pairs, cols)")
    given = torch.full((1,), 3.0, device=dev)
    for name, (recipe, rw, cw, table, key, configs, nbytes) in \
            _variants(TQ, TQB, TQMX).items():
        if not any(o in name for o in args.only.split(",")):
            continue
        if recipe is None:
            fn = lambda: tealite.amax(x, backend="triton")  # noqa: E731
        else:
            scale = given if isinstance(recipe, R.DelayedScaling) else None
            fn = lambda r=recipe, rw=rw, cw=cw, s=scale: tealite.quantize(  # noqa: E731
                x, r, rowwise=rw, columnwise=cw, scale=s, backend="triton")
        runs = _variant_runs(name, wanted, kernel_variants, table, key, configs)
        if not runs:
            continue
        b = nbytes(m, k)
        cms = copy_ms(b)
        ref_bits = _outputs(fn())  # the default kernel and tile: every row must match it
        torch.cuda.synchronize()
        for label, vtable, settings, table, key, configs in runs:
            _sweep(label, fn, vtable, settings, table, key, configs, ref_bits, b, cms, args)
    print(f"copy: {', '.join(f'{2 * n / ms / 1e6:.0f} GB/s' for n, ms in copy_cache.items())}"
          f"; total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
