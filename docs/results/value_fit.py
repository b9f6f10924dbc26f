"""Has a pong_v3 network learned the value of its states? Its Q against the returns in its run's own replay.

    python docs/results/value_fit.py runs/pong_v3_shared_rmsprop/checkpoints/replay.pt CHECKPOINT

For each agent's replay stream (a run saved with `save_replay = true`) it computes the discounted return
G_t = r_t + 0.99 r_t+1 + ... of every stored transition (to the end of its episode), draws 1,000 states, and
prints the spread of G against the spread of the network's max_a Q(s, a) on the same states, their
correlation, and the network's max Q on the states one step before a point is won (+1) and lost (-1),
where the frame already shows who scores. A network that has learned nothing of the frames gives the same
value to both.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from madqn.evaluation.agents import load_agents


def stream_returns(memory: dict, s: int, gamma: float = 0.99):
    """(chronological positions, discounted returns, rewards, episode ends) of stream ``s``."""
    written = int(memory["written"][s])
    cap = memory["rewards"].shape[1]
    n = min(written, cap)
    order = (np.arange(n) + (written % cap if written >= cap else 0)) % cap
    rewards = memory["rewards"][s].numpy()[order]
    ends = memory["episode_end"][s].numpy()[order]
    g = np.zeros(n, np.float32)
    acc = 0.0
    for t in range(n - 1, -1, -1):
        acc = rewards[t] + gamma * (0.0 if ends[t] else acc)
        g[t] = acc
    return order, g, rewards, ends


def stacks(memory: dict, s: int, order: np.ndarray, idx: np.ndarray) -> torch.Tensor:
    frames = memory["frames"][s]
    return torch.stack([frames[torch.as_tensor(order[i - 3:i + 1])] for i in idx])


def usable(ends: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Indices whose 4-frame stack lies inside one episode."""
    return idx[[not ends[i - 3:i + 1].any() for i in idx]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("replay")
    parser.add_argument("checkpoint")
    args = parser.parse_args()
    torch.set_num_threads(1)
    state = torch.load(args.replay, map_location="cpu", weights_only=False, mmap=True)
    memory = next(iter(state["groups"].values()))  # the first learner's replay (shared: all agents)
    rng = np.random.default_rng(0)
    agents = load_agents(args.checkpoint)
    names = list(agents.possible_agents)
    print("| checkpoint | agent | G std | max Q std | correlation | max Q before +1 | max Q before -1 |")
    print("|---|---|---|---|---|---|---|")
    for s in range(memory["rewards"].shape[0]):
        agent = names[s]
        net = agents.networks[agent]
        order, g, rewards, ends = stream_returns(memory, s)

        @torch.no_grad()
        def max_q(idx: np.ndarray) -> np.ndarray:
            ids = torch.full((len(idx),), s) if getattr(net, "n_agents", 0) else None
            return net(stacks(memory, s, order, idx), ids).float().max(1).values.numpy()

        idx = usable(ends, rng.integers(4, len(order) - 1, 1200))[:1000]
        pre = usable(ends, np.flatnonzero(rewards[4:-1] != 0) + 4)[:400]
        v, p = max_q(idx), max_q(pre)
        print(f"| {args.checkpoint} | {agent} | {g[idx].std():.2f} | {v.std():.4f} | {np.corrcoef(v, g[idx])[0, 1]:+.2f} "
              f"| {p[rewards[pre] > 0].mean():+.3f} | {p[rewards[pre] < 0].mean():+.3f} |")


if __name__ == "__main__":
    main()
