"""Shared CLI plumbing: consoles, option types, error handling (exit 2 on bad input), threads, devices.

Nothing here imports torch at module level: `gleak --help`, `--version` and usage errors must stay fast, so torch
is imported inside the functions that need it (`apply_threads`, `resolve_device`, `check_output_folder`).

Every option that more than one command takes is declared here once (``ModelOpt``, ``ArchOpt``, ``TruthOpt``,
``BatchSizeOpt``, ``LpipsOpt``, …): the commands annotate their parameters with these types, so the flag names,
help and checks cannot drift apart. Help text is shown literally (``pip install '.[ray]'`` keeps its brackets):
``GleakCommand`` and ``GleakGroup`` escape it for Rich when they render help, so no help string needs escaping."""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import functools
import importlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperArgument, TyperCommand, TyperGroup

from gleak.cli.settings_options import number as number
from gleak.cli.settings_options import option
from gleak.errors import INTERRUPTED, TRUTH_CONTRADICTION, GleakError, Origin, did_you_mean, shorten
from gleak.settings.audit import (
    AllowModelMismatch,
    Arch,
    ArchKwargs,
    AttackOptions,
    Device,
    Jobs,
    Lpips,
    MaxMemory,
    Seed,
    ShowText,
    Threads,
    TrustPickle,
    TrustRemoteCode,
)
from gleak.settings.values import MAX_THREADS, LpipsNetwork, Problem, jobs

__all__ = ["LpipsNetwork"]  # re-exported: the commands write their --lpips default with it


def _click_class(name: str) -> type[Exception]:
    """Click's exception class ``name`` (``UsageError``, ``ClickException``), found through Typer's public
    ``typer.BadParameter``: Typer up to 0.25 raises Click's own classes, Typer 0.26 and later a private vendored copy
    (``typer._click``) that other programs must not import. Both keep Click's hierarchy, BadParameter ⊂ UsageError ⊂
    ClickException, so the ancestors of the public class are the classes the installed Typer raises."""
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == name:
            return cast(type[Exception], cls)
    raise ImportError(f"typer.BadParameter does not derive from {name}: an unsupported Typer")  # pragma: no cover


UsageError = _click_class("UsageError")
ClickException = _click_class("ClickException")

if TYPE_CHECKING:
    import torch

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

F = TypeVar("F", bound=Callable[..., Any])

MODEL_HELP = "Global model: .pt2, .safetensors (weights, with --arch), state dict (.pt) or TorchScript archive."
ModelOpt = Annotated[Path | None, typer.Option("--model", "-M", help=MODEL_HELP)]
# a command that cannot run without the model, yet says so itself (one GleakError line) rather than Click's usage
NeededModelOpt = Annotated[Path | None, typer.Option("--model", "-M", help="Global model file (required): "
                                                     + MODEL_HELP.removeprefix("Global model: "))]
FcLayerOpt = Annotated[str | None, typer.Option("--fc-layer", help="Name of the last fully-connected layer "
                                                "(overrides detection).")]
# options that the settings declare (gleak.settings.audit): flag, help, variable and range written once there
ArchOpt = option(Arch)
ArchKwargsOpt = option(ArchKwargs)
TrustPickleOpt = option(TrustPickle)
ShowTextOpt = option(ShowText)
TrustRemoteCodeOpt = option(TrustRemoteCode)
DeviceOpt = option(Device)
SeedOpt = option(Seed)
AllowMismatchOpt = option(AllowModelMismatch)
JobsOpt = option(Jobs)
AttackOptionsOpt = option(AttackOptions)
MaxMemoryOpt = option(MaxMemory)
LpipsOpt = option(Lpips)
ThreadsOpt = option(Threads)
MAX_BATCH = 65_536  # the capture schema's bounds on gleak.batch_size and gleak.local_steps
MAX_STEPS = 100_000
MAX_LENGTH = 16_777_216  # the capture schema's bound on gleak.max_length (tokens per sequence)
MAX_MESSAGE = 600  # characters of one error line; longer ones are cut (a 1 MB option value is never echoed)


QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print only results and errors.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="More detail; tracebacks on internal errors.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite existing output files.")]
BatchSizeOpt = Annotated[int | None, typer.Option("--batch-size", "-b", help="Override the capture's B.",
                                                  callback=number(1, MAX_BATCH))]

def _truth_given(ctx: Any, param: Any, value: Any) -> Any:
    """--truth FILE after (or before) --no-truth: a usage error, whichever Click reads second."""
    if value is not None and not ctx.resilient_parsing and ctx.params.get("no_truth"):
        raise UsageError(TRUTH_CONTRADICTION, ctx)
    return value


def _no_truth_given(ctx: Any, param: Any, value: Any) -> Any:
    if value and not ctx.resilient_parsing and ctx.params.get("truth") is not None:
        raise UsageError(TRUTH_CONTRADICTION, ctx)
    return value


TruthOpt = Annotated[Path | None, typer.Option("--truth", callback=_truth_given, help="Ground-truth file; default: "
                                               "NAME.truth.safetensors next to the capture, when present.")]
NoTruthOpt = Annotated[bool, typer.Option("--no-truth", callback=_no_truth_given,
                                          help="Ignore any ground truth (the companion file too).")]


def check_output_folder(folder: Path, force: bool, fixed_names: Sequence[str] = (), patterns: Sequence[str] = (),
                        *, inputs: Mapping[str, Path] | None = None) -> None:
    """Refuse, before any work, an output folder the command cannot or should not write to.

    ``fixed_names`` are the files the command writes in ``folder`` (a name ending in ``/`` is a sub-folder it
    writes into, such as ``captures/``); ``patterns`` are shell patterns of the files it may write
    (``recon_*.png``). The rules:

    - ``folder`` exists and is not a directory: an error;
    - a fixed file name exists there as a directory: an error, even with ``force`` (it could not be replaced);
    - ``folder`` already holds any of those files and not ``force``: an error ending "pass --force to overwrite";
    - a file it would write is one of ``inputs`` (what -> path, e.g. ``{"the model": model}``): an error, even with
      ``force`` (the command would destroy its own input);
    - the folder (or its nearest existing ancestor) must be writable and every name must fit the file system
      (:func:`gleak.io.check_output_location`).

    A single-file output is its parent folder with one fixed name:
    ``check_output_folder(out.parent, force, [out.name], inputs={"the model": model})``."""
    from gleak.io import check_output_location, show

    files = [n for n in fixed_names if not n.endswith("/")]
    try:
        if folder.exists() and not folder.is_dir():
            raise GleakError(f"{show(folder)} exists and is not a directory")
    except OSError as exc:  # a name longer than the file system allows
        raise GleakError(f"cannot write {show(folder)}: {exc.strerror or type(exc).__name__}") from None
    check_output_location(folder / (files[0] if files else (fixed_names[0].rstrip("/") if fixed_names else "x")))
    try:
        entries = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        for name in files:
            if name in entries and (folder / name).is_dir():
                raise GleakError(f"{show(folder / name)} is a directory, expected a file path")
    except OSError as exc:
        raise GleakError(f"cannot write in {show(folder)}: {exc.strerror or type(exc).__name__}") from None
    wanted = {n.rstrip("/") for n in fixed_names}
    taken = [n for n in entries if n in wanted or any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    for what, path in (inputs or {}).items():
        for name in taken:
            with contextlib.suppress(OSError):
                if path.exists() and os.path.samefile(folder / name, path):
                    raise GleakError(f"{show(folder / name)} is {what}, an input of this command; write to "
                                     "another place")
    if not taken or force:
        return
    if len(taken) == 1:
        raise GleakError(f"{show(folder / taken[0])} already exists; pass --force to overwrite it")
    shown = ", ".join(taken[:3]) + (f" and {len(taken) - 3} more" if len(taken) > 3 else "")
    raise GleakError(f"{show(folder)} already holds {shown}; pass --force to overwrite them")


def fail(message: str) -> None:
    """Print exactly one error line on stderr (newlines folded, very long messages cut)."""
    line = " ".join(str(message).split())
    err_console.print(f"[bold red]error:[/] {escape(shorten(line, MAX_MESSAGE))}", soft_wrap=True, emoji=False)


def deferred(module: str, name: str) -> Callable[..., Any]:
    """A stand-in for ``module.name`` that imports it on the first call.

    Command modules bind their heavy callables (torch-backed loaders, attacks, writers) this way: the CLI starts
    without torch, and each name stays a module attribute that tests can monkeypatch."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{module}.{name}, imported on first use."
    return call


def _plain_placeholders(params: list[Any]) -> list[Any]:
    """Show arguments as ``CAPTURE`` and flags (``--force``, ``--help``) without a ``<bool>`` type column."""
    for param in params:
        if isinstance(param, TyperArgument):
            if param.metavar is None:
                param.metavar = (param.name or "").upper()
            shown = _placeholder(getattr(getattr(param, "type_descriptor", None), "annotation", None))
            setattr(param, "display_type_rich", functools.partial(_shown, shown))  # PATH, not <list[Path]>  # noqa: B010
        elif getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""  # a flag takes no value
        elif param.metavar is None and not _is_choice(param):  # PATH, TEXT, N, NUMBER rather than
            # <list[Path]>, <str>, <int>; a choice keeps Click's [alex|vgg|off]
            param.metavar = _placeholder(getattr(getattr(param, "type_descriptor", None), "annotation", None))
    return params


def _is_choice(param: Any) -> bool:
    """Whether ``param`` takes one of fixed choices: Click's ``param.type`` (Typer ≤ 0.28) or Typer 0.29's
    ``param.type_descriptor`` has them."""
    kind = getattr(param, "type", None) or getattr(param, "type_descriptor", None)
    return bool(getattr(kind, "choices", None))


def _shown(text: str | None, ctx: Any = None) -> str | None:
    """A fixed type column for an argument's help row."""
    return text


def _placeholder(annotation: Any) -> str | None:
    """The help placeholder for an option of type ``annotation`` (Optional and list unwrapped), or None."""
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (list, typing.Union) or (args and annotation not in (str, int, float)):
        annotation = args[0] if args else annotation
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) is list and args:
            annotation = args[0]
    return {str: "TEXT", Path: "PATH", int: "N", float: "NUMBER"}.get(annotation)


@contextlib.contextmanager
def _literal_help(command: Any, ctx: Any) -> Iterator[None]:
    """While help is rendered with Rich markup, the help texts of ``command``, its parameters and (for a group)
    its commands are escaped, so that ``pip install '.[ray]'`` and ``[tool.gleak]`` show as written instead
    of being eaten as markup tags; the texts are restored afterwards. Do not escape help strings by hand."""
    saved: list[tuple[Any, str, str]] = []

    def swap(obj: Any, attr: str) -> None:
        text = getattr(obj, attr, None)
        if isinstance(text, str) and "[" in text:
            saved.append((obj, attr, text))
            setattr(obj, attr, escape(text))

    try:
        if getattr(command, "rich_markup_mode", None) == "rich":
            for attr in ("help", "short_help", "epilog"):
                swap(command, attr)
            for param in command.get_params(ctx):
                swap(param, "help")
            subcommands = getattr(command, "commands", None)
            for sub in (subcommands.values() if isinstance(subcommands, Mapping) else ()):
                for attr in ("help", "short_help"):
                    swap(sub, attr)
        yield
    finally:
        for obj, attr, text in reversed(saved):
            setattr(obj, attr, text)


class GleakCommand(TyperCommand):
    """A command whose help shows arguments as ``CAPTURE`` (not ``{capture}``), flags without ``<bool>``, and its
    help texts literally (square brackets included)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_placeholders(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with _literal_help(self, ctx):
            super().format_help(ctx, formatter)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """Typer wraps required arguments in braces; the usage line reads better without them."""
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in super().collect_usage_pieces(ctx)]


class GleakGroup(TyperGroup):
    """The command group: Click's usage errors (bad option values, unknown options, missing arguments) become
    one ``error:`` line on stderr and exit 2, like every other bad input, instead of a multi-line panel."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_placeholders(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with _literal_help(self, ctx):
            super().format_help(ctx, formatter)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.suggest_commands = False  # resolve_command suggests once, whichever Click or Typer is installed

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """An unknown command's "Did you mean …?" exactly once: Click ≥ 8.4 suggests close names itself, older Click
        does not, and Typer's own suggestion (turned off above) would repeat Click's."""
        try:
            return super().resolve_command(ctx, args)
        except UsageError as e:
            message = str(getattr(e, "message", ""))
            shown = e.format_message()  # type: ignore[attr-defined]  # Click ≥ 8.4 adds its suggestion here
            if args and "did you mean" not in shown.lower():
                hint = did_you_mean(args[0], sorted(self.commands))
                if hint:
                    e.message = message.rstrip(".") + hint  # type: ignore[attr-defined]
            raise

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, windows_expand_args: bool = True,
             **extra: Any) -> Any:
        extra["windows_expand_args"] = windows_expand_args
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickException as e:
            hint = ""
            ctx = getattr(e, "ctx", None)
            if isinstance(e, UsageError):
                hint = f" (see '{ctx.command_path if ctx is not None else 'gleak'} --help')"
            fail(e.format_message() + hint)  # type: ignore[attr-defined]
            sys.exit(2)
        except typer.Abort:
            fail("aborted")
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


def handle_errors(fn: F) -> F:
    """Turn GleakError into one readable line and exit 2; anything else into exit 3 (with -v: a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        logging.getLogger("pyswarms").setLevel(logging.WARNING)
        try:
            threads = apply_threads(requested_threads())
            if kwargs.get("verbose"):
                err_console.print(f"[dim]threads: {threads} (--threads / GLEAK_THREADS)[/]")
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except GleakError as e:
            fail(str(e))
            # machines reading stdout get the error as JSON too
            if _wants_json(kwargs.get("format")) and not e.reported:
                from gleak.report.model import ErrorReport

                error = ErrorReport.build({"error": {"message": shorten(" ".join(str(e).split()), MAX_MESSAGE),
                                                     "exit_code": GleakError.exit_code}})
                sys.stdout.write(json.dumps(error.to_json()) + "\n")
            raise typer.Exit(GleakError.exit_code) from None
        except KeyboardInterrupt:
            fail("interrupted")
            raise typer.Exit(INTERRUPTED) from None
        except MemoryError:
            fail("out of memory; try a smaller batch or --device cpu")
            raise typer.Exit(2) from None
        except RecursionError:
            fail("input nested too deeply to read (a JSON value or a model structure)")
            raise typer.Exit(2) from None
        except Exception as e:
            if kwargs.get("verbose"):
                traceback.print_exc(file=sys.stderr)
            fail(f"internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                 "(please report it; -v shows the traceback)")
            raise typer.Exit(3) from None

    return cast(F, wrapper)


def _wants_json(format: Any) -> bool:
    """Whether ``--format`` asks for JSON on stdout (``json``, or a list naming it without ``table``)."""
    if not isinstance(format, str):
        return False
    names = {n.strip().lower() for n in format.split(",")}
    return "json" in names and "table" not in names


THREADS_ENV = "GLEAK_THREADS"


def default_threads() -> int:
    """torch's CPU threads when neither --threads nor GLEAK_THREADS is given: one.

    Measured on a 2-core machine (bench/startup.py --threads): alone, one thread and torch's default (one per
    core) tie; beside another CPU-bound job, torch's default collapses (its threads wait on each other) while one
    thread keeps its speed. The small models gleak attacks gain little from intra-op parallelism."""
    return 1


_CLI_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar("gleak_cli_threads", default=None)


def remember_threads(ctx: Any, threads: int | None) -> None:
    """The root command's ``--threads`` (or GLEAK_THREADS, which Click reads for it), for :func:`requested_threads`
    while this invocation runs; forgotten when its context closes, so a later call in the same process (a test, a
    host program) never sees it."""
    token = _CLI_THREADS.set(threads)
    ctx.call_on_close(lambda: _CLI_THREADS.reset(token))


def requested_threads() -> int | None:
    """The thread count asked for: ``gleak --threads N`` (or GLEAK_THREADS, which Click reads for it) when
    running under the CLI, else GLEAK_THREADS; None when neither is set."""
    value = _CLI_THREADS.get()
    if value is not None:
        return int(value)
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise GleakError(f"{THREADS_ENV} must be a whole number of threads, got {shorten(text, 40)!r}") from None
    if not 1 <= value <= MAX_THREADS:
        raise GleakError(f"{THREADS_ENV} must be between 1 and {MAX_THREADS}, got {value}")
    return value


def apply_threads(requested: int | None) -> int:
    """Set torch's intra-op CPU threads (``requested`` or the default) before any work; returns the count."""
    import torch

    count = requested if requested is not None else default_threads()
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return torch.get_num_threads()


def resolve_device(device: str) -> torch.device:
    """The torch device for ``auto``, ``cpu`` or ``cuda[:N]`` (see :func:`gleak.runs.inputs.resolve_device`)."""
    from gleak.runs.inputs import resolve_device as resolve

    return resolve(device)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@contextlib.contextmanager
def plain_progress(show: bool = True, every: float | None = None) -> Iterator[None]:
    """The progress of long work (:func:`gleak.timebox.checkpoint` lines: ``dager: position 37/150, 12 s``) as plain
    lines on stderr, at most one every ``every`` seconds (default 30), when stderr is not a terminal (CI logs; a
    terminal gets the commands' own bars). Nothing when ``show`` is False."""
    if not show or err_console.is_terminal:
        yield
        return
    from gleak.timebox import PROGRESS_EVERY, Throttled, reporting

    def write(line: str) -> None:
        err_console.print(escape(line), soft_wrap=True, highlight=False)

    with reporting(Throttled(write, PROGRESS_EVERY if every is None else every)):
        yield


def parameter_source(ctx: Any, key: str) -> str | None:
    """Where Click took parameter ``key`` from, by name (COMMANDLINE, ENVIRONMENT, DEFAULT, …): the enum's class is
    Click's or Typer's private copy of it, depending on the Typer installed, and its names are the same in both."""
    source = ctx.get_parameter_source(key)
    return None if source is None else str(source.name)


def parameter_envvar(ctx: Any, key: str) -> str:
    """The environment variable that parameter ``key`` reads, as declared on its option (``--address`` reads
    GLEAK_RAY_ADDRESS: the name is never rebuilt from the key)."""
    for param in ctx.command.params:
        if param.name == key:
            names = param.envvar
            return names if isinstance(names, str) else ", ".join(names or ())
    raise KeyError(key)  # pragma: no cover - only called with the command's own parameters


def flag_origin(ctx: Any, key: str, flag: str) -> Origin:
    """The origin of parameter ``key`` for its errors: its variable when Click read it from the environment, else
    ``flag``."""
    if parameter_source(ctx, key) == "ENVIRONMENT":
        return Origin(flag, env=parameter_envvar(ctx, key))
    return Origin(flag)


def parse_jobs(value: Any, origin: Origin | None = None) -> int:
    """``--jobs``: ``auto`` (0) or a whole number of workers from 1 to MAX_JOBS; else one line naming where the
    value came from (``origin``: --jobs unless told, e.g. GLEAK_JOBS)."""
    try:
        return jobs(str(value))
    except Problem as e:
        raise GleakError((origin or Origin("--jobs")).bad(shorten(str(value), 40), e.problem)) from None
