// Package logtext makes text that comes from outside the service (a driver's output, a bundle
// server's answers, OPA's error messages quoting bundle entry names and URLs) safe to write
// into the service log, the status and metrics labels: Escape makes control characters
// visible, so that such text cannot forge or hide a log line; RedactURLs removes the
// credentials of the URLs it holds. Clean does both.
package logtext

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Redacted replaces the user information, every query value and the fragment of a URL.
const Redacted = "xxxxx"

// Clean is Escape(RedactURLs(s)): what every text from outside goes through before it is
// logged or shown.
func Clean(s string) string { return Escape(RedactURLs(s)) }

// IsControl reports the runes that can move a terminal's cursor, change its state or reorder
// text: C0 and C1 controls (tab excepted), DEL, the Unicode line and paragraph separators and
// the bidirectional overrides and isolates.
func IsControl(r rune) bool {
	switch {
	case r == '\t':
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x2028, r == 0x2029, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// Escape writes every control rune (IsControl) and every invalid UTF-8 byte of s as a visible
// escape (\r, \n, \x1b, \u202e), so that the text stays on one line and cannot forge or hide a
// line of the log it is written to.
func Escape(s string) string {
	clean := true
	for i, r := range s {
		if IsControl(r) || r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD") {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80 && IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case IsControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// urlPattern finds URLs with a scheme in free text; the URL ends at white space, a quote or an
// angle bracket (how URLs are delimited in Go's and OPA's error messages).
var urlPattern = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>]+`)

// RedactURLs returns s with the credentials of every URL in it replaced by Redacted: the user
// information (name and password), the value of every query parameter (query strings carry
// signed-URL signatures and tokens) and the fragment. A URL that does not parse loses all of its user
// information and query. Text without "://" is returned as it is.
func RedactURLs(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	return urlPattern.ReplaceAllStringFunc(s, RedactURL)
}

// RedactURL is one URL with its user information, query values and fragment replaced by
// Redacted.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return redactUnparsed(raw)
	}
	if u.User != nil {
		u.User = url.User(Redacted) // a user name alone may be a token
	}
	if u.RawQuery != "" || u.ForceQuery {
		u.RawQuery = redactQuery(u.RawQuery)
	}
	if u.Fragment != "" {
		u.Fragment, u.RawFragment = Redacted, ""
	}
	return u.String()
}

// redactQuery keeps the query's names and replaces each value.
func redactQuery(q string) string {
	parts := strings.Split(q, "&")
	for i, p := range parts {
		if name, _, ok := strings.Cut(p, "="); ok {
			parts[i] = name + "=" + Redacted
		} else if p != "" {
			parts[i] = Redacted
		}
	}
	return strings.Join(parts, "&")
}

// redactUnparsed drops the user information and the query of a URL url.Parse refused.
func redactUnparsed(raw string) string {
	scheme, rest, _ := strings.Cut(raw, "://")
	if at := strings.LastIndex(strings.SplitN(rest, "/", 2)[0], "@"); at >= 0 {
		rest = Redacted + "@" + rest[at+1:]
	}
	if q := strings.IndexAny(rest, "?#"); q >= 0 {
		rest = rest[:q] + "?" + Redacted
	}
	return scheme + "://" + rest
}
