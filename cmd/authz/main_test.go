package main

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/sandbox"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestMain fails the package when a test leaves a goroutine behind (a server, a plugin client).
func TestMain(m *testing.M) {
	sandbox.Init() // the tests start drivers through this binary
	goleak.VerifyTestMain(cleanupRun{m})
}

// cleanupRun removes the binary built by authzBinary after the tests ran.
type cleanupRun struct{ m *testing.M }

func (c cleanupRun) Run() int {
	code := c.m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	return code
}

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// authzBinary builds the authz executable once for the tests that need a process (signals,
// resident memory, file-descriptor limits) and returns its path.
func authzBinary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the authz binary")
	}
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "authz-bin"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "authz")
		out, err := testutil.Go(context.Background(), "", "build", "-o", binPath, ".")
		if err != nil {
			binErr = err
			binPath = string(out)
		}
	})
	require.NoError(t, binErr, "go build: %s", binPath)
	return binPath
}

var (
	opaOnce sync.Once
	opaOut  string
	opaErr  error
)

// runBinary is authzBinary with authz-opa (cmd/authz-opa) built beside it, where `authz run`
// finds it: the tests of `authz run` run it as a user does.
func runBinary(t testing.TB) string {
	t.Helper()
	bin := authzBinary(t)
	opaOnce.Do(func() {
		var out []byte
		out, opaErr = testutil.Go(context.Background(), "", "build", "-o", filepath.Join(binDir, opaBinary), "../authz-opa")
		opaOut = string(out)
	})
	require.NoError(t, opaErr, "go build ../authz-opa: %s", opaOut)
	return bin
}
