"""Games as text environments, registered with Gymnasium as ``agentrl/<Game>-v0``.

>>> import gymnasium, agentrl
>>> env = gymnasium.make("agentrl/Sokoban-v0", preset="6x6")
>>> obs, info = env.reset(seed=0)

Gymnasium's wrappers do not forward custom methods: use ``env.unwrapped.valid_actions()`` and
``env.unwrapped.oracle_plan()``.
"""

from __future__ import annotations

import gymnasium

GAMES = {
    "Sokoban": "agentrl.envs.sokoban:SokobanEnv",
    "Tetris": "agentrl.envs.tetris:TetrisEnv",
    "BlocksWorld": "agentrl.envs.blocksworld:BlocksWorldEnv",
    "TextWorld": "agentrl.envs.textworld:TextWorldEnv",
    "Bandit": "agentrl.envs.bandit:BanditEnv",
    "BabyAI": "agentrl.envs.babyai:BabyAIEnv",
    "TextWorldExpress": "agentrl.envs.textworld_express:TextWorldExpressEnv",
}
"""Game name -> lazy entry point (modules import only when an env is made)."""


def env_id(game: str) -> str:
    return f"agentrl/{game}-v0"


def register_all() -> None:
    for game, entry_point in GAMES.items():
        if env_id(game) not in gymnasium.registry:
            # The passive checker samples Text spaces and warns on free text; our contract test
            # checks the API instead.
            gymnasium.register(env_id(game), entry_point=entry_point, disable_env_checker=True)


register_all()
