package api

// The plugin host's state as the API shows it (GET /v1/plugins): the types the plugin host
// fills and the HTTP server renders.

import "time"

// PluginState is a plugin's state as GET /v1/plugins shows it (the JSON names) and as the
// service log and tests read it.
type PluginState struct {
	ID     string `json:"id"`
	Key    string `json:"key"`
	Status string `json:"status"`
	// LastErrorCode is the code of the plugin's last failure (coded.PinMismatch,
	// coded.StartTimeout, …; "" when none): all that API callers see of it.
	LastErrorCode string `json:"lastError"`
	Restarts      uint64 `json:"restarts"`
	// PinDrift is true when the binary at the plugin's path no longer has its pinned SHA-256
	// (an in-place upgrade, a tampered file): the running worker still runs the pinned bytes,
	// and the next start will fail with PIN_MISMATCH until the pin is updated.
	PinDrift bool `json:"pinDrift"`
	// Worker is the running worker, nil (JSON null) while none runs.
	Worker *WorkerState `json:"worker"`
	// LastError is the last failure itself. It names paths and digests, so it goes to the
	// service log and never to the API.
	LastError string `json:"-"`
}

// WorkerState describes a live worker.
type WorkerState struct {
	PID              int       `json:"pid"`
	Generation       uint64    `json:"generation"`
	StartedAt        time.Time `json:"startedAt"`
	SupportedMethods []string  `json:"supportedMethods"`
	// Containment is how the worker is kept out of the host's reach .
	Containment *Containment `json:"containment"`
}

// Containment is how a worker is contained, as GET /v1/plugins shows it.
type Containment struct {
	// UID and GID are the user and group the driver runs as.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// Seccomp: the driver started with the host's seccomp filter (docs/drivers.md).
	Seccomp bool `json:"seccomp"`
	// PidNamespace: the driver runs in a pid namespace of its own, under an init that ends it
	// (and everything it started) with the host.
	PidNamespace bool `json:"pidNamespace"`
	// Landlock: the driver runs under the host's Landlock sandbox, with everything the
	// sandbox asks of the kernel (file, TCP and scope rules); Missing says what it lacks.
	Landlock bool `json:"landlock"`
	// SizedTmp: the driver's private temporary directory (TMPDIR) is a tmpfs of its own, in a
	// mount namespace of its own, bounded by the plugin's limits.tempDirBytes.
	SizedTmp bool `json:"sizedTmp"`
	// PrivateProc: the driver's /proc is one of its own pid namespace, mounted in its mount
	// namespace: it sees its init, itself and what it started, no other process of the machine.
	PrivateProc bool `json:"privateProc"`
	// Cgroup: the worker runs in a cgroup of its own, ended as a whole.
	Cgroup bool `json:"cgroup"`
	// HostNonDumpable: the host process is not dumpable.
	HostNonDumpable bool `json:"hostNonDumpable"`
	// Missing names each mechanism the worker runs without, and why.
	Missing []string `json:"missing,omitempty"`
}
