"""The run view: an audit's captures grouped by federated round and by client (``gleak.fl.round`` /
``gleak.fl.client_id``), with one leakage series per kind of finding.

Everything here is read from the report itself — each capture's scores, calibrations and findings — so building
the view runs no attack. A series holds, per round, the largest and the median value over the round's captures (and
the median chance level where the metric has one); the per-client table names each client's worst finding and the
round it came from; ``clear_from`` is the round from which no round has a finding at or above the gate's severity.
Captures that record no round form the "unknown round" group, listed last; a capture without a client id counts as a
client of its own.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gleak.report.model import (
    CaptureReport,
    ClientSummary,
    Finding,
    Report,
    RoundSummary,
    RunView,
    SeriesInfo,
    SeriesPoint,
    Severity,
    severity_rank,
)

Value = tuple[float, float | None]  # (value, chance or None)


@dataclass(frozen=True)
class Series:
    """How one series is read from a capture's entry in the report."""

    info: SeriesInfo
    read: Callable[[CaptureReport], Value | None]


def _best_label_iacc(c: CaptureReport) -> Value | None:
    """With truth: the best label attack's iAcc, and the batch's chance iAcc."""
    best = c.best_label()
    if best is None or c.chance is None:
        return None
    return float((best.scores or {})["iacc"] or 0.0), float(c.chance["iacc"])


def _expected_label_iacc(c: CaptureReport) -> Value | None:
    """Without truth: the calibrated combination's expected iAcc on batches simulated like the capture's (an
    abstention included: its best candidate's), and chance for batches drawn the same way."""
    for a in c.attacks:
        conf = a.confidence or {}
        if a.attack == "calibrated" and a.status in ("ok", "abstained") and "expected_iacc" in conf:
            return float(conf["expected_iacc"]), float(conf["chance_iacc"])
    return None


def _image_kappa(c: CaptureReport) -> Value | None:
    """With truth: the reconstructions' identification over chance κ (0 is chance)."""
    found = [float(a.identification["kappa"]) for a in c.attacks if a.task == "reconstruct" and a.identification]
    return (max(found), 0.0) if found else None


def _expected_image_kappa(c: CaptureReport) -> Value | None:
    """Without truth: the twin batches' identification over chance κ."""
    return (float(c.expected_images["kappa"]), 0.0) if c.expected_images else None


def _best_psnr(c: CaptureReport) -> Value | None:
    found = [float(v) for a in c.attacks if a.task == "reconstruct" and a.scores
             and (v := a.scores.get("psnr")) is not None]
    return (max(found), None) if found else None


SERIES: tuple[Series, ...] = (
    Series(SeriesInfo(name="label_iacc", title="best label iAcc over rounds", metric="iacc", rule="GLEAK-LABELS"),
           _best_label_iacc),
    Series(SeriesInfo(name="label_iacc_expected", title="expected label iAcc (calibrated, no truth) over rounds",
                      metric="expected_iacc", rule="GLEAK-LABELS-EXPECTED"), _expected_label_iacc),
    Series(SeriesInfo(name="image_kappa", title="image identification over chance (κ) over rounds",
                      metric="identification_kappa", rule="GLEAK-IMAGES"), _image_kappa),
    Series(SeriesInfo(name="image_kappa_expected", title="expected image identification over chance (κ, no truth) "
                      "over rounds", metric="expected_identification_kappa", rule="GLEAK-IMAGES-EXPECTED"),
           _expected_image_kappa),
    Series(SeriesInfo(name="psnr", title="best reconstruction PSNR over rounds", metric="psnr", unit="dB"),
           _best_psnr),
)


def build_run_view(report: Report) -> RunView | None:
    """The run view of ``report``, or None when no capture records a round or a client."""
    captures = report.captures
    if not any(c.round is not None or c.client is not None for c in captures):
        return None
    by_capture: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_capture.setdefault(f.capture, []).append(f)
    values = [{s.info.name: v for s in SERIES if (v := s.read(c)) is not None} for c in captures]
    present = [s.info for s in SERIES if any(s.info.name in v for v in values)]
    gated = report.gated_rounds()
    groups: dict[int | None, list[int]] = {}
    for i, c in enumerate(captures):
        groups.setdefault(c.round, []).append(i)
    order = sorted(r for r in groups if r is not None) + ([None] if None in groups else [])
    rounds = []
    for r in order:
        members = groups[r]
        found = [f for i in members for f in by_capture.get(captures[i].capture.path, [])]
        rounds.append(RoundSummary(
            round=r, captures=len(members), clients=len({captures[i].client or f"#{i}" for i in members}),
            errors=sum(captures[i].status == "error" for i in members), worst=_worst(found), findings=len(found),
            gated=r is None or r in gated,
            series={info.name: point for info in present
                    if (point := _point(values[i][info.name] for i in members if info.name in values[i]))}))
    return RunView(series=present, rounds=rounds, clients=_clients(captures, values, by_capture),
                   clear_from=None if report.fail_on == "none" else _clear_from(
                       [(rs.round, rs.worst is not None and severity_rank(rs.worst) >= severity_rank(report.fail_on))
                        for rs in rounds]),
                   series_clear_from={info.name: _clear_from_rule(captures, by_capture, info.rule)
                                      for info in present if info.rule})


def _point(pairs: Iterable[Value]) -> SeriesPoint | None:
    pairs = list(pairs)
    if not pairs:
        return None
    chances = [c for _, c in pairs if c is not None]
    return SeriesPoint(n=len(pairs), max=round(max(v for v, _ in pairs), 4),
                       median=round(statistics.median(v for v, _ in pairs), 4),
                       chance=round(statistics.median(chances), 4) if chances else None)


def _worst(findings: Iterable[Finding]) -> Severity | None:
    found: list[Severity] = [f.severity for f in findings]
    if not found:
        return None
    worst: Severity = max(found, key=severity_rank)
    return worst


def _clear_from(hits: Iterable[tuple[int | None, bool]]) -> int | None:
    """Given (round, whether it has the finding) in round order: the first known round after the last one that
    has it (the first round when none has); None when the last round has it or no round is known."""
    known = [(r, hit) for r, hit in hits if r is not None]
    if not known or known[-1][1]:
        return None
    last = max((i for i, (_, hit) in enumerate(known) if hit), default=-1)
    return known[last + 1][0]


def _clear_from_rule(captures: list[CaptureReport], by_capture: dict[str, list[Finding]], rule: str | None,
                     ) -> int | None:
    rounds: dict[int, bool] = {}
    for c in captures:
        if c.round is not None:
            hit = any(f.rule == rule for f in by_capture.get(c.capture.path, []))
            rounds[c.round] = rounds.get(c.round, False) or hit
    return _clear_from((r, rounds[r]) for r in sorted(rounds))


def _clients(captures: list[CaptureReport], values: list[dict[str, Value]],
             by_capture: dict[str, list[Finding]]) -> list[ClientSummary]:
    groups: dict[str | None, list[int]] = {}
    for i, c in enumerate(captures):
        groups.setdefault(c.client, []).append(i)
    out = []
    for client, members in groups.items():
        worst: tuple[int, int, Finding] | None = None  # (severity rank, round or -1, finding)
        for i in members:
            r = captures[i].round
            r = -1 if r is None else r
            for f in by_capture.get(captures[i].capture.path, []):
                key = (severity_rank(f.severity), r, f)
                if worst is None or key[:2] > worst[:2]:
                    worst = key
        series_max: dict[str, float] = {}
        for i in members:
            for name, (v, _) in values[i].items():
                series_max[name] = round(max(series_max.get(name, v), v), 4)
        finding = worst[2] if worst else None
        out.append(ClientSummary(
            client=client, captures=len(members),
            rounds=len({captures[i].round for i in members if captures[i].round is not None}),
            worst=finding.severity if finding else None,
            worst_round=(worst[1] if worst[1] >= 0 else None) if worst else None,
            worst_rule=finding.rule if finding else None, worst_title=finding.title if finding else None,
            series_max=series_max))
    out.sort(key=lambda c: (-(severity_rank(c.worst) if c.worst else -1), c.client is None, c.client or ""))
    return out


def gate_text(report: Report) -> str:
    """'≥ high in any round' / '≥ high in the last 3 rounds (17–19)' / '≥ high in every round'."""
    scope = report.fail_rounds
    if scope == "all":
        where = "in every round"
    elif scope.startswith("last:"):
        gated = sorted(report.gated_rounds())
        span = f" ({gated[0]}–{gated[-1]})" if len(gated) > 1 else (f" ({gated[0]})" if gated else "")
        where = f"in the last {scope.partition(':')[2]} rounds{span}, and captures without a round"
    else:
        where = "in any round"
    return f"≥ {report.fail_on} {where}"


def clear_text(view: RunView, fail_on: str) -> str:
    """When the run stops having findings at or above the gate's severity, in words."""
    known = [r for r in view.rounds if r.round is not None]
    if fail_on == "none" or not known:
        return ""
    if view.clear_from is None:
        return f"the last round ({known[-1].round}) still has a finding ≥ {fail_on}"
    if view.clear_from == known[0].round:
        return f"no round has a finding ≥ {fail_on}"
    return f"no finding ≥ {fail_on} from round {view.clear_from} on"
