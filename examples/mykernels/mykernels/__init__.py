"""An example kernel package with a tealite backend (``mykernels.tealite_plugin``).

torch stands in for the team's kernels.  One op is deliberately wrong, as a real kernel can
be: ``act_fwd`` computes ``gelu`` (TE's exact, erf-based GELU) with the tanh approximation.
"""
