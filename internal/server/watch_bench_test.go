package server_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
)

// BenchmarkWatchRevokeFanOut: the time from a worker's exit (the facts' change) to the last of
// 1,000 parked watches of one request reading its revoke, over loopback TCP. Reported as
// ns/op for the whole fan-out, and as µs per watch.
func BenchmarkWatchRevokeFanOut(b *testing.B) {
	const n = 1000
	cfg := testConfig()
	cfg.Limits.MaxConnections = 2 * n
	body := fixture(b, nil)
	for b.Loop() {
		b.StopTimer()
		facts := newChangingFacts(b)
		srv, err := server.New(cfg, testEngine(b), facts, server.Options{})
		require.NoError(b, err)
		url, stop := serve(b, srv)
		tr := &http.Transport{MaxIdleConnsPerHost: -1, DialContext: (&net.Dialer{}).DialContext}
		ctx, cancel := context.WithCancel(context.Background())
		var opened, revoked sync.WaitGroup
		opened.Add(n)
		revoked.Add(n)
		slots := make(chan struct{}, 64)
		for range n {
			go func() {
				slots <- struct{}{}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/authorize/watch", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := tr.RoundTrip(req)
				<-slots
				if err != nil {
					b.Error(err)
					opened.Done()
					revoked.Done()
					return
				}
				defer resp.Body.Close()
				sc := bufio.NewScanner(resp.Body)
				first := true
				for sc.Scan() {
					if strings.HasPrefix(sc.Text(), "data: ") && first {
						first = false
						opened.Done()
					}
					if sc.Text() == "event: revoke" {
						revoked.Done()
						return
					}
				}
			}()
		}
		opened.Wait()
		b.StartTimer()
		facts.kill()
		revoked.Wait()
		b.StopTimer()
		cancel()
		stop()
		tr.CloseIdleConnections()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/n, "µs/watch")
}
