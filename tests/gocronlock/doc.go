// Package gocronlock runs contrib/gocronlock's scheduler scenarios (timer
// skew, a long job, elector hand-overs) on memlock and on Redis, and who
// runs a job (replicas in processes of their own) on Redis, PostgreSQL and
// etcd. They live in the tests module so that the published gocronlock
// module requires no Redis client; its unit tests stay beside its code.
package gocronlock
