# shellcheck shell=bash
# A throwaway single-node Slurm (Debian's slurm-wlm 22.05 + munge) for the orchestration
# benchmark. Source this file, then:
#   slurm_local_start DIR C   -> starts a private munged, slurmctld and slurmd under DIR
#   slurm_local_run N C OUT   -> runs N /bin/true jobs, writes a JSON summary to OUT
#   slurm_local_latency K OUT -> unloaded submit->start latency of K single sbatch jobs, JSON
#   slurm_local_stop          -> stops everything slurm_local_start started (idempotent)
# Follows /work/shared/reference/slurm-localhost.md: munge dirs owned by munge, SlurmUser=root,
# proctrack/linuxproc, task/none, cons_tres with CR_Core, no accounting, state and spool in
# DIR, unused ports, MaxJobCount=100000, OverSubscribe=FORCE:64.
#
# Isolation: munged gets its own socket under DIR (slurm.conf AuthInfo=socket=...), so a
# system munged or another benchmark run is never touched; every daemon runs in the
# foreground as our child, so cleanup kills exactly the PIDs we started.
#
# Concurrency: Slurm must run at most C jobs at once, like Stemma's worker with --cpus C.
# The node is declared with CPUs=C (SlurmdParameters=config_overrides so slurmd accepts C
# even when the machine has fewer cores, just as `stemma-worker --cpus C` does), every job
# asks for exactly one CPU (--ntasks=1 --cpus-per-task=1), and the partition does NOT
# oversubscribe (OverSubscribe=NO instead of the reference's FORCE:64, which would let Slurm
# stack up to 64 jobs per CPU). So the node holds at most C jobs at a time. The run also
# reports the largest overlap actually seen in the jobs' own timestamps (max_concurrent).
#
# Submission: one job array (`sbatch --array=0-(N-1)`), the fastest fair way to hand Slurm
# N identical jobs (one RPC, like Stemma's single `submit -f`; the reference measured
# 35 jobs/s for an array vs 31 for separate sbatch calls). Each task is a bash script that
# records its own start ($EPOCHREALTIME, no fork), runs /bin/true as a child process, and
# records its end. Throughput = N / (last task end - submit start), which slightly favours
# Slurm (its own completion bookkeeping comes after the task's last timestamp).
#
# Tuning in Slurm's favour: SchedulerParameters=batch_sched_delay=0 (default 3 s) lets the
# controller's background loop schedule queued jobs on every pass (about once per second)
# instead of every 3 s; one untimed warm-up job absorbs slurmctld's ~3 s startup before its
# first scheduling pass. Slurm 22.05 still starts queued jobs mostly from that once-a-second
# loop, so with C slots it manages roughly C jobs per second here.
#
# Unloaded latency (slurm_local_latency): after the array, K jobs are submitted one at a time
# with plain `sbatch` (same --ntasks=1 --cpus-per-task=1) to the otherwise idle node. Each job
# script writes its own start time ($EPOCHREALTIME) to a file; the submit time is taken just
# before `sbatch` is invoked (epoch us, no fork). The next job is submitted only once the
# previous one's start file exists (timeout 30 s), so no job waits behind another.
# Latency = job start - submit time.

SL_DIR=""
SL_PIDS=()          # "name:pid" for everything we started, in start order
SL_CONF=""
SL_SOCKET=""

_sl_log() { echo "[slurm] $*"; }

# Prints the tail of each daemon log (the reason a start failed).
slurm_local_logs() {
  local f
  for f in "$SL_DIR"/log/munged.log "$SL_DIR"/log/slurmctld.log "$SL_DIR"/log/slurmd.log \
           "$SL_DIR"/log/*.stderr; do
    [[ -s "$f" ]] || continue
    echo "[slurm] ---- tail of $f"
    tail -n 15 "$f" | sed 's/^/[slurm]   /'
  done
}

_sl_pid_alive() { kill -0 "$1" 2>/dev/null; }

_sl_name_alive() {
  local entry
  for entry in "${SL_PIDS[@]}"; do
    if [[ "${entry%%:*}" == "$1" ]]; then _sl_pid_alive "${entry#*:}" && return 0; fi
  done
  return 1
}

slurm_local_start() {
  SL_DIR=$1
  local C=$2
  local host; host=$(hostname -s)
  mkdir -p "$SL_DIR"/{state,spool,log,ts,munge}
  chmod 755 "$SL_DIR"   # the caller makes the parents reachable for the munge user

  # Packages.
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    _sl_log "installing slurm-wlm and munge"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge \
        >"$SL_DIR/log/apt.log" 2>&1; then
      _sl_log "apt-get install slurm-wlm munge failed:"; tail -n 5 "$SL_DIR/log/apt.log"
      return 1
    fi
  fi

  # munge: key and directories owned by munge; our own socket, pid, seed and log.
  mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
    chmod 400 /etc/munge/munge.key
  fi
  chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge "$SL_DIR/munge"
  chmod 755 "$SL_DIR/munge"   # munged insists that everyone may reach the socket
  SL_SOCKET="$SL_DIR/munge/munge.socket"
  local as_munge=(runuser -u munge --)
  command -v setpriv >/dev/null && as_munge=(setpriv --reuid=munge --regid=munge --init-groups)
  "${as_munge[@]}" munged --foreground --socket="$SL_SOCKET" \
    --pid-file="$SL_DIR/munge/munged.pid" --log-file="$SL_DIR/munge/munged.log" \
    --seed-file="$SL_DIR/munge/munged.seed" --key-file=/etc/munge/munge.key \
    >"$SL_DIR/log/munged.stderr" 2>&1 &
  SL_PIDS+=("munged:$!")
  local i
  for ((i = 0; i < 50; i++)); do
    [[ -S "$SL_SOCKET" ]] && break
    _sl_name_alive munged || break
    sleep 0.1
  done
  ln -sf "$SL_DIR/munge/munged.log" "$SL_DIR/log/munged.log"
  if ! munge -n -S "$SL_SOCKET" 2>/dev/null | unmunge -S "$SL_SOCKET" >/dev/null 2>&1; then
    _sl_log "munged did not start"; slurm_local_logs; return 1
  fi

  # slurm.conf.
  local ports; mapfile -t ports < <(python3 "$(dirname "${BASH_SOURCE[0]}")/bench_stats.py" free-ports 2)
  SL_CONF="$SL_DIR/slurm.conf"
  cat >"$SL_CONF" <<CONF
ClusterName=stemmabench
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${SL_SOCKET}
SlurmctldPort=${ports[0]}
SlurmdPort=${ports[1]}
StateSaveLocation=${SL_DIR}/state
SlurmdSpoolDir=${SL_DIR}/spool
SlurmctldPidFile=${SL_DIR}/slurmctld.pid
SlurmdPidFile=${SL_DIR}/slurmd.pid
SlurmctldLogFile=${SL_DIR}/log/slurmctld.log
SlurmdLogFile=${SL_DIR}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MaxJobCount=100000
MaxArraySize=100001
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${C} State=UNKNOWN
PartitionName=bench Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  export SLURM_CONF="$SL_CONF"

  slurmctld -D -i -f "$SL_CONF" >"$SL_DIR/log/slurmctld.stderr" 2>&1 &
  SL_PIDS+=("slurmctld:$!")
  for ((i = 0; i < 100; i++)); do
    scontrol ping 2>/dev/null | grep -q 'is UP' && break
    _sl_name_alive slurmctld || break
    sleep 0.1
  done
  if ! scontrol ping 2>/dev/null | grep -q 'is UP'; then
    _sl_log "slurmctld did not come up"; slurm_local_logs; return 1
  fi
  slurmd -D -f "$SL_CONF" -N "$host" >"$SL_DIR/log/slurmd.stderr" 2>&1 &
  SL_PIDS+=("slurmd:$!")
  local state=""
  for ((i = 0; i < 200; i++)); do
    state=$(sinfo -h -n "$host" -o '%t' 2>/dev/null | head -n 1)
    [[ "$state" == idle ]] && break
    _sl_name_alive slurmd || break
    sleep 0.1
  done
  if [[ "$state" != idle ]]; then
    _sl_log "node is '${state:-missing}', not idle"; slurm_local_logs
    scontrol show node "$host" 2>&1 | grep -iE 'State|Reason' | sed 's/^/[slurm]   /'
    return 1
  fi
  _sl_log "up: slurmctld :${ports[0]}, slurmd :${ports[1]}, node $host CPUs=$C ($(sinfo -h -o '%P %a %t %c'))"
}

# slurm_local_run N C OUT_JSON
slurm_local_run() {
  local N=$1 C=$2 out=$3
  local ts="$SL_DIR/ts" script="$SL_DIR/job.sh"
  cat >"$script" <<JOB
#!/bin/bash
s=\$EPOCHREALTIME
/bin/true
e=\$EPOCHREALTIME
echo "\$s \$e" > "$ts/\$SLURM_ARRAY_TASK_ID"
JOB
  chmod +x "$script"
  # Untimed warm-up: one job, waited for (absorbs the controller's first scheduling delay).
  # (Polled here: `sbatch --wait` itself polls with a back-off of up to 10 s.)
  local w0=${EPOCHREALTIME/./} wid i
  if ! wid=$(sbatch --parsable --job-name=warmup --chdir="$SL_DIR" --output=/dev/null \
      --wrap=/bin/true 2>"$SL_DIR/log/warmup.err"); then
    _sl_log "warm-up sbatch failed: $(cat "$SL_DIR/log/warmup.err")"; slurm_local_logs; return 1
  fi
  for ((i = 0; i < 600; i++)); do
    [[ -z "$(squeue -h -j "$wid" 2>/dev/null)" ]] && break
    sleep 0.1
  done
  _sl_log "warm-up job done in $(( (${EPOCHREALTIME/./} - w0) / 1000 )) ms"
  local timeout_s=$(( 120 + N ))   # generous: Slurm does ~35 jobs/s here
  local submit_us=${EPOCHREALTIME/./}
  local jobid
  if ! jobid=$(sbatch --parsable --array="0-$((N - 1))" --ntasks=1 --cpus-per-task=1 \
      --job-name=bench --chdir="$SL_DIR" --output=/dev/null \
      --error="$SL_DIR/log/jobs.stderr" --open-mode=append "$script" 2>"$SL_DIR/log/sbatch.err"); then
    _sl_log "sbatch failed: $(cat "$SL_DIR/log/sbatch.err")"; return 1
  fi
  local submitted_us=${EPOCHREALTIME/./}
  _sl_log "submitted array $jobid ($N tasks, node allows $C at once) in $(( (submitted_us - submit_us) / 1000 )) ms"
  shopt -s nullglob
  local files n last_n=-1 last_report=$submit_us now
  while :; do
    files=("$ts"/*); n=${#files[@]}
    now=${EPOCHREALTIME/./}
    (( n >= N )) && break
    if (( now - submit_us > timeout_s * 1000000 )); then
      _sl_log "timed out after ${timeout_s}s with $n/$N jobs done"; break
    fi
    if (( now - last_report >= 5000000 && n != last_n )); then
      _sl_log "$n/$N jobs done after $(( (now - submit_us) / 1000000 )) s"
      last_report=$now; last_n=$n
    fi
    if ! _sl_name_alive slurmctld || ! _sl_name_alive slurmd; then
      _sl_log "a Slurm daemon died with $n/$N jobs done"; slurm_local_logs; break
    fi
    sleep 0.05
  done
  shopt -u nullglob
  local seen_us=$now
  # Let the last tasks finish writing (squeue empties once every task has ended).
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -z "$(squeue -h -r 2>/dev/null)" ]] && break
    sleep 0.1
  done
  _sl_log "all $n/$N job files seen $(( (seen_us - submit_us) / 1000 )) ms after submit"
  [[ -s "$SL_DIR/log/jobs.stderr" ]] && { _sl_log "job stderr:"; head -n 5 "$SL_DIR/log/jobs.stderr"; }
  python3 "$(dirname "${BASH_SOURCE[0]}")/bench_stats.py" slurm "$ts" "$submit_us" "$N" >"$out"
}

# slurm_local_latency K OUT_JSON
slurm_local_latency() {
  local K=$1 out=$2
  local dir="$SL_DIR/lat" script="$SL_DIR/lat-job.sh" pairs="$SL_DIR/lat.pairs"
  mkdir -p "$dir"
  : >"$pairs"
  cat >"$script" <<JOB
#!/bin/bash
s=\$EPOCHREALTIME
echo "\$s" > "$dir/\$1.tmp" && mv "$dir/\$1.tmp" "$dir/\$1"
/bin/true
JOB
  chmod +x "$script"
  # Leftovers of the array (if it timed out) would load the node: cancel them first.
  local i
  if [[ -n "$(squeue -h -r 2>/dev/null)" ]]; then
    _sl_log "latency: cancelling leftover jobs first"
    scancel --quiet --full --user=root 2>/dev/null
    for ((i = 0; i < 100; i++)); do
      [[ -z "$(squeue -h -r 2>/dev/null)" ]] && break
      sleep 0.1
    done
  fi
  local k sub_us start jobid misses=0 t0=${EPOCHREALTIME/./}
  for ((k = 0; k < K; k++)); do
    if ! _sl_name_alive slurmctld || ! _sl_name_alive slurmd; then
      _sl_log "latency: a Slurm daemon died after $k jobs"; slurm_local_logs; break
    fi
    sub_us=${EPOCHREALTIME/./}
    if ! jobid=$(sbatch --parsable --ntasks=1 --cpus-per-task=1 --job-name="lat$k" \
        --chdir="$SL_DIR" --output=/dev/null --error="$SL_DIR/log/lat.stderr" \
        --open-mode=append "$script" "$k" 2>"$SL_DIR/log/lat-sbatch.err"); then
      _sl_log "latency: sbatch $k failed: $(head -c 300 "$SL_DIR/log/lat-sbatch.err")"
      ((++misses >= 2)) && break
      continue
    fi
    start=-
    while (( ${EPOCHREALTIME/./} - sub_us < 30000000 )); do
      if [[ -s "$dir/$k" ]]; then read -r start <"$dir/$k"; break; fi
      sleep 0.005
    done
    echo "$sub_us ${start/./}" >>"$pairs"
    if [[ "$start" == - ]]; then
      _sl_log "latency: job $k ($jobid) did not start within 30 s"
      scancel --quiet "$jobid" 2>/dev/null
      ((++misses >= 2)) && break
      continue
    fi
    # Let it finish so the node is idle again for the next submit.
    for ((i = 0; i < 100; i++)); do
      [[ -z "$(squeue -h -j "$jobid" -t PD,CF,R,CG 2>/dev/null)" ]] && break
      sleep 0.05
    done
  done
  _sl_log "latency: $(wc -l <"$pairs") single jobs submitted one at a time in $(( (${EPOCHREALTIME/./} - t0) / 1000 )) ms"
  python3 "$(dirname "${BASH_SOURCE[0]}")/bench_stats.py" slurm-latency "$pairs" "$K" >"$out"
}

slurm_local_stop() {
  ((${#SL_PIDS[@]})) || return 0
  if [[ -n "$SL_CONF" ]] && _sl_name_alive slurmctld; then
    scancel --quiet --full --user=root 2>/dev/null || true
  fi
  local idx entry pid i
  # Stop in reverse start order: slurmd, slurmctld, munged.
  for ((idx = ${#SL_PIDS[@]} - 1; idx >= 0; idx--)); do
    entry=${SL_PIDS[idx]}; pid=${entry#*:}
    _sl_pid_alive "$pid" || continue
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 50; i++)); do _sl_pid_alive "$pid" || break; sleep 0.1; done
    if _sl_pid_alive "$pid"; then kill -KILL "$pid" 2>/dev/null; fi
    wait "$pid" 2>/dev/null
  done
  SL_PIDS=()
}
