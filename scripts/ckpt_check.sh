#!/usr/bin/env bash
# ckpt_check.sh — on one device: (1) checkpoint save + resume is exact, (2) a trained checkpoint
# exported for Hugging Face loads in transformers and gives moetrain's loss. The `ckpt` step of
# scripts/gpu_check.sh; runs alone too:
#   scripts/ckpt_check.sh [LOGDIR]                              # on the GPU (train.device=cuda)
#   CKPT_DEVICE=cpu MOETRAIN=build-ck/moetrain scripts/ckpt_check.sh   # development, no GPU
# Env: MOETRAIN (build/moetrain), CKPT_DEVICE (cuda), CKPT_DTYPES ("bf16 fp32": precision.dtype
# of the runs, one set each), CKPT_DL (seconds this may take, default 900: a later dtype's set
# and the exports are skipped, with a SKIP line, when too little is left; ~20 s are kept for
# transformers), CKPT_WORK (scratch for checkpoints and exports, /tmp/ckpt_check, wiped first),
# PYTHON (python3).
#
# Per dtype D, L0_sanity at world 1 (parallel.ep=1), 20 steps, optim.schedule=constant with
# optim.warmup=5 (the lr of a step then does not depend on train.steps, so a 10-step run and its
# continuation see the lr of the 20-step run), checkpoint.every=10, log.every=1:
#   A   straight 20 steps                                  → A/step_00000010, A/step_00000020
#   A2  the same again: the GPU's run-to-run noise (float atomics in the router statistics)
#   R   checkpoint.resume=A/step_00000010 → 20             (resume of the very state A continued from)
#   S   train.steps=10, then checkpoint.resume=auto → 20 in the same checkpoint.dir and log.dir
#       (a run that ended and is continued; metrics.jsonl joined by the resume). Its trainer state
#       is compared without steps_total, run_id (S is a run of its own) and the best-validation
#       fields (S's first part ends at step 10 with a validation that A does not make there)
# and compares (scripts/ckpt_check.py compare) the metrics.jsonl losses of R (steps 11-20) and
# S (1-20, 20 lines, no duplicates) with A's, and their step_00000020 (S: also step_00000010)
# rank files byte for byte and trainer_state.yaml's fields, against the A2-vs-A noise: PASS when
# bitwise, or no worse than twice the noise where the repeat itself is not bitwise (the
# tolerance is argued in scripts/ckpt_check.py). `moetrain inspect` checks the crcs.
# Then A/step_00000020 is exported (--dtype fp32 and bf16) and scored on the same 16 windows
# (data.path=eval.bin, a .bin shard of hairpin tokens both sides read: data.format=bin
# data.val_frac=0.5 train.eval_batches=2, 2048 target tokens) by `moetrain eval` — on the
# device in D (and fp32), on the CPU, and from the exports (checkpoint.init_from's reader) —
# and by transformers (scripts/ckpt_check.py hf: from_pretrained, fp32, CPU). Tolerances: the
# fp32 export through moetrain = the checkpoint's CPU loss exactly; the bf16 export on the
# device in bf16 = the checkpoint's exactly (both are the masters rounded to bf16, RNE: the
# checkpoint's eval runs with precision.master=fp32, since split masters round ties away from
# zero and so differ from the export at ~2^-17 of the weights);
# transformers vs moetrain in fp32 1e-5 relative (as scripts/hf_check.py), vs moetrain in bf16
# 1e-2 (the GPU tests' bf16 loss tolerance).
# Output: one line per check, "ckpt: PASS|FAIL|SKIP ..." ("NOTE" for the A2 noise, details
# indented), and a last line "ckpt: N passed, N
# failed, N skipped"; details (every command's log, the comparisons) under LOGDIR (default
# $CKPT_WORK/logs). Exit 1 when a check failed, else 0.
cd "$(dirname "$0")/.." || exit 1
BIN=${MOETRAIN:-build/moetrain}; DEV=${CKPT_DEVICE:-cuda}; DTYPES=${CKPT_DTYPES:-bf16 fp32}
DL=${CKPT_DL:-900}; WK=${CKPT_WORK:-/tmp/ckpt_check}; PY=${PYTHON:-python3}
LG=${1:-$WK/logs}
NS=20; HALF=10; EVN=16; SEQ=128
F=$(printf step_%08d $NS); H=$(printf step_%08d $HALF)
rm -rf "$WK/runs" "$WK/eval.bin"; mkdir -p "$WK/runs" "$LG" || exit 1
np=0; nf=0; nsk=0
res() {  # res PASS|FAIL|SKIP text
  case $1 in PASS) np=$((np + 1)) ;; FAIL) nf=$((nf + 1)) ;; *) nsk=$((nsk + 1)) ;; esac
  echo "ckpt: $*"; echo "ckpt: $*" >> "$LG/summary.log"
}
left() { echo $((DL - SECONDS)); }
# mt NAME TIMEOUT ARGS...: the binary, output to $LG/NAME.log; a FAIL line when it does not exit 0
# (-k: the trainer traps SIGTERM to save and stop after the step, so a hang needs SIGKILL)
mt() {
  local n=$1 to=$2; shift 2
  [ "$(left)" -lt $((to + 3)) ] && to=$(( $(left) - 3 ))
  [ "$to" -lt 5 ] && { res SKIP "$n: the deadline (CKPT_DL=$DL s) has passed"; return 1; }
  echo "+ $BIN $*" > "$LG/$n.log"
  timeout -k 5 "$to" "$BIN" "$@" >> "$LG/$n.log" 2>&1; local rc=$?
  if [ $rc -ne 0 ]; then
    local why; why=$(grep -m1 'error' "$LG/$n.log" | cut -c1-200); [ -n "$why" ] || why=$(tail -1 "$LG/$n.log" | cut -c1-200)
    [ $rc -ge 124 ] && why="timed out after ${to} s: $why"
    res FAIL "$n: moetrain exited $rc ($why); log $LG/$n.log"
  fi
  return $rc
}
# py NAME ARGS...: scripts/ckpt_check.py, its PASS/FAIL/SKIP lines counted, all of it in $LG/NAME.log
py() {
  local n=$1 to=90; shift
  [ "$(left)" -lt $((to + 3)) ] && to=$(( $(left) - 3 ))
  [ "$to" -lt 5 ] && { res SKIP "$n: the deadline (CKPT_DL=$DL s) has passed"; return 1; }
  timeout -k 5 $to "$PY" scripts/ckpt_check.py "$@" > "$LG/$n.log" 2>&1; local rc=$?
  [ $rc -ge 124 ] && [ $rc -ne 3 ] && echo "FAIL $n: ckpt_check.py timed out after $to s" >> "$LG/$n.log"
  while IFS= read -r line; do
    case $line in
      PASS\ *|FAIL\ *|SKIP\ *) res "${line%% *}" "${line#* }" ;;
      NOTE\ *|"  "*) echo "ckpt: $line" | tee -a "$LG/summary.log" ;;
    esac
  done < "$LG/$n.log"
  if [ $rc -ne 0 ] && [ $rc -ne 3 ] && ! grep -q '^FAIL ' "$LG/$n.log"; then
    res FAIL "$n: ckpt_check.py exited $rc ($(tail -1 "$LG/$n.log" | cut -c1-200)); log $LG/$n.log"
  fi
  return $rc
}
# ev NAME CKPT OVERRIDES...: moetrain eval on eval.bin; sets EV_LOSS (val_loss) and EV_TOK
# (tokens scored), both empty on failure
EVAL=(data.path="$WK/eval.bin" data.format=bin data.val_frac=0.5 train.eval_batches=2 train.micro_batch=8 train.seq_len=$SEQ)
ev() {
  local n=$1 ck=$2; shift 2
  EV_LOSS=; EV_TOK=
  [ -e "$ck" ] || return 1
  mt "$n" 60 eval --ckpt "$ck" "${EVAL[@]}" "$@" || return 1
  local j; j=$(grep '^{"eval"' "$LG/$n.log" | tail -1)
  EV_LOSS=$(echo "$j" | sed -n 's/.*"val_loss": \([0-9.eE+-]*\).*/\1/p')
  EV_TOK=$(echo "$j" | sed -n 's/.*"tokens": \([0-9]*\).*/\1/p')
  [ -n "$EV_LOSS" ] || { res FAIL "$n: no {\"eval\": ...} line with val_loss in $LG/$n.log"; return 1; }
}

[ -x "$BIN" ] || { res FAIL "no binary $BIN (build it, or carry build/moetrain)"; echo "ckpt: 0 passed, 1 failed, 0 skipped"; exit 1; }
echo "ckpt: $BIN on train.device=$DEV, dtypes [$DTYPES], work $WK, logs $LG, DL=$DL s" | tee -a "$LG/summary.log"
HF_CASES=()
py tokens tokens "$WK/eval.bin" --windows $((2 * EVN)) --seq $SEQ || echo "ckpt:   no eval.bin: the export checks are skipped"
first=1
for D in $DTYPES; do
  R=$WK/runs/$D
  need=$([ $first = 1 ] && echo 20 || echo 65)  # a later set keeps ~20 s for transformers
  if [ "$(left)" -lt $need ]; then res SKIP "$D: $(left) s left, the $D set needs ~$need s"; continue; fi
  first=0
  C=(--config L0_sanity train.device="$DEV" precision.dtype="$D" parallel.ep=1 train.steps=$NS optim.schedule=constant
     optim.warmup=5 checkpoint.every=$HALF checkpoint.keep=0 log.every=1)
  t0=$SECONDS
  mt "$D.A" 90 "${C[@]}" checkpoint.dir="$R/A" log.dir="$R/log_A" || continue
  mt "$D.A2" 90 "${C[@]}" checkpoint.dir="$R/A2" log.dir="$R/log_A2"
  mt "$D.R" 90 "${C[@]}" checkpoint.dir="$R/R" log.dir="$R/log_R" checkpoint.resume="$R/A/$H"
  if mt "$D.S1" 90 "${C[@]}" train.steps=$HALF checkpoint.dir="$R/S" log.dir="$R/log_S" &&
     mt "$D.S2" 90 "${C[@]}" checkpoint.dir="$R/S" log.dir="$R/log_S" checkpoint.resume=auto; then
    grep -q "resumed from .*$H" "$LG/$D.S2.log" && grep -q "$NS steps from step $HALF" "$LG/$D.S2.log" \
      && res PASS "$D: resume=auto found $R/S/$H and trained steps $((HALF + 1))-$NS" \
      || res FAIL "$D: resume=auto did not resume from step $HALF (see $LG/$D.S2.log)"
  fi
  echo "ckpt:   $D: 5 training runs in $((SECONDS - t0)) s" | tee -a "$LG/summary.log"
  for x in A R S; do
    [ -d "$R/$x/$F" ] || continue
    timeout -k 5 30 "$BIN" inspect "$R/$x/$F" > "$LG/$D.inspect_$x.log" 2>&1 \
      && res PASS "$D: moetrain inspect $x/$F: every crc holds" || res FAIL "$D: moetrain inspect $x/$F failed: $LG/$D.inspect_$x.log"
  done
  NZ=(); [ -f "$R/log_A2/metrics.jsonl" ] && NZ=(--noise "$R/log_A2/metrics.jsonl")
  NC=(); [ -d "$R/A2/$F" ] && NC=(--noise-ckpt "$R/A/$F" "$R/A2/$F")
  [ ${#NZ[@]} -gt 0 ] && py "$D.cmp_A2" compare --label "$D repeat A2 vs A (run-to-run noise, not a test of resume)" \
    --ref "$R/log_A/metrics.jsonl" --run "$R/log_A2/metrics.jsonl" --steps 1-$NS --ckpt "$R/A/$F" "$R/A2/$F" --info \
    --ignore-state run_id
  [ -d "$R/R/$F" ] && py "$D.cmp_R" compare --label "$D resume from A's step $HALF (R) vs straight (A)" \
    --ref "$R/log_A/metrics.jsonl" --run "$R/log_R/metrics.jsonl" --steps $((HALF + 1))-$NS --count $((NS - HALF)) \
    "${NZ[@]}" "${NC[@]}" --ckpt "$R/A/$F" "$R/R/$F"
  [ -d "$R/S/$F" ] && py "$D.cmp_S" compare --label "$D stop at $HALF + resume=auto (S) vs straight (A)" \
    --ref "$R/log_A/metrics.jsonl" --run "$R/log_S/metrics.jsonl" --steps 1-$NS --count $NS \
    "${NZ[@]}" "${NC[@]}" --ckpt "$R/A/$H" "$R/S/$H" --ckpt "$R/A/$F" "$R/S/$F" \
    --ignore-state steps_total,run_id,best_val_loss,best_step,evals_since_best

  # (2) export the trained checkpoint and score it in moetrain and in transformers
  [ -f "$WK/eval.bin" ] || continue
  if [ "$(left)" -lt 45 ]; then res SKIP "$D: export checks: $(left) s left, ~25 s needed + ~20 s for transformers"; continue; fi
  CK=$R/A/$F
  mt "$D.export32" 30 export --ckpt "$CK" --out "$R/hf32" --dtype fp32 || continue
  mt "$D.export16" 30 export --ckpt "$CK" --out "$R/hf16" --dtype bf16
  ev "$D.eval_dev" "$CK" train.device="$DEV" precision.dtype="$D" precision.master=fp32; l_dev=$EV_LOSS; tok=$EV_TOK
  ev "$D.eval_cpu" "$CK" train.device=cpu; l_cpu=$EV_LOSS; tok=${tok:-$EV_TOK}
  ev "$D.eval_hf32_cpu" "$R/hf32" train.device=cpu; l_x32=$EV_LOSS
  ev "$D.eval_hf16_cpu" "$R/hf16" train.device=cpu; l_x16=$EV_LOSS
  echo "ckpt:   $D eval on eval.bin ($tok tokens): ckpt $DEV/$D $l_dev, ckpt cpu $l_cpu, fp32 export cpu $l_x32, bf16 export cpu $l_x16" | tee -a "$LG/summary.log"
  [ -n "$l_cpu" ] && [ -n "$l_x32" ] && { [ "$l_cpu" = "$l_x32" ] \
    && res PASS "$D: the fp32 export read back by moetrain (init_from) gives the checkpoint's loss exactly ($l_x32)" \
    || res FAIL "$D: the fp32 export read back by moetrain gives $l_x32, the checkpoint $l_cpu (same weights: must be equal)"; }
  if [ "$DEV" != cpu ]; then
    l_dev32=
    if [ "$D" = fp32 ]; then l_dev32=$l_dev
    else
      ev "$D.eval_dev_fp32" "$CK" train.device="$DEV" precision.dtype=fp32; l_dev32=$EV_LOSS
      ev "$D.eval_hf16_dev" "$R/hf16" train.device="$DEV" precision.dtype="$D"; l_x16d=$EV_LOSS
      [ -n "$l_dev" ] && [ -n "$l_x16d" ] && { [ "$l_dev" = "$l_x16d" ] \
        && res PASS "$D: the bf16 export on $DEV/bf16 gives the checkpoint's $DEV/bf16 loss exactly ($l_dev): it holds the compute weights" \
        || res FAIL "$D: the bf16 export on $DEV/bf16 gives $l_x16d, the checkpoint $l_dev (both the masters rounded to bf16, to nearest even: must be equal)"; }
      [ -n "$l_dev" ] && HF_CASES+=(--case "$R/hf32" "moetrain eval $D $DEV/bf16" "$l_dev" 1e-2)
    fi
    [ -n "$l_dev32" ] && HF_CASES+=(--case "$R/hf32" "moetrain eval $D $DEV/fp32" "$l_dev32" 1e-5)
  fi
  [ -n "$l_cpu" ] && HF_CASES+=(--case "$R/hf32" "moetrain eval $D cpu" "$l_cpu" 1e-5)
  [ -n "$l_x16" ] && HF_CASES+=(--case "$R/hf16" "moetrain eval $D bf16-export cpu" "$l_x16" 1e-5)
done
if [ ${#HF_CASES[@]} -gt 0 ]; then
  if [ "$(left)" -lt 15 ]; then res SKIP "hf: $(left) s left for transformers"
  else py hf hf --bin "$WK/eval.bin" --seq $SEQ --val-frac 0.5 --nseq $EVN --tokens "${tok:-$((EVN * SEQ))}" "${HF_CASES[@]}"
  fi
fi
echo "ckpt: $np passed, $nf failed, $nsk skipped ($SECONDS s)" | tee -a "$LG/summary.log"
[ $nf -eq 0 ]
