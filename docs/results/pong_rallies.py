"""How a Pong player wins and loses its points: returns, misses and serve timeouts, read from the console's RAM.

    python docs/results/pong_rallies.py runs/pong_fast_shared/checkpoints/latest.pt [--games 4]
    python docs/results/pong_rallies.py random --games 10            # random players in both pong_v3 seats
    python docs/results/pong_rallies.py runs/pong_single_fast/checkpoints/latest.pt   # against the built-in player
    python docs/results/pong_rallies.py runs/pong_single_fast/checkpoints/latest.pt --seat first_0   # in pong_v3
    python docs/results/pong_rallies.py runs/pong_fast_shared/checkpoints/latest.pt --self-play   # training's games

A score against random players mixes three things: how often the player returns the ball, how often the
opponent misses, and pong_v3's serve timer (a server that does not press FIRE within about 2 s loses a
point, -1 to it and 0 to the other player). This probe separates them. For a pong_v3 checkpoint each seat
plays its own agent (epsilon 0.05, as in evaluation) against a uniformly random player in the other seat;
for a single-agent ALE/Pong-v5 checkpoint the agent plays the game's built-in player. Episode seeds are
0, 1, 2, ... (the seeds `madqn eval` uses).

RAM: byte 49 is the ball's x (it grows towards the right paddle), byte 54 its y (0 while no ball is in
play). pong_v3's first_0 and the single-player agent hold the right paddle, second_0 the left one. A
return is a change of the ball's horizontal direction (right -> left at the right paddle, left -> right
at the left one); a rally point is a +1/-1 pair of rewards, a timeout point a lone -1.

Per seat the table gives: points won and lost in rallies, points lost to the serve timer, the player's
returns, and its return rate = returns / (returns + rally points lost), the fraction of balls that reach
its side and come back.
"""
from __future__ import annotations

import argparse
import collections

import numpy as np
import torch

from madqn.envs.atari import make_atari_env
from madqn.evaluation.agents import load_agents, load_checkpoint

BALL_X, BALL_Y = 49, 54
RIGHT_SEATS = ("first_0", "player_0")


def play(env, agents, seat, games, epsilon, rng):
    """Play `games` episodes; `seat` acts with `agents` (None: every seat random). Returns per-seat counters."""
    stats = {a: collections.Counter() for a in env.possible_agents}
    ale = env._emulator.ale
    for game in range(games):
        obs, infos = env.reset(seed=game)
        if agents is not None:
            agents.reset()
        last_x, direction = None, 0
        while env.agents:
            actions = {a: int(rng.integers(env.action_space(a).n)) for a in env.agents}
            if agents is not None and seat is None:  # self-play: the agents in every seat, as in training
                actions = agents.act(obs, infos, epsilon=epsilon)
            elif agents is not None:
                (own,) = agents.possible_agents if len(agents.possible_agents) == 1 else (seat,)
                actions[seat] = agents.act({own: obs[seat]}, epsilon=epsilon)[own]
            obs, rewards, _, _, infos = env.step(actions)
            ram = ale.getRAM()
            x, in_play = int(ram[BALL_X]), int(ram[BALL_Y]) != 0
            scored = [a for a, r in rewards.items() if r > 0]
            lost = [a for a, r in rewards.items() if r < 0]
            for a in lost:  # one player (no serve timer): every point is a rally point
                stats[a]["lost_rally" if scored or len(env.possible_agents) == 1 else "lost_timeout"] += 1
            for a in scored:
                stats[a]["won_rally"] += 1
            if lost and (scored or len(env.possible_agents) == 1):  # the ball left on the loser's side
                stats[lost[0]]["side_mismatch"] += direction != (1 if lost[0] in RIGHT_SEATS else -1)
            if not (scored or lost) and in_play and last_x is not None and x != last_x:
                step_direction = 1 if x > last_x else -1
                if direction == 1 and step_direction == -1:
                    stats[_right(env)]["returns"] += 1
                elif direction == -1 and step_direction == 1 and len(env.possible_agents) > 1:
                    stats[_left(env)]["returns"] += 1
                direction = step_direction
            if not in_play or scored or lost:
                direction = 0
            last_x = x if in_play else None
        for a in env.possible_agents:
            stats[a]["games"] += 1
    return stats


def _right(env):
    return next(a for a in env.possible_agents if a in RIGHT_SEATS)


def _left(env):
    return next(a for a in env.possible_agents if a not in RIGHT_SEATS)


def row(label, seat, c):
    games = c["games"]
    chances = c["returns"] + c["lost_rally"]
    rate = c["returns"] / chances if chances else float("nan")
    per = lambda k: c[k] / games  # noqa: E731
    assert c["side_mismatch"] <= 0.05 * max(c["lost_rally"], 1), (seat, c)  # the RAM reading agrees with the rewards
    print(f"| {label} | {seat} | {games} | {per('won_rally'):.1f} | {per('lost_rally'):.1f} | "
          f"{per('lost_timeout'):.1f} | {per('returns'):.1f} | {rate:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint or export file, or 'random'")
    parser.add_argument("--games", type=int, default=4)
    parser.add_argument("--epsilon", type=float, default=0.05)
    parser.add_argument("--env", default="pong_v3", help="with 'random' or --seat: the env to play")
    parser.add_argument("--self-play", action="store_true",
                        help="the checkpoint's agents in every seat (training's games)")
    parser.add_argument("--seat", help="play a single-agent checkpoint in this seat of --env (e.g. first_0)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print("| player | seat | games | rally points won / game | rally points lost / game | "
          "serve timeouts lost / game | returns / game | return rate |")
    print("|---|---|---|---|---|---|---|---|")
    if args.checkpoint == "random":
        env = make_atari_env(args.env)
        stats = play(env, None, None, args.games, 1.0, rng)
        for seat in env.possible_agents:
            row("random", seat, stats[seat])
        return
    env = make_atari_env(args.env if args.seat else load_checkpoint(args.checkpoint)[1].env)
    agents = load_agents(args.checkpoint, seed=0)
    if args.self_play:
        stats = play(env, agents, None, args.games, args.epsilon, rng)
        for seat in env.possible_agents:
            row(f"{args.checkpoint} in self-play", seat, stats[seat])
        return
    for seat in [args.seat] if args.seat else env.possible_agents:
        stats = play(env, agents, seat, args.games, args.epsilon, rng)
        opponent = "built-in player" if len(env.possible_agents) == 1 else "random"
        row(f"{args.checkpoint} vs {opponent}", seat, stats[seat])


if __name__ == "__main__":
    main()
