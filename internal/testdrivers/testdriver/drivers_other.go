//go:build !linux

package main

import (
	"github.com/authz-dev/authz/internal/testdrivers/bounds"
	"github.com/authz-dev/authz/internal/testdrivers/checks"
	"github.com/authz-dev/authz/internal/testdrivers/faults"
	"github.com/authz-dev/authz/internal/testdrivers/identity"
	"github.com/authz-dev/authz/internal/testdrivers/liveness"
)

// drivers maps each marker to its driver's Main (the hostile driver needs Linux).
func drivers() map[string]func([]string) int {
	return map[string]func([]string) int{
		faults.Marker:   faults.Main,
		FailingMarker:   failing,
		BoundsMarker:    bounds.Main,
		checks.Marker:   checks.Main,
		identity.Marker: identity.Main,
		liveness.Marker: liveness.Main,
	}
}
