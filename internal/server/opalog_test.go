package server_test

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/testutil"
)

// logCollector is a loopback decision-log service: it keeps the events OPA uploads.
type logCollector struct {
	mu     sync.Mutex
	events []map[string]any
}

func (c *logCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var rd io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rd = zr
	}
	var evs []map[string]any
	if err := json.NewDecoder(rd).Decode(&evs); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.events = append(c.events, evs...)
	c.mu.Unlock()
}

func (c *logCollector) find(id string) map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.events {
		if e["decision_id"] == id {
			return e
		}
	}
	return nil
}

// TestOPADecisionLogsBesideTheLocalLog configures decision_logs in the opa section: each
// decision goes to the local JSON-lines log and, through OPA's decision-log plugin, to a
// loopback collector (uploaded in batches) and the console, masked by the bundle's
// system.log.mask policy on top of the local masks, with the bundle's revision.
func TestOPADecisionLogsBesideTheLocalLog(t *testing.T) {
	mods := policytest.EmbeddedModules(t)
	mods["system/log.rego"] = "package system.log\n\nmask contains \"/input/lease/id\"\n"
	out := &testutil.SyncBuffer{}
	eng := decision.New(decision.Options{})
	src, coll := opaLogged(t, "logged-1", mods, eng, true, hclog.New(&hclog.LoggerOptions{Output: out, Level: hclog.Info}))

	local := &testutil.SyncBuffer{}
	s, err := server.New(testConfig(), eng, staticFacts(t, "facts.json"), server.Options{Policy: src, DecisionLog: local})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	url := startHTTP(t, s)

	a := post(t, url+"/v1/authorize", fixture(t, nil))
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	doc := a.json(t)
	id := doc["decision_id"].(string)
	assert.Equal(t, "logged-1", doc["revision"])

	var ev map[string]any
	policytest.WaitFor(t, "the decision to be uploaded", 20*time.Second, func() bool { ev = coll.find(id); return ev != nil })
	assert.Equal(t, "authz/decision", ev["path"])
	assert.Equal(t, map[string]any{"authz": map[string]any{"revision": "logged-1"}}, ev["bundles"])
	assert.Equal(t, doc["allow"], ev["result"].(map[string]any)["allow"])
	in := ev["input"].(map[string]any)
	_, hasID := in["lease"].(map[string]any)["id"]
	assert.False(t, hasID, "system.log.mask removed /input/lease/id")
	assert.Equal(t, masked, in["environment"].(map[string]any)["config"], "the local masks apply too")
	assert.Contains(t, out.String(), id, "console: true prints the event in the service log")
	assert.Contains(t, local.String(), id, "the local decision log has the decision too")
}

// TestOPAMaskRulesLeaveDecisionsAlone: OPA's decision-log plugin applies system.log.mask rules to
// the event it is handed in place, so the event must not share the facts or the cached decision
// the service answers from. A mask that removes the pinned plugin's id and the worker's methods
// and upserts a capability in the result changes only the logged copies: the same request is
// granted again, from the cache and without it, with the same capabilities.
func TestOPAMaskRulesLeaveDecisionsAlone(t *testing.T) {
	mods := policytest.EmbeddedModules(t)
	mods["system/log.rego"] = `package system.log

mask contains "/input/facts/plugin/id"

mask contains "/input/facts/worker/supportedMethods"

mask contains "/input/resolved"

mask contains {"op": "upsert", "path": "/result/capabilities/reusableLeases", "value": true}
`
	for _, tc := range []struct {
		name  string
		cache decision.CacheOptions
	}{
		{name: "cache on"},
		{name: "cache off", cache: decision.CacheOptions{Disabled: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := decision.New(decision.Options{Cache: tc.cache})
			src, coll := opaLogged(t, "masked-1", mods, eng, false, hclog.NewNullLogger())

			s, err := server.New(testConfig(), eng, staticFacts(t, "facts.json"), server.Options{Policy: src, DecisionLog: &testutil.SyncBuffer{}})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, s.Close()) })
			url := startHTTP(t, s)

			var first map[string]any
			var ids []string
			for i := range 4 {
				a := post(t, url+"/v1/authorize", fixture(t, nil))
				require.Equal(t, http.StatusOK, a.status, "%s", a.body)
				doc := a.json(t)
				require.Equal(t, true, doc["allow"], "decision %d: %s", i, a.body)
				if first == nil {
					first = doc
				}
				assert.Equal(t, first["capabilities"], doc["capabilities"], "decision %d", i)
				ids = append(ids, doc["decision_id"].(string))
			}
			assert.Equal(t, false, first["capabilities"].(map[string]any)["reusableLeases"], "the fixture's lease is not reusable")
			for _, id := range ids {
				var ev map[string]any
				policytest.WaitFor(t, "the decision to be uploaded", 20*time.Second, func() bool { ev = coll.find(id); return ev != nil })
				assert.Equal(t, true, ev["result"].(map[string]any)["capabilities"].(map[string]any)["reusableLeases"], "the logged copy is masked")
				_, hasResolved := ev["input"].(map[string]any)["resolved"]
				assert.False(t, hasResolved, "the logged copy is masked")
			}
		})
	}
}

// opaLogged is a policy source on a loopback bundle server that publishes modules as revision,
// with OPA's decision logs uploaded to a loopback collector (and printed to logger when
// console), started and active, deciding with eng; it is closed with the test.
func opaLogged(t testing.TB, revision string, modules map[string]string, eng *decision.Engine, console bool, logger hclog.Logger) (*policy.Source, *logCollector) {
	t.Helper()
	bundles := policytest.NewBundleServer(t)
	coll := &logCollector{}
	logs := httptest.NewServer(coll)
	t.Cleanup(logs.Close)
	bundles.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: revision, Modules: modules}))
	pcfg := policy.Config{OPA: map[string]any{
		"services": map[string]any{
			"bundles": map[string]any{"url": bundles.URL},
			"logs":    map[string]any{"url": logs.URL},
		},
		"bundles": map[string]any{"authz": map[string]any{"service": "bundles", "resource": "/b.tar.gz",
			"polling": map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 2}}},
		"decision_logs": map[string]any{"service": "logs", "console": console,
			"reporting": map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 1}},
	}}
	src, err := policy.New(pcfg, eng, policy.Options{Logger: logger})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	t.Cleanup(func() { src.Close(context.Background()) })
	policytest.WaitFor(t, "the bundle to be activated", 20*time.Second, src.Ready)
	return src, coll
}
