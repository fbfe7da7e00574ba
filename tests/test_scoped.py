"""``tealite.scoped.Scoped``: a backend's platform facts and options are overridden for a block
and for the thread running it only, never by assigning a module global (issue 14 part 5).  The
holders the backends declare are checked too: each is a Scoped whose fields are the ones the
tests override."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from tealite.errors import TealiteArgumentError
from tealite.scoped import Scoped


@dataclass(frozen=True)
class Facts:
    nvidia: bool
    rounding: str | None = None


def _holder(detected: list[bool]) -> Scoped[Facts]:
    return Scoped("test.FACTS", lambda: Facts(nvidia=detected[-1]))


def test_an_override_lasts_for_its_block_and_nests():
    facts = _holder([False])
    with facts.override(nvidia=True) as inside:
        assert inside == facts.get() == Facts(nvidia=True)
        with facts.override(rounding="even"):  # keeps the enclosing override's nvidia
            assert facts.get() == Facts(nvidia=True, rounding="even")
        assert facts.get() == Facts(nvidia=True)
    assert facts.get() == Facts(nvidia=False)


def test_an_override_ends_when_its_block_raises():
    facts = _holder([False])
    with pytest.raises(RuntimeError):
        with facts.override(nvidia=True):
            raise RuntimeError("a failing test body")
    assert facts.get().nvidia is False


def test_outside_an_override_the_facts_are_detected_at_each_read():
    detected = [False]
    facts = _holder(detected)
    detected.append(True)  # e.g. torch.version.hip changed since the holder was made
    assert facts.get().nvidia is True


def test_another_thread_keeps_the_real_facts():
    """The fuzzer builds the next case's inputs on another thread while a case runs."""
    facts = _holder([False])
    seen = []
    with facts.override(nvidia=True):
        worker = threading.Thread(target=lambda: seen.append(facts.get().nvidia))
        worker.start()
        worker.join()
        assert facts.get().nvidia is True
    assert seen == [False]


def test_an_unknown_field_is_an_error_naming_the_fields():
    facts = _holder([False])
    with pytest.raises(TealiteArgumentError, match=r"\['nvidias'\].*\['nvidia', 'rounding'\]"):
        with facts.override(nvidias=True):
            pass
    assert facts.get() == Facts(nvidia=False)


def test_the_backends_hold_their_platform_facts_in_scoped_holders():
    """What the tests override: a typo in a test (or a field renamed in a backend) is an error,
    not a silently ignored override."""
    from tealite.backends import _triton_interpreter, aiter, triton
    expected = {
        aiter.PLATFORM: {"rocm", "gpu_visible", "mxfp4_scale_rounding"},
        triton.PLATFORM: {"rocm", "native_fp8_formats", "max_row_in_registers"},
    }
    if triton.HAVE_TRITON:
        from tealite.backends import aiter_triton
        from tealite.backends.aiter_triton import qgemm
        expected |= {_triton_interpreter.INTERPRETER: {"runtime_loop_gap"},
                     aiter_triton.PLATFORM: {"nvidia", "misreads_bf16_subnormals"},
                     aiter_triton.REJECTIONS: {"fp8_in_interpreter", "mxfp4_on_nvidia",
                                               "bf16_in_interpreter"},
                     qgemm.ROUTING: {"mxfp4_preference"}}
    for holder, fields in expected.items():
        assert isinstance(holder, Scoped)
        assert set(holder.get().__dataclass_fields__) == fields, holder.name


def test_a_routing_option_outside_its_choices_is_refused():
    pytest.importorskip("triton")
    from tealite.backends.aiter_triton import qgemm
    with pytest.raises(TealiteArgumentError, match="mxfp4_preference"):
        with qgemm.ROUTING.override(mxfp4_preference=("gemm_a8w8",)):
            pass
    with pytest.raises(TealiteArgumentError, match="non-empty"):
        with qgemm.ROUTING.override(mxfp4_preference=()):
            pass
    with qgemm.ROUTING.override(mxfp4_preference=(qgemm.FP4,)):
        assert qgemm.route("mx", None, None, 33, 32, 256, False) == qgemm.FP4
    assert qgemm.route("mx", None, None, 33, 32, 256, False) == qgemm.FP4_SHUFFLED_WEIGHT
