module github.com/ubgo/lock/tests

go 1.26.0

require (
	github.com/go-co-op/gocron/v2 v2.21.2
	github.com/google/uuid v1.6.0
	github.com/jonboulle/clockwork v0.5.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/ubgo/lock v0.0.0
	github.com/ubgo/lock/contrib/gocronlock v0.0.0
	github.com/ubgo/lock/memlock v0.0.0
	github.com/ubgo/lock/redislock v0.0.0
	golang.org/x/mod v0.43.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace (
	github.com/ubgo/lock => ../
	github.com/ubgo/lock/contrib/gocronlock => ../contrib/gocronlock
	github.com/ubgo/lock/memlock => ../memlock
	github.com/ubgo/lock/redislock => ../redislock
)
