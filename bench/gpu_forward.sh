#!/usr/bin/env bash
# One device run for the CUDA backend's forward pass: the CUDA tests (kernels and whole forward), verify-golden
# --backend cuda on every committed fixture and the bundled model, selftest on the GPU, and kld GPU vs the CPU
# reference. Uses the binaries built on the development machine and carried in build-carry/ (see gpu_run.sh).
# Logs go to $OUT; the last lines printed are the summaries. Each step has its own time limit.
# Steps by variable: GEN_PRESET=NAME (make a fixture with tools/golden first), GEN_VARIANTS=1 (every variant preset,
# see there), SKIP_CHECKS=1 (tests and benches
# only), SKIP_KLD=1 (no kld; KLD_A / KLD_B: its two configurations, default '' and 'cuda:', FAST standing for FAST's), LAYERS=N (bench --layers with FAST patches, then the fp32 twin), COMPARE=1 (with LAYERS: transformers on
# the same dimensions, bench/compare_transformers.py), BENCH=1 (the kernel bench; BENCH_ONLY=router,moe,prefill,fp8,attention for some sections), NCU=1 (kernel times of one
# decode step, bench/kernel_times.py), NCU_DETAIL=REGEX (ncu's full sections for those kernels), NCU_PIPES=REGEX (per-pipe issue rates of those kernels), NCU_STALLS=1 (every kernel of a replayed FAST step: warp stalls, bench/ncu_stalls.py), GOLDEN_ALT=PATCHES (verify-golden also with these), OFFICIAL=1 (also the official-code fixtures in their numerics mode),
# TEST_SHARDS, NCU_SKIP, NCU_SOURCE, LAYER_AB, LAYER_AB_PATCHES, LAYER_AB_VARIANTS, LAYER_AB_PAIRED, AB_ROUNDS, AB_LAYERS (see there), CARRY=DIR (binaries from DIR instead of build-carry/), LAYER_ALT=PATCHES (the layer bench again with FAST + these),
# LAYER_FAST_EXTRA="--timeline ..." (more options of the FAST layer bench: --timeline lists each batch's op regions in one replayed step),
# SANITIZE=GTEST_FILTER (compute-sanitizer over those CUDA tests, one process per test and tool of SANITIZE_TOOLS, in
# parallel: bench/sanitize_each.py, sanitize-summary.tsv and sanitize-logs.txt.gz),
# SANITIZE_LAYERS=N (compute-sanitizer's tools over the FAST layer bench of N layers at V4-Flash dimensions: see there),
# MBARRIER_PROBE=1 (bench/synccheck_mbarrier_probe.cu's variants under synccheck),
# PRO=1 (the layer bench at V4-Pro's dimensions, its fp32 twin, kld CPU / GPU twin vs FAST on that checkpoint),
# ORACLE=NAME (an official-code golden of tests/data/golden/NAME's model, made here and verified: see there; ORACLE=variants: every variant made),
# BENCH_AB=BINARY (the kernel bench with that carried binary and plumb, alternating), SASS=REGEX (cuobjdump's SASS of
# the matching kernels with opcode counts, SASS_BINS),
# KTRACE=1,8 (the kernel timeline of the FAST layer bench's replayed steps at those batches: bench/ktrace; carry
# libktrace.so, and libcupti.so.13 from the toolkit beside it),
# SERVE=1 (plumb serve's smoke test, tests/cli/serve_smoke.py, on the GPU with the fp32 twin and with FAST: serve.txt;
# SERVE_ALT=PATCHES: also with FAST + these),
# LONG_KLD=N (kld of the CPU reference against the GPU's FAST over N tokens on the bundled model, its context raised:
# see there),
# LONG_CONTEXT=N (with LAYERS: the FAST layer bench again at batches 1 and 8 after an N-token context, appended to
# layers-fast.txt: past 4 x index_topk tokens the CSA layers run their indexer, which indexer.skip_short skips below). At most 8 files come back.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
C=/tmp/plumb-carry  # build-carry/ (or $CARRY) with the binaries gzipped (the device tool carries at most 64 MiB)
# (.gz, or .xz: about half the size, unpacked with Python's lzma so the machine needs no xz tool; or one .tar.xz of
# both binaries: they share most of their code, so one solid archive is ~45 % smaller than two .xz)
rm -rf "$C" && cp -r "$PWD/${CARRY:-build-carry}" "$C" && for f in "$C"/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
for f in "$C"/*.tar.xz; do [ -e "$f" ] && python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$f" "$C" && rm -f "$f"; done
for f in "$C"/*.xz "$C"/lib*/*.xz; do [ -e "$f" ] && python3 -c "import lzma, sys; open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$f" && rm -f "$f"; done
chmod +x "$C"/plumb*
# cuBLASLt: the toolkit's, or the one PyTorch's wheels carry.
CUB=$(python3 -c "import nvidia.cublas as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$C/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${CUB:+:$CUB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$C/plumb" --version >/dev/null 2>&1 || export LD_LIBRARY_PATH="$C/lib-extra:$LD_LIBRARY_PATH"
# The test binaries name their data by the path they were built in: make that path this checkout.
built=$(grep -aoE -m1 '/[[:alnum:]_./-]*/tests/data' "$C/plumb_cuda_tests" | head -n 1 | sed 's#/tests/data$##')
if [ -n "$built" ] && [ ! -e "$built" ]; then mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"; fi
note() { echo "== $*" | tee -a "$OUT/run.log"; }
FAST=${FAST:-cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,cuda.graph,attn.splitk_decode,cuda.streams,cuda.prefill_gemm,indexer.skip_short,cuda.pdl,cuda.bf16_gemv,cuda.l2_evict_first,cuda.pdl_hc_attn,cuda.linear_early,cuda.early_joins,cuda.hc_norm_after_mix,cuda.comp_deferred,cuda.shared_first,cuda.l2_prefetch,cuda.hc_fold,cuda.batch_rows,cuda.batch_rows_indexer}

# Optional: a fixture at kernel-friendly dims, made here by transformers (tools/golden/make_golden.py), returned as
# $OUT/kernel-dims.tar and verified below with the fast-kernel patches.
# GEN_PRESET may name several presets (space-separated); GEN_SEEDS="S1 S2 ..." are tried in turn after the preset's
# own seed when the generator refuses one (a near tie at a top-k boundary).
extra=""
for gp in ${GEN_PRESET:-}; do
  rc=1
  for seed in "" ${GEN_SEEDS:-}; do
    note "make_golden $gp ${seed:+seed $seed}"
    rm -rf "/tmp/$gp"
    timeout 240 python3 tools/golden/make_golden.py --preset "$gp" --out "/tmp/$gp" ${seed:+--seed $seed} >>"$OUT/run.log" 2>&1
    rc=$?
    note "make_golden rc=$rc"
    [ $rc -eq 0 ] && break
  done
  [ $rc -eq 0 ] && tar -C /tmp -cf "$OUT/$gp.tar" "$gp" && extra="$extra /tmp/$gp/"
done

# Optional: GEN_VARIANTS=1 makes every variant preset (make_golden.py --variants: one configuration field or the
# schedule changed from a common base; VARIANT_FORMAT=official: in the official checkpoint formats), returned as $OUT/variants.tar and verified below like the committed
# fixtures; the installed transformers' DeepseekV4 source comes back beside them ($OUT/transformers-v4.tar), for
# reading what the version that made them does.
if [ -n "${GEN_VARIANTS:-}" ]; then
  note "make_golden --variants"
  rm -rf /tmp/variants
  timeout 300 python3 tools/golden/make_golden.py --variants /tmp/variants ${VARIANT_FORMAT:+--format $VARIANT_FORMAT} >"$OUT/variants.log" 2>&1
  note "make_golden --variants rc=$? ($(grep -c '^== v-' "$OUT/variants.log") made)"
  cp "$OUT/variants.log" /tmp/variants/ 2>/dev/null
  tar -C /tmp -cf "$OUT/variants.tar" variants
  for d in /tmp/variants/*/; do [ -f "$d/golden.json" ] && extra="$extra $d"; done
  # The CPU reference on every variant here too (16 cores; the tar may be too large to bring back): one summary,
  # each fixture in its own numerics (official-format variants are still transformers' goldens: the reference).
  timeout 300 "$C/plumb" verify-golden -q --patches numerics.fixture /tmp/variants >"$OUT/variants-cpu.txt" 2>&1
  note "variants on the CPU reference rc=$?: $(grep '^verify-golden: [0-9]* fixtures' "$OUT/variants-cpu.txt")"
  src=$(python3 -c "import os, transformers.models.deepseek_v4 as m; print(os.path.dirname(m.__file__))" 2>/dev/null)
  [ -n "$src" ] && tar -C "$src" -cf "$OUT/transformers-v4.tar" .
fi

# Optional: an official-code golden of a committed fixture's model (ORACLE=NAME): DeepSeek's model.py (.ref/current/,
# ignored) run by the oracle (../shared/oracle copied into the ignored .oracle/; both carried), returned as
# $OUT/oracle-refs.tar and verified on the GPU in the official numerics, alone and with cuda.moe_mxfp4 (its W4A8 kernels).
# ORACLE may name several (space-separated); a name that is not committed is taken from GEN_PRESET's /tmp/NAME, or
# from GEN_VARIANTS' /tmp/variants/NAME. Every NAME-ref folder goes into one $OUT/oracle-refs.tar (the tool returns at
# most 8 files). ORACLE=variants: every variant GEN_VARIANTS made (one oracle run of ~5-15 s and two verify-goldens
# each; the tar then holds only the refs that failed a verify-golden: all of them would pass the 16 MB a file returns).
# ORACLE_JOBS oracle runs at once (default 1 for named fixtures, 6 for variants: small models on one GPU, 16 cores),
# then the verifications one by one, each oracle's log in run.log in ORACLE's order.
orefs=()
orc_names=${ORACLE:-}
only_failed=
if [ "$orc_names" = variants ]; then
  orc_names=$(for d in /tmp/variants/*/; do [ -f "$d/golden.json" ] && basename "$d"; done)
  only_failed=1
fi
oracle_src() {  # (ORACLE=variants: the variant just made, in VARIANT_FORMAT, before a committed fixture of that name)
  local s="tests/data/golden/$1"
  [ -n "$only_failed" ] && [ -d "/tmp/variants/$1" ] && s="/tmp/variants/$1"
  [ -d "$s" ] || s="/tmp/$1"
  [ -d "$s" ] || s="/tmp/variants/$1"
  echo "$s"
}
oracle_one() {  # NAME: the official code on NAME's model -> /tmp/oracle-out-NAME/, log and rc in /tmp/oracle-logs/
  rm -rf "/tmp/oracle-out-$1"
  PYTHONDONTWRITEBYTECODE=1 timeout 300 python3 .oracle/run_ref.py .ref/current "$(oracle_src "$1")" "/tmp/oracle-out-$1" \
    >"/tmp/oracle-logs/$1.log" 2>&1
  echo $? >"/tmp/oracle-logs/$1.rc"
}
if [ -n "$orc_names" ]; then
  rm -rf /tmp/oracle-logs && mkdir -p /tmp/oracle-logs
  jobs_max=${ORACLE_JOBS:-$([ -n "$only_failed" ] && echo 6 || echo 1)}
  for orc in $orc_names; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    oracle_one "$orc" &
  done
  wait
fi
for orc in $orc_names; do
  src=$(oracle_src "$orc")
  note "oracle $orc ($src)"
  cat "/tmp/oracle-logs/$orc.log" >>"$OUT/run.log"
  orc_rc=$(cat "/tmp/oracle-logs/$orc.rc")
  note "oracle rc=$orc_rc"
  if [ "$orc_rc" != 0 ]; then  # refused (a model the official code cannot run) or failed: nothing to verify
    note "verify-golden $orc-ref skipped (oracle rc $orc_rc)"
    continue
  fi
  rm -rf "/tmp/$orc-ref" && mkdir -p "/tmp/$orc-ref"
  cp "$src/config.json" "$src/model.safetensors" "/tmp/oracle-out-$orc"/golden.* "/tmp/$orc-ref/"
  failed=
  for p in numerics.official numerics.official,cuda.moe_mxfp4; do
    timeout 120 "$C/plumb" verify-golden --backend cuda --patches "$p" "/tmp/$orc-ref" >>"$OUT/oracle-verify.txt" 2>&1
    rc=$?
    note "verify-golden $orc-ref [$p] rc=$rc"
    [ $rc -ne 0 ] && failed=1
  done
  [ -z "$only_failed" ] || [ -n "$failed" ] && orefs+=("$orc-ref")
done
[ -n "$orc_names" ] && note "oracle: $(grep -c '^== verify-golden .*-ref .* rc=0' "$OUT/run.log") verify-goldens pass, $(grep -c '^== verify-golden .*-ref .* rc=[1-9]' "$OUT/run.log") fail, $(grep -c '^== verify-golden .*-ref skipped' "$OUT/run.log") models the oracle did not run"
[ ${#orefs[@]} -gt 0 ] && tar -C /tmp -cf "$OUT/oracle-refs.tar" "${orefs[@]}"

note "cuda tests"
if [ -n "${GTEST_FILTER:-}" ] || [ "${TEST_SHARDS:-4}" -le 1 ]; then
  timeout "${T_TESTS:-240}" "$C/plumb_cuda_tests" --gtest_color=no ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$OUT/tests.txt" 2>&1
  rc=$?
else
  # TEST_SHARDS (4) processes at once on the one GPU, gtest's shards of the suite (the tests are small: host twins
  # and short kernels leave the GPU mostly idle), then the tests that check timings alone, so that their numbers are
  # not shared (the GPU time-slices between the processes: BenchLayersGpu's per-op step once timed a 15 us region at
  # 2.4 ms beside the shards, session 41).
  ns=${TEST_SHARDS:-4}
  pids=()
  for i in $(seq 0 $((ns - 1))); do
    GTEST_TOTAL_SHARDS=$ns GTEST_SHARD_INDEX=$i timeout "${T_TESTS:-240}" "$C/plumb_cuda_tests" --gtest_color=no \
      --gtest_filter='-*Timing*:*Times*:BenchLayersGpu.*' >"$OUT/tests-shard$i.txt" 2>&1 &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  timeout "${T_TESTS:-240}" "$C/plumb_cuda_tests" --gtest_color=no --gtest_filter='*Timing*:*Times*:BenchLayersGpu.*' >"$OUT/tests-timing.txt" 2>&1 || rc=$?
  cat "$OUT"/tests-shard*.txt "$OUT/tests-timing.txt" >"$OUT/tests.txt" && rm -f "$OUT"/tests-shard*.txt "$OUT/tests-timing.txt"
fi
note "cuda tests rc=$rc"

if [ -n "${SERVE:-}" ]; then  # plumb serve on the GPU: tests/cli/serve_smoke.py with the fp32 twin and with FAST (the
  # requests run on the server's worker threads, not the thread that loaded the model)
  for patches in "" "$FAST" ${SERVE_ALT:+"$FAST,$SERVE_ALT"}; do
    PLUMB_SERVE_ARGS="--backend cuda${patches:+ --patches $patches}" timeout 180 python3 tests/cli/serve_smoke.py "$C/plumb" \
      >>"$OUT/serve.txt" 2>&1
    note "serve_smoke --backend cuda [${patches/$FAST/FAST}] rc=$? $(tail -n 1 "$OUT/serve.txt")"
  done
fi

if [ -n "${LONG_KLD:-}" ]; then  # long-context agreement of the GPU with the CPU reference (long-kld.txt, long-kld.json)
  # LONG_KLD=N: the bundled model with its context raised to 65536 (config.json only: the weights are the same, trained
  # on short texts, so the check is of the two backends' agreement, not of the model's quality) over N tokens of
  # docs/*.md, A the CPU reference, B LONG_KLD_B (default the GPU's FAST): fed in steps of LONG_KLD_CHUNK tokens (999,
  # so the passes start at every position mod 4, as the CSA windows do not) and, for the last LONG_KLD_DECODE tokens
  # (200), one token per step (the decode path: graphs, caches grown past their first sizes).
  note "long-context kld: $LONG_KLD tokens"
  rm -rf /tmp/tiny-long && cp -r models/tiny /tmp/tiny-long
  python3 -c "import json; p='/tmp/tiny-long/config.json'; c=json.load(open(p)); c['max_position_embeddings']=65536; json.dump(c, open(p, 'w'), indent=1)"
  cat docs/*.md README.md | tr '\n\t\r' '   ' | sed 's/\\/\\\\/g' | "$C/plumb" tokenize -t models/tiny/tokenizer.json >/tmp/long-ids.txt
  python3 - "$LONG_KLD" "${LONG_KLD_CHUNK:-999}" "${LONG_KLD_DECODE:-200}" <<'PY' >/tmp/long-steps.txt
import sys
n, chunk, decode = (int(a) for a in sys.argv[1:])
ids = (['0'] + open('/tmp/long-ids.txt').read().split())[:n]  # BOS first
head, tail = ids[:len(ids) - decode], ids[len(ids) - decode:]
for i in range(0, len(head), chunk): print(' '.join(head[i:i + chunk]))
for t in tail: print(t)
PY
  note "long-context steps: $(wc -l </tmp/long-steps.txt) steps, $(wc -w </tmp/long-steps.txt) tokens"
  timeout "${T_LONG_KLD:-400}" "$C/plumb" kld -m /tmp/tiny-long --tokens /tmp/long-steps.txt --a "" \
    --b "${LONG_KLD_B:-cuda:$FAST}" --json "$OUT/long-kld.json" >"$OUT/long-kld.txt" 2>&1
  note "long-context kld rc=$? $(grep -m1 -i 'mean' "$OUT/long-kld.txt")"
fi

if [ -n "${SANITIZE:-}" ]; then  # compute-sanitizer, one process per (tool, test) of this gtest filter, several at once
  # (bench/sanitize_each.py; a tool that aborts a launch fails that test only): SANITIZE_TOOLS (default memcheck;
  # racecheck, synccheck, initcheck), SANITIZE_JOBS (12), T_SANITIZE per pair (300), T_SANITIZE_ALL (480),
  # SANITIZE_FIRST / SANITIZE_LAST (regexes: the tests started first / last; default last: the long forward tests, so
  # that a deadline leaves them out rather than the op-level tests, as session 32's first racecheck run did),
  # SANITIZE_FULL=1 (every test's whole shape list: by default the longest kernel tests take their sanitizer subset)
  note "compute-sanitizer per test: ${SANITIZE_TOOLS:-memcheck} over $SANITIZE"
  python3 bench/sanitize_each.py --bin "$C/plumb_cuda_tests" --tools "${SANITIZE_TOOLS:-memcheck}" --filter="$SANITIZE" \
    --first "${SANITIZE_FIRST:-}" --last "${SANITIZE_LAST:-Forward|Golden|Bench|Graph|Steps|Generate|Chunking}" --jobs "${SANITIZE_JOBS:-12}" --per-test "${T_SANITIZE:-300}" \
    --deadline "${T_SANITIZE_ALL:-480}" ${SANITIZE_FULL:+--full-sizes} --out "$OUT" >"$OUT/sanitize.txt" 2>&1
  note "compute-sanitizer per test rc=$?"
  tail -n 40 "$OUT/sanitize.txt"
fi

if [ -n "${MBARRIER_PROBE:-}" ]; then  # bench/synccheck_mbarrier_probe.cu's variants, plain and under synccheck (its
  # header: which change of hc_pre's mbarrier pattern synccheck stops reporting), into mbarrier-probe.txt
  note "mbarrier probe under synccheck"
  nvcc -O3 -arch=sm_90a -std=c++17 -Isrc -o /tmp/mbprobe bench/synccheck_mbarrier_probe.cu >"$OUT/mbarrier-probe.txt" 2>&1
  for v in push push-one-wave push-inval push-early-warp push-token local push-c8 push-c9 push-c12; do
    timeout 60 /tmp/mbprobe "$v" >>"$OUT/mbarrier-probe.txt" 2>&1
    timeout 120 compute-sanitizer --tool synccheck --print-limit 4 --error-exitcode 9 /tmp/mbprobe "$v" >"/tmp/mbprobe-$v.txt" 2>&1
    r=$?
    { echo "== $v under synccheck rc=$r: $(grep -c 'Barrier error\|Divergent' "/tmp/mbprobe-$v.txt") reports shown"
      grep -v "Host Frame" "/tmp/mbprobe-$v.txt" | head -n 40; } >>"$OUT/mbarrier-probe.txt"
  done
  note "mbarrier probe: $(grep -c '^== .* rc=0' "$OUT/mbarrier-probe.txt") of 9 variants clean under synccheck"
fi

if [ -n "${SANITIZE_LAYERS:-}" ]; then  # compute-sanitizer over the layer bench at V4-Flash dimensions with FAST: every
  # kernel of a prefill and of decode steps at the real shapes, which the op-level tests reach only in part. The stack
  # of SANITIZE_LAYERS layers (2: CSA and HCA; 4 adds a sliding-window layer) is written once by a plain run (its rows
  # show that it runs); then each run of SANITIZE_LAYERS_RUNS ("tool:context:batches[:patches] ...": the tool over a
  # prefill of that many tokens, then one decode step per batch) in its own process, all at once, T_SANITIZE_LAYERS each (default
  # 480 s; the bench's own budget of 480 s may skip a late batch). The default's sizes finished on an H100 in session
  # 66 (racecheck took 190 s for a 16-token prefill and batch 8; a 256-token prefill, past the grouped MoE's 192,
  # needs more than 420 s under racecheck and initcheck). racecheck and
  # initcheck run without cuda.prefill_gemm and cuda.head_bf16, so without cuBLASLt's kernels: racecheck does not
  # model their TMA and mbarrier pipelines (its reports there would use up the print limit, and leaving them
  # uninstrumented with --kernel-name-exclude kns=nvjet made compute-sanitizer 2025.3 fail on a hardware exception,
  # session 66), and initcheck does not see their TMA stores as writes (it would report every read of their outputs,
  # session 65).
  # sanitize-layers.txt gets each run's summary and its first reports.
  note "compute-sanitizer over bench --layers $SANITIZE_LAYERS"
  sl=(bench --layers "$SANITIZE_LAYERS" --dir /tmp/plumb-san-layers --prefill 0)
  timeout 240 "$C/plumb" "${sl[@]}" --patches "$FAST" --batches 1 --context 16 --iters 3 --warmup 1 >"$OUT/sanitize-layers.txt" 2>&1
  note "plain run rc=$?"
  no_lt=$(echo ",$FAST," | sed 's/,cuda.prefill_gemm,/,/; s/,cuda.head_bf16,/,/; s/^,//; s/,$//')
  pids=()
  i=0
  for r in ${SANITIZE_LAYERS_RUNS:-racecheck:16:1,8 initcheck:8:1,8 memcheck:256:1,8}; do
    IFS=: read -r tool ctx bs pset <<<"$r"
    patches=$FAST
    case $tool in racecheck | initcheck) patches=$no_lt ;; esac
    # (a fourth field: the patches instead, FAST standing for FAST's, e.g. "racecheck:16:1:numerics.official,cuda.fp8_gemv";
    # the fp32 twin is "numerics.reference", since the field cannot be empty; session 67 ran both clean)
    [ -n "$pset" ] && patches=${pset//FAST/$FAST}
    timeout "${T_SANITIZE_LAYERS:-480}" compute-sanitizer --tool "$tool" --print-limit 100 --error-exitcode 9 \
      "$C/plumb" "${sl[@]}" --patches "$patches" --batches "$bs" --context "$ctx" --iters 1 --warmup 0 >"/tmp/sanitize-layers-$i.txt" 2>&1 &
    pids+=("$i:$!:$r")
    i=$((i + 1))
  done
  for p in "${pids[@]}"; do
    IFS=: read -r i pid r <<<"$p"
    wait "$pid"
    rc=$?
    note "compute-sanitizer $r over the layer bench rc=$rc ($([ $rc = 124 ] && echo 'over its time' || echo 'finished'))"
    { echo "##### $r rc=$rc"; grep -E "SUMMARY|^\| [0-9]|^  batch [0-9]+: [0-9]" "/tmp/sanitize-layers-$i.txt"
      grep -vE "^\| |^$" "/tmp/sanitize-layers-$i.txt" | head -n 400; } >>"$OUT/sanitize-layers.txt"
  done
fi

if [ -z "${SKIP_CHECKS:-}" ]; then  # SKIP_CHECKS=1: tests and benches only
note "verify-golden --backend cuda"
: >"$OUT/golden.txt"

for fx in tests/data/golden/*/ models/tiny/ $extra; do
  [ -f "$fx/golden.json" ] || continue  # (a fixture device_slim.sh SLIM_REF moved out: its folder may still come)
  sets=("" "$FAST")
  [ -n "${GOLDEN_ALT:-}" ] && sets+=("${GOLDEN_ALT//FAST/$FAST}")  # GOLDEN_ALT=PATCHES: one more set (FAST stands for FAST's)
  if grep -q "official inference" "$fx/golden.json"; then  # DeepSeek's code: its numerics mode (OFFICIAL=1)
    [ -n "${OFFICIAL:-}" ] || continue
    mode=numerics.official; grep -q "initial revision" "$fx/golden.json" && mode=numerics.official_initial
    sets=("$mode")
  fi
  for patches in "${sets[@]}"; do
    timeout 60 "$C/plumb" verify-golden -q --backend cuda ${patches:+--patches $patches} "$fx" >"$OUT/one.txt" 2>&1
    rc=$?
    echo "### $fx [$patches] rc=$rc" >>"$OUT/golden.txt"
    if [ $rc -ne 0 ]; then head -c 6000 "$OUT/one.txt" >>"$OUT/golden.txt"; else grep -E "^backend cuda|verify-golden:" "$OUT/one.txt" >>"$OUT/golden.txt"; fi
  done
done
rm -f "$OUT/one.txt"
note "verify-golden: $(grep -c 'rc=0' "$OUT/golden.txt") pass, $(grep -c 'rc=[1-9]' "$OUT/golden.txt") fail"

note "selftest --backend cuda"
timeout "${T_SELF:-120}" "$C/plumb" selftest --backend cuda >"$OUT/selftest.txt" 2>&1
note "selftest rc=$? $(tail -n 1 "$OUT/selftest.txt")"

if [ -z "${SKIP_KLD:-}" ]; then  # SKIP_KLD=1: verify-golden and selftest only
KLD_A=${KLD_A:-} KLD_B=${KLD_B:-cuda:}
head -c "${KLD_BYTES:-8000}" README.md >/tmp/kld.txt
note "kld text: ${KLD_BYTES:-8000} bytes of README.md, prefill chunks of ${KLD_CHUNK:-0}"
note "kld [${KLD_A//FAST/$FAST}] vs [${KLD_B//FAST/$FAST}]"
timeout "${T_KLD:-120}" "$C/plumb" kld -m models/tiny --text "${KLD_TEXT:-/tmp/kld.txt}" --tokenizer models/tiny/tokenizer.json \
  --chunk "${KLD_CHUNK:-0}" --a "${KLD_A//FAST/$FAST}" --b "${KLD_B//FAST/$FAST}" >"$OUT/kld.txt" 2>&1
note "kld rc=$?"
fi
fi

# The layer bench's batch-1 (LAYER_BATCHES) table rows and per-op lines for variants "BINARY PATCHES", alternately,
# AB_ROUNDS times each, on one machine (machines differ by a few %). LAYER_AB_EXTRA: more bench options for every
# variant, e.g. --skeleton (its "without weight bytes" lines are kept too).
layer_ab() {
  for r in $(seq "${AB_ROUNDS:-2}"); do
    for v in "$@"; do
      read -r bin patches <<<"$v"
      echo "### $bin [$patches], round $r" >>"$OUT/layers-ab.txt"
      timeout 150 "$C/$bin" bench --layers "${LAYERS:-2}" --dir /tmp/plumb-layers --patches "$patches" --batches "${LAYER_BATCHES:-1}" \
        --prefill 0 ${LAYER_AB_EXTRA:-} 2>&1 | grep -E '^\| [0-9]|per-op|without weight' >>"$OUT/layers-ab.txt"
    done
  done
}
if [ -n "${LAYER_AB:-}" ]; then  # two builds: $C/plumb and $C/$LAYER_AB (another build's binary carried beside it,
  # e.g. plumb-old.xz), FAST patches
  note "layer A/B: plumb vs $LAYER_AB"
  layer_ab "plumb $FAST" "$LAYER_AB $FAST"
  note "layer A/B done"
fi
if [ -n "${LAYER_AB_VARIANTS:-}" ]; then  # any variants "BINARY PATCHES" separated by ';' (FAST stands for the FAST
  # patches), e.g. "plumb-old FAST;plumb FAST;plumb FAST,cuda.pdl"
  note "layer A/B: $LAYER_AB_VARIANTS"
  IFS=';' read -r -a vs <<<"${LAYER_AB_VARIANTS//FAST/$FAST}"
  layer_ab "${vs[@]}"
  note "layer A/B (variants) done"
fi
if [ -n "${LAYER_AB_PAIRED:-}" ]; then  # one build, one process per round and variant: A = FAST, B = LAYER_AB_PAIRED with FAST
  # standing for the FAST patches (e.g. "FAST,cuda.x", or "FAST" for the noise floor), `plumb bench --layers --ab`:
  # pairs of steps alternating A and B, the median difference with its 95 % interval (layers-ab-paired.txt);
  # AB_EXTRA: more bench options (e.g. "--warmup 16 --iters 60"; the batches are LAYER_BATCHES, default 1: not
  # --batches here); AB_LAYERS: the stack's layers (LAYERS, else 2)
  # Several B variants separated by ';' ("FAST,cuda.x;FAST,cuda.y"): each its AB_ROUNDS rounds, in turn.
  IFS=';' read -r -a ab_variants <<<"$LAYER_AB_PAIRED"
  for r in $(seq "${AB_ROUNDS:-2}"); do
    for v in "${ab_variants[@]}"; do
      note "layer A/B (paired, in process) round $r: FAST vs $v"
      echo "### round $r: A [$FAST], B [${v//FAST/$FAST}]" >>"$OUT/layers-ab-paired.txt"
      timeout 300 "$C/plumb" bench --layers "${AB_LAYERS:-${LAYERS:-2}}" --dir /tmp/plumb-layers --patches "$FAST" --ab "${v//FAST/$FAST}" \
        --batches "${LAYER_BATCHES:-1}" --prefill 0 ${AB_EXTRA:-} 2>&1 | grep -E '^\| [0-9]|A/B|FAILED|[Ee]rror|required|--help' >>"$OUT/layers-ab-paired.txt"
      # (the errors too: session 55 lost a run to an option given twice, "--batches" in AB_EXTRA, which printed nothing here)
    done
  done
  note "layer A/B (paired) done"
fi
if [ -n "${LAYER_AB_PATCHES:-}" ]; then  # one build: FAST against FAST + these patches
  note "layer A/B: FAST vs FAST,$LAYER_AB_PATCHES"
  layer_ab "plumb $FAST" "plumb $FAST,$LAYER_AB_PATCHES"
  note "layer A/B (patches) done"
fi

if [ -n "${LAYERS:-}" ]; then  # the whole GPU forward on a V4-Flash layer stack: fast kernels, then the fp32 twin at batch 1
  note "layer bench (fast kernels)"
  timeout "${T_LAYERS:-300}" "$C/plumb" bench --layers "$LAYERS" --dir /tmp/plumb-layers --patches "$FAST" \
    --batches "${LAYER_BATCHES:-1,8,32,128}" --prefill "${LAYER_PREFILL:-1024}" ${LAYER_FAST_EXTRA:-} --json "$OUT/layers-fast.json" >"$OUT/layers-fast.txt" 2>&1
  note "layer bench rc=$?"
  if [ -n "${LONG_CONTEXT:-}" ]; then
    timeout "${T_LAYERS:-300}" "$C/plumb" bench --layers "$LAYERS" --dir /tmp/plumb-layers --patches "$FAST" --batches 1,8 \
      --context "$LONG_CONTEXT" --prefill 0 >>"$OUT/layers-fast.txt" 2>&1
    note "layer bench (context $LONG_CONTEXT) rc=$?"
  fi
  if [ -n "${LAYER_ALT:-}" ]; then  # the same bench with more patches (LAYER_ALT=a,b), for an A/B in one run
    timeout "${T_LAYERS:-300}" "$C/plumb" bench --layers "$LAYERS" --dir /tmp/plumb-layers --patches "$FAST,$LAYER_ALT" \
      --batches "${LAYER_BATCHES:-1,8,32,128}" --prefill "${LAYER_PREFILL:-1024}" ${LAYER_FAST_EXTRA:-} >>"$OUT/layers-fast.txt" 2>&1
    note "layer bench (+$LAYER_ALT) rc=$?"
  fi
  timeout "${T_LAYERS_REF:-120}" "$C/plumb" bench --layers "$LAYERS" --dir /tmp/plumb-layers --batches "${LAYER_REF_BATCHES:-1}" --prefill 0 \
    --iters 3 >"$OUT/layers-ref.txt" 2>&1
  note "layer bench (fp32 twin) rc=$?"
fi

if [ -n "${PRO:-}" ]; then  # V4-Pro's dimensions (bench --model pro): FAST on a PRO_LAYERS stack (~15 GB a layer), the
  # fp32 twin at batch 1, then kld of the CPU reference and of the GPU twin against FAST on PRO_TOKENS (a short prefill
  # and decodes), all on the same synthetic checkpoint, into layers-pro.txt
  note "layer bench, V4-Pro dims"
  timeout "${T_PRO:-400}" "$C/plumb" bench --layers "${PRO_LAYERS:-2}" --model pro --dir /tmp/plumb-pro --patches "$FAST" \
    --batches "${PRO_BATCHES:-1,8}" --prefill "${PRO_PREFILL:-1024}" >"$OUT/layers-pro.txt" 2>&1
  note "layer bench (pro) rc=$?"
  if [ "${PRO_TWIN:-1}" = 1 ]; then
    timeout 200 "$C/plumb" bench --layers "${PRO_LAYERS:-2}" --model pro --dir /tmp/plumb-pro --batches 1 --prefill 0 --iters 3 \
      >>"$OUT/layers-pro.txt" 2>&1
    note "layer bench (pro, fp32 twin) rc=$?"
  fi
  printf '%s\n' "${PRO_TOKENS:-11 22 33 44 55 66 77 88 99 1000 2000 3000}" 5 6 7 8 >/tmp/pro-tokens.txt
  # PRO_KLD="A|B;A|B": the pairs (default: the CPU reference and the GPU twin, each against FAST)
  IFS=';' read -r -a pairs <<<"${PRO_KLD:-|cuda:FAST;cuda:|cuda:FAST}"
  for ab in "${pairs[@]//FAST/$FAST}"; do
    timeout "${T_PRO_KLD:-300}" "$C/plumb" kld -m /tmp/plumb-pro --tokens /tmp/pro-tokens.txt --a "${ab%%|*}" --b "${ab#*|}" >>"$OUT/layers-pro.txt" 2>&1
    note "kld pro [${ab%%|*}] vs [${ab#*|}] rc=$?"
  done
fi

if [ -n "${COMPARE:-}" ] && [ -f "$OUT/layers-fast.json" ]; then  # transformers on the same dimensions, ratio to plumb
  note "transformers comparison"
  timeout "${T_COMPARE:-300}" env PYTHONUNBUFFERED=1 python3 bench/compare_transformers.py --layers "$LAYERS" \
    --batches 1,8 --prefill-bench 1024 --plumb-json "$OUT/layers-fast.json" >>"$OUT/layers-ref.txt" 2>&1
  note "transformers comparison rc=$? (appended to layers-ref.txt: the device tool returns at most 8 files)"
fi

# The program the ncu steps below profile: one eager decode step at NCU_BATCH (default 1) of the layer bench, with
# NCU_PATCHES (default the tensor-core GEMV patches, no graph: ncu sees each launch); NCU_ITERS steps (default 2: more
# to reach a step that only some positions run, e.g. cuda.comp_deferred's window end every 4th).
ncu_step=("$C/plumb" bench --layers "${LAYERS:-2}" --dir /tmp/plumb-layers --patches "${NCU_PATCHES:-cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16}"
  --batches "${NCU_BATCH:-1}" --prefill 0 --iters "${NCU_ITERS:-2}" --warmup 1)

if [ -n "${NCU:-}" ]; then  # kernel time of one eager decode step at batch 1 (ncu, one metric), by launch and by kernel
  note "ncu: one decode step"
  # (NCU_ARGS: more ncu options, e.g. "--clock-control none" to keep the GPU's own clocks instead of ncu's base clocks)
  timeout "${T_NCU:-240}" ncu --csv --metrics gpu__time_duration.sum ${NCU_ARGS:-} "${ncu_step[@]}" >/tmp/ncu.csv 2>&1
  note "ncu rc=$?"
  python3 bench/kernel_times.py /tmp/ncu.csv >"$OUT/ncu-step.txt" 2>&1
  gzip -c /tmp/ncu.csv >"$OUT/ncu.csv.gz"
fi

if [ -n "${NCU_DETAIL:-}" ]; then  # ncu's full sections (stalls, memory, source counters) for the kernels whose names
  # match this regex, NCU_COUNT launches (default 2), in one eager decode step at batch 1 (NCU_BATCH), as text
  note "ncu detail: $NCU_DETAIL"
  # (NCU_SKIP=K: skip the first K matching launches, e.g. the context's prefill; NCU_SOURCE=1: also the report's
  # source page, SASS with its stall samples per instruction, as CSV)
  # (NCU_NAME_BASE=demangled: the regex sees template arguments, e.g. "linear16_one_kernel<1, 4>")
  timeout "${T_NCU:-240}" ncu --set full --import-source yes -o /tmp/ncu-detail -f --kernel-name-base "${NCU_NAME_BASE:-function}" -k "regex:${NCU_DETAIL}" \
    --launch-skip "${NCU_SKIP:-0}" --launch-count "${NCU_COUNT:-2}" "${ncu_step[@]}" >"$OUT/ncu-detail.txt" 2>&1
  note "ncu detail rc=$?"
  ncu -i /tmp/ncu-detail.ncu-rep --print-details all >>"$OUT/ncu-detail.txt" 2>&1
  if [ -n "${NCU_SOURCE:-}" ]; then
    ncu -i /tmp/ncu-detail.ncu-rep --page source --csv --print-source sass >"$OUT/ncu-source.csv" 2>&1
    note "ncu source page rc=$?"
    python3 bench/ncu_source.py "$OUT/ncu-source.csv" >"$OUT/ncu-source-summary.txt" 2>&1  # by opcode, reason, instruction
  fi
fi

if [ -n "${NCU_PIPES:-}" ]; then  # per-pipe issue rates (ALU, FMA, LSU, XU, FP64, tensor), IPC, DRAM throughput, stalls of the
  # kernels whose demangled names match this regex (template arguments included: "gemv_kernel<0," is the FP4 MXFP4
  # GEMV), NCU_COUNT launches (default 12) after NCU_SKIP, in one eager decode step at NCU_BATCH (default 1)
  note "ncu pipes: $NCU_PIPES"
  m=sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
  m=$m,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
  m=$m,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.avg.per_cycle_active
  m=$m,sm__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
  m=$m,sm__warps_active.avg.per_cycle_active,launch__registers_per_thread,launch__grid_size,launch__block_size
  m=$m,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp64.avg.pct_of_peak_sustained_active
  m=$m,sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_dmma_cycles_active.avg.pct_of_peak_sustained_active
  m=$m,smsp__inst_executed.sum,dram__bytes_read.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio
  timeout "${T_NCU:-240}" ncu --metrics "$m" --section WarpStateStats --section InstructionStats --kernel-name-base demangled \
    -k "regex:${NCU_PIPES}" --launch-skip "${NCU_SKIP:-0}" --launch-count "${NCU_COUNT:-12}" "${ncu_step[@]}" >"$OUT/ncu-pipes.txt" 2>&1
  note "ncu pipes rc=$?"
fi

if [ -n "${NCU_STALLS:-}" ]; then  # every kernel of one replayed decode step of the FAST layer bench (LAYERS, default 4;
  # NCU_BATCH): time, instructions per warp and warp stalls, ranked by time waiting for instructions (bench/ncu_stalls.py;
  # NCU_ARGS as above, e.g. "--clock-control none")
  note "ncu stalls"
  timeout "${T_NCU:-300}" ncu --csv --metrics "$(python3 bench/ncu_stalls.py --metrics)" ${NCU_ARGS:-} "$C/plumb" bench \
    --layers "${LAYERS:-4}" --dir /tmp/plumb-layers --patches "$FAST" --batches "${NCU_BATCH:-1}" --prefill 0 --iters 4 --warmup 1 \
    >/tmp/ncu-stalls.csv 2>&1
  note "ncu stalls rc=$?"
  python3 bench/ncu_stalls.py /tmp/ncu-stalls.csv >"$OUT/ncu-stalls.txt" 2>&1
  gzip -c /tmp/ncu-stalls.csv >"$OUT/ncu-stalls.csv.gz"
fi

if [ -n "${KTRACE:-}" ]; then  # KTRACE=1,8: the kernel timeline of the FAST layer bench's replayed steps per batch
  # (LAYERS, default 4; KTRACE_PATCHES: more patches), from the carried libktrace.so (bench/ktrace; libcupti.so.13
  # beside it when the image lacks one): ktrace-step-b<B>.txt, the raw records in ktrace-csv.tar.gz
  for b in ${KTRACE//,/ }; do
    note "ktrace batch $b"
    CUDA_INJECTION64_PATH="$C/libktrace.so" PLUMB_KTRACE_OUT="/tmp/ktrace-b$b.csv" timeout 200 "$C/plumb" bench \
      --layers "${LAYERS:-4}" --dir /tmp/plumb-layers --patches "$FAST${KTRACE_PATCHES:+,$KTRACE_PATCHES}" --batches "$b" --prefill 0 \
      >/dev/null 2>"/tmp/ktrace-b$b.log"
    note "ktrace batch $b rc=$? $(tail -n 1 "/tmp/ktrace-b$b.log")"
    python3 bench/ktrace/ktrace_step.py "/tmp/ktrace-b$b.csv" --last 30 >"$OUT/ktrace-step-b$b.txt" 2>&1
  done
  tar -czf "$OUT/ktrace-csv.tar.gz" -C /tmp $(cd /tmp && ls ktrace-b*.csv 2>/dev/null)
fi

if [ -n "${BENCH:-}" ]; then
  note "bench"
  timeout "${T_BENCH:-150}" "$C/plumb" bench ${BENCH_ONLY:+--only $BENCH_ONLY} --json "$OUT/bench.json" >"$OUT/bench.txt" 2>&1
  note "bench rc=$?"
fi

if [ -n "${BENCH_AB:-}" ]; then  # the kernel bench (BENCH_ONLY's sections) with binary $C/$BENCH_AB and with $C/plumb,
  # alternating, AB_ROUNDS rounds (default 2): bench-ab.txt, each run's table under a "== round R BINARY" line
  note "bench A/B: $BENCH_AB against plumb"
  for r in $(seq 1 "${AB_ROUNDS:-2}"); do
    for b in "$BENCH_AB" plumb; do
      echo "== round $r $b" >>"$OUT/bench-ab.txt"
      timeout "${T_BENCH:-150}" "$C/$b" bench ${BENCH_ONLY:+--only $BENCH_ONLY} >>"$OUT/bench-ab.txt" 2>&1
      note "bench $b round $r rc=$?"
    done
  done
fi

if [ -n "${SASS:-}" ]; then  # the SASS of the kernels whose mangled names match this regex (cuobjdump), per binary in
  # SASS_BINS (default plumb), with an opcode count per kernel: sass.txt.gz, sass-opcodes.txt
  note "sass: $SASS"
  for b in ${SASS_BINS:-plumb}; do
    cuobjdump -sass "$C/$b" 2>&1 | python3 bench/sass_filter.py "$SASS" "$b" "$OUT/sass-opcodes.txt" | gzip -c >"$OUT/sass-$b.txt.gz"
    note "sass $b rc=$?"
  done
fi

echo "==== summaries"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|worst error' "$OUT/tests.txt" | tail -30
[ -f "$OUT/golden.txt" ] && grep -E 'rc=[1-9]' -A 30 "$OUT/golden.txt" | head -60
[ -f "$OUT/selftest.txt" ] && tail -n 25 "$OUT/selftest.txt"
[ -f "$OUT/kld.txt" ] && tail -n 20 "$OUT/kld.txt"
[ -f "$OUT/long-kld.txt" ] && tail -n 20 "$OUT/long-kld.txt"
[ -f "$OUT/bench.txt" ] && tail -n 60 "$OUT/bench.txt"
[ -f "$OUT/ncu-step.txt" ] && head -n 200 "$OUT/ncu-step.txt"
[ -f "$OUT/layers-fast.txt" ] && tail -n 90 "$OUT/layers-fast.txt" && tail -n 25 "$OUT/layers-ref.txt"
exit 0  # the summaries above are informational: a missing optional file is not a failure
