module github.com/ubgo/lock/memlock

go 1.24

require github.com/ubgo/lock v0.0.0

replace github.com/ubgo/lock => ../
