//go:build unix

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// connectTimeout bounds the first round trip to a server: one that has not
// answered by then is unreachable (exitUnavailable).
const connectTimeout = 5 * time.Second

// factory is what every backend's Factory has in common.
type factory interface {
	AsLocker(opts ...lock.Option) lock.Locker
	lock.Inspector
	lock.Lister
	Err() error
	Close() error
}

// A backend is an open connection to the store a URL names.
type backend struct {
	kind string // "flock", "filelock", "pglock", "redislock", "etcdlock"
	factory
	// ttl is the default lease of a lease backend, 0 for flock and pglock,
	// whose locks end with a file descriptor or a session.
	ttl   time.Duration
	close func() // closes the client after the factory
}

func (b *backend) Close() {
	b.factory.Close()
	if b.close != nil {
		b.close()
	}
}

// errBadURL marks a --backend value that names no usable backend.
var errBadURL = errors.New("bad backend URL")

// errUnavailable marks a server that could not be reached.
var errUnavailable = errors.New("backend unreachable")

// open connects to the backend raw names and checks, with one round trip
// bounded by connectTimeout, that its server answers. prefix is passed to
// the backends with key prefixes (WithKeyPrefix); "" keeps their default.
func open(ctx context.Context, raw, prefix string) (*backend, error) {
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("%w %q: want scheme://..., one of flock, file, postgres, postgresql, redis, rediss, redis+cluster, rediss+cluster, etcd, etcds", errBadURL, redact(raw))
	}
	// lock prints its own one-line messages: the library's logs stay off
	// stderr, which cron mails (go-redis' too, see quiet).
	opts := []lock.Option{lock.WithLogger(nil)}
	if prefix != "" {
		opts = append(opts, lock.WithKeyPrefix(prefix))
	}
	var b *backend
	var ping func(ctx context.Context) error
	switch scheme {
	case "flock", "file":
		dir, err := dirOf(raw)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%w %q: %s is not a directory", errBadURL, redact(raw), dir)
		}
		if scheme == "flock" {
			b = &backend{kind: "flock", factory: flock.NewFactory(append(opts, flock.WithDir(dir))...)}
		} else {
			b = &backend{kind: "filelock", factory: filelock.NewFactory(append(opts, filelock.WithDir(dir))...), ttl: filelock.DefaultStaleAfter}
		}
	case "postgres", "postgresql":
		cfg, err := pgxpool.ParseConfig(raw)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", errBadURL, redact(raw), err)
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", errBadURL, redact(raw), err)
		}
		b = &backend{kind: "pglock", factory: pglock.NewFactory(pool, opts...), close: pool.Close}
		ping = pool.Ping
	case "redis", "rediss":
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", errBadURL, redact(raw), err)
		}
		rdb := redis.NewClient(o)
		b = &backend{kind: "redislock", factory: redislock.NewFactory(rdb, opts...), ttl: redislock.DefaultTTL, close: func() { rdb.Close() }}
		ping = func(ctx context.Context) error { return rdb.Ping(ctx).Err() }
	case "redis+cluster", "rediss+cluster":
		o, err := clusterOptions(raw)
		if err != nil {
			return nil, err
		}
		rdb := redis.NewClusterClient(o)
		b = &backend{kind: "redislock", factory: redislock.NewFactory(rdb, opts...), ttl: redislock.DefaultTTL, close: func() { rdb.Close() }}
		ping = func(ctx context.Context) error {
			return rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
		}
	case "etcd", "etcds":
		cfg, err := etcdConfig(raw)
		if err != nil {
			return nil, err
		}
		cli, err := clientv3.New(cfg)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", errBadURL, redact(raw), err)
		}
		b = &backend{kind: "etcdlock", factory: etcdlock.NewFactory(cli, opts...), ttl: etcdlock.DefaultTTL, close: func() { cli.Close() }}
		ping = func(ctx context.Context) error {
			// Any endpoint that answers will do: the client fails over.
			var errs []error
			for _, ep := range cfg.Endpoints {
				_, err := cli.Status(ctx, ep)
				if err == nil {
					return nil
				}
				errs = append(errs, err)
			}
			return errors.Join(errs...)
		}
	default:
		return nil, fmt.Errorf("%w %q: unknown scheme %q; want flock, file, postgres, postgresql, redis, rediss, redis+cluster, rediss+cluster, etcd or etcds", errBadURL, redact(raw), scheme)
	}
	if err := b.Err(); err != nil {
		b.Close()
		return nil, fmt.Errorf("%w %q: %v", errBadURL, redact(raw), err)
	}
	if ping != nil {
		pctx, cancel := context.WithTimeout(ctx, connectTimeout)
		err := ping(pctx)
		cancel()
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("%w: %s at %s: %v", errUnavailable, b.kind, redact(raw), err)
		}
	}
	return b, nil
}

// dirOf is the directory of a flock:///dir or file:///dir URL.
func dirOf(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%w %q: %v", errBadURL, redact(raw), err)
	}
	if u.Host != "" && u.Host != "localhost" || u.Path == "" || u.RawQuery != "" || u.User != nil {
		return "", fmt.Errorf("%w %q: want %s:///absolute/dir (three slashes, no host, no query)", errBadURL, redact(raw), u.Scheme)
	}
	return u.Path, nil
}

// hostsURL splits scheme://[user[:password]@]h1:p1,h2:p2[/path][?query],
// which net/url does not parse (a host list is no host).
func hostsURL(raw string) (u *url.URL, hosts []string, err error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo, hostlist := "", authority
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		userinfo, hostlist = authority[:i+1], authority[i+1:]
	}
	for _, h := range strings.Split(hostlist, ",") {
		if h == "" {
			return nil, nil, fmt.Errorf("%w %q: empty host in the host list", errBadURL, redact(raw))
		}
		hosts = append(hosts, h)
	}
	// The first host stands for the list, so that url.Parse checks the rest.
	u, err = url.Parse(scheme + "://" + userinfo + hosts[0] + tail)
	if err != nil {
		return nil, nil, fmt.Errorf("%w %q: %v", errBadURL, redact(raw), err)
	}
	return u, hosts, nil
}

// clusterOptions parses redis+cluster://[user:password@]h1:p1,h2:p2[?opts]
// (rediss+cluster:// for TLS): the seed nodes of a Redis Cluster, and
// go-redis' cluster options as query parameters (redis.ParseClusterURL,
// whose own form, redis://h1:p1?addr=h2:p2, is accepted after the +cluster
// scheme too).
func clusterOptions(raw string) (*redis.ClusterOptions, error) {
	u, hosts, err := hostsURL(raw)
	if err != nil {
		return nil, err
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("%w %q: a cluster has no database number (path %q)", errBadURL, redact(raw), u.Path)
	}
	u.Scheme = strings.TrimSuffix(u.Scheme, "+cluster")
	q := u.Query()
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	u.RawQuery = q.Encode()
	o, err := redis.ParseClusterURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", errBadURL, redact(raw), err)
	}
	return o, nil
}

// etcdConfig parses etcd://[user:password@]h1:2379,h2:2379 (etcds:// for
// TLS with the system's roots).
func etcdConfig(raw string) (clientv3.Config, error) {
	u, hosts, err := hostsURL(raw)
	if err != nil {
		return clientv3.Config{}, err
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" {
		return clientv3.Config{}, fmt.Errorf("%w %q: want etcd://host:port[,host:port...], no path or query (use --key-prefix for a prefix)", errBadURL, redact(raw))
	}
	// No DialTimeout: with one, New would block on the dial, and an
	// unreachable cluster would look like a bad URL; open's Status call
	// finds it instead.
	cfg := clientv3.Config{Endpoints: hosts, Logger: zap.NewNop()}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	if u.Scheme == "etcds" {
		cfg.TLS = &tls.Config{}
		for i, h := range cfg.Endpoints {
			cfg.Endpoints[i] = "https://" + h
		}
	}
	return cfg, nil
}

// quiet discards go-redis' own log lines (a failed dial is logged once
// per attempt): open reports the error once, clearly.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quiet{}) }

// passwordParam is a password given as a query parameter (pgx takes one).
var passwordParam = regexp.MustCompile(`(?i)([?&]password=)[^&]*`)

// redact hides the password of a URL in messages: the userinfo's and a
// password query parameter.
func redact(raw string) string {
	raw = passwordParam.ReplaceAllString(raw, "${1}xxxxx")
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority = rest[:i]
	}
	at := strings.LastIndexByte(authority, '@')
	if at < 0 {
		return raw
	}
	user, _, hasPassword := strings.Cut(authority[:at], ":")
	if !hasPassword {
		return raw
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}
