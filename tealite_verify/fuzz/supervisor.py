"""The campaign: spawn N worker processes, watch them, save findings, stop on time or signal.

Each worker runs in its own process group (``start_new_session``) with its events on a pipe,
read by one thread per worker into a queue.  The main loop:

* ``case`` without ``done`` for ``case_timeout`` s => the worker is hung: kill its process
  group, record a "hang" finding (the case, and the backend or reference that was running),
  restart the worker with a new seed;
* a worker that exits by a signal or non-zero status mid-case => "crash" finding (signal name,
  stderr tail), restart; ``device_lost`` (a dead CUDA context) => restart;
* ``finding`` => saved to the corpus at once (atomic), deduplicated by signature;
* the deadline, ``max_cases`` cases done, Ctrl-C or SIGTERM => workers stopped (SIGTERM:
  they flush their findings, then SIGKILL), report written; exit 130 when interrupted, 1 when
  there are findings, else 0.
"""
from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tealite_verify.fuzz import report
from tealite_verify.fuzz.findings import Corpus, Finding, new_finding

STARTUP_FAILURES_MAX = 3  # consecutive worker deaths before any case: give that slot up
STOP_GRACE_S = 5.0  # SIGTERM -> SIGKILL


@dataclass
class FuzzConfig:
    ops: list[str]
    backends: list[str] | None
    dtypes: list[str] | None
    recipe: str | None
    seconds: float
    seed: int = 0
    device: str = "cpu"
    workers: int | None = None
    corpus: str = "findings"
    case_timeout: float = 60.0
    size: str = "ci"
    batch: int = 100
    variants: int = 4
    json_path: str | None = None
    markdown_path: str | None = None
    verbose: bool = False
    db_always: bool = False
    # Stop once this many cases are done (the time budget still caps the campaign): a
    # campaign sized by cases, e.g. ci/false_alarm_campaign.sh.  None: time only.
    max_cases: int | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Slot:
    """One worker position: its current process and what it is doing."""
    index: int
    env: dict
    gen: int = 0
    proc: subprocess.Popen | None = None
    seed: int = 0
    pending: dict | None = None  # {"op", "case", "t0", "stage"}
    last_event: float = 0.0
    stderr: collections.deque = field(default_factory=lambda: collections.deque(maxlen=40))
    versions: dict = field(default_factory=dict)
    cases_this_proc: int = 0
    startup_failures: int = 0
    restarts: int = 0
    killed: bool = False  # by the watchdog or the stop: its exit is not a crash
    finished: bool = False
    retired: bool = False


def default_cuda_workers(gpus: int, cores: int) -> int:
    """Up to four workers per GPU, each with at least four cores: a case's harness work
    (inputs, float64 comparisons, Hypothesis) is CPU work that leaves the GPU mostly idle.
    Measured on the H100 host (16 cores, local shapes, 60 s): 1 worker 225 cases/s,
    4 workers 739 cases/s."""
    gpus = max(1, gpus)
    return gpus * max(1, min(4, cores // (4 * gpus)))


def worker_envs(n: int | None, device: str) -> list[dict]:
    """Per-worker environment additions: GPUs dealt round-robin when several are visible, and
    an equal share of the CPU cores for each worker's torch / OpenMP thread pool (4 workers
    with a pool of every core each ran slower on the H100 host than 1 did; with a share each,
    3.3x faster).  An OMP_NUM_THREADS already set is kept."""
    envs: list[dict]
    if device == "cuda":
        import torch
        count = torch.cuda.device_count()
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
        ids = visible or [str(i) for i in range(count)]
        n = n or default_cuda_workers(len(ids), os.cpu_count() or 1)
        envs = [{"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]} if len(ids) > 1 else {}
                for i in range(n)]
    else:
        n = n or 1
        envs = [{} for _ in range(n)]
    threads = str(max(1, (os.cpu_count() or 1) // n))
    for env in envs:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", threads)
    return envs


def reached_max_cases(cases: int, max_cases: int | None) -> bool:
    return max_cases is not None and cases >= max_cases


class Campaign:
    def __init__(self, cfg: FuzzConfig, targets: list[dict], notes: list[str]):
        self.cfg = cfg
        self.targets = targets
        self.notes = list(notes)
        self.corpus = Corpus(cfg.corpus)
        self.q: queue.Queue = queue.Queue()
        self.stats = report.Stats()
        self.stop_reason: str | None = None
        self.interrupted = False
        self.versions: dict = {}
        self.start = time.time()
        self.deadline = self.start + cfg.seconds
        self.shrink_grace = min(60.0, max(5.0, 0.2 * cfg.seconds))
        self.slots = [Slot(i, env) for i, env in enumerate(worker_envs(cfg.workers, cfg.device))]

    # ---- processes ------------------------------------------------------------------------
    def _spawn(self, slot: Slot) -> None:
        slot.gen += 1
        slot.seed = self.cfg.seed * 1_000_003 + slot.index * 7919 + slot.restarts * 104_729
        wcfg = {"targets": self.targets, "device": self.cfg.device, "seed": slot.seed,
                "deadline": self.deadline, "corpus": str(self.cfg.corpus),
                "size": self.cfg.size, "recipe": self.cfg.recipe, "batch": self.cfg.batch,
                "variants": self.cfg.variants,
                "index": slot.index, "shrink_grace": self.shrink_grace,
                "db_always": self.cfg.db_always}
        env = dict(os.environ, **slot.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        slot.proc = subprocess.Popen(
            [sys.executable, "-m", "tealite_verify.fuzz.worker", "-"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, text=True, bufsize=1)
        slot.proc.stdin.write(json.dumps(wcfg))
        slot.proc.stdin.close()
        slot.pending, slot.killed, slot.cases_this_proc = None, False, 0
        slot.last_event = time.time()
        gen, proc = slot.gen, slot.proc
        threading.Thread(target=self._read_events, args=(slot.index, gen, proc.stdout),
                         daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(slot, proc.stderr),
                         daemon=True).start()

    def _read_events(self, idx: int, gen: int, stream) -> None:
        for line in stream:
            self.q.put((idx, gen, line))
        self.q.put((idx, gen, None))

    def _read_stderr(self, slot: Slot, stream) -> None:
        for line in stream:
            slot.stderr.append(line.rstrip("\n"))
            if self.cfg.verbose:
                print(f"[worker {slot.index}] {line}", end="", file=sys.stderr)

    def _kill(self, slot: Slot, sig=signal.SIGKILL) -> None:
        if slot.proc is not None and slot.proc.poll() is None:
            try:
                os.killpg(slot.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    # ---- findings ---------------------------------------------------------------------------
    def _save(self, f: Finding) -> None:
        if not f.versions:
            f.versions = dict(self.versions)
        known = self.stats.findings.get(f.signature)
        if known is not None:  # seen earlier in this campaign: counted once per campaign
            known["hits"] += 1
            return
        path, is_new = self.corpus.add(f)
        stored = Corpus._load(path) or f
        self.stats.findings[f.signature] = {"finding": stored, "path": str(path),
                                            "new": is_new, "hits": 1}
        self.stats.bump_findings(f.op, f.backends)
        tag = "new" if is_new else f"known, seen {stored.count}x"
        print(f"\n[fuzz] finding ({tag}): {f.kind} {f.op} {'/'.join(f.backends)}: "
              f"{f.detail[:300]}\n       saved {path}", file=sys.stderr)

    def _process_finding(self, slot: Slot, kind: str, detail: str, error_type: str,
                         extra_metrics: dict) -> None:
        p = slot.pending
        stage = p.get("stage") or "harness"
        blamed = [stage.split(":", 1)[1]] if stage.startswith("backend:") else [stage]
        tail = "\n".join(list(slot.stderr)[-25:])
        f = new_finding(kind, p["op"], blamed, p["case"], self.cfg.device, detail=detail,
                        metrics=dict(extra_metrics, stage=stage), versions=slot.versions,
                        seed=slot.seed, error_type=error_type, stderr_tail=tail)
        self._save(f)

    # ---- events -----------------------------------------------------------------------------
    def _on_event(self, slot: Slot, ev: dict) -> None:
        slot.last_event = time.time()
        kind = ev.get("event")
        if kind == "case":
            slot.pending = {"op": ev["op"], "case": ev["case"], "t0": time.time(), "stage": None}
        elif kind == "stage" and slot.pending is not None:
            slot.pending["stage"] = ev["stage"]
        elif kind == "done":
            slot.pending = None
            slot.cases_this_proc += 1
            slot.startup_failures = 0
            self.stats.add_case(ev)
        elif kind == "finding":
            self._save(Finding.from_json(ev["finding"]))
        elif kind == "hello":
            slot.versions = ev.get("versions", {})
            self.versions = self.versions or slot.versions
            for err in ev.get("plugin_errors", []):
                self._note(f"worker {slot.index}: backend plugin failed to load: {err}")
        elif kind == "note":
            self._note(f"worker {slot.index}: {ev.get('op')}/{ev.get('dtype')}: "
                       f"{ev.get('message')}")
        elif kind == "device_lost":
            self._note(f"worker {slot.index}: device lost ({ev.get('detail')}); restarting")
        elif kind == "bye":
            slot.finished = True

    def _note(self, msg: str) -> None:
        if msg not in self.notes:
            self.notes.append(msg)
            print(f"\n[fuzz] {msg}", file=sys.stderr)

    def _on_exit(self, slot: Slot) -> None:
        rc = slot.proc.wait()
        time.sleep(0.05)  # let the stderr thread take the last lines
        if slot.pending is not None and not slot.killed:
            if rc < 0:
                try:
                    name = signal.Signals(-rc).name
                except ValueError:
                    name = f"signal {-rc}"
            else:
                name = f"exit status {rc}"
            last = next((s for s in reversed(slot.stderr) if s.strip()), "")
            self._process_finding(slot, "crash", f"worker died with {name} while running "
                                  f"{slot.pending.get('stage') or 'the harness'}"
                                  + (f"; stderr: {last[:200]}" if last else ""),
                                  name, {"returncode": rc})
            self.stats.crashes += 1
        elif rc != 0 and not slot.killed and not slot.finished:
            if slot.cases_this_proc == 0:
                slot.startup_failures += 1
            self._note(f"worker {slot.index} exited with status {rc} between cases; "
                       f"stderr tail:\n" + "\n".join(list(slot.stderr)[-8:]))
        slot.pending = None
        if slot.finished or self.stop_reason or time.time() >= self.deadline:
            slot.retired = True
            return
        if slot.startup_failures >= STARTUP_FAILURES_MAX:
            self._note(f"worker {slot.index} failed {STARTUP_FAILURES_MAX} times before its "
                       "first case; giving that worker up")
            slot.retired = True
            return
        slot.restarts += 1
        self.stats.restarts += 1
        self._spawn(slot)

    def _watchdog(self, now: float) -> None:
        for slot in self.slots:
            if slot.retired or slot.proc is None or slot.killed:
                continue
            p = slot.pending
            if p is not None and now - p["t0"] > self.cfg.case_timeout:
                self._kill(slot)
                slot.killed = True
                self._process_finding(slot, "hang", f"no result within "
                                      f"{self.cfg.case_timeout:g} s while running "
                                      f"{p.get('stage') or 'the harness'}", "timeout",
                                      {"timeout_s": self.cfg.case_timeout})
                self.stats.hangs += 1
            elif p is None and now - slot.last_event > max(180.0, 3 * self.cfg.case_timeout):
                self._kill(slot)  # stuck outside a case (import, Hypothesis): restart quietly
                slot.killed = True
                self._note(f"worker {slot.index} silent for {now - slot.last_event:.0f} s "
                           "outside a case; restarted")

    # ---- main loop ----------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        self.interrupted = True
        self.stop_reason = signal.Signals(signum).name

    def run(self) -> int:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for slot in self.slots:
                self._spawn(slot)
            self._loop()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            for slot in self.slots:
                self._kill(slot)
        return self._finish()

    def _loop(self) -> None:
        next_progress = time.time() + 2.0
        # No case starts after deadline + shrink grace, so by this time the watchdog has
        # judged every case still in flight.
        hard_end = self.deadline + self.shrink_grace + self.cfg.case_timeout + 2.0
        stopping_since = None
        while not all(s.retired for s in self.slots):
            try:
                idx, gen, line = self.q.get(timeout=0.2)
            except queue.Empty:
                idx = None
            if idx is not None:
                slot = self.slots[idx]
                if gen == slot.gen:
                    if line is None:
                        self._on_exit(slot)
                    else:
                        try:
                            self._on_event(slot, json.loads(line))
                        except ValueError:
                            pass
            now = time.time()
            self._watchdog(now)
            if self.stop_reason is None and reached_max_cases(self.stats.cases,
                                                              self.cfg.max_cases):
                self.stop_reason = "max-cases"
            if stopping_since is None and (self.stop_reason or now > hard_end):
                self.stop_reason = self.stop_reason or "deadline"
                stopping_since = now
                for slot in self.slots:
                    slot.killed = slot.proc is not None and slot.proc.poll() is None
                    self._kill(slot, signal.SIGTERM)  # workers flush their findings
            if stopping_since is not None and now - stopping_since > STOP_GRACE_S:
                for slot in self.slots:
                    self._kill(slot)
                    slot.killed = True
            if now >= next_progress:
                next_progress = now + 2.0
                report.progress(self.stats, now - self.start, self.deadline - now,
                                sum(1 for s in self.slots if not s.retired))

    def _finish(self) -> int:
        elapsed = time.time() - self.start
        report.progress(self.stats, elapsed, 0.0, 0, final=True)
        print(report.summary_table(self.stats), file=sys.stdout)
        for n in self.notes:
            print(f"note: {n}", file=sys.stdout)
        doc = report.json_report(self.cfg.to_json(), self.versions, self.stats, elapsed,
                                 self.targets, self.notes, self.interrupted)
        if self.cfg.json_path:
            Path(self.cfg.json_path).write_text(json.dumps(doc, indent=1, default=str))
        if self.cfg.markdown_path:
            Path(self.cfg.markdown_path).write_text(report.markdown(doc))
        if self.interrupted:
            print(f"interrupted ({self.stop_reason}); findings so far are in {self.cfg.corpus}",
                  file=sys.stderr)
            return 130
        return 1 if self.stats.findings else 0
