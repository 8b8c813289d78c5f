"""Agent presets: the settings of one game-playing agent, validated into a frozen dataclass.

Presets live in ``configs/agents.yaml`` (every key is documented there, in its
``preset_defaults`` block, which is merged under each preset)::

    >>> from agentrl.agents import load_agent_presets
    >>> presets = load_agent_presets()          # <repo>/configs/agents.yaml
    >>> presets["simpleSokobanAgent"].max_turns
    6

The default path is resolved from this file (``<repo>/configs/agents.yaml``), which works for
the editable install the project uses; a wheel install has no ``configs/`` and must pass
``path``. Hydra users compose the same file and hand the node to :func:`agent_presets_from_dict`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.agents.parsing import ANSWER_FORMATS
from agentrl.envs import GAMES

CONTEXTS = ("history", "state")
"""``AgentConfig.context``: what a turn's prompt holds besides the opening text."""
RULES_TEXTS = ("full", "brief")
"""``AgentConfig.rules``: how much fixed text opens the first user message."""

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "configs" / "agents.yaml"
"""``<repo>/configs/agents.yaml``: found from the package, not from the working directory."""

DEFAULTS_KEY = "preset_defaults"
"""The block merged under every preset. Not ``defaults``: Hydra reserves that key for its
Defaults List (a mapping there makes composition fail), and this file is composed by Hydra."""

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful agent playing a text game. Follow the answer format exactly."
)
MAX_SEPARATOR_CHARS = 8
AUTO = "auto"
FORMAT_MARGIN = 0.1
"""How far ``format_penalty: auto`` sits below the worst legal turn (the old flat penalty), so a
malformed reply is strictly worse than any turn of legal actions, even in a game whose legal
actions never cost anything (TextWorld, Bandit)."""


@dataclass(frozen=True)
class AgentConfig:
    """One agent preset. Validated on construction: a bad value raises ValueError naming the
    key and the allowed values. ``env_kwargs`` is a dict (so instances are not hashable); treat
    it as read-only."""

    game: str
    """Which game: a key of ``agentrl.envs.GAMES`` (Sokoban, Tetris, BlocksWorld, TextWorld,
    Bandit, BabyAI, TextWorldExpress)."""
    env_kwargs: dict = field(default_factory=dict)
    """Passed to ``gymnasium.make("agentrl/<game>-v0", **env_kwargs)``: ``preset`` + overrides."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """The system message of every episode."""
    instructions: str = ""
    """Extra text opening the first user message; the rules text (``rules``) follows it."""
    enable_think: bool = True
    """Require ``<think>…</think>`` before ``<answer>…</answer>`` (else answer only)."""
    answer_format: str = "tagged"
    """``tagged``: actions inside ``<answer></answer>`` (the rules above); ``plain``: the whole
    reply is the answer, no tags (for a tiny model on a one-word task; needs
    ``enable_think=False``). See :mod:`agentrl.agents.parsing`."""
    max_turns: int = 6
    """Model replies per episode; the episode ends after this many."""
    max_actions_per_turn: int = 5
    """Actions run from one reply; extra ones are dropped (and counted)."""
    max_actions_all_turns: int = 10
    """Actions run in the whole episode; the episode ends when they are spent."""
    action_separator: str = "||"
    """Text between actions in the answer: 1-8 punctuation characters, no '<', '>' or spaces."""
    format_penalty: float | str = "auto"
    """Reward (<= 0) for a reply that breaks the format; no action is run that turn. ``auto``
    (default): :meth:`format_penalty_for` the game, strictly below the worst well-formed turn
    (legal actions, or text the game cannot parse), so breaking the format never pays better
    than writing it."""
    format_credit: bool = False
    """Grade a malformed reply by how far it got toward the format (:func:`format_progress`):
    its reward rises from ``format_penalty`` toward the worst well-formed turn's by that share,
    never reaching it. So a group whose replies all break the format still differs where one
    wrote more of the tags, and writing the format still pays best."""
    history_window: int = 0
    """Past turns kept in the prompt: 0 = all, K = the last K (instructions always kept).
    ``context: history`` only."""
    context: str = "history"
    """What each turn's prompt holds. ``history``: one growing chat (the opening, then each
    reply and the feedback and new state after it; ``history_window`` drops the oldest turns).
    ``state``: every turn is a fresh chat, the opening rebuilt for the current state (system
    prompt, the instructions and rules, the state with its goal and the turns left): no earlier
    reply, no feedback. A reply is then trained on its own turn's chat, one row a turn, as
    with ``history_window: 1`` but without the first prompt and the previous reply in it."""
    rules: str = "full"
    """The fixed text after ``instructions``. ``full``: the game's rules, the answer format
    with an example, and the limits (turns, actions, the format penalty, the reply's token
    cap). ``brief``: the game's ``brief_rules`` (what a move is) and a one-line answer
    example; each state's heading names the turns left (and the actions left where the
    action budget is tighter than the turns). Only games with ``brief_rules``: BlocksWorld."""
    max_response_tokens: int = 400
    """Token limit of one reply (the rollout's sampling ``max_tokens``)."""
    held_out_of: str | None = None
    """The training preset (one without ``held_out_of``) this one is the held-out harder twin
    of; None for a training preset. Checked against the other presets at load time."""

    def __post_init__(self) -> None:
        if isinstance(self.env_kwargs, Mapping):
            object.__setattr__(self, "env_kwargs", dict(self.env_kwargs))  # a private copy
        if _is_number(self.format_penalty):  # "auto" stays a string: the Agent resolves it
            object.__setattr__(self, "format_penalty", float(self.format_penalty))
        for key, (ok, allowed) in RULES.items():
            value = getattr(self, key)
            if not ok(value):
                raise ValueError(f"{key}={value!r} is not allowed; allowed: {allowed}")
        if self.answer_format == "plain" and self.enable_think:
            raise ValueError("enable_think=True is not allowed with answer_format='plain'; "
                             "allowed: enable_think=false (a plain reply has no think block)")
        if self.context == "state" and self.history_window:
            raise ValueError(f"history_window={self.history_window} is not allowed with "
                             "context='state' (every turn is a fresh chat, no past turn is "
                             "kept); allowed: 0")

    @property
    def windowed(self) -> bool:
        """A reply is sampled from less than the whole episode so far (``history_window > 0``
        or ``context: state``): training takes one row per context window, and verl needs its
        V1 trainer for that (:mod:`agentrl.verl.windows`)."""
        return self.history_window > 0 or self.context == "state"

    def format_penalty_for(self, worst_action_reward: float) -> float:
        """The reward of a malformed reply in a game whose action texts pay at least
        ``worst_action_reward`` each (the env's property of that name: legal actions, and text
        the game cannot parse where that costs more).

        ``auto`` = ``worst x k - FORMAT_MARGIN`` with ``worst = min(0, worst_action_reward)``
        and ``k = max(max_actions_per_turn, ceil(max_actions_all_turns / max_turns))``:
        below a full well-formed turn of the worst action texts (``k >= max_actions_per_turn``),
        and ``max_turns`` malformed replies below spending the whole action budget on them
        (``max_turns x k >= max_actions_all_turns``). So every turn and every episode of
        well-formed replies returns more than breaking the format.
        """
        if self.format_penalty != AUTO:
            return self.format_penalty
        return self.worst_turn_reward(worst_action_reward) - FORMAT_MARGIN

    def worst_turn_reward(self, worst_action_reward: float) -> float:
        """A lower bound on a well-formed turn's reward: ``min(0, worst_action_reward) x k`` (``k``
        as in :meth:`format_penalty_for`)."""
        actions = max(self.max_actions_per_turn,
                      math.ceil(self.max_actions_all_turns / self.max_turns))
        return min(0.0, worst_action_reward) * actions

    def malformed_reward(self, progress: float, worst_action_reward: float) -> float:
        """The reward of a malformed reply that got ``progress`` (in [0, 1)) of the way to the
        format: the penalty, or with ``format_credit`` the penalty plus that share of its gap to
        the worst well-formed turn (none where an explicit penalty is above that turn)."""
        penalty = self.format_penalty_for(worst_action_reward)
        if not self.format_credit:
            return penalty
        gap = max(0.0, self.worst_turn_reward(worst_action_reward) - penalty)
        return penalty + min(max(progress, 0.0), 1.0) * gap


def _is_int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_separator(value: Any) -> bool:
    return (isinstance(value, str) and 1 <= len(value) <= MAX_SEPARATOR_CHARS
            and not any(ch.isspace() or ch.isalnum() or ch in "<>" for ch in value))


RULES: dict[str, tuple[Any, str]] = {
    "game": (lambda v: v in GAMES, f"one of {list(GAMES)}"),
    "env_kwargs": (lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
                   "a mapping of the game's options: preset plus overrides"),
    "system_prompt": (lambda v: isinstance(v, str), "a string"),
    "instructions": (lambda v: isinstance(v, str), "a string ('' for none)"),
    "enable_think": (lambda v: isinstance(v, bool), "true or false"),
    "answer_format": (lambda v: isinstance(v, str) and v in ANSWER_FORMATS,
                      f"one of {list(ANSWER_FORMATS)}"),
    "max_turns": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "max_actions_per_turn": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "max_actions_all_turns": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "action_separator": (_is_separator,
                         f"1-{MAX_SEPARATOR_CHARS} punctuation characters, no '<', '>', letters, "
                         "digits or spaces (e.g. '||', ';', ',')"),
    "format_penalty": (lambda v: v == AUTO or (_is_number(v) and math.isfinite(v) and v <= 0),
                       f"'{AUTO}' or a finite number <= 0"),
    "format_credit": (lambda v: isinstance(v, bool), "true or false"),
    "history_window": (lambda v: _is_int(v, 0), "an integer >= 0 (0 = all turns)"),
    "context": (lambda v: isinstance(v, str) and v in CONTEXTS, f"one of {list(CONTEXTS)}"),
    "rules": (lambda v: isinstance(v, str) and v in RULES_TEXTS, f"one of {list(RULES_TEXTS)}"),
    "max_response_tokens": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "held_out_of": (lambda v: v is None or (isinstance(v, str) and bool(v)),
                    "null or the name of a training preset of the same game"),
}
"""Key -> (check, allowed values in words). One entry per field of AgentConfig."""


# -- loading ---------------------------------------------------------------------------------------
def load_agent_presets(path: str | Path | None = None, *,
                       check_envs: bool = True) -> dict[str, AgentConfig]:
    """Every preset of an agents YAML file (default: ``DEFAULT_PATH``), by name.

    ``check_envs`` also builds each preset's game once (no reset) so that a bad ``env_kwargs``
    fails here, with the preset's name, rather than at the first episode. Raises
    FileNotFoundError for a missing file and ValueError for anything wrong inside it.
    """
    from omegaconf import OmegaConf

    path = DEFAULT_PATH if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"agent presets file not found: {path} (pass path=... when "
                                "agentrl is not installed from a checkout)")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as error:  # noqa: BLE001 - YAML/OmegaConf errors of any kind
        raise ValueError(f"{path}: cannot read agent presets: {error}") from None
    return agent_presets_from_dict(raw, source=str(path), check_envs=check_envs)


def agent_presets_from_dict(raw: Mapping, *, source: str = "agent presets",
                            check_envs: bool = True) -> dict[str, AgentConfig]:
    """Presets from an already loaded mapping (a dict or an OmegaConf node, e.g. Hydra's)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(raw, DictConfig):
        raw = OmegaConf.to_container(raw, resolve=True)
    if not isinstance(raw, Mapping):
        raise ValueError(f"{source}: expected a mapping of preset names, got {type(raw).__name__}")
    defaults = raw.get(DEFAULTS_KEY) or {}
    _check_block(DEFAULTS_KEY, defaults, source)
    presets: dict[str, AgentConfig] = {}
    for name, body in raw.items():
        if name == DEFAULTS_KEY:
            continue
        _check_block(name, body, source)
        try:
            merged = OmegaConf.to_container(OmegaConf.merge(defaults, body), resolve=True)
        except Exception as error:  # noqa: BLE001 - e.g. a list where the defaults have a mapping
            raise ValueError(f"{source}: agent preset {name!r}: cannot merge it over "
                             f"{DEFAULTS_KEY}: {error}") from None
        if merged.get("game") is None:
            raise ValueError(f"{source}: agent preset {name!r}: game is required; allowed: "
                             f"{RULES['game'][1]}")
        try:
            presets[str(name)] = AgentConfig(**merged)
        except ValueError as error:
            raise ValueError(f"{source}: agent preset {name!r}: {error}") from None
    _check_held_out(presets, source)
    if check_envs:
        for name, config in presets.items():
            check_env_kwargs(config, f"{source}: agent preset {name!r}")
    return presets


def _check_block(name: Any, body: Any, source: str) -> None:
    if not isinstance(body, Mapping):
        raise ValueError(f"{source}: agent preset {name!r} must be a mapping of settings, got "
                         f"{body!r}")
    unknown = sorted(str(key) for key in body if key not in RULES)
    if unknown:
        raise ValueError(f"{source}: agent preset {name!r}: unknown key(s) {unknown}; allowed: "
                         f"{list(RULES)}")


def _check_held_out(presets: dict[str, AgentConfig], source: str) -> None:
    """``held_out_of`` must name a *training* preset (no ``held_out_of``) of the same game."""
    for name, config in presets.items():
        twin = config.held_out_of
        if twin is None:
            continue
        target = presets.get(twin)
        if target is None or twin == name or target.game != config.game or target.held_out_of:
            training = sorted(n for n, c in presets.items()
                              if c.game == config.game and c.held_out_of is None and n != name)
            raise ValueError(f"{source}: agent preset {name!r}: held_out_of={twin!r} is not "
                             f"allowed; allowed: null or a training {config.game} preset (one "
                             f"without held_out_of): {training}")


def check_env_kwargs(config: AgentConfig, where: str = "agent config") -> None:
    """Build (and close) the config's game once; a rejected ``env_kwargs``, or ``rules: brief``
    for a game without ``brief_rules``, -> ValueError."""
    import inspect

    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    from agentrl.envs import env_id

    try:
        env = gymnasium.make(env_id(config.game), **config.env_kwargs)
        brief = getattr(env.unwrapped, "brief_rules", "")
        env.close()
    except (TypeError, ValueError) as error:
        creator = load_env_creator(gymnasium.spec(env_id(config.game)).entry_point)
        options = [name for name in inspect.signature(creator).parameters if name != "self"]
        raise ValueError(f"{where}: env_kwargs={config.env_kwargs!r} is not allowed by "
                         f"{config.game} ({error}); allowed keys: {options}") from None
    if config.rules == "brief" and not brief:
        raise ValueError(f"{where}: rules='brief' is not allowed for {config.game}: the game "
                         "has no brief_rules; allowed: 'full'")
