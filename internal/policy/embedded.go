package policy

import (
	"context"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
)

// embeddedProvider is the policy built into the binary, activated under the revision
// `authz version` prints. It never changes; an opa section still runs OPA's decision logs and
// status.
type embeddedProvider struct{ s *Source }

func newEmbeddedProvider(s *Source) provider { return embeddedProvider{s: s} }

func (p embeddedProvider) start(ctx context.Context) error {
	pol, err := EmbeddedGate()
	if err != nil {
		return err
	}
	p.s.mu.Lock()
	err = p.s.activateGateLocked(ctx, pol, "")
	p.s.mu.Unlock()
	if err != nil {
		return err
	}
	return p.s.startOPA(ctx, false)
}

func (embeddedProvider) reload(context.Context) error { return nil }

func (embeddedProvider) status(*Status) {}

func (p embeddedProvider) close(ctx context.Context) { p.s.stopOPA(ctx) }

// EmbeddedGate is the policy built into the binary as the gate's policy (GatePolicy), under
// the revision `authz version` prints. It fails with coded.PolicyBundleCheck.
func EmbeddedGate() (*GatePolicy, error) {
	p, err := decision.EmbeddedPolicy()
	if err != nil {
		return nil, &coded.Error{Code: coded.PolicyBundleCheck, Err: err}
	}
	return &GatePolicy{p: p, origin: OriginEmbedded}, nil
}
