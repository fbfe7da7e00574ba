"""tealite_verify: op-level differential testing and numerics verification for tealite.

float64 references (``references``), Hypothesis strategies (``strategies``), tolerance tiers
(``tiers``), declarative op specs (``specs``) and the differential runner (``runner``).
"""
