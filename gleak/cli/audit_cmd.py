"""`gleak audit`: the CI privacy gate. Exit 0: no finding at or above --fail-on; 1: one is; 2: bad input."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from gleak.cli.common import (
    ForceOpt,
    QuietOpt,
    VerboseOpt,
    apply_threads,
    check_output_folder,
    console,
    err_console,
    handle_errors,
    plain_progress,
    print_json,
    requested_threads,
)
from gleak.cli.settings_options import with_settings
from gleak.errors import GleakError, Origin
from gleak.settings import AuditSettings, Given, LoadedConfig, Resolved

if TYPE_CHECKING:
    from gleak.report.model import Report, SweepReport
    from gleak.runs.audit import AuditConfig
    from gleak.runs.audit.setup import HashCache


@handle_errors
@with_settings(AuditSettings, first=("ctx", "paths"))
def audit(
    ctx: typer.Context,
    paths: Annotated[list[Path] | None, typer.Argument(help="Capture files, or folders searched for captures.",
                                                       metavar="CAPTURE_OR_DIR...", show_default=False)] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Folder for report.json, report.html, "
                                                "report.sarif, report.md, junit.xml and image grids.")] = None,
    config_file: Annotated[Path | None, typer.Option("--config", help="Config file (default: gleak.toml, else "
                                                     "[tool.gleak] in pyproject.toml, in the working "
                                                     "directory).")] = None,
    show_config: Annotated[bool, typer.Option("--show-config", help="Print the effective configuration and "
                                              "where each value came from, then exit.")] = False,
    sweep: Annotated[Path | None, typer.Option("--sweep", help="A gleak sweep's folder (or its sweep.json): its "
                                               "plots and tables go into report.html (needs html in "
                                               "--format).")] = None,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    *,
    given: dict[str, Given],
) -> None:
    """Audit captures for leakage: findings with severities, reports for people, CI and code scanning."""
    from gleak.runs.audit import AuditConfig
    from gleak.runs.audit.setup import HashCache
    from gleak.settings import find_config, resolve

    loaded = find_config(config_file)
    resolved = resolve(AuditSettings, given, loaded)  # flags > GLEAK_* > the file > defaults, each value checked
    if show_config:
        _show_config(resolved)
        return
    checked = check_settings(resolved, paths, output, force, sweep, loaded)
    config = AuditConfig(**dict(resolved.settings), command=_command(paths))
    hashes, sweep_report = HashCache(), checked.sweep  # each model file hashed once, for the sweep's check too
    if sweep is not None and sweep_report is not None:
        sweep_report = check_sweep_model(sweep, sweep_report, list(config.model), config, hashes)
    with plain_progress(not quiet):  # off a terminal: a line at most every 30 s from inside the attacks
        report = _run(list(paths or []), config, output, show=not quiet and "table" in checked.formats, hashes=hashes)
    if output is not None:
        from gleak.report.outputs import write_outputs

        write_outputs(report, checked.files or ["json"], output, sweep_report)
    _render(report, checked.formats, checked.files, output, quiet)
    if report.has_errors():
        raise typer.Exit(2)
    if report.failed():
        raise typer.Exit(1)


def _command(paths: list[Path] | None) -> list[str]:
    """The command line the report records."""
    if sys.argv and "gleak" in sys.argv[0]:
        return ["gleak", *sys.argv[1:]]
    return ["gleak", "audit", *[str(p) for p in paths or []]]


@dataclass(frozen=True)
class CheckedSettings:
    """What the rendering takes once every setting is checked: the formats, those written as files, the sweep."""

    formats: tuple[str, ...]  # every --format name, table included
    files: list[str]  # the formats written as files (or json to stdout without -o)
    sweep: SweepReport | None


def check_settings(resolved: Resolved[AuditSettings], paths: list[Path] | None, output: Path | None, force: bool,
                   sweep: Path | None, loaded: LoadedConfig) -> CheckedSettings:
    """What the settings' own types cannot check, before any work, each error naming where its value came from
    (flag, variable, file): the Ray address without Ray, every attack option, the inputs, the output folder and the
    sweep (an untrusted file)."""
    from gleak.report.formats import get_format

    settings, sources = resolved.settings, resolved.sources
    if settings.address is not None and settings.executor != "ray":
        executor = sources["executor"]
        raise GleakError(f"{sources['address'].origin().subject(settings.address)} is a Ray cluster's address: use "
                         f"it with --executor ray (the executor is {settings.executor!r}, from "
                         f"{'the default' if executor.kind == 'default' else executor})")
    _check_attack_options(settings.options, sources["options"].origin())
    if not paths:
        raise GleakError("give at least one capture or folder of captures (CAPTURE_OR_DIR...)")
    if not settings.model:
        raise GleakError("audit needs the global model: --model FILE_OR_DIR (or model = [...] in the config)")
    threads = loaded.value("threads")
    if threads is not None and requested_threads() is None:
        apply_threads(threads)
    files = [f for f in settings.format if f != "table"]
    if output is None and any(f != "json" for f in files):
        raise GleakError(f"--format {','.join(files)} writes files: give a folder with -o DIR")
    if output is not None:
        check_output_folder(output, force, [get_format(n).FILENAME for n in files or ["json"]], ["run-*.png"])
    return CheckedSettings(settings.format, files, _load_sweep(sweep, files))


def _load_sweep(sweep: Path | None, files: list[str]) -> SweepReport | None:
    """--sweep, read and validated before any work (an untrusted file); it needs html among the formats."""
    if sweep is None:
        return None
    if "html" not in files:
        raise GleakError("--sweep puts a sweep into report.html: add html to --format (e.g. --format table,html "
                         "-o DIR)")
    from gleak.report.sweep_io import load_sweep

    return load_sweep(sweep)


def _show_config(resolved: Resolved[AuditSettings]) -> None:
    """--show-config: the effective settings and where each came from (JSON with --format json)."""
    if resolved.settings.format == ("json",):
        print_json(resolved.shown())
    else:
        from gleak.report.formats.console import print_audit_config

        print_audit_config(console, resolved)


def _render(report: Report, formats: Sequence[str], files: list[str], output: Path | None, quiet: bool) -> None:
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


def _check_attack_options(assignments: dict[str, dict[str, str]], origin: Origin) -> None:
    """``-O`` assignments (or the config's options table), every attack, key and value checked before any work;
    a bad one from the file names the file, its table and the key."""
    from gleak.attacks.registry import attack_class, resolve_assignments
    from gleak.registry import resolve_options

    if origin.table is None:
        resolve_assignments(assignments)
        return
    table = origin.table.removesuffix("]")
    for name, values in assignments.items():
        owner = attack_class(name, where=f"{table}.{origin.key}]: ")
        resolve_options(owner, values, {k: f"{table}.{origin.key}.{name}] key '{k}'" for k in values})


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


def _run(paths: list[Path], config: AuditConfig, output: Path | None, show: bool,
         hashes: HashCache | None = None) -> Report:
    """run_audit under a Rich progress bar on a terminal, or one plain line per capture (CI logs)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gleak.runs.audit import run_audit

    def audit_with(progress: Callable[[int, int, Path], None] | None) -> Report:
        return run_audit(paths, list(config.model), list(config.aux), config, output, progress, config.jobs,
                         config.executor, config.address, hashes)

    if not show:
        return audit_with(None)
    if not err_console.is_terminal:
        def line(i: int, total: int, path: Path) -> None:
            err_console.print(f"({i + 1}/{total}) {escape(str(path))}", soft_wrap=True, highlight=False)

        return audit_with(line)
    from gleak.timebox import reporting

    with Progress(TextColumn("[bold]audit"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(i: int, total: int, path: Path) -> None:
            bar.update(task, total=total, completed=i + 1, description=escape(path.name))

        with reporting(lambda text: bar.update(task, description=escape(text))):  # where the attacks are
            return audit_with(update)
