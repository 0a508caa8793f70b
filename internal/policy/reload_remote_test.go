package policy

import (
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/policy/policytest"
)

// TestReloadDuringPolling: a reload (SIGHUP) while OPA polls a remote bundle does not run a
// second download of that bundle beside the polling one (OPA's downloader is not safe for it:
// go test -race reports the race), and the manually triggered bundles are downloaded.
func TestReloadDuringPolling(t *testing.T) {
	srv := policytest.NewBundleServer(t)
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "r1", Modules: policytest.MarkerModules("M1")}))
	cfg := remoteConfig(srv, "", false, "")
	eng, src := startSource(t, cfg)
	policytest.WaitFor(t, "activation", 20*time.Second, func() bool { return eng.Revision() == "r1" })
	deadline := time.Now().Add(3 * time.Second) // the polling loop downloads every 1-2 s meanwhile
	for time.Now().Before(deadline) {
		require.NoError(t, src.Reload(t.Context()))
	}

	// A bundle with trigger: manual is downloaded by a reload, and only then.
	manual := remoteConfig(srv, "", false, "")
	bundles := maps.Clone(manual.OPA["bundles"].(map[string]any))
	b := maps.Clone(bundles["authz"].(map[string]any))
	delete(b, "polling")
	b["trigger"] = "manual"
	bundles["authz"] = b
	manual.OPA = maps.Clone(manual.OPA)
	manual.OPA["bundles"] = bundles
	meng, msrc := startSource(t, manual)
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "r2", Modules: policytest.MarkerModules("M2")}))
	require.NoError(t, msrc.Reload(t.Context()))
	policytest.WaitFor(t, "activation", 20*time.Second, func() bool { return meng.Revision() == "r2" })
}
