"""Scheduling decisions and host paths of Ray runs, without a cluster (coevo/orchestrate/cluster.py, hostpaths.py)."""
import os
import time

import pytest

from coevo.core.config import compose, to_object
from coevo.orchestrate.cluster import request_of, unschedulable
from coevo.orchestrate.hostpaths import HostPathError, Need, check_host_paths, for_workers, needs

TWO_NODES = {"aaaa": {"CPU": 2.0, "memory": 1e9, "node:10.0.0.1": 1.0}, "bbbb": {"CPU": 2.0, "node_b": 1.0}}


def default_requests(cpus: float = 1.0) -> dict:
    return {**{r: request_of(cpus) for r in ("proposer", "solver", "ranker")},
            "retrieval": request_of(1), "evidence": request_of(1)}


def test_request_leaves_zeros_out():
    assert request_of(0.5, 0, {"node_a": 0.1, "x": 0}) == {"CPU": 0.5, "node_a": 0.1}
    assert request_of(0) == {}


def test_five_cpus_on_two_two_cpu_nodes_names_the_evidence_actor():
    why = unschedulable(default_requests(), TWO_NODES)
    assert why is not None and why.startswith("the evidence actor (CPU 1) cannot be placed beside proposer, solver, "
                                              "ranker, retrieval")
    assert "request CPU 5 in all" in why and "have CPU 4" in why and "node_b 1" in why and "memory" not in why


def test_half_cpu_policies_fit():
    assert unschedulable(default_requests(0.5), TWO_NODES) is None


def test_a_request_larger_than_any_node():
    why = unschedulable({**default_requests(0.5), "solver": request_of(0.5, 1)}, TWO_NODES)
    assert why is not None and why.startswith("the solver actor requests CPU 0.5, GPU 1, more than any node")


def test_a_label_no_node_has():
    assert "node_c" in unschedulable({"proposer": request_of(0.5, 0, {"node_c": 0.1})}, TWO_NODES)


def test_fragmentation_counts_not_only_totals():
    # 3 CPUs asked, 4 in total, but no node holds two 1.5-CPU actors
    assert unschedulable({"a": {"CPU": 1.5}, "b": {"CPU": 1.5}}, TWO_NODES) is None
    assert unschedulable({"a": {"CPU": 1.5}, "b": {"CPU": 1.5}, "c": {"CPU": 1.0}}, TWO_NODES) is not None


def test_workers_get_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.jsonl").write_text('{"id": 1, "title": "t", "text": "x"}\n')
    cfg = to_object(compose(["experiment=smoke", "corpus=jsonl", "corpus.path=c.jsonl", "run.dir=runs/x",
                             "solver.checkpoint=ck"]))
    out = for_workers(cfg)
    assert out.corpus.path == str(tmp_path / "c.jsonl") and out.run.dir == str(tmp_path / "runs/x")
    assert out.solver.checkpoint == str(tmp_path / "ck") and os.path.isabs(out.retrieval.cache_dir)
    assert cfg.corpus.path == "c.jsonl"  # the driver's own config is left as written
    keys = [n.key for n in needs(out, "solver", out.solver)]
    assert keys == ["$COEVO_CACHE", "solver.checkpoint", "run.dir"]
    with pytest.raises(HostPathError, match=r"the solver actor on node - \(host .*\) cannot use what it needs: "
                                            r"solver.checkpoint: .*/ck does not exist"):
        check_host_paths("solver", needs(out, "solver", out.solver))
    assert [n.key for n in needs(out, "evidence")] == ["corpus.path", "retrieval.cache_dir", "$COEVO_CACHE"]
    check_host_paths("evidence", needs(out, "evidence"))  # the corpus exists, the caches can be created


def test_a_path_to_write_needs_a_writable_parent(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        with pytest.raises(HostPathError, match="run.dir: .*/ro/run is not writable"):
            check_host_paths("solver", [Need("run.dir", str(ro / "run"), write=True)])
    finally:
        ro.chmod(0o700)


def test_resources_take_free_keys_on_the_command_line():
    cfg = to_object(compose(["experiment=smoke", "+solver.resources.node_b=0.1", "+evidence.resources.node_a=1"]))
    assert cfg.solver.resources == {"node_b": 0.1} and cfg.evidence.resources == {"node_a": 1.0}
    with pytest.raises(ValueError, match="'resource' is not a key of solver"):
        compose(["+solver.resource.node_b=0.1"])


def test_placement_is_appended_to_config_yaml_once(tmp_path):
    import yaml

    from coevo.orchestrate.cluster import record_placement

    (tmp_path / "config.yaml").write_text("seed: 0\nray:\n  placement: spread\n")
    where = {"node_id": "ab" * 28, "host": "h", "ip": "10.0.0.1", "pid": 7}
    record_placement(tmp_path, {"solver": {**where, "resources": {"CPU": 0.5}}})
    record_placement(tmp_path, {"solver": {**where, "pid": 8, "resources": {"CPU": 0.5}}})  # a resumed run
    stored = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert stored["seed"] == 0 and stored["ray"] == {"placement": "spread"}
    assert stored["placement"] == {"solver": {**where, "pid": 8, "resources": {"CPU": 0.5}}}
    record_placement(tmp_path, {})  # ray.local=true: nothing recorded
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == stored


class _Handle:
    """An actor handle whose `ready` call can be made (the wait is faked)."""

    class ready:  # noqa: N801  the shape of an actor method
        @staticmethod
        def remote():
            return object()


def _nothing_ready(refs, num_returns, timeout):
    """`ray.wait` where no actor becomes ready within the timeout."""
    time.sleep(timeout)
    return [], refs


def test_waiting_actors_are_reported_then_time_out(monkeypatch):
    """Resources held by another job: reports name the pending actors and the free resources, then the timeout."""
    from coevo.core.config import RayConfig
    from coevo.orchestrate import cluster

    said = []
    monkeypatch.setattr(cluster.ray, "wait", _nothing_ready)
    monkeypatch.setattr(cluster, "node_totals", lambda: TWO_NODES)
    monkeypatch.setattr(cluster, "node_free", lambda: {"aaaa": {"CPU": 0.0}, "bbbb": {"CPU": 1.0}})
    monkeypatch.setattr(cluster, "say", said.append)
    requests = default_requests(0.5)
    with pytest.raises(cluster.SchedulingError, match=r"did not start within ray.ready_timeout_s=0.5s; ray: after "):
        cluster.wait_until_ready({n: _Handle for n in requests}, requests,
                                 RayConfig(ready_timeout_s=0.5, report_pending_s=0.1), call=lambda r, w: {})
    assert said and said[0].startswith("ray: after 0s 5 actors wait for resources: proposer (CPU 0.5); ")
    assert said[0].endswith("Free now: node aaaa: CPU 0; node bbbb: CPU 1 (other jobs may hold the rest)")


def test_placed_actors_time_out_naming_what_they_are_doing(monkeypatch):
    """Resources held for every actor but a constructor still busy (an index build): the timeout says so."""
    from coevo.core.config import RayConfig, compose, to_object
    from coevo.orchestrate import actors, cluster

    monkeypatch.setattr(cluster.ray, "wait", _nothing_ready)
    monkeypatch.setattr(cluster, "node_totals", lambda: TWO_NODES)
    monkeypatch.setattr(cluster, "_placed", lambda pg: True)
    monkeypatch.setattr(cluster, "say", lambda line: None)
    cfg = to_object(compose(["corpus=jsonl", "corpus.path=/data/wiki-18.jsonl"]))
    requests = default_requests(0.5)
    with pytest.raises(cluster.SchedulingError) as err:
        cluster.wait_until_ready({n: _Handle for n in requests}, requests,
                                 RayConfig(ready_timeout_s=0.3, report_pending_s=0.1), call=lambda r, w: {},
                                 starting=actors.start_notes(cfg))
    text = str(err.value)
    assert "are placed (the cluster holds their resources) but their constructors had not returned" in text
    assert "not waiting for CPUs/GPUs" in text and "Free now" not in text
    assert ("evidence: loads the corpus, the retriever and the entity index (spaCy over every passage); an index "
            "not in the cache is built here, inside the readiness window; build indexes once, before the run, "
            "with `python -m evidence.build_index corpus.name=jsonl corpus.path=/data/wiki-18.jsonl corpus.mmap=true` "
            "(resumable)"
            ) in text
    assert "solver: loads the solver model" in text
