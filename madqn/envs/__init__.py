"""Environments: PettingZoo adapters to the internal multi-agent interface, Atari preprocessing, vector envs.

Knows no learning: imports only ``madqn.envs``, ``madqn.config`` and ``madqn.errors``.
"""
