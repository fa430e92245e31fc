"""Sparse kernels: sync-free triangular solve (the first dependency-driven persistent kernel)."""

from kfuse.sparse.sptrsv import SptrsvPlan, analyze, sptrsv

__all__ = ["SptrsvPlan", "analyze", "sptrsv"]
