"""Every setting of ``gleak audit`` (and the options other commands share with it), declared once.

Adding an audit option is one field below: its type and range, its default, and a :class:`Cli` with its flag, help,
``GLEAK_*`` variable and config key. The command's option, the config files' key, ``--show-config``, the errors that
name where a value came from and the docs' table (docs/audit.md, checked by tests/test_settings.py) all follow;
the run then reads it from its :class:`~gleak.runs.audit.AuditConfig`.

The type aliases (``Seed``, ``Device``, …) are the declarations that several commands share; `gleak labels`,
`gleak reconstruct` and `gleak sweep` build their options from the same ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)

from gleak.errors import GleakError
from gleak.settings import values as v
from gleak.settings.declare import Cli, setting_error
from gleak.settings.values import Budget, ExecutorName, FailOnChoice, LpipsName, LpipsNetwork, Thresholds

# ------------------------------------------------------------------------------------ shared by several commands
Seed = Annotated[int, Field(ge=0, le=v.MAX_SEED), Cli(
    ("--seed",), "Seed for every stochastic step (0 … 2^63 − 1).", table="top")]
Device = Annotated[str, BeforeValidator(v.device), Cli(("--device",), "auto, cpu or cuda.", table="top")]
Lpips = Annotated[LpipsName, Cli(("--lpips",), "LPIPS network for the image scores (off: no LPIPS).",
                                 cli_type=LpipsNetwork)]
Jobs = Annotated[int, BeforeValidator(v.jobs), Cli(
    ("--jobs", "-j"), "Run this many at once (the audit's captures, the sweep's trials), in worker processes; auto: "
    "in this process, then one worker per CPU once the work left would take longer than starting the workers costs.",
    env="GLEAK_JOBS", cli_type=str, shown=v.shown_jobs,
    file_type=Annotated[Annotated[int, Field(ge=1, le=v.MAX_JOBS)] | None, BeforeValidator(v.auto_none)])]
MaxMemory = Annotated[float | None, Field(gt=0, allow_inf_nan=False), Cli(
    ("--max-memory",), "Memory in GB one attack may add; an attack that would need more is skipped with the option "
    "to lower (default: half the memory available when the run starts).", metavar="GB")]
AttackOptions = Annotated[dict[str, dict[str, str]], BeforeValidator(v.attack_options), Cli(
    ("--option", "-O"), "Set an attack's option (repeatable), e.g. -O rlu.mc_samples=500; `gleak attacks` lists "
    "them. A key that a dedicated flag also sets (--iterations, --augmentation, …) may be given one way only: both "
    "is an error.", metavar="ATTACK.KEY=VALUE", key="options", cli_type=list[str] | None,
    file_type=dict[str, dict[str, str | int | float | bool]])]
Arch = Annotated[str | None, Field(min_length=1, max_length=1000), Cli(
    ("--arch",), "Architecture for weight files: zoo name (lenet, idlg-cnn, fcn4, mlp, resnet-cifar), torchvision:NAME "
    "or package.module:factory.")]
ArchKwargs = Annotated[str | None, Cli(
    ("--arch-kwargs",), "JSON object of architecture arguments, e.g. '{\"activation\": \"sigmoid\"}'.",
    file_type=Annotated[str, BeforeValidator(v.arch_kwargs_text)])]
TrustPickle = Annotated[bool, Cli(
    ("--trust-pickle",), "Allow loading a whole pickled module. Pickles run code: only for files you trust.",
    table=None, not_in_files="trusting a pickle (which runs code when loaded) is decided on the command line only: "
    "pass --trust-pickle")]
TrustRemoteCode = Annotated[bool, Cli(
    ("--trust-remote-code",), "Allow a Hugging Face model folder whose config needs its own Python code (auto_map, or "
    "a model type transformers does not know). That code runs: only for folders you trust.", table=None,
    not_in_files="running a model folder's code is decided on the command line only: pass --trust-remote-code")]
AllowModelMismatch = Annotated[bool, Cli(
    ("--allow-model-mismatch",), "Attack even when the model's weights are not the ones the capture records "
    "(gleak.model.sha256); reports record it.", table=None, not_in_files="attacking with weights other than the "
    "captured ones is decided on the command line only: pass --allow-model-mismatch")]
ShowText = Annotated[bool, Cli(
    ("--show-text",), "A language model's capture: put the decoded tokens in the JSON report (and gleak "
    "reconstruct's sequences.txt). They are the client's data itself; without this flag reports hold token ids and "
    "counts only, and the console never shows text.",
    table=None, not_in_files="showing recovered text is decided on the command line only: pass --show-text")]
Threads = Annotated[int | None, Field(ge=1, le=v.MAX_THREADS), Cli(
    ("--threads",), "CPU threads for torch (default 1: steady on a shared machine; more can help large models on "
    "idle cores).", env="GLEAK_THREADS", table="top")]
Paths = Annotated[tuple[Path, ...], BeforeValidator(v.paths)]


class GlobalSettings(BaseModel):
    """The options of ``gleak`` itself (before the command)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)  # built when first used: --help stays fast

    threads: Threads = None


class AuditSettings(BaseModel):
    """What ``gleak audit`` runs and how it judges, each setting declared once (see the module's docstring).
    A bad value is a :class:`~gleak.errors.GleakError` about the value, naming the setting (``budget must be one of
    quick, standard, full, got 'fast'``); the command line names the flag, variable or file instead."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)  # built when first used: --help stays fast

    @model_validator(mode="wrap")
    @classmethod
    def _in_words(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        try:
            return handler(data)
        except ValidationError as e:
            raise GleakError(setting_error(e)) from None

    budget: Annotated[Budget, Cli(
        ("--budget",), "quick (label attacks and analytic reconstruction), standard (plus a bounded gradient-matching "
        "run) or full (the reconstruct defaults).", env="GLEAK_BUDGET", cli_type=str)] = "quick"
    time_limit: Annotated[float | None, Field(gt=0, allow_inf_nan=False), Cli(
        ("--time-limit",), "Seconds the audit of one capture may take, instead of its budget's (quick 120, standard "
        "600, full 1200); an attack that reaches its share stops, and says where.", env="GLEAK_TIME_LIMIT",
        metavar="SECONDS")] = None
    fail_on: Annotated[FailOnChoice, Cli(
        ("--fail-on",), "Exit 1 when a finding is at or above this severity: info, low, medium, high, critical, or "
        "none (never).", env="GLEAK_FAIL_ON", cli_type=str)] = "high"
    fail_rounds: Annotated[str, BeforeValidator(v.fail_rounds), Cli(
        ("--fail-rounds",), "Which rounds of a run (gleak.fl.round) the gate looks at: any, last:K (the K latest; "
        "captures without a round always count) or all (a finding in every round).", env="GLEAK_FAIL_ROUNDS")] = "any"
    format: Annotated[tuple[str, ...], BeforeValidator(v.formats), Cli(
        ("--format", "-f"), "Comma-separated: table (console), json, html, sarif, md, junit (files in -o DIR; json "
        "without -o goes to stdout).", env="GLEAK_FORMAT", cli_type=str)] = ("table",)
    lpips: Lpips = "alex"
    jobs: Jobs = 0
    executor: Annotated[ExecutorName, Cli(
        ("--executor",), "local (this machine's processes) or ray (a Ray cluster; the ray extra: pip install -e "
        "'.[ray]' from a clone; --jobs then counts Ray workers, auto or 1: one per cluster CPU).",
        env="GLEAK_EXECUTOR", cli_type=str)] = "local"
    address: Annotated[str | None, Cli(
        ("--address",), "Ray cluster address (--executor ray; default: RAY_ADDRESS, else a local Ray instance for "
        "this run).", env="GLEAK_RAY_ADDRESS")] = None
    model: Annotated[Paths, Cli(
        ("--model", "-M"), "Global model file or a folder of them (repeatable); each capture uses the model whose "
        "sha256 it records (required, here or in the config).", cli_type=list[Path] | None,
        file_type=Annotated[list[str], BeforeValidator(v.listed)], relative_to_file=True)] = ()
    aux: Annotated[Paths, Cli(
        ("--aux",), "Auxiliary data (repeatable); each capture uses the first whose input shape and classes fit.",
        cli_type=list[Path] | None,
        file_type=Annotated[list[str], BeforeValidator(v.listed)], relative_to_file=True)] = ()
    arch: Arch = None
    arch_kwargs: ArchKwargs = None
    thresholds: Annotated[Thresholds, BeforeValidator(v.thresholds), Cli(
        ("--threshold",), "Override a severity threshold, NAME=VALUE (repeatable; names and defaults in "
        "docs/audit.md).", key="threshold", cli_type=list[str] | None, file_type=dict[str, float],
        merge=True)] = Field(default_factory=Thresholds)
    options: AttackOptions = Field(default_factory=dict)
    max_epsilon: Annotated[float | None, Field(gt=0, allow_inf_nan=False), Cli(
        ("--max-epsilon",), "Privacy budget: a finding (GLEAK-DP-BUDGET, high) for every client whose ε, composed "
        "over the rounds of the run from what its captures record (DP-SGD or Flower's LocalDpMod), exceeds it.",
        env="GLEAK_MAX_EPSILON", metavar="EPSILON")] = None
    accept_unassessed: Annotated[bool, Cli(
        ("--accept-unassessed",), "Let captures with a threat no attack could measure pass the gate (their "
        "GLEAK-NOT-ASSESSED findings become info); by default such a capture is INCONCLUSIVE and fails.",
        env="GLEAK_ACCEPT_UNASSESSED")] = False
    confidence: Annotated[int, Field(ge=0, le=1000), Cli(
        ("--confidence",), "Captures without ground truth: calibrate the label attacks on this many batches simulated "
        "from --aux like the capture's (GLEAK-LABELS-EXPECTED; 0: off).")] = 24
    model_cache: Annotated[int, Field(ge=1, le=1000), Cli(
        ("--model-cache",), "Models kept loaded at once; the others are loaded when a capture needs them (memory "
        "stays flat over many rounds).")] = 4
    lineup: Annotated[int, Field(ge=1, le=99), Cli(
        ("--lineup",), "Distractors beside each true image in the identification lineup of GLEAK-IMAGES (chance 1 / "
        "(K + 1)).")] = 9
    max_memory: MaxMemory = None
    allow_model_mismatch: AllowModelMismatch = False
    trust_pickle: TrustPickle = False
    trust_remote_code: TrustRemoteCode = False
    device: Device = "auto"
    seed: Seed = 0

