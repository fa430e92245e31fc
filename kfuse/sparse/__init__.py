"""Sparse kernels: sync-free triangular solve (the first dependency-driven persistent kernel)."""

from kfuse.sparse.sptrsv import SptrsvPlan, analyze, sptrsv
from kfuse.sparse.variants import SyncOptions

__all__ = ["SptrsvPlan", "SyncOptions", "analyze", "sptrsv"]
