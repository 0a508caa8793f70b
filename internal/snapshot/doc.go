// Package snapshot assembles the one input document a decision is made on: the request
// (operation, environment, lease, command), checked and bounded, together with the facts as they
// are at that moment (the pinned plugin's record and status, its manifest entry, the live
// worker's methods, whether the driver accepts the provider configuration, the built-in
// provider) and the narrowing derived from the lease. The policy reads nothing else.
//
// What is snapshotted is that input, taken once per decision so that one decision never mixes
// two generations of a worker. It is not the domain's "capability snapshot" (the nine booleans
// a lease is entitled to), which the policy computes from this input and internal/decision
// returns as Document.Capabilities.
//
// The package also parses the two documents a caller brings: a request (ParseRequest) and a
// facts file (ParseFacts, LoadFacts), refusing a malformed one with coded.BadRequest or
// coded.BadFacts. Facts is the interface through which Build reads the host's state; the plugin
// host implements it live, FileFacts from a facts file.
package snapshot
