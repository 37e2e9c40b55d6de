"""A run on an existing two-node Ray cluster (both nodes on this machine, `ray.cluster_utils.Cluster`).

Each node carries a custom resource (`node_a`, `node_b`) and the smoke run's roles are pinned to
them through `<role>.resources`. The run completes, run.log and config.yaml name both nodes, a
solver actor on the second node generates with its updated weights after an update, and a
request no node can hold fails in seconds. Every process the test starts is gone at its end.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# node_a: 0.5 + 0.5 + 1 + 1 CPU of its 3 (two retrieval replicas, both pinned by retrieval.resources); node_b: 0.5 + 1.
PINNED = {"proposer": "node_a", "ranker": "node_a", "retrieval": "node_a", "solver": "node_b", "evidence": "node_b"}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _weight_update_reaches_the_engine(address: str, cfg, node_b: str) -> None:
    """A solver actor pinned to node_b: greedy log-probs of one prompt change after one update."""
    import ray

    from coevo.core.types import SamplingParams, TrainSequence
    from coevo.orchestrate.actors import PolicyWorker, RemotePolicy
    from coevo.orchestrate.cluster import placement_options, request_of

    _, opts = placement_options({"solver": request_of(0.5, 0, {"node_b": 0.1})}, "spread")
    actor = ray.remote(PolicyWorker).options(**opts["solver"]).remote(cfg.solver, "solver", 0)
    solver = RemotePolicy(actor, cfg.solver, "solver")
    assert ray.get(actor.ready.remote())["node_id"] == node_b
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    prompt = solver.chat_prompt_ids([{"role": "user", "content": "who wrote hamlet"}])
    before = solver.generate([prompt], greedy)[0][0]
    ids = prompt + before.token_ids
    result = solver.update([TrainSequence(ids, [0] * len(prompt) + [1] * len(before.token_ids), 1.0)])
    assert not result.get("skipped"), result
    after = solver.generate([prompt], greedy)[0][0]
    assert before.logprobs is not None and after.logprobs is not None
    assert after.logprobs != before.logprobs  # the engine on node_b generates with the new weights
    ray.kill(actor)


def _missing_corpus_names_node_and_path(tmp_path: Path, node_b: str) -> None:
    """The retrieval actor on node_b checks its corpus before it loads anything."""
    import ray

    from coevo.core.config import compose, to_object
    from coevo.orchestrate.actors import ActorFailure, RetrievalWorker, call
    from coevo.orchestrate.hostpaths import for_workers

    gone = tmp_path / "gone.jsonl"
    cfg = for_workers(to_object(compose(["experiment=smoke", "corpus=jsonl", f"corpus.path={gone}"])))
    actor = ray.remote(RetrievalWorker).options(num_cpus=0.5, resources={"node_b": 0.1}).remote(cfg)
    with pytest.raises(ActorFailure, match=rf"^the retrieval actor on node {node_b[:12]} \(host .+\) cannot use what "
                                           rf"it needs: corpus.path: {gone} does not exist; every node"):
        call(actor.ready.remote(), "retrieval start-up")


@pytest.mark.slow
def test_run_on_a_two_node_cluster(tmp_path, small_corpus):
    import ray
    from ray.cluster_utils import Cluster

    from coevo.core.config import compose, to_object
    from coevo.orchestrate.actors import create_actors
    from coevo.orchestrate.cluster import SchedulingError

    temp_dir = tempfile.mkdtemp(prefix="coevo-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    # Cluster() writes the head's address to the default temp dir's ray_current_cluster whatever temp_dir is,
    # without creating that directory: on a machine where no Ray session has left /tmp/ray it fails
    # (FileNotFoundError), which made this test pass or fail with the machine's history.
    os.makedirs(os.path.dirname(ray._private.utils.get_ray_address_file(None)), exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "resources": {"node_a": 1},
                                                            "include_dashboard": False, "temp_dir": temp_dir})
    try:
        cluster.add_node(num_cpus=2, resources={"node_b": 1})
        cluster.wait_for_nodes()
        node_a, node_b = (n.node_id for n in cluster.list_all_nodes())
        ray_pids = [p.process.pid for n in cluster.list_all_nodes() for ps in n.all_processes.values() for p in ps]
        run_dir = tmp_path / "run"
        cmd = [sys.executable, "-m", "coevo.run", "experiment=smoke", "corpus=jsonl", f"corpus.path={small_corpus}",
               f"run.dir={run_dir}", f"ray.address={cluster.address}", "run.steps=1", "retrieval.replicas=2",
               *(f"{r}.num_cpus=0.5" for r in ("proposer", "solver", "ranker")),
               *(f"+{role}.resources.{label}=0.1" for role, label in PINNED.items())]
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "[step 1/1]" in proc.stdout and "ray: 6 actors on 2 node(s)" in proc.stdout, proc.stdout[-3000:]
        placement = yaml.safe_load((run_dir / "config.yaml").read_text())["placement"]
        assert {role: p["node_id"] for role, p in placement.items()} == {
            **{role: node_a if label == "node_a" else node_b for role, label in PINNED.items()}, "retrieval.1": node_a}
        assert placement["solver"]["resources"] == {"CPU": 0.5, "node_b": 0.1}
        log = (run_dir / "run.log").read_text()
        assert f"actor solver on node {node_b}" in log and f"actor proposer on node {node_a}" in log
        actor_pids = [p["pid"] for p in placement.values()]

        ray.init(address=cluster.address, include_dashboard=False, configure_logging=False)
        try:
            cfg = to_object(compose(["experiment=smoke", "solver.lr=0.05", f"ray.address={cluster.address}"]))
            _weight_update_reaches_the_engine(cluster.address, cfg, node_b)
            _missing_corpus_names_node_and_path(tmp_path, node_b)
            # Refused before any actor starts (check_schedulable), not after ray.ready_timeout_s of waiting.
            with pytest.raises(SchedulingError, match=r"the solver actor requests CPU 1, GPU 1, more than any node"):
                create_actors(to_object(compose(["experiment=smoke", "solver.num_gpus=1",
                                                 f"ray.address={cluster.address}"])))
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in ray_pids + actor_pids):
        time.sleep(0.5)
    assert not [p for p in ray_pids + actor_pids if _alive(p)]
