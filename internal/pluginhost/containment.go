package pluginhost

// Containment is how a worker is contained, as GET /v1/plugins shows it.
type Containment struct {
	// UID and GID are the user and group the driver runs as.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// Seccomp: the driver started with the host's seccomp filter (docs/drivers.md).
	Seccomp bool `json:"seccomp"`
	// Cgroup: the worker runs in a cgroup of its own, ended as a whole.
	Cgroup bool `json:"cgroup"`
	// HostNonDumpable: the host process is not dumpable.
	HostNonDumpable bool `json:"hostNonDumpable"`
	// Missing names each mechanism the worker runs without, and why.
	Missing []string `json:"missing,omitempty"`
}
