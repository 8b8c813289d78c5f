"""Model loading: the tiny test model, chat templates, name errors, the embedded model's cache."""

from __future__ import annotations

import json
import sys
import time

import pytest
import torch

from agentrl.models import (
    CHAT_TEMPLATES,
    ModelNotFoundError,
    cache_root,
    end_of_turn_ids,
    load_model,
    load_tokenizer,
    loading,
)

CHAT = [
    {"role": "system", "content": "You play Sokoban."},
    {"role": "user", "content": "State: #@_$.#"},
    {"role": "assistant", "content": "<answer>Up</answer>"},
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_llama3():
    return load_model("tiny-llama3")


def test_tiny_model_is_small_seeded_and_fast(tiny):
    model, tokenizer = tiny
    start = time.perf_counter()
    again, _ = load_model("tiny")  # the tokenizer is cached by now
    assert time.perf_counter() - start < 3
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer)
    assert not model.training and model.dtype == torch.float32
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_tokenizer_special_tokens_are_set(tiny):
    _, tokenizer = tiny
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>"  # transformers' GGUF reader says <|im_start|>
    assert tokenizer.pad_token_id is not None
    assert end_of_turn_ids(tokenizer) == [im_end]
    text = "a , b . c"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_two_chat_templates_render_every_role_differently(tiny, tiny_llama3):
    renders = {}
    for name, (_, tokenizer) in {"tiny": tiny, "tiny-llama3": tiny_llama3}.items():
        text = tokenizer.apply_chat_template(CHAT, tokenize=False)
        for message in CHAT:
            assert message["role"] in text and message["content"] in text
        ids = tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=False)
        eot = end_of_turn_ids(tokenizer)[0]
        assert ids.count(eot) == 3, name  # each of the three turns ends with the token
        assert tokenizer.decode([eot]) in ("<|im_end|>", "<|eot_id|>")
        prompt = tokenizer.apply_chat_template(CHAT[:2], add_generation_prompt=True, tokenize=False)
        assert text.startswith(prompt), name  # the generation prompt opens the assistant turn
        renders[name] = (text, eot)
    assert renders["tiny"][0] != renders["tiny-llama3"][0]
    assert renders["tiny"][1] != renders["tiny-llama3"][1]
    assert renders["tiny-llama3"][0].startswith("<|begin_of_text|><|start_header_id|>system")


def test_llama3_variant_shares_the_tiny_weights(tiny, tiny_llama3):
    (model, tokenizer), (model3, tokenizer3) = tiny, tiny_llama3
    assert len(tokenizer3) == len(tokenizer) + 4
    assert model3.config.vocab_size == len(tokenizer3)
    assert model3.config.eos_token_id == tokenizer3.convert_tokens_to_ids("<|eot_id|>")
    base = model.get_input_embeddings().weight
    assert torch.equal(model3.get_input_embeddings().weight[: len(base)], base)
    assert torch.equal(
        model3.model.layers[1].mlp.up_proj.weight, model.model.layers[1].mlp.up_proj.weight
    )
    again, _ = load_model("tiny", chat_template="llama3")
    assert torch.equal(again.get_input_embeddings().weight, model3.get_input_embeddings().weight)
    assert load_tokenizer("tiny-llama3").chat_template == CHAT_TEMPLATES["llama3"].jinja


def test_jinja_template_override():
    tokenizer = load_tokenizer(
        "tiny", chat_template="{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    )
    assert (
        tokenizer.apply_chat_template(CHAT[:2], tokenize=False)
        == "[You play Sokoban.][State: #@_$.#]"
    )


def test_local_folder_round_trip(tiny, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model(str(tmp_path))
    ids = torch.tensor([tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=False)])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert loaded_tokenizer.pad_token_id == tokenizer.pad_token_id


def test_a_model_loaded_from_gguf_saves_as_an_ordinary_one(tiny, tmp_path):
    """transformers 5.17 leaves a GGUF quantizer on a model loaded from a .gguf file (its
    weights de-quantized) and then refuses save_pretrained: the embedded model's conversion."""
    from types import SimpleNamespace

    model, _ = tiny
    model.hf_quantizer = SimpleNamespace(quantization_config=SimpleNamespace(quant_method="gguf"))
    model.config.quantization_config = {"quant_method": "gguf"}
    try:
        with pytest.raises(ValueError, match="not serializable"):
            model.save_pretrained(tmp_path / "refused")
        loading._forget_gguf_quantizer(model)
        model.save_pretrained(tmp_path / "saved")
        assert "quantization_config" not in json.loads((tmp_path / "saved" / "config.json")
                                                       .read_text())
        from transformers import AutoModelForCausalLM

        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
        assert getattr(reloaded, "hf_quantizer", None) is None
        assert torch.equal(reloaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    finally:
        model.hf_quantizer = None
        vars(model.config).pop("quantization_config", None)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("no-such-org/no-such-model", "hub id 'no-such-org/no-such-model'"),
        ("./no/such/folder", "does not exist"),
        ("tiny-mistral", "unknown tiny variant"),
    ],
)
def test_unknown_names_fail_fast_and_list_allowed_forms(monkeypatch, name, expected):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError) as error:
        load_model(name)
    assert time.perf_counter() - start < 10
    assert expected in str(error.value)
    if name != "tiny-mistral":
        assert "'embedded'" in str(error.value) and "'tiny'" in str(error.value)


def test_offline_hub_is_detected_without_retries(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(loading, "_reachable", lambda url: False)
    with pytest.raises(ModelNotFoundError, match="not reachable"):
        load_model("no-such-org/no-such-model")


def test_gguf_header_reader_matches_file_metadata():
    values = loading._gguf_scalars(
        loading.embedded_gguf_path(),
        {
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.bos_token_id",
            "llama.block_count",
            "llama.rope.freq_base",
        },
    )
    assert values == {
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.bos_token_id": 1,
        "llama.block_count": 30,
        "llama.rope.freq_base": 100000.0,
    }


def test_cache_is_atomic_and_rebuilt_when_stale(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))

    def broken(folder):
        (folder / "half-written").write_text("x")
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        loading._cached_folder("thing", broken)
    assert not any(cache_root().iterdir())  # no folder, no leftover temp dir

    builds = []
    build = lambda folder: builds.append((folder / "data").write_text("ok"))
    folder = loading._cached_folder("thing", build)
    assert loading._cached_folder("thing", build) == folder and len(builds) == 1
    record = json.loads((folder / loading.SOURCE_FILE).read_text())
    (folder / loading.SOURCE_FILE).write_text(json.dumps({**record, "format": -1}))
    loading._cached_folder("thing", build)
    assert len(builds) == 2 and sorted(p.name for p in cache_root().iterdir()) == ["thing"]


def test_a_cache_another_process_finished_first_is_kept_not_moved_under_its_readers(
        monkeypatch, tmp_path):
    # processes started together all find no cache and convert; the first to finish renames its
    # folder in and loads from it: a later finisher must not move that folder aside (a reader
    # in between finds no model) but use it
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    first = loading._cached_folder("thing", lambda folder: (folder / "data").write_text("first"))
    record = (first / loading.SOURCE_FILE).read_text()
    import shutil
    shutil.rmtree(first)

    def slow_build(folder):  # while this process converts, another one finishes
        (folder / "data").write_text("second")
        first.mkdir()
        (first / "data").write_text("first")
        (first / loading.SOURCE_FILE).write_text(record)
        moved.append(first.stat().st_ino)

    moved: list[int] = []
    folder = loading._cached_folder("thing", slow_build)
    assert (folder / "data").read_text() == "first" and folder.stat().st_ino == moved[0]
    assert sorted(p.name for p in cache_root().iterdir()) == ["thing"]  # no temp dir left


@pytest.mark.slow
def test_embedded_model_is_converted_once_then_cached(monkeypatch):
    """The one slow test: the first load in a fresh cache de-quantizes the GGUF (~15-40 s)."""
    start = time.perf_counter()
    model, tokenizer = load_model("embedded")
    first = time.perf_counter() - start
    assert (cache_root() / "embedded" / loading.SOURCE_FILE).is_file()

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF file was read although the cache is valid")

    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    for module in list(sys.modules.values()):  # every module that imported the GGUF reader
        if getattr(module, "__dict__", {}).get("load_gguf_checkpoint") is load_gguf_checkpoint:
            monkeypatch.setattr(module, "load_gguf_checkpoint", no_gguf)
    monkeypatch.setattr(loading, "_from_gguf", no_gguf)
    start = time.perf_counter()
    cached, cached_tokenizer = load_model("embedded")
    second = time.perf_counter() - start
    print(f"embedded model: first load {first:.1f} s, cached load {second:.1f} s")

    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert cached_tokenizer.eos_token == "<|im_end|>" and cached_tokenizer.pad_token_id == 2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = torch.tensor(
        [
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        ]
    )
    with torch.no_grad():
        assert torch.equal(cached(ids).logits, model(ids).logits)
        out = cached.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False
        )
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])
