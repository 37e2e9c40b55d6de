"""`python -m coevo.run`: the main job (Hydra). Overrides: `proposer=qwen3-4b solver=qwen2.5-7b`."""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from coevo.config import register_schema, to_object
from coevo.stack import format_summary, load_stack_summary

register_schema()


@hydra.main(config_path="../configs", config_name="coevo", version_base="1.3")
def main(dcfg: DictConfig) -> None:
    cfg = to_object(dcfg)
    print(format_summary(load_stack_summary(cfg)), flush=True)


if __name__ == "__main__":
    main()
