"""A finished (or interrupted) run's model, read back from its run folder.

A language-model run folder (``lm``, ``mlm``) is self-contained: ``config.json`` gives the
model, ``best.pt`` or ``last.pt`` its weights, and the tokenizer is UTF-8 bytes or the file
copied into the folder (an ``mlm`` run's special ids follow from it:
:func:`kattn.train.mlm.run_vocab`).
A classification run's model sizes come from its task data, which is read again (a run
fine-tuned from a Hugging Face checkpoint is built from the config saved in its folder).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ..data import Tokenizer
from .checkpoint import BEST, LAST, load_model_state
from .config import RunConfig, load_run_config
from .distributed import Processes, resolve_device
from .objectives import objective_of


def load_trained_model(
    run_dir: str | Path, checkpoint: str = "best", device: str = "cpu"
) -> tuple[nn.Module, RunConfig, Tokenizer | None]:
    """The model of a run with its ``best`` (or ``last``) weights, in eval mode on ``device``
    (``auto``: CUDA when available), the run's config and its tokenizer (None for a
    classification run).

    Raises:
        ValueError: ``run_dir`` is not a run folder, or ``checkpoint`` is not best/last.
        FileNotFoundError: the checkpoint does not exist (yet).
    """
    run = Path(run_dir)
    if checkpoint not in ("best", "last"):
        raise ValueError(f"checkpoint must be 'best' or 'last', got {checkpoint!r}")
    config = load_run_config(run)
    target = resolve_device(device, Processes())
    model, tokenizer = objective_of(config).model_of_run(config, run)
    load_model_state(model, run / (BEST if checkpoint == "best" else LAST), target)
    return model.to(target).eval(), config, tokenizer
