"""madqn: multi-agent DQN3.0 for PettingZoo environments.

Data flows env -> actor -> replay -> learner; see docs/architecture.md.
"""

from madqn.config import Config, make_config
from madqn.errors import CheckpointError, ConfigError, MadqnError, NonFiniteError
from madqn.core.learner import DQN3RMSprop, Learner, q_targets
from madqn.api import RunResult, train
from madqn.training.trainer import EpisodeRecord, Hook, Trainer
from madqn.evaluation.agents import Agents, load_agents
from madqn.envs.adapters import make_env
from madqn.evaluation import EvalResult, RandomPolicy, evaluate

__version__ = "0.1.0"

__all__ = ["Config", "make_config", "MadqnError", "ConfigError", "CheckpointError", "NonFiniteError",
           "DQN3RMSprop", "Learner", "q_targets", "RunResult", "train", "Hook", "EpisodeRecord", "Trainer", "Agents",
           "load_agents", "make_env", "EvalResult", "RandomPolicy", "evaluate", "__version__"]
