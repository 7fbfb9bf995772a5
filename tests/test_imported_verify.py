"""An imported PyTorch model, planned and then run sharded under JAX (the import and the
verification issues together). Runs where both extras are installed, as in CI."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pase  # noqa: E402
from pase.outputs.jax.verify import verify  # noqa: E402


class SmallCNN(torch.nn.Module):
    """Conv, batch norm, ReLU, pooling, a residual add, then a classifier: the CNN layer types."""

    def __init__(self):
        super().__init__()
        # No bias before the batch norm: it removes the bias, whose gradient is then rounding noise.
        self.conv = torch.nn.Conv2d(4, 32, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(32)
        self.conv2 = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(32, 64)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = y + self.conv2(y)
        return self.fc(torch.flatten(self.pool(y), 1))


def test_an_imported_model_runs_sharded_with_the_same_numbers():
    net = pase.from_torch(SmallCNN(), (torch.randn(32, 4, 16, 16),), name="small_cnn")
    found = pase.plan(net, 4, pase.Machine(10.0, 16000.0))  # fast links: splitting pays off
    result = verify(found)
    assert result.ok, result.table()
    # Some layer is really split, so the run exercises sharding, not replicas only.
    assert any(max(c) > 1 for c in found.configs)
