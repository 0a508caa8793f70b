//go:build linux

package pluginhost

import (
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
)

// fakeProc writes a /proc-like directory with one process per uid.
func fakeProc(t *testing.T, uids ...uint32) string {
	t.Helper()
	dir := t.TempDir()
	for i, uid := range uids {
		pdir := filepath.Join(dir, strconv.Itoa(100+i))
		require.NoError(t, os.Mkdir(pdir, 0o755))
		status := fmt.Sprintf("Name:\tx\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t%d\t%d\t%d\t%d\nGid:\t0\t0\t0\t0\n", uid, uid, uid, uid)
		require.NoError(t, os.WriteFile(filepath.Join(pdir, "status"), []byte(status), 0o644))
	}
	require.NoError(t, os.Mkdir(filepath.Join(dir, "self"), 0o755)) // not a pid: skipped
	return dir
}

// TestChooseDynamicIDSkipsRunningUIDs: of a range of four uids, three run processes (or are
// this host's): the fourth is always chosen; with none left, the choice fails.
func TestChooseDynamicIDSkipsRunningUIDs(t *testing.T) {
	const base = 5000
	procDir := fakeProc(t, base, base+2)
	taken := map[uint32]bool{base + 1: true}
	for range 50 {
		id, err := chooseDynamicID(base, 4, taken, procDir)
		require.NoError(t, err)
		assert.Equal(t, uint32(base+3), id)
	}
	_, err := chooseDynamicID(base, 3, taken, procDir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "set plugins[].user")

	// Chosen at random: a free range of 65536 uids does not give one uid every time.
	seen := map[uint32]bool{}
	for range 20 {
		id, err := chooseDynamicID(dynamicIDBase, dynamicIDCount, nil, fakeProc(t))
		require.NoError(t, err)
		seen[id] = true
	}
	assert.Greater(t, len(seen), 1)
}

// fnvDynamicID is the uid a pure function of the plugin id would give.
func fnvDynamicID(pluginID string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(pluginID))
	return dynamicIDBase + h.Sum32()%dynamicIDCount
}

// TestDriverUIDIsNotAnotherProcesses: a process outside the host (another host's driver) runs
// as the uid that plugin id would map to; the host's driver of that id runs as another uid, one
// no process ran with when it was chosen.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestDriverUIDIsNotAnotherProcesses(t *testing.T) {
	if os.Getuid() != 0 {
		testutil.SkipUnlessCI(t, "dynamic driver uids are those of a root host")
	}
	const id = "uid-clash.sandbox"
	clash := fnvDynamicID(id)
	other := exec.Command("sleep", "300")
	other.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: clash, Gid: clash, Groups: []uint32{}}, Pdeathsig: syscall.SIGKILL}
	require.NoError(t, other.Start())
	stopOther := func() { _ = other.Process.Kill(); _ = other.Wait() }
	defer stopOther() // on a failure before the host's clean-up is registered

	before, err := uidsInUse("/proc")
	require.NoError(t, err)
	require.True(t, before[clash], "the other process runs as uid %d", clash)

	p := identityPlugin(t, id)
	p.User = ""
	h, rec := startHost(t, testConfig(t, p))
	t.Cleanup(stopOther) // before the host's check that it left no child behind
	waitStarted(t, h, rec)
	w := state(t, h, id).Worker
	require.NotNil(t, w)
	uid := uint32(w.Containment.UID)
	assert.NotEqual(t, clash, uid, "the driver shares its uid with a process outside its worker")
	assert.False(t, before[uid], "uid %d ran a process before the driver started", uid)
	assert.Contains(t, procFile(t, w.PID, "status"), fmt.Sprintf("Uid:\t%d\t", uid))
}

// TestDynamicIDIsChosenAgainWhenTaken: a plugin keeps its uid from one start to the next while
// no process runs with it; once a process outside the host runs with it (another host's
// driver), the next start chooses another.
//
// Sequential: it changes the process-wide dynamic uid table.
func TestDynamicIDIsChosenAgainWhenTaken(t *testing.T) {
	if os.Getuid() != 0 {
		testutil.SkipUnlessCI(t, "dynamic driver uids are those of a root host")
	}
	const id = "uid-retaken.sandbox"
	first, err := dynamicID(id)
	require.NoError(t, err)
	again, err := dynamicID(id)
	require.NoError(t, err)
	require.Equal(t, first, again, "kept while free")

	other := exec.Command("sleep", "300")
	other.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: first, Gid: first, Groups: []uint32{}}, Pdeathsig: syscall.SIGKILL}
	require.NoError(t, other.Start())
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()

	next, err := dynamicID(id)
	require.NoError(t, err)
	assert.NotEqual(t, first, next, "uid %d runs another process", first)
	inUse, err := uidsInUse("/proc")
	require.NoError(t, err)
	assert.False(t, inUse[next])
}
