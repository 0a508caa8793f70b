// Package hostpid translates the pids a test driver sees into the host's: a driver runs in a
// pid namespace of its own, while /proc is the host's, so the pids a driver reports for the
// host's tests to check must be the host's.
package hostpid

import (
	"os"
	"strconv"
	"strings"
)

// Self is this process's pid as the host sees it (/proc/self of the host's /proc).
func Self() int {
	s, err := os.Readlink("/proc/self")
	if err != nil {
		return os.Getpid()
	}
	pid, err := strconv.Atoi(s)
	if err != nil {
		return os.Getpid()
	}
	return pid
}

// Of returns the host's pid of the process that is pid in this process's pid namespace; pid
// itself when this process is in the host's namespace or the process is not found.
func Of(pid int) int {
	own := nsPids("self")
	if len(own) < 2 {
		return pid
	}
	ownNS, _ := os.Readlink("/proc/self/ns/pid")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return pid
	}
	for _, e := range entries {
		f := nsPids(e.Name())
		if len(f) != len(own) || f[len(f)-1] != strconv.Itoa(pid) {
			continue
		}
		if ns, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err == nil && ns == ownNS {
			if host, err := strconv.Atoi(f[0]); err == nil {
				return host
			}
		}
	}
	return pid
}

// nsPids is the NSpid line of /proc/PID/status: the pid in each namespace, the host's first.
func nsPids(pid string) []string {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return nil
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}
