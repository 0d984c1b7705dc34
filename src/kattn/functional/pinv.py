"""The iterative pseudo-inverse of Nyströmformer and Skyformer.

:func:`iterative_pinv` is the third-order hyper-power (Newton–Schulz type) iteration of
Razavi et al. used by Nyströmformer and Skyformer:
``Z ← ¼ Z (13I − MZ (15I − MZ (7I − MZ)))``. From ``Z₀ = Mᵀ / (‖M‖₁ ‖M‖_∞)`` it converges to
``M⁺`` for any M, because ``‖I − M Z₀‖ < 1`` on the range of M. From ``Z₀ = I`` it converges
to ``M⁻¹`` when ``‖I − M‖₂ < 1``: the condition Skyformer states for its preconditioned
matrix (Chen et al., NeurIPS 2021, §4.4, Lemma 3, after Razavi et al., Theorem 2). Each step
maps the residual ``R = I − MZ`` to ``R³(3I + R)/4``, so the start that leaves the smaller
residual converges faster: ``1 − λ`` from the identity against ``1 − λ²/s`` from ``Mᵀ/s``
for a symmetric M with eigenvalue λ in (0, 1]. :func:`iterative_pinv_solve` applies the same
iterate to a right-hand side for less work.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import int_at_least
from .numerics import autocast_off, without_autocast

#: ``init`` options of :func:`iterative_pinv`.
PINV_INITS = ("per_matrix", "global", "identity")


@without_autocast
def iterative_pinv(m: Tensor, iterations: int = 6, *, init: str = "per_matrix") -> Tensor:
    """Approximate pseudo-inverse of each ``(..., n, n)`` matrix by the hyper-power iteration.

    Args:
        m: ``(..., n, n)`` matrices (computed in fp32 at least).
        iterations: number of updates (6 in Nyströmformer and Skyformer).
        init: ``"per_matrix"`` scales ``Z₀ = Mᵀ / (‖M‖₁‖M‖_∞)`` per matrix (convergent for
            every matrix); ``"global"`` uses the released code's single maximum column sum over
            the whole batch, ``Z₀ = Mᵀ / max colsum`` (for comparing with published numbers;
            it can diverge for matrices far from the largest one, and makes each result
            depend on the other matrices of the batch); ``"identity"`` starts from
            ``Z₀ = I`` (Skyformer §4.4), which converges to ``M⁻¹`` only when
            ``‖I − M‖₂ < 1`` (not to a pseudo-inverse of a singular M: its null space grows
            by 3.25 a step).

    Returns:
        ``(..., n, n)`` in the accumulation dtype of ``m``.
    """
    _check_pinv_args(m, iterations, init)
    m = m.to(torch.promote_types(m.dtype, torch.float32))
    z = _initial_inverse(m, init)
    batch, n = m.shape[:-2], m.shape[-1]
    m, z = m.reshape(-1, n, n), z.reshape(-1, n, n)
    eyes = _identities(m)
    for _ in range(iterations):
        z = torch.bmm(z, _step_polynomial(torch.bmm(m, z), eyes)[-1])
    return z.reshape(*batch, n, n)


@without_autocast
def iterative_pinv_solve(
    m: Tensor, rhs: Tensor, iterations: int = 6, *, init: str = "per_matrix"
) -> Tensor:
    """``iterative_pinv(m, iterations, init=init) @ rhs`` without forming the pseudo-inverse.

    With ``X₀ = M Z₀`` the iterates are ``Z_{k+1} = Z_k p(X_k)`` and ``X_{k+1} = X_k p(X_k)``,
    so ``Z_n = Z₀ p(X₀) p(X₁) ⋯ p(X_{n−1})``; every ``p(X_k)`` is a polynomial in
    ``X₀`` (``M Mᵀ/s``, or M itself from the identity), so they commute and are applied to
    ``rhs`` as they come: three ``(n, n)`` products a step instead of four, and
    ``(n, n) × (n, c)`` ones for the rest (from the identity, no product with Z₀ at all).
    Equal to :func:`iterative_pinv` then a product, up to rounding (the same polynomial).
    Once differentiable: the backward pass through the steps is written out, each gradient
    accumulated inside a product.

    Args:
        m: ``(..., n, n)``; rhs: ``(..., n, c)``; iterations, init: of :func:`iterative_pinv`.

    Returns:
        ``(..., n, c)`` in the accumulation dtype of ``m``.
    """
    _check_pinv_args(m, iterations, init)
    if rhs.dim() < 2 or rhs.shape[-2] != m.shape[-1]:
        raise ValueError(f"rhs must be (..., {m.shape[-1]}, c), got {tuple(rhs.shape)}")
    m = m.to(torch.promote_types(m.dtype, torch.float32))
    batch = torch.broadcast_shapes(m.shape[:-2], rhs.shape[:-2])
    n, c = m.shape[-1], rhs.shape[-1]
    u = rhs.to(m.dtype).expand(*batch, n, c).reshape(-1, n, c)
    z0 = None
    if init != "identity":  # Z₀ = I: X₀ = M and Z₀ u = u
        z0 = _initial_inverse(m, init).expand(*batch, n, n).reshape(-1, n, n)
    m = m.expand(*batch, n, n).reshape(-1, n, n)
    if iterations > 0:
        u = _SolveSteps.apply(m if z0 is None else torch.bmm(m, z0), u, iterations)[0]
    return (u if z0 is None else torch.bmm(z0, u)).reshape(*batch, n, c)


def _check_pinv_args(m: Tensor, iterations: int, init: str) -> None:
    int_at_least("iterations", iterations, 0)
    if init not in PINV_INITS:
        raise ValueError(f"init must be one of {PINV_INITS}, got {init!r}")
    if m.dim() < 2 or m.shape[-1] != m.shape[-2]:
        raise ValueError(f"m must be (..., n, n), got shape {tuple(m.shape)}")


def _initial_inverse(m: Tensor, init: str) -> Tensor:
    """``Z₀ = Mᵀ/s``: s = ‖M‖₁‖M‖_∞ per matrix, or the largest column sum of the batch
    (``"global"``); pinv(0) = 0 with a finite gradient (no division by a zero scale). Or
    ``Z₀ = I`` (``"identity"``)."""
    if init == "identity":
        return torch.eye(m.shape[-1], device=m.device, dtype=m.dtype).expand(m.shape)
    if init == "global":
        scale = m.sum(dim=-2).amax()
    else:
        abs_m = m.abs()
        scale = abs_m.sum(dim=-2).amax(dim=-1) * abs_m.sum(dim=-1).amax(dim=-1)
        scale = scale[..., None, None]
    return m.transpose(-1, -2) / torch.where(scale != 0, scale, torch.ones_like(scale))


def _identities(m: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The multiples of I in :func:`_step_polynomial`, made once per call."""
    eye = torch.eye(m.shape[-1], device=m.device, dtype=m.dtype)
    return 1.75 * eye, -3.75 * eye, 3.25 * eye


def _step_polynomial(
    x: Tensor, eyes: tuple[Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """``p(X) = ¼(13I − X(15I − X(7I − X))) = 3.25I + X(−3.75I + X(1.75I − ¼X))`` for 3-D X,
    the identity terms and the ¼ folded into the products: ``a = 1.75I − ¼X``,
    ``inner = −3.75I + X a`` and ``p = 3.25I + X inner`` (the first two for backward)."""
    eye_a, eye_b, eye_c = eyes
    a = torch.add(eye_a, x, alpha=-0.25)
    inner = torch.baddbmm(eye_b, x, a)
    return a, inner, torch.baddbmm(eye_c, x, inner)


class _SolveSteps(torch.autograd.Function):
    """``u_n = p(X_{n−1}) ⋯ p(X₀) u₀`` with ``X_{k+1} = X_k p(X_k)`` for 3-D ``X₀ (N, n, n)``
    and ``u₀ (N, n, c)``; the last ``p(X) u`` by Horner's rule on u (no ``(n, n)`` product).
    The intermediates are extra, non-differentiable outputs, so that they are saved through
    ``save_for_backward`` (version checks, saved-tensor hooks, functorch)."""

    @staticmethod
    def forward(x: Tensor, u: Tensor, iterations: int) -> tuple[Tensor, ...]:
        with autocast_off(x):
            eyes = _identities(x)
            steps: list[Tensor] = []
            for _ in range(iterations - 1):
                a, inner, p = _step_polynomial(x, eyes)
                u, x = torch.bmm(p, u), torch.bmm(x, p)
                steps += [a, inner, p, u, x]
            # p(X) u = 3.25u + X(−3.75u + X(1.75u − ¼Xu))
            t = torch.bmm(x, u).mul_(-0.25).add_(u, alpha=1.75)
            t2 = torch.baddbmm(u, x, t, beta=-3.75)
            return torch.baddbmm(u, x, t2, beta=3.25), t, t2, *steps

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        x, u, _ = inputs
        _, *extras = output
        ctx.mark_non_differentiable(*extras)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, u, *extras)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor | None, *_: Tensor | None) -> tuple[Tensor | None, ...]:
        if grad is None:
            return None, None, None
        x, u, t, t2, *rest = ctx.saved_tensors
        steps = []  # (X_k, a_k, inner_k, p_k, u_k) of the full steps
        for i in range(0, len(rest), 5):
            a, inner, p, u_next, x_next = rest[i : i + 5]
            steps.append((x, a, inner, p, u))
            x, u = x_next, u_next
        need_x = ctx.needs_input_grad[0]
        with autocast_off(grad):
            grad = grad.to(x.dtype)
            # the last step: u' = 3.25u + X t2, t2 = −3.75u + X t, t = 1.75u − ¼Xu
            grad_t2 = torch.bmm(x.mT, grad)
            grad_t = torch.bmm(x.mT, grad_t2)
            grad_u = grad.mul(3.25).add_(grad_t2, alpha=-3.75).add_(grad_t, alpha=1.75)
            grad_u.baddbmm_(x.mT, grad_t, alpha=-0.25)
            if not need_x:
                for _, _, _, p, _ in reversed(steps):
                    grad_u = torch.bmm(p.mT, grad_u)
                return None, grad_u, None
            grad_x = torch.bmm(grad, t2.mT).baddbmm_(grad_t2, t.mT)
            grad_x.baddbmm_(grad_t, u.mT, alpha=-0.25)
            for x, a, inner, p, u in reversed(steps):  # u' = p u, X' = X p
                grad_p = torch.bmm(grad_u, u.mT).baddbmm_(x.mT, grad_x)
                grad_u = torch.bmm(p.mT, grad_u)
                grad_prev = torch.bmm(grad_x, p.mT).baddbmm_(grad_p, inner.mT)
                grad_inner = torch.bmm(x.mT, grad_p)  # p = 3.25I + X inner
                grad_prev.baddbmm_(grad_inner, a.mT)  # inner = −3.75I + X a
                grad_prev.add_(torch.bmm(x.mT, grad_inner), alpha=-0.25)  # a = 1.75I − ¼X
                grad_x = grad_prev
        return grad_x, grad_u, None
