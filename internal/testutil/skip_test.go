package testutil_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/authz-dev/authz/internal/testutil"
)

// recorder stands in for a test: it records whether SkipUnlessCI failed or skipped it.
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}
func (r *recorder) Skipf(format string, args ...any) {
	if r.failed == "" {
		r.skipped = fmt.Sprintf(format, args...)
	}
}

// TestSkipUnlessCIFailsInCI: under CI=true a containment test that cannot run fails the run;
// elsewhere it skips with its reason.
func TestSkipUnlessCIFailsInCI(t *testing.T) {
	t.Setenv("CI", "true")
	r := &recorder{TB: t}
	testutil.SkipUnlessCI(r, "no writable cgroup v2 hierarchy: %s", "read-only")
	assert.Equal(t, "CI=true, where this test must run: no writable cgroup v2 hierarchy: read-only", r.failed)
	assert.Empty(t, r.skipped)

	t.Setenv("CI", "")
	r = &recorder{TB: t}
	testutil.SkipUnlessCI(r, "needs root")
	assert.Empty(t, r.failed)
	assert.Equal(t, "needs root", r.skipped)
}
