//go:build race

package wal_test

// raceEnabled: the race runtime keeps state per goroutine ever started (the
// window and the router start one per event), so RSS ceilings are higher.
const raceEnabled = true
