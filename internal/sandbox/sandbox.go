// Package sandbox contains authz's driver plugins. A program that hosts drivers calls Init
// first thing in main (and a test binary that starts drivers, first thing in TestMain). The
// host starts each driver by executing its own program again with the launcher's arguments;
// Init recognises them, runs the launcher (a pid namespace's init, the driver's limits, Landlock
// sandbox and seccomp filter) and never returns then. Without Init the host starts drivers
// uncontained and says so in its start-up WARN and in /v1/plugins. Registration is explicit,
// like moby's reexec.Init: no library runs it from an init function.
//
// This package holds both sides of the launcher: the re-executed process (trampoline_linux.go:
// the namespaces' parent, the init that reaps and reports the driver's pid, stops, continues
// and exit over an inherited socket, the driver stage that sets limits, Landlock and seccomp
// and executes the driver) and the host's (contain_linux.go: the non-dumpable host, the
// launcher's executable, the namespace probe, what containment is missing; process_linux.go:
// the contained process). The plugin host (internal/pluginhost) asks NewProcess for a
// go-plugin runner.Runner built from a Spec (the driver's argv and environment, its sealed
// executable, limits, Landlock rules, credentials, cgroup descriptor and hooks) and wraps it
// with what only the host knows: the pin, the peer-credential check of the driver's socket,
// its cgroup and reaper. The plugin host imports this package, never the other way round.
//
// The parts that need nothing of the host or the launcher are packages below this one:
// seccomp (the system call allowlist and its BPF program), landlock (the file, network and
// scope rules), rlimit (the setrlimit limits) and tmpfs (the sized tmpfs, in a mount namespace
// of the driver's own, that is its private temporary directory).
//
// # Lock order
//
// Process.mu guards the pid until Start returns and whether the process was killed; Start holds
// it while the process starts, and so while the Started hook runs (and, after a failed start,
// Release and Cleanup): a hook may take the host's leaf locks, never call back into the
// Process. Process.fdMu guards the pidfds against their closing by Release; it is a leaf. Kill
// calls its hooks with no lock held. A decision takes neither: Alive and Answering are atomic
// loads, Running adds one pread of a descriptor held open. The plugin host's whole order is in
// its package doc (internal/pluginhost) and docs/drivers.md, "Lock order".
//
// See docs/drivers.md, "What a driver can and cannot do" and "Lock order".
package sandbox

// Init runs the driver launcher when this process was started as one (it then exits), and
// otherwise registers it and returns.
func Init() { initLauncher() }
