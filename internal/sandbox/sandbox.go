// Package sandbox registers the launcher that contains authz's driver plugins: a program that
// hosts drivers calls Init first thing in main (and a test binary that starts drivers, first
// thing in TestMain). The host starts each driver by executing its own program again with the
// launcher's arguments; Init recognises them, runs the launcher (a pid namespace's init, the
// driver's limits, Landlock sandbox and seccomp filter) and never returns then. Without Init
// the host starts drivers uncontained and says so in its start-up WARN and in /v1/plugins.
// Registration is explicit, like moby's reexec.Init: no library runs it from an init function.
//
// The containment's parts that need nothing of the plugin host are packages below this one:
// seccomp (the system call allowlist and its BPF program), landlock (the file, network and
// scope rules), rlimit (the setrlimit limits) and tmpfs (the sized tmpfs, in a mount namespace
// of the driver's own, that is its private temporary directory). The launcher itself (the pid and user
// namespaces, the init that reaps and reports the driver's pid and exit) and the host's side of
// it (building the launcher's command, the containment report) are still in internal/pluginhost,
// which this package calls.
//
// See docs/drivers.md, "What a driver can and cannot do".
package sandbox

import "github.com/authz-dev/authz/internal/pluginhost"

// Init runs the driver launcher when this process was started as one (it then exits), and
// otherwise registers it and returns.
func Init() { pluginhost.InitLauncher() }
