"""The chunked chain's tiling fits shared memory at its operands' element size (session 27: the
rule sized the buffers for fp16 only, so an fp32 chain at 256 -> 256 -> 256 planned ~320 KB)."""

from __future__ import annotations

import pytest

from kfuse.kernels.b2b import configs


@pytest.mark.parametrize("elem", [2, 4])
def test_chunked_config_fits_at_the_element_size(elem: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(configs, "interpreting", lambda: False)  # the GPU's rule (the interpreter has its own small tile)
    for widths, k0 in (([256, 256], 256), ([768, 192], 192), ([1024, 256], 256)):
        cfgs = [configs.chunked_config(widths, k0, elem=elem), configs.default_config(4096, widths, "chunked", elem=elem)]
        cfgs += [c for c in configs.candidate_configs(262144, widths, k0, elem=elem) if c.residence == "chunked"]
        assert len(cfgs) >= 3
        for c in cfgs:
            used = configs.chunked_smem_bytes(c.block_m, c.block_k, c.block_h, c.block_n, c.num_stages, elem)
            assert used <= configs.SMEM_LIMIT, (widths, elem, c.describe(), used)
    # fp32 halves the chunk where fp16 fits whole
    assert configs.chunked_config([256, 256], 256, elem=4).block_h < configs.chunked_config([256, 256], 256, elem=2).block_h
