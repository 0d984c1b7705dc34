"""Triton kernels (``pip install 'kattn[gpu]'``): linear attention, causal and not, forward
and backward, its decoding step (:mod:`~kattn.ops.triton.causal_linear`,
:mod:`~kattn.ops.triton.linear_backward`, :mod:`~kattn.ops.triton.noncausal_linear`,
:mod:`~kattn.ops.triton.linear_step`), the relative-position aggregators
(:mod:`~kattn.ops.triton.decay`, :mod:`~kattn.ops.triton.banded`,
:mod:`~kattn.ops.triton.toeplitz_blocked`), and the ``backend`` option's choice between the
kernels and the PyTorch paths (:mod:`~kattn.ops.triton.dispatch`).

Import the kernel modules themselves; this package imports nothing, and ``dispatch`` imports
triton only when it runs a kernel, so that ``kattn`` works without Triton. On a machine
without a GPU, set ``TRITON_INTERPRET=1`` before importing a kernel module to run it on CPU
tensors in Triton's interpreter."""
