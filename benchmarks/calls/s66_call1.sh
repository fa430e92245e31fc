#!/usr/bin/env bash
# Issue 8, session 66: session 65's caveat, second step. Session 66's first H100 call (s65_call4.sh) timed histogram's
# PTB grids at 1-16 programs an SM within 1-4% of each other (0.766-0.790 ms, the original 0.762): the grid does not
# explain the 8-warp worker partition's 1.4-1.7x rate. The partition's histogram differs in its warps (8 against the
# PTB kernel's 4: 8 values a thread against 16). So: each BE kernel's PTB grids on 4, 8 and 16 warps, then the `ws`
# histogram with time sharing (and every profile's x) on histogram's fastest PTB form.
# Prediction: histogram's PTB on 8 warps runs 1.2-1.6x faster than on 4 (the partition's rate); against that baseline
# Aker's `ws` gain falls from +8..+19% (H100, session 66) to -2..+6%.
set -u
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
mkdir -p "$OUT/solo" "$OUT/ws_best_form"
PYTHONPATH=. timeout 150 python benchmarks/experiments/be_solo_forms.py --per-sm 1,2,4,8 --warps 4,8,16 \
  --out "$OUT/solo/be_solo_forms_warps.json" 2>&1 | grep -v Warning
read -r p w < <(python -c "
import json; r=[x for x in json.load(open('$OUT/solo/be_solo_forms_warps.json')) if x['case']=='histogram'][0]
ptb={k: v['ms'] for k, v in r['forms'].items() if k.startswith('ptb') and v['ok']}
b=min(ptb, key=ptb.get); g, _, nw = b[3:].partition('_w'); print(g, nw or r['warps'])" 2>/dev/null || echo "4 4")
echo "histogram's fastest PTB form: $p programs an SM, $w warps"
left=$(( ${CALL_S:-300} - SECONDS - 5 ))
PYTHONPATH=. timeout "$left" python benchmarks/colocate_bench.py --out "$OUT/ws_best_form" --lc bert-base --be histogram \
  --be-each --versions ws --ws-warps 8 --ws-unroll 1 --ws-feed ldg --lc-gemms plan-ws --lc-tune fast \
  --policies lc_alone,timeshare,aker --seconds 0.5 --classify selected --max-keys 4 --be-programs-per-sm "$p" --be-warps "$w" \
  2>&1 | grep -v Warning > "$OUT/ws_best_form/colocate.log"
grep -E "^BE | aker |timeshare|ts_rerun|T_fused|BE fit" "$OUT/ws_best_form/colocate.log" | cut -c1-200
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
