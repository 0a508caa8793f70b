package pluginhost

import (
	"os"
	"testing"
)

// childProcesses lists the pids whose parent is this process, from the host's own reading of
// /proc (processTable).
func childProcesses(tb testing.TB) []int {
	tb.Helper()
	return childPids()
}

// childPids lists the pids whose parent is this process.
func childPids() []int {
	me := os.Getpid()
	var out []int
	for _, p := range processTable() {
		if p.ppid == me {
			out = append(out, p.pid)
		}
	}
	return out
}

// descendantsOf lists the descendants of pid.
func descendantsOf(pid int) []int {
	table := processTable()
	var out []int
	for i := 0; i <= len(out); i++ {
		parent := pid
		if i > 0 {
			parent = out[i-1]
		}
		for _, p := range table {
			if p.ppid == parent {
				out = append(out, p.pid)
			}
		}
	}
	return out
}
