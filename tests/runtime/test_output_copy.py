"""The graph outputs' copies (``kfuse.runtime.output_copy``): values and strides as ``clone`` gives them, one
multi-tensor copy, and no copy where the output structure's rebuild copies anyway (Hugging Face's DynamicCache),
checked on the real rebuild so a structure that keeps the graph's tensor still gets its copy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils import _pytree as pytree

from kfuse.runtime.compiled_model import Variant
from kfuse.runtime.output_copy import copies_needed, fresh_copies


def _outputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    nhwc = torch.randn(2, 5, 3, 7).contiguous(memory_format=torch.channels_last)
    return [torch.randn(3, 9), torch.randn(4, 6).t(), nhwc, torch.randint(0, 9, (5,))]


def test_copies_equal_clone_in_values_and_strides() -> None:
    static = _outputs()
    got = fresh_copies(static)
    for g, s in zip(got, static, strict=True):
        assert torch.equal(g, s) and g.stride() == s.stride() == s.clone().stride()
        assert g.untyped_storage().data_ptr() != s.untyped_storage().data_ptr()
    static[0].fill_(float("nan"))  # the next replay overwrites the graph's buffers: the copies keep the values
    assert not got[0].isnan().any()


def test_only_the_marked_outputs_are_copied() -> None:
    static = _outputs()
    got = fresh_copies(static, [True, False, False, True])
    assert got[1] is static[1] and got[2] is static[2]
    assert got[0] is not static[0] and torch.equal(got[3], static[3])
    assert all(g is s for g, s in zip(fresh_copies(static, False), static, strict=True))
    with pytest.raises(ValueError, match="3 flags for 4 outputs"):
        fresh_copies(static, [True, True, True])


def _decoder_output() -> tuple[list[torch.Tensor], pytree.TreeSpec]:
    transformers = pytest.importorskip("transformers")
    from transformers.cache_utils import DynamicCache
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    register_dynamic_cache_export_support()  # what kfuse's export does when a decoder returns its cache
    cache = DynamicCache()
    torch.manual_seed(1)
    for layer in range(2):
        cache.update(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), layer)
    out = transformers.modeling_outputs.BaseModelOutputWithPast(last_hidden_state=torch.randn(1, 5, 8), past_key_values=cache)
    leaves, spec = pytree.tree_flatten(out)
    return leaves, spec


def test_a_dynamic_cache_rebuild_copies_its_tensors_so_they_need_no_copy() -> None:
    leaves, spec = _decoder_output()
    need = copies_needed(leaves, spec)
    assert need == (True, False, False, False, False)  # the hidden state is handed over as is: it keeps its copy
    # and what the caller gets holds the same values, in tensors no later replay writes
    rebuilt = pytree.tree_unflatten(fresh_copies(leaves, need), spec)
    got = pytree.tree_leaves(rebuilt)
    held = {t.untyped_storage().data_ptr() for t in leaves}
    assert all(torch.equal(g, s) for g, s in zip(got, leaves, strict=True))
    assert not {t.untyped_storage().data_ptr() for t in got} & held


class DynamicCache:  # a container named like transformers' whose rebuild keeps the graph's tensors
    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors


pytree.register_pytree_node(DynamicCache, lambda c: (c.tensors, None), lambda xs, _: DynamicCache(list(xs)))


def test_a_container_that_keeps_the_tensors_keeps_their_copies() -> None:
    static = _outputs()[:2]
    _, spec = pytree.tree_flatten((torch.ones(1), DynamicCache(static)))
    assert copies_needed([torch.ones(1), *static], spec) == (True, True, True)


def test_outputs_outside_any_cache_are_always_copied() -> None:
    static = _outputs()
    _, spec = pytree.tree_flatten({"a": static[0], "b": static[1:]})
    assert copies_needed(static, spec) == (True, True, True, True)


def test_a_call_passes_the_per_output_copies_to_the_runner_and_other_callers_get_all() -> None:
    seen = []

    def runner(xs, clone_outputs):
        seen.append(clone_outputs)
        return list(xs)

    v = Variant(SimpleNamespace(graph_inputs=lambda flat: flat[:1]), [], None, runner, 0.0, copy_outputs=True)
    v.call_copies = (False,)
    v.run([torch.ones(1)], rebuilt=True)
    v.run([torch.ones(1)])  # a check, a profile: no rebuild follows, so every output is copied
    v.copy_outputs = False
    v.run([torch.ones(1)], rebuilt=True)  # copy_outputs=False (the caller consumes each output first) wins
    assert seen == [(False,), True, False]
