package server

import (
	"regexp"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
)

// metrics are the service's Prometheus metrics, in a registry of their own (never the global
// one, so two servers in one process, as in tests, do not collide).
type metrics struct {
	reg          *prometheus.Registry
	decisions    *prometheus.CounterVec
	evalFailures *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	logFailures  prometheus.Counter
	logCuts      prometheus.Counter
	requests     *prometheus.CounterVec
	watchEvents  *prometheus.CounterVec
}

func newMetrics(d Decider, facts FactsSource, origin func() string) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authz_decisions_total",
			Help: "Decisions answered, by operation, verdict (allow) and decision code (\"\" on a grant; DECISION_LOG_UNAVAILABLE for a decision answered 503 because its log line could not be written).",
		}, []string{"operation", "allow", "code"}),
		evalFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authz_decision_evaluation_failures_total",
			Help: "Decisions that could not be evaluated (answered 500 with a deny), by operation and error code.",
		}, []string{"operation", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "authz_decision_duration_seconds",
			Help:    "Time to make one decision (input assembly and evaluation), by operation.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"operation"}),
		logFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "authz_decision_log_failures_total",
			Help: "Decision log lines that could not be written.",
		}),
		logCuts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "authz_decision_log_cut_members_total",
			Help: "Members of decision log lines cut to keep a line within decisionLog.maxLineBytes (a whole input cut counts one).",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authz_http_requests_total",
			Help: "HTTP requests, by route (\"other\" for unknown paths) and status code.",
		}, []string{"route", "status"}),
		watchEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authz_watch_events_total",
			Help: "Events sent on watches (POST /v1/authorize/watch), by event (decision, update, revoke) and the decision's first reason (\"\" on a grant; \"other\" for a reason outside the contract's table).",
		}, []string{"event", "reason"}),
	}
	m.reg.MustRegister(
		m.decisions, m.evalFailures, m.latency, m.logFailures, m.logCuts, m.requests, m.watchEvents,
		&stateCollector{decider: d, facts: facts, origin: origin},
		buildInfoGauge(),
		// Besides the defaults, the two runtime figures that explain a latency tail: how long
		// runnable goroutines waited for a CPU (go_sched_latencies_seconds) and the garbage
		// collector's stop-the-world pauses (go_sched_pauses_total_gc_seconds).
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{
			Matcher: regexp.MustCompile(`^/sched/(latencies|pauses/total/gc):seconds$`),
		})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// buildInfoGauge is authz_build_info: always 1, what the binary was built from in its labels
// (the convention of prometheus_build_info and go_build_info).
func buildInfoGauge() prometheus.Collector {
	b := Build()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "authz_build_info",
		Help: "What the binary was built from (always 1; the module version, VCS revision, Go and OPA versions are the labels).",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision,
			"go_version": b.GoVersion, "opa_version": b.OPAVersion},
	}, func() float64 { return 1 })
}

func (m *metrics) observeDecision(op string, allow bool, code string, evalErr coded.Code, d time.Duration) {
	m.decisions.WithLabelValues(op, strconv.FormatBool(allow), code).Inc()
	m.latency.WithLabelValues(op).Observe(d.Seconds())
	if evalErr != "" {
		m.evalFailures.WithLabelValues(op, string(evalErr)).Inc()
	}
}

var (
	pluginUpDesc = prometheus.NewDesc("authz_plugin_up",
		"1 when the plugin's worker is running, else 0.", []string{"id", "key", "status"}, nil)
	pluginRestartsDesc = prometheus.NewDesc("authz_plugin_restarts_total",
		"Restarts of the plugin's worker since the service started.", []string{"id"}, nil)
	pluginGenerationDesc = prometheus.NewDesc("authz_plugin_worker_generation",
		"Generation of the plugin's running worker (grows with every restart).", []string{"id"}, nil)
	revisionDesc = prometheus.NewDesc("authz_policy_revision_info",
		"The active policy revision and where it came from (always 1; the revision and origin are the labels). Absent while no policy is loaded.", []string{"revision", "origin"}, nil)
	readyDesc = prometheus.NewDesc("authz_ready",
		"1 when GET /health/ready answers 200.", nil, nil)
	cacheHitsDesc = prometheus.NewDesc("authz_decision_cache_hits_total",
		"Decisions answered from the decision cache.", nil, nil)
	cacheMissesDesc = prometheus.NewDesc("authz_decision_cache_misses_total",
		"Cacheable decisions that were evaluated because the cache did not hold them.", nil, nil)
	cacheEvictionsDesc = prometheus.NewDesc("authz_decision_cache_evictions_total",
		"Decisions dropped from the decision cache to keep it within its bounds.", nil, nil)
)

// cacheStater is a Decider with a decision cache (*decision.Engine is one).
type cacheStater interface {
	CacheStats() decision.CacheStats
}

// stateCollector reads the plugin host and the engine at scrape time, so the metrics show the
// state now and never a copy that could go stale.
type stateCollector struct {
	decider Decider
	facts   FactsSource
	origin  func() string
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pluginUpDesc
	ch <- pluginRestartsDesc
	ch <- pluginGenerationDesc
	ch <- revisionDesc
	ch <- readyDesc
	ch <- cacheHitsDesc
	ch <- cacheMissesDesc
	ch <- cacheEvictionsDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.facts.Plugins() {
		up := 0.0
		if p.Worker != nil {
			up = 1
			ch <- prometheus.MustNewConstMetric(pluginGenerationDesc, prometheus.GaugeValue, float64(p.Worker.Generation), p.ID)
		}
		ch <- prometheus.MustNewConstMetric(pluginUpDesc, prometheus.GaugeValue, up, p.ID, p.Key, p.Status)
		ch <- prometheus.MustNewConstMetric(pluginRestartsDesc, prometheus.CounterValue, float64(p.Restarts), p.ID)
	}
	rev := c.decider.Revision()
	if rev != "" {
		ch <- prometheus.MustNewConstMetric(revisionDesc, prometheus.GaugeValue, 1, rev, c.origin())
	}
	ready := 0.0
	if rev != "" && c.facts.Ready() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, ready)
	if cs, ok := c.decider.(cacheStater); ok {
		st := cs.CacheStats()
		ch <- prometheus.MustNewConstMetric(cacheHitsDesc, prometheus.CounterValue, float64(st.Hits))
		ch <- prometheus.MustNewConstMetric(cacheMissesDesc, prometheus.CounterValue, float64(st.Misses))
		ch <- prometheus.MustNewConstMetric(cacheEvictionsDesc, prometheus.CounterValue, float64(st.Evictions))
	}
}
