#!/usr/bin/env bash
# launch.sh: run ps_trainer from a checkout. Sets up <repo>/.venv from the pinned requirements on
# first use, then runs the test suite, a whole cluster on this machine, or one task of a real
# cluster. `./launch.sh --help` for usage.
set -euo pipefail

# The repository is this script's own directory, resolved through symlinks (portable readlink -f).
src=${BASH_SOURCE[0]}
while [[ -L $src ]]; do
  dir=$(cd -P "$(dirname "$src")" && pwd)
  src=$(readlink "$src")
  [[ $src == /* ]] || src=$dir/$src
done
REPO=$(cd -P "$(dirname "$src")" && pwd)
unset src dir
# shellcheck source=tools/launch_lib.sh
source "$REPO/tools/launch_lib.sh"

# Seconds the other tasks get to exit by themselves after the chief has finished.
EXIT_WAIT_SECS=${PS_TRAINER_EXIT_WAIT_SECS:-60}

usage() {
  cat <<'EOF'
Usage:
  ./launch.sh local [--num_ps=N] [--num_workers=M] [--evaluator] [--no_isolate] [--program=FILE.py]
                    [trainer flags...]
      Run a whole cluster on this machine (default 1 PS, 2 workers; worker 0 is the chief and its
      log is shown; --evaluator adds a task scoring each checkpoint into <log_dir>/eval.json).
      --program runs each task as `python FILE.py`, a script of yours that calls
      ps_trainer.run(model_fn, input_fn), instead of `python -m ps_trainer`.
      Each task logs to <log_dir>/logs/<job>-<i>.log; --log_dir defaults to a new
      runs/local-YYYYmmdd-HHMMSS. The tasks run in a private network namespace with loopback only
      (--no_isolate: in this machine's network). Exits with the chief's status; Ctrl-C or SIGTERM
      stops every task after the chief's final checkpoint and leaves no task behind.
  ./launch.sh bench [--rounds=N] [--json] [--bench_dir=DIR] [--no_isolate] [trainer flags...]
      Measure what distribution costs: local mode, 1 PS + 1 worker, the plain TF1 pattern and the
      trainer's bare step (its floor) on the cluster and in one process, in turns (N rounds,
      default 3), then 2 workers async and sync; prints steps/s, examples/s, the ratio to local and
      where a traced step's time goes.
      Default work: the reference MLP on synthetic data (docs/performance.md); trainer flags
      replace parts of it.
  ./launch.sh compare --out_dir=DIR [--num_ps=N] [--num_workers=M] [--target_loss=X] [--no_isolate]
                      [trainer flags...]
      Train the same job async and sync on a local cluster (default 1 PS + 2 workers) and write
      DIR/comparison.md, .json and .png: speed, wall time, final and test loss, accuracy, time and
      steps to a target loss, loss curves, and the async gradient staleness distribution.
  ./launch.sh plan [--num_ps=N] [--num_workers=M] [--format=json] [trainer flags...]
      Show where every variable and table part would go (default 1 PS, 2 workers), the bytes on
      each PS and the bytes a worker moves per step, without starting anything
      (docs/large-models.md). Trainer flags pick the model and data, as for the run.
  ./launch.sh clicks --out_dir=DIR [--train_examples=N] [--test_examples=N] [--vocab=N] [--shards=N]
                     [--dense_dim=D] [--seed=S]
      Write a synthetic click data set for --model=wide_deep --dataset=tfrecord --data_dir=DIR
      (default 200,000 training examples over 200,000 ids in 4 files, 4 dense features, seed 0);
      prints its majority-class rate and the best accuracy any model can reach on it.
  ./launch.sh test [pytest args...]
      Run the test suite (default: all of it, -q) with the dev requirements, on two pytest-xdist
      workers where there are two cores; in one process with -n 0, -x, --pdb, -s or -p no:xdist.
  ./launch.sh [trainer flags...]
      Run one task, e.g. on one host of a real cluster:
        ./launch.sh --job_name=worker --task_index=0 --ps_hosts=h1:2222 --worker_hosts=h2:2222,h3:2222
      Without role flags or TF_CONFIG, trains in a single local process.
  ./launch.sh --help
      This text. Trainer flags: ./launch.sh --helpfull  (= python -m ps_trainer --helpfull);
      a command's own: ./launch.sh bench --help (or local, compare, plan, clicks)

Every mode first makes sure .venv holds requirements.txt (setting it up takes ~1-2 min once; safe
when several launches start at once). Environment: PYTHON (interpreter that creates .venv, default
python3), PS_TRAINER_PYTHON (use this interpreter as is, no .venv), PS_TRAINER_EXIT_WAIT_SECS (local:
how long the other tasks may take to exit after the chief, default 60).
EOF
}

# `./launch.sh local -h`: the local command's own paragraph of the usage, and where the trainer's
# flags it passes on are described, not the usage of every command.
usage_local() {
  echo "Usage:"
  usage | sed -n '/^  \.\/launch\.sh local /,/^  \.\/launch\.sh bench /p' | sed '$d'
  echo
  echo "Trainer flags (passed to every task): ./launch.sh --helpfull"
}

# `python -m ps_trainer` from any working directory: the package is the checkout, not installed.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

run_tests() {
  bootstrap dev
  cd "$REPO"
  (($#)) || set -- -q
  # Two pytest-xdist workers where there are two cores: the multi-process test files run one after
  # another on one of them (tests/xdist_groups.py), the rest on whichever is free. In one process
  # when the user's arguments choose the workers or need one process: a stop at the first failure
  # (a worker would first finish the tests it was handed, minutes of them), a debugger or live
  # output; and with a user-managed Python without pytest-xdist.
  local workers=(-n 2 --dist loadgroup) arg
  for arg in "$@"; do
    case $arg in
      -n* | --numprocesses* | --dist* | -pno:xdist | no:xdist | -x | --exitfirst | --maxfail* | \
        --pdb | --trace | -s | --capture=no) workers=() ;;
    esac
  done
  if ! (($(nproc 2>/dev/null || echo 1) >= 2)) || ! "$PY" -c 'import xdist' 2>/dev/null; then
    workers=()
  fi
  exec "$PY" -m pytest "${workers[@]}" "$@"
}

# Exit 2 with one line unless $2 is an integer >= 1.
check_count() {
  if ! [[ $2 =~ ^[0-9]+$ ]] || ((10#$2 < 1)); then
    DIE_STATUS=2 die "$1 must be an integer >= 1 (got '$2')"
  fi
}

# A fresh runs/local-YYYYmmdd-HHMMSS (with -2, -3... if two launches start in the same second).
new_log_dir() {
  local base n dir
  base="runs/local-$(date +%Y%m%d-%H%M%S)"
  mkdir -p runs || die "cannot create ./runs for the logs (pass --log_dir=DIR)"
  dir=$base
  for n in $(seq 2 100); do
    mkdir "$dir" 2>/dev/null && { echo "$dir"; return; }
    dir=$base-$n
  done
  die "cannot create a new directory $base-* (pass --log_dir=DIR)"
}

# Report tasks reaped with a non-zero status (indexes in NEWLY_FAILED), except the chief. A task
# that stopped on SIGINT/SIGTERM (130/143: someone asked it to) is reported, not a failure; nor is
# a failed evaluator, which training does not need.
report_failures() {
  local i
  for i in "${NEWLY_FAILED[@]}"; do
    [[ $i == "$CHIEF" ]] && continue
    case ${TASK_STATUS[i]} in
      130 | 143) msg "${TASK_NAMES[i]} stopped on a signal (log: ${TASK_LOGS[i]})" ;;
      *) msg "${TASK_NAMES[i]} exited with status ${TASK_STATUS[i]} (log: ${TASK_LOGS[i]})"
         # Training does not depend on the evaluator: it goes on without it.
         [[ ${TASK_NAMES[i]} == evaluator-* ]] || FAILED=1 ;;
    esac
  done
}

# Each task stops by itself on SIGTERM (the chief writes a final checkpoint, the PS tasks wait for
# it) and forces its own exit after 20 s (a PS after 35: it serves a blocked chief's last
# checkpoint, written after the chief's 20; ps_trainer/faults/stops.py); SIGKILL only after that
# (stops.SUPERVISOR_KILL_SECS; tests/test_launch.py holds the two equal).
STOP_GRACE_SECS=40
CHIEF_END_SAID=0  # Set once "chief finished" is said: a signal after does not say it again.
# How to continue a stopped run whose log dir the launcher made: the chief says "the same command
# continues from it", but the same command without --log_dir starts a new run in a new directory.
CONTINUE_HINT=""

say_how_to_continue() {  # the chief's exit status
  case $1 in
    130 | 143) [[ -z $CONTINUE_HINT ]] || msg "$CONTINUE_HINT" ;;
  esac
}

on_signal() {  # name exit-status
  trap - INT TERM
  local note=""
  [[ -n ${CHIEF:-} && -z ${TASK_DONE[CHIEF]:-} ]] && note=" (the chief writes a final checkpoint first)"
  msg "got SIG$1: stopping $(running_tasks)$note"
  stop_tasks "$STOP_GRACE_SECS" "$1"   # The same signal: Ctrl-C reads as SIGINT in their logs.
  # Unless the tail showing the chief's log ran to the chief's end (the signal may have come before
  # the tail started, or ended it), repeat the chief's word on where to continue.
  if [[ -n ${CHIEF:-} && -n ${TASK_STARTS[CHIEF]:-} ]] && ((TAIL_STATUS != 0)); then
    this_run_log "$CHIEF" | grep -a "the same command continues from it" | tail -n 1 || true
  fi
  [[ -z ${CHIEF:-} ]] || say_how_to_continue "${TASK_STATUS[CHIEF]:-}"
  # A chief that exits 0 finished the run (the signal came as it ended, or after): as without one,
  # the launcher's status is the chief's.
  if [[ -n ${CHIEF:-} && ${TASK_STATUS[CHIEF]:-} == 0 ]]; then
    ((CHIEF_END_SAID)) || msg "chief finished; result: $log_dir/result.json"
    exit 0
  fi
  exit "$2"
}

# Re-runs this launcher in a private network namespace with loopback only, so that no other host
# can reach the tasks' servers (they bind every interface and run any graph they are sent). As
# root `unshare -n`; otherwise in an unprivileged user namespace where the kernel allows it; else
# one line says so and the run goes on unisolated. $@: the subcommand and its original arguments.
isolate_network() {
  local how=() err
  if [[ -n ${PS_TRAINER_IN_NETNS:-} ]]; then   # inside already: bring loopback up
    if command -v ip >/dev/null 2>&1; then
      ip link set lo up || die "cannot bring up loopback in the private network namespace"
    else
      "$PY" -c 'import fcntl, socket, struct
s = socket.socket(); req = struct.pack("16sH", b"lo", 0)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, req))[1]  # SIOCGIFFLAGS
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP' \
        || die "cannot bring up loopback in the private network namespace"
    fi
    # Said by the caller once its input is checked: a mistake stays the only line.
    NETNS_NOTE="the tasks run in a private network namespace (loopback only): no other host can reach them"
    return
  fi
  if ! command -v unshare >/dev/null 2>&1; then
    err="unshare (util-linux) is not installed"
  elif err=$(unshare -n true 2>&1); then
    how=(unshare -n)
  elif err=$(unshare -rn true 2>&1); then
    how=(unshare -rn)
  fi
  if ((${#how[@]})); then
    PS_TRAINER_IN_NETNS=1 exec "${how[@]}" -- "$BASH" "$REPO/launch.sh" "$@"
  fi
  msg "cannot isolate the tasks in a private network namespace (${err:-unshare failed}); their servers listen on every interface of this machine without authentication (README: Security; --no_isolate hides this line)"
}

run_local() {
  local num_ps=1 num_workers=2 log_dir="" isolate=1 evaluator=0 args=() i original=("$@")
  local program=(-m ps_trainer)
  while (($#)); do
    # The launcher builds the cluster itself; a user's cluster flags would silently fight it.
    if [[ $1 =~ ^--?(no)?(ps_hosts|worker_hosts|job_name|task_index)(=|$) ]]; then
      DIE_STATUS=2 die "local builds the cluster itself: drop ${1%%=*} (use --num_ps/--num_workers; for one task of a real cluster run ./launch.sh without 'local')"
    fi
    case $1 in
      --num_ps=*) num_ps=${1#*=} ;;
      --num_workers=*) num_workers=${1#*=} ;;
      --log_dir=*) log_dir=${1#*=} ;;
      --no_isolate) isolate=0 ;;
      --evaluator) evaluator=1 ;;
      --program=*)
        program=("${1#*=}")
        [[ -f ${program[0]} ]] || DIE_STATUS=2 die "--program=${program[0]}: no such file" ;;
      --evaluator=* | --no_isolate=*)
        DIE_STATUS=2 die "${1%%=*} takes no value (got $1): pass ${1%%=*} to turn it on, nothing to leave it off" ;;
      --num_ps | --num_workers | --log_dir)
        (($# >= 2)) || DIE_STATUS=2 die "$1 needs a value"
        case $1 in
          --num_ps) num_ps=$2 ;;
          --num_workers) num_workers=$2 ;;
          --log_dir) log_dir=$2 ;;
        esac
        shift ;;
      -h | -\? | --help | --help*) usage_local; exit 0 ;;
      --) args+=("$@"); break ;;
      *) args+=("$1") ;;
    esac
    shift
  done
  check_count --num_ps "$num_ps"
  check_count --num_workers "$num_workers"
  num_ps=$((10#$num_ps)) num_workers=$((10#$num_workers))

  bootstrap runtime   # before isolating: it may need the network
  if ((isolate)); then
    isolate_network local "${original[@]}"
  fi
  local made_log_dir=0 status=0
  if [[ -z $log_dir ]]; then
    log_dir=$(new_log_dir)
    made_log_dir=1
    local given=""
    ((${#original[@]} == 0)) || given=$(printf '%q ' "${original[@]}")
    CONTINUE_HINT="to continue this run: ./launch.sh local ${given}--log_dir=$(printf '%q' "$log_dir") (the same command without --log_dir starts a new run)"
  fi
  local ports ps_hosts="" worker_hosts=""
  read -r -a ports < <(free_ports $((num_ps + num_workers)))
  ((${#ports[@]} == num_ps + num_workers)) || die "could not pick $((num_ps + num_workers)) free ports"
  for ((i = 0; i < num_ps; i++)); do ps_hosts+="${ps_hosts:+,}127.0.0.1:${ports[i]}"; done
  for ((i = 0; i < num_workers; i++)); do worker_hosts+="${worker_hosts:+,}127.0.0.1:${ports[num_ps + i]}"; done
  local common=(--ps_hosts="$ps_hosts" --worker_hosts="$worker_hosts" --log_dir="$log_dir")
  if [[ -n ${TF_CONFIG:-} ]]; then
    msg "ignoring TF_CONFIG: the local cluster is given by flags"
    unset TF_CONFIG
  fi

  # The chief's command line and the data it reads whole, checked before any task starts (nothing
  # loads TensorFlow): a mistake is one line from the trainer and exit 2, with no cluster started
  # and no log dir left behind.
  PS_TRAINER_CHECK_ONLY=1 "$PY" "${program[@]}" --job_name=worker --task_index=0 \
    "${common[@]}" "${args[@]}" || status=$?
  if ((status)); then
    if ((made_log_dir)); then rmdir "$log_dir" 2>/dev/null || true; fi
    exit "$status"
  fi
  mkdir -p "$log_dir/logs" 2>/dev/null || DIE_STATUS=2 die "cannot create --log_dir=$log_dir/logs"
  [[ -z ${NETNS_NOTE:-} ]] || msg "$NETNS_NOTE"

  trap 'on_signal INT 130' INT
  trap 'on_signal TERM 143' TERM
  trap 'stop_tasks 2' EXIT   # also on an unexpected error: leave no task behind
  for ((i = 0; i < num_ps; i++)); do
    start_task "ps-$i" "$log_dir/logs/ps-$i.log" \
      "$PY" "${program[@]}" --job_name=ps --task_index="$i" "${common[@]}" "${args[@]}"
  done
  CHIEF=${#TASK_PIDS[@]}
  for ((i = 0; i < num_workers; i++)); do
    start_task "worker-$i" "$log_dir/logs/worker-$i.log" \
      "$PY" "${program[@]}" --job_name=worker --task_index="$i" "${common[@]}" "${args[@]}"
  done
  if ((evaluator)); then
    start_task "evaluator-0" "$log_dir/logs/evaluator-0.log" \
      "$PY" "${program[@]}" --job_name=evaluator --task_index=0 "${common[@]}" "${args[@]}"
  fi
  msg "local cluster: ps $ps_hosts; workers $worker_hosts (worker-0 is the chief, its log follows); logs in $log_dir/logs/"
  # this_run_log -f, as a simple command: $! is then tail itself, which end_tail waits for.
  tail -c +"$((TASK_STARTS[CHIEF] + 1))" -f --pid="${TASK_PIDS[CHIEF]}" "${TASK_LOGS[CHIEF]}" &
  TAIL_PID=$!

  wait_for_chief
  local chief_status=${TASK_STATUS[CHIEF]}
  if [[ $chief_status == 0 ]]; then
    msg "chief finished; result: $log_dir/result.json"
    CHIEF_END_SAID=1
  else
    msg "chief (worker-0) exited with status $chief_status (log: ${TASK_LOGS[CHIEF]})"
    say_how_to_continue "$chief_status"
  fi
  local rest
  rest=$(running_tasks)
  if [[ $chief_status == 2 && -n $rest ]]; then
    # It ended on bad input (a log dir of another model, found once its graph is built; a bad
    # record met in training): the others would wait for it or meet the same input, so stop them.
    msg "stopping $rest: the chief ended on bad input (status 2)"
    stop_tasks "$STOP_GRACE_SECS"
  else
    # Shorter if the chief failed: then nobody may tell the PS tasks to stop.
    wait_for_the_rest $((chief_status == 0 ? EXIT_WAIT_SECS : (EXIT_WAIT_SECS < 10 ? EXIT_WAIT_SECS : 10)))
  fi
  if ((evaluator)) && [[ -f $log_dir/eval.json ]]; then
    msg "evaluator: scores in $log_dir/eval.json (its log: $log_dir/logs/evaluator-0.log)"
  fi
  exit "$chief_status"
}

# bench and compare start many local clusters; they run in one private network namespace (as
# `local` does), so the clusters inside need no isolation of their own.
run_experiment() {
  local what=$1 arg isolate=1
  shift
  for arg in "$@"; do
    case $arg in
      --no_isolate) isolate=0 ;;
      # The command's own help (its flags and what it does), not this script's whole usage.
      -h | -\? | --help | --help*) isolate=0 ;;
      --) break ;;
    esac
  done
  bootstrap runtime
  ((isolate)) && isolate_network "$what" "$@"
  # The command says it once its flags are checked (experiments/runs.py): a mistake stays one line.
  [[ -z ${NETNS_NOTE:-} ]] || export PS_TRAINER_LAUNCHER_NOTE="launch.sh: $NETNS_NOTE"
  local args=()
  for arg in "$@"; do [[ $arg == --no_isolate ]] || args+=("$arg"); done
  exec "$PY" -m "ps_trainer.experiments.$what" "${args[@]}"
}

# Distinct free ports, by the trainer's own picker (ps_trainer/settings/host_ports.py).
free_ports() {
  "$PY" -c 'import sys
from ps_trainer.settings import host_ports
print(*host_ports.free_ports(int(sys.argv[1])))' "$1"
}

# Polls until the chief ends (a foreground `sleep` keeps traps responsive), then lets tail print
# its last lines. A non-chief task that fails means the run cannot finish as asked (a lost PS or,
# in sync mode, a lost replica blocks the chief), so stop everything rather than hang.
wait_for_chief() {
  FAILED=0
  while :; do
    reap_tasks
    report_failures
    [[ -n ${TASK_DONE[CHIEF]} ]] && break
    if ((FAILED)); then
      msg "stopping the cluster: a task failed before the chief finished"
      stop_tasks "$STOP_GRACE_SECS"
      exit 1
    fi
    sleep 0.5
  done
  end_tail
}

# PS tasks exit once every worker has reported done; the other workers once training ends. Gives
# them $1 seconds, then SIGTERM.
wait_for_the_rest() {
  local bound=$1 announce=$((SECONDS + 3)) deadline=$((SECONDS + $1))
  while [[ -n $(running_tasks) ]] && ((SECONDS < deadline)); do
    if ((announce && SECONDS >= announce)); then
      msg "waiting up to $((deadline - SECONDS)) s more (${bound} s from the chief's end) for $(running_tasks) to exit"
      announce=0
    fi
    sleep 0.5
    reap_tasks
    report_failures
  done
  if [[ -n $(running_tasks) ]]; then
    msg "still running ${bound} s after the chief ended: $(running_tasks); sending SIGTERM"
    stop_tasks "$STOP_GRACE_SECS"
  fi
}

case "${1:-}" in
  -h | --help | help) usage ;;
  test) shift; run_tests "$@" ;;
  local) shift; run_local "$@" ;;
  bench | compare) run_experiment "$@" ;;
  plan) shift; bootstrap runtime; exec "$PY" -m ps_trainer.plan_main "$@" ;;
  clicks) shift; bootstrap runtime; exec "$PY" -m ps_trainer.datasets.clicks "$@" ;;
  -* | "")
    # One task: exec, so the trainer's PID is this script's (signals from a scheduler reach it).
    bootstrap runtime
    exec "$PY" -m ps_trainer "$@" ;;
  *)
    DIE_STATUS=2 die "unknown command '$1': the commands are local, bench, compare, plan, clicks," \
      "test and help; for one task, pass only trainer --flags (./launch.sh --help)" ;;
esac
