// Command fairness drives the attacks of docs/security.md ("Fairness") against a running
// `authz serve` on loopback, with two decide tokens (the attacker's and an honest caller's), and
// prints beside each attack the honest caller's status counts and median latency. Every attack is
// bounded in count and time.
//
//	go run ./scripts/fairness --addr 127.0.0.1:8181 --attacker TOKEN --honest TOKEN \
//	    --inspect TOKEN --request examples/grant.json --decision-log /tmp/authz-decisions.log
//
// The service is started with authentication.mode token (a tokens file holding the three
// tokens: two with the decide scope, one with inspect) and the facts the request is granted on
// (e.g. --facts internal/server/testdata/example-facts.json).
package main

import (
	"bufio"
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

type config struct {
	addr, attacker, honest, inspect string
	grant                           []byte
	decisionLog                     string
	duration                        time.Duration
}

func main() {
	var c config
	var reqPath string
	flag.StringVar(&c.addr, "addr", "127.0.0.1:8181", "address of the running service (loopback only)")
	flag.StringVar(&c.attacker, "attacker", "", "the attacker's decide token")
	flag.StringVar(&c.honest, "honest", "", "the honest caller's decide token")
	flag.StringVar(&c.inspect, "inspect", "", "an inspect token, to read authz_watches_open (optional)")
	flag.StringVar(&reqPath, "request", "examples/grant.json", "a request the service grants")
	flag.StringVar(&c.decisionLog, "decision-log", "", "the service's decision log file, to measure its growth (optional)")
	flag.DurationVar(&c.duration, "duration", 12*time.Second, "how long each attack lasts (at most 60s)")
	only := flag.String("only", "quiet,slow,watches,churn,batch", "the attacks to run, comma-separated")
	flag.Parse()
	if err := run(c, reqPath, strings.Split(*only, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "fairness:", err)
		os.Exit(1)
	}
}

func run(c config, reqPath string, only []string) error {
	host, _, err := net.SplitHostPort(c.addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--addr %s is not a loopback address", c.addr)
	}
	c.duration = min(c.duration, time.Minute)
	if c.grant, err = os.ReadFile(reqPath); err != nil {
		return err
	}
	attacks := map[string]func(config) string{"quiet": quiet, "slow": slowBodies, "watches": bigWatches, "churn": watchChurn, "batch": batches}
	for _, name := range only {
		f, ok := attacks[name]
		if !ok {
			return fmt.Errorf("no attack %q", name)
		}
		fmt.Printf("%-8s %s\n", name, f(c))
	}
	return nil
}

// honestLoad asks the granted request as the honest caller every 100 ms until ctx ends, and
// returns its status counts and median latency.
func honestLoad(ctx context.Context, c config) func() string {
	var mu sync.Mutex
	counts := map[int]int{}
	var lat []time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		client := &http.Client{Timeout: 10 * time.Second}
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			start := time.Now()
			status := post(client, c, c.honest, "/v1/authorize", c.grant)
			mu.Lock()
			counts[status]++
			lat = append(lat, time.Since(start))
			mu.Unlock()
		}
	}()
	return func() string {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("honest: %s, median %v", statusCounts(counts), median(lat))
	}
}

func post(client *http.Client, c config, token, path string, body []byte) int {
	req, err := http.NewRequest(http.MethodPost, "http://"+c.addr+path, bytes.NewReader(body))
	if err != nil {
		return -1
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func statusCounts(m map[int]int) string {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		name := strconv.Itoa(k)
		if k == 0 {
			name = "error"
		}
		parts = append(parts, fmt.Sprintf("%s×%d", name, m[k]))
	}
	return strings.Join(parts, " ")
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)/2].Round(100 * time.Microsecond)
}

// quiet: the honest caller alone.
func quiet(c config) string {
	ctx, cancel := context.WithTimeout(context.Background(), min(c.duration, 5*time.Second))
	defer cancel()
	return honestLoad(ctx, c)()
}

// slowBodies: 32 connections of the attacker send a decision body one byte a second.
func slowBodies(c config) string {
	ctx, cancel := context.WithTimeout(context.Background(), c.duration)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	cut := map[int]int{}
	for range 32 {
		wg.Go(func() {
			conn, err := net.Dial("tcp", c.addr)
			if err != nil {
				return
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(c.duration + 5*time.Second))
			fmt.Fprintf(conn, "POST /v1/authorize HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", c.addr, c.attacker)
			answered := make(chan int, 1)
			go func() {
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					answered <- 0
					return
				}
				resp.Body.Close()
				answered <- resp.StatusCode
			}()
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case status := <-answered:
					mu.Lock()
					cut[status]++
					mu.Unlock()
					return
				case <-t.C:
					if _, err := conn.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		})
	}
	time.Sleep(time.Second) // the slow bodies are admitted first
	result := honestLoad(ctx, c)()
	wg.Wait()
	return fmt.Sprintf("%s; slow bodies answered: %s", result, statusCounts(cut))
}

// bigWatches: the attacker opens watches of ~1 MB bodies until refused, fills what is left
// with smaller ones (64 KiB, then ~2 KB), then the honest caller opens a watch of the granted
// request. At most 300 attempts.
func bigWatches(c config) string {
	var req map[string]any
	if err := json.Unmarshal(c.grant, &req); err != nil {
		return err.Error()
	}
	lease, _ := req["lease"].(map[string]any)
	if lease == nil {
		lease = map[string]any{}
		req["lease"] = lease
	}
	var conns []io.Closer
	defer func() {
		for _, cl := range conns {
			cl.Close()
		}
	}()
	var opened []string
	attempts := 0
	for _, size := range []struct {
		name          string
		strings, each int
	}{{"~1 MB", 15, 60 << 10}, {"64 KiB", 1, 60 << 10}, {"~2 KB", 1, 8}} {
		n := 0
		for ; attempts < 300; attempts++ {
			junk := make([]any, size.strings)
			for j := range junk {
				junk[j] = fmt.Sprintf("%d-%s", attempts, strings.Repeat("x", size.each))
			}
			lease["junk"] = junk
			body, _ := json.Marshal(req)
			status, cl := openWatch(c, c.attacker, body)
			if status != http.StatusOK {
				break
			}
			conns = append(conns, cl)
			n++
		}
		opened = append(opened, fmt.Sprintf("%d of %s", n, size.name))
	}
	honest, cl := openWatch(c, c.honest, c.grant)
	if cl != nil {
		cl.Close()
	}
	return fmt.Sprintf("attacker's watches opened until refused: %s; honest grant.json watch: %d", strings.Join(opened, ", "), honest)
}

// openWatch opens a watch and reads its first event; the closer ends it.
func openWatch(c config, token string, body []byte) (int, io.Closer) {
	conn, err := net.Dial("tcp", c.addr)
	if err != nil {
		return 0, nil
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /v1/authorize/watch HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", c.addr, token, len(body))
	_, _ = conn.Write(body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil) //nolint:bodyclose // the stream is the connection, which the caller closes

	if err != nil {
		conn.Close()
		return 0, nil
	}
	if resp.StatusCode != http.StatusOK {
		conn.Close()
		return resp.StatusCode, nil
	}
	_ = conn.SetDeadline(time.Time{})
	return resp.StatusCode, conn
}

// watchChurn opens and closes 2,000 watches, then times how long the service holds their places.
func watchChurn(c config) string {
	before, _ := watchesOpen(c)
	start := time.Now()
	failed := 0
	for range 2000 {
		status, cl := openWatch(c, c.honest, c.grant)
		if cl == nil {
			failed++
			continue
		}
		_ = status
		cl.Close()
	}
	took := time.Since(start)
	if c.inspect == "" {
		return fmt.Sprintf("2000 watches opened and closed in %v (%d refused); no --inspect token to read authz_watches_open", took.Round(time.Millisecond), failed)
	}
	peak, _ := watchesOpen(c)
	freed := time.Now()
	for time.Since(freed) < 60*time.Second {
		n, err := watchesOpen(c)
		if err != nil || n <= before {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Sprintf("2000 watches opened and closed in %v (%d refused); open right after: %d; all places back %v later",
		took.Round(time.Millisecond), failed, peak-before, time.Since(freed).Round(10*time.Millisecond))
}

func watchesOpen(c config) (int, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+c.addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.inspect)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "authz_watches_open "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int(f), err
		}
	}
	return 0, errors.New("no authz_watches_open")
}

// batches: 8 AuthZEN batches at once, each 64 empty evaluations under ~1 MiB of top-level
// defaults.
func batches(c config) string {
	var req map[string]any
	if err := json.Unmarshal(c.grant, &req); err != nil {
		return err.Error()
	}
	props := map[string]any{}
	lease, _ := req["lease"].(map[string]any)
	id := any("lease-1")
	for k, v := range lease {
		if k == "id" {
			id = v
			continue
		}
		props[k] = v
	}
	junk := make([]any, 15)
	for j := range junk {
		junk[j] = strings.Repeat("x", 60<<10)
	}
	props["junk"] = junk
	env, _ := req["environment"].(map[string]any)
	op, _ := req["operation"].(string)
	evals := make([]any, 64)
	for i := range evals {
		evals[i] = map[string]any{}
	}
	batch := map[string]any{
		"subject":     map[string]any{"type": "lease", "id": id, "properties": props},
		"resource":    map[string]any{"type": "environment", "id": env["id"], "properties": env},
		"action":      map[string]any{"name": op},
		"evaluations": evals,
	}
	if cmd, ok := req["command"]; ok {
		batch["context"] = map[string]any{"command": cmd}
	}
	body, _ := json.Marshal(batch)
	logBefore := fileSize(c.decisionLog)
	ctx, cancel := context.WithTimeout(context.Background(), c.duration+50*time.Second)
	defer cancel()
	honest := honestLoad(ctx, c)
	var mu sync.Mutex
	counts := map[int]int{}
	var took []time.Duration
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			client := &http.Client{Timeout: 60 * time.Second}
			start := time.Now()
			status := post(client, c, c.attacker, "/access/v1/evaluations", body)
			mu.Lock()
			counts[status]++
			took = append(took, time.Since(start))
			mu.Unlock()
		})
	}
	wg.Wait()
	cancel()
	result := honest()
	logged := ""
	if c.decisionLog != "" {
		logged = fmt.Sprintf("; decision log grew %d KiB", (fileSize(c.decisionLog)-logBefore)>>10)
	}
	return fmt.Sprintf("%s; 8 batches of %d KiB: %s, median %v%s", result, len(body)>>10, statusCounts(counts), median(took), logged)
}

func fileSize(path string) int64 {
	if path == "" {
		return 0
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
