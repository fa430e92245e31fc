#!/usr/bin/env bash
# Issue 8, session 65's caveat: time sharing runs each BE kernel as PTB on 4 programs an SM, and the 8-warp worker
# partition ran histogram's blocks 1.4-1.7x faster than that (fused slopes 0.60-0.71 past the GEMM's window, H100 and
# H200). First every BE kernel's solo forms timed (original; PTB on 1, 2, 4, 8, 16 programs an SM; outputs checked),
# then the `ws` histogram run with time sharing on histogram's fastest PTB grid.
# Prediction: some PTB grid runs histogram 1.1-1.5x faster than 4 an SM (fewer programs: less contention on the 256
# bins' atomics); against that baseline Aker's `ws` gain falls from +9..+10% to +0..+5% (H200).
set -u
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
mkdir -p "$OUT/solo" "$OUT/ws_best_grid"
PYTHONPATH=. timeout 120 python benchmarks/experiments/be_solo_forms.py --out "$OUT/solo/be_solo_forms.json" 2>&1 | grep -v Warning
p=$(python -c "
import json; r=[x for x in json.load(open('$OUT/solo/be_solo_forms.json')) if x['case']=='histogram'][0]
ptb={k: v['ms'] for k, v in r['forms'].items() if k.startswith('ptb') and v['ok']}
print(min(ptb, key=ptb.get)[3:])" 2>/dev/null || echo 4)
echo "histogram's fastest PTB grid: $p programs an SM"
left=$(( ${CALL_S:-300} - SECONDS - 5 ))
PYTHONPATH=. timeout "$left" python benchmarks/colocate_bench.py --out "$OUT/ws_best_grid" --lc bert-base --be histogram \
  --be-each --versions ws --ws-warps 8 --ws-unroll 1 --ws-feed ldg --lc-gemms plan-ws --lc-tune fast \
  --policies lc_alone,timeshare,aker --seconds 0.5 --classify selected --max-keys 4 --be-programs-per-sm "$p" \
  2>&1 | grep -v Warning > "$OUT/ws_best_grid/colocate.log"
grep -E " aker |timeshare|ts_rerun|T_fused|BE fit" "$OUT/ws_best_grid/colocate.log" | cut -c1-200
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
