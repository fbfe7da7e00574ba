"""The multi-tensor ops' host path (issue 17: an Adam step over 1000 tensors was host-bound on an
H100, 12.1 ms at op level for a 3.5 ms kernel): the fast list checks agree with the per-entry
ones, keep no per-entry objects alive (which would wake the garbage collector every step), the
Triton backend's tables are cached on exactly what they are a function of, and the host-cost
script times the path with the launch stubbed."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import tealite
from tealite import registry
from tealite._checks import one_dtype_and_device
from tealite.backends._host_tables import device_table, device_table_of_array
from tealite.errors import TealiteArgumentError
from tealite.ops.multi_tensor import check_list
from tealite.training_types import MTA_CHUNK_ELEMENTS, AdamOptions


def _triton_or_skip():
    reason = registry.get_backend("triton").unavailable_reason()
    if reason:
        pytest.skip(f"triton backend unavailable: {reason}")


# ---- the fast list checks ------------------------------------------------------------------

def test_fast_checks_pass_good_lists_and_name_the_bad_entry():
    good = [torch.zeros(2, 3), torch.nn.Parameter(torch.zeros(4))]  # a subclass is a tensor
    assert check_list("xs", good, like=[torch.ones(2, 3), torch.ones(4)]) == tuple(good)
    assert one_dtype_and_device(good) == torch.float32
    cases = [([torch.zeros(2), 3.0], r"xs\[1\] must be a torch.Tensor, got float", None),
             ([torch.zeros(2), torch.zeros(2, dtype=torch.float16)], r"xs\[1\] dtype float16 "
              r"differs from xs\[0\]'s float32", None),
             ([torch.zeros(2), torch.zeros(2, device="meta")], r"xs\[1\] is on meta", None),
             ([torch.zeros(2, 3), torch.zeros(3, 2)], r"xs\[1\] shape \(3, 2\) differs from its "
              r"partner's \(2, 3\)", [torch.zeros(2, 3), torch.zeros(2, 3)])]
    for xs, message, like in cases:  # same element count, other shape: still an error
        with pytest.raises(TealiteArgumentError, match=message):
            check_list("xs", xs, like=like)
    assert one_dtype_and_device([torch.zeros(1), torch.zeros(1, device="meta")]) is None


def _young_objects_left(fn) -> int:
    """How many garbage-collected objects ``fn`` leaves allocated (the young-generation count
    that triggers a collection at 700), the collector paused so that none runs meanwhile."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        before = gc.get_count()[0]
        fn()
        return gc.get_count()[0] - before
    finally:
        if was_enabled:
            gc.enable()


def test_list_checks_keep_no_per_entry_objects_alive():
    """A pass that held 2000 ``torch.Size`` per call (the first version of the fast check)
    woke the collector every call and ran a full ~100 ms collection every ~100 calls."""
    xs = [torch.zeros(i % 7 + 1) for i in range(2000)]
    ys = [torch.zeros(i % 7 + 1) for i in range(2000)]
    held = []
    assert _young_objects_left(lambda: held.append([t.shape for t in xs])) >= 2000  # the probe
    assert _young_objects_left(lambda: check_list("ys", ys, like=xs)) < 50


# ---- the Triton backend's cached tables ------------------------------------------------------

def test_array_tables_match_the_value_tables():
    values = np.array([0, 3, 1 << 40, 7], dtype=np.int64)
    for dtype in (torch.int64, torch.int32):
        small = values[values < 1 << 31]
        want = device_table(small.tolist(), dtype, "cpu")
        got = device_table_of_array(small, dtype, "cpu")
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert device_table_of_array(values, torch.int64, "cpu") is device_table_of_array(
        values.copy(), torch.int64, "cpu")  # cached on the bytes, not the array object
    assert device_table_of_array(np.zeros(0, np.int64), torch.int64, "cpu").numel() == 0


def test_chunk_tables_are_a_function_of_the_counts():
    from tealite.backends.triton.multi_tensor import chunk_table
    a = [torch.empty(MTA_CHUNK_ELEMENTS + 1), torch.empty(0), torch.empty(3)]
    b = [torch.empty(MTA_CHUNK_ELEMENTS + 1), torch.empty(0), torch.empty(3)]
    assert all(x is y for x, y in zip(chunk_table(a, "cpu"), chunk_table(b, "cpu")))
    owner, first, numels = chunk_table([torch.empty(3), torch.empty(2 * MTA_CHUNK_ELEMENTS)],
                                       "cpu")
    assert owner.tolist() == [0, 1, 1] and first.tolist() == [0, 0, MTA_CHUNK_ELEMENTS]
    assert owner.dtype == torch.int32 and numels.tolist() == [3, 2 * MTA_CHUNK_ELEMENTS]


def test_address_tables_follow_the_pointers():
    from tealite.backends.triton.multi_tensor import address_tables
    x, y, z = torch.zeros(64), torch.zeros(8), torch.zeros(8)
    (t1,), aligned = address_tables(([x, y],), "cpu")
    assert t1.tolist() == [x.data_ptr(), y.data_ptr()] and aligned
    assert address_tables(([x, y],), "cpu")[0][0] is t1  # the same pointers: the cached table
    (t2,), _ = address_tables(([x, z],), "cpu")  # another tensor in the same place of the list
    assert t2.tolist() == [x.data_ptr(), z.data_ptr()]
    assert not address_tables(([x[1:], torch.zeros(0)],), "cpu")[1]


def test_non_contiguous_tensors_are_named():
    from tealite.backends.triton.multi_tensor import _contiguous
    _contiguous([torch.zeros(2, 3), torch.zeros(0)])
    with pytest.raises(ValueError, match="tensor 1 is not contiguous"):
        _contiguous([torch.zeros(2, 3), torch.zeros(2, 3).t(), torch.zeros(2, 3).t()])


# ---- the host-cost script ------------------------------------------------------------------

def test_host_cost_script_stubs_the_launch(monkeypatch, capsys):
    _triton_or_skip()
    from benchmarks import host_cost_multi_tensor as hc
    from tealite.backends.triton import multi_tensor as tmt
    real = tmt._adam_kernel
    with hc.launches_stubbed() as stubs:
        calls = hc.make_calls(hc.make_lists(6, 8, "cpu"))
        for fn in calls.values():
            fn()
        assert {k: s.launches for k, s in stubs.items()} == {
            "_adam_kernel": 1, "_sgd_kernel": 1, "_scale_kernel": 0, "_sumsq_kernel": 1}
    assert tmt._adam_kernel is real
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    hc.main(["--tensors", "6", "--max-log2", "8", "--reps", "2", "--reads"])
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines[:-1]] == list(calls) and "ms min per call" in lines[0]
    assert lines[-1].startswith("one pass per attribute") and "data_ptr" in lines[-1]


def test_adam_through_the_fast_path_matches_the_torch_backend():
    """The Triton op over a list that takes the fast paths (Parameters, an empty tensor)."""
    _triton_or_skip()
    g = torch.Generator().manual_seed(3)
    sizes = (70, 0, 7)
    grads, params = ([torch.randn(n, generator=g) for n in sizes] for _ in range(2))
    out = {}
    for backend in ("torch", "triton"):
        ps = [torch.nn.Parameter(p.clone(), requires_grad=False) for p in params]
        ms, vs = [torch.zeros(n) for n in sizes], [torch.zeros(n) for n in sizes]
        tealite.multi_tensor_adam(grads, ps, ms, vs, AdamOptions(lr=0.5, step=2),
                                  backend=backend)
        out[backend] = torch.cat([torch.cat(x) for x in (ps, ms, vs)])
    assert not torch.equal(out["triton"][:77], torch.cat(params))  # the step did run
    torch.testing.assert_close(out["triton"], out["torch"], rtol=1e-6, atol=1e-7)
