# shellcheck shell=bash
# Helpers for launch.sh: the .venv bootstrap and the bookkeeping of the tasks a local cluster starts.
# Sourced by launch.sh (which sets REPO and `set -euo pipefail`); defines functions and globals only.

VENV="$REPO/.venv"
STAMP="$VENV/.ps_trainer-stamp"   # "<file> <sha256>" per requirements file installed; written last
LOCK="$REPO/.venv.lock"            # outside .venv: `venv --clear` must not delete a lock someone holds
LOCK_WAIT_SECS=${PS_TRAINER_LOCK_WAIT_SECS:-900}
PY=""   # the interpreter that runs ps_trainer, set by bootstrap (used by launch.sh)

msg() { printf 'launch.sh: %s\n' "$*" >&2; }
die() { msg "$*"; exit "${DIE_STATUS:-1}"; }

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  else
    "${PYTHON:-python3}" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
  fi
}

# The stamp lines a venv must carry for the wanted requirement set ("runtime" or "dev").
wanted_stamp() {
  printf 'requirements.txt %s\n' "$(sha256_of "$REPO/requirements.txt")"
  if [[ $1 == dev ]]; then
    printf 'requirements-dev.txt %s\n' "$(sha256_of "$REPO/requirements-dev.txt")"
  fi
}

# True when .venv is complete for the wanted set: every wanted line is in the stamp. A dev venv
# therefore also satisfies a runtime request.
venv_ok() {
  local line
  [[ -x $VENV/bin/python && -f $STAMP ]] || return 1
  while IFS= read -r line; do
    grep -qxF -- "$line" "$STAMP" || return 1
  done <<<"$1"
}

# Take an exclusive lock on fd 9 (opened on $LOCK by the caller), waiting at most LOCK_WAIT_SECS.
# flock(1) is util-linux; where it is missing, python's fcntl.flock locks the same open file
# description, which stays locked after that python exits because this shell keeps fd 9 open.
lock_fd9() {
  local wait=$1
  if command -v flock >/dev/null 2>&1; then
    flock -w "$wait" 9
  else
    "${PYTHON:-python3}" - "$wait" <<'EOF'
import fcntl, sys, time
deadline = time.monotonic() + float(sys.argv[1])
while True:
    try:
        fcntl.flock(9, fcntl.LOCK_EX | fcntl.LOCK_NB)
        sys.exit(0)
    except BlockingIOError:
        if time.monotonic() >= deadline:
            sys.exit(1)
        time.sleep(0.5)
EOF
  fi
}

# Make sure $VENV holds the pinned requirements ("runtime", or "dev" = runtime + test runner).
#
# Concurrency: several tasks may start at the same moment on one host. The fast path (stamp matches)
# only reads. Otherwise we take an exclusive flock on $LOCK and re-check, so exactly one process
# installs and the others wait, then find the stamp written and go on.
# Atomicity: a venv cannot be built elsewhere and renamed into place, because it hard-codes its own
# path (console-script shebangs such as .venv/bin/pytest and pip, bin/activate). So we build in
# place under the lock, delete the stamp before touching anything and write it last (tmp + mv). A
# venv without a matching stamp is never used; one without any stamp is rebuilt from scratch.
# shellcheck disable=SC2034  # PY is read by launch.sh
bootstrap() {
  local want_set=$1 want
  if [[ -n ${PS_TRAINER_PYTHON:-} ]]; then   # user-managed environment: no bootstrap
    PY=$PS_TRAINER_PYTHON
    return
  fi
  PY="$VENV/bin/python"
  want=$(wanted_stamp "$want_set")
  venv_ok "$want" && return

  exec 9>>"$LOCK" || die "cannot create the lock file $LOCK (is the repository writable?)"
  if ! lock_fd9 0; then
    msg "waiting up to ${LOCK_WAIT_SECS} s for another launch.sh to finish setting up .venv (lock: $LOCK)"
    lock_fd9 "$LOCK_WAIT_SECS" || die "gave up after ${LOCK_WAIT_SECS} s waiting for the lock $LOCK; is another launch.sh stuck installing?"
  fi
  if venv_ok "$want"; then   # another process finished the install while we waited
    exec 9>&-
    return
  fi

  local base=${PYTHON:-python3} req=requirements.txt log="$VENV/.ps_trainer-install.log"
  [[ $want_set == dev ]] && req=requirements-dev.txt
  # A stamp for other requirements means the venv was complete for those: update it in place (the
  # pins make pip converge). No stamp means unknown state, e.g. a killed install; pip would then
  # take a half-unpacked package for installed (seen: tensorflow listed, tensorflow.python
  # missing), so build it anew.
  local reuse=0
  if [[ -f $STAMP && -x $VENV/bin/python ]] && "$VENV/bin/python" -c 'import pip' 2>/dev/null; then
    reuse=1
  fi
  rm -f "$STAMP"   # from here until the new stamp is written, the venv is "in progress"
  if ((reuse)); then
    msg "updating .venv to $req (changed or not installed yet)…"
  else
    if [[ -e $VENV ]]; then
      msg "rebuilding .venv (an earlier set-up did not finish; ~1-2 min)…"
    else
      msg "setting up .venv (first run, ~1-2 min)…"
    fi
    command -v "$base" >/dev/null 2>&1 || die "$base not found: install Python 3 (or set PYTHON=/path/to/python3)"
    "$base" -m venv --clear "$VENV" \
      || die "'$base -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
  fi
  if ! PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install -r "$REPO/$req" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    die "pip install -r $req failed (full log: $log)"
  fi
  printf '%s\n' "$want" >"$STAMP.tmp.$$"
  mv -f "$STAMP.tmp.$$" "$STAMP"
  exec 9>&-
}

# ---- tasks of a local cluster -------------------------------------------------------------------
# Parallel arrays, one entry per task started by this launcher; TASK_DONE[i] is set once reaped.
# TASK_STARTS[i]: the byte of its log where this run's output begins (a log dir used again keeps
# the earlier runs' output above it).
TASK_NAMES=() TASK_PIDS=() TASK_LOGS=() TASK_STARTS=() TASK_DONE=() TASK_STATUS=()
TAIL_PID=""
TAIL_STATUS=1  # end_tail sets it: 0 once the tail has run to the chief's end.

# PDEATHSIG: if the launcher itself is SIGKILLed (no trap can run), the kernel still TERMs its tasks.
PDEATH=()
if setpriv --help 2>/dev/null | grep -q -- --pdeathsig; then PDEATH=(setpriv --pdeathsig TERM --); fi

# Start one task in the background, stdout+stderr to its log, stdin from /dev/null.
# A log dir used again (a stopped run continued) appends: the stopped run's log is kept above.
start_task() {  # name log cmd...
  local name=$1 log=$2 start=0
  shift 2
  if [[ -s $log ]]; then
    printf '\n----- launch.sh: %s started again, %s -----\n' "$name" "$(date '+%F %T')" >>"$log"
    start=$(stat -c %s "$log")
  fi
  : >>"$log"   # exists now, before the fork opens it: `tail -f` may start on it at once
  "${PDEATH[@]}" "$@" </dev/null >>"$log" 2>&1 &
  TASK_NAMES+=("$name") TASK_PIDS+=("$!") TASK_LOGS+=("$log") TASK_STARTS+=("$start")
  TASK_DONE+=("") TASK_STATUS+=("")
}

# What task $1 wrote in this run (its log from TASK_STARTS on); more tail options may follow
# (-f --pid=...).
this_run_log() {  # task-index [tail options...]
  local i=$1
  shift
  tail -c +"$((TASK_STARTS[i] + 1))" "$@" "${TASK_LOGS[i]}"
}

# True while pid is a live (non-zombie) child of this shell. Checking the parent guards against
# signalling an unrelated process that reused the PID of a task bash has already reaped.
is_live_child() {
  local stat rest state ppid
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  rest=${stat##*) }   # fields after "(comm) ": state ppid ...
  read -r state ppid _ <<<"$rest"
  [[ $ppid == "$$" && $state != Z ]]
}

# Reap finished tasks; record their status. Sets NEWLY_FAILED to the indexes that exited non-zero.
reap_tasks() {
  local i st
  NEWLY_FAILED=()
  for i in "${!TASK_PIDS[@]}"; do
    [[ -z ${TASK_DONE[i]} ]] || continue
    is_live_child "${TASK_PIDS[i]}" && continue
    st=0
    wait "${TASK_PIDS[i]}" 2>/dev/null || st=$?
    TASK_DONE[i]=1 TASK_STATUS[i]=$st
    [[ $st == 0 ]] || NEWLY_FAILED+=("$i")
  done
}

# Names of the tasks still running (space-separated), excluding index $1 if given.
running_tasks() {
  local i out=()
  for i in "${!TASK_PIDS[@]}"; do
    [[ -z ${TASK_DONE[i]} && $i != "${1:-}" ]] && out+=("${TASK_NAMES[i]}")
  done
  echo "${out[*]}"
}

# Signal every task still running ($2, default SIGTERM), wait up to $1 s, then SIGKILL survivors,
# naming each.
stop_tasks() {  # grace-secs [signal, default TERM]
  local grace=$1 sig=${2:-TERM} i deadline
  reap_tasks
  for i in "${!TASK_PIDS[@]}"; do
    [[ -z ${TASK_DONE[i]} ]] && kill -"$sig" "${TASK_PIDS[i]}" 2>/dev/null || true
  done
  deadline=$((SECONDS + grace))
  while [[ -n $(running_tasks) ]] && ((SECONDS < deadline)); do
    sleep 0.2
    reap_tasks
  done
  for i in "${!TASK_PIDS[@]}"; do
    if [[ -z ${TASK_DONE[i]} ]] && is_live_child "${TASK_PIDS[i]}"; then
      msg "${TASK_NAMES[i]} (pid ${TASK_PIDS[i]}) ignored SIG$sig for ${grace} s: sending SIGKILL"
      kill -KILL "${TASK_PIDS[i]}" 2>/dev/null || true
    fi
  done
  reap_tasks
  end_tail
}

# The tail showing the chief's log ends by itself within a second of the chief (it checks --pid once
# a second), after printing the chief's last lines; it gets 3 s, then SIGTERM. Sets TAIL_STATUS: 0 if
# it ran to the end, else its status (143 when stopped here); with no tail running, the last one's
# stays (1 if none started).
end_tail() {
  local deadline=$((SECONDS + 3))
  [[ -n $TAIL_PID ]] || return 0
  while is_live_child "$TAIL_PID" && ((SECONDS < deadline)); do sleep 0.2; done
  if is_live_child "$TAIL_PID"; then kill -TERM "$TAIL_PID" 2>/dev/null || true; fi
  TAIL_STATUS=0
  wait "$TAIL_PID" 2>/dev/null || TAIL_STATUS=$?
  TAIL_PID=""
}
