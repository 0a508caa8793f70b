package opaplugin

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/plugins"

	"github.com/authz-dev/authz/internal/specexamples"
)

// BenchmarkGateRepeatedDecision is one request answered over and over by the gate inside OPA,
// over HTTP (POST /v1/authorize, one keep-alive connection), with its decision cache on (the
// default) and off. It reports decisions a second and the cache's hit ratio.
func BenchmarkGateRepeatedDecision(b *testing.B) {
	for _, bb := range []struct{ name, cache string }{{"cache=on", ""}, {"cache=off", `, "decisionCache": "off"`}} {
		b.Run(bb.name, func(b *testing.B) {
			reqJSON, _ := specexamples.NewFixture().JSON()
			m := newManager(b, nil)
			p := startPlugin(b, m, `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(b)+`"`+bb.cache+`}`, io.Discard)
			waitState(b, m, plugins.StateOK)
			url := "http://" + p.Addr().String() + "/v1/authorize"
			c := &http.Client{Timeout: 10 * time.Second}
			defer c.CloseIdleConnections()
			before := p.gate.CacheStats()
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				resp, err := c.Post(url, "application/json", bytes.NewReader(reqJSON))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			elapsed := time.Since(start)
			st := p.gate.CacheStats()
			hits, misses := st.Hits-before.Hits, st.Misses-before.Misses
			ratio := 0.0
			if hits+misses > 0 {
				ratio = float64(hits) / float64(hits+misses)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
			b.ReportMetric(ratio, "hit-ratio")
		})
	}
}
