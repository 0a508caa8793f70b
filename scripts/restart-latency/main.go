// Command restart-latency measures how a running `authz serve` reacts when its driver process is
// killed: the time from SIGKILL to the first deny of a request it granted, and from SIGKILL to
// the first grant again after the supervisor restarted the driver. It repeats the kill and
// prints every run and the medians. Loopback only; every wait is bounded.
//
//	go run ./scripts/restart-latency --addr 127.0.0.1:8181 --request examples/grant.json --runs 5
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8181", "address of the running service")
	reqPath := flag.String("request", "examples/grant.json", "a request the service grants")
	runs := flag.Int("runs", 5, "how many kills")
	settle := flag.Duration("settle", 11*time.Second, "wait between kills; the supervisor resets its back-off once a worker stayed up twice its maximum back-off (default 5s)")
	flag.Parse()
	if err := run(*addr, *reqPath, *runs, *settle); err != nil {
		fmt.Fprintln(os.Stderr, "restart-latency:", err)
		os.Exit(1)
	}
}

func run(addr, reqPath string, runs int, settle time.Duration) error {
	body, err := os.ReadFile(reqPath)
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: 5 * time.Second}
	base := "http://" + addr
	allow := func() (bool, error) {
		resp, err := c.Post(base+"/v1/authorize", "application/json", bytes.NewReader(body))
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		var doc struct {
			Allow bool `json:"allow"`
		}
		return doc.Allow, json.NewDecoder(resp.Body).Decode(&doc)
	}
	waitFor := func(want bool, since time.Time) (time.Duration, int, error) {
		for n := 1; time.Since(since) < 30*time.Second; n++ {
			got, err := allow()
			if err != nil {
				return 0, n, err
			}
			if got == want {
				return time.Since(since), n, nil
			}
		}
		return 0, 0, fmt.Errorf("no allow=%v within 30s", want)
	}
	var toDeny, toGrant []time.Duration
	for i := range runs {
		if ok, err := allow(); err != nil || !ok {
			return fmt.Errorf("run %d: the request is not granted before the kill (err %v)", i+1, err) //nolint:errorlint // err may be nil here (not granted)
		}
		pid, gen, err := workerPID(c, base)
		if err != nil {
			return err
		}
		killed := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill %d: %w", pid, err)
		}
		d, n, err := waitFor(false, killed)
		if err != nil {
			return err
		}
		g, m, err := waitFor(true, killed)
		if err != nil {
			return err
		}
		_, newGen, _ := workerPID(c, base)
		fmt.Printf("run %d: killed pid %d (generation %d): deny after %v (decision #%d), grant again after %v (decision #%d), generation %d\n",
			i+1, pid, gen, d.Round(10*time.Microsecond), n, g.Round(time.Millisecond), m, newGen)
		toDeny, toGrant = append(toDeny, d), append(toGrant, g)
		if i+1 < runs {
			time.Sleep(settle)
		}
	}
	fmt.Printf("median over %d runs: kill → deny %v, kill → grant %v\n", runs,
		median(toDeny).Round(10*time.Microsecond), median(toGrant).Round(time.Millisecond))
	return nil
}

func workerPID(c *http.Client, base string) (int, uint64, error) {
	resp, err := c.Get(base + "/v1/plugins")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var ps struct {
		Plugins []struct {
			Worker *struct {
				PID        int    `json:"pid"`
				Generation uint64 `json:"generation"`
			} `json:"worker"`
		} `json:"plugins"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil {
		return 0, 0, err
	}
	for _, p := range ps.Plugins {
		if p.Worker != nil && p.Worker.PID > 0 {
			return p.Worker.PID, p.Worker.Generation, nil
		}
	}
	return 0, 0, errors.New("no running worker")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
