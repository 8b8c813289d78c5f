"""A run never ends worse than its best: the best checkpoint by held-out validation is kept
beside the last (``checkpoints/best.json`` names it; ``keep_last`` pruning spares it), a run
folder stands for it unless ``last`` or ``step_N`` is asked for, and a run stops early after
``trainer.early_stop_patience`` validations without a gain or when the policy's entropy falls
below ``trainer.early_stop_entropy``.

The trainer tests script what a step and a validation report (no games are played), so the
best step and the stop are the test's choice; tests/test_cli_train.py runs the real thing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.config import compose_config
from agentrl.trainers import checkpoint as ckpt
from agentrl.trainers.checkpoint import (
    BestRecord, checkpoint_step, list_checkpoints, model_folder, read_best, run_checkpoint,
    save_checkpoint, write_best,
)
from agentrl.trainers.local import LocalTrainer
from agentrl.trainers.tracking import read_metrics


class FakeModel:
    def save_pretrained(self, folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "config.json").write_text("{}")


def steps(run_dir) -> list[int]:
    return [checkpoint_step(p) for p in list_checkpoints(run_dir)]


# -- checkpoints ------------------------------------------------------------------------------

def test_keep_last_spares_the_kept_steps(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, models={"actor": FakeModel()}, keep_last=2,
                        keep_steps=(2,))
    assert steps(tmp_path) == [2, 4, 5]
    ckpt.prune_checkpoints(tmp_path, 2)
    assert steps(tmp_path) == [4, 5]


def test_best_json_round_trips_and_names_only_a_complete_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 3, models={"actor": FakeModel()})
    record = BestRecord(step=3, val_success=0.5, val={"banditAgent": 0.5})
    path = write_best(tmp_path, record)
    assert path == tmp_path / "checkpoints" / "best.json"
    assert read_best(tmp_path) == record == read_best(tmp_path / "checkpoints")
    assert json.loads(path.read_text())["checkpoint"] == "step_000003"
    assert not list(path.parent.glob("best.json.tmp-*"))  # written aside, then renamed
    with pytest.raises(ValueError, match="only name a complete checkpoint"):
        write_best(tmp_path, BestRecord(step=4, val_success=0.9))
    assert read_best(tmp_path) == record  # the old pointer stands
    path.write_text("{not json")
    with pytest.raises(ValueError, match="best.json is damaged.*checkpoint=last"):
        read_best(tmp_path)


def test_a_run_folder_stands_for_its_best_unless_asked_for_another(tmp_path):
    run = tmp_path / "run"
    save_checkpoint(run, 1, models={"actor": FakeModel()})
    assert run_checkpoint(run).name == "step_000001"  # no best.json: the newest
    best = save_checkpoint(run, 2, models={"actor": FakeModel()})
    write_best(run, BestRecord(step=2, val_success=0.75))
    last = save_checkpoint(run, 3, models={"actor": FakeModel()}, keep_last=1, keep_steps=(2,))
    assert model_folder(run) == best / "actor"
    assert model_folder(run, "best") == best / "actor"
    assert model_folder(run, "last") == last / "actor"
    assert model_folder(run, "step_3") == model_folder(run, "3") == last / "actor"
    assert ckpt.chosen_model(str(run), None) == str(run)
    assert ckpt.chosen_model(str(run), "last") == str(last)
    with pytest.raises(ValueError, match=r"checkpoint .*step_000001: no such folder.*step_000002, "
                                         r"step_000003"):
        model_folder(run, "step_1")  # pruned
    with pytest.raises(ValueError, match="checkpoint='worst' is not allowed; allowed: best, last"):
        model_folder(run, "worst")
    with pytest.raises(ValueError, match="is not a run folder"):
        model_folder(last, "last")
    with pytest.raises(ValueError, match="--checkpoint last .* --model .* is not a run folder"):
        ckpt.chosen_model(str(last), "last")


def test_a_damaged_best_checkpoint_is_named_not_replaced_by_another(tmp_path):
    run = tmp_path / "run"
    best = save_checkpoint(run, 1, models={"actor": FakeModel()})
    write_best(run, BestRecord(step=1, val_success=0.5))
    save_checkpoint(run, 2, models={"actor": FakeModel()})
    (best / "actor" / "config.json").write_text("{} ")  # another size
    with pytest.raises(ValueError, match=r"the best checkpoint .*step_000001 \(best.json\): "
                                         r"actor/config.json has .*checkpoint=last"):
        model_folder(run)
    assert model_folder(run, "last").parent.name == "step_000002"


def test_a_crashed_best_json_write_is_cleaned_up(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "best.json.tmp-999999999").write_text("{")  # a process that is gone
    save_checkpoint(tmp_path, 1, models={"actor": FakeModel()})
    assert not (root / "best.json.tmp-999999999").exists()


# -- config -------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("trainer.early_stop_patience=-1", "trainer.early_stop_patience"),
    ("trainer.early_stop_patience=1.5", "trainer.early_stop_patience"),
    ("trainer.early_stop_entropy=-0.1", "trainer.early_stop_entropy"),
    ("trainer.early_stop_entropy=nan", "trainer.early_stop_entropy"),
])
def test_bad_early_stop_values_fail_naming_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        compose_config([override])


def test_patience_without_validation_is_refused():
    with pytest.raises(ValueError, match="trainer.early_stop_patience=2 .* val.test_freq=0"):
        compose_config(["trainer.early_stop_patience=2", "val.test_freq=0"])
    compose_config(["trainer.early_stop_patience=0", "val.test_freq=0"])  # 0 = off
    config = compose_config([])
    assert config.trainer.early_stop_patience is None and config.trainer.early_stop_entropy is None


def test_early_stop_is_refused_on_verl():
    with pytest.raises(ValueError, match="trainer.early_stop_patience=3 is not allowed with "
                                         "backend='verl'"):
        compose_config(["hardware=a100", "trainer.early_stop_patience=3"])


# -- the trainer ------------------------------------------------------------------------------

def scripted_trainer(tmp_path, val: dict[int, float], *overrides: str,
                     entropy: dict[int, float] | None = None) -> LocalTrainer:
    """A tiny trainer whose steps play nothing (``actor/entropy`` from ``entropy``) and whose
    validation at step s reports ``val[s]`` as the held-out success."""
    config = compose_config([
        "model=tiny", f"run_dir={tmp_path / 'run'}", "threads=1", "trainer.logger=[]",
        "trainer.plot=false", "algorithm.adv_estimator=grpo", "train.presets=[banditAgent]",
        "val.presets=[banditAgent]", "val.test_freq=1", "trainer.save_freq=0",
        "trainer.keep_last=1", *overrides])
    trainer = LocalTrainer(config)
    trainer.train_step = lambda step: ({"actor/entropy": entropy[step]}
                                       if entropy and step in entropy else {})
    trainer.validate = lambda: {"val/banditAgent/success": val[trainer.step]}
    return trainer


def fit(trainer: LocalTrainer):
    try:
        return trainer.fit()
    finally:
        trainer.close()


def test_the_best_checkpoint_is_kept_beside_the_last(tmp_path, one_torch_thread):
    run = fit(scripted_trainer(tmp_path, {0: 0.9, 1: 0.25, 2: 0.75, 3: 0.5, 4: 0.75},
                               "train.total_steps=4"))
    run_dir = tmp_path / "run"
    assert steps(run_dir) == [2, 4]  # keep_last=1 and the best
    assert read_best(run_dir) == BestRecord(step=2, val_success=0.75,
                                            val={"banditAgent": 0.75})  # a tie is no gain
    assert (run.best, run.best_checkpoint) == (read_best(run_dir), run_dir / "checkpoints"
                                               / "step_000002")
    assert run.checkpoint.name == "step_000004" and run.last_val_success == 0.75
    assert model_folder(run_dir).parent.name == "step_000002"
    assert model_folder(run_dir, "last").parent.name == "step_000004"


def test_patience_stops_after_n_validations_without_gain(tmp_path, one_torch_thread):
    run = fit(scripted_trainer(tmp_path, {0: 0.0, 1: 0.5, 2: 0.25, 3: 0.5, 4: 1.0, 5: 1.0},
                               "train.total_steps=5", "trainer.early_stop_patience=2"))
    assert run.step == 3 and run.stopped.startswith("2 validations without a gain")
    assert [r["step"] for r in read_metrics(run.metrics)] == [0, 1, 2, 3]
    assert steps(tmp_path / "run") == [1, 3]  # the best, and the stopped step saved as the last
    assert run.best.step == 1


def test_patience_counts_only_after_the_warm_start(tmp_path, one_torch_thread):
    trainer = scripted_trainer(tmp_path, {0: 0.0, 1: 0.5, 2: 0.25, 3: 0.25, 4: 0.25},
                               "train.total_steps=4", "train.sft_steps=2",
                               "trainer.early_stop_patience=1")
    trainer.warm_start.close()  # the scripted steps train nothing
    trainer.warm_start = None
    run = fit(trainer)
    assert run.step == 3 and run.best.step == 1  # step 2's loss is the warm start's


def test_collapsed_entropy_stops_the_run_at_that_step(tmp_path, one_torch_thread):
    run = fit(scripted_trainer(tmp_path, {0: 0.0, 1: 0.5, 2: 0.25, 3: 0.25},
                               "train.total_steps=3", "trainer.early_stop_entropy=0.05",
                               "val.test_freq=3", entropy={1: 0.9, 2: 0.01, 3: 0.8}))
    assert run.step == 2 and "entropy 0.01 below trainer.early_stop_entropy=0.05" in run.stopped
    records = read_metrics(run.metrics)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[-1]["val/banditAgent/success"] == 0.25  # the stopped step is validated
    assert steps(tmp_path / "run") == [2]  # and saved; it is also the best validated


def test_resume_restores_the_best_and_an_early_stop(tmp_path, one_torch_thread):
    val = {0: 0.0, 1: 0.5, 2: 0.25, 3: 0.25, 4: 0.6, 5: 0.75, 6: 0.0}
    first = fit(scripted_trainer(tmp_path, val, "train.total_steps=2", "trainer.save_freq=1"))
    assert (first.best.step, first.step) == (1, 2)
    (tmp_path / "run" / "checkpoints" / "best.json").unlink()  # a crash before the pointer
    second = fit(scripted_trainer(tmp_path, val, "train.total_steps=6",
                                  "trainer.early_stop_patience=2"))
    assert second.step == 3 and second.best.step == 1  # steps 2 and 3 without a gain
    assert read_best(tmp_path / "run").step == 1  # the pointer is written again on resume
    again = fit(scripted_trainer(tmp_path, val, "train.total_steps=6",
                                 "trainer.early_stop_patience=2"))
    assert again.step == 3 and again.stopped  # an early-stopped run is not trained again
    assert [r["step"] for r in read_metrics(again.metrics)] == [0, 1, 2, 3]
    going_on = fit(scripted_trainer(tmp_path, val, "train.total_steps=6",
                                    "trainer.early_stop_patience=3"))
    assert going_on.step == 6 and going_on.best.step == 5  # a looser patience goes on


def test_a_run_started_over_forgets_the_old_best(tmp_path, one_torch_thread):
    fit(scripted_trainer(tmp_path, {0: 0.0, 1: 0.5, 2: 0.25}, "train.total_steps=2"))
    assert read_best(tmp_path / "run").step == 1
    run = fit(scripted_trainer(tmp_path, {}, "train.total_steps=2", "resume=never",
                               "val.test_freq=0", "val.before_train=false"))
    assert run.best is None and read_best(tmp_path / "run") is None  # nothing validated
    assert model_folder(tmp_path / "run").parent.name == "step_000002"
