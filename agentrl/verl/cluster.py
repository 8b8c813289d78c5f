"""The Ray cluster a GPU run joins: how many GPUs it has, and whether every node can run verl.

    python -m agentrl.verl.cluster            # "16 8": the cluster's GPUs and GPUs per node
                                              # (exit 1 when no cluster is running)

    from agentrl.verl.cluster import check_cluster
    config, notes = check_cluster(config)     # before the launch (agentrl.verl.launch)

verl's ``main_ppo`` calls ``ray.init()`` with no address, which joins the cluster named by
``RAY_ADDRESS`` or the last ``ray start`` on this node, else starts a one-node cluster.
:func:`cluster_address` makes the same choice without joining. With a cluster running,
:func:`check_cluster` joins it, counts its GPU nodes and runs one probe task on each
(:func:`probe_node`), then:

- **GPUs.** A run asking for more nodes or GPUs per node than the cluster has is refused (verl
  would wait for them forever); a run using fewer says what is left idle. The example scripts
  count the cluster's GPUs (this module's command line), so two nodes of 8 are 16 GPUs, not 8.
- **Same checkout, shared run folder.** Ray starts verl's workers with the launcher's
  ``PYTHONPATH`` (this checkout) and the TaskRunner, on any node, reads the task files and
  writes checkpoints under ``run_dir``: a node without this checkout at the same path, or
  without the launcher's ``run_dir`` (a marker file written here, read there), is refused.
- **flash-attn.** Looked up on every node: when any node lacks it, the whole run uses PyTorch's
  sdpa attention (one attention for every rank; a node without flash-attn would otherwise fail
  with ImportError when verl builds the model).

Without a cluster (one node, started by verl itself), flash-attn is looked up here and
``verl.nnodes`` above 1 is refused: the other nodes' GPUs could never join.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import socket
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.config import TrainConfig

__all__ = ["GpuNode", "NodeProbe", "check_cluster", "cluster_address", "gpu_nodes", "judge",
           "layout", "probe_node", "probe_nodes"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MARKER_PREFIX = ".agentrl-shared-check-"
RAY_START_HINT = ("start one first: `ray start --head` on one node, then `ray start "
                  "--address=<head>:6379` on every other (docs/HARDWARE.md, several nodes)")


@dataclasses.dataclass(frozen=True)
class GpuNode:
    """A live Ray node with GPUs (``ray.nodes()``)."""

    node_id: str
    host: str
    gpus: int


@dataclasses.dataclass(frozen=True)
class NodeProbe:
    """What :func:`probe_node` found on one node."""

    host: str
    checkout: bool
    """This checkout's ``agentrl`` package is at the same path there."""
    shared: bool
    """The launcher's marker file in ``run_dir`` is readable there, with its content."""
    flash_attn: bool


# -- the cluster's GPUs ----------------------------------------------------------------------------
def cluster_address() -> str | None:
    """The cluster ``ray.init()`` with no address would join (None: it would start one)."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(None)
    except (ConnectionError, ValueError):
        return None


def gpu_nodes(ray_nodes: Iterable[Mapping[str, Any]]) -> list[GpuNode]:
    """The live nodes with GPUs in ``ray.nodes()``'s records, largest first."""
    nodes = [GpuNode(str(node["NodeID"]), str(node.get("NodeManagerHostname")
                                              or node.get("NodeManagerAddress", "?")),
                     int(node.get("Resources", {}).get("GPU", 0)))
             for node in ray_nodes if node.get("Alive")]
    return sorted((node for node in nodes if node.gpus > 0), key=lambda node: -node.gpus)


def layout(nodes: Sequence[GpuNode]) -> tuple[int, int]:
    """(nodes, GPUs per node) verl can use of ``nodes``: verl asks every node for the same
    number of GPUs, so the smallest node sets it."""
    return (len(nodes), min(node.gpus for node in nodes)) if nodes else (0, 0)


def _joined(address: str) -> Any:
    import ray

    return ray.init(address=address, logging_level="ERROR", log_to_driver=False)


def _cluster_nodes(address: str) -> list[GpuNode]:
    import ray

    _joined(address)
    try:
        return gpu_nodes(ray.nodes())
    finally:
        ray.shutdown()


# -- one probe per node ----------------------------------------------------------------------------
def probe_node(checkout: str, marker: str, token: str) -> NodeProbe:
    """What this node has: run on every node by :func:`probe_nodes`."""
    try:
        shared = Path(marker).read_text() == token
    except OSError:
        shared = False
    return NodeProbe(host=socket.gethostname(),
                     checkout=(Path(checkout) / "agentrl" / "__init__.py").is_file(),
                     shared=shared, flash_attn=importlib.util.find_spec("flash_attn") is not None)


def probe_nodes(node_ids: Sequence[str], run_dir: Path) -> list[NodeProbe]:
    """:func:`probe_node` on each of ``node_ids`` (Ray already joined), against a marker file
    written into ``run_dir`` here."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    run_dir.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    marker = run_dir / f"{MARKER_PREFIX}{token[:8]}"
    marker.write_text(token)
    try:
        remote = ray.remote(num_cpus=0)(probe_node)
        return ray.get([remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            node_id, soft=False)).remote(str(PROJECT_ROOT), str(marker), token)
            for node_id in node_ids])
    finally:
        marker.unlink(missing_ok=True)


# -- the verdict -----------------------------------------------------------------------------------
def judge(config: TrainConfig, nodes: Sequence[GpuNode], probes: Sequence[NodeProbe]
          ) -> tuple[bool, list[str]]:
    """(flash-attn on every node, notes) for ``config`` on a cluster of ``nodes``, whose nodes
    verl may place the run on were probed as ``probes``; ValueError naming the key or the node
    when the run cannot work there."""
    v = config.verl
    have_nodes, have_per_node = layout(nodes)
    shape = f"{have_nodes} GPU node(s) ({_hosts(nodes)})"
    eligible = sum(node.gpus >= v.n_gpus_per_node for node in nodes)
    if v.nnodes > eligible:
        raise ValueError(
            f"verl.nnodes={v.nnodes} x verl.n_gpus_per_node={v.n_gpus_per_node} is not allowed: "
            f"the running Ray cluster has {shape}, {eligible} of them with "
            f"{v.n_gpus_per_node} GPUs, and verl would wait for the missing GPUs forever; "
            f"allowed: verl.nnodes <= {eligible} (or `ray start` the missing nodes)")
    notes = [f"Ray cluster: {shape}; this run uses {v.nnodes} x {v.n_gpus_per_node} GPUs"]
    idle = sum(node.gpus for node in nodes) - v.nnodes * v.n_gpus_per_node
    if idle:
        notes.append(f"{idle} of the cluster's GPUs stay idle: GPUS={have_nodes * have_per_node} "
                     f"(verl.nnodes={have_nodes} verl.n_gpus_per_node={have_per_node}) uses them")
    for problem, message in (
            ("checkout", f"has no checkout at {PROJECT_ROOT}: every node needs this checkout at "
                         "the same path (a shared filesystem, or the same clone there)"),
            ("shared", f"cannot read the run folder {config.run_dir}: run_dir must be on a "
                       "filesystem every node shares (task files, checkpoints)")):
        missing = [probe.host for probe in probes if not getattr(probe, problem)]
        if missing:
            raise ValueError(f"node(s) {', '.join(missing)} {message}")
    without = [probe.host for probe in probes if not probe.flash_attn]
    if without:
        notes.append(f"flash-attn missing on {', '.join(without)}: every node uses sdpa")
    return not without, notes


def _hosts(nodes: Sequence[GpuNode]) -> str:
    return ", ".join(f"{node.host}: {node.gpus}" for node in nodes)


def check_cluster(config: TrainConfig, address: Callable[[], str | None] = cluster_address
                  ) -> tuple[bool, list[str]]:
    """(flash-attn on every node the run uses, notes): the cluster checks of the module
    docstring. ValueError (key or node, and the fix) when the run cannot work there."""
    found = address()
    if found is None:
        if config.verl.nnodes > 1:
            raise ValueError(f"verl.nnodes={config.verl.nnodes} is not allowed without a running "
                             f"Ray cluster (verl would start a one-node cluster here and wait "
                             f"for the other nodes forever): {RAY_START_HINT}; allowed: 1")
        return importlib.util.find_spec("flash_attn") is not None, []
    import ray

    try:
        _joined(found)
    except ConnectionError as error:
        raise ValueError(f"the Ray cluster at {found} (RAY_ADDRESS, or the last `ray start` on "
                         f"this node) cannot be joined, and verl's ray.init() would join it "
                         f"too: start it again, or `ray stop` to run without one ({error})"
                         ) from None
    try:
        nodes = gpu_nodes(ray.nodes())
        if not nodes:
            raise ValueError(f"the Ray cluster at {found} has no GPU node: {RAY_START_HINT}")
        # verl's placement groups choose the nodes: every node it may choose is probed
        probes = probe_nodes([node.node_id for node in nodes
                              if node.gpus >= config.verl.n_gpus_per_node], config.run_dir)
    finally:
        ray.shutdown()
    return judge(config, nodes, probes)


def main() -> int:
    """Print the running cluster's "GPUS GPUS_PER_NODE" (as the example scripts take them);
    exit 1 when no cluster is running or it has no GPU node."""
    found = cluster_address()
    if found is None:
        return 1
    try:
        nodes = _cluster_nodes(found)
    except ConnectionError:
        return 1
    count, per_node = layout(nodes)
    if not count:
        return 1
    print(count * per_node, per_node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
