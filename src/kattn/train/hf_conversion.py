"""Converting a saved Hugging Face model's attention to a kattn mechanism without fine-tuning
(Luo et al. 2021, §4.5), scoring it before and after, and saving it so that
``kattn.hf.from_pretrained`` loads it back.

The conversion keeps every weight of the checkpoint (embeddings, projections, norms,
feed-forward layers) and changes only the attention core, through ``kattn.hf``: the
mechanism's own tensors (random features, ...) are drawn from torch's generator, seeded
first. A causal language model is scored by perplexity and next-token agreement on a text;
any other model by the agreement of its last hidden states.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .conversion import conversion_target
from .hf_evaluation import (
    causal_lm_outputs,
    hidden_state_agreement,
    last_hidden_states,
    prediction_agreement,
    read_text,
    token_ids,
    windows,
)
from .hf_files import checkpoint_folder, has_tokenizer
from .hf_positions import hf_positions

#: the file the converted folder gets beside the model: the conversion and its scores.
RECORD_FILE = "kattn_conversion.json"


@dataclass
class HFConversion:
    """What :func:`convert_hf_checkpoint` did and measured.

    Attributes:
        source: the checkpoint folder.
        model_class: the transformers class it was loaded with.
        kind: ``"causal-lm"`` (scored by perplexity) or ``"encoder"`` (hidden states).
        mechanism, options: the kattn mechanism every attention layer runs now.
        seed: the seed of torch's generator when the mechanism's modules were built.
        text: where the scored text came from, how it was tokenised, windows and length.
        before, after: the scores of the checkpoint and of the converted model.
        agreement: how the two agree (next-token predictions, or hidden-state cosines).
        out: the folder the converted model was saved in (None: not saved).
        reload_max_abs_diff: the largest difference between the converted model's outputs and
            those of the model loaded back from ``out`` (0 when saving loses nothing).
    """

    source: str
    model_class: str
    kind: str
    mechanism: str
    options: dict[str, Any]
    seed: int
    text: dict[str, Any]
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    agreement: dict[str, float] = field(default_factory=dict)
    out: str | None = None
    reload_max_abs_diff: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


def kattn_hf() -> Any:
    """``kattn.hf``, or an ``ImportError`` saying which extra to install."""
    try:
        return importlib.import_module("kattn.hf")
    except ImportError as error:
        raise ImportError(
            f"converting a Hugging Face checkpoint needs kattn.hf: pip install kattn[hf] ({error})"
        ) from error


def resolve_target(mechanism: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``auto`` → softmax's kernelized counterpart (performer, Luo et al. 2021 §4.5) with
    ``options`` over its own; any other name as given."""
    if mechanism != "auto":
        return mechanism, dict(options)
    name, target = conversion_target("softmax", {})
    return name, {**target, **options}


def model_class_for(config: Any) -> Any:
    """The transformers class a checkpoint was saved from (``config.architectures[0]``), or
    ``AutoModel`` when the config does not name one transformers has."""
    import transformers

    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def is_causal_lm(model: nn.Module) -> bool:
    """Whether ``model`` is one of transformers' causal language models."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return type(model).__name__ in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def convert_hf_checkpoint(
    source: str | Path,
    mechanism: str,
    options: dict[str, Any] | None = None,
    *,
    out: str | Path | None = None,
    text: str | Path | None = None,
    length: int = 128,
    max_tokens: int = 4096,
    batch_size: int = 8,
    seed: int = 0,
    device: str = "cpu",
) -> HFConversion:
    """Convert the checkpoint in ``source`` to ``mechanism``, score both, and save it in ``out``.

    Args:
        source: a folder written by ``save_pretrained`` (nothing is downloaded).
        mechanism: a kattn mechanism, or ``"auto"`` (performer: softmax's PRF estimate).
        options: the mechanism's options (JSON values: they are recorded in the config).
        out: where to save the converted model (and the checkpoint's tokenizer, and
            :data:`RECORD_FILE`); it is then loaded back and compared.
        text: a UTF-8 text file to score on (default: the embedded text).
        length: tokens per window (at most the model's position limit).
        max_tokens: how many tokens of the text to score at most.
        batch_size: windows per forward.
        seed: seeds torch's generator before the mechanism's modules are built.
        device: where the models run.

    Returns:
        The :class:`HFConversion` with the scores.
    """
    hf = kattn_hf()
    from transformers import AutoConfig

    folder = checkpoint_folder(source, "--hf")
    name, options = resolve_target(mechanism, dict(options or {}))
    with _quiet_loading():
        config = AutoConfig.from_pretrained(folder)
        tokenizer = _tokenizer(folder)
        inputs, text_info = _inputs(config, tokenizer, text, length, max_tokens)
        model_class = model_class_for(config)
        original = model_class.from_pretrained(folder).to(device).eval()
        kind = "causal-lm" if is_causal_lm(original) else "encoder"
        result = HFConversion(str(folder), model_class.__name__, kind, name, options, seed,
                              text_info)  # fmt: skip
        before = _score(original, kind, inputs, batch_size)
        del original
        torch.manual_seed(seed)
        converted = hf.from_pretrained(model_class, str(folder), name, options=options)
        converted = converted.to(device).eval()
        _compare(result, before, _score(converted, kind, inputs, batch_size))
        if out is not None:
            _save(result, converted, tokenizer, Path(out))
            reloaded = hf.from_pretrained(model_class, str(out)).to(device).eval()
            result.reload_max_abs_diff = _max_abs_diff(converted, reloaded, inputs[:1])
            _write_record(result, Path(out))
    return result


def _inputs(
    config: Any, tokenizer: Any, text: str | Path | None, length: int, max_tokens: int
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The windows of token ids to score and a description of the text they come from."""
    raw, info = read_text(text)
    ids, how = token_ids(raw, tokenizer, int(config.vocab_size))
    inputs = windows(ids, length=min(length, hf_positions(config) or length), max_tokens=max_tokens)
    info.update(tokenizer=how, windows=inputs.shape[0], length=inputs.shape[1])
    return inputs, info


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers' loading reports and progress bars off while converting: every load here
    is of a checkpoint without the kattn tensors (expected to be missing) or of the folder
    just written; the result says what matters."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _tokenizer(folder: Path) -> Any:
    """The tokenizer saved in ``folder``, or None when it holds none (transformers would
    otherwise build an empty one of the model's type, which maps every word to [UNK])."""
    from transformers import AutoTokenizer

    if not has_tokenizer(folder):
        return None
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def _score(model: nn.Module, kind: str, inputs: torch.Tensor, batch_size: int) -> dict[str, Any]:
    if kind == "causal-lm":
        return causal_lm_outputs(model, inputs, batch_size)
    return {"hidden": last_hidden_states(model, inputs, batch_size)}


def _compare(result: HFConversion, before: dict[str, Any], after: dict[str, Any]) -> None:
    """Scores and agreement into ``result`` (predictions and hidden states left out)."""
    if result.kind == "causal-lm":
        agree = prediction_agreement(before.pop("predictions"), after.pop("predictions"))
        result.agreement = {"next_token_agreement": agree}
    else:
        result.agreement = hidden_state_agreement(before.pop("hidden"), after.pop("hidden"))
    result.before, result.after = before, after


def _save(result: HFConversion, model: Any, tokenizer: Any, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    result.out = str(out)


@torch.no_grad()
def _max_abs_diff(first: nn.Module, second: nn.Module, inputs: torch.Tensor) -> float:
    device = next(first.parameters()).device
    a = first(input_ids=inputs.to(device), output_hidden_states=True).hidden_states[-1]
    b = second(input_ids=inputs.to(device), output_hidden_states=True).hidden_states[-1]
    return (a - b).abs().max().item()


def _write_record(result: HFConversion, out: Path) -> None:
    text = json.dumps(result.as_dict(), indent=2, sort_keys=True)
    (out / RECORD_FILE).write_text(text + "\n")
