#!/usr/bin/env bash
# gpu_session.sh — one device call on a tight budget: the GPU tests, A/B runs, the stage profile,
# the benchmark sweep against Hugging Face and compute-sanitizer, in the order of STEPS, each
# only while the deadline leaves it time.
#   run(command="DL=540 STEPS='tests prof sweep san' scripts/gpu_session.sh",
#       carry=["build/moetrain", "build/tests/gpu", ".bench"])
# (the whole build/ is over the 64 MiB a call may carry; .bench holds hf_mixtral_baseline.py)
#
# Steps:
#   t:NAME one GPU test binary (t:test_cuda_ops)
#   tests  every GPU test (test_cuda_wgmma, test_cuda_gemm_attn with its kernel timings, _gemm_wg, _model,
#          _golden, _ops). If the
#          attention test fails, every later step runs with MOETRAIN_ATTN=mma.
#   ab:MBS:SET1,SET2,...   bench_8x7B_L2 at micro-batch MBS under each environment setting
#          (e.g. ab:8:MOETRAIN_ATTN=wgmma,MOETRAIN_ATTN=mma), or config overrides (a setting
#          with a dot: train.keep_swiglu=true, several joined by +); the fastest environment
#          setting is exported for the later steps (and said in d.log).
#   abf:MBS:ROUNDS:FILE   the same, the settings from FILE (one per line: a name, then environment
#          assignments and config overrides separated by spaces: values may hold , ; =), alternated
#          ROUNDS times (A B C A B C ...); each run's step line and the per-setting medians → d.log.
#          Nothing is exported. Lines starting with # are skipped. BIN=path among the assignments
#          runs that binary instead of build/moetrain (another commit's build, carried along).
#   prof   the per-stage table (log.profile=sync) at micro-batch 8 → prof.log; profev the same
#          from device events without syncs (log.profile=events) → profev.log
#   sweep  scripts/bench.sh over MBS × SEQ (default "1 2 4 8" × "1024 4096 8192") against
#          SWEEP_HF (default eager), one Hugging Face process → sweep.jsonl
#   head   scripts/bench.sh at micro-batch 4 and 8, seq 4096, against HEAD_HF (default
#          "eager eager+compile") → head.jsonl
#   diag   the attention kernels alone (test_cuda_gemm_attn with MOETRAIN_GPU_BENCH=attn at B 1
#          and 8), PyTorch's SDPA backends at the same shape (scripts/attn_ref.py), and Nsight
#          Compute's view of one launch of each wgmma attention kernel at B 8 (ncu.log); NCU=0
#          skips ncu, REF=0 the PyTorch reference
#   gg     the grouped expert GEMM alone, cuBLASLt's per-expert calls against cuda_gemm_wg.cu's
#          kernel (test_cuda_gemm_wg with MOETRAIN_GPU_BENCH=gg) → gg lines in d.log; ggncu: Nsight
#          Compute on the first launch of each (the w13 forward) → ncu_gg.log
#   san    compute-sanitizer memcheck, then racecheck, over test_cuda_gemm_attn and test_cuda_gemm_wg
#          (their default, short cases; SAN_TESTS picks others), with the kernels racecheck
#          reports hazards in; then tests/gpu/racecheck_probe in both forms (read its header)
#   ckpt   scripts/ckpt_check.sh (~60-90 s, at most 100): L0_sanity on the GPU at world 1, bf16
#          then fp32, 20 steps with checkpoint.every=10 (optim.schedule=constant): straight (A),
#          again (A2: the run-to-run noise), resumed from A's step 10 (R), and 10 steps then
#          checkpoint.resume=auto to 20 (S); R's and S's losses (metrics.jsonl) and final
#          checkpoints (rank files byte for byte, trainer_state) against A's, PASS when bitwise or
#          within 2x the A2-vs-A noise. Then A's step 20 is exported (fp32 and bf16) and scored on
#          one .bin of hairpin tokens by `moetrain eval` (GPU bf16 / fp32, CPU, the exports) and by
#          transformers' MixtralForCausalLM (scripts/ckpt_check.py hf, CPU fp32): rel 1e-5 against
#          moetrain in fp32, 1e-2 in bf16. PASS/FAIL/SKIP/NOTE lines → d.log; everything, with
#          every command's log, in more.tgz (ckpt/). CKPT_DEVICE=cpu runs it without a GPU
#          (development; the transformers part says SKIP where torch is missing).
# DMON=1: nvidia-smi dmon (power, temperature, SM and memory clocks, once a second, wall-clock
# stamped like the step lines) for the whole call → dmon.log in more.tgz, and its per-step
# medians in d.log (is a stage power-limited? the SM clock says).
# DL: seconds this call may take (default 560). Under $OUT (at most 8 files come back): d.log
# (everything in short), attn.log, prof8.log, sweep.jsonl, head.jsonl, more.tgz (full logs).
# Exit status: that of the attention/GEMM test when `tests` ran, else 0 (the ckpt verdict is in
# d.log: "ckpt: N passed, N failed, N skipped"; it needs only build/moetrain carried).
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build/gpu_session}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
W=$OUT; L=$W/d.log; DL=${DL:-560}; STEPS=${STEPS:-tests prof sweep san}; LOGS=/tmp/gs_logs; mkdir -p $LOGS
frc=0
say() { echo "$*" | tee -a $L; }
left() { echo $((DL - SECONDS)); }
# build/commit.txt (written by the caller before the call: a worktree's git metadata does not travel)
say "gpu_session: steps [$STEPS], DL=$DL, commit $(cat build/commit.txt 2>/dev/null || git log --oneline -1 2>/dev/null | cut -c1-60)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | tee -a $L

dmon_pid=
[ "${DMON:-0}" = 1 ] && { nvidia-smi dmon -s pc -o T > $LOGS/dmon.log 2>&1 & dmon_pid=$!; }
# dmon_sum FROM TO: median power (W) and SM clock (MHz) of the dmon lines stamped in [FROM, TO]
# (columns found by name in dmon's header: pwr, pclk)
dmon_sum() {
  [ -n "$dmon_pid" ] || return 0
  local sel
  sel=$(awk -v a="$1" -v b="$2" '/^#/ && /pwr/ { for (i = 1; i <= NF; i++) { if ($i == "pwr") P = i; if ($i == "pclk") C = i }; next }
    !/^#/ && P && C && $1 >= a && $1 <= b { print $P, $C }' $LOGS/dmon.log)
  [ -n "$sel" ] || return 0
  local n p c cmin
  n=$(echo "$sel" | wc -l)
  p=$(echo "$sel" | awk '{print $1}' | sort -n | sed -n "$(( (n + 1) / 2 ))p")
  c=$(echo "$sel" | awk '{print $2}' | sort -n | sed -n "$(( (n + 1) / 2 ))p")
  cmin=$(echo "$sel" | awk '{print $2}' | sort -n | head -1)
  say "  dmon $1-$2: $n s, median power $p W, median SM clock $c MHz (min $cmin)"
}

bench_line() { grep '^{"bench' "$1" | tail -1; }
bs() {  # bs NAME env...: scripts/bench.sh into $LOGS/NAME, its results to $W/NAME.jsonl; the whole
  # run ends by the deadline (RUN_TIMEOUT bounds each process, not their sum), keeping what it has
  local n=$1; shift
  timeout $(( $(left) - 10 )) env OUT=$LOGS/$n HF_BATCH=1 RUN_TIMEOUT=${RUN_TIMEOUT:-240} "$@" scripts/bench.sh \
    > $LOGS/$n.log 2>&1 || say "$n: bench.sh exit $? (124: cut at the deadline; the rows so far follow)"
  grep -A30 '^| ' $LOGS/$n.log | head -30 | tee -a $L
  cp $LOGS/$n/results.jsonl $W/$n.jsonl 2>/dev/null
}

for step in $STEPS; do
  say "== $step (t=$SECONDS s, $(left) s left, $(date +%T))"
  t_from=$(date +%T)
  case $step in
  tests)
    timeout 60 build/tests/gpu/test_cuda_wgmma > $LOGS/wgmma.log 2>&1; say "test_cuda_wgmma rc=$? $(tail -1 $LOGS/wgmma.log)"
    MOETRAIN_GPU_LONG=1 MOETRAIN_GPU_BENCH=1 timeout 200 build/tests/gpu/test_cuda_gemm_attn > $W/attn.log 2>&1; frc=$?
    say "test_cuda_gemm_attn rc=$frc"; grep -E "FAIL|passed|^attn_|^bench" $W/attn.log | head -30 | tee -a $L
    [ $frc -ne 0 ] && { export MOETRAIN_ATTN=mma; say "attention tests failed: the rest runs MOETRAIN_ATTN=mma"; }
    for t in test_cuda_gemm_wg test_cuda_model test_cuda_golden test_cuda_ops test_cuda_optim; do
      timeout 90 build/tests/gpu/$t > $LOGS/$t.log 2>&1; say "$t rc=$? $(tail -1 $LOGS/$t.log)"; grep FAIL $LOGS/$t.log | head -5 | tee -a $L
    done
    ;;
  t:*)  # t:NAME: one GPU test binary, e.g. t:test_cuda_ops
    t=${step#t:}; timeout 150 build/tests/gpu/$t > $LOGS/$t.log 2>&1; r=$?
    say "$t rc=$r $(tail -1 $LOGS/$t.log)"; grep -E "FAIL|embed_bwd" $LOGS/$t.log | head -20 | tee -a $L
    [ $r -ne 0 ] && frc=$r ;;
  ab:*)  # ab:MBS:SET1,SET2,...: bench_8x7B_L2 at micro-batch MBS under each env setting; the fastest is exported
    [ "$(left)" -lt 120 ] && { say "skipped: too little time"; continue; }
    IFS=: read -r _ mbs sets <<< "$step"; best=; bms=
    for set in ${sets//,/ }; do
      ev=$set; ov=; case $set in *.*=*) ev=; ov=${set//+/ } ;; esac  # a.b=v (+ joins several): config overrides
      env $ev timeout 100 build/moetrain --config bench_8x7B_L2 train.micro_batch=$mbs train.global_batch=$mbs $ov \
        > $LOGS/ab_${mbs}_${set//[^A-Za-z0-9]/_}.log 2>&1
      line=$(bench_line $LOGS/ab_${mbs}_${set//[^A-Za-z0-9]/_}.log); ms=$(echo "$line" | sed -n 's/.*"step_ms": \([0-9.]*\).*/\1/p')
      say "$set mbs=$mbs: $line | $(grep '^step 12' $LOGS/ab_${mbs}_${set//[^A-Za-z0-9]/_}.log | cut -c1-110)"
      if [ -n "$ms" ] && { [ -z "$bms" ] || awk "BEGIN{exit !($ms < $bms)}"; }; then best=$set; bms=$ms; fi
    done
    case $best in *.*=*) best= ;; esac  # only environment settings carry over
    [ -n "$best" ] && { export "${best?}"; say "$best for the rest"; } ;;
  abf:*)  # abf:MBS:ROUNDS:FILE: alternated A/B over the settings in FILE
    IFS=: read -r _ mbs rounds file <<< "$step"
    [ -r "$file" ] || { say "abf: no file $file"; continue; }
    for r in $(seq 1 "$rounds"); do
      while read -r name rest; do
        case $name in ''|'#'*) continue ;; esac
        [ "$(left)" -lt 40 ] && { say "abf: stopped, too little time"; break 2; }
        ev=(); ov=(); bin=build/moetrain
        for a in $rest; do case ${a%%=*} in BIN) bin=${a#BIN=} ;; *.*) ov+=("$a") ;; *) ev+=("$a") ;; esac; done
        f=$LOGS/abf_${mbs}_${name}_$r.log
        env "${ev[@]}" timeout 100 "$bin" --config bench_8x7B_L2 train.micro_batch=$mbs train.global_batch=$mbs \
          "${ov[@]}" > $f 2>&1
        ms=$(bench_line $f | sed -n 's/.*"step_ms": \([0-9.]*\).*/\1/p')
        say "abf mbs=$mbs $name round $r: ${ms:-FAILED} ms | steps 3-12: $(grep -E '^step +[0-9]+/' $f | awk 'NR>2' | sed -n 's/.* \([0-9.]*\) ms.*/\1/p' | tr '\n' ' ')"
        echo "$name $ms" >> $LOGS/abf_${mbs}_${file##*/}.txt
      done < "$file"
    done
    awk '$2 != "" { v[$1] = v[$1] " " $2 } END { for (n in v) print "abf mbs='$mbs' " n ":" v[n] }' $LOGS/abf_${mbs}_${file##*/}.txt | tee -a $L ;;
  prof|profev)  # prof: a sync per stage; profev: device events (log.profile=events), the plain step
    [ "$(left)" -lt 70 ] && { say "skipped: too little time"; continue; }
    pm=sync; [ $step = profev ] && pm=events
    timeout 100 build/moetrain --config bench_8x7B_L2 train.micro_batch=8 train.global_batch=8 \
      train.steps=${PROF_STEPS:-6} log.profile=$pm > $W/$step.log 2>&1; sed -n '/^profile/,$p' $W/$step.log | head -${PROF_LINES:-14} | tee -a $L ;;
  sweep)
    [ "$(left)" -lt 200 ] && { say "skipped: too little time"; continue; }
    bs sweep MBS="${MBS:-1 2 4 8}" SEQ="${SEQ:-1024 4096 8192}" HF_VARIANTS="${SWEEP_HF:-eager}" RUN_TIMEOUT=$(( $(left) - 20 )) ;;
  head)
    [ "$(left)" -lt 150 ] && { say "skipped: too little time"; continue; }
    bs head MBS="4 8" SEQ=4096 HF_VARIANTS="${HEAD_HF:-eager eager+compile}" ;;
  diag)
    MOETRAIN_GPU_BENCH=attn timeout 120 build/tests/gpu/test_cuda_gemm_attn > $LOGS/attn_bench.log 2>&1
    say "attention bench rc=$?"; grep -E "^attn_" $LOGS/attn_bench.log | tee -a $L
    [ "$(left)" -gt 90 ] && [ "${REF:-1}" = 1 ] && { PYTHONUNBUFFERED=1 timeout 90 python3 scripts/attn_ref.py 1 8 > $LOGS/attn_ref.log 2>&1
      grep -E "^attn_ref|rror" $LOGS/attn_ref.log | tee -a $L; }
    [ "${NCU:-1}" = 0 ] && continue  # NCU=0: timings only
    for kv in "k_attn_fwd_ws 0" "k_attn_dkdv_ws 0" "k_attn_fwd_wg 0" "k_attn_dkdv_wg 6" "k_attn_dq_ws 0" "k_attn_dq_ds 0"; do  # 6: skip the recompute path's dkdv
      set -- $kv
      [ "$(left)" -lt 60 ] && break
      MOETRAIN_GPU_BENCH=attn MOETRAIN_ATTN_B=8 timeout 120 ncu --clock-control none -k "regex:$1" --launch-skip $2 -c 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
        build/tests/gpu/test_cuda_gemm_attn >> $W/ncu.log 2>&1
      say "ncu $1 rc=$?"
    done
    grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible" $W/ncu.log | head -60 | tee -a $L ;;
  ggncu)  # Nsight Compute on one launch each of cuBLASLt's first w13 forward GEMM and ours (the gg bench)
    [ "$(left)" -lt 90 ] && { say "skipped: too little time"; continue; }
    for k in "nvjet|xmma|cutlass|sm90_" "k_gemm_grouped_wg"; do
      MOETRAIN_GPU_BENCH=gg timeout $(( $(left) / 2 )) ncu --clock-control none -k "regex:$k" -c 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
        --metrics lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
        build/tests/gpu/test_cuda_gemm_wg > $LOGS/ncu_gg1.log 2>&1
      say "ncu $k rc=$?"; sed -n '/==PROF==/,$p' $LOGS/ncu_gg1.log | grep -v "^gg " >> $W/ncu_gg.log
    done
    grep -E "^  [a-zA-Z_]+.*\(|Duration|Throughput|Hit Rate|lts__|dram__|Cluster|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" \
      $W/ncu_gg.log | head -70 | tee -a $L ;;
  gg)
    MOETRAIN_GPU_BENCH=gg timeout 120 build/tests/gpu/test_cuda_gemm_wg > $LOGS/gg.log 2>&1
    say "grouped GEMM bench rc=$?"; grep -E "^gg|FAIL|rror" $LOGS/gg.log | tee -a $L ;;
  san)
    [ "$(left)" -lt 60 ] && { say "skipped: too little time"; continue; }
    # SAN_TESTS: the binaries (default: the attention/GEMM test, then the grouped GEMM kernel's)
    for t in ${SAN_TESTS:-test_cuda_gemm_attn test_cuda_gemm_wg}; do
      for tool in memcheck racecheck; do
        [ "$(left)" -lt 45 ] && break 2
        timeout $(( $(left) - 15 )) compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 10000 \
          build/tests/gpu/$t > $LOGS/san_${t}_$tool.log 2>&1
        say "$t $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $LOGS/san_${t}_$tool.log | tail -1) $(tail -1 $LOGS/san_${t}_$tool.log)"
        # which kernels the hazards are in: ours fail, cuBLASLt's nvjet_* are reported only
        [ $tool = racecheck ] && scripts/racecheck_ours.sh $LOGS/san_${t}_racecheck.log 2>&1 | sed 's/^/  /' | tee -a $L
      done
    done
    # the probe of the stage release our warp-specialised kernels use, in both forms
    if [ -x build/tests/gpu/racecheck_probe ]; then
      for form in lane0 all; do
        compute-sanitizer --tool racecheck --print-limit 4 build/tests/gpu/racecheck_probe $form > $LOGS/san_probe_$form.log 2>&1
        say "racecheck_probe $form rc=$? $(grep -E 'RACECHECK SUMMARY' $LOGS/san_probe_$form.log | tail -1) $(grep -E 'racecheck_probe' $LOGS/san_probe_$form.log | tail -1)"
      done
    fi ;;
  ckpt)  # checkpoint save/resume exactness and the Hugging Face export (scripts/ckpt_check.sh)
    [ "$(left)" -lt 45 ] && { say "skipped: too little time"; continue; }
    cdl=$(( $(left) - 10 )); [ $cdl -gt 100 ] && cdl=100; ck0=$SECONDS
    CKPT_DL=$cdl CKPT_WORK=/tmp/gs_ckpt timeout -k 5 $((cdl + 20)) scripts/ckpt_check.sh $LOGS/ckpt > $LOGS/ckpt.log 2>&1
    say "ckpt rc=$? ($((SECONDS - ck0)) s; full output in more.tgz: ckpt.log, ckpt/)"
    grep -E '^ckpt: (PASS|FAIL|SKIP|NOTE|[0-9]+ passed|.* on train\.device=)|^ckpt:   [a-z0-9]+:? (eval on|[0-9]+ training)' \
      $LOGS/ckpt.log | cut -c1-300 | tee -a $L ;;
  *) say "unknown step $step" ;;
  esac
  dmon_sum $t_from $(date +%T)
done
say "done t=$SECONDS s"
[ -n "$dmon_pid" ] && kill $dmon_pid 2>/dev/null
tar czf $W/more.tgz -C $LOGS . 2>/dev/null
exit $frc
