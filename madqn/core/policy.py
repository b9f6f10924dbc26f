"""Q-values for acting: every agent of one env step (all env copies) in one batched forward.

With a shared network the rows of all agents go through it together, each with its agent id. With
independent networks of one architecture the per-agent parameters are STACKED, (G, ...) tensors
whose slices ARE the learners' parameters (each ``nn.Parameter`` is rebound to a view of its
slice), and ``torch.func.vmap`` evaluates all G networks in one call: optimizer steps and
checkpoint loads write through the views, so acting always sees the current weights without a
copy. Learners whose networks differ in shape are evaluated one after another.

``snapshot=True`` (overlap mode, where a learner thread updates the weights while the actor acts)
gives the actor its own copy instead, refreshed by :meth:`ActingNetworks.refresh` under a lock
after every learning round, so a forward never reads half-updated weights.
"""

from __future__ import annotations

import copy
import threading
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap


def _same_architecture(networks: Sequence[nn.Module]) -> bool:
    first = networks[0]
    shapes = [(n, p.shape, p.dtype, p.device) for n, p in first.named_parameters()]
    return all(type(net) is type(first) and not list(net.buffers())
               and [(n, p.shape, p.dtype, p.device) for n, p in net.named_parameters()] == shapes
               for net in networks)


class StackedNetworks:
    """G networks of one architecture as one vmapped function over stacked parameters.

    ``bind=True`` rebinds every network's parameters to views of the stacked tensors (zero-copy,
    always current); ``bind=False`` keeps a separate copy, updated by :meth:`copy_from`.
    ``__call__(x_GB..., agent_ids=None)`` returns (G, B, n_actions): row b of group g through
    network g, exactly what ``networks[g](x[g])`` computes (up to float summation order).
    """

    def __init__(self, networks: Sequence[nn.Module], *, bind: bool = True):
        if not networks or not _same_architecture(networks):
            raise ValueError("StackedNetworks needs networks of one architecture without buffers")
        self.networks = list(networks)
        self.names = [n for n, _ in networks[0].named_parameters()]
        self.base = copy.deepcopy(networks[0]).to("meta")  # structure only; weights come from params
        with torch.no_grad():
            self.params = {n: torch.stack([dict(net.named_parameters())[n].detach() for net in networks])
                           for n in self.names}
        self.bound = bind
        if bind:
            self.rebind()
        self._forward = vmap(self._one, in_dims=(0, 0))

    def _one(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(self.base, params, (x,))

    def rebind(self) -> None:
        """Make every network parameter a view of its stacked slice (after anything replaced .data)."""
        for g, net in enumerate(self.networks):
            for name, p in net.named_parameters():
                view = self.params[name][g]
                if p.data_ptr() != view.data_ptr():
                    view.copy_(p.detach())
                    p.data = view

    def is_bound(self) -> bool:
        return all(p.data_ptr() == self.params[name][g].data_ptr()
                   for g, net in enumerate(self.networks) for name, p in net.named_parameters())

    def copy_from(self, networks: Sequence[nn.Module]) -> None:
        with torch.no_grad():
            for g, net in enumerate(networks):
                for name, p in net.named_parameters():
                    self.params[name][g].copy_(p, non_blocking=True)

    def one(self, g: int, x: Tensor) -> Tensor:
        """Network g alone on (B, ...) inputs."""
        with torch.no_grad():
            return functional_call(self.base, {n: t[g] for n, t in self.params.items()}, (x,))

    def __call__(self, x_GB: Tensor) -> Tensor:
        with torch.no_grad():
            return self._forward(self.params, x_GB)


class ActingNetworks:
    """Acting-side view of the learners' online networks: ``q_values`` for any rows of any groups."""

    def __init__(self, networks: Sequence[nn.Module], device: torch.device, *, snapshot: bool = False):
        self.device = torch.device(device)
        self.snapshot = snapshot
        self.lock = threading.Lock()
        self.sources = list(networks)
        self.stacked: StackedNetworks | None = None
        if len(networks) > 1 and _same_architecture(networks) and getattr(networks[0], "n_agents", 0) == 0:
            self.stacked = StackedNetworks(networks, bind=not snapshot)
            self.networks = self.stacked.networks
        else:
            self.networks = [copy.deepcopy(n).requires_grad_(False) for n in networks] if snapshot else list(networks)
        self.uses_ids = [getattr(n, "n_agents", 0) > 0 for n in self.networks]

    def refresh(self) -> None:
        """Snapshot mode: copy the learners' current weights into the acting copy (call after updates)."""
        if not self.snapshot:
            return
        with self.lock, torch.no_grad():
            if self.stacked is not None:
                self.stacked.copy_from(self.sources)
            else:
                for dst, src in zip(self.networks, self.sources):
                    for pd, ps in zip(dst.parameters(), src.parameters()):
                        pd.copy_(ps, non_blocking=True)

    def q_values(self, states: np.ndarray, groups: np.ndarray, agent_ids: np.ndarray) -> np.ndarray:
        """Q-values (N, n_actions) as float32 numpy for N states (uint8 stacks) of the given groups."""
        groups = np.asarray(groups, dtype=np.int64)
        x = torch.from_numpy(np.ascontiguousarray(states))
        if self.device.type == "cuda":
            x = x.pin_memory()
        x = x.to(self.device, non_blocking=True)  # frames cross to the device as uint8
        present = np.unique(groups)
        with self.lock, torch.no_grad():
            if self.stacked is not None and len(present) > 1:
                q = self._stacked_q(x, groups)
            elif len(present) == 1:
                q = self._forward_group(int(present[0]), x, agent_ids)
            else:  # networks of different shapes: one forward each
                q = [None] * len(groups)
                for g in present:
                    rows = np.flatnonzero(groups == g)
                    q_g = self._forward_group(int(g), x[torch.as_tensor(rows, device=self.device)], agent_ids[rows])
                    for k, row in enumerate(rows):
                        q[row] = q_g[k]
                q = torch.stack(q)
            return q.float().cpu().numpy()

    def _forward_group(self, g: int, x: Tensor, agent_ids: np.ndarray) -> Tensor:
        if self.stacked is not None:
            return self.stacked.one(g, x)
        ids = torch.as_tensor(agent_ids, device=self.device) if self.uses_ids[g] else None
        return self.networks[g](x, ids)

    def _stacked_q(self, x: Tensor, groups: np.ndarray) -> Tensor:
        """One vmapped forward: rows grouped per network, padded to the largest group with zeros."""
        n_groups = len(self.networks)
        counts = np.bincount(groups, minlength=n_groups)
        width = int(counts.max())
        order = np.argsort(groups, kind="stable")
        slot = np.empty(len(groups), dtype=np.int64)  # position of each row in its group's block
        slot[order] = np.arange(len(groups)) - np.repeat(np.cumsum(counts) - counts, counts)
        flat = torch.as_tensor(groups * width + slot, device=self.device)
        x_GB = x.new_zeros((n_groups * width, *x.shape[1:]))
        x_GB[flat] = x
        q_GB = self.stacked(x_GB.view(n_groups, width, *x.shape[1:]))
        return q_GB.reshape(n_groups * width, -1)[flat]
