"""``tealite.backends._pad.pad_end``: F.pad's result, and no F.pad call on a zero-size tensor
(torch <= 2.9 refuses those, pytorch issue 161014; the project supports such ROCm stacks)."""
from __future__ import annotations

import pytest
import torch

from tealite.backends import _pad


@pytest.mark.parametrize("shape,pads,value", [((0, 3), (0, 1), 0.0), ((2, 0), (0, 3, 0, 2), 1.0),
                                              ((2, 3), (0, 1, 0, 1), 0.0), ((0,), (0, 5), 2.0)])
def test_pad_end_is_f_pad_without_calling_it_on_empty_tensors(monkeypatch, shape, pads, value):
    t = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    want = torch.nn.functional.pad(t, pads, value=value)
    if t.numel() == 0:
        def refuse(*a, **k):
            raise RuntimeError("F.pad on a zero-size dim (torch <= 2.9)")
        monkeypatch.setattr(torch.nn.functional, "pad", refuse)
    got = _pad.pad_end(t, pads, value=value)
    assert got.shape == want.shape and torch.equal(got, want)
