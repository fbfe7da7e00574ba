"""Instruction work per element of the grouped quantize cast kernels (issue 16), on the CPU:
``python -m benchmarks.grouped_quantize_ptx``.

The columns of benchmarks/quantize_ptx.py (its compiler and counters, bf16 input, sm_90a,
the bench's launch: 16-byte aligned pointers, K divisible by 16), for the cast-transpose +
dbias kernels of grouped_quantize.py under ``VARIANTS["ct"]`` "plain" (ALIGN 1) and
"aligned" (ALIGN 16: every split a multiple of 16).  The group size, the row stride of a
group's x.T codes, is loaded at run time: without the hint each columnwise code is its own
1-byte store (the "st" column).
"""
from __future__ import annotations

from benchmarks.quantize_ptx import _compile, _fp8, _stats
from tealite.backends.triton import grouped_quantize as G

_TABLES = dict(tile_group="*i32", tile_row="*i32", group_off="*i64", s_off="*i64",
               st_off="*i64", part_ptr="*fp32", amax_bits_ptr="*i32")


def _rows():
    """(name, kernel, tile rows, tile cols, warps, constexprs)."""
    tensor, block = G._grouped_tensor_cast_kernel, G._grouped_block_cast_kernel
    cfg_t, cfg_b = G.CONFIGS["tensor"], G.CONFIGS["block_col"]
    rows = []
    for align in (1, 16):
        rows += [(f"tensor ct + dbias, ALIGN {align}", tensor, cfg_t,
                  dict(COL=True, GIVEN=False, DBIAS=True, ALIGN=align)),
                 (f"block 1x128 ct + dbias, ALIGN {align}", block, cfg_b,
                  dict(COL=True, SQUARE=False, DBIAS=True, ALIGN=align)),
                 (f"block 1x128 ct, ALIGN {align}", block, cfg_b,
                  dict(COL=True, SQUARE=False, DBIAS=False, ALIGN=align))]
    return rows


def main() -> None:
    print(f"{'kernel (tile, warps)':48s} {'PTX/el':>7s} {'SASS/el':>7s} {'bar':>4s} "
          f"{'smem ops':>8s} {'shfl':>4s} {'regs':>4s} {'spill':>5s}  "
          f"global loads / stores (count x bytes, per thread)")
    for name, kernel, cfg, extra in _rows():
        bm, bn, warps = cfg["BM"], cfg["BN"], cfg["num_warps"]
        consts, ptrs = _fp8(kernel, bm, bn, "*u8", **extra)
        consts.pop("GROUP_M")  # the grouped kernels take their tiles from the host's table
        s = _stats(_compile(kernel, consts, dict(ptrs, **_TABLES), warps), bm * bn)
        print(f"{name + f' ({bm}x{bn}, {warps})':48s} {s['ptx']:7.1f} {s['sass']:7.1f} "
              f"{s['bar']:4d} {s['shared']:8d} {s['shfl']:4d} {s['regs']:4d} {s['spill']:5d}  "
              f"{s['ld']} / {s['st']}")


if __name__ == "__main__":
    main()
