# Session 36, call 1: which GPU, the wheels into /tmp/site, the first half of the default model's GGUF to /tmp/gg.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
source benchmarks/device_wheels.sh .dev/w35/*.whl && echo wheels ok
mkdir -p /tmp/gg && cp .dev/m1/* /tmp/gg/ && ls -la /tmp/gg
git log --oneline -1 2>/dev/null
