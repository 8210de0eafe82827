#!/usr/bin/env bash
# A throwaway single-node Ceph cluster on 127.0.0.1 for tests and benchmarks: 1 monitor, 1 OSD on
# memstore (data in RAM), optionally 1 manager (needed only for `rados df` / `ceph df` numbers).
# Pools of size 1; no authentication unless --cephx (then client.admin's key is in
# DIR/client.admin.keyring, and a user NAME finds its key in DIR/client.NAME.keyring).
# Everything lives under DIR; daemons are stopped by the PIDs they wrote there.
#
#   scripts/ceph-cluster.sh start DIR [--with-mgr] [--cephx] [--osd-bytes BYTES]  prints DIR/ceph.conf
#   scripts/ceph-cluster.sh stop DIR                                       stops what start started
#   scripts/ceph-cluster.sh pause-osd DIR | resume-osd DIR                 for failure tests
#
# The outage tests freeze the OSD (SIGSTOP/SIGCONT) rather than restart it: a memstore OSD
# restarted here sometimes came back with a new identity ("wrong fsid") and without its data.
#
# Use the cluster with `CEPH_CONF=DIR/ceph.conf ceph -s`, `rados -c DIR/ceph.conf ...`.
set -euo pipefail
trap 'echo "ceph-cluster: failed at line $LINENO: $BASH_COMMAND (logs in $dir/log)" >&2' ERR

usage() {
  sed -n '2,12p' "$0" >&2
  exit 2
}
(($# >= 2)) || usage
action=$1
dir=$2
shift 2
conf="$dir/ceph.conf"

# Every ceph CLI call gives up after a few seconds instead of Ceph's default 300 s.
cli() { ceph -c "$conf" --connect-timeout 5 "$@"; }

pid_of() { cat "$dir/run/$1.pid" 2>/dev/null || true; }

# Stops one daemon by its pid file; waits until it has exited (SIGKILL after 60 s: an OSD
# saving its memstore takes a while).
stop_daemon() {
  local pid
  pid=$(pid_of "$1")
  [[ -n "$pid" ]] || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 600); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/run/$1.pid"
}

wait_for() {
  local what=$1 tries=$2
  shift 2
  for _ in $(seq "$tries"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "ceph-cluster: timed out waiting for $what (logs in $dir/log)" >&2
  return 1
}

osd_up() { cli osd stat 2>/dev/null | grep -q "1 up"; }

case "$action" in
start)
  with_mgr=false
  auth=none
  osd_bytes=$((2 << 30))
  while (($#)); do
    case $1 in
    --with-mgr) with_mgr=true ;;
    --cephx) auth=cephx ;;
    --osd-bytes) osd_bytes=$2; shift ;;
    *) usage ;;
    esac
    shift
  done
  [[ ! -e "$conf" ]] || { echo "ceph-cluster: $dir already holds a cluster" >&2; exit 1; }
  mkdir -p "$dir"/{mon,osd,run,log}
  dir=$(cd "$dir" && pwd)
  conf="$dir/ceph.conf"
  # A free port for the monitor, so that clusters of parallel test runs do not collide.
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  fsid=$(cat /proc/sys/kernel/random/uuid)
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = [v1:127.0.0.1:$port]
public addr = 127.0.0.1
ms bind msgr2 = false
auth cluster required = $auth
auth service required = $auth
auth client required = $auth
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
mon allow pool delete = true
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon data avail crit = 1
mon data avail warn = 1
run dir = $dir/run
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
# PG read leases last osd_heartbeat_grace x 0.8 and are renewed every half lease. A one-OSD
# cluster has no peer to report its OSD down, so a frozen OSD (pause-osd) stays up; if it stays
# frozen past its lease, its PGs come back "laggy" and, in Ceph 16 with no replica to ack a
# lease, may never serve again (ops "waiting for readable": ceph/ceph-container#1682, Ceph
# tracker 80404). A long grace keeps test outages (< 24 s) inside the lease.
osd heartbeat grace = 60
mon osd down out interval = 0
[client]
keyring = $dir/\$name.keyring
[mon.a]
mon data = $dir/mon
[mgr.x]
mgr data = $dir/mgr
keyring = $dir/mgr/keyring
[osd.0]
osd data = $dir/osd
keyring = $dir/osd/keyring
osd objectstore = memstore
memstore device bytes = $osd_bytes
EOF
  # An explicit monmap with the v1 address only: the monitor binds exactly that port.
  monmaptool --create --fsid "$fsid" --addv a "[v1:127.0.0.1:$port]" "$dir/monmap" >/dev/null
  keyring=()
  if [[ $auth == cephx ]]; then
    # The monitor's key and client.admin's (all caps); the monitor keeps both from mkfs on.
    ceph-authtool "$dir/mon.keyring" --create-keyring --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool "$dir/client.admin.keyring" --create-keyring --gen-key -n client.admin \
      --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
    ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/client.admin.keyring" >/dev/null
    keyring=(--keyring "$dir/mon.keyring")
  fi
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" "${keyring[@]}" >/dev/null
  ceph-mon -c "$conf" -i a
  wait_for "the monitor" 150 cli mon stat
  # Right after the election the monitor may still refuse commands (EPERM): retry.
  wait_for "the monitor to accept commands" 150 cli osd create
  wait_for "osd.0 in the crush map" 150 cli osd crush add osd.0 1 root=default
  # A fresh memstore OSD sometimes refuses to boot here ("wrong fsid" from the monitor, exit
  # 250) with an all-zero osd fsid after mkfs: make it again, at most three times.
  for attempt in 1 2 3; do
    rm -rf "$dir/osd" && mkdir -p "$dir/osd"
    ceph-osd -c "$conf" -i 0 --mkfs --mkkey --no-mon-config >/dev/null 2>&1
    if [[ $auth == cephx ]]; then
      cli auth del osd.0 >/dev/null 2>&1 || true
      cli auth add osd.0 osd 'allow *' mon 'allow profile osd' mgr 'allow profile osd' \
        -i "$dir/osd/keyring" >/dev/null 2>&1
    fi
    if ceph-osd -c "$conf" -i 0 2>>"$dir/log/osd.0.stderr"; then break; fi
    echo "ceph-cluster: osd.0 did not boot (attempt $attempt)" >>"$dir/log/osd.0.stderr"
    ((attempt < 3)) || { echo "ceph-cluster: osd.0 does not boot (see $dir/log)" >&2; exit 1; }
  done
  wait_for "osd.0 to be up" 300 osd_up
  if $with_mgr; then
    mkdir -p "$dir/mgr"
    if [[ $auth == cephx ]]; then
      cli auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
        -o "$dir/mgr/keyring" >/dev/null 2>&1
    fi
    ceph-mgr -c "$conf" -i x
  fi
  echo "$conf"
  ;;
stop)
  [[ -e "$conf" ]] || exit 0
  stop_daemon mgr.x
  stop_daemon osd.0
  stop_daemon mon.a
  ;;
pause-osd)
  kill -STOP "$(pid_of osd.0)"
  ;;
resume-osd)
  kill -CONT "$(pid_of osd.0)"
  ;;
*) usage ;;
esac
