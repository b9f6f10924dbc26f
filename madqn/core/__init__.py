"""The DQN3.0 core: Q-networks, the update (q_targets, DQN3RMSprop, Learner), replay, acting maths.

Imports nothing of madqn outside ``madqn.core`` (docs/architecture.md).
"""
