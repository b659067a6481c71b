"""Expected image leakage of a capture without ground truth — every real FL capture.

With auxiliary data, the audit simulates a few twin batches: the capture's model and settings (batch size, local
steps, optimiser, learning rate, loss, train/eval mode; what :func:`gleak.attacks.labels.confidence.client_settings`
reads from its metadata), on examples drawn from one half of the auxiliary data. Each twin is reconstructed with
the attack and budget the capture got, and its identification lineup (:mod:`gleak.metrics.identification`) is
scored with distractors from the other half. The pooled rate is the expectation; its Clopper–Pearson interval
says how well the twins pin it down, and the predictive interval (beta-binomial under a Jeffreys prior) is where
one batch of the capture's size should land — the range the capture's own identification is expected in.
"""

from __future__ import annotations

from typing import Any

from gleak.attacks import Context, build_context, get_attack
from gleak.errors import GleakError
from gleak.runs.audit.setup import EXPECTED_TWINS, AuditConfig

SEED_STRIDE = 104729  # twin i is simulated with seed + i·SEED_STRIDE (apart from the label calibration's)


def not_expected_reason(ctx: Context, config: AuditConfig) -> str | None:
    """Why no expectation can be simulated for ``ctx``'s capture under ``config`` (one line), or None."""
    if EXPECTED_TWINS.get(config.budget, 0) == 0:
        return (f"expected image leakage not simulated (budget {config.budget}: the standard and full budgets "
                "reconstruct twin batches)")
    if ctx.aux is None:
        return "expected image leakage not simulated: needs auxiliary data (--aux) to simulate twin batches"
    if ctx.model is None or ctx.no_forward_reason:
        return f"expected image leakage not simulated: {ctx.no_forward_reason or 'needs the model'}"
    return None


def expected_images(ctx: Context, config: AuditConfig, attack: str,
                    bounds: dict[str, int] | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(the expectation, or None and why there is none — one line) for ``ctx``'s capture under ``config``'s
    budget, reconstructing with ``attack`` bounded by ``bounds``."""
    why = not_expected_reason(ctx, config)
    if why is not None or ctx.aux is None or ctx.model is None:  # (the last two only narrow the types)
        return None, why
    twins = EXPECTED_TWINS[config.budget]
    from gleak.attacks.labels.confidence import client_settings, split_aux, unsimulated_defenses
    from gleak.io import tensors_sha256
    from gleak.metrics.identification import LEVEL, clopper_pearson
    from gleak.models.loading import LoadedModel
    from gleak.runs.reconstruct import reconstruct
    from gleak.runs.scoring import identification_of
    from gleak.simulate.images import ClientConfig, simulate_client

    settings = client_settings(ctx)
    pool, rest = split_aux(ctx.aux, config.seed)
    loaded = LoadedModel(ctx.model, "twin", None, {}, ctx.input_shape, tensors_sha256(ctx.model.state_dict()), {})
    credits: list[float] = []
    chances: list[float] = []
    per_twin: list[float] = []
    problems: list[str] = []
    for i in range(twins):
        seed = config.seed + SEED_STRIDE * (i + 1)
        try:
            capture, truth = simulate_client(ctx.model, pool, ClientConfig(**settings, seed=seed))
            twin = build_context(capture, loaded, rest, ctx.device, seed, ctx.layer.name, loss=ctx.loss,
                                 max_memory=ctx.max_memory)
            chosen = get_attack(attack, "reconstruct")
            chosen.configure(config.attack_options(attack, bounds))
            done = reconstruct(twin, chosen, "auto", truth, lpips="off")
        except GleakError as e:
            problems.append(str(e))
            continue
        if not done.ok or done.images is None or done.truth_pixels is None:
            problems.append(done.result.reason or done.result.status)
            continue
        found = identification_of(twin, done.images, done.truth_pixels, truth, config.lineup, seed)
        if found is None:  # the twin's context holds the other half of the aux data: never here
            problems.append("no distractors")
            continue
        ident = found[0]
        credits += ident.credits
        chances += [1 / len(s) for s in ident.scores]
        per_twin.append(round(ident.rate, 4))
    if not credits:
        return None, ("expected image leakage not simulated: no twin batch could be reconstructed ("
                      + "; ".join(sorted(set(problems)))[:300] + ")")
    n, hits = len(credits), sum(credits)
    rate, chance = hits / n, sum(chances) / n
    low, high = clopper_pearson(hits, n, LEVEL)
    batch = len(credits) // len(per_twin)
    predicted = _predictive(hits, n, batch, LEVEL)
    out: dict[str, Any] = {
        "rate": round(rate, 4), "chance": round(chance, 4),
        "kappa": round((rate - chance) / (1 - chance), 4) if chance < 1 else 0.0,
        "interval": [round(low, 4), round(high, 4)], "predicted": [round(predicted[0], 4), round(predicted[1], 4)],
        "level": LEVEL, "twins": len(per_twin), "per_twin": per_twin, "n": n, "attack": attack,
        "options": {**(bounds or {}), **config.options.get(attack, {})}, "distractors": config.lineup,
        "settings": settings_note(settings)}
    missing = unsimulated_defenses(ctx)
    if missing:
        out["defense_not_simulated"] = ", ".join(missing)[:200]
    if settings.get("defenses"):
        out["defenses_simulated"] = [repr(d) for d in settings["defenses"]]
    if problems:
        out["failed_twins"] = len(problems)
    return out, None


def _predictive(hits: float, n: int, batch: int, level: float) -> tuple[float, float]:
    """Where the identification rate of one batch of ``batch`` images should fall (central ``level``), given
    ``hits`` of ``n`` on the twins: beta-binomial with the Jeffreys posterior Beta(hits + ½, n − hits + ½)."""
    from scipy.stats import betabinom

    dist = betabinom(batch, hits + 0.5, n - hits + 0.5)
    tail = (1 - level) / 2
    return float(dist.ppf(tail)) / batch, float(dist.ppf(1 - tail)) / batch


def settings_note(settings: dict[str, Any]) -> str:
    """'B = 16, m = 1, fedsgd, train mode' — what the twins reproduce, in a line."""
    mode = "train" if settings.get("train_mode") else "eval"
    return (f"B = {settings['batch_size']}, m = {settings['local_steps']}, {settings['scheme']}, "
            f"{settings['optimizer']} lr {settings['learning_rate']:g}, {mode} mode"
            + (f", defenses {' then '.join(repr(d) for d in settings['defenses'])}"
               if settings.get("defenses") else ""))
