// Command opa-floor is the floor authz's first run is measured against (scripts/first-run):
// the least program that serves one Rego rule with the same OPA, answering {"allow": true}
// for a request with a lease id.
package main

import (
	"context"
	"encoding/json"
	"log"
	"net/http"

	"github.com/open-policy-agent/opa/v1/rego"
)

func main() {
	q, err := rego.New(rego.Query("data.floor.allow"),
		rego.Module("floor.rego", "package floor\n\nallow if input.lease.id != \"\"\n")).PrepareForEval(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	http.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		var in map[string]any
		err := json.NewDecoder(r.Body).Decode(&in)
		rs, evalErr := q.Eval(r.Context(), rego.EvalInput(in))
		_ = json.NewEncoder(w).Encode(map[string]bool{"allow": err == nil && evalErr == nil && rs.Allowed()})
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:18182", nil)) //nolint:gosec // a measurement on loopback
}
