// Command compare-opa measures `authz serve` side by side with a stock `opa run --server` that
// serves the same policies/, on loopback, in one run.
//
// It builds authz and the pinned OPA, starts them on free loopback ports (authz with a static
// facts file it writes, once with the decision cache and once without), and sends them the same
// decisions: authz gets the request (POST /v1/authorize) and assembles the input itself; OPA gets
// the input authz assembles (POST /v1/data/authz/decision), the document `authz decide
// --print-input` prints, checked on a sample. Every answer is checked against the independent
// oracle (allow and code). Two streams: "distinct" (no two requests share what the policy reads)
// and "replay" (a few hundred leases asked again and again); and the floor, GET /health on each
// server. Each cell runs --rounds times, alternating the servers, at each concurrency.
//
//	go run ./scripts/compare-opa --duration 3s --concurrency 1,8,32
//
// Everything it starts is stopped when it returns, and the whole run is bounded by --timeout.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specoracle"
)

type options struct {
	duration    time.Duration
	concurrency []int
	rounds      int
	leases      int
	perCell     int
	timeout     time.Duration
}

func main() {
	var o options
	var conc string
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "time of one cell (one server, one stream, one concurrency, one round)")
	flag.StringVar(&conc, "concurrency", "1,8,32", "comma-separated connection counts")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds per cell, alternating the servers")
	flag.IntVar(&o.leases, "leases", 300, "leases of the replay stream")
	flag.IntVar(&o.perCell, "distinct", 12000, "distinct requests prepared per cell of the distinct stream (a cell ends early when they run out)")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "bound on the whole run")
	flag.Parse()
	for _, s := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "compare-opa: bad --concurrency %q\n", conc)
			os.Exit(2)
		}
		o.concurrency = append(o.concurrency, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	err := run(ctx, o, os.Stdout)
	cancel()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare-opa:", err)
		os.Exit(1)
	}
}

// call is one prepared decision: the bodies for each server and the oracle's answer.
type call struct {
	authzBody, opaBody []byte
	allow              bool
	code               string
}

type server struct {
	name string
	url  string
	cmd  *exec.Cmd
	opa  bool
}

func run(ctx context.Context, o options, out io.Writer) error {
	dir, err := os.MkdirTemp("", "compare-opa-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	authzBin := filepath.Join(dir, "authz")
	if err := command(ctx, root, "go", "build", "-o", authzBin, "./cmd/authz").Run(); err != nil {
		return fmt.Errorf("build authz: %w", err)
	}
	opaPath, err := command(ctx, root, "go", "tool", "-n", "opa").Output()
	if err != nil {
		return fmt.Errorf("build the pinned opa (go tool -n opa): %w", err)
	}
	opaBin := strings.TrimSpace(string(opaPath))

	factsVal := makeFacts(o.leases)
	factsJSON, _ := json.Marshal(factsVal)
	factsFile := filepath.Join(dir, "facts.json")
	if err := os.WriteFile(factsFile, factsJSON, 0o600); err != nil {
		return err
	}
	facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
	if err != nil {
		return err
	}
	streams := map[string][]call{}
	replay, err := prepare(ctx, facts, factsVal, o.leases, func(i int) map[string]any { return replayRequest(i, o.leases) })
	if err != nil {
		return err
	}
	streams["replay"] = replay
	cells := len(o.concurrency) * o.rounds
	distinct, err := prepare(ctx, facts, factsVal, o.perCell*cells, distinctRequest)
	if err != nil {
		return err
	}
	streams["distinct"] = distinct
	if err := checkPrintInput(ctx, authzBin, factsFile, replay[0], replayRequest(0, o.leases), facts); err != nil {
		return err
	}

	servers := []*server{
		{name: "authz", cmd: exec.Command(authzBin, "serve", "--facts", factsFile, "--log-level", "error")},
		{name: "authz (cache off)", cmd: exec.Command(authzBin, "serve", "--facts", factsFile, "--log-level", "error", "--decision-cache", "off")},
		{name: "opa", opa: true, cmd: exec.Command(opaBin, "run", "--server", "--log-level", "error", "--skip-version-check", filepath.Join(root, "policies"))},
	}
	for _, s := range servers {
		if err := s.start(ctx); err != nil {
			stopAll(servers)
			return err
		}
	}
	defer stopAll(servers)

	fmt.Fprintf(out, "# authz vs stock OPA, %s per cell, %d rounds alternating, %s\n\n", o.duration, o.rounds, time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "| stream | conns | server | req/s | p50 ms | p90 ms | p99 ms | errors | vs opa |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, stream := range []string{"distinct", "replay", "floor"} {
		for ci, c := range o.concurrency {
			results := map[string]*result{}
			for round := range o.rounds {
				order := slices.Clone(servers)
				if round%2 == 1 {
					slices.Reverse(order)
				}
				for _, s := range order {
					calls := streams[stream]
					if stream == "distinct" {
						cell := ci*o.rounds + round
						calls = calls[cell*o.perCell : (cell+1)*o.perCell]
					}
					r := load(ctx, s, stream, calls, c, o.duration, stream == "distinct")
					if results[s.name] == nil {
						results[s.name] = &result{}
					}
					results[s.name].merge(r)
					if ctx.Err() != nil {
						return ctx.Err()
					}
				}
			}
			opaRate := results["opa"].rate()
			for _, s := range servers {
				r := results[s.name]
				fmt.Fprintf(out, "| %s | %d | %s | %.0f | %.2f | %.2f | %.2f | %d | %.2fx |\n", stream, c, s.name, r.rate(),
					r.pct(50), r.pct(90), r.pct(99), r.errors, r.rate()/opaRate)
			}
		}
	}
	fmt.Fprintf(out, "\n| server | RSS now MiB | peak RSS MiB |\n|---|---|---|\n")
	for _, s := range servers {
		now, peak := rss(s.cmd.Process.Pid)
		fmt.Fprintf(out, "| %s | %.1f | %.1f |\n", s.name, now, peak)
	}
	return nil
}

// makeFacts: ten plugins with thirty sandbox providers each (the replay leases pin them), and
// one plugin driver for the distinct stream; every worker verifies every method.
func makeFacts(leases int) map[string]any {
	methods := []any{"environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease", "environmentSyncIn",
		"environmentSyncOut", "environmentExecute", "duplexChannelOpen", "environmentRunnerIngressEndpoint"}
	var plugins []any
	workers := map[string]any{}
	for p := range 10 {
		var entries []any
		for i := p; i < leases; i += 10 {
			entries = append(entries, map[string]any{"driverKey": fmt.Sprintf("prov-%d", i), "kind": "sandbox_provider",
				"sandboxCapabilities": map[string]any{"duplexCommandStream": true, "incrementalSessionOutput": true}})
		}
		id := fmt.Sprintf("plugin-%d", p)
		plugins = append(plugins, map[string]any{"id": id, "key": "acme." + id, "status": "ready",
			"manifest": map[string]any{"environmentDrivers": entries}})
		workers[id] = map[string]any{"supportedMethods": methods}
	}
	plugins = append(plugins, map[string]any{"id": "driver.plugin", "key": "acme.driver", "status": "ready",
		"manifest": map[string]any{"environmentDrivers": []any{map[string]any{"driverKey": "dk", "kind": "environment_driver",
			"sandboxCapabilities": map[string]any{"duplexCommandStream": true}}}}})
	workers["driver.plugin"] = map[string]any{"supportedMethods": methods}
	return map[string]any{"plugins": plugins, "workers": workers, "builtinProviders": map[string]any{"fake": map[string]any{"execute": true}}}
}

// replayRequest is lease i of the replay stream: a plugin-backed sandbox lease on its own
// provider, with its lease policy and backend.
func replayRequest(i, leases int) map[string]any {
	i %= leases
	md := map[string]any{"driver": "sandbox", "sandboxProviderPlugin": true, "pluginId": fmt.Sprintf("plugin-%d", i%10),
		"provider": fmt.Sprintf("prov-%d", i)}
	if i%3 == 0 {
		md["backend"] = "job"
	}
	policies := []string{"ephemeral", "reuse_by_environment", "reuse_by_execution_workspace", "retain_on_failure"}
	return map[string]any{
		"operation":   "openDuplexChannel",
		"environment": map[string]any{"id": fmt.Sprintf("env-%d", i), "driver": "sandbox", "config": map[string]any{"provider": md["provider"]}},
		"lease": map[string]any{"id": fmt.Sprintf("lease-%d", i), "companyId": "company-1", "leasePolicy": policies[i%4],
			"providerLeaseId": fmt.Sprintf("pl-%d", i), "metadata": md},
		"command": []any{"sh", "-c", "echo hi"},
	}
}

// distinctRequest is request i of the distinct stream: a lease on the plugin driver whose
// metadata carries a provider of its own, which the policy reads (so no two share a cache key);
// one in ten is on the local driver, a deny.
func distinctRequest(i int) map[string]any {
	md := map[string]any{"driver": "plugin", "pluginId": "driver.plugin", "driverKey": "dk", "provider": fmt.Sprintf("unique-%d", i)}
	if i%10 == 9 {
		md["driver"] = "local"
	}
	return map[string]any{
		"operation":   "openDuplexChannel",
		"environment": map[string]any{"id": fmt.Sprintf("env-%d", i), "driver": "plugin"},
		"lease":       map[string]any{"id": fmt.Sprintf("lease-%d", i), "leasePolicy": "ephemeral", "metadata": md},
	}
}

// prepare builds n calls: the request body, the input authz assembles from it, and the oracle's
// answer.
func prepare(ctx context.Context, facts *snapshot.FileFacts, factsVal any, n int, req func(int) map[string]any) ([]call, error) {
	calls := make([]call, n)
	factsRT := roundTrip(factsVal)
	for i := range calls {
		body, _ := json.Marshal(req(i))
		r, err := snapshot.ParseRequest(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		in := snapshot.Build(ctx, r, facts, snapshot.Options{})
		opaBody, _ := json.Marshal(map[string]any{"input": in})
		want, err := specoracle.Decide(roundTrip(req(i)), factsRT)
		if err != nil {
			return nil, err
		}
		calls[i] = call{authzBody: body, opaBody: opaBody, allow: want.Allow, code: want.Code}
	}
	return calls, nil
}

func roundTrip(v any) any {
	b, _ := json.Marshal(v)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out any
	_ = dec.Decode(&out)
	return out
}

// checkPrintInput checks that the input sent to OPA is what `authz decide --print-input`
// prints for the same request (now_ns aside).
func checkPrintInput(ctx context.Context, bin, factsFile string, c call, req map[string]any, _ *snapshot.FileFacts) error {
	body, _ := json.Marshal(req)
	cmd := exec.CommandContext(ctx, bin, "decide", "--facts", factsFile, "--print-input")
	cmd.Stdin = bytes.NewReader(body)
	printed, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("authz decide --print-input: %w", err)
	}
	var a, b map[string]any
	if err := json.Unmarshal(printed, &a); err != nil {
		return err
	}
	var wrapped struct{ Input map[string]any }
	if err := json.Unmarshal(c.opaBody, &wrapped); err != nil {
		return err
	}
	b = wrapped.Input
	delete(a, "now_ns")
	delete(b, "now_ns")
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		return fmt.Errorf("the input sent to OPA differs from authz decide --print-input:\n%s\n%s", ja, jb)
	}
	return nil
}

type result struct {
	n, errors int
	elapsed   time.Duration
	lat       []time.Duration
}

func (r *result) merge(o *result) {
	r.n += o.n
	r.errors += o.errors
	r.elapsed += o.elapsed
	r.lat = append(r.lat, o.lat...)
}

func (r *result) rate() float64 {
	if r == nil || r.elapsed <= 0 {
		return 0
	}
	return float64(r.n) / r.elapsed.Seconds()
}

func (r *result) pct(p int) float64 {
	if len(r.lat) == 0 {
		return 0
	}
	slices.Sort(r.lat)
	return float64(r.lat[(len(r.lat)-1)*p/100].Microseconds()) / 1000
}

// load sends calls to s from conns connections for d (or until the calls run out when once is
// set), checking every answer.
func load(ctx context.Context, s *server, stream string, calls []call, conns int, d time.Duration, once bool) *result {
	tr := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var next atomic.Int64
	var mu sync.Mutex
	res := &result{}
	var wg sync.WaitGroup
	start := time.Now()
	for range conns {
		wg.Go(func() {
			var lat []time.Duration
			n, errs := 0, 0
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if once && i >= len(calls) {
					break
				}
				var c call
				if len(calls) > 0 {
					c = calls[i%len(calls)]
				}
				t0 := time.Now()
				err := s.send(ctx, client, stream, c)
				if ctx.Err() != nil {
					break
				}
				lat = append(lat, time.Since(t0))
				n++
				if err != nil {
					errs++
					if errs <= 3 {
						fmt.Fprintf(os.Stderr, "%s %s: %v\n", s.name, stream, err)
					}
				}
			}
			mu.Lock()
			res.n += n
			res.errors += errs
			res.lat = append(res.lat, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

func (s *server) send(ctx context.Context, client *http.Client, stream string, c call) error {
	var req *http.Request
	var err error
	switch {
	case stream == "floor":
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/health", nil)
	case s.opa:
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/data/authz/decision", bytes.NewReader(c.opaBody))
	default:
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/authorize", bytes.NewReader(c.authzBody))
	}
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %.200s", resp.StatusCode, body)
	}
	if stream == "floor" {
		return nil
	}
	var doc struct {
		Allow *bool  `json:"allow"`
		Code  string `json:"code"`
	}
	if s.opa {
		var wrapped struct {
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(body, &wrapped); err != nil {
			return err
		}
		body = wrapped.Result
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return err
	}
	if doc.Allow == nil || *doc.Allow != c.allow || doc.Code != c.code {
		return fmt.Errorf("answer %.200s, want allow %v code %q", body, c.allow, c.code)
	}
	return nil
}

func (s *server) start(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s.cmd.Args = append(s.cmd.Args, "--addr", addr)
	s.cmd.Stderr = os.Stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	s.url = "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if resp, err := http.Get(s.url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer /health on %s within 60s", s.name, addr)
}

func stopAll(servers []*server) {
	for _, s := range servers {
		if s.cmd.Process == nil {
			continue
		}
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// rss reads the resident and peak resident memory of pid in MiB.
func rss(pid int) (now, peak float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			now = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	return now, peak
}

func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run compare-opa inside the authz module")
	}
	return filepath.Dir(mod), nil
}

func command(ctx context.Context, dir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	return cmd
}
