"""Compound modules (torch.nn.Module) composed of tealite's verified ops: the floor above the
front-end ops, which it calls; no op, backend or bottom module imports it."""
from tealite.modules.layernorm_mlp import (NORMALIZATIONS, LayerNormLinear, LayerNormMLP,
                                           ModuleBackends)

__all__ = ["LayerNormLinear", "LayerNormMLP", "ModuleBackends", "NORMALIZATIONS"]
