"""``gather`` is refused in one line either way, for the reason that applies: positions a
batch-dependent tensor gives are data-dependent; positions a constant table gives (DeBERTa's
relative-position lookup) are not, but no PaSE layer reads at arbitrary positions."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pase.sources.torch.importer import UnmappableOpsError, from_torch  # noqa: E402

from test_torch_import import Lambda  # noqa: E402


def _refusal(forward) -> str:
    model = Lambda(forward, fc=nn.Linear(8, 8), head=nn.Linear(8, 3))
    with pytest.raises(UnmappableOpsError) as info:
        from_torch(model, (torch.randn(4, 8),))
    message = str(info.value)
    assert "\n" not in message and [op for op, *_ in info.value.ops] == ["aten.gather"]
    return message


def test_a_gather_by_a_constant_table_says_it_is_not_data_dependent():
    def forward(m, x):
        positions = (torch.arange(8).flip(0)).expand(4, 8)  # the same for every example
        return m.head(torch.gather(m.fc(x), 1, positions))

    message = _refusal(forward)
    assert "constant index table" in message and "not data-dependent" in message
    assert "position_ids" not in message


def test_a_gather_by_batch_dependent_positions_is_data_dependent():
    def forward(m, x):
        positions = (x.abs() * 7).long().clamp(0, 7)  # computed from the input's values
        return m.head(torch.gather(m.fc(x), 1, positions))

    message = _refusal(forward)
    assert "batch-dependent tensor: data-dependent" in message and "constant" not in message
