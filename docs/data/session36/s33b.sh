# Session 33, 8B shape served: ratio 2 (now with the graph floor) against the fixed 30-ms default, the replay after
# capture in both. H100: two long prompts a second (where ratio 2 collapsed in session 32); H200: one a second.
set -u
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"; git log --oneline -1 2>/dev/null
R=2; echo "$GPU" | grep -q H200 && R=1
ARMS="${ARMS:-muxr2 mux}" LONG_RATES=$R LIMIT=${LIMIT:-585} bash .dev/run/s32rates.sh
