//go:build linux

package pluginhost

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/sandbox"
)

// pinnedExecutable is a reference to a sealed in-memory copy of a driver binary: the bytes the
// host hashed are the bytes that run. The file at the configured path is read and hashed; the
// copy is a memfd sealed against every change and executed through its descriptor, so a
// symlink swapped or the file rewritten after the read cannot change what runs.
//
// There is one copy per digest in the host, shared by every worker that runs those bytes and
// released with the last reference (Close): N workers of one binary hold it in memory once.
type pinnedExecutable struct {
	*sealedCopy
	once sync.Once
}

// sealedCopy is the shared copy of one digest.
type sealedCopy struct {
	file     *os.File // read-only descriptor of the sealed copy, close-on-exec
	sum      []byte
	dev, ino uint64 // identity of the sealed copy: /proc/PID/exe of the worker must be it
	refs     int    // guarded by sealedCopies.mu
}

// sealedCopies are the copies in use, by hex digest.
var sealedCopies = struct {
	mu       sync.Mutex
	byDigest map[string]*sealedCopy
}{byDigest: map[string]*sealedCopy{}}

// execPath is the path the child executes: the sealed copy, by descriptor.
func (p *pinnedExecutable) execPath() string { return fmt.Sprintf("/proc/self/fd/%d", p.file.Fd()) }

// ref returns another reference to the same copy, to be closed on its own.
func (p *pinnedExecutable) ref() *pinnedExecutable {
	sealedCopies.mu.Lock()
	defer sealedCopies.mu.Unlock()
	p.refs++
	return &pinnedExecutable{sealedCopy: p.sealedCopy}
}

// Close releases this reference; the last one closes the copy.
func (p *pinnedExecutable) Close() error {
	p.once.Do(func() {
		sealedCopies.mu.Lock()
		defer sealedCopies.mu.Unlock()
		p.refs--
		if p.refs > 0 {
			return
		}
		if key := hex.EncodeToString(p.sum); sealedCopies.byDigest[key] == p.sealedCopy {
			delete(sealedCopies.byDigest, key)
		}
		_ = p.file.Close()
	})
	return nil
}

// openPinned hashes the binary at path, checks the digest against want (nil: no check,
// InsecureSkipPinCheck) and returns a reference to the sealed copy of those bytes, made now
// unless one is in use already. Unless allowWritable, it refuses a binary or a directory that
// group or others may write: whoever can write there can replace the driver between two starts.
func openPinned(path string, want []byte, allowWritable bool) (*pinnedExecutable, []string, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, nil, coded.Errorf(coded.PinUnreadable, "open plugin binary: %w", err)
	}
	defer func() { _ = src.Close() }()
	warnings, err := checkWritable(path, src, allowWritable)
	if err != nil {
		return nil, warnings, err
	}
	fi, err := src.Stat()
	if err != nil {
		return nil, warnings, coded.Errorf(coded.PinUnreadable, "stat plugin binary: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, warnings, coded.Errorf(coded.UnsafeBinary, "plugin binary %s is not a regular file", path)
	}
	h := sha256.New()
	if _, err := io.Copy(h, src); err != nil {
		return nil, warnings, coded.Errorf(coded.PinUnreadable, "read plugin binary: %w", err)
	}
	sum := h.Sum(nil)
	if err := checkPin(path, sum, want); err != nil {
		return nil, warnings, err
	}
	if err := checkExecutable(path, src); err != nil {
		return nil, warnings, err
	}
	if exe := sharedCopy(sum); exe != nil {
		return exe, warnings, nil
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return nil, warnings, coded.Errorf(coded.PinUnreadable, "read plugin binary: %w", err)
	}
	// The digest of the copy is what counts: the file may have changed since it was hashed.
	c, err := sealCopy(src, filepath.Base(path))
	if err != nil {
		return nil, warnings, err
	}
	if err := checkPin(path, c.sum, want); err != nil {
		_ = c.file.Close()
		return nil, warnings, err
	}
	return shareCopy(c), warnings, nil
}

// checkExecutable refuses a file this system cannot execute: neither a #! script nor an ELF
// executable of the host's own class and machine. The launcher would fail to exec it after the
// fork, where the reason is lost; here it is said with the configured path.
func checkExecutable(path string, f io.ReaderAt) error {
	var head [20]byte
	n, _ := f.ReadAt(head[:], 0)
	if n >= 2 && string(head[:2]) == "#!" {
		return nil
	}
	if n == len(head) && string(head[:4]) == "\x7fELF" {
		// Without its own identity the host cannot compare: the exec decides.
		if own, ok := ownELFIdentity(); !ok || elfIdentity(head) == own {
			return nil
		}
	}
	return coded.Errorf(coded.StartFailed, "cannot execute the plugin binary %s: exec format error (neither a #! script nor an ELF executable for this system)", path)
}

// elfIdentity is the class, byte order and machine of an ELF header's first 20 bytes.
func elfIdentity(h [20]byte) [4]byte { return [4]byte{h[4], h[5], h[18], h[19]} }

// ownELFIdentity is the ELF identity of the running binary; ok is false when it cannot be read.
var ownELFIdentity = sync.OnceValues(func() (id [4]byte, ok bool) {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return id, false
	}
	defer f.Close()
	var head [20]byte
	if _, err := f.ReadAt(head[:], 0); err != nil {
		return id, false
	}
	return elfIdentity(head), true
})

// checkPin refuses a digest other than want (nil: any).
func checkPin(path string, sum, want []byte) error {
	if want != nil && !bytes.Equal(sum, want) {
		return coded.Errorf(coded.PinMismatch, "sha256 mismatch for %s: got %x, configured %x (refusing to start it; if the binary was upgraded on purpose, configure its new sha256)",
			path, sum, want)
	}
	return nil
}

// sharedCopy returns a new reference to the copy of digest sum, nil when there is none.
func sharedCopy(sum []byte) *pinnedExecutable {
	sealedCopies.mu.Lock()
	defer sealedCopies.mu.Unlock()
	c := sealedCopies.byDigest[hex.EncodeToString(sum)]
	if c == nil {
		return nil
	}
	c.refs++
	return &pinnedExecutable{sealedCopy: c}
}

// shareCopy registers c as the copy of its digest and returns a reference to it, or to the copy
// registered meanwhile (c is then discarded).
func shareCopy(c *sealedCopy) *pinnedExecutable {
	sealedCopies.mu.Lock()
	defer sealedCopies.mu.Unlock()
	key := hex.EncodeToString(c.sum)
	if prev := sealedCopies.byDigest[key]; prev != nil {
		_ = c.file.Close()
		c = prev
	} else {
		sealedCopies.byDigest[key] = c
	}
	c.refs++
	return &pinnedExecutable{sealedCopy: c}
}

// sealCopy copies src into a new sealed memfd while hashing it.
func sealCopy(src io.Reader, name string) (*sealedCopy, error) {
	h := sha256.New()
	f, dev, ino, err := sandbox.SealedCopy(src, name, h)
	if err != nil {
		return nil, err
	}
	return &sealedCopy{file: f, sum: h.Sum(nil), dev: dev, ino: ino}, nil
}

// checkWritable refuses (or, when allowed, reports) a binary or directory writable by group or
// others. A directory with the sticky bit is fine: others cannot rename or remove our file there.
func checkWritable(path string, f *os.File, allow bool) ([]string, error) {
	var problems []string
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o022 != 0 {
		problems = append(problems, fmt.Sprintf("plugin binary %s is writable by group or others (mode %s)", path, fi.Mode().Perm()))
	}
	dir := filepath.Dir(path)
	if di, err := os.Stat(dir); err == nil && di.Mode().Perm()&0o022 != 0 && di.Mode()&os.ModeSticky == 0 {
		problems = append(problems, fmt.Sprintf("plugin directory %s is writable by group or others (mode %s)", dir, di.Mode().Perm()))
	}
	if len(problems) == 0 {
		return nil, nil
	}
	msg := strings.Join(problems, "; ")
	if allow {
		return problems, nil
	}
	return nil, coded.Errorf(coded.UnsafeBinary, "%s: anyone who can write there can replace the driver; "+
		"make it writable by its owner only (chmod go-w), or set allowWritableBinary to start it anyway", msg)
}

// exeIdentity returns the device and inode of the executable process pid runs now.
func exeIdentity(pid int) (dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/exe", pid), &st); err != nil {
		return 0, 0, err
	}
	return st.Dev, st.Ino, nil
}
