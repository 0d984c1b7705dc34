"""Pure tensor maths on ``(B, H, L, ·)`` tensors; a slow reference beside each fast path."""

from .banded import banded_linear_attention, banded_log_coefficients
from .banded_decoding import BandedState, banded_init_state, banded_step
from .bigbird import (
    BigBirdLayout,
    bigbird_attention,
    bigbird_global_positions,
    bigbird_layout,
    bigbird_pattern,
)
from .decay import (
    decay_init_state,
    decay_linear_attention,
    decay_log_coefficients,
    decay_prefill,
    decay_step,
)
from .gaussian import (
    gaussian_attention,
    gaussian_attention_reference,
    gaussian_kernel,
    gaussian_product,
)
from .hadamard import (
    hadamard_matrix,
    hadamard_transform,
    is_power_of_two,
    next_power_of_two,
)
from .informer import (
    InformerSample,
    informer_attention,
    informer_attention_reference,
    informer_factor,
    informer_sample,
    informer_sizes,
    informer_sparsity,
)
from .linear import (
    linear_attention,
    linear_attention_cumsum,
    linear_attention_parallel,
    linear_attention_reference,
)
from .linear_causal import (
    LinearState,
    linear_attention_chunked,
    linear_attention_init_state,
    linear_attention_prefill,
)
from .linear_step import linear_attention_step
from .linformer import linformer_attention, linformer_attention_reference
from .local import (
    LocalState,
    local_attention,
    local_blocked_attention,
    local_blocked_pattern,
    local_init_state,
    local_pattern,
    local_prefill,
    local_step,
)
from .longformer import longformer_attention, longformer_pattern
from .masks import allowed_keys
from .numerics import accumulation_dtype, exp_nonpositive, guard_normaliser
from .nystrom import (
    iterative_pinv,
    iterative_pinv_solve,
    nystromformer_attention,
    nystromformer_attention_reference,
    nystromformer_conv_skip,
    nystromformer_conv_skip_reference,
    segment_means,
    skyformer_attention,
    skyformer_attention_reference,
    skyformer_landmarks,
)
from .rpe_blocked import (
    DenseRows,
    RowLogCoefficients,
    ToeplitzRows,
    blocked_is_cheaper,
    rpe_linear_attention_blocked,
)
from .simpletron import (
    SimpletronState,
    simpletron_attention,
    simpletron_attention_reference,
    simpletron_init_state,
    simpletron_prefill,
    simpletron_step,
)
from .smyrf import (
    SmyrfOrders,
    smyrf_attention,
    smyrf_attention_reference,
    smyrf_num_clusters,
    smyrf_orders,
    smyrf_pattern,
    smyrf_transform,
)
from .softmax import (
    KVCache,
    softmax_attention,
    softmax_attention_reference,
    softmax_init_state,
    softmax_prefill,
    softmax_step,
)
from .sparse import block_sparse_attention, sparse_attention_reference
from .sparse_combine import (
    add_global_tokens,
    block_sparse_attention_with_globals,
    global_positions,
    merge_partial_attention,
)
from .sparse_pattern import block_pattern_to_dense
from .sparse_transformer import (
    sparse_transformer_attention,
    sparse_transformer_attention_reference,
    sparse_transformer_pattern,
)
from .toeplitz import fft_length, rpe_linear_attention_fft, toeplitz_dense, toeplitz_matmul
from .toeplitz2d import rpe2d_linear_attention_fft, toeplitz2d_dense_log

__all__ = [
    "BandedState",
    "BigBirdLayout",
    "DenseRows",
    "InformerSample",
    "KVCache",
    "LinearState",
    "LocalState",
    "RowLogCoefficients",
    "SimpletronState",
    "SmyrfOrders",
    "ToeplitzRows",
    "accumulation_dtype",
    "add_global_tokens",
    "allowed_keys",
    "banded_init_state",
    "banded_linear_attention",
    "banded_log_coefficients",
    "banded_step",
    "bigbird_attention",
    "bigbird_global_positions",
    "bigbird_layout",
    "bigbird_pattern",
    "block_pattern_to_dense",
    "block_sparse_attention",
    "block_sparse_attention_with_globals",
    "blocked_is_cheaper",
    "decay_init_state",
    "decay_linear_attention",
    "decay_log_coefficients",
    "decay_prefill",
    "decay_step",
    "exp_nonpositive",
    "fft_length",
    "gaussian_attention",
    "gaussian_attention_reference",
    "gaussian_kernel",
    "gaussian_product",
    "global_positions",
    "guard_normaliser",
    "hadamard_matrix",
    "hadamard_transform",
    "informer_attention",
    "informer_attention_reference",
    "informer_factor",
    "informer_sample",
    "informer_sizes",
    "informer_sparsity",
    "is_power_of_two",
    "iterative_pinv",
    "iterative_pinv_solve",
    "linear_attention",
    "linear_attention_chunked",
    "linear_attention_cumsum",
    "linear_attention_init_state",
    "linear_attention_parallel",
    "linear_attention_prefill",
    "linear_attention_reference",
    "linear_attention_step",
    "linformer_attention",
    "linformer_attention_reference",
    "local_attention",
    "local_blocked_attention",
    "local_blocked_pattern",
    "local_init_state",
    "local_pattern",
    "local_prefill",
    "local_step",
    "longformer_attention",
    "longformer_pattern",
    "merge_partial_attention",
    "next_power_of_two",
    "nystromformer_attention",
    "nystromformer_attention_reference",
    "nystromformer_conv_skip",
    "nystromformer_conv_skip_reference",
    "rpe2d_linear_attention_fft",
    "rpe_linear_attention_blocked",
    "rpe_linear_attention_fft",
    "segment_means",
    "simpletron_attention",
    "simpletron_attention_reference",
    "simpletron_init_state",
    "simpletron_prefill",
    "simpletron_step",
    "skyformer_attention",
    "skyformer_attention_reference",
    "skyformer_landmarks",
    "smyrf_attention",
    "smyrf_attention_reference",
    "smyrf_num_clusters",
    "smyrf_orders",
    "smyrf_pattern",
    "smyrf_transform",
    "softmax_attention",
    "softmax_attention_reference",
    "softmax_init_state",
    "softmax_prefill",
    "softmax_step",
    "sparse_attention_reference",
    "sparse_transformer_attention",
    "sparse_transformer_attention_reference",
    "sparse_transformer_pattern",
    "toeplitz2d_dense_log",
    "toeplitz_dense",
    "toeplitz_matmul",
]
