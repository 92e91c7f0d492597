module github.com/ubgo/lock

go 1.24
