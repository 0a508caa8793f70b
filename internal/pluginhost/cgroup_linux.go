//go:build linux

package pluginhost

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Every worker runs in a cgroup (v2) of its own, created under the host's cgroup:
//
//	<host's cgroup>/authz-drivers.<host pid>/<plugin id>.<worker marker>
//
// A process cannot leave its cgroup without write access to a common ancestor, which a driver
// does not have, so the cgroup holds the driver and every descendant, however it escaped the
// process tree (double fork, setsid, an empty environment). Ending the worker ends the cgroup
// (cgroup.kill), and the host reaps its zombie children by their cgroup.

// cgroupParentPrefix starts the name of the cgroup holding a host's worker cgroups.
const cgroupParentPrefix = "authz-drivers."

// cgroupRoot is where a host's worker cgroups live.
type cgroupRoot struct {
	mount   string // the cgroup2 mount point
	hostRel string // the host's cgroup, relative to the mount ("/" for the root)
	rel     string // the workers' parent, relative to the mount
	dir     string // the workers' parent, absolute
	hasKill bool   // cgroup.kill exists (Linux 5.14)

	mu      sync.Mutex    // serialises creating and removing the parent
	ctrlErr error         // why controllers cannot be enabled, once tried
	ctrlOK  []string      // controllers enabled for the workers
	stale   []staleCgroup // ended when the root was found, not yet logged (under mu)
}

// staleCgroup is the workers' cgroup of a host that is gone, ended and removed at a host start.
type staleCgroup struct {
	dir   string // absolute
	ended int    // processes that still ran in it
}

// findCgroupRoot locates the cgroup2 hierarchy and the host's cgroup in it and checks that the
// host may create cgroups there.
func findCgroupRoot() (*cgroupRoot, error) {
	mount, err := cgroup2Mount()
	if err != nil {
		return nil, err
	}
	rel, err := ownCgroup()
	if err != nil {
		return nil, err
	}
	r := &cgroupRoot{mount: mount, hostRel: rel, rel: filepath.Join(rel, cgroupParentPrefix+strconv.Itoa(os.Getpid()))}
	r.dir = filepath.Join(mount, r.rel)
	if err := r.makeParent(); err != nil {
		return nil, err
	}
	_, err = os.Stat(filepath.Join(r.dir, "cgroup.kill"))
	r.hasKill = err == nil
	_ = os.Remove(r.dir) // made again for the first worker; a host without workers leaves none
	r.stale = r.removeStale()
	return r, nil
}

// takeStale returns the stale cgroups ended when r was found, once.
func (r *cgroupRoot) takeStale() []staleCgroup {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.stale
	r.stale = nil
	return out
}

// removeStale ends and removes the worker cgroups of hosts that are gone (killed before they
// could remove them): what their drivers left running there ends now.
func (r *cgroupRoot) removeStale() []staleCgroup {
	hostDir := filepath.Join(r.mount, r.hostRel)
	entries, err := os.ReadDir(hostDir)
	if err != nil {
		return nil
	}
	var out []staleCgroup
	for _, e := range entries {
		pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), cgroupParentPrefix))
		if !e.IsDir() || !strings.HasPrefix(e.Name(), cgroupParentPrefix) || err != nil || exists(pid) {
			continue
		}
		parent := &cgroupRoot{mount: r.mount, rel: filepath.Join(r.hostRel, e.Name()), dir: filepath.Join(hostDir, e.Name()), hasKill: r.hasKill}
		found := staleCgroup{dir: parent.dir}
		workers, _ := os.ReadDir(parent.dir)
		for _, w := range workers {
			if w.IsDir() {
				cg := &workerCgroup{root: parent, dir: filepath.Join(parent.dir, w.Name()), fd: -1}
				found.ended += len(cg.procs())
				cg.kill()
				cg.waitEmpty(time.Second)
				_ = os.Remove(cg.dir)
			}
		}
		_ = os.Remove(parent.dir)
		out = append(out, found)
	}
	return out
}

// cgroup2Mount returns the mount point of the cgroup2 file system (on a hybrid system, such as
// /sys/fs/cgroup/unified).
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		line := s.Text()
		i := strings.Index(line, " - ")
		if i < 0 {
			continue
		}
		post := strings.Fields(line[i+3:])
		pre := strings.Fields(line[:i])
		if len(post) > 0 && post[0] == "cgroup2" && len(pre) >= 5 && pre[3] == "/" {
			return unescapeMount(pre[4]), nil
		}
	}
	return "", errors.New("no cgroup v2 file system is mounted")
}

// unescapeMount undoes the octal escapes of mountinfo (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroup returns the host's cgroup v2 path (the "0::" line of /proc/self/cgroup).
func ownCgroup() (string, error) {
	return cgroupOf("self")
}

// cgroupOf returns the cgroup v2 path of process pid ("self" for the host), without the
// " (deleted)" the kernel appends for a process whose cgroup was removed (a zombie).
func cgroupOf(pid string) (string, error) {
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return strings.TrimSuffix(rest, " (deleted)"), nil
		}
	}
	return "", errors.New("the process is in no cgroup v2")
}

// makeParent creates the workers' parent cgroup (no error when it exists).
func (r *cgroupRoot) makeParent() error {
	if err := os.Mkdir(r.dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create the cgroup %s for drivers: %w", r.dir, err)
	}
	return nil
}

// owns reports whether the cgroup path rel (relative to the mount) is one of this host's
// worker cgroups.
func (r *cgroupRoot) owns(rel string) bool {
	return strings.HasPrefix(rel, r.rel+"/")
}

// workerCgroup is the cgroup of one worker.
type workerCgroup struct {
	root *cgroupRoot
	dir  string
	rel  string
	fd   int // the directory, for CLONE_INTO_CGROUP
}

// newWorker creates the cgroup of one worker, with the limits asked for.
func (r *cgroupRoot) newWorker(name string, lim ResourceLimits) (*workerCgroup, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.makeParent(); err != nil {
		return nil, err
	}
	rel := filepath.Join(r.rel, name)
	cg := &workerCgroup{root: r, rel: rel, dir: filepath.Join(r.mount, rel), fd: -1}
	if err := os.Mkdir(cg.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create the driver's cgroup: %w", err)
	}
	if err := cg.limit(lim); err != nil {
		_ = os.Remove(cg.dir)
		return nil, err
	}
	fd, err := unix.Open(cg.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = os.Remove(cg.dir)
		return nil, fmt.Errorf("open the driver's cgroup: %w", err)
	}
	cg.fd = fd
	return cg, nil
}

// limit writes memory.max and pids.max.
func (cg *workerCgroup) limit(lim ResourceLimits) error {
	for _, l := range []struct {
		field, file string
		v           uint64
	}{
		{"memoryMax", "memory.max", lim.MemoryMax},
		{"pidsMax", "pids.max", lim.PidsMax},
	} {
		if l.v == 0 {
			continue
		}
		if err := cg.root.enableControllers(); err != nil {
			return fmt.Errorf("limits.%s: %w", l.field, err)
		}
		if err := os.WriteFile(filepath.Join(cg.dir, l.file), []byte(strconv.FormatUint(l.v, 10)), 0); err != nil {
			return fmt.Errorf("limits.%s: set %s of the driver's cgroup: %w", l.field, l.file, err)
		}
	}
	return nil
}

// limitControllers are the controllers the per-driver limits need.
var limitControllers = []string{"memory", "pids"}

// enableControllers enables the memory and pids controllers for the worker cgroups (once). A
// cgroup other than the root may enable controllers for its children only while it holds no
// process: when the host is alone in its cgroup, it moves itself into a leaf of its own first.
// Called with r.mu held.
func (r *cgroupRoot) enableControllers() error {
	if r.ctrlOK != nil || r.ctrlErr != nil {
		return r.ctrlErr
	}
	r.ctrlErr = func() error {
		if err := limitsAvailable(r.mount, r.hostRel); err != nil {
			return err
		}
		hostDir := filepath.Join(r.mount, r.hostRel)
		if r.hostRel != "/" && !hasControllers(hostDir, "cgroup.subtree_control") {
			leaf := filepath.Join(hostDir, fmt.Sprintf("authz-host.%d", os.Getpid()))
			if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("create a leaf cgroup for the host: %w", err)
			}
			if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
				return fmt.Errorf("move the host into its leaf cgroup: %w", err)
			}
		}
		enable := []byte("+" + strings.Join(limitControllers, " +"))
		for _, dir := range []string{hostDir, r.dir} {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), enable, 0); err != nil {
				return fmt.Errorf("enable the %s controllers in %s: %w", strings.Join(limitControllers, " and "), dir, err)
			}
		}
		r.ctrlOK = limitControllers
		return nil
	}()
	return r.ctrlErr
}

// limitsAvailable says why memoryMax and pidsMax cannot be applied to drivers of a host in
// cgroup hostRel, nil when they can: the controllers must be available to the host's cgroup,
// and it must be the root, already delegate them, or hold the host alone (which then moves into
// a leaf of its own).
func limitsAvailable(mount, hostRel string) error {
	hostDir := filepath.Join(mount, hostRel)
	if !hasControllers(hostDir, "cgroup.controllers") {
		return fmt.Errorf("the cgroup v2 controllers %s are not available to the host's cgroup %s (on a hybrid system they may be bound to cgroup v1)",
			strings.Join(limitControllers, " and "), hostRel)
	}
	if unix.Access(hostDir, unix.W_OK) != nil {
		return fmt.Errorf("the host may not write to its cgroup %s: run it with the cgroup delegated (systemd: Delegate=yes)", hostRel)
	}
	if hostRel == "/" || hasControllers(hostDir, "cgroup.subtree_control") {
		return nil
	}
	procs, err := readCgroupPids(filepath.Join(hostDir, "cgroup.procs"))
	if err != nil {
		return err
	}
	if len(procs) != 1 || procs[0] != os.Getpid() {
		return fmt.Errorf("the host's cgroup %s holds other processes, so it cannot delegate controllers: run authz in a cgroup of its own (systemd: Delegate=yes)", hostRel)
	}
	return nil
}

// cgroupLimitsProblem says why the cgroup limits cannot be applied by a host in this process,
// nil when they can.
func cgroupLimitsProblem() error {
	mount, err := cgroup2Mount()
	if err != nil {
		return err
	}
	rel, err := ownCgroup()
	if err != nil {
		return err
	}
	if strings.HasPrefix(filepath.Base(rel), "authz-host.") { // moved into its leaf already
		rel = filepath.Dir(rel)
	}
	return limitsAvailable(mount, rel)
}

// hasControllers reports whether the file (cgroup.controllers, cgroup.subtree_control) of dir
// names every limit controller.
func hasControllers(dir, file string) bool {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return false
	}
	have := strings.Fields(string(b))
	for _, c := range limitControllers {
		if !slices.Contains(have, c) {
			return false
		}
	}
	return true
}

// procs returns the pids in the cgroup.
func (cg *workerCgroup) procs() []int {
	pids, _ := readCgroupPids(filepath.Join(cg.dir, "cgroup.procs"))
	return pids
}

// readCgroupPids reads a cgroup.procs file.
func readCgroupPids(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// populated reports whether a live process is left in the cgroup.
func (cg *workerCgroup) populated() bool {
	b, err := os.ReadFile(filepath.Join(cg.dir, "cgroup.events"))
	if err != nil {
		return len(cg.procs()) > 0
	}
	return strings.Contains(string(b), "populated 1")
}

// kill kills every process in the cgroup: cgroup.kill, which no fork escapes, or else SIGKILL
// to each member until none is left (bounded).
func (cg *workerCgroup) kill() {
	if cg.root.hasKill {
		if err := os.WriteFile(filepath.Join(cg.dir, "cgroup.kill"), []byte("1"), 0); err == nil {
			return
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		pids := cg.procs()
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(time.Millisecond)
	}
}

// killExcept kills every process in the cgroup but keep (the driver itself, which may still
// stop gracefully), until no other is left (bounded: a member forking in a loop is caught in a
// later round).
func (cg *workerCgroup) killExcept(keep int) {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		others := 0
		for _, pid := range cg.procs() {
			if pid != keep {
				others++
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if others == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// waitEmpty waits (bounded) until no live process is left in the cgroup.
func (cg *workerCgroup) waitEmpty(bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	for cg.populated() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// remove removes the (empty) cgroup, and the parent when no worker cgroup is left in it.
func (cg *workerCgroup) remove() {
	cg.root.mu.Lock()
	defer cg.root.mu.Unlock()
	if cg.fd >= 0 {
		_ = unix.Close(cg.fd)
		cg.fd = -1
	}
	_ = os.Remove(cg.dir)
	if cg.root.ctrlOK == nil { // a parent with controllers enabled is kept for the next worker
		_ = os.Remove(cg.root.dir)
	}
}
