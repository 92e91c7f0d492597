#!/usr/bin/env bash
# scripts/services.sh — bring up the local services the ubgo/lock backend
# tests talk to (PostgreSQL, Redis, etcd) on a Debian 12 machine where we are
# root. Idempotent: if everything is already up it only checks and exits.
#
# Usage:
#   scripts/services.sh [up]                    bring up postgres, redis and etcd
#   scripts/services.sh up postgres|redis|etcd  bring up just one (several allowed)
#   scripts/services.sh status                  print "<service>: up|down" for each
#                                               (exit 0 if all managed ones are up)
#   scripts/services.sh etcd-bin                print the etcd binary path (installs
#                                               etcd-server if needed)
#
# Endpoints (loopback only):
#   postgres  127.0.0.1:5432  user postgres, trust auth, database "test"
#   redis     127.0.0.1:6379
#   etcd      127.0.0.1:2379 (client), 127.0.0.1:2380 (peer)
#
# If LOCK_TEST_POSTGRES_DSN / LOCK_TEST_REDIS_ADDR / LOCK_TEST_ETCD_ENDPOINTS
# point somewhere other than the defaults above, that service is not managed.
#
# Status lines go to stderr; only `status` and `etcd-bin` write to stdout.
# Daemons are started with all stdio redirected to files so they never hold a
# pipe of the caller open (which would hang `$(...)` or Go's exec.Cmd.Wait).

set -euo pipefail

PG_HOST=127.0.0.1
PG_PORT=5432
PG_DB=test
REDIS_PORT=6379
ETCD_CLIENT_PORT=2379
ETCD_PEER_PORT=2380
ETCD_DATA_DIR=/var/lib/ubgo-lock-etcd
ETCD_LOG=/var/log/ubgo-lock-etcd.log
ETCD_PID_FILE=/run/ubgo-lock-etcd.pid
REDIS_DIR=/var/lib/redis
REDIS_LOG_DIR=/var/log/redis
APT_LOG=/var/log/ubgo-lock-services-apt.log
LOCK_FILE=/run/ubgo-lock-services.lock

APT_UPDATED=0
ETCD_BIN=""

log() { printf '%s\n' "$*" >&2; }
die() { printf 'services.sh: error: %s\n' "$*" >&2; exit 1; }

# Serialise concurrent invocations (e.g. parallel test packages). fd 9 must be
# closed (9>&-) for every long-lived child, or the daemon would keep the lock.
take_lock() {
	exec 9>"$LOCK_FILE" || die "cannot open lock file $LOCK_FILE"
	flock -w 900 9 || die "timed out waiting for $LOCK_FILE"
}

# tcp_open PORT — is something accepting connections on 127.0.0.1:PORT?
tcp_open() {
	timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# ---------------------------------------------------------------- apt helpers

wait_for_apt() {
	local i=0
	while pgrep -x 'apt-get|apt|dpkg|aptitude|unattended-upgr' >/dev/null 2>&1; do
		if ((i == 0)); then log "apt: another apt/dpkg process is running, waiting for it"; fi
		i=$((i + 1))
		((i > 1800)) && die "apt/dpkg still busy after 15 minutes"
		sleep 0.5
	done
}

apt_install() {
	local rc=0
	wait_for_apt
	if ((APT_UPDATED == 0)); then
		log "apt: apt-get update (log: $APT_LOG)"
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -q \
			</dev/null >>"$APT_LOG" 2>&1 9>&- ||
			log "apt: warning: apt-get update failed (see $APT_LOG), trying install anyway"
		APT_UPDATED=1
	fi
	log "apt: installing $* (log: $APT_LOG)"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@" \
		</dev/null >>"$APT_LOG" 2>&1 9>&- || rc=$?
	if ((rc != 0)); then
		tail -n 20 "$APT_LOG" >&2 || true
		die "apt-get install $* failed (exit $rc)"
	fi
}

# ------------------------------------------------------ endpoint override logic

# is_local_hostport HOST PORT DEFAULT_PORT
is_local_hostport() {
	local host=$1 port=$2 def=$3
	host=${host#[}
	host=${host%]}
	case "$host" in
	"" | 127.0.0.1 | localhost | ::1 | /*) ;; # /* = unix socket dir on this machine
	*) return 1 ;;
	esac
	[[ -z "$port" || "$port" == "$def" ]]
}

# split_hostport "h:p" → sets HP_HOST / HP_PORT (handles [v6]:port)
split_hostport() {
	local hp=$1
	HP_HOST=$hp HP_PORT=""
	if [[ "$hp" =~ ^\[([^]]*)\](:([0-9]*))?$ ]]; then
		HP_HOST=${BASH_REMATCH[1]} HP_PORT=${BASH_REMATCH[3]}
	elif [[ "$hp" =~ ^([^:]*):([0-9]*)$ ]]; then
		HP_HOST=${BASH_REMATCH[1]} HP_PORT=${BASH_REMATCH[2]}
	fi
}

postgres_external() {
	local dsn=${LOCK_TEST_POSTGRES_DSN:-} rest host="" port=""
	[[ -z "$dsn" ]] && return 1
	if [[ "$dsn" =~ ^postgres(ql)?:// ]]; then
		rest=${dsn#*://}
		rest=${rest%%[/?]*} # authority
		rest=${rest##*@}    # drop userinfo
		split_hostport "$rest"
		host=$HP_HOST port=$HP_PORT
	else
		[[ "$dsn" =~ (^|[[:space:]])host=([^[:space:]]*) ]] && host=${BASH_REMATCH[2]}
		[[ "$dsn" =~ (^|[[:space:]])port=([^[:space:]]*) ]] && port=${BASH_REMATCH[2]}
		host=${host//\'/} port=${port//\'/}
	fi
	! is_local_hostport "$host" "$port" "$PG_PORT"
}

redis_external() {
	local addr=${LOCK_TEST_REDIS_ADDR:-}
	[[ -z "$addr" ]] && return 1
	addr=${addr#redis://}
	addr=${addr##*@}
	addr=${addr%%/*}
	split_hostport "$addr"
	! is_local_hostport "$HP_HOST" "$HP_PORT" "$REDIS_PORT"
}

etcd_external() {
	local eps=${LOCK_TEST_ETCD_ENDPOINTS:-} ep
	[[ -z "$eps" ]] && return 1
	local -a _eps
	IFS=', ' read -r -a _eps <<<"$eps"
	for ep in "${_eps[@]}"; do
		[[ -z "$ep" ]] && continue
		ep=${ep#http://}
		ep=${ep%/}
		split_hostport "$ep"
		is_local_hostport "$HP_HOST" "$HP_PORT" "$ETCD_CLIENT_PORT" || return 0
	done
	return 1
}

# ------------------------------------------------------------------ postgres

pg_ready() {
	if command -v pg_isready >/dev/null 2>&1; then
		pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 2 >/dev/null 2>&1
	else
		tcp_open "$PG_PORT"
	fi
}

# pg_psql DB SQL — run SQL over TCP as postgres without any password source.
pg_psql() {
	env -u PGPASSWORD -u PGSERVICE PGPASSFILE=/dev/null PGCONNECT_TIMEOUT=5 \
		psql -X -w -h "$PG_HOST" -p "$PG_PORT" -U postgres -d "$1" -v ON_ERROR_STOP=1 -tAc "$2" </dev/null
}

pg_cluster_version() {
	[[ -d /etc/postgresql ]] || return 1
	local v
	v=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
	[[ -n "$v" && -d "/etc/postgresql/$v/main" ]] || return 1
	printf '%s\n' "$v"
}

pg_wait_ready() {
	local i
	for ((i = 0; i < 150; i++)); do
		pg_ready && return 0
		sleep 0.2
	done
	return 1
}

pg_start_cluster() {
	local ver=$1 out rc=0
	out=$(mktemp)
	pg_ctlcluster --skip-systemctl-redirect "$ver" main start </dev/null >"$out" 2>&1 9>&- || rc=$?
	if ((rc != 0)) && ! pg_wait_ready; then
		cat "$out" >&2
		rm -f "$out"
		die "postgres: pg_ctlcluster $ver main start failed (exit $rc)"
	fi
	rm -f "$out"
	pg_wait_ready || die "postgres: cluster $ver/main started but 127.0.0.1:$PG_PORT is not accepting connections (check 'port' in /etc/postgresql/$ver/main/postgresql.conf)"
}

# Make 127.0.0.1 / ::1 trust auth work: prepend trust rules to pg_hba.conf
# (first match wins) and reload.
pg_fix_trust() {
	local hba ver
	hba=$(runuser -u postgres -- psql -X -tAc 'SHOW hba_file' </dev/null 2>/dev/null) || hba=""
	if [[ -z "$hba" ]] && ver=$(pg_cluster_version); then
		hba=/etc/postgresql/$ver/main/pg_hba.conf
	fi
	[[ -n "$hba" && -f "$hba" ]] || die "postgres: trust auth for postgres@127.0.0.1 does not work and pg_hba.conf was not found"
	if ! grep -q 'ubgo/lock services.sh' "$hba"; then
		log "postgres: enabling trust auth for 127.0.0.1 and ::1 in $hba"
		sed -i '1i # added by ubgo/lock scripts/services.sh: trust loopback TCP for tests\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
	fi
	if ! runuser -u postgres -- psql -X -tAc 'SELECT pg_reload_conf()' </dev/null >/dev/null 2>&1; then
		ver=$(pg_cluster_version) || die "postgres: cannot reload configuration"
		pg_ctlcluster --skip-systemctl-redirect "$ver" main reload </dev/null >/dev/null 2>&1 9>&- ||
			die "postgres: reload of cluster $ver/main failed"
	fi
	sleep 0.3
	pg_psql postgres 'SELECT 1' >/dev/null 2>&1 ||
		die "postgres: trust auth for postgres@127.0.0.1:$PG_PORT still fails after editing $hba"
}

pg_ensure_db() {
	if ! command -v psql >/dev/null 2>&1; then
		log "postgres: psql not installed, cannot verify database '$PG_DB'"
		return 0
	fi
	if ! pg_psql postgres 'SELECT 1' >/dev/null 2>&1; then
		pg_fix_trust
	fi
	local have
	have=$(pg_psql postgres "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" 2>/dev/null) ||
		die "postgres: cannot query pg_database as postgres@127.0.0.1:$PG_PORT"
	if [[ "$have" != 1 ]]; then
		pg_psql postgres "CREATE DATABASE \"$PG_DB\"" >/dev/null ||
			die "postgres: creating database '$PG_DB' failed"
		log "postgres: created database '$PG_DB'"
	fi
}

# pglock's scale test holds 10,000 advisory locks at once, and other tests
# hold more beside it; the default shared lock table (64 per connection ×
# 100 connections) has room for 6,400. Raise it once (a restart; it persists
# in postgresql.auto.conf, so later runs find it done).
PG_MIN_LOCKS=256
pg_tune() {
	command -v psql >/dev/null 2>&1 || return 0
	local have ver
	have=$(pg_psql postgres 'SHOW max_locks_per_transaction' 2>/dev/null) || return 0
	((have >= PG_MIN_LOCKS)) && return 0
	log "postgres: raising max_locks_per_transaction from $have to $PG_MIN_LOCKS (restarts the server)"
	pg_psql postgres "ALTER SYSTEM SET max_locks_per_transaction = $PG_MIN_LOCKS" >/dev/null ||
		die "postgres: ALTER SYSTEM SET max_locks_per_transaction failed"
	ver=$(pg_cluster_version) || die "postgres: no cluster found to restart"
	pg_ctlcluster --skip-systemctl-redirect "$ver" main restart </dev/null >/dev/null 2>&1 9>&- ||
		die "postgres: restart of cluster $ver/main failed"
	pg_wait_ready || die "postgres: not accepting connections after the restart"
}

up_postgres() {
	if postgres_external; then
		log "postgres: LOCK_TEST_POSTGRES_DSN points elsewhere, not managing"
		return 0
	fi
	local ver
	if pg_ready; then
		pg_ensure_db
		pg_tune
		log "postgres: already running"
		return 0
	fi
	if tcp_open "$PG_PORT" && command -v pg_isready >/dev/null 2>&1; then
		# Something is listening but not ready: maybe starting up.
		pg_wait_ready || die "postgres: 127.0.0.1:$PG_PORT is in use but not accepting connections"
		pg_ensure_db
		pg_tune
		log "postgres: already running"
		return 0
	fi
	if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! pg_cluster_version >/dev/null; then
		if ! command -v pg_ctlcluster >/dev/null 2>&1 || [[ -z "$(ls /usr/lib/postgresql 2>/dev/null)" ]]; then
			apt_install postgresql
		fi
		if ! pg_cluster_version >/dev/null; then
			ver=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
			[[ -n "$ver" ]] || die "postgres: no PostgreSQL server version found under /usr/lib/postgresql"
			log "postgres: creating cluster $ver/main"
			pg_createcluster "$ver" main </dev/null >/dev/null 2>&1 9>&- ||
				die "postgres: pg_createcluster $ver main failed"
		fi
	fi
	ver=$(pg_cluster_version) || die "postgres: no cluster found under /etc/postgresql"
	pg_start_cluster "$ver"
	pg_ensure_db
	pg_tune
	log "postgres: started (cluster $ver/main)"
}

# --------------------------------------------------------------------- redis

redis_ping() {
	local reply
	if command -v redis-cli >/dev/null 2>&1; then
		reply=$(timeout 3 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping </dev/null 2>/dev/null) || return 1
	else
		reply=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$REDIS_PORT; printf 'PING\r\n' >&3; head -n 1 <&3" 2>/dev/null) || return 1
	fi
	[[ "$reply" == *PONG* ]]
}

up_redis() {
	if redis_external; then
		log "redis: LOCK_TEST_REDIS_ADDR points elsewhere, not managing"
		return 0
	fi
	if redis_ping; then
		log "redis: already running"
		return 0
	fi
	tcp_open "$REDIS_PORT" && die "redis: 127.0.0.1:$REDIS_PORT is in use but does not answer PING with PONG"
	command -v redis-server >/dev/null 2>&1 || apt_install redis-server
	mkdir -p "$REDIS_DIR" "$REDIS_LOG_DIR"
	local out rc=0 i
	out=$(mktemp)
	redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" \
		--save "" --appendonly no --dir "$REDIS_DIR" --logfile "$REDIS_LOG_DIR/ci.log" \
		</dev/null >"$out" 2>&1 9>&- || rc=$?
	if ((rc != 0)); then
		cat "$out" >&2
		rm -f "$out"
		die "redis: redis-server failed to start (exit $rc)"
	fi
	rm -f "$out"
	for ((i = 0; i < 75; i++)); do
		if redis_ping; then
			log "redis: started"
			return 0
		fi
		sleep 0.2
	done
	tail -n 20 "$REDIS_LOG_DIR/ci.log" >&2 2>/dev/null || true
	die "redis: started but 127.0.0.1:$REDIS_PORT does not answer PING (log: $REDIS_LOG_DIR/ci.log)"
}

# ---------------------------------------------------------------------- etcd

# find_etcd_bin — sets ETCD_BIN, installing etcd-server/etcd-client if needed.
find_etcd_bin() {
	[[ -n "$ETCD_BIN" ]] && return 0
	local p
	for p in "$(command -v etcd 2>/dev/null || true)" /usr/bin/etcd /usr/local/bin/etcd; do
		if [[ -n "$p" && -x "$p" ]]; then
			ETCD_BIN=$p
			return 0
		fi
	done
	apt_install etcd-server etcd-client
	p=$(command -v etcd 2>/dev/null || true)
	[[ -n "$p" && -x "$p" ]] || die "etcd: etcd-server installed but no etcd binary on PATH"
	ETCD_BIN=$p
}

etcd_healthy() {
	if command -v curl >/dev/null 2>&1; then
		curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_CLIENT_PORT/health" 2>/dev/null | grep -q '"health": *"true"'
	elif command -v etcdctl >/dev/null 2>&1; then
		ETCDCTL_API=3 timeout 5 etcdctl --endpoints="127.0.0.1:$ETCD_CLIENT_PORT" \
			--dial-timeout=2s endpoint health </dev/null >/dev/null 2>&1
	else
		tcp_open "$ETCD_CLIENT_PORT"
	fi
}

is_our_etcd() {
	[[ "$1" =~ ^[0-9]+$ ]] && kill -0 "$1" 2>/dev/null || return 1
	[[ "$(cat "/proc/$1/comm" 2>/dev/null)" == etcd ]] || return 1
	tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "--data-dir $ETCD_DATA_DIR"
}

# etcd_pid_alive — is the etcd we manage (same data dir) running? Refreshes the
# pid file if it is stale but the process can be found.
etcd_pid_alive() {
	local pid=""
	[[ -f "$ETCD_PID_FILE" ]] && pid=$(<"$ETCD_PID_FILE")
	is_our_etcd "$pid" && return 0
	for pid in $(pgrep -x etcd 2>/dev/null || true); do
		if is_our_etcd "$pid"; then
			echo "$pid" >"$ETCD_PID_FILE"
			return 0
		fi
	done
	return 1
}

# etcd_wait_healthy SECONDS — poll every 0.2 s; fails early if our etcd died.
etcd_wait_healthy() {
	local n=$(($1 * 5)) i
	for ((i = 0; i < n; i++)); do
		etcd_healthy && return 0
		if ((i % 5 == 4)) && ! etcd_pid_alive; then
			sleep 0.2
			etcd_healthy && return 0
			return 1
		fi
		sleep 0.2
	done
	return 1
}

up_etcd() {
	if etcd_external; then
		log "etcd: LOCK_TEST_ETCD_ENDPOINTS points elsewhere, not managing"
		return 0
	fi
	if etcd_healthy; then
		log "etcd: already running"
		return 0
	fi
	if etcd_pid_alive; then
		# Our etcd is still starting (or got slow): give it time instead of racing it.
		log "etcd: process $(<"$ETCD_PID_FILE") exists but is not healthy yet, waiting"
		etcd_wait_healthy 30 && { log "etcd: already running"; return 0; }
		die "etcd: process $(<"$ETCD_PID_FILE") is not healthy after 30 s (log: $ETCD_LOG)"
	fi
	tcp_open "$ETCD_CLIENT_PORT" && die "etcd: 127.0.0.1:$ETCD_CLIENT_PORT is in use but /health is not OK"
	tcp_open "$ETCD_PEER_PORT" && die "etcd: peer port 127.0.0.1:$ETCD_PEER_PORT is already in use"

	find_etcd_bin
	mkdir -p "$ETCD_DATA_DIR" "$(dirname "$ETCD_LOG")"
	chmod 700 "$ETCD_DATA_DIR"

	# etcd refuses to start if an ETCD_* variable duplicates a flag, so start it
	# with a clean ETCD_* environment. Non-amd64 arches need ETCD_UNSUPPORTED_ARCH.
	local -a envargs=() unset_args=()
	local v arch
	rm -f "$ETCD_PID_FILE"
	for v in $(compgen -e); do
		[[ "$v" == ETCD_* ]] && unset_args+=(-u "$v")
	done
	case "$(uname -m)" in
	x86_64) arch="" ;;
	aarch64) arch=arm64 ;;
	ppc64le) arch=ppc64le ;;
	s390x) arch=s390x ;;
	armv7l | armv6l) arch=arm ;;
	i?86) arch=386 ;;
	*) arch=$(uname -m) ;;
	esac
	[[ -n "$arch" ]] && envargs+=("ETCD_UNSUPPORTED_ARCH=$arch")

	printf '\n==== %s services.sh starting %s\n' "$(date -Is)" "$ETCD_BIN" >>"$ETCD_LOG"
	setsid nohup env "${unset_args[@]}" "${envargs[@]}" "$ETCD_BIN" \
		--name default \
		--data-dir "$ETCD_DATA_DIR" \
		--listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" \
		</dev/null >>"$ETCD_LOG" 2>&1 9>&- &
	echo $! >"$ETCD_PID_FILE"

	if etcd_wait_healthy 30; then
		log "etcd: started (pid $(<"$ETCD_PID_FILE"), data $ETCD_DATA_DIR, log $ETCD_LOG)"
		return 0
	fi
	tail -n 20 "$ETCD_LOG" >&2 || true
	die "etcd: not healthy on 127.0.0.1:$ETCD_CLIENT_PORT within 30 s (log: $ETCD_LOG)"
}

# -------------------------------------------------------------------- status

cmd_status() {
	local down=0
	if postgres_external; then
		echo "postgres: external (LOCK_TEST_POSTGRES_DSN)"
	elif pg_ready; then echo "postgres: up"; else echo "postgres: down"; down=1; fi
	if redis_external; then
		echo "redis: external (LOCK_TEST_REDIS_ADDR)"
	elif redis_ping; then echo "redis: up"; else echo "redis: down"; down=1; fi
	if etcd_external; then
		echo "etcd: external (LOCK_TEST_ETCD_ENDPOINTS)"
	elif etcd_healthy; then echo "etcd: up"; else echo "etcd: down"; down=1; fi
	return "$down"
}

usage() {
	sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0" >&2
}

main() {
	local cmd=${1:-up}
	(($# > 0)) && shift
	case "$cmd" in
	up)
		[[ $EUID -eq 0 ]] || die "must run as root (installs packages, starts system services)"
		local -a svcs=("$@")
		((${#svcs[@]} == 0)) && svcs=(postgres redis etcd)
		local s
		for s in "${svcs[@]}"; do
			case "$s" in
			postgres | redis | etcd) ;;
			*) die "unknown service '$s' (want postgres, redis or etcd)" ;;
			esac
		done
		take_lock
		for s in "${svcs[@]}"; do "up_$s"; done
		;;
	status) cmd_status ;;
	etcd-bin)
		if ! command -v etcd >/dev/null 2>&1; then take_lock; fi
		find_etcd_bin
		printf '%s\n' "$ETCD_BIN"
		;;
	-h | --help | help) usage ;;
	*)
		usage
		die "unknown command '$cmd'"
		;;
	esac
}

main "$@"
