"""Compiled kernels behind kattn's PyTorch paths (optional; imported on demand)."""
