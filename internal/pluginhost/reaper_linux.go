//go:build linux

package pluginhost

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// reaper ends the descendants of drivers. The host process is a child subreaper: a process a
// driver started and then left (double fork, setsid) is reparented to the host, not to init, so
// the host can still end it and must reap it.
type reaper struct {
	self int

	mu     sync.Mutex   // one sweep at a time; guards groups and seen
	groups map[int]bool // pids of the drivers started: each leads its own process group
	seen   map[int]bool // host children seen alive with a worker marker (orphans of drivers)

	cgroups *cgroupRoot // the worker cgroups; nil: none
}

var subreaperOnce sync.Once

// newReaper sets the host up to contain drivers (once per process: a child subreaper, not
// dumpable, the launcher and cgroups; see hostContainment), logs what drivers run without, and
// returns a reaper. Every host start goes through it.
func newReaper(log hclog.Logger) *reaper {
	subreaperOnce.Do(func() {
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	})
	containment.setUp().warn(log)
	return &reaper{self: os.Getpid(), groups: map[int]bool{}, seen: map[int]bool{}, cgroups: containment.cgroups}
}

// started records a driver process: its process group is a driver's.
func (r *reaper) started(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.groups[pid] = true
}

// reapZombies reaps the host's zombie children that came from drivers: orphans that ended on
// their own while their driver ran (members of a worker cgroup, whatever their shape; without
// cgroups, members of a driver's process group, or seen alive with a worker marker). A driver
// process itself is reaped by its own wait, and any other child is left to whoever started it.
func (r *reaper) reapZombies() {
	r.mu.Lock()
	defer r.mu.Unlock()
	table := processTable()
	present := map[int]bool{}
	for _, p := range table {
		present[p.pid], present[p.pgid] = true, true
		if p.ppid != r.self || r.groups[p.pid] {
			continue
		}
		if !p.zombie {
			if !r.seen[p.pid] && hasAnyMarker(p.pid) {
				r.seen[p.pid] = true
			}
			continue
		}
		if r.groups[p.pgid] || r.seen[p.pid] || r.inWorkerCgroup(p.pid) {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(p.pid, &ws, unix.WNOHANG, nil)
			delete(r.seen, p.pid)
		}
	}
	for pid := range r.seen {
		if !present[pid] {
			delete(r.seen, pid)
		}
	}
	for pid := range r.groups {
		if !present[pid] { // neither the driver nor any member of its group is left
			delete(r.groups, pid)
		}
	}
}

// inWorkerCgroup reports whether process pid is (or, a zombie, was) in one of the host's worker
// cgroups.
func (r *reaper) inWorkerCgroup(pid int) bool {
	if r.cgroups == nil {
		return false
	}
	rel, err := cgroupOf(strconv.Itoa(pid))
	return err == nil && r.cgroups.owns(rel)
}

// reapCgroup reaps the host's zombie children that were in the worker cgroup rel (other than
// driver processes, which their own wait reaps).
func (r *reaper) reapCgroup(rel string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range processTable() {
		if p.ppid != r.self || !p.zombie || r.groups[p.pid] {
			continue
		}
		if got, err := cgroupOf(strconv.Itoa(p.pid)); err == nil && got == rel {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(p.pid, &ws, unix.WNOHANG, nil)
		}
	}
}

// hasAnyMarker reports whether process pid carries a worker marker in its environment.
func hasAnyMarker(pid int) bool {
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return false
	}
	return bytes.Contains(env, []byte("\x00"+workerMarkerEnv+"=")) || bytes.HasPrefix(env, []byte(workerMarkerEnv+"="))
}

// procInfo is one line of the process table.
type procInfo struct {
	pid, ppid, pgid int
	zombie          bool
}

// processTable reads /proc.
func processTable() []procInfo {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := make([]procInfo, 0, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold anything, so parse after the last ')'.
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgid, _ := strconv.Atoi(f[2])
		out = append(out, procInfo{pid: pid, ppid: ppid, pgid: pgid, zombie: f[0] == "Z" || f[0] == "X"})
	}
	return out
}

// hasMarker reports whether process pid carries the worker marker in its environment.
func hasMarker(pid int, marker string) bool {
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return false
	}
	return bytes.Contains(env, []byte("\x00"+workerMarkerEnv+"="+marker+"\x00")) ||
		bytes.HasPrefix(env, []byte(workerMarkerEnv+"="+marker+"\x00"))
}

// family returns the processes attributable to the driver root (excluding root itself): its
// descendants, the members of its process group, and the host's children that carry its marker.
func (r *reaper) family(table []procInfo, root int, marker string) []procInfo {
	children := map[int][]procInfo{}
	for _, p := range table {
		children[p.ppid] = append(children[p.ppid], p)
	}
	seen := map[int]bool{root: true}
	var out []procInfo
	var walk func(pid int)
	walk = func(pid int) {
		for _, c := range children[pid] {
			if !seen[c.pid] {
				seen[c.pid] = true
				out = append(out, c)
				walk(c.pid)
			}
		}
	}
	walk(root)
	for _, p := range table {
		if seen[p.pid] {
			continue
		}
		if p.pgid == root || (p.ppid == r.self && !p.zombie && hasMarker(p.pid, marker)) {
			seen[p.pid] = true
			out = append(out, p)
			walk(p.pid)
		}
	}
	return out
}

// endFamily freezes (SIGSTOP) every process attributable to the driver root until no new one
// appears, so none can fork away, then kills them all and returns their pids. The driver itself
// is left to its caller; once it is gone, its killed descendants are the host's children and
// reapOrphans reaps them.
func (r *reaper) endFamily(root int, marker string) map[int]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	stopped := map[int]bool{}
	for round := 0; round < 50; round++ {
		fresh := 0
		for _, p := range r.family(processTable(), root, marker) {
			if !stopped[p.pid] {
				stopped[p.pid] = true
				_ = syscall.Kill(p.pid, syscall.SIGSTOP)
				fresh++
			}
		}
		if fresh == 0 {
			break
		}
	}
	for pid := range stopped {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return stopped
}

// reapOrphans waits (bounded) for the killed processes that are now the host's children.
func reapOrphans(pids map[int]bool, bound time.Duration) {
	deadline := time.Now().Add(bound)
	pending := len(pids)
	for pending > 0 && time.Now().Before(deadline) {
		pending = 0
		for pid := range pids {
			var ws unix.WaitStatus
			got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			switch {
			case got == pid: // reaped
				delete(pids, pid)
			case err != nil && !exists(pid): // gone: its parent reaped it
				delete(pids, pid)
			default: // still dying, or not reparented to the host yet
				pending++
			}
		}
		if pending > 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// exists reports whether pid is in the process table (a zombie counts).
func exists(pid int) bool {
	_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
	return err == nil
}

// closeInheritedOnExec marks every descriptor above stderr close-on-exec, so that no file the
// host inherited from whoever started it (a secret open as fd 9, say) reaches a driver.
func closeInheritedOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
	}
}
