#!/usr/bin/env bash
# What OptiML runs on a GPU machine to produce benchmarks/results/: the search benchmark's
# measurements (resumable), the profiler's benchmark, the GPU tests and the editor's GPU flow,
# each step's output under $OUT (at most a few files, for machines that return little).
#
#   OUT=/tmp/out benchmarks/gpu_run.sh [step ...]
#     steps: search profile tests catalog editor llm verdicts tricks overhead deliver lift linear remote
#            intents kernelbench schedules corpus phases throughput
#
# search: measures for SEARCH_SECONDS (default 200; SEARCH_FIXTURES: only these fixture files)
# into $OUT/search-table-h200.json, starting from benchmarks/results/search-table-h200.json when it
# exists; `benchmarks/search.py compare` (no GPU) turns the table into the comparison.
# profile: PROFILE_ONLY lists fixture files (PROFILE_TIMEOUT; results written after each one).
# catalog: every transformation's proposals on every fixture, the wild ones included, checked for
# correctness (a few hundred evaluations; CATALOG_TIMEOUT).
# verdicts: the GPU tests of the harness and of the verdict's checks (VERDICTS_TIMEOUT).
# tricks: the corpus of tricks and honest controls (TRICKS_SHARD=K/N, TRICKS_ONLY, TRICKS_TIMEOUT).
# overhead: what the checks cost per evaluation (OVERHEAD_REPEATS, OVERHEAD_TIMEOUT).
# lift: the lifting's GPU tests (every fixture kernel that lifts against its host model; every
#   kernel of fixtures/corpus against its NumPy reference).
# linear: PyTorch's F.linear on fixtures/wild/linear_bias.cu's size, and `optiml optimize` on it
#   (LINEAR_BUDGET evaluations, LINEAR_SECONDS).
# deliver: `optiml optimize` on the naive softmax and layernorm of fixtures/tricks/originals
#   (DELIVER_BUDGET evaluations, DELIVER_SECONDS each; DELIVER_ONLY: softmax or layernorm).
# intents: benchmarks/intents.py, OptiML-G's formulas against PyTorch (INTENTS_BUDGET, default 48 as
#   optimize's, INTENTS_TIME, default 90 s: the bar's wall time per kernel; INTENTS_SHARD=i/n,
#   INTENTS_ONLY; INTENTS_TIMEOUT for the step). Each row says what the search evaluated.
# kernelbench: benchmarks/kernelbench.py on KB_TASKS (KernelBench level 1: carry it, ../shared does
#   not travel), KB_BUDGET, KB_TIME (defaults as intents'), KB_SHARD, KB_ONLY, KB_TIMEOUT,
#   KB_STEPS (optimize,torch), KB_TORCH_FROM (committed tables whose PyTorch times are reused),
#   KB_SECONDS (start no task after that many seconds: the rest is named in the table).
#   `benchmarks/generated_table.py` (no GPU) merges either one's shards into a table.
# schedules: benchmarks/schedules.py, every rewrite on the corpus, holdout and wild kernels
#   (SCHEDULES_SHARD=i/n, SCHEDULES_SECONDS: stop starting kernels after that; SCHEDULES_TIMEOUT).
# corpus: benchmarks/corpus.py, `optiml optimize` with its defaults on the same kernels against
#   PyTorch and the floor (CORPUS_SHARD=i/n, CORPUS_ONLY, CORPUS_TIMEOUT for the step).
# phases: benchmarks/eval_phases.py, where an evaluation's time goes, each one in a runner started
#   for it and in one started ahead (PHASES_REPEATS, PHASES_TIMEOUT).
# throughput: benchmarks/throughput.py, the search's evaluations a minute (THROUGHPUT_FIXTURES,
#   THROUGHPUT_PARALLEL, THROUGHPUT_BUDGET, THROUGHPUT_AHEAD=off|on|both, THROUGHPUT_TIMEOUT).
# remote: `optiml optimize` of fixtures/softmax.cu locally, over SSH on loopback and on Ray
#   (benchmarks/remote_search.py; REMOTE_SSHD: the sshd binary to start, see its docstring).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to a folder for the results}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=("$@")
# What every step's output starts with: where and with what it ran.
header() {
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "# $(nvcc --version 2>/dev/null | grep -o 'V[0-9][0-9.]*' | head -1) ncu $(ncu --version 2>/dev/null | grep -o '[0-9]\{4\}\.[0-9.]*' | head -1) $(nvim --version 2>/dev/null | head -1) python $(python3 -c 'import platform; print(platform.python_version())')"
}
[ ${#steps[@]} -eq 0 ] && steps=(search profile tests editor)
for step in "${steps[@]}"; do
  echo "== $step $(date -u +%FT%TZ)"
  case "$step" in
    search)
      table="$OUT/search-table-h200.json"
      [ -f benchmarks/results/search-table-h200.json ] && cp benchmarks/results/search-table-h200.json "$table"
      python3 benchmarks/search.py measure --table "$table" --seconds "${SEARCH_SECONDS:-200}" \
        ${SEARCH_FIXTURES:+--fixtures $SEARCH_FIXTURES} \
        2>&1 | tee "$OUT/search-measure.log" | tail -20
      ;;
    profile)
      mkdir -p "$OUT/profile"
      # shellcheck disable=SC2086
      timeout "${PROFILE_TIMEOUT:-300}" python3 benchmarks/profile_fixtures.py --out "$OUT/profile" \
        ${PROFILE_ONLY:+--only $PROFILE_ONLY} 2>&1 | tee "$OUT/profile/profile.log" | tail -15
      tar czf "$OUT/profile.tgz" -C "$OUT" profile && rm -rf "$OUT/profile"
      ;;
    tests)
      timeout -s INT -k 15 "${TESTS_TIMEOUT:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --dist loadgroup \
        tests/test_gpu.py tests/search/test_gpu_catalog.py -k "not test_proposal_is_correct" -rfEsp \
        2>&1 | (header; cat) | tee "$OUT/gpu-tests.txt" | tail -15
      ;;
    catalog)
      timeout -s INT -k 15 "${CATALOG_TIMEOUT:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 \
        tests/search/test_gpu_catalog.py -k test_proposal_is_correct -rfEsp \
        2>&1 | (header; cat) | tee "$OUT/gpu-catalog.txt" | tail -25
      ;;
    editor)
      timeout -s INT -k 15 "${EDITOR_TIMEOUT:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/server -rfEsp \
        2>&1 | (header; cat) | tee "$OUT/editor-gpu.txt" | tail -15
      ;;
    remote)
      timeout -s INT -k 15 "${REMOTE_TIMEOUT:-500}" python3 benchmarks/remote_search.py \
        --sshd "${REMOTE_SSHD:-/usr/sbin/sshd}" --out "$OUT/remote-search-h200.json" \
        2>&1 | (header; cat) | tee "$OUT/remote-search.log" | tail -40
      ;;
    llm)
      python3 benchmarks/llm_e2e.py --out "$OUT/llm" 2>&1 | tee "$OUT/llm-e2e.log" | tail -20
      ;;
    verdicts)
      timeout -s INT -k 15 "${VERDICTS_TIMEOUT:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 \
        tests/test_gpu_verdicts.py tests/test_gpu.py -rfEsp \
        2>&1 | (header; cat) | tee "$OUT/gpu-verdicts.txt" | tail -15
      ;;
    tricks)
      # shellcheck disable=SC2086
      timeout -s INT -k 15 "${TRICKS_TIMEOUT:-500}" python3 benchmarks/tricks.py \
        --out "$OUT/tricks-h200-$(echo "${TRICKS_SHARD:-1/1}" | tr / -).json" --shard "${TRICKS_SHARD:-1/1}" \
        ${TRICKS_ONLY:+--only $TRICKS_ONLY} 2>&1 | (header; cat) | tee "$OUT/tricks.log" | tail -80
      ;;
    overhead)
      timeout -s INT -k 15 "${OVERHEAD_TIMEOUT:-240}" python3 benchmarks/verdict_overhead.py \
        --out "$OUT/verdict-overhead-h200.json" --repeats "${OVERHEAD_REPEATS:-5}" \
        2>&1 | (header; cat) | tee "$OUT/overhead.log" | tail -15
      ;;
    deliver)
      for what in ${DELIVER_ONLY:-softmax layernorm}; do
        cp "fixtures/tricks/originals/${what}_rows.cu" "$OUT/${what}_rows.cu"
        timeout -s INT -k 15 "$(( ${DELIVER_SECONDS:-200} + 120 ))" python3 -m optiml.cli optimize \
          "$OUT/${what}_rows.cu" -k "${what}_rows" --budget "${DELIVER_BUDGET:-24}" \
          --time "${DELIVER_SECONDS:-200}" --out "$OUT/deliver-$what" \
          2>&1 | (header; cat) | tee "$OUT/deliver-$what.txt" | tail -25
      done
      ;;
    lift)
      timeout -s INT -k 15 "${LIFT_TIMEOUT:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/lift -rfEs \
        2>&1 | (header; cat) | tee "$OUT/lift-gpu.txt" | tail -8
      ;;
    linear)
      python3 benchmarks/linear_bias.py --out "$OUT" 2>&1 | (header; cat) | tee "$OUT/linear-torch.txt" | tail -20
      cp fixtures/wild/linear_bias.cu "$OUT/linear_bias.cu"
      timeout -s INT -k 15 "$(( ${LINEAR_SECONDS:-90} + 120 ))" python3 -m optiml.cli optimize \
        "$OUT/linear_bias.cu" -k matmul_forward_naive --budget "${LINEAR_BUDGET:-12}" \
        --time "${LINEAR_SECONDS:-90}" --out "$OUT/linear" \
        2>&1 | (header; cat) | tee "$OUT/linear-optimize.txt" | tail -25
      ;;
    intents)
      # shellcheck disable=SC2086
      timeout -s INT -k 15 "${INTENTS_TIMEOUT:-560}" python3 benchmarks/intents.py --out "$OUT/intents" \
        --budget "${INTENTS_BUDGET:-48}" --time "${INTENTS_TIME:-90}" --shard "${INTENTS_SHARD:-1/1}" \
        ${INTENTS_ONLY:+--only $INTENTS_ONLY} 2>&1 | (header; cat) | tee "$OUT/intents.log" | tail -5
      cp "$OUT"/intents/intents*.json "$OUT"/ 2>/dev/null; rm -rf "$OUT/intents/work"
      ;;
    kernelbench)
      # shellcheck disable=SC2086
      timeout -s INT -k 15 "${KB_TIMEOUT:-560}" python3 benchmarks/kernelbench.py --out "$OUT/kb" \
        --tasks "${KB_TASKS:?set KB_TASKS to the level-1 folder}" --budget "${KB_BUDGET:-48}" \
        --time "${KB_TIME:-90}" --shard "${KB_SHARD:-1/1}" ${KB_ONLY:+--only $KB_ONLY} \
        ${KB_STEPS:+--steps $KB_STEPS} ${KB_TORCH_FROM:+--torch-from $KB_TORCH_FROM} \
        ${KB_SECONDS:+--seconds $KB_SECONDS} \
        2>&1 | (header; cat) | tee "$OUT/kernelbench.log" | tail -5
      cp "$OUT"/kb/kernelbench*.json "$OUT"/ 2>/dev/null
      # each task's search record (trajectory), where a row's summary does not say enough
      (cd "$OUT/kb/work" 2>/dev/null && find . -path '*/optimize/*.json' -print0 |
        tar czf "$OUT/kb-trajectories.tgz" --null -T -)
      rm -rf "$OUT/kb/work"
      ;;
    schedules)
      timeout -s INT -k 15 "${SCHEDULES_TIMEOUT:-560}" python3 benchmarks/schedules.py --out "$OUT/schedules" \
        --shard "${SCHEDULES_SHARD:-1/1}" --seconds "${SCHEDULES_SECONDS:-480}" \
        2>&1 | (header; cat) | tee "$OUT/schedules.log" | tail -5
      ;;
    phases)
      timeout -s INT -k 15 "${PHASES_TIMEOUT:-120}" python3 benchmarks/eval_phases.py \
        --out "$OUT/eval-phases.json" --repeats "${PHASES_REPEATS:-2}" \
        2>&1 | (header; cat) | tee "$OUT/eval-phases.log" | tail -3
      ;;
    throughput)
      # shellcheck disable=SC2086
      timeout -s INT -k 15 "${THROUGHPUT_TIMEOUT:-560}" python3 benchmarks/throughput.py \
        --out "$OUT/throughput.json" --parallel "${THROUGHPUT_PARALLEL:-8}" \
        --budget "${THROUGHPUT_BUDGET:-20}" ${THROUGHPUT_FIXTURES:+--fixtures $THROUGHPUT_FIXTURES} \
        --ahead "${THROUGHPUT_AHEAD:-off}" \
        2>&1 | (header; cat) | tee "$OUT/throughput.log" | tail -3
      ;;
    corpus)
      # shellcheck disable=SC2086
      timeout -s INT -k 15 "${CORPUS_TIMEOUT:-560}" python3 benchmarks/corpus.py --out "$OUT/corpus" \
        --shard "${CORPUS_SHARD:-1/1}" ${CORPUS_ONLY:+--only $CORPUS_ONLY} \
        2>&1 | (header; cat) | tee "$OUT/corpus.log" | tail -5
      cp "$OUT"/corpus/corpus*.json "$OUT"/ 2>/dev/null; rm -rf "$OUT/corpus/work"
      ;;
    *) echo "unknown step $step" ;;
  esac
done
