package api

import (
	"encoding/json"
	"time"
)

// Status is the state of the policy: GET /v1/status. Bundles holds, per bundle, its status in
// the shape of OPA's status API; an error of authz's own check of a bundle (entrypoint
// missing) shows there too, with code POLICY_BUNDLE_CHECK.
type Status struct {
	// Revision is the active policy's revision: the manifest revision of its bundle (the
	// revisions of several bundles joined as NAME=REVISION,...), or for the embedded policy
	// and bundles without one a digest of their content ("sha256:…"). "" while none is active.
	Revision string `json:"revision"`
	// Origin says where the active policy came from: "embedded", "file:PATH" or
	// "remote:NAME[,NAME…]".
	Origin string `json:"origin"`
	// ActivatedAt is when the active policy was activated (zero while none is).
	ActivatedAt time.Time `json:"activated_at"`
	// Bundles is the status of each configured bundle, by name.
	Bundles map[string]*BundleStatus `json:"bundles"`
	// LastError is the last failure to activate a policy (any bundle), "" when there was none
	// since the last activation.
	LastError string `json:"last_error,omitempty"`
}

// BundleStatus is one bundle's status: the fields and JSON names of OPA's bundle status
// (plugins/bundle.Status), less its per-download metrics, so that a reader of the API does not
// link OPA's bundle plugin. internal/policy fills it from OPA's.
type BundleStatus struct {
	Name                     string      `json:"name"`
	ActiveRevision           string      `json:"active_revision,omitempty"`
	LastSuccessfulActivation time.Time   `json:"last_successful_activation"`
	Type                     string      `json:"type,omitempty"`
	Size                     int         `json:"size,omitempty"`
	LastSuccessfulDownload   time.Time   `json:"last_successful_download"`
	LastSuccessfulRequest    time.Time   `json:"last_successful_request"`
	LastRequest              time.Time   `json:"last_request"`
	Code                     string      `json:"code,omitempty"`
	Message                  string      `json:"message,omitempty"`
	Errors                   []error     `json:"errors,omitempty"`
	HTTPCode                 json.Number `json:"http_code,omitempty"`
}

// Origin kinds, the first word of Status.Origin.
const (
	OriginEmbedded = "embedded"
	OriginFile     = "file"
	OriginRemote   = "remote"
)

// Decision is one decision as it is handed to OPA's decision-log plugin (the policy source adds
// the active bundles).
type Decision struct {
	ID         string
	Path       string // the decision's path below data, e.g. "authz/decision"
	Timestamp  time.Time
	Input      any
	Result     any
	Revision   string
	RemoteAddr string
	// Error is the evaluation failure's code when the decision could not be evaluated.
	Error string
}
