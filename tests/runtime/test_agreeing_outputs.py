"""AgreeingOutputs: an autotuner without a reference keeps only the candidates that compute what most compute."""

import torch

from kfuse.runtime.unfused import AgreeingOutputs, wrong_result


def _out(seed: int, n: int = 257) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def test_a_miscompiled_candidate_stands_apart() -> None:
    good = _out(0)
    outputs = AgreeingOutputs()
    outputs.add("a", good)
    outputs.add("b", good + 1e-4 * _out(1))  # rounding differences between tilings agree
    outputs.add("bad", _out(2))  # a different result
    outputs.add("c", good.clone())
    agree, others = outputs.agreeing()
    assert agree == ["a", "b", "c"]
    assert others == ["bad"]


def test_a_tie_goes_to_the_preferred_candidate() -> None:
    outputs = AgreeingOutputs()
    outputs.add("x", _out(3))
    outputs.add("y", _out(4))
    assert outputs.agreeing(prefer="y") == (["y"], ["x"])
    assert outputs.agreeing(prefer="x") == (["x"], ["y"])


def test_outputs_are_copied_so_a_reused_buffer_cannot_fool_the_check() -> None:
    buf = _out(5)
    outputs = AgreeingOutputs()
    outputs.add("first", buf)
    buf.copy_(_out(6))  # the launcher writes the next candidate into the same output tensor
    outputs.add("second", buf)
    assert outputs.agreeing(prefer="first") == (["first"], ["second"])
    assert wrong_result(buf, _out(6)) is None


def test_nothing_added_means_nothing_agrees() -> None:
    assert AgreeingOutputs().agreeing() == ([], [])
