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
	built := b.GoVersion + ", opa " + b.OPAVersion
	if b.Revision != "" {
		built = "revision " + b.Revision + ", " + built
	}
	_, err = fmt.Fprintf(w, "authz %s (%s)\npolicy %s\n", b.Version, built, rev)
	return err
}
