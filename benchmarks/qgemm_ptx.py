"""Resource use of the Triton MXFP8 qgemm kernel as compiled for sm_90a, on the CPU (no GPU):
``python benchmarks/qgemm_ptx.py [--variant acc|fold] [--config BMxBNxBK/W/S ...]``.

Each row cross-compiles ``qgemm._qgemm_kernel`` for MXFP8 e4m3 x e4m3 (fp8-typed code tiles,
bf16 out, the arguments an 8192^3 launch specializes: 16-byte aligned pointers and sizes) and
prints registers and spill bytes (``ptxas -v``), shared memory, the PTX counts of wgmma
instructions / waits, fp32 FMAs and multiplies, ``bar.sync``, and the TTGIR layout
conversions.  A spill-free build with few registers lets more CTAs share an SM, which is how
the accumulator variant's CUDA-core scaling can overlap another CTA's MMAs
(_qgemm_mx_acc.py).  Timing needs a GPU: benchmarks/qgemm_configs.py.
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

from tealite.backends.triton import qgemm as Q

_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
# The accumulator variant's sweep (benchmarks/qgemm_configs.py "mxfp8 acc"), default first.
ACC_CONFIGS = ("128x128x32/8/4", "128x128x32/8/3", "128x128x32/8/6", "128x128x64/8/4",
               "128x128x128/8/3", "64x128x32/4/6", "128x64x32/4/6", "256x128x32/8/3")


def parse(text: str) -> Q.QGemmConfig:
    """``BMxBNxBK/WARPS/STAGES`` as a config (GROUP_M 8)."""
    tile, warps, stages = text.split("/")
    bm, bn, bk = (int(v) for v in tile.split("x"))
    return Q.QGemmConfig(bm, bn, bk, 8, int(warps), int(stages))


def compile_mx(cfg: Q.QGemmConfig, mx_acc: bool, target=("cuda", 90, 32), typed: bool = True):
    """``_qgemm_kernel`` for MXFP8 e4m3 x e4m3 (``typed``: fp8 code tiles, else bytes)."""
    const = dict(KIND=Q._KINDS["mx"], SCALE_K=Q._MX_SCALE_K, SA_ROWS=1, E8M0_BIAS=Q._E8M0_BIAS,
                 EVEN_LOW=Q._E2M1_EVEN_IN_LOW_NIBBLE, DOT_FP8=False, F32_OPERANDS=False,
                 A_TYPED=typed, B_TYPED=typed, HAS_BIAS=False, BIAS_BF16=False, OUT_BF16=True,
                 I64=False, EVEN_K=True, EVEN_SCALE_K=True, BLOCK_M=cfg.block_m,
                 BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, MX_ACC=mx_acc,
                 **Q._operand_constants("A", "e4m3"), **Q._operand_constants("B", "e4m3"))
    code = "*fp8e4nv" if typed else "*u8"
    ptrs = dict(a_ptr=code, b_ptr=code, sa_ptr="*u8", sb_ptr="*u8", bias_ptr="*i16",
                out_ptr="*i16")
    names = Q._qgemm_kernel.arg_names
    sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n] != "constexpr"}
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if target[0] == "hip":
        opts.update(waves_per_eu=cfg.waves_per_eu, matrix_instr_nonkdim=cfg.matrix_instr_nonkdim)
    return triton.compile(ASTSource(Q._qgemm_kernel, sig, const, attrs),
                          target=GPUTarget(*target), options=opts)


def stats(k) -> dict:
    ptx = k.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run([os.path.join(_BIN, "ptxas-blackwell"), "-v", "--gpu-name=sm_90a",
                              src, "-o", os.devnull], capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores", log)
    return dict(regs=int(regs.group(1)) if regs else -1,
                spill=int(spill.group(1)) if spill else -1, smem=k.metadata.shared,
                wgmma=ptx.count("wgmma.mma_async"), waits=ptx.count("wgmma.wait_group"),
                fma=len(re.findall(r"\bfma\.rn\.f32", ptx)),
                mul=len(re.findall(r"\bmul(?:\.rn)?\.f32", ptx)), bar=ptx.count("bar.sync"),
                cvt=k.asm["ttgir"].count("convert_layout"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=("acc", "fold"), default="acc")
    p.add_argument("--config", action="append", help="BMxBNxBK/WARPS/STAGES (repeatable)")
    args = p.parse_args()
    configs = args.config or (ACC_CONFIGS if args.variant == "acc" else ("128x128x64/4/3",))
    print(f"MXFP8 e4m3 qgemm, VARIANTS['mx'] = {args.variant!r}, sm_90a, triton "
          f"{triton.__version__}")
    print(f"{'config':18s} {'regs':>5s} {'spill B':>8s} {'smem':>7s} {'wgmma':>6s} "
          f"{'waits':>6s} {'fma':>6s} {'mul':>6s} {'bar':>5s} {'cvt':>4s}")
    for text in configs:
        s = stats(compile_mx(parse(text), args.variant == "acc"))
        print(f"{text:18s} {s['regs']:5d} {s['spill']:8d} {s['smem']:7d} {s['wgmma']:6d} "
              f"{s['waits']:6d} {s['fma']:6d} {s['mul']:6d} {s['bar']:5d} {s['cvt']:4d}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
