"""Triton kernels (``pip install 'kattn[gpu]'``): :mod:`kattn.ops.triton.causal_linear`.

Import the kernel modules themselves; this package imports nothing, so that ``kattn`` works
without Triton. On a machine without a GPU, set ``TRITON_INTERPRET=1`` before importing a
kernel module to run it on CPU tensors in Triton's interpreter."""
