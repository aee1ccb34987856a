#!/usr/bin/env bash
# What OptiML runs on a GPU machine to produce benchmarks/results/: the GPU tests, the profiler's
# benchmark and the search benchmark (resumable), each step's log and output under $OUT.
#
#   OUT=/tmp/out benchmarks/gpu_run.sh [step ...]     steps: tests profile search llm editor
#
# The search step measures for SEARCH_SECONDS (default 240) and keeps its table in
# benchmarks/results/search-table-h200.json, so a later run goes on where this one stopped.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to a folder for the results}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests profile search)
table=benchmarks/results/search-table-h200.json
for step in "${steps[@]}"; do
  echo "== $step $(date -u +%FT%TZ)"
  case "$step" in
    tests)
      python3 -m pytest -m gpu -q -n "${PYTEST_WORKERS:-8}" -p no:cacheprovider \
        tests/test_gpu.py tests/search/test_gpu_catalog.py 2>&1 | tee "$OUT/gpu-tests.txt" | tail -40
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_profile.py 2>&1 \
        | tee -a "$OUT/gpu-tests.txt" | tail -15
      ;;
    profile)
      python3 benchmarks/profile.py --out "$OUT/profile" 2>&1 | tee "$OUT/profile.log" | tail -30
      cp "$OUT/profile/profile-h200.json" "$OUT/" 2>/dev/null
      ;;
    search)
      python3 benchmarks/search.py measure --table "$table" --seconds "${SEARCH_SECONDS:-240}" \
        2>&1 | tee "$OUT/search-measure.log" | tail -20
      cp "$table" "$OUT/"
      python3 benchmarks/search.py compare --table "$table" --out "$OUT" 2>&1 | tail -30
      ;;
    llm)
      python3 benchmarks/llm_e2e.py --out "$OUT/llm" 2>&1 | tee "$OUT/llm-e2e.log" | tail -20
      ;;
    editor)
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/server 2>&1 | tee "$OUT/editor-gpu.txt" | tail -15
      ;;
    *) echo "unknown step $step" ;;
  esac
done
