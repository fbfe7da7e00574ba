"""Judge a candidate run against a baseline.

Regressions (any one fails the gate):

* ``vanished``: an entry point the baseline had is missing, or a key whose cases ran now has
  cases that are unsupported / unavailable (modules moved, a wrapper was removed);
* ``new-failure``: a case that passed now fails, errors or disagrees with a peer backend;
* ``contract``: a declared contract field changed, or a contract observed by probing did;
* ``error-growth``: a key's worst error/tolerance ratio grew beyond ``factor`` times the
  baseline's (ratios below ``floor`` count as ``floor``, so a bit-exact baseline of 0 does not
  make any rounding change a regression, while growth toward the tolerance still does).

Improvements (reported, never failing): failures that now pass, entry points that appeared,
ratios that shrank by the same factor.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tealite_verify.gate.record import unnum

DEFAULT_FACTOR = 2.0
DEFAULT_FLOOR = 0.05


@dataclass
class Finding:
    kind: str
    where: str
    detail: str


@dataclass
class Result:
    regressions: list[Finding] = field(default_factory=list)
    improvements: list[Finding] = field(default_factory=list)
    unchanged: int = 0
    factor: float = DEFAULT_FACTOR
    floor: float = DEFAULT_FLOOR

    @property
    def passed(self) -> bool:
        return not self.regressions


def _entry_points(base: dict, cand: dict, res: Result) -> None:
    old = base["aiter"].get("entry_points", {})
    new = cand["aiter"].get("entry_points", {})
    if base["aiter"].get("found") and not cand["aiter"].get("found"):
        res.regressions.append(Finding("vanished", "aiter", cand["aiter"].get("reason", "")))
    for name, state in old.items():
        now = new.get(name, "missing: not in this loader's table")
        if state == "available" and now != "available":
            res.regressions.append(Finding("vanished", f"entry point {name}", now))
        elif state != "available" and now == "available":
            res.improvements.append(Finding("appeared", f"entry point {name}", "now loads"))


def _contracts(base: dict, cand: dict, res: Result) -> None:
    for section in ("contracts", "observed"):
        old, new = base.get(section, {}), cand.get(section, {})
        for name in sorted(set(old) | set(new)):
            if name not in new:
                res.regressions.append(Finding("contract", f"{section} {name}",
                                               "no longer declared / observed"))
                continue
            if name not in old:
                res.improvements.append(Finding("contract", f"{section} {name}", "new"))
                continue
            for k in sorted(set(old[name]) | set(new[name])):
                if old[name].get(k) != new[name].get(k):
                    res.regressions.append(Finding(
                        "contract", f"{section} {name}.{k}",
                        f"{old[name].get(k)!r} -> {new[name].get(k)!r}"))


def _cases(base: dict, cand: dict, res: Result) -> None:
    new_by_index = {r["index"]: r for r in cand["cases"]}
    for old in base["cases"]:
        new = new_by_index.get(old["index"])
        where = f"case {old['index']} [{old['key']}] {old['entry_point'] or ''}".rstrip()
        if new is None:
            res.regressions.append(Finding("vanished", where, "case not run"))
            continue
        if old["status"] == "ok" and new["status"] in ("unsupported", "unavailable"):
            res.regressions.append(Finding("vanished", where, f"{new['status']}: "
                                                              f"{new['reason']}"))
            continue
        old_ok = old["verdict"] == "pass" and all(v == "pass" for v in old["peers"].values())
        new_ok = new["verdict"] == "pass" and all(v == "pass" for v in new["peers"].values())
        if old_ok and not new_ok:
            detail = "; ".join(new["failures"]) or new.get("reason") or \
                f"peers {new['peers']}"
            res.regressions.append(Finding("new-failure", where, detail))
        elif not old_ok and new_ok:
            res.improvements.append(Finding("fixed", where, "now passes"))
        if old["entry_point"] and new["entry_point"] and old["entry_point"] != new["entry_point"]:
            res.regressions.append(Finding("contract", where, f"entry point "
                                           f"{old['entry_point']} -> {new['entry_point']}"))


def _errors(base: dict, cand: dict, res: Result) -> None:
    for key, old in base["entries"].items():
        new = cand["entries"].get(key)
        if new is None or not old["ran"] or not new["ran"]:
            continue
        r_old = max(unnum(old["max_ratio"]), res.floor)
        r_new = unnum(new["max_ratio"])
        if r_new > res.factor * r_old and r_new > res.floor:
            res.regressions.append(Finding(
                "error-growth", key, f"worst err/tol {old['max_ratio']} -> {new['max_ratio']}"
                f" (> {res.factor:g}x)"))
        elif r_new * res.factor < r_old and unnum(old["max_ratio"]) > res.floor:
            res.improvements.append(Finding(
                "error-shrink", key, f"worst err/tol {old['max_ratio']} -> {new['max_ratio']}"))
        else:
            res.unchanged += 1


def compare(base: dict, cand: dict, *, factor: float = DEFAULT_FACTOR,
            floor: float = DEFAULT_FLOOR) -> Result:
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    if base.get("schema") != cand.get("schema"):
        raise ValueError(f"baseline schema {base.get('schema')!r} != candidate "
                         f"{cand.get('schema')!r}")
    res = Result(factor=factor, floor=floor)
    _entry_points(base, cand, res)
    _contracts(base, cand, res)
    _cases(base, cand, res)
    _errors(base, cand, res)
    return res
