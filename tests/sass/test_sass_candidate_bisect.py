"""The pure parts of benchmarks/experiments/sass_candidate_bisect.py: cutting a permutation into independent segments."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "experiments"))

from sass_candidate_bisect import segments, with_segments  # noqa: E402


def test_segments_are_the_closed_permuted_ranges() -> None:
    order = [0, 2, 1, 3, 6, 4, 5, 7, 8, 10, 9]
    assert segments(order) == [(1, 3), (4, 7), (9, 11)]
    assert segments(list(range(5))) == []
    assert segments([4, 3, 2, 1, 0]) == [(0, 5)]


def test_with_segments_applies_only_the_chosen_ones() -> None:
    order = [0, 2, 1, 3, 6, 4, 5, 7]
    segs = segments(order)
    assert with_segments(order, []) == list(range(8))
    assert with_segments(order, [segs[1]]) == [0, 1, 2, 3, 6, 4, 5, 7]
    assert with_segments(order, segs) == order
