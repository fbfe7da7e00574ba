"""One fuzzing process: ``python -m tealite_verify.fuzz.worker CONFIG_JSON`` (or ``-``: stdin).

Loops over its (op, dtype) targets round-robin until the deadline; each iteration is one
Hypothesis run (``max_examples=batch``, a fresh ``@seed``, the corpus's example database so a
rerun replays known failures first and continues), steered by ``hypothesis.target`` toward the
worst err/tol ratio and mismatch count, shrinking failures to minimal cases.

Events go to the original stdout as JSON lines (stdout itself is redirected to stderr so a
chatty backend cannot corrupt them): ``hello``; per case ``case`` -> ``stage`` (which backend /
the reference is running: the supervisor blames that one on a hang or crash) -> ``done``;
``finding`` (one per signature of a shrunk failure); ``note``; ``device_lost``; ``bye``.
Hangs and crashes are the supervisor's business: this process just dies or stalls.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
import traceback

RATIO_CAP = 1e12  # hypothesis.target needs finite values; inf ratios (shape errors) map here
SHRINK_GRACE_S = 60.0  # a failure found just before the deadline may still be shrunk this long


class _OutOfTime(BaseException):
    """Raised inside the test body past the deadline: Hypothesis lets BaseException through."""


class _CaseFailed(Exception):
    pass


_FAIL_TYPES: dict[tuple, type] = {}


def _failure_type(sigs: tuple) -> type:
    """One exception class per set of signatures: Hypothesis keeps (and shrinks) one minimal
    example per distinct exception origin, so distinct bugs are not merged into one."""
    if sigs not in _FAIL_TYPES:
        _FAIL_TYPES[sigs] = type(f"CaseFailed_{len(_FAIL_TYPES)}", (_CaseFailed,), {})
    return _FAIL_TYPES[sigs]


class Events:
    """JSON lines on a private duplicate of fd 1; fd 1 then points at stderr."""

    def __init__(self):
        self._f = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def emit(self, event: str, **kw) -> None:
        kw["event"] = event
        kw["t"] = time.time()
        self._f.write(json.dumps(kw, default=str) + "\n")
        self._f.flush()


def plan_targets(ops, backend_filter, dtype_filter, recipe_filter, device: str):
    """[(op, dtype or None, judged backends)], plus notes on what was left out and why."""
    from tealite import registry
    from tealite_verify.fuzz.findings import recipe_description
    from tealite_verify.specs import all_specs, get_spec
    specs = all_specs()
    ops = list(specs) if not ops or "all" in ops else list(ops)
    known = registry.backends()
    targets, notes = [], []
    for f in backend_filter or []:
        if f not in known:
            notes.append(f"backend {f!r} is not registered (known: {sorted(known)})")
    for op in ops:
        spec = get_spec(op)
        names = []
        for name, b in sorted(known.items()):
            if backend_filter and name not in backend_filter:
                continue
            if not spec.implemented_by(b):
                continue
            reason = b.unavailable_reason()
            if reason:
                notes.append(f"{op}: backend {name} unavailable ({reason})")
            elif device not in spec.devices_of(b):
                notes.append(f"{op}: backend {name} does not run on {device}")
            else:
                names.append(name)
        if not names:
            notes.append(f"{op}: no selected backend implements it on {device}; skipped")
            continue
        if recipe_filter and not any(recipe_description(c) for c in spec.smoke_cases):
            notes.append(f"{op}: has no recipe; skipped by --recipe {recipe_filter!r}")
            continue
        dtypes = [d for d in spec.dtypes if not dtype_filter or d in dtype_filter]
        if dtype_filter and not dtypes:
            notes.append(f"{op}: no dtype in {dtype_filter} (it has {list(spec.dtypes)})")
            continue
        for d in (dtypes if dtype_filter else [None]):
            targets.append({"op": op, "dtype": d, "backends": names})
    return targets, notes


def _instrument(spec, events: Events, stage_times: dict):
    """The spec with call / reference wrapped to announce the stage (for hang / crash blame)
    and time it (a fallback when the runner reports no timings)."""
    def call(inputs, case, backend):
        events.emit("stage", stage=f"backend:{backend}")
        t = time.perf_counter()
        try:
            return spec.call(inputs, case, backend)
        finally:
            stage_times[f"backend:{backend}"] = time.perf_counter() - t

    def reference(inputs, case):
        events.emit("stage", stage="reference")
        t = time.perf_counter()
        try:
            return spec.reference(inputs, case)
        finally:
            stage_times["reference"] = time.perf_counter() - t

    return dataclasses.replace(spec, call=call, reference=reference)


def _error_type(reason: str | None) -> str:
    head = (reason or "").split(":", 1)[0].strip()
    return head if head.isidentifier() else "error"


def classify(rep, device: str, versions: dict, seed) -> list:
    """The findings in a failing CaseReport: each backend error, each failed comparison with
    the reference (a failed parity check, tiers/parity.py, as a finding of kind "parity"), and
    pairwise disagreements between backends that both pass the reference."""
    from tealite_verify.fuzz.findings import new_finding
    from tealite_verify.tiers.metrics import Tier
    out = []
    for o in rep.errors:
        out.append(new_finding("error", rep.op, [o.backend], rep.case, device,
                               detail=f"{o.backend} raised {o.reason}",
                               error_type=_error_type(o.reason), versions=versions, seed=seed))
    bad_vs_ref = set()
    for c in rep.failures:
        if c.rhs == "reference":
            bad_vs_ref.add(c.lhs)
    for c in rep.failures:
        pair = c.rhs != "reference"
        if pair and (c.lhs in bad_vs_ref or c.rhs in bad_vs_ref):
            continue  # already blamed on the backend that misses the reference
        names = [c.lhs, c.rhs] if pair else [c.lhs]
        m = c.metrics.to_dict()
        vs = "its split path" if c.metrics.tier is Tier.PARITY else c.rhs
        kind = "parity" if c.metrics.tier is Tier.PARITY else "mismatch"
        out.append(new_finding(kind, rep.op, names, rep.case, device, output=c.output,
                               detail=f"{c.lhs} vs {vs} [{c.output}]: {c.metrics.summary()}",
                               metrics=m, versions=versions, seed=seed))
    return out


def _turn_case(spec, case: dict, names: list[str], device: str, size: str,
               dtype: str | None = None):
    """(the drawn case fitted to the backend whose turn it is, its inputs or None): the turn
    is chosen by the case's seed, so a replayed draw gets the same fit; each judged backend
    gets runnable cases in turn, also one that accepts a narrow slice of the op
    (tealite_verify.suite.fit_for, whose dry run built the inputs: they are not built again)."""
    if len(names) < 2 or not isinstance(case.get("seed"), int):
        return case, None
    from tealite_verify.suite import fit_for
    turn = case["seed"] % len(names)
    return fit_for(spec, case, names[turn], device=device, size=size,
                   offset=case["seed"] // len(names), dtypes=(dtype,) if dtype else None)


def _backend_stats(rep) -> dict:
    stats = {}
    for name, o in rep.outcomes.items():
        mine = [c.metrics for c in rep.comparisons if c.lhs == name and c.rhs == "reference"]
        r = max((m.max_ratio for m in mine), default=0.0)
        stats[name] = {"status": o.status, "ratio": r if math.isfinite(r) else RATIO_CAP}
        stats[name].update(_probabilistic_stats(mine))
    return stats


def _capped(r: float) -> float:
    return r if math.isfinite(r) else RATIO_CAP


def _probabilistic_stats(metrics) -> dict:
    """The opt-in probabilistic check's results for one backend's comparisons (empty when it
    was not computed): worst prob err/bound, worst FlashAttention-style ratio, suspicious."""
    probs = [m for m in metrics if m.prob_ratio is not None]
    if not probs:
        return {}
    fas = [m.fa_ratio for m in probs if m.fa_ratio is not None]
    return {"prob_ratio": _capped(max(m.prob_ratio for m in probs)),
            "fa_ratio": _capped(max(fas)) if fas else None,
            "suspicious": any(m.suspicious for m in probs)}


def _suspicious_events(rep) -> dict:
    """``done`` event fields of the probabilistic check: its per-case false-alarm probability,
    and for a suspicious case the comparisons and the case (report.Stats keeps them)."""
    if rep.probabilistic is None:
        return {}
    sus = rep.suspicious
    if not sus:
        return {"probabilistic": rep.probabilistic}
    return {"probabilistic": rep.probabilistic,
            "suspicious": [{"backend": c.lhs, "output": c.output,
                            "prob_ratio": _capped(c.metrics.prob_ratio),
                            "fa_ratio": (None if c.metrics.fa_ratio is None
                                         else _capped(c.metrics.fa_ratio)),
                            "detail": c.metrics.summary(),
                            "repro": rep.repro(c.lhs)} for c in sus],
            "case": rep.case}


class Worker:
    def __init__(self, cfg: dict, events: Events):
        self.cfg = cfg
        self.events = events
        self.device = cfg.get("device", "cpu")
        self.deadline = float(cfg["deadline"])
        self.shrink_grace = float(cfg.get("shrink_grace", SHRINK_GRACE_S))
        self.rng = random.Random(cfg.get("seed", 0))
        self.last_end = time.perf_counter()
        self.versions: dict = {}
        self.db_used: set[str] = set()
        self._pool = None

    def prefetch(self, spec, case):
        """A future of ``spec.make_inputs(case, device)``, built on the input thread."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inputs")
        return self._pool.submit(spec.make_inputs, case, self.device)

    def run(self) -> int:
        from hypothesis.database import DirectoryBasedExampleDatabase
        from tealite import registry
        from tealite_verify import profiles
        from tealite_verify.fuzz import versions
        profiles.load("local")
        errors = registry.load_plugins()
        self.versions = versions.collect(with_cuda=self.device == "cuda")
        targets = self.cfg["targets"]
        self.events.emit("hello", pid=os.getpid(), versions=self.versions, plugin_errors=errors,
                         targets=targets)
        self.db = DirectoryBasedExampleDatabase(os.path.join(self.cfg["corpus"], ".hypothesis"))
        self.last_end = time.perf_counter()  # startup (imports) is not per-case overhead
        i = int(self.cfg.get("index", 0))
        dead: set[int] = set()
        while time.time() < self.deadline and len(dead) < len(targets):
            j = i % len(targets)
            i += 1
            if j in dead:
                continue
            if not self.run_batch(targets[j]):
                dead.add(j)
        self.events.emit("bye")
        return 0

    def run_batch(self, target: dict) -> bool:
        """One Hypothesis run on ``target``; False when the target cannot be fuzzed at all."""
        from hypothesis import HealthCheck, Phase, example, given, settings
        from hypothesis import seed as hseed
        from hypothesis import target as htarget
        from tealite_verify.fuzz.findings import recipe_description
        from tealite_verify.runner import run_case
        from tealite_verify.specs import get_spec

        op, dtype, names = target["op"], target["dtype"], target["backends"]
        spec0 = get_spec(op)
        stage_times: dict = {}
        spec = _instrument(spec0, self.events, stage_times)
        strategy = spec0.cases(dtype, self.cfg.get("size", "ci"))
        recipe = self.cfg.get("recipe")
        if recipe:
            strategy = strategy.filter(lambda c: recipe in recipe_description(c))
        batch_seed = self.rng.getrandbits(63)
        latest: dict[str, object] = {}  # signature -> Finding of the latest (smallest) failure

        n_variants = max(1, int(self.cfg.get("variants", 1)))

        def body(case):
            # Drawing a case costs Hypothesis several ms, more than a small kernel and its
            # reference: run a few data seeds of each drawn case (same shape, recipe and
            # distribution), target the worst of them, and record the failing variant itself
            # (a plain case, replayable as is).  Each next variant's inputs are generated on
            # a thread while the current one runs (torch's generators and copies, and
            # numpy's large array operations, release the GIL).
            best = [0.0, 0.0]
            case, built = _turn_case(spec0, case, names, self.device,
                                     self.cfg.get("size", "ci"), dtype)
            variants = _seed_variants(case, n_variants)
            ahead = None
            try:
                for j, v in enumerate(variants):
                    current = ahead
                    ahead = (self.prefetch(spec0, variants[j + 1])
                             if j + 1 < len(variants) else None)
                    prepared = current.result if current else (
                        (lambda: built) if built is not None and j == 0 else None)
                    ratio, mism = run_one(v, prepared)
                    best[0], best[1] = max(best[0], ratio), max(best[1], mism)
            finally:
                if ahead is not None:
                    ahead.cancel()
                htarget(min(best[0], RATIO_CAP), label="max err/tol")
                htarget(best[1], label="mismatched elements")

        def run_one(case, prepared=None):
            limit = self.deadline + (self.shrink_grace if latest else 0.0)
            if time.time() > limit:
                raise _OutOfTime()
            t0 = time.perf_counter()
            t_gen = t0 - self.last_end
            stage_times.clear()
            self.events.emit("case", op=op, case=case)
            try:
                rep = run_case(spec, case, backends=names, device=self.device,
                               prepared_inputs=prepared)
            except Exception as exc:  # the harness (inputs / reference / tiers) itself failed
                from tealite_verify.fuzz.findings import new_finding
                line = traceback.format_exception_only(type(exc), exc)[-1].strip()
                f = new_finding("error", op, ["harness"], case, self.device,
                                detail=f"harness raised {line}", error_type=type(exc).__name__,
                                versions=self.versions, seed=batch_seed)
                self.events.emit("done", op=op, verdict="fail", ratio=0.0, backends={},
                                 timings={}, t_total=time.perf_counter() - t0, t_gen=t_gen)
                self.last_end = time.perf_counter()
                latest[f.signature] = f
                raise _failure_type((f.signature,))(f.detail)
            t_total = time.perf_counter() - t0
            ratio = rep.max_ratio()
            ratio = ratio if math.isfinite(ratio) else RATIO_CAP
            mism = sum(c.metrics.mismatches for c in rep.comparisons if c.rhs == "reference")
            timings = dict(getattr(rep, "timings", None) or stage_times)
            self.events.emit("done", op=op, verdict=rep.verdict, ratio=ratio,
                             backends=_backend_stats(rep), timings=timings, t_total=t_total,
                             t_gen=t_gen, **_suspicious_events(rep))
            self.last_end = time.perf_counter()
            if rep.errors and self.device == "cuda":
                self._check_device()
            if rep.verdict == "fail":
                found = classify(rep, self.device, self.versions, batch_seed)
                for f in found:
                    latest[f.signature] = f
                sigs = tuple(sorted(f.signature for f in found))
                raise _failure_type(sigs)("; ".join(f.detail for f in found)[:2000])
            return ratio, float(mism)

        body._hypothesis_internal_add_digest = json.dumps(
            [op, dtype, names, self.cfg.get("size"), recipe, self.device]).encode()
        phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
        # The example database costs Hypothesis a Pareto front over every targeted case (2x
        # slower cases measured on CPU gemm), so by default only a target's first run in this
        # process uses it: it replays stored failures and the best-ratio cases of earlier
        # campaigns.  Later failures are in the findings corpus, replayed as explicit examples.
        key = json.dumps([op, dtype])
        use_db = self.cfg.get("db_always") or key not in self.db_used
        self.db_used.add(key)
        wrapped = given(case=strategy)(body)
        for case in (self._known_cases(op, dtype, names, recipe) if use_db else []):
            wrapped = example(case=case)(wrapped)
        # settings after @seed: @seed alone switches the example database off.
        test = settings(
            max_examples=int(self.cfg.get("batch", 100)), deadline=None,
            database=self.db if use_db else None,
            phases=phases, suppress_health_check=list(HealthCheck), print_blob=False,
            report_multiple_bugs=True, derandomize=False)(hseed(batch_seed)(wrapped))
        ok = True
        try:
            test()
        except _OutOfTime:
            pass
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if _contains(exc, _OutOfTime):
                pass  # stopped mid-run (Hypothesis may wrap it): keep what was found
            elif not _only_case_failures(exc):
                line = traceback.format_exception_only(type(exc), exc)[-1].strip()
                self.events.emit("note", op=op, dtype=dtype,
                                 message=f"hypothesis run ended with {type(exc).__name__}: "
                                         f"{line[:500]}")
                from hypothesis.errors import Unsatisfiable
                ok = not isinstance(exc, Unsatisfiable)
        for f in latest.values():
            self.events.emit("finding", finding=f.to_json())
        return ok

    def _known_cases(self, op: str, dtype, names, recipe) -> list[dict]:
        """Cases of stored mismatch / error findings this target can judge (crash and hang
        cases would only kill this worker again: the supervisor's replay handles those)."""
        from tealite_verify.fuzz.findings import REPLAYED_KINDS, Corpus, recipe_description
        out = []
        for _, f in Corpus(self.cfg["corpus"]).all():
            if (f.op == op and f.kind in REPLAYED_KINDS and set(f.backends) <= set(names)
                    and f.device == self.device and (dtype is None or f.dtype == dtype)
                    and (not recipe or recipe in recipe_description(f.case))):
                out.append(f.case)
        return out[:20]

    def _check_device(self) -> None:
        """After a backend error on CUDA: if the context is dead (illegal address, device-side
        assert), every later case would fail too; exit so the supervisor starts a fresh one."""
        import torch
        try:
            torch.cuda.synchronize()
            torch.zeros(1, device="cuda").add_(1).item()
        except Exception as exc:
            self.events.emit("device_lost", detail=f"{type(exc).__name__}: {exc}"[:1000])
            os._exit(3)


def _seed_variants(case: dict, n: int) -> list[dict]:
    """``case`` and n - 1 copies with the next data seeds (cases without a seed: itself)."""
    seed = case.get("seed")
    if n <= 1 or not isinstance(seed, int):
        return [case]
    return [case] + [dict(case, seed=(seed + j) % 2**31) for j in range(1, n)]


def _contains(exc: BaseException, cls: type) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, cls):
            return True
        if isinstance(exc, BaseExceptionGroup):
            return any(_contains(e, cls) for e in exc.exceptions)
        exc = exc.__cause__ or exc.__context__
    return False


def _only_case_failures(exc: BaseException) -> bool:
    if isinstance(exc, _CaseFailed):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_case_failures(e) for e in exc.exceptions)
    return False


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    raw = sys.stdin.read() if not argv or argv[0] == "-" else argv[0]
    cfg = json.loads(raw)
    events = Events()
    worker = Worker(cfg, events)

    def on_term(signum, frame):
        # The supervisor is stopping: end the Hypothesis run now; run_batch still emits the
        # failures found so far before this process exits.
        worker.deadline = worker.shrink_grace = 0.0
        raise _OutOfTime()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    try:
        return worker.run()
    except _OutOfTime:
        return 0


if __name__ == "__main__":
    sys.exit(main())
