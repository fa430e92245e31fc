"""Benchmark harness: kfuse side by side with PyTorch eager, CUDA graphs and torch.compile."""
