"""Check, bit for bit, the Triton router kernels against an earlier revision's on a GPU (or,
with TRITON_INTERPRET=1, in the interpreter).

    python benchmarks/router_bits.py [--rev 839c0ad] [--cases 200]

The earlier revision's tealite/backends/triton/router.py is read with ``git show`` and loaded
as a private module (its backend registration skipped).  Compared: probs and the routing
map of the forward (every score kind, groups incl. sizes that are not a power of two,
expert bias, aux scores) and the backward's gradient, on random small cases (ties, -inf and
signed zeros among them) and on the benchmark's 16384 x 256 bf16 top-8 cases.  Prints every
differing case; exit status 1 if any.
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tealite.backends.triton import DEVICES  # noqa: E402
from tealite.backends.triton import router as NEW  # noqa: E402
from tealite.ops.router import router_config  # noqa: E402


def _old_module(rev: str, old_file: str | None = None):
    """``old_file``: the earlier router.py as a file (a machine whose copy of the tree has no
    git history, e.g. the lent GPU)."""
    src = Path(old_file).read_text() if old_file else subprocess.run(
        ["git", "show", f"{rev}:tealite/backends/triton/router.py"], cwd=ROOT,
        capture_output=True, text=True, check=True).stdout
    future = "from __future__ import annotations\n"
    src = src.replace("@BACKEND.implements(", "@_unregistered(").replace(
        future, future + "\n\ndef _unregistered(*a, **k):\n    return lambda f: f\n", 1)
    path = Path(tempfile.mkdtemp()) / "router_old.py"  # a file: triton.jit reads the source
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("router_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses (Tile, since 2026-11-27) look it up there
    spec.loader.exec_module(module)
    return module


def _logits(t, e, kind, dtype, g, device):
    x = torch.randn(t, e, generator=g)
    if kind == "ties":
        x = torch.randint(-2, 1, (t, e), generator=g).float()
        x[(x == 0) & (torch.rand(t, e, generator=g) < 0.5)] = -0.0
    elif kind == "masked":
        x[torch.rand(t, e, generator=g) < 0.5] = float("-inf")
    elif kind == "huge":
        x = x * 4096
    return x.to(dtype).to(device)


def _groups(e: int, topk: int, rnd) -> tuple:
    options = [(n, k) for n in range(2, e + 1) if e % n == 0 for k in range(1, n + 1)
               if topk % k == 0 and topk // k <= e // n and topk <= k * (e // n)]
    return rnd.choice(options) if options and rnd.random() < 0.6 else (None, None)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8 if t.dtype == torch.bool else
                               {1: torch.int8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _same(a, b) -> bool:
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    return all(torch.equal(_bits(p), _bits(q)) for p, q in zip(a, b))


def _cases(n: int, device: str):
    rnd, g = random.Random(0), torch.Generator().manual_seed(0)
    for _ in range(n):
        e = rnd.choice([1, 3, 5, 8, 12, 15, 16, 31, 32, 64, 120, 160, 256])
        topk = rnd.randint(1, min(8, e))
        fn = rnd.choice(["softmax", "pre", "sigmoid"])
        groups = _groups(e, topk, rnd)
        cfg = router_config(topk, e, score_function="sigmoid" if fn == "sigmoid" else "softmax",
                            use_pre_softmax=fn == "pre", num_groups=groups[0],
                            group_topk=groups[1], scaling_factor=rnd.choice([None, 2.5]))
        x = _logits(rnd.choice([1, 7, 40]), e, rnd.choice(["normal", "ties", "masked", "huge"]),
                    rnd.choice([torch.float32, torch.bfloat16, torch.float16]), g, device)
        bias = (torch.randn(e, generator=g) * 0.1).to(device) if fn == "sigmoid" and \
            rnd.random() < 0.5 else None
        yield cfg, x, bias
    if device == "cpu":  # the interpreter: the benchmark's size would take minutes
        return
    x = _logits(16384, 256, "normal", torch.bfloat16, g, device)
    yield router_config(8, 256), x, None
    yield (router_config(8, 256, score_function="sigmoid", num_groups=8, group_topk=4), x,
           (torch.randn(256, generator=g) * 0.1).to(device))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="839c0ad")
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--old-file", default=None, help="the earlier router.py, instead of git show")
    args = ap.parse_args(argv)
    old, device, bad, n = _old_module(args.rev, args.old_file), DEVICES[0], 0, 0
    for cfg, x, bias in _cases(args.cases, device):
        grad = torch.randn(x.shape, dtype=x.dtype, device=device)
        _, routing_map = NEW._launch_fwd(x, cfg, bias, aux=False)
        aux = router_config(cfg.topk, x.shape[1], score_function=cfg.score_function.value)
        aux = type(cfg)(aux.topk, aux.score_function, aux.score_function.value == "softmax")
        pairs = {"fwd": lambda m: m._launch_fwd(x, cfg, bias, aux=False),
                 "bwd": lambda m: m._launch_bwd(grad, x, routing_map, cfg, aux=False),
                 "aux fwd": lambda m: m._launch_fwd(x, aux, None, aux=True),
                 "aux bwd": lambda m: m._launch_bwd(grad.float(), x, None, cfg, aux=True)}
        for what, call in pairs.items():
            n += 1
            if not _same(call(old), call(NEW)):
                bad += 1
                print(f"DIFFERENT {what}: {tuple(x.shape)} {x.dtype} {cfg} bias "
                      f"{bias is not None}")
    print(f"{n} comparisons against {args.rev} on {device}: {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
