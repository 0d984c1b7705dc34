"""kattn mechanisms inside Hugging Face transformers models (the ``hf`` extra).

``import kattn.hf`` registers ``"kattn:<name>"`` with transformers for every registered
mechanism, so that ``attn_implementation="kattn:performer"`` works wherever transformers
takes an attention implementation. See docs/huggingface.md.

    kattn.hf.use(model, "performer", num_features=128)      # a model in memory
    kattn.hf.from_pretrained(AutoModelForCausalLM, path)     # a saved one, kattn tensors too
    AutoModel.from_pretrained(path, attn_implementation="kattn:performer")  # built lazily
"""

from __future__ import annotations

try:
    import transformers  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError("kattn.hf needs Hugging Face transformers: pip install kattn[hf]") from error

from torch.nn.modules.module import register_module_module_registration_hook

from .attach import attention_modules, is_attention_module, on_register
from .attention import attention_forward
from .cache import RecurrentCache, RecurrentLayer
from .loading import check_options, check_use, from_pretrained, use
from .masks import kattn_mask, key_padding_mask
from .names import PREFIX, mechanism_of
from .registration import implementation_name, register_all

register_all()
# Attention modules that transformers builds with a kattn implementation (from_pretrained,
# from_config) get their kattn modules as they are built, before any weights load.
_HOOK = register_module_module_registration_hook(on_register)

__all__ = [
    "PREFIX",
    "RecurrentCache",
    "RecurrentLayer",
    "attention_forward",
    "attention_modules",
    "check_options",
    "check_use",
    "from_pretrained",
    "implementation_name",
    "is_attention_module",
    "kattn_mask",
    "key_padding_mask",
    "mechanism_of",
    "register_all",
    "use",
]
