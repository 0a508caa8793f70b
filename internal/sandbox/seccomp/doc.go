// Package seccomp builds and installs the seccomp filter of a contained driver: an allowlist of
// the system calls a Go driver needs (each group says why), with argument conditions on clone,
// socket, ioctl and personality, assembled into classic BPF. The driver launcher calls Install
// after its limits and Landlock sandbox and before it executes the driver; the plugin host calls
// Available once at start-up to say in its WARN and in /v1/plugins when the kernel cannot filter.
//
// Linux only (amd64 and arm64 have an allowlist; elsewhere Available reports why there is none).
package seccomp
