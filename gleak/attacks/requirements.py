"""What an attack needs from a capture and its model: :class:`Requirements`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, frozen=True)
class Requirements:
    """What an attack needs. Hard needs make it not applicable (with a reason); soft ones only warn."""

    kinds: frozenset[str] = frozenset({"gradient", "update"})
    gradient_view: bool = True  # needs ∇W as one step's gradient: a gradient, or a one-step SGD update
    needs_bias: bool = False
    needs_model: bool = False  # the global model's weights (e.g. to evaluate the last layer)
    needs_model_forward: bool = False
    needs_batch_forward: bool = False  # runs the model on the client's whole batch at once (gradient matching)
    needs_aux: bool = False
    single_sample: bool = False
    needs_batch_size: bool = True
    needs_nonneg_features: bool = False  # soft: the result is marked when the features go negative
    needs_text: bool = False  # a language model's capture (token batches): the token attacks

    def describe(self) -> list[str]:
        out = []
        if self.kinds == frozenset({"update"}):
            out.append("update")
        elif self.gradient_view:
            out.append("gradient or 1-step update")
        else:
            out.append("gradient or update (any steps)")
        for flag, text in ((self.needs_bias, "bias"), (self.needs_model, "model"),
                           (self.needs_model_forward, "model forward"),
                           (self.needs_batch_forward, "forward of the whole batch"),
                           (self.needs_aux, "aux data"), (self.single_sample, "B = 1"),
                           (self.needs_batch_size, "known B"),
                           (self.needs_text, "text capture"), (self.needs_nonneg_features, "features ≥ 0 (soft)")):
            if flag:
                out.append(text)
        return out
