package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/snapshot"
)

const decideUsage = `Usage: authz decide --facts FILE [--request FILE] [--bundle PATH] [--print-input] [--explain]

Decides one request (docs/contract.md, "The request") against a facts file ("The facts
(host state)") with the embedded policy, or the bundle of --bundle (verified with --verification-key when given), and prints the decision document as JSON. The request is read from stdin unless
--request is given. Exit status: 0 when a decision was made (grant or deny), 2 for a bad
request, bad facts or bad flags, 1 when the decision could not be evaluated (the printed
document is then a deny with reason evaluation_failed).

Flags:
`

func runDecide(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("decide", flag.ContinueOnError)
	factsPath := fs.String("facts", "", "facts file (plugins, workers, builtinProviders); required")
	requestPath := fs.String("request", "", "request file; stdin when absent or \"-\"")
	printInput := fs.Bool("print-input", false, "print the assembled input document instead of deciding")
	explain := fs.Bool("explain", false, "also write a readable account of the decision to stderr")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on the evaluation")
	var pcfg policy.Config
	policyFlags(fs, &pcfg, false) // --bundle and its verification flags
	if ok, err := parseFlags(fs, decideUsage, args, stderr, "the request comes from stdin or --request"); !ok {
		return err
	}
	if *factsPath == "" {
		return usageError("decide: --facts FILE is required (a facts file as in docs/contract.md, \"The facts (host state)\"; `authz serve` exposes its live facts at GET /v1/facts)")
	}

	// The request is checked first: when both are bad, the request is reported (docs/contract.md, "Precise rules").
	req, err := readRequest(*requestPath, stdin)
	if err != nil {
		return usageError("decide: bad request: %v", err)
	}
	facts, err := snapshot.LoadFacts(*factsPath)
	if err != nil {
		return usageError("decide: bad facts in %s: %v", *factsPath, err)
	}

	if *printInput {
		return writeJSON(stdout, snapshot.Build(ctx, req, facts, snapshot.Options{}))
	}
	// The embedded policy, or the bundle of --bundle.
	eng, src, err := policy.Start(ctx, pcfg, decision.Options{EvalTimeout: *timeout}, policy.Options{})
	if err != nil {
		return usageError("decide: %v", err)
	}
	defer src.Close(ctx)
	doc, input, evalErr := eng.Decide(ctx, req, facts)
	if err := writeJSON(stdout, doc); err != nil {
		return err
	}
	if *explain {
		fmt.Fprint(stderr, decision.Explain(doc, input, evalErr))
	}
	if evalErr != nil {
		return &exitError{code: 1, msg: "decide: the decision could not be evaluated (" + string(coded.CodeOf(evalErr)) + ": " + evalErr.Error() + "); the printed document denies"}
	}
	return nil
}

func readRequest(path string, stdin io.Reader) (*snapshot.Request, error) {
	if path == "" || path == "-" {
		return snapshot.ParseRequest(stdin)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return snapshot.ParseRequest(f)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
