"""Which ReLU units of a DQN 3.0 conv network still respond to Pong frames: per layer, on real game states.

    python docs/results/dead_units.py runs/pong_fast_shared/checkpoints/latest.pt [more checkpoints ...]

Plays 400 agent steps of pong_v3 (or ALE/Pong-v5 for a one-agent checkpoint... any game with --env) with
uniformly random actions, seed 0, stacks each agent's last 4 frames as the networks see them, and runs every
network of the checkpoint on those states (a shared network once per agent id). Per layer it prints the
fraction of units (conv: channels) that are active (> 0) on at least one state, and the mean fraction of
active units; and the spread of the Q-values across states. A layer with no active unit cuts every state
out of the network: Q(s, a) is then the same for all s, no gradient reaches the layers below it, and the
network can never learn again.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from madqn.envs.atari import make_atari_env
from madqn.evaluation.agents import load_agents


def random_play_states(env_name: str, agents, steps: int = 400, seed: int = 0) -> dict[str, np.ndarray]:
    """Each agent's 4-frame stacks over `steps` agent steps of uniformly random play."""
    env = make_atari_env(env_name)
    rng = np.random.default_rng(seed)
    obs, infos = env.reset(seed=seed)
    agents.reset()
    seats = dict(zip(env.possible_agents, agents.possible_agents))  # env seat -> the checkpoint's agent
    states = {a: [] for a in seats.values()}
    for _ in range(steps):
        for seat, a in seats.items():
            agents.histories[a].push(agents.specs[a].convert(obs[seat]))
            states[a].append(agents.histories[a].state().copy())
        obs, _, _, _, infos = env.step({s: int(rng.integers(env.action_space(s).n)) for s in env.agents})
        if not env.agents:
            obs, infos = env.reset(seed=seed + 1)
            agents.reset()
    return {a: np.stack(v) for a, v in states.items()}


@torch.no_grad()
def layer_activity(net, frames: np.ndarray, agent_id: int | None):
    """{layer: (fraction of units ever active, mean active fraction)} and the Q-values, in fp32."""
    x = torch.as_tensor(frames)
    ids = None if agent_id is None else torch.full((len(frames),), agent_id)
    layers = net.conv_features(x, ids)  # the network's own conv1-conv3 ReLU outputs
    layers.append(F.relu(net.fc(layers[-1].flatten(1))))
    out = {}
    for name, h in zip(("conv1", "conv2", "conv3", "fc"), layers):
        units = h.reshape(h.shape[0], h.shape[1], -1)
        out[name] = ((units > 0).any(0).any(-1).float().mean().item(), (units > 0).float().mean().item())
    return out, net(x, ids).numpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--env", help="game to play (default pong_v3; ALE/Pong-v5 for one-agent checkpoints)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| checkpoint | step | agent | conv1 | conv2 | conv3 | fc | Q std across states |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.checkpoints:
        agents = load_agents(path, seed=0)
        env_name = args.env or ("pong_v3" if len(agents.possible_agents) == 2 else "ALE/Pong-v5")
        states = random_play_states(env_name, agents)
        step = torch.load(path, map_location="cpu", weights_only=True).get("step", "?")
        for a, frames in states.items():
            net = agents.networks[a]
            activity, q = layer_activity(net, frames, agents.agent_ids[a] if net.n_agents else None)
            cells = " | ".join(f"{ever:.2f} / {mean:.3f}" for ever, mean in activity.values())
            print(f"| {path} | {step} | {a} | {cells} | {q.std(0).mean():.4f} |")


if __name__ == "__main__":
    main()
