#!/usr/bin/env bash
# scripts/services.sh — private PostgreSQL, Redis and etcd servers, and a
# PgBouncer in front of that PostgreSQL, for the ubgo/lock tests, on ports of their own, with their data in a cache
# directory. It never reconfigures, restarts or stops a server it did not
# start: the machine's own Postgres, Redis or etcd are left alone.
#
# Usage:
#   scripts/services.sh [up]                      start (or reuse) all four
#   scripts/services.sh up postgres|redis|etcd|pgbouncer
#                                                 just those (several allowed)
#   scripts/services.sh down [postgres|redis|etcd|pgbouncer]
#                                                 stop ours (all by default)
#   scripts/services.sh status                    "<service>: up|down|external ..."
#                                                 (exit 0 if all managed ones are up)
#   scripts/services.sh etcd-bin                  print the etcd binary path
#                                                 (installs etcd-server if needed)
#
# Endpoints (loopback only, below the ephemeral port range so an outgoing
# connection never holds one), which internal/testenv uses by default:
#   postgres  127.0.0.1:25432  user postgres, trust auth, database "test"
#   redis     127.0.0.1:26379  no persistence
#   etcd      127.0.0.1:22379 (client), 127.0.0.1:22380 (peer)
#   pgbouncer 127.0.0.1:26432  in front of our postgres, trust auth: database
#             "session" is its database "test" in pool_mode=session,
#             "transaction" the same in pool_mode=transaction
#
# Data, logs and pid files live under $LOCK_SERVICES_DIR, by default
# /var/cache/ubgo-lock as root (the cluster runs as the postgres user, who
# cannot reach /root) and ${XDG_CACHE_HOME:-$HOME/.cache}/ubgo-lock otherwise.
# Missing server packages are installed with apt-get (as root).
#
# A LOCK_TEST_POSTGRES_DSN / LOCK_TEST_REDIS_ADDR / LOCK_TEST_ETCD_ENDPOINTS /
# LOCK_TEST_PGBOUNCER_ADDR that names another server leaves that service
# alone: not started, not touched. Our PgBouncer serves only our PostgreSQL,
# so it is not started either when LOCK_TEST_POSTGRES_DSN names another.
#
# Status lines go to stderr; only `status` and `etcd-bin` write to stdout.
# Daemons are started with all stdio redirected to files so they never hold a
# pipe of the caller open (which would hang `$(...)` or Go's exec.Cmd.Wait).

set -euo pipefail

PG_PORT=25432
PG_DB=test
REDIS_PORT=26379
ETCD_CLIENT_PORT=22379
ETCD_PEER_PORT=22380
PGB_PORT=26432

# pglock's scale test holds 10,000 advisory locks at once while other
# packages' tests hold theirs; the shared lock table has room for about
# max_locks_per_transaction × max_connections (64 × 100 by default).
# make bench's 64 waiting processes each open a pool of their own (a lock
# session, a wait session, a listener) beside the floor's 64 connections.
PG_SETTINGS=(
	"listen_addresses=127.0.0.1"
	"port=$PG_PORT"
	"max_connections=500"
	"max_locks_per_transaction=256"
)

if [[ -n "${LOCK_SERVICES_DIR:-}" ]]; then
	DIR=$LOCK_SERVICES_DIR
elif [[ $EUID -eq 0 ]]; then
	DIR=/var/cache/ubgo-lock
else
	DIR=${XDG_CACHE_HOME:-$HOME/.cache}/ubgo-lock
fi
PG_DIR=$DIR/postgres
PG_DATA=$PG_DIR/data
PG_SOCK=$PG_DIR/run
PG_LOG=$PG_DIR/postgres.log
REDIS_DIR=$DIR/redis
REDIS_PID_FILE=$REDIS_DIR/redis.pid
REDIS_LOG=$REDIS_DIR/redis.log
ETCD_DIR=$DIR/etcd
ETCD_DATA=$ETCD_DIR/data
ETCD_PID_FILE=$ETCD_DIR/etcd.pid
ETCD_LOG=$ETCD_DIR/etcd.log
PGB_DIR=$DIR/pgbouncer
PGB_INI=$PGB_DIR/pgbouncer.ini
PGB_PID_FILE=$PGB_DIR/pgbouncer.pid
PGB_LOG=$PGB_DIR/pgbouncer.log
APT_LOG=$DIR/apt.log
LOCK_FILE=$DIR/services.lock

APT_UPDATED=0
ETCD_BIN=""
PG_BIN=""

log() { printf '%s\n' "$*" >&2; }
die() { printf 'services.sh: error: %s\n' "$*" >&2; exit 1; }

# Serialise concurrent invocations (e.g. two test runs). fd 9 must be
# closed (9>&-) for every long-lived child, or the daemon would keep the lock.
take_lock() {
	# As root the postgres user must be able to pass through it.
	[[ -d "$DIR" ]] || mkdir -p -m 755 "$DIR"
	exec 9>"$LOCK_FILE" || die "cannot open lock file $LOCK_FILE"
	flock -w 900 9 || die "timed out waiting for $LOCK_FILE"
}

# tcp_open PORT — is something accepting connections on 127.0.0.1:PORT?
tcp_open() {
	timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# our_pid PID COMM DIR — is PID a live process named COMM whose working
# directory is DIR? Postgres and Redis chdir to their data directory, and
# etcd is started in its own; so a stale pid file never makes us signal
# someone else's process.
our_pid() {
	[[ "$1" =~ ^[0-9]+$ ]] && kill -0 "$1" 2>/dev/null || return 1
	[[ "$(cat "/proc/$1/comm" 2>/dev/null)" == "$2" ]] || return 1
	[[ "$(readlink "/proc/$1/cwd" 2>/dev/null)" == "$(readlink -f "$3")" ]]
}

# pid_from FILE — the first line of a pid file, or nothing.
pid_from() {
	[[ -f "$1" ]] && head -n 1 "$1" 2>/dev/null || true
}

# stop_pid PID NAME — SIGTERM, wait up to 30 s, then SIGKILL.
stop_pid() {
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 150; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.2
	done
	log "$2: pid $pid still running after 30 s, killing it"
	kill -KILL "$pid" 2>/dev/null || true
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
	[[ $EUID -eq 0 ]] || die "$* not installed; run as root, or: sudo apt-get install $*"
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

# is_ours HOST PORT OUR_PORT — does host:port name our private server?
# An empty port is the client's standard one (5432, 6379, 2379), not ours.
is_ours() {
	local host=$1 port=$2 our=$3
	host=${host#[}
	host=${host%]}
	case "$host" in
	127.0.0.1 | localhost | ::1 | "$PG_SOCK") ;;
	*) return 1 ;;
	esac
	[[ "$port" == "$our" ]]
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
	! is_ours "$host" "$port" "$PG_PORT"
}

redis_external() {
	local addr=${LOCK_TEST_REDIS_ADDR:-}
	[[ -z "$addr" ]] && return 1
	addr=${addr#redis://}
	addr=${addr##*@}
	addr=${addr%%/*}
	split_hostport "$addr"
	! is_ours "$HP_HOST" "$HP_PORT" "$REDIS_PORT"
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
		is_ours "$HP_HOST" "$HP_PORT" "$ETCD_CLIENT_PORT" || return 0
	done
	return 1
}

pgbouncer_external() {
	local addr=${LOCK_TEST_PGBOUNCER_ADDR:-}
	[[ -z "$addr" ]] && return 1
	split_hostport "$addr"
	! is_ours "$HP_HOST" "$HP_PORT" "$PGB_PORT"
}

# ------------------------------------------------------------------ postgres

# pg_as CMD... — run a server binary as the cluster's owner: the postgres
# user when we are root (initdb and pg_ctl refuse root), else ourselves.
pg_as() {
	if [[ $EUID -eq 0 ]]; then
		(cd / && runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

# find_pg_bin — sets PG_BIN to the server binaries of the cluster's
# version, or of the newest installed one for a new cluster.
find_pg_bin() {
	local ver=""
	if [[ -f "$PG_DATA/PG_VERSION" ]]; then
		ver=$(<"$PG_DATA/PG_VERSION")
		[[ -x /usr/lib/postgresql/$ver/bin/pg_ctl ]] ||
			die "postgres: $PG_DATA was made by PostgreSQL $ver, which is not installed; run 'scripts/services.sh down', remove $PG_DIR and run 'up' again for a new cluster"
	else
		ver=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1)
		if [[ -z "$ver" || ! -x /usr/lib/postgresql/$ver/bin/initdb ]]; then
			apt_install postgresql
			ver=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1)
		fi
	fi
	PG_BIN=/usr/lib/postgresql/$ver/bin
	[[ -x $PG_BIN/initdb && -x $PG_BIN/pg_ctl && -x $PG_BIN/psql ]] ||
		die "postgres: no initdb, pg_ctl and psql in $PG_BIN"
}

# pg_pid — the pid of our running postmaster, or failure.
pg_pid() {
	local pid
	pid=$(pid_from "$PG_DATA/postmaster.pid")
	our_pid "$pid" postgres "$PG_DATA" && printf '%s\n' "$pid"
}

# pg_pidfile_line N — line N of our postmaster.pid: 4 is the running
# server's port, 5 its socket directory (ours even if the settings have
# changed since it started).
pg_pidfile_line() { sed -n "${1}p" "$PG_DATA/postmaster.pid" 2>/dev/null || true; }

# pg_psql DB SQL — run SQL as postgres over the running server's socket.
pg_psql() {
	local port sock
	port=$(pg_pidfile_line 4) sock=$(pg_pidfile_line 5)
	env -u PGPASSWORD -u PGSERVICE -u PGOPTIONS PGCONNECT_TIMEOUT=5 \
		"$PG_BIN/psql" -X -w -h "${sock:-$PG_SOCK}" -p "${port:-$PG_PORT}" \
		-U postgres -d "$1" -v ON_ERROR_STOP=1 -tAc "$2" </dev/null
}

# pg_wait_ready — until our server accepts connections on its socket;
# fails early if it died.
pg_wait_ready() {
	local i port sock
	for ((i = 0; i < 150; i++)); do
		pg_pid >/dev/null || return 1
		port=$(pg_pidfile_line 4) sock=$(pg_pidfile_line 5)
		if [[ -n "$port" && -n "$sock" ]] &&
			"$PG_BIN/pg_isready" -q -U postgres -h "$sock" -p "$port" -t 2 >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.2
	done
	return 1
}

# pg_write_conf — our settings, in a file postgresql.conf includes.
pg_write_conf() {
	local conf=$PG_DATA/ubgo-lock.conf tmp s
	tmp=$(mktemp)
	{
		echo "# Written by scripts/services.sh at every 'up'; edits are overwritten."
		for s in "${PG_SETTINGS[@]}" "unix_socket_directories=$PG_SOCK"; do
			printf "%s = '%s'\n" "${s%%=*}" "${s#*=}"
		done
	} >"$tmp"
	if ! cmp -s "$tmp" "$conf"; then
		pg_as tee "$conf" <"$tmp" >/dev/null
	fi
	rm -f "$tmp"
	grep -q "^include_if_exists 'ubgo-lock.conf'" "$PG_DATA/postgresql.conf" ||
		echo "include_if_exists 'ubgo-lock.conf'" | pg_as tee -a "$PG_DATA/postgresql.conf" >/dev/null
}

# pg_settings_current — does the running server use the settings we want?
pg_settings_current() {
	local want="" have s names=""
	for s in "${PG_SETTINGS[@]}" "unix_socket_directories=$PG_SOCK"; do
		want+="${s%%=*}=${s#*=};"
		names+="'${s%%=*}',"
	done
	have=$(pg_psql postgres "SELECT string_agg(name || '=' || setting, ';' ORDER BY array_position(ARRAY[${names%,}], name::text)) || ';' FROM pg_settings WHERE name IN (${names%,})") ||
		return 1
	[[ "$have" == "$want" ]]
}

pg_init() {
	log "postgres: creating a cluster in $PG_DATA"
	mkdir -p "$PG_DIR"
	if [[ $EUID -eq 0 ]]; then
		id postgres >/dev/null 2>&1 || die "postgres: no postgres user (it comes with the postgresql package)"
		chown postgres: "$PG_DIR"
		runuser -u postgres -- test -w "$PG_DIR" ||
			die "postgres: the postgres user cannot reach $PG_DIR; set LOCK_SERVICES_DIR to a directory it can"
	fi
	chmod 700 "$PG_DIR"
	# A half-made cluster (initdb interrupted) is ours to remove.
	[[ -d "$PG_DATA" ]] && rm -rf -- "$PG_DATA"
	pg_as "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
		</dev/null >>"$PG_LOG.initdb" 2>&1 9>&- || {
		tail -n 20 "$PG_LOG.initdb" >&2
		die "postgres: initdb failed (log: $PG_LOG.initdb)"
	}
}

pg_start() {
	local rc=0
	pg_as "$PG_BIN/pg_ctl" start -D "$PG_DATA" -l "$PG_LOG" -w -t 60 \
		</dev/null >/dev/null 2>&1 9>&- || rc=$?
	if ((rc != 0)) || ! pg_wait_ready; then
		tail -n 20 "$PG_LOG" >&2 || true
		die "postgres: not accepting connections on 127.0.0.1:$PG_PORT (pg_ctl exit $rc, log: $PG_LOG)"
	fi
}

pg_ensure_db() {
	local have
	have=$(pg_psql postgres "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'") ||
		die "postgres: cannot query pg_database on our cluster (log: $PG_LOG)"
	if [[ "$have" != 1 ]]; then
		pg_psql postgres "CREATE DATABASE \"$PG_DB\"" >/dev/null ||
			die "postgres: creating database '$PG_DB' failed"
		log "postgres: created database '$PG_DB'"
	fi
}

up_postgres() {
	if postgres_external; then
		log "postgres: LOCK_TEST_POSTGRES_DSN names another server, leaving it alone"
		return 0
	fi
	local what=started
	# The socket path must fit in sun_path (107 bytes).
	((${#PG_SOCK} + 17 <= 107)) || die "postgres: socket path under $PG_SOCK is too long; set LOCK_SERVICES_DIR to a shorter directory"
	find_pg_bin
	[[ -f "$PG_DATA/PG_VERSION" ]] || pg_init
	pg_as mkdir -p "$PG_SOCK"
	pg_write_conf
	if pg_pid >/dev/null; then
		pg_wait_ready || die "postgres: our server (pid $(pg_pid)) does not accept connections (log: $PG_LOG)"
		if pg_settings_current; then
			what="already running"
		else
			log "postgres: our server's settings are out of date, restarting it"
			pg_as "$PG_BIN/pg_ctl" stop -D "$PG_DATA" -m fast -w -t 60 </dev/null >/dev/null 2>&1 9>&- ||
				die "postgres: stopping our server failed (log: $PG_LOG)"
			what=restarted
		fi
	fi
	if [[ "$what" != "already running" ]]; then
		tcp_open "$PG_PORT" && die "postgres: 127.0.0.1:$PG_PORT is in use by another program; free it, or point LOCK_TEST_POSTGRES_DSN at a server of your choosing"
		pg_start
	fi
	"$PG_BIN/pg_isready" -q -U postgres -h 127.0.0.1 -p "$PG_PORT" -t 5 >/dev/null 2>&1 ||
		die "postgres: our server does not answer on 127.0.0.1:$PG_PORT (log: $PG_LOG)"
	pg_ensure_db
	log "postgres: $what on 127.0.0.1:$PG_PORT (pid $(pg_pid), data $PG_DATA, log $PG_LOG)"
}

down_postgres() {
	local pid
	if ! pid=$(pg_pid); then
		log "postgres: not running"
		return 0
	fi
	find_pg_bin
	pg_as "$PG_BIN/pg_ctl" stop -D "$PG_DATA" -m fast -w -t 60 </dev/null >/dev/null 2>&1 9>&- ||
		stop_pid "$pid" postgres
	log "postgres: stopped (pid $pid)"
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

redis_pid() {
	local pid
	pid=$(pid_from "$REDIS_PID_FILE")
	our_pid "$pid" redis-server "$REDIS_DIR" && printf '%s\n' "$pid"
}

# redis_wait SECONDS — until ours answers PING; fails early if it died.
redis_wait() {
	local i
	for ((i = 0; i < $1 * 5; i++)); do
		redis_ping && redis_pid >/dev/null && return 0
		sleep 0.2
	done
	return 1
}

up_redis() {
	if redis_external; then
		log "redis: LOCK_TEST_REDIS_ADDR names another server, leaving it alone"
		return 0
	fi
	if redis_pid >/dev/null; then
		redis_wait 15 || die "redis: our server (pid $(redis_pid)) does not answer PING on 127.0.0.1:$REDIS_PORT (log: $REDIS_LOG)"
		log "redis: already running on 127.0.0.1:$REDIS_PORT (pid $(redis_pid))"
		return 0
	fi
	tcp_open "$REDIS_PORT" && die "redis: 127.0.0.1:$REDIS_PORT is in use by another program; free it, or point LOCK_TEST_REDIS_ADDR at a server of your choosing"
	command -v redis-server >/dev/null 2>&1 || apt_install redis-server
	mkdir -p "$REDIS_DIR"
	rm -f "$REDIS_PID_FILE"
	local rc=0
	# No config file: the machine's /etc/redis/redis.conf is not ours.
	(cd "$REDIS_DIR" && redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" \
		--save "" --appendonly no --dir "$REDIS_DIR" \
		--pidfile "$REDIS_PID_FILE" --logfile "$REDIS_LOG" \
		</dev/null >>"$REDIS_LOG" 2>&1 9>&-) || rc=$?
	if ((rc != 0)) || ! redis_wait 15; then
		tail -n 20 "$REDIS_LOG" >&2 2>/dev/null || true
		die "redis: did not come up on 127.0.0.1:$REDIS_PORT (exit $rc, log: $REDIS_LOG)"
	fi
	log "redis: started on 127.0.0.1:$REDIS_PORT (pid $(redis_pid), log $REDIS_LOG)"
}

down_redis() {
	local pid
	if ! pid=$(redis_pid); then
		log "redis: not running"
		return 0
	fi
	stop_pid "$pid" redis
	rm -f "$REDIS_PID_FILE"
	log "redis: stopped (pid $pid)"
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

# etcd_pid — the pid of our etcd, from its pid file or, if that is stale,
# among the etcd processes (refreshing the file).
etcd_pid() {
	local pid
	pid=$(pid_from "$ETCD_PID_FILE")
	if our_pid "$pid" etcd "$ETCD_DIR"; then
		printf '%s\n' "$pid"
		return 0
	fi
	for pid in $(pgrep -x etcd 2>/dev/null || true); do
		if our_pid "$pid" etcd "$ETCD_DIR"; then
			echo "$pid" >"$ETCD_PID_FILE"
			printf '%s\n' "$pid"
			return 0
		fi
	done
	return 1
}

# etcd_wait SECONDS — until ours is healthy; fails early if it died.
etcd_wait() {
	local i
	for ((i = 0; i < $1 * 5; i++)); do
		etcd_healthy && etcd_pid >/dev/null && return 0
		if ((i % 5 == 4)) && ! etcd_pid >/dev/null; then
			return 1
		fi
		sleep 0.2
	done
	return 1
}

up_etcd() {
	if etcd_external; then
		log "etcd: LOCK_TEST_ETCD_ENDPOINTS names another server, leaving it alone"
		return 0
	fi
	if etcd_pid >/dev/null; then
		# Ours may still be starting (or got slow): give it time instead of racing it.
		etcd_wait 30 || die "etcd: our server (pid $(etcd_pid)) is not healthy on 127.0.0.1:$ETCD_CLIENT_PORT (log: $ETCD_LOG)"
		log "etcd: already running on 127.0.0.1:$ETCD_CLIENT_PORT (pid $(etcd_pid))"
		return 0
	fi
	tcp_open "$ETCD_CLIENT_PORT" && die "etcd: 127.0.0.1:$ETCD_CLIENT_PORT is in use by another program; free it, or point LOCK_TEST_ETCD_ENDPOINTS at a server of your choosing"
	tcp_open "$ETCD_PEER_PORT" && die "etcd: peer port 127.0.0.1:$ETCD_PEER_PORT is in use by another program"

	find_etcd_bin
	mkdir -p "$ETCD_DATA"
	chmod 700 "$ETCD_DATA"

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
	# Started in its own directory, which is how etcd_pid recognises it.
	(cd "$ETCD_DIR" && exec setsid nohup env "${unset_args[@]}" "${envargs[@]}" "$ETCD_BIN" \
		--name default \
		--data-dir "$ETCD_DATA" \
		--listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" \
		</dev/null >>"$ETCD_LOG" 2>&1 9>&-) &
	echo $! >"$ETCD_PID_FILE"

	if etcd_wait 30; then
		log "etcd: started on 127.0.0.1:$ETCD_CLIENT_PORT (pid $(etcd_pid), data $ETCD_DATA, log $ETCD_LOG)"
		return 0
	fi
	tail -n 20 "$ETCD_LOG" >&2 || true
	die "etcd: not healthy on 127.0.0.1:$ETCD_CLIENT_PORT within 30 s (log: $ETCD_LOG)"
}

down_etcd() {
	local pid
	if ! pid=$(etcd_pid); then
		log "etcd: not running"
		return 0
	fi
	stop_pid "$pid" etcd
	rm -f "$ETCD_PID_FILE"
	log "etcd: stopped (pid $pid)"
}

# ----------------------------------------------------------------- pgbouncer

# as_owner CMD... — run CMD as the postgres user when we are root (pgbouncer
# refuses root), else as ourselves; in the current directory.
as_owner() {
	if [[ $EUID -eq 0 ]]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

pgb_pid() {
	local pid
	pid=$(pid_from "$PGB_PID_FILE")
	our_pid "$pid" pgbouncer "$PGB_DIR" && printf '%s\n' "$pid"
}

# pgb_wait SECONDS — until ours accepts connections; fails early if it died.
pgb_wait() {
	local i
	for ((i = 0; i < $1 * 5; i++)); do
		pgb_pid >/dev/null && tcp_open "$PGB_PORT" && return 0
		if ((i % 5 == 4)) && ! pgb_pid >/dev/null; then
			return 1
		fi
		sleep 0.2
	done
	return 1
}

# pgb_write_conf — our configuration; succeeds if it changed. Two entries
# for one database: the session-mode pool is as large as a session test run
# needs (a client holds its server connection until it disconnects), the
# transaction-mode pool small, as such pools are.
pgb_write_conf() {
	local tmp
	tmp=$(mktemp)
	cat >"$tmp" <<-EOF
		; Written by scripts/services.sh at every 'up'; edits are overwritten.
		[databases]
		session = host=127.0.0.1 port=$PG_PORT dbname=$PG_DB user=postgres pool_mode=session pool_size=60
		transaction = host=127.0.0.1 port=$PG_PORT dbname=$PG_DB user=postgres pool_mode=transaction pool_size=10

		[pgbouncer]
		listen_addr = 127.0.0.1
		listen_port = $PGB_PORT
		unix_socket_dir =
		auth_type = trust
		auth_file = $PGB_DIR/userlist.txt
		admin_users = postgres
		pidfile = $PGB_PID_FILE
		logfile = $PGB_LOG
		max_client_conn = 500
	EOF
	echo '"postgres" ""' | as_owner tee "$PGB_DIR/userlist.txt" >/dev/null
	if cmp -s "$tmp" "$PGB_INI"; then
		rm -f "$tmp"
		return 1
	fi
	as_owner tee "$PGB_INI" <"$tmp" >/dev/null
	rm -f "$tmp"
}

up_pgbouncer() {
	if pgbouncer_external; then
		log "pgbouncer: LOCK_TEST_PGBOUNCER_ADDR names another server, leaving it alone"
		return 0
	fi
	if postgres_external; then
		log "pgbouncer: LOCK_TEST_POSTGRES_DSN names another server, so ours (which serves only our postgres) is not started; set LOCK_TEST_PGBOUNCER_ADDR to a PgBouncer in front of yours"
		return 0
	fi
	local bin what=started changed=0
	bin=$(command -v pgbouncer 2>/dev/null || true)
	[[ -z "$bin" && -x /usr/sbin/pgbouncer ]] && bin=/usr/sbin/pgbouncer
	if [[ -z "$bin" ]]; then
		apt_install pgbouncer
		bin=/usr/sbin/pgbouncer
	fi
	[[ -x "$bin" ]] || die "pgbouncer: installed but no pgbouncer binary"
	mkdir -p "$PGB_DIR"
	if [[ $EUID -eq 0 ]]; then
		id postgres >/dev/null 2>&1 || die "pgbouncer: no postgres user to run it as (it comes with the postgresql package)"
		chown postgres: "$PGB_DIR"
	fi
	pgb_write_conf && changed=1
	if pgb_pid >/dev/null; then
		if ((changed == 0)); then
			pgb_wait 15 || die "pgbouncer: ours (pid $(pgb_pid)) does not accept connections on 127.0.0.1:$PGB_PORT (log: $PGB_LOG)"
			log "pgbouncer: already running on 127.0.0.1:$PGB_PORT (pid $(pgb_pid))"
			return 0
		fi
		log "pgbouncer: our configuration changed, restarting it"
		stop_pid "$(pgb_pid)" pgbouncer
		what=restarted
	fi
	tcp_open "$PGB_PORT" && die "pgbouncer: 127.0.0.1:$PGB_PORT is in use by another program; free it, or point LOCK_TEST_PGBOUNCER_ADDR at a PgBouncer of your choosing"
	rm -f "$PGB_PID_FILE"
	# In the foreground of a session of its own, started in its directory,
	# which is how pgb_pid recognises it; it writes its pid file itself.
	local -a run=("$bin" -q "$PGB_INI")
	[[ $EUID -eq 0 ]] && run=(runuser -u postgres -- "${run[@]}")
	(cd "$PGB_DIR" && exec setsid nohup "${run[@]}" </dev/null >>"$PGB_DIR/pgbouncer.out" 2>&1 9>&-) &
	if pgb_wait 15; then
		log "pgbouncer: $what on 127.0.0.1:$PGB_PORT (pid $(pgb_pid), log $PGB_LOG)"
		return 0
	fi
	tail -n 20 "$PGB_LOG" >&2 || true
	die "pgbouncer: not accepting connections on 127.0.0.1:$PGB_PORT within 15 s (log: $PGB_LOG)"
}

down_pgbouncer() {
	local pid
	if ! pid=$(pgb_pid); then
		log "pgbouncer: not running"
		return 0
	fi
	stop_pid "$pid" pgbouncer
	rm -f "$PGB_PID_FILE"
	log "pgbouncer: stopped (pid $pid)"
}

# -------------------------------------------------------------------- status

cmd_status() {
	local down=0 pid
	if postgres_external; then
		echo "postgres: external (LOCK_TEST_POSTGRES_DSN)"
	elif pid=$(pg_pid) && PG_BIN=$(dirname "$(readlink -f "/proc/$pid/exe")") &&
		"$PG_BIN/pg_isready" -q -U postgres -h 127.0.0.1 -p "$PG_PORT" -t 2; then
		echo "postgres: up (127.0.0.1:$PG_PORT, pid $pid, data $PG_DATA)"
	else
		echo "postgres: down"
		down=1
	fi
	if redis_external; then
		echo "redis: external (LOCK_TEST_REDIS_ADDR)"
	elif pid=$(redis_pid) && redis_ping; then
		echo "redis: up (127.0.0.1:$REDIS_PORT, pid $pid, dir $REDIS_DIR)"
	else
		echo "redis: down"
		down=1
	fi
	if etcd_external; then
		echo "etcd: external (LOCK_TEST_ETCD_ENDPOINTS)"
	elif pid=$(etcd_pid) && etcd_healthy; then
		echo "etcd: up (127.0.0.1:$ETCD_CLIENT_PORT, pid $pid, data $ETCD_DATA)"
	else
		echo "etcd: down"
		down=1
	fi
	if pgbouncer_external; then
		echo "pgbouncer: external (LOCK_TEST_PGBOUNCER_ADDR)"
	elif postgres_external; then
		echo "pgbouncer: not ours to run (LOCK_TEST_POSTGRES_DSN names another server)"
	elif pid=$(pgb_pid) && tcp_open "$PGB_PORT"; then
		echo "pgbouncer: up (127.0.0.1:$PGB_PORT, pid $pid, dir $PGB_DIR)"
	else
		echo "pgbouncer: down"
		down=1
	fi
	return "$down"
}

usage() {
	sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0" >&2
}

# services ARGS... — the services named (all four by default), checked.
services() {
	SVCS=("$@")
	((${#SVCS[@]} == 0)) && SVCS=(postgres redis etcd pgbouncer)
	local s
	for s in "${SVCS[@]}"; do
		case "$s" in
		postgres | redis | etcd | pgbouncer) ;;
		*) die "unknown service '$s' (want postgres, redis, etcd or pgbouncer)" ;;
		esac
	done
}

main() {
	local cmd=${1:-up} s
	(($# > 0)) && shift
	case "$cmd" in
	up | down)
		services "$@"
		take_lock
		for s in "${SVCS[@]}"; do "${cmd}_$s"; done
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
