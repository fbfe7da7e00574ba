"""``list`` a person can read (issue 18): the ops x backends matrix fits a terminal, says a
backend's unavailability reason once, keeps every per-cell fact as a numbered note, filters
by op and backend with clear errors, and has a JSON form that round-trips; ``run`` shows its
progress on stderr unless told not to, with its stdout unchanged."""
from __future__ import annotations

import io
import json
import sys

import pytest
import torch

from tealite_verify import progress, support_matrix
from tealite_verify.cli import main
from tealite_verify.support_matrix import Matrix, Status

REASON = "needs the flux capacitor (test backend)"


def _list(capsys, *args) -> tuple[int, str, str]:
    rc = main(["list", *args])
    got = capsys.readouterr()
    return rc, got.out, got.err


def _matrix_section(out: str) -> str:
    """Everything before the recipes table: title, matrix, legend, backends, notes."""
    return out.split("\nrecipe ", 1)[0]


def _cells(section: str) -> dict[tuple[str, str], str]:
    """(op, column header) -> the cell's text, over every column group of the matrix."""
    out, header = {}, None
    for line in section.split("\nlegend:", 1)[0].splitlines():
        words = line.split()
        if words[:1] == ["op"]:
            header = words[1:]
        elif header and words and not set(words[0]) <= {"-"}:
            out.update({(words[0], h): w for h, w in zip(header, words[1:])})
    return out


def _words(text: str) -> str:
    return " ".join(text.split())  # wrapped lines joined back


@pytest.fixture
def odd_backends(make_backend):
    """An unavailable backend implementing three ops, and an available one implementing gemm
    in float16 only (partial), amax in any dtype (supported, but not as its other ops)."""
    gone = make_backend("gone")
    gone.probe = lambda: REASON
    for op in ("gemm", "amax", "act_fwd"):
        gone.implements(op)(lambda *a, **k: None)
    half = make_backend("halfonly")
    half.implements("gemm", dtypes=(torch.float16,))(lambda *a, **k: None)
    half.implements("amax")(lambda *a, **k: None)
    floats = (torch.float16, torch.bfloat16, torch.float32)
    half.implements("act_fwd", dtypes=floats)(lambda *a, **k: None)
    half.implements("act_bwd", dtypes=floats)(lambda *a, **k: None)
    return gone.name, half.name


def test_list_fits_an_80_column_terminal_with_every_backend_and_op(capsys):
    rc, out, _ = _list(capsys)
    assert rc == 0
    matrix = _matrix_section(out).splitlines()
    assert len(matrix) > 50 and max(map(len, matrix)) <= support_matrix.WIDTH
    assert sum(line.startswith("op ") for line in matrix) == 1  # one group of columns
    assert max(len(line) for line in out.splitlines()) <= 100  # the other tables: 100


def test_many_backends_split_the_matrix_into_column_groups(make_backend):
    """Eight more backends would make one row ~140 columns: the matrix is cut into groups of
    columns, each repeating the op column, and still fits."""
    from tealite import registry
    from tealite_verify.specs import all_specs
    for i in range(8):
        make_backend(f"plugin{i}_with_a_long_name")
    m = support_matrix.build(all_specs(), registry.backends(), ("cpu",))
    grid = support_matrix.render(m).split("\nlegend:", 1)[0].splitlines()
    assert max(map(len, grid)) <= support_matrix.WIDTH
    headers = [line for line in grid if line.startswith("op ")]
    assert len(headers) >= 2
    assert sum(len(h.split()) - 1 for h in headers) == len(m.backends)  # each column once


def test_a_backends_reason_is_printed_once_and_its_cells_marked(capsys, odd_backends):
    gone, _ = odd_backends
    rc, out, _ = _list(capsys)
    section = _matrix_section(out)
    assert rc == 0 and _words(section).count(REASON) == 1
    assert f"{gone} unavailable: {REASON}" in _words(section)
    cells = _cells(section)
    assert [cells[(op, gone)] for op in ("gemm", "amax", "act_fwd", "act_bwd")] == \
        ["✗", "✗", "✗", "·"]


def test_cells_that_differ_from_their_backend_get_numbered_notes(capsys, odd_backends):
    """What the old table said per cell is still there: the partial gemm's refusal, amax's
    dtypes, act_fwd / act_bwd's shared support on the backend's own line."""
    _, half = odd_backends
    rc, out, _ = _list(capsys, "--backend", half, "--op", "gemm", "--op", "amax",
                       "--op", "act_fwd", "--op", "act_bwd")
    section = _matrix_section(out)
    cells = {op: c for (op, _), c in _cells(section).items()}
    assert len(cells) == 4 and cells["act_fwd"] == cells["act_bwd"] == "✓"
    assert cells["amax"] == "✓1" and cells["gemm"] == "~2"
    text = _words(section)
    assert f"= {half} bfloat16, float16, float32; on cpu/cuda, unless a note says otherwise" \
        in text
    assert f"1 {half}: any dtype; on cpu/cuda 2 {half}: float16; on cpu/cuda; refuses " \
        "float32, bfloat16" in text


def test_filters_narrow_the_matrix(capsys):
    rc, out, _ = _list(capsys, "--op", "gemm", "--op", "amax", "--backend", "torch")
    assert rc == 0 and set(_cells(_matrix_section(out))) == {("amax", "torch"),
                                                             ("gemm", "torch")}
    assert "triton" not in _matrix_section(out)


@pytest.mark.parametrize("argv, named, valid", [
    (["--op", "gemmm"], "--op: unknown name 'gemmm' (did you mean 'gemm'?)", "qgemm"),
    (["--op", "gemm", "--backend", "nosuch"], "--backend: unknown name 'nosuch'", "torch"),
])
def test_a_bad_filter_is_an_error_naming_the_option_and_the_valid_names(capsys, argv, named,
                                                                       valid):
    rc, out, err = _list(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith(f"error: {named}") and "; valid: " in err
    assert valid in err.split("; valid: ")[1].split(", ")


def test_json_round_trips_and_keeps_the_schema(capsys, odd_backends):
    gone, half = odd_backends
    rc, out, _ = _list(capsys, "--json")
    assert rc == 0
    d = json.loads(out)
    assert set(d) == {"schema", "machine_devices", "ops", "backends", "cells"}
    assert d["schema"] == support_matrix.SCHEMA
    assert len(d["cells"]) == len(d["ops"]) * len(d["backends"])
    assert {c["status"] for c in d["cells"]} <= {s.value for s in Status}
    assert Matrix.from_dict(d).to_dict() == d
    cell = {(c["op"], c["backend"]): c for c in d["cells"]}
    assert cell[("gemm", gone)]["status"] == "unavailable" and \
        cell[("gemm", gone)]["reason"] == REASON
    assert cell[("gemm", half)] == {"op": "gemm", "backend": half, "status": "partial",
                                    "reason": "refuses float32, bfloat16",
                                    "dtypes": ["float16"], "layouts": None,
                                    "devices": ["cpu", "cuda"]}
    assert cell[("act_bwd", gone)]["reason"] == "no implementation of act_bwd"
    roundtrip = next(o for o in d["ops"] if o["name"] == "quant_roundtrip")
    assert roundtrip["drives"] == ["quantize", "dequantize"]
    with pytest.raises(ValueError, match="schema"):
        Matrix.from_dict(dict(d, schema="tealite_verify.list/0"))


def test_ascii_fallback(capsys):
    assert support_matrix.can_encode("utf-8") and not support_matrix.can_encode("ascii")
    rc, out, _ = _list(capsys, "--ascii", "--op", "gemm", "--op", "amax")
    assert rc == 0 and out.isascii()
    assert _cells(_matrix_section(out))[("amax", "torch")] == "+"
    assert "legend: + supported" in out
    _, out, _ = _list(capsys, "--op", "gemm")
    assert not out.isascii()  # the unicode symbols where stdout can print them


def test_ascii_is_chosen_for_a_stdout_that_cannot_print_the_symbols(monkeypatch):
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))
    assert main(["list", "--op", "amax", "--backend", "torch"]) == 0  # no UnicodeEncodeError
    sys.stdout.flush()
    assert b"legend: + supported" in raw.getvalue()


# ---- run's progress -----------------------------------------------------------------------

class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_in_a_log_is_a_plain_line_every_interval():
    clock, log = _Clock(), io.StringIO()
    p = progress.RunProgress(2, stream=log, now=clock)
    p.begin_op("gemm")
    for _ in range(3):
        clock.t += 1
        p.case_done(failed=False)
    assert log.getvalue() == ""  # a short run writes nothing
    clock.t += progress.PLAIN_INTERVAL_S
    p.case_done(failed=True)
    p.op_done()
    p.above("a failure report")
    p.finish()
    assert log.getvalue().splitlines() == [
        "[run] 0/2 ops, at gemm | 4 cases | 1 failing | 0:33 elapsed",
        "a failure report",
        "[run] 1/2 ops, at gemm | 4 cases | 1 failing | 0:33 elapsed"]
    assert "\r" not in log.getvalue()


def test_progress_on_a_terminal_rewrites_one_line_and_keeps_reports_off_it():
    clock, tty = _Clock(), _Tty()
    p = progress.RunProgress(1, stream=tty, now=clock)
    p.begin_op("amax")
    clock.t += 1
    p.case_done(failed=False)
    p.above("report")
    clock.t += 1
    p.op_done()
    p.finish()
    text = tty.getvalue()
    assert text.count("[run] ") == 4 and text.endswith("| 1 cases | 0 failing | 0:02 elapsed\n")
    assert "\r\033[Kreport\n" in text  # the line is erased before the report


def test_progress_disabled_writes_nothing_but_reports():
    clock, tty = _Clock(), _Tty()
    p = progress.RunProgress(1, stream=tty, now=clock, enabled=False)
    clock.t += 60
    p.case_done(failed=True)
    p.above("report")
    p.finish()
    assert tty.getvalue() == "report\n"


def test_run_shows_progress_unless_told_not_to(capsys, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_INTERVAL_S", 0.0)  # a line per step, as on a long run
    argv = ["run", "--op", "amax", "--backend", "torch", "--examples", "1"]
    outs = []
    for extra in ([], ["--no-progress"], ["--quiet"]):
        assert main(argv + extra) == 0
        got = capsys.readouterr()
        outs.append(got.out)
        lines = [line for line in got.err.splitlines() if line.startswith("[run] ")]
        if extra:
            assert lines == []
        else:
            assert lines[0].startswith("[run] 0/1 ops, at amax | 0 cases | 0 failing")
            assert lines[-1].startswith("[run] 1/1 ops | ") and " 0 failing | " in lines[-1]
    assert outs[0] == outs[1] == outs[2]  # stdout: the summary, as before
