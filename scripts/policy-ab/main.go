// Command policy-ab compares the evaluation cost of policy directories side by side in one
// process: each is prepared with rego (as `opa bench` prepares it) and evaluated on the same
// input, converted once. The policies take turns, each for the same time per round (-batch), so
// a machine whose load changes during the run slows them alike, and a pause of the process (the
// machine's other work taking the core) falls on each with the same odds. It prints, per policy,
// the median and fastest round (ns per evaluation), the median of the per-round ratios to the
// first policy, the same for the CPU time of the process (user and system, getrusage), and the
// allocations per evaluation. With -read-ast-values-from-store, base documents (data.json files
// in a directory) are read from the in-memory store as AST values (as with `opa bench
// --read-ast-values-from-store`); without it they are converted on every read, as `opa bench`
// does by default. -cpuprofile writes a CPU profile of the whole run (preparation and rounds),
// -memprofile a profile of every allocation of the run.
//
//	git show <commit>:policies/... # the policy to compare against, into a directory
//	go run ./cmd/authz decide --facts internal/specexamples/facts.json --print-input \
//	    < internal/specexamples/request.json > grant-input.json
//	go run ./scripts/policy-ab --input grant-input.json old/policies policies
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"syscall"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

func main() {
	input := flag.String("input", "", "input document (JSON)")
	query := flag.String("query", "data.authz.decision", "query to evaluate")
	rounds := flag.Int("rounds", 31, "rounds; each evaluates every policy for -batch")
	batch := flag.Duration("batch", 50*time.Millisecond, "how long each policy is evaluated per round (equal for all, so that a pause of the process falls on each with the same odds)")
	readAST := flag.Bool("read-ast-values-from-store", false, "read base documents (data.json files) from the store as AST values, as `opa bench --read-ast-values-from-store` does")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	memprofile := flag.String("memprofile", "", "write a profile of every allocation of the run to this file (slows the run)")
	flag.Parse()
	if *memprofile != "" {
		runtime.MemProfileRate = 1
	}
	stopProfile := func() {}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "policy-ab:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "policy-ab:", err)
			os.Exit(1)
		}
		stopProfile = func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}
	}
	err := run(*input, *query, flag.Args(), *rounds, *batch, *readAST)
	stopProfile()
	if err == nil && *memprofile != "" {
		err = writeMemProfile(*memprofile)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "policy-ab:", err)
		os.Exit(1)
	}
}

func run(inputPath, query string, dirs []string, rounds int, batch time.Duration, readAST bool) error {
	if inputPath == "" || len(dirs) == 0 || rounds < 1 || batch <= 0 {
		return errors.New("usage: policy-ab --input FILE DIR [DIR...]")
	}
	ctx := context.Background()
	raw, err := os.ReadFile(inputPath)
	if err != nil {
		return err
	}
	var in any
	if err := json.Unmarshal(raw, &in); err != nil {
		return fmt.Errorf("input: %w", err)
	}
	val, err := ast.InterfaceToValue(in)
	if err != nil {
		return err
	}
	pqs := make([]rego.PreparedEvalQuery, len(dirs))
	for i, d := range dirs {
		if pqs[i], err = rego.New(rego.Query(query), rego.Load([]string{d}, nil), rego.StoreReadAST(readAST)).PrepareForEval(ctx); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		rs, err := pqs[i].Eval(ctx, rego.EvalParsedInput(val))
		if err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		if len(rs) != 1 {
			return fmt.Errorf("%s: want one result, got %d", d, len(rs))
		}
	}
	ns := make([][]float64, len(dirs))
	cpu := make([][]float64, len(dirs))
	allocs := make([]float64, len(dirs))
	var ms runtime.MemStats
	for r := range rounds {
		for i, pq := range pqs {
			runtime.ReadMemStats(&ms)
			before := ms.Mallocs
			cpu0 := cpuTime()
			start := time.Now()
			n := 0
			for time.Since(start) < batch {
				if _, err := pq.Eval(ctx, rego.EvalParsedInput(val)); err != nil {
					return err
				}
				n++
			}
			ns[i] = append(ns[i], float64(time.Since(start).Nanoseconds())/float64(n))
			cpu[i] = append(cpu[i], float64((cpuTime()-cpu0).Nanoseconds())/float64(n))
			runtime.ReadMemStats(&ms)
			if r == rounds-1 {
				allocs[i] = float64(ms.Mallocs-before) / float64(n)
			}
		}
	}
	fmt.Printf("%d rounds of %s of evaluations per policy, alternating, %s\n", rounds, batch, time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("| policy | median ns/op | fastest round ns/op | median ratio to %s | median CPU ns/op | median CPU ratio | allocs/op |\n|---|---|---|---|---|---|---|\n", dirs[0])
	for i, d := range dirs {
		fmt.Printf("| %s | %.0f | %.0f | %.3f | %.0f | %.3f | %.0f |\n", d, median(ns[i]), slices.Min(ns[i]), medianRatio(ns[i], ns[0]),
			median(cpu[i]), medianRatio(cpu[i], cpu[0]), allocs[i])
	}
	return nil
}

// writeMemProfile writes the allocations of the whole run (every one, -memprofile sets the rate).
func writeMemProfile(path string) error {
	runtime.GC() // the profile is as of the last collection
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// medianRatio is the median of the per-round ratios a[r]/b[r].
func medianRatio(a, b []float64) float64 {
	r := make([]float64, len(a))
	for i := range a {
		r[i] = a[i] / b[i]
	}
	return median(r)
}

// cpuTime is the user and system time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
