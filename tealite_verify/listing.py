"""``python -m tealite_verify list``: the ops x backends matrix (support_matrix.py), the
quantization recipes, the numerics probed on this machine and the declared numerics that differ
between cpu and cuda; ``--coverage``: the coverage-matrix cells the last run exercised."""
from __future__ import annotations

import json
import sys
import textwrap

from tealite import registry
from tealite_verify import coverage, suite, support_matrix
from tealite_verify.specs import all_specs
from tealite_verify.tables import LIST_WIDTH, table


def add_parser(sub) -> None:
    ls = sub.add_parser("list", help="ops x backends matrix")
    ls.add_argument("--op", action="append",
                    help="only this op (repeatable); unknown names are an error listing them")
    ls.add_argument("--backend", action="append", help="only this backend (repeatable)")
    ls.add_argument("--json", action="store_true",
                    help=f"print the matrix as JSON (schema {support_matrix.SCHEMA}, "
                         "README's CLI section) instead of text")
    ls.add_argument("--ascii", action="store_true",
                    help="ASCII symbols (the default where stdout cannot encode the others)")
    ls.add_argument("--coverage", action="store_true",
                    help="the coverage-matrix cells the last run exercised, per op x backend "
                         "x dtype, and the ones it did not")


def run(args) -> int:
    import torch
    try:
        ops = support_matrix.check_filter("--op", args.op, all_specs())
        names = support_matrix.check_filter("--backend", args.backend, registry.backends())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.coverage:
        return print_coverage(ops, names)
    machine = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    matrix = support_matrix.select(
        support_matrix.build(all_specs(), registry.backends(), machine), ops, names)
    if args.json:
        print(json.dumps(matrix.to_dict(), indent=1))
        return 0
    ascii_only = args.ascii or not support_matrix.can_encode(sys.stdout.encoding)
    print(f"ops x backends on this machine ({'/'.join(machine)}):")
    print(support_matrix.render(matrix, ascii_only=ascii_only))
    print()
    print(recipes_table())
    print()
    print(probed_table())
    print()
    print(device_numerics_table(ops, names))
    for err in registry.plugin_load_errors():
        print(f"plugin failed to load: {err}", file=sys.stderr)
    return 0


def print_coverage(ops=None, backends=None) -> int:
    """Each (op, backend, dtype): the coverage-matrix cells the last recorded run exercised
    (``pytest -m differential`` and ``run`` record them; see tealite_verify/suite.py); ``ops``
    and ``backends`` (None: all) narrow it as ``list``'s filters do."""
    path = suite.coverage_file()
    seen = suite.load_coverage(path)
    if not seen:
        print(f"no coverage recorded in {path}: run `pytest -m differential` or "
              f"`python -m tealite_verify run` first ({suite.COVERAGE_ENV} moves the file)",
              file=sys.stderr)
        return 1
    rows = []
    specs = all_specs()
    for (op, backend, dtype), cells in sorted(seen.items()):
        if (ops and op not in ops) or (backends and backend not in backends):
            continue
        universe = specs[op].coverage if op in specs else ()
        got, total = coverage.ratio({tuple(c.split("=", 1)) for c in cells}, universe)
        missing = coverage.describe_missing(universe, {tuple(c.split("=", 1)) for c in cells})
        rows.append([op, backend, dtype, f"{got}/{total}",
                     ", ".join(missing[:6]) + (f" (+{len(missing) - 6})" if len(missing) > 6
                                               else "")])
    print(f"coverage-matrix cells exercised, from {path}:")
    print(table(rows, ["op", "backend", "dtype", "cells", "not exercised"],
                max_width=LIST_WIDTH))
    return 0


def probed_table() -> str:
    """Numerics the backends probe on this machine instead of assuming (declared to the
    tiers per case): which can change between CPUs and GPUs CI lands on."""
    import torch

    from tealite.backends.scaled_mm import probes as scaled_mm_probes
    from tealite.backends.torch import probes
    devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    rows = probes.describe(devices) + scaled_mm_probes.describe(devices)
    return "probed on this machine:\n" + table([list(r) for r in rows],
                                                 ["kernel", "device", "finding"],
                                                 max_width=LIST_WIDTH)


def device_numerics_table(ops=None, backends=None) -> str:
    """Declared numerics that differ between cpu and cuda, per backend x op, as in force on
    this machine (tealite_verify/device_numerics.py): which a case's tier assumes depends on
    where it runs.  ``ops`` / ``backends`` (None: all) narrow it as ``list``'s filters do."""
    import torch

    from tealite_verify import device_numerics
    rows, notes = device_numerics.differences()
    def keep(backend, op):
        return (backends is None or backend in backends) and (ops is None or op in ops)
    rows = [r for r in rows if keep(r[0], r[1])]
    notes = [n for n in notes if keep(*n.split(":")[0].split(" ")[:2])]
    where = "evaluated on this machine's GPU" if torch.cuda.is_available() else \
        "cuda: what the declaration says for it, evaluated without a GPU"
    head = textwrap.fill(f"declared numerics that differ between cpu and cuda ({where}):",
                         LIST_WIDTH, subsequent_indent="  ") + "\n"
    body = table(rows, ["backend", "op", "key", "cpu", "cuda", "dtypes"],
                  max_width=LIST_WIDTH) if rows else \
        "none for the ops' smoke cases"
    return head + body + "".join(f"\nnote: {n}" for n in notes)


def recipes_table() -> str:
    """Every quantization recipe, family by family, with its formats and variants: read from
    the recipe classes' declared domains (a new recipe shows up with no edit here)."""
    import tealite.recipes as R
    from tealite.formats import FORMATS
    from tealite_verify import recipe_space
    rows = []
    for cls in R.RECIPES:
        families: dict[str, tuple[set, set]] = {}
        for point in recipe_space.points(cls):
            fmts, variants = families.setdefault(
                recipe_space.label(point.recipe, family_only=True), (set(), set()))
            fmts.add(point.recipe.fmt)
            variants.add("/".join(point.recipe.taxonomy()[1]) or "-")
        for family, (fmts, variants) in families.items():
            rows.append([cls.__name__, family, ", ".join(f for f in FORMATS if f in fmts),
                         " | ".join(sorted(variants))])
    rows.append([R.CustomRecipe.__name__, "per role", "per role", "qfactory(Role) -> recipe"])
    formats = ", ".join(f"{f.name} (max {f.max:g}{', fnuz' if f.fnuz else ''})"
                        for f in FORMATS.values())
    return (table(rows, ["recipe", "family", "formats", "variants (scale rule/rounding)"],
                   max_width=LIST_WIDTH)
            + "\n" + textwrap.fill(f"formats: {formats}; FP8 casts saturate by default "
                                   "(Saturation.SATURATE), NONFINITE available",
                                   support_matrix.WIDTH, subsequent_indent="  "))
