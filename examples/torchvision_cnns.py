"""Model factories for ``pase -g torch:examples/torchvision_cnns.py:NAME``: torchvision CNNs.

Each ``NAME(batch)`` returns ``(module, args)``: the network with random weights
(``weights=None``, nothing downloaded), built on the ``meta`` device so that no weight is
allocated, and an image batch of the size the built-in graph of the same name uses.
Copy one and change the model or the input to plan your own.
"""

import torch
import torchvision


def alexnet(batch):
    """torchvision AlexNet on 227 x 227 images (the built-in ``alexnet``'s input size)."""
    with torch.device("meta"):
        model = torchvision.models.alexnet(weights=None)
        images = torch.empty(batch, 3, 227, 227)
    return model, (images,)


def resnet101(batch):
    """torchvision ResNet-101 on 227 x 227 images, as the built-in ``resnet101``."""
    with torch.device("meta"):
        model = torchvision.models.resnet101(weights=None)
        images = torch.empty(batch, 3, 227, 227)
    return model, (images,)


def inception_v3(batch):
    """torchvision Inception v3 on 299 x 299 images, without the auxiliary classifier."""
    with torch.device("meta"):
        model = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False)
        images = torch.empty(batch, 3, 299, 299)
    return model, (images,)


def resnet18_small(batch):
    """torchvision ResNet-18 on 32 x 32 images, 10 classes: a CNN small enough to run sharded on a laptop."""
    with torch.device("meta"):
        model = torchvision.models.resnet18(weights=None, num_classes=10)
        images = torch.empty(batch, 3, 32, 32)
    return model, (images,)


def densenet121(batch):
    """torchvision DenseNet-121 on 224 x 224 images: its dense blocks put the exact search out of
    reach (dependent sets of 25); plan it with ``--approx``."""
    with torch.device("meta"):
        model = torchvision.models.densenet121(weights=None)
        images = torch.empty(batch, 3, 224, 224)
    return model, (images,)
