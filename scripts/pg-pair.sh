#!/usr/bin/env bash
# A PostgreSQL primary and its streaming standby, as local processes with their own
# ports and data directories, and the failover between them.
#
#   scripts/pg-pair.sh create DIR PRIMARY_PORT STANDBY_PORT sync|async [UPSTREAM_PORT]
#                                       UPSTREAM_PORT: where the standby streams from, a
#                                       proxy to the primary (default: the primary)
#   scripts/pg-pair.sh failover DIR     the primary killed (`pg_ctl stop -m immediate`),
#                                       the standby promoted; prints its port
#   scripts/pg-pair.sh destroy DIR      both stopped, DIR removed
#
# `sync`: every commit waits until the standby has flushed it (synchronous_commit = on,
# the standby named in synchronous_standby_names), so the promoted standby has every
# commit a client saw succeed. `async`: commits return at once and the standby follows
# as fast as it can; a failover loses what it had not received yet.
#
# Both servers listen on 127.0.0.1 only, trust every local connection (a test pair), and
# run with wal_level = logical, for the log-tailing relay. PostgreSQL refuses to run as
# root: as root, the servers run as the user postgres, which then owns DIR.
set -euo pipefail

log() { printf 'pg-pair: %s\n' "$*" >&2; }

bindir() {
  local dir
  dir=$(pg_config --bindir 2>/dev/null || true)
  if [ -z "$dir" ] || [ ! -x "$dir/pg_ctl" ]; then
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
  fi
  [ -x "$dir/pg_ctl" ] || { log "no PostgreSQL server binaries (pg_ctl) found"; exit 1; }
  printf '%s' "$dir"
}
BIN=$(bindir)

# as_owner CMD...: runs a server command as the user that owns the data.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

psql_at() {
  local port=$1
  shift
  psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -XAtq "$@"
}

wait_until() {
  local what=$1
  shift
  for _ in $(seq 1 300); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  log "timed out waiting for $what"
  return 1
}

standby_streaming() {
  local port=$1 mode=$2 state
  state=$(psql_at "$port" -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming'")
  case "$mode" in
    sync) [ "$state" = sync ] ;;
    *) [ -n "$state" ] ;;
  esac
}

promoted() { [ "$(psql_at "$1" -c 'SELECT pg_is_in_recovery()')" = f ]; }

create() {
  local dir=$1 primary_port=$2 standby_port=$3 mode=$4 upstream_port=${5:-$2}
  case "$mode" in sync | async) ;; *) log "mode: sync or async, not $mode"; exit 2 ;; esac
  if [ -e "$dir/primary" ]; then
    log "$dir already holds a pair: destroy it first"
    exit 1
  fi
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  as_owner "$BIN/initdb" -D "$dir/primary" -U postgres --auth=trust --no-sync >/dev/null
  # fsync = off: the failover kills a server process, not the machine; what the killed
  # server wrote is in the operating system's cache either way, and the pair starts in
  # seconds instead of waiting on the disk.
  cat >>"$dir/primary/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $primary_port
unix_socket_directories = '$dir'
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
max_slot_wal_keep_size = '1GB'
hot_standby = on
fsync = off
shared_buffers = '64MB'
max_connections = 100
wal_keep_size = '256MB'
EOF
  if [ "$mode" = sync ]; then
    echo "synchronous_standby_names = 'standby'" >>"$dir/primary/postgresql.conf"
  fi
  as_owner "$BIN/pg_ctl" -D "$dir/primary" -l "$dir/primary.log" -w start >/dev/null
  as_owner "$BIN/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres \
    -D "$dir/standby" --wal-method=stream --no-sync
  # The standby's own settings win over the copied primary's: its port, where it
  # streams from under which name, and no synchronous standby of its own — once
  # promoted it has none, and a primary waiting for one would hold every commit.
  cat >>"$dir/standby/postgresql.auto.conf" <<EOF
port = $standby_port
primary_conninfo = 'host=127.0.0.1 port=$upstream_port user=postgres application_name=standby'
synchronous_standby_names = ''
EOF
  as_owner touch "$dir/standby/standby.signal"
  as_owner "$BIN/pg_ctl" -D "$dir/standby" -l "$dir/standby.log" -w start >/dev/null
  wait_until "the standby to stream ($mode)" standby_streaming "$primary_port" "$mode"
  log "primary on 127.0.0.1:$primary_port, $mode standby on 127.0.0.1:$standby_port"
}

failover() {
  local dir=$1 standby_port
  standby_port=$(sed -n 's/^port = //p' "$dir/standby/postgresql.auto.conf" | tail -n1)
  if as_owner "$BIN/pg_ctl" -D "$dir/primary" status >/dev/null 2>&1; then
    as_owner "$BIN/pg_ctl" -D "$dir/primary" stop -m immediate >/dev/null
  else
    log "the primary is down already"
  fi
  as_owner "$BIN/pg_ctl" -D "$dir/standby" promote -w >/dev/null
  wait_until "the standby to leave recovery" promoted "$standby_port"
  log "primary killed; the standby on 127.0.0.1:$standby_port is the primary"
  echo "$standby_port"
}

destroy() {
  local dir=$1 node
  for node in primary standby; do
    if [ -f "$dir/$node/postmaster.pid" ]; then
      as_owner "$BIN/pg_ctl" -D "$dir/$node" stop -m immediate >/dev/null 2>&1 || true
    fi
  done
  rm -rf "$dir"
}

case "${1:-}" in
  create) create "${2:?DIR}" "${3:?PRIMARY_PORT}" "${4:?STANDBY_PORT}" "${5:?sync or async}" "${6:-}" ;;
  failover) failover "${2:?DIR}" ;;
  destroy) destroy "${2:?DIR}" ;;
  *) log "usage: $0 create DIR PRIMARY_PORT STANDBY_PORT sync|async [UPSTREAM_PORT] | failover DIR | destroy DIR"; exit 2 ;;
esac
