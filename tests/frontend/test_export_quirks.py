"""Model habits that torch.export traces but a plain import did not take (found compiling YOLOv8 / YOLO11 from
ultralytics): a forward that caches tensors in attributes, and ``.item()`` of a buffer."""

from __future__ import annotations

import torch

import kfuse


class _CachingHead(torch.nn.Module):
    """Like YOLOv8's ``Detect``: anchors made from the input's shape on the first call, kept in attributes, and a
    stride buffer read with ``.item()`` (``new_full(..., self.stride[i])``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 6, 1)
        self.register_buffer("stride", torch.tensor([8.0, 16.0]))
        self.shape = None
        self.anchors = torch.empty(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shape != x.shape:
            h, w = x.shape[2:]
            ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
            self.anchors = torch.stack((xs, ys), -1).view(-1, 2)
            self.shape = x.shape
        scale = x.new_full((x.shape[2] * x.shape[3], 1), self.stride[1])
        y = self.conv(x).flatten(2).transpose(1, 2)  # [B, HW, 6]
        return y[..., :2] + self.anchors * scale


def test_a_forward_that_caches_tensors_and_reads_a_buffer_item_compiles_natively() -> None:
    torch.manual_seed(0)
    m = _CachingHead().eval()
    x = torch.randn(2, 4, 5, 3)
    c = kfuse.compile(m, (x,))
    assert c.report.get("frontend", "export") != "dynamo" and c.report["fallback"] == []
    # the tracer's tensors did not stay in the module: eager calls after the compile still work and agree
    assert not isinstance(m.anchors, torch._subclasses.FakeTensor)
    want = m(x)
    torch.testing.assert_close(c(x), want)
    assert m.shape == x.shape


def test_item_of_a_computed_tensor_goes_through_dynamo() -> None:
    class _HostRead(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * x.abs().max().item()

    x = torch.randn(3, 4)
    c = kfuse.compile(_HostRead(), (x,))
    assert c.report["frontend"] == "dynamo" and "item" in c.report["frontend_reason"]
    torch.testing.assert_close(c(x), _HostRead()(x))


def test_a_dynamo_graph_kfuse_cannot_take_runs_as_pytorch() -> None:
    """Funnel's Dynamo graphs return Python ints beside tensors: that graph runs eagerly, and says why."""
    from kfuse.frontend.dynamo import kfuse_backend

    class _ReturnsInt(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
            return x + 1, 3

    gm = torch.fx.symbolic_trace(_ReturnsInt())
    x = torch.randn(2, 3)
    run = kfuse_backend(gm, [x])
    assert "not a tensor" in run.kfuse_eager
    got, n = run(x)
    torch.testing.assert_close(got, x + 1)
    assert n == 3
