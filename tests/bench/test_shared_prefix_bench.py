"""scripts/bench/shared_prefix.py on the tiny model: one rollout, the actor update timed with
and without the shared prefix; the shared runs read fewer tokens and keep fewer activations."""

from __future__ import annotations

import json


def test_shared_runs_read_fewer_tokens_on_the_same_batch(load_script, tmp_path, one_torch_thread):
    bench = load_script("scripts/bench/shared_prefix.py")
    out = tmp_path / "shared_prefix.json"
    result = bench.main(["--micro-batch-sizes", "2", "4", "--repeats", "1", "--out", str(out),
                         "model=tiny", "threads=1", "train.group_num=2", "train.group_size=2",
                         "rollout.max_new_tokens=8"])
    assert json.loads(out.read_text()) == result
    assert result["rows_in_batch"] == 4 and result["presets"] == ["tightSokobanAgent"]
    runs = {(r["micro_batch_size"], r["shared_prefix_tokens"]): r for r in result["runs"]}
    assert set(runs) == {(2, 0), (2, 32), (4, 0), (4, 32)}
    for micro in (2, 4):
        off, on = runs[(micro, 0)], runs[(micro, 32)]
        assert off["tokens_read"] >= result["batch_tokens"]  # every real token, and padding
        assert on["tokens_read"] < off["tokens_read"] / 1.5  # the prompt is most of a row
        assert on["activation_mb"] < off["activation_mb"]
        assert on["speedup_same_micro"] > 0 and len(on["seconds"]) == 1
