package hostpid

import (
	"errors"
	"os"
	"testing"
)

// TestResolve: a plain pid is one; this process's own Ref resolves to its pid; a pid of a pid
// namespace no process is in is gone; anything else is an error.
func TestResolve(t *testing.T) {
	if pid, err := Resolve("1234\n"); err != nil || pid != 1234 {
		t.Errorf("Resolve(1234) = %d, %v", pid, err)
	}
	if pid, err := Resolve(Self()); err != nil || pid != os.Getpid() {
		t.Errorf("Resolve(Self() %q) = %d, %v; want %d", Self(), pid, err, os.Getpid())
	}
	if pid, err := Resolve(Of(os.Getpid())); err != nil || pid != os.Getpid() {
		t.Errorf("Resolve(Of(own pid) %q) = %d, %v; want %d", Of(os.Getpid()), pid, err, os.Getpid())
	}
	if _, err := Resolve("5@pid:[1]"); !errors.Is(err, ErrGone) {
		t.Errorf("a namespace no process is in: %v, want ErrGone", err)
	}
	for _, bad := range []string{"", "x", "0", "-3", "5@", "5@net:[4026531840]", "5@pid:[1"} {
		if _, err := Resolve(bad); err == nil || errors.Is(err, ErrGone) {
			t.Errorf("Resolve(%q): %v, want an error", bad, err)
		}
	}
}
