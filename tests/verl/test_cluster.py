"""The Ray cluster a GPU run joins: its GPUs counted, every node probed (agentrl.verl.cluster)."""

from __future__ import annotations

import importlib.util

import pytest

from agentrl.config import compose_config
from agentrl.verl import cluster
from agentrl.verl.cluster import GpuNode, NodeProbe

GPU = ["hardware=a100", "model=qwen_halfb"]


def two_nodes(gpus: int = 8) -> list[GpuNode]:
    return [GpuNode("a" * 8, "node-a", gpus), GpuNode("b" * 8, "node-b", gpus)]


def probe(host: str, **problems: bool) -> NodeProbe:
    return NodeProbe(**{"host": host, "checkout": True, "shared": True, "flash_attn": True,
                        **problems})


def config_for(tmp_path, *overrides: str):
    return compose_config([*GPU, f"run_dir={tmp_path}", *overrides])


def test_gpu_nodes_read_rays_records_and_skip_dead_and_cpu_nodes():
    records = [
        {"NodeID": "1", "Alive": True, "NodeManagerHostname": "gpu-1", "Resources": {"GPU": 8.0}},
        {"NodeID": "2", "Alive": False, "NodeManagerHostname": "gpu-2", "Resources": {"GPU": 8.0}},
        {"NodeID": "3", "Alive": True, "NodeManagerHostname": "head", "Resources": {"CPU": 4.0}},
        {"NodeID": "4", "Alive": True, "NodeManagerHostname": "gpu-4", "Resources": {"GPU": 4.0}},
    ]
    nodes = cluster.gpu_nodes(records)
    assert [(node.host, node.gpus) for node in nodes] == [("gpu-1", 8), ("gpu-4", 4)]
    assert cluster.layout(nodes) == (2, 4)   # verl asks every node for the same count


def test_two_nodes_used_as_one_say_what_stays_idle(tmp_path):
    config = config_for(tmp_path)                       # verl.nnodes=1 x 8
    flash_attn, notes = cluster.judge(config, two_nodes(), [probe("node-a"), probe("node-b")])
    assert flash_attn
    assert "2 GPU node(s) (node-a: 8, node-b: 8)" in notes[0] and "uses 1 x 8" in notes[0]
    assert "8 of the cluster's GPUs stay idle: GPUS=16" in notes[1]


def test_more_nodes_than_the_cluster_has_are_refused(tmp_path):
    config = config_for(tmp_path, "verl.nnodes=2")
    with pytest.raises(ValueError, match=r"verl.nnodes=2 x verl.n_gpus_per_node=8 is not "
                                         r"allowed.*1 of them with 8 GPUs.*allowed: verl.nnodes <= 1"):
        cluster.judge(config, two_nodes()[:1], [probe("node-a")])


def test_nodes_without_flash_attn_put_every_node_on_sdpa(tmp_path):
    config = config_for(tmp_path, "verl.nnodes=2")
    flash_attn, notes = cluster.judge(config, two_nodes(),
                                      [probe("node-a"), probe("node-b", flash_attn=False)])
    assert not flash_attn
    assert "flash-attn missing on node-b: every node uses sdpa" in notes


@pytest.mark.parametrize(("problem", "message"), [
    ("checkout", r"node\(s\) node-b has no checkout at .*same path"),
    ("shared", r"node\(s\) node-b cannot read the run folder .*shares"),
])
def test_a_node_without_the_checkout_or_the_run_folder_is_refused(tmp_path, problem, message):
    config = config_for(tmp_path, "verl.nnodes=2")
    with pytest.raises(ValueError, match=message):
        cluster.judge(config, two_nodes(), [probe("node-a"), probe("node-b", **{problem: False})])


def test_several_nodes_without_a_cluster_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"verl.nnodes=2 is not allowed without a running Ray "
                                         r"cluster.*ray start --head"):
        cluster.check_cluster(config_for(tmp_path, "verl.nnodes=2"), address=lambda: None)


def test_a_cluster_that_cannot_be_joined_is_named(tmp_path, monkeypatch):
    def refuse(address):
        raise ConnectionError("no GCS there")

    monkeypatch.setattr(cluster, "_joined", refuse)
    with pytest.raises(ValueError, match=r"10.0.0.1:6379 .* cannot be joined.*ray stop"):
        cluster.check_cluster(config_for(tmp_path), address=lambda: "10.0.0.1:6379")


def test_one_node_without_a_cluster_looks_up_flash_attn_here(tmp_path):
    flash_attn, notes = cluster.check_cluster(config_for(tmp_path), address=lambda: None)
    assert flash_attn == (importlib.util.find_spec("flash_attn") is not None) and notes == []


@pytest.mark.slow  # starts Ray
def test_the_probe_runs_on_the_node_and_reads_the_launchers_marker(tmp_path):
    """A real Ray task on this machine's node: the checkout, the marker file, flash-attn."""
    import ray

    ray.init(num_cpus=1, num_gpus=0, include_dashboard=False, logging_level="ERROR")
    try:
        node_id = ray.get_runtime_context().get_node_id()
        found, = cluster.probe_nodes([node_id], tmp_path / "run")
    finally:
        ray.shutdown()
    assert found.checkout and found.shared
    assert found.flash_attn == (importlib.util.find_spec("flash_attn") is not None)
    assert not list((tmp_path / "run").iterdir())               # the marker is removed
    elsewhere = cluster.probe_node(str(tmp_path), str(tmp_path / "missing"), "token")
    assert not elsewhere.checkout and not elsewhere.shared
