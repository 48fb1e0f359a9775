#!/usr/bin/env bash
# Fault tolerance with NCCL on 2 GPUs (owner: fault). Budget: ~80 s of GPU wall time.
#
#  1. kill:  torchrun --max-restarts 1, SIGKILL rank 1 as soon as checkpoint step_50 exists;
#            expect: the group restarts, resumes from the newest complete checkpoint without
#            --resume, finishes all steps (exit 0).
#  2. term:  SIGTERM to torchrun at step >= 20; expect: both ranks finish the step, write a
#            checkpoint at the step reached, workers exit 0 (torchrun itself exits 1 by design,
#            it re-raises the signal); then a short --resume run continues from that step.
#
# Writes $OUT/fault/{kill.log,term.log,resume.log,results.txt,summary.txt}. Every phase is
# guarded: a failing one is logged and the script goes on.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
# A fresh rendezvous store per torchrun round: with the shared default a restarted group
# can read the dead group's keys and fail to connect (pytorch#135712; seen on CPU/gloo).
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1

OUT=${OUT:-/tmp/fault-out}
R="$OUT/fault"
mkdir -p "$R"
WORK=$(mktemp -d /tmp/fault.XXXXXX)
PY=${PYTHON:-python}
COMMON=(--config tiny --set metrics.progress=false --set train.log_every=10)
# FAULT_EXTRA: extra `train run` arguments, e.g. a smaller model for a CPU dry run of this script.
read -r -a EXTRA <<< "${FAULT_EXTRA:-}"
COMMON+=("${EXTRA[@]}")
T0=$SECONDS
: > "$R/results.txt"

note() { echo "$1=$2" | tee -a "$R/results.txt"; }

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# torchrun in the background under a hard time limit; sets PID to the pid of `timeout`
# (a child of this shell, so `wait` works; torchrun is its child).
PID=
launch() {
  local log=$1 limit=$2 port
  shift 2
  port=$(free_port)
  timeout -k 10 "$limit" "$PY" -m torch.distributed.run --nproc-per-node "${FAULT_NPROC:-2}" --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$port" "$@" > "$log" 2>&1 &
  PID=$!
}

children() { cat /proc/"$1"/task/*/children 2>/dev/null || true; }

# pid of the first descendant of $1 whose environment has RANK=$2 (a torchrun worker)
worker_pid() {
  local queue=("$1") p c
  while ((${#queue[@]})); do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    for c in $(children "$p"); do
      if tr '\0' '\n' < /proc/"$c"/environ 2>/dev/null | grep -qx "RANK=$2"; then
        echo "$c"
        return 0
      fi
      queue+=("$c")
    done
  done
  return 1
}

wait_for() {  # seconds, command...
  local end=$((SECONDS + $1))
  shift
  while ((SECONDS < end)); do
    if "$@"; then return 0; fi
    sleep 0.05
  done
  return 1
}

final_loss() { grep -E '^loss ' "$1" | tail -1 | awk '{print $4}'; }

kill_phase() {
  local out="$WORK/kill" log="$R/kill.log" start=$SECONDS pid victim rc=0
  # NCCL does not notice a dead peer: rank 0 stays inside its collective until torchrun
  # SIGTERMs it; train.shutdown_grace_s=5 makes it leave 5 s later (instead of torchrun's
  # SIGKILL after 30 s), which also exercises the grace timer on GPU.
  launch "$log" 150 --max-restarts 1 --monitor-interval 0.5 -m train run "${COMMON[@]}" \
    --steps 300 --checkpoint-every 50 --set train.shutdown_grace_s=5 --out "$out"
  pid=$PID
  if ! wait_for 90 test -d "$out/checkpoints/step_00000050"; then
    note kill.error "no checkpoint step_00000050 within 90 s"
    kill "$pid" 2>/dev/null || true
    wait "$pid" || true
    return 1
  fi
  victim=$(worker_pid "$pid" 1) || { note kill.error "rank 1 worker not found"; return 1; }
  kill -9 "$victim"
  local killed_at=$SECONDS
  note kill.killed_rank1_pid "$victim"
  note kill.killed_after_s $((SECONDS - start))
  if wait_for 100 grep -q 'resumed from' "$log"; then
    note kill.kill_to_resumed_s $((SECONDS - killed_at))
  fi
  wait "$pid" || rc=$?
  note kill.torchrun_exit "$rc"
  note kill.restarted "$(grep -c 'resumed from' "$log" || true)"
  note kill.resumed_at_step "$(grep -o 'resumed from .* at step [0-9]*' "$log" | grep -o '[0-9]*$' | head -1)"
  note kill.first_error "$(grep -m1 'error: ' "$log" | cut -c1-160 || true)"
  note kill.grace_timer_fired "$(grep -c 'no checkpoint within' "$log" || true)"
  note kill.latest "$(cat "$out/checkpoints/latest" 2>/dev/null || echo none)"
  note kill.final_loss "$(final_loss "$log")"
  note kill.wall_s $((SECONDS - start))
}

term_phase() {
  local out="$WORK/term" log="$R/term.log" start=$SECONDS pid tr t rc=0 step
  launch "$log" 120 -m train run "${COMMON[@]}" --set train.log_every=1 --steps 100000 --out "$out"
  pid=$PID
  if ! wait_for 90 grep -q 'step     20/' "$log"; then
    note term.error "step 20 not reached within 90 s"
    kill "$pid" 2>/dev/null || true
    wait "$pid" || true
    return 1
  fi
  tr=$(children "$pid" | awk '{print $1}')
  t=$SECONDS
  kill -TERM "$tr"
  wait "$pid" || rc=$?
  note term.torchrun_exit "$rc"
  note term.exit_after_sigterm_s $((SECONDS - t))
  note term.sigterm_seen_by_ranks "$(grep -c 'SIGTERM received' "$log" || true)"
  step=$(grep -o 'preempted: checkpoint written at step [0-9]*' "$log" | grep -o '[0-9]*$' | head -1)
  note term.checkpoint_step "${step:-none}"
  note term.latest "$(cat "$out/checkpoints/latest" 2>/dev/null || echo none)"
  note term.verify "$("$PY" -c "import sys; from train.checkpoint import verify; print(verify(__import__('pathlib').Path(sys.argv[1])) or 'complete')" "$out/checkpoints/step_$(printf %08d "${step:-0}")" 2>&1 | tail -1)"
  note term.grace_timer_fired "$(grep -c 'forcing exit\|no checkpoint within' "$log" || true)"
  if [[ -n "$step" ]] && ((SECONDS - T0 < 65)); then
    local rlog="$R/resume.log" rpid rrc=0
    launch "$rlog" 60 -m train run "${COMMON[@]}" --steps $((step + 20)) --resume --out "$out"
    rpid=$PID
    wait "$rpid" || rrc=$?
    note resume.exit "$rrc"
    note resume.from_step "$(grep -o 'at step [0-9]*' "$rlog" | grep -o '[0-9]*$' | head -1)"
    note resume.latest "$(cat "$out/checkpoints/latest" 2>/dev/null || echo none)"
    note resume.final_loss "$(final_loss "$rlog")"
  else
    note resume.skipped "time budget (elapsed $((SECONDS - T0)) s)"
  fi
  note term.wall_s $((SECONDS - start))
}

"$PY" -c 'import inspect, torch, torch.distributed.launcher.api as a
print("torch", torch.__version__, "gpus", torch.cuda.device_count(),
      "torchrun_shutdown_timeout_supported", "shutdown_timeout" in inspect.signature(a.LaunchConfig).parameters)' \
  | tee "$R/env.txt" || true
# PHASES: which phases to run (default both); FAULT_NPROC: workers (default 2, one per GPU).
case " ${PHASES:-kill term} " in *" kill "*) kill_phase || note kill.phase "FAILED (see kill.log)" ;; esac
case " ${PHASES:-kill term} " in *" term "*) term_phase || note term.phase "FAILED (see term.log)" ;; esac
note total_wall_s $((SECONDS - T0))

{
  echo "fault-tolerance on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) x${FAULT_NPROC:-2}, NCCL"
  printf '%-32s %s\n' "observation" "value"
  printf '%-32s %s\n' "--------------------------------" "-----"
  sed 's/=/ /' "$R/results.txt" | awk '{k=$1; $1=""; printf "%-32s%s\n", k, $0}'
  echo "expected: kill.torchrun_exit 0, kill.restarted 1, kill.resumed_at_step >= 50, kill.latest step_00000300;"
  echo "          term.torchrun_exit 1 (SignalException, by design), term.sigterm_seen_by_ranks 2,"
  echo "          term.verify complete, term.grace_timer_fired 0, resume.exit 0 from term.checkpoint_step"
} | tee "$R/summary.txt"
rm -rf "$WORK"
