package policy

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/authz-dev/authz/internal/policystate"
)

// DefaultDecisionLogBufferBytes is OPA's decision_logs.reporting.buffer_size_limit_bytes when
// the opa section sets no bound of the buffer (policystate).
const DefaultDecisionLogBufferBytes = policystate.DefaultDecisionLogBufferBytes

// boundOPA applies authz's bounds to an opa section (raw JSON) before OPA's plugin manager
// reads it: every bundle without size_limit_bytes gets DefaultBundleEntryBytes (OPA's default
// is 1 GiB per file), the decision-log buffer gets DefaultDecisionLogBufferBytes unless it is
// bounded already. It returns the bounds of the bundles' download streams: the defaults, with
// one entry as large as the largest size_limit_bytes the operator set.
func boundOPA(raw []byte) ([]byte, bundleLimits, error) {
	lim := defaultBundleLimits()
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // numbers are written back as they were
	if err := dec.Decode(&doc); err != nil {
		return nil, lim, fmt.Errorf("not a JSON-shaped document: %w", err)
	}
	if bundles, ok := doc["bundles"].(map[string]any); ok {
		var largest int64
		for _, b := range bundles {
			bm, ok := b.(map[string]any)
			if !ok {
				continue // OPA's parser reports it
			}
			if n, ok := positive(bm["size_limit_bytes"]); ok {
				largest = max(largest, n)
				continue
			}
			bm["size_limit_bytes"] = DefaultBundleEntryBytes
		}
		lim = lim.withEntryLimit(largest)
	}
	if dl, ok := doc["decision_logs"].(map[string]any); ok {
		rep, ok := dl["reporting"].(map[string]any)
		if !ok && dl["reporting"] == nil {
			rep = map[string]any{}
			dl["reporting"] = rep
		}
		if rep != nil {
			_, limited := rep["buffer_size_limit_bytes"]
			_, rated := rep["max_decisions_per_second"]
			if t, _ := rep["buffer_type"].(string); (t == "" || t == "size") && !limited && !rated {
				rep["buffer_size_limit_bytes"] = DefaultDecisionLogBufferBytes
			}
		}
	}
	out, err := json.Marshal(doc)
	return out, lim, err
}

// positive is v as a positive integer, when it is one.
func positive(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil && i > 0
}
