"""Where each AITER Triton entry point lives, per AITER version (the loader's candidate table),
and why one that could not be loaded is missing.

A :class:`Candidate` names a module under ``aiter.ops.triton`` and the versions that define the
entry point there (``since`` inclusive, ``until`` exclusive, None = open).  The loader tries, in
table order, the candidates whose range admits the loaded version (all of them when the
version is unknown).  An entry point none of them yields is classified (:func:`classify`):

* ``"import-error"``: a candidate module is in the tree but importing it fails (a loader or
  stand-in problem; the reason keeps the exception type and message);
* ``"moved-unknown"``: ``def NAME(`` exists in a module of the tree that no admitted candidate
  names (the table needs a candidate; the reason names the module);
* ``"removed"``: no module of the tree defines it (AITER dropped it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

OPS = "aiter.ops.triton"


@dataclass(frozen=True)
class Candidate:
    """``aiter.ops.triton.<module>`` defines ``name`` in versions [since, until)."""

    module: str
    name: str
    since: str | None = None
    until: str | None = None

    def admits(self, version: str | None) -> bool:
        """True when ``version`` is in range, or unknown / unparseable (then all are tried)."""
        key = version_key(version) if version else None
        if key is None:
            return True
        if self.since is not None and key < version_key(self.since):
            return False
        return self.until is None or key < version_key(self.until)

    @property
    def qualified(self) -> str:
        return f"{OPS}.{self.module}"


# v0.1.10 moved the Triton wrappers into gemm/basic/, quant/ and normalization/ (v0.1.10 also
# installs a sys.meta_path shim that maps the old flat names to the new modules).
V10 = "0.1.10"
C = Candidate
CANDIDATES: tuple[Candidate, ...] = (
    # module (under aiter.ops.triton)         entry point                                since until
    C("gemm_a16w16",                          "gemm_a16w16",                             None, V10),
    C("gemm.basic.gemm_a16w16",               "gemm_a16w16",                             V10),
    C("gemm_a8w8",                            "gemm_a8w8",                               None, V10),
    C("gemm.basic.gemm_a8w8",                 "gemm_a8w8",                               V10),
    C("gemm_a8w8_per_token_scale",            "gemm_a8w8_per_token_scale",               None, V10),
    C("gemm.basic.gemm_a8w8_per_token_scale", "gemm_a8w8_per_token_scale",               V10),
    C("gemm_a8w8_blockscale",                 "gemm_a8w8_blockscale",                    None, V10),
    C("gemm.basic.gemm_a8w8_blockscale",      "gemm_a8w8_blockscale",                    V10),
    C("gemm_afp4wfp4",                        "gemm_afp4wfp4",                           None, V10),
    C("gemm.basic.gemm_afp4wfp4",             "gemm_afp4wfp4",                           V10),
    C("gemm_afp4wfp4",                        "gemm_afp4wfp4_preshuffled_scales",        None, V10),
    C("gemm.basic.gemm_afp4wfp4",             "gemm_afp4wfp4_preshuffled_scales",        V10),
    C("gemm_afp4wfp4",                        "gemm_afp4wfp4_preshuffled_weight_scales", None, V10),
    C("gemm.basic.gemm_afp4wfp4",             "gemm_afp4wfp4_preshuffled_weight_scales", V10),
    C("quant",                                "dynamic_mxfp4_quant",                     None, V10),
    C("quant.quant",                          "dynamic_mxfp4_quant",                     V10),
    C("quant",                                "dynamic_per_tensor_quant_fp8_i8",         None, V10),
    C("quant.quant",                          "dynamic_per_tensor_quant_fp8_i8",         V10),
    C("quant",                                "dynamic_per_token_quant_fp8_i8",          None, V10),
    C("quant.quant",                          "dynamic_per_token_quant_fp8_i8",          V10),
    C("quant",                                "static_per_tensor_quant_fp8_i8",          None, V10),
    C("quant.quant",                          "static_per_tensor_quant_fp8_i8",          V10),
    C("rmsnorm",                              "rms_norm",                                None, V10),
    C("normalization.rmsnorm",                "rms_norm",                                V10),
    C("norm",                                 "layer_norm",                              None, V10),
    C("normalization.norm",                   "layer_norm",                              V10),
    C("rmsnorm",                              "rmsnorm2d_fwd_with_dynamicquant",         None, V10),
    C("normalization.rmsnorm",                "rmsnorm2d_fwd_with_dynamicquant",         V10),
    C("norm",                                 "layernorm2d_fwd_with_dynamicquant",       None, V10),
    C("normalization.norm",                   "layernorm2d_fwd_with_dynamicquant",       V10),
    # Private helpers behind the autograd Functions: the only way to AITER's backward kernels.
    C("rmsnorm",                              "_rmsnorm_forward",                        None, V10),
    C("normalization.rmsnorm",                "_rmsnorm_forward",                        V10),
    C("rmsnorm",                              "_rmsnorm_backward",                       None, V10),
    C("normalization.rmsnorm",                "_rmsnorm_backward",                       V10),
    C("norm",                                 "_layernorm_forward",                      None, V10),
    C("normalization.norm",                   "_layernorm_forward",                      V10),
    C("norm",                                 "_layernorm_backward",                     None, V10),
    C("normalization.norm",                   "_layernorm_backward",                     V10),
    # Fused add + RMSNorm + pad: fused_add_rmsnorm_pad.py in 0.1.7; normalization/ later.  No
    # version range is claimed for the move (as for rope): both are tried, the flat one first.
    *(C(module, "fused_add_rmsnorm_pad") for module in ("fused_add_rmsnorm_pad",
                                                       "normalization.fused_add_rmsnorm_pad")),
    C("fused_fp8_quant",                      "fused_rms_fp8_per_tensor_static_quant",   None, V10),
    C("quant.fused_fp8_quant",                "fused_rms_fp8_per_tensor_static_quant",   V10),
    C("fused_mxfp4_quant",                    "fused_rms_mxfp4_quant",                   None, V10),
    C("quant.fused_mxfp4_quant",              "fused_rms_mxfp4_quant",                   V10),
    C("activation",                           "act_mul_and_mxfp4_quant"),
    C("activation",                           "act_mul_and_fp8_group_quant"),
    # RoPE: rope.py in 0.1.7; a rope/ package (rope/rope.py) later.  No version range is
    # claimed for the move: both are tried, the flat module first.
    *(C(module, f"{name}_{d}") for name in ("rope", "rope_thd", "rope_cached_positions",
                                            "rope_cached_thd_positions_2c")
      for d in ("fwd", "bwd") for module in ("rope", "rope.rope")),
    # Flash attention (mha.py; v0.1.10 moved it to attention/): the public wrappers and the
    # two backward kernels their autograd Functions choose between (one kernel by default).
    # The forward helper behind the wrappers (_flash_attn_forward, the FP8 path) is reached
    # through flash_attn_func's module (backends/aiter_triton/attention.py).
    C("mha",                                  "flash_attn_func",                         None, V10),
    C("attention.mha",                        "flash_attn_func",                         V10),
    C("mha",                                  "flash_attn_varlen_func",                  None, V10),
    C("attention.mha",                        "flash_attn_varlen_func",                  V10),
    C("mha_onekernel_bwd",                    "flash_attn_onekernel_backward",           None, V10),
    C("attention.mha_onekernel_bwd",          "flash_attn_onekernel_backward",           V10),
    C("mha_fused_bwd",                        "flash_attn_fused_backward",               None, V10),
    C("attention.mha_fused_bwd",              "flash_attn_fused_backward",               V10),
    C("mha_v3",                               "flash_attn_fp8_func",                     None, V10),
    C("attention.mha_v3",                     "flash_attn_fp8_func",                     V10),
    C("softmax",                              "softmax"),
    # MoE routing (triton_kernels' routing, carried by AITER): the top-k with a softmax over
    # the chosen logits.  Not aiter.ops.triton.topk.topk (FlagGems' plain top-k, unmapped).
    C("moe_routing.topk",                     "topk"),
    # Fused MoE (the expert FFN's GEMMs with routing): moe_op.py in 0.1.7; later trees keep it
    # under moe/.  No version range is claimed for the move: both are tried, flat first.
    *(C(module, "fused_moe") for module in ("moe_op", "moe.moe_op")),
    C("moe_align_block_size",                 "moe_align_block_size_triton"),
    # Grouped GEMM: gmm.py in 0.1.7; gemm/grouped/gmm.py later.  No version range is claimed
    # for the move (as for rope): both are tried, the flat module first.
    *(C(module, name) for name in ("gmm", "ptgmm", "nptgmm")
      for module in ("gmm", "gemm.grouped.gmm")),
)
del C


def _group(candidates: tuple[Candidate, ...]) -> dict[str, tuple[Candidate, ...]]:
    out: dict[str, list[Candidate]] = {}
    for c in candidates:
        out.setdefault(c.name, []).append(c)
    return {name: tuple(cs) for name, cs in out.items()}


# entry point -> its candidates, in table order
ENTRY_POINTS: dict[str, tuple[Candidate, ...]] = _group(CANDIDATES)


# ---- versions (the PEP 440 subset AITER's tags and wheels use; no `packaging` dependency) -

_VERSION = re.compile(r"^v?(?P<release>\d+(?:\.\d+)*)"
                      r"(?:\.?(?P<pre>a|b|rc)(?P<pre_n>\d*))?"
                      r"(?:\.?post(?P<post>\d*))?"
                      r"(?:\.?dev(?P<dev>\d*))?"
                      r"(?:\+[\w.]+)?$", re.I)
_PRE_RANK = {"a": 0, "b": 1, "rc": 2}


def version_key(version: str | None) -> tuple | None:
    """A sort key ordering versions as PEP 440 does (``0.1.7.post2.dev18`` < ``0.1.7.post2`` <
    ``0.1.10``); None for an unparseable string."""
    m = _VERSION.match((version or "").strip())
    if m is None:
        return None
    release = tuple(int(p) for p in m["release"].split("."))
    release += (0,) * (6 - len(release))
    dev = m["dev"] is not None
    post = m["post"] is not None
    if m["pre"]:
        pre = (1, _PRE_RANK[m["pre"].lower()], int(m["pre_n"] or 0))
    else:  # a bare dev release sorts before the release's pre-releases
        pre = (0,) if dev and not post else (2,)
    return (release, pre, (int(m["post"] or 0),) if post else (-1,),
            (int(m["dev"] or 0),) if dev else (float("inf"),))


def admitted(name: str, version: str | None) -> tuple[tuple[Candidate, ...], tuple[Candidate, ...]]:
    """(candidates to try, in order; candidates whose range excludes ``version``)."""
    cands = ENTRY_POINTS[name]
    return (tuple(c for c in cands if c.admits(version)),
            tuple(c for c in cands if not c.admits(version)))


# ---- the tree ----------------------------------------------------------------------------

def module_file(root: Path, module: str) -> Path | None:
    """The file of ``aiter.ops.triton.<module>`` in the tree at ``root`` (or None)."""
    base = Path(root, "aiter", "ops", "triton", *module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def modules_defining(root: Path, name: str) -> list[str]:
    """Modules (relative to ``aiter.ops.triton``) of the tree whose source has ``def name(``
    (at any indentation: a wrapper defined under a condition counts)."""
    base = Path(root, "aiter", "ops", "triton")
    pattern = re.compile(rf"^\s*def\s+{re.escape(name)}\s*\(", re.M)
    found = []
    for path in sorted(base.rglob("*.py")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if name in text and pattern.search(text):
            rel = path.relative_to(base).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found.append(".".join(parts))
    return found


@dataclass(frozen=True)
class Attempt:
    """What trying one candidate gave: ``error`` None means the module imported but lacks the
    name; ``absent`` means the module is not in the tree (and did not import)."""

    candidate: Candidate
    error: str | None
    absent: bool


def classify(name: str, root: Path, attempts: list[Attempt],
             excluded: tuple[Candidate, ...], version: str | None) -> tuple[str, str]:
    """(missing_kind, human reason) for an entry point no admitted candidate yielded."""
    tried = [a.candidate.module for a in attempts]
    broken = [a for a in attempts if a.error is not None and not a.absent]
    if broken:
        return "import-error", "; ".join(f"{a.candidate.qualified}: {a.error}" for a in broken)
    elsewhere = [m for m in modules_defining(root, name) if m not in tried]
    if elsewhere:
        ranged = {c.module: c for c in excluded}
        where = ", ".join(f"{OPS}.{m}" + (f" (named by a candidate whose range "
                                           f"[{ranged[m].since}, {ranged[m].until}) excludes "
                                           f"{version})" if m in ranged else "")
                          for m in elsewhere)
        return "moved-unknown", (f"def {name}( is in {where}, which no candidate for AITER "
                                 f"{version or '(unknown version)'} names; tried "
                                 f"{_tried(attempts)}")
    in_tried = [m for m in modules_defining(root, name) if m in tried]
    if in_tried:  # the file defines it, yet the imported module does not bind it
        return "import-error", (f"{', '.join(f'{OPS}.{m}' for m in in_tried)} imported, but "
                                f"{name} is not bound (a conditional definition?)")
    return "removed", (f"no module under aiter/ops/triton defines {name} (tried "
                       f"{_tried(attempts)})")


def _tried(attempts: list[Attempt]) -> str:
    if not attempts:
        return "no candidate: every candidate's version range excludes this version"
    return ", ".join(f"{a.candidate.qualified}" + (" (not in the tree)" if a.absent else
                                                   f" ({a.error})" if a.error else
                                                   " (no such attribute)")
                     for a in attempts)
