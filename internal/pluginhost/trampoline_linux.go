//go:build linux

package pluginhost

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// launchArg is the first argument that makes the host's own executable the driver launcher:
// started by the host in the driver's place, it sets the driver's resource limits, installs the
// seccomp filter and executes the driver. Go cannot run code in a child between fork and exec,
// so the host executes itself (/proc/self/exe in the child) with
//
//	argv: [driver argv[0], launchArg, limits, driver argv[1:]...]   fd 3: the sealed copy
//
// (limits as launchLimits writes them) and the launcher, once limited and filtered, executes
// fd 3 with the driver's own argv and environment.
// Every program that links this package (authz, its tests) is a launcher; no other argument
// or environment variable makes it one.
const launchArg = "--authz-driver-launch"

// launchFD is the descriptor of the driver's sealed copy in the launcher.
const launchFD = 3

// launcherExitCode is the launcher's exit status when it cannot filter or execute the driver.
const launcherExitCode = 126

func init() {
	if len(os.Args) > 1 && os.Args[1] == launchArg {
		os.Exit(runLauncher(os.Args))
	}
}

// runLauncher is the launcher; it returns only when it failed.
func runLauncher(args []string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "authz driver launcher: %v; the driver was not started\n", err)
		return launcherExitCode
	}
	if len(args) < 3 {
		return fail(fmt.Errorf("want the limits argument"))
	}
	if err := setLimits(args[2]); err != nil {
		return fail(err)
	}
	if err := installSeccomp(); err != nil {
		return fail(err)
	}
	// Resolved by execve before the descriptor closes: the driver does not inherit it.
	unix.CloseOnExec(launchFD)
	argv := append([]string{args[0]}, args[3:]...)
	err := unix.Exec(fmt.Sprintf("/proc/self/fd/%d", launchFD), argv, os.Environ())
	return fail(fmt.Errorf("execute the driver: %w", err))
}

// rlimits are the resource limits of ResourceLimits, by their name in the launcher's argument.
var rlimits = []struct {
	name, field string
	resource    int
	value       func(ResourceLimits) uint64
}{
	{"as", "addressSpaceBytes", unix.RLIMIT_AS, func(l ResourceLimits) uint64 { return l.AddressSpaceBytes }},
	{"nproc", "processes", unix.RLIMIT_NPROC, func(l ResourceLimits) uint64 { return l.Processes }},
	{"nofile", "openFiles", unix.RLIMIT_NOFILE, func(l ResourceLimits) uint64 { return l.OpenFiles }},
	{"cpu", "cpuSeconds", unix.RLIMIT_CPU, func(l ResourceLimits) uint64 { return l.CPUSeconds }},
}

// launchLimits writes the launcher's limits argument: "limits:" and NAME=VALUE pairs,
// comma-separated, for the limits set.
func launchLimits(l ResourceLimits) string {
	var pairs []string
	for _, r := range rlimits {
		if v := r.value(l); v != 0 {
			pairs = append(pairs, r.name+"="+strconv.FormatUint(v, 10))
		}
	}
	return "limits:" + strings.Join(pairs, ",")
}

// setLimits sets on the launcher (and so on the driver it becomes) the limits of arg.
func setLimits(arg string) error {
	spec, ok := strings.CutPrefix(arg, "limits:")
	if !ok {
		return fmt.Errorf("bad limits argument %q", arg)
	}
	for pair := range strings.SplitSeq(spec, ",") {
		if pair == "" {
			continue
		}
		name, value, _ := strings.Cut(pair, "=")
		v, err := strconv.ParseUint(value, 10, 64)
		if err != nil {
			return fmt.Errorf("bad limit %q", pair)
		}
		known := false
		for _, r := range rlimits {
			if r.name == name {
				known = true
				if err := unix.Setrlimit(r.resource, &unix.Rlimit{Cur: v, Max: v}); err != nil {
					return fmt.Errorf("limits.%s: set %d: %w", r.field, v, err)
				}
			}
		}
		if !known {
			return fmt.Errorf("unknown limit %q", name)
		}
	}
	return nil
}
