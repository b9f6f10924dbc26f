"""Q-networks: DQN3.0's convnet_atari3, a small MLP for vector observations, and a dispatcher.

Both networks share one calling convention, ``forward(x, agent_ids=None) -> q_BA``, and expose
``n_agents``: when it is > 0 the network is shared between agents and is told which agent it is
acting for by a one-hot agent indicator (PettingZoo Atari paper), so ``agent_ids`` (B,) long is
required; with ``n_agents == 0`` it is ignored. ``dueling=True`` (Wang et al. 2016) replaces the
last hidden layer and the output layer by a :class:`DuelingHead`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _conv_out(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


def compute_dtype(weight: Tensor) -> torch.dtype:
    """The dtype the layers compute in: autocast's (bf16, ``precision = "bf16"``) inside an autocast
    region on the weight's device, else the weight's own."""
    device = weight.device.type
    if not hasattr(torch, "get_autocast_dtype"):  # torch < 2.4
        on = torch.is_autocast_cpu_enabled() if device == "cpu" else torch.is_autocast_enabled()
        return (torch.get_autocast_cpu_dtype() if device == "cpu" else torch.get_autocast_gpu_dtype()) if on \
            else weight.dtype
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def _check_agent_ids(agent_ids: Tensor | None, n_agents: int, batch: int) -> None:
    if n_agents > 0:
        if agent_ids is None:
            raise ValueError(f"this network is shared by {n_agents} agents: forward() needs agent_ids")
        if agent_ids.shape != (batch,):
            raise ValueError(f"agent_ids must have shape ({batch},), got {tuple(agent_ids.shape)}")


class DuelingHead(nn.Module):
    """Two streams of ``width`` ReLU units on the same features: V (one output) and A (one per action),
    combined as Q = V + A - mean_a(A) (Wang et al. 2016, eq. 9: the mean over all actions)."""

    def __init__(self, in_features: int, width: int, n_actions: int):
        super().__init__()
        self.value = nn.Sequential(nn.Linear(in_features, width), nn.ReLU(), nn.Linear(width, 1))
        self.advantage = nn.Sequential(nn.Linear(in_features, width), nn.ReLU(), nn.Linear(width, n_actions))

    def forward(self, features: Tensor) -> Tensor:
        v_B1 = self.value(features)
        a_BA = self.advantage(features)
        return v_B1 + a_BA - a_BA.mean(dim=1, keepdim=True)


class DQN3ConvNet(nn.Module):
    """convnet_atari3 (Nature DQN): 3 convs + fc 512 + linear, ReLU, padding 0, default init.

    Input: frames (B, hist_len, S, S) as uint8 or float in [0, 255]; the 1/255 scaling happens
    here, so replay and actor keep uint8. With ``n_agents > 0`` conv1 has ``n_agents`` extra input
    channels holding a constant one-hot plane of the agent id. Because conv1 has no padding, such
    a plane contributes the same value at every output position (the sum of its kernel slice),
    so it is added to conv1's bias instead of convolving the planes: exactly the same maths as
    concatenating the channels, and the weights (and their init bounds, fan_in included) are
    those of the concatenated network.

    ``dueling=True``: the conv stack, then two 512-unit streams V and A (:class:`DuelingHead`)
    instead of fc + linear.
    """

    def __init__(self, n_actions: int, hist_len: int = 4, n_agents: int = 0, frame_size: int = 84,
                 dueling: bool = False):
        super().__init__()
        if n_actions < 1 or hist_len < 1 or n_agents < 0:
            raise ValueError(f"bad DQN3ConvNet sizes: n_actions={n_actions}, hist_len={hist_len}, n_agents={n_agents}")
        s1 = _conv_out(frame_size, 8, 4)
        s2 = _conv_out(s1, 4, 2)
        s3 = _conv_out(s2, 3, 1)
        if s3 < 1:
            raise ValueError(f"frame_size {frame_size} is too small for convnet_atari3 (needs >= 36)")
        self.n_actions = n_actions
        self.hist_len = hist_len
        self.n_agents = n_agents
        self.frame_size = frame_size
        self.dueling = dueling
        self.conv1 = nn.Conv2d(hist_len + n_agents, 32, kernel_size=8, stride=4)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=4, stride=2)
        self.conv3 = nn.Conv2d(64, 64, kernel_size=3, stride=1)
        if dueling:
            self.head = DuelingHead(64 * s3 * s3, 512, n_actions)
        else:
            self.fc = nn.Linear(64 * s3 * s3, 512)
            self.out = nn.Linear(512, n_actions)

    def forward(self, frames: Tensor, agent_ids: Tensor | None = None) -> Tensor:
        h = self.conv_features(frames, agent_ids)[-1]
        if self.dueling:
            return self.head(h.flatten(1))
        h = F.relu(self.fc(h.flatten(1)))
        return self.out(h)

    def conv_features(self, frames: Tensor, agent_ids: Tensor | None = None) -> list[Tensor]:
        """The ReLU outputs of conv1, conv2 and conv3 (the head reads the last one, flattened)."""
        batch = frames.shape[0]
        expected = (self.hist_len, self.frame_size, self.frame_size)
        if frames.dim() != 4 or tuple(frames.shape[1:]) != expected:
            raise ValueError(f"frames must have shape (B, {', '.join(map(str, expected))}), got {tuple(frames.shape)}")
        _check_agent_ids(agent_ids, self.n_agents, batch)
        w = self.conv1.weight
        dtype = compute_dtype(w)
        if frames.dtype == torch.uint8 and dtype == torch.get_default_dtype():
            x = frames / 255.0  # one pass: uint8 in, float out (the same values as .float() / 255)
        else:  # under bf16 autocast: straight to bf16, the same values autocast's cast of x / 255 gives
            x = frames.to(dtype) / 255.0
        if self.n_agents > 0:
            # (32, n_agents): what a constant 1-plane in agent channel k adds to each output unit.
            plane_sum_CA = w[:, self.hist_len:].sum(dim=(2, 3))
            bias_BC = self.conv1.bias + plane_sum_CA.t()[agent_ids.long()]
            h = F.conv2d(x, w[:, : self.hist_len], None, stride=4)
            h = h + bias_BC.to(h.dtype)[:, :, None, None]  # in the conv's dtype (bf16 + fp32 would give fp32)
        else:
            h = F.conv2d(x, w, self.conv1.bias, stride=4)
        h1 = F.relu(h)
        h2 = F.relu(self.conv2(h1))
        return [h1, h2, F.relu(self.conv3(h2))]

    def unit_activity(self, frames: Tensor, agent_ids: Tensor | None = None) -> dict[str, float]:
        """Per ReLU layer, the fraction of its units (conv layers: channels) active (> 0) on at least one of
        ``frames``. A layer at 0 passes nothing of the input on: Q no longer depends on the state, and no
        gradient reaches the layers below it (dying ReLUs)."""
        with torch.no_grad():
            layers = self.conv_features(frames, agent_ids)
            if not self.dueling:
                layers.append(F.relu(self.fc(layers[-1].flatten(1))))
        names = ["conv1", "conv2", "conv3", "fc"]
        return {name: (h.reshape(h.shape[0], h.shape[1], -1) > 0).any(dim=2).any(dim=0).float().mean().item()
                for name, h in zip(names, layers)}


class MLPQNetwork(nn.Module):
    """ReLU MLP on the flattened (B, hist_len, obs_dim) history, one-hot agent id appended.

    Inputs are cast to the parameters' dtype (bf16 inside a bf16 autocast region) and NOT rescaled
    (vector observations are used as given).
    ``dueling=True``: the last hidden layer becomes two streams of its width, V and A
    (:class:`DuelingHead`), on the output of the layers before it (the input when there is one
    hidden layer).
    """

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hist_len: int = 1,
        n_agents: int = 0,
        hidden: Sequence[int] = (256, 256),
        dueling: bool = False,
    ):
        super().__init__()
        if obs_dim < 1 or n_actions < 1 or hist_len < 1 or n_agents < 0:
            raise ValueError(
                f"bad MLPQNetwork sizes: obs_dim={obs_dim}, n_actions={n_actions}, hist_len={hist_len}, n_agents={n_agents}"
            )
        self.obs_dim = obs_dim
        self.n_actions = n_actions
        self.hist_len = hist_len
        self.n_agents = n_agents
        self.hidden = tuple(int(h) for h in hidden)
        self.dueling = dueling
        if dueling and not self.hidden:
            raise ValueError("a dueling MLP needs at least one hidden layer (mlp_hidden)")
        layers: list[nn.Module] = []
        width = hist_len * obs_dim + n_agents
        for h in self.hidden[:-1] if dueling else self.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        if dueling:
            layers.append(DuelingHead(width, self.hidden[-1], n_actions))
        else:
            layers.append(nn.Linear(width, n_actions))
        self.layers = nn.Sequential(*layers)

    def forward(self, obs: Tensor, agent_ids: Tensor | None = None) -> Tensor:
        batch = obs.shape[0]
        x = obs.reshape(batch, -1).to(compute_dtype(next(self.parameters())))  # as DQN3ConvNet: params' or autocast's
        if x.shape[1] != self.hist_len * self.obs_dim:
            raise ValueError(
                f"observations must hold hist_len*obs_dim = {self.hist_len}*{self.obs_dim} values per row, "
                f"got shape {tuple(obs.shape)}"
            )
        _check_agent_ids(agent_ids, self.n_agents, batch)
        if self.n_agents > 0:
            x = torch.cat([x, F.one_hot(agent_ids.long(), self.n_agents).to(x.dtype)], dim=1)
        return self.layers(x)


def build_q_network(
    obs_shape: tuple[int, ...],
    n_actions: int,
    hist_len: int,
    n_agents: int = 0,
    kind: str = "auto",
    hidden: Sequence[int] = (256, 256),
    dueling: bool = False,
) -> nn.Module:
    """Pick the Q-network for ONE preprocessed observation of shape ``obs_shape``.

    "auto": a square 2-D frame (84x84 after DQN3.0 preprocessing) -> DQN3ConvNet, a 1-D vector
    -> MLPQNetwork. "conv" forces the conv net (needs a square frame of side >= 36); "mlp"
    forces the MLP on the flattened observation. ``dueling``: V and A streams (Wang et al. 2016).
    """
    obs_shape = tuple(int(d) for d in obs_shape)
    is_frame = len(obs_shape) == 2 and obs_shape[0] == obs_shape[1] and obs_shape[0] >= 36
    if kind == "auto":
        if is_frame:
            kind = "conv"
        elif len(obs_shape) == 1:
            kind = "mlp"
        else:
            raise ValueError(
                f"cannot pick a Q-network for observation shape {obs_shape}: expected a preprocessed "
                "square frame like (84, 84) (conv) or a vector (d,) (mlp); set the network kind explicitly"
            )
    if kind == "conv":
        if not is_frame:
            raise ValueError(f"the conv Q-network needs a square 2-D frame of side >= 36, got shape {obs_shape}")
        return DQN3ConvNet(n_actions, hist_len=hist_len, n_agents=n_agents, frame_size=obs_shape[0], dueling=dueling)
    if kind == "mlp":
        if len(obs_shape) == 0:
            raise ValueError("the mlp Q-network needs an observation with at least one dimension")
        return MLPQNetwork(math.prod(obs_shape), n_actions, hist_len=hist_len, n_agents=n_agents, hidden=hidden,
                           dueling=dueling)
    raise ValueError(f"unknown Q-network kind {kind!r}: expected 'auto', 'conv' or 'mlp'")
