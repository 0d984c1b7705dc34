"""How many tokens a Hugging Face model has positions for."""

from __future__ import annotations

from typing import Any

#: model types whose positions are numbered from ``pad_token_id + 1`` (RoBERTa's scheme):
#: they take ``max_position_embeddings − pad_token_id − 1`` tokens (512 of RoBERTa's 514).
OFFSET_POSITIONS = frozenset({
    "roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text",
    "roberta-prelayernorm", "xmod", "ibert", "longformer", "mpnet",
})  # fmt: skip


def hf_positions(hf_config: Any) -> int | None:
    """The longest sequence ``hf_config``'s model has positions for: ``max_position_embeddings``
    (GPT-2's ``n_positions``), less RoBERTa's offset for :data:`OFFSET_POSITIONS`; None when
    the config gives no such number."""
    for key in ("max_position_embeddings", "n_positions"):
        positions = getattr(hf_config, key, None)
        if isinstance(positions, int) and positions > 1:
            if getattr(hf_config, "model_type", None) in OFFSET_POSITIONS:
                positions -= int(hf_config.pad_token_id or 0) + 1  # numbered from pad + 1
            return positions
    return None
