//go:build linux

package pluginhost

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// A host running as root does not run drivers as root unless a plugin says `user: root`. Each
// plugin without `user:` runs as a user of its own: a dynamic uid (and a gid of the same number)
// of the reserved range below, which no account holds and which owns no file, so a driver can
// reach neither another driver (another uid) nor the host (root, not dumpable). The uid is
// chosen at random among those no process runs with (of this host or any other), and kept
// while no other process takes it. Where the range is not mapped (a user namespace with a
// short uid map), drivers run as driverUser if the system has it.
const (
	// driverUser is the account drivers of a root host run as where no dynamic uid is mapped.
	driverUser = "authz-driver"
	// dynamicIDBase and dynamicIDCount are the reserved range of dynamic driver uids and gids.
	dynamicIDBase  = 0x7ffe0000
	dynamicIDCount = 0x10000
)

var dynamicIDs = struct {
	mu    sync.Mutex
	byID  map[string]uint32
	taken map[uint32]bool
}{byID: map[string]uint32{}, taken: map[uint32]bool{}}

// driverCredential returns the credential the plugin's driver runs with: the configured user
// and group; with neither, nil for a host that is not root (the driver runs as the host's
// user) and the plugin's own unprivileged user for a root host.
func driverCredential(cfg PluginConfig) (*syscall.Credential, error) {
	cred, err := resolveCredential(cfg.User, cfg.Group)
	if err != nil || cred != nil || os.Geteuid() != 0 {
		return cred, err
	}
	id, err := dynamicID(cfg.ID)
	if err == nil {
		return &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{}}, nil
	}
	if u, lerr := user.Lookup(driverUser); lerr == nil {
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 == nil && err2 == nil && uid != 0 {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
		}
	}
	return nil, err
}

// dynamicID returns the plugin's dynamic uid (and gid): chosen at random in the range when the
// plugin first starts in this host (chooseDynamicID), and chosen again at a later start when a
// process on the system already runs with it.
func dynamicID(pluginID string) (uint32, error) {
	dynamicIDs.mu.Lock()
	defer dynamicIDs.mu.Unlock()
	id, ok := dynamicIDs.byID[pluginID]
	if ok {
		inUse, err := uidsInUse("/proc")
		if err == nil && !inUse[id] {
			return id, nil
		}
	}
	if !idMapped("/proc/self/uid_map", dynamicIDBase, dynamicIDCount) || !idMapped("/proc/self/gid_map", dynamicIDBase, dynamicIDCount) {
		return 0, fmt.Errorf("the reserved driver uids %d-%d are not mapped in this user namespace: set plugins[].user (or create the user %q)",
			dynamicIDBase, dynamicIDBase+dynamicIDCount-1, driverUser)
	}
	next, err := chooseDynamicID(dynamicIDBase, dynamicIDCount, dynamicIDs.taken, "/proc")
	if err != nil {
		return 0, err
	}
	if ok {
		delete(dynamicIDs.taken, id)
	}
	dynamicIDs.taken[next] = true
	dynamicIDs.byID[pluginID] = next
	return next, nil
}

// chooseDynamicID picks a uid of [base, base+count) at random that no process under procDir
// runs with (real, effective, saved or file-system uid) and that taken (this host's other
// plugins) does not hold. A driver's uid is thus shared with no process outside its own worker
// when it is chosen; two hosts choosing at the same instant may still pick the same one.
func chooseDynamicID(base, count uint32, taken map[uint32]bool, procDir string) (uint32, error) {
	inUse, err := uidsInUse(procDir)
	if err != nil {
		return 0, fmt.Errorf("list the uids processes run as: %w", err)
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	off := binary.LittleEndian.Uint32(b[:]) % count
	for range count {
		id := base + off
		if !taken[id] && !inUse[id] {
			return id, nil
		}
		off = (off + 1) % count
	}
	return 0, fmt.Errorf("no dynamic driver uid is left: set plugins[].user")
}

// uidsInUse returns every uid a process under procDir runs with, read from the Uid line of each
// procDir/PID/status. A process that ends while it is read is skipped.
func uidsInUse(procDir string) (map[uint32]bool, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil, err
	}
	out := map[uint32]bool{}
	for _, e := range entries {
		if _, err := strconv.ParseUint(e.Name(), 10, 32); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "status"))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			rest, ok := strings.CutPrefix(line, "Uid:")
			if !ok {
				continue
			}
			for _, f := range strings.Fields(rest) {
				if u, err := strconv.ParseUint(f, 10, 32); err == nil {
					out[uint32(u)] = true
				}
			}
			break
		}
	}
	return out, nil
}

// idMapped reports whether the ids [first, first+n) are mapped in the uid_map or gid_map file.
func idMapped(file string, first, n uint64) bool {
	f, err := os.Open(file)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) != 3 {
			continue
		}
		inside, err1 := strconv.ParseUint(fields[0], 10, 64)
		count, err2 := strconv.ParseUint(fields[2], 10, 64)
		if err1 == nil && err2 == nil && first >= inside && first+n <= inside+count {
			return true
		}
	}
	return false
}
