"""`gleak audit`: the CI privacy gate. Exit 0: no finding at or above --fail-on; 1: one is; 2: bad input."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gleak.cli.common import (
    AllowMismatchOpt,
    ArchKwargsOpt,
    ArchOpt,
    AttackOptionsOpt,
    DeviceOpt,
    ForceOpt,
    QuietOpt,
    SeedOpt,
    TrustPickleOpt,
    VerboseOpt,
    apply_threads,
    console,
    err_console,
    handle_errors,
    number,
    print_json,
    requested_threads,
)
from gleak.errors import GleakError, shorten

if TYPE_CHECKING:
    from gleak.report.model import Report

FORMATS = ("table", "json", "html", "sarif", "md", "junit")
MAX_JOBS = 256
SEVERITY_NAMES = ("info", "low", "medium", "high", "critical", "none")
STYLE = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan", "info": "dim"}


def parse_formats(text: str) -> list[str]:
    """``table,json`` -> ["table", "json"]; unknown names are a usage error."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in FORMATS]
    if bad or not names:
        raise GleakError(f"--format takes a comma-separated list of {', '.join(FORMATS)}; got "
                         f"{shorten(repr(text), 60)}")
    return list(dict.fromkeys(names))


def parse_thresholds(items: list[str]) -> Any:
    """``["labels_high=0.95", …]`` -> Thresholds, validated (unknown names and non-numbers are usage errors)."""
    from pydantic import ValidationError

    from gleak.report.model import Thresholds

    values: dict[str, float] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or name not in Thresholds.model_fields:
            raise GleakError(f"--threshold takes NAME=VALUE with NAME one of {', '.join(Thresholds.model_fields)}; "
                             f"got {shorten(repr(item), 60)}")
        try:
            values[name] = float(text)
        except ValueError:
            raise GleakError(f"--threshold {name}: {shorten(repr(text), 40)} is not a number") from None
        if values[name] != values[name] or abs(values[name]) == float("inf"):
            raise GleakError(f"--threshold {name} must be finite")
    try:
        return Thresholds(**values)
    except ValidationError as e:
        raise GleakError(f"--threshold: {shorten(str(e).splitlines()[0], 200)}") from None


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
    format: Annotated[str, typer.Option("--format", "-f", envvar="GLEAK_FORMAT", help="Comma-separated: table "
                                        "(console), json, html, sarif, md, junit (files in -o DIR; json "
                                        "without -o goes to stdout).")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Folder for report.json, report.html, "
                                                "report.sarif, report.md, junit.xml and image grids.")] = None,
    option: AttackOptionsOpt = None,
    threshold: Annotated[list[str] | None, typer.Option("--threshold", help="Override a severity threshold, "
                                                        "NAME=VALUE (repeatable; names and defaults in the "
                                                        "README, 'Audit in CI').")] = None,
    lpips: Annotated[str, typer.Option(help="LPIPS network for image scores: alex, vgg or off.")] = "alex",
    confidence: Annotated[int, typer.Option("--confidence", callback=number(0, 1000), help="Captures without "
                                            "ground truth: calibrate the label attacks on this many batches "
                                            "simulated from --aux like the capture's (GLEAK-LABELS-EXPECTED; 0: "
                                            "off).")] = 24,
    jobs: Annotated[int, typer.Option("--jobs", "-j", envvar="GLEAK_JOBS", callback=number(1, MAX_JOBS),
                                      help="Audit this many captures at once, in worker processes (with "
                                      "--executor ray: Ray workers; 1 means one per cluster CPU).")] = 1,
    executor: Annotated[str, typer.Option("--executor", envvar="GLEAK_EXECUTOR", help="local (this machine's "
                                          "processes) or ray (a Ray cluster; pip install 'gleak[ray]').")] = "local",
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
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Audit captures for leakage: findings with severities, reports for people, CI and code scanning."""
    from gleak.audit import AuditConfig
    from gleak.config import find_config
    from gleak.report.formats import get_format

    loaded = find_config(config_file)
    given = {"budget": budget, "fail_on": fail_on, "format": format, "lpips": lpips, "jobs": jobs, "seed": seed,
             "device": device, "model": model, "aux": aux, "threshold": threshold, "option": option,
             "executor": executor, "address": address}
    effective, sources = merge_config(ctx, given, loaded)
    if show_config:
        if parse_formats(effective["format"]) == ["json"]:
            print_json({k: {"value": [str(v) for v in effective[k]] if isinstance(effective[k], list)
                            else effective[k], "from": sources[k]} for k in OPTION_KEYS})
        else:
            render_config(effective, sources)
        return
    budget, fail_on, format, lpips = effective["budget"], effective["fail_on"], effective["format"], effective["lpips"]
    jobs, seed, device = effective["jobs"], effective["seed"], effective["device"]
    model, aux, threshold = effective["model"], effective["aux"], effective["threshold"]
    executor, address = effective["executor"], effective["address"]
    from gleak.executors import EXECUTORS

    if executor not in EXECUTORS:
        raise GleakError(f"--executor must be one of {', '.join(EXECUTORS)}, got {shorten(repr(executor), 40)}")
    if address is not None and executor != "ray":
        raise GleakError("--address is the Ray cluster's address: use it with --executor ray")
    from gleak.attacks.options import parse_option_assignments, resolve_assignments

    assignments = parse_option_assignments(effective["option"] or [])
    resolve_assignments(assignments)  # every attack, key and value checked before any work
    if not paths:
        raise GleakError("give at least one capture or folder of captures (CAPTURE_OR_DIR...)")
    if not model:
        raise GleakError("audit needs the global model: --model FILE_OR_DIR (or model = [...] in the config)")
    if loaded.settings.threads is not None and requested_threads() is None:
        apply_threads(loaded.settings.threads)

    formats = parse_formats(format)
    if fail_on not in SEVERITY_NAMES:
        raise GleakError(f"--fail-on must be one of {', '.join(SEVERITY_NAMES)}, got {shorten(repr(fail_on), 40)}")
    if lpips not in ("alex", "vgg", "off"):
        raise GleakError(f"--lpips must be alex, vgg or off, got {shorten(repr(lpips), 40)}")
    files = [f for f in formats if f != "table"]
    if output is None and any(f != "json" for f in files):
        raise GleakError(f"--format {','.join(files)} writes files: give a folder with -o DIR")
    if output is not None:
        _check_output_dir(output, files or ["json"], force)
    config = AuditConfig(budget=budget, fail_on=fail_on,  # type: ignore[arg-type]
                         thresholds=parse_thresholds(threshold or []), options=assignments,
                         seed=seed, device=device, lpips=lpips, allow_model_mismatch=allow_model_mismatch,
                         confidence=confidence,
                         trust_pickle=trust_pickle, arch=arch, arch_kwargs=arch_kwargs,
                         command=["gleak", *sys.argv[1:]] if sys.argv and "gleak" in sys.argv[0] else
                         ["gleak", "audit", *[str(p) for p in paths]])
    report = _run(list(paths), list(model), list(aux or []), config, output, jobs,
                  show=not quiet and "table" in formats, executor=executor, address=address)
    if output is not None:
        from gleak.io import OutputSet

        with OutputSet(output, True) as out:
            for name in files or ["json"]:
                fmt = get_format(name)
                out.write_bytes(fmt.FILENAME, fmt.render(report, output).encode("utf-8"))
            out.commit()
    elif "json" in files:
        sys.stdout.write(get_format("json").render(report))
    if "table" in formats:
        render_table(report)
        if output is not None and not quiet:
            console.print(f"reports in {escape(str(output))}: "
                          + ", ".join(get_format(n).FILENAME for n in files or ["json"]), soft_wrap=True)
    if "table" not in formats and not quiet:  # one line for CI logs when the console table is off
        verdict = "errors" if report.has_errors() else ("FAIL" if report.failed() else "PASS")
        err_console.print(f"gleak audit: {len(report.captures)} capture(s), {len(report.findings)} finding(s)"
                          + (f" (worst {report.worst()})" if report.findings else "")
                          + f"; {verdict} (--fail-on {report.fail_on})"
                          + (f"; reports in {escape(str(output))}" if output is not None else ""), soft_wrap=True)
    if report.has_errors():
        raise typer.Exit(2)
    if report.failed():
        raise typer.Exit(1)


OPTION_KEYS = ("budget", "fail_on", "format", "lpips", "jobs", "executor", "address", "seed", "device", "model",
               "aux", "threshold", "option")


def merge_config(ctx: typer.Context, given: dict[str, Any], loaded: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """Flags > GLEAK_* environment > config file > defaults: the effective values and where each came from."""
    from gleak.cli.common import ParameterSource

    effective: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in OPTION_KEYS:
        source = ctx.get_parameter_source(key)
        value = given[key]
        if source == ParameterSource.COMMANDLINE and value not in (None, []):
            effective[key], sources[key] = value, "command line"
        elif source == ParameterSource.ENVIRONMENT:
            effective[key], sources[key] = value, "environment (GLEAK_" + key.upper() + ")"
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
    if ctx.get_parameter_source("threshold") == ParameterSource.COMMANDLINE and loaded.audit_value("threshold"):
        merged = {f"{k}": f"{k}={v}" for k, v in loaded.audit_value("threshold").items()}
        merged.update({item.partition("=")[0].strip(): item for item in given["threshold"] or []})
        effective["threshold"], sources["threshold"] = list(merged.values()), "config file, then the command line"
    return effective, sources


def render_config(effective: dict[str, Any], sources: dict[str, str]) -> None:
    """The effective configuration as a table: key, value, source."""
    table = Table(title="gleak audit: effective configuration", title_justify="left")
    for col in ("key", "value", "from"):
        table.add_column(col, overflow="fold")
    for key in OPTION_KEYS:
        value = effective[key]
        shown = ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)
        table.add_row(key.replace("_", "-"), escape(shown if value not in (None, []) else "—"), escape(sources[key]))
    console.print(table)


def _run(paths: list[Path], model: list[Path], aux: list[Path], config: Any, output: Path | None, jobs: int,
         show: bool, executor: str = "local", address: str | None = None) -> Report:
    """run_audit under a Rich progress bar on a terminal, or one plain line per capture (CI logs)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gleak.audit import run_audit

    if not show:
        return run_audit(paths, model, aux, config, output, None, jobs, executor, address)
    if not err_console.is_terminal:
        def line(i: int, total: int, path: Path) -> None:
            err_console.print(f"({i + 1}/{total}) {escape(str(path))}", soft_wrap=True, highlight=False)

        return run_audit(paths, model, aux, config, output, line, jobs, executor, address)
    with Progress(TextColumn("[bold]audit"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(i: int, total: int, path: Path) -> None:
            bar.update(task, total=total, completed=i + 1, description=escape(path.name))

        return run_audit(paths, model, aux, config, output, update, jobs, executor, address)


def _check_output_dir(folder: Path, formats: list[str], force: bool) -> None:
    from gleak.io import check_output_location
    from gleak.report.formats import get_format

    check_output_location(folder / "report.json")
    if folder.exists() and not folder.is_dir():
        raise GleakError(f"{folder} exists and is not a directory")
    if folder.exists() and not force:
        taken = [get_format(n).FILENAME for n in formats if (folder / get_format(n).FILENAME).exists()]
        if taken:
            raise GleakError(f"{folder} already holds {', '.join(taken)}; pass --force to overwrite")


def render_table(report: Report) -> None:
    """The console summary: findings by severity, one row per capture, the verdict."""
    from gleak.report.model import SEVERITIES, severity_rank

    by_capture: dict[str, list[Any]] = {}
    for f in report.findings:
        by_capture.setdefault(f.capture, []).append(f)
    counts = {s: sum(f.severity == s for f in report.findings) for s in SEVERITIES}
    summary = "  ".join(f"[{STYLE[s]}]{s} {n}[/]" for s, n in reversed(counts.items()) if n)
    console.print(f"[bold]gleak audit[/] ({report.budget}): {len(report.captures)} capture(s), "
                  f"{len(report.findings)} finding(s)" + (f": {summary}" if summary else ""), soft_wrap=True)
    table = Table(show_lines=False)
    table.add_column("capture", overflow="fold")
    for col in ("kind", "best labels", "iAcc/chance", "images", "worst"):
        table.add_column(col)
    for c in report.captures:
        if c.status == "error":
            table.add_row(escape(c.capture.path), "[red]error[/]", escape(c.error or ""), "", "", "")
            continue
        scored = [a for a in c.attacks if a.task == "labels" and a.scores and "iacc" in a.scores]
        best = max(scored, key=lambda a: (a.scores or {}).get("iacc") or 0.0) if scored else None
        label = iacc = "—"
        if best is not None and c.chance is not None:
            value = (best.scores or {}).get("iacc") or 0.0
            label, iacc = best.attack, f"{value:.2f}/{c.chance['iacc']:.2f}"
        elif c.truth_counts is None:
            label = "no truth"
        images = "—"
        recon = next((a for a in c.attacks if a.task == "reconstruct"), None)
        if recon is not None:
            psnr = (recon.scores or {}).get("psnr")
            images = f"{recon.attack} {psnr:.1f} dB" if psnr is not None else f"{recon.attack} ({recon.status})"
        found = by_capture.get(c.capture.path, [])
        worst = max((f.severity for f in found), key=severity_rank, default=None)
        kind = f"{c.kind} B={c.batch_size}" + (f" m={c.local_steps}" if (c.local_steps or 1) > 1 else "")
        table.add_row(escape(c.capture.path), kind, label, iacc, images,
                      f"[{STYLE[worst]}]{worst}[/]" if worst else "none")
    console.print(table)
    for f in sorted(report.findings, key=lambda f: -severity_rank(f.severity)):
        console.print(f"[{STYLE[f.severity]}]{f.severity:>8}[/] {f.rule} {escape(f.capture)}: {escape(f.title)}",
                      soft_wrap=True)
    for n in report.notices:
        console.print(f"[yellow]note[/] {n.code} {escape(n.capture or '')}: {escape(n.message)}", soft_wrap=True)
    if report.has_errors():
        console.print("[bold red]some captures could not be audited (exit 2)[/]")
    elif report.fail_on == "none":
        console.print("verdict: reported only (--fail-on none)")
    elif report.failed():
        console.print(f"[bold red]FAIL[/]: a finding at or above --fail-on {report.fail_on} (exit 1)")
    else:
        console.print(f"[bold green]PASS[/]: no finding at or above --fail-on {report.fail_on}")
