"""The training configuration: hydra YAML in ``configs/``, validated into frozen dataclasses.

    >>> from agentrl.config import compose_config
    >>> config = compose_config(["model=tiny", "train.group_num=2"])    # agentrl train ...
    >>> config.train.group_num, config.run_dir.parts[-3:]
    (2, ('runs', 'agentrl', 'quick'))
    >>> saved = config.to_dict()                                         # plain, for checkpoints

- :mod:`agentrl.config.schema`: the dataclasses (one per section of ``configs/base.yaml``,
  every key documented) and :func:`build_config`, which validates a plain mapping.
- :mod:`agentrl.config.fields`: :class:`Section`, a dataclass that coerces and checks its own
  fields, and building one from a mapping (unknown keys named).
- :mod:`agentrl.config.verl_rules`: what the verl backend refuses (the rules that hold with
  ``backend=verl`` only).
- :mod:`agentrl.config.compose`: :func:`compose_config`, hydra's composition of
  ``base.yaml`` with ``agents.yaml``, a hardware preset and a model preset.
"""

from agentrl.config.compose import compose_config, default_config_dir, group_options
from agentrl.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    HardwareConfig,
    LoraConfig,
    ModelConfig,
    RolloutConfig,
    TrainConfig,
    TrainerConfig,
    TrainGroupsConfig,
    ValConfig,
    VerlConfig,
    build_config,
)

__all__ = [
    "ActorConfig", "AlgorithmConfig", "CriticConfig", "HardwareConfig", "LoraConfig",
    "ModelConfig", "RolloutConfig", "TrainConfig", "TrainGroupsConfig", "TrainerConfig",
    "ValConfig", "VerlConfig", "build_config", "compose_config", "default_config_dir", "group_options",
]
