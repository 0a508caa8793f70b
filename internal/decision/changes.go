package decision

// OnPolicyChange calls fn with the revision of every policy the engine makes current, after it
// is current: a decision made after fn was called decides on it. fn must return quickly and
// must not block or call cancel.
func (e *Engine) OnPolicyChange(fn func(revision string)) (cancel func()) {
	return e.activated.Add(fn)
}
