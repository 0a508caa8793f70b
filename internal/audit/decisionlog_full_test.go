package audit

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallDisk returns a directory on a 64 KiB tmpfs (unmounted when the test ends), or "" when
// this process may not mount one (not root).
func smallDisk(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if os.Geteuid() != 0 {
		return ""
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Logf("no tmpfs (%v): simulating the full disk", err)
		return ""
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fullFile is a logFile over a real file that accepts only room more bytes, like a disk with
// room bytes free: a write that does not fit is cut short with ENOSPC.
type fullFile struct {
	*os.File
	room int
}

func (f *fullFile) Write(b []byte) (int, error) {
	if len(b) <= f.room {
		f.room -= len(b)
		return f.File.Write(b)
	}
	n, _ := f.File.Write(b[:f.room])
	f.room -= n
	return n, syscall.ENOSPC
}

// TestDecisionLogDiskFull fills the disk under the decision log: the line that does not fit
// is an error and leaves no partial line behind, and once there is room again the next line
// starts on a line of its own. Every line in the file is whole, and each line that was
// reported written is there exactly once.
func TestDecisionLogDiskFull(t *testing.T) {
	dir := smallDisk(t)
	real := dir != ""
	if !real {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, "decisions.log")
	l, err := newFileDecisionLog(path, nil, nil)
	require.NoError(t, err)
	defer l.close()

	entry := func(id string) logEntry {
		return logEntry{DecisionID: id, Path: "/v1/authorize", Operation: "openDuplexChannel",
			Input: map[string]any{"padding": strings.Repeat("x", 3000)}}
	}
	var filler string
	var fake *fullFile
	if real {
		// Leave about 10 KiB free: three lines fit, the fourth is cut short.
		filler = filepath.Join(dir, "filler")
		fillDisk(t, filler, 10<<10)
	} else {
		fake = &fullFile{File: l.file.(*os.File), room: 10 << 10}
		l.setFile(path, fake)
	}

	var written []string
	var failures int
	for i := range 6 {
		id := "d" + string(rune('0'+i))
		if err := l.write(entry(id)); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			failures++
			continue
		}
		written = append(written, id)
	}
	require.Positive(t, failures, "the disk never filled up")
	require.NotEmpty(t, written)
	ids := linesOf(t, path)
	assert.Equal(t, written, ids, "after the disk filled up")

	// Room again: the next lines are whole.
	if real {
		require.NoError(t, os.Remove(filler))
	} else {
		fake.room = 1 << 20
	}
	for _, id := range []string{"after1", "after2"} {
		require.NoError(t, l.write(entry(id)))
		written = append(written, id)
	}
	assert.Equal(t, written, linesOf(t, path), "after room was made")
}

// fillDisk writes path until the file system has about free bytes left.
func fillDisk(t testing.TB, path string, free int64) {
	t.Helper()
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(filepath.Dir(path), &st))
	avail := int64(st.Bavail) * st.Bsize
	require.Greater(t, avail, free)
	require.NoError(t, os.WriteFile(path, make([]byte, avail-free), 0o600))
}

// linesOf reads the decision_id of every line of a decision log; every line must be whole.
func linesOf(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, len(b) == 0 || b[len(b)-1] == '\n', "the file ends in a partial line")
	var ids []string
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if line == "" && len(b) == 0 {
			break
		}
		var rec struct {
			DecisionID string `json:"decision_id"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "line %d is not whole: %.80q…", i+1, line)
		ids = append(ids, rec.DecisionID)
	}
	return ids
}

// shortWriter writes only the first n bytes of a write, then fails.
type shortWriter struct {
	n   int
	out strings.Builder
}

func (w *shortWriter) Write(b []byte) (int, error) {
	if w.n >= 0 && len(b) > w.n {
		w.out.Write(b[:w.n])
		n := w.n
		w.n = -1
		return n, errors.New("broken pipe")
	}
	return w.out.Write(b)
}

// TestDecisionLogStreamAfterShortWrite: a stream (stderr) cannot be truncated, so after a
// write that stopped in the middle of a line, the next line starts with a newline and is
// whole.
func TestDecisionLogStreamAfterShortWrite(t *testing.T) {
	w := &shortWriter{n: 10}
	l, err := newDecisionLog(w, nil, nil)
	require.NoError(t, err)
	require.Error(t, l.write(logEntry{DecisionID: "lost"}))
	require.NoError(t, l.write(logEntry{DecisionID: "kept"}))
	lines := strings.Split(w.out.String(), "\n")
	require.Len(t, lines, 3)
	assert.Len(t, lines[0], 10, "the partial line")
	var rec logEntry
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &rec))
	assert.Equal(t, "kept", rec.DecisionID)
	assert.Empty(t, lines[2])
}
