"""The CLI's main job, list and repro, in-process."""
from __future__ import annotations

import json

from tealite_verify.cli import drawn_cases, main
from tealite_verify.specs import get_spec


def test_run_all_ops_passes_on_torch(capsys):
    assert main(["run", "--examples", "2"]) == 0
    out = capsys.readouterr().out
    for op in ("gemm", "layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd",
               "act_fwd", "act_bwd", "dbias_dact", "quantize", "dequantize", "amax", "qgemm"):
        assert op in out
    ran = out.split("backends that ran: ")[1].split(";")[0].split(", ")
    assert {"scaled_mm", "torch"} <= set(ran)


def test_run_writes_json(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["run", "--op", "gemm", "--examples", "1", "--json", str(path)]) == 0
    reports = json.loads(path.read_text())
    assert reports and all(r["verdict"] == "pass" for r in reports)
    assert all("repro" in r and r["comparisons"] for r in reports if r["case"]["m"] > 0)


def test_repro_roundtrip(capsys):
    case = get_spec("layernorm_fwd").smoke_cases[0]
    assert main(["repro", "--op", "layernorm_fwd", "--case", json.dumps(case)]) == 0
    assert "layernorm_fwd on cpu: pass" in capsys.readouterr().out


def test_drawn_cases_are_reproducible_from_seed():
    spec = get_spec("gemm")
    assert drawn_cases(spec, 5, "ci", 3) == drawn_cases(spec, 5, "ci", 3)
    assert drawn_cases(spec, 5, "ci", 3) != drawn_cases(spec, 5, "ci", 4)


def test_list_shows_ops_and_backends(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[1].split()  # line 0: the title; the names are abbreviated
    assert header[0] == "op" and {"s_mm", "torch", "triton", "a_trit"} <= set(header)
    backend_lines = out.split("\nbackends:\n", 1)[1].split("\nnotes:", 1)[0]
    assert all(f" {n} " in backend_lines for n in ("scaled_mm", "torch", "triton",
                                                    "aiter_triton"))
    assert "\ngemm " in out


def test_list_shows_the_numerics_probed_on_this_machine(capsys):
    """Subnormal handling of torch's matmul is probed, never assumed (issue 13)."""
    import torch

    from tealite.backends.torch.probes import matmul_flushes_subnormal_inputs
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "probed on this machine" in out and "torch.matmul bfloat16" in out
    want = "treated as zero" if matmul_flushes_subnormal_inputs(torch.bfloat16) else "kept"
    line = next(l for l in out.splitlines() if "torch.matmul bfloat16" in l)
    assert want in line


def test_list_shows_declared_numerics_that_differ_by_device(capsys, make_backend):
    """A plug-in whose declaration depends on the device shows both values; one that does
    not is not listed; one that cannot be evaluated for a device says so (issue 13)."""
    import torch

    by_device = make_backend("bydevice")
    by_device.implements("act_fwd", numerics=lambda p: {
        "compute_dtype": torch.float16 if p["device"] == "cuda" else torch.float32,
        "rsqrt": "exact"})(lambda x, *, kind: x)  # the same on both devices
    constant = make_backend("constant")
    constant.implements("act_fwd", numerics={"compute_dtype": torch.float16})(
        lambda x, *, kind: x)

    def needs_the_device(p):
        if p["device"] == "cuda":
            raise RuntimeError("probe needs a GPU")
        return {}

    probed = make_backend("probed")
    probed.implements("act_fwd", numerics=needs_the_device)(lambda x, *, kind: x)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    section = out.split("declared numerics that differ between cpu and cuda")[1]
    rows = [line.split() for line in section.splitlines()]
    assert [by_device.name, "act_fwd", "compute_dtype", "float32", "float16"] in \
        [r[:5] for r in rows]
    assert not any(r and r[0] == constant.name for r in rows)
    assert not any("rsqrt" in r for r in rows if r and r[0] == by_device.name)
    assert f"note: {probed.name} act_fwd: the cuda declaration cannot be evaluated here " \
           f"(RuntimeError: probe needs a GPU)" in section
