// Package hostpid names the processes a test driver reports to the host's tests. A driver runs
// in a pid namespace of its own and, where the host can mount one, with a /proc of that
// namespace: it cannot see its pid as the host sees it. So a driver reports a Ref: the host's
// pid where its /proc shows it (the machine's /proc), otherwise its pid in its namespace and
// the namespace's identity ("PID@pid:[INODE]", readlink /proc/self/ns/pid, which any /proc
// shows). The host's tests turn a Ref into the host's pid with Resolve, by scanning the host's
// /proc for the process of that namespace with that pid, while it exists.
package hostpid

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Self is this process's Ref.
func Self() string {
	own := nsPids("self")
	if len(own) >= 2 {
		return own[0] // the machine's /proc: the pid in the host's namespace comes first
	}
	return ref(os.Getpid())
}

// Of is the Ref of the process that is pid in this process's pid namespace: with the machine's
// /proc, its host pid (pid itself when this process is in the host's namespace or the process
// is not found).
func Of(pid int) string {
	own := nsPids("self")
	if len(own) < 2 {
		return ref(pid)
	}
	ownNS, _ := os.Readlink("/proc/self/ns/pid")
	if host, ok := find(strconv.Itoa(pid), len(own), ownNS); ok {
		return strconv.Itoa(host)
	}
	return strconv.Itoa(pid)
}

// ref is pid of this process's namespace with the namespace's identity; the plain pid where
// the namespace cannot be read.
func ref(pid int) string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return strconv.Itoa(pid)
	}
	return strconv.Itoa(pid) + "@" + ns
}

// ErrGone: no process of the Ref's pid namespace has its pid (any more).
var ErrGone = errors.New("no such process")

// Resolve turns a Ref into the pid the calling process (the host's test) sees it by: a plain
// pid is one already; a namespace's pid is found in the caller's /proc, ErrGone when no
// process of that namespace has it. A Ref that is neither is an error.
func Resolve(r string) (int, error) {
	pid, ns, found := strings.Cut(strings.TrimSpace(r), "@")
	n, err := strconv.Atoi(pid)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("not a pid reference: %q", r)
	}
	if !found {
		return n, nil
	}
	if !strings.HasPrefix(ns, "pid:[") || !strings.HasSuffix(ns, "]") {
		return 0, fmt.Errorf("not a pid namespace in %q", r)
	}
	if own, err := os.Readlink("/proc/self/ns/pid"); err == nil && own == ns {
		return n, nil
	}
	if host, ok := find(pid, 0, ns); ok {
		return host, nil
	}
	return 0, ErrGone
}

// find scans /proc for the process whose pid in the namespace ns is pid (the last of its
// NSpid) and returns its pid in /proc's namespace (the first); levels > 0: only a process with
// that many NSpid entries.
func find(pid string, levels int, ns string) (int, bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		f := nsPids(e.Name())
		if len(f) < 2 || (levels > 0 && len(f) != levels) || f[len(f)-1] != pid {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err == nil && l == ns {
			if host, err := strconv.Atoi(f[0]); err == nil {
				return host, true
			}
		}
	}
	return 0, false
}

// nsPids is the NSpid line of /proc/PID/status: the pid in each namespace, /proc's first.
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
