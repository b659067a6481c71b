"""The settings layer: each setting declared once (gleak.settings.audit), and everything that derives from the
declaration — the command's option, its variable, the config file's key, --show-config, the errors naming where a
value came from, the docs' table — follows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pytest
import typer
from pydantic import Field
from typer.testing import CliRunner

from gleak.cli.common import GleakCommand, GleakGroup, handle_errors
from gleak.cli.settings_options import with_settings
from gleak.errors import GleakError
from gleak.settings import AuditSettings, Cli, Given, GlobalSettings, find_config, resolve, settings_table
from gleak.settings.declare import declared

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_table_is_made_from_the_declarations() -> None:
    """docs/audit.md marks where the table goes; the site's hook puts the declarations' table there."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("settings_table_hook", ROOT / "docs" / "_hooks" / "settings_table.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    assert page.count(hook.MARKER) == 1
    built = hook.on_page_markdown(page)
    assert settings_table(GlobalSettings, AuditSettings) in built
    for model in (GlobalSettings, AuditSettings):
        for _, cli in declared(model).values():
            assert f"`{cli.flag}`" in built
    assert "docs/_hooks/settings_table.py" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_every_audit_setting_is_an_option_of_the_command_with_its_variable() -> None:
    from gleak.cli import app

    audit = typer.main.get_command(app).commands["audit"]  # type: ignore[attr-defined]
    params = {p.name: p for p in audit.params}
    for name, (_, cli) in declared(AuditSettings).items():
        assert name in params, name
        assert set(params[name].opts) | set(params[name].secondary_opts) >= set(cli.flags), name
        assert params[name].envvar == cli.env, name


def test_precedence_flag_then_variable_then_file_then_default(tmp_path: Path) -> None:
    (tmp_path / "gleak.toml").write_text('seed = 5\n[audit]\nbudget = "full"\nfail-on = "low"\nlineup = 4\n'
                                         'model = "m.safetensors"\njobs = "auto"\n'
                                         '[audit.threshold]\nlabels_high = 0.8\n')
    loaded = find_config(start=tmp_path)
    given = {"budget": Given("standard", "environment", env="GLEAK_BUDGET"), "lineup": Given(7, "command line"),
             "thresholds": Given(["image_low=0.2"], "command line")}
    resolved = resolve(AuditSettings, given, loaded)
    s, sources = resolved.settings, resolved.sources
    assert (s.budget, str(sources["budget"])) == ("standard", "environment (GLEAK_BUDGET)")  # variable > file
    assert (s.lineup, str(sources["lineup"])) == (7, "command line")  # flag > file
    assert s.fail_on == "low" and str(sources["fail_on"]).startswith("config ") and "[audit]" in str(sources["fail_on"])
    assert s.seed == 5 and "(top level)" in str(sources["seed"])
    assert s.model == (tmp_path / "m.safetensors",)  # relative to the file
    assert (s.thresholds.labels_high, s.thresholds.image_low) == (0.8, 0.2)  # the file's, then the flag's, by name
    assert str(sources["thresholds"]) == "config file, then the command line"
    assert (s.confidence, str(sources["confidence"])) == (24, "default")
    assert s.jobs == 0 and resolved.shown()["jobs"]["value"] == "auto" and sources["jobs"].kind == "config"
    assert resolved.shown()["lineup"] == {"value": 7, "from": "command line"}


@pytest.mark.parametrize(("given", "expected"), [
    ({"lineup": Given(0, "command line")}, "--lineup must be ≥ 1, got 0"),
    ({"budget": Given("fats", "environment", env="GLEAK_BUDGET")},
     "GLEAK_BUDGET='fats' must be one of quick, standard, full; did you mean 'fast'"),
    ({"thresholds": Given(["labels_high=2"], "command line")},
     "--threshold labels_high must be between 0 and 1 (an iAcc), got 2"),
    ({"format": Given("json,pdf", "command line")}, "--format must be a comma-separated list of"),
])
def test_a_bad_value_names_its_source(given: dict[str, Given], expected: str) -> None:
    with pytest.raises(GleakError) as e:
        resolve(AuditSettings, given)
    assert str(e.value).startswith(expected.split("; did you")[0]), str(e.value)


def test_library_errors_name_the_setting_not_a_flag() -> None:
    from gleak.runs.audit import AuditConfig

    with pytest.raises(GleakError, match=r"^model_cache must be ≥ 1, got 0$"):
        AuditConfig(model_cache=0)
    with pytest.raises(GleakError, match=r"^budget must be one of quick, standard, full, got 'fast'"):
        AuditConfig(budget="fast")  # type: ignore[arg-type]
    assert AuditConfig(jobs=0).jobs == 0 and AuditConfig(format="json,md").format == ("json", "md")


# ----------------------------------------------------------------- adding an option: one declaration, then its use
class Extended(AuditSettings):
    """A made-up audit option, declared as every other is: nothing else is written for it."""

    made_up: Annotated[int, Field(ge=1, le=9), Cli(("--made-up",), "A made-up option.", env="GLEAK_MADE_UP")] = 3


def _command() -> typer.Typer:
    app = typer.Typer(cls=GleakGroup, add_completion=False, pretty_exceptions_enable=False)

    @app.command(cls=GleakCommand)
    @handle_errors
    @with_settings(Extended)
    def audit(ctx: typer.Context, config_file: Annotated[Path | None, typer.Option("--config")] = None, *,
              given: dict[str, Given]) -> None:
        resolved = resolve(Extended, given, find_config(config_file))
        typer.echo(json.dumps(resolved.shown()["made_up"]))

    @app.command()
    def other() -> None:  # a second command, so that `audit` stays a subcommand
        pass

    return app


@pytest.mark.parametrize(("args", "env", "file", "expected"), [
    ([], {}, "", {"value": 3, "from": "default"}),
    (["--made-up", "5"], {"GLEAK_MADE_UP": "6"}, "[audit]\nmade-up = 7\n", {"value": 5, "from": "command line"}),
    ([], {"GLEAK_MADE_UP": "6"}, "[audit]\nmade-up = 7\n", {"value": 6, "from": "environment (GLEAK_MADE_UP)"}),
    ([], {}, "[audit]\nmade-up = 7\n", {"value": 7, "from": "config gleak.toml [audit]"}),
])
def test_a_new_declaration_is_a_flag_a_variable_a_config_key_and_a_show_config_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], file: str,
        expected: dict[str, object]) -> None:
    from gleak.settings import files

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(files, "SECTIONS", (GlobalSettings, Extended))  # the file's tables, as if declared there
    if file:
        (tmp_path / "gleak.toml").write_text(file)
    result = CliRunner().invoke(_command(), ["audit", *args], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == expected
    bad = CliRunner().invoke(_command(), ["audit", "--made-up", "12"])
    assert bad.exit_code == 2 and "--made-up" in bad.stderr and "≤ 9" in bad.stderr
    assert "`--made-up` | `GLEAK_MADE_UP` | `made-up` in `[tool.gleak.audit]` | `3` |" in settings_table(Extended)
