"""Where a Boxing player fights: distance to the opponent, time in reach, the ring's edges, read from the console's RAM.

    python docs/results/boxing_positions.py runs/boxing_fast_shared/checkpoints/latest.pt [--games 3]
    python docs/results/boxing_positions.py random --games 10                  # random players in both seats
    python docs/results/boxing_positions.py runs/boxing_fast_shared/checkpoints/latest.pt --self-play

A score against random players says how many punches land, not how the player gets them. For a boxing_v2
checkpoint each seat plays its own agent (epsilon 0.05, as in evaluation) against a uniformly random
player in the other seat; --self-play puts the agents in both seats, as in training. Episode seeds are
0, 1, 2, ... (the seeds `madqn eval` uses).

RAM (the AtariARI annotations of Boxing): bytes 32 / 34 are the white boxer's (first_0's) x / y,
bytes 33 / 35 the black boxer's (second_0's). A punch only scores when the two boxers are level and
close, so the table gives, per seat and game: points scored and conceded, the mean horizontal and
vertical distance between the boxers, the fraction of steps in reach (|dx| <= 32 and |dy| <= 24, where
nearly all of random play's scoring punches are seen; the probe checks that 95% of rewards come in reach), and the
fraction of steps the seat's boxer spends against the ring's left or right rope (x at its minimum or
maximum as seen in play: cornered or pushed back).
"""
from __future__ import annotations

import argparse
import collections

import numpy as np
import torch

from madqn.envs.atari import make_atari_env
from madqn.evaluation.agents import load_agents, load_checkpoint

X = {"first_0": 32, "second_0": 33}
Y = {"first_0": 34, "second_0": 35}
REACH_X, REACH_Y = 32, 24  # random play, 6 games: 4 rewarded steps (of 186 points) fall outside
ROPES = (30, 109)  # the boxers' x range in play (random play, 10 games: 30..109)


def play(env, agents, seat, games, epsilon, rng):
    """Play `games` episodes; `seat` acts with `agents` (None: every seat random). Returns per-seat counters."""
    stats = {a: collections.Counter() for a in env.possible_agents}
    ale = env._emulator.ale
    for game in range(games):
        obs, infos = env.reset(seed=game)
        if agents is not None:
            agents.reset()
        while env.agents:
            actions = {a: int(rng.integers(env.action_space(a).n)) for a in env.agents}
            if agents is not None and seat is None:  # self-play: the agents in every seat, as in training
                actions = agents.act(obs, infos, epsilon=epsilon)
            elif agents is not None:
                actions[seat] = agents.act({seat: obs[seat]}, epsilon=epsilon)[seat]
            obs, rewards, _, _, infos = env.step(actions)
            ram = ale.getRAM()
            dx = abs(int(ram[X["first_0"]]) - int(ram[X["second_0"]]))
            dy = abs(int(ram[Y["first_0"]]) - int(ram[Y["second_0"]]))
            in_reach = dx <= REACH_X and dy <= REACH_Y
            for a, r in rewards.items():
                c = stats[a]
                c["steps"] += 1
                c["dx"] += dx
                c["dy"] += dy
                c["reach"] += in_reach
                c["rope"] += int(ram[X[a]]) <= ROPES[0] or int(ram[X[a]]) >= ROPES[1]
                c["scored"] += max(r, 0)
                c["conceded"] += max(-r, 0)
                c["rewards_out_of_reach"] += r != 0 and not in_reach
        for a in env.possible_agents:
            stats[a]["games"] += 1
    return stats


def row(label, seat, c):
    games, steps = c["games"], c["steps"]
    assert c["rewards_out_of_reach"] <= 0.05 * max(c["scored"] + c["conceded"], 1), (seat, c)  # RAM agrees with rewards
    print(f"| {label} | {seat} | {games} | {c['scored'] / games:.1f} | {c['conceded'] / games:.1f} | "
          f"{c['dx'] / steps:.1f} | {c['dy'] / steps:.1f} | {c['reach'] / steps:.2f} | {c['rope'] / steps:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint or export file, or 'random'")
    parser.add_argument("--games", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=0.05)
    parser.add_argument("--self-play", action="store_true", help="the checkpoint's agents in both seats (training's games)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print("| player | seat | games | points scored / game | conceded / game | mean dx | mean dy | "
          "in reach | on the ropes |")
    print("|---|---|---|---|---|---|---|---|---|")
    env = make_atari_env("boxing_v2")
    if args.checkpoint == "random":
        stats = play(env, None, None, args.games, 1.0, rng)
        for seat in env.possible_agents:
            row("random", seat, stats[seat])
        return
    assert load_checkpoint(args.checkpoint)[1].env == "boxing_v2", "a boxing_v2 checkpoint"
    agents = load_agents(args.checkpoint, seed=0)
    if args.self_play:
        stats = play(env, agents, None, args.games, args.epsilon, rng)
        for seat in env.possible_agents:
            row("self-play", seat, stats[seat])
        return
    for seat in env.possible_agents:
        stats = play(env, agents, seat, args.games, args.epsilon, rng)
        row(f"trained {seat} vs random", seat, stats[seat])
        other = next(a for a in env.possible_agents if a != seat)
        row(f"random {other} vs trained {seat}", other, stats[other])


if __name__ == "__main__":
    main()
