package server

import (
	"io"

	"github.com/authz-dev/authz/internal/decision"
)

// Masker masks one decision as the decision log does: the values at the decisionLog.mask
// pointers (below /input), and every other copy of them in the input and in the document's
// message. It never modifies its arguments.
type Masker func(input any, doc decision.Document) (any, decision.Document)

// NewMasker returns the Masker of the given pointers (decisionLog.mask), for a decision log
// other than the service's own (OPA's, when the gate runs inside OPA) to record the same
// masked values.
func NewMasker(masks []string) (Masker, error) {
	l, err := newDecisionLog(io.Discard, nil, masks)
	if err != nil {
		return nil, err
	}
	return func(input any, doc decision.Document) (any, decision.Document) {
		e := maskEntry(logEntry{Input: input, Result: doc}, l.masks)
		return e.Input, e.Result
	}, nil
}
