"""Greedy actions and Q spread of a trained pong_v3 / ALE/Pong-v5 checkpoint on 600 states of its own play.

    python docs/results/probe_greedy_actions.py runs/pong_fast_shared/checkpoints/latest.pt

The agents play each other (or the built-in opponent) with 20% random actions, seed 5; at every state the
greedy action of each agent and the spread of its Q-values (max - min) are recorded. For a shared network it also
counts the states where the greedy action changes when the other seat's agent indicator is fed instead of the
agent's own, and the mean |Q change| (a shared network that ignores the indicator plays both seats alike).
"""
import collections
import sys

import numpy as np
import torch

from madqn.envs.adapters import load_env_factory
from madqn.envs.atari import make_atari_env
from madqn.evaluation.agents import load_agents, load_checkpoint

torch.set_num_threads(1)
path = sys.argv[1]
agents = load_agents(path, seed=0)
spec = load_checkpoint(path)[1].env  # an Atari name, or a custom env such as envs/pong_vs_random.py:make_env
env = load_env_factory(spec)() if ":" in spec else make_atari_env(spec)
obs, infos = env.reset(seed=5)
agents.reset()
greedy = {a: collections.Counter() for a in env.possible_agents}
spread = {a: [] for a in env.possible_agents}
swapped = {a: [] for a in env.possible_agents}  # (greedy action changed, mean |Q change|) with another seat's id
rng = np.random.default_rng(0)
for t in range(600):
    actions = agents.act(obs, infos, epsilon=0.0)
    for a in obs:
        q = agents.q_values(a)
        spread[a].append(float(q.max() - q.min()))
        greedy[a][actions[a]] += 1
        network = agents.networks[a]
        if getattr(network, "n_agents", 0) > 1:
            other = (agents.agent_ids[a] + 1) % network.n_agents
            with torch.no_grad():
                q_other = network(torch.as_tensor(agents.histories[a].state()[None]), torch.tensor([other]))[0]
            q_other = q_other.float().numpy()
            swapped[a].append((q_other.argmax() != q.argmax(), float(np.abs(q_other - q).mean())))
    actions = {a: int(rng.integers(env.action_space(a).n)) if rng.random() < 0.2 else x for a, x in actions.items()}
    obs, _, _, _, infos = env.step(actions)
    if not env.agents:
        obs, infos = env.reset(seed=t)
        agents.reset()
for a in env.possible_agents:
    line = f"{a}: greedy actions {dict(sorted(greedy[a].items()))}, mean Q spread {np.mean(spread[a]):.4f}"
    if swapped[a]:
        changed, dq = zip(*swapped[a])
        line += f"; with the next seat's indicator the greedy action changes in {sum(changed)}/{len(changed)} states, mean |Q change| {np.mean(dq):.4f}"
    print(line)
