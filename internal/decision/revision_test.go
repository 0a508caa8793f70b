package decision_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/authz-dev/authz/internal/decision"
)

// TestRevisions: the revisions of policy content are stable digests (the values docs and
// decision logs show: these are the values of the digests authz has always used), independent
// of map order; data counts when given; several bundles join
// as sorted NAME=REVISION pairs, one bundle is its revision alone.
func TestRevisions(t *testing.T) {
	mods := map[string]string{"b.rego": "package b", "a.rego": "package a"}
	tests := []struct {
		name string
		got  string
		want string
	}{
		{name: "modules", got: decision.ContentRevision(mods), want: "sha256:892422aa711a2771"},
		{name: "modules and nil data", got: decision.ContentRevision(mods, nil), want: "sha256:dc258cc3abece0f9"},
		{name: "modules and data", got: decision.ContentRevision(mods, map[string]any{"x": 1}), want: "sha256:6aa692e0f612ae82"},
		{name: "one bundle", got: decision.JoinRevisions(map[string]string{"authz": "r1"}), want: "r1"},
		{name: "bundles", got: decision.JoinRevisions(map[string]string{"z": "r2", "a": "r1"}), want: "a=r1,z=r2"},
		{name: "no bundle", got: decision.JoinRevisions(nil), want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.got)
		})
	}
}
