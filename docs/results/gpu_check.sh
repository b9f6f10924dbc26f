#!/usr/bin/env bash
# One prepared GPU check for a session lent a device machine (one H100/H200, about 15 minutes of device time):
# the CUDA tests, `madqn bench --quick --device cuda` and a wall-limited configs/pong_gpu.toml run, each under its
# own time limit so that the whole script ends within about 9 minutes. Everything it keeps lands in $OUT.
#
#   bash docs/results/gpu_check.sh prepare    # here, with the package index: wheels the GPU image lacks, into .whl/
#   # then, through the device tool: command "bash docs/results/gpu_check.sh run", carry [".whl"], timeout_s 600
#
# The GPU image has python3 3.12 with torch, numpy, opencv, scipy, pytest; madqn's Atari stack travels as wheels.
set -uo pipefail
cd "$(dirname "$0")/../.."
WHEELS="pettingzoo==1.27.0 gymnasium==1.4.0 ale-py==0.12.1 supersuit==3.11.0 tinyscaler==1.2.8
        farama-notifications==0.0.6 multi-agent-ale-py==0.1.12"  # 6 MB in all (videos are not made there)

case "${1:-}" in
prepare)
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl $WHEELS
    ls .whl
    ;;
run)
    OUT=${OUT:-/tmp/gpu_check}
    mkdir -p "$OUT"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/machine.txt"
    python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/machine.txt"
    # 1. the CUDA tests: the captured update against the eager one, device-resident replay, the CUDA learner
    timeout 150 python3 -m pytest -p no:cacheprovider -q -m "" -p no:xdist \
        tests/test_cuda_graph.py tests/test_device_frames.py tests/test_cuda.py 2>&1 | tee "$OUT/cuda_tests.log" | tail -15
    # 2. the bench, CUDA rows included (the captured learner against the captured bare update, pong_gpu end to end)
    timeout 240 python3 -m madqn bench --quick --device cuda --out "$OUT/bench_cuda.md" > "$OUT/bench.log" 2>&1
    tail -30 "$OUT/bench.log"
    # 3. configs/pong_gpu.toml for 150 s of wall time (SIGTERM: it checkpoints), evaluating every 50k agent steps
    timeout -s TERM 150 python3 -m madqn train --config configs/pong_gpu.toml --set eval_freq=50000 \
        --set eval_steps=10000 --set save_replay=false --run-dir /tmp/pong_gpu > "$OUT/train.log" 2>&1
    tail -5 "$OUT/train.log"
    for f in train.csv eval.csv; do cp "/tmp/pong_gpu/$f" "$OUT/pong_gpu_$f" 2>/dev/null; done
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
