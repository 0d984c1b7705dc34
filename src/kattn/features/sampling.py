"""Random projections ``W`` (M, D) for random-feature maps (Choromanski et al. 2021 §2.4).

* ``gaussian``: iid rows ``w ~ N(0, I_D)``.
* ``orthogonal`` (ORF): rows orthogonal within each block of D, each row rescaled to the norm of
  an independent ``N(0, I_D)`` vector, so every row is still marginally Gaussian.
* ``sphere``: iid rows uniform on the sphere of radius √D (Luo et al. 2021 §4.5, "Sphere-PRF").
"""

from __future__ import annotations

import torch
from torch import Tensor

SAMPLINGS = ("orthogonal", "gaussian", "sphere")


def gaussian_projection(m: int, d: int, generator: torch.Generator | None = None) -> Tensor:
    """``(m, d)`` iid standard normal rows."""
    return torch.randn(m, d, generator=generator)


def orthogonal_projection(m: int, d: int, generator: torch.Generator | None = None) -> Tensor:
    """``(m, d)`` rows orthogonal in blocks of d, with chi-distributed norms."""
    blocks = []
    for start in range(0, m, d):
        gaussian = torch.randn(d, d, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gaussian)
        q = q * torch.sign(torch.diagonal(r))  # Haar-distributed orthogonal matrix
        blocks.append(q.T[: min(d, m - start)])
    rows = torch.cat(blocks)
    norms = torch.randn(m, d, generator=generator, dtype=torch.float64).norm(dim=1)
    return (rows * norms[:, None]).float()


def sphere_projection(m: int, d: int, generator: torch.Generator | None = None) -> Tensor:
    """``(m, d)`` iid rows uniform on the sphere of radius √d."""
    w = torch.randn(m, d, generator=generator)
    return w * (d**0.5 / w.norm(dim=1, keepdim=True))


def sample_projection(
    sampling: str, m: int, d: int, generator: torch.Generator | None = None
) -> Tensor:
    """Draw an ``(m, d)`` projection with the named scheme."""
    samplers = {
        "orthogonal": orthogonal_projection,
        "gaussian": gaussian_projection,
        "sphere": sphere_projection,
    }
    if sampling not in samplers:
        raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    return samplers[sampling](m, d, generator)
