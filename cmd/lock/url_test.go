//go:build unix

package main

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// The Redis Cluster form: seed nodes as a host list (or go-redis' addr
// parameters), credentials, options, TLS with rediss+cluster.
func TestClusterURL(t *testing.T) {
	o, err := clusterOptions("redis+cluster://u:pw@h1:7000,h2:7001?dial_timeout=3s&addr=h3:7002")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"h1:7000", "h3:7002", "h2:7001"}; !sameElements(o.Addrs, want) || o.Username != "u" || o.Password != "pw" || o.DialTimeout != 3*time.Second || o.TLSConfig != nil {
		t.Errorf("options %+v, want seeds %v, user u, password pw, dial timeout 3s, no TLS", o, want)
	}
	if o, err := clusterOptions("rediss+cluster://h1:7000"); err != nil || o.TLSConfig == nil || !slices.Equal(o.Addrs, []string{"h1:7000"}) {
		t.Errorf("rediss+cluster: %+v, %v; want TLS to h1:7000", o, err)
	}
	for _, bad := range []string{"redis+cluster://h1:1,,h2:2", "redis+cluster://h1:1/2", "redis+cluster://h1:1?no_such_option=1"} {
		if _, err := clusterOptions(bad); !errors.Is(err, errBadURL) {
			t.Errorf("%s: %v, want a bad URL", bad, err)
		}
	}
}

func sameElements(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func TestEtcdURL(t *testing.T) {
	cfg, err := etcdConfig("etcd://root:pw@h1:2379,h2:2379")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Endpoints, []string{"h1:2379", "h2:2379"}) || cfg.Username != "root" || cfg.Password != "pw" || cfg.TLS != nil {
		t.Errorf("config %+v", cfg)
	}
	cfg, err = etcdConfig("etcds://h1:2379")
	if err != nil || cfg.TLS == nil || !slices.Equal(cfg.Endpoints, []string{"https://h1:2379"}) {
		t.Errorf("etcds: %+v, %v; want TLS to https://h1:2379", cfg, err)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://u:secret@h:1/0":                       "redis://u:xxxxx@h:1/0",
		"redis://:secret@h:1":                          "redis://:xxxxx@h:1",
		"postgres://u@h/db?sslmode=disable&password=x": "postgres://u@h/db?sslmode=disable&password=xxxxx",
		"etcd://u:p@w@h1:2379,h2:2379":                 "etcd://u:xxxxx@h1:2379,h2:2379",
		"flock:///var/run":                             "flock:///var/run",
		"redis+cluster://u:pw@h1:1,h2:2/":              "redis+cluster://u:xxxxx@h1:1,h2:2/",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
