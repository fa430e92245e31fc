"""kfuse: a kernel-fusion compiler and tuner for deep-learning inference on NVIDIA GPUs."""

__version__ = "0.1.0"
