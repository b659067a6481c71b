"""`gleak audit`: the CI privacy gate. Exit 0: no finding at or above --fail-on; 1: one is; 2: bad input."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.markup import escape

from gleak.cli.common import (
    AllowMismatchOpt,
    ArchKwargsOpt,
    ArchOpt,
    AttackOptionsOpt,
    DeviceOpt,
    ForceOpt,
    JobsOpt,
    LpipsNetwork,
    LpipsOpt,
    MaxMemoryOpt,
    QuietOpt,
    SeedOpt,
    TrustPickleOpt,
    VerboseOpt,
    apply_threads,
    check_output_folder,
    console,
    err_console,
    gigabytes,
    handle_errors,
    number,
    parameter_envvar,
    parameter_source,
    parse_jobs,
    print_json,
    requested_threads,
)
from gleak.errors import GleakError, Origin, did_you_mean

if TYPE_CHECKING:
    from gleak.report.model import Budget, ExecutorName, FailOn, Report, SweepReport
    from gleak.runs.audit import AuditConfig
    from gleak.runs.audit.setup import HashCache

FORMATS = ("table", "json", "html", "sarif", "md", "junit")


def parse_formats(text: str, origin: Origin | None = None) -> list[str]:
    """``table,json`` -> ["table", "json"]; unknown names are a usage error naming where the value came from
    (``origin``: --format unless told, e.g. GLEAK_FORMAT or the config file's key)."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in FORMATS]
    if bad or not names:
        hint = did_you_mean(bad[0], FORMATS) if len(bad) == 1 else ""
        raise GleakError((origin or Origin("--format")).bad(
            text, f"must be a comma-separated list of {', '.join(FORMATS)}", hint))
    return list(dict.fromkeys(names))


@handle_errors
def audit(
    ctx: typer.Context,
    paths: Annotated[list[Path] | None, typer.Argument(help="Capture files, or folders searched for captures.",
                                                       metavar="CAPTURE_OR_DIR...", show_default=False)] = None,
    model: Annotated[list[Path] | None, typer.Option("--model", "-M", help="Global model file or a folder of "
                                                     "them (repeatable); each capture uses the model whose sha256 "
                                                     "it records (required, here or in the config).")] = None,
    aux: Annotated[list[Path] | None, typer.Option("--aux", help="Auxiliary data (repeatable); each capture "
                                                   "uses the first whose input shape and classes fit.")] = None,
    budget: Annotated[str, typer.Option(envvar="GLEAK_BUDGET", help="quick (label attacks and analytic "
                                        "reconstruction), standard (plus a bounded gradient-matching run) or "
                                        "full (the reconstruct defaults).")] = "quick",
    fail_on: Annotated[str, typer.Option("--fail-on", envvar="GLEAK_FAIL_ON", help="Exit 1 when a finding is "
                                         "at or above this severity: info, low, medium, high, critical, or "
                                         "none (never).")] = "high",
    fail_rounds: Annotated[str, typer.Option("--fail-rounds", envvar="GLEAK_FAIL_ROUNDS", help="Which rounds of a "
                                             "run (gleak.fl.round) the gate looks at: any, last:K (the K latest; "
                                             "captures without a round always count) or all (a finding in every "
                                             "round).")] = "any",
    format: Annotated[str, typer.Option("--format", "-f", envvar="GLEAK_FORMAT", help="Comma-separated: table "
                                        "(console), json, html, sarif, md, junit (files in -o DIR; json "
                                        "without -o goes to stdout).")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Folder for report.json, report.html, "
                                                "report.sarif, report.md, junit.xml and image grids.")] = None,
    option: AttackOptionsOpt = None,
    max_memory: MaxMemoryOpt = None,
    threshold: Annotated[list[str] | None, typer.Option("--threshold", help="Override a severity threshold, "
                                                        "NAME=VALUE (repeatable; names and defaults in "
                                                        "docs/audit.md).")] = None,
    lpips: LpipsOpt = LpipsNetwork.alex,
    confidence: Annotated[int, typer.Option("--confidence", callback=number(0, 1000), help="Captures without "
                                            "ground truth: calibrate the label attacks on this many batches "
                                            "simulated from --aux like the capture's (GLEAK-LABELS-EXPECTED; 0: "
                                            "off).")] = 24,
    model_cache: Annotated[int, typer.Option("--model-cache", callback=number(1, 1000), help="Models kept loaded "
                                             "at once; the others are loaded when a capture needs them (memory "
                                             "stays flat over many rounds).")] = 4,
    lineup: Annotated[int, typer.Option("--lineup", callback=number(1, 99), help="Distractors beside each true "
                                        "image in the identification lineup of GLEAK-IMAGES (chance 1 / "
                                        "(K + 1)).")] = 9,
    max_epsilon: Annotated[float | None, typer.Option(
        "--max-epsilon", envvar="GLEAK_MAX_EPSILON", metavar="EPSILON", callback=number(0, low_open=True),
        help="Privacy budget: a finding (GLEAK-DP-BUDGET, high) for every client whose ε, composed over the rounds "
        "of the run from what its captures record (DP-SGD or Flower's LocalDpMod), exceeds it.")] = None,
    jobs: JobsOpt = "auto",
    executor: Annotated[str, typer.Option("--executor", envvar="GLEAK_EXECUTOR", help="local (this machine's "
                                          "processes) or ray (a Ray cluster; the ray extra: pip install -e "
                                          "'.[ray]' from a clone; --jobs then counts Ray workers, auto or 1: one "
                                          "per cluster CPU).")] = "local",
    address: Annotated[str | None, typer.Option("--address", envvar="GLEAK_RAY_ADDRESS", help="Ray cluster "
                                                "address (--executor ray; default: RAY_ADDRESS, else a local "
                                                "Ray instance for this run).")] = None,
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    allow_model_mismatch: AllowMismatchOpt = False,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    config_file: Annotated[Path | None, typer.Option("--config", help="Config file (default: gleak.toml, else "
                                                     "[tool.gleak] in pyproject.toml, in the working "
                                                     "directory).")] = None,
    show_config: Annotated[bool, typer.Option("--show-config", help="Print the effective configuration and "
                                              "where each value came from, then exit.")] = False,
    sweep: Annotated[Path | None, typer.Option("--sweep", help="A gleak sweep's folder (or its sweep.json): its "
                                               "plots and tables go into report.html (needs html in "
                                               "--format).")] = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Audit captures for leakage: findings with severities, reports for people, CI and code scanning."""
    from gleak.config import find_config

    loaded = find_config(config_file)
    given = {"budget": budget, "fail_on": fail_on, "fail_rounds": fail_rounds,
             "format": format, "lpips": str(lpips), "jobs": jobs, "seed": seed,
             "device": device, "model": model, "aux": aux, "arch": arch, "arch_kwargs": arch_kwargs,
             "threshold": threshold, "option": option, "executor": executor, "address": address,
             "max_epsilon": max_epsilon}
    effective, sources = merge_config(ctx, given, loaded)
    origins = {key: origin_of(ctx, key, sources[key], loaded) for key in OPTION_KEYS}
    if show_config:
        _show_config(effective, sources, origins)
        return
    checked = check_settings(effective, sources, origins, paths, output, force, sweep, loaded)
    config = _audit_config(effective, checked, paths or [], allow_model_mismatch=allow_model_mismatch,
                           confidence=confidence, max_memory=max_memory, lineup=lineup, model_cache=model_cache,
                           trust_pickle=trust_pickle)
    from gleak.runs.audit.setup import HashCache

    hashes, sweep_report = HashCache(), checked.sweep  # each model file hashed once, for the sweep's check too
    if sweep is not None and sweep_report is not None:
        sweep_report = check_sweep_model(sweep, sweep_report, checked.model, config, hashes)
    report = _run(list(paths or []), checked.model, checked.aux, config, output, checked.workers,
                  show=not quiet and "table" in checked.formats, executor=checked.executor, address=checked.address,
                  hashes=hashes)
    if output is not None:
        from gleak.report.outputs import write_outputs

        write_outputs(report, checked.files or ["json"], output, sweep_report)
    _render(report, checked.formats, checked.files, output, quiet)
    if report.has_errors():
        raise typer.Exit(2)
    if report.failed():
        raise typer.Exit(1)


@dataclass(frozen=True)
class CheckedSettings:
    """The audit's settings once every one is checked: what the run and the rendering take."""

    formats: list[str]  # every --format name, table included
    files: list[str]  # the formats written as files (or json to stdout without -o)
    budget: Budget
    fail_on: FailOn
    fail_rounds: str
    executor: ExecutorName
    workers: int
    address: str | None
    options: dict[str, dict[str, str]]
    model: list[Path]
    aux: list[Path]
    sweep: SweepReport | None


def check_settings(effective: dict[str, Any], sources: dict[str, str], origins: dict[str, Origin],
                   paths: list[Path] | None, output: Path | None, force: bool, sweep: Path | None,
                   loaded: Any) -> CheckedSettings:
    """Every setting checked before any work, each error naming where its value came from (flag, variable,
    file); the output folder and the sweep (an untrusted file) too."""
    from gleak.errors import choose
    from gleak.report.formats import get_format
    from gleak.runs.audit.setup import BUDGETS, EXECUTORS, FAIL_ON, parse_fail_rounds

    formats = parse_formats(effective["format"], origins["format"])
    budget = choose(effective["budget"], BUDGETS, origins["budget"])
    gate = choose(effective["fail_on"], FAIL_ON, origins["fail_on"])
    fail_rounds = parse_fail_rounds(effective["fail_rounds"], origins["fail_rounds"])
    runner = choose(effective["executor"], EXECUTORS, origins["executor"])
    workers = parse_jobs(effective["jobs"], origins["jobs"])
    executor, address = effective["executor"], effective["address"]
    if address is not None and executor != "ray":
        raise GleakError(f"{origins['address'].subject(address)} is a Ray cluster's address: use it with --executor "
                         f"ray (the executor is {executor!r}, from "
                         f"{'the default' if sources['executor'] == 'default' else sources['executor']})")
    assignments = _attack_options(effective["option"] or [], origins["option"])
    if not paths:
        raise GleakError("give at least one capture or folder of captures (CAPTURE_OR_DIR...)")
    if not effective["model"]:
        raise GleakError("audit needs the global model: --model FILE_OR_DIR (or model = [...] in the config)")
    if loaded.settings.threads is not None and requested_threads() is None:
        apply_threads(loaded.settings.threads)
    files = [f for f in formats if f != "table"]
    if output is None and any(f != "json" for f in files):
        raise GleakError(f"--format {','.join(files)} writes files: give a folder with -o DIR")
    if output is not None:
        check_output_folder(output, force, [get_format(n).FILENAME for n in files or ["json"]], ["run-*.png"])
    return CheckedSettings(formats, files, budget, gate, fail_rounds, runner, workers, address, assignments,
                           list(effective["model"]), list(effective["aux"] or []), _load_sweep(sweep, files))


def _load_sweep(sweep: Path | None, files: list[str]) -> SweepReport | None:
    """--sweep, read and validated before any work (an untrusted file); it needs html among the formats."""
    if sweep is None:
        return None
    if "html" not in files:
        raise GleakError("--sweep puts a sweep into report.html: add html to --format (e.g. --format table,html "
                         "-o DIR)")
    from gleak.report.sweep_io import load_sweep

    return load_sweep(sweep)


def _audit_config(effective: dict[str, Any], checked: CheckedSettings, paths: list[Path], *,
                  allow_model_mismatch: bool, confidence: int, max_memory: float | None, lineup: int,
                  model_cache: int, trust_pickle: bool) -> AuditConfig:
    """The run's configuration from the checked settings (thresholds parsed here) and the flags the config file
    does not hold."""
    from gleak.config import parse_thresholds
    from gleak.runs.audit import AuditConfig

    return AuditConfig(budget=checked.budget, fail_on=checked.fail_on, fail_rounds=checked.fail_rounds,
                       thresholds=parse_thresholds(effective["threshold"] or []), options=checked.options,
                       seed=effective["seed"], device=effective["device"], lpips=effective["lpips"],
                       allow_model_mismatch=allow_model_mismatch, confidence=confidence,
                       max_memory=gigabytes(max_memory), lineup=lineup, model_cache=model_cache,
                       max_epsilon=effective["max_epsilon"], trust_pickle=trust_pickle, arch=effective["arch"],
                       arch_kwargs=effective["arch_kwargs"],
                       command=["gleak", *sys.argv[1:]] if sys.argv and "gleak" in sys.argv[0] else
                       ["gleak", "audit", *[str(p) for p in paths]])


def _show_config(effective: dict[str, Any], sources: dict[str, str], origins: dict[str, Origin]) -> None:
    """--show-config: the effective settings and where each came from (JSON with --format json)."""
    if parse_formats(effective["format"], origins["format"]) == ["json"]:
        print_json({k: {"value": [str(v) for v in effective[k]] if isinstance(effective[k], list)
                        else effective[k], "from": sources[k]} for k in OPTION_KEYS})
    else:
        from gleak.report.formats.console import print_audit_config

        print_audit_config(console, OPTION_KEYS, effective, sources)


def _render(report: Report, formats: list[str], files: list[str], output: Path | None, quiet: bool) -> None:
    """The console's part: json on stdout without -o, the table, or one line for CI logs without it."""
    from gleak.report.formats import get_format

    if output is None and "json" in files:
        sys.stdout.write(get_format("json").render(report))
    if "table" in formats:
        from gleak.report.formats.console import print_audit

        print_audit(console, report)
        if output is not None and not quiet:
            console.print(f"reports in {escape(str(output))}: "
                          + ", ".join(get_format(n).FILENAME for n in files or ["json"]), soft_wrap=True)
    if "table" not in formats and not quiet:  # one line for CI logs when the console table is off
        from gleak.report.verdict import verdict as answer_of

        verdict = answer_of(report).status
        err_console.print(f"gleak audit: {len(report.captures)} capture(s), {len(report.findings)} finding(s)"
                          + (f" (worst {report.worst()})" if report.findings else "")
                          + f"; {verdict} (--fail-on {report.fail_on}"
                          + (f" --fail-rounds {report.fail_rounds})" if report.fail_rounds != "any" else ")")
                          + (f"; reports in {escape(str(output))}" if output is not None else ""), soft_wrap=True)


OPTION_KEYS = ("budget", "fail_on", "fail_rounds", "format",
               "lpips", "jobs", "executor", "address", "seed", "device", "model",
               "aux", "arch", "arch_kwargs", "threshold", "option", "max_epsilon")


def _flag(ctx: typer.Context, key: str) -> str:
    """The flag of parameter ``key`` as errors name it (``fail_on`` -> ``--fail-on``; ``option`` -> ``-O``)."""
    if key == "option":
        return "-O"
    for param in ctx.command.params:
        if param.name == key:
            return max(param.opts, key=len)
    raise KeyError(key)  # pragma: no cover - every OPTION_KEYS entry is a parameter of audit


def origin_of(ctx: typer.Context, key: str, source: str, loaded: Any) -> Origin:
    """Where setting ``key`` came from (``source``, as :func:`merge_config` names it), for its errors: the flag, the
    environment variable or the config file's key."""
    flag = _flag(ctx, key)
    if source.startswith("environment"):
        return Origin(flag, env=parameter_envvar(ctx, key))
    if source.startswith("config ") and loaded.path is not None:
        return cast(Origin, loaded.origin(key, flag))
    return Origin(flag)


def _attack_options(items: list[str], origin: Origin) -> dict[str, dict[str, str]]:
    """``-O`` assignments (or the config's options table), every attack, key and value checked before any work;
    a bad one from the file names the file, its table and the key."""
    from gleak.attacks.registry import attack_class, parse_option_assignments, resolve_assignments
    from gleak.registry import resolve_options

    assignments = parse_option_assignments(items)
    if origin.table is None:
        resolve_assignments(assignments)
        return assignments
    table = origin.table.removesuffix("]")
    for name, values in assignments.items():
        owner = attack_class(name, where=f"{table}.{origin.key}]: ")
        resolve_options(owner, values, {k: f"{table}.{origin.key}.{name}] key '{k}'" for k in values})
    return assignments


def check_sweep_model(where: Path, sweep: SweepReport, models: list[Path], config: Any,
                      hashes: HashCache | None = None) -> SweepReport:
    """The sweep, checked against the audited models: one made for another model (its recorded weights hash is
    none of theirs) is refused unless --allow-model-mismatch, which the sweep's notices then record; one that
    records no hash is shown with a notice that says so (never as checked)."""
    from gleak.runs.audit.setup import ModelSet, find_models

    recorded = sweep.settings.model_sha256
    if recorded is None:
        notice = ("this sweep records no model hash (settings.model_sha256): it was not checked against the "
                  f"audited model; it was made with {sweep.settings.model}")
        return sweep.model_copy(update={"notices": [*sweep.notices, notice]})
    audited = set(ModelSet.load(find_models(models), config, hashes=hashes).index.values())
    if recorded in audited:
        return sweep
    if not config.allow_model_mismatch:
        raise GleakError(f"--sweep {where}: the sweep was made for another model (sha256 {recorded[:12]}…, "
                         f"{sweep.settings.model}), not the audited one{'s' if len(audited) > 1 else ''} "
                         f"({', '.join(sorted(h[:12] + '…' for h in audited))}); give the sweep of this model, or "
                         "--allow-model-mismatch to show it anyway (the report says so)")
    notice = (f"made for another model (sha256 {recorded[:12]}…) than the audited one: shown with "
              "--allow-model-mismatch")
    return sweep.model_copy(update={"notices": [*sweep.notices, notice]})


def merge_config(ctx: typer.Context, given: dict[str, Any], loaded: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """Flags > GLEAK_* environment > config file > defaults: the effective values and where each came from."""
    effective: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in OPTION_KEYS:
        source = parameter_source(ctx, key)
        value = given[key]
        if source == "COMMANDLINE" and value not in (None, []):
            effective[key], sources[key] = value, "command line"
        elif source == "ENVIRONMENT":
            effective[key], sources[key] = value, f"environment ({parameter_envvar(ctx, key)})"
        elif (from_file := loaded.audit_value(key)) is not None:
            if key == "threshold":
                from_file = [f"{k}={v}" for k, v in from_file.items()]
            elif key == "option":
                from_file = [f"{a}.{k}={v}" for a, values in from_file.items() for k, v in values.items()]
            elif key in ("model", "aux"):
                from_file = [Path(p) if Path(p).is_absolute() or loaded.path is None else loaded.path.parent / p
                             for p in from_file]
            effective[key], sources[key] = from_file, f"config {loaded.where(key)}"
        else:
            effective[key], sources[key] = value, "default"
    if parameter_source(ctx, "threshold") == "COMMANDLINE" and loaded.audit_value("threshold"):
        merged = {f"{k}": f"{k}={v}" for k, v in loaded.audit_value("threshold").items()}
        merged.update({item.partition("=")[0].strip(): item for item in given["threshold"] or []})
        effective["threshold"], sources["threshold"] = list(merged.values()), "config file, then the command line"
    return effective, sources


def _run(paths: list[Path], model: list[Path], aux: list[Path], config: Any, output: Path | None, jobs: int,
         show: bool, executor: ExecutorName = "local", address: str | None = None,
         hashes: HashCache | None = None) -> Report:
    """run_audit under a Rich progress bar on a terminal, or one plain line per capture (CI logs)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gleak.runs.audit import run_audit

    if not show:
        return run_audit(paths, model, aux, config, output, None, jobs, executor, address, hashes)
    if not err_console.is_terminal:
        def line(i: int, total: int, path: Path) -> None:
            err_console.print(f"({i + 1}/{total}) {escape(str(path))}", soft_wrap=True, highlight=False)

        return run_audit(paths, model, aux, config, output, line, jobs, executor, address, hashes)
    with Progress(TextColumn("[bold]audit"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(i: int, total: int, path: Path) -> None:
            bar.update(task, total=total, completed=i + 1, description=escape(path.name))

        return run_audit(paths, model, aux, config, output, update, jobs, executor, address, hashes)


