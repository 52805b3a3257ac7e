one() { d=$(mktemp -d); t0=$(date +%s.%N); (cd $1 && timeout 120 .venv/bin/python -m deploy.launch --model ~/.cache/pdserve/models/SmolLM2-135M-Instruct --backend local --port 0 --log-dir $d --log-level warning --prefill 1 --decode 1 --num-kvcache-blocks 256 > $d/launcher.out 2>&1) &
pid=$!; for i in $(seq 1 300); do sleep 0.05; grep -q "pdserve ready" $d/launcher.out && break; done; t1=$(date +%s.%N); echo "$2 $(echo "$t1-$t0"|bc)"; pkill -TERM -f "log-dir $d" ; wait $pid; sleep 1; }
for r in 1 2 3 4; do one /tmp/base base; one /work/main new; done
