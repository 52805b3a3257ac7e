# Sourced by the engine's env-switch A/B scripts (skew_help_ab.sh, top_k_ab.sh): the repository root as
# the working directory and on PYTHONPATH, LOG (${OUT:-/tmp/pdserve-gpu}/NAME), `elapsed` (seconds since
# sourcing), `quiet` (a benchmark's last line, progress bars dropped) and `medians` (the runs' table).
#   source "$(dirname "${BASH_SOURCE[0]}")/env_ab.sh" NAME
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
LOG="${OUT:-/tmp/pdserve-gpu}/$1"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
quiet() { grep -v "Loading\|it/s\]" | tail -1; }

# medians KEY BASE: offline.py's JSON files $LOG/FIGURE_KEY{ARM}_N.json, per figure each arm's runs,
# their median and its ratio to arm BASE's.
medians() {
  python3 - "$LOG" "$1" "$2" <<'PY'
import json, pathlib, statistics, sys
log, key, base = sys.argv[1:]
runs = {}
for path in sorted(pathlib.Path(log).glob(f"*_{key}*_*.json")):
    figure, rest = path.stem.split(f"_{key}")
    runs.setdefault(figure, {}).setdefault(rest.split("_")[0], []).append(json.loads(path.read_text())[0]["tok_per_s"])
for figure, arms in sorted(runs.items()):
    for arm, values in sorted(arms.items()):
        median = statistics.median(values)
        ratio = median / statistics.median(arms[base]) if arms.get(base) else float("nan")
        print(f"{figure:6} {key}={arm}: {[round(v) for v in values]} median {round(median)} ({ratio:.3f}x {key}={base})")
PY
}
