package server_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
)

// BenchmarkWatchRevokeFanOut: the time from a worker's exit (the facts' change) to the last of
// 1,000 parked watches of one request reading its revoke, over loopback TCP. Reported as
// ns/op for the whole fan-out, and as µs per watch.
func BenchmarkWatchRevokeFanOut(b *testing.B) {
	benchmarkRevokeFanOut(b, "")
}

// BenchmarkWatchRevokeFanOutLogged is BenchmarkWatchRevokeFanOut with a decision log file,
// which records every revoke: it reports the median and the 99th percentile of the time from
// the worker's exit to a watch reading its revoke.
func BenchmarkWatchRevokeFanOutLogged(b *testing.B) {
	benchmarkRevokeFanOut(b, filepath.Join(b.TempDir(), "decisions.log"))
}

func benchmarkRevokeFanOut(b *testing.B, logPath string) {
	const n = 1000
	cfg := testConfig()
	cfg.Limits.MaxConnections = 2 * n
	cfg.DecisionLog.Path = logPath
	var mu sync.Mutex
	var reached []time.Duration
	var killed time.Time
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
						mu.Lock()
						reached = append(reached, time.Since(killed))
						mu.Unlock()
						revoked.Done()
						return
					}
				}
			}()
		}
		opened.Wait()
		b.StartTimer()
		killed = time.Now()
		facts.kill()
		revoked.Wait()
		b.StopTimer()
		cancel()
		stop()
		tr.CloseIdleConnections()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/n, "µs/watch")
	slices.Sort(reached)
	if len(reached) > 0 {
		b.ReportMetric(float64(reached[len(reached)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(reached[len(reached)*99/100].Microseconds()), "p99-µs")
	}
}
