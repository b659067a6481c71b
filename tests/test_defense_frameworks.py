"""The defenses users run inside their FL framework, measured: Flower's ``LocalDpMod`` and NVFlare's
``PercentilePrivacy`` / ``SVTPrivacy``, with gleak's capture mod / filter behind them (the three federations are
marked ``integration``; the record checks at the end are fast; docs/defenses.md, "Inside FL frameworks").

Each integration test runs a small federation (4 clients × 6 rounds, one local SGD step of B = 8 on the shipped
MNIST digits, an untrained LeNet-5, FedAvg of what the clients send) in which every client's update is captured
twice: before the framework's defense (the clean update, with its truth) and after it (what leaves the client,
with ``gleak.defense``). gleak's label attacks (every default one) then score three things per client and round:
the clean capture, the framework-defended capture, and the clean capture through the gleak defenses the defended
capture's ``gleak.defense`` names as equivalent (``apply_defenses``). The leakage measure is the best iAcc over
the attacks, averaged over the 24 captures, against chance (uniform guessing) and, where a defense leaves
nothing, against the floor: the same attacks on another client's defended update, scored against these labels
(the best of 8 attacks beats uniform guessing even on an update that carries nothing about the labels).

Flower runs in-process: Flower's own ``ClientApp`` with the example's client (``examples/flower/dp_apps.py``) is
called on each train ``Message`` (``app(message, context)``, the call Flower's runtime makes), so Flower composes
the mods and its real ``LocalDpMod`` clips and noises the reply. The simulation engine would add only Ray's
start-up (about 30 s of the 60 s budget on 2 cores) and transport, which no mod sees, and its actors draw
``LocalDpMod``'s noise from unseeded NumPy generators. NVFlare's filters are called as NVFlare's client runner
calls a task-result filter chain: ``filter.process(shareable, fl_ctx)`` in order.

Tolerance: with N = 24 paired captures, the per-capture best iAcc (steps of 1/8) of a defended capture and of
its gleak-equivalent differ with a standard deviation of about 0.09 to 0.16 in these settings (each report line
prints the paired standard errors), so the mean difference has a standard error of at most 0.16 / √24 = 0.033;
TOLERANCE = 0.10 is three of those. Each check is seeded, so a run is reproducible, and the controls show that it
fails for a wrong mapping: noise σ = sensitivity / ε (a reading of LocalDpMod that forgets √(2 ln(1.25/δ))), or
top-k without PercentilePrivacy's clamp, land 0.2 away. Run ``pytest -m integration -s
tests/test_defense_frameworks.py`` to see the numbers (docs/defenses.md, "Inside FL frameworks" quotes them).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gleak.attacks import AttackResult
from gleak.attacks.context import build_context
from gleak.attacks.plan import run_label_attacks, select_attacks
from gleak.capture import Capture, load_capture, load_truth, truth_path_for
from gleak.data.images import load_dataset
from gleak.defenses import Defense, apply_defenses, parse_defense, rebuild_defenses, recorded_defenses
from gleak.defenses.apply import contribution_norm
from gleak.metrics.labels import chance_scores, truth_counts
from gleak.models import LoadedModel, load_model

from .conftest import MNIST_AUX, ROOT

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLE = ROOT / "examples" / "flower"
CLIENTS, ROUNDS, BATCH, STEPS, LR = 4, 6, 8, 1, 0.05
ARCH, KWARGS = "lenet", {"activation": "relu"}
TOLERANCE = 0.10  # on a mean best iAcc over 24 paired captures: 3 standard errors (module docs)
DROP = 0.15  # a defense "reduces leakage" when the mean best iAcc falls by more than this (≥ 5 standard errors)
# Flower's LocalDpMod: the update clipped to C = 0.02 (the clean updates' norms are about 0.03), then Gaussian noise
# σ = S·√(2 ln(1.25/δ))/ε = 0.00484 on every entry
DP = {"clipping_norm": 0.02, "sensitivity": 0.02, "epsilon": 20.0, "delta": 1e-5}


# ---------------------------------------------------------------------------------------------- scoring
class Scorer:
    """gleak's default label attacks, with the MNIST aux data, scored against the truth."""

    def __init__(self) -> None:
        self.attacks = select_attacks("labels", None)
        self.aux = load_dataset(MNIST_AUX)
        self.forwards: dict[str, dict[str, Any]] = {}  # the aux forwards, by model weights (no BatchNorm here)

    def __call__(self, capture: Capture, model: LoadedModel, labels: torch.Tensor) -> tuple[float, float]:
        """The best iAcc of the attacks on this capture, and their mean iAcc."""
        assert model.weights_sha256
        ctx = build_context(capture, model, seed=0).with_aux(self.aux,
                                                             self.forwards.setdefault(model.weights_sha256, {}))
        results = run_label_attacks(ctx, self.attacks, truth_counts(labels, ctx.num_classes))
        best = _best_iacc(results)
        assert best is not None, [(r.attack, r.reason) for r in results]
        return best, _mean([r.scores["iacc"] for r in results if r.scores])


class Table:
    """Rows of per-capture scores (best iAcc, and the attacks' mean iAcc), one value per client and round."""

    def __init__(self, scorer: Scorer, *rows: str) -> None:
        self.scorer = scorer
        self.best: dict[str, list[float]] = {r: [] for r in rows}
        self.mean: dict[str, list[float]] = {r: [] for r in rows}
        self.chance: list[float] = []

    def add(self, row: str, captures: Capture | Sequence[Capture], model: LoadedModel, labels: torch.Tensor) -> None:
        """Score the capture (several: their average, e.g. noise draws of a prediction)."""
        scored = [self.scorer(c, model, labels) for c in ([captures] if isinstance(captures, Capture) else captures)]
        self.best[row].append(_mean([b for b, _ in scored]))
        self.mean[row].append(_mean([m for _, m in scored]))

    def add_chance(self, labels: torch.Tensor) -> None:
        self.chance.append(chance_scores(truth_counts(labels, 10))["iacc"])

    def __getitem__(self, row: str) -> float:
        """The row's mean best iAcc over the captures."""
        return _mean(self.best[row])

    def se(self, a: str, b: str) -> float:
        """Standard error of the mean paired difference of two rows' best iAcc."""
        return statistics.stdev([x - y for x, y in zip(self.best[a], self.best[b], strict=True)]) / math.sqrt(
            len(self.best[a]))

    def report(self, name: str) -> str:
        """One line: each row's mean best iAcc (and the attacks' mean iAcc), and each row's paired standard error
        against the second row (the framework's defense)."""
        rows = list(self.best)
        line = f"{name} (N = {len(self.chance)}, chance {_mean(self.chance):.3f}): " + "; ".join(
            f"{r} {self[r]:.3f} (attacks' mean {_mean(self.mean[r]):.3f}"
            + (f", paired SE vs {rows[1]} {self.se(r, rows[1]):.3f}" if r != rows[1] else "") + ")" for r in rows)
        print(line)
        return line


@pytest.fixture(scope="module")
def scorer() -> Scorer:
    return Scorer()


@pytest.fixture
def numpy_seed() -> Iterator[None]:
    """LocalDpMod and SVTPrivacy draw from NumPy's global generator: seed it, and give the state back after."""
    state = np.random.get_state()
    np.random.seed(29)
    yield
    np.random.set_state(state)


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values)


def _best_iacc(results: Sequence[AttackResult]) -> float | None:
    """The best iAcc over the attacks' results (scored against the truth), None when none was scored."""
    return max((r.scores["iacc"] for r in results if r.scores), default=None)


def _models(folder: Path) -> dict[str, LoadedModel]:
    """The round models a recorder saved, by their weights' sha256 (what each capture records)."""
    loaded = [load_model(p) for p in sorted((folder / "models").glob("*.safetensors"))]
    return {m.weights_sha256: m for m in loaded if m.weights_sha256}


def _equivalent(capture: Capture) -> list[Defense]:
    """The gleak defenses the capture's gleak.defense names as equivalent to what the framework did (the audit's
    own path: ``rebuild_defenses`` of ``recorded_defenses``)."""
    chain, unknown = rebuild_defenses(recorded_defenses(capture))
    assert not unknown, unknown
    return chain


def _train(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, seed: int) -> torch.Tensor:
    """STEPS SGD steps on random batches of the shard, as the example's task.train; the labels trained on."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    seen = []
    for _ in range(STEPS):
        pick = torch.randperm(len(labels), generator=generator)[:BATCH]
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs[pick]), labels[pick]).backward()
        optimizer.step()
        seen.append(labels[pick])
    return torch.cat(seen)


# ---------------------------------------------------------------------------------------------- Flower
@pytest.fixture
def _flower_task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages made outside a running app need the task identity Flower's runtime would set."""
    pytest.importorskip("flwr", reason="gleak[flower] not installed")
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_node_id", "_task_id"):
        if hasattr(TaskIdentity, name):
            monkeypatch.setattr(TaskIdentity, name, 1)


@pytest.mark.integration
@pytest.mark.usefixtures("_flower_task_identity", "numpy_seed")
def test_flower_local_dp_mod_captured_after_it_and_predicted_by_clip_then_gaussian(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scorer: Scorer) -> None:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.clientapp.mod import LocalDpMod

    monkeypatch.syspath_prepend(str(EXAMPLE))
    import dp_apps  # examples/flower/dp_apps.py: the example's client behind LocalDpMod
    import task

    dp = LocalDpMod(**DP)
    app = dp_apps.client_app(tmp_path / "dp", dp, clean=tmp_path / "clean", background=False)
    contexts = [Context(run_id=1, node_id=n + 1, node_config={"partition-id": n, "num-partitions": CLIENTS},
                        state=RecordDict(), run_config={}) for n in range(CLIENTS)]
    state = task.new_model().state_dict()
    for rnd in range(1, ROUNDS + 1):  # FedAvg over what the clients send: the DP'd replies
        replies = []
        for ctx in contexts:
            config = ConfigRecord({"server-round": rnd, "lr": LR, "local-steps": STEPS, "batch-size": BATCH})
            msg = Message(RecordDict({"arrays": ArrayRecord(state), "config": config}), dst_node_id=ctx.node_id,
                          message_type=MessageType.TRAIN)
            reply = app(msg, ctx)
            assert not reply.has_error(), reply.error
            replies.append(reply.content["arrays"].to_torch_state_dict())
        state = {k: torch.stack([r[k] for r in replies]).mean(0) for k in state}

    sigma = DP["sensitivity"] * math.sqrt(2 * math.log(1.25 / DP["delta"])) / DP["epsilon"]
    models = _models(tmp_path / "dp")
    table = Table(scorer, "clean", "LocalDpMod", "gleak clip+gaussian", "control σ=S/ε")
    control = [parse_defense(f"clip:norm={DP['clipping_norm']}"),
               parse_defense(f"gaussian:sigma={DP['sensitivity'] / DP['epsilon']}")]
    for i, path in enumerate(sorted((tmp_path / "dp").glob("round-*/client-*[0-9].safetensors"))):
        defended = load_capture(path)
        clean = load_capture(tmp_path / "clean" / path.parent.name / path.name)
        labels = load_truth(truth_path_for(clean.path), clean).labels  # type: ignore[arg-type]
        assert defended.meta["gleak.model.sha256"] == clean.meta["gleak.model.sha256"]
        model = models[defended.meta["gleak.model.sha256"]]
        # what gleak.defense records, and what the DP mod did: the clean update clipped to C, plus N(0, σ²)
        (entry,) = defended.get("gleak.defense")
        assert entry["name"] == "flwr.LocalDpMod" and entry["epsilon"] == DP["epsilon"]
        assert entry["noise_std"] == pytest.approx(sigma) and clean.get("gleak.defense") is None
        assert contribution_norm(clean) > DP["clipping_norm"]  # the clip binds
        scale = DP["clipping_norm"] / contribution_norm(clean)
        residual = torch.cat([(defended.tensors[k] - scale * clean.tensors[k]).flatten() for k in clean.tensors])
        assert abs(float(residual.mean())) < 4 * sigma / math.sqrt(residual.numel())
        assert float(residual.std()) == pytest.approx(sigma, rel=0.02)  # 61,706 draws: a 0.3 % standard error
        chain = _equivalent(defended)
        assert [d.name for d in chain] == ["clip", "gaussian"]
        table.add("clean", clean, model, labels)
        table.add("LocalDpMod", defended, model, labels)
        # the prediction: gleak's equivalent on the clean capture, averaged over two noise draws
        table.add("gleak clip+gaussian", [apply_defenses(clean, chain, seed=100 * i + s) for s in range(2)], model,
                  labels)
        table.add("control σ=S/ε", apply_defenses(clean, control, seed=100 * i), model, labels)
        table.add_chance(labels)
    assert len(table.chance) == CLIENTS * ROUNDS
    table.report("Flower LocalDpMod(clipping_norm=0.02, sensitivity=0.02, epsilon=20, delta=1e-5)")
    measured, predicted = table["LocalDpMod"], table["gleak clip+gaussian"]
    assert table["clean"] - measured > DROP, table.best  # the DP mod reduces the leak …
    assert measured - _mean(table.chance) > 0.1, table.best  # … not to chance at ε = 20
    se = table.se("LocalDpMod", "gleak clip+gaussian")
    assert abs(measured - predicted) <= TOLERANCE, (measured, predicted, se)  # gleak's equivalent predicts it
    assert abs(table["control σ=S/ε"] - measured) > TOLERANCE, table.best  # a wrong mapping would be caught


# ---------------------------------------------------------------------------------------------- NVFlare
def _nvflare_federation(folder: Path, privacy: Any) -> list[tuple[Capture, Capture, torch.Tensor, LoadedModel]]:
    """CLIENTS sites × ROUNDS rounds; each site's task-result chain is [capture (clean), privacy, capture (with
    defense)], the server averages what the chain lets out. Returns (clean, defended, labels, model) per update."""
    from nvflare.apis.dxo import DXO, DataKind, MetaKey, from_shareable
    from nvflare.apis.filter import FilterChainType, FilterContextKey
    from nvflare.apis.fl_context import FLContextManager
    from nvflare.app_common.app_constant import AppConstants

    from gleak.integrations.nvflare import GleakCaptureFilter

    common = {"arch": ARCH, "arch_kwargs": KWARGS, "learning_rate": LR, "batch_size": BATCH}
    data_filter = GleakCaptureFilter(str(folder / "clean"), **common)
    data_filter.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_DATA_CHAIN)
    before = GleakCaptureFilter(str(folder / "clean"), **common)
    after = GleakCaptureFilter(str(folder / "defended"), defense=[privacy], **common)
    for f in (before, after):
        f.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_RESULT_CHAIN)
    data = load_dataset(ROOT / "samples" / "data" / "mnist_client.safetensors")
    model = load_model(ROOT / "samples" / "models" / "lenet_untrained.safetensors").module
    state = {k: v.clone() for k, v in model.state_dict().items()}
    labels: dict[tuple[int, str], torch.Tensor] = {}
    for rnd in range(1, ROUNDS + 1):
        diffs = []
        for site_index in range(CLIENTS):
            site = f"site-{site_index + 1}"
            fl_ctx = FLContextManager(identity_name=site, job_id="job-29").new_context()
            task_data = DXO(DataKind.WEIGHTS, {k: v.numpy() for k, v in state.items()}).to_shareable()
            task_data.set_header(AppConstants.CURRENT_ROUND, rnd)
            data_filter.process(task_data, fl_ctx)
            model.load_state_dict(state)
            inputs, targets = data.batch(torch.arange(site_index, len(data), CLIENTS))
            labels[rnd, site] = _train(model, inputs, targets, 1000 * rnd + site_index)
            diff = {k: (v.detach() - state[k]).numpy() for k, v in model.state_dict().items()}
            result = DXO(DataKind.WEIGHT_DIFF, diff, meta={MetaKey.NUM_STEPS_CURRENT_ROUND: STEPS}).to_shareable()
            result.set_header(AppConstants.CURRENT_ROUND, rnd)
            for f in (before, privacy, after):  # NVFlare's client runner: each task-result filter in order
                result = f.process(result, fl_ctx)
            diffs.append(from_shareable(result).data)
        state = {k: v + torch.as_tensor(np.mean([d[k] for d in diffs], axis=0)) for k, v in state.items()}
    models = _models(folder / "defended")
    out = []
    for (rnd, site), y in sorted(labels.items()):
        name = f"round-{rnd:04d}/client-{site}.safetensors"
        clean, defended = load_capture(folder / "clean" / name), load_capture(folder / "defended" / name)
        out.append((clean, defended, y, models[defended.meta["gleak.model.sha256"]]))
    return out


@pytest.fixture
def _nvflare() -> None:
    pytest.importorskip("nvflare", reason="gleak[nvflare] not installed")


@pytest.mark.integration
@pytest.mark.usefixtures("_nvflare", "numpy_seed")
def test_nvflare_percentile_privacy_is_global_topk_until_its_clamp_binds(tmp_path: Path, scorer: Scorer) -> None:
    from nvflare.app_common.filters import PercentilePrivacy

    # (a) gamma = 0.1 per step is above every |Δ| here: PercentilePrivacy is gleak's global top-k
    table = Table(scorer, "clean", "PercentilePrivacy", "gleak topk")
    for clean, defended, labels, model in _nvflare_federation(tmp_path / "a", PercentilePrivacy(99.9, gamma=0.1)):
        (entry,) = defended.get("gleak.defense")
        assert entry["name"] == "nvflare.PercentilePrivacy" and entry["clamped"] == 0
        assert entry["gleak_equivalent"] == ["topk:ratio=0.999,scope=global"]
        predicted = apply_defenses(clean, _equivalent(defended), seed=0)
        kept = sum(int((t != 0).sum()) for t in defended.tensors.values())
        assert kept == sum(int((t != 0).sum()) for t in predicted.tensors.values()) == 62  # the same entries …
        for k, t in defended.tensors.items():  # … with the same values
            torch.testing.assert_close(t, predicted.tensors[k], rtol=1e-6, atol=0.0)
        table.add("clean", clean, model, labels)
        table.add("PercentilePrivacy", defended, model, labels)
        table.add("gleak topk", predicted, model, labels)
        table.add_chance(labels)
    table.report("NVFlare PercentilePrivacy(percentile=99.9, gamma=0.1)")
    assert table.best["PercentilePrivacy"] == table.best["gleak topk"]  # the same tensors: the same answers
    # magnitude sparsification keeps the last layer's bias entries, the largest: the labels leak as before
    assert table["clean"] - table["PercentilePrivacy"] <= TOLERANCE, table.best

    # (b) gamma = 0.001 binds: every kept entry is clamped to ±gamma, which no gleak defense does
    table = Table(scorer, "clean", "PercentilePrivacy", "gleak topk (no clamp)")
    topk = [parse_defense("topk:ratio=0.999,scope=global")]
    for clean, defended, labels, model in _nvflare_federation(tmp_path / "b", PercentilePrivacy(99.9, gamma=0.001)):
        (entry,) = defended.get("gleak.defense")
        assert entry["clamped"] > 0 and entry["gleak_equivalent"] is None and "clamp" in entry["no_equivalent"]
        table.add("clean", clean, model, labels)
        table.add("PercentilePrivacy", defended, model, labels)
        table.add("gleak topk (no clamp)", apply_defenses(clean, topk), model, labels)
        table.add_chance(labels)
    table.report("NVFlare PercentilePrivacy(percentile=99.9, gamma=0.001)")
    measured = table["PercentilePrivacy"]
    assert table["clean"] - measured > DROP, table.best  # the clamp is what reduces the leak …
    assert table["gleak topk (no clamp)"] - measured > TOLERANCE, table.best  # … so top-k alone over-predicts it


@pytest.mark.integration
@pytest.mark.usefixtures("_nvflare", "numpy_seed")
def test_nvflare_svt_privacy_release_is_laplace_and_its_defaults_leave_noise(tmp_path: Path, scorer: Scorer) -> None:
    from nvflare.app_common.filters import SVTPrivacy

    # (a) every entry released (fraction 1, no replacement), gamma above every |Δ|/m: SVT's release step alone,
    # clamp (not binding) + Laplace(2·gamma/noise_var) = gleak's laplace:scale=0.005
    gamma, noise_var = 0.05, 20.0
    table = Table(scorer, "clean", "SVTPrivacy", "gleak laplace")
    pairs = _nvflare_federation(tmp_path / "a", SVTPrivacy(fraction=1.0, replace=False, gamma=gamma,
                                                           noise_var=noise_var))
    for i, (clean, defended, labels, model) in enumerate(pairs):
        (entry,) = defended.get("gleak.defense")
        assert entry["name"] == "nvflare.SVTPrivacy" and entry["n_upload"] == 61706
        assert entry["release_noise_scale"] == pytest.approx(2 * gamma / noise_var)
        assert entry["gleak_equivalent"] == [f"laplace:scale={entry['release_noise_scale']!r}"]
        assert max(float(t.abs().max()) for t in clean.tensors.values()) < gamma / STEPS  # its condition holds
        residual = torch.cat([(defended.tensors[k] - clean.tensors[k]).flatten() for k in clean.tensors])
        assert float(residual.abs().mean()) == pytest.approx(2 * gamma / noise_var, rel=0.02)  # E|Laplace(b)| = b
        table.add("clean", clean, model, labels)
        table.add("SVTPrivacy", defended, model, labels)
        table.add("gleak laplace", apply_defenses(clean, _equivalent(defended), seed=i), model, labels)
        table.add_chance(labels)
    table.report("NVFlare SVTPrivacy(fraction=1, replace=False, gamma=0.05, noise_var=20)")
    measured, predicted = table["SVTPrivacy"], table["gleak laplace"]
    assert table["clean"] - measured > DROP, table.best
    se = table.se("SVTPrivacy", "gleak laplace")
    assert abs(measured - predicted) <= TOLERANCE, (measured, predicted, se)

    # (b) NVFlare's defaults: about 10 % of the entries, chosen at random in effect (the query noise dwarfs
    # gamma = 1e-5), each clamped to ±1e-5 and given Laplace(2e-4) noise: no gleak equivalent. The floor: the
    # attacks on another client's defended update of the same round, scored against this client's labels (what
    # they score when the update carries nothing about these labels, sparsity and noise alike)
    table = Table(scorer, "clean", "SVTPrivacy()", "floor")
    pairs = _nvflare_federation(tmp_path / "b", SVTPrivacy())
    for i, (clean, defended, labels, model) in enumerate(pairs):
        (entry,) = defended.get("gleak.defense")
        assert entry["gleak_equivalent"] is None and "random subset" in entry["no_equivalent"]
        assert entry["release_noise_scale"] == pytest.approx(2e-4)
        other = pairs[i - i % CLIENTS + (i + 1) % CLIENTS][1]  # the next site's, same round and model
        assert other.meta["gleak.model.sha256"] == defended.meta["gleak.model.sha256"]
        table.add("clean", clean, model, labels)
        table.add("SVTPrivacy()", defended, model, labels)
        table.add("floor", other, model, labels)
        table.add_chance(labels)
    table.report("NVFlare SVTPrivacy() (its defaults)")
    measured = table["SVTPrivacy()"]
    assert table["clean"] - measured > DROP, table.best
    assert abs(measured - table["floor"]) <= TOLERANCE, (table.best, table.se("SVTPrivacy()", "floor"))


# ---------------------------------------------------------------------------------------------- records (fast)
def test_flower_defense_records_localdpmod_and_refuses_what_it_cannot_record(tmp_path: Path) -> None:
    pytest.importorskip("flwr", reason="gleak[flower] not installed")
    from flwr.client.mod import LocalDpMod as LegacyLocalDpMod
    from flwr.clientapp.mod import LocalDpMod

    from gleak.errors import GleakError
    from gleak.integrations.flower import GleakCaptureMod, defense_record

    for cls in (LocalDpMod, LegacyLocalDpMod):  # the Message-API mod and the client_fn one: the same maths
        entry = defense_record(cls(1.0, 2.0, 4.0, 1e-5))
        assert entry["name"] == "flwr.LocalDpMod" and entry["clipping_norm"] == 1.0
        assert entry["noise_std"] == pytest.approx(2.0 * math.sqrt(2 * math.log(1.25e5)) / 4.0)
        assert entry["gleak_equivalent"] == ["clip:norm=1.0", f"gaussian:sigma={entry['noise_std']!r}"]
    assert defense_record(LocalDpMod(1.0, 1.0, 0.0, 1e-5))["gleak_equivalent"] is None  # ε = 0: no finite σ
    assert defense_record({"name": "my-clip", "norm": 2})["norm"] == 2
    for bad in ({"norm": 2}, {"name": "x", "norm": float("nan")}, {"name": "x", "f": object()}, "clip:norm=2",
                {"name": "x", "gleak_equivalent": ["clip:nrom=2"]}, {"name": "x", "gleak_equivalent": "clip:norm=2"}):
        with pytest.raises(GleakError):
            GleakCaptureMod(tmp_path, defense=[bad])


def test_nvflare_filter_records_its_privacy_filters_and_warns_when_it_runs_before_svt(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("nvflare", reason="gleak[nvflare] not installed")
    from nvflare.apis.dxo import DXO, DataKind, MetaKey
    from nvflare.apis.filter import FilterChainType, FilterContextKey
    from nvflare.apis.fl_context import FLContextManager
    from nvflare.app_common.app_constant import AppConstants
    from nvflare.app_common.filters import PercentilePrivacy, SVTPrivacy

    from gleak.errors import GleakError
    from gleak.integrations.nvflare import GleakCaptureFilter, defense_record

    assert defense_record(PercentilePrivacy(95, 0.02)) == {"name": "nvflare.PercentilePrivacy", "percentile": 95,
                                                            "gamma": 0.02}
    assert defense_record(SVTPrivacy())["fraction"] == 0.1
    for bad in (object(), {"name": "x", "gleak_equivalent": ["no-such-defense"]}):
        with pytest.raises(GleakError):
            GleakCaptureFilter(str(tmp_path), defense=[bad])
    svt = SVTPrivacy()
    early = GleakCaptureFilter(str(tmp_path), defense=[svt])  # wrongly placed: before SVTPrivacy
    early.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_RESULT_CHAIN)
    torch.manual_seed(0)
    diff = {"fc.weight": 0.01 * torch.randn(10, 20).numpy(), "fc.bias": 0.01 * torch.randn(10).numpy()}
    result = DXO(DataKind.WEIGHT_DIFF, diff, meta={MetaKey.NUM_STEPS_CURRENT_ROUND: 2}).to_shareable()
    result.set_header(AppConstants.CURRENT_ROUND, 1)
    fl_ctx = FLContextManager(identity_name="site-1", job_id="job-1").new_context()
    with caplog.at_level("WARNING"):
        svt.process(early.process(result, fl_ctx), fl_ctx)
    assert "after SVTPrivacy" in caplog.text
    (entry,) = load_capture(tmp_path / "round-0001" / "client-site-1.safetensors").get("gleak.defense")
    assert entry["name"] == "nvflare.SVTPrivacy" and "n_upload" not in entry  # what the DXO could not show
