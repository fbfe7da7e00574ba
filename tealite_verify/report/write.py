"""The two calls the CLI makes: write the page of a run, or of a fuzz campaign."""
from __future__ import annotations

import time
from pathlib import Path

from tealite_verify.fuzz import versions as version_info
from tealite_verify.fuzz.supervisor import Campaign
from tealite_verify.report import extract, fuzz, page
from tealite_verify.runner import CaseReport


def _write(path, text: str) -> Path:
    out = Path(path)
    out.write_text(text, encoding="utf-8")
    return out


def write_run(path, reports: list[CaseReport], *, device: str, settings: dict) -> Path:
    """The page of one ``run``: ``settings``, the options it was given (shown as they are)."""
    info = version_info.collect(with_cuda=str(device).startswith("cuda"))
    data = extract.from_run(reports, device=device, settings=settings, versions=info)
    return _write(path, page.render(data))


def write_fuzz(path, campaign: Campaign) -> Path:
    """The page of a finished ``fuzz`` campaign."""
    cfg = campaign.cfg
    info = campaign.versions or version_info.collect(with_cuda=cfg.device == "cuda")
    settings = {k: v for k, v in cfg.to_json().items() if k not in ("json_path", "verbose")}
    data = fuzz.from_campaign(campaign.stats, campaign.stats.findings, device=cfg.device,
                              settings=settings, versions=info, notes=campaign.notes,
                              elapsed_s=time.time() - campaign.start)
    return _write(path, page.render(data))
