package testutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Go runs the go command with args in dir (the test's directory when ""), and returns its
// combined output. The go commands that tests run (builds of the programs they start, `go
// tool -n opa`) run one at a time across the test processes of a `go test ./...` (a lock file
// in the temporary directory): a package one of them compiled is taken from Go's build cache
// by the next, instead of being compiled by both at once. They run without the race detector
// even when GOFLAGS asks for it (EnvWithoutRace): the programs the tests start are measured as
// they ship, their resident memory among the rest.
func Go(ctx context.Context, dir string, args ...string) ([]byte, error) {
	unlock, err := lockGo()
	if err != nil {
		return nil, err
	}
	defer unlock()
	// go test puts its own toolchain first on the test's PATH.
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = EnvWithoutRace(os.Environ())
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// lockGo takes the lock that the tests' go commands share, waiting for it.
func lockGo() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), fmt.Sprintf("authz-test-go-%d.lock", os.Getuid())), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { _ = f.Close() }, nil
}

// EnvWithoutRace returns env with -race removed from GOFLAGS.
func EnvWithoutRace(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GOFLAGS="); ok {
			var kept []string
			for _, f := range strings.Fields(v) {
				if f != "-race" && f != "-race=true" {
					kept = append(kept, f)
				}
			}
			kv = "GOFLAGS=" + strings.Join(kept, " ")
		}
		out = append(out, kv)
	}
	return out
}
