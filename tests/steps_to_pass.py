"""Steps to the learning tests' pass rule: a hook that evaluates the current networks during training.

``StepsToPass(factory, check_every, rule)`` evaluates every ``check_every`` agent steps after
learn_start, as the final evaluation does (20 episodes at epsilon eval_ep on the final evaluation's
seeds, against random agents on the same seeds), and stops the run at the first step the rule holds.
"""

import madqn
from madqn.evaluation.agents import Agents
from madqn.training.trainer import Hook


class StepsToPass(Hook):
    def __init__(self, factory, check_every, rule):
        self.factory, self.check_every, self.rule = factory, check_every, rule
        self.passed_at = None
        self.random = None
        self.history = []

    def on_step(self, trainer):
        c = trainer.config
        if trainer.step <= c.learn_start or trainer.step % self.check_every:
            return
        seed = c.seed + 1_000_000
        if self.random is None:
            self.random = madqn.evaluate(self.factory, "random", episodes=20, seed=seed).mean_scores()
        agents = Agents.from_trainer(trainer, seed=c.seed)
        scores = madqn.evaluate(self.factory, agents, episodes=20, epsilon=c.eval_ep, seed=seed,
                                max_steps=c.eval_steps, config=c).mean_scores()
        self.history.append((trainer.step, scores))
        if self.rule(scores, self.random):
            self.passed_at = trainer.step
            trainer.stop_requested = True
