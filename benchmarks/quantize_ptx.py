"""Instruction work per element of the Triton cast-transpose kernels, on the CPU (no GPU):
``python benchmarks/quantize_ptx.py [--only mxfp4]``.

Each row cross-compiles one kernel (bf16 input, the arguments a 16384 x 8192 launch
specializes: 16-byte aligned pointers, sizes divisible by 16) for sm_90a and prints, per
element of its tile: PTX and SASS instructions (straight-line code, one tile per program, so
static counts are the per-thread work), then per program: ``bar.sync``, shared-memory
operations (and how many are single-byte stores), shuffles, registers and spill bytes
(``ptxas -v``), and the global access widths.  A memory-bound kernel on an H100 moves about 13 bytes per SM per cycle at
copy speed, and an SM issues at most 128 thread-instructions per cycle: a cast-transpose of
bf16 to FP8 (4 bytes per element) may spend about 40 instructions per element at 100 % of
copy, MXFP4 (3 bytes) about 30 (docs/benchmarks.md).  Variants are the modules' ``VARIANTS``
(``packed``, ``arith``, ``finite``).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tealite.backends.triton import quantize as TQ, quantize_block as TQB, quantize_mx as TQMX
from tealite.backends.triton._codecs import (_fmt_constants, _mx_scale_constants,
                                             _overflow_constants)
from tealite.formats import get_format

_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def _compile(kernel, consts: dict, ptrs: dict, warps: int):
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n in ("fmax", "eps")
                                                       else "i32") for n in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if sig[n] not in ("constexpr", "fp32")}
    return triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps))


def _fp8(kernel, bm, bn, qt, **extra):
    fmt = get_format("e4m3")
    consts = dict(_fmt_constants(fmt), **_overflow_constants(fmt), ROW=True, POW2=False,
                  SATURATE=True, X_BF16=True, HW_FP8=True, BM=bm, BN=bn, GROUP_M=1, **extra)
    ptrs = {n: "*fp32" for n in kernel.arg_names if n.endswith("_ptr")}
    return consts, dict(ptrs, x_ptr="*i16", q_ptr="*u8", qt_ptr=qt)


def _mx(kernel, name, mode, bm, bn, row=True, col=True, arith=False, finite=False):
    fmt = get_format(name)
    consts = dict(_fmt_constants(fmt), **_mx_scale_constants(name, mode), ROW=row,
                  FP4=fmt.packed, TIES_AWAY=False, X_BF16=True, HW_FP8=True, BM=bm, BN=bn,
                  GROUP_M=1, FP4_ARITH=arith, FINITE=finite, **({"EVEN": True} if kernel is TQMX._mx_ct_packed_kernel else {}))
    if kernel is TQMX._mx_cast_kernel:
        consts["COL"] = col
    packed = kernel is TQMX._mx_ct_packed_kernel
    return consts, {n: "*i32" if packed and n == "qt_ptr" else "*i16" if n == "x_ptr" else "*u8"
                    for n in kernel.arg_names if n.endswith("_ptr")}


def _mx_pairs(bm, bn, **extra):
    """A bf16-pair MXFP4 kernel (_mx_pairs; quantize_mx VARIANTS "pairs")."""
    consts = dict(_mx_scale_constants("e2m1", "floor"), BM=bm, BN=bn, GROUP_M=1, **extra)
    return consts, dict(x_ptr="*i32", q_ptr="*u8", s_ptr="*u8", qt_ptr="*u8", st_ptr="*u8")


def _mx_cols(bn, **extra):
    """The "cols" MXFP4 cast-transpose (_mx_pairs; 32-row tiles, x.T as int32 words)."""
    consts, ptrs = _mx_pairs(32, bn, **extra)
    del consts["BM"]
    return consts, dict(ptrs, qt_ptr="*i32")


def _mx8_cols(bn):
    """The MXFP8 "cols" cast-transpose (e4m3, RCEIL, finite; x.T as int32 words)."""
    consts, ptrs = _mx(TQMX._mx_cast_kernel, "e4m3", "rceil", 32, bn, finite=True)
    for n in ("FP4", "FP4_ARITH", "BM", "COL"):
        consts.pop(n, None)
    return consts, dict(ptrs, qt_ptr="*i32")


def _rows():
    """(name, kernel, tile rows, tile cols, warps, (consts, pointer types))."""
    ct, ctp = TQ._cast_transpose_tensor_kernel, TQ._cast_transpose_tensor_packed_kernel
    blk, blkp = TQB._block_cast_kernel, TQB._block_ct_packed_kernel
    mx, mxp = TQMX._mx_cast_kernel, TQMX._mx_ct_packed_kernel
    pct, cct = TQMX._mx_fp4_pairs_ct_kernel, TQMX._mx_fp4_cols_ct_kernel
    c8 = TQMX._mx_fp8_cols_ct_kernel
    return [
        ("fp8-delayed-ct (default)", ct, 64, 128, 4, _fp8(ct, 64, 128, "*u8", GIVEN=True)),
        ("fp8-delayed-ct/packed", ctp, 64, 128, 4,
         _fp8(ctp, 64, 128, "*i32", GIVEN=True, EVEN=True)),
        ("block1x128-ct (default)", blk, 128, 128, 4,
         _fp8(blk, 128, 128, "*u8", COL=True, SQUARE=False)),
        ("block1x128-ct/packed", blkp, 128, 128, 4, _fp8(blkp, 128, 128, "*i32", EVEN=True)),
        ("block1x128-ct/packed 8 warps", blkp, 128, 128, 8,
         _fp8(blkp, 128, 128, "*i32", EVEN=True)),
        ("mxfp8-row (default)", mx, 32, 128, 4, _mx(mx, "e4m3", "rceil", 32, 128, col=False)),
        ("mxfp8-ct (NaN fix-ups; before)", mx, 32, 64, 2, _mx(mx, "e4m3", "rceil", 32, 64)),
        ("mxfp8-ct/packed", mxp, 32, 64, 2, _mx(mxp, "e4m3", "rceil", 32, 64)),
        ("mxfp8-ct/packed 64x64", mxp, 64, 64, 2, _mx(mxp, "e4m3", "rceil", 64, 64)),
        ("mxfp8-ct/finite (now default)", mx, 32, 64, 2,
         _mx(mx, "e4m3", "rceil", 32, 64, finite=True)),
        ("mxfp8-ct/finite 32x128/2", mx, 32, 128, 2,
         _mx(mx, "e4m3", "rceil", 32, 128, finite=True)),
        ("mxfp8-ct/cols 32x128/4", c8, 32, 128, 4, _mx8_cols(128)),
        ("mxfp8-ct/cols 32x256/4", c8, 32, 256, 4, _mx8_cols(256)),
        ("mxfp8-ct/cols 32x256/8", c8, 32, 256, 8, _mx8_cols(256)),
        ("mxfp8-ct/cols 32x128/2", c8, 32, 128, 2, _mx8_cols(128)),
        ("mxfp8-ct/packed+finite 64x64", mxp, 64, 64, 2,
         _mx(mxp, "e4m3", "rceil", 64, 64, finite=True)),
        ("mxfp4-row (ladder; before)", mx, 32, 128, 4,
         _mx(mx, "e2m1", "floor", 32, 128, col=False)),
        ("mxfp4-row/arith", mx, 32, 128, 4,
         _mx(mx, "e2m1", "floor", 32, 128, col=False, arith=True)),
        ("mxfp4-row/arith+finite (now default)", mx, 32, 128, 4,
         _mx(mx, "e2m1", "floor", 32, 128, col=False, arith=True, finite=True)),
        ("mxfp4-row/pairs", TQMX._mx_fp4_pairs_kernel, 32, 128, 4, _mx_pairs(32, 128)),
        ("mxfp4-row/pairs 64x128/8", TQMX._mx_fp4_pairs_kernel, 64, 128, 8, _mx_pairs(64, 128)),
        ("mxfp4-row/pairs 32x256/8", TQMX._mx_fp4_pairs_kernel, 32, 256, 8, _mx_pairs(32, 256)),
        ("mxfp4-ct (ladder; before)", mx, 32, 64, 2, _mx(mx, "e2m1", "floor", 32, 64)),
        ("mxfp4-ct/arith", mx, 32, 64, 2, _mx(mx, "e2m1", "floor", 32, 64, arith=True)),
        ("mxfp4-ct/arith+finite (now default)", mx, 32, 64, 2,
         _mx(mx, "e2m1", "floor", 32, 64, arith=True, finite=True)),
        ("mxfp4-ct/pairs", pct, 64, 64, 2, _mx_pairs(64, 64, ROW=True)),
        ("mxfp4-ct/cols 32x256/2", cct, 32, 256, 2, _mx_cols(256, ROW=True)),
        ("mxfp4-ct/cols 32x256/4", cct, 32, 256, 4, _mx_cols(256, ROW=True)),
        ("mxfp4-ct/cols 32x512/4", cct, 32, 512, 4, _mx_cols(512, ROW=True)),
        ("mxfp4-ct/cols 32x128/2", cct, 32, 128, 2, _mx_cols(128, ROW=True)),
        ("mxfp4-ct/cols 32x256/2 col-only", cct, 32, 256, 2, _mx_cols(256, ROW=False)),
        ("mxfp4-ct/pairs 32x64/2", pct, 32, 64, 2, _mx_pairs(32, 64, ROW=True)),
        ("mxfp4-ct/pairs 64x128/4", pct, 64, 128, 4, _mx_pairs(64, 128, ROW=True)),
        ("mxfp4-ct/pairs 128x64/4", pct, 128, 64, 4, _mx_pairs(128, 64, ROW=True)),
        ("mxfp4-ct/packed+arith+finite 64x64", mxp, 64, 64, 2,
         _mx(mxp, "e2m1", "floor", 64, 64, arith=True, finite=True)),
    ]


def _instructions(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        line = re.sub(r"^@!?%p\d+\s+", "", line.strip())
        if line and not line.startswith(("//", ".", "{", "}", "$")) and not line.endswith(":"):
            out.append(line)
    return out


def _widths(ptx: list[str], op: str) -> str:
    """``count x bytes`` per access width of one kind of global access, widest first."""
    sizes = {"b8": 1, "b16": 2, "b32": 4, "b64": 8}
    found: dict[int, int] = {}
    for i in ptx:
        m = re.match(re.escape(op) + r"(?:\.\w+)*?(?:\.v(\d))?\.(b8|b16|b32|b64)\b", i)
        if m:
            width = int(m.group(1) or 1) * sizes[m.group(2)]
            found[width] = found.get(width, 0) + 1
    return " ".join(f"{n}x{w}" for w, n in sorted(found.items(), reverse=True))


def _stats(k, elems: int) -> dict:
    threads = k.metadata.num_warps * 32
    per_thread = elems / threads
    ptx = _instructions(k.asm["ptx"])
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(k.asm["ptx"])
        with open(cubin, "wb") as f:
            f.write(k.asm["cubin"])
        log = subprocess.run([os.path.join(_BIN, "ptxas-blackwell"), "-v", "--gpu-name=sm_90a",
                              src, "-o", os.devnull], capture_output=True, text=True).stderr
        dis = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-sass", cubin],
                             capture_output=True, text=True).stdout
    sass = [ln for ln in dis.splitlines()
            if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", ln) and "NOP" not in ln]
    shared = [i for i in ptx if i.startswith(("ld.shared", "st.shared"))]
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores", log)
    return dict(ptx=len(ptx) / per_thread, sass=len(sass) / per_thread,
                ld=_widths(ptx, "ld.global"), st=_widths(ptx, "st.global"),
                bar=sum(i.startswith("bar.sync") for i in ptx), shared=len(shared),
                byte_st=sum(i.startswith("st.shared.b8") for i in ptx),
                shfl=sum(i.startswith("shfl") for i in ptx),
                regs=int(regs.group(1)) if regs else -1, spill=int(spill.group(1)) if spill else 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="rows whose name contains this")
    args = ap.parse_args()
    print(f"{'kernel (tile, warps)':42s} {'PTX/el':>7s} {'SASS/el':>7s} {'bar':>4s} "
          f"{'smem ops':>8s} {'st.b8':>5s} {'shfl':>4s} {'regs':>4s} {'spill':>5s}  "
          f"global loads / stores (count x bytes, per thread)")
    for name, kernel, bm, bn, warps, (consts, ptrs) in _rows():
        if args.only not in name:
            continue
        s = _stats(_compile(kernel, consts, ptrs, warps), bm * bn)
        print(f"{name + f' ({bm}x{bn}, {warps})':42s} {s['ptx']:7.1f} {s['sass']:7.1f} "
              f"{s['bar']:4d} {s['shared']:8d} {s['byte_st']:5d} {s['shfl']:4d} {s['regs']:4d} "
              f"{s['spill']:5d}  {s['ld']} / {s['st']}")


if __name__ == "__main__":
    main()
