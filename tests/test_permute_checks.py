"""moe_permute's value checks and host cost on the triton path (issue 16's op-level target):
the map kernels read the caller's routing as given, the checks come out of the map kernels'
counts in one read-back whose place in the call is pinned (launches, read), the counts'
host copy is started only where the call reads them, and the errors stay those of the
front end (the bounds named, int64 indices included, across scan blocks) on every backend.
"""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite import TealiteArgumentError, registry
from tealite.moe_types import MapType
from tealite_verify.references import permute as ref
from test_permute import TE_MASK, TE_ROWS, X, _backends


# ---- host cost of the triton path (issue 16's op-level target) -----------------------------

def _triton_or_skip():
    why = registry.get_backend("triton").unavailable_reason()
    if why is not None:
        pytest.skip(str(why))


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64])
def test_triton_row_map_reads_every_mask_dtype_as_given(dtype):
    """The map kernels read the caller's mask without a conversion op: a bool mask as bytes,
    int masks in their own dtype, any nonzero value routed (2, -1)."""
    _triton_or_skip()
    routing = TE_MASK.to(dtype)
    if dtype != torch.bool:
        routing = routing * torch.tensor([2, -1, 1], dtype=dtype)
    p = tealite.moe_permute(torch.zeros(5, 1), routing, num_out_tokens=6, backend="triton")
    want = ref.row_id_map(TE_MASK.numpy(), "mask", 3, 6)
    assert p.row_id_map.rows.tolist() == want.tolist()
    assert p.row_id_map.tokens_per_expert == (3, 2, 1)


def test_triton_row_map_marks_slots_no_expert_owns():
    """An index out of range (reachable only where the front end's value check is skipped:
    a CUDA-graph capture) gets row -1 and moves nothing, instead of an unwritten row."""
    _triton_or_skip()
    impl = registry.get_backend("triton").impls["moe_permute"]
    idx = torch.tensor([[0], [5], [1], [-3]], dtype=torch.int32)
    x = torch.arange(4.0).reshape(4, 1)
    out, row_map, _, _ = impl.fn(x, idx, map_type=MapType.INDEX, num_experts=2,
                                 num_out_tokens=2, probs=None, scale_inv=None)
    assert row_map.rows.tolist() == [[0], [-1], [1], [-1]]
    assert out.tolist() == [[0.0], [2.0]] and row_map.tokens_per_expert == (1, 1)


# (map type, num_out_tokens given): the order of one checked call's launches and its one
# read-back.  An index map's check reads the rows kernel's counts and bounds after every
# launch (x and the probs scattered); a mask without num_out_tokens reads its counts before
# the scatters (they size the output), with it after them.
CHECKED_ORDER = {
    ("index", None): ["_rows_kernel", "_scatter_rows_kernel", "_scatter_rows_kernel", "read"],
    ("index", 5): ["_rows_kernel", "_scatter_rows_kernel", "_scatter_rows_kernel", "read"],
    ("mask", None): ["_count_kernel", "_rows_kernel", "read", "_scatter_rows_kernel",
                     "_scatter_rows_kernel"],
    ("mask", 5): ["_count_kernel", "_rows_kernel", "_scatter_rows_kernel",
                  "_scatter_rows_kernel", "read"],
}


@pytest.mark.parametrize("map_type,num_out", list(CHECKED_ORDER))
def test_triton_permute_reads_the_device_once(map_type, num_out):
    """One host read-back per checked permute call, which also settles tokens_per_expert (no
    second read when the grouped GEMM asks for its m_splits), and no torch op launched for
    the checks: they come out of the map kernels.  Each read is a device sync, which at op
    level cost more than the kernels (docs/benchmarks.md); the read sits after every launch
    where nothing has to be sized by it, so the host's dispatch and launches overlap the
    device instead of following a drained queue.  Fails if a check adds a read, a launch or
    moves the read earlier (main at 17b4129: a torch aminmax / sum and the read before the
    map kernels, and a second read for tokens_per_expert)."""
    _triton_or_skip()
    from benchmarks.host_cost_moe import counting, torch_kernel_ops
    import tealite.backends.triton.permute as module
    idx = torch.tensor([[0, 2], [1, 2], [2, 0]])
    routing = idx if map_type == "index" else \
        torch.zeros((3, 3), dtype=torch.bool).scatter_(1, idx, True)
    x, probs = torch.ones(3, 4), torch.rand(routing.shape)

    def call():
        return tealite.moe_permute(x, routing, map_type=map_type, num_experts=3,
                                   num_out_tokens=num_out, probs=probs, backend="triton")
    with counting([module]) as counts:
        p = call()
        assert counts.order == CHECKED_ORDER[(map_type, num_out)]
        kept = (2, 1, 3) if num_out is None else (2, 1, 2)
        assert p.row_id_map.tokens_per_expert == kept
        assert sum(counts.reads.values()) == 1, counts.reads
    # the interpreter runs the kernels through torch copies of its own; no other op may run
    assert set(torch_kernel_ops(call)) <= {"aten::set_", "aten::new_empty", "aten::copy_"}
    assert torch.Tensor.tolist.__name__ == "tolist"  # restored on exit


def test_host_copy_waits_for_its_copy_before_reading():
    """The counts' host copy reads only after its event (CUDA: the async copy into pinned
    memory has landed); a CPU tensor is read as it is, with nothing to wait for."""
    from tealite.moe_types import HostCopy
    seen = []

    class Done:
        def synchronize(self):
            seen.append("waited")
    host = torch.tensor([3, 1])
    assert HostCopy(host, Done()).tolist() == [3, 1] and seen == ["waited"]
    cpu = HostCopy.start(host)
    assert cpu.host is host and cpu.done is None and cpu.tolist() == [3, 1]


@pytest.mark.parametrize("map_type", ["mask", "index"])
@pytest.mark.parametrize("check_values", [True, False])
def test_triton_copies_the_counts_only_where_the_call_reads_them(monkeypatch, map_type,
                                                                  check_values):
    """The counts' host copy (a device copy between the map kernels and the scatters on CUDA)
    is started for the checked call, which reads them right after, and not for the unchecked
    one (TE's convention: nobody may read them, and its rows were at the target)."""
    _triton_or_skip()
    import tealite.backends.triton.permute as module
    started = []
    monkeypatch.setattr(module, "_host_copy",
                        lambda t, f=module._host_copy: started.append(t) or f(t))
    idx = torch.tensor([[0, 2], [1, 2], [2, 0]])
    routing = idx if map_type == "index" else \
        torch.zeros((3, 3), dtype=torch.bool).scatter_(1, idx, True)
    p = tealite.moe_permute(torch.ones(3, 4), routing, map_type=map_type, num_experts=3,
                            num_out_tokens=6, check_values=check_values, backend="triton")
    assert len(started) == (1 if check_values else 0)
    assert p.row_id_map.tokens_per_expert == (2, 1, 3)


INDEX_BAD = [
    (torch.tensor([[0, 1], [1, 3]]), r"got values in \[0, 3\]"),
    (torch.tensor([[0, -1], [1, 2]], dtype=torch.int32), r"got values in \[-1, 2\]"),
    (torch.tensor([[0, 1], [2 ** 40, -(2 ** 40)]]), r"got values in \[-1099511627776, "
                                                    r"1099511627776\]"),
]


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("block", [4096, 2], ids=["one block", "scan blocks"])
@pytest.mark.parametrize("idx,message", INDEX_BAD, ids=["high", "negative", "int64 wide"])
def test_out_of_range_indices_raise_with_their_bounds(monkeypatch, backend, block, idx,
                                                      message):
    """The range check keeps its error and reports the indices' min and max, int64 ones
    included, also where triton's check comes out of its map kernel after the launches (the
    bounds carried across scan blocks: 2 slots a block here); in range passes."""
    import tealite.backends.triton.permute as module
    monkeypatch.setattr(module, "_MAP_BLOCK", block)
    x = torch.arange(8.0).reshape(2, 4)
    with pytest.raises(TealiteArgumentError, match=r"indices must lie in \[0, num_experts = 3\), "
                                                   + message):
        tealite.moe_permute(x, idx, map_type="index", num_experts=3, backend=backend)
    ok = tealite.moe_permute(x, idx.clamp(0, 2), map_type="index", num_experts=3,
                             backend=backend)
    assert ok.row_id_map.rows.tolist() == \
        ref.row_id_map(idx.clamp(0, 2).numpy(), "index", 3, 4).tolist()


def test_a_checked_after_map_without_bounds_is_still_checked(monkeypatch):
    """A backend checked after its launches whose index map carries no bounds (its counts
    already read) still gets the range check: the front end's own read."""
    _triton_or_skip()
    import tealite.backends.triton.permute as module
    monkeypatch.setattr(module, "_kept", lambda counts, copy, map_type, e, n: ((0,) * e, n))
    with pytest.raises(TealiteArgumentError, match=r"got values in \[0, 3\]"):
        tealite.moe_permute(torch.ones(2, 4), torch.tensor([[0, 1], [1, 3]]), map_type="index",
                            num_experts=3, backend="triton")


@pytest.mark.parametrize("backend", _backends())
def test_num_out_above_a_masks_routed_count_raises(backend):
    """A mask's num_out_tokens above its routed slots raises with both numbers (triton:
    checked from the counts read after its launches); equal to them passes."""
    with pytest.raises(TealiteArgumentError,
                       match=r"num_out_tokens \(8\) must be <= the routed slots \(7\)"):
        tealite.moe_permute(X, TE_MASK, num_out_tokens=8, backend=backend)
    p = tealite.moe_permute(X, TE_MASK, num_out_tokens=7, backend=backend)
    assert p.row_id_map.rows.tolist() == TE_ROWS


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("map_type", ["mask", "index"])
def test_unchecked_permute_reads_nothing_back(backend, map_type):
    """check_values=False (the caller vouches for the routing, as TE assumes) gives the same
    rows and map as the checked call; on triton the call reads nothing back until
    tokens_per_expert is asked for (the checked call reads once)."""
    from benchmarks.host_cost_moe import counting
    idx = torch.tensor([[0, 2], [1, 2], [2, 0], [1, 0]])
    routing = idx if map_type == "index" else \
        torch.zeros((4, 3), dtype=torch.bool).scatter_(1, idx, True)
    x = torch.arange(8.0).reshape(4, 2)
    kw = dict(map_type=map_type, num_experts=3, num_out_tokens=7, backend=backend)
    checked = tealite.moe_permute(x, routing, **kw)
    with counting() as counts:
        unchecked = tealite.moe_permute(x, routing, check_values=False, **kw)
        at_call = sum(counts.reads.values())
    if backend == "triton":
        assert at_call == 0, counts.reads
    assert torch.equal(unchecked.out, checked.out)
    assert torch.equal(unchecked.row_id_map.rows, checked.row_id_map.rows)
    assert unchecked.row_id_map.tokens_per_expert == checked.row_id_map.tokens_per_expert
