#!/usr/bin/env bash
# Issue 28's serving comparison on one GPU: aggregated `--mixed 1` at each chunk size against
# `--prefill 1 --decode 1` (on a one-GPU host the launcher runs it as one multiplexed worker), on the
# interference workload of benchmarks/serving/serving.py (64 chat clients 256 in / 256 out back to back,
# 6,000-token prompts arriving at each rate of LONG_RATES per second), REPEAT runs of INTERF_S seconds
# per rate, goodput at the SLO (TTFT <= 1 s and every inter-token gap <= ITL_SLO_MS).
#   bash benchmarks/serving/pd_one_gpu.sh [MODEL_DIR]     (default: the default model)
# A random-weight shape (the 8B one: `python -m common.tools.random_model --preset qwen3-8b --out DIR
# --tokenizer-from DEFAULT_MODEL_DIR --device cuda`) needs a tokenizer covering its vocabulary, which
# --tokenizer-from gives it: without one, most sampled ids stream no text and the ITL measures nothing.
# Env: ARMS ("agg512 agg2048 agg8192 mux": aggN is --mixed 1 --max-num-batched-tokens N; mux the
# default multiplexed worker (every prompt a chunk); muxm is mux with --mux-inline-measured (prompts
# inline up to a measured break-even against a chunk); muxiN is mux with a fixed limit: prompts of up
# to N tokens inside its decode steps; muxtN is mux with the fixed target --itl-target-ms N (and
# --itl-target-solo-ratio 0); muxrR is mux with
# --itl-target-solo-ratio R (R x the solo decode gap, at most the target; the default, as mux, is R = 2
# since session 36; muxt30 is the fixed 30-ms target alone); muxk is mux with
# --mux-split knee: the share stops where a larger one would slow decode; muxd is mux with --mux-split
# drain --itl-target-solo-ratio 2: 2 x solo, but the --itl-target-ms cap while prefill is behind; muxa is mux with each new chunk
# started after its engine step's decode step, PDSERVE_MUX_CHUNK_AFTER_DECODE=1), LONG_RATES
# ("0.5 1 2"), REPEAT (3), INTERF_S (30), ITL_SLO_MS (50: the 8B shape's; 15 for the default model),
# MUX_EXTRA (more launch flags of the multiplexed arm, e.g. "--itl-target-ms 10"). One cluster per arm
# serves every rate (about 5.5 minutes per arm at the defaults): split ARMS over device calls.
# Logs and tables: ${OUT:-/tmp/pdserve-pd1}/ARM/; each arm's table (benchmarks/serving/cluster_table.py)
# is printed as it finishes: one row per rate, TTFT of the long prompts, TPOT and ITL of the chat. The
# workers' logs (ARM/SETUP/logs/) carry a stats line every 10 s whose "step ms by class" part says which
# steps (beside a chunk, the first after a launch, ...) are long: where the chat's ITL tail comes from;
# ARM/step_classes.txt keeps those parts of the arm's lines.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
MODEL="${1:-}"
OUTDIR="${OUT:-/tmp/pdserve-pd1}"
WL=""
for rate in ${LONG_RATES:-0.5 1 2}; do WL="$WL interference@$rate"; done
for arm in ${ARMS:-agg512 agg2048 agg8192 mux}; do
  after=0
  case $arm in
    agg*) setup=mixed extra="--max-num-batched-tokens ${arm#agg}" ;;
    mux) setup=ipc extra="${MUX_EXTRA:-}" ;;
    muxm) setup=ipc extra="--mux-inline-measured ${MUX_EXTRA:-}" ;;
    muxi*) setup=ipc extra="--mux-inline-prompt-tokens ${arm#muxi} ${MUX_EXTRA:-}" ;;
    muxt*) setup=ipc extra="--itl-target-ms ${arm#muxt} --itl-target-solo-ratio 0 ${MUX_EXTRA:-}" ;;
    muxr*) setup=ipc extra="--itl-target-solo-ratio ${arm#muxr} ${MUX_EXTRA:-}" ;;
    muxk) setup=ipc extra="--mux-split knee ${MUX_EXTRA:-}" ;;
    muxd) setup=ipc extra="--mux-split drain --itl-target-solo-ratio 2 ${MUX_EXTRA:-}" ;;
    muxa) setup=ipc extra="${MUX_EXTRA:-}" after=1 ;;
    *) echo "unknown arm $arm (aggN, mux, muxm, muxiN, muxtN, muxrR, muxk, muxd or muxa)" >&2; exit 2 ;;
  esac
  echo "== $arm"
  env PDSERVE_MUX_CHUNK_AFTER_DECODE=$after OUT="$OUTDIR" TAG="$arm" SETUPS="$setup" MIXED_N=1 WORKLOADS="$WL" REPEAT="${REPEAT:-3}" \
      GOODPUT="--goodput-ttft-ms 1000 --goodput-itl-ms ${ITL_SLO_MS:-50}" LAUNCH_EXTRA="$extra" \
      bash benchmarks/serving/gpu_cluster.sh $MODEL
  # The workers' step classes over the arm's runs, one line per stats interval (see above).
  grep -h "step ms by class" "$OUTDIR/$arm/$setup/logs/"* 2>/dev/null | sed 's/.*step ms by class/step ms by class/' \
    > "$OUTDIR/$arm/step_classes.txt"
done
