"""torch.compile of a model using performer gives the eager outputs (one cheap smoke test)."""

import pytest
import torch

import kattn


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_compiled_performer_model_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        kattn.MultiheadAttention(
            32, 4, mechanism="performer", batch_first=True, num_features=16, chunk_size=8
        ),
    ).eval()

    def forward(x, causal):
        h = model[0](x)
        return model[1](h, is_causal=causal)[0]

    compiled = torch.compile(forward, backend="inductor", fullgraph=False)
    x = torch.randn(2, 20, 16)
    with torch.no_grad():
        for causal in (False, True):
            torch.testing.assert_close(
                compiled(x, causal), forward(x, causal), rtol=1e-4, atol=1e-5
            )
