#!/usr/bin/env bash
# scripts/services.sh — private servers for the ubgo/lock tests (PostgreSQL,
# Redis, etcd, a PgBouncer in front of that PostgreSQL; MariaDB and NATS on
# request), on loopback ports of their own, with their data in a cache
# directory. It never reconfigures, restarts or stops a server it did not
# start: the machine's own servers are left alone.
#
# Usage:
#   scripts/services.sh [up] [SERVICE...]   start (or reuse) these; by default
#                                           postgres, redis, etcd and pgbouncer
#   scripts/services.sh down [SERVICE...]   stop ours (all by default)
#   scripts/services.sh status [SERVICE...] "<service>: up|down|external ..."
#                                           (exit 0 if all managed ones are up)
#   scripts/services.sh bin SERVICE         print its binary's path (installs it
#                                           if needed); etcd-bin = bin etcd
#
# Endpoints (loopback only, below the ephemeral port range so an outgoing
# connection never holds one), which internal/testenv uses by default:
#   postgres  127.0.0.1:25432  user postgres, trust auth, database "test"
#   redis     127.0.0.1:26379  no persistence
#   etcd      127.0.0.1:22379 (client), 127.0.0.1:22380 (peer)
#   pgbouncer 127.0.0.1:26432  in front of our postgres, trust auth: database
#             "session" is its database "test" in pool_mode=session,
#             "transaction" the same in pool_mode=transaction
#   mariadb   127.0.0.1:23306  only with `up mariadb`: user root, no password,
#             database "test" (root@tcp(127.0.0.1:23306)/test)
#   nats      127.0.0.1:24222  only with `up nats`: JetStream on
# LOCK_SERVICES_PORT_OFFSET=N adds N to every port (a second set of servers,
# with another LOCK_SERVICES_DIR, beside the first).
#
# Data, logs and pid files live under $LOCK_SERVICES_DIR/<service>, by default
# /var/cache/ubgo-lock as root (the cluster runs as the postgres user, who
# cannot reach /root) and ${XDG_CACHE_HOME:-$HOME/.cache}/ubgo-lock otherwise.
# Missing server packages are installed with apt-get (as root); servers from
# a Go module are built with `go install` into $LOCK_SERVICES_DIR/go.
#
# A LOCK_TEST_* variable (the table's second column) that names another
# server leaves that service alone: not started, not touched. Our PgBouncer
# serves only our PostgreSQL, so it is not started either when
# LOCK_TEST_POSTGRES_DSN names another.
#
# Status lines go to stderr; only `status` and `bin` write to stdout.
# Daemons are started with all stdio redirected to files so they never hold a
# pipe of the caller open (which would hang `$(...)` or Go's exec.Cmd.Wait).

set -euo pipefail
shopt -s lastpipe # write_conf at the end of a pipe sets CHANGED here

log() { printf '%s\n' "$*" >&2; }
die() { printf 'services.sh: error: %s\n' "$*" >&2; exit 1; }
# fail WHAT LOG — die with the end of LOG.
fail() { tail -n 20 "$2" >&2 2>/dev/null || true; die "$SVC: $1 (log: $PWD/$2)"; }

# ---------------------------------------------------------------- the services
#
# service NAME VARIABLE PORTS SOURCE BINARY [OPTION...]
#   NAME      its directory under $DIR and the prefix of its hooks
#   VARIABLE  the LOCK_TEST_* variable that names a server of the user's instead
#   PORTS     its ports, comma-separated; the first is the one clients use
#   SOURCE    the Debian package(s) that provide BINARY, or go:MODULE@VERSION
#   BINARY    the server's program (a glob picks the newest match); its
#             process has this name and runs in its pid file's directory
#   OPTION    pid=FILE  its pid file, in its directory (default NAME.pid)
#             user=USER run as USER when we are root
#             stop=SIG  the signal that stops it (default TERM)
#             needs=SVC not ours to run when SVC is external
#             asked     started only when named: `up NAME`
# and its hooks, functions run in its directory ($1 its first port, $BIN its
# program): NAME_start (with `detach`) and NAME_ready (it answers) are
# required; NAME_prepare (data, configuration: `write_conf` marks a change,
# which restarts it), NAME_current (does the running server have our
# settings?) and NAME_after (once it answers: databases, users) are optional.

declare -a ALL=()
declare -A VAR=() PORTS=() SRC=() PROG=() PIDF=() RUNAS=() SIG=() NEEDS=() ASKED=()

service() {
	local s=$1 o p ports=()
	ALL+=("$s") VAR[$s]=$2 SRC[$s]=$4 PROG[$s]=$5 PIDF[$s]=$s.pid SIG[$s]=TERM
	for p in ${3//,/ }; do ports+=($((p + ${LOCK_SERVICES_PORT_OFFSET:-0}))); done
	PORTS[$s]=${ports[*]}
	for o in "${@:6}"; do
		case $o in
		pid=*) PIDF[$s]=${o#*=} ;;
		user=*) RUNAS[$s]=${o#*=} ;;
		stop=*) SIG[$s]=${o#*=} ;;
		needs=*) NEEDS[$s]=${o#*=} ;;
		asked) ASKED[$s]=1 ;;
		*) die "service $s: unknown option $o" ;;
		esac
	done
}

#       name      variable                 ports       source                   binary
service postgres  LOCK_TEST_POSTGRES_DSN   25432       postgresql               '/usr/lib/postgresql/*/bin/postgres' \
	pid=data/postmaster.pid user=postgres stop=INT
service redis     LOCK_TEST_REDIS_ADDR     26379       redis-server             redis-server
service etcd      LOCK_TEST_ETCD_ENDPOINTS 22379,22380 'etcd-server etcd-client' etcd
service pgbouncer LOCK_TEST_PGBOUNCER_ADDR 26432       pgbouncer                pgbouncer \
	user=postgres needs=postgres
service mariadb   LOCK_TEST_MYSQL_DSN      23306       mariadb-server           mariadbd \
	pid=data/mariadbd.pid user=mysql asked
service nats      LOCK_TEST_NATS_URL       24222       go:github.com/nats-io/nats-server/v2@v2.15.2 nats-server \
	asked

# port SVC — the port its clients use.
port() { local p=${PORTS[$1]}; printf '%s\n' "${p%% *}"; }

# --- postgres: a cluster made with initdb, our settings in a file
# postgresql.conf includes. pglock's scale test holds 10,000 advisory locks
# at once while other packages' tests hold theirs; the shared lock table has
# room for about max_locks_per_transaction × max_connections (64 × 100 by
# default). make bench's 64 waiting processes each open a pool of their own
# (a lock session, a wait session, a listener) beside the floor's 64
# connections.
PG_DB="test"
PG_SETTINGS=(
	"listen_addresses=127.0.0.1"
	"port=$(port postgres)"
	"max_connections=500"
	"max_locks_per_transaction=256"
)

postgres_prepare() {
	# The socket path must fit in sun_path (107 bytes).
	((${#PWD} + 21 <= 107)) || die "postgres: socket path under $PWD/run is too long; set LOCK_SERVICES_DIR to a shorter directory"
	PG_SETTINGS+=("unix_socket_directories=$PWD/run")
	if [[ -f data/PG_VERSION ]]; then
		local ver
		ver=$(<data/PG_VERSION)
		BIN=/usr/lib/postgresql/$ver/bin/postgres
		[[ -x $BIN ]] || die "postgres: $PWD/data was made by PostgreSQL $ver, which is not installed; run 'scripts/services.sh down', remove $PWD and run 'up' again for a new cluster"
	fi
	PG_BIN=${BIN%/*}
	[[ -x $PG_BIN/initdb && -x $PG_BIN/psql && -x $PG_BIN/pg_isready ]] ||
		die "postgres: no initdb, psql and pg_isready in $PG_BIN"
	if [[ ! -f data/PG_VERSION ]]; then
		log "postgres: creating a cluster in $PWD/data"
		rm -rf -- data # a half-made cluster (initdb interrupted) is ours to remove
		as_owner "$PG_BIN/initdb" -D "$PWD/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
			</dev/null >>postgres.log.initdb 2>&1 9>&- ||
			fail "initdb failed" postgres.log.initdb
	fi
	as_owner mkdir -p run
	local s
	for s in "${PG_SETTINGS[@]}"; do printf "%s = '%s'\n" "${s%%=*}" "${s#*=}"; done |
		write_conf data/ubgo-lock.conf '#'
	grep -q "^include_if_exists 'ubgo-lock.conf'" data/postgresql.conf ||
		echo "include_if_exists 'ubgo-lock.conf'" | as_owner tee -a data/postgresql.conf >/dev/null
}

postgres_start() { detach "$BIN" -D "$PWD/data"; }

# Over the running server's own socket and port (lines 5 and 4 of its pid
# file): ours even if the settings have changed since it started.
postgres_ready() {
	local port sock
	port=$(sed -n 4p data/postmaster.pid 2>/dev/null) sock=$(sed -n 5p data/postmaster.pid 2>/dev/null)
	[[ -n $port && -n $sock ]] && "${BIN%/*}/pg_isready" -q -U postgres -h "$sock" -p "$port" -t 2 >/dev/null 2>&1
}

# pg_psql DB SQL — run SQL as postgres over the running server's socket.
pg_psql() {
	env -u PGPASSWORD -u PGSERVICE -u PGOPTIONS PGCONNECT_TIMEOUT=5 \
		"$PG_BIN/psql" -X -w -h "$(sed -n 5p data/postmaster.pid)" -p "$(sed -n 4p data/postmaster.pid)" \
		-U postgres -d "$1" -v ON_ERROR_STOP=1 -tAc "$2" </dev/null
}

postgres_current() {
	local want="" have s names=""
	for s in "${PG_SETTINGS[@]}"; do
		want+="${s%%=*}=${s#*=};"
		names+="'${s%%=*}',"
	done
	have=$(pg_psql postgres "SELECT string_agg(name || '=' || setting, ';' ORDER BY array_position(ARRAY[${names%,}], name::text)) || ';' FROM pg_settings WHERE name IN (${names%,})") ||
		return 1
	[[ "$have" == "$want" ]]
}

postgres_after() {
	local have
	have=$(pg_psql postgres "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'") ||
		die "postgres: cannot query pg_database on our cluster (log: $LOG)"
	if [[ "$have" != 1 ]]; then
		pg_psql postgres "CREATE DATABASE \"$PG_DB\"" >/dev/null || die "postgres: creating database '$PG_DB' failed"
		log "postgres: created database '$PG_DB'"
	fi
}

# --- redis: no configuration file (the machine's is not ours), no persistence.
redis_start() {
	detach "$BIN" --bind 127.0.0.1 --port "$1" --save "" --appendonly no --dir "$PWD" \
		--pidfile "$PWD/redis.pid" --logfile "$PWD/redis.log"
}

redis_ready() {
	local reply
	if command -v redis-cli >/dev/null 2>&1; then
		reply=$(timeout 3 redis-cli -h 127.0.0.1 -p "$1" ping </dev/null 2>/dev/null) || return 1
	else
		reply=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1; printf 'PING\r\n' >&3; head -n 1 <&3" 2>/dev/null) || return 1
	fi
	[[ "$reply" == *PONG* ]]
}

# --- etcd: one member. It refuses to start if an ETCD_* variable duplicates
# a flag, so it gets a clean ETCD_* environment; arches other than amd64 need
# ETCD_UNSUPPORTED_ARCH.
etcd_start() {
	local v peer=${PORTS[etcd]#* } clean=() arch
	for v in $(compgen -e); do [[ $v == ETCD_* ]] && clean+=(-u "$v"); done
	case $(uname -m) in
	x86_64) arch="" ;; aarch64) arch=arm64 ;; armv7l | armv6l) arch=arm ;; i?86) arch=386 ;; *) arch=$(uname -m) ;;
	esac
	detach env "${clean[@]}" ${arch:+ETCD_UNSUPPORTED_ARCH=$arch} "$BIN" --name default --data-dir "$PWD/data" \
		--listen-client-urls "http://127.0.0.1:$1" --advertise-client-urls "http://127.0.0.1:$1" \
		--listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
		--initial-cluster "default=http://127.0.0.1:$peer"
	echo "$LAUNCHED" >etcd.pid # env and etcd exec: the same process
}

etcd_ready() {
	if command -v curl >/dev/null 2>&1; then
		curl -fsS --max-time 2 "http://127.0.0.1:$1/health" 2>/dev/null | grep -q '"health": *"true"'
	elif command -v etcdctl >/dev/null 2>&1; then
		ETCDCTL_API=3 timeout 5 etcdctl --endpoints="127.0.0.1:$1" --dial-timeout=2s endpoint health </dev/null >/dev/null 2>&1
	else
		tcp_open "$1"
	fi
}

# --- pgbouncer: two entries for one database: the session-mode pool is as
# large as a session test run needs (a client holds its server connection
# until it disconnects), the transaction-mode pool small, as such pools are.
pgbouncer_prepare() {
	echo '"postgres" ""' | write_conf userlist.txt
	cat <<-EOF | write_conf pgbouncer.ini ';'
		[databases]
		session = host=127.0.0.1 port=$(port postgres) dbname=$PG_DB user=postgres pool_mode=session pool_size=60
		transaction = host=127.0.0.1 port=$(port postgres) dbname=$PG_DB user=postgres pool_mode=transaction pool_size=10

		[pgbouncer]
		listen_addr = 127.0.0.1
		listen_port = $1
		unix_socket_dir =
		auth_type = trust
		auth_file = $PWD/userlist.txt
		admin_users = postgres
		pidfile = $PWD/pgbouncer.pid
		logfile = $PWD/pgbouncer.log
		max_client_conn = 500
	EOF
}

pgbouncer_start() {
	rm -f pgbouncer.pid # it refuses to start over a live pid, even another program's
	detach "$BIN" -q "$PWD/pgbouncer.ini"
}

pgbouncer_ready() { tcp_open "$1"; }

# --- mariadb: a datadir made with mariadb-install-db; no option files (the
# machine's /etc/mysql is not ours); socket and logs in our directory.
mariadb_prepare() {
	[[ -d data/mysql ]] && return 0
	log "mariadb: creating a datadir in $PWD/data"
	rm -rf -- data # half-made: ours to remove
	as_owner mariadb-install-db --no-defaults --datadir="$PWD/data" --auth-root-authentication-method=normal \
		--skip-test-db </dev/null >>mariadb.log.install 2>&1 9>&- ||
		fail "mariadb-install-db failed" mariadb.log.install
}

mariadb_start() {
	detach "$BIN" --no-defaults --datadir="$PWD/data" --bind-address=127.0.0.1 --port="$1" \
		--socket="$PWD/mariadb.sock" --pid-file="$PWD/data/mariadbd.pid" --log-error="$PWD/mariadb.log"
}

mariadb_ready() {
	mariadb-admin --no-defaults --protocol=tcp -h 127.0.0.1 -P "$1" -u root --connect-timeout=2 ping </dev/null >/dev/null 2>&1
}

mariadb_after() {
	mariadb --no-defaults -S "$PWD/mariadb.sock" -u root -e 'CREATE DATABASE IF NOT EXISTS test' </dev/null ||
		die "mariadb: creating database 'test' failed"
}

# --- nats: one server with JetStream, built from its Go module.
nats_start() { detach "$BIN" -a 127.0.0.1 -p "$1" -js -sd "$PWD/data" -P "$PWD/nats.pid"; }

nats_ready() { [[ $(timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1; head -c 4 <&3" 2>/dev/null) == INFO ]]; }

# ------------------------------------------------------------------- the rest

if [[ -n "${LOCK_SERVICES_DIR:-}" ]]; then
	DIR=$LOCK_SERVICES_DIR
elif [[ $EUID -eq 0 ]]; then
	DIR=/var/cache/ubgo-lock
else
	DIR=${XDG_CACHE_HOME:-$HOME/.cache}/ubgo-lock
fi
DIR=$(readlink -m "$DIR")
APT_LOG=$DIR/apt.log
APT_UPDATED=0

# Serialise concurrent invocations (e.g. two test runs). fd 9 must be
# closed (9>&-) for every long-lived child, or the daemon would keep the lock.
take_lock() {
	# As root the services' users must be able to pass through it.
	[[ -d $DIR ]] || { mkdir -p "$DIR" && chmod 755 "$DIR"; }
	exec 9>"$DIR/services.lock" || die "cannot open lock file $DIR/services.lock"
	flock -w 900 9 || die "timed out waiting for $DIR/services.lock"
}

# tcp_open PORT — is something accepting connections on 127.0.0.1:PORT?
tcp_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# use SVC — make SVC the current service: its variables, and its directory
# as the working directory when it exists.
use() {
	[[ -v "VAR[$1]" ]] || die "unknown service '$1' (want one of: ${ALL[*]})"
	SVC=$1 PORT=$(port "$1") PIDFILE=$DIR/$1/${PIDF[$1]} LOG=$DIR/$1/$1.log BIN="" LAUNCHED=""
	OWNER=${RUNAS[$1]:-} COMM=${PROG[$1]##*/} && COMM=${COMM:0:15}
	[[ $EUID -eq 0 ]] || OWNER=""
	cd "$DIR/$1" 2>/dev/null || cd /
}

hook() { if declare -F "${SVC}_$1" >/dev/null; then "${SVC}_$1" "${@:2}"; fi; }

# as_owner CMD... — run CMD as the service's user when we are root (initdb,
# pgbouncer and mariadbd refuse root), else as ourselves.
as_owner() { if [[ -n $OWNER ]]; then runuser -u "$OWNER" -- "$@"; else "$@"; fi; }

# write_conf FILE [COMMENT] — FILE gets stdin (under a COMMENT line saying
# so); CHANGED=1 when that changed it.
write_conf() {
	local tmp
	tmp=$(mktemp)
	{
		[[ -z ${2:-} ]] || echo "$2 Written by scripts/services.sh at every 'up'; edits are overwritten."
		cat
	} >"$tmp"
	if ! cmp -s "$tmp" "$1"; then
		as_owner tee "$1" <"$tmp" >/dev/null
		CHANGED=1
	fi
	rm -f "$tmp"
}

# detach CMD... — start a server in a session of its own, as its user, in
# the current directory, with all stdio appended to its log.
detach() {
	local run=("$@")
	[[ -z $OWNER ]] || run=(runuser -u "$OWNER" -- "$@")
	[[ -e $LOG ]] || as_owner touch "$LOG" # the server may open it itself
	printf '\n==== %s services.sh starting %s\n' "$(date -Is)" "$*" >>"$LOG"
	(exec setsid nohup "${run[@]}" </dev/null >>"$LOG" 2>&1 9>&-) &
	LAUNCHED=$!
}

# ------------------------------------------------------------ who is ours

# our_pid PID — is PID a live process with the current service's name whose
# working directory is its pid file's? Servers run in their directories,
# so a stale pid file never makes us signal someone else's process.
our_pid() {
	[[ "$1" =~ ^[0-9]+$ ]] && kill -0 "$1" 2>/dev/null || return 1
	[[ "$(cat "/proc/$1/comm" 2>/dev/null)" == "$COMM" ]] || return 1
	[[ "$(readlink "/proc/$1/cwd" 2>/dev/null)" == "$(readlink -f "${PIDFILE%/*}")" ]]
}

# pid_of — our server's pid: from its pid file or, when that is stale,
# the process of its name in its directory whose parent is not (not a
# postgres backend).
pid_of() {
	local pid
	pid=$(head -n 1 "$PIDFILE" 2>/dev/null) && our_pid "$pid" && { echo "$pid"; return 0; }
	for pid in $(pgrep -x "$COMM" 2>/dev/null); do
		our_pid "$pid" && ! our_pid "$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null)" && { echo "$pid"; return 0; }
	done
	return 1
}

# wait_ready — until ours answers, for up to 60 s; fails early if it died.
wait_ready() {
	local i
	for ((i = 0; i < 300; i++)); do
		pid_of >/dev/null && hook ready "$PORT" && return 0
		pid_of >/dev/null || { [[ -n $LAUNCHED ]] && kill -0 "$LAUNCHED" 2>/dev/null; } || return 1
		sleep 0.2
	done
	return 1
}

# stop_pid PID — the service's stop signal, wait up to 30 s, then SIGKILL.
stop_pid() {
	local i
	kill -"${SIG[$SVC]}" "$1" 2>/dev/null || return 0
	for ((i = 0; i < 150; i++)); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.2
	done
	log "$SVC: pid $1 still running after 30 s, killing it"
	kill -KILL "$1" 2>/dev/null || true
}

# external SVC — does its LOCK_TEST_* variable name a server that is not
# ours? Each endpoint (host:port, URL, key=value or MySQL DSN) is ours only
# on loopback or a socket in our directory, at our port; no port is the
# client's standard one, not ours.
external() {
	local name=${VAR[$1]} v ep host port
	v=${!name:-}
	[[ -z $v ]] && return 1
	if [[ $v =~ (^|[[:space:]])[a-z_]+= ]]; then # key=value
		host="" port=""
		[[ $v =~ (^|[[:space:]])host=([^[:space:]]*) ]] && host=${BASH_REMATCH[2]//\'/}
		[[ $v =~ (^|[[:space:]])port=([^[:space:]]*) ]] && port=${BASH_REMATCH[2]//\'/}
		ours "$1" "$host" "$port" && return 1
		return 0
	fi
	[[ $v =~ (tcp|unix)\(([^\)]*)\) ]] && v=${BASH_REMATCH[2]} # user@tcp(host:port)/db
	for ep in ${v//,/ }; do
		ep=${ep#*://} ep=${ep%%[/?]*} ep=${ep##*@}
		host=$ep port=""
		if [[ $ep =~ ^\[([^]]*)\](:([0-9]*))?$ ]]; then
			host=${BASH_REMATCH[1]} port=${BASH_REMATCH[3]}
		elif [[ $ep =~ ^([^:]*):([0-9]*)$ ]]; then
			host=${BASH_REMATCH[1]} port=${BASH_REMATCH[2]}
		fi
		ours "$1" "$host" "$port" || return 0
	done
	return 1
}

# ours SVC HOST PORT — loopback or a socket in our directory, at our port.
ours() {
	case $2 in 127.0.0.1 | localhost | ::1 | "$DIR"/*) [[ $3 == "$(port "$1")" ]] ;; *) return 1 ;; esac
}

# ----------------------------------------------------------------- programs

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

# locate — the current service's program: built from its module into
# $DIR/go/PROGRAM@VERSION, or the newest match of its glob, or on PATH.
locate() {
	local p=${PROG[$SVC]} src=${SRC[$SVC]}
	if [[ $src == go:* ]]; then
		p=$DIR/go/$p@${src##*@}/$p
	elif [[ $p == */* ]]; then
		# shellcheck disable=SC2086 # the glob
		p=$(printf '%s\n' $p | sort -V | tail -n 1)
	else
		p=$(PATH=$PATH:/usr/sbin:/usr/local/bin command -v "$p" 2>/dev/null) || return 1
	fi
	[[ -x $p ]] && echo "$p"
}

# find_bin [install] — sets BIN to the current service's program; with
# install, installs its source first when it is missing.
find_bin() {
	BIN=$(locate) && return 0
	[[ ${1:-} == install ]] || return 1
	local src=${SRC[$SVC]} rc=0
	if [[ $src == go:* ]]; then
		log "$SVC: go install ${src#go:} (log: $DIR/go/install.log)"
		mkdir -p "$DIR/go"
		(cd "$DIR/go" && GOBIN=$DIR/go/${PROG[$SVC]}@${src##*@} go install "${src#go:}" \
			</dev/null >>install.log 2>&1 9>&-) || rc=$?
		((rc == 0)) || { tail -n 20 "$DIR/go/install.log" >&2; die "$SVC: go install ${src#go:} failed"; }
	else
		# shellcheck disable=SC2086 # a list of packages
		apt_install $src
	fi
	BIN=$(locate) || die "$SVC: $src installed, but no ${PROG[$SVC]}"
}

# ---------------------------------------------------------------- commands

# leave_alone — is the current service someone else's to run? Says why.
leave_alone() {
	if external "$SVC"; then
		log "$SVC: ${VAR[$SVC]} names another server, leaving it alone"
	elif [[ -n ${NEEDS[$SVC]:-} ]] && external "${NEEDS[$SVC]}"; then
		log "$SVC: ${VAR[${NEEDS[$SVC]}]} names another server, so ours (which serves only our ${NEEDS[$SVC]}) is not started; set ${VAR[$SVC]} to one in front of yours"
	else
		return 1
	fi
}

up() {
	use "$1"
	leave_alone && return 0
	local pid what=started p
	[[ -d $DIR/$SVC ]] || mkdir -m 700 "$DIR/$SVC"
	cd "$DIR/$SVC"
	if [[ -n $OWNER ]]; then
		id "$OWNER" >/dev/null 2>&1 || die "$SVC: no user $OWNER to run it as (it comes with ${SRC[$SVC]})"
		chown "$OWNER:" .
		runuser -u "$OWNER" -- test -w . ||
			die "$SVC: the $OWNER user cannot reach $PWD; set LOCK_SERVICES_DIR to a directory it can"
	fi
	find_bin install
	CHANGED=0
	hook prepare "$PORT"
	if pid=$(pid_of); then
		# Ours may still be starting (or got slow): give it time instead of racing it.
		wait_ready || die "$SVC: our server (pid $pid) does not answer on 127.0.0.1:$PORT (log: $LOG)"
		if ((CHANGED == 0)) && hook current; then
			what="already running"
		else
			log "$SVC: our server's configuration is out of date, restarting it"
			stop_pid "$pid"
			what=restarted
		fi
	fi
	if [[ $what != "already running" ]]; then
		for p in ${PORTS[$SVC]}; do
			! tcp_open "$p" || die "$SVC: 127.0.0.1:$p is in use by another program; free it, or point ${VAR[$SVC]} at a server of your choosing"
		done
		hook start "$PORT"
		wait_ready || fail "did not come up on 127.0.0.1:$PORT" "${LOG##*/}"
	fi
	hook after "$PORT"
	log "$SVC: $what on 127.0.0.1:$PORT (pid $(pid_of), dir $DIR/$SVC, log $LOG)"
}

down() {
	use "$1"
	local pid
	if ! pid=$(pid_of); then
		log "$SVC: not running"
		return 0
	fi
	stop_pid "$pid"
	log "$SVC: stopped (pid $pid)"
}

# status SVC [quiet] — one line; fails if ours is down (quiet: says nothing then).
status() {
	use "$1"
	local pid
	if external "$SVC"; then
		echo "$SVC: external (${VAR[$SVC]})"
	elif [[ -n ${NEEDS[$SVC]:-} ]] && external "${NEEDS[$SVC]}"; then
		echo "$SVC: not ours to run (${VAR[${NEEDS[$SVC]}]} names another server)"
	elif pid=$(pid_of) && find_bin && hook ready "$PORT"; then
		echo "$SVC: up (127.0.0.1:$PORT, pid $pid, dir $DIR/$SVC)"
	else
		[[ -n ${2:-} ]] || echo "$SVC: down"
		return 1
	fi
}

usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0" >&2; }

main() {
	local cmd=${1:-up} s down=0 names=()
	(($# > 0)) && shift
	for s in "$@"; do use "$s"; done # unknown names fail here
	case $cmd in
	up)
		take_lock
		for s in "${ALL[@]}"; do [[ -n ${ASKED[$s]:-} ]] || names+=("$s"); done
		(($#)) || set -- "${names[@]}"
		for s in "$@"; do up "$s"; done
		;;
	down)
		take_lock
		(($#)) || set -- "${ALL[@]}"
		for s in "$@"; do down "$s"; done
		;;
	status)
		if (($#)); then
			for s in "$@"; do status "$s" || down=1; done
		else # asked-for services only when they run
			for s in "${ALL[@]}"; do status "$s" ${ASKED[$s]:+quiet} || ((${ASKED[$s]:-0})) || down=1; done
		fi
		return "$down"
		;;
	bin | etcd-bin)
		[[ $cmd == bin ]] || set -- etcd
		(($# == 1)) || die "bin wants one service"
		use "$1"
		find_bin || { take_lock && find_bin install; }
		printf '%s\n' "$BIN"
		;;
	-h | --help | help) usage ;;
	*)
		usage
		die "unknown command '$cmd'"
		;;
	esac
}

main "$@"
