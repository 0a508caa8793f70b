package policy

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
)

// counterProvider is a kind of source for the test: each start and reload activates a policy
// whose revision counts them.
type counterProvider struct {
	s      *Source
	n      int
	closed int
}

func (p *counterProvider) activate(ctx context.Context) error {
	p.n++
	mod := ast.MustParseModuleWithOpts("package authz\ndecision := {\"allow\": false}\n", ast.ParserOptions{})
	pol, err := decision.CompileModules(map[string]*ast.Module{"p.rego": mod}, nil, "counter-"+string(rune('0'+p.n)))
	if err != nil {
		return err
	}
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.s.activateLocked(ctx, pol, "counter", "")
}

func (p *counterProvider) start(ctx context.Context) error  { return p.activate(ctx) }
func (p *counterProvider) reload(ctx context.Context) error { return p.activate(ctx) }
func (p *counterProvider) status(st *Status) {
	st.Bundles["counter"] = &bundleplugin.Status{Name: "counter", ActiveRevision: st.Revision}
}
func (p *counterProvider) close(context.Context) { p.closed++ }

// TestAKindOfSourceIsOneProviderAndOneEntry: a kind of source is a provider and an entry in
// kinds; the Source hands it start, reload, status and close, and shows its origin.
func TestAKindOfSourceIsOneProviderAndOneEntry(t *testing.T) {
	saved := kinds
	t.Cleanup(func() { kinds = saved })
	var made *counterProvider
	kinds = append([]kind{{name: "counter", selects: func(c Config) bool { return c.Bundle == "" && len(c.OPA) == 0 },
		new: func(s *Source) provider { made = &counterProvider{s: s}; return made }}}, saved...)

	assert.Equal(t, "counter", Config{}.Kind())
	assert.Equal(t, OriginFile, Config{Bundle: "b.tar.gz"}.Kind(), "the kinds after it are still selected")
	eng, src, err := Start(t.Context(), Config{}, decision.Options{}, Options{})
	require.NoError(t, err)
	assert.Equal(t, "counter-1", eng.Revision())
	require.NoError(t, src.Reload(t.Context()))
	st := src.Status()
	assert.Equal(t, "counter-2", st.Revision)
	assert.Equal(t, "counter", st.Origin)
	assert.Equal(t, "counter-2", st.Bundles["counter"].ActiveRevision)
	src.Close(t.Context())
	src.Close(t.Context())
	assert.Equal(t, 1, made.closed, "Close closes the provider once")
}
