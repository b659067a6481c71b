"""The reconstruction run behind ``gleak reconstruct`` — and the one the audit runs within its budget: choose
the attack (:func:`auto_attack`), prepare its targets (recovered labels, the truth or a labels report), run it,
check its pixels, and score images and recovered outputs against the ground truth (:mod:`gleak.runs.scoring`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gleak import __version__
from gleak.attacks import Context, run_attack
from gleak.attacks.base import AttackResult, ImageOutput, RunInputs, jsonable
from gleak.attacks.reconstruct.base import ReconstructionAttack
from gleak.attacks.reconstruct.generative import GenerativeAttack
from gleak.attacks.reconstruct.inputs import ReconInputs, describe_targets, prepare
from gleak.attacks.reconstruct.objective import DISTANCES
from gleak.attacks.registry import get_attack, resolve_assignments
from gleak.capture import Truth
from gleak.errors import LABELS_TRUTH_OFF, GleakError, shorten
from gleak.io import OutputSet, safetensors_bytes
from gleak.registry import check_flag_conflicts
from gleak.report.model import Baseline, ImageMetrics, ReconstructLabels, ReconstructReport
from gleak.runs.inputs import InputSpec, model_mode_of, open_inputs
from gleak.runs.scoring import ScoredImages, score_outputs, score_reconstruction
from gleak.settings.values import LPIPS_NETWORKS

if TYPE_CHECKING:
    from gleak.generator.file import GeneratorFile

FIXED_OUTPUTS = ("grid.png", "lineup.png", "metrics.json", "images.safetensors", "recovered.safetensors")
Progress = Callable[[int, int, int, float], None]  # an attack's: restart, step, steps, loss


@dataclass(frozen=True)
class ReconProgress:
    """Where a reconstruction stands: the attack, the restart (from 0) of how many, the step of how many, and
    the best loss so far."""

    attack: str
    restart: int
    restarts: int
    step: int
    steps: int
    loss: float


def auto_attack(ctx: Context) -> str:
    """The automatic choice: imprint or trap-weights where the global model carries one (a malicious server's:
    exact at any batch size), fcn where it applies (analytic, exact), else feature for one example, else ig."""
    for trap in ("imprint", "trap-weights"):
        if get_attack(trap).not_applicable(ctx) is None:
            return trap
    if get_attack("fcn").not_applicable(ctx) is None:
        return "fcn"
    return "feature" if ctx.batch_size == 1 else "ig"


def choose_attack(ctx: Context, name: str) -> ReconstructionAttack:
    """The named reconstruction attack, or for ``auto`` the :func:`auto_attack` choice."""
    try:  # only reconstruction attacks are listed or suggested: a label attack is never the fix here
        return get_attack(auto_attack(ctx) if name == "auto" else name, "reconstruct")
    except GleakError as e:
        raise GleakError(f"{e}, or auto") from None


@dataclass
class Reconstruction:
    """One reconstruction: the attack's result, the targets it used, and — when it made finite images — the
    images (reordered to pair with the truth when scored), the true images and the scores."""

    result: AttackResult
    prepared: ReconInputs
    images: torch.Tensor | None = None
    truth_pixels: torch.Tensor | None = None
    scored: ScoredImages | None = None
    scoring_error: str | None = None  # the truth could not be scored against these images (shape)
    output_scores: dict[str, Any] | None = None
    diverged: bool = False

    @property
    def ok(self) -> bool:
        return self.result.status == "ok" and not self.diverged


FEATURE_ATTACKS = ("feature", "fcn")  # the attacks handed the single example's last-layer input


def wants_feature(name: str) -> bool:
    """Whether reconstruction attack ``name`` is handed the feature (:func:`prepare`'s ``want_feature``)."""
    return name in FEATURE_ATTACKS


def reconstruct(ctx: Context, attack: ReconstructionAttack, labels: str, truth: Truth | None,
                generator: GeneratorFile | None = None, progress: Progress | None = None,
                lpips: str = "alex", prepared: ReconInputs | None = None) -> Reconstruction:
    """Prepare ``attack``'s targets from ``labels`` (``auto``, ``truth`` or a labels report; a GleakError when
    there are none), run it (never raises: a failure is the result's status), and score what it made against
    ``truth`` when given. ``prepared``: targets already prepared on ``ctx`` (:func:`prepare`, with
    ``want_feature`` when any attack they are for :func:`wants_feature`), used instead of preparing again — the
    sweep prepares once per point for all its attacks; ``labels`` is then unused. An attack that does not want the
    feature is not handed one."""
    want = wants_feature(attack.name)
    if prepared is None:
        prepared = prepare(ctx, labels, truth, want_feature=want)
    elif not want and prepared.feature is not None:
        prepared = replace(prepared, feature=None, feature_source=None)
    result = run_attack(attack, ctx, prepared.run_inputs(progress, generator))
    out = Reconstruction(result, prepared)
    if result.status != "ok" or not isinstance(result.output, ImageOutput):
        return out
    images = result.output.images
    if images is not None and not bool(torch.isfinite(images).all()):
        result.status, result.reason, result.output = "failed", "non-finite pixels (diverged)", None
        out.diverged = True
        return out
    out.images = images
    classes = prepared.targets.argmax(1).tolist()
    if truth is not None and result.output.recovered:
        out.output_scores = jsonable(score_outputs(ctx, truth, result.output.recovered, classes))
    if truth is not None and images is not None:
        try:
            out.scored = score_reconstruction(ctx, images, truth, lpips)
        except GleakError as e:
            out.scoring_error = str(e)
        else:
            out.images, out.truth_pixels = out.scored.images, out.scored.truth  # image k pairs with truth k
    return out


# ------------------------------------------------------------------------------------- gleak reconstruct
@dataclass(kw_only=True, frozen=True)
class ReconstructRequest:
    """``gleak reconstruct``: the inputs, the attack (``auto`` or a name), where its labels come from, an image
    generator for fgla/rgla, the dedicated flags' values (``{"iterations": 300}``; keys an attack declares) and
    ``-O`` assignments by attack, and the LPIPS network (``off`` to skip)."""

    inputs: InputSpec
    attack: str = "auto"
    labels: str = "auto"
    generator: Path | None = None
    flags: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    lpips: str = "alex"

    def check(self) -> None:
        """Every option checked before any file is read (one-line GleakErrors)."""
        if self.lpips not in LPIPS_NETWORKS:
            raise GleakError(f"--lpips must be alex, vgg or off, got {shorten(repr(self.lpips), 40)}")
        distance = self.flags.get("distance")
        if distance is not None and distance not in DISTANCES:
            raise GleakError(f"--distance must be one of {', '.join(DISTANCES)}, got {shorten(distance, 40)!r}")
        if self.labels == "truth" and self.inputs.no_truth:
            raise GleakError(LABELS_TRUTH_OFF)
        check_flag_conflicts(self.flags, self.options)
        resolve_assignments(self.options, task="reconstruct")  # every -O checked before any work
        if self.inputs.model.path is None:
            raise GleakError("reconstruction needs the global model (--model)")


@dataclass
class ReconstructRun:
    """What ``gleak reconstruct`` produced: the typed report and the tensors its files hold."""

    report: ReconstructReport
    images: torch.Tensor | None
    truth_pixels: torch.Tensor | None
    recovered: dict[str, torch.Tensor]
    lineup: torch.Tensor | None = None  # the identification lineups as a picture (lineup.png), with truth


def run_reconstruct(request: ReconstructRequest,
                    progress: Callable[[ReconProgress], None] | None = None) -> ReconstructRun:
    """Open the inputs, choose and configure the attack, reconstruct, score; the report and the images.
    ``progress`` is called as the optimiser goes."""
    request.check()
    inputs = open_inputs(request.inputs)
    ctx = inputs.ctx
    chosen = choose_attack(ctx, request.attack)
    gen_file = None
    if request.generator is not None:
        from gleak.generator.file import load_generator

        if not isinstance(chosen, GenerativeAttack):
            raise GleakError(f"--generator is for the generative attacks (fgla, rgla); {chosen.name} does not use it")
        gen_file = load_generator(request.generator, ctx.device)
    reason = chosen.not_applicable(ctx, RunInputs(generator=gen_file))
    if reason:
        raise GleakError(f"{chosen.name} does not apply: {reason}")
    flags = dict(request.flags)
    given = {k: v for k, v in flags.items() if k in chosen.Options.model_fields}
    typed = chosen.configure({**given, **request.options.get(chosen.name, {})}, {k: f"--{k}" for k in flags})
    ignored = ignored_options(chosen.name, typed.model_dump(), flags, request.options)
    step: Progress | None = None
    if progress is not None:
        restarts, report_to = int(getattr(chosen.used_options(), "restarts", 1)), progress

        def step(restart: int, it: int, total: int, loss: float) -> None:
            report_to(ReconProgress(chosen.name, restart, restarts, it, total, loss))

    started = time.perf_counter()
    done = reconstruct(ctx, chosen, request.labels, inputs.truth, gen_file, step, request.lpips)
    result = done.result
    if done.diverged:
        raise GleakError(f"{chosen.name} diverged (non-finite pixels); try a smaller --lr")
    if result.status != "ok" or not isinstance(result.output, ImageOutput):
        raise GleakError(f"{chosen.name} failed: {result.reason}")
    if done.scoring_error:
        raise GleakError(done.scoring_error)
    prepared = done.prepared
    labels = ReconstructLabels(source=prepared.source, targets=describe_targets(prepared.targets),
                               classes=prepared.targets.argmax(1).tolist())  # top class per image, in order
    if prepared.label_result is not None:
        labels.attack_seconds = round(prepared.label_result.seconds, 3)
    metrics = baseline = None
    if done.scored is not None:
        from gleak.metrics.images import BASELINE_MARGIN

        scored = done.scored
        metrics = ImageMetrics.model_validate(jsonable(scored.metrics))
        floor, kind, beats = scored.baseline_psnr, scored.baseline_kind, scored.baseline_beaten
        baseline = Baseline(psnr=round(floor, 2), kind=kind, margin_db=BASELINE_MARGIN, beaten=beats,
                            statement=None if beats else
                            f"no better than a blank/mean-image baseline ({floor:.2f} dB, {kind}): mean PSNR "
                            f"{scored.metrics['mean']['psnr']:.2f} dB is not {BASELINE_MARGIN:g} dB above it")
    lineup = identification = None
    if done.scored is not None and done.images is not None and done.truth_pixels is not None and inputs.truth:
        from gleak.metrics.identification import DEFAULT_DISTRACTORS
        from gleak.report.images import lineup_picture
        from gleak.runs.scoring import identification_of

        found = identification_of(ctx, done.images, done.truth_pixels, inputs.truth, DEFAULT_DISTRACTORS,
                                  request.inputs.seed)
        if found is not None:
            ident, drawn = found
            lineup = lineup_picture(done.images, done.truth_pixels, drawn.images, ident.matched, ident.scores)
            identification = ident.to_json()
    report = ReconstructReport(
        gleak_version=__version__, capture=str(request.inputs.capture), model=str(request.inputs.model.path),
        attack=chosen.name, paper=chosen.paper, options=result.options or {}, batch_size=ctx.batch_size,
        labels=labels, feature_source=prepared.feature_source, seed=request.inputs.seed, device=str(ctx.device),
        seconds=round(result.seconds, 3), total_seconds=0.0, diagnostics=jsonable(result.output.diagnostics),
        warnings=result.warnings, metrics=metrics, model_check=ctx.model_check, model_mode=model_mode_of(ctx),
        ignored_options=ignored, threads=torch.get_num_threads(), baseline=baseline,
        generator=gen_file.describe() if gen_file is not None else None, output_scores=done.output_scores,
        images_written=done.images is not None, identification=identification)
    # iterations are Adam steps or L-BFGS outer steps; an L-BFGS step runs many objective evaluations
    iterations, evaluations = (result.output.diagnostics.get(k) for k in ("iterations_run", "evaluations_run"))
    if iterations and result.seconds > 0:
        report.iterations_per_second = round(iterations / result.seconds, 2)
    if evaluations and result.seconds > 0:
        report.evaluations_per_second = round(evaluations / result.seconds, 2)
    report.total_seconds = round(time.perf_counter() - started, 3)
    return ReconstructRun(report, done.images, done.truth_pixels, dict(result.output.recovered), lineup)


def ignored_options(attack: str, used: Mapping[str, Any], flags: Mapping[str, Any],
                    assignments: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The options the user set that the chosen attack does not use (reported, never silently dropped): flags
    it does not declare, -O for other attacks, and signed for feature unless its distance is cosine."""
    idle = {"signed"} if attack == "feature" and used.get("distance") != "cosine" else set()
    notes = [f"--{key}: {attack} does not use it" for key in flags if key not in used or key in idle]
    for name, values in assignments.items():
        for key in values:
            if name != attack:
                notes.append(f"-O {name}.{key}: {attack} ran, not {name}")
            elif key in idle:
                notes.append(f"-O {name}.{key}: {attack} uses it only with distance cosine")
    return notes


def write_outputs(run: ReconstructRun, folder: Path, force: bool) -> list[Path]:
    """Write the reconstruction's files; every one appears together, or (on any failure) none does.

    The grid and the per-image PNGs are enlarged alike; each grid cell is captioned with the label the
    attack used and, with ground truth, its PSNR and SSIM. What a generative attack recovers on the way
    (logits, features) goes to recovered.safetensors; without images only it and metrics.json are written."""
    from gleak.report.formats.text import fmt_number
    from gleak.report.images import enlarge, grid, png_bytes

    data = run.report.to_json()
    images, truth, recovered = run.images, run.truth_pixels, run.recovered
    extra = {"gleak.kind": "recovered", "gleak.attack": data["attack"]}
    metrics_json = (json.dumps(data, indent=2) + "\n").encode()
    if images is None:
        with OutputSet(folder, force) as out:
            out.write_bytes("recovered.safetensors", safetensors_bytes(
                {k: v.contiguous() for k, v in recovered.items()}, extra))
            out.write_bytes("metrics.json", metrics_json)
            return out.commit()
    rows = [truth, images] if truth is not None else [images]
    m = data["metrics"]
    order = m["matching"] if m is not None else list(range(len(images)))
    classes = data["labels"].get("classes") or []
    captions = []
    for k, source in enumerate(order):
        lines = [f"label {classes[source]}" if source < len(classes) else "label ?"]
        if m is not None:
            p, q = m["psnr"][k], m["ssim"][k]  # None: not finite (identical images give +inf dB)
            lines += ["exact" if p is None else f"{p:.1f} dB", f"SSIM {fmt_number(q, 2)}"]
        captions.append(lines)
    shown = enlarge(images.float())
    with OutputSet(folder, force) as out:
        out.write_bytes("grid.png", png_bytes(grid(rows, captions=captions)))
        if run.lineup is not None:
            out.write_bytes("lineup.png", png_bytes(run.lineup))
        for i, image in enumerate(shown):
            out.write_bytes(f"recon_{i:03d}.png", png_bytes(image))
        out.write_bytes("images.safetensors", safetensors_bytes(
            {"images": images.contiguous()}, {"gleak.kind": "reconstruction", "gleak.attack": data["attack"]}))
        if recovered:
            out.write_bytes("recovered.safetensors", safetensors_bytes(
                {k: v.contiguous() for k, v in recovered.items()}, extra))
        out.write_bytes("metrics.json", metrics_json)
        return out.commit()

