module github.com/ubgo/lock/flock

go 1.26.0

require (
	github.com/ubgo/lock v0.0.0
	golang.org/x/sys v0.50.0
)

replace github.com/ubgo/lock => ..
