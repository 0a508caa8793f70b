//go:build linux

// Package rlimit sets a contained driver's resource limits (setrlimit): the plugin host writes
// them into the launcher's argument with Limits.Arg, the launcher sets them on itself (and so
// on the driver it executes) with Set, and a driver started without the launcher gets them from
// the host with Prlimit right after it started.
package rlimit

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Limits are a driver's resource limits; a zero field is not set. Each is named after the
// plugin host's configuration field (limits.<field> in its errors).
type Limits struct {
	AddressSpaceBytes uint64 // RLIMIT_AS, limits.addressSpaceBytes
	Processes         uint64 // RLIMIT_NPROC, limits.processes
	OpenFiles         uint64 // RLIMIT_NOFILE, limits.openFiles
	DataBytes         uint64 // RLIMIT_DATA, limits.dataBytes
	FileSizeBytes     uint64 // RLIMIT_FSIZE, limits.fileSizeBytes
	CPUSeconds        uint64 // RLIMIT_CPU, limits.cpuSeconds
}

// rlimits are the resource limits of Limits, by their name in the launcher's argument.
var rlimits = []struct {
	name, field string
	resource    int
	value       func(Limits) uint64
}{
	{"as", "addressSpaceBytes", unix.RLIMIT_AS, func(l Limits) uint64 { return l.AddressSpaceBytes }},
	{"nproc", "processes", unix.RLIMIT_NPROC, func(l Limits) uint64 { return l.Processes }},
	{"nofile", "openFiles", unix.RLIMIT_NOFILE, func(l Limits) uint64 { return l.OpenFiles }},
	{"data", "dataBytes", unix.RLIMIT_DATA, func(l Limits) uint64 { return l.DataBytes }},
	{"fsize", "fileSizeBytes", unix.RLIMIT_FSIZE, func(l Limits) uint64 { return l.FileSizeBytes }},
	{"cpu", "cpuSeconds", unix.RLIMIT_CPU, func(l Limits) uint64 { return l.CPUSeconds }},
}

// Arg writes the launcher's limits argument: "limits:" and NAME=VALUE pairs, comma-separated,
// for the limits set.
func (l Limits) Arg() string {
	var pairs []string
	for _, r := range rlimits {
		if v := r.value(l); v != 0 {
			pairs = append(pairs, r.name+"="+strconv.FormatUint(v, 10))
		}
	}
	return "limits:" + strings.Join(pairs, ",")
}

// Set sets on the calling process (the launcher, and so the driver it becomes) the limits of arg.
func Set(arg string) error {
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

// Prlimit sets the limits on the running process pid (a driver started without the launcher).
func Prlimit(pid int, l Limits) error {
	for _, r := range rlimits {
		v := r.value(l)
		if v == 0 {
			continue
		}
		rl := unix.Rlimit{Cur: v, Max: v}
		if err := unix.Prlimit(pid, r.resource, &rl, nil); err != nil {
			return fmt.Errorf("limits.%s: set %d on the driver: %w", r.field, v, err)
		}
	}
	return nil
}
