"""Hypothesis strategies: shapes, dtypes, value distributions.  They draw *descriptions*
(sizes, distribution parameters, seeds); :mod:`tealite_verify.tensors` builds the tensors."""
