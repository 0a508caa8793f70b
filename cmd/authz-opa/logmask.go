package main

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/hashicorp/go-hclog"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/authz-dev/authz/internal/opaplugin"
)

// defaultLogMask is what OPA's decision log masks when the user configured no masks: the
// environment's config, a driver's configuration (API URLs, credentials), as the gate's own
// log masks it by default (decisionLog.mask).
var defaultLogMask = []any{"/input/environment/config"}

// logMaskPath is where OPA's decision log looks for its masks when decision_logs.mask_decision
// is not set: data.system.log.mask, a rule of the user's mask policy, or else data.
var (
	logMaskPath = storage.Path{"system", "log", "mask"}
	logMaskRef  = ast.MustParseRef("data.system.log.mask")
)

// logMasking keeps OPA's decision log masking /input/environment/config while the user
// configures no masks of their own: no decision_logs.mask_decision, no rule and no data at
// data.system.log.mask, and OPA's write APIs closed. The default is data at system/log/mask (which OPA reads when no rule
// defines it), written at start and again after each policy change that removed it (a bundle
// whose roots cover system/log erases it; one that defines the rule replaces it).
type logMasking struct {
	m   *plugins.Manager
	off bool // plugins.authz.opaWriteAPI: masks are the user's, through OPA's API
	log hclog.Logger
}

// maskConfigured reports whether OPA's configuration logs no decisions, or names its own mask
// rule (decision_logs.mask_decision): then the default is not needed, or not wanted.
func maskConfigured(m *plugins.Manager) bool {
	if m.Config == nil || len(m.Config.DecisionLogs) == 0 {
		return true
	}
	var dl struct {
		MaskDecision *string `json:"mask_decision"`
	}
	if err := json.Unmarshal(m.Config.DecisionLogs, &dl); err != nil {
		return true // OPA's decision log plugin reports it
	}
	return dl.MaskDecision != nil
}

// start writes the default and watches policy changes, unless masks are configured.
func (l *logMasking) start(ctx context.Context) {
	if l.off || maskConfigured(l.m) {
		return
	}
	l.apply(ctx)
	// Triggers run inside the commit of the change: write after it, in a transaction of its own.
	l.m.RegisterCompilerTrigger(func(storage.Transaction) { go l.apply(context.Background()) })
}

// apply writes the default when no rule and no data define data.system.log.mask.
func (l *logMasking) apply(ctx context.Context) {
	if c := l.m.GetCompiler(); c != nil && len(c.GetRulesWithPrefix(logMaskRef)) > 0 {
		return // the user's mask policy
	}
	err := storage.Txn(ctx, l.m.Store, storage.WriteParams, func(txn storage.Transaction) error {
		if _, err := l.m.Store.Read(ctx, txn, logMaskPath); err == nil {
			return nil // masks of the user's, or the default already
		} else if !storage.IsNotFound(err) {
			return err
		}
		if err := storage.MakeDir(ctx, l.m.Store, txn, logMaskPath[:len(logMaskPath)-1]); err != nil {
			return err
		}
		return l.m.Store.Write(ctx, txn, storage.AddOp, logMaskPath, defaultLogMask)
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		l.log.Warn("OPA's decision log may record /input/environment/config unmasked: the default mask could not be written; configure a mask policy (data.system.log.mask)", "error", err)
	}
}

// maskingGate is the gate's plugin, which also sets the decision log's default mask at Start.
type maskingGate struct {
	*opaplugin.Plugin
	masks *logMasking
}

func (g maskingGate) Start(ctx context.Context) error {
	g.masks.start(ctx)
	return g.Plugin.Start(ctx)
}
