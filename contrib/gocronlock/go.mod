module github.com/ubgo/lock/contrib/gocronlock

go 1.26.0

require (
	github.com/go-co-op/gocron/v2 v2.21.2
	github.com/google/uuid v1.6.0
	github.com/ubgo/lock v0.0.0
	github.com/ubgo/lock/memlock v0.0.0
)

require (
	github.com/jonboulle/clockwork v0.5.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
)

replace (
	github.com/ubgo/lock => ../..
	github.com/ubgo/lock/memlock => ../../memlock
)
