#!/usr/bin/env bash
# A real Redis Cluster on loopback for the remote tier's tests and benchmarks:
# 3 masters + 3 replicas (Redis 7, Debian's redis-server / redis-tools), ACL on.
#
#   scripts/redis-cluster.sh start DIR [BASE_PORT] [--tls] [--maxmemory SIZE] [--bind IP]
#                        # nodes on 127.0.0.1:BASE_PORT..+5 (default 21100), cluster bus on
#                        # +10000 (keep both below 32768, where the kernel's ephemeral ports start)
#   scripts/redis-cluster.sh stop DIR
#
# --tls: every port (clients, replication, cluster bus) speaks TLS only, and clients must
# present a certificate (mutual TLS). A private CA is made in DIR/tls/ (once per DIR):
# ca.crt, the nodes' node.crt/node.key (IP 127.0.0.1), a client's client.crt/client.key.
# --maxmemory SIZE: each master holds at most SIZE (e.g. 8mb) and evicts with allkeys-lru.
# --bind IP: listen on (and announce) IP instead of 127.0.0.1, e.g. a veth address inside a
# network namespace (run the script there: `ip netns exec NS scripts/redis-cluster.sh ...`);
# the nodes' certificate names IP. Off loopback, clients need --tls.
#
# `start` writes DIR/password (mode 0600, random, kept when DIR already has one) for the ACL user `orbitkv`, whose
# rights are the remote tier's: read and write keys under `okv:`, the cluster's slot map,
# nothing else; the `default` user is kept for the nodes' own replication (its password
# in DIR/admin-password, 0600). It prints the seed addresses (one per line) and exits once
# the cluster reports `cluster_state:ok`. Every node's log and config is under DIR/PORT/.
set -euo pipefail
cmd="${1:-}"
dir="${2:-}"
[[ -n "$cmd" && -n "$dir" ]] || { echo "usage: $0 start|stop DIR [BASE_PORT]" >&2; exit 2; }
base="${3:-21100}"
tls=0
maxmemory=""
bind=127.0.0.1
shift $(($# < 3 ? $# : 3))
while [[ $# -gt 0 ]]; do
    case "$1" in
    --tls) tls=1 ;;
    --maxmemory) maxmemory="${2:?--maxmemory needs a size}"; shift ;;
    --bind) bind="${2:?--bind needs an address}"; shift ;;
    *) echo "redis-cluster: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
ports=()
for i in 0 1 2 3 4 5; do ports+=("$((base + i))"); done

stop() {
    local pidf pid pids=()
    for pidf in "$dir"/*/redis.pid; do
        pid="$(cat "$pidf" 2>/dev/null)" || continue  # a node exiting removes its own
        pids+=("$pid")
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    rm -f "$dir"/*/redis.pid
}

case "$cmd" in
stop)
    stop
    exit 0
    ;;
start) ;;
*)
    echo "usage: $0 start|stop DIR [BASE_PORT]" >&2
    exit 2
    ;;
esac

command -v redis-server >/dev/null && command -v redis-cli >/dev/null \
    || { echo "redis-cluster: needs redis-server and redis-cli (Debian: redis-server redis-tools)" >&2; exit 2; }
mkdir -p "$dir"
umask 077
# Credentials are made once per DIR: a cluster started again in DIR keeps them.
for f in password admin-password; do
    [[ -s "$dir/$f" ]] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/$f"
done
pass="$(cat "$dir/password")"
admin="$(cat "$dir/admin-password")"
cli=(redis-cli -h "$bind")
node_tls=""
if [[ "$tls" == 1 ]]; then
    t="$dir/tls"
    if [[ ! -s "$t/client.crt" ]]; then
        mkdir -p "$t"
        ossl() { openssl "$@" >/dev/null 2>&1 || { echo "redis-cluster: openssl $1 failed" >&2; exit 1; }; }
        ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$t/ca.key"
        ossl req -x509 -new -key "$t/ca.key" -subj /CN=orbitkv-test-ca -days 2 -out "$t/ca.crt"
        printf 'subjectAltName=IP:%s,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' "$bind" >"$t/node.ext"
        printf 'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n' >"$t/client.ext"
        for who in node client; do
            ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$t/$who.key"
            ossl req -new -key "$t/$who.key" -subj "/CN=orbitkv-test-$who" -out "$t/$who.csr"
            ossl x509 -req -in "$t/$who.csr" -CA "$t/ca.crt" -CAkey "$t/ca.key" -CAcreateserial -days 2 \
                -extfile "$t/$who.ext" -out "$t/$who.crt"
        done
    fi
    cli+=(--tls --cacert "$t/ca.crt" --cert "$t/client.crt" --key "$t/client.key")
    node_tls="tls-cert-file $t/node.crt
tls-key-file $t/node.key
tls-ca-cert-file $t/ca.crt
tls-auth-clients yes
tls-cluster yes
tls-replication yes"
fi
# A node whose port is taken fails to bind and exits, and the checks below would then talk
# to whatever holds the port (e.g. a cluster left running by an interrupted test, with
# another password): refuse up front, naming the port.
for p in "${ports[@]}"; do
    for q in "$p" "$((p + 10000))"; do
        if (exec 3<>"/dev/tcp/$bind/$q") 2>/dev/null; then
            echo "redis-cluster: port $q on $bind is already in use (a cluster left running by an" \
                "interrupted test? stop it: pkill -f 'redis-server $bind:$p'); pick another base port" >&2
            exit 1
        fi
    done
done
for p in "${ports[@]}"; do
    mkdir -p "$dir/$p"
    rm -f "$dir/$p/nodes.conf" "$dir/$p/dump.rdb"
    if [[ "$tls" == 1 ]]; then listen="port 0
tls-port $p
$node_tls"; else listen="port $p"; fi
    if [[ -n "$maxmemory" ]]; then limits="maxmemory $maxmemory
maxmemory-policy allkeys-lru"; else limits=""; fi
    cat >"$dir/$p/redis.conf" <<CONF
bind $bind
$listen
$limits
dir $dir/$p
daemonize yes
pidfile $dir/$p/redis.pid
logfile $dir/$p/redis.log
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 2000
cluster-replica-validity-factor 0
repl-diskless-sync-delay 0
appendonly no
save ""
protected-mode yes
masteruser default
masterauth $admin
user default on >$admin ~* &* +@all
user orbitkv on >$pass resetkeys ~okv:* resetchannels -@all +@read +@write +@connection -@dangerous +cluster|slots +cluster|shards +cluster|nodes +cluster|myid +cluster|info +readonly +readwrite +asking
CONF
    redis-server "$dir/$p/redis.conf"
done
for p in "${ports[@]}"; do
    up=0
    for _ in $(seq 400); do
        if REDISCLI_AUTH="$admin" "${cli[@]}" -p "$p" ping >/dev/null 2>&1; then up=1; break; fi
        sleep 0.05
    done
    if [[ "$up" != 1 ]]; then
        echo "redis-cluster: the node on port $p did not start within 20 s; its log:" >&2
        tail -n 20 "$dir/$p/redis.log" >&2 || true
        stop
        exit 1
    fi
done
addrs=()
for p in "${ports[@]}"; do addrs+=("$bind:$p"); done
REDISCLI_AUTH="$admin" "${cli[@]}" --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 \
    || { cat "$dir/create.log" >&2; stop; exit 1; }
# Ready: the cluster says ok and every replica's link to its master is up (a replica that
# never synced could not take over its master's slots).
for _ in $(seq 400); do
    if REDISCLI_AUTH="$admin" "${cli[@]}" -p "${ports[0]}" cluster info 2>/dev/null | grep -q "cluster_state:ok" \
        && [[ "$(for p in "${ports[@]}"; do REDISCLI_AUTH="$admin" "${cli[@]}" -p "$p" info replication; done 2>/dev/null \
            | grep -c "master_link_status:up")" == 3 ]]; then
        printf '%s\n' "${addrs[@]}"
        exit 0
    fi
    sleep 0.05
done
echo "redis-cluster: the cluster did not reach cluster_state:ok (see $dir/*/redis.log)" >&2
stop
exit 1
