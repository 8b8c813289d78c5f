"""Chat templates by name, and the end-of-turn tokens a template writes.

The rollout layer works on token ids (token-in/token-out), so it needs two facts about a
tokenizer's chat template: how turns are rendered (``tokenizer.apply_chat_template``) and which
token closes an assistant turn. :func:`end_of_turn_ids` reads the second from the template itself
instead of a table of model names.

Named templates exist so tests can run the same tiny model under two different formats:

- ``chatml``: ``<|im_start|>role\\ncontent<|im_end|>\\n`` (Qwen, SmolLM2 without its default
  system prompt); ends a turn with ``<|im_end|>``.
- ``llama3``: Llama-3-Instruct's format (``<|begin_of_text|>``, ``<|start_header_id|>role
  <|end_header_id|>\\n\\n``, content stripped of surrounding whitespace, ``<|eot_id|>``); ends a
  turn with ``<|eot_id|>``. The strip is Llama 3's own: rendered text is not a plain
  concatenation of the messages, which is exactly what token-in/token-out code must survive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and the special tokens it needs in the vocabulary."""

    jinja: str
    special_tokens: tuple[str, ...]
    """Added to the tokenizer (as special tokens) when missing."""
    eos_token: str
    """Becomes ``tokenizer.eos_token``: the token that closes an assistant turn."""
    bos_token: str | None = None
    """Becomes ``tokenizer.bos_token`` when set (the template writes it; encoding never adds it)."""


CHATML = ChatTemplate(
    jinja=(
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    special_tokens=("<|im_start|>", "<|im_end|>"),
    eos_token="<|im_end|>",
)

LLAMA3 = ChatTemplate(
    jinja=(
        "{% for message in messages %}"
        "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
        " + message['content'] | trim + '<|eot_id|>' %}"
        "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
        "{{ content }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}"
    ),
    special_tokens=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    eos_token="<|eot_id|>",
    bos_token="<|begin_of_text|>",
)

CHAT_TEMPLATES: dict[str, ChatTemplate] = {"chatml": CHATML, "llama3": LLAMA3}
"""Named templates for ``load_model(..., chat_template=NAME)`` and ``"tiny-NAME"``."""

_PROBE = "agentrl-end-of-turn-probe"


def apply_chat_template_override(tokenizer: Any, template: str) -> int:
    """Give ``tokenizer`` a named template (adding its special tokens) or a raw Jinja string.

    Returns how many tokens were added to the vocabulary; the caller must grow the model's
    embeddings to ``len(tokenizer)`` when that is not 0. Pad stays as it was: any id works for
    padding because attention masks, not ids, mark it.
    """
    if template in CHAT_TEMPLATES:
        spec = CHAT_TEMPLATES[template]
        vocab = tokenizer.get_vocab()
        missing = [t for t in spec.special_tokens if t not in vocab]
        added = tokenizer.add_tokens(missing, special_tokens=True) if missing else 0
        tokenizer.chat_template = spec.jinja
        tokenizer.eos_token = spec.eos_token
        if spec.bos_token is not None:
            tokenizer.bos_token = spec.bos_token
        return added
    if "{{" in template or "{%" in template:
        tokenizer.chat_template = template
        return 0
    raise ValueError(
        f"unknown chat template {template!r}: use one of {sorted(CHAT_TEMPLATES)} "
        "or pass a Jinja template string"
    )


def end_of_turn_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """Token ids that end an assistant turn: the one the chat template writes, then eos, then
    every end-of-sequence id of the model's ``generation_config``.

    The first id is what the template puts right after an assistant message's content
    (``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama 3), found by rendering a probe
    conversation, so it is the token to append when a reply was cut off before it. Then
    ``tokenizer.eos_token_id`` if different, then :func:`generation_eos_ids` (Qwen2.5 lists
    ``<|im_end|>`` and ``<|endoftext|>``: a reply ending on either is finished, as vLLM and
    ``generate`` stop on both). Pass the list as ``SamplingParams.stop_token_ids``.
    """
    ids: list[int] = []
    turn_end = _template_turn_end(tokenizer)
    if turn_end is not None:
        ids.append(turn_end)
    for eos in (tokenizer.eos_token_id, *generation_eos_ids(generation_config)):
        if eos is not None and eos not in ids:
            ids.append(int(eos))
    if not ids:
        raise ValueError("tokenizer has neither a chat template turn end nor an eos token")
    return ids


def generation_eos_ids(generation_config: Any) -> list[int]:
    """``generation_config.eos_token_id`` as a list (it may be one id, a list, or missing)."""
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(t) for t in (eos if isinstance(eos, (list, tuple)) else [eos])]


def _template_turn_end(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after an assistant message, if any."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # noqa: BLE001 - a template may reject the probe (e.g. needs a system turn)
        return None
    if not isinstance(text, str) or _PROBE not in text:
        return None
    suffix = text.split(_PROBE, 1)[1]
    suffix_ids = tokenizer.encode(suffix, add_special_tokens=False) if suffix else []
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    if suffix_ids and suffix_ids[0] in special:
        return int(suffix_ids[0])
    return None
