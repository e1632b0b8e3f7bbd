#!/usr/bin/env bash
# A single-host Slurm 22.05 cluster for the tests: `snakemake --profile slurm` on a laptop/CI box.
#
#   scripts/slurm-cluster.sh install   Debian packages (slurmctld slurmd slurm-client slurmdbd munge
#                                      mariadb-server), when missing
#   scripts/slurm-cluster.sh start     munged, MariaDB + slurmdbd (accounting: the executor plugin
#                                      polls sacct), slurmctld and one slurmd per fake node; idempotent
#   scripts/slurm-cluster.sh stop      kills only the daemons this script started (by their pidfiles)
#   scripts/slurm-cluster.sh status    exit 0 when the cluster answers and its nodes are up
#
# The fake cluster: nodes node1..node$NODES (SlurmdParameters=config_overrides lets each declare
# 64 CPUs, 512000 MB and 8 "h100" GPUs on whatever the machine has; a GPU is a character device,
# /dev/ttyN), partitions `cpu` (default) and `gpu` over all nodes, account `otbuild` for root.
# Jobs really run here, on the CPU; the allocation (nodes, GPUs per node) is what Slurm grants.
# The config is /etc/slurm/slurm.conf (jobs' wrappers drop SLURM_CONF); a slurm.conf that this
# script did not write is never touched. State: /var/lib/otbuild-slurm, logs: /var/log/otbuild-slurm.
set -euo pipefail

NODES=${OTBUILD_SLURM_NODES:-4}
CLUSTER=otbuild
ACCOUNT=otbuild
ETC=/etc/slurm
STATE=/var/lib/otbuild-slurm
RUN=/run/otbuild-slurm
LOGS=/var/log/otbuild-slurm
DB_PORT=3307
MARK="# written by otbuild scripts/slurm-cluster.sh"
PACKAGES="slurmctld slurmd slurm-client slurmdbd munge mariadb-server"
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

die() { echo "slurm-cluster: $*" >&2; exit 1; }

install() {
    local missing=""
    for p in $PACKAGES; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=" $p"
    done
    [ -z "$missing" ] && return 0
    echo "slurm-cluster: installing$missing"
    $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends $missing
}

# pid of a daemon we started, when it is still alive
alive() { local f="$RUN/$1.pid"; [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS WHAT COMMAND...
    local t=$1 what=$2; shift 2
    for _ in $(seq $((t * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    die "$what did not come up in ${t}s (logs: $LOGS)"
}

write_config() {
    if [ -e "$ETC/slurm.conf" ] && ! grep -qF "$MARK" "$ETC/slurm.conf"; then
        die "$ETC/slurm.conf exists and was not written by this script: not touching a real cluster"
    fi
    mkdir -p "$ETC" "$STATE" "$RUN" "$LOGS"
    local host nodes ports=""
    host=$(hostname)
    {
        echo "$MARK"
        echo "ClusterName=$CLUSTER"
        echo "SlurmctldHost=$host(127.0.0.1)"
        echo "SlurmctldPort=16817"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "StateSaveLocation=$STATE/ctld"
        echo "SlurmdSpoolDir=$STATE/slurmd-%n"
        echo "SlurmctldPidFile=$RUN/slurmctld.pid"
        echo "SlurmdPidFile=$RUN/slurmd-%n.pid"
        echo "SlurmctldLogFile=$LOGS/slurmctld.log"
        echo "SlurmdLogFile=$LOGS/slurmd-%n.log"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "MpiDefault=none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core_Memory"
        echo "DefMemPerCPU=1000"
        echo "SlurmdParameters=config_overrides"
        echo "ReturnToService=2"
        echo "SchedulerType=sched/backfill"
        echo "MinJobAge=600"
        echo "KillWait=5"
        echo "InactiveLimit=0"
        echo "GresTypes=gpu"
        echo "AccountingStorageType=accounting_storage/slurmdbd"
        echo "AccountingStorageHost=127.0.0.1"
        echo "AccountingStoragePort=16819"
        echo "AccountingStorageTRES=gres/gpu"
        echo "AccountingStoreFlags=job_comment"
        for i in $(seq "$NODES"); do
            echo "NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=64 RealMemory=512000 Gres=gpu:h100:8 State=UNKNOWN"
        done
        nodes="node[1-$NODES]"
        echo "PartitionName=cpu Nodes=$nodes Default=YES MaxTime=INFINITE State=UP"
        echo "PartitionName=gpu Nodes=$nodes MaxTime=INFINITE State=UP"
    } > "$ETC/slurm.conf.tmp"
    { echo "$MARK"; echo "AutoDetect=off"
      echo "NodeName=node[1-$NODES] Name=gpu Type=h100 File=/dev/tty[0-7]"; } > "$ETC/gres.conf.tmp"
    { echo "$MARK"
      echo "DbdHost=localhost"; echo "DbdAddr=127.0.0.1"; echo "DbdPort=16819"; echo "SlurmUser=root"
      echo "AuthType=auth/munge"; echo "PidFile=$RUN/slurmdbd.pid"; echo "LogFile=$LOGS/slurmdbd.log"
      echo "StorageType=accounting_storage/mysql"; echo "StorageHost=127.0.0.1"
      echo "StoragePort=$DB_PORT"; echo "StorageUser=slurm"; echo "StoragePass=otbuild"
      echo "StorageLoc=slurm_acct_db"; } > "$ETC/slurmdbd.conf.tmp"
    chmod 600 "$ETC/slurmdbd.conf.tmp"
    for f in slurm.conf gres.conf slurmdbd.conf; do
        if cmp -s "$ETC/$f.tmp" "$ETC/$f"; then rm "$ETC/$f.tmp"; else mv "$ETC/$f.tmp" "$ETC/$f"; CHANGED=1; fi
    done
    # torch's rendezvous (and users' scripts) resolve the node names
    grep -qE "^127\.0\.0\.1 .*\bnode1\b" /etc/hosts || \
        echo "127.0.0.1 $(for i in $(seq "$NODES"); do printf 'node%s ' "$i"; done)" >> /etc/hosts
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi  # one is running already
    [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile /etc/munge/munge.key
                                      chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
    mkdir -p /run/munge && chown munge:munge /run/munge
    runuser -u munge -- munged 2>>"$LOGS/munged.log" || true
    wait_for 10 munged sh -c "munge -n | unmunge"
    cp /run/munge/munged.pid "$RUN/munged.pid"  # written by munge's user; ours says we started it
}

start_mariadb() {
    alive mariadb && return 0
    local data="$STATE/mysql"
    if [ ! -d "$data/mysql" ]; then
        mariadb-install-db --user=mysql --datadir="$data" --auth-root-authentication-method=socket \
            --skip-test-db >"$LOGS/mariadb-install.log" 2>&1 || die "mariadb-install-db failed ($LOGS)"
    fi
    mkdir -p "$RUN/mysql" && chown mysql:mysql "$RUN/mysql"
    setsid mariadbd --user=mysql --datadir="$data" --socket="$RUN/mysql/mysqld.sock" --port=$DB_PORT \
        --bind-address=127.0.0.1 --pid-file="$RUN/mysql/mariadb.pid" --skip-log-bin \
        --innodb-buffer-pool-size=32M --log-error="$LOGS/mariadb.log" </dev/null >/dev/null 2>&1 &
    wait_for 30 MariaDB mariadb --socket="$RUN/mysql/mysqld.sock" -e "select 1"
    wait_for 5 "MariaDB's pidfile" test -s "$RUN/mysql/mariadb.pid"
    cp "$RUN/mysql/mariadb.pid" "$RUN/mariadb.pid"
    mariadb --socket="$RUN/mysql/mysqld.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'otbuild';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start_slurm() {
    alive slurmdbd || slurmdbd
    wait_for 30 slurmdbd sacctmgr -n list cluster
    sacctmgr -n list cluster format=cluster | grep -qw "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
    alive slurmctld || slurmctld
    wait_for 30 slurmctld scontrol ping
    for i in $(seq "$NODES"); do
        mkdir -p "$STATE/slurmd-node$i"
        alive "slurmd-node$i" || slurmd -N "node$i"
    done
    wait_for 30 "the nodes" nodes_up
    sacctmgr -n list account format=account | grep -qw "$ACCOUNT" || \
        sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description=otbuild Organization=otbuild >/dev/null
    sacctmgr -n list assoc user=root account="$ACCOUNT" format=user | grep -qw root || \
        sacctmgr -i add user root Account="$ACCOUNT" Cluster="$CLUSTER" >/dev/null
}

nodes_up() {  # every node idle, mixed or allocated (not down/unknown)
    local states
    states=$(sinfo -h -N -p cpu -o "%t" 2>/dev/null) || return 1
    [ "$(grep -cE '^(idle|mix|alloc)' <<<"$states")" -eq "$NODES" ]
}

start() {
    command -v slurmctld >/dev/null || die "not installed: run $0 install"
    [ "$(id -u)" = 0 ] || die "start: the daemons run as root (run as root)"
    CHANGED=0
    write_config
    [ $CHANGED = 1 ] && alive slurmctld && { echo "slurm-cluster: config changed, restarting"; stop; }
    start_munge
    start_mariadb
    start_slurm
    echo "slurm-cluster: up ($NODES nodes, partitions cpu and gpu, account $ACCOUNT)"
}

stop() {
    local names=(slurmd-node* slurmctld slurmdbd mariadb munged) pids=()
    for n in "${names[@]}"; do
        for f in "$RUN"/$n.pid; do
            [ -s "$f" ] || continue
            local p; p=$(cat "$f")
            kill "$p" 2>/dev/null && pids+=("$p")
            rm -f "$f"
        done
    done
    for _ in $(seq 100); do
        local left=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
        [ $left = 0 ] && break
        sleep 0.1
    done
    echo "slurm-cluster: stopped"
}

status() {
    scontrol ping >/dev/null 2>&1 && sacctmgr -n list cluster >/dev/null 2>&1 && nodes_up
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
