package configcheck_test

import (
	"errors"
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
