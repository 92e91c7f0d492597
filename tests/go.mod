module github.com/ubgo/lock/tests

go 1.24

require (
	github.com/ubgo/lock v0.0.0
	github.com/ubgo/lock/memlock v0.0.0
)

replace (
	github.com/ubgo/lock => ../
	github.com/ubgo/lock/memlock => ../memlock
)
