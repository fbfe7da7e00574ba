"""float64 references, one module per op family, written from the math in numpy.

They take and return numpy float64 arrays and never call tealite or torch.nn.functional:
a reference may not share a code path with an implementation it judges.
"""
