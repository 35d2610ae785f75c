#!/usr/bin/env bash
# GPU calls that check and time everything on a single-GPU machine (the H200 of our
# device tool), from source; each part fits one 10-minute device call. Part "check"
# (phase 1) runs the GPU tests and `mono qualify` in parallel (they are compile-bound;
# their timings mean nothing) while the benchmarks' kernels compile; part "bench"
# (phase 2) runs `mono bench` one kernel at a time on a quiet GPU; part "tune" times the
# tuning tables (engine GEMV variants, FFN layouts, a timeline), part "tiles" FFN tiles.
# Logs go to one archive and the plots/JSON beside it, so few files land in $OUT.
# Usage (repo root): OUT=dir tools/gpu_session.sh "PART [PART ...]" (part bisect: first
# `tools/gpu_session.sh --prepare REV...` here), parts: check+bench, tune,
# tiles, diag, stream, fixes, drafter, kimi, drafter-tune, sanitize, k2perf, k2occ,
# k2-tune, kimi-tune, tables, k2check, bisect, k2tables, k2router, naps, icache, l2fill, k1step, acquire, split, verify, k2prof, mini, k2-backoff, k1, k1-tests, ffn, frag, gluon, gluon-tune, gluon-waves, gluon-down, gluon-final, k2-gluon, ffn-both, k2-both, fp8, fp8-route, sdown, stages, rings, s16-router, rmma, fulltests, push, pubstore, backoff, confirm, toy, order, k1-drafter, k1-tune, pair, gemv, stock, upstage, router, gemvprof, profile, profile-drafter, latency, all.
set -uo pipefail
if [[ ${1:-} == --prepare ]]; then  # here, before a call of part "bisect": each REV's code
    shift
    rm -rf .bisect
    for rev in "$@"; do
        mkdir -p ".bisect/$rev" && git archive "$rev" packages integration tools conftest.py \
            pyproject.toml |
            tar x -C ".bisect/$rev"
    done
    exit
fi
OUT=${OUT:-gpu-session-out}
mkdir -p "$OUT"
LOG=$(mktemp -d)
PART=${1:-check+bench}
has() { [[ " $PART " == *" $1 "* ]]; }  # PART: one or more part names
export PYTHONUNBUFFERED=1
src_path() {  # the PYTHONPATH of the repo's tree at prefix $1 ("": this one; ".bisect/REV/")
    local p=${1}packages/mono-peer/src:${1}packages/mono-runtime/src
    p=$p:${1}packages/mono-kernels-minimax/src:${1}packages/mono-kernels-kimi/src
    echo "$p:${1}integration/src:${1}tools/src"
}
PYTHONPATH=$(src_path "")
export PYTHONPATH
# humming (vLLM's HUMMING kernels, the FFN bench's stock baseline), carried from the synced
# environment: `carry: [".venv/lib/python3.11/site-packages/humming"]`
HUMMING_SITE=.venv/lib/python3.11/site-packages
[[ -d $HUMMING_SITE/humming ]] && PYTHONPATH=$PYTHONPATH:$HUMMING_SITE
P=packages
MONO="python3 -m mono_tools.cli"  # a word list, so `timeout` can run it
# The whole part ends by BUDGET seconds (default 560, inside the device call's 600), so
# the archive is always written: each step's limit is cut to what is left, and a step
# with under 20 s left is skipped and says so.
END=$((SECONDS + ${BUDGET:-560}))
step() {  # name, timeout, command...: its output in $LOG/name.txt, its status in status.txt
    local name=$1 limit=$2 left=$((END - SECONDS - 10)); shift 2
    if ((left < 20)); then
        echo "$name: skipped (the part's budget is spent)" >>"$LOG/status.txt"
        return
    fi
    ((limit > left)) && limit=$left
    timeout "$limit" "$@" >"$LOG/$name.txt" 2>&1
    echo "$name: exit $? (limit ${limit} s, ended at ${SECONDS} s)" >>"$LOG/status.txt"
}
tests() {  # name, timeout, pytest args...
    local name=$1 limit=$2; shift 2
    step "$name" "$limit" python3 tools/gpu_run.py --out "$LOG/$name" -- -v --timeout 280 "$@"
}
ncu_launch() {  # report name, kernel regex, launches to skip, command...: Nsight Compute
    # on one launch (clocks left alone), the sections ncu_top.py reads, into $LOG/name
    local name=$1 kernel=$2 skip=$3; shift 3
    step "ncu-$name" 240 "$NCU" --clock-control none -k "regex:$kernel" --launch-skip "$skip" \
        --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section SourceCounters \
        --section MemoryWorkloadAnalysis --import-source yes -o "$LOG/$name" -f "$@"
}
k2_warm() {  # limit, MONO_K2_TILES values...: each variant's Gluon K2 at S = 1 / 4 / 16
    # compiled in a process of its own, in the background (the caller waits)
    local limit=$1 v; shift
    for v in "$@"; do
        step "warm-k2-${v//[=,]/_}" "$limit" env MONO_K2_TILES="$v" python3 -m \
            mono_kernels_kimi.k2.bench --rows 1,4,16 --layers 1 --no-baseline --engine gluon &
    done
}
k2_time() {  # name prefix, limit, MONO_K2_TILES values...: each timed alone, 8 layers a graph
    local pre=$1 limit=$2 v; shift 2
    for v in "$@"; do
        step "$pre-${v//[=,]/_}" "$limit" env MONO_K2_TILES="$v" python3 -m \
            mono_kernels_kimi.k2.bench --rows 1,4,16 --layers 8 --no-baseline --engine gluon
    done
}
warm_ffn() {  # name, timeout, widths, format, MONO_FFN_TILES ("": none): compile, time nothing
    step "warm-ffn-$1" "$2" env MONO_FFN_TILES="$5" python3 -m mono_kernels_minimax.ffn.bench \
        --rows "$3" --formats "$4" --layers 1 --no-baseline
}
warm_env() {  # name prefix, variable, values...: each value's FFN (mxfp4, S = 1 and 16)
    # compiled in a process of its own, in the background (a variable read at import is in
    # Triton's cache key)
    local pre=$1 var=$2 v; shift 2
    for v in "$@"; do
        (export "$var=$v"; warm_ffn "$pre$v" 200 1,16 mxfp4 "") &
    done
}
timed_env() {  # name prefix, step limit, variable, values...: each value timed with its timeline
    local pre=$1 limit=$2 var=$3 v; shift 3
    for v in "$@"; do
        mkdir -p "$LOG/bench/$pre$v"
        step "$pre$v" "$limit" env "$var=$v" python3 -m mono_kernels_minimax.ffn.tune \
            --rows 1,16 --format mxfp4 --timeline "$LOG/bench/$pre$v"
    done
}
: >"$LOG/status.txt"
mkdir -p "$LOG/bench"
if has k1-tests; then
    # K1's GPU tests alone, in the background, beside whichever part is named with it
    # (they are compile-bound; a part timing kernels beside them would be disturbed). All
    # 20 need more than 300 s on a fresh machine (stop 34: the give-up test, full shapes,
    # was cut there), so they may take the whole call.
    tests k1 540 $P/mono-kernels-kimi/tests/test_k1_gpu.py --tb=short &
fi
if has check+bench || has all; then
    # Phase 1, in parallel.
    tests ffn 270 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "not bench" &
    tests k1 270 $P/mono-kernels-kimi/tests/test_k1_gpu.py -k "tiny or bad_slot or 1-1-True-13-full" &
    tests k2 270 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "not bench" &
    tests rest 270 $P/mono-peer/tests $P/mono-runtime/tests integration/tests/test_toy_decode.py \
        tools/tests/test_gpu_smoke.py &
    step qualify 270 $MONO qualify --ranks 1 --json "$LOG/qualify.json" &
    step warm-ffn 270 python3 -m mono_kernels_minimax.ffn.bench --rows 1,4,16 --formats mxfp4 --layers 2 &
    step warm-k2 270 python3 -m mono_kernels_kimi.k2.bench --rows 1,4,16 --layers 2 --no-baseline &
    step warm-kda 270 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,8x1,16x1,2x8 --layers 2 &
    wait
    # Phase 2, one at a time.
    step bench-ffn 130 $MONO bench ffn --rows 1,4,16 --format mxfp4 --out "$LOG/bench"
    step bench-kda 120 $MONO bench kda --rows 1,8,16 --out "$LOG/bench"
    step bench-k2 150 $MONO bench k2 --rows 1,4,16 --out "$LOG/bench"
    step bench-allreduce 50 $MONO bench allreduce --rows 1,4,16 --out "$LOG/bench"
fi
if has tune || has all; then
    # Tuning tables: every engine GEMV variant (formats x tiles, mxfp4-rot beside the
    # checkpoint layout), the FFN on both MXFP4 layouts and 8-warp tiles, one timeline.
    step gemv-variants 200 python3 -m mono_runtime.stream.bench --variants --rows 1,16 \
        --json "$LOG/bench/gemv-variants.json"
    step tune-ffn 200 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 --format mxfp4 \
        --layouts rot,k32
    step timeline-ffn 120 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 \
        --format mxfp4 --timeline "$LOG/bench"
fi
if has diag; then
    # Correctness after a fix (in parallel, compile-bound), then where the time goes:
    # the FFN's, K2's and K1's item timelines (FFN tiles: part "tiles").
    tests k2 200 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "not bench" &
    tests rest 200 integration/tests/test_toy_decode.py -k "gpu and kimi" &
    step qualify 200 $MONO qualify --ranks 1 --json "$LOG/qualify.json" &
    wait
    step timeline-ffn 120 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 \
        --format mxfp4 --timeline "$LOG/bench"
    step timeline-k2 120 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 8 \
        --timeline "$LOG/bench"
    step timeline-kda 150 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,8x1,16x1 \
        --timeline "$LOG/bench"
fi
if has stream; then
    # After a change to the streaming engine: the FFN's and K2's GPU tests beside their
    # benchmarks' compiles, then the two benchmarks on a quiet GPU.
    tests ffn 270 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "not bench" --tb=short &
    tests k2 270 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "not bench" --tb=short &
    step warm-ffn 270 python3 -m mono_kernels_minimax.ffn.bench --rows 1,2,4,8,16 --formats mxfp4 --layers 2 &
    step warm-k2 270 python3 -m mono_kernels_kimi.k2.bench --rows 1,4,16 --layers 2 --no-baseline &
    wait
    step bench-ffn 170 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4 --out "$LOG/bench"
    step bench-k2 150 $MONO bench k2 --rows 1,4,16 --out "$LOG/bench"
fi
if has fixes; then
    # After fixes found on a CPU: K2 at full rank shapes, the toy decode with K1 + K2, the
    # drafter, the FFN on HUMMING-repacked experts (in parallel: compile-bound).
    tests k2 240 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "full_rank or opbyop" --tb=short &
    tests rest 240 integration/tests/test_toy_decode.py -k "gpu and kimi" --tb=short &
    tests drafter 280 $P/mono-kernels-kimi/tests/test_drafter_gpu.py --tb=short &
    # the FFN on experts repacked from vLLM's HUMMING layout (issue 16's H200 check)
    tests sources 200 $P/mono-kernels-minimax/tests/test_ffn_sources.py --tb=short &
    wait
fi
if has drafter; then
    # Issue 17 on the H200: the drafter's GPU tests (tiny cases, then a TP8 rank's full
    # shapes eager and from a graph), then `mono bench drafter` (1, 2, 4, 8 requests at
    # 1K / 8K / 32K cached tokens, with its op-by-op path), then its item timelines at 1K.
    # With part "fixes" in the same call its tests ran there; DRAFTER_TESTS=0 skips them
    # (an earlier call ran them: part "k2tables" does).
    if ! has fixes && [[ ${DRAFTER_TESTS:-1} != 0 ]]; then
        tests drafter 300 $P/mono-kernels-kimi/tests/test_drafter_gpu.py --tb=short
    fi
    step bench-drafter 200 $MONO bench drafter --rows 1,2,4,8 --out "$LOG/bench"
    # (1K: the short context, where the drafter trails its op-by-op path; with the critical
    # path: what held the launch's end, hand-offs against work)
    step timeline-drafter 100 python3 -m mono_kernels_kimi.drafter.bench --requests 1,8 \
        --context 1024 --timeline "$LOG/bench"
fi
if has kimi; then
    # After a change to the drafter or K2: both kernels' GPU tests side by side (full rank
    # shapes included), then `mono bench drafter` and `mono bench k2` and their timelines.
    tests drafter 200 $P/mono-kernels-kimi/tests/test_drafter_gpu.py --tb=short &
    tests k2 240 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "not bench" --tb=short &
    step warm-k2 240 python3 -m mono_kernels_kimi.k2.bench --rows 1,4,16 --layers 2 --no-baseline &
    wait
    step timeline-k2 60 python3 -m mono_kernels_kimi.k2.bench --rows 16,1 --layers 8 \
        --timeline "$LOG/bench"
    step bench-k2 120 $MONO bench k2 --rows 1,4,16 --out "$LOG/bench"
    step bench-drafter 160 $MONO bench drafter --rows 1,2,4,8 --out "$LOG/bench"
    step timeline-drafter 60 python3 -m mono_kernels_kimi.drafter.bench --requests 1,8 \
        --context 8192 --timeline "$LOG/bench"
fi
if has drafter-tune; then
    # Drafter tiles (MONO_DRAFTER_TILES) compiled side by side and timed one after another
    # (stop 32 made rc = 2048, rs = 1 at 1-2 requests and ast = 2 the defaults from this
    # part, stop 33 gpair = 1 and nsplit = 32, stop 56 occ = 1 and dks = 3: two programs
    # an SM 4-19% slower, down in 3 K parts 3-6% faster). Next: two programs an SM again,
    # down in 2 / 6 K parts, gate_up in 7 (504 items: 1.9 waves where 4 parts' 288 are 1.1
    # of 132 programs), with 64-row tiles, q_b in 96 items of 16 rows; then the default's
    # timelines at 1K (the short contexts at one request: 0.61x op-by-op at stop 33). Its
    # GPU tests and `mono bench drafter`: part `drafter` or `kimi` (with a variant:
    # MONO_DRAFTER_TILES set).
    step tune-drafter 450 python3 -m mono_kernels_kimi.drafter.bench --requests 1,8 \
        --context 1024,32768 --variants "|occ=2|dks=2|dks=6|gks=7|gb=64,gks=7|qbn=16"
    step timeline-drafter 100 python3 -m mono_kernels_kimi.drafter.bench --requests 1,8 \
        --context 1024 --timeline "$LOG/bench"
fi
if has sanitize; then
    # The drafter under compute-sanitizer's memcheck, synccheck and racecheck.
    for tool in memcheck synccheck racecheck; do
        step drafter-$tool 100 compute-sanitizer --tool $tool --print-limit 5 \
            python3 -m pytest -x -q -m gpu -p no:cacheprovider --timeout 90 \
            $P/mono-kernels-kimi/tests/test_drafter_gpu.py -k auto
    done
fi
if has k2perf; then
    step bench-k2 150 $MONO bench k2 --rows 1,4,16 --out "$LOG/bench"
    step timeline-k2 120 python3 -m mono_kernels_kimi.k2.bench --rows 16,1 --layers 8 \
        --timeline "$LOG/bench"
fi
if has kimi-tune; then
    # Kimi-K3 tiles, beside the drafter's GPU tests (stop 45; its one call, KIMI_TUNE_MIN,
    # made K2's 64-row bf16 items the Gluon build's default and took its S = 1 timeline).
    # K2: the early route (the default since) and 16-row items (the old tiles) timed against
    # it, then gate and up rows in one ring (`ring`) and one program an SM; K1: its proj loop
    # in K steps of 128 / 256 (twice / four times the bytes in flight: at one request 100
    # programs stream ~32 GB/s each, what ~48 KB in flight allows) and its items' first 896
    # columns asked of L2 while AttnRes runs (`proj_pf`). All compiled side by side (a
    # process a variant), then K2's S = 1 and 16 timelines and each variant timed alone (4
    # layers a graph: 8.6 GB of K2 weights, ~150x the L2). ~560 s on a fresh machine.
    tests drafter 240 $P/mono-kernels-kimi/tests/test_drafter_gpu.py --tb=short &
    OLD="uc=16,sb=16,lb=16,rbk=256,pbk=256"
    V2=("" "$OLD" "ring=1" "occ=1")
    V1=("" "block_k=64" "proj_pf=896")  # (block_k 128 the default since stop 46)
    # the variants' results checked at full shapes against the references
    (export MONO_K2_TILES=""
     tests k2 200 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "full_rank and gluon" --tb=short) &
    (export MONO_K1_TILES="proj_pf=896"
     tests k1 200 $P/mono-kernels-kimi/tests/test_k1_gpu.py -k "full" --tb=short) &
    for v in "${V2[@]}"; do
        step "warm-k2-${v//[=,]/_}" 240 env MONO_K2_TILES="$v" \
            python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 2 --no-baseline &
    done
    for v in "${V1[@]}"; do
        step "warm-k1-${v//[=,]/_}" 240 env MONO_K1_TILES="$v" python3 -m \
            mono_kernels_kimi.kda.bench --shapes 1x1,4x1,8x1,16x1 --layers 2 --no-baseline &
    done
    step warm-timeline-k2 240 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 1 \
        --timeline "$LOG/warm" &  # (compiles the timeline builds: timed again below)
    wait
    step timeline-k2 90 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 4 \
        --timeline "$LOG/bench"
    for v in "${V2[@]}"; do
        step "k2occ-${v//[=,]/_}" 80 env MONO_K2_TILES="$v" \
            python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 4 --no-baseline
    done
    for v in "${V1[@]}"; do
        step "k1tile-${v//[=,]/_}" 80 env MONO_K1_TILES="$v" python3 -m \
            mono_kernels_kimi.kda.bench --shapes 1x1,4x1,8x1,16x1 --layers 8 --no-baseline
    done
fi
if has k2occ || has k2-tune; then
    # K2 tiles (issue 15). k2occ: programs an SM (the default's bf16 streams at K step 128
    # need 61 KB of shared memory, two programs an SM; 122 KB at 256: one). k2-tune: the
    # bf16 stages' row tiles (16-row shared-up and up-projection items stream at ~2.2 TB/s
    # at one program an SM against ~4 in 64 rows: tools/stream_probe.py) and K splits. Each
    # variant's widths compile in parallel, then each is timed alone; the default with its
    # op-by-op path last.
    V=("" "occ=1" "obk=256,sdk=256,occ=1")
    # (sb = 64 and uc = 64 take 120 KB of shared memory: one program an SM; sm_90 on a CPU.
    # dc = 128: the routed down tile's e8m0 scales are 256 B a trip at 64 rows x 128, 2 B a
    # thread, which Triton loads synchronously each trip; 512 B at 128 rows go async)
    has k2-tune && V=("" "sb=32" "uc=32" "oc=128" "sd=128" "dks=2" "dc=128")
    for v in "${V[@]}"; do
        for s in 1 4 16; do
            step "warm-k2-$s-${v//[=,]/_}" 270 env MONO_K2_TILES="$v" \
                python3 -m mono_kernels_kimi.k2.bench --rows $s --layers 2 --no-baseline &
        done
    done
    wait
    for v in "${V[@]}"; do
        step "k2occ-${v//[=,]/_}" 90 env MONO_K2_TILES="$v" \
            python3 -m mono_kernels_kimi.k2.bench --rows 1,4,16 --layers 8 --no-baseline
    done
    step bench-k2 150 $MONO bench k2 --rows 1,4,16 --out "$LOG/bench"
fi
if has k1; then
    # After a change to K1 (issue 14): all its GPU tests (tiny and full shapes, eager and
    # graph, the give-up while serving) beside its benchmark's compiles; `mono bench kda`
    # over R requests of one token; spec shapes (R x L) with the op-by-op path; timelines.
    tests k1 300 $P/mono-kernels-kimi/tests/test_k1_gpu.py --tb=short &
    step warm-kda 300 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,2x1,4x1,8x1,16x1,1x2,1x4,1x8,2x4,2x8 \
        --layers 2 &
    wait
    step bench-kda 120 $MONO bench kda --rows 1,2,4,8,16 --out "$LOG/bench"
    step shapes-kda 90 python3 -m mono_kernels_kimi.kda.bench --shapes 1x2,1x4,1x8,2x4,2x8
    step timeline-kda 60 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,8x1,16x1 \
        --timeline "$LOG/bench"
fi
if has k1-drafter; then
    # After a change to K1's tiles and the drafter together: the drafter's GPU tests beside
    # K1's benchmark compiles (K1's own tests: part k1), then `mono bench kda` and `mono
    # bench drafter` on a quiet GPU, then K1's timelines.
    tests drafter 240 $P/mono-kernels-kimi/tests/test_drafter_gpu.py --tb=short &
    step warm-kda 240 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,2x1,4x1,8x1,16x1 \
        --layers 2 &
    wait
    step bench-kda 120 $MONO bench kda --rows 1,2,4,8,16 --out "$LOG/bench"
    step bench-drafter 160 $MONO bench drafter --rows 1,2,4,8 --out "$LOG/bench"
    step timeline-kda 60 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,4x1,16x1 \
        --timeline "$LOG/bench"
fi
if has k1-tune; then
    # K1 (issue 14): its item timelines at 1, 4, 8 and 16 requests beside each MONO_K1_TILES
    # variant's compiles, then each variant timed alone. Stop 31 timed the head items'
    # state rows, in_proj's K parts, row blocks, warps and depth; stop 32 the AttnRes
    # items' columns and the K parts (now chosen per width: `ares_block_h`,
    # `proj_split_k`), and the in_proj L2 prefetch (removed: 0.5-6% slower); stop 33 these
    # variants at 4 requests too (4 K parts there now). Variants: each per-width choice
    # fixed, proj items of 64 rows, deeper / narrower proj loops.
    V=("" "split_k=2" "split_k=4" "block_h=512" "block_n=64" "stages=3" "block_k=32")
    step timeline-kda 240 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,4x1,8x1,16x1 \
        --timeline "$LOG/bench" &
    for v in "${V[@]}"; do
        step "warm-k1-${v//[=,]/_}" 240 env MONO_K1_TILES="$v" python3 -m \
            mono_kernels_kimi.kda.bench --shapes 1x1,4x1,8x1,16x1 --layers 2 --no-baseline &
    done
    wait
    for v in "${V[@]}"; do
        step "k1tile-${v//[=,]/_}" 60 env MONO_K1_TILES="$v" python3 -m \
            mono_kernels_kimi.kda.bench --shapes 1x1,4x1,8x1,16x1 --layers 8 --no-baseline
    done
fi
if has pair; then
    # Gate and up as one tile of 2 BN rows (one dot a K step: ptxas keeps the wgmma
    # pipelined) against two dots a K step (ptxas serializes every wgmma of the FFN and K2:
    # C7515), in the FFN (tile pair), K2 (upair) and the drafter (gpair): each variant's
    # widths compiled side by side (beside the drafter's GPU tests), then each timed alone.
    for v in pair=1 pair=2; do
        step "warm-ffn-$v" 270 env MONO_FFN_TILES=$v python3 -m mono_kernels_minimax.ffn.bench \
            --rows 1,2,4,8,16 --formats mxfp4 --layers 2 --no-baseline &
    done
    for v in upair=1 upair=2; do
        for s in 1 4 16; do
            step "warm-k2-$s-$v" 270 env MONO_K2_TILES=$v python3 -m mono_kernels_kimi.k2.bench \
                --rows $s --layers 2 --no-baseline &
        done
    done
    step warm-drafter-gpair2 270 env MONO_DRAFTER_TILES=gpair=2 python3 -m \
        mono_kernels_kimi.drafter.bench --requests 1,8 --context 1024 --no-baseline &
    tests drafter 270 $P/mono-kernels-kimi/tests/test_drafter_gpu.py --tb=short &
    wait
    for v in pair=1 pair=2; do
        step "pair-ffn-$v" 60 env MONO_FFN_TILES=$v python3 -m mono_kernels_minimax.ffn.bench \
            --rows 1,2,4,8,16 --formats mxfp4 --no-baseline
    done
    for v in upair=1 upair=2; do
        step "pair-k2-$v" 60 env MONO_K2_TILES=$v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,4,16 --no-baseline
    done
    step pair-drafter 150 python3 -m mono_kernels_kimi.drafter.bench --requests 1,8 \
        --context 8192,32768 --variants "gpair=1|gpair=2"
fi
if has ffn; then
    # After a change to the FFN (stop 34's defaults were timed only at S = 1, 2): its GPU
    # tests beside its benchmark's and timelines' compiles, `mono bench ffn` at every width
    # on a quiet GPU, then the default's timelines at S = 1 and 16 (the route's share).
    tests ffn 250 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "not bench and not opbyop" \
        --tb=short &
    step warm-ffn 250 python3 -m mono_kernels_minimax.ffn.bench --rows 1,2,4,8,16 \
        --formats mxfp4 --layers 1 --no-baseline &
    step warm-timeline 250 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 --format mxfp4 \
        --layers 1 --timeline "$LOG" &
    wait
    step bench-ffn 130 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4 --out "$LOG/bench"
    step timeline-ffn 80 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 --format mxfp4 \
        --timeline "$LOG/bench"
    # one program an SM: do the latency-bound items (seam, router, route) shrink to their
    # alone times when their SM is not shared? (stop 34: ~3x them in the FFN)
    mkdir -p "$LOG/occ1"
    step timeline-ffn-occ1 60 python3 -m mono_kernels_minimax.ffn.tune --variants occ=1 \
        --rows 1 --format mxfp4 --timeline "$LOG/occ1"  # (ffn.tune sets MONO_FFN_TILES itself)
fi
if has frag; then
    # The Gluon mxfp4-frag engine (stop 35): its GPU test, then the engine GEMV of both
    # MXFP4 engines and cuBLAS bf16 in one run (kernels only), chosen tiles at S = 1, 4, 16
    # on a layer-sized and a large weight, then every frag tile on the FFN's up volume.
    tests frag 150 $P/mono-runtime/tests/test_frag.py --tb=short
    step gemv-frag 200 python3 -m mono_runtime.stream.bench --rows 1,4,16 \
        --formats mxfp4,mxfp4_frag --shapes 6144x6144,16384x8192,1536x6144 \
        --json "$LOG/bench/bench-gemv-frag.json"
    step gemv-frag-tiles 150 python3 -m mono_runtime.stream.bench --rows 1,16 --variants \
        --formats mxfp4_frag --shapes 6144x6144 --json "$LOG/bench/gemv-frag-tiles.json"
    step gemv-frag-tiles-expert 120 python3 -m mono_runtime.stream.bench --rows 1 --variants \
        --formats mxfp4_frag --shapes 1536x6144 --json "$LOG/bench/gemv-frag-tiles-expert.json"
fi
if has order; then
    # The FFN's scheduling tiles at S = 1 and 2, in under 200 s: the shared expert's up
    # items after the routed ones (sfirst=0; stop 34: 3-4 us slower), the route's tiles
    # of 2 rows (rt=2; stop 34: 1.5-2.5 us slower) against the default (the route as a
    # called function, timed here in stop 34, was slower and is gone); the FFN's tiny
    # GPU tests (both orders) and the route alone (tools/route_probe.py: cold, then warm)
    # beside the variants' compiles, then each variant timed alone, then `mono bench ffn`.
    tests ffn 110 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "tiny_every_width and mxfp4" &
    step route-probe 100 python3 tools/route_probe.py --rows 1,2,4,16 --rt 2,4 &
    for v in "" sfirst=0 rt=2; do
        warm_ffn "$v" 110 1,2 mxfp4 "$v" &
    done
    wait
    step order-ffn 50 python3 -m mono_kernels_minimax.ffn.tune --rows 1,2 --format mxfp4 \
        --variants "|sfirst=0|rt=2"
    step bench-ffn 50 $MONO bench ffn --rows 1,2 --format mxfp4 --out "$LOG/bench"
fi
if has stock; then
    # vLLM's stock MXFP4 experts (HUMMING; carry its package, see PYTHONPATH above) against
    # the FFN reference while a one-layer bench compiles every kernel (ours, HUMMING's,
    # torch.compile's), then the FFN bench with it beside the op-by-op baseline.
    tests stock 200 $P/mono-kernels-minimax/tests/test_ffn_stock.py &
    step warm-stock 220 python3 -m mono_kernels_minimax.ffn.bench --rows 1,2,4,8,16 \
        --formats mxfp4 --layers 1 &
    wait
    step bench-ffn-stock 220 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4 --out "$LOG/bench"
    for name in stock warm-stock bench-ffn-stock; do
        echo "== $name"
        tail -25 "$LOG/$name.txt"
    done
fi
if has gluon; then
    # The FFN's Gluon build (issue 13): its GPU tests (its only checks against the
    # reference: Gluon has no interpreter) beside the Triton build's (the shared helpers
    # it uses became two-language), compile-bound, in parallel; then both engines' benches
    # with the stock path (carry humming) on a quiet GPU, JSON rows in bench/.
    tests ffn-gluon 300 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "gluon" --tb=short &
    tests ffn-triton 300 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "not gluon and not bench" --tb=short &
    wait
    for engine in ${ENGINES:-gluon triton}; do
        step "bench-ffn-$engine" 150 python3 -m mono_kernels_minimax.ffn.bench --rows ${ROWS:-1,2,4,8,16} \
            --formats mxfp4 --engine "$engine" --json
        grep '^{' "$LOG/bench-ffn-$engine.txt" >"$LOG/bench/bench-ffn-$engine.json"
    done
    for name in ffn-gluon ffn-triton bench-ffn-gluon bench-ffn-triton; do
        echo "== $name"
        tail -30 "$LOG/$name.txt" "$LOG/$name"/*.txt 2>/dev/null | tail -30
    done
fi
if has gluon-tune; then
    # The Gluon FFN's tiles (its tests first, compile-bound, in parallel), then one table.
    tests ffn-gluon 200 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "gluon or two_ranks or full_rank" --tb=short &
    step warm-tune 200 python3 -m mono_kernels_minimax.ffn.tune --rows 1 --layers 1 --variants "stages=2,occ=3" &
    wait
    step tune-gluon 330 python3 -m mono_kernels_minimax.ffn.tune --rows ${ROWS:-1,4,16} --layouts frag --layers 12 \
        --variants "${VARIANTS:-|stages=2|stages=4|stages=2,occ=3|uks=2|dc=64|ubk=128|ubk0=256}"
    for name in ffn-gluon warm-tune tune-gluon; do
        echo "== $name"
        tail -30 "$LOG/$name.txt"
    done
fi
if has gluon-waves; then
    # The Gluon FFN's routed up stage by item count (stop 37's reading of the timeline: at
    # S = 1 its 192 items fill 0.73 of the 264 programs, at S = 4 and 8 1.3-1.5 waves):
    # each K-part count for every width, pair=3 (an up item's gate and up in one ring,
    # twice the bytes in flight; its GPU tests beside the compiles: test_frag.py's row pair
    # and test_ffn_gpu.py's full shapes with pair=3; read them before the table), and down
    # K steps of 128 (6 a slot, not 3). Each variant's widths compiled in its own process
    # side by side, then all timed in one table.
    tests ring 240 $P/mono-runtime/tests/test_frag.py \
        $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "row_pair or one-ring" --tb=short &
    V=("" "pair=3" "pair=3,uks=8" "uks=8" "uks=8,ubk=128" "uks=2" "dbk=128" "pair=3,dbk=128")
    for v in "${V[@]}"; do
        step "warm-waves-${v//[=,]/_}" 240 env MONO_FFN_TILES="$v" python3 -m \
            mono_kernels_minimax.ffn.bench --rows ${ROWS:-1,4,8,16} --formats mxfp4 --layers 1 \
            --no-baseline --engine gluon &
    done
    wait
    joined=$(IFS='|'; echo "${V[*]}")
    step tune-waves 240 python3 -m mono_kernels_minimax.ffn.tune --rows ${ROWS:-1,4,8,16} \
        --layouts frag --layers 12 --variants "$joined"
    tail -12 "$LOG/ring.txt"
    tail -30 "$LOG/tune-waves.txt"
fi
if has gluon-down; then
    # The Gluon FFN's down stage at S = 8 and 16 (0.86x the stock path at 16; its items
    # stream ~6 slots each, one ring a slot): twice the slot groups (ng 16: half the slots
    # an item, twice the items), 128 latent columns an item, both; compiled side by side,
    # then one table, beside the one-ring pair (pair 3: 0.93-0.95x the time at S = 8 / 16
    # in stop 38's gluon-waves). (ng 16 exceeds S = 1-4's slot count: those keep theirs.)
    V=("" "pair=3" "ng=16" "pair=3,ng=16" "pair=3,dc=128" "pair=3,ng=16,dc=128")
    for v in "${V[@]}"; do
        step "warm-down-${v//[=,]/_}" 240 env MONO_FFN_TILES="$v" python3 -m \
            mono_kernels_minimax.ffn.bench --rows 8,16 --formats mxfp4 --layers 1 \
            --no-baseline --engine gluon &
    done
    wait
    joined=$(IFS='|'; echo "${V[*]}")
    step tune-down 200 python3 -m mono_kernels_minimax.ffn.tune --rows 8,16 --layouts frag \
        --layers 12 --variants "$joined"
    tail -20 "$LOG/tune-down.txt"
fi
if has gluon-final; then
    # The Gluon FFN's remaining GPU tests (two ranks, graph replay, full shapes with the
    # device's default engine and with Gluon named) beside the bench's compiles, then `mono
    # bench ffn` with the default engine (Gluon) and the stock path (carry humming).
    tests ffn-gluon 300 $P/mono-kernels-minimax/tests/test_ffn_gpu.py \
        -k "two_ranks or graph or mxfp4-None or mxfp4-gluon" --tb=short &
    step warm-bench 300 python3 -m mono_kernels_minimax.ffn.bench --rows 1,2,4,8,16 \
        --formats mxfp4 --layers 1 --no-baseline --engine gluon &
    wait
    step bench-ffn 170 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4 --out "$LOG/bench"
    for name in ffn-gluon bench-ffn; do
        echo "== $name"
        tail -25 "$LOG/$name.txt"
    done
fi
if has k2-gluon; then
    # K2's Gluon build: its GPU tests (full TP8-rank shapes, graph replay) beside both
    # builds' bench compiles, then both timed one after the other.
    tests k2-gluon 300 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "gluon" --tb=short &
    for e in gluon triton; do
        step warm-k2-$e 300 python3 -m mono_kernels_kimi.k2.bench --rows 1,4,16 --layers 1 \
            --no-baseline --engine $e &
    done
    wait
    for e in gluon triton; do
        step k2-bench-$e 120 python3 -m mono_kernels_kimi.k2.bench --rows 1,4,16 --layers 8 \
            --no-baseline --engine $e
    done
    for name in k2-gluon k2-bench-gluon k2-bench-triton; do
        echo "== $name"
        tail -20 "$LOG/$name.txt"
    done
fi
if has ffn-both; then
    # The issue's one table: `mono bench ffn` over both formats (MXFP4 on the Gluon build,
    # FP8 on the Triton one, each against op-by-op and, MXFP4, the stock path; carry
    # humming), its compiles warmed first beside K2's tiny-shape GPU tests.
    tests k2 300 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "tiny or opbyop" --tb=short &
    for f in mxfp4 fp8; do
        step warm-ffn-$f 300 python3 -m mono_kernels_minimax.ffn.bench --rows 1,2,4,8,16 \
            --formats $f --layers 1 --no-baseline &
    done
    wait
    step bench-ffn 300 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4,fp8 --out "$LOG/bench"
    step timeline-ffn 120 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 \
        --format mxfp4 --timeline "$LOG/bench"
fi
if has k2-both; then
    # `mono bench gemv` (every format beside cuBLAS), then `mono bench k2` with its op-by-op
    # path, each build (bench-k2-ENGINE.json), its compiles warmed first.
    for e in gluon triton; do
        step warm-k2-$e 300 python3 -m mono_kernels_kimi.k2.bench --rows 1,2,4,8,16 \
            --layers 1 --no-baseline --engine $e &
    done
    wait
    step bench-gemv 200 $MONO bench gemv --rows 1,4,16 --out "$LOG/bench"
    for e in gluon triton; do
        step bench-k2-$e 150 $MONO bench k2 --rows 1,2,4,8,16 --engine $e --out "$LOG/k2-$e"
        cp "$LOG/k2-$e/bench-k2.json" "$LOG/bench/bench-k2-$e.json" 2>/dev/null
        cp "$LOG/k2-$e/bench-k2.png" "$LOG/bench-k2-$e.png" 2>/dev/null
    done
fi
if has fp8; then
    # The Gluon engine's FP8 stream (fp8-frag): its GPU tests and the FFN's FP8 Gluon build
    # at full shapes beside the FP8 bench's compiles, then the engine GEMV (fp8 on both
    # engines beside mxfp4-frag and bf16), the fp8-frag tile table, and `mono bench ffn
    # --format fp8 --engine gluon` against op-by-op.
    tests frag8 200 $P/mono-runtime/tests/test_frag8.py $P/mono-runtime/tests/test_frag.py \
        -k "frag8 or fp8" --tb=short &
    tests ffn 300 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "fp8-gluon" \
        --tb=short &
    step warm-ffn-fp8 300 python3 -m mono_kernels_minimax.ffn.bench --rows 1,2,4,8,16 \
        --formats fp8 --layers 1 --no-baseline --engine gluon &
    wait
    step gemv-fp8 120 python3 -m mono_runtime.stream.bench --rows 1,4,16 \
        --formats fp8,fp8_frag,mxfp4_frag,bf16 --shapes 4096x6144,16384x8192 \
        --json "$LOG/bench/bench-gemv-fp8.json"
    step gemv-fp8-tiles 90 python3 -m mono_runtime.stream.bench --rows 1,16 --variants \
        --formats fp8_frag --shapes 6144x6144 --json "$LOG/bench/gemv-fp8-tiles.json"
    step bench-ffn 150 $MONO bench ffn --rows 1,2,4,8,16 --format fp8 --engine gluon \
        --out "$LOG/bench"
fi
if has fp8-route || has route; then  # (route: its old name)
    # Parts fp8 and route in one call (~560 s): every compile-bound check in parallel (the
    # fp8-frag GPU tests, the FFN's FP8 Gluon build and route stage at full shapes, the
    # compiles of what is timed next), then, most wanted first, `mono bench ffn --format
    # fp8` (Gluon), the route tiles, FP8 on each build, the engine GEMV of both FP8 engines.
    tests frag8 200 $P/mono-runtime/tests/test_frag8.py $P/mono-runtime/tests/test_frag.py \
        -k "frag8 or fp8" --tb=short &
    tests ffn 260 $P/mono-kernels-minimax/tests/test_ffn_gpu.py \
        -k "fp8-gluon" --tb=short &
    for e in gluon triton; do
        step warm-ffn-fp8-$e 260 python3 -m mono_kernels_minimax.ffn.bench --rows 1,2,4,8,16 \
            --formats fp8 --layers 1 --no-baseline --engine $e &
    done
    V=("" "rr=4,racc=2" "spf=0")
    for v in "${V[@]}"; do
        warm_ffn "${v//[=,]/_}" 200 1,8,16 mxfp4 "$v" &
    done
    wait
    step bench-ffn 150 $MONO bench ffn --rows 1,2,4,8,16 --format fp8 --engine gluon \
        --out "$LOG/bench"
    joined=$(IFS='|'; echo "${V[*]}")
    step tiles-ffn 80 python3 -m mono_kernels_minimax.ffn.tune --rows 1,8,16 \
        --format mxfp4 --variants "$joined"
    step tune-ffn 70 python3 -m mono_kernels_minimax.ffn.tune --rows 1,4,16 --format fp8 \
        --layouts frag,rot --variants "|ubk=256,dbk=256,stages=2"
    step gemv-fp8 60 python3 -m mono_runtime.stream.bench --rows 1,16 \
        --formats fp8,fp8_frag,mxfp4_frag --shapes 16384x8192 \
        --json "$LOG/bench/bench-gemv-fp8.json"
fi
if has sdown; then
    # The shared expert's down items as a stage of their own (sdown, stop 41) and the
    # Gluon build's route stage by default at S > 4: the FFN's GPU tests (Gluon both formats,
    # FP8's Triton build, two ranks, graph replay with padding, the tiny subsets) beside the
    # compiles of what is timed next; then the tiles that decide the defaults (the old
    # route, dpf=2 and the down ring at S > 4; spf and uks0 at S <= 4), FP8 on each build,
    # the issue's table (`mono bench ffn`, both formats on the Gluon build), timelines.
    G=$P/mono-kernels-minimax/tests/test_ffn_gpu.py
    tests ffn 180 $G -k "full_rank and (mxfp4-gluon] or down-ring)" --tb=short &
    tests ffn2 180 $G -k "gluon_tiny or full_rank and fp8" --tb=short &
    tests ffn3 180 $G -k "two_ranks or padding" --tb=short &
    tests frag8 120 $P/mono-runtime/tests/test_frag.py -k "stream_experts" --tb=short &
    for f in "mxfp4 gluon" "fp8 gluon" "fp8 triton"; do
        set -- $f
        step "warm-ffn-$1-$2" 180 python3 -m mono_kernels_minimax.ffn.bench \
            --rows 1,2,4,8,16 --formats "$1" --layers 1 --no-baseline --engine "$2" &
    done
    NARROW=("" "spf=0" "uks0=16")  # tiles timed at S <= 4 ...
    WIDE=("" "rr=0,racc=1" "dpf=2" "dring=1" "dring=1,dpf=2")  # ... and at S > 4
    for v in "${NARROW[@]:1}"; do
        warm_ffn "${v//[=,]/_}" 170 1,2,4 mxfp4 "$v" &
    done
    for v in "${WIDE[@]:1}"; do
        warm_ffn "${v//[=,]/_}" 170 8,16 mxfp4 "$v" &
    done
    wait
    # most wanted first: the tiles (they decide the defaults), then the table
    step order-ffn 70 python3 -m mono_kernels_minimax.ffn.tune --rows 8,16 --format mxfp4 \
        --variants "$(IFS='|'; echo "${WIDE[*]}")"
    step tiles-ffn 50 python3 -m mono_kernels_minimax.ffn.tune --rows 1,2,4 --format mxfp4 \
        --variants "$(IFS='|'; echo "${NARROW[*]}")"
    step tune-ffn 60 python3 -m mono_kernels_minimax.ffn.tune --rows 1,2,4,8,16 --format fp8 \
        --layouts frag,rot
    step bench-ffn 170 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4,fp8 --engine gluon \
        --out "$LOG/bench"
    step timeline-ffn 50 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 \
        --format mxfp4 --timeline "$LOG/bench"
fi
if has stages; then
    # Stop 42's default (the Gluon MXFP4 build's routed up items in a 6-deep ring at S <= 4,
    # tile ust) as the issue's table, then the depths around it; its GPU tests beside the
    # compiles. (Stop 42's first call also timed tile udpf, the up items asking L2 for
    # their expert's down rows: slower at every S, removed.) ~300 s on a fresh machine.
    G=$P/mono-kernels-minimax/tests/test_ffn_gpu.py
    tests ffn 200 $G -k "gluon_tiny or full_rank and (mxfp4-gluon] or fp8-gluon)" --tb=short &
    NARROW=("" "ust=8" "ust=4" "ust=6,dst=4")  # at S <= 4
    for v in "${NARROW[@]:1}"; do
        warm_ffn "n${v//[=,]/_}" 200 1,2,4 mxfp4 "$v" &
    done
    for f in mxfp4 fp8; do
        warm_ffn "$f" 200 1,2,4,8,16 "$f" "" &
    done
    wait
    step bench-ffn 160 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4,fp8 --out "$LOG/bench"
    step tiles-ffn 110 python3 -m mono_kernels_minimax.ffn.tune --rows 1,2,4 --format mxfp4 \
        --variants "$(IFS='|'; echo "${NARROW[*]}")"
fi
if has rings; then
    # Deeper rings where they still fit two programs an SM (sm_90 compile, stop 42): FP8's
    # Gluon FFN at S <= 4 (61,440 B of shared memory by default; ust=8 98,304 B), MXFP4's
    # depths around stop 42's default (the part stages' table was cut there), K2's Gluon
    # build at stages 4 and 5 (61,440 B at 3; 81,920 / 102,400 B), then the FFN's S = 1 and
    # 16 timelines (ffn.tune takes ~25 s a variant; K2's compiles are the long pole). ~500 s.
    K2V=("" "stages=4" "stages=5")
    k2_warm 300 "${K2V[@]}"
    F8=("" "ust=6" "ust=8" "ust=8,dst=4")  # FP8, S <= 4
    MX=("" "ust=4" "ust=6,dst=4")  # MXFP4, S <= 4 (the default is ust=6)
    for v in "${F8[@]}"; do
        warm_ffn "fp8${v//[=,]/_}" 200 1,2,4 fp8 "$v" &
    done
    for v in "${MX[@]}"; do
        warm_ffn "mx${v//[=,]/_}" 200 1,2,4 mxfp4 "$v" &
    done
    wait
    step tune-fp8 120 python3 -m mono_kernels_minimax.ffn.tune --rows 1,2,4 --format fp8 \
        --variants "$(IFS='|'; echo "${F8[*]}")"
    step tune-mx 90 python3 -m mono_kernels_minimax.ffn.tune --rows 1,2,4 --format mxfp4 \
        --variants "$(IFS='|'; echo "${MX[*]}")"
    k2_time k2ring 90 "${K2V[@]}"
    step timeline-ffn 60 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 \
        --format mxfp4 --timeline "$LOG/bench"
fi
if has s16-router; then
    # Why the router items at S = 16 work ~20 us (4 at S = 1) and all end within 0.3 us of
    # each other (stop 42's timeline, 34.0-34.3 us): the shared expert's early L2 prefetch
    # (spf=1 at S > 4: 28 MB asked for while the router loads) or its up items streaming
    # beside the router (sfirst=0 puts them after the routed ones) are the suspects: each
    # timed at S = 8 / 16 and drawn at S = 16. ~300 s on a fresh machine.
    WIDE=("" "spf=0" "sfirst=0" "spf=0,sfirst=0")
    for v in "${WIDE[@]}"; do
        warm_ffn "w${v//[=,]/_}" 200 8,16 mxfp4 "$v" &
    done
    wait
    step tune-wide 110 python3 -m mono_kernels_minimax.ffn.tune --rows 8,16 --format mxfp4 \
        --variants "$(IFS='|'; echo "${WIDE[*]}")"
    for v in "${WIDE[@]:1}"; do
        d="$LOG/bench/${v//[=,]/_}"
        mkdir -p "$d"
        step "timeline-${v//[=,]/_}" 45 env MONO_FFN_TILES="$v" python3 -m \
            mono_kernels_minimax.ffn.tune --rows 16 --format mxfp4 --timeline "$d"
    done
fi
if has rmma; then
    # The router on the tensor cores at S > 4 (stop 43: bf16 rows times the fp32 weights
    # split into three bf16 parts; its FMA dot held every router item ~20 us at S = 16):
    # the FFN's GPU tests beside the compiles, the issue's table in both formats, the
    # S = 1 and 16 timelines, then the tensor-core router at S <= 4 too (rrows=0) and the
    # up items in two K parts at S > 4 (uks=2: 1200 shorter items, a shorter last wave).
    # ~540 s on a fresh machine.
    tests ffn 200 $P/mono-kernels-minimax/tests/test_ffn_gpu.py \
        -k "gluon_tiny or padding or full_rank" --tb=short &
    for f in mxfp4 fp8; do
        warm_ffn "$f" 200 1,2,4,8,16 "$f" "" &
    done
    warm_ffn rrows0 200 1,2,4 mxfp4 "rrows=0" &
    warm_ffn uks2 200 8,16 mxfp4 "uks=2" &
    wait
    step bench-ffn 160 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4,fp8 --out "$LOG/bench"
    step timeline-ffn 60 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 \
        --format mxfp4 --timeline "$LOG/bench"
    step tune-rrows 60 python3 -m mono_kernels_minimax.ffn.tune --rows 1,2,4 --format mxfp4 \
        --variants "|rrows=0"
    step tune-uks 60 python3 -m mono_kernels_minimax.ffn.tune --rows 8,16 --format mxfp4 \
        --variants "|uks=2"
fi
if has fulltests; then
    # The FFN's full-rank Triton MXFP4 GPU test alone (stop 44: its reference's MXFP4 unpack
    # ran out of memory on an H100; now in row passes). ~120 s.
    tests ffn 200 $P/mono-kernels-minimax/tests/test_ffn_gpu.py \
        -k "full_rank and mxfp4-triton" --tb=long
fi
if has push; then
    # What a push item's publishes cost (the FFN's 12 push items took 2.3 us at S = 1 and
    # 9.2 us at S = 16 with exchanges, stop 43): publish_value as configured (stores since
    # stop 44), at device scope, and as relaxed 64-bit exchanges; with the ping-pong
    # variants beside. ~60 s.
    step push 120 python3 -m mono_runtime.bench_protocol --variants --push
fi
if has pubstore; then
    # publish_value as relaxed 64-bit stores (MONO_PUBLISH=store, the default since stop
    # 44) against exchanges (xchg, before): the FFN at S = 1 and 16 with timelines (its push
    # items took 2.3 / 9.2 us with exchanges at stop 43), each way compiled in its own
    # process (the way is in Triton's cache key), and the Gluon FFN's tiny GPU test with
    # stores. ~200 s.
    warm_env publish- MONO_PUBLISH xchg store
    MONO_PUBLISH=store tests ffn2 200 $P/mono-kernels-minimax/tests/test_ffn_gpu.py \
        -k "gluon_tiny" --tb=short &
    wait
    timed_env publish- 60 MONO_PUBLISH xchg store
fi
if has icache; then
    # Whether a once-run item's code is its latency: the instruction-fetch probe
    # (straight-line FMAs against a loop, after binaries that evict them from the SM's
    # caches, then also after a read that sweeps the L2), K2 beside its op-by-op path and
    # its S = 1 / 16 timelines; K2's GPU tests beside the compiles. Stop 48 (H100): no cost
    # with the code still in L2; dsum folded into the down stage (tile dfold, since
    # removed) was slower: 150.8 / 408.2 us at S = 1 / 16 against 148.5 / 387.7.
    # ~420 s on a fresh machine.
    tests k2 280 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "full_rank or tiny" --tb=short &
    step warm-k2 280 python3 -m mono_kernels_kimi.k2.bench --rows 1,2,4,8,16 --layers 1 &
    step warm-tl-k2 280 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 1 \
        --timeline "$LOG/warm" &
    step icache 200 python3 -m mono_runtime.bench_icache &
    wait
    step icache-l2 100 python3 -m mono_runtime.bench_icache --l2-mb 400
    step bench-k2 110 $MONO bench k2 --rows 1,2,4,8,16 --out "$LOG/bench"
    step timeline-k2 110 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 4 \
        --timeline "$LOG/bench"
fi
if has l2fill; then
    # The L2 filled while HBM idles (stop 48's S = 1 timeline: HBM idle 10-25 us while
    # col / mix / norm hand off, 100-119 us while dsum / lred do): the first K columns of
    # upproj's rows (upf) and of router / latdown / shup parts (xpf, of 1792) asked of L2
    # early; and a down item's slots one stream each (dring=0) against the ring, at every
    # width, the full-rank Gluon test beside the compiles; then the instruction-fetch
    # probe with the L2 swept. Stop 48 (H100): the fills gained nothing, the ring 1-8%,
    # the probe showed no fetch cost. ~300 s when fresh.
    V=("" "MONO_K2_TILES=dring=0" "MONO_K2_TILES=upf=2048" "MONO_K2_TILES=xpf=1024")
    rows() { [[ -z $1 || $1 == *dring* ]] && echo 1,2,4,8,16 || echo 1,16; }
    for v in "${V[@]}"; do
        step "warm-k2-${v//[=:,]/_}" 260 env $v python3 -m mono_kernels_kimi.k2.bench \
            --rows "$(rows "$v")" --layers 1 --no-baseline &
    done
    tests k2 260 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "full_rank and gluon" --tb=short &
    wait
    for v in "${V[@]}"; do
        step "k2-${v//[=:,]/_}" 40 env $v python3 -m mono_kernels_kimi.k2.bench \
            --rows "$(rows "$v")" --layers 4 --no-baseline
    done
    step icache-l2 100 python3 -m mono_runtime.bench_icache \
        --shapes 256x1,1024x1,64x8,256x8,512x8 --l2-mb 400
fi
if has k1step; then
    # K1 timed as it serves, one epoch bump a graph of launches (its bench had bumped it at
    # every launch: a kernel of its own between two K1 launches, ~6 us a layer beside a
    # 54 us timeline span at S = 1), beside its op-by-op path; K2's timelines with each
    # item's SM (do the short items that take 6-8 us share their SM with a streaming
    # item?), and K2 with one program an SM (occ=1) at S = 1 and 16. ~300 s when fresh.
    step warm-kda 240 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,4x1,8x1,16x1 \
        --layers 1 &
    step warm-tl-k2 240 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 1 \
        --timeline "$LOG/warm" &
    for v in occ=1 occ=2; do
        step "warm-k2-$v" 240 env MONO_K2_TILES=$v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,16 --layers 1 --no-baseline &
    done
    wait
    step bench-kda 100 $MONO bench kda --rows 1,4,8,16 --out "$LOG/bench"
    step timeline-k2 60 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 4 \
        --timeline "$LOG/bench"
    for v in occ=1 occ=2; do
        step "k2-$v" 40 env MONO_K2_TILES=$v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,16 --layers 4 --no-baseline
    done
fi
if has split; then
    # Are K2's bf16 streams held by one program an SM? Stop 50's S = 1 timeline (H100):
    # upproj's 112 items of 64 rows ran on 107 SMs, one program each, ~23 GB/s an item
    # (51 MB in 20 us at S = 1 and 16 alike; HBM idle around them), the routed up stage's
    # 96 items on 76 SMs. Each variant compiled in its own process, then timed one at a
    # time: upproj in 32-row items (uc=32: 224, two an SM), the same with the routed up
    # items in two K parts (uks=2) and with oproj in 32 columns (oc=32); the winner's S =
    # 1 / 16 timeline; the FFN's S = 1 / 16 timeline (same question there). ~330 s fresh.
    V=("" uc=32 uks=2,uc=32 oc=32,uc=32)
    for v in "${V[@]}"; do
        step "warm-k2-${v//[=:,]/_}" 260 env MONO_K2_TILES=$v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,4,16 --layers 1 --no-baseline &
    done
    step warm-tl-k2 260 env MONO_K2_TILES=uks=2,uc=32 python3 -m mono_kernels_kimi.k2.bench \
        --rows 1,16 --layers 1 --timeline "$LOG/warm" &
    step warm-tl-ffn 260 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 --format mxfp4 \
        --timeline "$LOG/warm" &
    wait
    for v in "${V[@]}"; do
        step "k2-${v//[=:,]/_}" 40 env MONO_K2_TILES=$v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,4,16 --layers 4 --no-baseline
    done
    step timeline-k2 60 env MONO_K2_TILES=uks=2,uc=32 python3 -m mono_kernels_kimi.k2.bench \
        --rows 1,16 --layers 4 --timeline "$LOG/bench"
    step timeline-ffn 90 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 --format mxfp4 \
        --timeline "$LOG/bench"
fi
if has k2check; then
    # K2 after a change, in ~200 s fresh: its full-rank Gluon test beside the compiles,
    # `mono bench k2` at S = 1 / 4 / 16 (beside its op-by-op path), then its S = 1 / 16
    # timeline (span, stages, marks, what held the end).
    tests k2 150 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "full_rank and gluon" --tb=short &
    step warm-k2 150 python3 -m mono_kernels_kimi.k2.bench --rows 1,4,16 --layers 1 &
    step warm-tl-k2 150 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 1 \
        --timeline "$LOG/warm" &
    wait
    step bench-k2 80 $MONO bench k2 --rows 1,4,16 --out "$LOG/bench"
    step timeline-k2 60 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 4 \
        --timeline "$LOG/bench"
fi
if has k2tables; then
    # After a K2 change, one call: its full-rank Gluon test beside every compile, then the
    # same-run tables (K2 first, its S = 1 / 16 timeline, then K1 and the FFN while the
    # budget lasts). ~560 s fresh.
    tests k2 250 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "full_rank and gluon" --tb=short &
    # the FFN's and the drafter's GPU tests beside; the FFN's in two steps (its tiny widths,
    # each a compile, and its full-rank shapes did not fit one step's 250 s in stop 56)
    tests ffn 250 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "full_rank" --tb=short &
    tests ffn2 250 $P/mono-kernels-minimax/tests/test_ffn_gpu.py \
        -k "not bench and not opbyop and not full_rank" --tb=short &
    tests drafter 250 $P/mono-kernels-kimi/tests/test_drafter_gpu.py --tb=short &
    step warm-k2 250 python3 -m mono_kernels_kimi.k2.bench --rows 1,2,4,8,16 --layers 1 &
    step warm-tl-k2 250 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 1 \
        --timeline "$LOG/warm" &
    step warm-kda 250 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,4x1,8x1,16x1 --layers 1 &
    step warm-ffn 250 python3 -m mono_kernels_minimax.ffn.bench --rows 1,2,4,8,16 --formats mxfp4 --layers 1 &
    wait
    step bench-k2 110 $MONO bench k2 --rows 1,2,4,8,16 --out "$LOG/bench"
    step timeline-k2 60 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 4 \
        --timeline "$LOG/bench"
    step bench-kda 90 $MONO bench kda --rows 1,4,8,16 --out "$LOG/bench"
    step bench-ffn 100 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4 --out "$LOG/bench"
fi
if has bisect; then
    # Which commit slowed a kernel: K2 (or BISECT_MODULE's bench) at BISECT_ROWS (default 8)
    # for this tree and every revision under .bisect/ (made here by `tools/gpu_session.sh
    # --prepare REV...`; carry: [".bisect"]), compiled side by side, then timed one after
    # another, this tree first and last (the drift between them is the noise). Stop 54:
    # 09ef461 228.3 us at S = 8, b364073's dsum layout 252.3.
    # With BISECT_TEST (a GPU test file) and BISECT_K (its -k expression): which commit
    # broke it, that test at every revision side by side instead (stop 56: the Triton
    # FFN's tiny bf16 test, wrong at S = 16).
    ROWS=${BISECT_ROWS:-8}
    MOD=${BISECT_MODULE:-mono_kernels_kimi.k2.bench --engine gluon}
    REVS=(head $(ls .bisect 2>/dev/null))
    src() {  # a revision's PYTHONPATH ("head": this tree)
        if [[ $1 == head ]]; then src_path ""; else src_path ".bisect/$1/"; fi
    }
    if [[ -n ${BISECT_TEST:-} ]]; then
        for r in "${REVS[@]}"; do
            dir=.; [[ $r == head ]] || dir=.bisect/$r
            (cd "$dir" && PYTHONPATH=$(src_path "") step "test-$r" 280 python3 -m pytest \
                -m gpu -x -q -p no:cacheprovider --tb=line "$BISECT_TEST" -k "${BISECT_K:-}") &
        done
        wait
    else
        for r in "${REVS[@]}"; do
            PYTHONPATH=$(src "$r") step "warm-bisect-$r" 200 python3 -m $MOD --rows "$ROWS" \
                --layers 1 --no-baseline &
        done
        wait
        n=0
        for r in "${REVS[@]}" head; do
            n=$((n + 1))
            PYTHONPATH=$(src "$r") step "bisect-$n-$r" 60 python3 -m $MOD --rows "$ROWS" \
                --layers 8 --no-baseline
        done
    fi
fi
if has k2router; then
    # Stop 53's S = 1 timeline: the router's 224 items wait ~22 us for x while only oproj
    # streams, then work ~11.6 us at ~5 GB/s a program; at S = 16 the down stage's 224 items
    # leave 40 of 264 programs idle for ~90 us. Times the router's own ring depth (rst), its
    # rows asked of L2 (rpf) or into shared memory (rres) before its wait, and 9 slot groups
    # (ng), after K2's full-rank Gluon test under rres, rst and ng at once (rpf only adds a
    # prefetch) and test_frag's asked-rows GPU test. ~400 s fresh (stop 53: 4 variants' S =
    # 1 / 16 compiled in parallel in 49 s; an 8-layer timing of two widths needs > 30 s).
    V=("" "rst=8" "rpf=1792" "rres=1" "rres=1,rst=8" "ng=9")
    tests frag 120 $P/mono-runtime/tests/test_frag.py -k "asked" --tb=short &
    (export MONO_K2_TILES="rres=1,rst=8,ng=9"
     tests k2-all 250 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "full_rank and gluon" \
        --tb=short) &
    k2_warm 250 "${V[@]}"
    wait
    k2_time k2router 90 "${V[@]}"
fi
if has mini; then
    # The least a change to K2 needs on a GPU, in ~240 s fresh: its full-rank Gluon test
    # (and K1's 1 x 1 full-shape one) beside the bench's compile, then K2's S = 1 / 16
    # timeline.
    tests k2 230 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "full_rank and gluon" --tb=short &
    tests k1 200 $P/mono-kernels-kimi/tests/test_k1_gpu.py -k "1-1-True-13-full" --tb=short &
    step warm-k2 200 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 1 \
        --timeline "$LOG/warm" &
    wait
    step timeline-k2 45 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 4 \
        --timeline "$LOG/bench"
fi
if has acquire; then
    # Do a stage's waiters slow their own hand-off by acquiring the same done words with
    # read-modify-writes? K1's S = 1 timeline (stop 49, H100) had ~100 proj items take 2.3
    # us after the last of 28 mix items ended, each adding 0 to all 28 words. The fan-out
    # table (`bench_protocol --fanouts`: the time from one stage's publish to its last
    # waiter's return, each acquire way), then K2, K1 and the FFN with each way of
    # MONO_ACQUIRE (load: the default since stop 50; atomic; the fence way, timed here in
    # stop 50, is gone), each compiled in its own process,
    # timed one at a time; and K2's routed up items in two K parts (uks=2: 192 items at
    # S = 1, where 96 left SMs idle and more bytes in flight an item did not help), with
    # its full-rank Gluon GPU test. ~560 s when fresh (the last ways may be cut).
    for v in atomic load; do
        step "warm-k2-$v" 280 env MONO_ACQUIRE=$v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,4,16 --layers 1 --no-baseline &
        step "warm-kda-$v" 280 env MONO_ACQUIRE=$v python3 -m mono_kernels_kimi.kda.bench \
            --shapes 1x1,8x1 --layers 1 --no-baseline &
        step "warm-ffn-$v" 280 env MONO_ACQUIRE=$v python3 -m mono_kernels_minimax.ffn.bench \
            --rows 1,16 --formats mxfp4 --layers 1 --no-baseline &
    done
    step warm-k2-uks2 280 env MONO_K2_TILES=uks=2 python3 -m mono_kernels_kimi.k2.bench \
        --rows 1,4,16 --layers 1 --no-baseline &
    MONO_K2_TILES=uks=2 tests k2 280 $P/mono-kernels-kimi/tests/test_k2_gpu.py \
        -k "full_rank and gluon" --tb=short &
    wait
    step fanout 60 python3 -m mono_runtime.bench_protocol --fanouts 1,31,131,263
    for v in uks=1 uks=2; do
        step "k2-$v" 45 env MONO_K2_TILES=$v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,4,16 --layers 4 --no-baseline
    done
    for v in atomic load; do
        step "k2-$v" 40 env MONO_ACQUIRE=$v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,16 --layers 4 --no-baseline
        step "kda-$v" 25 env MONO_ACQUIRE=$v python3 -m mono_kernels_kimi.kda.bench \
            --shapes 1x1,8x1 --layers 8 --no-baseline
        step "ffn-$v" 35 env MONO_ACQUIRE=$v python3 -m mono_kernels_minimax.ffn.bench \
            --rows 1,16 --formats mxfp4 --layers 12 --no-baseline
    done
fi
if has verify; then
    # The hand-offs' acquire (MONO_ACQUIRE's default, now a load a pair) checked at full
    # shapes: K2's full-rank Gluon test, K1's 1 x 1 full-shape test and the FFN's MXFP4
    # Gluon full-rank test, in the background: name it before `tables`, whose compiles
    # they share the wait with.
    tests k2 280 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "full_rank and gluon" --tb=short &
    tests k1 280 $P/mono-kernels-kimi/tests/test_k1_gpu.py -k "1-1-True-13-full" --tb=short &
    tests ffn 280 $P/mono-kernels-minimax/tests/test_ffn_gpu.py -k "full_rank_shapes and mxfp4-gluon and not ring" --tb=short &
fi
if has tables; then
    # The issues' tables as committed: K2, K1 and the FFN each beside its op-by-op path in
    # the same run, compiled first side by side, then timed one at a time on a quiet GPU,
    # and K2's S = 1 / 16 timelines. ~450 s on a fresh machine.
    step warm-k2 300 python3 -m mono_kernels_kimi.k2.bench --rows 1,2,4,8,16 --layers 1 &
    step warm-kda 300 python3 -m mono_kernels_kimi.kda.bench --shapes 1x1,4x1,8x1,16x1 --layers 1 &
    step warm-ffn 300 python3 -m mono_kernels_minimax.ffn.bench --rows 1,2,4,8,16 --formats mxfp4 --layers 1 &
    # (the timeline build compiled here too: stop 50's timeline step, compiling in its own
    # 60 s, was cut)
    step warm-tl-k2 300 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 1 \
        --timeline "$LOG/warm" &
    wait
    step bench-k2 110 $MONO bench k2 --rows 1,2,4,8,16 --out "$LOG/bench"
    step bench-kda 90 $MONO bench kda --rows 1,4,8,16 --out "$LOG/bench"
    step bench-ffn 100 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4 --out "$LOG/bench"
    step timeline-k2 90 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 4 \
        --timeline "$LOG/bench"
fi
if has naps; then
    # Waits that sleep only once they have waited a while (MONO_POLL_BACKOFF_NS=NAP:SPIN):
    # stop 46's K2 timeline had every short hand-off of a chain (col, mix, dsum, lred) take
    # 6-13 us while ~250 programs spun on the same done and alarm words; a 1 us nap in every
    # poll lost 6%. K2 at S = 1 and 16, the FFN and K1, each value compiled in its own
    # process, then timed alone, and K2's timeline under one of them. Beside them K2's
    # items asking L2 for a ring's first steps of their rows before their inputs are in
    # (`xpf`, `upf`: columns; whole rows lost at TP 1). ~540 s when fresh.
    V=("" "MONO_POLL_BACKOFF_NS=300:2000" "MONO_POLL_BACKOFF_NS=1000:2000" "MONO_K2_TILES=xpf=256,upf=256" "MONO_K2_TILES=xpf=512,upf=512")
    for v in "${V[@]}"; do
        step "warm-k2-${v//[=:,]/_}" 260 env $v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,16 --layers 1 --no-baseline &
    done
    step warm-tl-k2 260 env MONO_POLL_BACKOFF_NS=300:2000 python3 -m mono_kernels_kimi.k2.bench \
        --rows 1,16 --layers 1 --timeline "$LOG/warm" &
    warm_env backoff-ns MONO_POLL_BACKOFF_NS 0 300:2000
    for v in 0 300:2000; do
        step "warm-kda-$v" 260 env MONO_POLL_BACKOFF_NS=$v python3 -m mono_kernels_kimi.kda.bench \
            --shapes 1x1,8x1 --layers 1 --no-baseline &
    done
    wait
    for v in "${V[@]}"; do
        step "k2-${v//[=:,]/_}" 50 env $v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,16 --layers 4 --no-baseline
    done
    step timeline-k2 60 env MONO_POLL_BACKOFF_NS=300:2000 python3 -m mono_kernels_kimi.k2.bench \
        --rows 1,16 --layers 4 --timeline "$LOG/bench"
    for v in 0 300:2000; do
        step "backoff-ns$v" 60 env MONO_POLL_BACKOFF_NS=$v python3 -m mono_kernels_minimax.ffn.bench \
            --rows 1,16 --formats mxfp4 --layers 4 --no-baseline
        step "k2-kda-$v" 45 env MONO_POLL_BACKOFF_NS=$v python3 -m mono_kernels_kimi.kda.bench \
            --shapes 1x1,8x1 --layers 8 --no-baseline
    done
fi
if has k2-backoff; then
    # K2's waits sleeping between polls (MONO_POLL_BACKOFF_NS) and its weight rows asked of
    # L2 ahead (`upf`, `xpf`), against the default, at S = 1 and 16, and the default's
    # timeline. Stop 46 (H100, prefetches then on): both off -3.7% / -3.2%, so off is the
    # default since; a 1 us sleep no gain. Each variant compiled in its own process (a value
    # read at import is in Triton's cache key). ~220 s on a fresh machine.
    tests k2 200 $P/mono-kernels-kimi/tests/test_k2_gpu.py -k "full_rank and gluon" --tb=short &
    V=("" "MONO_POLL_BACKOFF_NS=1000" "MONO_K2_TILES=xpf=1" "MONO_K2_TILES=upf=1,xpf=1")
    for v in "${V[@]}"; do
        step "warm-k2-${v//[=,]/_}" 240 env $v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,16 --layers 1 --no-baseline &
    done
    step warm-tl-k2 240 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 1 \
        --timeline "$LOG/warm" &
    wait
    for v in "${V[@]}"; do
        step "k2-${v//[=,]/_}" 50 env $v python3 -m mono_kernels_kimi.k2.bench \
            --rows 1,16 --layers 4 --no-baseline
    done
    step timeline-k2 60 python3 -m mono_kernels_kimi.k2.bench --rows 1,16 --layers 4 \
        --timeline "$LOG/bench"
fi
if has backoff; then
    # Waits that sleep between polls (MONO_POLL_BACKOFF_NS, read at import; 0 spins). Stop
    # 44 (exchanges then): 2000 ns slower at S = 1 and 16; 100 ns spanned 42.2 us at S = 1
    # against 44.2 spinning, but its timing was cut by a 50 s step limit (each `ffn.tune`
    # here takes ~45 s). Each value compiled in its own process (the value is in Triton's
    # cache key), then timed at S = 1 and 16 with its timeline. ~280 s.
    warm_env backoff-ns MONO_POLL_BACKOFF_NS 0 100 200
    wait
    timed_env backoff-ns 75 MONO_POLL_BACKOFF_NS 0 100 200
fi
if has confirm; then
    # The defaults stop 41 chose from part sdown's tiles (spf=0 at S <= 4, the down ring at
    # S > 4, FP8 on the Gluon build), timed as the issue's table, then the timelines (the
    # shared down items now stamp when they were ready); the grouped ring's engine test
    # and the FFN's Gluon GPU tests beside the compiles. ~350 s on a fresh machine.
    tests frag8 100 $P/mono-runtime/tests/test_frag.py -k "stream_experts" --tb=short &
    tests ffn 200 $P/mono-kernels-minimax/tests/test_ffn_gpu.py \
        -k "gluon_tiny or padding or full_rank and (mxfp4-gluon] or fp8-gluon)" --tb=short &
    for f in mxfp4 fp8; do
        warm_ffn "$f" 120 1,2,4,8,16 "$f" "" &
    done
    wait
    step bench-ffn 150 $MONO bench ffn --rows 1,2,4,8,16 --format mxfp4,fp8 --out "$LOG/bench"
    step timeline-ffn 50 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 \
        --format mxfp4 --timeline "$LOG/bench"
fi
if has toy; then
    # The toy greedy decodes on the kernels (32 steps, eager and graph): the MiniMax-M3 toy
    # on the Gluon FFN (mxfp4) and the Triton one (bf16), the Kimi-K3 toy with K1 (+ K2).
    tests toy 280 integration/tests/test_toy_decode.py -k "gpu" --tb=short
    echo "== toy"; tail -12 "$LOG/toy.txt"
fi
if has upstage; then
    # Is the FFN's routed up stage slow because of its shape or its kernel? At S = 1 it is
    # ~20 MB in 192 items of 128 rows x 1536 K (6 K steps each) that start together; the
    # engine GEMV over 6144 x 6144 with split 4 is the same volume in the same items (bn 128),
    # timed with every MXFP4 tile. Then the GEMV on one routed expert's w13 (1536 x 6144).
    step gemv-upstage 150 python3 -m mono_runtime.stream.bench --variants --formats mxfp4 \
        --rows 1 --shapes 6144x6144 --json "$LOG/bench/gemv-upstage.json"
    step gemv-w13 100 python3 -m mono_runtime.stream.bench --variants --formats mxfp4 \
        --rows 1 --shapes 1536x6144 --json "$LOG/bench/gemv-w13.json"
fi
if has router; then
    # The FFN router item's arithmetic alone (its `rrows` tile default comes from this).
    step router-micro 90 python3 tools/ffn_router_micro.py
fi
if has gemv; then
    step gemv-variants 200 python3 -m mono_runtime.stream.bench --variants --rows 1,16 \
        --json "$LOG/bench/gemv-variants.json"
fi
if has gemvprof; then
    # Is the engine GEMV bound by issue or by memory? Nsight Compute on one launch of
    # tools/gemv_probe.py, MXFP4 (the FFN's up tile) beside bf16 (stop 27: 0.70 warps issued
    # a scheduler-cycle at 53% of DRAM peak, against 0.08 at 87%).
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
    export NCU
    for f in mxfp4 bf16; do
        step gemv-$f-time 60 python3 tools/gemv_probe.py $f --time
        step ncu-gemv-$f 150 "$NCU" --clock-control none -k regex:gemv_kernel --launch-skip 3 \
            --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats \
            --section SchedulerStats --section SourceCounters --import-source yes \
            -o "$LOG/gemv-$f" -f python3 tools/gemv_probe.py $f
        step top-gemv-$f 60 python3 tools/ncu_top.py "$LOG/gemv-$f.ncu-rep" --lines 30 --views sass
        rm -f "$LOG/gemv-$f.ncu-rep"
    done
fi
if has profile; then
    # Where the FFN's warps wait (Nsight Compute, clocks left alone): one launch at S = 1
    # and one at S = 16 out of the benchmark's graphs, summarised by tools/ncu_top.py.
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
    export NCU
    for s in 1 16; do
        ncu_launch ffn-s$s ffn_kernel 4 python3 -m mono_kernels_minimax.ffn.bench --rows $s \
            --formats mxfp4 --layers 2 --no-baseline
        step top-ffn-s$s 60 python3 tools/ncu_top.py "$LOG/ffn-s$s.ncu-rep" --lines 45
        rm -f "$LOG/ffn-s$s.ncu-rep"
    done
fi
if has k2prof; then
    # Where K2's warps wait (Nsight Compute, clocks left alone): one launch at S = 16 and
    # one at 1 out of the bench's graphs, by SASS line and by source line (the stages'
    # helpers), to tell the up and down loops' stalls (decode, barrier, copies) from the
    # chains'. The kernel is compiled first without ncu (under it, stop 53's compile and
    # set-up ran past 150 s); its name is its body's, `_k2_body`.
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
    export NCU
    step k2-route-probe 90 python3 tools/k2_route_probe.py --rows 1,4,16
    for s in 16 1; do
        step warm-k2-s$s 150 python3 -m mono_kernels_kimi.k2.bench --rows $s --layers 2 \
            --no-baseline
        ncu_launch k2-s$s _k2_body 3 python3 -m mono_kernels_kimi.k2.bench --rows $s --layers 2 \
            --no-baseline
        # (--match: the route's and union's own lines, one program's of 264 each: stop 52
        # had them run 4-6x slower inside K2 than alone)
        step top-k2-s$s 90 python3 tools/ncu_top.py "$LOG/k2-s$s.ncu-rep" --lines 60 \
            --views cuda,sass \
            --match "tl.max(word,word == best,tl.sigmoid(logits),words = tl.reduce,below = tl.sum,own = tl.sum"
        rm -f "$LOG/k2-s$s.ncu-rep"
    done
fi
if has profile-drafter; then
    # Where the drafter's warps wait (Nsight Compute, clocks left alone): one launch at one
    # request and 8K cached tokens, each stall reason's share of the whole kernel first.
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
    export NCU
    step ncu-drafter 300 "$NCU" --clock-control none -k regex:drafter_kernel --launch-skip 3 \
        --launch-count 1 --section WarpStateStats --section SchedulerStats \
        --section SourceCounters --section InstructionStats --import-source yes \
        -o "$LOG/drafter" -f python3 -m mono_kernels_kimi.drafter.bench --requests 1 \
        --context 8192 --no-baseline
    step top-drafter 100 python3 tools/ncu_top.py "$LOG/drafter.ncu-rep" --lines 40 --views sass
    rm -f "$LOG/drafter.ncu-rep"
fi
if has latency; then
    # A fused kernel's small steps on an idle GPU (tools/latency_probe.py).
    step latency 200 python3 tools/latency_probe.py --json "$LOG/bench/latency.json"
fi
if has tiles || has all; then
    # FFN tiles on the tile-major mxfp4-rot around the default (2 programs an SM, 3 stages,
    # gate and up as one 128-row tile at S <= 4, down items prefetching their rows to L2):
    # K steps of 128 (half the decoded tile's registers), more and fewer up K parts, the
    # unpaired loop, fewer shared-expert K parts (stop 27: no down prefetch and 2 stages
    # within noise or worse). Each variant's two widths compiled in its own process side
    # by side, then all timed in one.
    V=("" "ubk=128" "uks=2" "uks=8" "pair=0" "uks0=4")
    for v in "${V[@]}"; do
        warm_ffn "${v//[=,]/_}" 300 1,16 mxfp4 "$v" &
    done
    wait
    joined=$(IFS='|'; echo "${V[*]}")
    step tiles-ffn 300 python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 --format mxfp4 \
        --variants "$joined"
fi
wait  # a background part (k1-tests)
cp "$LOG"/bench/bench-*.json "$OUT"/ 2>/dev/null  # 8 files come back at most: PNGs in the archive
tar -C "$LOG" -czf "$OUT/logs.tgz" .
cat "$LOG/status.txt"
for name in ffn ffn2 ffn3 k1 k2 drafter sources rest frag8; do
    [[ -f $LOG/$name.txt ]] || continue
    echo "== tests $name"
    grep -E "^(FAILED|ERROR) " "$LOG/$name.txt" | head -20
    grep -E "^E   " "$LOG/$name.txt" | head -12
    grep -E "pytest exit" "$LOG/$name.txt"
done
for name in icache icache-l2 crowd qualify shapes-kda tune-drafter pair-drafter drafter-memcheck drafter-synccheck drafter-racecheck bench-ffn bench-kda bench-drafter \
    bench-k2 bench-k2-gluon bench-k2-triton bench-gemv bench-allreduce gemv-variants tune-ffn timeline-ffn timeline-k2 timeline-kda timeline-drafter \
    tiles-ffn order-ffn tune-fp8 tune-mx tune-wide tune-rrows tune-uks tune-rr push publish-xchg publish-store backoff-ns0 backoff-ns100 backoff-ns200 timeline-spf_0 timeline-sfirst_0 timeline-spf_0_sfirst_0 route-probe gemv-fp8 gemv-fp8-tiles timeline-ffn-occ1 gemv-upstage gemv-w13 top-ffn-s1 top-ffn-s16 top-drafter latency gemv-mxfp4-time gemv-bf16-time top-gemv-mxfp4 top-gemv-bf16; do
    [[ -f $LOG/$name.txt ]] || continue
    echo "== $name"
    tail -40 "$LOG/$name.txt"
done
for f in "$LOG"/test-*.txt "$LOG"/k2occ-*.txt "$LOG"/k2ring-*.txt "$LOG"/k1tile-*.txt "$LOG"/pair-*.txt "$LOG"/k2-*.txt "$LOG"/backoff-ns*.txt; do  # each K2 / K1 tile variant's table
    [[ -f $f ]] || continue
    echo "== $(basename "$f" .txt)"
    tail -9 "$f"
done
