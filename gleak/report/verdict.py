"""The answer an audit report leads with: the gate's status, the worst severity and the counts, and for a run the
round from which leakage stays at chance; and the notices, identical ones grouped. Every format (console, HTML,
Markdown, the CLI's one-line summary) reads these, so they say the same thing.

The status is ``ERROR`` when a capture could not be audited, ``FAIL`` when a finding reaches the gate,
``INCONCLUSIVE`` when only threats that no attack could measure (GLEAK-NOT-ASSESSED) fail it — no leak found, none
ruled out — ``GATE OFF`` under ``--fail-on none`` (the report still names its worst finding: it is never a green
PASS), else ``PASS`` (which names the threats left unassessed under ``--accept-unassessed``, and those outside the
budget)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gleak.report.model import NOT_ASSESSED, SEVERITIES, Notice, Report, RunView, severity_rank
from gleak.report.privacy import short_number
from gleak.report.run_privacy import largest_epsilon
from gleak.report.run_view import clear_text, gate_text

Status = Literal["ERROR", "FAIL", "INCONCLUSIVE", "GATE OFF", "PASS"]
MIN_RUN_CAPTURES = 2  # a single capture gets no run section, whatever rounds it records


@dataclass(frozen=True)
class Verdict:
    status: Status
    worst: str | None
    counts: dict[str, int]  # severity -> findings, the non-zero ones, worst first
    headline: str  # one sentence: the status and why
    run_line: str  # for a run: rounds, clients, when the findings stop and where each series reaches chance; or ""

    @property
    def counts_text(self) -> str:
        return ", ".join(f"{n} {s}" for s, n in self.counts.items()) or "no findings"


def verdict(report: Report) -> Verdict:
    """The report's answer (see the module docstring)."""
    worst = report.worst()
    counts: dict[str, int] = {s: n for s in reversed(SEVERITIES)
                              if (n := sum(f.severity == s for f in report.findings))}
    total = len(report.findings)
    unassessed = [f.metric or "?" for f in report.findings if f.rule == NOT_ASSESSED]
    findings = f"{total} finding{'s' if total != 1 else ''}"
    gated = 0 if report.fail_on == "none" else sum(
        1 for f in report.findings if severity_rank(f.severity) >= severity_rank(report.fail_on))
    if report.has_errors():
        bad = sum(c.status == "error" for c in report.captures)
        status: Status = "ERROR"
        headline = f"{bad} of {len(report.captures)} capture(s) could not be audited" + (
            f"; {gated} finding{'s' if gated != 1 else ''} at the gate ({gate_text(report)}), worst {worst}"
            if gated else "")
    elif report.inconclusive():
        status = "INCONCLUSIVE"
        them = "them" if len(unassessed) > 1 else "it"
        headline = (f"{_threats(unassessed)} not assessed: no attack could measure {them}, so the gate cannot pass "
                    "(--accept-unassessed lets it); no other finding at the gate")
    elif report.failed():
        status = "FAIL"
        headline = (f"{gated} finding{'s' if gated != 1 else ''} at the gate ({gate_text(report)}); worst {worst}"
                    + (f"; {_threats(unassessed)} not assessed" if unassessed else ""))
    elif report.fail_on == "none":
        status = "GATE OFF"
        headline = f"nothing fails under --fail-on none; worst finding {worst or 'none'}"
    else:
        status = "PASS"
        headline = f"no finding at the gate ({gate_text(report)})" + (f"; worst {worst} ({findings})" if worst else "")
        if unassessed:
            headline += f"; {_threats(unassessed)} not assessed, accepted (--accept-unassessed)"
    outside = _outside_budget(report)
    if outside and status in ("PASS", "GATE OFF"):
        headline += f"; {outside}"
    return Verdict(status, worst, counts, headline, run_line(report))


def _threats(threats: list[str]) -> str:
    """'2 threats (tokens, sentences)' / '1 threat (tokens)': the threats of the GLEAK-NOT-ASSESSED findings (one
    per capture and threat), each name once."""
    names = list(dict.fromkeys(threats))
    return f"{len(threats)} threat{'s' if len(threats) != 1 else ''} ({', '.join(names)})"


def _outside_budget(report: Report) -> str:
    """'images of 3 captures outside budget quick (--budget standard reconstructs them)', or ''."""
    outside = [t.threat for c in report.captures for t in c.coverage or [] if t.status == "outside_budget"]
    if not outside:
        return ""
    threats = ", ".join(sorted(set(outside)))
    n = len(outside)
    return (f"{threats} of {n} capture{'s' if n != 1 else ''} outside budget {report.budget} (--budget standard "
            "measures them)")


def has_run(report: Report) -> bool:
    """Whether the report is about a run (its run section is shown): a run view over at least two captures."""
    return report.run is not None and len(report.captures) >= MIN_RUN_CAPTURES


def run_line(report: Report) -> str:
    """'20 rounds, 5 clients; no finding ≥ high from round 10 on; iAcc: no finding from round 10 on', or ''."""
    view = report.run
    if view is None or not has_run(report):
        return ""
    known = sum(r.round is not None for r in view.rounds)
    parts = [f"{known} round{'s' if known != 1 else ''}, {len(view.clients)} client"
             f"{'s' if len(view.clients) != 1 else ''}"]
    clear = clear_text(view, report.fail_on)
    if clear:
        parts.append(clear)
    parts += _series_clear(view)
    top = largest_epsilon(view.privacy)
    if top is not None and view.privacy is not None:
        who = "" if top[1] is None else f" (client {top[1]})"
        parts.append(f"largest ε = {short_number(top[0])}{who} at δ = {short_number(view.privacy.delta)} "
                     f"({view.privacy.accountant.upper()}, composed over its rounds)")
    return "; ".join(parts)


def _series_clear(view: RunView) -> list[str]:
    """Per series with a finding rule, the round from which its leakage no longer raises a finding (back to what
    chance gives), or that it still does in the last round."""
    metrics = {s.name: s.metric for s in view.series}
    out = []
    for name, first in view.series_clear_from.items():
        what = metrics.get(name, name)
        out.append(f"{what}: no finding from round {first} on" if first is not None
                   else f"{what}: still a finding in the last round")
    return out


@dataclass(frozen=True)
class NoticeGroup:
    code: str
    message: str
    captures: list[str]  # the captures it concerns (empty: the whole run)

    @property
    def count(self) -> int:
        return max(1, len(self.captures))


def grouped_notices(notices: list[Notice]) -> list[NoticeGroup]:
    """Identical notices (same code and message) once each, with the captures they concern, in first-seen order."""
    groups: dict[tuple[str, str], NoticeGroup] = {}
    for n in notices:
        group = groups.setdefault((n.code, n.message), NoticeGroup(n.code, n.message, []))
        if n.capture:
            group.captures.append(n.capture)
    return list(groups.values())


def notice_text(group: NoticeGroup, max_names: int = 3) -> str:
    """'RECONSTRUCTION_SKIPPED × 100: message (a, b, c and 97 more; every capture in report.json)'."""
    times = f" × {group.count}" if group.count > 1 else ""
    names = group.captures[:max_names]
    where = ""
    if names:
        more = len(group.captures) - len(names)
        where = " (" + ", ".join(names) + (f" and {more} more; report.json lists them" if more > 0 else "") + ")"
    return f"{group.code}{times}: {group.message}{where}"
