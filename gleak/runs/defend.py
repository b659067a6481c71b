"""The runs behind ``gleak defend`` and ``gleak defenses``: a capture through defenses, written with its truth
rebound to the new file; the defense registry described."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gleak.capture import Capture, load_capture, load_truth, save_capture, save_truth, truth_path_for
from gleak.defenses import DEFENSES, Defense, apply_defenses, contribution_distortion
from gleak.errors import GleakError
from gleak.io import OutputSet, check_writable, companion_exists
from gleak.report.model import DefenseInfo


@dataclass
class DefendRun:
    capture: Capture
    written: list[Path]
    distortion: dict[str, float]


def run_defend(source: Path, defenses: list[Defense], output: Path, seed: int = 0, force: bool = False) -> DefendRun:
    """``source`` through ``defenses`` into ``output`` (and the truth beside the source, when there is one, into
    the truth beside ``output``, bound to the new file's bytes). Nothing is written unless all of it can be."""
    if not defenses:
        raise GleakError("give at least one --defense NAME[:KEY=VALUE,...] (gleak defenses lists them)")
    try:
        same = output.resolve() == source.resolve()
    except OSError:
        same = False
    if same:
        raise GleakError(f"{output} is the input capture: write the defended capture to another file")
    capture = load_capture(source)
    truth_file = truth_path_for(source)
    truth = load_truth(truth_file, capture) if companion_exists(truth_file) else None
    check_writable(output, force)
    if truth is not None:
        check_writable(truth_path_for(output), force)
    defended = apply_defenses(capture, defenses, seed)
    with OutputSet(output.parent, force) as out:  # both files or neither
        save_capture(defended, out.path(output.name), force=force, clock=False)  # the input's time, if any
        if truth is not None:
            save_truth(truth, out.path(truth_path_for(output).name), capture_path=out.path_of(output.name),
                       force=force)
        written = out.commit()
    return DefendRun(defended, written, contribution_distortion(capture, defended))


def describe_defenses() -> list[DefenseInfo]:
    """One entry per registered defense: name, summary, kind (contribution or training), the option a sweep
    varies, where it comes from, and its options (name, type, default, range, help)."""
    ordered = sorted(DEFENSES.values(), key=lambda c: c.training)  # contribution first
    return [DefenseInfo.model_validate(cls.describe()) for cls in ordered]
