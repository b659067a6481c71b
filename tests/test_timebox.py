"""Budgets are bounds (issue 44, part 4): deadlines and their shares on an injected clock (no test waits on time),
the checkpoints of the long loops stopping DAGER, tag and the image optimisers at their share in one line, the
audit's per-capture deadline, and the throttled plain progress lines for logs that are not a terminal."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from gleak.errors import GleakError
from gleak.timebox import Deadline, Forecast, OutOfTime, Throttled, checkpoint, current, reporting, running

if TYPE_CHECKING:
    from gleak.attacks import Context

Tiny = tuple[torch.nn.Module, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]


class FakeClock:
    """A monotonic clock that moves only when told to, or by ``tick`` seconds on every reading."""

    def __init__(self, start: float = 1000.0, tick: float = 0.0) -> None:
        self.now, self.tick = start, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# ------------------------------------------------------------------------------------------------ the deadline


def test_a_deadline_counts_down_and_stops_in_one_line_naming_its_share_and_budget() -> None:
    clock = FakeClock()
    audit = Deadline.after(100, "audit", budget="quick", clock=clock)
    assert audit.remaining() == 100 and not audit.expired() and audit.bounded
    clock.advance(10)
    dager = audit.share("dager", fraction=0.5)  # half of the 90 s left
    assert dager.seconds == 45 and dager.remaining() == 45 and audit.remaining() == 90
    dager.check("position 36/150")  # in time: nothing
    clock.advance(45)
    with pytest.raises(OutOfTime) as caught:
        dager.check("position 37/150")
    assert str(caught.value) == "dager stopped at its time share (45 s of budget quick) at position 37/150"
    assert isinstance(caught.value, GleakError) and caught.value.where == "position 37/150"
    assert not audit.expired() and audit.remaining() == 45  # the parent goes on


def test_a_share_never_outlasts_its_parent_and_seconds_and_fractions_combine() -> None:
    clock = FakeClock()
    audit = Deadline.after(60, "audit", budget="quick", clock=clock)
    assert audit.share("tag", seconds=500).remaining() == 60  # capped by the parent's end
    assert audit.share("tag", seconds=10, fraction=0.5).remaining() == 10  # the smaller
    assert audit.share("tag", fraction=0.25).remaining() == 15
    assert audit.share("rest").remaining() == 60  # neither: the rest, renamed
    clock.advance(70)
    late = audit.share("late", fraction=0.5)
    assert late.remaining() == 0 and late.expired()
    with pytest.raises(ValueError):
        audit.share("x", fraction=0)
    with pytest.raises(ValueError):
        audit.share("x", seconds=-1)
    with pytest.raises(ValueError):
        Deadline.after(-1, "x")


def test_an_unbounded_deadline_never_stops_and_its_shares_stay_unbounded() -> None:
    clock = FakeClock()
    free = Deadline.unbounded("gleak reconstruct", clock=clock)
    clock.advance(1e9)
    free.check("anywhere")
    assert free.remaining() == math.inf and not free.share("dager", fraction=0.5).bounded
    assert free.share("dager", seconds=5).remaining() == 5  # seconds bound even an unbounded parent


def test_a_named_view_keeps_the_end_and_names_the_share_it_runs_under() -> None:
    clock = FakeClock()
    tokens = Deadline.after(30, "audit", budget="full", clock=clock).share("tokens", seconds=20)
    bag = tokens.named("token-bag")
    assert bag.end == tokens.end
    clock.advance(25)
    with pytest.raises(OutOfTime, match=r"^token-bag stopped at the time share of tokens \(20 s of budget full\) "
                                        r"at rows 4096/16156$"):
        bag.check("rows 4096/16156")


def test_checkpoints_obey_the_innermost_deadline_in_force_and_nothing_outside_one() -> None:
    clock = FakeClock()
    checkpoint("no scope: nothing happens")
    assert current() is None
    outer = Deadline.after(10, "outer", clock=clock)
    inner = outer.share("inner", seconds=2)
    with running(outer):
        with running(inner):
            assert current() is inner
            clock.advance(3)
            with pytest.raises(OutOfTime, match="^inner stopped"):
                checkpoint("step 3")
        assert current() is outer
        checkpoint("outer still has time")
        with running(None):  # None keeps the one outside
            assert current() is outer
    assert current() is None


# ------------------------------------------------------------------------------------------------ progress


def test_throttled_progress_writes_at_most_one_line_per_period() -> None:
    clock = FakeClock()
    lines: list[str] = []
    sink = Throttled(lines.append, every=30, clock=clock)
    sink("at 0 s")  # nothing yet: the first line comes once a period has passed
    for second in range(1, 100):
        clock.advance(1)
        sink(f"at {second} s")
    assert lines == ["at 30 s", "at 60 s", "at 90 s"] and sink.lines == 3


def test_checkpoints_report_what_where_and_the_seconds_since_the_scope_began() -> None:
    clock = FakeClock()
    lines: list[str] = []
    with reporting(lines.append), running(Deadline.after(None, "dager", clock=clock)):
        clock.advance(12)
        checkpoint("position 37/150")
    with reporting(lines.append):
        checkpoint("outside any deadline")
    checkpoint("no sink: said to nobody")
    assert lines == ["dager: position 37/150, 12 s", "outside any deadline"]


def test_off_a_terminal_the_cli_prints_plain_progress_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from gleak.cli.common import plain_progress

    with plain_progress(every=0), running(Deadline.unbounded("dager")):
        checkpoint("layer 2: position 3/9")
    with plain_progress(show=False), running(Deadline.unbounded("dager")):
        checkpoint("quiet: not shown")
    err = capsys.readouterr().err
    assert err.splitlines() == ["dager: layer 2: position 3/9, 0 s"]


# ------------------------------------------------------------------------------------------------ attacks


@pytest.fixture(scope="module")
def tiny_capture() -> Iterator[Tiny]:
    """A tiny GPT-2-style model's FedSGD gradient of B = 4 random sequences (DAGER recovers them exactly)."""
    pytest.importorskip("transformers")
    from .token_models import gpt2, gradient, token_batch

    torch.set_num_threads(1)
    model = gpt2(d=128, vocab=500)
    ids, mask = token_batch(4, 500, (6, 10), seed=11)
    yield model, gradient(model, ids, mask), ids, mask


def _ctx(tiny: Tiny, deadline: Deadline | None) -> Context:
    from .token_models import spec_of, text_context

    model, tensors, ids, _ = tiny
    spec = spec_of(model, batch_size=int(ids.shape[0]), max_length=int(ids.shape[1]))
    return dataclasses.replace(text_context(tensors, spec), model=model, deadline=deadline)


def _real(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    return [[t for t, m in zip(r, k, strict=True) if m] for r, k in zip(ids.tolist(), mask.tolist(), strict=True)]


def test_dager_stops_at_its_share_in_one_line_and_in_time_finds_the_same_batch(tiny_capture: Tiny) -> None:
    from gleak.attacks import run_attack
    from gleak.attacks.base import TextOutput
    from gleak.attacks.registry import get_attack

    _, _, ids, mask = tiny_capture
    free = run_attack(get_attack("dager", "text"), _ctx(tiny_capture, None))
    assert free.status == "ok" and isinstance(free.output, TextOutput)
    assert sorted(free.output.sequences) == sorted(_real(ids, mask))
    roomy = run_attack(get_attack("dager", "text"),
                       _ctx(tiny_capture, Deadline.after(1e6, "audit", clock=FakeClock(tick=1))))
    assert roomy.status == "ok" and isinstance(roomy.output, TextOutput)
    assert roomy.output.sequences == free.output.sequences
    # every reading of the clock is a second: the share of 20 s ends inside DAGER's loops
    clock = FakeClock(tick=1)
    share = Deadline.after(100, "audit", budget="quick", clock=clock).share("dager", seconds=20)
    stopped = run_attack(get_attack("dager", "text"), _ctx(tiny_capture, share))
    assert stopped.status == "failed" and stopped.out_of_time and stopped.output is None
    reason = stopped.reason or ""
    assert reason.startswith("dager stopped at its time share (20 s of budget quick) at "), reason
    assert "\n" not in reason and len(reason) < 120


def test_an_attack_whose_share_is_spent_before_it_starts_fails_at_once(tiny_capture: Tiny) -> None:
    from gleak.attacks import run_attack
    from gleak.attacks.registry import get_attack

    clock = FakeClock()
    spent = Deadline.after(5, "audit", budget="standard", clock=clock)
    clock.advance(6)
    result = run_attack(get_attack("token-bag", "tokens"), _ctx(tiny_capture, spent))
    assert result.status == "failed" and result.out_of_time
    assert result.reason == "token-bag stopped at the time share of audit (5 s of budget standard) at its start"


def test_the_deadline_in_force_bounds_an_attack_whose_context_has_none(tiny_capture: Tiny) -> None:
    from gleak.attacks import run_attack
    from gleak.attacks.registry import get_attack

    clock = FakeClock(tick=1)
    with running(Deadline.after(3, "twins", budget="full", clock=clock)):
        result = run_attack(get_attack("dager", "text"), _ctx(tiny_capture, None))
    assert result.status == "failed" and result.out_of_time
    assert (result.reason or "").startswith("dager stopped at the time share of twins (3 s of budget full) at ")


def _tag_under(tiny: Tiny, seconds: float, iterations: int) -> tuple[str | None, list[str]]:
    """tag on the tiny capture with ``iterations`` steps and a deadline of ``seconds``, each step a second (its
    checkpoint's progress line moves the clock; the set-up takes none): (why it failed, or None; the step lines)."""
    from gleak.attacks import run_attack
    from gleak.attacks.registry import get_attack

    attack = get_attack("tag", "text")
    attack.configure({"iterations": str(iterations)})
    clock = FakeClock()
    lines: list[str] = []

    def tick(line: str) -> None:
        if line.startswith("tag: restart"):
            lines.append(line)
            clock.advance(1)

    with reporting(tick):
        result = run_attack(attack, _ctx(tiny, Deadline.after(seconds, "tag", budget="full", clock=clock)))
    assert (result.status == "ok") == (result.reason is None) and result.out_of_time == (result.status == "failed")
    return result.reason, lines


def test_tag_stops_at_once_when_its_steps_cannot_fit_and_at_its_share_otherwise(tiny_capture: Tiny) -> None:
    # 1000 steps of a second in 10 s: stopped after the first 3, from their pace
    reason, lines = _tag_under(tiny_capture, 10, 1000)
    assert reason == ("tag stopped after 3 of 1000 steps: at 1 s each it would need about 1000 s, more than its "
                      "time share (10 s of budget full)"), reason
    assert lines[:2] == ["tag: restart 1/1, step 0/1000, 0 s", "tag: restart 1/1, step 1/1000, 1 s"]
    # 8 steps (and the last distance) at a second each: their pace fits 8.4 s, the last distance does not
    reason, lines = _tag_under(tiny_capture, 8.4, 8)
    assert reason == "tag stopped at its time share (8 s of budget full) at restart 1/1, step 8/8", reason
    assert len(lines) == 9
    assert _tag_under(tiny_capture, 9.5, 8)[0] is None  # in time: ok


def test_a_forecast_stops_a_loop_whose_pace_cannot_meet_the_deadline() -> None:
    clock = FakeClock()
    with running(Deadline.after(100, "ig", budget="full", clock=clock)):
        slow = Forecast(100)
        for done in range(1, 3):
            clock.advance(2)
            slow.check(done)  # too few steps to judge
        clock.advance(2)
        with pytest.raises(OutOfTime, match=r"^ig stopped after 3 of 100 steps: at 2 s each it would need about "
                                            r"200 s, more than its time share \(100 s of budget full\)$"):
            slow.check(3)
        fast = Forecast(100)
        for done in range(1, 100):
            clock.advance(0.5)
            fast.check(done)  # 50 s in all, inside the 94 s left
    Forecast(100).check(50)  # outside a deadline: nothing


def test_the_image_optimisers_stop_at_the_deadline_in_force() -> None:
    from gleak.attacks.reconstruct.optimize import adam, lbfgs

    def objective(x: torch.Tensor) -> torch.Tensor:
        return (x - 1).square().sum() + 1  # never 0: L-BFGS would stop there

    gen = torch.Generator().manual_seed(0)
    clock = FakeClock(tick=1)
    with running(Deadline.after(100, "ig", budget="full", clock=clock)), \
            pytest.raises(OutOfTime, match=r"^ig stopped after 3 of 200 steps: at [\d.]+ s each it would need about "):
        adam(objective, (3,), 100, 2, 0.1, gen, torch.device("cpu"), None)  # Adam: its pace judged
    clock = FakeClock(tick=1)
    with running(Deadline.after(5, "feature", budget="standard", clock=clock)), \
            pytest.raises(OutOfTime, match=r"^feature stopped at its time share \(5 s of budget standard\) at "
                                           r"restart 1/2, step \d+/100$"):
        lbfgs(objective, (3,), 100, 2, 1.0, gen, torch.device("cpu"))  # L-BFGS may converge early: no forecast
    found = adam(objective, (3,), 100, 1, 0.1, torch.Generator().manual_seed(0), torch.device("cpu"), None)
    assert found.iterations_run == 100  # no deadline: the whole run


# ------------------------------------------------------------------------------------------------ the audit


def test_each_budget_states_its_bound_and_keeps_a_reserve() -> None:
    from gleak.runs.audit.setup import BUDGET_SECONDS, budget_deadline

    assert BUDGET_SECONDS == {"quick": 120.0, "standard": 600.0, "full": 1200.0}
    clock = FakeClock()
    quick, full = budget_deadline("quick", clock=clock), budget_deadline("full", clock=clock)
    assert quick.remaining() == 90 and quick.budget == "quick"  # 30 s kept back
    assert full.remaining() == 1080 and full.budget == "full"  # 10 % kept back
    assert budget_deadline("full", spent=80, clock=clock).remaining() == 1000  # opening the capture counts
    assert budget_deadline("quick", seconds=10, clock=clock).remaining() == 5  # at most half kept back
    assert budget_deadline("quick", spent=200, clock=clock).remaining() == 0


@pytest.fixture(scope="module")
def text_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a tiny LLaMA-style model's capture of B = 4 notes, beside its truth; the model's folder)."""
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from gleak.cli import app

    from .text_models import build_notes_and_models

    folder = tmp_path_factory.mktemp("timebox")
    notes, llama, _ = build_notes_and_models(folder)
    out = folder / "c.safetensors"
    result = CliRunner().invoke(app, ["simulate", "--model", str(llama), "--data", str(notes), "-b", "4",
                                      "--max-length", "12", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    return out, llama


def test_an_audit_past_its_time_limit_reports_each_attack_stopped_not_an_error(text_capture: tuple[Path, Path]
                                                                              ) -> None:
    from gleak.capture import load_capture
    from gleak.models import load_model
    from gleak.runs.audit.capture import audit_loaded
    from gleak.runs.audit.setup import AuditConfig

    out, llama = text_capture
    # a microsecond: spent before the first attack starts
    report, _, _ = audit_loaded(load_capture(out), load_model(llama), [], AuditConfig(time_limit=1e-6),
                                model_folder=llama)
    assert report.status == "ok", report.error
    ran = [t for t in report.tokens or [] if t.status != "not_applicable"]
    stopped = re.compile(r"^(\S+) stopped at (its|the) time share (of [\w ]+ )?\(0 s of budget quick, --time-limit "
                         r"1e-06\) at its start$")
    assert ran and all(t.status == "failed" and (m := stopped.match(t.reason or "")) and m[1] == t.attack
                       for t in ran), [(t.attack, t.reason) for t in ran]
    assert report.sentences is not None and report.sentences.status == "failed"
    assert stopped.match(report.sentences.reason or ""), report.sentences.reason


def test_the_audit_prints_its_attacks_progress_off_a_terminal(text_capture: tuple[Path, Path], gleak,  # type: ignore[no-untyped-def]
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from gleak import timebox

    out, llama = text_capture
    monkeypatch.setattr(timebox, "PROGRESS_EVERY", 0.0)  # every line (the 30 s throttle is tested on its own clock)
    r = gleak("audit", out, "--model", llama, "--format", "json")
    assert r.exit_code in (0, 1), r.stderr
    lines = r.stderr.splitlines()
    assert any(re.fullmatch(r"token-bag: rows \d+/\d+, \d+ s", line) for line in lines), lines[:20]
    dager = re.compile(r"dager: layer 2: position \d+/\d+, \d+ prefixes, \d+ s")
    assert any(dager.fullmatch(line) for line in lines), lines[:20]
    quiet = gleak("audit", out, "--model", llama, "--format", "json", "--quiet")
    assert not any(line.startswith(("token-bag:", "dager:")) for line in quiet.stderr.splitlines())


def test_the_time_limit_is_checked_in_one_line(gleak, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    r = gleak("audit", "nothing.safetensors", "--model", "nothing.safetensors", "--time-limit", "0")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "--time-limit" in r.stderr, r.stderr
    monkeypatch.setenv("GLEAK_TIME_LIMIT", "soon")
    r = gleak("audit", "nothing.safetensors", "--model", "nothing.safetensors")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "GLEAK_TIME_LIMIT" in r.stderr, r.stderr
