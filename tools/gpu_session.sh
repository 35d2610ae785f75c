#!/usr/bin/env bash
# One GPU call that checks and times everything on a single-GPU machine (the H200 of our
# device tool), from source: GPU tests first (in parallel: they are compile-bound and
# their timings mean nothing), then the benchmarks one after another on a quiet GPU.
# Usage (repo root): OUT=dir tools/gpu_session.sh [quick]
set -uo pipefail
OUT=${OUT:-gpu-session-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=packages/mono-peer/src:packages/mono-runtime/src:packages/mono-kernels-minimax/src:packages/mono-kernels-kimi/src:integration/src:tools/src
P=packages
run_tests() {  # name, timeout, pytest args...
    local name=$1 limit=$2; shift 2
    timeout "$limit" python3 tools/gpu_run.py --out "$OUT/$name" -- -v --timeout 280 "$@" \
        >"$OUT/$name.log" 2>&1
    echo "tests $name: exit $?" >>"$OUT/status.txt"
}
: >"$OUT/status.txt"
# Phase 1: correctness, in parallel.
run_tests ffn 270 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "not full and not bench" &
run_tests k1 270 $P/mono-kernels-kimi/tests/test_k1_gpu.py -k "tiny or bad_slot" &
run_tests rest 270 $P/mono-peer/tests $P/mono-runtime/tests integration/tests/test_toy_decode.py \
    tools/tests/test_gpu_smoke.py &
# Compile the benchmarks' kernels meanwhile (Triton and inductor caches are on disk), so
# phase 2 times kernels rather than compilers.
timeout 270 python3 -m mono_kernels_minimax.ffn.bench --rows 1,4,16 --formats mxfp4,fp8 --layers 2 >"$OUT/ffn-warm.txt" 2>&1 &
timeout 270 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,8x1,1x8 --layers 2 --skip-no-prefetch >"$OUT/kda-warm.txt" 2>&1 &
wait
# Phase 2: benchmarks, one at a time.
bench() {  # name, timeout, command...
    local name=$1 limit=$2; shift 2
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    echo "bench $name: exit $?" >>"$OUT/status.txt"
}
bench protocol 45 python3 -m mono_runtime.bench_protocol --variants
bench ffn 150 python3 -m mono_kernels_minimax.ffn.bench --rows 1,4,16 --formats mxfp4,fp8 --layers 12
bench kda 100 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,8x1,1x8 --layers 8 --skip-no-prefetch
cat "$OUT/status.txt"
for f in "$OUT"/*.log; do echo "== $f"; grep -E "^(passed|FAILED|ERROR|skipped) " "$f" | grep -v "^passed" | head -20; grep -E "pytest exit" "$f"; done
for f in protocol ffn kda; do echo "== $f"; tail -25 "$OUT/$f.txt"; done
