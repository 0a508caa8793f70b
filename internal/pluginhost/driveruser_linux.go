//go:build linux

package pluginhost

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// A host running as root does not run drivers as root unless a plugin says `user: root`. Each
// plugin without `user:` runs as a user of its own: a dynamic uid (and a gid of the same number)
// of the reserved range below, which no account holds and which owns no file, so a driver can
// reach neither another driver (another uid) nor the host (root, not dumpable). A plugin keeps
// its uid for the life of the host. Where the range is not mapped (a user namespace with a
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

// dynamicID returns the plugin's dynamic uid (and gid): derived from its id, the next free one
// on a collision with another plugin's.
func dynamicID(pluginID string) (uint32, error) {
	dynamicIDs.mu.Lock()
	defer dynamicIDs.mu.Unlock()
	if id, ok := dynamicIDs.byID[pluginID]; ok {
		return id, nil
	}
	if !idMapped("/proc/self/uid_map", dynamicIDBase, dynamicIDCount) || !idMapped("/proc/self/gid_map", dynamicIDBase, dynamicIDCount) {
		return 0, fmt.Errorf("the reserved driver uids %d-%d are not mapped in this user namespace: set plugins[].user (or create the user %q)",
			dynamicIDBase, dynamicIDBase+dynamicIDCount-1, driverUser)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(pluginID))
	off := h.Sum32() % dynamicIDCount
	for range dynamicIDCount {
		id := dynamicIDBase + off
		if !dynamicIDs.taken[id] {
			dynamicIDs.taken[id] = true
			dynamicIDs.byID[pluginID] = id
			return id, nil
		}
		off = (off + 1) % dynamicIDCount
	}
	return 0, fmt.Errorf("no dynamic driver uid is left: set plugins[].user")
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
