package decision

import (
	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
)

// Document is the decision document of docs/contract.md, "The decision document". Every field is always present in JSON.
type Document struct {
	Allow        bool             `json:"allow"`
	Code         string           `json:"code"`
	Message      string           `json:"message"`
	Reasons      []string         `json:"reasons"`
	Capabilities api.Capabilities `json:"capabilities"`
	DecisionID   string           `json:"decision_id"`
	Revision     string           `json:"revision"`
}

// reasonEvaluationFailed is the only reason of a decision that could not be evaluated.
const reasonEvaluationFailed = "evaluation_failed"

// capabilityDenied holds each operation's capability-denied code and message (docs/contract.md, "Codes and messages"):
// the answer to every evaluation that fails.
var capabilityDenied = map[string][2]string{
	snapshot.OpOpenDuplexChannel: {
		"DUPLEX_CHANNEL_CAPABILITY_DENIED",
		"Sandbox lease does not grant the duplex command stream capability.",
	},
	snapshot.OpGetRunnerIngressEndpoint: {
		"RUNNER_INGRESS_CAPABILITY_DENIED",
		"Sandbox lease does not grant runner WebSocket ingress.",
	},
}

// FailedDocument is the deny of docs/contract.md, "Precise rules", "Failures": the operation's capability-denied
// code and message, no capability, and the reason evaluation_failed. An unknown operation gets
// the duplex channel's code.
func FailedDocument(operation string) Document {
	cd, ok := capabilityDenied[operation]
	if !ok {
		cd = capabilityDenied[snapshot.OpOpenDuplexChannel]
	}
	return Document{
		Code:    cd[0],
		Message: cd[1],
		Reasons: []string{reasonEvaluationFailed},
	}
}

// FailClosed is what answers a decision that could not be evaluated: whatever the decider
// returned beside err, the fail-closed deny of FailedDocument, keeping the decision id and the
// revision of doc; code is err's code (EVAL_ERROR when it has none). Every face that decides
// answers a failure through it.
func FailClosed(operation string, doc Document, err error) (failed Document, code coded.Code) {
	code = coded.CodeOf(err)
	if code == "" {
		code = coded.EvalError
	}
	failed = FailedDocument(operation)
	failed.DecisionID, failed.Revision = doc.DecisionID, doc.Revision
	return failed, code
}
