"""Shared CLI options and the papercuts around them: --truth/--no-truth, --lpips choices, the output-folder check,
config-file errors in plain words, threshold ranges, one "did you mean", help text that keeps its brackets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gleak.cli import app
from gleak.cli.common import (
    BatchSizeOpt,
    GleakCommand,
    GleakGroup,
    LpipsNetwork,
    LpipsOpt,
    NoTruthOpt,
    TruthOpt,
    check_output_folder,
)
from gleak.errors import TRUTH_CONTRADICTION, GleakError, did_you_mean
from gleak.report.formats.text import fmt_number
from gleak.settings import AuditSettings, find_config, load_config, parse_thresholds
from gleak.settings.values import THRESHOLD_BOUNDS

WIDE = {"COLUMNS": "200", "TERMINAL_WIDTH": "200"}


def invoke(target: typer.Typer, *args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(target, [str(a) for a in args], env=WIDE, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


# ---------------------------------------------------------------------------------- a command with the shared options

tiny = typer.Typer(cls=GleakGroup, add_completion=False, pretty_exceptions_enable=False)


@tiny.command(cls=GleakCommand)
def run(lpips: LpipsOpt = LpipsNetwork.alex, truth: TruthOpt = None, no_truth: NoTruthOpt = False,
        batch_size: BatchSizeOpt = None) -> None:
    """Needs pip install 'gleak[ray]' and [tool.gleak] in pyproject.toml."""
    typer.echo(json.dumps({"lpips": lpips, "lpips_is_str": isinstance(lpips, str), "truth": str(truth),
                           "no_truth": no_truth, "batch_size": batch_size}))


@tiny.command(cls=GleakCommand)
def other() -> None:
    """Lists [things] in brackets."""


def test_lpips_is_a_choice_shown_in_help_and_a_bad_value_is_one_usage_line() -> None:
    code, out, _ = invoke(tiny, "run", "--help")
    assert code == 0 and ("[alex|vgg|off]" in out or "<alex|vgg|off>" in out)  # Click's brackets, Typer 0.29's
    code, out, err = invoke(tiny, "run", "--lpips", "vgg")
    assert code == 0 and json.loads(out)["lpips"] == "vgg" and json.loads(out)["lpips_is_str"]
    code, out, err = invoke(tiny, "run", "--lpips", "squeeze")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error:") and "'squeeze' is not one of 'alex', 'vgg', 'off'" in err


@pytest.mark.parametrize("args", [("--truth", "t.safetensors", "--no-truth"), ("--no-truth", "--truth", "t")])
def test_truth_and_no_truth_together_are_a_usage_error(args: tuple[str, ...]) -> None:
    code, out, err = invoke(tiny, "run", *args)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert TRUTH_CONTRADICTION in err


def test_truth_and_no_truth_together_are_refused_by_the_library_too() -> None:
    """The same rule for callers that do not come through Click: gleak.runs.inputs.open_inputs refuses the pair
    before it reads anything (the capture need not exist)."""
    from gleak.runs.inputs import InputSpec, open_inputs

    with pytest.raises(GleakError, match="--truth and --no-truth contradict each other; give one"):
        open_inputs(InputSpec(capture=Path("missing.safetensors"), truth=Path("t.safetensors"), no_truth=True))
    spec = InputSpec(capture=Path("c.safetensors"), truth=Path("t"))
    assert spec.truth_file() == Path("t")
    assert InputSpec(capture=Path("c.safetensors"), no_truth=True).truth_file() is None
    code, out, _ = invoke(tiny, "run", "--truth", "t")
    assert code == 0 and json.loads(out)["truth"] == "t"


def test_batch_size_keeps_its_range_check() -> None:
    assert json.loads(invoke(tiny, "run", "-b", "3")[1])["batch_size"] == 3
    code, _, err = invoke(tiny, "run", "--batch-size", "0")
    assert code == 2 and "must be a finite number ≥ 1 and ≤ 65536, got 0" in err


# ---------------------------------------------------------------------------------------- help keeps its brackets

def test_help_shows_square_brackets_literally() -> None:
    code, out, _ = invoke(app, "audit", "--help")
    assert code == 0
    assert "pip install -e '.[ray]'" in out
    assert "[tool.gleak] in pyproject.toml" in out
    code, out, _ = invoke(tiny, "run", "--help")
    assert "pip install 'gleak[ray]' and [tool.gleak] in pyproject.toml" in out
    code, out, _ = invoke(tiny, "--help")  # the group's list of commands too
    assert "Lists [things] in brackets." in out and "'gleak[ray]'" in out


def test_help_text_is_escaped_only_while_rendering(capsys: pytest.CaptureFixture[str]) -> None:
    group = typer.main.get_command(tiny)
    assert isinstance(group, GleakGroup)
    command = group.commands["run"]
    before = {p.name: getattr(p, "help", None) for p in command.params}
    assert "'gleak[ray]'" in (command.help or "")
    with command.make_context("run", [], resilient_parsing=True) as ctx:
        command.get_help(ctx)  # Typer's Rich help prints as it renders
    assert "'gleak[ray]'" in capsys.readouterr().out
    assert {p.name: getattr(p, "help", None) for p in command.params} == before
    assert "\\[" not in (command.help or "")
    assert run.__doc__ is not None and "\\[" not in run.__doc__


# ---------------------------------------------------------------------------------------- one "did you mean"

@pytest.mark.parametrize("typo", ["lables", "label"])
def test_an_unknown_command_suggests_once(typo: str) -> None:
    code, _, err = invoke(app, typo)
    assert code == 2 and err.count("\n") == 1
    assert err.lower().count("did you mean") == 1 and "'labels'" in err


def test_did_you_mean_treats_dashes_and_underscores_alike() -> None:
    assert did_you_mean("fail_on", ["budget", "fail-on"]) == "; did you mean 'fail-on'?"
    assert did_you_mean("failon", ["budget", "fail-on"]) == "; did you mean 'fail-on'?"
    assert did_you_mean("zzz", ["budget", "fail-on"]) == ""


# ---------------------------------------------------------------------------------------- config files

def config_error(tmp_path: Path, text: str, name: str = "gleak.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(GleakError) as e:
        load_config(path)
    return str(e.value)


@pytest.mark.parametrize(("text", "expected"), [
    ('[audit]\nfail_on = "high"\n', "gleak.toml [audit]: unknown key 'fail_on'; did you mean 'fail-on'? (keys: budget, "
                                    "time-limit, fail-on,"),
    ('[audit]\nfailon = "high"\n', "unknown key 'failon'; did you mean 'fail-on'?"),
    ("[audit]\njobs = 0\n", "gleak.toml [audit] key 'jobs': must be ≥ 1, got 0"),
    ('[audit]\njobs = "two"\n', "gleak.toml [audit] key 'jobs': must be a whole number, got 'two'"),
    ('[audit]\nfail-rounds = "last:0"\n', "gleak.toml [audit] key 'fail-rounds': must be any (a finding in any "
                                          "round fails), last:K"),
    ('[audit]\nbudget = "fast"\n', "gleak.toml [audit] key 'budget': must be quick, standard or full, got 'fast'"),
    ("threads = 0\n", "gleak.toml (top level) key 'threads': must be ≥ 1, got 0"),
    ('budget = "quick"\n', "gleak.toml (top level): unknown key 'budget'; it belongs in [audit]"),
    ("[audit]\nseed = 1\n", "gleak.toml [audit]: unknown key 'seed'; it belongs at the top level"),
    ("[audit]\ntrust-pickle = true\n", "'trust-pickle' cannot be set in a config file"),
    ("[audit.threshold]\nlabels_critical = 1.5\n",
     "gleak.toml [audit.threshold] key 'labels_critical': must be between 0 and 1 (an iAcc), got 1.5"),
    ("[audit.threshold]\nimage_high = -3\n",
     "key 'image_high': must be between 0 and 1 (identification over chance, κ), got -3"),
    ("[audit.threshold]\nimage_high_psnr = 20\n", "'image_high_psnr' was retired: image findings are judged by "
     "identification over chance (κ in [0, 1]), set 'image_high' instead"),
    ("[audit.threshold]\nlabel_high = 0.5\n", "unknown threshold 'label_high'; did you mean 'labels_high'?"),
    ("[audit.options]\nrlu = {mc_samples = [1]}\n",
     "gleak.toml [audit.options.rlu] key 'mc_samples': must be a string, a number or true/false, got [1]"),
    ('[audit]\narch-kwargs = "{oops"\n', "gleak.toml [audit] key 'arch-kwargs': must be a table or a JSON object"),
    ('[audit]\narch = ""\n', "gleak.toml [audit] key 'arch': must not be empty"),
])
def test_config_errors_name_file_table_and_key_in_plain_words(tmp_path: Path, monkeypatch, text: str,
                                                              expected: str) -> None:
    monkeypatch.chdir(tmp_path)
    message = config_error(tmp_path, text)
    assert expected in message, message
    assert "Input should" not in message and "Extra inputs" not in message and "Value error" not in message


def test_pyproject_errors_name_the_tool_gleak_tables(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    message = config_error(tmp_path, '[tool.gleak]\nbudget = "quick"\n', "pyproject.toml")
    assert message.startswith("pyproject.toml [tool.gleak]: unknown key 'budget'; it belongs in [tool.gleak.audit]")
    message = config_error(tmp_path, '[tool.gleak.audit]\nfail_on = "low"\n', "pyproject.toml")
    assert message.startswith("pyproject.toml [tool.gleak.audit]: unknown key 'fail_on'; did you mean 'fail-on'?")


def test_the_cli_prints_the_config_error_in_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gleak.toml").write_text('[audit]\nfail_on = "high"\n')
    code, _, err = invoke(app, "audit", "--show-config")
    assert code == 2 and err.count("\n") == 1
    assert "gleak.toml [audit]: unknown key 'fail_on'; did you mean 'fail-on'?" in err


@pytest.mark.parametrize("value", ['{hidden = 48, act = "relu"}', "'{\"hidden\": 48, \"act\": \"relu\"}'"])
def test_arch_and_arch_kwargs_can_be_set_in_the_audit_table(tmp_path: Path, monkeypatch, value: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.gleak.audit]\narch = "mynet:make"\narch-kwargs = {value}\nmodel = "models/global.safetensors"\n')
    loaded = find_config()
    assert loaded.value("arch") == "mynet:make"
    assert json.loads(loaded.value("arch_kwargs")) == {"hidden": 48, "act": "relu"}
    # one path is a list of one, relative to the file
    assert loaded.value("model") == [tmp_path / "pyproject.toml" / ".." / "models/global.safetensors"] or \
        [p.resolve() for p in loaded.value("model")] == [(tmp_path / "models/global.safetensors").resolve()]
    found = loaded.lookup("arch", AuditSettings.model_fields["arch"].metadata[-1])
    assert found is not None and str(found[1]) == "config pyproject.toml [tool.gleak.audit]"


# ---------------------------------------------------------------------------------------- thresholds

def test_threshold_bounds_cover_every_threshold() -> None:
    from gleak.report.model import Thresholds

    assert set(THRESHOLD_BOUNDS) == set(Thresholds.model_fields)
    defaults = Thresholds()
    for name, (low, high, _) in THRESHOLD_BOUNDS.items():  # every default lies in its own range
        value = getattr(defaults, name)
        assert low <= value and (high is None or value <= high), name


@pytest.mark.parametrize(("item", "fragment"), [
    ("labels_critical=1.5", "--threshold labels_critical must be between 0 and 1 (an iAcc), got 1.5"),
    ("labels_high=-0.1", "--threshold labels_high must be between 0 and 1 (an iAcc), got -0.1"),
    ("labels_low_margin=2", "must be between 0 and 1 (iAcc above chance)"),
    ("image_critical=-1", "--threshold image_critical must be between 0 and 1 (identification over chance, κ), got -1"),
    ("image_low=nan", "must be a finite number"),
    ("image_low_margin=1", "'image_low_margin' was retired"),
    ("labels_high=lots", "is not a number"),
    ("label_high=0.5", "did you mean 'labels_high'?"),
    ("labels_high", "NAME=VALUE"),
])
def test_threshold_values_must_lie_in_their_range(item: str, fragment: str) -> None:
    with pytest.raises(GleakError) as e:
        parse_thresholds([item])
    assert fragment in str(e.value), str(e.value)


def test_thresholds_within_range_are_kept() -> None:
    th = parse_thresholds(["labels_critical=1", "labels_high=0", "image_high=0.45", "image_low=0"])
    assert (th.labels_critical, th.labels_high, th.image_high, th.image_low) == (1.0, 0.0, 0.45, 0.0)


# ---------------------------------------------------------------------------------------- the output folder

NAMES = ("grid.png", "metrics.json")
RECON = ("recon_*.png", "truth_*.png")


def test_output_folder_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("x")
    with pytest.raises(GleakError, match="out exists and is not a directory"):
        check_output_folder(tmp_path / "out", True, NAMES)


def test_output_folder_new_or_unrelated_files_pass(tmp_path: Path) -> None:
    check_output_folder(tmp_path / "new" / "deeper", False, NAMES, RECON)  # nothing exists yet
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    (tmp_path / "out" / "recon_1.jpg").write_text("not a pattern match")
    check_output_folder(tmp_path / "out", False, NAMES, RECON)


def test_output_folder_holding_outputs_needs_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "recon_000.png").write_bytes(b"")
    with pytest.raises(GleakError, match=r"recon_000.png already exists; pass --force to overwrite it"):
        check_output_folder(out, False, NAMES, RECON)
    for name in ("grid.png", "metrics.json", "truth_000.png", "recon_001.png"):
        (out / name).write_bytes(b"")
    with pytest.raises(GleakError) as e:
        check_output_folder(out, False, NAMES, RECON)
    assert "already holds grid.png, metrics.json, recon_000.png and 2 more; pass --force to overwrite" in str(e.value)
    check_output_folder(out, True, NAMES, RECON)


def test_output_sub_folders_and_file_names_that_are_folders(tmp_path: Path) -> None:
    (tmp_path / "captures").mkdir()
    with pytest.raises(GleakError, match="pass --force"):
        check_output_folder(tmp_path, False, ("report.json", "captures/"))
    check_output_folder(tmp_path, True, ("report.json", "captures/"))
    (tmp_path / "report.json").mkdir()
    with pytest.raises(GleakError, match="report.json is a directory, expected a file path"):
        check_output_folder(tmp_path, True, ("report.json",))


def test_single_output_file_and_its_inputs(tmp_path: Path) -> None:
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"weights")
    check_output_folder(tmp_path, False, ["gen.safetensors"], inputs={"the model": model})
    with pytest.raises(GleakError, match="model.safetensors is the model, an input of this command"):
        check_output_folder(tmp_path, True, [model.name], inputs={"the model": model})
    (tmp_path / "gen.safetensors").write_bytes(b"old")
    with pytest.raises(GleakError, match="gen.safetensors already exists; pass --force to overwrite it"):
        check_output_folder(tmp_path, False, ["gen.safetensors"], inputs={"the model": model})


def test_output_location_is_checked(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(GleakError, match="is a file, not a folder"):
        check_output_folder(tmp_path / "file" / "sub" / "out", False, NAMES)
    with pytest.raises(GleakError, match="cannot write .*(too long|longer than the file system allows)"):
        check_output_folder(tmp_path / ("x" * 300), False, NAMES)
    with pytest.raises(GleakError, match="longer than the file system allows"):
        check_output_folder(tmp_path, False, ["y" * 300])


# ---------------------------------------------------------------------------------------- numbers

def test_fmt_number() -> None:
    assert fmt_number(None, 2) == "—"
    assert fmt_number(float("nan"), 2) == fmt_number(float("inf"), 4) == "—"
    assert fmt_number(12.3456, 2) == "12.35" and fmt_number(0.5, 4) == "0.5000"
    assert fmt_number(-0.0001, 2) == "0.00" and fmt_number(-1.25, 1) == "-1.2"
    assert fmt_number(0.250, 3, trim=True) == "0.25" and fmt_number(1.0, 3, trim=True) == "1"
