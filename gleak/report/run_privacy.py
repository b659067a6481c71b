"""ε over an audited run: each client's cumulative privacy loss after each round it trained in, beside the leakage
the audit measured (the run view's ``privacy``), and the ``--max-epsilon`` budget.

Two kinds of local DP are read from the captures, each accounted with Opacus (:mod:`gleak.defenses.accounting`):

* **DP-SGD** (``gleak.dp.*``: ``gleak simulate --defense dpsgd``, or any client that records Opacus's settings):
  record-level DP of the client's examples; each round composes its noisy steps (z, q, steps).
* **Flower's LocalDpMod** (a ``flwr.LocalDpMod`` entry in ``gleak.defense``, written by gleak's Flower mod): the
  Gaussian mechanism on the client's whole clipped update, once per round, with z = σ / sensitivity and q = 1:
  client-level DP of everything the client sent.

The two protect different units (one example, one client), so a run is accounted in one of them: DP-SGD where any
capture records it, else LocalDpMod; a capture of the other kind, or of none, makes its client's ε unknown from that
round on (named, never taken as 0 or ∞). Central DP, where the *server* adds noise to the aggregate (Flower's
``DifferentialPrivacyServerSide…`` / ``…ClientSideFixedClipping`` strategies), is not in any client's update: the
captures show updates before that noise, so its ε is the server's to state and gleak does not claim it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from gleak.defenses.accounting import RoundSpend, cumulative_epsilon
from gleak.report.model import (
    CaptureReport,
    ClientPrivacy,
    EpsilonAfterRound,
    EpsilonTerms,
    Finding,
    Notice,
    RunPrivacy,
)
from gleak.report.privacy import describe_epsilon, short_number

DPSGD = "DP-SGD on each client (record-level: one example of the client's data), from gleak.dp.*"
LOCAL_DP = ("Flower's LocalDpMod on each client (client-level: the client's whole update, Gaussian mechanism once "
            "per round), from gleak.defense")
CENTRAL_NOTE = ("central DP (noise the server adds to the aggregate) is not in a client's update and is not "
                "accounted here")
BUDGET_RULE = "GLEAK-DP-BUDGET"


def _local_dp(capture: CaptureReport) -> dict[str, float] | None:
    for record in capture.defense or []:
        if record.get("name") == "flwr.LocalDpMod":
            try:
                sigma, sensitivity, delta = (float(record[k]) for k in ("noise_std", "sensitivity", "delta"))
            except (KeyError, TypeError, ValueError):
                return None
            if sensitivity > 0 and sigma >= 0:
                return {"noise_multiplier": sigma / sensitivity, "delta": delta}
    return None


def _spend(capture: CaptureReport, kind: str) -> tuple[RoundSpend, float | None, str | None]:
    """What ``capture`` costs in the run's kind of DP, with its δ and accountant (None: not of that kind)."""
    if kind == "dpsgd" and capture.epsilon_terms is not None:
        t = capture.epsilon_terms
        return RoundSpend(capture.round, t.noise_multiplier, t.sample_rate, t.steps), t.delta, t.accountant
    if kind == "local" and (local := _local_dp(capture)) is not None:
        return RoundSpend(capture.round, local["noise_multiplier"], 1.0, 1), local["delta"], "rdp"
    return RoundSpend(capture.round), None, None


def account_run(captures: Sequence[CaptureReport], max_epsilon: float | None = None) -> RunPrivacy | None:
    """Each client's cumulative ε after each round, or None when no capture records DP. Captures that could not
    be audited are left out (their error is reported elsewhere)."""
    audited = [c for c in captures if c.status == "ok"]
    if any(c.epsilon_terms is not None for c in audited):
        kind, what = "dpsgd", DPSGD
    elif any(_local_dp(c) is not None for c in audited):
        kind, what = "local", LOCAL_DP
    else:
        return None
    spends = [(c, *_spend(c, kind)) for c in audited]
    deltas = sorted({d for _, _, d, _ in spends if d is not None})
    accountants = Counter(a for _, _, _, a in spends if a is not None)
    delta, accountant = deltas[0], accountants.most_common(1)[0][0]
    notes = [CENTRAL_NOTE]
    if len(deltas) > 1:
        notes.append(f"the captures record δ = {', '.join(short_number(d) for d in deltas)}: every ε here is at the "
                     f"smallest, δ = {short_number(delta)}")
    if len(accountants) > 1:
        notes.append(f"the captures name the accountants {', '.join(sorted(accountants))}: composed with "
                     f"{accountant.upper()}, the one most of them name")
    by_client: dict[str, list[tuple[CaptureReport, RoundSpend]]] = {}
    for i, (capture, spend, _, _) in enumerate(spends):
        by_client.setdefault(capture.client if capture.client is not None else f"\0{i}", []).append((capture, spend))
    clients = []
    for key, members in by_client.items():
        members.sort(key=lambda m: (m[1].round is None, m[1].round or 0))
        composed = cumulative_epsilon([s for _, s in members], delta, accountant)
        rounds: list[EpsilonAfterRound] = []
        for (_, spend), after in zip(members, composed, strict=True):
            entry = EpsilonAfterRound(round=spend.round, epsilon=after.epsilon, reason=after.reason,
                                      sample_rate=spend.sample_rate, steps=spend.steps,
                                      noise_multiplier=spend.noise_multiplier)
            if rounds and rounds[-1].round == spend.round and spend.round is not None:
                rounds[-1] = entry  # several captures in one round: ε after all of them
            else:
                rounds.append(entry)
        over = next((r.round for r in rounds if max_epsilon is not None and r.epsilon is not None
                     and r.epsilon > max_epsilon), None)
        clients.append(ClientPrivacy(client=None if key.startswith("\0") else key, rounds=rounds,
                                     epsilon=rounds[-1].epsilon if rounds else None, over_budget_round=over))
    clients.sort(key=lambda c: (c.epsilon is None, -(c.epsilon or 0.0)))
    return RunPrivacy(delta=delta, accountant=accountant, kind=what, max_epsilon=max_epsilon, clients=clients,  # type: ignore[arg-type]
                      notes=notes)


def budget_findings(privacy: RunPrivacy, captures: Sequence[CaptureReport]) -> list[Finding]:
    """One high finding per client whose cumulative ε exceeds ``max_epsilon``, at the capture of the round where it
    first does (so that --fail-on and --fail-rounds gate it like any finding)."""
    if privacy.max_epsilon is None:
        return []
    out = []
    for client in privacy.clients:
        if client.over_budget_round is None:
            continue
        # ε never falls: the client stays over budget, so the finding sits at its latest round (a gate on the last
        # rounds sees it) and names the round where the budget was first exceeded
        last = client.rounds[-1]
        mine = [c for c in captures if c.client == client.client and c.status == "ok" and c.round == last.round]
        if not mine:
            continue
        who = "a client without an id" if client.client is None else f"client {client.client}"
        known = [r.epsilon for r in client.rounds if r.epsilon is not None]
        shown = client.epsilon if client.epsilon is not None else max(known)
        stated = client_statement(privacy, client) if client.epsilon is not None else (
            f"ε = {short_number(shown)} at δ = {short_number(privacy.delta)} ({privacy.accountant.upper()})")
        out.append(Finding(
            rule=BUDGET_RULE, severity="high", capture=mine[-1].capture.path,
            title=f"{who} is over the privacy budget {short_number(privacy.max_epsilon)}: {stated} (first over "
                  f"after round {client.over_budget_round})",
            detail=f"at δ = {short_number(privacy.delta)} ({privacy.accountant.upper()}), composed over its "
                   f"{len(known)} accounted round(s)" + ("" if client.epsilon is not None else
                                                          "; its ε after that is unknown (DP_UNACCOUNTED)"),
            metric="epsilon", measured=shown, threshold=privacy.max_epsilon))
    return out


def largest_epsilon(privacy: RunPrivacy | None) -> tuple[float, str | None] | None:
    """The largest final ε of any client, and that client, or None."""
    if privacy is None:
        return None
    known = [c for c in privacy.clients if c.epsilon is not None]
    if not known:
        return None
    top = max(known, key=lambda c: c.epsilon or 0.0)
    return float(top.epsilon or 0.0), top.client


def privacy_notices(privacy: RunPrivacy | None, max_epsilon: float | None) -> list[Notice]:
    """What the accounting could not do, said once: clients whose ε became unknown, or a budget with nothing to
    check (DP_UNACCOUNTED, MAX_EPSILON_UNUSED)."""
    if privacy is None:
        if max_epsilon is None:
            return []
        return [Notice(code="MAX_EPSILON_UNUSED", message=f"--max-epsilon {short_number(max_epsilon)} checked "
                       "nothing: no capture records DP (gleak.dp.* from DP-SGD, or Flower's LocalDpMod)")]
    out = []
    for client in privacy.clients:
        reason = next((r.reason for r in client.rounds if r.reason), None)
        if reason is not None:
            who = "a client without an id" if client.client is None else f"client {client.client}"
            out.append(Notice(code="DP_UNACCOUNTED", message=f"{who}: ε unknown from then on: {reason}"))
    return out


def client_statement(privacy: RunPrivacy, client: ClientPrivacy) -> str:
    """The client's ε with its terms: ``ε = 2.17 at δ = 1e-5 (RDP; q = 0.016, 3 steps × 4 rounds)`` when every
    round had the same q and steps, else the ranges; or why it is unknown."""
    if client.epsilon is None:
        reason = next((r.reason for r in client.rounds if r.reason), "unknown")
        return f"ε unknown: {reason}"
    accounted = [r for r in client.rounds if r.sample_rate is not None and r.steps is not None]
    rates = sorted({r.sample_rate for r in accounted if r.sample_rate is not None})
    steps = sorted({r.steps for r in accounted if r.steps is not None})
    zs = sorted({r.noise_multiplier for r in accounted if r.noise_multiplier is not None})
    if len(rates) == 1 and len(steps) == 1 and len(zs) == 1:
        terms = EpsilonTerms(delta=privacy.delta, accountant=privacy.accountant, sample_rate=rates[0],
                             steps=steps[0], rounds=len(accounted), noise_multiplier=zs[0])
        return describe_epsilon(client.epsilon, terms)
    return (f"ε = {short_number(client.epsilon)} at δ = {short_number(privacy.delta)} ({privacy.accountant.upper()}; "
            f"q {short_number(rates[0])}–{short_number(rates[-1])}, {steps[0]}–{steps[-1]} steps per round × "
            f"{len(accounted)} rounds)")


def epsilon_by_round(privacy: RunPrivacy, rounds: Sequence[int]) -> list[float | None]:
    """For each round, the largest cumulative ε over the clients as it stood after that round (a client that did
    not train in a round keeps its ε); None where no client's ε is known yet. One pass over each client's entries
    (they are in round order), so a long run's plots stay linear in its rounds."""
    latest: list[float | None] = [None] * len(privacy.clients)
    seen = [0] * len(privacy.clients)
    best_at: dict[int, float | None] = {}
    for r in sorted(set(rounds)):
        for i, client in enumerate(privacy.clients):
            entries = client.rounds
            while seen[i] < len(entries):
                at = entries[seen[i]].round
                if at is None or at > r:
                    break
                latest[i] = entries[seen[i]].epsilon
                seen[i] += 1
        known = [e for e in latest if e is not None]
        best_at[r] = max(known) if known else None
    return [best_at[r] for r in rounds]
