module github.com/ubgo/lock/memlock

go 1.26.0

require github.com/ubgo/lock v0.0.0

replace github.com/ubgo/lock => ../
