"""The monkeypatches that connect torch to ``Instrumentation``; ``apply`` and ``remove``.

Every patched function passes straight through inside DataLoader worker processes
(``get_worker_info()`` is set there) and once the instrumentation is stopping. The patches
are grouped by what they patch: ``loader`` (the DataLoader and the training loop),
``comm_calls`` (DDP, the process group, collectives, host syncs), ``spawn`` (spawned ranks,
uncaught exceptions); ``registry`` holds what they share (what ``remove`` undoes, ``Hooks``).
"""

from __future__ import annotations

import inspect

from ddp_profile.profiler.rank.patches.comm_calls import (
    ddp_forward,
    ddp_init,
    make_lockstep,
    patch_collectives,
    process_group_destroy,
    process_group_init,
    watch_host_syncs,
)
from ddp_profile.profiler.rank.patches.loader import (
    iterator_next,
    loader_init,
    loader_iter,
    sampler_set_epoch,
    tensor_backward,
)
from ddp_profile.profiler.rank.patches.registry import Hooks, event_after, handles, originals, patch
from ddp_profile.profiler.rank.patches.spawn import install_excepthook, patch_spawn
from ddp_profile.profiler.rank.windows import noting_dispatch


def is_applied() -> bool:
    return bool(originals)


def apply(instr: Hooks) -> None:
    """Install every patch for ``instr`` (an ``instrument.Instrumentation``)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DataParallel, DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader
    from torch.utils.data._utils import pin_memory as pin_module
    from torch.utils.data.dataloader import _BaseDataLoaderIter
    from torch.utils.data.distributed import DistributedSampler

    patch(DataLoader, "__init__", loader_init(instr, inspect.signature(DataLoader.__init__)))
    patch(DataLoader, "__iter__", loader_iter(instr))
    patch(_BaseDataLoaderIter, "__next__", iterator_next(instr))
    if instr.screen.replays:  # a pass may be continued
        patch(_BaseDataLoaderIter, "_next_index", noting_dispatch)
    patch(torch.Tensor, "backward", tensor_backward(instr))
    patch(DistributedDataParallel, "__init__",
          ddp_init(instr, inspect.signature(DistributedDataParallel.__init__)))
    patch(DistributedDataParallel, "forward", ddp_forward(instr, make_lockstep(dist.all_reduce)))
    patch(DataParallel, "__init__", event_after(instr, "data_parallel"))
    patch(DistributedSampler, "set_epoch", sampler_set_epoch(instr))
    patch(pin_module, "pin_memory", instr.pin_meter.wrap)  # pin thread and loop alike
    if dist.is_available():
        patch(dist, "init_process_group", process_group_init(instr, dist))
        patch(dist, "destroy_process_group", process_group_destroy(instr))
        patch_collectives(instr, dist)
    patch_spawn(instr)
    handles.append(register_optimizer_step_post_hook(instr.on_optimizer_step))
    install_excepthook(instr)


def remove() -> None:
    """Undo every patch (used by tests; a probe's process simply exits)."""
    while originals:
        owner, name, original = originals.pop()
        setattr(owner, name, original)
    while handles:
        handles.pop().remove()


__all__ = ["Hooks", "apply", "is_applied", "remove", "watch_host_syncs"]
