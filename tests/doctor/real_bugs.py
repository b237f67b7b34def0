"""Real CPU bugs of torches in the window, each inside one submodule of a small model (builders
in the ``bench --model`` contract). Which torch shows which bug was checked here; the tests pin
the verdict per torch, since fixes land.

- ``build_pad_matmul`` (pytorch #196681): GELU, two pads and a broadcast matmul on a
  ``channels_last`` tensor 66 wide. Inductor's 2-D tiled reduction writes past its buffer:
  torch 2.10.0 dies (SIGABRT, "free(): invalid pointer"); 2.13.0 and 2.15.0 give a forward 20
  off and then abort at exit ("double free or corruption").
- ``build_channels_last_pool`` (pytorch #197888): ``adaptive_max_pool3d`` backward on a
  ``channels_last_3d`` input: the forward is equal, the gradients are not (2.0 off) on torch
  2.13.0; equal on 2.10.0 and 2.15.0.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class PadMatmul(nn.Module):
    """The model's only pad and matmul (pytorch #196681)."""

    def forward(self, x):
        v = (x * 0.5) * (torch.erf(x * 0.7071067811865476) + 1)
        p = F.pad(v.permute(3, 2, 1, 0), (0, 0, 0, 58), value=0.5)
        q = F.pad(v, (0, 0, 0, 0, 0, 58), value=0.5)
        return torch.matmul(q, p)


class PadMatmulModel(nn.Module):
    """A 1x1 convolution (channels_last in, channels_last out), the pad-matmul, a mean as loss."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(8, 8, 1)
        self.mix = PadMatmul()

    def forward(self, x):
        return {"loss": self.mix(self.stem(x)).square().mean()}


def _channels_last_batch(step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(1, 8, 66, 66, generator=gen)
    return {"x": x.contiguous(memory_format=torch.channels_last)}


def build_pad_matmul():
    return PadMatmulModel(), _channels_last_batch


class ChannelsLastPool(nn.Module):
    """The model's only pooling (pytorch #197888)."""

    def forward(self, x):
        return F.adaptive_max_pool3d(x.contiguous(memory_format=torch.channels_last_3d), (3, 3, 3))


class PoolModel(nn.Module):
    """A linear layer, the channels-last pooling, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 6)
        self.pool = ChannelsLastPool()
        self.head = nn.Linear(27, 1)

    def forward(self, x, y):
        h = self.pool(self.stem(x))
        out = self.head(h.flatten(2)).squeeze(-1)
        return {"loss": F.mse_loss(out, y)}


def _pool_batch(step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return {"x": torch.randn(2, 3, 6, 6, 6, generator=gen), "y": torch.randn(2, 3, generator=gen)}


def build_channels_last_pool():
    return PoolModel(), _pool_batch
