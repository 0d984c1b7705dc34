"""The fast Walsh–Hadamard transform behind FastFood (Le et al., ICML 2013): equal to the
explicit Sylvester matrix, differentiable, its own inverse when normalised."""

import pytest
import torch

from kattn.functional import hadamard_matrix, hadamard_transform, next_power_of_two


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_hadamard_transform_equals_the_explicit_matrix(n):
    x = torch.randn(3, 5, n, dtype=torch.float64, generator=gen(0), requires_grad=True)
    h = hadamard_matrix(n, dtype=torch.float64)
    fast, dense = hadamard_transform(x), x @ h
    torch.testing.assert_close(fast, dense)
    w = torch.randn(3, 5, n, dtype=torch.float64, generator=gen(1))
    (g_fast,) = torch.autograd.grad((fast * w).sum(), x)
    (g_dense,) = torch.autograd.grad((dense * w).sum(), x)
    torch.testing.assert_close(g_fast, g_dense)


def test_hadamard_matrix_is_sylvester_and_transform_is_differentiable_twice():
    h = hadamard_matrix(8, dtype=torch.float64)
    torch.testing.assert_close(h @ h, 8 * torch.eye(8, dtype=torch.float64))
    torch.testing.assert_close(h, h.T)
    assert h[1].tolist() == [1, -1, 1, -1, 1, -1, 1, -1]  # Sylvester order
    x = torch.randn(2, 16, dtype=torch.float64, generator=gen(2), requires_grad=True)
    assert torch.autograd.gradcheck(hadamard_transform, (x,))
    assert torch.autograd.gradgradcheck(hadamard_transform, (x,))
    y = hadamard_transform(x, normalized=True)
    torch.testing.assert_close(hadamard_transform(y, normalized=True), x)  # its own inverse


def test_hadamard_transform_refuses_other_sizes():
    with pytest.raises(ValueError, match="power of two"):
        hadamard_transform(torch.randn(4, 12))
    assert [next_power_of_two(n) for n in (1, 2, 3, 12, 64, 65)] == [1, 2, 4, 16, 64, 128]
