package decision

// ReadDocument reads a decision document decoded from JSON (as a decision log holds it) with the
// checks a policy's result gets: exactly the document's shape, only the boolean true grants.
// Members other than the decision's own (decision_id, revision, …) are ignored.
func ReadDocument(v any) (Document, error) { return parseResult(v) }
