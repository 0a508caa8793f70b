//go:build !linux

package pluginhost

import (
	"github.com/authz-dev/authz/internal/api"

	"context"
	"errors"
	"net"
	"os"
	"os/exec"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin/runner"
)

// errNeedsLinux is why drivers do not start elsewhere: the host binds the pin to the bytes
// that run (a sealed memfd), checks the peer of the driver socket and watches the process by
// pidfd, and these need Linux.
var errNeedsLinux = errors.New("driver plugins need Linux: the host executes the pinned bytes from a sealed memfd and verifies the driver process by pidfd and peer credentials")

type pinnedExecutable struct{}

func (*pinnedExecutable) Close() error { return nil }

func openPinned(string, []byte, bool) (*pinnedExecutable, []string, error) {
	return nil, nil, errNeedsLinux
}

type proc struct {
	runner.Runner // never called: openPinned fails first
	exited        chan struct{}
	state         *os.ProcessState
}

type reaper struct{}

func (*reaper) reapZombies()         {}
func cgroupLimitsProblem() error     { return errNeedsLinux }
func newReaper(hclog.Logger) *reaper { return &reaper{} }
func (*proc) containment() *api.Containment {
	return &api.Containment{Missing: []string{errNeedsLinux.Error()}}
}
func closeInheritedOnExec()                                  {}
func (*proc) started() int                                   { return 0 }
func (*proc) alive() bool                                    { return false }
func (*proc) answering() bool                                { return false }
func (*proc) probe() bool                                    { return false }
func (*proc) running() bool                                  { return false }
func (*proc) release()                                       {}
func (*proc) endDescendants()                                {}
func (*proc) refused() error                                 { return nil }
func (*proc) checkExecutable() error                         { return errNeedsLinux }
func (*proc) Kill(context.Context) error                     { return nil }
func (*proc) dial(context.Context, string) (net.Conn, error) { return nil, errNeedsLinux }

func newProc(hclog.Logger, *exec.Cmd, *pinnedExecutable, PluginConfig, string, *reaper) (*proc, error) {
	return nil, errNeedsLinux
}

// exitText words how the driver ended; "" when unknown.
func (p *proc) exitText() string {
	if p.state == nil {
		return ""
	}
	return p.state.String()
}
