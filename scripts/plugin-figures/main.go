// Command plugin-figures measures the plugin host with a real (not race-instrumented) example
// driver: start time, SIGKILL to the worker's methods being gone, SIGKILL to a restored worker,
// SIGSTOP to the worker being left out (Worker false), Close time, and the resident memory of
// host and driver. It builds the driver with the go command, repeats the measurement and prints
// medians. Every wait is bounded.
//
//	go run ./scripts/plugin-figures --runs 5
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/sandbox"
)

func main() {
	sandbox.Init()
	runs := flag.Int("runs", 5, "how many hosts to start, kill and close")
	flag.Parse()
	if err := measure(*runs); err != nil {
		fmt.Fprintln(os.Stderr, "plugin-figures:", err)
		os.Exit(1)
	}
}

func measure(runs int) error {
	dir, err := os.MkdirTemp("", "plugin-figures")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "example-driver")
	if out, err := exec.Command("go", "build", "-o", bin, "./examples/exampledriver/cmd/example-driver").CombinedOutput(); err != nil {
		return fmt.Errorf("build the example driver: %w: %s", err, out)
	}
	sum, err := pluginhost.FileSHA256(bin)
	if err != nil {
		return err
	}

	var start, gone, restored, stopped, closing []time.Duration
	var hostRSS, driverRSS []int
	for range runs {
		cfg := pluginhost.DefaultConfig()
		cfg.Plugins = []pluginhost.PluginConfig{{ID: "example", Path: bin, SHA256: sum}}
		cfg.Logger = hclog.NewNullLogger()
		h, err := pluginhost.New(cfg)
		if err != nil {
			return err
		}
		err = func() error {
			defer h.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			t0 := time.Now()
			if err := h.Start(ctx); err != nil {
				return err
			}
			if err := h.WaitStarted(ctx); err != nil {
				return err
			}
			start = append(start, time.Since(t0))
			w := h.Plugins()[0].Worker
			if w == nil {
				return errors.New("no worker after start")
			}
			hostRSS = append(hostRSS, rssKiB("self"))
			driverRSS = append(driverRSS, rssKiB(strconv.Itoa(w.PID)))

			if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
				return err
			}
			t1 := time.Now()
			d, err := waitFor(5*time.Second, func() bool { _, ok := h.Worker("example"); return !ok })
			if err != nil {
				return fmt.Errorf("worker still listed after SIGKILL: %w", err)
			}
			gone = append(gone, d)
			if _, err := waitFor(30*time.Second, func() bool { _, ok := h.Worker("example"); return ok }); err != nil {
				return fmt.Errorf("no restored worker: %w", err)
			}
			restored = append(restored, time.Since(t1))
			w = h.Plugins()[0].Worker
			if w == nil {
				return errors.New("no worker after the restore")
			}
			if err := syscall.Kill(w.PID, syscall.SIGSTOP); err != nil {
				return err
			}
			d, err = waitFor(5*time.Second, func() bool { _, ok := h.Worker("example"); return !ok })
			if err != nil {
				return fmt.Errorf("worker still listed after SIGSTOP: %w", err)
			}
			stopped = append(stopped, d)
			if err := syscall.Kill(w.PID, syscall.SIGCONT); err != nil {
				return err
			}
			if _, err := waitFor(5*time.Second, func() bool { _, ok := h.Worker("example"); return ok }); err != nil {
				return fmt.Errorf("worker not listed again after SIGCONT: %w", err)
			}
			t2 := time.Now()
			if err := h.Close(); err != nil {
				return err
			}
			closing = append(closing, time.Since(t2))
			return nil
		}()
		if err != nil {
			return err
		}
	}
	fmt.Printf("runs: %d, medians (the restore includes the minimum back-off of %s)\n", runs, pluginhost.DefaultMinBackoff)
	fmt.Printf("plugin start (Start to WaitStarted):  %v  all %v\n", median(start), start)
	fmt.Printf("SIGKILL to Worker() false:            %v  all %v\n", median(gone), gone)
	fmt.Printf("SIGKILL to restored worker:           %v  all %v\n", median(restored), restored)
	fmt.Printf("SIGSTOP to Worker() false:            %v  all %v\n", median(stopped), stopped)
	fmt.Printf("Close (graceful stop of one worker):  %v  all %v\n", median(closing), closing)
	fmt.Printf("host RSS (this program, one plugin):  %d KiB  all %v\n", median(hostRSS), hostRSS)
	fmt.Printf("driver RSS (example-driver):          %d KiB  all %v\n", median(driverRSS), driverRSS)
	return nil
}

func waitFor(timeout time.Duration, cond func() bool) (time.Duration, error) {
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("timed out after %s", timeout)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return time.Since(start), nil
}

func median[T int | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// rssKiB reads VmRSS of /proc/<pid>/status (0 when unreadable).
func rssKiB(pid string) int {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return n
		}
	}
	return 0
}
