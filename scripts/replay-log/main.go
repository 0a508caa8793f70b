// Command replay-log writes a decision log for measuring `authz replay` (issue: replay in
// bounded memory): N lines made from the contract's examples decided by the embedded policy,
// to stdout. Write it to /tmp, never into the repository:
//
//	go run ./scripts/replay-log -n 1000000 > /tmp/replay-realistic.jsonl
//	go run ./scripts/replay-log -n 200000 -miss > /tmp/replay-miss.jsonl
//	/usr/bin/time -v go run ./cmd/authz replay --log /tmp/replay-realistic.jsonl   # Maximum resident set size
//
// Without -miss the log is a day's realistic one: many leases (a lease id, decision id and
// clock per line) but few distinct footprints (what the policy reads repeats), so most
// decisions come from the decision cache. With -miss every line differs in what the policy
// reads (the worker's generation), so every decision misses the cache. The command checks that
// on the first lines with the engine's cache statistics.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
)

func main() {
	n := flag.Int("n", 1000000, "lines to write")
	miss := flag.Bool("miss", false, "make every line differ in what the policy reads (every decision misses the cache)")
	flag.Parse()
	if err := write(*n, *miss); err != nil {
		fmt.Fprintln(os.Stderr, "replay-log:", err)
		os.Exit(1)
	}
}

func write(n int, miss bool) error {
	ctx := context.Background()
	p, err := decision.EmbeddedPolicy()
	if err != nil {
		return err
	}
	eng := decision.New(decision.Options{})
	if err := eng.Activate(ctx, p); err != nil {
		return err
	}
	type row struct{ in snapshot.Input }
	var rows []row
	for _, ex := range specexamples.Rows() {
		reqJSON, factsJSON := ex.Fixture().JSON()
		req, err := snapshot.ParseRequestBytes(reqJSON)
		if err != nil {
			return err
		}
		facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
		if err != nil {
			return err
		}
		_, in, err := eng.Decide(ctx, req, facts)
		if err != nil {
			return err
		}
		rows = append(rows, row{in})
	}
	check := decision.New(decision.Options{})
	if err := check.Activate(ctx, p); err != nil {
		return err
	}
	w := bufio.NewWriterSize(os.Stdout, 1<<20)
	for i := range n {
		in := clone(rows[i%len(rows)].in)
		in["now_ns"] = 1796042400000000000 + int64(i)*1e6
		if lease, ok := in["lease"].(map[string]any); ok {
			lease["id"] = fmt.Sprintf("lease-%d", i)
		}
		if miss {
			facts, _ := in["facts"].(map[string]any)
			if facts == nil {
				facts = map[string]any{}
				in["facts"] = facts
			}
			worker, _ := facts["worker"].(map[string]any)
			if worker == nil {
				worker = map[string]any{}
				facts["worker"] = worker
			}
			worker["generation"] = i + 1
		}
		doc, err := eng.Evaluate(ctx, in)
		if err != nil {
			return err
		}
		if i < 2000 {
			if _, err := check.Evaluate(ctx, in); err != nil {
				return err
			}
		}
		line, err := json.Marshal(map[string]any{"decision_id": doc.DecisionID, "path": "/v1/authorize",
			"operation": in["operation"], "input": in, "result": doc, "revision": doc.Revision})
		if err != nil {
			return err
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	st := check.CacheStats()
	fmt.Fprintf(os.Stderr, "replay-log: %d lines; of the first %d decisions %d missed the cache\n", n, min(n, 2000), st.Misses)
	return nil
}

// clone is a deep copy of a JSON-shaped value.
func clone[T any](v T) T {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}
