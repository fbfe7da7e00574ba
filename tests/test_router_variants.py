"""The Triton router's variants (tealite/backends/triton/router.py ``VARIANTS``: the same work
done another way, swept by benchmarks/router_configs.py) give the default's bits, and the
backward's routing-map check, run in its kernel, refuses what the front end's check refuses
with the same error."""
from __future__ import annotations

import re

import pytest
import torch

import tealite
from tealite.backends.triton import router as R
from tealite.router_checks import COUNTS_THE_MAP


def _inputs(device, tokens=19, experts=32, dtype=torch.bfloat16, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, experts, generator=g).to(dtype).to(device)
    grad = torch.randn(tokens, experts, generator=g).to(dtype).to(device)
    return x, grad


@pytest.mark.parametrize("in_kernel", [True, False], ids=["in-kernel", "before-launch"])
@pytest.mark.parametrize("row,marks", [(0, 3), (18, 5), (9, 0)])
def test_a_map_with_a_wrong_count_names_the_argument_and_row(triton_device, in_kernel, row,
                                                             marks):
    """Both ways of checking give check_map_counts' message for the first bad row (the last
    row sits alone in its program at 8 tokens per program, a tail block)."""
    x, grad = _inputs(triton_device)
    _, routing_map = tealite.router_fwd(x, 4, backend="triton")
    bad = routing_map.cpu().clone()
    bad[row] = False
    bad[row, :marks] = True
    message = f"routing_map must mark exactly topk = 4 experts per token; row {row} marks {marks}"
    with R.VARIANTS.override(map_check_in_kernel=in_kernel):
        tealite.router_bwd(grad, x, routing_map, 4, backend="triton")  # the good map passes
        with pytest.raises(tealite.TealiteArgumentError, match=re.escape(message)):
            tealite.router_bwd(grad, x, bad.to(triton_device), 4, backend="triton")


def test_the_triton_backward_is_the_one_that_counts_the_map():
    """The front end leaves the count to the Triton backward (its three reduction kernels and
    read are what kept the op at 6 % of copy on an H100) and keeps it for the others."""
    from tealite.backends.torch import router as T
    assert R.router_bwd in COUNTS_THE_MAP
    assert T.router_bwd not in COUNTS_THE_MAP


@pytest.mark.parametrize("score_function", ["softmax", "sigmoid"])
def test_the_map_check_variants_give_the_same_bits(triton_device, score_function):
    x, grad = _inputs(triton_device, tokens=21, experts=24, dtype=torch.float16)
    _, routing_map = tealite.router_fwd(x, 6, backend="torch", score_function=score_function)
    routing_map = routing_map.to(triton_device)
    run = lambda: tealite.router_bwd(grad, x, routing_map, 6, backend="triton",  # noqa: E731
                                     score_function=score_function, scaling_factor=1.5)
    want = run()
    with R.VARIANTS.override(map_check_in_kernel=False):
        got = run()
    assert torch.equal(got, want)
