"""The typed reading of a Hugging Face ``config.json``'s fields, shared by the readers of every
model type (``pase.sources.hf``, ``hf_types``, ``hf_moe``): each error names the file and the field.
"""

from __future__ import annotations

import json
import math

from pase.core.fileio import InputError

__all__ = ["ACTIVATIONS", "DEFAULT_SEQUENCE", "Fields", "block_count", "sequence_length", "shown"]

#: Sequence length when ``-m`` is not given (capped by the config's maximum position).
DEFAULT_SEQUENCE = 2048

#: Activations of the MLP (``hidden_act`` / ``activation_function``); each is one point-wise
#: operation of the projection it follows, whatever its formula.
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python",
               "quick_gelu", "relu", "relu2", "tanh", "sigmoid")


def shown(value) -> str:
    """A field's value as the messages quote it: its JSON, cut at 60 characters."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Fields:
    """Typed access to the fields of one config, every error naming the file and the field."""

    def __init__(self, data: dict, source: str):
        self.data = data
        self.source = source
        #: Fields that change the network and are not modelled, one line each.
        self.notes: list = []

    def fail(self, message: str):
        raise InputError(f"hf config {self.source}: {message}")

    def _get(self, key: str, default, required: bool):
        if key not in self.data or (self.data[key] is None and not required):
            if required:
                self.fail(f"{key} is missing")
            return default, False
        return self.data[key], True

    def positive(self, key: str, default=None, required: bool = True, condition: str = "") -> int:
        value, given = self._get(key, default, required)
        if not given:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.fail(f"{key} must be a positive integer{condition}, got {shown(value)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value, given = self._get(key, default, False)
        if given and not isinstance(value, bool):
            self.fail(f"{key} must be true or false, got {shown(value)}")
        return value

    def number(self, key: str) -> None:
        """A positive finite number if present (an epsilon): checked, not used."""
        value, given = self._get(key, None, False)
        if given and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                      or value <= 0):
            self.fail(f"{key} must be a positive number, got {shown(value)}")

    def choice(self, key: str, default: str, choices) -> str:
        value, given = self._get(key, default, False)
        if given and value not in choices:
            self.fail(f"{key} {shown(value)} is not supported; supported: {', '.join(choices)}")
        return value


def block_count(fields: Fields, key: str) -> int:
    """The block count, at most the decoder's ``MAX_LAYERS`` (checked before any per-block field is read)."""
    from graphs.decoder import MAX_LAYERS

    layers = fields.positive(key)
    if layers > MAX_LAYERS:
        fields.fail(f"{key} must be at most {MAX_LAYERS} (the largest published decoders have about 128), "
                    f"got {layers}")
    return layers


def sequence_length(fields: Fields, sequence, maximum_key: str, learned: bool) -> int:
    """The sequence length: ``-m`` (``sequence``), checked against the config's maximum position
    when positions are learned; by default :data:`DEFAULT_SEQUENCE` capped by that maximum."""
    maximum = fields.positive(maximum_key, required=learned)
    if sequence is None:
        return DEFAULT_SEQUENCE if maximum is None else min(maximum, DEFAULT_SEQUENCE)
    if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 1:
        raise ValueError(f"the sequence length (-m) must be a positive integer, got {sequence!r}")
    if learned and sequence > maximum:
        # The file is fine; the command line asks for more than it has (exit 2, not 1).
        raise ValueError(f"hf config {fields.source}: -m {sequence} is longer than its {maximum} learned positions "
                         f"({maximum_key})")
    return sequence
