"""The interpreter-gap scan (tealite_verify/gate/interpreter_gaps.py) on small synthetic AITER
trees: it flags ``not`` / ``and`` / ``or`` on tensors inside jit code reachable from an entry
point, and leaves alone what Python evaluates identically in both worlds (constexpr operands,
control-flow tests, type queries, heuristics lambdas, code outside jit functions).  The real
tree case (AITER's ``_mxfp4_quant_op`` from v0.1.7.post3) is in test_aiter_gate_history.py
and the end-to-end gate proof on a patched copy in test_aiter_gate.py."""
from __future__ import annotations

import textwrap
from pathlib import Path

from tealite_verify.gate import interpreter_gaps as G

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def _helper(x, SATURATE: tl.constexpr):
    big = x >= 6
    small = (not big) & (x < 1)          # flagged: a tensor
    if SATURATE and not SATURATE:        # control flow on constexpr: fine
        small = small
    keep = not SATURATE                  # constexpr: fine
    both = isinstance(x, tl.tensor) and x.dtype == tl.float32   # a type query: fine
    return small


@triton.heuristics({"EVEN": lambda args: args["M"] % 4 == 0 and args["N"] % 4 == 0})
@triton.jit
def _kernel(x_ptr, M, N, EVEN: tl.constexpr):
    pid = tl.program_id(0)
    if pid == 0 or EVEN:                 # a scalar test: fine
        x = tl.load(x_ptr + tl.arange(0, 32))
        y = _helper(x, True)


@triton.jit
def _unrelated(x):
    return not x                          # flagged, but no entry point reaches it


def _host_only(flag, other):
    return not flag or other              # not jit code: fine
'''

WRAPPER = '''
from aiter.ops.triton._triton_kernels.k import _kernel


def entry(x):
    _kernel[(1,)](x, 4, 4)


def other_entry(x):
    return x
'''


def _tree(tmp_path: Path) -> Path:
    base = tmp_path / "tree" / "aiter" / "ops" / "triton"
    (base / "_triton_kernels").mkdir(parents=True)
    (base / "_triton_kernels" / "k.py").write_text(textwrap.dedent(KERNELS))
    (base / "w.py").write_text(textwrap.dedent(WRAPPER))
    return tmp_path / "tree"


def test_a_bool_op_on_a_tensor_reached_from_an_entry_point_is_flagged(tmp_path):
    gaps = G.gaps_reached_from(_tree(tmp_path), "entry")
    assert [(g.function, g.code) for g in gaps] == [("_helper", "not big")]
    (g,) = gaps
    assert g.path == "aiter/ops/triton/_triton_kernels/k.py" and g.kind == G.KIND_BOOL_ON_TENSOR
    assert "k.py" in g.describe() and str(g.line) in g.describe()


def test_entry_points_that_reach_no_gap_are_not_listed(tmp_path):
    out = G.scan(_tree(tmp_path), ["entry", "other_entry", "absent"])
    assert list(out) == ["entry"]
    assert out["entry"][0]["code"] == "not big"


def test_a_tree_with_a_syntax_error_in_one_file_still_scans(tmp_path):
    tree = _tree(tmp_path)
    (tree / "aiter/ops/triton/broken.py").write_text("def (:\n")
    assert [g.code for g in G.gaps_reached_from(tree, "entry")] == ["not big"]
