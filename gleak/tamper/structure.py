"""Weight-only tests for a crafted global model (METHODS-server §5; the attacks in §3).

Each test reads one :class:`~gleak.tamper.views.LayerView` and returns the :class:`Hit` it finds, if any. Every
trap threshold is an exact structure that continuous initialisation and gradient descent do not produce, set far
from the honest null stated beside it; nothing here is fitted to particular models.

- duplicate rows (Fowl et al., ICLR 2022, "Robbing the Fed": K identical measurement rows with a bias ladder);
- constant rows (class fishing's 0.5 rows, Wen et al., ICML 2022; averaging imprints; "ones" connections);
- trap-weight pairing (Boenisch et al., EuroS&P 2023: each row's positive half a scaled copy of its negative half);
- input-passing kernels and identity matrices (SEER's transmit-SNR, Garov et al., ICLR 2024; Decepticons);
- extreme biases (fishing's 1000-valued competitors), with the share of zeroed rows;
- zeroed embedding columns (Decepticons).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from gleak.tamper.views import LayerView

Tier = Literal["trap", "suspicious"]

STRICT_COS = 0.999  # rows this parallel, four or more of them: an imprint (honest max |cos| at fan-in 64 is ~0.3)
LOOSE_COS = 0.95  # rows this parallel, eight or more of them: a jittered imprint
EXACT_COS = 1 - 1e-6  # an exact duplicate pair, within float32 rounding (a one-shot imprint has two rows)
MIN_FAN_IN = 64  # below it random rows reach cos 0.7: only exact duplicates count
MIN_ROW = 16  # rows shorter than this are not tested for constant or paired structure
CONSTANT_CV = 1e-3  # sd / |mean| of a constant row
PAIR_TOLERANCE = 1e-5  # relative: float32 rounding of s·v is ~6e-8
PAIR_SHARE = 0.9
PAIR_ROWS = 8
TRANSMIT = 1.0  # SEER's transmit-SNR: one weight outweighing all the others of its kernel together
IDENTITY = 1e-3
BIAS_ABS = 100.0
BIAS_RATIO = 10.0
BIAS_SUSPICIOUS = 20.0
ZERO_COLUMNS = 4
GRAM_CHUNK = 1024
PROJECT_ABOVE = 2e10  # K²·n flops above which rows are first projected to PROJECTED dims to find candidates
PROJECTED = 128
MAX_PAIRS = 1 << 20  # candidate pairs of one block checked one by one; past it the block's exact cosines are computed
MAX_LISTED = 5  # tensors named in an architecture finding


@dataclass(frozen=True)
class Hit:
    """One structure found in one layer: the rule, its tier, the statistic against its threshold, and the honest
    reference (``null``) the threshold stands against."""

    rule: str
    tier: Tier
    layer: str
    title: str
    metric: str
    measured: float
    threshold: float
    null: str
    rows: int = 0


def _unit_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    norms = w.norm(dim=1)
    keep = (norms > 0).nonzero().flatten()
    return w[keep] / norms[keep, None], keep


def _neighbours(unit: torch.Tensor, levels: tuple[float, ...]) -> list[torch.Tensor]:
    """For each level and row, how many other rows have cosine ≥ that level with it (one chunked Gram pass;
    when the exact Gram is too large, candidates come from a random projection and are confirmed exactly)."""
    k, n = unit.shape
    counts = [torch.zeros(k, dtype=torch.long) for _ in levels]
    if k < 2:
        return counts
    low = min(levels)
    if k * k * n <= PROJECT_ABOVE:
        for start in range(0, k, GRAM_CHUNK):
            block = unit[start:start + GRAM_CHUNK] @ unit.T
            for c, level in zip(counts, levels, strict=True):
                c[start:start + GRAM_CHUNK] = (block >= level).sum(1) - 1
        return counts
    gen = torch.Generator().manual_seed(0)
    proj = torch.randn(n, PROJECTED, generator=gen, dtype=unit.dtype) / math.sqrt(PROJECTED)
    small = unit @ proj
    small = small / small.norm(dim=1, keepdim=True).clamp_min(1e-300)
    for start in range(0, k, GRAM_CHUNK):
        block = small[start:start + GRAM_CHUNK] @ small.T
        near = block >= low - 0.3  # projected cosines spread by ~1/√PROJECTED around the true ones
        if int(near.sum()) > MAX_PAIRS:  # coherent rows: this block's exact cosines, not millions of pairs
            exact_block = unit[start:start + GRAM_CHUNK] @ unit.T
            for c, level in zip(counts, levels, strict=True):
                c[start:start + GRAM_CHUNK] = (exact_block >= level).sum(1) - 1
            continue
        pairs = near.nonzero()
        pairs = pairs[pairs[:, 0] + start != pairs[:, 1]]
        if len(pairs) == 0:
            continue
        exact = (unit[pairs[:, 0] + start] * unit[pairs[:, 1]]).sum(1)
        for c, level in zip(counts, levels, strict=True):
            rows = pairs[exact >= level, 0] + start
            c.index_add_(0, rows, torch.ones_like(rows))
    return counts


def duplicate_rows(view: LayerView) -> Hit | None:
    """Clusters of near-parallel rows: ≥ 4 at cos ≥ 0.999 or ≥ 8 at cos ≥ 0.95 (fan-in ≥ 64), or an exact
    duplicate pair (fan-in ≥ 16). The honest null: independent rows have cos ≈ N(0, 1/n), so the largest of
    K(K−1)/2 pairs stays near √(2 ln K² / n) (0.3 at K = 64, n = 64; 0.12 at n = 3072)."""
    if view.role == "embedding" or view.fan_in < MIN_ROW or view.rows < 2:
        return None
    unit, _ = _unit_rows(view.weight)
    null = f"independent rows at fan-in {view.fan_in}: max cos ≈ {_null_cos(unit.shape[0], view.fan_in):.2f}"
    near = _neighbours(unit, (EXACT_COS, STRICT_COS, LOOSE_COS))
    exact = int((near[0] >= 1).sum())
    if view.fan_in >= MIN_FAN_IN:
        for count, level, size in ((near[1], STRICT_COS, 4), (near[2], LOOSE_COS, 8)):
            members = int((count >= size - 1).sum())
            if members >= size:
                return Hit("GLEAK-SERVER-IMPRINT", "trap", view.name,
                           f"{members} rows of {view.name} read the same direction (cos ≥ {level}): an imprint "
                           "layer's measurement rows, or the equal weights that read them", "rows in a cluster",
                           float(members), float(size), null, members)
    if exact >= 2:
        return Hit("GLEAK-SERVER-IMPRINT", "trap", view.name,
                   f"{exact} rows of {view.name} are exact copies of another row", "duplicated rows", float(exact),
                   2.0, null, exact)
    return None


def _null_cos(k: int, n: int) -> float:
    pairs = max(k * (k - 1) / 2, 1.0)
    return min(1.0, math.sqrt(2 * math.log(2 * pairs) / n))


def constant_rows(view: LayerView) -> Hit | None:
    """Non-zero rows whose entries are all equal (sd / |mean| < 1e-3, fan-in ≥ 16): class fishing's target rows,
    averaging imprints, "ones" connections. Continuous initialisation never gives one."""
    if view.role == "embedding" or view.fan_in < MIN_ROW:
        return None
    w = view.weight
    mean = w.mean(1, dtype=torch.float64)
    sd = torch.cat([w[i:i + GRAM_CHUNK].double().std(1) for i in range(0, w.shape[0], GRAM_CHUNK)])  # float64 in
    cv = sd / mean.abs().clamp_min(1e-300)  # chunks: a VGG-sized layer is not copied whole
    hit = int(((cv < CONSTANT_CV) & (mean != 0)).sum())
    if hit == 0:
        return None
    return Hit("GLEAK-SERVER-CONSTANT-ROWS", "trap", view.name,
               f"{hit} row(s) of {view.name} hold one value in every entry", "constant rows", float(hit), 1.0,
               "continuous initialisation: none", hit)


def paired_share(rows: torch.Tensor) -> torch.Tensor:
    """Per row, the share of its entries whose opposite-sign partner (matched by rank of size) stands at the
    row's common ratio within 1e-5; 0 for rows whose signs are not balanced."""
    pos = torch.sort(rows.clamp_min(0), dim=1, descending=True).values
    neg = torch.sort((-rows).clamp_min(0), dim=1, descending=True).values
    n_pos, n_neg = (rows > 0).sum(1), (rows < 0).sum(1)
    m = torch.minimum(n_pos, n_neg)
    width = int(m.max()) if len(m) else 0
    if width == 0:
        return torch.zeros(rows.shape[0], dtype=torch.float64)
    ratio = pos[:, :width] / neg[:, :width].clamp_min(1e-300)
    used = torch.arange(width)[None, :] < m[:, None]
    s = torch.nanmedian(torch.where(used, ratio, torch.nan), dim=1).values
    close = ((ratio / s[:, None] - 1).abs() <= PAIR_TOLERANCE) & used
    share = close.sum(1) / m.clamp_min(1)
    balanced = ((n_pos - n_neg).abs() <= 1) & (m >= MIN_ROW // 2)
    return torch.where(balanced, share.double(), torch.zeros_like(share, dtype=torch.float64))


def trap_pairing(view: LayerView) -> Hit | None:
    """Trap weights: each row holds as many negative as positive entries (±1), and its positive entries are an
    exact scaled copy s·|v| of the negative ones. The share of matched pairs (sorted by size, one common ratio
    within 1e-5) is ≥ 0.9 in ≥ 8 rows (or every row of a smaller layer). Honest rows: balanced signs in about
    √(2/(πn)) of rows, and two independent halves of one distribution whose sorted ratios wander by ~1/√n, so a
    share within 1e-5 stays near 0."""
    if view.role == "embedding" or view.fan_in < MIN_ROW:
        return None
    need = min(PAIR_ROWS, view.rows)
    w = view.weight
    balanced = (((w > 0).sum(1) - (w < 0).sum(1)).abs() <= 1).nonzero().flatten()
    hits = 0
    for start in range(0, len(balanced), GRAM_CHUNK):
        hits += int((paired_share(w[balanced[start:start + GRAM_CHUNK]]) >= PAIR_SHARE).sum())
    if hits < need or hits == 0:
        return None
    return Hit("GLEAK-SERVER-TRAP-WEIGHTS", "trap", view.name,
               f"{hits} rows of {view.name} pair each negative weight with a scaled positive copy (trap weights)",
               "paired rows", float(hits), float(need), "independent rows: matched share ≈ 0", hits)


def input_passing(view: LayerView, first_conv: bool) -> Hit | None:
    """Layers that pass their input through: SEER's transmit-SNR on the first convolution (a kernel whose largest
    weight outweighs the rest together, T > 1; honest kernels of 25–147 taps stay below 0.2), and dense square
    matrices equal to c·I or with one non-zero entry in most rows."""
    w = view.weight
    if view.role == "conv" and first_conv and view.fan_in >= 9:
        a = w.abs()
        top = a.max(1).values
        t = top / (a.sum(1) - top + 1e-6)
        worst = float(t.max())
        if worst > TRANSMIT:
            return Hit("GLEAK-SERVER-INPUT-PASSING", "trap", view.name,
                       f"{int((t > TRANSMIT).sum())} kernel(s) of the first convolution {view.name} pass one input "
                       "through (Dirac-like)", "transmit-SNR", worst, TRANSMIT,
                       "honest first convolutions: below 0.2", int((t > TRANSMIT).sum()))
    if view.role != "dense" or view.fan_in < MIN_ROW:
        return None
    nonzero = (w != 0).sum(1)
    live = int((nonzero > 0).sum())
    single = int((nonzero == 1).sum())
    if live >= MIN_ROW and single >= live / 2:
        return Hit("GLEAK-SERVER-INPUT-PASSING", "trap", view.name,
                   f"{single} of {live} rows of {view.name} read a single input (an identity or shift)",
                   "single-entry rows", float(single), live / 2, "dense layers: none", single)
    if w.shape[0] == w.shape[1]:
        c = float(torch.diagonal(w).mean())
        off = float((w - c * torch.eye(w.shape[0], dtype=w.dtype)).norm() / w.norm().clamp_min(1e-300))
        if c != 0 and off < IDENTITY:
            return Hit("GLEAK-SERVER-INPUT-PASSING", "trap", view.name,
                       f"{view.name} is a multiple of the identity", "‖W − cI‖/‖W‖", off, IDENTITY,
                       "continuous initialisation: ≈ 1.4", w.shape[0])
    return None


def extreme_bias(view: LayerView) -> Hit | None:
    """Biases far outside their layer's scale: r = |b| / max(‖W‖_F/√K, 1e-3) ≥ 10 with |b| ≥ 100 is a trap
    (fishing sets the other classes' biases to 1000 so that no gradient reaches the body); r ≥ 20 alone is
    suspicious. PyTorch's default initialisation keeps r ≲ 2. The detail counts the layer's zeroed rows."""
    if view.bias is None or view.role == "embedding" or view.bias.numel() != view.rows:
        return None
    scale = max(float(view.weight.norm()) / math.sqrt(view.rows), 1e-3)
    b = view.bias.abs()
    r = b / scale
    trap = (b >= BIAS_ABS) & (r >= BIAS_RATIO)
    zero = int((view.weight.abs().sum(1) == 0).sum())
    note = f"; {zero} of {view.rows} rows are all zero" if zero else ""
    if bool(trap.any()):
        return Hit("GLEAK-SERVER-EXTREME-BIAS", "trap", view.name,
                   f"{int(trap.sum())} bias(es) of {view.name} reach {float(b.max()):.4g}, "
                   f"{float(r.max()):.0f}× the layer's weight scale{note}", "bias / weight scale", float(r.max()),
                   BIAS_RATIO, "default initialisation: ≲ 2", int(trap.sum()))
    if float(r.max()) >= BIAS_SUSPICIOUS:
        return Hit("GLEAK-SERVER-EXTREME-BIAS", "suspicious", view.name,
                   f"a bias of {view.name} is {float(r.max()):.0f}× the layer's weight scale{note}",
                   "bias / weight scale", float(r.max()), BIAS_SUSPICIOUS, "default initialisation: ≲ 2",
                   int((r >= BIAS_SUSPICIOUS).sum()))
    return None


def zeroed_columns(view: LayerView) -> Hit | None:
    """An embedding whose leading ≥ 4 columns are exactly zero in every row (Decepticons frees them to carry a
    measurement): no initialisation or training leaves a column at exactly zero."""
    if view.role != "embedding" or view.rows < 2:
        return None
    zero = (view.weight == 0).all(0)
    lead = int(torch.cumprod(zero.to(torch.int64), 0).sum())
    if lead < ZERO_COLUMNS or bool(zero.all()):
        return None
    return Hit("GLEAK-SERVER-ZEROED-EMBEDDING", "trap", view.name,
               f"the first {lead} columns of {view.name} are zero in every row", "zeroed leading columns",
               float(lead), float(ZERO_COLUMNS), "trained or initialised embeddings: none", lead)


def architecture_hits(tensors: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], what: str
                      ) -> list[Hit]:
    """The received tensors' keys and shapes against the client's own model (``what`` names it): an added,
    missing or reshaped tensor is the published form of Robbing the Fed, trap weights and LOKI (a layer inserted
    before the model)."""
    extra = sorted(set(tensors) - set(reference))
    missing = sorted(set(reference) - set(tensors))
    reshaped = sorted(k for k in set(tensors) & set(reference) if tuple(tensors[k].shape) != tuple(reference[k].shape))
    hits = []
    for keys, how in ((extra, "not in"), (missing, "missing from"), (reshaped, "reshaped from")):
        if keys:
            named = ", ".join(keys[:MAX_LISTED]) + (f" and {len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED
                                                    else "")
            hits.append(Hit("GLEAK-SERVER-ARCHITECTURE", "trap", keys[0], f"{len(keys)} tensor(s) {how} {what}: "
                            f"{named}", "tensors", float(len(keys)), 1.0, "the client's own model: an exact match",
                            len(keys)))
    return hits


def check_views(views: Iterable[LayerView]) -> list[Hit]:
    """Every test on every view, in layer order. ``views`` is consumed one layer at a time (a generator keeps one
    float32 copy of a half-precision layer in memory, never the whole model's)."""
    hits: list[Hit] = []
    seen_conv = False
    for view in views:
        first_conv = view.role == "conv" and not seen_conv
        seen_conv = seen_conv or view.role == "conv"
        for found in (duplicate_rows(view), constant_rows(view), trap_pairing(view), input_passing(view, first_conv),
                      extreme_bias(view), zeroed_columns(view)):
            if found is not None:
                hits.append(found)
    return hits
