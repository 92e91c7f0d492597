module github.com/ubgo/lock

go 1.26.0
