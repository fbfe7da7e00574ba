"""Tolerance tiers: how far a backend's output may be from the float64 reference.

No tier is a blanket ``atol``/``rtol``: each derives what it accepts from what the computation
does, and every comparison returns a :class:`metrics.Metrics` labelled with a
:class:`metrics.Tier`.  One module per tier, each with its single-backend check and its pair
rule (backend vs backend); specs choose a tier per output and give it the reference.

===========================  =====================================================
module                       tiers (labels)
===========================  =====================================================
``primitives``               unit roundoff, gamma_n, ulp, overflow threshold, underflow
``metrics``                  ``Tier``, ``Metrics``, the one builder; ``malformed``,
                             ``absent``, the self-judged pair rule
``exact``                    ``exact``
``bounded``                  ``bounded``: the comparison under every value tier
``ulp``                      ``ulp``, ``ulp-pair``
``gemm``                     ``gemm``, ``gemm-pair``
``grouped_gemm``             ``gemm`` per group (each group's K), empty groups ``exact``
``parity``                   ``parity``: a grouped path against its own split path
``probabilistic``            opt-in "suspicious" verdict on the gemm tier
``quantized``                quantized codes and scales (``exact``), ``absent`` amax
``fp32_div``                 ``div-<n>ulp``, ``recip-<n>ulp``, ``fp32-div-pair``
``e8m0_adjusted``            ``e8m0-adjusted``, ``e8m0-adjusted-pair``
``fp4_ties``                 ``fp4-ties``
``shuffle``                  ``shuffle``
``dequantized``              ``dequantized``, ``-pair``, ``-cross-recipe``
``code_interval``            ``code-interval``, ``e8m0-interval``, ``scale-interval``,
                             ``amax-interval`` (and their ``-pair``), ``exact-pair``
===========================  =====================================================

Tiers import references and ``tealite`` shared types, never specs, the runner or the CLI.
"""
