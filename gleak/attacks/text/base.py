"""What every sentence-reconstruction attack shares: the task, and the checks that it can run at all (a model to
recompute inputs with, a decoder trained on next-token loss unless the attack reads classifiers too)."""

from __future__ import annotations

from typing import ClassVar

from gleak.attacks.base import NO_INPUTS, Attack, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.requirements import Requirements


class SentenceAttack(Attack):
    """Base of the ``text`` attacks. Subclasses add their own checks through :meth:`sentence_problem`."""

    task = "text"
    requires: ClassVar[Requirements] = Requirements(needs_text=True, gradient_view=False, needs_batch_size=False)
    not_causal: ClassVar[str] = "needs a decoder trained on next-token loss (this capture is a classifier's)"
    reads_classifiers: ClassVar[bool] = False  # also reads sequence classifiers' captures

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason:
            return reason
        if ctx.model is None:
            return "needs the model (--model DIR, the Hugging Face folder the capture was made with)"
        spec = ctx.text_model
        if spec is not None and spec.task != "causal_lm" and not self.reads_classifiers:
            return self.not_causal
        return self.sentence_problem(ctx)

    def sentence_problem(self, ctx: Context) -> str | None:
        """Why this attack cannot read ``ctx`` beyond the shared checks (one line), or None."""
        return None
