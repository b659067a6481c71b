"""The console format: what each command prints on a terminal or a CI log, built from its typed report alone.

Rich tables sized for 80 columns (CI logs): file paths are shortened to their names in tables (full paths in
the lines below them), numeric columns never wrap. Every function prints to the console it is given; nothing
here computes a result the report does not hold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table

from gleak.report.formats.text import fmt_number
from gleak.report.model import (
    AttackInfo,
    CaptureReport,
    CheckModelReport,
    DefenseInfo,
    ImageMetrics,
    InspectReport,
    LabelResult,
    LabelsReport,
    ReconstructReport,
    Report,
    TextReport,
    TokensReport,
    TrainGeneratorReport,
)
from gleak.settings.declare import Resolved

NAME = "table"
KIND_SHORT = {"gradient": "grad", "update": "upd"}  # the audit table's kind column
STYLE = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan", "info": "dim"}


SHOWN = 12


def compact(counts: Sequence[int], limit: int = SHOWN) -> str:
    """'3×2 7×1' (class×count), the largest counts first past ``limit`` entries."""
    pairs = [(c, int(n)) for c, n in enumerate(counts) if n]
    if len(pairs) > limit:
        top = sorted(pairs, key=lambda p: -p[1])[:limit]
        return " ".join(f"{c}×{n}" for c, n in sorted(top)) + f" … (+{len(pairs) - limit} classes)"
    return " ".join(f"{c}×{n}" for c, n in pairs) or "—"


def print_labels(console: Console, report: LabelsReport) -> None:
    """`gleak labels`: the capture line, the truth and chance, one row per attack, soft labels, reasons."""
    results = report.results
    head = (f"[bold]{report.capture}[/]: {report.kind}, B = {report.batch_size}"
            + (f", m = {report.local_steps} steps" if report.local_steps > 1 else "")
            + f", C = {report.num_classes}, last layer '{report.last_layer}'")
    console.print(head)
    if report.model_mode is not None:
        console.print(f"[dim]model: {escape(report.model_mode.note)}[/]", soft_wrap=True)
    if report.truth_counts is not None and report.chance is not None:
        console.print(f"truth: {compact(report.truth_counts)}   [dim]chance (random guessing): iAcc "
                      f"{report.chance.iacc:.3f}, cAcc {report.chance.cacc:.3f}[/]")
    rows, reasons = _label_rows(results, scored=report.truth_counts is not None)
    folded: tuple[str, ...] = ()
    for folded in FOLDED_LABEL_COLUMNS:  # fold: the counts (then the times) into lines below, every score kept
        if fits(console, _label_table(rows, folded, counts_width=COUNTS_WIDTH)):
            break
    table = _label_table(rows, folded)  # the counts wrap at spaces into the room left (at least COUNTS_WIDTH)
    console.print(table)
    if folded:
        for r in results:
            if r.status == "ok":
                console.print(f"{escape(r.attack)}" + (f" ({_time(r.seconds)})" if TIME in folded else "")
                              + f": {compact(r.counts or [])}", soft_wrap=True)
    legend = _composition_legend(results)
    if legend:
        console.print(f"[dim]{escape(legend)}[/]", soft_wrap=True)
    soft_rows = [r for r in results if r.status == "ok" and r.soft_label is not None]
    if soft_rows:
        print_soft_labels(console, report, soft_rows)
    for reason, names in reasons.items():
        console.print(f"{', '.join(names)} — {reason}", soft_wrap=True)
    for r in results:
        for w in r.warnings:
            console.print(f"[yellow]⚠ {r.attack}:[/] {w}", soft_wrap=True)
    for note in report.ignored_options:
        console.print(f"[yellow]ignored[/] {note}", soft_wrap=True)


COUNTS, TIME = "recovered class×count", "time"
FOLDED_LABEL_COLUMNS: tuple[tuple[str, ...], ...] = ((), (COUNTS,), (COUNTS, TIME))  # tried in order at 80 columns
COUNTS_WIDTH = 16  # the narrowest the counts column may wrap to ('0×2 1×3 2×4 3×6' a line) before it is folded


def _label_rows(results: Sequence[LabelResult], scored: bool) -> tuple[list[dict[str, str]], dict[str, list[str]]]:
    """The labels table's cells by column (only the columns that apply), and the attacks by reason."""
    calibrated = any(r.confidence for r in results)
    rows: list[dict[str, str]] = []
    reasons: dict[str, list[str]] = {}
    for r in results:
        row = {"attack": r.attack, COUNTS: "", TIME: ""}
        c = r.confidence or {}
        if calibrated:
            row |= {"90 % ±": "", "expected/chance": ""}
        if scored:
            row |= dict.fromkeys(("iAcc", "cAcc", "exact", "chance"), "")
        if r.status == "abstained":
            reasons.setdefault(f"[cyan]abstained[/]: {r.reason}", []).append(r.attack)
            row |= {COUNTS: "[cyan]abstained[/] (no counts)", TIME: _time(r.seconds)}
            if calibrated and c.get("calibrated"):
                row |= {"90 % ±": "—", "expected/chance": _expected(c)}
        elif r.status != "ok":
            label = {"not_applicable": "[yellow]not applicable[/]", "error": "[red]error[/]"}.get(
                r.status, "[red]failed[/]")
            reasons.setdefault(f"{label}: {r.reason}", []).append(r.attack)
            row |= {"attack": f"[dim]{r.attack}[/]", COUNTS: label}
        else:
            row |= {"attack": r.attack + (" [yellow]⚠[/]" if r.warnings else ""), COUNTS: compact(r.counts or []),
                    TIME: _time(r.seconds)}
            if calibrated:
                row |= ({"90 % ±": f"{c['half_width']}", "expected/chance": _expected(c)} if c.get("calibrated")
                        else {"90 % ±": "—", "expected/chance": "[dim]not calibrated[/]"})
            if scored and r.scores:
                s = r.scores
                colour = "green" if s["iacc"] >= 0.999 else ("yellow" if s["iacc"] > s["chance_iacc"] else "red")
                row |= {"iAcc": f"[{colour}]{s['iacc']:.3f}[/]", "cAcc": f"{s['cacc']:.3f}",
                        "exact": f"{s['exact']:.3f}", "chance": f"{s['chance_iacc']:.3f}"}
        rows.append(row)
    return rows, reasons


def _label_table(rows: Sequence[dict[str, str]], folded: Sequence[str] = (), counts_width: int | None = None
                 ) -> Table:
    """The labels table without the ``folded`` columns (their values go to lines below it); ``counts_width`` caps
    the counts column (which wraps at spaces), to measure whether the table fits."""
    table = Table(show_lines=False)
    columns = [col for col in (rows[0] if rows else {"attack": ""}) if col not in folded]
    for col in columns:
        if col == "attack":
            table.add_column(col, style="bold", no_wrap=True)
        elif col == COUNTS:
            table.add_column(col, overflow="fold", max_width=counts_width)
        else:
            table.add_column(col, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*[row[col] for col in columns])
    return table


COMPOSITION_SHORT = {"uniform": "uni", "dirichlet": "dir"}  # the labels table's expected/chance column


def _expected(confidence: Mapping[str, Any]) -> str:
    """'0.84/0.71 uni': expected vs chance iAcc on the composition named (red when uninformative)."""
    comp = confidence.get("composition")
    text = (f"{confidence['expected_iacc']:.2f}/{confidence['chance_iacc']:.2f}"
            + (f" {COMPOSITION_SHORT.get(comp, comp)}" if comp else ""))
    return text if confidence.get("informative") else f"[red]{text}[/]"


def _composition_legend(results: Sequence[LabelResult]) -> str:
    """What expected/chance compares and the compositions it names (from the first calibration that says)."""
    for r in results:
        by = (r.confidence or {}).get("by_composition")
        if not by:
            continue
        names = "; ".join(f"{COMPOSITION_SHORT.get(n, n)}: {_composition_words(n, m)}" for n, m in by.items())
        return ("expected/chance: iAcc on batches simulated like this one vs random guessing on batches drawn the "
                f"same way, for the composition with the smaller margin ({names})")
    return ""


def _composition_words(name: str, measured: Mapping[str, Any]) -> str:
    if name == "uniform":
        return "labels uniform over the aux data's classes, an IID client"
    if name == "dirichlet" and measured.get("alpha") is not None:
        return f"Dirichlet({measured['alpha']:g}) class shares, a non-IID client"
    return str(measured.get("assumes", name))


def print_tokens(console: Console, report: TokensReport) -> None:
    """`gleak labels` on a language model's capture: one row per token attack with the number of tokens it
    recovered and, with the truth, precision / recall / F1 next to chance F1 and the recall of the sensitive tokens
    (digits, capitals). Never decoded text: the console is
    where CI logs come from (the JSON holds the text only with --show-text)."""
    console.print(f"[bold]{escape(report.capture)}[/]: {report.kind}, {report.model_type} ({report.task}), "
                  f"V = {report.vocab_size}, B = {report.batch_size}"
                  + (f", m = {report.local_steps} steps" if report.local_steps > 1 else "")
                  + (", tied embeddings" if report.tied_embeddings else ""), soft_wrap=True)
    if report.truth_tokens is not None:
        console.print(f"truth: {report.truth_tokens.get('inputs', 0)} distinct input tokens, "
                      f"{report.truth_tokens.get('targets', 0)} distinct targets"
                      + (f", {report.sensitive_tokens} sensitive (digits, capitals)"
                         if report.sensitive_tokens is not None else ""))
    table = _token_table(report, method=True)
    if not fits(console, table):  # fold: each attack's method into a line below, every score column kept
        table = _token_table(report, method=False)
    console.print(table)
    if len(table.columns) < len(TOKEN_COLUMNS):
        methods = "; ".join(f"{r.attack}: {r.method}" for r in report.results if r.method)
        if methods:
            console.print(f"[dim]method — {escape(methods)}[/]", soft_wrap=True)
    reasons: dict[str, list[str]] = {}  # one line per reason, naming every attack that gave it
    for r in report.results:
        if r.reason:
            reasons.setdefault(r.reason, []).append(r.attack + (f" ({STATUS_WORDS.get(r.status, r.status)})"
                                                                if r.status != "ok" else ""))
    for reason, attacks in reasons.items():
        console.print(f"[dim]{', '.join(attacks)}: {escape(reason)}[/]", soft_wrap=True)
    if report.show_text:
        console.print("[dim]decoded tokens: in the JSON report only (--format json or -o FILE)[/]")


TOKEN_COLUMNS = ("attack", "method", "tokens", "prec.", "recall", "F1", "chance", "sens.")
UNBOUNDED = 1 << 16  # a width no table reaches: fits() measures its widest rendering
STATUS_WORDS = {"not_applicable": "not applicable"}  # the reason lines' words for a status
STATUS_SHORT = {"not_applicable": "n/a"}  # the tokens table's cell for a status (the reason line below says why)


def fits(console: Console, table: Table) -> bool:
    """Whether ``table`` shows every cell whole, unwrapped, at the console's width (measured without a limit)."""
    unbounded = console.options.update(width=UNBOUNDED)
    return Measurement.get(console, unbounded, table).maximum <= console.options.max_width


def _token_table(report: TokensReport, method: bool) -> Table:
    """The token attacks' table (every score column; the method column only when asked)."""
    table = Table(show_lines=False)
    for col in TOKEN_COLUMNS:
        if col == "method" and not method:
            continue
        left = col in ("attack", "method")
        table.add_column(col, justify="left" if left else "right", no_wrap=col != "method")
    for r in report.results:
        sc = r.scores or {}
        cells = [f"{sc[k]:.3f}" if k in sc else "—" for k in ("precision", "recall", "f1", "chance_f1",
                                                                "sensitive_recall")]
        found = (str(len(r.tokens)) if r.tokens else (f"len {r.max_length}" if r.max_length else "—"))
        table.add_row(r.attack, *([escape(r.method or "—")] if method else []),
                      found if r.status == "ok" else STATUS_SHORT.get(r.status, r.status), *cells)
    return table


def print_text(console: Console, report: TextReport, written: Sequence[Path]) -> None:
    """`gleak reconstruct` on a language model's capture: what was recovered and how well, never decoded text (the
    console is where CI logs come from; --show-text puts the text in metrics.json and sequences.txt only)."""
    console.print(f"[bold]{escape(report.capture)}[/]: {report.kind}, {report.model_type}, V = {report.vocab_size}, "
                  f"B = {report.batch_size}" + (f", m = {report.local_steps} steps" if report.local_steps > 1 else "")
                  + (", LoRA" if report.lora else ""), soft_wrap=True)
    if report.status != "ok":
        console.print(f"{report.attack}: {report.status}: {escape(report.reason or '')}", soft_wrap=True)
    else:
        exact = sum(s.exact for s in report.sequences)
        to_last = sum(s.exact_up_to_last and not s.exact for s in report.sequences)
        console.print(f"{report.attack}: {len(report.sequences)} sequence(s) recovered in {report.seconds:.1f} s: "
                      f"{exact} exact (every token proven)"
                      + (f", {to_last} more exact up to the last token (the last one solved from the LM head but "
                         "not proven, or missing)" if to_last else ""), soft_wrap=True)
    sc = report.scores
    if sc:
        table = Table(show_lines=False)
        for col in ("", "ROUGE-1", "ROUGE-2", "ROUGE-L", "exact", "up to last", "token acc."):
            table.add_column(col, justify="left" if not col else "right", no_wrap=True)
        keys = ("rouge1", "rouge2", "rougeL", "exact_match", "exact_up_to_last", "token_accuracy")
        table.add_row("recovered", *[f"{sc[k]:.3f}" if k in sc else "—" for k in keys])
        table.add_row("chance", *[f"{sc['chance_' + k]:.3f}" if "chance_" + k in sc else "—" for k in keys])
        if any(k.startswith("bag_only_") for k in sc):
            table.add_row("bag only", *[f"{sc['bag_only_' + k]:.3f}" if "bag_only_" + k in sc else "—"
                                        for k in keys])
        console.print(table)
        console.print(f"[dim]against {report.truth_sequences} truth sequence(s), matched one to one; ROUGE over "
                      "token ids; exact: every token in place; up to last: every token but the last[/]",
                      soft_wrap=True)
    elif report.status == "ok":
        console.print("[dim]no ground truth beside the capture: not scored[/]")
    if written:
        console.print(f"wrote {', '.join(escape(str(p)) for p in written)}"
                      + ("" if report.show_text else " (token ids only: --show-text decodes)"), soft_wrap=True)


def print_soft_labels(console: Console, report: LabelsReport, rows: Sequence[LabelResult]) -> None:
    """Soft labels of one example, one row per class (classes with mass, at most 20), truth first."""
    truth = report.truth_soft_label
    vectors: list[Sequence[float]] = [truth] if truth is not None else []
    vectors += [r.soft_label for r in rows if r.soft_label is not None]
    mass = [max(abs(float(v[c])) for v in vectors) for c in range(len(vectors[0]))]
    shown = [c for c in sorted(range(len(mass)), key=lambda c: -mass[c]) if mass[c] > 1e-4][:20]
    table = Table(title="soft label of the example", title_justify="left")
    table.add_column("class", justify="right")
    if truth is not None:
        table.add_column("truth", justify="right")
    for r in rows:
        table.add_column(r.attack, justify="right")
    for c in sorted(shown):
        table.add_row(str(c), *[f"{float(v[c]):.5f}" for v in vectors])
    console.print(table)
    for r in rows:
        d = r.diagnostics or {}
        if d.get("augmentation") == "smoothing":
            what = f"label smoothing, class {d['class']}, ε = {d['epsilon']:.5f}"
        elif d.get("augmentation") == "mixup":
            what = f"mixup of classes {d['classes'][0]} and {d['classes'][1]}, ratio {d['ratio']:.5f}"
        else:
            what = d.get("case", "")
        line = f"{r.attack}: {what}; search: {d.get('stage', '—')}, loss {d.get('loss', float('nan')):.2e}"
        if d.get("confidence") is not None:
            bound = d.get("l1_error_bound", float("nan"))
            line += f"; confidence {d['confidence']:.3f} (90 % bound on L1: {bound:.2g})"
        scores = r.scores or {}
        if "soft_l1" in scores:
            ok = "[green]recovered[/]" if scores["soft_success"] else "[red]not recovered[/]"
            line += f"; L1 to truth {scores['soft_l1']:.2e} ({ok})"
        console.print(line, soft_wrap=True)


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def print_reconstruct(console: Console, report: ReconstructReport, written: Sequence[Path]) -> None:
    """`gleak reconstruct`: the run, its speed, the matched image scores and the baseline, the files written."""
    console.print(f"[bold]{report.capture}[/]: {report.attack} ({report.paper}), B = {report.batch_size}, "
                  f"labels {report.labels.source}"
                  + (f", feature from {report.feature_source}" if report.feature_source else ""), soft_wrap=True)
    if report.model_mode is not None:
        console.print(f"[dim]model: {escape(report.model_mode.note)}[/]", soft_wrap=True)
    d = report.diagnostics
    work = ""
    if d.get("iterations_run"):
        work = f", {d['iterations_run']:,} iterations"
        if d.get("evaluations_run"):
            work += f" ({d['evaluations_run']:,} objective evaluations)"
    speeds = [f"{value:.1f} {unit}/s" for value, unit in ((report.iterations_per_second, "iterations"),
                                                          (report.evaluations_per_second, "evaluations"))
              if value]
    speed = f": {', '.join(speeds)}" if speeds else ""
    threads = f"{report.threads} thread{'s' if report.threads != 1 else ''}"
    console.print(f"time {report.seconds:.1f} s on {threads}{work}{speed}"
                  + (f", final loss {d['loss']:.3e}" if "loss" in d else ""), soft_wrap=True)
    if "bins_with_examples" in d:  # the imprint attack: what the bins held
        console.print(f"imprint {d['layer']}: {d['bins_with_examples']} of {d['bins']} bins held examples"
                      + (f", {d['blank']} example(s) left blank (they shared bins)" if d.get("blank") else ""),
                      soft_wrap=True)
    if "agreeing" in d:  # the trap-weights attack
        console.print(f"trap weights {d['layer']}: {d['candidates']} candidate(s), {d['agreeing']} given by two or "
                      "more rows" + (f", {d['blank']} example(s) left blank" if d.get("blank") else ""),
                      soft_wrap=True)
    o = report.output_scores
    if o:
        parts = []
        if o.get("logit_mse") is not None:
            parts.append(f"logit MSE {o['logit_mse']:.2e}")
        if o.get("feature_cosine_mean") is not None:
            parts.append(f"feature cosine mean {o['feature_cosine_mean']:.4f} (min {o['feature_cosine_min']:.4f})")
        console.print("recovered vs true model outputs: " + ", ".join(parts), soft_wrap=True)
    if report.generator:
        g = report.generator
        ceiling = f", held-out PSNR {g['heldout_psnr']:.2f} dB" if g.get("heldout_psnr") is not None else ""
        console.print(f"[dim]generator {escape(str(g['file']))} (layer {g['layer']}{ceiling})[/]", soft_wrap=True)
    m = report.metrics
    if not report.images_written:
        console.print("[yellow]no images written[/] (no generator): the recovered features are in "
                      "recovered.safetensors", soft_wrap=True)
    elif m is not None:
        _print_image_scores(console, report, m)
    else:
        console.print("[dim]no ground truth: images are written unscored[/]")
    for w in report.warnings:
        console.print(f"[yellow]⚠[/] {w}", soft_wrap=True)
    for note in report.ignored_options:
        console.print(f"[yellow]ignored[/] {note}", soft_wrap=True)
    console.print(f"wrote {written[0]} and {len(written) - 1} more files in {written[0].parent}/")


def _print_image_scores(console: Console, report: ReconstructReport, m: ImageMetrics) -> None:
    """The matched per-image scores, the identification lineup and the no-attack baseline."""
    table = Table(title="reconstruction vs truth (matched one-to-one)", title_justify="left")
    for col in ("image", "PSNR dB", "SSIM", "LPIPS"):
        table.add_column(col, justify="right")
    lp = m.lpips or [None] * len(m.psnr)
    for i, (p, s, v) in enumerate(zip(m.psnr, m.ssim, lp, strict=True)):
        table.add_row(str(i), fmt_number(p, 2), fmt_number(s, 4), fmt_number(v, 4))
    mean = m.mean
    table.add_row("[bold]mean[/]", fmt_number(mean.psnr, 2), fmt_number(mean.ssim, 4), fmt_number(mean.lpips, 4))
    console.print(table)
    if "bins_with_examples" in report.diagnostics or "agreeing" in report.diagnostics:
        copies = sum(1 for p in m.psnr if p is not None and p >= EXACT_DB)
        console.print(f"[bold]{copies} of {len(m.psnr)}[/] images came back exactly (PSNR ≥ {EXACT_DB:g} dB)",
                      soft_wrap=True)
    if m.lpips is None:
        console.print(f"[yellow]LPIPS not computed:[/] {m.lpips_info.get('unavailable')}", soft_wrap=True)
    ident = report.identification
    if not ident:
        console.print("[dim]identification not scored: it needs --aux data for distractors (lineup.png)[/]",
                      soft_wrap=True)
    else:
        low, high = ident["interval"]
        console.print(f"[bold]identification:[/] {ident['identified']:g} of {ident['n']} true images picked out "
                      f"of lineups of {ident['distractors'] + 1} (rate {ident['rate']:.2f}, "
                      f"{100 * ident['level']:.0f} % interval [{low:.2f}, {high:.2f}], chance "
                      f"{ident['chance']:.2f}; distractors: {ident['lineup']})", soft_wrap=True)
    base = report.baseline
    if base is not None and base.statement:
        console.print(f"[bold red]{base.statement}[/]", soft_wrap=True)
    elif base is not None:
        console.print(f"baseline ({base.kind}): {base.psnr:.2f} dB", soft_wrap=True)


def print_audit_config(console: Console, resolved: Resolved[Any]) -> None:
    """The effective configuration as a table: key, value, source (what ``--show-config`` prints)."""
    table = Table(title="gleak audit: effective configuration", title_justify="left")
    for col in ("key", "value", "from"):
        table.add_column(col, overflow="fold")
    for key, entry in resolved.shown().items():
        value = entry["value"]
        if isinstance(value, dict):
            value = [f"{k}={v}" for k, v in value.items()]
        shown = ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)
        table.add_row(key.replace("_", "-"), escape(shown if value not in (None, []) else "—"), escape(entry["from"]))
    console.print(table)


def short_names(paths: Sequence[str]) -> tuple[str, dict[str, str]]:
    """The folder the paths share and each path below it (``.safetensors`` dropped), so that a table cell stays one
    line at 80 columns; the full paths stay in the lines under the table."""
    import posixpath

    unique = list(dict.fromkeys(paths))
    if not unique:
        return "", {}
    parents = [posixpath.dirname(p.replace("\\", "/")) for p in unique]
    try:
        common = posixpath.commonpath(parents) if all(parents) or not any(parents) else ""
    except ValueError:  # absolute and relative paths mixed
        common = ""
    names = {p: (posixpath.relpath(p.replace("\\", "/"), common) if common else p).removesuffix(".safetensors")
             for p in unique}
    return common, names


MAX_RUN_ROWS = 12  # console: the first and last rounds of a longer run, and the worst clients


def print_run(console: Console, report: Report) -> None:
    """The run view in short: the gate, when the findings stop, a few rounds and the worst clients."""
    from gleak.report.run_view import clear_text, gate_text

    view = report.run
    if view is None:
        return
    names = [s.name for s in view.series]
    clear = clear_text(view, report.fail_on)
    console.print(f"[bold]run[/]: {sum(r.round is not None for r in view.rounds)} round(s), {len(view.clients)} "
                  f"client(s); gate {gate_text(report)}" + (f"; {clear}" if clear else ""), soft_wrap=True)
    if view.privacy is not None:
        from gleak.report.run_privacy import client_statement

        for client in view.privacy.clients[:3]:  # the largest ε first
            who = client.client if client.client is not None else "(no client id)"
            console.print(f"ε of client {escape(who)}: {escape(client_statement(view.privacy, client))}"
                          + (f" [red](over budget from round {client.over_budget_round})[/]"
                             if client.over_budget_round is not None else ""), soft_wrap=True)
        if len(view.privacy.clients) > 3:
            console.print(f"… {len(view.privacy.clients) - 3} more clients' ε in report.json / report.html")
    table = Table(caption="max / median over each round's captures (chance)", caption_justify="left")
    for col in ("round", "captures", "worst", *names):
        table.add_column(col, no_wrap=True)
    rows = view.rounds
    half = MAX_RUN_ROWS // 2
    shown = rows if len(rows) <= MAX_RUN_ROWS else [*rows[:half], None, *rows[-half:]]
    for r in shown:
        if r is None:
            table.add_row(f"… {len(rows) - 2 * half} more", "", "", *[""] * len(names))
            continue
        cells = []
        for n in names:
            p = r.series.get(n)
            cells.append("—" if p is None else f"{p.max:.2f} / {p.median:.2f}"
                         + (f" ({p.chance:.2f})" if p.chance is not None else ""))
        worst = f"[{STYLE[r.worst]}]{r.worst}[/]" if r.worst else "none"
        table.add_row("unknown" if r.round is None else str(r.round), str(r.captures), worst, *cells)
    console.print(table)
    worst_clients = [c for c in view.clients if c.worst][:5]
    for c in worst_clients:
        console.print(f"  client {escape(c.client or '(no id)')}: worst [{STYLE[c.worst or 'info']}]{c.worst}[/]"
                      + (f" in round {c.worst_round}" if c.worst_round is not None else "")
                      + (f" ({c.worst_rule})" if c.worst_rule else ""), soft_wrap=True)


def print_audit(console: Console, report: Report) -> None:
    """The console summary: findings by severity, one row per capture, the verdict."""
    from gleak.report.model import SEVERITIES, severity_rank
    from gleak.report.verdict import grouped_notices, has_run, notice_text, verdict

    by_capture: dict[str, list[Any]] = {}
    for f in report.findings:
        by_capture.setdefault(f.capture, []).append(f)
    counts = {s: sum(f.severity == s for f in report.findings) for s in SEVERITIES}
    summary = "  ".join(f"[{STYLE[s]}]{s} {n}[/]" for s, n in reversed(counts.items()) if n)
    answer = verdict(report)
    console.print(f"{_status(answer.status)}: {escape(answer.headline)}", soft_wrap=True)  # the answer first
    if answer.run_line:
        console.print(f"run: {escape(answer.run_line)}", soft_wrap=True)
    console.print(f"[bold]gleak audit[/] ({report.budget}): {len(report.captures)} capture(s), "
                  f"{len(report.findings)} finding(s)" + (f": {summary}" if summary else ""), soft_wrap=True)
    folder, names = short_names([c.capture.path for c in report.captures])
    table = Table(show_lines=False, caption=f"captures in {escape(folder)}/" if folder else None,
                  caption_justify="left")
    table.add_column("capture", overflow="ellipsis", no_wrap=True, max_width=28)
    what, score, shown = _audit_columns(report.captures)
    for col in ("kind", what, score, shown, "worst"):
        table.add_column(col, no_wrap=col in ("kind", score, "worst"))
    for c in report.captures:
        if c.status == "error":
            table.add_row(escape(names[c.capture.path]), "[red]error[/]", escape(c.error or ""), "", "", "")
            continue
        best = c.best_label()
        label = iacc = "—"
        if best is not None and c.chance is not None:
            value = (best.scores or {}).get("iacc") or 0.0
            label, iacc = best.attack, f"{value:.2f}/{c.chance['iacc']:.2f}"
        elif c.truth_counts is None:
            label = "no truth"
        images = "—"
        recon = next((a for a in c.attacks if a.task == "reconstruct"), None)
        if recon is not None:
            ident, psnr = recon.identification, (recon.scores or {}).get("psnr")
            if ident:
                images = f"{recon.attack} {ident['identified']:g}/{ident['n']} id"
            elif c.expected_images:
                images = f"{recon.attack} expected {c.expected_images['rate']:.2f} id"
            elif psnr is not None:
                images = f"{recon.attack} {psnr:.1f} dB"
            else:
                images = f"{recon.attack} ({recon.status})" if recon.status != "ok" else recon.attack
        if c.tokens is not None:  # a language model's capture: the token attacks, never their text
            label, iacc, images = _token_cells(c)
        found = by_capture.get(c.capture.path, [])
        worst = max((f.severity for f in found), key=severity_rank, default=None)
        kind = f"{KIND_SHORT.get(c.kind or '', c.kind)} B={c.batch_size}" + (
            f" m={c.local_steps}" if (c.local_steps or 1) > 1 else "")
        table.add_row(escape(names[c.capture.path]), kind, label, iacc, images,
                      f"[{STYLE[worst]}]{worst}[/]" if worst else "none")
    console.print(table)
    for f in sorted(report.findings, key=lambda f: -severity_rank(f.severity)):
        console.print(f"[{STYLE[f.severity]}]{f.severity:>8}[/] {f.rule} {escape(f.capture)}: {escape(f.title)}",
                      soft_wrap=True)
    for group in grouped_notices(report.notices):
        console.print(f"[yellow]note[/] {escape(notice_text(group))}", soft_wrap=True)
    if has_run(report):
        print_run(console, report)
    # the verdict again, last: where a CI log is read from
    if report.has_errors():
        console.print("[bold red]some captures could not be audited (exit 2)[/]")
    elif report.fail_on == "none":
        console.print(f"{_status('GATE OFF')}: {escape(verdict(report).headline)}")
    elif report.inconclusive():
        console.print(f"{_status('INCONCLUSIVE')}: a threat no attack could measure (GLEAK-NOT-ASSESSED; "
                      "--accept-unassessed lets it pass) (exit 1)")
    elif report.failed():
        console.print(f"[bold red]FAIL[/]: a finding at or above --fail-on {report.fail_on}"
                      + (f" --fail-rounds {report.fail_rounds}" if report.fail_rounds != "any" else "") + " (exit 1)")
    else:
        console.print(f"[bold green]PASS[/]: no finding at or above --fail-on {report.fail_on}"
                      + (f" --fail-rounds {report.fail_rounds}" if report.fail_rounds != "any" else ""))


AUDIT_COLUMNS = {"image": ("labels", "iAcc/chance", "images"), "text": ("tokens", "recall/chance", "sentences"),
                 "both": ("labels/tokens", "iAcc|recall/chance", "images/sentences")}


def _audit_columns(captures: Sequence[CaptureReport]) -> tuple[str, str, str]:
    """The audit table's three middle columns, named for what the captures are: an image classifier's (labels,
    iAcc, images), a language model's (tokens, token recall, sentences), or both in one audit."""
    kinds = {c.tokens is not None for c in captures if c.status != "error"}
    return AUDIT_COLUMNS["both" if kinds == {True, False} else "text" if kinds == {True} else "image"]


def _token_cells(c: CaptureReport) -> tuple[str, str, str]:
    """A language model's capture in the audit table: (the best token attack, its recall / chance recall against
    the truth, or expected from twin batches; the sentence attack in a few words)."""
    best = c.best_tokens()
    if best is not None:
        scores = best.scores or {}
        return best.attack, f"{scores['recall']:.2f}/{scores.get('chance_recall', 0.0):.2f}", _sentence_cell(c)
    expected = c.expected_tokens or {}
    recall, chance = _mean_of(expected.get("recall")), _mean_of(expected.get("chance_recall"))
    if recall is not None:
        return (f"{expected.get('attack', 'tokens')} expected",
                f"{recall:.2f}/" + (f"{chance:.2f}" if chance is not None else "—"), _sentence_cell(c))
    ran = [t.attack for t in c.tokens or [] if t.status == "ok"]
    return ("no truth" if ran and c.truth is None else "none scored"), "—", _sentence_cell(c)


def _mean_of(value: Any) -> float | None:
    """A number, or the mean of a {mean, min, max} summary (twin batches), else None."""
    if isinstance(value, Mapping):
        value = value.get("mean")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _sentence_cell(c: CaptureReport) -> str:
    """The sentence reconstruction of a language model's capture in a few words: ROUGE-1 against the truth or
    expected from twins, else its status."""
    entry = c.sentences
    if entry is None:
        return "—"
    if entry.status != "ok":
        return f"{entry.attack} {STATUS_WORDS.get(entry.status, entry.status)}"
    if entry.scores and entry.scores.get("rouge1") is not None:
        return f"{entry.attack} ROUGE-1 {entry.scores['rouge1']:.2f}"
    rouge1 = _mean_of((entry.expected or {}).get("rouge1"))
    if rouge1 is not None:
        return f"{entry.attack} expected ROUGE-1 {rouge1:.2f}"
    return f"{entry.attack} {entry.sequences} unscored"


def _status(status: str) -> str:
    """The verdict word, styled: FAIL and ERROR red, INCONCLUSIVE yellow, PASS green, GATE OFF plain (never
    green)."""
    style = {"FAIL": "bold red", "ERROR": "bold red", "INCONCLUSIVE": "bold yellow", "PASS": "bold green"}.get(
        status, "bold")
    return f"[{style}]{status}[/]"


def print_inspect(console: Console, report: InspectReport, verbose: bool,
                  meanings: Mapping[str, str] | None = None) -> None:
    """`gleak inspect`: the capture, the model check, the last layer, the metadata (with -v what each key
    means), the attacks that apply and (with -v) every tensor."""

    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("kind", report.kind)
    summary.add_row("tensors", f"{report.num_tensors} ({report.num_parameters:,} parameter values)")
    summary.add_row("batch size", str(report.batch_size if report.batch_size is not None else "unknown"))
    summary.add_row("local steps", str(report.local_steps))
    summary.add_row("ground truth", report.truth_file or "none found")
    model = report.model
    if model is not None:
        match = {None: "[yellow]the capture records no model hash[/]",
                 True: "[green]weights match the capture's model[/]",
                 False: "[red]weights differ from the model the capture was made with "
                        "(--allow-model-mismatch)[/]"}[model.matches_capture]
        summary.add_row("model", f"{model.file} ({model.source})")
        summary.add_row("", match)
        if model.mode is not None:
            summary.add_row("", escape(model.mode.note))
    console.print(Panel(summary, title=f"gleak inspect — {report.file}", expand=False))

    layer = report.last_layer
    table = Table(title="Last fully-connected layer", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("layer", layer.name)
    table.add_row("weight", f"{layer.weight_key}  {layer.weight_shape}  (C = {layer.num_classes}, "
                  f"d = {layer.feature_dim})")
    table.add_row("bias", layer.bias_key or "none")
    table.add_row("why", layer.reason)
    console.print(table)

    meta = Table(title="Metadata", title_justify="left")
    meta.add_column("key", style="cyan")
    meta.add_column("value")
    if verbose:
        meta.add_column("meaning", style="dim")
    for key, value in report.metadata.items():
        meta.add_row(key, _short(value), *([(meanings or {}).get(key, "")] if verbose else []))
    for key, value in report.unknown_metadata.items():
        meta.add_row(key, _short(value), *(["[yellow]unknown key, kept as is[/]"] if verbose else []))
    if report.unknown_metadata and not verbose:
        meta.caption = f"{len(report.unknown_metadata)} unknown key(s) kept as is (last rows); -v explains each key"
    console.print(meta)

    if report.attacks:
        attacks = Table(title="Attacks (with --aux where needed)", title_justify="left", show_header=False)
        attacks.add_column(style="bold")
        attacks.add_column()
        for name, reason in report.attacks.items():
            attacks.add_row(name, "[green]applies[/]" if reason is None else f"[dim]not applicable: {reason}[/]")
        console.print(attacks)

    if verbose:
        tensors = Table(title="Tensors", title_justify="left")
        tensors.add_column("name")
        tensors.add_column("shape")
        tensors.add_column("dtype")
        for t in report.tensors:
            tensors.add_row(t.name, str(t.shape), t.dtype)
        console.print(tensors)


def _short(value: Any, limit: int = 70) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def print_train_generator(console: Console, r: TrainGeneratorReport) -> None:
    """`gleak train-generator`: the file written, the model and layer, the data, the training and its scores."""
    s = r.settings
    ex = r.examples
    train = f"{s.epochs} epoch{'s' if s.epochs != 1 else ''} on pixel MSE"
    if s.loss == "rgla":
        train += f" + {s.finetune_epochs} rgla fine-tune"
    train += f" (batch {s.batch_size}, lr {s.lr:g}, seed {s.seed}): final train loss {r.train_loss:.4e}"
    if r.heldout_psnr is not None:
        held = f"MSE {r.heldout_mse:.4e}, PSNR {r.heldout_psnr:.2f} dB"
        if r.baseline_psnr is not None:
            held += f" (mean-image baseline {r.baseline_psnr:.2f} dB)"
    else:
        held = "—"
    threads = f"{r.threads} thread{'s' if r.threads != 1 else ''}"
    rows = [
        ("wrote", r.file),
        ("model", f"{r.model} (weights sha256 {r.model_sha256[:12]}…)"),
        ("layer", f"{r.layer}: {r.feature_dim} features → {r.num_classes} classes"),
        ("images", f"{r.image_shape} from {r.aux}: {ex.train} train, {ex.heldout} held out"),
        ("training", train),
        ("held-out", held),
        ("time", f"{r.seconds:.1f} s training ({r.total_seconds:.1f} s in all) on {r.device}, {threads}"),
    ]
    for key, value in rows:
        console.print(f"[bold]{key:<9}[/] {escape(value)}", soft_wrap=True)
    for note in r.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def print_defenses(console: Console, rows: Sequence[DefenseInfo]) -> None:
    """`gleak defenses`: one row per defense with what it does, its source and its options (with defaults)."""
    from gleak.registry import format_default

    table = Table(title="gleak defenses", title_justify="left")
    for col in ("defense", "acts on", "what it does / source"):
        table.add_column(col, overflow="fold")
    for r in rows:
        options = "".join(f"\n[cyan]{escape(o.name)}={escape(format_default(o.default))}[/]"
                          + (" [bold](strength)[/]" if o.name == r.strength else "")
                          + f"  {escape(o.help)}" for o in r.options)
        acts = "training (DP-SGD)" if r.kind == "training" else "the contribution"
        table.add_row(f"[bold]{r.name}[/]", acts, f"{escape(r.summary)}\n[dim]{escape(r.source)}[/]{options}")
    console.print(table)
    console.print("[dim]spec: --defense NAME[:KEY=VALUE,...] (gleak defend, gleak simulate)[/]")


def print_attacks(console: Console, rows: Sequence[AttackInfo]) -> None:
    """`gleak attacks`: one row per attack with its task, needs, summary, paper and options (with defaults)."""
    from gleak.registry import format_default

    table = Table(title="gleak attacks", title_justify="left")
    for col in ("attack", "task", "needs", "what it does / paper"):
        table.add_column(col, overflow="fold")
    for r in rows:
        options = "".join(f"\n[cyan]{escape(o.name)}={escape(format_default(o.default))}[/]  "
                          f"{escape(o.help)}" for o in r.options)
        table.add_row(f"[bold]{r.name}[/]", r.task, ", ".join(r.requires),
                      f"{escape(r.summary)}\n[dim]{escape(r.paper)}[/]{options}")
    console.print(table)
    console.print("[dim]set an option with -O ATTACK.KEY=VALUE (gleak labels, gleak reconstruct)[/]")


EXACT_DB = 40.0  # a copy of the example, not a likeness: float32 rounding of an exact inversion sits far above

VERDICT_STYLE = {"clean": "green", "suspicious": "yellow", "flagged": "bold red"}


def print_check_model(console: Console, report: CheckModelReport) -> None:
    """`gleak check-model`: the verdict, one row per finding (layer, structure, statistic against threshold and
    the honest value), and what was not checked."""
    style = VERDICT_STYLE[report.verdict]
    console.print(f"[{style}]{report.verdict.upper()}[/]  {escape(report.model)}  "
                  f"[dim]({escape(report.source)}; {report.layers} layers, {report.parameters:,} parameters, "
                  f"{report.seconds:.1f} s)[/]")
    if report.findings:
        table = Table(title="Structures a malicious server plants (GLEAK-SERVER-*)", title_justify="left")
        for column in ("tier", "finding", "layer", "measured (threshold)"):
            table.add_column(column, overflow="fold")
        for f in report.findings:
            table.add_row(f"[{'red' if f.tier == 'trap' else 'yellow'}]{f.tier}[/]",
                          escape(f.rule.removeprefix("GLEAK-SERVER-")), escape(f.layer),
                          f"{fmt_number(f.measured, 3, trim=True)} {escape(f.metric)} "
                          f"({fmt_number(f.threshold, 3, trim=True)})")
        console.print(table)
        for f in report.findings:
            console.print(f"  - {escape(f.title)} [dim](honest models: {escape(f.null)})[/]")
    else:
        console.print("No structure of the known server attacks was found (this is not proof that the model is "
                      "safe).")
    p = report.probe
    if p is not None:
        if p.reason:
            console.print(f"data test on {escape(p.data)}: not measured ({escape(p.reason)})")
        else:
            console.print(f"data test on {escape(p.data)}: a server could copy [bold]{p.copied} of {p.batch}[/] of "
                          f"your examples exactly from {escape(p.layer or '')} (share {p.share:.2f})")
    for note in report.notes:
        console.print(f"[dim]note: {escape(note)}[/]")
