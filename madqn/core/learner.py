"""The DQN3.0 Q update: targets/delta (getQUpdate), centred RMSProp, and the Learner that holds
the online network, its target copy and the optimizer.

The update is DQN3.0's gradient injection, not a loss: ``q_BA.backward(-targets_BA)`` where
``targets`` holds the clipped TD error at the taken action. The resulting ``.grad`` is
``-sum_i clip(delta_i) dQ(s_i, a_i)/dw``, i.e. the gradient of a SUMMED Huber loss (threshold
clip_delta), and the optimizer descends on it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from madqn.core.networks import DQN3ConvNet


def q_targets(
    q_all: Tensor,
    q2_all: Tensor,
    actions: Tensor,
    rewards: Tensor,
    terminals: Tensor,
    *,
    discount: float | Tensor,
    clip_delta: float,
    r_max: float = 1.0,
    rescale_r: bool = False,
    next_action_mask: Tensor | None = None,
    q2_online: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """DQN3.0 getQUpdate on a batch. Returns ``(targets_BA, delta_B, q2_max_B)``.

    q_all: Q(s, .) of the online net (B, A); q2_all: Q(s2, .) of the target net (B, A);
    actions (B,) long; rewards (B,) clipped rewards; terminals (B,) "s2 is terminal";
    discount a float or a (B,) tensor (one discount per row, e.g. gamma**k for n-step returns).
    q2_max = max over the (legal, if ``next_action_mask`` (B, A) bool is given) actions, 0 for a
    row with no legal action; delta = r [/ r_max] + discount * q2_max * (1 - term) - Q(s, a),
    clipped to [-clip_delta, clip_delta] when clip_delta > 0; targets is zero except
    targets[i, a_i] = clipped delta_i. The returned delta is the clipped one, q2_max the raw max
    (before discount and terminal masking). Never part of autodiff.

    Double DQN (van Hasselt et al. 2016): with ``q2_online`` (B, A), Q(s2, .) of the ONLINE net,
    the bootstrap value is q2_all[i, argmax_a q2_online[i, a]] over the legal actions instead of
    the max of q2_all (still 0 for a row with no legal action); q2_max is that value.
    """
    with torch.no_grad():
        q_all = q_all.detach()
        q2_all = q2_all.detach()
        actions_B1 = actions.long().view(-1, 1)
        mask_BA = None if next_action_mask is None else next_action_mask.to(torch.bool)
        chooser = q2_all if q2_online is None else q2_online.detach()
        if mask_BA is not None:
            chooser = chooser.masked_fill(~mask_BA, float("-inf"))
        if q2_online is None:
            q2_max = chooser.max(dim=1).values
        else:
            q2_max = q2_all.gather(1, chooser.argmax(dim=1, keepdim=True)).squeeze(1)
        if mask_BA is not None:
            q2_max = torch.where(mask_BA.any(dim=1), q2_max, torch.zeros_like(q2_max))
        not_term = 1.0 - terminals.to(q2_max.dtype)
        if isinstance(discount, Tensor):
            discount = discount.to(q2_max.dtype)
        q2 = discount * q2_max * not_term
        r = rewards.to(q2_max.dtype)
        if rescale_r:
            r = r / r_max
        q_sa = q_all.gather(1, actions_B1).squeeze(1)
        delta = r + q2 - q_sa
        if clip_delta > 0:
            delta = delta.clamp(-clip_delta, clip_delta)
        targets = torch.zeros_like(q_all)
        targets.scatter_(1, actions_B1, delta.view(-1, 1).to(targets.dtype))
    return targets, delta, q2_max


class DQN3RMSprop(torch.optim.Optimizer):
    """DQN3.0's centred RMSProp: no momentum, g and g2 start at 0, no bias correction, eps INSIDE
    the square root. Descends on ``.grad`` (= -dw of the Lua code):

        grad' = grad + weight_cost * p
        g  = decay g  + (1 - decay) grad'
        g2 = decay g2 + (1 - decay) grad'^2
        p -= lr * grad' / sqrt(g2 - g^2 + eps)

    Differs from ``torch.optim.RMSprop(centered=True)``, whose eps sits outside the root.
    """

    def __init__(self, params, lr: float = 2.5e-4, decay: float = 0.95, eps: float = 0.01, weight_cost: float = 0.0):
        if lr < 0:
            raise ValueError(f"invalid learning rate {lr}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"invalid decay {decay} (needs 0 <= decay < 1)")
        if eps <= 0:
            raise ValueError(f"invalid eps {eps} (needs > 0)")
        if weight_cost < 0:
            raise ValueError(f"invalid weight_cost {weight_cost}")
        super().__init__(params, dict(lr=lr, decay=decay, eps=eps, weight_cost=weight_cost))
        self.fused = False  # True: one compiled elementwise kernel per step (``compile = true``), see dqn3_rmsprop_
        self._scratch: dict[torch.Tensor, torch.Tensor] = {}  # per-parameter buffer for the denominator

    def __getstate__(self):
        return {**super().__getstate__(), "fused": self.fused}

    def __setstate__(self, state):  # copy.deepcopy / pickle: the scratch buffers are rebuilt, not copied
        super().__setstate__(state)
        self.fused = state.get("fused", False)
        self._scratch = {}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, gs, g2s, denoms = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("DQN3RMSprop does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["g"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["g2"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                denom = self._scratch.get(p)
                if denom is None or denom.shape != p.shape or denom.device != p.device:
                    denom = self._scratch[p] = torch.empty_like(p)  # reused: no fresh pages per step
                params.append(p)
                grads.append(p.grad)
                gs.append(state["g"])
                g2s.append(state["g2"])
                denoms.append(denom)
            if not params:
                continue
            dqn3_rmsprop_(params, grads, gs, g2s, denoms, lr=group["lr"], decay=group["decay"], eps=group["eps"],
                          weight_cost=group["weight_cost"], fused=self.fused)
        return loss


def dqn3_rmsprop_(params: list[Tensor], grads: list[Tensor], gs: list[Tensor], g2s: list[Tensor],
                  denoms: list[Tensor], *, lr: float, decay: float, eps: float, weight_cost: float,
                  fused: bool = False) -> None:
    """One DQN3.0 centred-RMSProp step on lists of tensors, in place (the maths of :class:`DQN3RMSprop`).

    ``fused=False``: PyTorch's foreach kernels, one pass over the parameters per operation (``denoms`` is
    scratch space). ``fused=True``: the same operations in the same order, compiled by ``torch.compile`` into
    one loop over each parameter (the learning rate passed as a tensor, so an annealed lr compiles once);
    equal to the foreach path up to float rounding of the compiled kernel (tests/test_compiled.py)."""
    if fused:
        _fused_rmsprop()(params, grads, gs, g2s, torch.tensor(lr, dtype=params[0].dtype, device=params[0].device),
                         decay, eps, weight_cost)
        return
    if weight_cost != 0:
        grads = torch._foreach_add(grads, params, alpha=weight_cost)
    torch._foreach_mul_(gs, decay)
    torch._foreach_add_(gs, grads, alpha=1.0 - decay)
    torch._foreach_mul_(g2s, decay)
    torch._foreach_addcmul_(g2s, grads, grads, value=1.0 - decay)
    torch._foreach_copy_(denoms, g2s)
    torch._foreach_addcmul_(denoms, gs, gs, value=-1.0)  # g2 - g^2
    torch._foreach_add_(denoms, eps)
    torch._foreach_sqrt_(denoms)
    torch._foreach_addcdiv_(params, grads, denoms, value=-lr)


def _rmsprop_elementwise(params, grads, gs, g2s, lr: Tensor, decay: float, eps: float, weight_cost: float) -> None:
    for p, grad, g, g2 in zip(params, grads, gs, g2s):
        if weight_cost != 0:
            grad = grad + weight_cost * p
        g.mul_(decay).add_(grad, alpha=1.0 - decay)
        g2.mul_(decay).addcmul_(grad, grad, value=1.0 - decay)
        p.add_(grad / (g2 - g * g + eps).sqrt() * -lr)


@functools.cache
def _fused_rmsprop():
    """The compiled kernel, built on first use (compiling needs a C++ compiler; eager runs never ask)."""
    return torch.compile(_rmsprop_elementwise, dynamic=False, fullgraph=True)


def lr_at(step: int, *, learn_start: int, lr_start: float, lr_end: float, lr_endt: int) -> float:
    """DQN3.0 learning-rate anneal: linear from lr_start to lr_end over lr_endt steps past learn_start."""
    if lr_endt <= 0:
        return lr_end
    t = max(0, step - learn_start)
    return (lr_start - lr_end) * max(0, lr_endt - t) / lr_endt + lr_end


def build_optimizer(params, name: str, *, lr: float | Tensor, decay: float = 0.95, eps: float = 0.01,
                    weight_cost: float = 0.0, adam_eps: float = 4.8e-3, capturable: bool = False) -> torch.optim.Optimizer:
    """``"rmsprop"``: DQN3.0's centred RMSProp (:class:`DQN3RMSprop`); ``"adam"``: Adam (Kingma & Ba
    2015) with ``adam_eps``; weight_cost is its L2 term.

    Both descend on the learner's SUMMED minibatch gradient, so their eps is on that scale. Adam's step
    is invariant to the gradient's scale except through eps: Adam with eps on the sum of B gradients is
    Adam with eps / B on their mean. Rainbow's eps 1.5e-4 (on its mean loss, B = 32) is therefore
    ``adam_eps`` 4.8e-3 here; 1.5e-4 here would be 32 times smaller than Rainbow's. ``capturable``: Adam's
    CUDA-graph-safe variant (its step count on the device; ``lr`` may then be a device tensor)."""
    if name == "rmsprop":
        return DQN3RMSprop(params, lr=lr, decay=decay, eps=eps, weight_cost=weight_cost)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, eps=adam_eps, weight_decay=weight_cost, capturable=capturable)
    raise ValueError(f"unknown optimizer {name!r}: expected 'rmsprop' or 'adam'")


def bf16_supported(device: torch.device) -> bool:
    """Whether the device runs bfloat16 matmuls natively (CUDA compute capability >= 8.0, or a CPU
    with AVX512-BF16 / AMX), which is what ``precision = "auto"`` asks for."""
    return _bf16_support(device) is not None


def _bf16_support(device: torch.device) -> str | None:
    """What makes bf16 native on ``device`` (for the run's first line), or None."""
    if device.type == "cuda":
        return "this GPU has bf16 tensor cores" if _cuda_bf16_native(device) else None
    if device.type == "cpu":
        try:
            flags = set(open("/proc/cpuinfo").read().split())
        except OSError:
            return None
        found = [name for flag, name in (("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX-BF16")) if flag in flags]
        return f"this CPU has {' and '.join(found)}" if found else None
    return None


def _cuda_bf16_native(device: torch.device) -> bool:
    """Whether the GPU ``device`` (the learner's, not whichever is current) has bf16 tensor cores. torch's
    ``is_bf16_supported()`` asks the current device and, by default, counts emulation (pre-Ampere GPUs run
    bf16 slower than fp32), so it is asked with ``including_emulation=False`` with ``device`` selected."""
    if not torch.cuda.is_available():
        return False
    with torch.cuda.device(device):
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch < 2.3: no including_emulation; native means compute capability >= 8.0
            return torch.version.hip is not None or torch.cuda.get_device_capability(device)[0] >= 8


def resolve_precision(precision: str, device: torch.device) -> str:
    """``"fp32"``/``"bf16"`` as given; ``"auto"``: bf16 where the device supports it natively."""
    return describe_precision(precision, device)[0]


def describe_precision(precision: str, device: torch.device) -> tuple[str, str]:
    """``(resolved precision, why)`` for the run's first line, e.g. ``("bf16", "auto: this CPU has AVX512-BF16")``."""
    if precision != "auto":
        return precision, "set"
    support = _bf16_support(device)
    if support is not None:
        return "bf16", f"auto: {support}"
    return "fp32", f"auto: no native bf16 on {device.type}"


@contextlib.contextmanager
def cuda_fp32_precision(mode: str) -> Iterator[None]:
    """CUDA only: fp32 matmuls and cuDNN convolutions in ``mode`` ("tf32" or "ieee") inside the block,
    the process's previous settings restored after it. PyTorch's default runs cuDNN convolutions in
    TF32, so the fp32 learner asks for "ieee" (true fp32) and the bf16 one for "tf32" (what autocast
    leaves in fp32). Never entered on CPU."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9
        saved = matmul.fp32_precision, conv.fp32_precision
        matmul.fp32_precision = conv.fp32_precision = mode
        try:
            yield
        finally:
            matmul.fp32_precision, conv.fp32_precision = saved
    else:
        saved = matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode == "tf32"
        try:
            yield
        finally:
            matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class Learner:
    """Online network, target network (a frozen deepcopy) and optimizer; one update per call.

    With a shared network several agents' minibatches feed the same Learner; ``agent_ids`` are
    passed to the networks only when they were built with ``n_agents > 0``. The defaults are
    DQN3.0's; ``double``, ``optimizer = "adam"`` and ``precision = "bf16"`` are the switchable
    extensions (docs/dqn3.md).
    """

    def __init__(
        self,
        network: nn.Module,
        *,
        lr: float,
        lr_end: float,
        lr_endt: int,
        learn_start: int,
        discount: float,
        clip_delta: float,
        rescale_r: bool,
        r_max: float,
        weight_cost: float,
        device: torch.device | str,
        decay: float = 0.95,
        eps: float = 0.01,
        use_target: bool = True,
        optimizer: str = "rmsprop",
        adam_eps: float = 4.8e-3,
        double: bool = False,
        precision: str = "fp32",
        compile: bool = False,
        cuda_graph: bool = False,
    ):
        self.device = torch.device(device)
        self.online_network = network.to(self.device)
        self.target_network = copy.deepcopy(self.online_network)
        self.target_network.requires_grad_(False)
        self.target_network.eval()
        self.optimizer = build_optimizer(self.online_network.parameters(), optimizer, lr=lr, decay=decay, eps=eps,
                                         weight_cost=weight_cost, adam_eps=adam_eps)
        self.use_target = use_target  # False: bootstrap from the online network (DQN3.0 with target_q unset)
        self.double = double
        if precision not in ("fp32", "bf16", "auto"):
            raise ValueError(f"unknown precision {precision!r}: expected 'fp32', 'bf16' or 'auto'")
        self.precision = resolve_precision(precision, self.device)
        self.lr_start = lr
        self.lr_end = lr_end
        self.lr_endt = lr_endt
        self.learn_start = learn_start
        self.discount = discount
        self.clip_delta = clip_delta
        self.rescale_r = rescale_r
        self.r_max = r_max
        self.uses_agent_ids = getattr(network, "n_agents", 0) > 0
        self._forward = self._forward_targets
        # cuda_graph: one CUDA graph per input signature, replayed per update (:meth:`_replay`); None: eager
        self._graphs: dict[tuple, tuple[list, torch.cuda.CUDAGraph, dict[str, Tensor]]] | None = None
        if cuda_graph:
            if self.device.type != "cuda":
                raise ValueError(f"cuda_graph needs a CUDA device, got {self.device}")
            self._graphs = {}
            dtype = next(self.online_network.parameters()).dtype
            self._lr = torch.tensor(float(lr), dtype=dtype, device=self.device)  # filled per update: the graph reads it
            if optimizer == "adam":
                self.optimizer = build_optimizer(self.online_network.parameters(), optimizer, lr=self._lr,
                                                 weight_cost=weight_cost, adam_eps=adam_eps, capturable=True)
        elif compile:
            if self.device.type == "cpu" and isinstance(network, DQN3ConvNet):
                # oneDNN's convolutions work in NHWC: with the weights stored so, no reorder per call
                self.online_network.to(memory_format=torch.channels_last)
                self.target_network.to(memory_format=torch.channels_last)
            # the forwards and targets as one graph (its backward compiled with it), the optimizer as one kernel
            self._forward = torch.compile(self._forward_targets, dynamic=False)
            if isinstance(self.optimizer, DQN3RMSprop):
                self.optimizer.fused = True

    def _ids(self, agent_ids: Tensor | None) -> Tensor | None:
        return agent_ids if self.uses_agent_ids else None

    def _autocast(self):
        """bf16 autocast for the forwards (the backward follows their dtypes) when precision is bf16;
        weights, the targets/delta, gradients and optimizer state stay fp32."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16",
                              cache_enabled=self._graphs is None)  # a graph must not capture cached casts

    def device_precision(self):
        """On CUDA, the whole update (forwards and backward) runs with TF32 for bf16 and IEEE fp32 for
        fp32 (:func:`cuda_fp32_precision`); on CPU nothing changes."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return cuda_fp32_precision("tf32" if self.precision == "bf16" else "ieee")

    def update(
        self,
        states: Tensor,
        actions: Tensor,
        rewards: Tensor,
        next_states: Tensor,
        terminals: Tensor,
        agent_ids: Tensor | None = None,
        next_action_masks: Tensor | None = None,
        step: int = 0,
        discounts: Tensor | None = None,
        weights: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """One DQN3.0 qLearnMinibatch on tensors already on the device.

        ``discounts`` (B,): per-row discounts replacing ``discount`` (n-step returns); ``weights``
        (B,): importance weights that scale each row's injected delta (prioritized replay).
        Returns 0-dim detached tensors (no host sync): mean |clipped delta|, mean Q(s, a) and
        mean max_a Q_target(s2, a), plus ``delta`` (B,), the clipped TD errors.
        """
        with self.device_precision():
            if self._graphs is not None:
                return self._replay((states, actions, rewards, next_states, terminals, agent_ids, next_action_masks,
                                     discounts, weights), step)
            return self._update(states, actions, rewards, next_states, terminals, agent_ids, next_action_masks,
                                step, discounts, weights)

    def _update(self, states, actions, rewards, next_states, terminals, agent_ids, next_action_masks, step,
                discounts, weights) -> dict[str, Tensor]:
        q_all, targets, delta, q2_max = self._forward(states, actions, rewards, next_states, terminals, agent_ids,
                                                      next_action_masks, discounts, weights)
        self.optimizer.zero_grad(set_to_none=True)
        # DQN3.0's injected output gradient in the output's dtype: under bf16, -targets rounded to bf16 (the
        # same as injecting fp32 -targets into q_all.float(), whose backward rounds it); .grad lands in fp32.
        q_all.backward((-targets).to(q_all.dtype))
        lr = lr_at(step, learn_start=self.learn_start, lr_start=self.lr_start, lr_end=self.lr_end, lr_endt=self.lr_endt)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        q_sa = q_all.detach().float().gather(1, actions.long().view(-1, 1))
        return {"abs_delta": delta.abs().mean(), "q_mean": q_sa.mean(), "q2_max": q2_max.mean(), "delta": delta}

    # ---- the captured update (cuda_graph) ------------------------------------------------------------
    def _replay(self, args: tuple, step: int) -> dict[str, Tensor]:
        """The update as one CUDA graph launch: the inputs copied into the graph's own tensors, the learning
        rate into its device scalar. The first call with a new input signature (shapes, dtypes, which optional
        inputs are given, and the reward scale ``r_max``, which the graph holds as a constant) captures a graph
        for it (:meth:`_capture`). The statistics returned are the graph's
        output tensors, overwritten by the next update: read or accumulate them before it (the learner set
        does)."""
        key = tuple(None if a is None else (tuple(a.shape), a.dtype) for a in args) + (self.r_max,)  # r_max: a constant
        if key not in self._graphs:
            self._graphs[key] = self._capture(args)
        inputs, graph, out = self._graphs[key]
        for static, a in zip(inputs, args):
            if a is not None:
                static.copy_(a, non_blocking=True)
        self._lr.fill_(lr_at(step, learn_start=self.learn_start, lr_start=self.lr_start, lr_end=self.lr_end,
                             lr_endt=self.lr_endt))
        graph.replay()
        return dict(out)

    def _capture(self, args: tuple) -> tuple[list, torch.cuda.CUDAGraph, dict[str, Tensor]]:
        """Capture :meth:`_graph_step` on tensors of ``args``' signature: three warm-up steps on a side stream
        (CUDA's rule before a capture), then the capture; the weights and optimizer state the warm-up moved
        are put back, so the run goes on exactly where it was."""
        inputs = [None if a is None else a.clone() for a in args]
        params = list(self.online_network.parameters())
        if isinstance(self.optimizer, DQN3RMSprop):  # its state exists before the warm-up, as zeros
            for p in params:
                st = self.optimizer.state[p]
                if not st:
                    st["g"], st["g2"] = torch.zeros_like(p), torch.zeros_like(p)
        saved_params = [p.detach().clone() for p in params]
        saved_state = {p: {k: v.clone() for k, v in self.optimizer.state[p].items() if isinstance(v, Tensor)}
                       for p in params if self.optimizer.state.get(p)}
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self._graph_step(*inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            out = self._graph_step(*inputs)
        with torch.no_grad():
            for p, saved in zip(params, saved_params):
                p.copy_(saved)
            for p in params:
                for k, v in self.optimizer.state.get(p, {}).items():
                    if isinstance(v, Tensor):
                        v.copy_(saved_state[p][k]) if p in saved_state else v.zero_()
        return inputs, graph, out

    def _graph_step(self, states, actions, rewards, next_states, terminals, agent_ids, next_action_masks, discounts,
                    weights) -> dict[str, Tensor]:
        """The update :meth:`_update` makes, with the learning rate read from the device scalar ``_lr`` (so an
        annealed rate needs no new graph) and the optimizer's maths per tensor (launches are free in a graph)."""
        q_all, targets, delta, q2_max = self._forward_targets(states, actions, rewards, next_states, terminals,
                                                              agent_ids, next_action_masks, discounts, weights)
        self.optimizer.zero_grad(set_to_none=True)
        q_all.backward((-targets).to(q_all.dtype))
        with torch.no_grad():
            if isinstance(self.optimizer, DQN3RMSprop):
                for group in self.optimizer.param_groups:
                    ps = [p for p in group["params"] if p.grad is not None]
                    _rmsprop_elementwise(ps, [p.grad for p in ps], [self.optimizer.state[p]["g"] for p in ps],
                                         [self.optimizer.state[p]["g2"] for p in ps], self._lr, group["decay"],
                                         group["eps"], group["weight_cost"])
            else:
                self.optimizer.step()
        q_sa = q_all.detach().float().gather(1, actions.long().view(-1, 1))
        return {"abs_delta": delta.abs().mean(), "q_mean": q_sa.mean(), "q2_max": q2_max.mean(), "delta": delta}

    def _forward_targets(self, states, actions, rewards, next_states, terminals, agent_ids, next_action_masks,
                         discounts, weights) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The forwards and DQN3.0's targets of one update (:meth:`_td`), the targets weighted by the importance
        weights of prioritized replay: the gradient to inject. ``compile = true`` runs this compiled."""
        q_all, targets, delta, q2_max = self._td(states, actions, rewards, next_states, terminals, agent_ids,
                                                 next_action_masks, discounts)
        if weights is not None:
            targets = targets * weights.to(targets.dtype).view(-1, 1)
        return q_all, targets, delta, q2_max

    def td_error(self, states: Tensor, actions: Tensor, rewards: Tensor, next_states: Tensor, terminals: Tensor,
                 agent_ids: Tensor | None = None, next_action_masks: Tensor | None = None,
                 discounts: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(delta_B, q2_max_B)`` exactly as ``update`` computes them (same networks, Double DQN, precision),
        without a gradient or an optimizer step: DQN3.0's validation statistics (V, TD error)."""
        with self.device_precision(), torch.no_grad():
            _, _, delta, q2_max = self._td(states, actions, rewards, next_states, terminals, agent_ids,
                                           next_action_masks, discounts)
        return delta, q2_max

    def _td(self, states, actions, rewards, next_states, terminals, agent_ids, next_action_masks, discounts):
        """The one TD computation of ``update`` and ``td_error``: ``(q_all, targets, delta, q2_max)`` with
        Q(s, .) of the online network (differentiable unless the caller disabled autograd)."""
        ids = self._ids(agent_ids)
        with self._autocast():
            with torch.no_grad():
                q2_all = (self.target_network if self.use_target else self.online_network)(next_states, ids)
                q2_online = None
                if self.double:  # without a target network Double DQN is plain DQN: no second forward
                    q2_online = self.online_network(next_states, ids) if self.use_target else q2_all
            q_all = self.online_network(states, ids)
        targets, delta, q2_max = q_targets(
            q_all.detach().float(),
            q2_all.float(),
            actions,
            rewards,
            terminals,
            discount=self.discount if discounts is None else discounts,
            clip_delta=self.clip_delta,
            r_max=self.r_max,
            rescale_r=self.rescale_r,
            next_action_mask=next_action_masks,
            q2_online=None if q2_online is None else q2_online.float(),
        )
        return q_all, targets, delta, q2_max

    def sync_target(self) -> None:
        """Copy the online weights into the target network (DQN3.0: every target_q steps)."""
        self.target_network.load_state_dict(self.online_network.state_dict())

    def q_values(self, states: Tensor, agent_ids: Tensor | None = None) -> Tensor:
        """Q(s, .) of the online network, for acting."""
        with torch.no_grad():
            return self.online_network(states, self._ids(agent_ids))

    def state_dict(self) -> dict[str, Any]:
        return {
            "online": self.online_network.state_dict(),
            "target": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._graphs:  # the optimizer's state tensors are replaced: graphs captured on the old ones go
            self._graphs.clear()
        self.online_network.load_state_dict(state["online"])
        self.target_network.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self._graphs is not None and not isinstance(self.optimizer, DQN3RMSprop):
            for group in self.optimizer.param_groups:  # capturable Adam reads the rate from the device scalar
                group["lr"] = self._lr
