// Command syscalls-per-decision counts the system calls `authz serve` makes per cached decision:
// it starts the given authz binary on its defaults (the example driver as a real plugin),
// repeats the example grant at 8 connections under `strace -f -c -p`, and prints the calls per
// decision of the ones the liveness of a worker used to cost (openat, close, read, pread64,
// ppoll, waitid). Every wait is bounded; the service is stopped at the end.
//
//	go build -o /tmp/new/ ./cmd/authz
//	go run ./scripts/syscalls-per-decision --authz /tmp/new/authz
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	bin := flag.String("authz", "", "the authz binary to measure (required)")
	addr := flag.String("addr", "127.0.0.1:18281", "where it listens")
	conns := flag.Int("c", 8, "connections")
	dur := flag.Duration("d", 5*time.Second, "how long the load runs under strace")
	flag.Parse()
	if *bin == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := measure(*bin, *addr, *conns, *dur); err != nil {
		fmt.Fprintln(os.Stderr, "syscalls-per-decision:", err)
		os.Exit(1)
	}
}

func measure(bin, addr string, conns int, dur time.Duration) error {
	body, err := os.ReadFile("examples/grant.json")
	if err != nil {
		return fmt.Errorf("run it from the repository's root: %w", err)
	}
	serve := exec.Command(bin, "serve", "--addr", addr)
	serve.Stderr = io.Discard
	if err := serve.Start(); err != nil {
		return err
	}
	defer func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		_ = serve.Wait()
	}()
	url := "http://" + addr + "/v1/authorize"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns}, Timeout: 5 * time.Second}
	deadline := time.Now().Add(2 * time.Minute)
	for !granted(client, url, body) {
		if time.Now().After(deadline) {
			return errors.New("no grant from the service within 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	load(client, url, body, conns, time.Second) // warm: the decision is cached
	out, err := os.CreateTemp("", "strace")
	if err != nil {
		return err
	}
	_ = out.Close()
	defer os.Remove(out.Name())
	strace := exec.Command("strace", "-f", "-c", "-o", out.Name(), "-p", strconv.Itoa(serve.Process.Pid))
	if err := strace.Start(); err != nil {
		return fmt.Errorf("strace (apt-get install -y strace): %w", err)
	}
	time.Sleep(500 * time.Millisecond) // attached to every thread
	n, grants := load(client, url, body, conns, dur)
	_ = strace.Process.Signal(syscall.SIGINT)
	_ = strace.Wait()
	counts, err := readCounts(out.Name())
	if err != nil {
		return err
	}
	fmt.Printf("%s: %d decisions (%d grants) in %s at %d connections, under strace\n", bin, n, grants, dur, conns)
	for _, sc := range []string{"openat", "close", "read", "pread64", "ppoll", "waitid"} {
		fmt.Printf("  %-8s %8d  %.2f per decision\n", sc, counts[sc], float64(counts[sc])/float64(max(n, 1)))
	}
	return nil
}

// granted reports whether the service grants the example request.
func granted(client *http.Client, url string, body []byte) bool {
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return bytes.Contains(out, []byte(`"allow":true`))
}

// load posts body from conns goroutines for dur and returns the decisions and grants.
func load(client *http.Client, url string, body []byte, conns int, dur time.Duration) (n, grants int64) {
	var decided, allowed atomic.Int64
	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for time.Now().Before(end) {
				ok := granted(client, url, body)
				decided.Add(1)
				if ok {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return decided.Load(), allowed.Load()
}

// readCounts reads the calls column of strace -c's table, by system call.
func readCounts(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	counts := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		calls, err := strconv.ParseInt(fields[3], 10, 64)
		if err != nil {
			continue
		}
		counts[fields[len(fields)-1]] = calls
	}
	return counts, sc.Err()
}
