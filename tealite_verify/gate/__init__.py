"""The AITER version gate: ``python -m tealite_verify gate capture|compare``.

``capture`` runs a fixed, seeded case set (:mod:`caseset`) through every AITER backend and
writes a baseline: per op x backend x recipe x dtype x shape class the availability, the
entry points that ran, the verdict against the float64 / bit-exact references (and against a
peer backend), the worst error/tolerance ratio and error statistics; plus every declared
contract and, for the quantizers, the contract *observed* by probing (:mod:`observe`).

``compare`` re-runs exactly the baseline's cases against a candidate AITER (the installed one,
or a wheel / source tree given by path) and fails on new failures, vanished entry points,
contract changes and error growth beyond a stated factor; it reports improvements too
(:mod:`compare`, :mod:`report`).
"""
