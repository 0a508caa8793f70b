// Command compile-cost measures what a first build compiles, side by side, in figures a busy
// machine does not blur much: for each package given, it builds it with an empty build cache of
// its own (go build -debug-actiongraph; the modules must be downloaded already) and prints how
// many packages it links and the CPU time (user+sys) the compiler and the linker spent. Then,
// module by module, the compile CPU of the packages the first links and the last does not:
//
//	go run ./scripts/first-run/compile-cost ./cmd/authz ./scripts/first-run/opa-floor
//
// It takes minutes (it compiles everything, twice).
package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// action is what compile-cost reads of an action of Go's action graph.
type action struct {
	Mode    string
	Package string
	CmdUser time.Duration
	CmdSys  time.Duration
}

type result struct {
	pkg    string
	wall   time.Duration
	cpu    map[string]time.Duration // compile CPU by import path
	link   time.Duration
	module map[string]string // import path -> module path ("std" for the standard library)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: compile-cost PACKAGE...   (the first compared with the last)")
		os.Exit(2)
	}
	var results []result
	for _, pkg := range os.Args[1:] {
		r, err := measure(pkg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "compile-cost:", err)
			os.Exit(1)
		}
		results = append(results, r)
		var sum time.Duration
		for _, d := range r.cpu {
			sum += d
		}
		fmt.Printf("%-32s %4d packages  compile %6.1f s CPU  link %4.1f s CPU  total %6.1f s CPU  (%4.0f s wall)\n",
			pkg, len(r.module), sum.Seconds(), r.link.Seconds(), (sum + r.link).Seconds(), r.wall.Seconds())
	}
	if len(results) < 2 {
		return
	}
	first, last := results[0], results[len(results)-1]
	byModule := map[string]time.Duration{}
	count := map[string]int{}
	for p, m := range first.module {
		if _, shared := last.module[p]; !shared {
			byModule[m] += first.cpu[p]
			count[m]++
		}
	}
	mods := make([]string, 0, len(byModule))
	var total time.Duration
	for m, d := range byModule {
		mods = append(mods, m)
		total += d
	}
	slices.SortFunc(mods, func(a, b string) int { return cmp.Compare(byModule[b], byModule[a]) })
	fmt.Printf("\ncompiled for %s only: %.1f s CPU in %d packages, by module:\n", first.pkg, total.Seconds(), len(first.module)-shared(first, last))
	for _, m := range mods {
		fmt.Printf("  %5.1f s  %3d  %s\n", byModule[m].Seconds(), count[m], m)
	}
}

func shared(a, b result) int {
	n := 0
	for p := range a.module {
		if _, ok := b.module[p]; ok {
			n++
		}
	}
	return n
}

func measure(pkg string) (result, error) {
	r := result{pkg: pkg, cpu: map[string]time.Duration{}, module: map[string]string{}}
	list, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{if .Standard}}std{{else}}{{with .Module}}{{.Path}}{{end}}{{end}}", pkg).Output()
	if err != nil {
		return r, fmt.Errorf("go list %s: %w", pkg, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(list)), "\n") {
		p, m, _ := strings.Cut(line, " ")
		r.module[p] = m
	}
	dir, err := os.MkdirTemp("", "compile-cost")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	graph := filepath.Join(dir, "actions.json")
	build := exec.Command("go", "build", "-debug-actiongraph="+graph, "-o", os.DevNull, pkg)
	build.Env = append(os.Environ(), "GOCACHE="+filepath.Join(dir, "cache"))
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	start := time.Now()
	if err := build.Run(); err != nil {
		return r, fmt.Errorf("go build %s: %w", pkg, err)
	}
	r.wall = time.Since(start)
	b, err := os.ReadFile(graph)
	if err != nil {
		return r, err
	}
	var actions []action
	if err := json.Unmarshal(b, &actions); err != nil {
		return r, fmt.Errorf("%s: %w", graph, err)
	}
	for _, a := range actions {
		switch a.Mode {
		case "build":
			r.cpu[a.Package] += a.CmdUser + a.CmdSys
		case "link":
			r.link += a.CmdUser + a.CmdSys
		}
	}
	return r, nil
}
