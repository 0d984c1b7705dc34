"""The ``linear`` schedule of BERT's pre-training (Luo et al. 2021, Appendix A.1; the
KL-Transformer's min(i/w, (I − i)/(I − w))): a linear warm-up to the peak, then a linear decay
that reaches 0 at the last step."""

import pytest
import torch

from kattn.train.config import OptimConfig
from kattn.train.schedules import build_optimizer, schedule_factor


def test_linear_rises_to_the_peak_then_falls_to_zero_at_the_end():
    warmup, total = 4, 12
    factors = [schedule_factor("linear", step, warmup, total) for step in range(total + 1)]
    assert factors[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert factors[4:] == pytest.approx([(total - s) / (total - warmup) for s in range(4, 13)])
    assert factors[-1] == 0.0 and max(factors) == 1.0
    # the KL-Transformer's formula, steps counted from 1
    kl = [min(i / warmup, (total - i) / (total - warmup)) for i in range(1, total + 1)]
    assert factors[:total] == pytest.approx(
        [min(1.0, f) for f in kl[:warmup]] + kl[warmup - 1 : -1]
    )
    assert schedule_factor("linear", 5, 0, 10) == pytest.approx(0.5)  # no warm-up


def test_the_optimiser_steps_the_linear_schedule():
    model = torch.nn.Linear(2, 2)
    optim = OptimConfig(lr=1e-3, schedule="linear", warmup_steps=2)
    optimizer, scheduler = build_optimizer(model, optim, total_steps=6)
    rates = []
    for _ in range(6):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([5e-4, 1e-3, 1e-3, 0.75e-3, 0.5e-3, 0.25e-3])
