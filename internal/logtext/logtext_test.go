package logtext

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestEscape(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "bundle authz: ok", "bundle authz: ok"},
		{"tab kept", "a\tb", "a\tb"},
		{"newline", "x.rego\n[INFO] forged", `x.rego\n[INFO] forged`},
		{"carriage return", "a\rb", `a\rb`},
		{"escape sequence", "a\x1b[2Jb", `a\x1b[2Jb`},
		{"C1 control", "a\u0085b", `a\u0085b`},
		{"bidi override", "a\u202eb", `a\u202eb`},
		{"invalid UTF-8", "a\xffb", `a\xffb`},
		{"replacement character kept", "a\uFFFDb", "a\uFFFDb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Escape(tc.in))
		})
	}
}

func TestRedactURLs(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"no URL", "bundle authz: server replied with Not Found", "bundle authz: server replied with Not Found"},
		{"plain URL", `Get "https://b.example/bundles/authz.tar.gz": EOF`, `Get "https://b.example/bundles/authz.tar.gz": EOF`},
		{"query values", `Get "https://b.example/a.tar.gz?sig=SECRET&se=2026": EOF`, `Get "https://b.example/a.tar.gz?sig=xxxxx&se=xxxxx": EOF`},
		{"query without value", "https://b.example/a?SECRET", "https://b.example/a?xxxxx"},
		{"password", "https://user:SECRET@b.example/a", "https://xxxxx@b.example/a"},
		{"token as user name", "https://SECRET@b.example/a", "https://xxxxx@b.example/a"},
		{"fragment", "https://b.example/a#token=SECRET", "https://b.example/a#xxxxx"},
		{"two URLs", "http://a/x?k=S1 and http://u:S2@b/y", "http://a/x?k=xxxxx and http://xxxxx@b/y"},
		{"unparsable", "http://u:S1@b%zz/x?k=S2", "http://xxxxx@b%zz/x?xxxxx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := RedactURLs(tc.in)
			assert.Equal(t, tc.want, got)
			assert.NotContains(t, got, "SECRET")
		})
	}
}

func TestCleanRedactsThenEscapes(t *testing.T) {
	assert.Equal(t, `http://h/a?sig=xxxxx\n[INFO] x`, Clean("http://h/a?sig=SECRET\n[INFO] x"))
}
