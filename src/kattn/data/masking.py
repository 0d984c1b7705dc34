"""BERT's masking for masked language modelling (Devlin et al. 2019, §3.1; the setting of Luo
et al. 2021, Appendix A.1).

Of each sequence's ordinary tokens (not [PAD], [CLS], [SEP] or [MASK]), a share ``mask_prob``
(0.15) is chosen to be predicted; a chosen token is replaced by [MASK] with probability 0.8,
by a random ordinary token with probability 0.1, and left unchanged otherwise. The count per
sequence is ``⌊mask_prob · n + u⌋`` with ``u ~ U(0, 1)`` (fairseq's rounding: exactly
``mask_prob · n`` in expectation), at least one; the chosen tokens are a uniform draw without
replacement. With ``whole_word`` the draw is over words instead of tokens (Devlin et al.'s
whole-word masking), and every token of a chosen word is masked; the 80/10/10 replacement is
still decided per token, as BERT's code does. All randomness comes from one
``torch.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .mlm_vocab import MLMVocab

#: the label of a position that is not predicted (``F.cross_entropy``'s ``ignore_index``).
IGNORE_INDEX = -100


@dataclass(frozen=True)
class MaskingConfig:
    """How tokens are masked.

    Attributes:
        mask_prob: share of the ordinary tokens (or words) chosen for prediction.
        mask_token_share: share of the chosen tokens replaced by [MASK].
        random_token_share: share replaced by a random ordinary token (the rest are kept).
        whole_word: choose whole words (needs known word boundaries).
    """

    mask_prob: float = 0.15
    mask_token_share: float = 0.8
    random_token_share: float = 0.1
    whole_word: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_prob <= 1.0:
            raise ValueError(f"mask_prob must be in (0, 1], got {self.mask_prob}")
        for name in ("mask_token_share", "random_token_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.mask_token_share + self.random_token_share > 1.0 + 1e-12:
            raise ValueError(
                f"mask_token_share + random_token_share must be at most 1 (the rest is kept "
                f"unchanged), got {self.mask_token_share} + {self.random_token_share}"
            )


@dataclass(frozen=True)
class MaskedTokens:
    """A masked batch.

    Attributes:
        inputs: ``(B, L)`` the ids the model reads ([MASK], random or kept at chosen positions).
        labels: ``(B, L)`` the original id at chosen positions, :data:`IGNORE_INDEX` elsewhere.
    """

    inputs: Tensor
    labels: Tensor

    @property
    def chosen(self) -> Tensor:
        """``(B, L)`` bool: the positions to predict."""
        return self.labels != IGNORE_INDEX


def mask_tokens(
    tokens: Tensor,
    vocab: MLMVocab,
    generator: torch.Generator,
    config: MaskingConfig | None = None,
) -> MaskedTokens:
    """BERT's masking of ``tokens (B, L)`` (see the module docstring).

    Args:
        tokens: ids in ``[0, vocab.vocab_size)``; specials and padding are never chosen.
        vocab: the special ids, the ordinary ids random replacements draw from and the word
            boundaries.
        generator: the source of every random draw (on ``tokens``' device).
        config: the shares (default :class:`MaskingConfig`'s: 0.15, 80/10/10, per token).

    Returns:
        The inputs and labels; a sequence with no ordinary token has no chosen position.

    Raises:
        ValueError: ``tokens`` is not ``(B, L)`` integers, or ``whole_word`` without known
            word boundaries.
    """
    config = config or MaskingConfig()
    if tokens.dim() != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(
            f"tokens must be (B, L) integer ids, got {tuple(tokens.shape)} {tokens.dtype}"
        )
    tokens = tokens.long()
    ordinary = ~vocab.is_special(tokens)
    starts = vocab.word_starts(tokens) & ordinary if config.whole_word else ordinary
    chosen = _choose_units(starts, config.mask_prob, generator)
    if config.whole_word:
        chosen = _spread_to_words(chosen, starts) & ordinary
    labels = torch.where(chosen, tokens, torch.full_like(tokens, IGNORE_INDEX))
    draw = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    to_mask = chosen & (draw < config.mask_token_share)
    to_random = chosen & ~to_mask & (draw < config.mask_token_share + config.random_token_share)
    ordinary_ids = vocab.ordinary_ids.to(tokens.device)
    pick = torch.randint(len(ordinary_ids), tokens.shape, generator=generator, device=tokens.device)
    inputs = torch.where(to_mask, torch.full_like(tokens, vocab.mask_id), tokens)
    inputs = torch.where(to_random, ordinary_ids[pick], inputs)
    return MaskedTokens(inputs, labels)


def _choose_units(units: Tensor, prob: float, generator: torch.Generator) -> Tensor:
    """``(B, L)`` bool: ``⌊prob · n + u⌋`` (at least one) of each row's ``n`` True positions
    of ``units``, drawn uniformly without replacement."""
    n = units.sum(dim=1)
    u = torch.rand(n.shape, generator=generator, device=units.device, dtype=torch.float64)
    count = torch.floor(prob * n.double() + u).long().clamp(min=1)
    count = torch.minimum(count, n)
    scores = torch.rand(units.shape, generator=generator, device=units.device)
    scores = scores.masked_fill(~units, 2.0)  # never before a unit
    rank = scores.argsort(dim=1).argsort(dim=1)
    return units & (rank < count[:, None])


def _spread_to_words(chosen_starts: Tensor, starts: Tensor) -> Tensor:
    """``(B, L)`` bool: every position whose word (the last start at or before it) is chosen."""
    positions = torch.arange(starts.shape[1], device=starts.device).expand_as(starts)
    last_start = torch.where(starts, positions, torch.full_like(positions, -1)).cummax(dim=1)
    word = last_start.values
    spread = chosen_starts.gather(1, word.clamp(min=0))
    return spread & (word >= 0)
