//go:build linux

package landlock

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Spec is what the launcher's Landlock ruleset lets a driver reach beyond the system
// files: its private temporary directory and what its plugin's sandbox configuration adds.
type Spec struct {
	Tmp     string   `json:"tmp,omitempty"`
	Read    []string `json:"read,omitempty"`
	Write   []string `json:"write,omitempty"`
	Connect []uint16 `json:"connect,omitempty"`
}

// Landlock's ABI versions that matter here: 4 adds TCP bind and connect rules, 6 the scoping
// of signals and abstract unix sockets to the driver's own domain.
const (
	landlockNetABI   = 4
	landlockScopeABI = 6
)

// systemReadDirs are read (and executed) by any driver: libraries, certificates, time zones.
var systemReadDirs = []string{
	"/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/share/zoneinfo", "/usr/share/ca-certificates",
	"/etc/ssl", "/etc/pki", "/etc/ca-certificates",
	// The Go runtime reads its CPU quota and huge page size here.
	"/sys/fs/cgroup", "/sys/kernel/mm/transparent_hugepage",
	// Its own /proc files: where the driver stage mounted a procfs of the driver's pid
	// namespace before these rules are made, the rule is bound to it, and the process table is
	// the namespace's only; elsewhere the machine's, as the kernel's ptrace checks allow.
	"/proc",
}

// systemReadFiles are the name resolution and user database files any driver may read.
var systemReadFiles = []string{
	"/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf",
	"/etc/services", "/etc/protocols", "/etc/localtime", "/etc/passwd", "/etc/group",
	"/dev/urandom", "/dev/random",
}

// systemWriteFiles are the devices any driver may open for writing.
var systemWriteFiles = []string{"/dev/null", "/dev/zero"}

// Arg writes the launcher's sandbox argument.
func Arg(s Spec) string {
	b, _ := json.Marshal(s)
	return "sandbox:" + string(b)
}

// ABI is the kernel's Landlock ABI version, 0 without Landlock.
func ABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return v
}

// Missing says what of the sandbox this kernel lacks, "" when it has all of it.
func Missing() string {
	switch v := ABI(); {
	case v == 0:
		return "Landlock (the kernel has none, or it is off): a driver reads and writes whatever its user may"
	case v < landlockNetABI:
		return fmt.Sprintf("Landlock network rules (kernel ABI %d, want %d): a driver binds and connects to any TCP port", v, landlockNetABI)
	case v < landlockScopeABI:
		return fmt.Sprintf("Landlock scoping (kernel ABI %d, want %d): a driver signals processes of its user and reaches abstract unix sockets", v, landlockScopeABI)
	}
	return ""
}

// Apply restricts the calling thread (which then executes the driver: the domain is
// inherited across execve, and by every process the driver starts) to what arg allows.
// The caller keeps its OS thread locked until the exec.
func Apply(arg string) error {
	raw, ok := strings.CutPrefix(arg, "sandbox:")
	if !ok {
		return fmt.Errorf("bad sandbox argument %q", arg)
	}
	var spec Spec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return fmt.Errorf("bad sandbox argument: %w", err)
	}
	rules := []landlock.Rule{
		landlock.RODirs(systemReadDirs...).IgnoreIfMissing(),
		landlock.ROFiles(systemReadFiles...).IgnoreIfMissing(),
		landlock.RWFiles(systemWriteFiles...).IgnoreIfMissing(),
	}
	if spec.Tmp != "" {
		rules = append(rules, landlock.RWDirs(spec.Tmp))
	}
	for _, p := range spec.Read {
		if isDir(p) {
			rules = append(rules, landlock.RODirs(p))
		} else {
			rules = append(rules, landlock.ROFiles(p).IgnoreIfMissing())
		}
	}
	for _, p := range spec.Write {
		if isDir(p) {
			rules = append(rules, landlock.RWDirs(p))
		} else {
			rules = append(rules, landlock.RWFiles(p).IgnoreIfMissing())
		}
	}
	for _, port := range spec.Connect {
		rules = append(rules, landlock.ConnectTCP(port))
	}
	// Everything V7 handles: files, TCP bind and connect, signals and abstract unix sockets
	// outside the domain; on an older kernel, what it has (the host warns of the rest).
	fd, flags, err := landlock.V7.BestEffort().NewRulesetFD(rules...)
	if err != nil {
		return fmt.Errorf("build the Landlock ruleset: %w", err)
	}
	if fd < 0 {
		return nil // no Landlock here: the host reported it missing
	}
	defer func() { _ = unix.Close(fd) }()
	runtime.LockOSThread() // never unlocked: this thread executes the driver
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if err := ll.LandlockRestrictSelf(fd, flags); err != nil {
		return fmt.Errorf("enforce the Landlock ruleset: %w", err)
	}
	return nil
}

// isDir reports whether p is a directory (a rule for a directory covers what is beneath it).
func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// Tmp is the private directory of the launcher's sandbox argument, "" when none.
func Tmp(arg string) string { return specOf(arg).Tmp }

// ConnectsTCP reports whether the sandbox argument lists TCP ports the driver may connect to:
// only then may it open IP sockets at all (seccomp.Install).
func ConnectsTCP(arg string) bool { return len(specOf(arg).Connect) > 0 }

// specOf reads a sandbox argument; a malformed one is the empty Spec.
func specOf(arg string) Spec {
	raw, ok := strings.CutPrefix(arg, "sandbox:")
	if !ok {
		return Spec{}
	}
	var spec Spec
	if json.Unmarshal([]byte(raw), &spec) != nil {
		return Spec{}
	}
	return spec
}
