"""loadtune's view of ``peers_train.py``: the same dataset, model and step as a workload file.

loadtune builds its own DataLoader (``get_workload() -> loadtune.Workload``) in one process.
The workload's arguments come from ``PEERS_WORKLOAD_ARGS`` (the ``peers_train.py`` command-line
arguments of the workload, as one JSON list), so one file serves every workload.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peers_train  # noqa: E402


def _args():
    return peers_train.parse_args(json.loads(os.environ.get("PEERS_WORKLOAD_ARGS", "[]")))


def _train_step(model, optimizer, batch, device):
    x, y = (t.to(device) for t in batch)
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def get_workload():
    """The workload loadtune tunes."""
    import loadtune

    args = _args()
    return loadtune.Workload(
        name="peers_train", make_dataset=lambda: peers_train.make_dataset(args),
        make_model=lambda: peers_train.make_model(args), train_step=_train_step,
        make_optimizer=lambda model: torch.optim.SGD(model.parameters(), lr=0.01),
        default_batch_size=args.batch_size)
