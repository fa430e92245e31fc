#!/usr/bin/env bash
# The test suite on the GPU machine, in one device call, keeping what it found if the call's limit
# cuts it short: pytest is stopped with SIGINT (it then prints its summary), every failure is logged
# as it happens (tests/failure_log.py), and tests/conftest.py pins a CUDA fault on the test that
# caused it (the xdist worker exits and is replaced). pyelftools comes from the carried .whl/
# (pass carry: [".whl"]). --show-capture=no: a failing compile test's captured torch DEBUG log lines
# otherwise fill the call's output tail (session 37 lost a failure message to them).
# When the limit cuts it, the tests that did not run are written to $OUT/not_run.txt (one id a line);
# commit that file and pass it on with pytest's @file argument to run the remainder next:
#   benchmarks/run_suite_gpu.sh [LIMIT_S] [pytest args...]     e.g. run_suite_gpu.sh 500 -m gpu tests/
#   benchmarks/run_suite_gpu.sh 300 @benchmarks/results/h200/logs/not_run.txt
set -u
limit="${1:-500}"; shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
whl=$(ls "$root"/.whl/pyelftools*.whl "$root"/../../.whl/pyelftools*.whl 2>/dev/null | head -1)
export PYTHONPATH="$root${whl:+:$whl}" KFUSE_FAILURE_LOG="$OUT/failures.log" KFUSE_DONE_LOG="$OUT/done.txt"
workers=$(python -c "import xdist" 2>/dev/null && echo "-n 14" || echo "")
cd "$root" && timeout -s INT "$limit" python -m pytest -q $workers -p tests.failure_log -p no:cacheprovider --tb=line --show-capture=no -rfE "${@:-tests/}" \
  > "$OUT/suite.log" 2>&1
rc=$?
echo "pytest rc=$rc (124: cut at ${limit}s)"
tail -n 5 "$OUT/suite.log"
if [ "$rc" = 124 ] || [ "$rc" = 2 ]; then  # cut (SIGINT: pytest exits 2 after its summary): what is left
  python -m pytest --collect-only -q -p no:cacheprovider "${@:-tests/}" 2>/dev/null | grep "::" | sort > "$OUT/collected.txt"
  sort -u "$OUT/done.txt" 2>/dev/null | comm -23 "$OUT/collected.txt" - > "$OUT/not_run.txt"
  echo "not run: $(wc -l < "$OUT/not_run.txt") of $(wc -l < "$OUT/collected.txt") (\$OUT/not_run.txt)"
fi
[ -f "$OUT/failures.log" ] && { echo "--- failures by message:"; grep "^    E " "$OUT/failures.log" | sort | uniq -c | sort -rn | head -20; }
