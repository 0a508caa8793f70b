package main

import (
	"fmt"
	"io"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/policies"
)

// policyRevision is the revision of the embedded policy: the "revision" of every decision this
// binary makes with it.
func policyRevision() (string, error) {
	mods, err := policies.Modules()
	if err != nil {
		return "", fmt.Errorf("read the embedded policy: %w", err)
	}
	return decision.ContentRevision(mods), nil
}

func printVersion(w io.Writer) error {
	rev, err := policyRevision()
	if err != nil {
		return err
	}
	b := server.Build()
	_, err = fmt.Fprintf(w, "authz %s\npolicy %s\nrevision %s\ngo %s\nopa %s\n", b.Version, rev, b.Revision, b.GoVersion, b.OPAVersion)
	return err
}
