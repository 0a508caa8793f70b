package configcheck_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/configcheck"
)

func TestProblems(t *testing.T) {
	tests := []struct {
		name string
		add  func(p *configcheck.Problems)
		want string
	}{
		{name: "none", add: func(*configcheck.Problems) {}},
		{name: "nil part", add: func(p *configcheck.Problems) { p.Include(nil) }},
		{name: "one", add: func(p *configcheck.Problems) { p.Add("maxBodyBytes", "must be positive, got %d", 0) },
			want: "maxBodyBytes: must be positive, got 0"},
		{name: "in the order recorded", add: func(p *configcheck.Problems) {
			p.Add("addr", "%q: want host:port", "x")
			p.Include(errors.New("plugins[0].id: must not be empty"))
			p.Add("tls.key", "must be set together with tls.cert")
		}, want: "addr: \"x\": want host:port\nplugins[0].id: must not be empty\ntls.key: must be set together with tls.cert"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p configcheck.Problems
			tt.add(&p)
			if tt.want == "" {
				assert.NoError(t, p.Err())
				return
			}
			require.Error(t, p.Err())
			assert.Equal(t, tt.want, p.Err().Error())
		})
	}
}

// TestUnder: Under names every field of a configuration below the field that holds it, from
// the errors' structure: through nested joins and the name a *DocumentError tells, whatever
// the messages hold (a newline included); an error that names no field follows "prefix: "
// with its message kept whole.
func TestUnder(t *testing.T) {
	problems := func(add func(p *configcheck.Problems)) error {
		var p configcheck.Problems
		add(&p)
		return p.Err()
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{name: "a field", err: problems(func(p *configcheck.Problems) { p.Add("addr", "%q: want host:port", "x") }),
			want: `plugins.authz.addr: "x": want host:port`},
		{name: "nested joins", err: problems(func(p *configcheck.Problems) {
			p.Add("evalTimeout", "must be positive")
			p.Include(problems(func(p *configcheck.Problems) {
				p.Add("plugins[0].id", "must not be empty")
				p.Include(problems(func(p *configcheck.Problems) { p.Add("tls.key", "must be set together with tls.cert") }))
			}))
			p.Add("log.level", "must be one of trace, debug, info, warn, error, off")
		}), want: "plugins.authz.evalTimeout: must be positive\nplugins.authz.plugins[0].id: must not be empty\n" +
			"plugins.authz.tls.key: must be set together with tls.cert\nplugins.authz.log.level: must be one of trace, debug, info, warn, error, off"},
		{name: "a message holding a newline", err: problems(func(p *configcheck.Problems) {
			p.Add("opa", "first line\nsecond line")
			p.Add("addr", "must be set")
		}), want: "plugins.authz.opa: first line\nsecond line\nplugins.authz.addr: must be set"},
		{name: "a field told with the configuration's name",
			err:  &configcheck.DocumentError{Name: "config", Err: &configcheck.FieldError{Field: "evalTimeout", Line: 3, Err: errors.New("cannot unmarshal")}},
			want: "plugins.authz.evalTimeout (line 3): cannot unmarshal"},
		{name: "a value at several fields",
			err:  &configcheck.FieldError{Field: "configCheckTimeout", Or: []string{"evalTimeout"}, Line: 1, Err: errors.New("cannot unmarshal")},
			want: "plugins.authz.configCheckTimeout or plugins.authz.evalTimeout (line 1): cannot unmarshal"},
		{name: "a problem of the whole configuration", err: errors.New("line 3: did not find expected key"),
			want: "plugins.authz: line 3: did not find expected key"},
		{name: "told with the configuration's name", err: &configcheck.DocumentError{Name: "config", Err: errors.New("line 3: did not find expected key")},
			want: "plugins.authz: line 3: did not find expected key"},
		{name: "other errors that wrap several keep their words",
			err:  fmt.Errorf("%w and %w", &configcheck.FieldError{Field: "a", Err: errors.New("x")}, &configcheck.FieldError{Field: "b", Err: errors.New("y")}),
			want: "plugins.authz: a: x and b: y"},
		{name: "another wrapper keeps its words", err: fmt.Errorf("read: %w", &configcheck.FieldError{Field: "addr", Err: errors.New("must be set")}),
			want: "plugins.authz: read: addr: must be set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.err.Error()
			got := configcheck.Under("plugins.authz", tt.err)
			require.Error(t, got)
			assert.Equal(t, tt.want, got.Error())
			assert.Equal(t, before, tt.err.Error(), "err is left as it was")
		})
	}
	assert.NoError(t, configcheck.Under("plugins.authz", nil))
}

// TestUnderKeepsTheCause: the moved problems wrap the original ones, so errors.Is and
// errors.As find the cause and the field's new name.
func TestUnderKeepsTheCause(t *testing.T) {
	cause := errors.New("no such file")
	var p configcheck.Problems
	p.Add("addr", "must be set")
	p.Include(&configcheck.FieldError{Field: "plugins[0].path", Err: cause})
	err := configcheck.Under("plugins.authz", &configcheck.DocumentError{Name: "config", Err: p.Err()})
	assert.ErrorIs(t, err, cause)
	var fe *configcheck.FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "plugins.authz.addr", fe.Field)
}

func TestWithLinesFindsTheField(t *testing.T) {
	src := []byte("addr: x\nplugins:\n  - id: a\n    sha256: abc\ndecisionLog:\n  mask:\n    - /a\n    - /b\n")
	var p configcheck.Problems
	p.Add("plugins[0].sha256", "bad")
	p.Add("decisionLog.mask[1]", "bad")
	p.Add("tls.key", "not in the file")
	p.Include(&configcheck.FieldError{Field: "addr", Line: 9, Err: errors.New("told")})
	p.Include(errors.New("whole"))
	var got []string
	for _, e := range configcheck.WithLines(configcheck.Under("plugins.authz", p.Err()), nil) {
		got = append(got, e.Error())
	}
	assert.Equal(t, []string{"plugins.authz.plugins[0].sha256: bad", "plugins.authz.decisionLog.mask[1]: bad",
		"plugins.authz.tls.key: not in the file", "plugins.authz.addr (line 9): told", "plugins.authz: whole"}, got, "no source: no lines")
	got = nil
	for _, e := range configcheck.WithLines(p.Err(), src) {
		got = append(got, e.Error())
	}
	assert.Equal(t, []string{"plugins[0].sha256 (line 4): bad", "decisionLog.mask[1] (line 8): bad",
		"tls.key: not in the file", "addr (line 9): told", "whole"}, got)
}
