"""Q-network shapes, parameter count, init bounds and the agent indicator (DQN3.0 convnet_atari3)."""

import math

import pytest
import torch
import torch.nn.functional as F

from madqn.core.networks import DQN3ConvNet, MLPQNetwork, build_q_network

torch.set_num_threads(1)


def _frames(batch, hist=4, size=84, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, hist, size, size), dtype=torch.uint8, generator=g)


def test_conv_parameter_count_matches_nature_dqn():
    net = DQN3ConvNet(n_actions=6, hist_len=4)
    assert sum(p.numel() for p in net.parameters()) == 1_687_206


def test_conv_layer_and_output_shapes():
    net = DQN3ConvNet(n_actions=6)
    x = _frames(2).float() / 255
    h1 = F.relu(net.conv1(x))
    h2 = F.relu(net.conv2(h1))
    h3 = F.relu(net.conv3(h2))
    assert h1.shape == (2, 32, 20, 20)
    assert h2.shape == (2, 64, 9, 9)
    assert h3.shape == (2, 64, 7, 7)
    assert net.fc.in_features == 3136 and net.fc.out_features == 512
    assert net(_frames(2)).shape == (2, 6)


def test_conv_forward_equals_layer_by_layer_on_scaled_input():
    torch.manual_seed(0)
    net = DQN3ConvNet(n_actions=5)
    frames = _frames(3)
    x = frames.double() / 255.0  # independent computation in float64
    w = {k: v.double() for k, v in net.state_dict().items()}
    h = F.relu(F.conv2d(x, w["conv1.weight"], w["conv1.bias"], stride=4))
    h = F.relu(F.conv2d(h, w["conv2.weight"], w["conv2.bias"], stride=2))
    h = F.relu(F.conv2d(h, w["conv3.weight"], w["conv3.bias"], stride=1))
    h = F.relu(h.flatten(1) @ w["fc.weight"].t() + w["fc.bias"])
    expected = h @ w["out.weight"].t() + w["out.bias"]
    torch.testing.assert_close(net(frames).double(), expected, rtol=1e-5, atol=1e-6)
    # uint8 frames and the same values as float give the same Q-values (scaling is inside).
    torch.testing.assert_close(net(frames), net(frames.float()), rtol=0, atol=0)


def test_default_init_within_torch7_bounds():
    torch.manual_seed(1)
    net = DQN3ConvNet(n_actions=6, n_agents=2)
    fan_ins = {"conv1": (4 + 2) * 64, "conv2": 32 * 16, "conv3": 64 * 9, "fc": 3136, "out": 512}
    for name, fan_in in fan_ins.items():
        layer = getattr(net, name)
        bound = 1 / math.sqrt(fan_in)
        for t in (layer.weight, layer.bias):
            assert t.abs().max().item() <= bound + 1e-7
            assert t.abs().max().item() > 0.8 * bound  # uniform over the whole range, not tiny


@pytest.mark.parametrize("n_agents", [1, 2, 3])
def test_conv_agent_indicator_equals_concatenated_one_hot_channels(n_agents):
    torch.manual_seed(2)
    net = DQN3ConvNet(n_actions=4, n_agents=n_agents).double()
    frames = _frames(2 * n_agents, seed=3)
    ids = torch.arange(2 * n_agents) % n_agents
    # Explicit version: append n_agents constant one-hot planes and run the plain conv stack.
    planes = F.one_hot(ids, n_agents).double()[:, :, None, None].expand(-1, -1, 84, 84)
    x = torch.cat([frames.double() / 255.0, planes], dim=1)
    h = F.relu(F.conv2d(x, net.conv1.weight, net.conv1.bias, stride=4))
    h = F.relu(net.conv3(F.relu(net.conv2(h))))
    expected = net.out(F.relu(net.fc(h.flatten(1))))
    torch.testing.assert_close(net(frames, ids), expected, rtol=1e-10, atol=1e-10)


def test_conv_agent_indicator_changes_output_and_is_required():
    torch.manual_seed(4)
    net = DQN3ConvNet(n_actions=3, n_agents=2)
    frames = _frames(1).expand(2, -1, -1, -1)
    q = net(frames, torch.tensor([0, 1]))
    assert not torch.allclose(q[0], q[1])
    with pytest.raises(ValueError, match="agent_ids"):
        net(frames)


def test_conv_rejects_wrong_frame_shape():
    net = DQN3ConvNet(n_actions=3)
    with pytest.raises(ValueError, match="shape"):
        net(torch.zeros(2, 3, 84, 84, dtype=torch.uint8))


def test_mlp_shapes_no_scaling_and_indicator():
    torch.manual_seed(5)
    net = MLPQNetwork(obs_dim=3, n_actions=2, hist_len=2, n_agents=2, hidden=(8, 4))
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(2 * 3 + 2, 8), (8, 4), (4, 2)]
    obs = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]] * 2, dtype=torch.float64)
    ids = torch.tensor([0, 1])
    q = net(obs, ids)
    assert q.shape == (2, 2) and q.dtype == torch.float32
    # Explicit: flattened history (unscaled) followed by the one-hot id.
    x = torch.tensor([[1.0, 2, 3, 4, 5, 6, 1, 0], [1.0, 2, 3, 4, 5, 6, 0, 1]])
    torch.testing.assert_close(q, net.layers(x))
    with pytest.raises(ValueError, match="agent_ids"):
        net(obs)


def test_mlp_without_agents_ignores_ids_and_accepts_int_input():
    torch.manual_seed(6)
    net = MLPQNetwork(obs_dim=4, n_actions=3)
    obs = torch.arange(8).reshape(2, 1, 4)
    q = net(obs)
    assert q.shape == (2, 3)
    torch.testing.assert_close(q, net(obs.float(), torch.tensor([0, 1])))


def test_build_q_network_dispatch():
    conv = build_q_network((84, 84), n_actions=6, hist_len=4, n_agents=2)
    assert isinstance(conv, DQN3ConvNet) and conv.n_agents == 2 and conv.hist_len == 4
    mlp = build_q_network((5,), n_actions=3, hist_len=2, hidden=[16])
    assert isinstance(mlp, MLPQNetwork) and mlp.obs_dim == 5 and mlp.hidden == (16,)
    forced = build_q_network((84, 84), n_actions=3, hist_len=1, kind="mlp", hidden=(4,))
    assert isinstance(forced, MLPQNetwork) and forced.obs_dim == 84 * 84
    assert forced(torch.zeros(2, 1, 84, 84, dtype=torch.uint8)).shape == (2, 3)


@pytest.mark.parametrize(
    "shape, kind, match",
    [
        ((84, 84, 3), "auto", "observation shape"),
        ((10, 10), "auto", "observation shape"),
        ((5,), "conv", "square 2-D frame"),
        ((84, 80), "conv", "square 2-D frame"),
        ((84, 84), "transformer", "unknown Q-network kind"),
    ],
)
def test_build_q_network_errors(shape, kind, match):
    with pytest.raises(ValueError, match=match):
        build_q_network(shape, n_actions=3, hist_len=4, kind=kind)


def test_mlp_computes_in_its_parameters_dtype():
    """A float64 MLP keeps float64 inputs exact (no cast to float32), like DQN3ConvNet; uint8 inputs
    become the parameters' dtype; under bf16 autocast the layers compute in bf16."""
    torch.manual_seed(0)
    net = MLPQNetwork(obs_dim=2, n_actions=2, hidden=(4,)).double()
    obs = torch.tensor([[[1.0 + 1e-12, 3.0]], [[-2.0, 0.5]]], dtype=torch.float64)  # 1 + 1e-12 is 1.0 in float32
    w = {k: v for k, v in net.state_dict().items()}
    x = obs.reshape(2, -1)
    expected = torch.relu(x @ w["layers.0.weight"].T + w["layers.0.bias"]) @ w["layers.2.weight"].T + w["layers.2.bias"]
    q = net(obs)
    assert q.dtype == torch.float64
    torch.testing.assert_close(q, expected, rtol=0, atol=1e-15)
    assert net(torch.tensor([[[7, 9]]], dtype=torch.uint8)).dtype == torch.float64
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert MLPQNetwork(obs_dim=2, n_actions=2, hidden=(4,))(obs.float()).dtype == torch.bfloat16
