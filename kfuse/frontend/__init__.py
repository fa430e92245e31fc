"""Frontends: torch.export programs, Dynamo FX graphs (torch.compile backend) and ONNX models."""
