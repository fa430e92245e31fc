"""Issue 8's per-pair table from the committed co-location records (``kfuse.colocate.pairs``; also ``kfuse colocate
pairs``).

    python benchmarks/colocate_pairs.py                        # every benchmarks/results/*/colocate*.json
    python benchmarks/colocate_pairs.py FILE.json [FILE.json ...]
    python benchmarks/colocate_pairs.py --png OUT.png --gpu H100   # and a plot of one GPU's pairs
"""

from kfuse.colocate.pairs import main

if __name__ == "__main__":
    main()
