"""coevo/train/precision.py: optimizer state allocated at build is the state a first step would create."""
from __future__ import annotations

import copy

import torch

from coevo.train.precision import allocate_optimizer_state


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    torch.manual_seed(seed)
    loss = model(torch.randn(7, 5)).pow(2).sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def test_allocation_changes_no_weight_and_leaves_zero_moments_at_step_zero() -> None:
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.3)
    allocate_optimizer_state(opt)
    for p, old in zip(model.parameters(), before):
        assert torch.equal(p, old)  # bitwise: lr 0 makes decay and update exactly zero
        assert p.grad is None
        state = opt.state[p]
        assert float(state["step"]) == 0.0
        assert torch.count_nonzero(state["exp_avg"]) == 0 and torch.count_nonzero(state["exp_avg_sq"]) == 0
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg"].shape == p.shape
    assert [g["lr"] for g in opt.param_groups] == [0.5]


def test_steps_after_allocation_equal_torchs_lazy_ones_bitwise() -> None:
    eager, lazy = _model(), _model()
    opt_eager = torch.optim.AdamW(eager.parameters(), lr=1e-2, weight_decay=0.1)
    opt_lazy = torch.optim.AdamW(lazy.parameters(), lr=1e-2, weight_decay=0.1)
    allocate_optimizer_state(opt_eager)
    for seed in (1, 2, 3):  # bias correction uses the step count: three steps check it was reset
        _step(eager, opt_eager, seed)
        _step(lazy, opt_lazy, seed)
    for a, b in zip(eager.parameters(), lazy.parameters()):
        assert torch.equal(a, b)
    assert float(opt_eager.state[next(eager.parameters())]["step"]) == 3.0


def test_allocation_is_skipped_when_state_exists() -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, opt, 1)
    state = copy.deepcopy(opt.state_dict())
    allocate_optimizer_state(opt)  # e.g. after a checkpoint's state was loaded: nothing to do
    after = opt.state_dict()
    assert after["state"].keys() == state["state"].keys()
    for key, value in state["state"].items():
        assert float(after["state"][key]["step"]) == float(value["step"]) == 1.0
        assert torch.equal(after["state"][key]["exp_avg"], value["exp_avg"])
