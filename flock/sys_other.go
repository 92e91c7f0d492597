//go:build !(unix && !aix && !hurd) && !windows

package flock

import (
	"errors"
	"time"
)

type sysFile = int

const noFile sysFile = -1

type fileID struct{}

var errUnsupported = errors.New("flock: file locks are not supported on this platform")

func sysOpen(string, bool, bool) (sysFile, error)  { return noFile, errUnsupported }
func sysClose(sysFile)                             {}
func sysTryLock(sysFile, bool) (bool, error)       { return false, errUnsupported }
func sysUnlock(sysFile) error                      { return errUnsupported }
func sysDowngrade(sysFile) (bool, error)           { return false, errUnsupported }
func sysPread(sysFile, []byte, int64) (int, error) { return 0, errUnsupported }
func sysPwrite(sysFile, []byte, int64) error       { return errUnsupported }
func sysStat(sysFile) (fileID, time.Time, error)   { return fileID{}, time.Time{}, errUnsupported }
func sysSameFile(sysFile, string) (bool, error)    { return false, errUnsupported }
func sysRemove(string) error                       { return errUnsupported }
func sysRetryOpen(error) bool                      { return false }
