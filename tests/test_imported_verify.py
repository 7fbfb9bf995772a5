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


class NewMappings(torch.nn.Module):
    """Issue 23's mappings in one model: a depthwise convolution, a squeeze-excitation gate
    (a broadcast product), a 1-D convolution and a fused projection split 4 + 2 + 2."""

    def __init__(self):
        super().__init__()
        self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.gate = torch.nn.Conv2d(8, 8, 4)
        self.conv1d = torch.nn.Conv1d(8, 8, 3, padding=1)
        self.fused = torch.nn.Linear(16, 8 * 4, bias=False)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.depthwise(x)
        y = y * torch.sigmoid(self.gate(y))  # (b, 8, 4, 4) * (b, 8, 1, 1)
        y = self.conv1d(y.flatten(2))  # (b, 8, 16)
        parts = self.fused(y).view(y.shape[0], 8, 8, 4)
        q, k = parts[:, :, :4], parts[:, :, 4:6]
        return self.out(q.flatten(2)) + self.out(torch.cat((k, k), 2).flatten(2))


def test_the_new_mappings_run_sharded_with_the_same_numbers():
    net = pase.from_torch(NewMappings(), (torch.randn(8, 8, 4, 4),), name="new_mappings")
    ops = [layer.op for layer in net.layers]
    assert "Unstack" in ops and any(layer.args.get("groups") for layer in net.layers)
    assert any(layer.op == "Elementwise" and layer.inputs[0].shape != layer.inputs[1].shape for layer in net.layers)
    found = pase.plan(net, 4, pase.Machine(10.0, 16000.0))
    result = verify(found)
    assert result.ok, result.table()
