package server_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
)

// TestTokenRevokedWhileTheBodyIsSentDecidesNothing: access is checked when the headers arrive
// and again once the body is in, so a token that a Reload revoked while the body was being sent
// is refused: no decision, and no watch that would keep a grant open past the revocation.
func TestTokenRevokedWhileTheBodyIsSentDecidesNothing(t *testing.T) {
	for _, path := range []string{"/v1/authorize", "/v1/authorize/watch", "/v1/capabilities", "/access/v1/evaluation", "/access/v1/evaluations", "/v1/data/authz/decision", "/"} {
		t.Run(path, func(t *testing.T) {
			tokens := writeTokens(t, decideToken+" decide\n"+bothToken+" decide,inspect\n")
			s := newServer(t, withFacts(newChangingFacts(t)), withConfig(func(c *server.Config) {
				c.Authentication.Mode = server.AuthToken
				c.Authentication.TokensFile = tokens
			}))
			base := startHTTP(t, s)
			u, err := url.Parse(base)
			require.NoError(t, err)
			body := fixture(t, nil)
			switch {
			case strings.HasPrefix(path, "/access/"):
				body = mustJSON(t, toAuthZEN(t, []byte(body)))
			case strings.HasPrefix(path, "/v1/data/"):
				body = `{"input": ` + body + `}`
			}

			conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))
			// Expect: 100-continue: the service asks for the body once its handler begins to
			// read it, that is once the headers passed the access check.
			_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n",
				path, u.Host, decideToken, len(body))
			require.NoError(t, err)
			br := bufio.NewReader(conn)
			cont, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			_ = cont.Body.Close() // a 100 Continue has no body
			require.Equal(t, http.StatusContinue, cont.StatusCode, "the headers passed the access check")

			// The token is revoked while the body is on its way.
			require.NoError(t, os.WriteFile(tokens, []byte(bothToken+" decide,inspect\n"), 0o600))
			require.NoError(t, s.Reload())
			_, err = io.WriteString(conn, body)
			require.NoError(t, err)

			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
			assert.NotEqual(t, "text/event-stream", resp.Header.Get("Content-Type"), "no stream")
			var doc map[string]any
			require.NoError(t, json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc))
			assert.Equal(t, "UNAUTHORIZED", doc["code"])
			assert.NotEqual(t, true, doc["allow"])
			assert.NotEqual(t, true, doc["decision"])
		})
	}
}

// TestBodyWithAContentEncodingIsRefused: the decision endpoints decide a body as sent; one that
// says it is encoded is refused (415), never decided as if it were not. The Data API keeps
// OPA's gzip.
func TestBodyWithAContentEncodingIsRefused(t *testing.T) {
	url := startHTTP(t, newServer(t))
	for _, path := range []string{"/v1/authorize", "/v1/capabilities", "/v1/authorize/watch", "/access/v1/evaluation"} {
		for _, enc := range []string{"gzip", "br", "gzip, identity"} {
			t.Run(path+" "+enc, func(t *testing.T) {
				body := fixture(t, nil)
				if strings.HasPrefix(path, "/access/") {
					body = mustJSON(t, toAuthZEN(t, []byte(body)))
				}
				req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Content-Encoding", enc)
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				assert.Equal(t, http.StatusUnsupportedMediaType, resp.StatusCode)
				var doc map[string]any
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
				assert.Equal(t, "UNSUPPORTED_MEDIA_TYPE", doc["code"])
				assert.NotEqual(t, true, doc["allow"])
			})
		}
	}
	for _, enc := range []string{"", "identity"} {
		req, err := http.NewRequest(http.MethodPost, url+"/v1/authorize", strings.NewReader(fixture(t, nil)))
		require.NoError(t, err)
		req.Header.Set("Content-Encoding", enc)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "Content-Encoding %q is the body as sent", enc)
	}
}

// TestOptionsAsteriskIsNotAnswered: "OPTIONS *" is a path the route table does not know (404),
// refused like any other, not net/http's own 200.
func TestOptionsAsteriskIsNotAnswered(t *testing.T) {
	base, stop := serve(t, newServer(t))
	defer stop()
	u, err := url.Parse(base)
	require.NoError(t, err)
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = fmt.Fprintf(conn, "OPTIONS * HTTP/1.1\r\nHost: %s\r\n\r\n", u.Host)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}
