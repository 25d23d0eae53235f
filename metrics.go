// metrics.go: GET /metrics: the overview's gauges and this process's
// counters (counters.go) in the Prometheus text exposition format
// (version 0.0.4), written by hand.

package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// promWriter writes the exposition format; the first write error sticks.
type promWriter struct {
	w   *bufio.Writer
	err error
}

func (p *promWriter) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

// family writes a metric family's HELP and TYPE lines.
func (p *promWriter) family(name, typ, help string) {
	p.printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func (p *promWriter) sample(name, labels string, v float64) {
	if labels != "" {
		labels = "{" + labels + "}"
	}
	p.printf("%s%s %s\n", name, labels, formatFloat(v))
}

// counter writes a counter family of one sample.
func (p *promWriter) counter(name, help string, v int64) {
	p.family(name, "counter", help)
	p.sample(name, "", float64(v))
}

// gauge writes a gauge family of one sample.
func (p *promWriter) gauge(name, help string, v float64) {
	p.family(name, "gauge", help)
	p.sample(name, "", v)
}

// histogramFamily writes a histogram family of one histogram.
func (p *promWriter) histogramFamily(name, help string, h *histogram) {
	p.family(name, "histogram", help)
	p.histogram(name, "", h)
}

// histogram writes one histogram's _bucket, _sum and _count lines.
func (p *promWriter) histogram(name, labels string, h *histogram) {
	sep := ""
	if labels != "" {
		sep = ","
	}
	var cumulative uint64
	for i, b := range h.bounds {
		cumulative += h.counts[i].Load()
		p.sample(name+"_bucket", labels+sep+`le="`+formatFloat(b)+`"`, float64(cumulative))
	}
	p.sample(name+"_bucket", labels+sep+`le="+Inf"`, float64(h.count.Load()))
	p.sample(name+"_sum", labels, math.Float64frombits(h.sumBits.Load()))
	p.sample(name+"_count", labels, float64(h.count.Load()))
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// labelValue escapes a label value as the format requires.
func labelValue(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// writeMetrics writes the overview's gauges and the process's counters.
func writeMetrics(w io.Writer, o Overview, c *processCounters) error {
	p := &promWriter{w: bufio.NewWriter(w)}
	writeOverviewGauges(p, o)
	if c != nil {
		c.write(p)
	}
	if p.err == nil {
		p.err = p.w.Flush()
	}
	return p.err
}

// writeOverviewGauges writes the overview as gauges: what every replica
// reads alike from the database, and every alert, firing (1) or not (0).
func writeOverviewGauges(p *promWriter, o Overview) {
	p.gauge("outboxd_events_backlog", "Un-fanned, un-poisoned events waiting for the relay.", float64(o.Backlog))
	p.gauge("outboxd_events_poisoned", "Events set aside after repeated relay failures.", float64(o.Poisoned))
	p.gauge("outboxd_events_oldest_unfanned_age_seconds", "Age of the oldest event waiting for the relay.", o.OldestUnfannedAgeSeconds)
	p.family("outboxd_jobs", "gauge", "Jobs by state.")
	for _, s := range []struct {
		state string
		n     int64
	}{
		{"available", o.Jobs.Available}, {"running", o.Jobs.Running}, {"retryable", o.Jobs.Retryable},
		{"completed", o.Jobs.Completed}, {"discarded", o.Jobs.Discarded},
	} {
		p.sample("outboxd_jobs", `state="`+s.state+`"`, float64(s.n))
	}
	p.family("outboxd_endpoints", "gauge", "Endpoints by state.")
	p.sample("outboxd_endpoints", `state="enabled"`, float64(o.Endpoints.Enabled))
	p.sample("outboxd_endpoints", `state="failing"`, float64(o.Endpoints.Failing))
	p.sample("outboxd_endpoints", `state="disabled"`, float64(o.Endpoints.Disabled))
	p.family("outboxd_table_bytes", "gauge", "Total size of outboxd's tables, indexes and TOAST included.")
	for _, t := range o.Tables {
		p.sample("outboxd_table_bytes", `table="`+labelValue(t.Name)+`"`, float64(t.TotalBytes))
	}
	p.family("outboxd_table_dead_rows", "gauge", "Dead rows waiting for vacuum, by table.")
	for _, t := range o.Tables {
		p.sample("outboxd_table_dead_rows", `table="`+labelValue(t.Name)+`"`, float64(t.DeadRows))
	}
	p.gauge("outboxd_oldest_transaction_age_seconds", "Age of the oldest open transaction holding back vacuum in this database.", o.OldestXactAgeSeconds)
	p.gauge("outboxd_notify_queue_usage_ratio", "Share of PostgreSQL's NOTIFY queue in use; full, it fails every notifying COMMIT.", o.NotifyQueueUsage)
	p.family("outboxd_alerts_firing", "gauge", "Alerts firing, by name.")
	for _, rule := range alertRules {
		firing := 0.0
		for _, a := range o.Alerts {
			if a.Name == rule.name {
				firing = 1
			}
		}
		p.sample("outboxd_alerts_firing", `alert="`+rule.name+`"`, firing)
	}
}

// processCounters are what this process's loops did since it started; each
// replica reports its own, and Prometheus sums them. A loop the process
// does not run is nil, and writes nothing.
type processCounters struct {
	relay      *relay
	workers    *workerPool
	rescuer    *rescuer
	deliveries *deliveryMetrics
	notifier   *ownerNotifier
	retention  *sweeper // its cycles, anomaly-cap stops and rows pruned; nil without one
	registry   *replicaRegistry
	auth       *authMetrics // wrong admin tokens, counted by the HTTP side
}

// addTo adds to an overview what this process knows beside the database:
// the rows its retention sweeps pruned, and which of the replicas it is.
func (c *processCounters) addTo(o *Overview) {
	if c == nil {
		return
	}
	if c.retention != nil {
		o.Pruned = c.retention.PrunedByTable()
	}
	if c.registry != nil {
		self := c.registry.ID()
		for i := range o.Replicas {
			o.Replicas[i].Self = o.Replicas[i].ID == self
		}
	}
}

// write writes every loop's counters, one loop after the other.
func (c *processCounters) write(p *promWriter) {
	if c.relay != nil {
		writeRelayCounters(p, c.relay)
	}
	if c.workers != nil {
		writeWorkerCounters(p, c.workers)
	}
	if c.rescuer != nil {
		writeRescuerCounters(p, c.rescuer)
	}
	if c.registry != nil {
		p.counter("outboxd_replica_reregistered_total", "Times this process found itself declared dead and registered again under a new id.",
			c.registry.reregistered.Load())
	}
	if c.deliveries != nil {
		writeDeliveryCounters(p, c.deliveries)
	}
	if c.notifier != nil {
		p.counter("outboxd_owner_notifications_sent_total", "Mails sent to endpoint owners about failing or disabled endpoints.", c.notifier.sent.Load())
		p.counter("outboxd_owner_notifications_dropped_total", "Owner notifications deliberately not sent: over the hourly cap per owner.", c.notifier.dropped.Load())
	}
	if c.retention != nil {
		writeRetentionCounters(p, c.retention)
	}
	if c.auth != nil {
		writeAuthCounters(p, c.auth)
	}
}

// writeAuthCounters writes the wrong admin tokens by way, both ways
// always, 0 included, so that a rate over them exists before the first.
func writeAuthCounters(p *promWriter, m *authMetrics) {
	p.family("outboxd_auth_failures_total", "counter", "Wrong admin tokens checked and refused (401), by way: a bearer token (bearer) or the panel's sign-in (sign_in).")
	writeByVia(p, "outboxd_auth_failures_total", m.wrong)
	p.family("outboxd_auth_throttled_total", "counter", "Admin tokens refused unchecked (429), their client address past its budget of wrong ones, by way.")
	writeByVia(p, "outboxd_auth_throttled_total", m.throttled)
}

func writeByVia(p *promWriter, name string, by *counterVec) {
	n := by.Snapshot()
	for _, via := range []string{authViaBearer, authViaSignIn} {
		p.sample(name, `via="`+via+`"`, float64(n[via]))
	}
}

func writeRelayCounters(p *promWriter, r *relay) {
	p.counter("outboxd_relay_passes_total", "Relay passes run.", r.passes.Load())
	p.histogramFamily("outboxd_relay_pass_seconds", "Duration of one relay pass's statement, its claim for this process's workers included (outboxd_relay_jobs_claimed_total).", r.passTime)
	p.counter("outboxd_relay_events_total", "Events fanned out by the relay.", r.eventsFanned.Load())
	p.counter("outboxd_relay_jobs_enqueued_total", "Jobs enqueued by the relay.", r.jobsEnqueued.Load())
	p.counter("outboxd_relay_row_failures_total", "Failed relay attempts counted against single events.", r.rowFailures.Load())
	p.counter("outboxd_relay_pass_timeouts_total", "Relay statements cancelled at -relay-pass-timeout.", r.passTimeouts.Load())
	p.counter("outboxd_relay_filters_held_total", "Endpoints' filters held after they failed a relay pass alone (docs/filters.md).", r.filtersHeld.Load())
}

func writeWorkerCounters(p *promWriter, w *workerPool) {
	p.family("outboxd_job_attempts_total", "counter", "Job attempts by outcome.")
	p.sample("outboxd_job_attempts_total", `outcome="completed"`, float64(w.completed.Load()))
	p.sample("outboxd_job_attempts_total", `outcome="retryable"`, float64(w.retried.Load()))
	p.sample("outboxd_job_attempts_total", `outcome="discarded"`, float64(w.discarded.Load()))
	p.histogramFamily("outboxd_job_claim_seconds", "Duration of one claim statement (outbox.claim_lane_jobs).", w.claims)
	p.counter("outboxd_jobs_claimed_total", "Jobs taken by the workers' claims (outboxd_job_claim_seconds).", w.claimedJobs.Load())
	p.histogramFamily("outboxd_job_outcome_batch_seconds", "Duration of writing one batch of job outcomes, retries included.", w.outcomeBatches)
	p.counter("outboxd_job_outcomes_written_total", "Job outcomes in the batches written.", w.outcomeJobs.Load())
}

func writeRescuerCounters(p *promWriter, r *rescuer) {
	p.counter("outboxd_jobs_rescued_total", "Jobs found running past the rescue horizon.", r.rescued.Load())
	p.counter("outboxd_jobs_rescued_from_dead_replicas_total", "Running jobs of replicas declared dead (no heartbeat), rescued by this process.", r.rescuedOfDead.Load())
	p.counter("outboxd_replicas_declared_dead_total", "Replicas this process declared dead: no heartbeat within their dead_after.", r.declaredDead.Load())
}

func writeDeliveryCounters(p *promWriter, d *deliveryMetrics) {
	p.family("outboxd_deliveries_total", "counter", "Webhook delivery attempts by outcome.")
	outcomes := d.outcomes.Snapshot()
	for _, o := range sortedKeys(outcomes) {
		p.sample("outboxd_deliveries_total", `outcome="`+labelValue(o)+`"`, float64(outcomes[o]))
	}
	p.histogramFamily("outboxd_delivery_duration_seconds", "Duration of one webhook delivery attempt.", d.latency)
	p.family("outboxd_commit_to_first_2xx_seconds", "histogram", "Time from an event's commit (outbox.events.committed_at) to its first 2xx answer, by endpoint.")
	for _, ep := range d.commitTo2xx.labels() {
		p.histogram("outboxd_commit_to_first_2xx_seconds", `endpoint="`+labelValue(ep)+`"`, d.commitTo2xx.With(ep))
	}
}

func writeRetentionCounters(p *promWriter, s *sweeper) {
	p.family("outboxd_retention_cycles_total", "counter", "Retention cycles by result: swept by this process, skipped while another replica held the lock, or failed (an anomaly-cap stop included).")
	p.sample("outboxd_retention_cycles_total", `result="swept"`, float64(s.cycles.Load()))
	p.sample("outboxd_retention_cycles_total", `result="skipped"`, float64(s.skipped.Load()))
	p.sample("outboxd_retention_cycles_total", `result="failed"`, float64(s.failed.Load()))
	p.family("outboxd_retention_anomaly_cap_stops_total", "counter", "Cycles a sweep stopped at -retention-anomaly-cap instead of deleting on.")
	for _, st := range s.Stats() {
		p.sample("outboxd_retention_anomaly_cap_stops_total", `sweep="`+labelValue(st.Sweep)+`"`, float64(st.CapHits))
	}
	p.family("outboxd_rows_pruned_total", "counter", "Rows deleted by the retention sweeps, by table.")
	pruned := s.PrunedByTable()
	for _, table := range sortedKeys(pruned) {
		p.sample("outboxd_rows_pruned_total", `table="`+labelValue(table)+`"`, float64(pruned[table]))
	}
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// writeDeliveryStatsMetrics writes every endpoint's delivery statistics
// over the last hour (stats.go, outbox.delivery_stats): gauges, not
// counters, as retention deletes old minutes, and the same on every
// replica, which reads them from the database (aggregate them with max,
// not sum). The histogram above counts this process's deliveries since it
// started; these count every replica's, and survive restarts.
func writeDeliveryStatsMetrics(w io.Writer, st DeliveryStats) error {
	p := &promWriter{w: bufio.NewWriter(w)}
	p.family("outboxd_delivery_stats_last_hour_produced", "gauge", "Deliveries fanned out in the last 60 minutes, the current one included; every replica's.")
	p.sample("outboxd_delivery_stats_last_hour_produced", "", float64(st.Produced))
	p.family("outboxd_delivery_stats_last_hour_filtered_out", "gauge", "Events that endpoints' filters kept from them in the last 60 minutes, the current one included; every replica's.")
	p.sample("outboxd_delivery_stats_last_hour_filtered_out", "", float64(st.FilteredOut))
	p.family("outboxd_delivery_stats_last_hour_filter_errors", "gauge", "Events that endpoints did not get in the last 60 minutes, the current one included, because their filter was held after an error; every replica's.")
	p.sample("outboxd_delivery_stats_last_hour_filter_errors", "", float64(st.FilterErrors))
	p.family("outboxd_delivery_stats_last_hour_attempts", "gauge", "Delivery attempts in the last 60 minutes, the current one included, by outcome; every replica's.")
	c := st.FailuresByClass
	for _, o := range []struct {
		outcome string
		n       int64
	}{
		{"success", st.Successes}, {"timeout", c.Timeout}, {"4xx", c.Status4xx}, {"5xx", c.Status5xx},
		{"connection", c.Connection}, {"other", c.Other},
	} {
		p.sample("outboxd_delivery_stats_last_hour_attempts", `outcome="`+o.outcome+`"`, float64(o.n))
	}
	p.family("outboxd_delivery_stats_last_hour_commit_to_first_2xx_seconds", "gauge",
		"Commit to first 2xx over the last 60 minutes: the upper bound of the bucket holding the quantile; absent without a success.")
	for _, q := range []struct {
		label string
		ms    *float64
	}{{"0.5", st.LatencyP50MS}, {"0.99", st.LatencyP99MS}} {
		if q.ms != nil {
			p.sample("outboxd_delivery_stats_last_hour_commit_to_first_2xx_seconds", `quantile="`+q.label+`"`, *q.ms/1000)
		}
	}
	if p.err == nil {
		p.err = p.w.Flush()
	}
	return p.err
}

// writeTraceRepairMetrics writes how many times outbox.record repaired a
// trace context: a counter in the database, kept for every producer by
// sequences (schema.sql, trace_repairs_*), the same on every replica
// (aggregate it with max, not sum). A repair's name is its header and
// what was done to it: traceparent_dropped, tracestate_truncated, ...
func writeTraceRepairMetrics(w io.Writer, repairs traceRepairs) error {
	p := &promWriter{w: bufio.NewWriter(w)}
	p.family("outboxd_trace_context_repairs_total", "counter",
		"Trace contexts outbox.record repaired instead of failing the recording, by header and action (dropped, downgraded from a later version, truncated); every producer's.")
	for _, repair := range sortedKeys(repairs) {
		header, action, _ := strings.Cut(repair, "_")
		p.sample("outboxd_trace_context_repairs_total", `header="`+labelValue(header)+`",action="`+labelValue(action)+`"`, float64(repairs[repair]))
	}
	if p.err == nil {
		p.err = p.w.Flush()
	}
	return p.err
}
